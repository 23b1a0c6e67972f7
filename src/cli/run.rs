//! `volcano-runner run [--cluster sim|auto|URL]`: the main job. Consumes submissions, cancels and
//! extensions and applies them to the cluster; with the monitoring duty (the default) also watches the
//! jobs of the shards this runner holds. Runs until SIGTERM or SIGINT, then finishes in-flight work
//! within `runner.shutdown_grace`.
//!
//! The cluster is `[cluster] target` unless `--cluster` says otherwise: `auto` (in-cluster service
//! account, else `KUBECONFIG`), an `http(s)://` URL, or `sim`, which starts the cluster simulator inside
//! this process (for a first run without a cluster; `--sim-listen` makes it reachable for `kubectl` and
//! `volcano-runner admin`).

use std::path::Path;
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

pub async fn run(args: Args, config: Option<&Path>) -> Result<ExitCode, CliError> {
    let mut config = load_config(config, args.cluster.as_deref())?;
    if let Some(id) = &args.id {
        config.runner.id = Some(id.clone());
    }
    config.runner.check()?;
    config.ops.check()?;
    let runner_id = config.runner.runner_id();
    let shutdown = CancellationToken::new();
    // Whatever way this function returns, everything it started stops.
    let _stop_on_return = shutdown.clone().drop_guard();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    // Metrics, /healthz and /readyz from the start: the kubelet sees a live, not yet ready, process
    // while the broker and the cluster are being reached.
    let ops = Ops::new();
    let endpoint = ops
        .bind(&config.ops)
        .await
        .map_err(|e| CliError::Other(e.to_string()))?;
    info!(listen = %endpoint.local_addr().map_err(|e| CliError::Other(e.to_string()))?, "Serving /metrics, /healthz and /readyz.");
    let endpoint = tokio::spawn(endpoint.run(shutdown.clone().cancelled_owned()));

    let sim = match config.cluster.target {
        ClusterTarget::Sim => {
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
            Some((Arc::new(handle), speed))
        }
        _ => None,
    };
    let client = match &sim {
        Some((handle, _)) => {
            let url = handle
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
    let version = client::probe(&client).await.map_err(cluster_error)?;
    info!(cluster = %config.cluster.target, %version, "Connected to the cluster.");
    // The runner's own namespaces are made sure of by the service (created where it may), for any
    // cluster: the embedded simulator, a standalone one, or a real one.

    let monitor_clock = sim.as_ref().map(|(handle, speed)| {
        let clock: Arc<dyn Clock> = Arc::new(SimClock {
            handle: handle.clone(),
            speed: *speed,
        });
        (clock, Duration::from_millis(200))
    });
    let service = Service {
        config,
        client,
        runner_id,
        monitor: !args.no_monitor,
        monitor_clock,
    };
    let result = service.run_with_ops(shutdown.clone(), ops).await;
    shutdown.cancel();
    if let Ok(Err(e)) = endpoint.await {
        tracing::warn!(error = %e, "The metrics endpoint failed.");
    }
    if let Some((handle, _)) = sim
        && let Ok(handle) = Arc::try_unwrap(handle)
    {
        handle.shutdown().await;
    }
    result.map_err(|e| CliError::Other(e.to_string()))?;
    Ok(ExitCode::SUCCESS)
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

/// A client for `--cluster` (or `[cluster] target`) for the operator commands; `sim` makes no sense
/// there (it would be a new, empty simulator): point them at the running one's URL.
pub async fn operator_client(config: &Config) -> Result<kube::Client, CliError> {
    if config.cluster.target == ClusterTarget::Sim {
        return Err(CliError::Other(
            "--cluster sim would start a new, empty simulator; give the URL of the running one \
             (volcano-runner run --cluster sim --sim-listen 127.0.0.1:6443, then --cluster \
             http://127.0.0.1:6443)"
                .into(),
        ));
    }
    client::connect(&config.cluster)
        .await
        .map_err(cluster_error)
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

/// The embedded simulator's clock, as the monitor's clock: the monitor's timers then fire in simulated
/// time, at the simulator's speed.
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
        Some(Duration::from_secs_f64(left / self.speed))
    }
}
