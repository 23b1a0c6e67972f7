//! The cluster simulator: a Kubernetes API server with a Volcano model, reached over real HTTP by the
//! real `kube` client (and by `kubectl`), exactly as a real cluster is.
//!
//! - [`api`], [`store`], [`registry`], [`schema`], [`patch`], [`selector`]: the API server's semantics
//!   (CRUD, list/watch, patch kinds, optimistic concurrency, structural-schema validation).
//! - [`volcano`]: Volcano's admission webhooks (pure functions, usable on their own), job controller,
//!   gang scheduler and a kubelet driven by a simulated clock ([`clock`]).
//! - [`faults`]: latency, error fractions, cut watches and unavailability, per resource and verb.
//! - [`Simulator::start`] serves it on a socket and returns a [`SimHandle`] for tests and tools.
//!
//! Tests run with [`SimConfig::for_tests`]: a free port and a clock that moves only when the test calls
//! [`SimHandle::advance`], after which the model has settled, so nothing sleeps through simulated time.

pub mod api;
pub mod builtin;
pub mod clock;
pub mod cluster;
pub mod discovery;
pub mod encode;
pub mod error;
pub mod exec;
pub mod faults;
pub mod history;
pub mod interactive;
pub mod json;
pub mod names;
pub mod netpol;
pub mod patch;
pub mod quantity;
pub mod registry;
pub mod schema;
pub mod selector;
mod server;
pub mod store;
pub mod table;
pub mod volcano;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use error::ApiError;
pub use faults::{FaultPlan, FaultRule, Faults};

/// Reads a duration written as `"90s"`, `"1m 30s"`, `"PT1M"` or a number of seconds.
fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Secs(f64),
        Text(String),
    }
    match Raw::deserialize(d)? {
        Raw::Secs(s) => seconds(s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "a duration must be a non-negative number of seconds that a duration can hold, not {s}"
            ))
        }),
        Raw::Text(t) => parse_duration(&t).map_err(serde::de::Error::custom),
    }
}

/// Parses `"90s"`, `"1m 30s"`, `"1h"`, `"PT1M"` or `"2.5"` (seconds).
pub fn parse_duration(t: &str) -> Result<Duration, String> {
    if let Ok(secs) = t.trim().parse::<f64>()
        && secs.is_finite()
        && secs >= 0.0
    {
        return seconds(secs).ok_or_else(|| format!("{t:?} is too long for a duration"));
    }
    let d: jiff::SignedDuration = t
        .trim()
        .parse()
        .map_err(|e| format!("{t:?} is not a duration (such as \"90s\" or \"1m 30s\"): {e}"))?;
    Duration::try_from(d).map_err(|_| format!("{t:?}: a duration must not be negative"))
}

/// A number of seconds as a duration; `None` when it is negative, not a number, or too long to hold
/// (`Duration::from_secs_f64` would panic on `1e20`).
fn seconds(secs: f64) -> Option<Duration> {
    if secs < 0.0 {
        return None;
    }
    Duration::try_from_secs_f64(secs).ok()
}

/// A taint on a simulated node.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TaintSpec {
    pub key: String,
    #[serde(default)]
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// One simulated node.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    pub name: String,
    /// Allocatable cpu as a quantity (`"16"`, `"15500m"`).
    pub cpu: String,
    /// Allocatable memory as a quantity (`"64Gi"`).
    pub memory: String,
    /// Number of `nvidia.com/gpu`.
    #[serde(default)]
    pub gpus: u32,
    /// Pods the node takes at most (the kubelet's `maxPods`).
    #[serde(default = "default_max_pods")]
    pub max_pods: u32,
    /// Labels, for `nodeSelector`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Taints pods must tolerate.
    #[serde(default)]
    pub taints: Vec<TaintSpec>,
}

fn default_max_pods() -> u32 {
    110
}

impl NodeSpec {
    /// A node of the default shape: 16 cpu and 64 GiB, no GPUs, labels or taints.
    pub fn cpu_node(name: &str) -> NodeSpec {
        NodeSpec {
            name: name.to_string(),
            cpu: "16".into(),
            memory: "64Gi".into(),
            gpus: 0,
            max_pods: 110,
            labels: BTreeMap::new(),
            taints: Vec::new(),
        }
    }
}

