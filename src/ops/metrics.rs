//! [`Metrics`]: what a runner counts, as Prometheus metrics.
//!
//! One handle per process, cloned into every part that reports (cloning is an `Arc` bump). Methods are
//! named after what happened (`message_handled`, `kube_call`, `event_published`) so call sites read as a
//! sentence, and every label value is a `&'static str` chosen by the caller or a Kubernetes resource name,
//! never an id: the number of time series stays bounded whatever the traffic.
//!
//! All names start with `volcano_runner_`; counters end in `_total`, durations are seconds. The
//! exposition is OpenMetrics text (`# EOF` at the end), which Prometheus reads.
//!
//! | metric | type | labels | meaning |
//! | --- | --- | --- | --- |
//! | `messages_handled_total` | counter | `type`, `outcome` | inbound messages settled, by what happened to them |
//! | `message_handling_seconds` | histogram | `type` | from delivery to settlement |
//! | `messages_in_flight` | gauge | | deliveries being handled now |
//! | `kube_requests_total` | counter | `verb`, `resource` | Kubernetes API requests |
//! | `kube_request_errors_total` | counter | `verb`, `resource`, `error` | of those, the failed ones, by class |
//! | `kube_request_duration_seconds` | histogram | `verb`, `resource` | until the response headers (a watch: until it starts) |
//! | `submissions_paused` | gauge | | 1 while the pause switch is on |
//! | `submission_gate_open` | gauge | | 1 while this runner takes submissions (not paused, below the cap) |
//! | `active_jobs` / `active_jobs_limit` | gauge | | the capacity view and its cap (absent: no cap) |
//! | `monitored_jobs` | gauge | | jobs whose monitoring duty this runner holds |
//! | `accounting_lag_seconds` | gauge | | how far behind the ticks are: over the running jobs this runner monitors, the longest time a tick has been due (its end plus `[pipeline.accounting] settle`) without being published; 0 when every tick is on time (at the last full pass) |
//! | `lease_shards_held` / `lease_shards` | gauge | | shard leases held by this runner, and in all |
//! | `monitor_watch_events_total` | counter | `watch`, `news` | the monitor's watch events (`jobs`, `pods`, `podgroups`), `news="no"` for a version its cache held already (the echo of its own write) |
//! | `monitor_decisions_total` | counter | | jobs the monitor decided (a worker ran the decision; a job whose view is the one it was last decided on is not counted) |
//! | `events_published_total` | counter | `type` | outbound messages the broker confirmed |
//! | `event_publish_failures_total` | counter | `type`, `reason` | publishes that failed after their retries |
//! | `event_confirm_seconds` | histogram | `type` | from publish to the broker's confirm |
//! | `events_waiting_for_route` | gauge | | events no queue receives, published again until one does (their messages stay in hand) |
//! | `broker_connected` / `broker_reconnects_total` | gauge / counter | | the AMQP connection, read at scrape time |
//! | `watch_restarts_total` | counter | `watch` | Kubernetes watches that had to start over |
//! | `authz_checks_total` | counter | `decision`, `reason` | proxy-sync's session checks, by answer: `allowed` (`session`, `session_url`) or `denied` (`no_session` and the check's reasons) |
//! | `ready` | gauge | `check` | the last outcome of each readiness check |
//! | `build_info` | info | `version` | the running version |
//!
//! Beside them, unprefixed, the standard process metrics ([`super::process`]): `process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`,
//! `process_start_time_seconds`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use super::health::BrokerConnection;
use crate::messages::MessageType;

/// The prefix of every metric name.
pub const PREFIX: &str = "volcano_runner";

/// The `Content-Type` of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

