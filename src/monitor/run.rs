//! The monitor's loop. One task owns the cache, the work queue and the timers; it selects on:
//!
//! - three watches (`kube::runtime::watcher`): managed VolcanoJobs, their pods, and every PodGroup (for
//!   queue positions). A change enqueues the job it concerns.
//! - a full reconciliation every `reconcile_interval` (W1): a metadata-only list of each kind is compared
//!   with the cache ([`super::verify`]); then every job is looked at (a "pass"). A difference the watch
//!   does not explain within [`SUSPECT_GRACE`] makes that kind's watch start over with a full list, and
//!   what that list no longer has is gone. A job whose objects have not changed since it was last
//!   decided, and that has no deadline due, keeps its decision: deciding it again would give the same.
//! - the timers: each job's next check (expiry, warnings, the next tick) in the clock's time, and retries
//!   after failures in real time. They fire whatever the event traffic (W2, W3).
//! - the shard set: gaining a shard starts a full reconciliation, so a runner that takes over acts on
//!   fresh state within one list.
//! - the workers: at most `max_concurrent` jobs are handled at once, one worker per job at a time; a
//!   change that arrives while its job is in hand makes the job go round once more.
//!
//! Every job is handled on its own: a failure is logged and retried with backoff for that job only (W6,
//! W7), and nothing is acted on for a job whose shard this runner does not hold at that moment.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{BoxStream, FuturesUnordered};
use futures::{Future, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::cache::{
    Cache, FastMap, FastSet, Fingerprint, Intake, JobKey, Kind, Snapshot, WatchedGroup, WatchedJob,
    WatchedNode, WatchedPod, is_newer,
};
use super::clock::{Clock, SystemClock};
use super::decide::Settings;
use super::execute::{Executor, Handled};
use super::queued::ConfirmedQueued;
use super::timers::{Backoff, Deadlines, ESTIMATE_EVERY};
use super::verify::{self, Listed, Suspect};
use super::waiting::{Lane, Waiting};
use crate::broker::Publisher;
use crate::cluster::HeldShards;
use crate::config::Config;
use crate::config::monitor::MonitorConfig;
use crate::forecast::Node;
use crate::volcano::{LABEL_JOB_NAME, Queue, VolcanoJob};

/// How long a difference between the API and the cache may stay unexplained before the watch of that
/// kind is taken to have missed it. A healthy watch delivers a change within milliseconds; this leaves
/// room for a busy API server without letting a broken watch go unnoticed for long.
pub const SUSPECT_GRACE: Duration = Duration::from_secs(3);

/// Whether the submit path of this process has submissions in hand, told when that changes (see
/// [`Monitor::with_submit_load`]): the loop wakes when the load is over instead of looking again and
/// again whether it is.
pub type SubmitLoad = tokio::sync::watch::Receiver<bool>;

/// What one full reconciliation pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Passes completed since start (0: none yet).
    pub passes: u64,
    /// Jobs held in the cache at the end of the pass.
    pub jobs: usize,
    /// Pods and PodGroups held in the cache at the end of the pass (with `jobs`: what a runner's memory
    /// follows, the live jobs' objects and not the ended ones kept for the retention).
    pub pods: usize,
    pub groups: usize,
    /// Jobs of this runner's shards looked at in the pass.
    pub owned: usize,
    /// Of those, the jobs decided afresh; the others had not changed since their last decision.
    pub decided: usize,
    /// Jobs found gone by the pass's lists.
    pub gone: usize,
    /// From the start of the lists to the last job of the pass handled.
    pub took: Duration,
    /// How far behind the ticks of those jobs are ([`super::lag::overdue`]: the longest).
    pub accounting_lag: Duration,
}

/// A job handled: its key, what came of it, and the fingerprint of the snapshot it was decided on.
type Work = Pin<Box<dyn Future<Output = (JobKey, Handled, Option<Fingerprint>)> + Send>>;

/// The three metadata lists of a reconciliation, jobs, pods and PodGroups.
type Verifying = Pin<Box<dyn Future<Output = Result<[Listed; 3], kube::Error>> + Send>>;

/// A list a pass waits for: a kind's full list (through its watch), or the reconciliation's metadata
/// lists of all three kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Awaited {
    Full(Kind),
    Metadata,
    /// The first list of nodes (the start-time estimates), awaited by the first pass only.
    Nodes,
    /// The first list of Queues (which are `fifo`), likewise.
    Queues,
}

/// A pass in progress.
struct Pass {
    started: Instant,
    lists_pending: HashSet<Awaited>,
    outstanding: FastSet<JobKey>,
    owned: usize,
    decided: usize,
    gone: usize,
    accounting_lag: jiff::SignedDuration,
}

/// The loop's state, apart from the streams.
struct Loop {
    exec: Arc<Executor>,
    cache: Cache,
    /// Jobs to decide, each in one lane, with when it came to it. [`Lane::Ready`]: taken once
    /// [`Loop::hold`] has passed. [`Lane::Urgent`]: jobs whose QUEUED this monitor is to tell (left to
    /// it by a submitting runner that did not hold the job's shard, see [`super::queued::BY_MONITOR`])
    /// and has not told yet: taken after `coalesce` even while the submit path is busy, since the job's
    /// user waits for that QUEUED as for the submit path's own (one `defer_under_load` would be added
    /// to it on a busy runner).
    waiting: Waiting<JobKey, Instant>,
    /// Whether this process's submit path is busy (then the jobs wait longer, `defer_under_load`).
    submit_load: Option<SubmitLoad>,
    /// `[monitor] coalesce`: how long a queued job waits before it is decided. The API tells one change
    /// of a job as a burst of events (its status, its PodGroup, its pod created, bound and started, a
    /// few milliseconds apart); one decision on the last of them, rather than one per event, is most of
    /// what the monitor saves per job.
    coalesce: Duration,
    /// `[monitor] defer_under_load`: how long it waits instead while the submit path has submissions
    /// in hand. Submitting is what the orchestrator waits for; the monitor tolerates lag (its decisions
    /// are made from the latest state whenever they are made, and a deadline is due by the cluster's
    /// clock, not by when it was looked at).
    defer_under_load: Duration,
    busy: FastSet<JobKey>,
    dirty: FastSet<JobKey>,
    /// Jobs that vanished before their end was published, with their last state.
    gone: FastMap<JobKey, (Arc<VolcanoJob>, Arc<Vec<Pod>>)>,
    checks: Deadlines<JobKey, jiff::Timestamp>,
    retries: Deadlines<JobKey, Instant>,
    backoff: Backoff<JobKey>,
    pass: Option<Pass>,
    passes: u64,
    max_concurrent: usize,
    /// The fingerprint of the snapshot each job was last decided on, when that decision was to wait.
    settled: FastMap<JobKey, Fingerprint>,
    /// Differences found by the last reconciliation that the watches have yet to explain, by kind.
    suspects: Vec<(Kind, Suspect)>,
    /// When the suspects are judged.
    suspects_due: Option<Instant>,
    /// The nodes jobs can be placed on, by name, for the start-time estimates (from their own watch).
    nodes: std::collections::BTreeMap<String, Node>,
    /// The nodes of a full list in progress.
    nodes_listing: Option<std::collections::BTreeMap<String, Node>>,
    /// The `fifo` Queues (from their own watch), for the start-time estimates.
    fifo_queues: super::queues::FifoQueues,
    /// Something changed since the start-time estimates were made, and when they were.
    estimates_stale: bool,
    /// In the clock's time and in real time: due when either has moved on by [`ESTIMATE_EVERY`], so a
    /// simulated clock that jumps finds them due, and one that stands still does not hold them back.
    estimated_at: Option<(jiff::Timestamp, Instant)>,
    /// Shards just gained, whose jobs wait for the full lists the gain started: the cache may not have
    /// the last writes of the runner that handed them over yet (its watch events were cut off), and a
    /// decision on it would publish a transition that runner had published and recorded.
    listing_shards: std::collections::BTreeSet<u32>,
    /// The shards held as the loop last took the leases' news in ([`Loop::shards_changed`]). The
    /// leases publish a gain at any moment, and the executor's view of them (`exec.shards`) has it at
    /// once; until the loop has taken it in, its watches have not started over, so a job of the shard
    /// gained is held back as while [`Loop::listing_shards`] (see [`may_decide`]).
    taken_in: std::collections::BTreeSet<u32>,
    /// Jobs of those shards that came up meanwhile, queued again once the lists are in.
    held_back: FastSet<JobKey>,
    /// The watches' first lists are in: before, no shard is listed ([`Loop::say_listed`]).
    lists_in: bool,
    /// Every node's taints and version (cordoned ones too), for the node reservations
    /// (`[monitor] reserve_nodes`, [`super::reserve`]).
    node_taints: std::collections::BTreeMap<String, super::reserve::NodeTaints>,
    node_taints_listing: Option<std::collections::BTreeMap<String, super::reserve::NodeTaints>>,
    /// The reservation taint's key.
    reservation_key: String,
    /// The node writes of the last round (reservations and maintenance taints), while they run: one
    /// round at a time, each decided from what the watch shows after the one before.
    reserving: Option<tokio::task::JoinHandle<()>>,
    /// When the node taints are planned again: the earliest end of a maintenance window not over (its
    /// taints go then, [`super::maintenance::plan_taints`]), or shortly after a round that wrote.
    taints_due: Option<jiff::Timestamp>,
    /// Whether the decisions have been told the node patch was refused (see
    /// [`Executor::taints_refused`]).
    taints_refused_seen: bool,
    /// While the node patch is refused: when the maintenance taints are tried again
    /// ([`TAINTS_RETRY`]).
    taints_retry_at: Option<jiff::Timestamp>,
    /// Where the watch events and decisions are counted (what monitoring costs per job).
    metrics: Option<crate::ops::Metrics>,
}

