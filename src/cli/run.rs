//! `volcano-runner run [--cluster sim|auto|URL]`: the main job. Consumes submissions, cancels and
//! extensions and applies them to the cluster; with the monitoring duty (the default) also watches the
//! jobs of the shards this runner holds. Runs until SIGTERM or SIGINT, then finishes in-flight work
//! within `runner.shutdown_grace`.
//!
//! The cluster is `[cluster] target` unless `--cluster` says otherwise: `auto` (in-cluster service
//! account, else `KUBECONFIG`), an `http(s)://` URL, or `sim`, which starts the cluster simulator inside
//! this process (for a first run without a cluster; `--sim-listen` makes it reachable for `kubectl` and
//! `volcano-runner admin`).
//!
//! # Who owns what runs, and the stop order
//! Every long-running loop of the process has one owner and is joined before the process exits:
//! - [`Service::run_with_ops`] owns the runner's loops: the two consume loops and their handlers, the
//!   gate and pause followers, the tombstone sweeper, the shard leases, the monitor, the namespace retry,
//!   and the broker connection's supervisor;
//! - this function owns the process's own: the signal listener, the `/metrics` `/healthz` `/readyz`
//!   endpoint, the `draining` readiness flag, the remote simulator clock follower, and the embedded
//!   simulator.
//!
//! On SIGTERM or SIGINT the stop goes in this order: (1) `/readyz` says `draining`; (2) the service stops
//! consuming, finishes the messages in hand within `runner.shutdown_grace` (returning the rest), stops the
//! monitor and the leases (releasing them), and closes the broker connection (publisher channels first);
//! (3) the process's followers end and are joined; (4) the endpoint stops, last, so that it answers
//! through the whole drain; (5) the embedded simulator stops.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::info;

use super::CliError;
use crate::cluster::{ClusterTarget, client};
use crate::config::Config;
use crate::monitor::Clock;
use crate::ops::Ops;
use crate::runner::service::Service;
use crate::sim::{SimHandle, Simulator};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The cluster: `sim` (the embedded simulator), `auto` (in-cluster, else KUBECONFIG) or an http(s)://
    /// URL. Default: `[cluster] target`.
    #[arg(long)]
    pub cluster: Option<String>,
    /// With `--cluster sim`: simulated seconds per real second (default: `[sim] clock_speed`).
    #[arg(long)]
    pub sim_clock_speed: Option<f64>,
    /// With `--cluster sim`: the address the simulator serves the Kubernetes API on, for kubectl and
    /// `volcano-runner admin --cluster http://ADDR` (default: a free port on 127.0.0.1).
    #[arg(long)]
    pub sim_listen: Option<String>,
    /// This runner's name (default: `[runner] id`, else the host name plus a random suffix).
    #[arg(long)]
    pub id: Option<String>,
    /// Do not take part in the monitoring duty (no shard leases, no lifecycle events after QUEUED).
    #[arg(long)]
    pub no_monitor: bool,
}

