//! The runner: consumes submissions, cancels and extensions from RabbitMQ and applies them to the
//! cluster, exactly once in effect.
//!
//! Delivery is at-least-once, so every effect is made idempotent instead: objects are found by name and
//! recognised by the submission's fingerprint, annotations are written with resourceVersion preconditions,
//! and every event has a deterministic id. A delivery is acked only after its effects are in the cluster
//! and its events are confirmed by the broker; a transient failure returns it to the queue, bad input goes
//! to the dead-letter queue with the reason.
//!
//! # Layout
//! - [`RunnerConfig`] (this file): the `[runner]` section.
//! - [`Runner`] (this file): wires consumers, handlers, the submission gate and the tombstone sweeper.
//! - [`consume`]: the consume loops (in-flight bound, gate, graceful shutdown) and the pause follower.
//! - [`handle`]: what one message does: [`handle::submit`], [`handle::cancel`], [`handle::extend`],
//!   [`handle::reject`].
//! - [`plan`]: the pipeline's desired objects as the applier's steps, with the runner's decorations
//!   (cleanup finalizer, `acceptedBy`, trace context).
//! - Finding, patching and ending VolcanoJobs by job id is [`crate::cluster::jobs`]; the whole nodes each
//!   owner holds, [`crate::cluster::whole_nodes`] (the session issuer needs the job store too).
//! - [`events`]: the events the runner publishes (pure; their ids are [`crate::durable::ids`]).
//! - [`service`]: [`service::Service`], the runner with its broker connection, shard leases and monitor:
//!   what `volcano-runner run` runs.

pub mod consume;
pub mod events;
pub mod handle;
pub mod plan;
pub mod refusal;
pub mod service;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::broker::{Broker, BrokerError, ConsumerKind};
use crate::cluster::{Applier, GateDriver, RetryPolicy, SubmitGate, Tombstones};
use crate::config::Config;
use crate::durable::AnnotationKeys;

pub use consume::Stats;
pub use handle::{Handler, Settle};
pub use plan::RunnerKeys;

pub use crate::config::runner::{OutputFormat, RunnerConfig, RunnerConfigError};

/// Why the runner could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error(transparent)]
    Config(#[from] RunnerConfigError),
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

/// One runner: the two consumers, the handlers, the submission gate and the tombstone sweeper.
pub struct Runner {
    handler: Arc<Handler>,
    /// Feeds the handler's view of the maintenance windows (followed while the runner runs).
    windows: tokio::sync::watch::Sender<Option<crate::cluster::Windows>>,
    broker: Broker,
    gate_driver: GateDriver,
    stats: Arc<Stats>,
    /// Metrics and readiness of the process (see [`Runner::with_ops`]).
    ops: crate::ops::Ops,
    /// Readiness of the two consume loops: down from construction until each loop runs.
    ready: [crate::ops::ReadyFlag; 2],
    /// The submissions in hand (the submit loop's record), for readiness and for a monitor in the
    /// same process ([`Runner::submit_load`]).
    submitting: consume::Progress,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("handler", &self.handler)
            .finish_non_exhaustive()
    }
}

impl Runner {
    /// A runner named `runner_id` on `client` and `broker`. Nothing is consumed until [`Runner::run`].
    pub fn new(
        config: Config,
        client: kube::Client,
        broker: Broker,
        runner_id: String,
    ) -> Result<Self, RunnerError> {
        Self::with_ops(config, client, broker, runner_id, crate::ops::Ops::new())
    }

    /// [`Runner::new`], reporting into `ops`: message counts and latencies, in-flight deliveries, published
    /// events, the gate, and a readiness flag per consume loop.
    pub fn with_ops(
        config: Config,
        client: kube::Client,
        broker: Broker,
        runner_id: String,
        ops: crate::ops::Ops,
    ) -> Result<Self, RunnerError> {
        config.runner.check()?;
        let prefix = &config.pipeline.annotation_prefix;
        let keys = AnnotationKeys::new(prefix);
        let retry = RetryPolicy::from_config(&config.cluster);
        let applier = Applier::new(client.clone(), retry.clone(), keys.submission_hash.clone())
            .with_end_marker(keys.outcome.clone());
        let (gate, gate_driver) = SubmitGate::new(client.clone(), &config.cluster);
        let submit_ready = ops.readiness.consumer_flag("submit consumer");
        let control_ready = ops.readiness.consumer_flag("control consumer");
        let events_route = handle::route::EventsRoute::new(
            ops.readiness
                .condition("events routing", "no event published yet"),
            ops.metrics.clone(),
        );
        let gate_state = gate.subscribe();
        submit_ready.explain_with(move || {
            gate_state
                .borrow()
                .closed_because()
                .map(|why| format!("not taking submissions ({why}); they wait in the queue"))
        });
        let (windows_tx, windows) = tokio::sync::watch::channel(None);
        let tombstones = Tombstones::new(client.clone(), &config.cluster);
        let handler = Handler {
            bookings: crate::cluster::Bookings::new(
                client.clone(),
                &config.cluster,
                &config.bookings,
                &keys,
            ),
            maintenance: windows,
            windows_clock: Arc::new(crate::monitor::SystemClock),
            runner_keys: RunnerKeys::new(&keys),
            keys,
            jobs: crate::cluster::jobs::JobStore::new(
                client.clone(),
                &config.pipeline,
                &config.cluster,
            ),
            confirmed_queued: crate::monitor::ConfirmedQueued::default()
                .with_cancels(tombstones.clone()),
            tombstones,
            pending_extensions: crate::cluster::PendingExtensions::new(
                client.clone(),
                &config.cluster,
            ),
            applier,
            gate,
            publisher: broker.publisher().with_metrics(ops.metrics.clone()),
            format: config.runner.output_format.into(),
            events_route,
            shard_holders: None,
            retry,
            client,
            runner_id,
            config: Arc::new(config),
        };
        Ok(Self {
            handler: Arc::new(handler),
            windows: windows_tx,
            broker,
            gate_driver,
            stats: Arc::new(Stats::default()),
            ready: [submit_ready, control_ready],
            ops,
            submitting: consume::Progress::default(),
        })
    }

