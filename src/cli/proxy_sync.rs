//! `volcano-runner proxy-sync [--cluster sim|auto|URL] [--envoy-dir DIR]`: the proxy-sync role, run
//! beside Envoy in each proxy pod. Keeps the routes of every running interactive job (from the proxy
//! events and the cluster) and writes them as Envoy's dynamic configuration; docs/proxy.md says how.
//! `/readyz` is ready once the table has been built from the cluster and written, so a new instance
//! takes traffic only when it routes every running job. The session bridges (VNC, terminal, logs) are
//! served on `[proxy_sync] bridge_listen`. Runs until SIGTERM or SIGINT.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tokio_util::sync::CancellationToken;
use tracing::info;

use super::CliError;
use super::run::{ServedOps, cancel_on_signal, cluster_error, load_config, operator_client};
use crate::broker::Broker;
use crate::cluster::{ClusterTarget, client};
use crate::config::Config;
use crate::ops::{Condition, Ops};
use crate::proxy::bridge::{BridgeContext, Bridges};
use crate::proxy::{HostNaming, ProxySync};
use crate::sessions::check::{CheckSettings, SessionCheck};
use crate::sessions::origin::OriginPolicy;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The cluster: `sim` (the simulator of a runner started with `run --cluster sim` on this machine),
    /// `auto` (in-cluster, else KUBECONFIG) or an http(s):// URL. Default: `[cluster] target`.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Where to write the Envoy files (default: `[proxy_sync] envoy_dir`; empty: none).
    #[arg(long)]
    pub envoy_dir: Option<PathBuf>,
    /// The Envoy node id (default: `[runner] id`, else the host name plus a random suffix).
    #[arg(long)]
    pub id: Option<String>,
}

pub async fn run(args: Args, config: Option<&Path>) -> Result<ExitCode, CliError> {
    let mut config = load_config(config, args.cluster.as_deref())?;
    if let Some(dir) = args.envoy_dir {
        config.proxy_sync.envoy_dir = dir;
    }
    if let Some(id) = &args.id {
        config.runner.id = Some(id.clone());
    }
    config.check()?;
    let node_id = config.runner.runner_id();
    let shutdown = CancellationToken::new();
    let _stop_on_return = shutdown.clone().drop_guard();
    let signals = tokio::spawn(cancel_on_signal(shutdown.clone()));

    let ops = Ops::new();
    let endpoint = ServedOps::start(&ops, &config.ops).await?;
    let broker_ready = ops.readiness.expect_broker();
    let table_ready = ops
        .readiness
        .condition("route table", "not built from the cluster yet");
    let sessions_ready = (!config.proxy_sync.authz_listen.is_empty()).then(|| {
        ops.readiness
            .condition("sessions", "the session records are not listed yet")
    });

    let client = match config.cluster.target {
        ClusterTarget::Sim => operator_client(&config).await?,
        _ => client::connect_with(&config.cluster, &ops.kube_layer())
            .await
            .map_err(cluster_error)?,
    };
    ops.readiness.add_cluster(
        client.clone(),
        config.ops.cluster_check_timeout,
        config.ops.cluster_check_ttl,
    );
    let broker = Broker::connect(config.broker.clone(), shutdown.clone())
        .await
        .map_err(|e| CliError::Other(format!("RabbitMQ: {e}")))?;
    broker_ready.fill(broker.clone());
    ops.readiness.seal();
    info!(
        envoy_dir = %config.proxy_sync.envoy_dir.display(),
        prefix = %config.pipeline.proxy.prefix,
        domain = %config.pipeline.proxy.domain,
        "Proxy sync starting."
    );
    let check_client = client.clone();
    let sync = ProxySync::new(
        broker.clone(),
        client,
        config.pipeline.clone(),
        config.cluster.managed_selector.clone(),
        config.proxy_sync.clone(),
        node_id,
        Some(table_ready),
    );
    let check = match sessions_ready {
        Some(ready) => {
            Some(start_check(&config, check_client, &sync, &ops, ready, &shutdown).await?)
        }
        None => None,
    };
    let bridges = if config.proxy_sync.bridge_listen.is_empty() {
        None
    } else {
        let bridges = bind_bridges(&config, &sync, check.as_ref()).await?;
        let serving = tokio::spawn(bridges.run(shutdown.clone()));
        Some(serving)
    };
    let result = sync.run(shutdown.clone()).await;
    shutdown.cancel();
    if let Some(bridges) = bridges {
        let _ = bridges.await;
    }
    if let Some(check) = check {
        check.join().await;
    }
    broker.close().await;
    let _ = signals.await;
    endpoint.stop().await;
    result.map_err(|e| CliError::Other(e.to_string()))?;
    Ok(ExitCode::SUCCESS)
}

/// The session check (`[proxy_sync] authz_listen`): which browser session may reach which job.
async fn start_check(
    config: &Config,
    client: kube::Client,
    sync: &ProxySync,
    ops: &Ops,
    ready: Condition,
    shutdown: &CancellationToken,
) -> Result<SessionCheck, CliError> {
    SessionCheck::start(
        client,
        sync.routes(),
        CheckSettings {
            namespace: config.cluster.namespace.clone(),
            naming: naming(config),
            secure: config.sessions.scheme == "https",
            allowed_origins: config.sessions.allowed_origins.clone(),
            clock: std::sync::Arc::new(jiff::Timestamp::now),
            metrics: Some(ops.metrics.clone()),
        },
        &config.proxy_sync,
        Some(ready),
        shutdown.clone(),
    )
    .await
    .map_err(|e| {
        CliError::Other(format!(
            "[proxy_sync] authz_listen {}: {e}",
            config.proxy_sync.authz_listen
        ))
    })
}

/// The session bridges (VNC, terminal, logs) on `[proxy_sync] bridge_listen`. With a session check in
/// this process, every bridge ends with the session that opened it.
async fn bind_bridges(
    config: &Config,
    sync: &ProxySync,
    check: Option<&SessionCheck>,
) -> Result<Bridges, CliError> {
    let bridges = Bridges::bind(
        &config.proxy_sync.bridge_listen,
        BridgeContext {
            routes: sync.routes(),
            naming: naming(config),
            client: sync.client.clone(),
            connect_timeout: config.proxy_sync.connect_timeout,
            lifecycle_key: config.pipeline.keys().lifecycle_state.clone(),
            origins: OriginPolicy::new(
                config.sessions.scheme == "https",
                &config.sessions.allowed_origins,
            ),
            sessions: check.map(|c| c.authz.clone()),
        },
    )
    .await
    .map_err(|e| CliError::Other(e.to_string()))?;
    info!(listen = %bridges.local_addr().map_err(|e| CliError::Other(e.to_string()))?, "Serving the session bridges (VNC, terminal, logs).");
    Ok(bridges)
}

/// The job host names the proxy serves (`[pipeline.proxy]`).
fn naming(config: &Config) -> HostNaming {
    HostNaming {
        prefix: config.pipeline.proxy.prefix.clone(),
        domain: config.pipeline.proxy.domain.clone(),
    }
}