/// The default nodes: four of 16 cpu / 64 GiB and one of the same with 4 GPUs.
pub fn default_nodes() -> Vec<NodeSpec> {
    let mut nodes: Vec<NodeSpec> = (1..=4)
        .map(|i| NodeSpec::cpu_node(&format!("sim-node-{i}")))
        .collect();
    let mut gpu = NodeSpec::cpu_node("sim-gpu-1");
    gpu.gpus = 4;
    gpu.labels
        .insert("nvidia.com/gpu.present".into(), "true".into());
    nodes.push(gpu);
    nodes
}

/// The `[sim]` section of the configuration: the cluster simulator (`volcano-runner sim`, and the
/// simulator tests and benchmarks start in-process).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SimConfig {
    /// Address the API server listens on. `127.0.0.1:0` picks a free port (tests do this).
    pub listen: String,
    /// The simulated nodes. Their capacity decides which gangs fit, so tests can provoke
    /// Unschedulable jobs with a job bigger than any node.
    pub nodes: Vec<NodeSpec>,
    /// How long a container runs when the command rules do not recognise its command (no `sleep`).
    #[serde(deserialize_with = "duration")]
    pub default_run: Duration,
    /// An image whose name contains this text never pulls: its pod stays in ErrImagePull /
    /// ImagePullBackOff. Empty switches the rule off.
    pub image_pull_failure_marker: String,
    /// Simulated seconds per real second. 0 stops the clock: it moves only when a test advances it.
    pub clock_speed: f64,
    /// Simulated instant at start (RFC 3339); empty starts at the current real time.
    pub start_time: String,
    /// From a pod's binding to its containers starting (image pull and sandbox in a real cluster).
    #[serde(deserialize_with = "duration")]
    pub pod_start_delay: Duration,
    /// From a delete request to a running pod being gone (it exits on SIGTERM), at most its grace period.
    #[serde(deserialize_with = "duration")]
    pub pod_termination_delay: Duration,
    /// How late the kubelet reports a container's end: the pod status says the container runs until
    /// this long after it really ended, then reports it terminated with its real `finishedAt`. Real
    /// kubelets lag by about a second; zero reports at once.
    #[serde(deserialize_with = "duration")]
    pub status_report_delay: Duration,
    /// Volcano's enqueue over-commit factor: a gang is enqueued when its minimum resources fit into
    /// this many times the idle capacity.
    pub overcommit_factor: f64,
    /// Volcano's `proportion` plugin (in Volcano's default scheduler configuration): queues share the
    /// cluster by `spec.weight`, are served lowest share first, and a queue that holds what it deserves
    /// places nothing. Off by default: the monitor's replay does not model it yet, and its bounds do
    /// not hold under it (docs/estimates.md, "Between queues"); off, every queue's gangs are tried in
    /// one order.
    pub proportion: bool,
    /// Changes kept for watches, of all kinds together. A watch resuming from a resourceVersion after
    /// which a change of its own kind is no longer kept gets 410 Gone (a real API server keeps a watch
    /// cache per resource, so a burst of pods does not expire a watch of nodes); a small value lets
    /// tests provoke it.
    pub watch_history: usize,
    /// How long a change stays in the watch history (real time; the last 100 changes stay however old).
    /// etcd is compacted every 5 minutes, and a real API server's watch cache keeps less (about the
    /// last 75 seconds of changes): a watch that falls further behind, or resumes from an older version,
    /// gets 410 Gone and lists again. The default is etcd's 5 minutes, the longest a real cluster
    /// allows, so that a runner slowed down by a loaded machine is not sent to relist sooner than a real
    /// cluster could. Without the window the simulator kept `watch_history` changes (a hundred thousand)
    /// however old: at one job a second over an hour of every job's history, each change with its object.
    #[serde(deserialize_with = "duration")]
    pub watch_window: Duration,
    /// How long a watch without `timeoutSeconds` stays open (a real API server ends watches after
    /// 30 to 60 minutes).
    #[serde(deserialize_with = "duration")]
    pub watch_timeout: Duration,
    /// How often an idle watch that allows bookmarks receives one, so that clients resume cheaply.
    #[serde(deserialize_with = "duration")]
    pub bookmark_interval: Duration,
    /// Whether the model records Kubernetes Events (Scheduled, Unschedulable, PodGroupPending, ...).
    pub events: bool,
    /// Whether Volcano's admission webhooks run (a cluster without them accepts invalid jobs).
    pub volcano_admission: bool,
    /// Seed for generated uids and names, so runs repeat.
    pub seed: u64,
    /// Faults from the start (tests usually set them at run time through the handle).
    pub faults: FaultPlan,
    /// A directory that stands for the storage behind the jobs' PersistentVolumeClaims: claim `C` is
    /// `<storage_dir>/C/`. When set, the simulator writes what a job's output wrapper writes (every
    /// rank's `stdout.txt` / `stdout-<rank>.txt` in its output folder), so tests can read the files.
    pub storage_dir: Option<std::path::PathBuf>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            listen: "127.0.0.1:6443".into(),
            nodes: default_nodes(),
            default_run: Duration::from_secs(60),
            image_pull_failure_marker: "does-not-exist".into(),
            clock_speed: 1.0,
            start_time: String::new(),
            pod_start_delay: Duration::from_secs(1),
            pod_termination_delay: Duration::from_secs(1),
            status_report_delay: Duration::ZERO,
            overcommit_factor: 1.2,
            proportion: false,
            watch_history: 100_000,
            watch_window: Duration::from_secs(300),
            watch_timeout: Duration::from_secs(1800),
            bookmark_interval: Duration::from_secs(10),
            events: true,
            volcano_admission: true,
            seed: 1,
            faults: FaultPlan::default(),
            storage_dir: None,
        }
    }
}