/// How long after the node patch was refused the maintenance taints are tried again: a refusal during
/// an RBAC rollout is not taken for good, and one that lasts costs one refused write a minute.
const TAINTS_RETRY: jiff::SignedDuration = jiff::SignedDuration::from_secs(60);

/// Objects per page of a watch's initial list.
const WATCH_PAGE: u32 = 100;

/// Runs the monitor until `shutdown`. See the module documentation.
/// A kind's watch: a stream of its events, restarted with a full list when it ends.
type Watch<K> = BoxStream<'static, Result<Event<K>, watcher::Error>>;

/// How the monitor's watches start (and start over): the APIs, their selectors and pages.
struct Watches {
    client: kube::Client,
    jobs_api: Api<WatchedJob>,
    pods_api: Api<WatchedPod>,
    groups_api: Api<WatchedGroup>,
    selector: String,
    pod_selector: String,
    paged: watcher::Config,
}

impl Watches {
    fn new(client: kube::Client, managed: &str) -> Self {
        // Ended jobs are left out, and the pods' lists leave finished pods out (see
        // [`super::live_pods`]): what the monitor holds and lists grows with the live jobs, not with
        // the jobs kept for the retention (see [`crate::cluster::labels::ENDED`]).
        let selector = format!("{managed},!{}", crate::cluster::labels::ENDED);
        Self {
            jobs_api: Api::all(client.clone()),
            pods_api: Api::all(client.clone()),
            groups_api: Api::all(client.clone()),
            client,
            // Only pods of Volcano jobs: the cache keeps no other, and the reconciliation's list must
            // match it.
            pod_selector: format!("{selector},{LABEL_JOB_NAME}"),
            selector,
            // Pages of a hundred, not kube's five hundred: a runner's peak memory is its full cache plus
            // the page being read when a watch starts over, and a fifth of the page costs only more
            // round trips on a start.
            paged: watcher::Config::default().page_size(WATCH_PAGE),
        }
    }

    fn jobs(&self) -> Watch<WatchedJob> {
        let managed = self.paged.clone().labels(&self.selector);
        watcher::watcher(self.jobs_api.clone(), managed)
            .default_backoff()
            .boxed()
    }

    /// Its lists leave finished pods out, its watch does not (see [`super::live_pods`]).
    fn pods(&self) -> Watch<WatchedPod> {
        super::live_pods::watch(self.pods_api.clone(), self.pod_selector.clone(), WATCH_PAGE)
            .default_backoff()
            .boxed()
    }

    fn groups(&self) -> Watch<WatchedGroup> {
        watcher::watcher(self.groups_api.clone(), self.paged.clone())
            .default_backoff()
            .boxed()
    }

    /// The nodes, for the start-time estimates of waiting jobs: a few hundred objects that rarely
    /// change.
    fn nodes(&self) -> Watch<WatchedNode> {
        let api: Api<WatchedNode> = Api::all(self.client.clone());
        watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed()
    }

    /// The Volcano Queues, for which of them are `fifo` (a handful of objects).
    fn queues(&self) -> Watch<Queue> {
        let api: Api<Queue> = Api::all(self.client.clone());
        watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed()
    }

    /// The metadata lists of a reconciliation. One kind after another, not the three at once: a pass
    /// holds one page in memory instead of three, and its CPU is the same (the pass is not urgent; the
    /// watches are what react).
    fn verify(&self) -> Verifying {
        let client = self.client.clone();
        let urls = [
            self.jobs_api.resource_url().to_owned(),
            self.pods_api.resource_url().to_owned(),
            self.groups_api.resource_url().to_owned(),
        ];
        let selectors = [
            Some(self.selector.clone()),
            Some(self.pod_selector.clone()),
            None,
        ];
        Box::pin(async move {
            let [jobs, pods, groups] = &urls;
            let [sj, sp, sg] = &selectors;
            let j = verify::list_versions(&client, jobs, sj.as_deref(), None).await?;
            // The pods as the pod watch lists them: those not finished.
            let unfinished = Some(super::live_pods::UNFINISHED);
            let p = verify::list_versions(&client, pods, sp.as_deref(), unfinished).await?;
            let g = verify::list_versions(&client, groups, sg.as_deref(), None).await?;
            Ok([j, p, g])
        })
    }
}

/// The running watches.
struct Streams {
    jobs: Watch<WatchedJob>,
    pods: Watch<WatchedPod>,
    groups: Watch<WatchedGroup>,
    nodes: Watch<WatchedNode>,
    /// The node watch ended for good (this runner may not watch nodes).
    nodes_forbidden: bool,
    queues: Watch<Queue>,
    /// Likewise for the Queue watch.
    queues_forbidden: bool,
}

impl Streams {
    fn start(watches: &Watches) -> Self {
        Self {
            jobs: watches.jobs(),
            pods: watches.pods(),
            groups: watches.groups(),
            nodes: watches.nodes(),
            nodes_forbidden: false,
            queues: watches.queues(),
            queues_forbidden: false,
        }
    }

    /// The reconciliation's metadata lists are in: compared with the cache, or, when they failed,
    /// every watch starts over with a full list.
    fn listed(
        &mut self,
        watches: &Watches,
        state: &mut Loop,
        listed: Result<[Listed; 3], kube::Error>,
    ) {
        match listed {
            Ok(lists) => state.verified(lists),
            Err(e) => {
                tracing::warn!(error = %e, "Listing for the reconciliation failed; every watch starts over with a full list.");
                self.start_over(watches, state, &ALL_KINDS);
            }
        }
    }

    /// The suspects' grace is over: the watch of a kind that did not explain its differences missed
    /// something, and starts over.
    fn judge(&mut self, watches: &Watches, state: &mut Loop, reporter: &Reporter<'_>) {
        let missed = state.judge_suspects();
        if !missed.is_empty() {
            missed.iter().for_each(|kind| reporter.restarted(*kind));
            self.start_over(watches, state, &missed);
        }
    }

    /// The watches of `kinds` start over with a full list, and a pass waits for those lists.
    fn start_over(&mut self, watches: &Watches, state: &mut Loop, kinds: &[Kind]) {
        for kind in kinds {
            match kind {
                Kind::Jobs => self.jobs = watches.jobs(),
                Kind::Pods => self.pods = watches.pods(),
                Kind::Groups => self.groups = watches.groups(),
            }
        }
        state.begin_pass(kinds);
    }
}

/// Where the loop reports: watch restarts, shards held, passes.
struct Reporter<'a> {
    metrics: Option<crate::ops::Metrics>,
    shards: u32,
    reports: &'a tokio::sync::watch::Sender<PassReport>,
}

