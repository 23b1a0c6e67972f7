//! The monitor: once a job exists, someone watches it. For every job in a shard this runner holds, it
//! publishes the lifecycle (RUNNING, then exactly one of SUCCESS, FAILURE, EXPIRED, CANCELLED, and
//! status events while it waits), enforces the expiry with warnings before it, charges in accounting
//! ticks while the job runs, tells the proxies where interactive jobs live, and cleans up exactly once.
//!
//! # Layout
//! - [`MonitorConfig`] (this file): the `[monitor]` section.
//! - [`clock`]: where "now" comes from ([`SystemClock`], or a simulated clock in tests).
//! - [`record`]: what the monitor persists on each job (last published state, outcome, status hash).
//! - [`observe`]: ranks, exit codes, start and end times, image pull failures, pending reasons.
//! - [`decide`]: the pure decision per job: observed objects + now → [`decide::Step`].
//! - [`events`]: the lifecycle events and their deterministic ids.
//! - [`cache`]: the watched objects, kept small; [`keys`]: the keys and fast maps its users share.
//! - [`peers`]: peers run together: the gate, their addresses, their ends.
//! - [`inputs`]: the forecast's snapshot ([`crate::forecast`], which replays the scheduler) read from
//!   the listed nodes, pods, PodGroups and jobs; [`telling`]: when a waiting job hears its estimate
//!   again.
//! - [`reserve`]: nodes reserved by a taint for a whole-node or large gang past its waiting time.
//! - [`timers`]: deadlines by job (in the clock's time) and retry backoff (in real time).
//! - [`execute`]: carries a step out: publish (confirmed), then patch (resourceVersion), then delete.
//! - [`verify`]: the full reconciliation's check of the watches: metadata lists against the cache.
//! - [`listing`]: reads a page of a metadata list for names and versions only, without a serde tree.
//! - [`queued`]: the jobs whose QUEUED this process had confirmed (the monitor sends no copy of it).
//! - [`run`]: the loop: watches, full reconciliation, timers, shards, bounded concurrency.
//!
//! See `docs/monitor.md` for the duty and failover design and the order of effects.

pub mod cache;
pub mod clock;
pub mod decide;
pub mod end_tails;
pub mod events;
pub mod execute;
pub mod inputs;
pub mod keys;
pub mod lag;
pub mod listing;
pub mod maintenance;
pub mod observe;
pub mod peers;
pub mod queued;
pub mod queues;
pub mod record;
pub mod reserve;
pub mod run;
pub mod telling;
pub mod timers;
pub mod verify;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use clock::{Clock, SystemClock};
pub use decide::{Observed, Settings, Step};
pub use queued::ConfirmedQueued;
pub use record::{Outcome, Published, Terminal};
pub use run::PassReport;

use crate::broker::Publisher;
use crate::cluster::HeldShards;
use crate::config::Config;

pub use crate::config::monitor::{Encoding, MonitorConfig, MonitorConfigError};

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
        run::run(self, shutdown).await
    }
}
