//! [`ProxySync`]: the loop of one proxy-sync instance. Nothing missed, nothing stale:
//!
//! 1. It binds a queue of its own to the proxy fanout exchange (server-named, exclusive, auto-delete:
//!    every instance gets every event, and the queue goes when the instance does).
//! 2. Only then it builds the whole table from the cluster ([`super::snapshot`]): every event published
//!    from now on is in the queue, and everything before is in the cluster's state.
//! 3. It writes the Envoy files, reports ready, and applies the queued events and every later one
//!    (ordered against the snapshot by [`super::table`], so an event that the snapshot already reflects
//!    changes nothing).
//!
//! A temporary queue does not survive a lost channel or connection: the consumer binds a new one, and
//! what was published in between was never queued. So whenever the queue consumed is not the one the
//! table was built after, the instance stops taking events, rebuilds from the cluster and reports
//! not ready meanwhile; the new queue keeps what comes in the while.
//!
//! A message that is not a valid `ProxyEvent` goes to the dead-letter queue with the reason.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::caddy::{self, CaddyAdmin, CaddyError, CaddySettings};
use super::envoy::{self, EnvoySettings, WriteError};
use super::snapshot;
use crate::broker::consumer::Source;
use crate::broker::{
    Broker, BrokerError, DeadLetterReason, Delivery, OutboundEvent, QueueConsumer,
};
use crate::cluster::ClusterError;
use crate::config::ProxySyncConfig;
use crate::config::proxy_sync::Upstream;
use crate::durable::AnnotationKeys;
use crate::ops::health::Condition;
use crate::pipeline::PipelineConfig;
pub use crate::routes::Routes;
use crate::routes::table::{HostNaming, JobUpdate};

/// Why the loop stopped.
#[derive(Debug, thiserror::Error)]
pub enum ProxySyncError {
    /// The queue could not be bound at start.
    #[error("binding the proxy queue: {0}")]
    Broker(#[from] BrokerError),
    /// The Envoy files cannot be written (a wrong or read-only directory): permanent.
    #[error(transparent)]
    Envoy(#[from] WriteError),
}

/// One proxy-sync instance; see the module documentation.
pub struct ProxySync {
    pub broker: Broker,
    pub client: kube::Client,
    pub pipeline: PipelineConfig,
    /// `[cluster] managed_selector`: the jobs (and their pods) volcano-runner manages.
    pub managed_selector: String,
    pub config: ProxySyncConfig,
    /// The Envoy node id (the pod's name).
    pub node_id: String,
    /// Set ok once the table is built and written, failing while it is (re)built.
    pub ready: Option<Condition>,
    routes: Routes,
}

impl ProxySync {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        broker: Broker,
        client: kube::Client,
        pipeline: PipelineConfig,
        managed_selector: String,
        config: ProxySyncConfig,
        node_id: String,
        ready: Option<Condition>,
    ) -> Self {
        Self {
            broker,
            client,
            pipeline,
            managed_selector,
            config,
            node_id,
            ready,
            routes: Routes::default(),
        }
    }

    /// The table this instance keeps.
    pub fn routes(&self) -> Routes {
        self.routes.clone()
    }

    fn naming(&self) -> HostNaming {
        HostNaming {
            prefix: self.pipeline.proxy.prefix.clone(),
            domain: self.pipeline.proxy.domain.clone(),
        }
    }

    fn set_ready(&self, result: Result<(), String>) {
        if let Some(ready) = &self.ready {
            ready.set(result);
        }
    }

    /// Runs until `shutdown`. Fails only when the queue cannot be bound at start or the Envoy files
    /// cannot be written; a cluster that does not answer is retried (not ready meanwhile).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), ProxySyncError> {
        self.set_ready(Err("binding the proxy queue".into()));
        let bindings = vec![(self.broker.config().proxy_exchange.clone(), String::new())];
        let mut consumer = QueueConsumer::start_source(
            self.broker.clone(),
            Source::Temporary(bindings),
            self.config.prefetch,
            "proxy",
        )
        .await?;
        let writer = Arc::new(Writer::new(
            &self.config,
            self.naming(),
            self.node_id.clone(),
        ));
        let write_loop = tokio::spawn(writer.clone().run(
            self.routes.clone(),
            self.routes.subscribe(),
            self.config.coalesce,
            self.config.caddy_check,
            shutdown.clone(),
        ));
        let result = self.consume(&mut consumer, &writer, &shutdown).await;
        consumer.close().await;
        write_loop.abort();
        let _ = write_loop.await;
        result
    }