impl SimConfig {
    /// The configuration tests use: a free port on loopback and a stopped clock.
    pub fn for_tests() -> Self {
        SimConfig {
            listen: "127.0.0.1:0".into(),
            clock_speed: 0.0,
            ..SimConfig::default()
        }
    }

    /// Checks the values a typo could break, naming the key.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |key: &str, reason: String| {
            Err(SimError::Config {
                key: key.to_string(),
                reason,
            })
        };
        if self.listen.parse::<SocketAddr>().is_err() {
            return bad(
                "sim.listen",
                format!("{:?} is not an address such as 127.0.0.1:6443", self.listen),
            );
        }
        if !(self.clock_speed.is_finite() && self.clock_speed >= 0.0) {
            return bad(
                "sim.clock_speed",
                format!("{} is not a speed factor >= 0", self.clock_speed),
            );
        }
        if !(self.overcommit_factor.is_finite() && self.overcommit_factor > 0.0) {
            return bad(
                "sim.overcommit_factor",
                format!("{} must be a number above 0", self.overcommit_factor),
            );
        }
        if self.watch_history == 0 {
            return bad("sim.watch_history", "must be at least 1".into());
        }
        if !self.start_time.is_empty() && self.start_time.parse::<jiff::Timestamp>().is_err() {
            return bad(
                "sim.start_time",
                format!(
                    "{:?} is not an RFC 3339 instant such as 2026-01-01T00:00:00Z",
                    self.start_time
                ),
            );
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let key = format!("sim.nodes[{i}]");
            if !names::dns1123_subdomain(&n.name).is_empty() {
                return bad(
                    &format!("{key}.name"),
                    format!(
                        "{:?} is not a valid node name (lowercase letters, digits, '-', '.')",
                        n.name
                    ),
                );
            }
            if !names.insert(n.name.clone()) {
                return bad(
                    &format!("{key}.name"),
                    format!("{:?} is used by two nodes", n.name),
                );
            }
            if quantity::parse_milli(&n.cpu).is_none_or(|c| c <= 0) {
                return bad(
                    &format!("{key}.cpu"),
                    format!(
                        "{:?} is not a cpu quantity such as \"16\" or \"15500m\"",
                        n.cpu
                    ),
                );
            }
            if quantity::parse_milli(&n.memory).is_none_or(|m| m <= 0) {
                return bad(
                    &format!("{key}.memory"),
                    format!("{:?} is not a memory quantity such as \"64Gi\"", n.memory),
                );
            }
        }
        if self.nodes.len() > 250 {
            return bad(
                "sim.nodes",
                format!("{} nodes: at most 250 are simulated", self.nodes.len()),
            );
        }
        Ok(())
    }

    fn model_config(&self) -> volcano::ModelConfig {
        volcano::ModelConfig {
            nodes: self.nodes.clone(),
            default_run: self.default_run,
            image_pull_failure_marker: self.image_pull_failure_marker.clone(),
            pod_start_delay: self.pod_start_delay,
            pod_termination_delay: self.pod_termination_delay,
            status_report_delay: self.status_report_delay,
            overcommit_factor: self.overcommit_factor,
            proportion: self.proportion,
            events: self.events,
            storage_dir: self.storage_dir.clone(),
        }
    }
}