    /// Takes every instant from `clock` (the monitor's; the system clock by default): the acceptance it
    /// records on a job, a cancel's tombstone, whether a maintenance window holds a submission back.
    pub fn with_clock(mut self, clock: Arc<dyn crate::monitor::Clock>) -> Self {
        Arc::get_mut(&mut self.handler)
            .expect("the clock is set before the runner starts")
            .windows_clock = clock;
        self
    }

    /// Decides from `holders` (followed while the runner runs) who tells each new job's QUEUED: a job
    /// whose shard another runner holds is left to that runner's monitor, and the submit path writes no
    /// record of a confirm (see [`crate::monitor::queued`]). `identity` in the leases must be this
    /// runner's own.
    pub fn with_shard_holders(mut self, holders: crate::cluster::ShardHolders) -> Self {
        Arc::get_mut(&mut self.handler)
            .expect("the shard holders are set before the runner starts")
            .shard_holders = Some(holders);
        self
    }

    /// The submission gate (pause switch and capacity), as this runner sees it.
    pub fn gate(&self) -> SubmitGate {
        self.handler.gate.clone()
    }

    /// The maintenance windows as this runner follows them, for a monitor in the same process
    /// ([`crate::monitor::Monitor::with_windows`]): one watch of their ConfigMaps per process.
    pub fn windows(&self) -> tokio::sync::watch::Receiver<Option<crate::cluster::Windows>> {
        self.windows.subscribe()
    }

    /// The jobs whose QUEUED this runner had confirmed by the broker, for a monitor in the same process
    /// ([`crate::monitor::Monitor::with_confirmed_queued`]): it then publishes no copy of their QUEUED.
    pub fn confirmed_queued(&self) -> crate::monitor::ConfirmedQueued {
        self.handler.confirmed_queued.clone()
    }

    /// Whether this runner has submissions in hand, as a watch told when that changes, for a monitor in
    /// the same process ([`crate::monitor::Monitor::with_submit_load`]): it lets them go first.
    pub fn submit_load(&self) -> crate::monitor::run::SubmitLoad {
        self.submitting.busy()
    }

    /// Whether its events reach a queue, for what the runner says about itself on its member lease.
    pub fn events_route(&self) -> handle::route::EventsRoute {
        self.handler.events_route.clone()
    }

    /// What the runner did so far.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// Consumes until `shutdown` (the token given to [`Broker::connect`]), then finishes in-flight work
    /// within `runner.shutdown_grace` and closes its consumers. The broker connection itself is the
    /// caller's to close.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), RunnerError> {
        let config = self.handler.config.clone();
        let submit = self.broker.consumer(ConsumerKind::Submit).await?;
        // Closed until the pause switch has been read: take nothing before that.
        let switch = submit.switch();
        switch.pause();
        let control = self.broker.consumer(ConsumerKind::Control).await?;
        info!(
            runner = %self.handler.runner_id,
            max_in_flight = config.runner.max_in_flight,
            "Runner consuming submissions and control messages."
        );

        let background = shutdown.child_token();
        let mut tasks = tokio::task::JoinSet::new();
        let token = background.clone();
        tasks.spawn(self.gate_driver.run(async move { token.cancelled().await }));
        spawn_followers(
            &mut tasks,
            &self.handler,
            self.windows,
            switch,
            &self.ops.metrics,
            &background,
        );
        spawn_duties(&mut tasks, &self.handler, &self.broker, &background);