/// A process's ops endpoint (`/metrics`, `/healthz`, `/readyz`), served from [`ServedOps::start`] until
/// [`ServedOps::stop`], or until it is dropped when the process returns early.
pub(super) struct ServedOps {
    stop: tokio_util::sync::DropGuard,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl ServedOps {
    /// Binds `[ops] listen` (a port taken fails the start, naming it) and serves `ops` from now on.
    pub(super) async fn start(ops: &Ops, config: &crate::ops::OpsConfig) -> Result<Self, CliError> {
        let server = ops.bind(config).await.map_err(|e| {
            CliError::Other(format!("[ops] listen {}: {e}", config.listen_address()))
        })?;
        let listen = server
            .local_addr()
            .map_err(|e| CliError::Other(e.to_string()))?;
        info!(listen = %listen, "Serving /metrics, /healthz and /readyz.");
        let stop = CancellationToken::new();
        let task = tokio::spawn(server.run(stop.clone().cancelled_owned()));
        Ok(Self {
            stop: stop.drop_guard(),
            task,
        })
    }

    /// Stops serving, after the requests in progress, and says if the endpoint had failed.
    pub(super) async fn stop(self) {
        self.stop.disarm().cancel();
        if let Ok(Err(e)) = self.task.await {
            tracing::warn!(error = %e, "The metrics endpoint failed.");
        }
    }
}

pub async fn run(args: Args, config: Option<&Path>) -> Result<ExitCode, CliError> {
    let mut config = load_config(config, args.cluster.as_deref())?;
    if let Some(id) = &args.id {
        config.runner.id = Some(id.clone());
    }
    // `--id` changed the configuration after it was loaded: check it again.
    config.check()?;
    let runner_id = config.runner.runner_id();
    let shutdown = CancellationToken::new();
    // Whatever way this function returns, everything it started stops.
    let _stop_on_return = shutdown.clone().drop_guard();
    // The process's own loops (see the module documentation); each ends on `shutdown`.
    let mut loops = tokio::task::JoinSet::new();
    loops.spawn(cancel_on_signal(shutdown.clone()));
    // Metrics, /healthz and /readyz from the start: the kubelet sees a live, not yet ready, process
    // while the broker and the cluster are being reached.
    let ops = Ops::new();
    // The endpoint outlives the drain: during it /readyz answers 503 `draining`, rather than refusing
    // connections, until the process is done.
    let endpoint = ServedOps::start(&ops, &config.ops).await?;
    let draining = ops.readiness.condition("not draining", "");
    draining.set(Ok(()));
    {
        let shutdown = shutdown.clone();
        loops.spawn(async move {
            shutdown.cancelled().await;
            draining.set(Err(
                "draining: finishing the messages in hand, then exiting".into(),
            ));
        });
    }

    let sim = start_embedded_sim(&config, &args).await?;
    let client = match &sim {
        Some(embedded) => {
            let url = embedded
                .url()
                .parse()
                .map_err(|e| CliError::Other(format!("the embedded simulator's URL: {e}")))?;
            client::connect_url_with(url, &config.cluster, &ops.kube_layer())
                .map_err(cluster_error)?
        }
        None => client::connect_with(&config.cluster, &ops.kube_layer())
            .await
            .map_err(cluster_error)?,
    };
    ops.readiness.add_cluster(
        client.clone(),
        config.ops.cluster_check_timeout,
        config.ops.cluster_check_ttl,
    );
    let version = client::probe(&client)
        .await
        .map_err(|e| unreachable(&config, &e.to_string()))?;
    info!(cluster = %config.cluster.target, %version, "Connected to the cluster.");
    // The runner's own namespaces are made sure of by the service (created where it may), for any
    // cluster: the embedded simulator, a standalone one, or a real one.

    let monitor_clock = monitor_clock(
        &config,
        &client,
        sim.as_ref(),
        &version,
        &mut loops,
        &shutdown,
    )
    .await?;
    let service = Service {
        config,
        client,
        runner_id,
        monitor: !args.no_monitor,
        monitor_clock,
    };
    let result = service.run_with_ops(shutdown.clone(), ops).await;
    shutdown.cancel();
    while loops.join_next().await.is_some() {}
    endpoint.stop().await;
    if let Some(Embedded { clock, address }) = sim {
        drop(address);
        if let Ok(handle) = Arc::try_unwrap(clock.handle) {
            handle.shutdown().await;
        }
    }
    result.map_err(|e| CliError::Other(e.to_string()))?;
    Ok(ExitCode::SUCCESS)
}

/// The embedded simulator of `--cluster sim`, its clock speed and its published address; `None` for
/// any other cluster.
async fn start_embedded_sim(config: &Config, args: &Args) -> Result<Option<Embedded>, CliError> {
    if !matches!(config.cluster.target, ClusterTarget::Sim) {
        return Ok(None);
    }
    let mut sim_config = config.sim.clone();
    sim_config.listen = args
        .sim_listen
        .clone()
        .unwrap_or_else(|| "127.0.0.1:0".into());
    if let Some(speed) = args.sim_clock_speed {
        sim_config.clock_speed = speed;
    }
    let speed = sim_config.clock_speed;
    let handle = Simulator::start(sim_config)
        .await
        .map_err(|e| CliError::Other(format!("the embedded simulator: {e}")))?;
    println!(
        "volcano-runner: embedded cluster simulator at {} (clock speed {speed})",
        handle.url()
    );
    let address = EmbeddedSimAddress::publish(&handle.url());
    Ok(Some(Embedded {
        clock: SimClock {
            handle: Arc::new(handle),
            speed,
        },
        address,
    }))
}

/// How often the monitor looks at a simulator's clock, which does not run by itself (see
/// `Service::monitor_clock`).
const SIM_CLOCK_LOOK: Duration = Duration::from_millis(200);

/// The embedded simulator with its clock speed (the monitor's clock), and its address published for
/// the other commands while it runs.
struct Embedded {
    clock: SimClock,
    address: Option<EmbeddedSimAddress>,
}

impl Embedded {
    /// Where its Kubernetes API listens.
    fn url(&self) -> String {
        self.clock.handle.url()
    }
}

/// The clock the monitor follows: the embedded simulator's, or that of a simulator reached by URL (it
/// runs a clock of its own, often faster than real time: with the wall clock the monitor would charge
/// wall-clock time against simulated jobs and publish ticks for the future); `None` for a real cluster.
async fn monitor_clock(
    config: &Config,
    client: &kube::Client,
    sim: Option<&Embedded>,
    version: &str,
    loops: &mut tokio::task::JoinSet<()>,
    shutdown: &CancellationToken,
) -> Result<Option<(Arc<dyn Clock>, Duration)>, CliError> {
    if let Some(embedded) = sim {
        let clock: Arc<dyn Clock> = Arc::new(embedded.clock.clone());
        return Ok(Some((clock, SIM_CLOCK_LOOK)));
    }
    if !version.contains(SIM_VERSION_MARK) {
        return Ok(None);
    }
    let clock = RemoteSimClock::read(client).await.map_err(|e| {
        CliError::Other(format!(
            "the cluster at {} is a volcano-runner simulator, but its clock could not be read \
             (GET /sim/v1/clock: {e}); the monitor must use the simulator's clock, so the runner \
             does not start. Use a simulator of this version.",
            config.cluster.target
        ))
    })?;
    info!(
        speed = clock.speed(),
        "The cluster is a simulator: the monitor follows its clock."
    );
    let clock = Arc::new(clock);
    loops.spawn(clock.clone().follow(client.clone(), shutdown.clone()));
    let clock: Arc<dyn Clock> = clock;
    Ok(Some((clock, SIM_CLOCK_LOOK)))
}

/// The configuration (file, then `VOLCANO_RUNNER_*` variables), with `--cluster` on top.
pub fn load_config(path: Option<&Path>, cluster: Option<&str>) -> Result<Config, CliError> {
    let mut config = Config::load(path)?;
    if let Some(target) = cluster {
        config.cluster.target = ClusterTarget::try_from(target.to_owned())
            .map_err(|e| CliError::Other(format!("--cluster: {e}")))?;
    }
    Ok(config)
}

/// Where `run --cluster sim` leaves its embedded simulator's URL, so that the operator commands with
/// `[cluster] target = "sim"` (the default) reach the simulator of the runner started on this machine:
/// `volcano-runner-embedded-sim/` in the temporary directory (`TMPDIR`), one file per runner process,
/// `<pid>.url`, so that two runners on one machine never overwrite each other's.
pub fn embedded_sim_directory() -> PathBuf {
    std::env::temp_dir().join("volcano-runner-embedded-sim")
}

/// The embedded simulator's URL, written to `<pid>.url` in [`embedded_sim_directory`] while the runner
/// runs and removed when it stops. A runner killed with SIGKILL leaves its file; readers skip (and remove)
/// files whose process is gone.
struct EmbeddedSimAddress {
    path: PathBuf,
}

impl EmbeddedSimAddress {
    fn publish(url: &str) -> Option<Self> {
        let dir = embedded_sim_directory();
        let path = dir.join(format!("{}.url", std::process::id()));
        let written = std::fs::create_dir_all(&dir).and_then(|()| {
            // Written whole, then renamed into place: a reader never sees half an address.
            let partial = dir.join(format!(".{}.url.partial", std::process::id()));
            std::fs::write(&partial, format!("{url}\n"))?;
            std::fs::rename(&partial, &path)
        });
        match written {
            Ok(()) => Some(Self { path }),
            Err(e) => {
                tracing::warn!(
                    path = %path.display(),
                    error = %e,
                    "Cannot write the embedded simulator's address: `volcano-runner admin` needs \
                     --cluster with its URL."
                );
                None
            }
        }
    }
}

impl Drop for EmbeddedSimAddress {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One runner with an embedded simulator on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
struct EmbeddedSim {
    pid: u32,
    url: String,
}

/// The embedded simulators of the runners alive on this machine, by process id; files of processes that
/// are gone are removed on the way.
fn embedded_sims(dir: &Path) -> Vec<EmbeddedSim> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut sims = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(pid) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".url"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if !process_alive(pid) {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        if let Ok(text) = std::fs::read_to_string(&path) {
            sims.push(EmbeddedSim {
                pid,
                url: text.trim().to_owned(),
            });
        }
    }
    sims.sort_by_key(|s| s.pid);
    sims
}

/// Whether a process with this id exists (signal 0 checks without sending anything).
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 sends nothing; it only reports whether the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Which embedded simulator the operator commands reach: the only one alive, or an error that lists them
/// all (or says there is none) and how to choose.
fn choose_embedded_sim(dir: &Path, sims: &[EmbeddedSim]) -> Result<http::Uri, CliError> {
    match sims {
        [] => Err(CliError::Other(format!(
            "[cluster] target is \"sim\", but no runner with an embedded simulator is running on this \
             machine (none left its address in {}). Start one with `volcano-runner run --cluster sim`, \
             or point --cluster at a cluster (auto, or an http(s):// URL).",
            dir.display()
        ))),
        [one] => one.url.parse().map_err(|e| {
            CliError::Other(format!(
                "{}: not a URL ({e}); remove it and restart `volcano-runner run --cluster sim`",
                dir.join(format!("{}.url", one.pid)).display()
            ))
        }),
        several => {
            let list: Vec<String> = several
                .iter()
                .map(|s| format!("--cluster {} (the runner of process {})", s.url, s.pid))
                .collect();
            Err(CliError::Other(format!(
                "[cluster] target is \"sim\", but {} runners with an embedded simulator run on this \
                 machine; say which: {}",
                several.len(),
                list.join(", ")
            )))
        }
    }
}

/// The URL of the embedded simulator a runner on this machine serves (`run --cluster sim`), for the
/// operator commands when the target is `sim`.
fn embedded_sim_url() -> Result<http::Uri, CliError> {
    let dir = embedded_sim_directory();
    choose_embedded_sim(&dir, &embedded_sims(&dir))
}

/// A client for `--cluster` (or `[cluster] target`) for the operator commands. With `sim`, the
/// simulator inside the runner started on this machine with `run --cluster sim`.
pub async fn operator_client(config: &Config) -> Result<kube::Client, CliError> {
    let mut config = config.clone();
    if config.cluster.target == ClusterTarget::Sim {
        config.cluster.target = ClusterTarget::Url(embedded_sim_url()?);
    }
    let config = &config;
    let client = client::connect(&config.cluster)
        .await
        .map_err(cluster_error)?;
    // One quick look, no retries: an operator command against a wrong address should say so at once,
    // not after the retry budget.
    let budget = config.cluster.connect_timeout + config.cluster.request_timeout;
    match tokio::time::timeout(budget, client::probe(&client)).await {
        Ok(Ok(_)) => Ok(client),
        Ok(Err(e)) => Err(unreachable(config, &e.to_string())),
        Err(_) => Err(unreachable(config, &format!("no answer within {budget:?}"))),
    }
}

/// The cluster cannot be reached: where, why, and what to do.
fn unreachable(config: &Config, why: &str) -> CliError {
    CliError::Other(format!(
        "cannot reach the cluster at {}: {why}. Is the API server (or `volcano-runner sim`, or the \
         runner started with `run --cluster sim`) running there? Point --cluster or [cluster] target \
         at it.",
        config.cluster.target
    ))
}

pub fn cluster_error(e: crate::cluster::ClusterError) -> CliError {
    CliError::Other(format!("cluster: {e}"))
}

/// Cancels `token` on SIGTERM or SIGINT (Ctrl-C). A signal that cannot be listened for (a process
/// started with SIGINT ignored, in some shells' background jobs) is not taken as received.
pub async fn cancel_on_signal(token: CancellationToken) {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
        () = token.cancelled() => return,
    }
    info!("Signal received; shutting down.");
    token.cancel();
}

