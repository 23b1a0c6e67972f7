//! `volcano-runner sim --listen 127.0.0.1:6443 [flags]`: serves the cluster simulator until Ctrl-C or
//! SIGTERM. Settings come from the `[sim]` section of `--config`, then from the flags.

use std::path::Path;
use std::process::ExitCode;

use crate::sim::{FaultRule, NodeSpec, SimConfig, Simulator, parse_duration};

use super::CliError;

#[derive(Debug, Default, clap::Args)]
pub struct Args {
    /// Address to serve the Kubernetes API on (`127.0.0.1:0` picks a free port).
    #[arg(long)]
    pub listen: Option<String>,
    /// Simulated seconds per real second; 0 stops the clock.
    #[arg(long)]
    pub clock_speed: Option<f64>,
    /// Simulated start instant (RFC 3339), instead of now.
    #[arg(long)]
    pub start_time: Option<String>,
    /// How long containers with unrecognised commands run, e.g. `60s`, `5m`.
    #[arg(long)]
    pub default_run: Option<String>,
    /// Images whose name contains this never pull (ErrImagePull).
    #[arg(long)]
    pub image_pull_failure_marker: Option<String>,
    /// Replaces the default nodes; repeat for several: `NAME:CPU:MEMORY[:GPUS]`, e.g. `big:64:256Gi:8`.
    #[arg(long = "node", value_name = "NAME:CPU:MEMORY[:GPUS]")]
    pub nodes: Vec<String>,
    /// Changes kept for watches, all kinds together (a watch that missed a change of its kind that is
    /// no longer kept gets 410 Gone).
    #[arg(long)]
    pub watch_history: Option<usize>,
    /// Do not record Kubernetes Events.
    #[arg(long)]
    pub no_events: bool,
    /// Run without Volcano's admission webhooks.
    #[arg(long)]
    pub no_admission: bool,
    /// Fault rule: the resource it applies to (`pods`, `jobs.batch.volcano.sh`); default all.
    #[arg(long)]
    pub fault_resource: Option<String>,
    /// Fault rule: the verb it applies to (get, list, watch, create, update, patch, delete); default all.
    #[arg(long)]
    pub fault_verb: Option<String>,
    /// Fault rule: latency added to each matching request, in milliseconds.
    #[arg(long)]
    pub fault_latency_ms: Option<u64>,
    /// Fault rule: fraction of matching requests answered 500.
    #[arg(long)]
    pub fault_500: Option<f64>,
    /// Fault rule: fraction of matching requests answered 503.
    #[arg(long)]
    pub fault_503: Option<f64>,
    /// Fault rule: fraction of matching requests answered 429.
    #[arg(long)]
    pub fault_429: Option<f64>,
    /// Fault rule: fraction of matching requests answered 422 Invalid (a refusal no retry changes).
    #[arg(long)]
    pub fault_422: Option<f64>,
    /// Fault rule: fraction of matching requests answered 403 Forbidden (as RBAC would).
    #[arg(long)]
    pub fault_403: Option<f64>,
    /// Fault rule: Retry-After seconds on 429 and 503.
    #[arg(long)]
    pub fault_retry_after: Option<u64>,
    /// Fault rule: cut watches after this many events.
    #[arg(long)]
    pub fault_watch_cut_events: Option<u64>,
    /// Fault rule: cut watches after this many seconds.
    #[arg(long)]
    pub fault_watch_cut_secs: Option<f64>,
    /// Fault rule: fraction (0..1) of watch events silently lost while the watch goes on.
    #[arg(long)]
    pub fault_watch_lose: Option<f64>,
    /// Total unavailability (every request 503) starting this many seconds after start ...
    #[arg(long)]
    pub fault_unavailable_from: Option<f64>,
    /// ... and lasting this many seconds.
    #[arg(long)]
    pub fault_unavailable_for: Option<f64>,
}

fn bad(flag: &str, why: impl std::fmt::Display) -> CliError {
    CliError::Other(format!("--{flag}: {why}"))
}

/// Reads `NAME:CPU:MEMORY[:GPUS]`.
pub fn parse_node(s: &str) -> Result<NodeSpec, String> {
    let parts: Vec<&str> = s.split(':').collect();
    if !(3..=4).contains(&parts.len()) {
        return Err(format!(
            "{s:?} is not NAME:CPU:MEMORY[:GPUS], e.g. big:64:256Gi:8"
        ));
    }
    let gpus = match parts.get(3) {
        Some(g) => g
            .parse()
            .map_err(|_| format!("{s:?}: GPUS must be a whole number, not {g:?}"))?,
        None => 0,
    };
    Ok(NodeSpec {
        name: parts[0].to_string(),
        cpu: parts[1].to_string(),
        memory: parts[2].to_string(),
        gpus,
        max_pods: 110,
        labels: Default::default(),
        taints: Vec::new(),
    })
}

/// The `[sim]` section, loaded as every command loads the configuration (the file, then the
/// `VOLCANO_RUNNER_*` variables, every section checked).
fn load(config: Option<&Path>) -> Result<SimConfig, CliError> {
    Ok(crate::config::Config::load(config)?.sim)
}