impl Reporter<'_> {
    fn shards(&self, held: &std::collections::BTreeSet<u32>) {
        if let Some(metrics) = &self.metrics {
            metrics.set_lease_shards(held.len(), self.shards);
        }
    }

    fn restarted(&self, kind: Kind) {
        if let Some(metrics) = &self.metrics {
            metrics.watch_restarted(watch_name(kind));
        }
    }

    fn pass(&self, report: PassReport) {
        if let Some(metrics) = &self.metrics {
            metrics.set_monitored_jobs(report.owned);
            metrics.set_accounting_lag(report.accounting_lag);
        }
        self.reports.send_replace(report);
    }

    /// A watch's item: its event, or `None` when it failed (logged; it restarts by itself) or ended
    /// (`*ended` set: the caller starts it over).
    fn watched<K>(
        &self,
        kind: Kind,
        item: Option<Result<Event<K>, watcher::Error>>,
        ended: &mut bool,
    ) -> Option<Event<K>> {
        match item {
            Some(Ok(event)) => Some(event),
            Some(Err(e)) => {
                self.restarted(kind);
                match kind {
                    Kind::Jobs => {
                        tracing::warn!(error = %e, "The VolcanoJob watch failed; it restarts by itself.")
                    }
                    Kind::Pods => {
                        tracing::warn!(error = %e, "The pod watch failed; it restarts by itself.")
                    }
                    Kind::Groups => {
                        tracing::warn!(error = %e, "The PodGroup watch failed; it restarts by itself.")
                    }
                }
                None
            }
            None => {
                *ended = true;
                None
            }
        }
    }
}

/// The maintenance windows: the runner's watch of their ConfigMaps when it shares this process, else
/// one of the monitor's own, polled by the loop (not spawned: it stops with the monitor, however the
/// monitor stops). Every decision reads them from the receiver.
fn windows_source(
    m: &Monitor,
) -> (
    tokio::sync::watch::Receiver<Option<crate::cluster::Windows>>,
    impl Future<Output = ()> + use<>,
) {
    match m.windows.clone() {
        Some(windows) => (
            windows,
            futures::future::Either::Left(std::future::pending()),
        ),
        None => {
            let (windows_tx, windows) = tokio::sync::watch::channel(None);
            let follow = crate::cluster::maintenance::follow(
                m.client.clone(),
                m.config.cluster.namespace.clone(),
                m.config.cluster.relist_interval,
                windows_tx,
            );
            (windows, futures::future::Either::Right(follow))
        }
    }
}

/// The executor the loop's workers carry steps out with.
fn executor(
    m: &Monitor,
    windows: tokio::sync::watch::Receiver<Option<crate::cluster::Windows>>,
) -> Arc<Executor> {
    Arc::new(Executor::new(
        m.client.clone(),
        m.publisher.clone(),
        Settings::new(m.config.clone(), m.runner_id.clone()),
        m.clock.clone(),
        m.shards.clone(),
        m.confirmed_queued.clone(),
        windows,
    ))
}

/// The monitoring duty of one runner. Build it with [`Monitor::new`], then [`Monitor::run`] it until
/// shutdown; it acts only on jobs whose shard the runner holds.
pub struct Monitor {
    pub(crate) client: kube::Client,
    pub(crate) publisher: Publisher,
    pub(crate) config: Arc<Config>,
    pub(crate) runner_id: String,
    pub(crate) shards: watch::Receiver<HeldShards>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) poll: Duration,
    pub(crate) reports: watch::Sender<PassReport>,
    /// Where watch restarts, held shards and monitored jobs are reported (see [`Monitor::with_metrics`]).
    pub(crate) metrics: Option<crate::ops::Metrics>,
    /// See [`Monitor::with_confirmed_queued`].
    pub(crate) confirmed_queued: ConfirmedQueued,
    /// See [`Monitor::with_windows`].
    pub(crate) windows: Option<watch::Receiver<Option<crate::cluster::Windows>>>,
    /// See [`Monitor::with_submit_load`].
    pub(crate) submit_load: Option<SubmitLoad>,
}

impl Monitor {
    /// The duty for the jobs of the shards in `shards` (from [`crate::cluster::LeaseHandle::subscribe`]).
    /// `runner_id` goes into every event.
    pub fn new(
        client: kube::Client,
        publisher: Publisher,
        config: Arc<Config>,
        runner_id: String,
        shards: watch::Receiver<HeldShards>,
    ) -> Self {
        Self {
            client,
            publisher,
            config,
            runner_id,
            shards,
            clock: Arc::new(SystemClock),
            poll: Duration::from_millis(100),
            reports: watch::Sender::new(PassReport::default()),
            metrics: None,
            confirmed_queued: ConfirmedQueued::default(),
            windows: None,
            submit_load: None,
        }
    }

    /// Reads the maintenance windows from `windows` (the runner's watch in the same process,
    /// [`crate::runner::Runner::windows`]) instead of following their ConfigMaps itself.
    pub fn with_windows(
        mut self,
        windows: watch::Receiver<Option<crate::cluster::Windows>>,
    ) -> Self {
        self.windows = Some(windows);
        self
    }

    /// Sends no copy of a job's QUEUED before its first event when `confirmed` says that this process
    /// (the runner's submit path, [`crate::runner::Runner::confirmed_queued`]) already had it confirmed.
    /// Without it the monitor sends the copy for every job, which is always safe.
    pub fn with_confirmed_queued(mut self, confirmed: ConfirmedQueued) -> Self {
        self.confirmed_queued = confirmed;
        self
    }

    /// Lets the submissions of this process go first: while `busy` says the submit path has
    /// submissions in hand, a job's changes wait up to `[monitor] defer_under_load` before the job is
    /// decided (instead of `coalesce`), so that the runner's core goes to submitting and each job is
    /// decided once on the changes of that while. Without it the monitor never defers.
    pub fn with_submit_load(mut self, busy: SubmitLoad) -> Self {
        self.submit_load = Some(busy);
        self
    }

    /// Reports into `metrics`: watch restarts, the shards held, the jobs monitored.
    pub fn with_metrics(mut self, metrics: crate::ops::Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Takes time from `clock` instead of the system clock. A clock that does not run by itself
    /// ([`Clock::real_until`] is `None`) is looked at every `poll`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>, poll: Duration) -> Self {
        self.clock = clock;
        self.poll = poll;
        self
    }

    /// Reports of full reconciliation passes, for metrics, benchmarks and tests.
    pub fn reports(&self) -> watch::Receiver<PassReport> {
        self.reports.subscribe()
    }

    /// Runs until `shutdown` is cancelled; then stops taking new work, lets the jobs in hand finish
    /// their current step (each step is safe to interrupt anyway), and returns.
    pub async fn run(self, shutdown: CancellationToken) {
        run(self, shutdown).await
    }
}

/// The monitor's loop (see the module documentation): until `shutdown`, or until the leases are gone.
pub async fn run(m: Monitor, shutdown: CancellationToken) {
    let mc = m.config.monitor.clone();
    let (mut windows, follow_windows) = windows_source(&m);
    let mut follow_windows = std::pin::pin!(follow_windows);
    let mut windows_open = true;
    let exec = executor(&m, windows.clone());
    let watches = Watches::new(m.client.clone(), &m.config.cluster.managed_selector);
    let mut streams = Streams::start(&watches);
    let mut state = Loop::new(exec, &mc);
    state.submit_load = m.submit_load.clone();
    state.metrics = m.metrics.clone();
    // Its own receiver of the load, waited on below; the state's is read by `Loop::hold`.
    let mut load = m.submit_load.clone();
    let mut verifying: Option<Verifying> = None;
    let mut resync = resync_timer(mc.reconcile_interval);
    let mut shards = m.shards.clone();
    state.taken_in = shards.borrow_and_update().held().clone();
    let mut workers: FuturesUnordered<Work> = FuturesUnordered::new();
    let clock = m.clock.clone();
    let reporter = Reporter {
        metrics: m.metrics.clone(),
        shards: m.config.cluster.lease.shards,
        reports: &m.reports,
    };
    reporter.shards(&state.taken_in);
    loop {
        state.dispatch(&mut workers);
        if let Some(report) = state.finish_pass() {
            reporter.pass(report);
        }
        let wake = state.next_wake(clock.as_ref(), m.poll, workers.len());
        let mut ended = false;
        tokio::select! {
            () = shutdown.cancelled() => break,
            Some((key, handled, fingerprint)) = workers.next(), if !workers.is_empty() => state.finished(key, handled, fingerprint),
            item = streams.jobs.next() => {
                if let Some(event) = reporter.watched(Kind::Jobs, item, &mut ended) { state.on_job(event) }
                if ended { streams.jobs = watches.jobs() }
            }
            item = streams.pods.next() => {
                if let Some(event) = reporter.watched(Kind::Pods, item, &mut ended) { state.on_pod(event) }
                if ended { streams.pods = watches.pods() }
            }
            item = streams.groups.next() => {
                if let Some(event) = reporter.watched(Kind::Groups, item, &mut ended) { state.on_group(event) }
                if ended { streams.groups = watches.groups() }
            }
            item = streams.nodes.next(), if !streams.nodes_forbidden => {
                streams.nodes_forbidden = state.on_node_watch(item);
            }
            item = streams.queues.next(), if !streams.queues_forbidden => {
                streams.queues_forbidden = state.on_queue_watch(item);
            }
            () = sleep(wake) => state.fire(clock.now(), Instant::now()),
            // The submit load changed: the next turn takes the jobs it no longer holds back.
            changed = async { load.as_mut().expect("guarded").changed().await }, if load.is_some() => {
                if changed.is_err() { load = None }
            }
            _ = resync.tick() => if let Some(lists) = state.resync(&watches) {
                verifying = Some(lists);
            },
            listed = async { verifying.as_mut().expect("guarded").await }, if verifying.is_some() => {
                verifying = None;
                streams.listed(&watches, &mut state, listed);
            }
            () = sleep_until(state.suspects_due) => streams.judge(&watches, &mut state, &reporter),
            () = &mut follow_windows => {}
            changed = windows.changed(), if windows_open => {
                windows_open = changed.is_ok();
                if windows_open {
                    windows.borrow_and_update();
                    // A window scheduled or cancelled changes what every running job is due,
                    // and every estimate.
                    state.requeue_all();
                }
            }
            changed = shards.changed() => {
                if changed.is_err() {
                    // The leases are gone (shutdown in progress): nothing is held any more.
                    break;
                }
                let now_held = shards.borrow_and_update().held().clone();
                if state.shards_changed(now_held, &reporter) {
                    verifying = None;
                    streams.start_over(&watches, &mut state, &ALL_KINDS);
                }
            }
        }
    }
    drain(state, workers).await;
}