/// What a volcano-runner simulator's `/version` says it is.
const SIM_VERSION_MARK: &str = "volcano-runner-sim";

/// A simulator's clock read over HTTP (`GET /sim/v1/clock`), for a runner pointed at a simulator by URL:
/// the simulated instant and speed at the last reading, extrapolated with the local monotonic clock, and
/// read again every [`RemoteSimClock::RESYNC`] (a clock a test moves by hand has speed 0 and only moves
/// between readings).
#[derive(Debug)]
struct RemoteSimClock {
    reading: std::sync::Mutex<(jiff::Timestamp, std::time::Instant, f64)>,
}

impl RemoteSimClock {
    const RESYNC: Duration = Duration::from_millis(200);

    async fn read(client: &kube::Client) -> Result<Self, String> {
        let reading = Self::fetch(client).await?;
        Ok(Self {
            reading: std::sync::Mutex::new(reading),
        })
    }

    async fn fetch(
        client: &kube::Client,
    ) -> Result<(jiff::Timestamp, std::time::Instant, f64), String> {
        let request = http::Request::get("/sim/v1/clock")
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let asked = std::time::Instant::now();
        let text = client
            .request_text(request)
            .await
            .map_err(|e| e.to_string())?;
        let body: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let now = body["now"]
            .as_str()
            .and_then(|s| s.parse::<jiff::Timestamp>().ok())
            .ok_or_else(|| format!("no time in {text}"))?;
        let speed = body["speed"]
            .as_f64()
            .ok_or_else(|| format!("no speed in {text}"))?;
        Ok((now, asked, speed))
    }