/// Why the simulator could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("configuration {key}: {reason}")]
    Config { key: String, reason: String },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot build a kube client for {url}: {reason}")]
    Client { url: String, reason: String },
}

/// Starts simulators.
pub struct Simulator;

impl Simulator {
    /// Starts the API server on `config.listen` with the Volcano model. The returned handle owns the
    /// server; dropping it (or [`SimHandle::shutdown`]) stops it.
    pub async fn start(config: SimConfig) -> Result<SimHandle, SimError> {
        config.validate()?;
        let listener = tokio::net::TcpListener::bind(&config.listen)
            .await
            .map_err(|source| SimError::Bind {
                addr: config.listen.clone(),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| SimError::Bind {
            addr: config.listen.clone(),
            source,
        })?;
        let (shared, shutdown) = assemble(&config, addr.to_string())?;
        let app = router(shared.clone());
        let token = shutdown.clone();
        let server = tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { token.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "simulator HTTP server stopped");
            }
        });
        let ticker = tokio::spawn(server::ticker(shared.clone()));
        tracing::info!(%addr, "cluster simulator listening");
        Ok(SimHandle {
            shared,
            addr,
            tasks: vec![server, ticker],
            shutdown,
        })
    }

    /// The API server's request handling, in-process: no listener and no ticker (the simulated clock moves
    /// only as requests move it). For driving the handlers without sockets, as the fuzzer does with arbitrary
    /// requests (`fuzz/fuzz_targets/sim_request.rs`); a test talks to [`Simulator::start`] over HTTP.
    pub fn in_process(config: &SimConfig) -> Result<axum::Router, SimError> {
        config.validate()?;
        let (shared, _shutdown) = assemble(config, "in-process".to_owned())?;
        Ok(router(shared))
    }
}

/// The simulator's state from its configuration; `address` is the one it reports for itself.
fn assemble(
    config: &SimConfig,
    address: String,
) -> Result<(Arc<server::Shared>, CancellationToken), SimError> {
    let start = if config.start_time.is_empty() {
        jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
            .unwrap_or_else(|_| jiff::Timestamp::now())
    } else {
        config.start_time.parse().map_err(|e| SimError::Config {
            key: "sim.start_time".into(),
            reason: format!("{e}"),
        })?
    };
    let clock = Arc::new(clock::SimClock::new(start, config.clock_speed));
    let faults = Arc::new(Faults::new(config.faults.clone()));
    let mut cluster = cluster::Cluster::new(
        config.watch_history,
        config.seed,
        start,
        config.model_config(),
    );
    cluster.core.volcano_admission = config.volcano_admission;
    cluster.core.store.set_window(config.watch_window);
    let shutdown = CancellationToken::new();
    cluster
        .model
        .interactive
        .set_shutdown(shutdown.child_token());
    let settings = server::ServerSettings {
        watch_timeout: config.watch_timeout,
        bookmark_interval: config.bookmark_interval,
        default_run: config.default_run,
        address,
    };
    let shared = Arc::new(server::Shared::new(
        cluster,
        clock,
        faults,
        shutdown.clone(),
        settings,
    ));
    Ok((shared, shutdown))
}