/// The full reconciliation's timer: every `interval`, the first one `interval` from now; a tick
/// missed (a long pass) is not made up for.
fn resync_timer(interval: Duration) -> tokio::time::Interval {
    let mut resync = tokio::time::interval_at(Instant::now() + interval, interval);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    resync
}

/// Each step is safe to interrupt; gives the jobs in hand (and a round of node writes) a moment to
/// finish theirs.
async fn drain(mut state: Loop, mut workers: FuturesUnordered<Work>) {
    let reserving = state.reserving.take();
    let drain = async {
        while workers.next().await.is_some() {}
        if let Some(task) = reserving {
            let _ = task.await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), drain).await;
}

/// The span of one round of work on a job: its job id and the trace of its submission (from the
/// VolcanoJob's `traceparent` annotation, continued), so the monitor's log lines join the runner's.
fn job_span(exec: &Executor, key: &JobKey, job: &VolcanoJob) -> tracing::Span {
    let trace = job
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&exec.settings.keys.traceparent))
        .and_then(|v| crate::ops::TraceContext::parse(v).ok())
        .map_or_else(crate::ops::TraceContext::new_root, |parent| parent.child());
    crate::ops::trace::job_span(key.job_id().unwrap_or_default(), &trace)
}

/// What the loop does with a job due to be decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// Decide it now.
    Decide,
    /// Hold it back until the lists of its shard are in ([`Loop::held_back`]).
    HoldBack,
    /// Not this runner's: keep nothing for it.
    NotOurs,
}

/// Whether a job of `shard` (held by the leases now: `owns`) may be decided now. Only once the loop has
/// taken the gain of its shard in (`taken_in`: its watches started over then) and the lists that
/// started are in (`listing`): before, the cache may miss the last writes of the runner that handed
/// the shard over, and a decision on it publishes again a transition (RUNNING, a QUEUED copy) that
/// runner published and recorded. The leases publish a gain between two turns of the loop, and the
/// loop decides the jobs due (at the top of a turn) before it takes the gain in.
fn may_decide(
    owns: bool,
    shard: u32,
    taken_in: &std::collections::BTreeSet<u32>,
    listing: &std::collections::BTreeSet<u32>,
) -> Gate {
    if !owns {
        Gate::NotOurs
    } else if !taken_in.contains(&shard) || listing.contains(&shard) {
        Gate::HoldBack
    } else {
        Gate::Decide
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

const ALL_KINDS: [Kind; 3] = [Kind::Jobs, Kind::Pods, Kind::Groups];

/// Whether a watch failed because this runner may not list or watch that kind.
fn forbidden(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 403,
        watcher::Error::WatchError(s) => s.code == 403,
        _ => false,
    }
}

/// The name of a kind's watch in metrics.
fn watch_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Jobs => "jobs",
        Kind::Pods => "pods",
        Kind::Groups => "podgroups",
    }
}