    fn speed(&self) -> f64 {
        self.reading.lock().unwrap_or_else(|e| e.into_inner()).2
    }

    /// Reads the simulator's clock again every [`Self::RESYNC`] until `shutdown`.
    async fn follow(self: Arc<Self>, client: kube::Client, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(Self::RESYNC) => {}
            }
            match Self::fetch(&client).await {
                Ok(reading) => *self.reading.lock().unwrap_or_else(|e| e.into_inner()) = reading,
                Err(e) => {
                    tracing::debug!(error = %e, "The simulator's clock could not be read; extrapolating.")
                }
            }
        }
    }
}

impl Clock for RemoteSimClock {
    fn now(&self) -> jiff::Timestamp {
        let (at, read, speed) = *self.reading.lock().unwrap_or_else(|e| e.into_inner());
        let passed = read.elapsed().as_secs_f64() * speed;
        jiff::SignedDuration::try_from_secs_f64(passed)
            .ok()
            .and_then(|passed| at.checked_add(passed).ok())
            .unwrap_or(at)
    }

    fn real_until(&self, at: jiff::Timestamp) -> Option<Duration> {
        let speed = self.speed();
        if speed <= 0.0 {
            return None;
        }
        let left = at.duration_since(self.now()).as_secs_f64().max(0.0);
        // A tiny speed makes the quotient overflow a Duration: that is "never" in practice.
        Some(Duration::try_from_secs_f64(left / speed).unwrap_or(Duration::MAX))
    }
}