/// Every request goes to the one handler, which routes by path.
fn router(shared: Arc<server::Shared>) -> axum::Router {
    axum::Router::new()
        .route(
            "/api/v1/namespaces/{ns}/pods/{name}/exec",
            axum::routing::any(exec::handle),
        )
        .fallback(server::handle)
        .with_state(shared)
}

/// A running simulator: its address, a client, the clock, the fault plan, and shutdown.
pub struct SimHandle {
    shared: Arc<server::Shared>,
    addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
    shutdown: CancellationToken,
}

impl SimHandle {
    /// The socket address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The API requests it has served, by `<verb> <resource>` (`create jobs.batch.volcano.sh`, `watch
    /// pods`, `patch jobs.batch.volcano.sh/status`, ...), since it started.
    pub fn request_counts(&self) -> std::collections::BTreeMap<String, u64> {
        self.shared.request_counts()
    }

    /// The API requests of one kind (`get configmaps`, ...) it has served since it started.
    pub fn request_count(&self, kind: &str) -> u64 {
        self.shared.request_counts().get(kind).copied().unwrap_or(0)
    }

    /// How long its one lock (the cluster's state: every request, watch read and controller step runs
    /// under it) has been held since it started. Over a span of real time, its share says whether a
    /// load was bound by the simulator rather than by its clients or the cores.
    pub fn lock_held(&self) -> std::time::Duration {
        self.shared.lock_held()
    }

    /// `http://127.0.0.1:PORT`, for `kube::Config::new` or `kubectl --server`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A `kube::Config` for this simulator (plain HTTP, no credentials).
    pub fn kube_config(&self) -> kube::Config {
        let uri = self.url().parse().expect("http://ip:port is a valid URI");
        kube::Config::new(uri)
    }

    /// A `kube::Client` talking to this simulator.
    pub fn client(&self) -> Result<kube::Client, SimError> {
        kube::Client::try_from(self.kube_config()).map_err(|e| SimError::Client {
            url: self.url(),
            reason: e.to_string(),
        })
    }

    /// The current simulated instant.
    pub fn now(&self) -> jiff::Timestamp {
        self.shared.clock.now()
    }

    /// Moves simulated time forward by `by`; every pod start, exit, termination and TTL on the way
    /// happens at its own instant, and the model has settled when this returns.
    pub fn advance(&self, by: Duration) {
        self.shared.clock.advance(by);
        self.shared.with(|_| ());
        self.shared.clock_changed();
    }

    /// Changes the clock speed (0 stops it).
    pub fn set_clock_speed(&self, speed: f64) {
        self.shared.clock.set_speed(speed);
        self.shared.with(|_| ());
        self.shared.clock_changed();
    }

    /// The live fault plan: `set`, `add_rule`, `unavailable_for`, `clear`.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Drops the retained watch history, as an etcd compaction does: watches resuming from an older
    /// resourceVersion get 410 Gone.
    pub fn compact_history(&self) {
        self.shared.with(|c| c.core.store.compact());
    }

    /// What the simulator's object store holds (objects, those kept as text, the watch history) and
    /// about how many bytes: a walk over the whole store, for tests and the benchmark's soak lines.
    pub fn footprint(&self) -> store::Footprint {
        self.shared.read(|c| c.core.store.footprint())
    }