async fn sleep(wake: Option<Duration>) {
    match wake {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

impl Pass {
    fn new(awaited: impl IntoIterator<Item = Awaited>) -> Self {
        Self {
            started: Instant::now(),
            lists_pending: awaited.into_iter().collect(),
            outstanding: FastSet::default(),
            owned: 0,
            decided: 0,
            gone: 0,
            accounting_lag: jiff::SignedDuration::ZERO,
        }
    }
}

impl Loop {
    /// The loop's state at the start: the first pass waits for every kind's list, and for the nodes,
    /// so that a waiting job's first status carries its estimate instead of a second status following
    /// with it.
    fn new(exec: Arc<Executor>, mc: &MonitorConfig) -> Self {
        let mut state = Loop {
            cache: Cache::with_replicas_key(exec.settings.keys.replicas.clone())
                .with_peers_key(exec.settings.keys.peers.clone())
                .with_reserve_nodes(mc.reserve_nodes)
                .with_proportion(mc.proportion)
                .with_start_margin(exec.settings.start_margin)
                .with_queue_timeout(exec.settings.queue_timeout)
                .with_clock(exec.clock.clone()),
            waiting: Waiting::default(),
            submit_load: None,
            coalesce: mc.coalesce,
            defer_under_load: mc.defer_under_load.max(mc.coalesce),
            busy: FastSet::default(),
            dirty: FastSet::default(),
            gone: FastMap::default(),
            checks: Deadlines::new(),
            retries: Deadlines::new(),
            backoff: Backoff::new(mc.retry_min_delay, mc.retry_max_delay),
            pass: None,
            passes: 0,
            max_concurrent: mc.max_concurrent.max(1),
            settled: FastMap::default(),
            suspects: Vec::new(),
            suspects_due: None,
            nodes: Default::default(),
            nodes_listing: None,
            fifo_queues: Default::default(),
            estimates_stale: true,
            estimated_at: None,
            listing_shards: Default::default(),
            taken_in: Default::default(),
            held_back: FastSet::default(),
            lists_in: false,
            node_taints: Default::default(),
            node_taints_listing: None,
            reservation_key: super::reserve::taint_key(&exec.settings.keys),
            reserving: None,
            taints_due: None,
            taints_refused_seen: false,
            taints_retry_at: None,
            metrics: None,
            exec,
        };
        state.begin_pass(&ALL_KINDS);
        if let Some(pass) = &mut state.pass {
            pass.lists_pending.insert(Awaited::Nodes);
            pass.lists_pending.insert(Awaited::Queues);
        }
        state
    }

    /// An item of the node watch. Returns whether the watch is over for good: this runner may not
    /// watch nodes (then it gets no estimates, and writes no windows' taints: without the nodes, none
    /// would be seen written).
    fn on_node_watch(&mut self, item: Option<Result<Event<WatchedNode>, watcher::Error>>) -> bool {
        match item {
            Some(Ok(event)) => {
                self.on_node(event);
                return false;
            }
            Some(Err(e)) if forbidden(&e) => {
                tracing::warn!(error = %e, "This runner may not list and watch nodes: waiting jobs get no start-time estimate. Grant list and watch on nodes to its ClusterRole (deploy/base/clusterrole.yaml does).");
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "The node watch failed; it restarts by itself.");
                return false;
            }
            None => {}
        }
        self.exec
            .taints_refused
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.list_done(Awaited::Nodes);
        true
    }

    /// An item of the Queue watch. Returns whether the watch is over for good: this runner may not
    /// watch Queues (then every queue is taken as `traverse`, and a bound told in a `fifo` queue can
    /// break: it says so once).
    fn on_queue_watch(&mut self, item: Option<Result<Event<Queue>, watcher::Error>>) -> bool {
        match item {
            Some(Ok(event)) => {
                match self.fifo_queues.on_event(event) {
                    super::queues::Seen::Same => {}
                    seen => {
                        self.cache.set_fifo_queues(self.fifo_queues.names().clone());
                        self.estimates_stale = true;
                        if seen == super::queues::Seen::Listed {
                            self.list_done(Awaited::Queues);
                        }
                    }
                }
                return false;
            }
            Some(Err(e)) if forbidden(&e) => {
                tracing::warn!(error = %e, "This runner may not list and watch Volcano Queues: every queue is taken as traverse, and estimates told in a fifo queue can be early. Grant list and watch on queues to its ClusterRole (deploy/base/clusterrole.yaml does).");
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "The Queue watch failed; it restarts by itself.");
                return false;
            }
            None => {}
        }
        self.list_done(Awaited::Queues);
        true
    }

    /// The reconciliation's timer: its metadata lists, unless the previous one is still going (still
    /// listing, or still giving the watches their moment: the next tick comes soon).
    fn resync(&mut self, watches: &Watches) -> Option<Verifying> {
        if self.pass.is_some() || self.suspects_due.is_some() {
            tracing::debug!("The previous reconciliation is still going; this one is skipped.");
            return None;
        }
        self.begin_verify();
        Some(watches.verify())
    }

    /// The shards held changed to `now_held`: another runner may have acted on a job meanwhile, so
    /// every job is decided afresh. Returns whether shards were gained: then every watch starts over
    /// (the jobs of a gained shard wait for those lists).
    fn shards_changed(
        &mut self,
        now_held: std::collections::BTreeSet<u32>,
        reporter: &Reporter<'_>,
    ) -> bool {
        let held = &self.taken_in;
        self.listing_shards.extend(now_held.difference(held));
        self.listing_shards.retain(|s| now_held.contains(s));
        let gained = now_held.difference(held).count() > 0;
        self.taken_in = now_held;
        let held = &self.taken_in;
        reporter.shards(held);
        self.settled.clear();
        if gained {
            tracing::info!(shards = ?held, "Gained shards: reconciling every job.");
        }
        self.say_listed();
        gained
    }

    /// Tells the leases which held shards this monitor has listed since it gained them, whose jobs it
    /// decides (and whose QUEUED it tells) as they come: the leases say so to the other runners
    /// ([`crate::cluster::HeldShards::set_listed`]).
    fn say_listed(&self) {
        let listed = if self.lists_in {
            self.taken_in
                .difference(&self.listing_shards)
                .copied()
                .collect()
        } else {
            std::collections::BTreeSet::new()
        };
        self.exec.shards.borrow().set_listed(listed);
    }

    fn enqueue(&mut self, key: JobKey) {
        if self.busy.contains(&key) {
            self.dirty.insert(key);
            return;
        }
        // A job waiting already keeps its place, unless it is now to be told QUEUED: queued before its
        // job was in the cache (its PodGroup or pod came first), it moves to the urgent lane.
        if self.waiting.lane_of(&key) == Some(Lane::Urgent) {
            return;
        }
        let lane = if self.tells_queued(&key) {
            Lane::Urgent
        } else {
            Lane::Ready
        };
        self.waiting.push(key, lane, Instant::now());
    }

    /// Whether the job's QUEUED is left to this monitor and not told yet, as far as the cache and this
    /// process know (the decision itself reads it again).
    fn tells_queued(&self, key: &JobKey) -> bool {
        let Some(job) = self.cache.job(key) else {
            return false;
        };
        // Asked about this process only when the job says it is left untold (a lock).
        let queued = &self.exec.settings.queued;
        queued.left_untold(job.metadata.annotations.as_ref(), false)
            && key
                .job_id()
                .is_some_and(|id| !self.exec.confirmed_queued.contains(id))
    }

    /// The next job due to be decided: one whose QUEUED is to be told once `coalesce` has passed, else
    /// the first of the others once `hold` has (each lane in the order its jobs came to it).
    fn next_due(&mut self, now: Instant, hold: Duration) -> Option<JobKey> {
        if self
            .waiting
            .first(Lane::Urgent)
            .is_some_and(|at| at + self.coalesce <= now)
        {
            return self.waiting.pop(Lane::Urgent);
        }
        if self
            .waiting
            .first(Lane::Ready)
            .is_some_and(|at| at + hold <= now)
        {
            return self.waiting.pop(Lane::Ready);
        }
        None
    }

    /// How long a queued job waits before it is decided: `defer_under_load` while this process's
    /// submit path is busy, else `coalesce`.
    fn hold(&self) -> Duration {
        match &self.submit_load {
            Some(busy) if self.defer_under_load > self.coalesce && *busy.borrow() => {
                self.defer_under_load
            }
            _ => self.coalesce,
        }
    }

    /// The watches of `kinds` start over with a full list; the pass looks at every job once they are in.
    fn begin_pass(&mut self, kinds: &[Kind]) {
        for kind in kinds {
            self.cache.init_start(*kind);
        }
        // Suspects of a kind listed afresh are settled by that list.
        self.suspects.retain(|(k, _)| !kinds.contains(k));
        if self.suspects.is_empty() {
            self.suspects_due = None;
        }
        self.pass = Some(Pass::new(kinds.iter().map(|k| Awaited::Full(*k))));
    }

    /// A reconciliation by metadata lists starts: the pass waits for [`Loop::verified`].
    fn begin_verify(&mut self) {
        self.pass = Some(Pass::new([Awaited::Metadata]));
    }

    /// The metadata lists are in: note what the cache does not explain, then look at every job.
    fn verified(&mut self, lists: [Listed; 3]) {
        let mut found = Vec::new();
        for (kind, listed) in ALL_KINDS.into_iter().zip(&lists) {
            let cache = &self.cache;
            let suspects = verify::differences(
                listed,
                |ns, name| cache.version_of(kind, ns, name),
                cache.listed_count(kind),
                cache.digest(kind),
                || cache.versions(kind),
            );
            found.extend(suspects.into_iter().map(|s| (kind, s)));
        }
        if !found.is_empty() {
            tracing::debug!(
                differences = found.len(),
                "The reconciliation found differences; the watches have a moment to explain them."
            );
            self.suspects = found;
            self.suspects_due = Some(Instant::now() + SUSPECT_GRACE);
        }
        self.list_done(Awaited::Metadata);
    }

    /// The kinds whose watch has not explained a difference in time (and must list again in full).
    fn judge_suspects(&mut self) -> Vec<Kind> {
        self.suspects_due = None;
        let suspects = std::mem::take(&mut self.suspects);
        let mut kinds = Vec::new();
        for (kind, suspect) in &suspects {
            if kinds.contains(kind) || suspect.resolved(self.cache.version(*kind, &suspect.key)) {
                continue;
            }
            tracing::warn!(
                kind = ?kind,
                object = %suspect.key,
                expected = ?suspect.expect,
                "The watch missed a change; that kind is listed afresh."
            );
            kinds.push(*kind);
        }
        kinds
    }

    fn list_done(&mut self, which: Awaited) {
        {
            let Some(pass) = &mut self.pass else { return };
            if !pass.lists_pending.remove(&which) || !pass.lists_pending.is_empty() {
                return;
            }
        }
        // Every list is in: the jobs of shards just gained may be decided now.
        self.listing_shards.clear();
        self.lists_in = true;
        self.say_listed();
        for key in std::mem::take(&mut self.held_back) {
            self.enqueue(key);
        }
        // Estimate when the waiting jobs start (unless nothing changed since the last
        // time), then look at every job of ours. One that has not changed since it was decided (and is
        // not in hand, and not gone) keeps its decision without being queued.
        if self.estimates_stale {
            self.estimate();
        }
        let Some(pass) = &mut self.pass else { return };
        // The shards held, checked once for the whole pass (not a lock and a clock read per job).
        let (valid, shards) = {
            let held = self.exec.shards.borrow();
            (held.valid_now(), held.shards())
        };
        let mut owned = 0;
        let mut lag = jiff::SignedDuration::ZERO;
        let (keys, now) = (&self.exec.settings.keys, self.exec.clock.now());
        let accounting = &self.exec.settings.config.pipeline.accounting;
        let mut stale: Vec<JobKey> = Vec::new();
        for (key, fingerprint) in self.cache.fingerprints() {
            if !key
                .job_id()
                .is_some_and(|id| valid.contains(&crate::cluster::lease::shard_of(id, shards)))
            {
                continue;
            }
            owned += 1;
            if let Some(overdue) = self.cache.job(key).and_then(|job| {
                super::lag::overdue(job, keys, accounting.period, accounting.settle, now)
            }) {
                lag = lag.max(overdue);
            }
            let unchanged = !self.busy.contains(key)
                && !self.gone.contains_key(key)
                && self.settled.get(key) == Some(&fingerprint);
            if !unchanged {
                stale.push(key.clone());
            }
        }
        pass.owned = owned;
        pass.accounting_lag = lag;
        pass.outstanding = stale.iter().cloned().collect();
        for key in stale {
            self.enqueue(key);
        }
    }

    fn finish_pass(&mut self) -> Option<PassReport> {
        let pass = self.pass.as_ref()?;
        if !pass.lists_pending.is_empty() || !pass.outstanding.is_empty() {
            return None;
        }
        let pass = self.pass.take()?;
        self.passes += 1;
        let report = PassReport {
            passes: self.passes,
            jobs: self.cache.len(),
            pods: self.cache.count(Kind::Pods),
            groups: self.cache.count(Kind::Groups),
            owned: pass.owned,
            decided: pass.decided,
            gone: pass.gone,
            took: pass.started.elapsed(),
            accounting_lag: pass.accounting_lag.unsigned_abs(),
        };
        tracing::debug!(?report, "Reconciliation pass done.");
        Some(report)
    }

    fn on_node(&mut self, event: Event<WatchedNode>) {
        self.estimates_stale = true;
        let key = self.reservation_key.as_str();
        match event {
            Event::Init => {
                self.nodes_listing = Some(Default::default());
                self.node_taints_listing = Some(Default::default());
            }
            Event::InitApply(n) => {
                if let Some(listing) = &mut self.node_taints_listing {
                    let t = n.taints();
                    listing.insert(t.name.clone(), t);
                }
                if let (Some(listing), Some(node)) = (&mut self.nodes_listing, n.to_node(key)) {
                    listing.insert(node.name.clone(), node);
                }
            }
            Event::InitDone => {
                if let Some(listing) = self.nodes_listing.take() {
                    self.nodes = listing;
                }
                if let Some(listing) = self.node_taints_listing.take() {
                    self.node_taints = listing;
                }
                self.tainted_changed();
                self.list_done(Awaited::Nodes);
            }
            Event::Apply(n) => {
                let name = n.metadata.name.clone().unwrap_or_default();
                self.node_taints.insert(name.clone(), n.taints());
                match n.to_node(key) {
                    Some(node) => self.nodes.insert(name, node),
                    None => self.nodes.remove(&name),
                };
                self.tainted_changed();
            }
            Event::Delete(n) => {
                let name = n.metadata.name.as_deref().unwrap_or_default();
                self.nodes.remove(name);
                self.node_taints.remove(name);
                self.tainted_changed();
            }
        }
    }

    /// The maintenance windows whose taint is on a node (the ids the maintenance taints carry), for
    /// the decisions: when they change (a window's taint written, moved on or lifted), every job is
    /// decided again (a job waits to be told it is held until the taint that holds it is there).
    fn tainted_changed(&mut self) {
        let tainted = super::maintenance::tainted_windows(
            self.node_taints.values().flat_map(|n| &n.taints),
            &self.exec.settings.keys.maintenance_taint(),
        );
        let changed = self.exec.tainted.send_if_modified(|current| {
            let changed = **current != tainted;
            if changed {
                *current = Arc::new(tainted);
            }
            changed
        });
        if changed {
            self.requeue_all();
        }
    }

    /// Every job is decided again: something every decision reads changed.
    fn requeue_all(&mut self) {
        self.settled.clear();
        self.estimates_stale = true;
        let keys: Vec<JobKey> = self.cache.fingerprints().map(|(k, _)| k.clone()).collect();
        for key in keys {
            self.enqueue(key);
        }
    }

    /// Counts a watch event (see [`crate::ops::Metrics::monitor_watch_event`]).
    fn watched(&self, watch: &'static str, news: bool) {
        if let Some(metrics) = &self.metrics {
            metrics.monitor_watch_event(watch, news);
        }
    }

    fn on_job(&mut self, event: Event<WatchedJob>) {
        self.estimates_stale = true;
        match event {
            // The echo of a worker's write, whose answer is in the cache already (its job was looked
            // after when the answer came, see `finished`), is neither stored nor decided again; an
            // event for a job whose worker runs waits in the cache for its answer.
            Event::Apply(w) => {
                let intake = self.cache.take_watched(w, |key| self.busy.contains(key));
                self.took(intake);
            }
            Event::InitApply(w) => {
                let intake = self.cache.take_listed(w);
                self.took(intake);
            }
            Event::Delete(w) => {
                let key = JobKey::of(&w.metadata);
                let pods = self.cache.pods(&key);
                // A job that left the watch (labelled ended) comes as it was *before* that write, at
                // the write's version (an API server sends the content that still matched): the cached
                // job, when a worker's answer put it there at that version, is the one that shows the
                // end recorded, and spares the gone path a read (see `Executor::handle_gone`).
                let job = match self.cache.remove_job(&key) {
                    Some((cached, _))
                        if is_newer(
                            cached.metadata.resource_version.as_deref(),
                            w.metadata.resource_version.as_deref(),
                        ) =>
                    {
                        cached
                    }
                    _ => Arc::new(w.into_job()),
                };
                self.peer_changed(&key);
                self.vanished(key, job, pods);
            }
            Event::Init => self.cache.init_start(Kind::Jobs),
            Event::InitDone => {
                for (key, job, pods) in self.cache.init_done(Kind::Jobs) {
                    if let Some(pass) = &mut self.pass {
                        pass.gone += 1;
                    }
                    self.peer_changed(&key);
                    self.vanished(key, job, pods);
                }
                self.list_done(Awaited::Full(Kind::Jobs));
            }
        }
    }

    /// What the cache made of a job's watch event or listed job: counted, and a job stored is decided
    /// again (with the jobs that read it as their peer). One held is counted when it is released (see
    /// `finished`).
    fn took(&mut self, intake: Intake) {
        match intake {
            Intake::Echo => self.watched("jobs", false),
            Intake::Held => {}
            Intake::Stored { key, news } => {
                self.watched("jobs", news);
                self.peer_changed(&key);
                self.enqueue(key);
            }
        }
    }

    fn on_pod(&mut self, event: Event<WatchedPod>) {
        self.estimates_stale = true;
        match event {
            Event::Apply(w) | Event::InitApply(w) => {
                let news = !self.cache.holds_version(Kind::Pods, &w.metadata);
                self.watched("pods", news);
                let disruption = w.disruption();
                let attempt = w.attempt();
                if let Some(key) = self.cache.apply_pod(w.into_pod()) {
                    if let Some(d) = disruption {
                        self.cache.note_disruption(&key, d, true, attempt);
                    }
                    self.peer_changed(&key);
                    self.enqueue(key);
                }
            }
            Event::Delete(w) => {
                let ns = w.metadata.namespace.clone().unwrap_or_default();
                let name = w.metadata.name.clone().unwrap_or_default();
                if let Some(key) = self.cache.remove_pod(&ns, &name) {
                    let attempt = w.attempt();
                    match w.disruption() {
                        Some(d) => self.cache.note_disruption(&key, d, true, attempt),
                        None => self
                            .cache
                            .note_disruption(&key, w.deleted(), false, attempt),
                    }
                    self.peer_changed(&key);
                    self.enqueue(key);
                }
            }
            Event::Init => self.cache.init_start(Kind::Pods),
            Event::InitDone => {
                for (key, _, _) in self.cache.init_done(Kind::Pods) {
                    self.enqueue(key);
                }
                self.list_done(Awaited::Full(Kind::Pods));
            }
        }
    }

    fn on_group(&mut self, event: Event<WatchedGroup>) {
        self.estimates_stale = true;
        match event {
            Event::Apply(pg) | Event::InitApply(pg) => {
                let news = !self.cache.holds_version(Kind::Groups, &pg.metadata);
                self.watched("podgroups", news);
                if let Some(key) = self.cache.apply_group(pg.into_group())
                    && self.cache.job(&key).is_some()
                {
                    self.enqueue(key);
                }
            }
            Event::Delete(pg) => {
                if let Some(key) = self.cache.remove_group(&pg.into_group())
                    && self.cache.job(&key).is_some()
                {
                    self.enqueue(key);
                }
            }
            Event::Init => self.cache.init_start(Kind::Groups),
            Event::InitDone => {
                for (key, _, _) in self.cache.init_done(Kind::Groups) {
                    self.enqueue(key);
                }
                self.list_done(Awaited::Full(Kind::Groups));
            }
        }
    }

    /// The job `key` or one of its pods changed or went: the jobs that have it as their peer are decided
    /// again (their decisions read it, see [`super::peers`]).
    fn peer_changed(&mut self, key: &JobKey) {
        for dependent in self.cache.touch_dependents(key) {
            self.enqueue(dependent);
        }
    }

    /// A job is gone: publish its end if nobody did.
    fn vanished(&mut self, key: JobKey, job: Arc<VolcanoJob>, pods: Arc<Vec<Pod>>) {
        self.checks.set(&key, None);
        if let Some(pass) = &mut self.pass {
            pass.outstanding.remove(&key);
        }
        self.gone.insert(key.clone(), (job, pods));
        self.enqueue(key);
    }

    /// Makes the start-time estimates afresh and queues every job whose estimate changed.
    fn estimate(&mut self) {
        let nodes: Vec<Node> = self.nodes.values().cloned().collect();
        let now = self.exec.clock.now();
        self.cache
            .set_maintenance_windows(self.exec.maintenance.borrow().clone());
        self.cache
            .set_maintenance_tainted(self.exec.tainted.borrow().clone());
        self.cache.set_booked_nodes(super::inputs::booked_nodes(
            self.node_taints
                .values()
                .map(|n| (n.name.as_str(), n.taints.as_slice())),
            &self.exec.settings.keys,
        ));
        let changed = self
            .cache
            .estimate_starts(&nodes, &self.exec.settings.keys, now);
        self.estimates_stale = false;
        self.estimated_at = Some((now, Instant::now()));
        for key in changed {
            self.enqueue(key);
        }
        self.write_node_taints();
    }

    fn taints_refused(&self) -> bool {
        self.exec
            .taints_refused
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// When the node patch is found refused, or allowed again: every job is decided again (a job
    /// without the gate is no longer held, and is told so; or it is held again). While it is refused,
    /// the maintenance taints are tried again after [`TAINTS_RETRY`].
    fn note_taints_refused(&mut self) {
        let refused = self.taints_refused();
        if self.taints_refused_seen == refused {
            return;
        }
        self.taints_refused_seen = refused;
        self.taints_retry_at = refused
            .then(|| self.exec.clock.now().checked_add(TAINTS_RETRY).ok())
            .flatten();
        self.taints_due = crate::interval::earliest(self.taints_due, self.taints_retry_at);
        self.requeue_all();
    }

    /// The node taints, in one round of writes: `[monitor] reserve_nodes` taints the nodes the replay
    /// reserves for the whole-node and large gangs of this runner's shards, and removes their taints once they no
    /// longer wait ([`super::reserve`]); with shard 0 held, every node a maintenance window not over
    /// covers carries the maintenance taint, and no other ([`super::maintenance::plan_taints`]). A node
    /// whose write fails does not stop the others ([`super::reserve::apply`]). Decided from the watched taints,
    /// windows and jobs only: a round's writes run in the background, and the next round waits for
    /// them. With `reserve_nodes` off nothing is reserved, but the taints left from when it was on are
    /// still removed (nothing would ever lift them otherwise). A node patch the cluster refuses (no
    /// grant) is said once, at ERROR, and the maintenance taints are tried again only after
    /// [`TAINTS_RETRY`] (quietly) until a write succeeds: meanwhile jobs without the gate are told what a
    /// window will do to them instead of being held.
    fn write_node_taints(&mut self) {
        if self.node_taints.is_empty() {
            return;
        }
        // A round still writing, or one that wrote: looked at again shortly (a write that failed
        // without a node event to tell, or a change that came meanwhile, is not left for the next
        // unrelated event).
        let soon = self.exec.clock.now().checked_add(ESTIMATE_EVERY).ok();
        if self.reserving.as_ref().is_some_and(|h| !h.is_finished()) {
            self.taints_due = crate::interval::earliest(self.taints_due, soon);
            return;
        }
        let taints: Vec<super::reserve::NodeTaints> = self.node_taints.values().cloned().collect();
        // Not before the first pass has the full lists: a taint whose job the cache has not listed yet
        // would be taken for one whose job is gone.
        let mut changes = if self.passes == 0 {
            Vec::new()
        } else {
            let reservations = self.cache.reservations();
            let held = self.exec.shards.borrow();
            super::reserve::plan(
                &taints,
                &self.reservation_key,
                &reservations.reserving,
                &reservations.reserve_now,
                // Nor the jobs of shards just gained, whose lists are still coming in.
                |id| {
                    let shard = crate::cluster::lease::shard_of(id, held.shards());
                    may_decide(held.owns(id), shard, &self.taken_in, &self.listing_shards)
                        == Gate::Decide
                },
            )
        };
        // The maintenance taints are the same for every runner (decided from the windows and the
        // nodes alone): one runner writes them, the holder of shard 0 (one at a time, by the shard
        // lease; taken over with the shard when it dies), rather than every runner every node, all but
        // one of them refused with a conflict.
        let writes_maintenance = self.exec.shards.borrow().holds(0);
        let windows = self
            .exec
            .maintenance
            .borrow()
            .clone()
            .filter(|_| writes_maintenance);
        self.taints_due = None;
        let now = self.exec.clock.now();
        let refused = self.taints_refused();
        let retry = refused && self.taints_retry_at.is_none_or(|at| at <= now);
        if refused && windows.is_some() {
            if retry {
                self.taints_retry_at = now.checked_add(TAINTS_RETRY).ok();
            }
            self.taints_due = self.taints_retry_at;
        }
        if let Some(windows) = windows.filter(|_| !refused || retry) {
            let after = super::reserve::after(&taints, &changes);
            let planned = super::maintenance::plan_taints(
                &after,
                &windows,
                &self.exec.settings.keys.maintenance_taint(),
                now,
            );
            changes = super::reserve::with_maintenance(changes, &after, planned);
            let ends = windows.iter().map(|w| w.end).filter(|e| *e > now).min();
            self.taints_due = crate::interval::earliest(self.taints_due, ends);
        }
        if changes.is_empty() {
            return;
        }
        self.taints_due = crate::interval::earliest(self.taints_due, soon);
        let client = self.exec.client.clone();
        let refused = self.exec.taints_refused.clone();
        // Joined at shutdown with the jobs in hand.
        let task = tokio::spawn(async move {
            let applied = super::reserve::apply(&client, &changes).await;
            if applied.refused().is_none() && applied.written > 0 {
                // Allowed (again): forgotten.
                if refused.swap(false, std::sync::atomic::Ordering::Relaxed) {
                    tracing::info!(
                        "This runner may patch nodes again: maintenance windows hold back the jobs queued before them again."
                    );
                }
            }
            if let Some(e) = applied.refused()
                && !refused.swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                tracing::error!(error = %e, "This runner may not patch nodes: maintenance windows hold back only the jobs created while one was in their way (by the scheduling gate); a job queued before a window is told what the window will do to it, and may start into it. Grant patch on nodes to its ClusterRole (deploy/base/clusterrole.yaml does).");
            }
            for (node, e) in applied.failed.iter().filter(|(_, e)| !e.is_forbidden()) {
                tracing::warn!(%node, error = %e, "Node taints not written; tried again shortly.");
            }
        });
        self.reserving = Some(task);
    }

    /// When the estimates are due again, in the clock's time and in real time (`None`: nothing changed
    /// since they were made).
    fn estimate_due(&self) -> Option<(jiff::Timestamp, Instant)> {
        if !self.estimates_stale {
            return None;
        }
        Some(match self.estimated_at {
            Some((at, real)) => (
                at.checked_add(ESTIMATE_EVERY).unwrap_or(at),
                real + Duration::try_from(ESTIMATE_EVERY).unwrap_or_default(),
            ),
            None => (jiff::Timestamp::MIN, Instant::now()),
        })
    }

    fn dispatch(&mut self, workers: &mut FuturesUnordered<Work>) {
        self.note_taints_refused();
        if self
            .estimate_due()
            .is_some_and(|(at, real)| at <= self.exec.clock.now() || real <= Instant::now())
        {
            self.estimate();
        }
        let (now, hold) = (Instant::now(), self.hold());
        while workers.len() < self.max_concurrent {
            // Queued in order: the first one not due yet is the earliest of those waiting.
            let Some(key) = self.next_due(now, hold) else {
                return;
            };
            if self.busy.contains(&key) {
                self.dirty.insert(key);
                continue;
            }
            let shard = key.job_id().map(|id| {
                let held = self.exec.shards.borrow();
                (
                    crate::cluster::lease::shard_of(id, held.shards()),
                    held.owns(id),
                )
            });
            let gate = shard.map_or(Gate::NotOurs, |(shard, owns)| {
                may_decide(owns, shard, &self.taken_in, &self.listing_shards)
            });
            if gate == Gate::HoldBack {
                self.held_back.insert(key);
                continue;
            }
            if gate == Gate::NotOurs {
                // Not ours now; whoever holds the shard looks after it. Keep nothing for it.
                self.settled.remove(&key);
                self.gone.remove(&key);
                self.checks.set(&key, None);
                self.retries.set(&key, None);
                self.done_in_pass(&key);
                continue;
            }
            let exec = self.exec.clone();
            if let Some((job, pods)) = self.gone.get(&key).cloned() {
                self.busy.insert(key.clone());
                let span = job_span(&exec, &key, &job);
                workers.push(Box::pin(
                    async move {
                        let handled = exec.handle_gone(job, pods).await;
                        (key, handled, None)
                    }
                    .instrument(span),
                ));
                continue;
            }
            // Nothing about it changed since it was decided: the decision stands (found out before
            // its snapshot is taken, which copies its pods).
            let Some(fingerprint) = self.cache.fingerprint(&key) else {
                self.done_in_pass(&key);
                continue;
            };
            if self.settled.get(&key) == Some(&fingerprint) {
                self.done_in_pass(&key);
                continue;
            }
            let Some(snap): Option<Snapshot> = self.cache.snapshot(&key) else {
                self.done_in_pass(&key);
                continue;
            };
            let fingerprint = snap.fingerprint;
            if let Some(metrics) = &self.metrics {
                metrics.monitor_decided();
            }
            if let Some(pass) = &mut self.pass
                && pass.outstanding.contains(&key)
            {
                pass.decided += 1;
            }
            self.busy.insert(key.clone());
            let span = job_span(&exec, &key, &snap.job);
            workers.push(Box::pin(
                async move {
                    let handled = exec.handle(snap).await;
                    (key, handled, Some(fingerprint))
                }
                .instrument(span),
            ));
        }
    }

    fn done_in_pass(&mut self, key: &JobKey) {
        if let Some(pass) = &mut self.pass {
            pass.outstanding.remove(key);
        }
    }

    fn finished(&mut self, key: JobKey, handled: Handled, fingerprint: Option<Fingerprint>) {
        self.busy.remove(&key);
        // Nothing came for the job while it was decided: its view is still the snapshot's.
        let unchanged = fingerprint.is_some() && self.cache.fingerprint(&key) == fingerprint;
        self.done_in_pass(&key);
        let was_gone = self.gone.contains_key(&key);
        let refreshed = match handled.job {
            Some(job) if !was_gone => self.cache.refresh_job(job),
            _ => false,
        };
        let as_written = handled.settled_as_written && unchanged && refreshed;
        // Asked for again while it was decided (the maintenance windows or the nodes' taints changed, a
        // deadline came, its start estimate moved): what was decided read the world as it was before,
        // and does not stand for the view, whose fingerprint does not show what changed.
        let superseded = self.dirty.contains(&key);
        match fingerprint {
            _ if handled.error.is_some() || superseded => {
                self.settled.remove(&key);
            }
            Some(f) if handled.settled => {
                self.settled.insert(key.clone(), f);
            }
            // The snapshot with the job as written was decided: that is the cache's view now.
            Some(_) if as_written => match self.cache.fingerprint(&key) {
                Some(f) => {
                    self.settled.insert(key.clone(), f);
                }
                None => {
                    self.settled.remove(&key);
                }
            },
            _ => {
                self.settled.remove(&key);
            }
        }
        if refreshed {
            // What its watch event (skipped as an echo, see `on_job`) would have done: the jobs
            // that read it as their peer are decided again, and so is the job, unless its view as
            // written was decided already.
            self.peer_changed(&key);
            if !as_written {
                self.enqueue(key.clone());
            }
        }
        if let Some(intake) = self.cache.release_held(&key) {
            self.took(intake);
        }
        match handled.error {
            None => {
                if was_gone {
                    self.gone.remove(&key);
                    // A job of the same name created meanwhile (a rolled-back job's submission, created
                    // afresh) waits in the cache: its events were queued under the key that the gone
                    // job's handling took, so it is decided now, or never until its next event.
                    if self.cache.fingerprint(&key).is_some() {
                        self.enqueue(key.clone());
                    }
                }
                self.backoff.succeed(&key);
                self.retries.set(&key, None);
                self.checks.set(&key, handled.next_check);
                if !handled.done.is_empty() {
                    tracing::debug!(job = %key, done = ?handled.done, "Job handled.");
                }
            }
            Some(error) => {
                let delay = self.backoff.fail(&key);
                tracing::warn!(job = %key, error = %error, retry_in = ?delay, "Handling the job failed; it is retried.");
                self.retries.set(&key, Some(Instant::now() + delay));
            }
        }
        if self.dirty.remove(&key) {
            self.enqueue(key);
        }
    }

    /// How long to sleep before a timer is due: the earliest check in the clock's time, the earliest
    /// retry in real time, or the first queued job's [`Loop::hold`] (when a worker is free to take it;
    /// a change of the submit load wakes the loop too, which then asks again). A clock that does not
    /// run by itself is looked at every `poll`.
    fn next_wake(&self, clock: &dyn Clock, poll: Duration, working: usize) -> Option<Duration> {
        let now = Instant::now();
        let ready = self.waiting.first(Lane::Ready).map(|at| at + self.hold());
        let urgent = self
            .waiting
            .first(Lane::Urgent)
            .map(|at| at + self.coalesce);
        let queued = ready
            .into_iter()
            .chain(urgent)
            .min()
            .filter(|_| working < self.max_concurrent)
            .map(|at| at.saturating_duration_since(now));
        let check = self
            .checks
            .next()
            .map(|at| clock.real_until(at).unwrap_or(poll));
        let retry = self
            .retries
            .next()
            .map(|at| at.saturating_duration_since(Instant::now()));
        let estimate = self.estimate_due().map(|(at, real)| {
            let real = real.saturating_duration_since(Instant::now());
            clock.real_until(at).map_or(real, |d| d.min(real))
        });
        let taints = self
            .taints_due
            .map(|at| clock.real_until(at).unwrap_or(poll));
        [check, retry, estimate, taints, queued]
            .into_iter()
            .flatten()
            .min()
    }

    fn fire(&mut self, now: jiff::Timestamp, instant: Instant) {
        // A maintenance window is over: its taints go (with the estimates, which it changes too).
        if self.taints_due.is_some_and(|at| at <= now) {
            self.taints_due = None;
            self.estimates_stale = true;
        }
        // A deadline is due: the same objects may now call for something else.
        for key in self.checks.pop_due(now) {
            self.settled.remove(&key);
            self.enqueue(key);
        }
        for key in self.retries.pop_due(instant) {
            self.settled.remove(&key);
            self.enqueue(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// A job of a shard the leases hold now is decided only once the loop has taken the gain in and
    /// its lists are in: a gain the leases published after the loop's last look (its watches not
    /// started over yet) holds the job back, as the lists in progress do.
    #[test]
    fn a_job_of_a_shard_gained_is_held_back_until_the_loop_has_taken_the_gain_in() {
        let none = BTreeSet::new();
        let three = BTreeSet::from([3]);
        assert_eq!(may_decide(true, 3, &three, &none), Gate::Decide);
        assert_eq!(
            may_decide(true, 3, &none, &none),
            Gate::HoldBack,
            "gained after the loop's last look"
        );
        assert_eq!(
            may_decide(true, 3, &three, &three),
            Gate::HoldBack,
            "its lists not in yet"
        );
        assert_eq!(may_decide(false, 3, &three, &none), Gate::NotOurs);
        assert_eq!(may_decide(false, 3, &none, &none), Gate::NotOurs);
    }
}
