//! Carries out the decisions for one job, in the kill-safe order: **publish (confirmed), then persist
//! (guarded by a test of the uid and the annotations decided on), then end the job (`TerminateJob`), delete its companions and remove the finalizer**, and asks [`decide`] again
//! after every write until the job is settled.
//!
//! - A kill before a publication leaves the annotations as they were: the same decision is made again.
//! - A kill between a publication and its patch re-publishes the same ids with the same content
//!   (consumers drop duplicates by id); never the other way round, which would lose the message.
//! - A failed guard (422) or a 409 Conflict means the job changed under us (another runner, an extension, Volcano): re-read and
//!   decide again, the annotations now say what was done.
//! - Anything else (broker down, API 5xx past the retry budget) ends this try; the loop retries the job
//!   later with backoff, and the other jobs carry on (W6, W7).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Pod, Toleration};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::cache::{Snapshot, WatchedJob, WatchedPod};
use super::clock::Clock;
use super::decide::{self, Action, Observed, Settings, Step};
use super::end_tails;
use super::queued::ConfirmedQueued;
use super::record::RankTail;
use crate::broker::{self, BrokerConfig, PublishError, Publisher};
use crate::cluster::labels::FIELD_MANAGER;
use crate::cluster::lease::Duty;
use crate::cluster::{ClusterError, HeldShards, KubeResultExt, RetryPolicy};
use crate::config::monitor::Encoding;
use crate::messages::Format;
use crate::pipeline::hooks::{FactsError, Outbound};
use crate::volcano::{LABEL_JOB_NAME, VolcanoJob};

/// Decisions and writes for one job in one go, before the job is handed back to the loop.
const MAX_ROUNDS: usize = 12;

/// [`crate::cluster::labels::ENDED`] as a JSON pointer below the job (`/` escaped as `~1`).
const ENDED_LABEL_PATH: &str = "/metadata/labels/volcano-runner~1ended";