    /// [`SimHandle::footprint`] for a task that outlives a borrow of the handle (the soak lines).
    pub fn footprint_reader(&self) -> impl Fn() -> store::Footprint + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || shared.read(|c| c.core.store.footprint())
    }

    /// The name of every VolcanoJob created from now on, with the instant it was stored, until the
    /// receiver is dropped ([`store::Store::tap_created`]): how the benchmark sees jobs appear without
    /// a watch of its own on the cores it measures.
    pub fn created_jobs(&self) -> tokio::sync::mpsc::UnboundedReceiver<store::Created> {
        self.shared.with(|c| {
            let res = c.core.registry.get(c.core.ids.jobs).storage;
            c.core.store.tap_created(res)
        })
    }

    /// Drops every open watch connection at once; clients must resume (and may find their
    /// resourceVersion compacted away).
    pub fn cut_watches(&self) {
        self.shared.cut_watches();
    }

    /// Sets a queue's `status.state` (`Open`, `Closed`) as `vcctl queue operate` does; a closed queue
    /// still holding PodGroups shows `Closing` until they are gone.
    pub fn set_queue_state(&self, queue: &str, state: &str) -> Result<(), ApiError> {
        self.shared.with(|c| {
            let key = c.core.key_of(c.core.ids.queues, "", queue);
            if !c.core.store.contains(&key) {
                return Err(ApiError::not_found(
                    "queues",
                    "scheduling.volcano.sh",
                    queue,
                ));
            }
            c.core.update_internal(&key, |q| {
                q["status"]["state"] = Value::String(state.to_string())
            });
            Ok(())
        })
    }

    /// Reads an object directly (for assertions), e.g. `("batch.volcano.sh", "v1alpha1", "jobs", ns, name)`.
    pub fn object(
        &self,
        group: &str,
        version: &str,
        plural: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Value> {
        self.shared.with(|c| {
            let id = c.core.registry.lookup(group, version, plural)?;
            c.core.get(id, namespace, name).ok().map(|o| (*o).clone())
        })
    }

    /// Whether the cluster's NetworkPolicies, as a network plugin that enforces them would apply them,
    /// let `from` open a connection to `to` on `port`/`protocol` (see [`netpol`]). The simulator runs no
    /// pod network, so this is the question a test asks instead of connecting.
    pub fn connection(
        &self,
        from: &netpol::Peer,
        to: &netpol::Peer,
        port: u16,
        protocol: netpol::Protocol,
    ) -> Result<netpol::Verdict, ApiError> {
        self.shared
            .read(|c| netpol::connection(&c.core, from, to, port, protocol))
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.read(|c| c.core.store.resource_version())
    }

    /// Stops the server and its tasks and waits for them.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_too_long_to_hold_is_an_error_not_a_panic() {
        // Found by the fuzzer (config_toml): `default_run = 1e30` panicked in Duration::from_secs_f64.
        for text in [
            "default_run = 1e30",
            "default_run = \"1e30\"",
            "default_run = 1.8446744073709552e19",
        ] {
            let err = toml::from_str::<SimConfig>(text).unwrap_err().to_string();
            assert!(err.contains("duration"), "{text}: {err}");
        }
        assert!(parse_duration("1e30").unwrap_err().contains("too long"));
        assert_eq!(
            parse_duration("1e9"),
            Ok(Duration::from_secs(1_000_000_000))
        );
        assert!(parse_duration("-1").is_err());
    }

    #[test]
    fn config_parses_durations_and_nodes() {
        let c: SimConfig = toml::from_str(
            r#"
            default_run = "2m"
            pod_start_delay = 0.5
            clock_speed = 60
            [[nodes]]
            name = "big"
            cpu = "64"
            memory = "256Gi"
            gpus = 8
            "#,
        )
        .unwrap();
        assert_eq!(c.default_run, Duration::from_secs(120));
        assert_eq!(c.pod_start_delay, Duration::from_millis(500));
        assert_eq!(c.nodes.len(), 1);
        assert_eq!(c.nodes[0].max_pods, 110);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn config_errors_name_the_key() {
        let mut c = SimConfig::default();
        c.nodes[1].cpu = "lots".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.starts_with("configuration sim.nodes[1].cpu:"), "{e}");
        let e = toml::from_str::<SimConfig>("default_run = \"soon\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a duration"), "{e}");
        assert!(toml::from_str::<SimConfig>("typo = 1").is_err());
    }

    #[test]
    fn the_documented_section_holds_the_defaults() {
        let table: toml::Table =
            toml::from_str(include_str!("../../deploy/config.d/sim.toml")).unwrap();
        let documented: SimConfig = table["sim"].clone().try_into().unwrap();
        assert_eq!(documented, SimConfig::default());
    }

    #[test]
    fn default_nodes_match_the_issue() {
        let nodes = default_nodes();
        assert_eq!(nodes.len(), 5);
        assert_eq!(nodes.iter().filter(|n| n.gpus == 4).count(), 1);
        assert!(nodes.iter().all(|n| n.cpu == "16" && n.memory == "64Gi"));
    }
}
