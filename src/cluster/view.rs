//! A view of one kind of object kept by a watch, for checks that may answer from it instead of a
//! request (the tombstone before a create, whether a job of some name exists). What it keeps of each
//! object is the caller's choice, so a view of 10,000 jobs can be their names alone. It answers only
//! once the watch has listed, and not after a watch error until it has listed again; its users keep an
//! authoritative request for what must not be missed.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// Objects by `(name, namespace)`: names first, so every namespace's object of one name is a range.
pub type ByName<V> = BTreeMap<(String, String), V>;

/// A watched view; clones share it.
#[derive(Debug)]
pub struct WatchView<V> {
    inner: Arc<RwLock<Inner<V>>>,
}

impl<V> Clone for WatchView<V> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<V> Default for WatchView<V> {
    fn default() -> Self {
        Self {
            inner: Arc::new(RwLock::new(Inner {
                synced: false,
                live: BTreeMap::new(),
                next: BTreeMap::new(),
            })),
        }
    }
}

#[derive(Debug)]
struct Inner<V> {
    /// A listing has completed since the watch (re)started: the map can answer.
    synced: bool,
    live: ByName<V>,
    /// Being rebuilt by a relist (between `Init` and `InitDone`).
    next: ByName<V>,
}

impl<V> WatchView<V> {
    /// A view that has listed `objects` and follows no watch: for checks run without a cluster (the fuzz
    /// targets, benchmarks of the check alone).
    pub fn listed(objects: ByName<V>) -> Self {
        Self {
            inner: Arc::new(RwLock::new(Inner {
                synced: true,
                live: objects,
                next: BTreeMap::new(),
            })),
        }
    }

    /// `f` of the view, or `None` while it cannot answer (not listed yet, or since a watch error).
    pub fn read<R>(&self, f: impl FnOnce(&ByName<V>) -> R) -> Option<R> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner.synced.then(|| f(&inner.live))
    }

    /// Puts in the view an object this process has just written, under `key` (`(name, namespace)`),
    /// before its watch event arrives: a check right after its own write then answers from the write,
    /// however late the watch is. The watch event, when it comes, brings the same object. A relist
    /// under way keeps it too, in case its list was taken before the write.
    pub fn wrote(&self, key: (String, String), value: V)
    where
        V: Clone,
    {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        inner.next.insert(key.clone(), value.clone());
        inner.live.insert(key, value);
    }

    /// Keeps the view with a watch of `api` (narrowed by `config`), keeping `keep(object)` of each,
    /// until `shutdown`. `what` names the watch in the log of a failure.
    pub async fn follow<K>(
        &self,
        api: Api<K>,
        config: watcher::Config,
        what: &str,
        keep: impl Fn(&K) -> V,
        shutdown: impl Future<Output = ()>,
    ) where
        K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
        K::DynamicType: Default,
    {
        let key = |o: &K| (o.name_any(), o.namespace().unwrap_or_default());
        let stream = watcher::watcher(api, config).default_backoff();
        let mut stream = std::pin::pin!(stream);
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let event = tokio::select! {
                () = &mut shutdown => return,
                event = stream.next() => event,
            };
            let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
            match event {
                None => return,
                Some(Err(e)) => {
                    inner.synced = false;
                    tracing::debug!(watch = what, error = %e, "Watch failed; checks read until it has listed again.");
                }
                Some(Ok(Event::Init)) => inner.next.clear(),
                Some(Ok(Event::InitApply(o))) => {
                    inner.next.insert(key(&o), keep(&o));
                }
                Some(Ok(Event::InitDone)) => {
                    inner.live = std::mem::take(&mut inner.next);
                    inner.synced = true;
                }
                Some(Ok(Event::Apply(o))) => {
                    inner.live.insert(key(&o), keep(&o));
                }
                Some(Ok(Event::Delete(o))) => {
                    inner.live.remove(&key(&o));
                }
            }
        }
    }
}

/// Whether `view` has an object named `name` in any namespace.
pub fn has_name<V>(view: &ByName<V>, name: &str) -> bool {
    view.range((name.to_owned(), String::new())..)
        .next()
        .is_some_and(|((n, _), _)| n == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_found_in_any_namespace_and_only_that_name() {
        let mut view: ByName<()> = BTreeMap::new();
        view.insert(("j-1".into(), "ns-b".into()), ());
        view.insert(("j-10".into(), "ns-a".into()), ());
        assert!(has_name(&view, "j-1"));
        assert!(has_name(&view, "j-10"));
        assert!(!has_name(&view, "j-"));
        assert!(!has_name(&view, "j-2"));
    }

    #[test]
    fn a_write_of_this_process_is_seen_before_its_watch_event() {
        let view: WatchView<u32> = WatchView::listed(BTreeMap::new());
        view.wrote(("t-1".into(), "ns".into()), 7);
        assert_eq!(
            view.read(|m| m.get(&("t-1".into(), "ns".into())).copied()),
            Some(Some(7))
        );
    }

    #[test]
    fn an_unlisted_view_does_not_answer() {
        let view: WatchView<()> = WatchView::default();
        assert_eq!(view.read(|m| m.len()), None);
        view.inner.write().unwrap().synced = true;
        assert_eq!(view.read(|m| m.len()), Some(0));
    }
}
