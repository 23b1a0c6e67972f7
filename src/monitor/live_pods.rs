//! The monitor's pod watch: its lists leave finished pods out, its watch does not.
//!
//! Volcano keeps a finished job's stopped pods (`Succeeded`, `Failed`) until the job's TTL, 24 h by
//! default ([`crate::config`] `ended_job_retention`), and their phase never changes again. A monitor
//! that listed them would hold and page through every pod of every job kept for the retention (issue
//! 46). So every list of the pod watch (its start, a relist after 410 Gone) and of the reconciliation
//! ([`super::verify`]) asks the API server for the pods that have not finished
//! ([`UNFINISHED`], a field selector the API server supports for pods), without a write per pod.
//!
//! The watch itself has no field selector. With one, a pod that finishes would leave the selection, and
//! an API server reports that as a `DELETED` event carrying the pod's *previous* content (still
//! `Running`, without its container's exit code): the monitor would learn every rank's exit code and
//! end time only by reading the pods again at the job's end, a request per job. Without it, the event
//! that finishes a pod brings its terminated state, as before, and a pod only leaves the watch when it is
//! deleted. What the cache then keeps of finished pods is bounded by the live jobs: a finished pod is kept
//! while its job is held and dropped with it (see [`super::cache::Cache::remove_job`]), and one whose job
//! is not held is not taken in. kube's `watcher` applies one configuration to both the list and the
//! watch, hence this small state machine of its own (list pages, then watch from the list's version,
//! follow bookmarks, start over with a list on 410 Gone); `WatchStreamExt::default_backoff` paces it
//! after errors as it does kube's.

use std::collections::VecDeque;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::Api;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::runtime::watcher::{Error, Event};

use super::cache::WatchedPod;

/// The field selector of the monitor's pod lists: pods that have not finished.
pub const UNFINISHED: &str = "status.phase!=Succeeded,status.phase!=Failed";

/// Where the watch is.
enum State {
    /// About to list from the start (an `Init` goes out first).
    Start,
    /// Listing, page by page: the next page's continue token, and the list's version (its first page's).
    Listing {
        token: Option<String>,
        version: Option<String>,
    },
    /// Watching from `version`; `None`: the watch request is to be (re)sent.
    Watching {
        version: String,
        events: Option<BoxStream<'static, kube::Result<WatchEvent<WatchedPod>>>>,
    },
}

struct Walker {
    api: Api<WatchedPod>,
    labels: String,
    page: u32,
    state: State,
    pending: VecDeque<Event<WatchedPod>>,
}

/// The pods matching the label selector `labels`: a list of those not finished ([`UNFINISHED`], pages
/// of `page`), then every change to any of them, as kube's watcher reports them (`Init`, `InitApply`,
/// `InitDone`, then `Apply` and `Delete`). Errors are items; the stream goes on after them.
pub fn watch(
    api: Api<WatchedPod>,
    labels: String,
    page: u32,
) -> impl Stream<Item = Result<Event<WatchedPod>, Error>> + Send + 'static {
    let walker = Walker {
        api,
        labels,
        page,
        state: State::Start,
        pending: VecDeque::new(),
    };
    futures::stream::unfold(walker, |mut w| async move {
        let item = w.step().await;
        Some((item, w))
    })
}

impl Walker {
    async fn step(&mut self) -> Result<Event<WatchedPod>, Error> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(event);
            }
            match &mut self.state {
                State::Start => {
                    self.state = State::Listing {
                        token: None,
                        version: None,
                    };
                    return Ok(Event::Init);
                }
                State::Listing { token, version } => {
                    let mut params = ListParams::default()
                        .labels(&self.labels)
                        .fields(UNFINISHED)
                        .limit(self.page);
                    if let Some(t) = token.as_deref() {
                        params = params.continue_token(t);
                    }
                    let page = match self.api.list(&params).await {
                        Ok(page) => page,
                        Err(e) => {
                            // A page that fails (an expired continue token among others) starts the
                            // list over: the pages already read are applied again under a new `Init`.
                            self.state = State::Start;
                            return Err(Error::InitialListFailed(e));
                        }
                    };
                    if version.is_none() {
                        *version = page.metadata.resource_version.clone();
                    }
                    self.pending
                        .extend(page.items.into_iter().map(Event::InitApply));
                    match page.metadata.continue_.filter(|c| !c.is_empty()) {
                        Some(next) => *token = Some(next),
                        None => {
                            let Some(version) = version.take() else {
                                self.state = State::Start;
                                return Err(Error::NoResourceVersion);
                            };
                            self.pending.push_back(Event::InitDone);
                            self.state = State::Watching {
                                version,
                                events: None,
                            };
                        }
                    }
                }
                State::Watching { version, events } => {
                    let stream = match events {
                        Some(stream) => stream,
                        None => {
                            let params = WatchParams::default().labels(&self.labels);
                            match self.api.watch(&params, version).await {
                                Ok(s) => events.insert(s.boxed()),
                                Err(e) => return Err(Error::WatchStartFailed(e)),
                            }
                        }
                    };
                    let next = stream.next().await;
                    match next {
                        // The watch's time is up (or the connection closed): watch again from here.
                        None => *events = None,
                        Some(Ok(WatchEvent::Added(pod) | WatchEvent::Modified(pod))) => {
                            note_version(version, &pod);
                            return Ok(Event::Apply(pod));
                        }
                        Some(Ok(WatchEvent::Deleted(pod))) => {
                            note_version(version, &pod);
                            return Ok(Event::Delete(pod));
                        }
                        Some(Ok(WatchEvent::Bookmark(mark))) => {
                            *version = mark.metadata.resource_version;
                        }
                        // 410 Gone: the version is too old to watch from; list again. Any other
                        // error is reported and the watch goes on (it ends by itself if it cannot,
                        // and is then sent again from the last version), as kube's watcher does: an
                        // event that cannot be read is skipped, not read again for ever.
                        Some(Ok(WatchEvent::Error(status))) => {
                            if status.code == 410 {
                                self.state = State::Start;
                            }
                            return Err(Error::WatchError(status));
                        }
                        Some(Err(e)) => return Err(Error::WatchFailed(e)),
                    }
                }
            }
        }
    }
}

/// The watch goes on from the version of the last object it delivered.
fn note_version(version: &mut String, pod: &WatchedPod) {
    if let Some(rv) = &pod.metadata.resource_version {
        version.clone_from(rv);
    }
}