const HANDLING_BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const KUBE_BUCKETS: [f64; 13] = [
    0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const CONFIRM_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MessageLabels {
    r#type: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabel {
    r#type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KubeLabels {
    verb: &'static str,
    resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KubeErrorLabels {
    verb: &'static str,
    resource: String,
    error: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    r#type: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchLabel {
    watch: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchEventLabels {
    watch: &'static str,
    news: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AuthzLabels {
    decision: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabel {
    check: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NoLabels {}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

struct Inner {
    registry: Registry,
    /// The standard process metrics, without the prefix.
    process: Registry,
    deliveries: Deliveries,
    kube: Kube,
    gate: Gate,
    monitoring: Monitoring,
    events: Events,
    checks: Checks,
    broker: Arc<BrokerSource>,
}

/// The inbound messages: settled, how long they took, in hand now.
struct Deliveries {
    messages: Family<MessageLabels, Counter>,
    handling: HistogramFamily<TypeLabel>,
    in_flight: Gauge,
}

impl Deliveries {
    /// Registers them in `registry`, in the order of the exposition.
    fn register(registry: &mut Registry) -> Self {
        let messages = Family::<MessageLabels, Counter>::default();
        registry.register(
            "messages_handled",
            "Inbound messages settled, by message type and what happened to them",
            messages.clone(),
        );
        let handling: HistogramFamily<TypeLabel> =
            Family::new_with_constructor(|| Histogram::new(HANDLING_BUCKETS));
        registry.register_with_unit(
            "message_handling",
            "Time from delivery to settlement (ack, requeue or dead-letter), by message type",
            Unit::Seconds,
            handling.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "messages_in_flight",
            "Deliveries being handled now",
            in_flight.clone(),
        );
        Self {
            messages,
            handling,
            in_flight,
        }
    }
}

/// The Kubernetes API requests.
struct Kube {
    kube_requests: Family<KubeLabels, Counter>,
    kube_errors: Family<KubeErrorLabels, Counter>,
    kube_latency: HistogramFamily<KubeLabels>,
}

impl Kube {
    /// Registers them in `registry`, in the order of the exposition.
    fn register(registry: &mut Registry) -> Self {
        let kube_requests = Family::<KubeLabels, Counter>::default();
        registry.register(
            "kube_requests",
            "Kubernetes API requests, by RBAC verb and resource",
            kube_requests.clone(),
        );
        let kube_errors = Family::<KubeErrorLabels, Counter>::default();
        registry.register(
            "kube_request_errors",
            "Kubernetes API requests that failed, by verb, resource and error class",
            kube_errors.clone(),
        );
        let kube_latency: HistogramFamily<KubeLabels> =
            Family::new_with_constructor(|| Histogram::new(KUBE_BUCKETS));
        registry.register_with_unit(
            "kube_request_duration",
            "Time until the API server's response headers (for a watch: until it started)",
            Unit::Seconds,
            kube_latency.clone(),
        );
        Self {
            kube_requests,
            kube_errors,
            kube_latency,
        }
    }
}

/// The submission gate: the pause switch and the active-job cap.
struct Gate {
    paused: Gauge,
    gate_open: Gauge,
    active_jobs: Family<NoLabels, Gauge>,
    active_jobs_limit: Family<NoLabels, Gauge>,
}

impl Gate {
    /// Registers them in `registry`, in the order of the exposition.
    fn register(registry: &mut Registry) -> Self {
        let paused = Gauge::default();
        registry.register(
            "submissions_paused",
            "1 while the cluster-wide pause switch is on",
            paused.clone(),
        );
        let gate_open = Gauge::default();
        registry.register(
            "submission_gate_open",
            "1 while this runner takes submissions (not paused and below the active-job cap)",
            gate_open.clone(),
        );
        let active_jobs = Family::<NoLabels, Gauge>::default();
        registry.register(
            "active_jobs",
            "Active VolcanoJobs managed by volcano-runner, as this runner counts them (absent when not \
             counted: without a cap runners do not watch for it)",
            active_jobs.clone(),
        );
        let active_jobs_limit = Family::<NoLabels, Gauge>::default();
        registry.register(
            "active_jobs_limit",
            "The cluster-wide cap on active jobs (absent when there is none)",
            active_jobs_limit.clone(),
        );
        Self {
            paused,
            gate_open,
            active_jobs,
            active_jobs_limit,
        }
    }
}

/// The monitoring duty: its jobs, its lag, its shards and what it costs (events read, decisions made).
struct Monitoring {
    monitored: Gauge,
    accounting_lag: Gauge<f64, std::sync::atomic::AtomicU64>,
    shards_held: Gauge,
    shards: Gauge,
    watch_events: Family<WatchEventLabels, Counter>,
    decisions: Counter,
}

impl Monitoring {
    /// Registers them in `registry`, in the order of the exposition.
    fn register(registry: &mut Registry) -> Self {
        let monitored = Gauge::default();
        registry.register(
            "monitored_jobs",
            "Jobs whose monitoring duty this runner holds (at the last full reconciliation pass)",
            monitored.clone(),
        );
        let accounting_lag = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register_with_unit(
            "accounting_lag",
            "The longest time a running job's tick has been due (its end plus the settle delay) without \
             being published, over the jobs this runner monitors (at the last full pass; 0: on time)",
            Unit::Seconds,
            accounting_lag.clone(),
        );
        let shards_held = Gauge::default();
        registry.register(
            "lease_shards_held",
            "Monitoring shards whose lease this runner holds",
            shards_held.clone(),
        );
        let shards = Gauge::default();
        registry.register("lease_shards", "Monitoring shards in all", shards.clone());
        let watch_events = Family::<WatchEventLabels, Counter>::default();
        registry.register(
            "monitor_watch_events",
            "The monitor's watch events by watch; news=\"no\": a version its cache held already",
            watch_events.clone(),
        );
        let decisions = Counter::default();
        registry.register(
            "monitor_decisions",
            "Jobs the monitor decided (a view it had decided already is not decided again)",
            decisions.clone(),
        );
        Self {
            monitored,
            accounting_lag,
            shards_held,
            shards,
            watch_events,
            decisions,
        }
    }
}

/// The outbound messages: confirmed, failed, waiting for a route.
struct Events {
    waiting_for_route: Gauge,
    published: Family<TypeLabel, Counter>,
    publish_failures: Family<FailureLabels, Counter>,
    confirm: HistogramFamily<TypeLabel>,
}

impl Events {
    /// Registers them in `registry`, in the order of the exposition.
    fn register(registry: &mut Registry) -> Self {
        let waiting_for_route = Gauge::default();
        registry.register(
            "events_waiting_for_route",
            "Events that no queue receives (nothing bound to the events exchange for them), published again \
             until one does; the messages that caused them stay in hand",
            waiting_for_route.clone(),
        );
        let published = Family::<TypeLabel, Counter>::default();
        registry.register(
            "events_published",
            "Outbound messages the broker confirmed, by message type",
            published.clone(),
        );
        let publish_failures = Family::<FailureLabels, Counter>::default();
        registry.register(
            "event_publish_failures",
            "Outbound messages that could not be published after their retries",
            publish_failures.clone(),
        );
        let confirm: HistogramFamily<TypeLabel> =
            Family::new_with_constructor(|| Histogram::new(CONFIRM_BUCKETS));
        registry.register_with_unit(
            "event_confirm",
            "Time from publishing an outbound message to the broker's confirm",
            Unit::Seconds,
            confirm.clone(),
        );
        Self {
            waiting_for_route,
            published,
            publish_failures,
            confirm,
        }
    }
}

/// The watches, the session checks and the readiness checks.
struct Checks {
    watch_restarts: Family<WatchLabel, Counter>,
    authz_checks: Family<AuthzLabels, Counter>,
    ready: Family<CheckLabel, Gauge>,
}

impl Checks {
    /// Registers them in `registry`, in the order of the exposition.
    fn register(registry: &mut Registry) -> Self {
        let watch_restarts = Family::<WatchLabel, Counter>::default();
        registry.register(
            "watch_restarts",
            "Kubernetes watches that had to start over (an error, 410 Gone, a dropped stream)",
            watch_restarts.clone(),
        );
        let authz_checks = Family::<AuthzLabels, Counter>::default();
        registry.register(
            "authz_checks",
            "Session checks answered by proxy-sync's /authz, by decision and reason",
            authz_checks.clone(),
        );
        let ready = Family::<CheckLabel, Gauge>::default();
        registry.register(
            "ready",
            "The last outcome of each readiness check (1 ok, 0 failing)",
            ready.clone(),
        );
        Self {
            watch_restarts,
            authz_checks,
            ready,
        }
    }
}

/// The process's metrics. Cheap to clone; every clone reports into the same registry.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Counts one delivery as in flight until dropped.
#[must_use = "the delivery counts as in flight only while this lives"]
pub struct InFlight {
    gauge: Gauge,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

impl Metrics {
    /// A fresh registry with every metric registered (and at zero where that means something).
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let deliveries = Deliveries::register(&mut registry);
        let kube = Kube::register(&mut registry);
        let gate = Gate::register(&mut registry);
        let monitoring = Monitoring::register(&mut registry);
        let events = Events::register(&mut registry);
        let checks = Checks::register(&mut registry);
        registry.register(
            "build",
            "The running version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let broker = Arc::new(BrokerSource::default());
        registry.register_collector(Box::new(broker.clone()));
        // The standard process metrics keep their standard, unprefixed names.
        let mut process = Registry::default();
        process.register_collector(Box::new(super::process::ProcessCollector));
        Self {
            inner: Arc::new(Inner {
                registry,
                process,
                deliveries,
                kube,
                gate,
                monitoring,
                events,
                checks,
                broker,
            }),
        }
    }

    /// The exposition text for a scrape ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let _ = encode_registry(&mut out, &self.inner.registry);
        let _ = encode_registry(&mut out, &self.inner.process);
        let _ = encode_eof(&mut out);
        out
    }

    /// An inbound message was settled. `outcome` is a fixed word (`applied`, `duplicate`, `rejected`,
    /// `dead_lettered`, `requeued`, ...), `message_type` the message's name (`SubmitJob`, or `unknown`).
    pub fn message_handled(
        &self,
        message_type: &'static str,
        outcome: &'static str,
        duration: Duration,
    ) {
        self.inner
            .deliveries
            .messages
            .get_or_create(&MessageLabels {
                r#type: message_type,
                outcome,
            })
            .inc();
        self.inner
            .deliveries
            .handling
            .get_or_create(&TypeLabel {
                r#type: message_type,
            })
            .observe(duration.as_secs_f64());
    }

    /// Counts one delivery as in flight until the guard is dropped.
    pub fn in_flight(&self) -> InFlight {
        self.inner.deliveries.in_flight.inc();
        InFlight {
            gauge: self.inner.deliveries.in_flight.clone(),
        }
    }

    /// One Kubernetes API request: its RBAC verb (`get`, `list`, `watch`, `create`, `patch`, ...), its
    /// resource (`jobs.batch.volcano.sh`, `pods`, `leases.coordination.k8s.io/status`), how long it
    /// took, and the error class when it failed. [`KubeCallLayer`](super::KubeCallLayer) calls this for
    /// every request of a client built with it.
    pub fn kube_call(
        &self,
        verb: &'static str,
        resource: &str,
        duration: Duration,
        error: Option<&'static str>,
    ) {
        let labels = KubeLabels {
            verb,
            resource: resource.to_owned(),
        };
        self.inner.kube.kube_requests.get_or_create(&labels).inc();
        self.inner
            .kube
            .kube_latency
            .get_or_create(&labels)
            .observe(duration.as_secs_f64());
        if let Some(error) = error {
            self.inner
                .kube
                .kube_errors
                .get_or_create(&KubeErrorLabels {
                    verb,
                    resource: labels.resource,
                    error,
                })
                .inc();
        }
    }

    /// Whether the cluster-wide pause switch is on.
    pub fn set_paused(&self, paused: bool) {
        self.inner.gate.paused.set(i64::from(paused));
    }

    /// Whether this runner takes submissions now.
    pub fn set_gate_open(&self, open: bool) {
        self.inner.gate.gate_open.set(i64::from(open));
    }

    /// The capacity view: active jobs counted (`None`: not counted, so absent rather than a made-up 0),
    /// and the cap (`None`: no cap).
    pub fn set_capacity(&self, active: Option<u64>, limit: Option<u32>) {
        match active {
            Some(active) => {
                self.inner
                    .gate
                    .active_jobs
                    .get_or_create(&NoLabels {})
                    .set(i64::try_from(active).unwrap_or(i64::MAX));
            }
            None => self.inner.gate.active_jobs.clear(),
        }
        match limit {
            Some(limit) => {
                self.inner
                    .gate
                    .active_jobs_limit
                    .get_or_create(&NoLabels {})
                    .set(i64::from(limit));
            }
            None => self.inner.gate.active_jobs_limit.clear(),
        }
    }

    /// How far behind this runner's ticks are (see the module's table), at the last full pass.
    pub fn set_accounting_lag(&self, lag: Duration) {
        self.inner.monitoring.accounting_lag.set(lag.as_secs_f64());
    }

    /// How many jobs this runner monitors (the jobs of the shards it holds, at the last full pass).
    pub fn set_monitored_jobs(&self, count: usize) {
        self.inner
            .monitoring
            .monitored
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// The monitor's `watch` (`jobs`, `pods`, `podgroups`) brought an event; `news`: a version its cache
    /// did not hold yet (an echo of the monitor's own write is not news).
    pub fn monitor_watch_event(&self, watch: &'static str, news: bool) {
        let news = if news { "yes" } else { "no" };
        self.inner
            .monitoring
            .watch_events
            .get_or_create(&WatchEventLabels { watch, news })
            .inc();
    }

    /// The monitor decided a job (a worker runs its decision).
    pub fn monitor_decided(&self) {
        self.inner.monitoring.decisions.inc();
    }

    /// The shard leases this runner holds, of how many.
    pub fn set_lease_shards(&self, held: usize, total: u32) {
        self.inner
            .monitoring
            .shards_held
            .set(i64::try_from(held).unwrap_or(i64::MAX));
        self.inner.monitoring.shards.set(i64::from(total));
    }

    /// An outbound message was confirmed by the broker, `confirm` after it was published.
    pub fn event_published(&self, message_type: &'static str, confirm: Duration) {
        let labels = TypeLabel {
            r#type: message_type,
        };
        self.inner.events.published.get_or_create(&labels).inc();
        self.inner
            .events
            .confirm
            .get_or_create(&labels)
            .observe(confirm.as_secs_f64());
    }

    /// One more (`1`) or one fewer (`-1`) event waits for a queue that receives it.
    pub fn waiting_for_route(&self, delta: i64) {
        self.inner.events.waiting_for_route.inc_by(delta);
    }

    /// An outbound message could not be published (`reason`: a fixed word such as `timeout`, `unroutable`).
    pub fn event_publish_failed(&self, message_type: &'static str, reason: &'static str) {
        self.inner
            .events
            .publish_failures
            .get_or_create(&FailureLabels {
                r#type: message_type,
                reason,
            })
            .inc();
    }

    /// A publish through an instrumented [`Publisher`](crate::broker::Publisher) ended: confirmed after
    /// `elapsed`, or failed for `failure` (a fixed word: `PublishError::reason`). `type_name` is the AMQP
    /// `type` (`volcano_runner.v1.JobEvent`).
    pub fn published(&self, type_name: &str, elapsed: Duration, failure: Option<&'static str>) {
        let message_type =
            MessageType::from_amqp_type(type_name).map_or("unknown", MessageType::name);
        match failure {
            None => self.event_published(message_type, elapsed),
            Some(reason) => self.event_publish_failed(message_type, reason),
        }
    }

    /// proxy-sync's `/authz` answered a check: `allowed` or `denied`, and why (fixed words, never an id;
    /// [`crate::sessions::authz::Decision::labels`]).
    pub fn authz_checked(&self, decision: &'static str, reason: &'static str) {
        self.inner
            .checks
            .authz_checks
            .get_or_create(&AuthzLabels { decision, reason })
            .inc();
    }

    /// A Kubernetes watch (`jobs`, `pods`, `pause`, `capacity`, ...) had to start over.
    pub fn watch_restarted(&self, watch: &'static str) {
        self.inner
            .checks
            .watch_restarts
            .get_or_create(&WatchLabel { watch })
            .inc();
    }

    /// The outcome of a readiness check (set by [`Readiness`](super::Readiness) on every evaluation).
    pub fn set_ready(&self, check: &str, ok: bool) {
        self.inner
            .checks
            .ready
            .get_or_create(&CheckLabel {
                check: check.to_owned(),
            })
            .set(i64::from(ok));
    }

    /// Reports the broker connection's state and reconnect count, read at every scrape.
    pub fn watch_broker(&self, broker: impl BrokerConnection) {
        *self
            .inner
            .broker
            .broker
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(broker));
    }
}

/// The broker's own counters, read at scrape time so they are never stale or double-counted.
#[derive(Default)]
struct BrokerSource {
    broker: Mutex<Option<Arc<dyn BrokerConnection>>>,
}

impl std::fmt::Debug for BrokerSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BrokerSource")
    }
}

impl Collector for BrokerSource {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let broker = self
            .broker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(broker) = broker else {
            return Ok(());
        };
        let connected = ConstGauge::new(i64::from(broker.is_connected()));
        connected.encode(encoder.encode_descriptor(
            "broker_connected",
            "1 while the AMQP connection is up",
            None,
            connected.metric_type(),
        )?)?;
        let reconnects = ConstCounter::new(broker.reconnects());
        reconnects.encode(encoder.encode_descriptor(
            "broker_reconnects",
            "How often the AMQP connection was re-established since start",
            None,
            reconnects.metric_type(),
        )?)?;
        Ok(())
    }
}

/// Samples parsed from exposition text: `name{label="value",...}` to value. For tests and for reading
/// another runner's `/metrics`; understands what [`Metrics::encode`] writes (no exemplars, no
/// timestamps).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples(BTreeMap<String, f64>);

impl Samples {
    /// Parses exposition text. Comment lines are skipped; a malformed line is an error naming it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut samples = BTreeMap::new();
        for line in text.lines() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) = line
                .rsplit_once(' ')
                .ok_or_else(|| format!("not a sample: {line}"))?;
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().map_err(|_| format!("not a number: {line}"))?,
            };
            samples.insert(normalize(key)?, value);
        }
        Ok(Self(samples))
    }

    /// The value of `name` with exactly these labels (in any order), if present.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.0.get(&key(name, labels)).copied()
    }

    /// Like [`get`](Self::get), 0 when absent (a counter that never moved).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }

    /// The sum of every sample of `name` whose labels include these.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|(k, _)| {
                let (n, rest) = k.split_once('{').unwrap_or((k, ""));
                n == name
                    && labels
                        .iter()
                        .all(|(l, v)| rest.contains(&format!("{l}=\"{v}\"")))
            })
            .map(|(_, v)| v)
            .sum()
    }
}