        let progress = [self.submitting.clone(), consume::Progress::default()];
        for (flag, progress) in self.ready.iter().zip(&progress) {
            let (progress, limit) = (progress.clone(), config.runner.stall_after);
            flag.fail_when(move || progress.stalled(limit));
        }
        let loop_of = |kind, consumer, slots: usize, gate, i: usize| consume::Loop {
            kind,
            consumer,
            handler: self.handler.clone(),
            slots: Arc::new(Semaphore::new(slots)),
            gate,
            stats: self.stats.clone(),
            requeue_delay: config.runner.requeue_delay,
            grace: config.runner.shutdown_grace,
            metrics: self.ops.metrics.clone(),
            ready: Some(self.ready[i].clone()),
            progress: progress[i].clone(),
        };
        let submit_loop = loop_of(
            ConsumerKind::Submit,
            submit,
            config.runner.max_in_flight as usize,
            Some(self.handler.gate.subscribe()),
            0,
        );
        let control_loop = loop_of(
            ConsumerKind::Control,
            control,
            usize::from(config.broker.control_prefetch),
            None,
            1,
        );
        tokio::join!(
            submit_loop.run(shutdown.clone()),
            control_loop.run(shutdown.clone())
        );
        background.cancel();
        while tasks.join_next().await.is_some() {}
        let (acked, requeued, dead_lettered) = self.stats.snapshot();
        let returned_at_shutdown = self.stats.stopped.load(Ordering::Relaxed);
        let settle_failed = self.stats.settle_failed.load(Ordering::Relaxed);
        info!(
            acked,
            requeued, returned_at_shutdown, dead_lettered, settle_failed, "Runner stopped."
        );
        Ok(())
    }
}

/// The runner's followers, each stopped by `background`: the maintenance windows, the pause switch, the
/// gate's metric, the tombstone, job and shard-holder caches, and the tombstone sweeper.
fn spawn_followers(
    tasks: &mut tokio::task::JoinSet<()>,
    handler: &Arc<Handler>,
    windows: tokio::sync::watch::Sender<Option<crate::cluster::Windows>>,
    switch: crate::broker::ConsumerSwitch,
    metrics: &crate::ops::Metrics,
    background: &CancellationToken,
) {
    let config = &handler.config;
    let follow_windows = crate::cluster::maintenance::follow(
        handler.client.clone(),
        config.cluster.namespace.clone(),
        config.cluster.relist_interval,
        windows,
    );
    let token = background.clone();
    tasks.spawn(async move {
        tokio::select! {
            () = follow_windows => {}
            () = token.cancelled() => {}
        }
    });
    tasks.spawn(consume::follow_pause(
        handler.gate.clone(),
        switch,
        background.clone(),
    ));
    tasks.spawn(crate::cluster::gate::follow_gate(
        handler.gate.subscribe(),
        metrics.clone(),
        background.clone().cancelled_owned(),
    ));
    let (tombstones, token) = (handler.tombstones.clone(), background.clone());
    tasks.spawn(async move { tombstones.follow(token.cancelled()).await });
    let (jobs, token) = (handler.jobs.clone(), background.clone());
    tasks.spawn(async move { jobs.follow(token.cancelled()).await });
    if let Some(holders) = handler.shard_holders.clone() {
        let token = background.clone();
        tasks.spawn(async move { holders.follow(token.cancelled()).await });
    }
    let tombstones = handler.tombstones.clone();
    let (interval, token) = (config.cluster.tombstone_sweep_interval, background.clone());
    // Tombstones are written by the handler's clock: aged by the same one.
    let clock = handler.windows_clock.clone();
    tasks.spawn(async move {
        tombstones
            .run_sweeper(interval, || clock.now(), token.cancelled())
            .await;
    });
}

/// The runner's periodic duties beside consuming, each stopped by `background`: session requests (a
/// consumer of their own, so a session never waits behind submissions), pending extensions, and the
/// tidying of booked fates.
fn spawn_duties(
    tasks: &mut tokio::task::JoinSet<()>,
    handler: &Arc<Handler>,
    broker: &Broker,
    background: &CancellationToken,
) {
    let config = &handler.config;
    let issuer = crate::sessions::issuer::Issuer::new(
        broker.clone(),
        handler.client.clone(),
        config.clone(),
        Arc::new(jiff::Timestamp::now),
    );
    let token = background.clone();
    tasks.spawn(async move {
        if let Err(e) = issuer.run(token).await {
            tracing::error!(error = %e, "Session requests cannot be consumed; no session is opened by this runner.");
        }
    });

    let (handler_for_extend, token) = (handler.clone(), background.clone());
    let interval = config.cluster.pending_extension_interval;
    tasks.spawn(async move {
        handle::extend::run_pending(handler_for_extend, interval, token.cancelled()).await;
    });

    let (handler, token) = (handler.clone(), background.clone());
    let interval = config.bookings.check_interval;
    tasks.spawn(async move {
        handle::fates::run_tidy(handler, interval, token.cancelled()).await;
    });
}