    async fn consume(
        &self,
        consumer: &mut QueueConsumer,
        writer: &Arc<Writer>,
        shutdown: &CancellationToken,
    ) -> Result<(), ProxySyncError> {
        // The queue the table was last built after.
        let mut built_after: Option<String> = None;
        let mut check = tokio::time::interval(self.broker.config().health_check_interval);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let retention = self.config.removed_retention;
        let mut prune =
            tokio::time::interval_at(tokio::time::Instant::now() + retention, retention);
        loop {
            if let Some(queue) = consumer.queue()
                && built_after.as_deref() != Some(queue)
            {
                let queue = queue.to_owned();
                if !self.rebuild(&queue, writer, shutdown).await? {
                    return Ok(());
                }
                built_after = Some(queue);
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                delivery = consumer.recv() => {
                    let Some(delivery) = delivery else { return Ok(()) };
                    if delivery.queue() != built_after.as_deref().unwrap_or_default() {
                        // The first event on a new queue: the table is rebuilt first, then it applies.
                        let queue = delivery.queue().to_owned();
                        if !self.rebuild(&queue, writer, shutdown).await? {
                            return Ok(());
                        }
                        built_after = Some(queue);
                    }
                    self.handle(delivery).await;
                }
                _ = check.tick() => {}
                _ = prune.tick() => {
                    let pruned = self.routes.change(|t| (t.prune_removed(), false));
                    debug!(pruned, "Forgot removed jobs past the retention.");
                }
            }
        }
    }