fn key(name: &str, labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return name.to_owned();
    }
    let mut sorted: Vec<_> = labels.to_vec();
    sorted.sort();
    let inner: Vec<String> = sorted.iter().map(|(l, v)| format!("{l}=\"{v}\"")).collect();
    format!("{name}{{{}}}", inner.join(","))
}

/// `name{b="2",a="1"}` as `name{a="1",b="2"}`.
fn normalize(sample: &str) -> Result<String, String> {
    let Some((name, rest)) = sample.split_once('{') else {
        return Ok(sample.to_owned());
    };
    let body = rest
        .strip_suffix('}')
        .ok_or_else(|| format!("unclosed labels: {sample}"))?;
    let mut labels = Vec::new();
    let mut start = 0;
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match c {
            '\\' if in_quotes && !escaped => {
                escaped = true;
                continue;
            }
            '"' if !escaped => in_quotes = !in_quotes,
            ',' if !in_quotes => {
                labels.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        escaped = false;
    }
    if start < body.len() {
        labels.push(&body[start..]);
    }
    if labels.is_empty() {
        return Ok(name.to_owned());
    }
    labels.sort();
    Ok(format!("{name}{{{}}}", labels.join(",")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_histograms_show_up_with_their_labels() {
        let m = Metrics::new();
        m.message_handled("SubmitJob", "applied", Duration::from_millis(30));
        m.message_handled("SubmitJob", "applied", Duration::from_millis(70));
        m.message_handled("CancelJob", "dead_lettered", Duration::from_millis(2));
        m.kube_call(
            "create",
            "jobs.batch.volcano.sh",
            Duration::from_millis(4),
            None,
        );
        m.kube_call("get", "pods", Duration::from_millis(1), Some("not_found"));
        m.event_published("JobEvent", Duration::from_millis(3));
        m.event_publish_failed("AccountingTick", "timeout");
        m.set_capacity(Some(5), Some(10));
        m.set_lease_shards(3, 8);
        m.set_monitored_jobs(4);
        m.set_accounting_lag(Duration::from_millis(90_500));
        m.watch_restarted("jobs");
        let text = m.encode();
        assert!(text.ends_with("# EOF\n"), "{text}");
        let s = Samples::parse(&text).unwrap();
        let applied = [("type", "SubmitJob"), ("outcome", "applied")];
        assert_eq!(
            s.get("volcano_runner_messages_handled_total", &applied),
            Some(2.0)
        );
        assert_eq!(
            s.get(
                "volcano_runner_messages_handled_total",
                &[("outcome", "dead_lettered"), ("type", "CancelJob")]
            ),
            Some(1.0)
        );
        assert_eq!(
            s.get(
                "volcano_runner_message_handling_seconds_count",
                &[("type", "SubmitJob")]
            ),
            Some(2.0)
        );
        let sum = s
            .get(
                "volcano_runner_message_handling_seconds_sum",
                &[("type", "SubmitJob")],
            )
            .unwrap();
        assert!((sum - 0.1).abs() < 1e-9, "{sum}");
        // Cumulative buckets: 30 ms and 70 ms are both under 0.1 s, only 30 ms under 0.05 s.
        let bucket = |le| {
            s.get(
                "volcano_runner_message_handling_seconds_bucket",
                &[("type", "SubmitJob"), ("le", le)],
            )
        };
        assert_eq!(bucket("0.05"), Some(1.0));
        assert_eq!(bucket("0.1"), Some(2.0));
        assert_eq!(bucket("+Inf"), Some(2.0));
        assert_eq!(
            s.get(
                "volcano_runner_kube_request_errors_total",
                &[
                    ("verb", "get"),
                    ("resource", "pods"),
                    ("error", "not_found")
                ]
            ),
            Some(1.0)
        );
        assert_eq!(s.sum("volcano_runner_kube_requests_total", &[]), 2.0);
        assert_eq!(
            s.get(
                "volcano_runner_events_published_total",
                &[("type", "JobEvent")]
            ),
            Some(1.0)
        );
        assert_eq!(s.get("volcano_runner_active_jobs_limit", &[]), Some(10.0));
        assert_eq!(s.get("volcano_runner_lease_shards_held", &[]), Some(3.0));
        assert_eq!(s.get("volcano_runner_monitored_jobs", &[]), Some(4.0));
        assert_eq!(
            s.get("volcano_runner_accounting_lag_seconds", &[]),
            Some(90.5)
        );
        assert_eq!(
            s.get(
                "volcano_runner_build_info",
                &[("version", env!("CARGO_PKG_VERSION"))]
            ),
            Some(1.0)
        );
        // No broker attached: its metrics are absent rather than a made-up 0.
        assert!(!text.contains("broker_connected"));
        m.set_capacity(None, None);
        let s = Samples::parse(&m.encode()).unwrap();
        assert_eq!(s.get("volcano_runner_active_jobs_limit", &[]), None);
        assert_eq!(
            s.get("volcano_runner_active_jobs", &[]),
            None,
            "not counted without a cap: absent, not 0"
        );
    }

    #[test]
    fn the_in_flight_guard_counts_while_it_lives() {
        let m = Metrics::new();
        let in_flight = |m: &Metrics| {
            Samples::parse(&m.encode())
                .unwrap()
                .value("volcano_runner_messages_in_flight", &[])
        };
        let a = m.in_flight();
        let b = m.clone().in_flight();
        assert_eq!(in_flight(&m), 2.0);
        drop(a);
        assert_eq!(in_flight(&m), 1.0);
        drop(b);
        assert_eq!(in_flight(&m), 0.0);
    }

    #[test]
    fn label_values_are_escaped_and_parsed_back() {
        let m = Metrics::new();
        m.set_ready("broker \"main\", vhost /", false);
        let s = Samples::parse(&m.encode()).unwrap();
        assert_eq!(
            s.get(
                "volcano_runner_ready",
                &[("check", "broker \\\"main\\\", vhost /")]
            ),
            Some(0.0)
        );
    }

    #[test]
    fn malformed_text_is_an_error() {
        assert!(Samples::parse("x{a=\"1\" 2").is_err());
        assert!(Samples::parse("x one").is_err());
        assert!(Samples::parse("lonely").is_err());
    }
}