/// The embedded simulator's clock, as the monitor's clock: the monitor's timers then fire in simulated
/// time, at the simulator's speed.
#[derive(Clone)]
struct SimClock {
    handle: Arc<SimHandle>,
    speed: f64,
}

impl std::fmt::Debug for SimClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimClock")
            .field("url", &self.handle.url())
            .field("speed", &self.speed)
            .finish()
    }
}

impl Clock for SimClock {
    fn now(&self) -> jiff::Timestamp {
        self.handle.now()
    }

    fn real_until(&self, at: jiff::Timestamp) -> Option<Duration> {
        if self.speed <= 0.0 {
            return None;
        }
        let left = at.duration_since(self.handle.now()).as_secs_f64().max(0.0);
        Some(Duration::try_from_secs_f64(left / self.speed).unwrap_or(Duration::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("vr-embedded-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn each_runner_has_its_address_and_the_dead_ones_are_skipped() {
        let dir = scratch("alive");
        let me = std::process::id();
        std::fs::write(dir.join(format!("{me}.url")), "http://127.0.0.1:7001\n").unwrap();
        // A pid no process has (beyond the kernel's pid_max): a runner killed with SIGKILL.
        let dead = dir.join("4194305.url");
        std::fs::write(&dead, "http://127.0.0.1:7002\n").unwrap();
        std::fs::write(dir.join("notes.txt"), "not an address").unwrap();
        let sims = embedded_sims(&dir);
        assert_eq!(
            sims,
            [EmbeddedSim {
                pid: me,
                url: "http://127.0.0.1:7001".into()
            }]
        );
        assert!(!dead.exists(), "a dead runner's file is removed");
        assert_eq!(
            choose_embedded_sim(&dir, &sims).unwrap().to_string(),
            "http://127.0.0.1:7001/"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn several_runners_are_listed_and_none_is_explained() {
        let dir = scratch("several");
        let sims = [
            EmbeddedSim {
                pid: 10,
                url: "http://127.0.0.1:7001".into(),
            },
            EmbeddedSim {
                pid: 11,
                url: "http://127.0.0.1:7002".into(),
            },
        ];
        let err = choose_embedded_sim(&dir, &sims).unwrap_err().to_string();
        assert!(err.contains("2 runners"), "{err}");
        assert!(
            err.contains("--cluster http://127.0.0.1:7001 (the runner of process 10)"),
            "{err}"
        );
        assert!(err.contains("--cluster http://127.0.0.1:7002"), "{err}");
        let none = choose_embedded_sim(&dir, &[]).unwrap_err().to_string();
        assert!(none.contains("run --cluster sim"), "{none}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_runner_publishes_its_own_address_and_removes_it_when_it_stops() {
        let address = EmbeddedSimAddress::publish("http://127.0.0.1:7003").expect("written");
        let path = address.path.clone();
        assert_eq!(
            path,
            embedded_sim_directory().join(format!("{}.url", std::process::id()))
        );
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "http://127.0.0.1:7003\n"
        );
        drop(address);
        assert!(!path.exists());
    }
}