/// Why handling a job stopped early. The job is tried again later.
#[derive(Debug, thiserror::Error)]
pub enum HandleError {
    #[error("{0}")]
    Cluster(#[from] ClusterError),
    #[error("publishing failed: {0}")]
    Publish(#[from] PublishError),
    /// The job's annotations cannot be read; it needs a person.
    #[error("{0}")]
    Facts(#[from] FactsError),
    #[error("the job kept changing while it was handled ({MAX_ROUNDS} rounds)")]
    Unsettled,
}

/// What handling a job came to.
#[derive(Debug)]
pub struct Handled {
    /// The job as last read or written, for the cache.
    pub job: Option<Arc<VolcanoJob>>,
    /// When to look again (in the clock's time), if no event comes first.
    pub next_check: Option<Timestamp>,
    /// Set when the try failed; the loop retries with backoff.
    pub error: Option<HandleError>,
    /// The effects carried out, e.g. `["status", "start", "monitor"]`, for logs and tests.
    pub done: Vec<&'static str>,
    /// The job's snapshot, as it was given, needed nothing until `next_check`: no read, no write. The
    /// same snapshot need not be decided again before then.
    pub settled: bool,
    /// The job as written (`job`, the answer to this call's last patch) was decided again with the
    /// snapshot's pods and PodGroup (or pods read afresh, as new as the cache's or newer), and needs
    /// nothing until `next_check`: the view the cache holds once the answer is in it need not be
    /// decided again (the watch's echo of the write would otherwise bring one more decision per
    /// write, which changed nothing).
    pub settled_as_written: bool,
}

impl Handled {
    /// A try that failed before it decided anything: retried with backoff.
    fn failed(error: HandleError) -> Self {
        Self {
            job: None,
            next_check: None,
            error: Some(error),
            done: Vec::new(),
            settled: false,
            settled_as_written: false,
        }
    }
}

/// The writes of the monitor: publisher, API, and everything they need.
pub struct Executor {
    pub(crate) client: kube::Client,
    pub(crate) publisher: Publisher,
    pub(crate) broker: BrokerConfig,
    pub(crate) content_type: Format,
    pub(crate) retry: RetryPolicy,
    pub(crate) settings: Settings,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) shards: watch::Receiver<HeldShards>,
    pub(crate) tail_bytes: usize,
    pub(crate) tail_total: usize,
    /// Jobs whose QUEUED this process's submit path had confirmed: no copy of it before their first
    /// event.
    pub(crate) confirmed_queued: ConfirmedQueued,
    /// The maintenance windows, from the monitor's watch of them (`None` until first listed).
    pub(crate) maintenance: watch::Receiver<Option<crate::cluster::Windows>>,
    /// The cluster refused the node patch by which the monitor writes the maintenance windows' taints:
    /// set once, by the monitor's loop; a job without the gate can no longer be held back.
    pub(crate) taints_refused: Arc<std::sync::atomic::AtomicBool>,
    /// The maintenance windows whose taint is on a node, from the monitor's watch of the nodes.
    pub(crate) tainted: watch::Sender<Arc<BTreeSet<String>>>,
}

/// The job and its pods a decision is taken on, and whether (and when) they were read afresh.
struct View {
    job: Arc<VolcanoJob>,
    pods: Arc<Vec<Pod>>,
    fresh: bool,
    /// When the view was last read afresh (an instant taken just before the read).
    fresh_at: Option<Timestamp>,
}

impl View {
    /// The snapshot as it was given: nothing read afresh yet.
    fn of(snap: &Snapshot) -> Self {
        View {
            job: snap.job.clone(),
            pods: snap.pods.clone(),
            fresh: false,
            fresh_at: None,
        }
    }
}

/// What this runner knows besides the job, read once when [`Executor::handle`] begins.
struct Known {
    queued_confirmed: bool,
    windows: Option<Arc<Vec<crate::cluster::Window>>>,
    tainted: Arc<BTreeSet<String>>,
}

/// What a round of [`Executor::handle`] ends with: decide again, or done until the instant given.
enum Round {
    Again,
    Done(Option<Timestamp>),
}

/// Whether the view holds the job as this call wrote it (an answer to its patch), not as the snapshot
/// had it.
fn wrote(snap: &Snapshot, view: &View) -> bool {
    !Arc::ptr_eq(&snap.job, &view.job)
        && view.job.metadata.resource_version != snap.job.metadata.resource_version
}

/// The earlier of two instants to look again at (`None`: no need).
fn earliest(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl Executor {
    /// Everything from the monitor's parts and configuration.
    pub fn new(
        client: kube::Client,
        publisher: Publisher,
        settings: Settings,
        clock: Arc<dyn Clock>,
        shards: watch::Receiver<HeldShards>,
        confirmed_queued: ConfirmedQueued,
        maintenance: watch::Receiver<Option<crate::cluster::Windows>>,
    ) -> Self {
        let config = settings.config.clone();
        Self {
            client,
            publisher,
            broker: config.broker.clone(),
            content_type: match config.monitor.encoding {
                Encoding::Json => Format::Json,
                Encoding::Protobuf => Format::Protobuf,
            },
            retry: RetryPolicy::from_config(&config.cluster),
            tail_bytes: config.monitor.log_tail_bytes,
            tail_total: config.monitor.log_tail_total_bytes,
            settings,
            clock,
            shards,
            confirmed_queued,
            maintenance,
            taints_refused: Arc::default(),
            tainted: watch::Sender::new(Arc::default()),
        }
    }

    fn owns(&self, job_id: &str) -> bool {
        self.shards.borrow().owns(job_id)
    }

    fn begin_duty(&self, job_id: &str) -> Duty {
        self.shards.borrow().begin_duty(job_id)
    }

    fn jobs(&self, namespace: &str) -> Api<WatchedJob> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Decides and acts for one job until it needs nothing more for now.
    pub async fn handle(&self, mut snap: Snapshot) -> Handled {
        match self.peers_from_cluster(&snap).await {
            Ok(Some(peers)) => snap.peers = peers,
            Ok(None) => {}
            Err(e) => return Handled::failed(e.into()),
        }
        let mut view = View::of(&snap);
        // Ids confirmed during this call: after a conflict the same decision comes again, and its
        // messages (same ids, same content) need not go out twice.
        let mut confirmed: HashSet<String> = HashSet::new();
        let mut done = Vec::new();
        let mut settled = false;
        let mut settled_as_written = false;
        let job_id = snap.key.job_id().unwrap_or_default().to_owned();
        let mut known = self.known(&job_id);
        // Begun before the first look at the shard, and held until the last write: a shard handed to
        // another runner is released only once this has ended, so the new holder reads what was written.
        let _duty = self.begin_duty(&job_id);
        let result = async {
            for _ in 0..MAX_ROUNDS {
                // A shard on its way out starts nothing more for its jobs; but what this handling has
                // told is still recorded (its duty keeps the shard here until then): a write of it that
                // conflicted is made again, or the next holder would find it unrecorded and tell it
                // a second time.
                let owned = self.owns(&job_id);
                if !owned && confirmed.is_empty() {
                    return Ok(None);
                }
                let now = self.clock.now();
                // The monitor may have told the job's QUEUED itself in the round before.
                known.queued_confirmed = known.queued_confirmed
                    || (!done.is_empty() && self.confirmed_queued.contains(&job_id));
                if view.job.retries() > snap.job.retries() {
                    // Volcano restarted the job since the snapshot was taken: what the watch saw take
                    // its pod away is in the cache, not in the snapshot. Decide it again from there.
                    return Ok(Some(now));
                }
                let step = self.decide(&snap, &view, &known, now)?;
                if !owned && !records_only(&step, &confirmed) {
                    return Ok(None);
                }
                if step.needs_fresh_view() && !view.fresh {
                    if !self.freshen(&step, &mut view, now).await? {
                        return Ok(None);
                    }
                    continue;
                }
                let rounds = match step {
                    Step::Wait { next_check } => {
                        settled = !view.fresh && done.is_empty();
                        // Pods read afresh (a tick's proof) are as new as the cache's or newer:
                        // a change the cache has yet to take in is decided when its event comes.
                        settled_as_written = wrote(&snap, &view);
                        return Ok(next_check);
                    }
                    Step::Record {
                        outcome, logs, set, ..
                    } => {
                        done.push("record");
                        self.record(&snap.key.namespace, &mut view, outcome, &logs, set)
                            .await?
                    }
                    Step::Act(action) => {
                        done.push(action.what);
                        self.act_step(
                            &snap.key.namespace,
                            &job_id,
                            &mut view,
                            action,
                            &mut confirmed,
                        )
                        .await?
                    }
                };
                if let Round::Done(next_check) = rounds {
                    let as_written = self.settle_as_written(&snap, &view, &mut known, &job_id);
                    settled_as_written = as_written.is_some();
                    return Ok(as_written.map_or(next_check, |then| earliest(next_check, then)));
                }
            }
            Err(HandleError::Unsettled)
        }
        .await;
        let (next_check, error) = match result {
            Ok(next_check) => (next_check, None),
            Err(error) => {
                settled = false;
                settled_as_written = false;
                (None, Some(error))
            }
        };
        Handled {
            job: Some(view.job),
            next_check,
            error,
            done,
            settled,
            settled_as_written,
        }
    }

    /// What this runner knows besides the job `job_id`, as of now.
    fn known(&self, job_id: &str) -> Known {
        Known {
            queued_confirmed: self.confirmed_queued.contains(job_id),
            windows: self.maintenance.borrow().clone(),
            tainted: self.tainted.borrow().clone(),
        }
    }

    /// After a step that wrote the job and asked for no other: the job as written decided now (no
    /// request, no effect), so that the cache's view of it, once the answer is in, counts as decided.
    /// Only a decision to wait is taken (`Some`, with when to look again); any other step is left to the
    /// decision the written view gets from the loop.
    fn settle_as_written(
        &self,
        snap: &Snapshot,
        view: &View,
        known: &mut Known,
        job_id: &str,
    ) -> Option<Option<Timestamp>> {
        known.queued_confirmed = known.queued_confirmed || self.confirmed_queued.contains(job_id);
        if wrote(snap, view)
            && view.job.retries() <= snap.job.retries()
            && self.owns(job_id)
            && let Ok(Step::Wait { next_check }) = self.decide(snap, view, known, self.clock.now())
        {
            Some(next_check)
        } else {
            None
        }
    }

    /// The decision on `view`, with what the snapshot and this runner know besides.
    fn decide(
        &self,
        snap: &Snapshot,
        view: &View,
        known: &Known,
        now: Timestamp,
    ) -> Result<Step, FactsError> {
        let obs = Observed {
            job: &view.job,
            pods: &view.pods,
            podgroup: snap.podgroup.as_deref(),
            jobs_ahead: snap.jobs_ahead,
            estimate: snap.estimate.as_deref(),
            estimate_pending: snap.estimate_pending,
            disruption: snap.disruption.as_ref().map(|(g, d)| (*g, d)),
            fresh_at: view.fresh_at,
            queued_confirmed: known.queued_confirmed,
            cancel_seen: self.cancel_seen(&view.job, known, now),
            maintenance: known.windows.as_deref().map(Vec::as_slice),
            maintenance_taints: !self
                .taints_refused
                .load(std::sync::atomic::Ordering::Relaxed),
            maintenance_tainted: Some(&known.tainted),
            peers: &snap.peers,
            // A view read afresh in another phase than the cache's is no longer the one first seen.
            phase_seen: snap
                .phase_seen
                .filter(|_| view.job.phase() == snap.job.phase()),
        };
        decide::decide(&obs, &self.settings, now)
    }

    /// Whether a cancel of the job is in this runner's view of the tombstones: asked only for a job
    /// whose QUEUED is left to its monitor and not known to be told (see [`Observed::cancel_seen`]).
    fn cancel_seen(&self, job: &VolcanoJob, known: &Known, now: Timestamp) -> bool {
        if !self
            .settings
            .queued
            .left_untold(job.metadata.annotations.as_ref(), known.queued_confirmed)
        {
            return false;
        }
        let name = job.metadata.name.as_deref().unwrap_or_default();
        crate::pipeline::names::job_id_from_vcjob_name(name)
            .is_some_and(|job_id| self.confirmed_queued.cancel_seen(job_id, now))
    }

    /// Reads afresh what `step` needs (the pods alone for a tick); `false`: the job is gone.
    async fn freshen(
        &self,
        step: &Step,
        view: &mut View,
        now: Timestamp,
    ) -> Result<bool, HandleError> {
        if !step.fresh_pods_suffice() {
            return self.reread(view, now).await;
        }
        let at = self.clock.now();
        view.pods = self.fresh_pods(&view.job).await?;
        view.fresh = true;
        view.fresh_at = Some(at);
        Ok(true)
    }

    /// Reads the job and its pods again (changed under us, or a step that needs a view read just
    /// now), as of `at`. `false`: the job is gone.
    async fn reread(&self, view: &mut View, at: Timestamp) -> Result<bool, HandleError> {
        match self.fresh_view(&view.job).await? {
            Some((j, p)) => {
                view.job = j;
                view.pods = p;
                view.fresh = true;
                view.fresh_at = Some(at);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Records the outcome with the rank's log tails (a deleted job's pods may be gone: the tails
    /// read before the deletion fill in).
    async fn record(
        &self,
        namespace: &str,
        view: &mut View,
        mut outcome: super::record::Outcome,
        logs: &[(u32, String)],
        mut set: BTreeMap<String, String>,
    ) -> Result<Round, HandleError> {
        let prefix = &self.settings.keys.prefix;
        let kept = end_tails::decode(view.job.metadata.annotations.as_ref(), prefix);
        let mut remove = BTreeSet::new();
        if !kept.is_empty() {
            remove.insert(end_tails::key(prefix));
        }
        outcome.log_tails = end_tails::merge(self.tails(namespace, logs).await, kept);
        set.insert(self.settings.keys.outcome.clone(), outcome.to_annotation());
        match self.patch(&view.job, &set, &remove, false).await {
            Ok(Some(new)) => view.job = new,
            Ok(None) => return Ok(Round::Done(None)),
            Err(e) if e.is_conflict() => {
                // Changed under us: read the job and its pods again, and decide again.
                let at = self.clock.now();
                if !self.reread(view, at).await? {
                    return Ok(Round::Done(None));
                }
            }
            Err(e) => return Err(e.into()),
        }
        Ok(Round::Again)
    }

    /// Carries an action out; decides again after a conflict, or when the action asks to.
    async fn act_step(
        &self,
        namespace: &str,
        job_id: &str,
        view: &mut View,
        mut action: Action,
        confirmed: &mut HashSet<String>,
    ) -> Result<Round, HandleError> {
        // The tails of the ranks the command is about to stop; not for a job whose outcome (with its
        // tails) is recorded already.
        let recorded = view
            .job
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(&self.settings.keys.outcome));
        if action.delete && !action.release && !recorded {
            self.keep_end_tails(namespace, &view.job, &view.pods, &mut action)
                .await;
        }
        for failure in &action.failures {
            tracing::warn!(job = %job_id, plugin = %failure.plugin, error = %failure.error, "A hook failed; the other plugins' actions stand.");
        }
        for _ in 0..MAX_ROUNDS {
            match self.act(&view.job, &view.pods, &action, confirmed).await? {
                Acted::Settled(new) => {
                    if let Some(new) = new {
                        view.job = new;
                    }
                    return Ok(if action.again {
                        Round::Again
                    } else {
                        Round::Done(action.next_check)
                    });
                }
                Acted::Gone => return Ok(Round::Done(None)),
                Acted::Conflict => {
                    // Changed under us: read the job and its pods again, and decide again. But an
                    // outcome published before its record ([`Action::records_outcome`]) is what must be
                    // recorded: its write is made again on the job as read now (a cancel that came in
                    // between would otherwise have its own end told after it), unless that job records
                    // an end already.
                    let at = self.clock.now();
                    if !self.reread(view, at).await? {
                        return Ok(Round::Done(None));
                    }
                    if !action.records_outcome || self.records_an_end(&view.job) {
                        return Ok(Round::Again);
                    }
                }
            }
        }
        Ok(Round::Again)
    }

    /// Whether the job records its outcome or its published end.
    fn records_an_end(&self, job: &VolcanoJob) -> bool {
        let record = super::record::Record::read(job, &self.settings.keys);
        record.outcome.is_some() || matches!(record.published, super::record::Published::Ended(_))
    }

    /// Publishes the end of a job that vanished; nothing can be persisted.
    pub async fn handle_gone(&self, job: Arc<VolcanoJob>, pods: Arc<Vec<Pod>>) -> Handled {
        let now = self.clock.now();
        let job_id = crate::pipeline::names::job_id_from_vcjob_name(
            job.metadata.name.as_deref().unwrap_or_default(),
        )
        .unwrap_or_default()
        .to_owned();
        let mut done = Vec::new();
        let _duty = self.begin_duty(&job_id);
        // Nothing can be written on a job that is gone.
        let queued_confirmed = self.confirmed_queued.contains(&job_id);
        self.confirmed_queued
            .gone(&job_id, job.metadata.uid.as_deref());
        let result = async {
            if !self.owns(&job_id) {
                return Ok(());
            }
            if let Some(action) =
                decide::decide_gone(&job, &pods, &self.settings, now, queued_confirmed)?
            {
                // "Not in the watch" is not a fact: the job may have left it ended (labelled, in a
                // write this cache never saw, by another runner), or a list may have missed it. Only
                // the cluster says it is gone.
                if let Some(there) = self.still_there(&job).await? {
                    tracing::debug!(job = %job_id, ended = there, "Left the watch but still there: nothing to publish.");
                    return Ok(());
                }
                done.push(action.what);
                let traceparent = self.traceparent(&job);
                self.publish(&action.publish, traceparent.as_deref())
                    .await?;
            }
            Ok::<(), HandleError>(())
        }
        .await;
        Handled {
            job: None,
            next_check: None,
            error: result.err(),
            done,
            settled: false,
            settled_as_written: false,
        }
    }

    /// The peers of the snapshot's job with every peer the watches do not hold read from the cluster
    /// (`None`: the watches hold them all). An ended peer has left the watches (its end recorded,
    /// [`crate::cluster::labels::ENDED`]), and one that is not there may not have been created yet:
    /// only the cluster tells them apart, and a peer's end must be decided from what it recorded.
    async fn peers_from_cluster(
        &self,
        snap: &Snapshot,
    ) -> Result<Option<Arc<Vec<super::peers::PeerSeen>>>, ClusterError> {
        if snap.peers.iter().all(|p| p.job.is_some()) {
            return Ok(None);
        }
        let api = self.jobs(&snap.key.namespace);
        let mut peers = snap.peers.as_ref().clone();
        for peer in peers.iter_mut().filter(|p| p.job.is_none()) {
            let name = crate::pipeline::names::vcjob_name(&peer.job_id);
            let op = format!("get jobs.batch.volcano.sh {}/{name}", snap.key.namespace);
            let got = self
                .retry
                .run(&op, || async {
                    api.get(&name).await.classify(|| op.clone())
                })
                .await;
            peer.job = match got {
                Ok(w) => Some(Arc::new(w.into_job())),
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(e),
            };
        }
        Ok(Some(Arc::new(peers)))
    }

    /// Whether the job `last` (by name and uid) is still in the cluster, and if so whether its end is
    /// recorded (`Some(true)`); `None` when it is gone (or another job took its name).
    async fn still_there(&self, last: &VolcanoJob) -> Result<Option<bool>, ClusterError> {
        let Some(job) = self.read_job(last).await? else {
            return Ok(None);
        };
        if job.metadata.uid != last.metadata.uid {
            return Ok(None);
        }
        let labelled = job
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(crate::cluster::labels::ENDED));
        let record = super::record::Record::read(&job, &self.settings.keys);
        let published = matches!(record.published, super::record::Published::Ended(_));
        Ok(Some(labelled || published))
    }

    /// Lets the pods the action names be scheduled: their scheduling gate removed, the tolerations the
    /// action gives them added. `true` when a pod changed since the watch showed it (a conflict: the
    /// job's pods are read again and the job decided again).
    async fn release_pods(
        &self,
        job: &Arc<VolcanoJob>,
        pods: &[Pod],
        action: &Action,
    ) -> Result<bool, HandleError> {
        if action.ungate.is_none() && action.tolerate.is_none() {
            return Ok(false);
        }
        let gated = action
            .ungate
            .as_ref()
            .map(|(g, p)| (g.as_str(), p.as_slice()));
        let tolerating = action
            .tolerate
            .as_ref()
            .map(|(t, p)| (t.as_slice(), p.as_slice()));
        let names: BTreeSet<&String> = gated
            .map(|(_, p)| p)
            .into_iter()
            .chain(tolerating.map(|(_, p)| p))
            .flatten()
            .collect();
        for name in names {
            let Some(pod) = pods.iter().find(|p| p.metadata.name.as_ref() == Some(name)) else {
                continue;
            };
            let gate = gated.filter(|(_, p)| p.contains(name)).map(|(g, _)| g);
            let tolerations = tolerating
                .filter(|(_, p)| p.contains(name))
                .map_or(&[][..], |(t, _)| t);
            match self.release(job, pod, gate, tolerations).await {
                Ok(()) => {}
                // The pod changed since the watch showed it: read the job's pods again and decide
                // again.
                Err(e) if e.is_conflict() => return Ok(true),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(false)
    }

    /// Publishes the action's messages not confirmed yet in this handling, and notes them confirmed.
    async fn publish_unconfirmed(
        &self,
        job: &Arc<VolcanoJob>,
        action: &Action,
        confirmed: &mut HashSet<String>,
    ) -> Result<(), HandleError> {
        let publish: Vec<Outbound> = action
            .publish
            .iter()
            .filter(|m| !confirmed.contains(message_id(m)))
            .cloned()
            .collect();
        if !publish.is_empty() {
            let traceparent = self.traceparent(job);
            self.publish(&publish, traceparent.as_deref()).await?;
            confirmed.extend(publish.iter().map(|m| message_id(m).to_owned()));
        }
        Ok(())
    }

    async fn act(
        &self,
        job: &Arc<VolcanoJob>,
        pods: &[Pod],
        action: &Action,
        confirmed: &mut HashSet<String>,
    ) -> Result<Acted, HandleError> {
        let mut current = None;
        // A job's peers: their names first, then its pods may be scheduled (see `super::peers`).
        if let Some(addresses) = &action.peer_endpoints {
            self.write_peer_endpoints(job, addresses).await?;
        }
        if self.release_pods(job, pods, action).await? {
            return Ok(Acted::Conflict);
        }
        self.publish_unconfirmed(job, action, confirmed).await?;
        if action.carry_queued {
            // Confirmed: in the queues ahead of anything published from now on. Its record rides on
            // the next write of the job (or is written before its shard goes). A shard already on its
            // way out (or no shards to carry it with: a monitor built without its runner) gets the
            // record written now, while this handling's duty still keeps the shard here, so that the
            // next holder reads it and tells nothing again.
            let (ns, name) = names(job);
            if let Some(job_id) = crate::pipeline::names::job_id_from_vcjob_name(name)
                && !self
                    .confirmed_queued
                    .carry(job_id, job.metadata.uid.as_deref(), ns, name)
            {
                self.confirmed_queued.record(job_id);
                let set = BTreeMap::from([(self.settings.queued.confirmed.clone(), "true".into())]);
                match self.patch(job, &set, &BTreeSet::new(), false).await {
                    Ok(Some(new)) => current = Some(new),
                    Ok(None) => return Ok(Acted::Gone),
                    // Changed under us: decided again; the record is only a copy spared.
                    Err(e) if e.is_conflict() => return Ok(Acted::Conflict),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        // The finalizer goes in the same write when nothing is to happen between the two (the end of a
        // batch job that Volcano has finished: see `decide::publish_end`).
        let mut unfinalize = action.remove_finalizer;
        if !action.set.is_empty() || !action.remove.is_empty() {
            let together = unfinalize && !action.delete && !action.release && !action.companions;
            match self.patch(job, &action.set, &action.remove, together).await {
                Ok(Some(new)) => current = Some(new),
                Ok(None) => return Ok(Acted::Gone),
                Err(e) if e.is_conflict() => return Ok(Acted::Conflict),
                Err(e) => return Err(e.into()),
            }
            unfinalize &= !together;
        }
        let mut latest = current.clone().unwrap_or_else(|| job.clone());
        if action.delete && !action.release {
            crate::cluster::end::terminate(&self.client, &self.retry, &latest).await?;
        }
        if action.release {
            match self.delete(&latest, &DeleteParams::foreground()).await? {
                Some(new) => {
                    latest = new.clone();
                    current = Some(new);
                }
                None => return Ok(Acted::Gone),
            }
        }
        if action.companions {
            crate::cluster::end::delete_companions(
                &self.client,
                &self.retry,
                &latest,
                &self.settings.keys,
            )
            .await?;
        }
        if unfinalize {
            match self.unfinalize(&latest).await {
                Ok(Some(new)) => current = Some(new),
                Ok(None) => return Ok(Acted::Gone),
                Err(e) if e.is_conflict() => return Ok(Acted::Conflict),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Acted::Settled(current))
    }

    /// Writes the EndpointSlice of the job's peers Service: one endpoint per peer, named by its hostname
    /// (which cluster DNS answers under the Service's name), at the peer's rank 0 address. Created the
    /// first time (with the first addresses' family, which a slice cannot change; owned by the job, so
    /// it goes with it), replaced by a merge patch after that; whichever of the two is tried first, the
    /// other follows when the slice is (not) there.
    async fn write_peer_endpoints(
        &self,
        job: &VolcanoJob,
        addresses: &BTreeMap<String, String>,
    ) -> Result<(), ClusterError> {
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        let (ns, name) = names(job);
        let Some(job_id) = crate::pipeline::names::job_id_from_vcjob_name(name) else {
            return Ok(());
        };
        let service = crate::pipeline::plugins::connect_to_job::peers_service_name(job_id);
        let body = peer_endpoint_slice(job, &service, addresses);
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), ns);
        let written_before = job
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(&self.settings.keys.peer_addresses));
        let create = || async {
            let slice = &body;
            let op = format!("create endpointslices.discovery.k8s.io {ns}/{service}");
            self.retry
                .run(&op, || async {
                    api.create(&kube::api::PostParams::default(), slice)
                        .await
                        .map(|_| ())
                        .classify(|| op.clone())
                })
                .await
        };
        let patch = || async {
            let op = format!("patch endpointslices.discovery.k8s.io {ns}/{service}");
            let endpoints = json!({"endpoints": body.endpoints});
            self.retry
                .run(&op, || async {
                    api.patch(&service, &PatchParams::default(), &Patch::Merge(&endpoints))
                        .await
                        .map(|_| ())
                        .classify(|| op.clone())
                })
                .await
        };
        if written_before {
            match patch().await {
                Err(e) if e.is_not_found() => create().await,
                other => other,
            }
        } else {
            match create().await {
                Err(e) if e.is_already_exists() => patch().await,
                other => other,
            }
        }
    }

    /// Removes the scheduling gate `gate` from a pod (keeping any other gate) and adds the
    /// `tolerations` it lacks (keeping those it has: Kubernetes lets a pod's tolerations be added to,
    /// never changed), in one write guarded by the version the decision saw: the pod as the watch cache
    /// keeps it (its gates, and its tolerations while it waits to be placed), so nothing is read first.
    /// A conflict (the pod changed since: another writer's gates or tolerations are never dropped) is
    /// the caller's to decide again; a pod that is gone, or that needs neither, needs nothing.
    async fn release(
        &self,
        job: &VolcanoJob,
        pod: &Pod,
        gate: Option<&str>,
        tolerations: &[Toleration],
    ) -> Result<(), ClusterError> {
        let (ns, _) = names(job);
        let Some(name) = pod.metadata.name.as_deref() else {
            return Ok(());
        };
        let spec = pod.spec.clone().unwrap_or_default();
        let gates = spec.scheduling_gates.unwrap_or_default();
        let ungate = gate.is_some_and(|gate| gates.iter().any(|g| g.name == gate));
        let mut had = spec.tolerations.unwrap_or_default();
        let missing: Vec<Toleration> = tolerations
            .iter()
            .filter(|t| !had.contains(t))
            .cloned()
            .collect();
        if !ungate && missing.is_empty() {
            return Ok(());
        }
        // Without the version the write could drop what it did not see: the pod is read afresh with
        // the job's (a conflict), which carries it.
        let Some(rv) = pod.metadata.resource_version.as_deref() else {
            return Err(ClusterError::Conflict {
                op: format!("release pods {ns}/{name}"),
                message: "no resourceVersion seen".to_owned(),
            });
        };
        let mut body = json!({"metadata": {"resourceVersion": rv}});
        if ungate {
            let rest: Vec<_> = gates
                .into_iter()
                .filter(|g| Some(g.name.as_str()) != gate)
                .collect();
            body["spec"]["schedulingGates"] = json!(rest);
        }
        if !missing.is_empty() {
            had.extend(missing);
            body["spec"]["tolerations"] = json!(had);
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let op = format!("release pods {ns}/{name}");
        // A conflict is not tried again here: the same version would conflict again.
        let result = self
            .retry
            .run(&op, || async {
                match api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&body))
                    .await
                    .map(|_| ())
                    .classify(|| op.clone())
                {
                    Err(e) if e.is_conflict() || e.is_not_found() => Ok(Err(e)),
                    other => other.map(Ok),
                }
            })
            .await?;
        match result {
            Err(e) if e.is_not_found() => Ok(()),
            other => other,
        }
    }

    /// The submission's trace context from the job's annotation, when it is well-formed.
    fn traceparent(&self, job: &VolcanoJob) -> Option<String> {
        let value = job
            .metadata
            .annotations
            .as_ref()?
            .get(&self.settings.keys.traceparent)?;
        crate::ops::trace::TraceParent::parse(value).map(|t| t.as_str().to_owned())
    }

    fn outbound(&self, message: &Outbound, traceparent: Option<&str>) -> broker::Outbound {
        let m = match message {
            Outbound::Lifecycle(e) => {
                broker::Outbound::job_event(e, self.content_type, &self.broker)
            }
            Outbound::Accounting(t) => {
                broker::Outbound::accounting(t, self.content_type, &self.broker)
            }
            Outbound::Proxy(p) => broker::Outbound::proxy(p, self.content_type, &self.broker),
        };
        match traceparent {
            Some(tp) => m.with_traceparent(tp),
            None => m,
        }
    }

    /// Publishes in order: consecutive ticks and proxy events together (confirms in flight at once),
    /// each lifecycle event alone after everything before it was confirmed, so consumers see RUNNING
    /// before the ticks and the terminal event after the final tick.
    async fn publish(
        &self,
        messages: &[Outbound],
        traceparent: Option<&str>,
    ) -> Result<(), PublishError> {
        let mut batch = Vec::new();
        for message in messages {
            let out = self.outbound(message, traceparent);
            if matches!(message, Outbound::Lifecycle(_)) {
                if !batch.is_empty() {
                    self.publisher.publish_all(&batch).await?;
                    batch.clear();
                }
                self.publisher.publish(&out).await?;
            } else {
                batch.push(out);
            }
        }
        if !batch.is_empty() {
            self.publisher.publish_all(&batch).await?;
        }
        // Each lifecycle transition once at info, in the job's span (job id, trace id).
        for message in messages {
            if let Outbound::Lifecycle(e) = message
                && e.state != crate::messages::v1::JobState::Unspecified as i32
            {
                tracing::info!(event_id = %e.event_id, status = %e.status, "Published a lifecycle transition.");
            }
        }
        Ok(())
    }

    /// Writes annotations, guarded by what the decision rests on. `Ok(None)`: the job is gone.
    ///
    /// The guard is a JSON patch whose `test` operations hold the job's identity and the annotations as
    /// decided on: every durable fact of the job (what was published, the cause of a deletion, an
    /// extension, another runner's record) is an annotation, so a change to any of them fails the patch
    /// (422) and the decision is made again. A status update by Volcano does not: guarding with the
    /// resourceVersion would turn each of those into a conflict, a read and a second write.
    ///
    /// `unfinalize`: our finalizer goes in the same write (tested too: the finalizers as seen).
    async fn patch(
        &self,
        job: &VolcanoJob,
        set: &BTreeMap<String, String>,
        remove: &BTreeSet<String>,
        unfinalize: bool,
    ) -> Result<Option<Arc<VolcanoJob>>, ClusterError> {
        let finalizers = unfinalize.then(|| self.finalizers_without_ours(job));
        let carried = self.carried_record(job);
        let with_record;
        let set = match &carried {
            Some((_, key)) => {
                with_record = {
                    let mut set = set.clone();
                    set.insert(key.clone(), "true".to_owned());
                    set
                };
                &with_record
            }
            None => set,
        };
        let written = match guarded_annotation_patch(job, set, remove) {
            Some(mut ops) => {
                if let (Some(rest), Value::Array(ops)) = (&finalizers, &mut ops) {
                    let seen = job.metadata.finalizers.clone().unwrap_or_default();
                    ops.push(json!({"op": "test", "path": "/metadata/finalizers", "value": seen}));
                    ops.push(
                        json!({"op": "replace", "path": "/metadata/finalizers", "value": rest}),
                    );
                    // The write that ends the job's watch (see `unfinalize`).
                    ops.push(json!({"op": "add", "path": ENDED_LABEL_PATH, "value": "true"}));
                }
                self.write_json_patch(job, &ops).await
            }
            None => self.patch_by_version(job, set, remove, finalizers).await,
        };
        if let (Some((job_id, _)), Ok(_)) = (&carried, &written) {
            self.confirmed_queued.carried_done(job_id);
        }
        written
    }

    /// The job id and the annotation key of the record of a confirmed QUEUED that this write is to
    /// carry (see [`ConfirmedQueued::carry`]): the submit path left it to the monitor's first write.
    /// Any job this process had its QUEUED confirmed for and that lacks the record gets it, carried or
    /// not: a job created afresh under the name of a gone one whose record went with it (its QUEUED is
    /// the same message, told once), or one whose submit path could not write it. It costs no request.
    fn carried_record(&self, job: &VolcanoJob) -> Option<(String, String)> {
        let name = job.metadata.name.as_deref()?;
        let job_id = crate::pipeline::names::job_id_from_vcjob_name(name)?;
        let key = &self.settings.queued.confirmed;
        let recorded = job
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(key));
        if recorded {
            self.confirmed_queued.carried_done(job_id);
            return None;
        }
        self.confirmed_queued
            .contains(job_id)
            .then(|| (job_id.to_owned(), key.clone()))
    }

    /// The job's finalizers without our cleanup finalizer (other finalizers stay).
    fn finalizers_without_ours(&self, job: &VolcanoJob) -> Vec<String> {
        job.metadata
            .finalizers
            .iter()
            .flatten()
            .filter(|f| **f != self.settings.finalizer)
            .cloned()
            .collect()
    }

    /// A JSON patch (see [`Executor::patch`]): a failed `test` comes back as a conflict.
    async fn write_json_patch(
        &self,
        job: &VolcanoJob,
        ops: &Value,
    ) -> Result<Option<Arc<VolcanoJob>>, ClusterError> {
        let (ns, name) = names(job);
        let op = format!("patch jobs.batch.volcano.sh {ns}/{name}");
        let url = format!(
            "{}/{name}?fieldManager={FIELD_MANAGER}",
            self.jobs(ns).resource_url()
        );
        self.send_patch(&op, || async {
            let request =
                crate::cluster::apply::json_patch_request(&url, ops).classify(|| op.clone())?;
            match self
                .client
                .request::<WatchedJob>(request)
                .await
                .classify(|| op.clone())
            {
                Err(ClusterError::Rejected {
                    code: 422, message, ..
                }) => Err(ClusterError::Conflict {
                    op: op.clone(),
                    message: format!("the job is not as decided on: {message}"),
                }),
                other => other,
            }
        })
        .await
    }

    /// Sends a patch with retries. A conflict is an answer, not a hiccup: the same patch would conflict
    /// again, so it goes back to the caller (re-read, decide again) instead of being retried. `Ok(None)`:
    /// the job is gone.
    async fn send_patch<F, Fut>(
        &self,
        op: &str,
        attempt: F,
    ) -> Result<Option<Arc<VolcanoJob>>, ClusterError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<WatchedJob, ClusterError>>,
    {
        let result = self
            .retry
            .run(op, || async {
                match attempt().await {
                    Err(e) if e.is_conflict() => Ok(Err(e)),
                    other => other.map(Ok),
                }
            })
            .await;
        match result {
            Ok(Ok(w)) => Ok(Some(Arc::new(w.into_job()))),
            Ok(Err(conflict)) => Err(conflict),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A merge patch of annotations that only applies to the version the decision was made on (for a
    /// job without annotations, which a JSON patch cannot test).
    async fn patch_by_version(
        &self,
        job: &VolcanoJob,
        set: &BTreeMap<String, String>,
        remove: &BTreeSet<String>,
        finalizers: Option<Vec<String>>,
    ) -> Result<Option<Arc<VolcanoJob>>, ClusterError> {
        let mut annotations = serde_json::Map::new();
        for key in remove {
            annotations.insert(key.clone(), Value::Null);
        }
        for (key, value) in set {
            annotations.insert(key.clone(), Value::String(value.clone()));
        }
        let mut body = json!({"metadata": {
            "annotations": annotations,
            "resourceVersion": job.metadata.resource_version,
        }});
        if let Some(rest) = finalizers {
            body["metadata"]["finalizers"] = json!(rest);
            body["metadata"]["labels"] = json!({crate::cluster::labels::ENDED: "true"});
        }
        self.write(job, body).await
    }

    /// Removes our finalizer, guarded by the resourceVersion (other finalizers stay), and labels the job
    /// ended: the same write takes it out of every monitor's watch (see [`crate::cluster::labels::ENDED`]).
    async fn unfinalize(&self, job: &VolcanoJob) -> Result<Option<Arc<VolcanoJob>>, ClusterError> {
        let rest = self.finalizers_without_ours(job);
        let body = json!({"metadata": {
            "finalizers": rest,
            "labels": {crate::cluster::labels::ENDED: "true"},
            "resourceVersion": job.metadata.resource_version,
        }});
        self.write(job, body).await
    }

    async fn write(
        &self,
        job: &VolcanoJob,
        body: Value,
    ) -> Result<Option<Arc<VolcanoJob>>, ClusterError> {
        let (ns, name) = names(job);
        let api = self.jobs(ns);
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let op = format!("patch jobs.batch.volcano.sh {ns}/{name}");
        self.send_patch(&op, || async {
            api.patch(name, &params, &Patch::Merge(&body))
                .await
                .classify(|| op.clone())
        })
        .await
    }

    /// Deletes the job (its pods and companions follow by ownerReferences: after it with `background`,
    /// before it with `foreground`). `Ok(None)`: gone already.
    ///
    /// Sent as a raw request: kube's `Api::delete` reads the whole answer (the job with its pod
    /// templates) into a JSON tree only to look at its `kind`, then reads it again; that was a
    /// twentieth of a monitoring runner's CPU. Here the kind is read without keeping anything, then the
    /// slim job.
    async fn delete(
        &self,
        job: &VolcanoJob,
        params: &DeleteParams,
    ) -> Result<Option<Arc<VolcanoJob>>, ClusterError> {
        let (ns, name) = names(job);
        let url = self.jobs(ns).resource_url().to_owned();
        let op = format!("delete jobs.batch.volcano.sh {ns}/{name}");
        let result = self
            .retry
            .run(&op, || async {
                let request = kube::core::Request::new(url.as_str())
                    .delete(name, params)
                    .map_err(kube::Error::BuildRequest)
                    .classify(|| op.clone())?;
                let text = self
                    .client
                    .request_text(request)
                    .await
                    .classify(|| op.clone())?;
                deleted_job(&text)
                    .map_err(kube::Error::SerdeError)
                    .classify(|| op.clone())
            })
            .await;
        match result {
            Ok(job) => Ok(job.map(|w| Arc::new(w.into_job()))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The job and its pods as the API has them now. `None`: the job is gone.
    async fn fresh_view(
        &self,
        job: &VolcanoJob,
    ) -> Result<Option<(Arc<VolcanoJob>, Arc<Vec<Pod>>)>, HandleError> {
        let Some(job) = self.read_job(job).await? else {
            return Ok(None);
        };
        let job = Arc::new(job);
        let pods = self.fresh_pods(&job).await?;
        Ok(Some((job, pods)))
    }

    /// The job by its name as the API has it now (retried); `None`: no job of that name.
    async fn read_job(&self, job: &VolcanoJob) -> Result<Option<VolcanoJob>, ClusterError> {
        let (ns, name) = names(job);
        let api = self.jobs(ns);
        let op = format!("get jobs.batch.volcano.sh {ns}/{name}");
        let got = self
            .retry
            .run(&op, || async {
                api.get(name).await.classify(|| op.clone())
            })
            .await;
        match got {
            Ok(w) => Ok(Some(w.into_job())),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The job's pods, listed just now.
    async fn fresh_pods(&self, job: &VolcanoJob) -> Result<Arc<Vec<Pod>>, HandleError> {
        let (ns, name) = names(job);
        let pods_api: Api<WatchedPod> = Api::namespaced(self.client.clone(), ns);
        let params = ListParams::default().labels(&format!("{LABEL_JOB_NAME}={name}"));
        let op = format!("list pods of {ns}/{name}");
        let listed = self
            .retry
            .run(&op, || async {
                pods_api.list(&params).await.classify(|| op.clone())
            })
            .await?;
        let mut pods: Vec<Pod> = listed.items.into_iter().map(WatchedPod::into_pod).collect();
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(Arc::new(pods))
    }

    /// Before the monitor deletes a running job (its expiry): the tails of its logs go on the job with
    /// the patch that comes before the delete, so they outlive the pods (see [`end_tails`]).
    async fn keep_end_tails(
        &self,
        namespace: &str,
        job: &VolcanoJob,
        pods: &[Pod],
        action: &mut Action,
    ) {
        let prefix = &self.settings.keys.prefix;
        if end_tails::kept_on(job, prefix) {
            return;
        }
        let budget = end_tails::Budget {
            per_rank: self.tail_bytes,
            total: self.tail_total,
        };
        let Some(job_id) = job
            .metadata
            .name
            .as_deref()
            .and_then(crate::pipeline::names::job_id_from_vcjob_name)
        else {
            return;
        };
        let ranks: Vec<(u32, String)> = super::observe::ranks(job_id, pods)
            .into_iter()
            .filter(|r| r.started_at.is_some() || r.terminated.is_some())
            .map(|r| (r.rank, r.pod))
            .collect();
        let snapshot =
            end_tails::snapshot_of(&self.client, namespace, &ranks, prefix, budget).await;
        if let Some((key, value)) = snapshot {
            action.set.insert(key, value);
        }
    }

    /// The end of each rank's log, bounded per rank and in all, each read with retries. A log that
    /// cannot be read is left out.
    async fn tails(&self, namespace: &str, ranks: &[(u32, String)]) -> Vec<RankTail> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let budget = end_tails::Budget {
            per_rank: self.tail_bytes,
            total: self.tail_total,
        };
        end_tails::read_with(ranks, budget, |pod, params| {
            let api = api.clone();
            async move {
                let op = format!("read the log of pod {namespace}/{pod}");
                self.retry
                    .run(&op, || async {
                        api.logs(&pod, &params).await.classify(|| op.clone())
                    })
                    .await
            }
        })
        .await
    }
}

/// The result of carrying out an [`Action`].
enum Acted {
    /// Done; the job as written, when a write returned it.
    Settled(Option<Arc<VolcanoJob>>),
    /// The job changed under us: re-read and decide again.
    Conflict,
    /// The job no longer exists.
    Gone,
}

/// Whether `step` tells nothing that `confirmed` does not hold already: it only records (and finishes)
/// what this handling has told.
fn records_only(step: &Step, confirmed: &HashSet<String>) -> bool {
    matches!(step, Step::Act(action)
        if !action.publish.is_empty()
            && action.publish.iter().all(|m| confirmed.contains(message_id(m))))
}

fn message_id(message: &Outbound) -> &str {
    match message {
        Outbound::Lifecycle(e) => &e.event_id,
        Outbound::Accounting(t) => &t.tick_id,
        Outbound::Proxy(p) => &p.event_id,
    }
}

/// The JSON patch that writes `set` and removes `remove` (only what is there: removing a missing member
/// fails) on the job as it was seen: `test`s of its uid and of all its annotations first. `None` when the
/// job has no uid or no annotations to test (a merge patch guarded by the resourceVersion is used then).
pub(crate) fn guarded_annotation_patch(
    job: &VolcanoJob,
    set: &BTreeMap<String, String>,
    remove: &BTreeSet<String>,
) -> Option<Value> {
    let uid = job.metadata.uid.as_ref()?;
    let annotations = job.metadata.annotations.as_ref()?;
    let pointer = |key: &str| {
        format!(
            "/metadata/annotations/{}",
            key.replace('~', "~0").replace('/', "~1")
        )
    };
    let mut ops = vec![
        json!({"op": "test", "path": "/metadata/uid", "value": uid}),
        json!({"op": "test", "path": "/metadata/annotations", "value": annotations}),
    ];
    for key in remove {
        if annotations.contains_key(key) && !set.contains_key(key) {
            ops.push(json!({"op": "remove", "path": pointer(key)}));
        }
    }
    for (key, value) in set {
        ops.push(json!({"op": "add", "path": pointer(key), "value": value}));
    }
    Some(Value::Array(ops))
}

fn names(job: &VolcanoJob) -> (&str, &str) {
    (
        job.metadata.namespace.as_deref().unwrap_or_default(),
        job.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// A delete's answer: the job while its finalizers hold it (`Some`), or a `Status` when it went at
/// once (`None`).
fn deleted_job(text: &str) -> Result<Option<WatchedJob>, serde_json::Error> {
    #[derive(serde::Deserialize)]
    struct Kind<'a> {
        #[serde(borrow, default)]
        kind: Option<std::borrow::Cow<'a, str>>,
    }
    let kind: Kind<'_> = serde_json::from_str(text)?;
    if kind.kind.as_deref() == Some("Status") {
        return Ok(None);
    }
    serde_json::from_str(text).map(Some)
}

/// The EndpointSlice of a job's peers Service `service` (see [`Executor::write_peer_endpoints`]). One
/// address family per slice, as Kubernetes requires: the first address's; a peer of the other family
/// (a dual-stack cluster whose pods' first addresses differ) is left out rather than written wrongly.
fn peer_endpoint_slice(
    job: &VolcanoJob,
    service: &str,
    addresses: &BTreeMap<String, String>,
) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    use crate::pipeline::names::{MANAGED_BY, MANAGED_BY_LABEL};
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let v6 = |a: &str| a.contains(':');
    let family_v6 = addresses.values().next().is_some_and(|a| v6(a));
    let endpoints = addresses
        .iter()
        .filter(|(_, a)| v6(a) == family_v6)
        .map(|(hostname, address)| Endpoint {
            addresses: vec![address.clone()],
            hostname: Some(hostname.clone()),
            conditions: Some(EndpointConditions {
                ready: Some(true),
                ..EndpointConditions::default()
            }),
            ..Endpoint::default()
        })
        .collect();
    let labels = BTreeMap::from([
        ("kubernetes.io/service-name".to_owned(), service.to_owned()),
        (
            "endpointslice.kubernetes.io/managed-by".to_owned(),
            MANAGED_BY.to_owned(),
        ),
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
    ]);
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(service.to_owned()),
            labels: Some(labels),
            owner_references: Some(vec![crate::pipeline::desired::owner_reference(
                job.metadata.name.as_deref().unwrap_or_default(),
                job.metadata.uid.as_deref().unwrap_or_default(),
            )]),
            ..ObjectMeta::default()
        },
        address_type: if family_v6 { "IPv6" } else { "IPv4" }.to_owned(),
        endpoints,
        ports: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deletes_answer_is_the_held_job_or_a_status_for_one_gone_at_once() {
        let held = r#"{"apiVersion":"batch.volcano.sh/v1alpha1","kind":"Job",
            "metadata":{"name":"j-1","namespace":"ns","deletionTimestamp":"2026-01-01T00:00:00Z",
                        "finalizers":["x/y"]},
            "spec":{"queue":"q","tasks":[{"name":"t","replicas":2,"template":{"spec":{}}}]},
            "status":{"state":{"phase":"Completed"}}}"#;
        let job = deleted_job(held)
            .unwrap()
            .expect("a job held by its finalizers");
        assert_eq!(job.metadata.name.as_deref(), Some("j-1"));
        assert!(job.metadata.deletion_timestamp.is_some());
        let job = job.into_job();
        assert_eq!(job.spec.tasks[0].replicas, 2);
        assert_eq!(
            job.status.map(|s| s.state.phase),
            Some(crate::volcano::JobPhase::Completed)
        );

        let gone = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success",
            "details":{"name":"j-1","group":"batch.volcano.sh","kind":"jobs","uid":"u"}}"#;
        assert!(deleted_job(gone).unwrap().is_none());

        assert!(deleted_job("<html>bad gateway</html>").is_err());
    }

    fn job(annotations: &[(&str, &str)]) -> VolcanoJob {
        let mut job: VolcanoJob = serde_json::from_value(json!({
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "metadata": {"name": "j-1", "namespace": "ns", "uid": "u-1", "resourceVersion": "7"},
            "spec": {}
        }))
        .unwrap();
        job.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        job
    }

    fn apply(target: &VolcanoJob, ops: &Value) -> Result<Value, String> {
        let mut doc = serde_json::to_value(target).unwrap();
        let ops: json_patch::Patch = serde_json::from_value(ops.clone()).unwrap();
        json_patch::patch(&mut doc, &ops).map_err(|e| e.to_string())?;
        Ok(doc)
    }

    /// The patch writes and removes the keys on the job as seen, whatever else changed (its status, its
    /// resourceVersion), and fails on a job whose annotations or identity are not the ones decided on.
    #[test]
    fn the_guard_holds_the_annotations_and_the_uid_not_the_version() {
        let seen = job(&[("ucloud.dk/state", "QUEUED"), ("ucloud.dk/a~b", "x")]);
        let set = BTreeMap::from([("ucloud.dk/state".to_owned(), "RUNNING".to_owned())]);
        let remove = BTreeSet::from(["ucloud.dk/a~b".to_owned(), "ucloud.dk/absent".to_owned()]);
        let ops = guarded_annotation_patch(&seen, &set, &remove).unwrap();

        // Volcano moved the status on: the patch still applies.
        let mut now = seen.clone();
        now.metadata.resource_version = Some("8".into());
        let done = apply(&now, &ops).unwrap();
        assert_eq!(
            done["metadata"]["annotations"],
            json!({"ucloud.dk/state": "RUNNING"})
        );

        // Another writer recorded something (a cancel's cause): the test fails.
        let mut changed = seen.clone();
        changed
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("ucloud.dk/terminationCause".into(), "cancelled".into());
        assert!(apply(&changed, &ops).is_err());
        // A job of the same name created again: the test fails.
        let mut recreated = seen.clone();
        recreated.metadata.uid = Some("u-2".into());
        assert!(apply(&recreated, &ops).is_err());

        // Nothing to test on: the resourceVersion guards instead.
        let mut bare = seen.clone();
        bare.metadata.annotations = None;
        assert!(guarded_annotation_patch(&bare, &set, &remove).is_none());
    }

    #[test]
    fn a_step_records_only_when_it_tells_nothing_new() {
        let event = |id: &str| {
            Outbound::Lifecycle(crate::messages::v1::JobEvent {
                event_id: id.to_owned(),
                ..Default::default()
            })
        };
        let act = |ids: &[&str]| {
            Step::Act(Action {
                what: "start",
                publish: ids.iter().map(|id| event(id)).collect(),
                ..Action::default()
            })
        };
        let told: HashSet<String> = ["h1/QUEUED".to_owned(), "h1/RUNNING".to_owned()].into();
        assert!(records_only(&act(&["h1/RUNNING"]), &told));
        assert!(records_only(&act(&["h1/QUEUED", "h1/RUNNING"]), &told));
        assert!(!records_only(&act(&["h1/RUNNING", "h1/tick/1"]), &told));
        assert!(!records_only(&act(&[]), &told), "a write of its own");
        assert!(!records_only(&act(&["h1/RUNNING"]), &HashSet::new()));
        assert!(!records_only(&Step::Wait { next_check: None }, &told));
    }
}