/// Applies the flags over the configuration.
pub fn apply(args: &Args, mut cfg: SimConfig) -> Result<SimConfig, CliError> {
    if let Some(l) = &args.listen {
        cfg.listen = l.clone();
    }
    if let Some(s) = args.clock_speed {
        cfg.clock_speed = s;
    }
    if let Some(t) = &args.start_time {
        cfg.start_time = t.clone();
    }
    if let Some(d) = &args.default_run {
        cfg.default_run = parse_duration(d).map_err(|e| bad("default-run", e))?;
    }
    if let Some(m) = &args.image_pull_failure_marker {
        cfg.image_pull_failure_marker = m.clone();
    }
    if !args.nodes.is_empty() {
        cfg.nodes = args
            .nodes
            .iter()
            .map(|n| parse_node(n))
            .collect::<Result<_, _>>()
            .map_err(|e| bad("node", e))?;
    }
    if let Some(h) = args.watch_history {
        cfg.watch_history = h;
    }
    if args.no_events {
        cfg.events = false;
    }
    if args.no_admission {
        cfg.volcano_admission = false;
    }
    let rule = FaultRule {
        resource: args.fault_resource.clone().unwrap_or_default(),
        verb: args.fault_verb.clone().unwrap_or_default(),
        latency_ms: args.fault_latency_ms.unwrap_or(0),
        error_500: args.fault_500.unwrap_or(0.0),
        error_503: args.fault_503.unwrap_or(0.0),
        error_429: args.fault_429.unwrap_or(0.0),
        error_422: args.fault_422.unwrap_or(0.0),
        error_403: args.fault_403.unwrap_or(0.0),
        retry_after_secs: args.fault_retry_after.unwrap_or(1),
        watch_cut_after_events: args.fault_watch_cut_events,
        watch_cut_after_secs: args.fault_watch_cut_secs,
        watch_lose_events: args.fault_watch_lose.unwrap_or(0.0),
    };
    for (flag, v) in [
        ("fault-500", rule.error_500),
        ("fault-503", rule.error_503),
        ("fault-429", rule.error_429),
        ("fault-422", rule.error_422),
        ("fault-403", rule.error_403),
        ("fault-watch-lose", rule.watch_lose_events),
    ] {
        if !(0.0..=1.0).contains(&v) {
            return Err(bad(flag, format!("{v} is not a fraction between 0 and 1")));
        }
    }
    let neutral = FaultRule {
        retry_after_secs: 1,
        ..FaultRule::default()
    };
    let mut neutral_scoped = neutral.clone();
    neutral_scoped.resource = rule.resource.clone();
    neutral_scoped.verb = rule.verb.clone();
    if rule != neutral_scoped {
        cfg.faults.rules.push(rule);
    }
    if let Some(from) = args.fault_unavailable_from {
        cfg.faults.unavailable_from_secs = Some(from);
        cfg.faults.unavailable_secs = Some(args.fault_unavailable_for.unwrap_or(10.0));
    } else if let Some(len) = args.fault_unavailable_for {
        cfg.faults.unavailable_from_secs = Some(0.0);
        cfg.faults.unavailable_secs = Some(len);
    }
    Ok(cfg)
}

async fn terminated() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

pub async fn run(args: Args, config: Option<&Path>) -> Result<ExitCode, CliError> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let cfg = apply(&args, load(config)?)?;
    let speed = cfg.clock_speed;
    let handle = Simulator::start(cfg)
        .await
        .map_err(|e| CliError::Other(e.to_string()))?;
    let url = handle.url();
    // Written without println!, which would panic if whoever started us closed our stdout.
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "volcano-runner sim: Kubernetes API with Volcano at {url} (clock speed {speed})"
    );
    let _ = writeln!(out, "try: kubectl --server {url} get nodes,queues");
    let _ = out.flush();
    drop(out);
    terminated().await;
    handle.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_from_flags() {
        let n = parse_node("big:64:256Gi:8").unwrap();
        assert_eq!(
            (n.name.as_str(), n.cpu.as_str(), n.memory.as_str(), n.gpus),
            ("big", "64", "256Gi", 8)
        );
        assert!(parse_node("big:64").is_err());
        assert!(parse_node("big:64:1Gi:x").unwrap_err().contains("GPUS"));
    }

    #[test]
    fn flags_override_config_and_build_a_fault_rule() {
        let args = Args {
            listen: Some("127.0.0.1:0".into()),
            clock_speed: Some(0.0),
            default_run: Some("5m".into()),
            fault_503: Some(0.5),
            fault_verb: Some("create".into()),
            ..Args::default()
        };
        let cfg = apply(&args, SimConfig::default()).unwrap();
        assert_eq!(cfg.listen, "127.0.0.1:0");
        assert_eq!(cfg.default_run, std::time::Duration::from_secs(300));
        assert_eq!(cfg.faults.rules.len(), 1);
        assert_eq!(cfg.faults.rules[0].verb, "create");
        let none = apply(&Args::default(), SimConfig::default()).unwrap();
        assert!(none.faults.rules.is_empty());
        let bad = Args {
            fault_429: Some(2.0),
            ..Args::default()
        };
        assert!(
            apply(&bad, SimConfig::default())
                .unwrap_err()
                .to_string()
                .contains("--fault-429")
        );
    }
}
