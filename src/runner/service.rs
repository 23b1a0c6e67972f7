//! [`Service`]: everything `volcano-runner run` runs in one process, given a cluster client: the broker
//! connection, the [`Runner`] (consumers and handlers), the shard leases and the monitor.
//!
//! The CLI builds the client (a real cluster, a URL, or the embedded simulator) and hands it over; tests
//! do the same with a simulator of their own. Every part runs until the one `shutdown` token fires, and
//! the broker connection is closed last, after every consumer and publisher is done with it.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::broker::Broker;
use crate::cluster::ShardLeases;
use crate::config::Config;
use crate::monitor::{Clock, Monitor};

use super::{Runner, RunnerError};

/// How often a runner whose own namespace is missing (and that may not create it) looks again.
const NAMESPACE_RETRY: Duration = Duration::from_secs(30);

/// Ensures the runner's namespaces exist and reports it in readiness: `false` (with an ERROR naming the
/// cause, once per cause) when they do not and cannot be made to.
async fn ensure_own_namespaces(
    client: &kube::Client,
    config: &Config,
    condition: &crate::ops::health::Condition,
) -> bool {
    match crate::cluster::namespaces::ensure_runner_namespaces(
        client,
        &config.cluster,
        &config.pipeline,
    )
    .await
    {
        Ok(created) => {
            for name in created {
                info!(namespace = %name, "Created the runner's namespace (leases, tombstones, pause switch).");
            }
            condition.set(Ok(()));
            true
        }
        Err(why) => {
            let first = condition.get_err().as_deref() != Some(why.as_str());
            if first {
                tracing::error!(namespace = %config.cluster.namespace, "{why}");
            }
            condition.set(Err(why));
            false
        }
    }
}

/// How long closing the broker connection may take at the end.
const BROKER_CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// One runner process.
pub struct Service {
    /// The whole configuration (broker, cluster, pipeline, runner, monitor).
    pub config: Config,
    /// The cluster to work on.
    pub client: kube::Client,
    /// This runner's name (see [`super::RunnerConfig::id`]); also its identity in the shard leases.
    pub runner_id: String,
    /// Whether this process also carries the monitoring duty (leases and monitor). Off only for
    /// special deployments (and tests of the consuming side alone): jobs are then never watched here.
    pub monitor: bool,
    /// The monitor's clock and how often it looks at a clock that does not run by itself; `None` for the
    /// system clock. With the embedded simulator, its clock.
    pub monitor_clock: Option<(Arc<dyn Clock>, Duration)>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("runner_id", &self.runner_id)
            .field("monitor", &self.monitor)
            .finish_non_exhaustive()
    }
}