    /// Builds the table from the cluster, retrying until it succeeds (false: shut down meanwhile), and
    /// writes the Envoy files before reporting ready.
    async fn rebuild(
        &self,
        queue: &str,
        writer: &Arc<Writer>,
        shutdown: &CancellationToken,
    ) -> Result<bool, ProxySyncError> {
        self.set_ready(Err(format!(
            "building the route table from the cluster (after binding {queue})"
        )));
        let mut delays = self.broker.config().reconnect_backoff();
        let began = std::time::Instant::now();
        let (updates, skipped) = loop {
            match self.read_cluster().await {
                Ok(found) => break found,
                Err(e) => {
                    let delay = delays.next().unwrap_or(Duration::from_secs(1));
                    warn!(error = %e, ?delay, "The route table could not be built from the cluster; retrying.");
                    tokio::select! {
                        () = shutdown.cancelled() => return Ok(false),
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        };
        for s in &skipped {
            warn!(job = %s.job, reason = %s.reason, "A job's annotations are unreadable; it is not routed.");
        }
        let jobs = updates.len();
        self.routes.change(|t| {
            let changed = t.replace(updates);
            ((), changed)
        });
        writer.write(&self.routes).await?;
        // Caddy too has every route before ready; a Caddy not up yet (a sidecar starting) is waited for.
        let mut delays = self.broker.config().reconnect_backoff();
        while let Err(e) = writer.push_caddy(&self.routes, false).await {
            let delay = delays.next().unwrap_or(Duration::from_secs(1));
            warn!(error = %e, ?delay, "The routes could not be pushed to Caddy; retrying.");
            tokio::select! {
                () = shutdown.cancelled() => return Ok(false),
                () = tokio::time::sleep(delay) => {}
            }
        }
        info!(jobs, %queue, took = ?began.elapsed(), "Route table built from the cluster.");
        self.set_ready(Ok(()));
        Ok(true)
    }

    async fn read_cluster(&self) -> Result<(Vec<JobUpdate>, Vec<snapshot::Skipped>), ClusterError> {
        let (jobs, pods) = snapshot::list(&self.client, &self.managed_selector).await?;
        let keys: AnnotationKeys = self.pipeline.keys().into_owned();
        Ok(snapshot::updates(&jobs, &pods, &keys, &self.pipeline))
    }

    /// Applies one delivery, or dead-letters it with the reason.
    async fn handle(&self, delivery: Delivery) {
        let update = match OutboundEvent::decode(
            delivery.type_name(),
            delivery.content_type(),
            delivery.body(),
        ) {
            Ok(OutboundEvent::Proxy(event)) => JobUpdate::from_event(&event).map_err(|e| {
                DeadLetterReason::new(e.kind().code(), e.message()).with_field(e.field())
            }),
            Ok(other) => Err(DeadLetterReason::new(
                "unexpected_message_type",
                format!(
                    "{} is not a proxy event; only ProxyEvent is published to the proxy exchange",
                    other.type_name()
                ),
            )),
            Err(e) => {
                let reason = DeadLetterReason::new(e.reason(), e.to_string());
                Err(match e.field() {
                    Some(field) => reason.with_field(field),
                    None => reason,
                })
            }
        };
        match update {
            Ok(update) => {
                let job = update.job_id.clone();
                let applied = self.routes.apply(update);
                debug!(%job, ?applied, "Proxy event applied.");
                if let Err(e) = delivery.ack().await {
                    // It comes again and changes nothing the second time.
                    debug!(error = %e, "A proxy event's ack failed.");
                }
            }
            Err(reason) => {
                warn!(code = %reason.code, reason = %reason.message, "A proxy event is invalid; dead-lettering it.");
                if let Err(e) = delivery.dead_letter(&reason).await {
                    warn!(error = %e, "Dead-lettering an invalid proxy event failed.");
                }
            }
        }
    }
}

/// Writes the Envoy files and pushes Caddy's configuration, one write at a time: changes coalesced by
/// [`Writer::run`], or at once by [`Writer::write`] and [`Writer::push_caddy`] (after a rebuild, before
/// ready).
struct Writer {
    settings: Option<EnvoySettings>,
    caddy: Option<(CaddyAdmin, CaddySettings)>,
    /// The table version and the marker last pushed to Caddy (with the check, the marker never
    /// changes after the first push, and nothing is pushed again unless Caddy lost it).
    caddy_pushed: Mutex<Option<(u64, String)>>,
    naming: HostNaming,
    node_id: String,
    lock: tokio::sync::Mutex<()>,
    /// The table version last written.
    written: Mutex<Option<u64>>,
    /// How many times the files were written.
    passes: std::sync::atomic::AtomicU64,
}

impl Writer {
    fn new(c: &ProxySyncConfig, naming: HostNaming, node_id: String) -> Self {
        // The URLs were checked with the configuration ([`ProxySyncConfig::check`]).
        let upstream = |url: &str| {
            (!url.is_empty())
                .then(|| Upstream::parse(url).ok())
                .flatten()
        };
        let caddy = upstream(&c.caddy_admin).map(|admin| {
            (
                CaddyAdmin::new(admin.clone()),
                CaddySettings {
                    admin,
                    listen_port: c.listen_port,
                    authz: upstream(&c.authz_url),
                    bridge: upstream(&c.bridge_url),
                },
            )
        });
        Self {
            caddy,
            caddy_pushed: Mutex::new(None),
            settings: (!c.envoy_dir.as_os_str().is_empty()).then(|| EnvoySettings {
                dir: c.envoy_dir.clone(),
                listen_port: c.listen_port,
                connect_timeout_ms: u64::try_from(c.connect_timeout.as_millis())
                    .unwrap_or(u64::MAX),
                authz: upstream(&c.authz_url),
                bridge: upstream(&c.bridge_url),
            }),
            naming,
            node_id,
            lock: tokio::sync::Mutex::new(()),
            written: Mutex::new(None),
            passes: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Writes the table as it is now, unless that version is written already.
    async fn write(&self, routes: &Routes) -> Result<(), WriteError> {
        let Some(settings) = &self.settings else {
            return Ok(());
        };
        let _one_at_a_time = self.lock.lock().await;
        let version = routes.version();
        if *self.written.lock().unwrap_or_else(|e| e.into_inner()) == Some(version) {
            return Ok(());
        }
        let files = routes.read(|t| envoy::render(t, &self.naming, settings));
        let bootstrap = envoy::bootstrap(settings, &self.node_id);
        let dir = settings.dir.clone();
        let began = std::time::Instant::now();
        let written = tokio::task::spawn_blocking(move || -> Result<usize, WriteError> {
            let mut n = 0;
            for (name, value) in files {
                n += usize::from(envoy::write_atomically(&dir, name, &value)?);
            }
            n += usize::from(envoy::write_atomically(
                &dir,
                envoy::BOOTSTRAP_FILE,
                &bootstrap,
            )?);
            Ok(n)
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?;
        *self.written.lock().unwrap_or_else(|e| e.into_inner()) = Some(version);
        self.passes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        debug!(files = written, version, took = ?began.elapsed(), "Envoy configuration written.");
        Ok(())
    }

    /// Pushes the table as it is now to Caddy, unless that version is what Caddy got last (`force`:
    /// whatever Caddy got).
    async fn push_caddy(&self, routes: &Routes, force: bool) -> Result<(), CaddyError> {
        let Some((admin, settings)) = &self.caddy else {
            return Ok(());
        };
        let _one_at_a_time = self.lock.lock().await;
        let version = routes.version();
        let pushed = self
            .caddy_pushed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if !force && pushed.as_ref().is_some_and(|(v, _)| *v == version) {
            return Ok(());
        }
        let (config, marker) = if caddy::per_request_routing(settings) {
            // The same configuration whatever the routes: reading them would be wasted.
            caddy::config(&[], settings)
        } else {
            routes.read(|t| caddy::config(&t.routes(&self.naming), settings))
        };
        if !force && pushed.as_ref().is_some_and(|(_, m)| *m == marker) {
            // Nothing Caddy runs would change: no /load, so no reload and no WebSocket closed.
            *self.caddy_pushed.lock().unwrap_or_else(|e| e.into_inner()) = Some((version, marker));
            return Ok(());
        }
        let began = std::time::Instant::now();
        admin.load(&config).await?;
        debug!(version, %marker, took = ?began.elapsed(), "Caddy configuration pushed.");
        *self.caddy_pushed.lock().unwrap_or_else(|e| e.into_inner()) = Some((version, marker));
        Ok(())
    }

    /// Pushes the whole configuration again when Caddy no longer runs what it was given (restarted, or
    /// its configuration replaced), or was never given the current version.
    async fn check_caddy(&self, routes: &Routes) -> Result<(), CaddyError> {
        let Some((admin, _)) = &self.caddy else {
            return Ok(());
        };
        let pushed = self
            .caddy_pushed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match pushed {
            Some((_, marker)) if !admin.runs(&marker).await? => {
                warn!(%marker, "Caddy no longer runs the configuration it was given (restarted?); pushing it again.");
                self.push_caddy(routes, true).await
            }
            _ => self.push_caddy(routes, false).await,
        }
    }

    /// Writes after each change `changes` sees (subscribed by the caller, so no change made after the
    /// call is missed), at most once per `coalesce`; and every `caddy_check` checks that Caddy still
    /// runs what it was given.
    async fn run(
        self: Arc<Self>,
        routes: Routes,
        mut changes: watch::Receiver<u64>,
        coalesce: Duration,
        caddy_check: Duration,
        shutdown: CancellationToken,
    ) -> Result<(), WriteError> {
        let mut check =
            tokio::time::interval_at(tokio::time::Instant::now() + caddy_check, caddy_check);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                changed = changes.changed() => if changed.is_err() { return Ok(()) },
                _ = check.tick(), if self.caddy.is_some() => {
                    if let Err(e) = self.check_caddy(&routes).await {
                        warn!(error = %e, "Caddy's configuration could not be checked or pushed; trying again.");
                    }
                    continue;
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = tokio::time::sleep(coalesce) => {}
            }
            changes.borrow_and_update();
            if let Err(e) = self.write(&routes).await {
                // Envoy keeps serving the last files; the next change tries again.
                warn!(error = %e, "The Envoy configuration could not be written.");
            }
            if let Err(e) = self.push_caddy(&routes, false).await {
                // Caddy keeps serving what it has; the next check pushes again.
                warn!(error = %e, "The routes could not be pushed to Caddy.");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::v1::{ProxyAction, ProxyEvent, ProxyTarget};
    use crate::routes::table::Applied;
    use std::sync::atomic::Ordering;

    fn update(job: &str) -> JobUpdate {
        JobUpdate::from_event(&ProxyEvent {
            event_id: format!("{job}/proxy/create/x"),
            job_id: job.into(),
            action: ProxyAction::Create as i32,
            targets: vec![ProxyTarget {
                rank: 0,
                pod_ip: "10.0.0.1".into(),
                port: 8888,
                hostname: format!("j-{job}-job-0.j-{job}"),
            }],
            domains: vec![],
            timestamp: Some(pbjson_types::Timestamp {
                seconds: 1,
                nanos: 0,
            }),
            sequence: 1,
        })
        .unwrap()
    }

    /// A burst of changes is one write, with all of them; a later change is the next write.
    #[tokio::test]
    async fn changes_within_the_interval_are_written_together() {
        let dir = std::env::temp_dir().join(format!("vr-envoy-coalesce-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let config = ProxySyncConfig {
            envoy_dir: dir.clone(),
            ..ProxySyncConfig::default()
        };
        let naming = HostNaming {
            prefix: "app-".into(),
            domain: "cloud.sdu.dk".into(),
        };
        let writer = Arc::new(Writer::new(&config, naming, "n".into()));
        let routes = Routes::default();
        let shutdown = CancellationToken::new();
        let interval = Duration::from_millis(600);
        let task = tokio::spawn(writer.clone().run(
            routes.clone(),
            routes.subscribe(),
            interval,
            Duration::from_secs(3600),
            shutdown.clone(),
        ));
        for i in 0..100 {
            assert_eq!(routes.apply(update(&format!("j{i}"))), Applied::Changed);
        }
        tokio::time::sleep(interval * 3).await;
        assert_eq!(writer.passes.load(Ordering::Relaxed), 1);
        let rds = std::fs::read_to_string(dir.join(envoy::RDS_FILE)).unwrap();
        assert_eq!(rds.matches("\"domains\"").count(), 100);
        routes.apply(update("late"));
        tokio::time::sleep(interval * 3).await;
        assert_eq!(writer.passes.load(Ordering::Relaxed), 2);
        let rds = std::fs::read_to_string(dir.join(envoy::RDS_FILE)).unwrap();
        assert!(rds.contains("app-late-0.cloud.sdu.dk"));
        shutdown.cancel();
        task.await.unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