impl Service {
    /// Connects to RabbitMQ (declaring or checking the topology), then runs until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), RunnerError> {
        self.run_with_ops(shutdown, crate::ops::Ops::new()).await
    }

    /// [`Service::run`], reporting into `ops`: the broker's connection and its readiness, the runner's
    /// messages and consumers, the monitor's shards, watches and jobs, every published event.
    pub async fn run_with_ops(
        mut self,
        shutdown: CancellationToken,
        ops: crate::ops::Ops,
    ) -> Result<(), RunnerError> {
        self.config.runner.check()?;
        // Not ready until the broker is connected (the cluster check is the caller's, with its client).
        let broker_ready = ops.readiness.expect_broker();
        if self.config.cluster.lease.identity.is_none() {
            self.config.cluster.lease.identity = Some(self.runner_id.clone());
        }
        let broker = match Broker::connect(self.config.broker.clone(), shutdown.clone()).await {
            Ok(broker) => broker,
            // Stopped (SIGTERM, Ctrl-C) while RabbitMQ was still being tried: nothing was started,
            // so nothing is left to finish. A stop that was asked for is not a failure.
            Err(crate::broker::BrokerError::Shutdown) if shutdown.is_cancelled() => {
                info!("Stopped before RabbitMQ was reached; nothing was consumed.");
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        ops.metrics.watch_broker(broker.clone());
        broker_ready.fill(broker.clone());
        let config = Arc::new(self.config.clone());
        let mut runner = Runner::with_ops(
            (*config).clone(),
            self.client.clone(),
            broker.clone(),
            self.runner_id.clone(),
            ops.clone(),
        )?;
        if let Some((clock, _)) = &self.monitor_clock {
            runner = runner.with_clock(clock.clone());
        }
        // Who holds each shard: a job of another runner's shard gets its QUEUED from that runner's
        // monitor, so submitting it costs no write of the record of its confirm.
        let identity = config.cluster.lease.identity.clone().unwrap_or_default();
        runner = runner.with_shard_holders(crate::cluster::ShardHolders::new(
            self.client.clone(),
            &config.cluster,
            &identity,
        ));
        let mut duties = tokio::task::JoinSet::new();
        // The runner's own namespace holds its leases, tombstones and pause switch: without it the
        // monitoring duty would never start, silently. Made sure of now, and again until it works.
        let own = ops.readiness.condition(
            "own namespace",
            &format!("namespace {} not checked yet", config.cluster.namespace),
        );
        let namespaces_ok = ensure_own_namespaces(&self.client, &config, &own).await;
        if !namespaces_ok {
            let (client, config, token) = (self.client.clone(), config.clone(), shutdown.clone());
            duties.spawn(async move {
                loop {
                    tokio::select! {
                        () = token.cancelled() => return,
                        () = tokio::time::sleep(NAMESPACE_RETRY) => {}
                    }
                    if ensure_own_namespaces(&client, &config, &own).await {
                        return;
                    }
                }
            });
        }
        if self.monitor {
            self.start_monitoring(&config, &runner, &broker, &ops, &shutdown, &mut duties);
        }
        ops.readiness.seal();
        // The worker threads follow the CPU limit, or TOKIO_WORKER_THREADS (see docs/ops.md).
        let workers = tokio::runtime::Handle::current().metrics().num_workers();
        info!(runner = %self.runner_id, monitor = self.monitor, workers, "volcano-runner started.");
        let result = runner.run(shutdown.clone()).await;
        // The runner returns on shutdown (or failed to start): stop the duties too.
        shutdown.cancel();
        while let Some(done) = duties.join_next().await {
            if let Err(e) = done {
                warn!(error = %e, "A duty ended abnormally.");
            }
        }
        // Bounded: a connection whose close handshake never completes (seen with lapin after a channel
        // close raced its own Closing state) must not keep the process from exiting.
        if tokio::time::timeout(BROKER_CLOSE_TIMEOUT, broker.close())
            .await
            .is_err()
        {
            warn!(timeout = ?BROKER_CLOSE_TIMEOUT, "The RabbitMQ connection did not close in time; leaving it.");
        }
        result
    }

    /// The monitoring duty, as duties of this process: the shard leases, the writer of the records of
    /// confirmed QUEUEDs when a shard leaves, and the monitor.
    fn start_monitoring(
        &self,
        config: &Arc<Config>,
        runner: &Runner,
        broker: &Broker,
        ops: &crate::ops::Ops,
        shutdown: &CancellationToken,
        duties: &mut tokio::task::JoinSet<()>,
    ) {
        // The record of a confirmed QUEUED of a job of this runner's shards rides on the monitor's
        // first write of it; a shard that leaves first gets its records written before it goes, and
        // the shard's lease lists them meanwhile, for a runner that takes the shard over after a kill.
        let confirmed = runner.confirmed_queued();
        let (leases, handle) = ShardLeases::new(self.client.clone(), &config.cluster);
        // What keeps this runner from its work goes on its member lease, for `admin status`.
        let route = runner.events_route();
        // Leases that cannot be written leave the jobs unmonitored: told at WARN and in /readyz.
        let leases = leases
            .with_note(move || route.problem())
            .with_health(ops.readiness.condition("shard leases", ""))
            .with_carried_records(Arc::new(confirmed.clone()));
        let token = shutdown.clone();
        duties.spawn(async move { leases.run(token.cancelled_owned()).await });
        confirmed.attach(handle.subscribe());
        let key = crate::monitor::queued::annotation_key(&config.pipeline.annotation_prefix);
        duties.spawn(confirmed.write_on_handover(self.client.clone(), key));
        let mut monitor = Monitor::new(
            self.client.clone(),
            broker.publisher().with_metrics(ops.metrics.clone()),
            config.clone(),
            self.runner_id.clone(),
            handle.subscribe(),
        )
        .with_metrics(ops.metrics.clone())
        .with_confirmed_queued(runner.confirmed_queued())
        .with_submit_load(runner.submit_load())
        .with_windows(runner.windows());
        if let Some((clock, poll)) = &self.monitor_clock {
            monitor = monitor.with_clock(clock.clone(), *poll);
        }
        duties.spawn(monitor.run(shutdown.clone()));
    }
}
