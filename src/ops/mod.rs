//! Operating volcano-runner: metrics, health and readiness, logs, traces, and what the deploy manifests
//! are checked against.
//!
//! Nothing here decides what happens to a job. The runner and the monitor report what they do through a
//! [`Metrics`] handle, put their work in spans made by [`trace`], and register what readiness means
//! for them with [`Readiness`]; [`OpsServer`] serves it all over HTTP for Prometheus and the kubelet.
//!
//! Ops sits below the parts it observes: the broker and the cluster layer report into it, and it names
//! neither. What readiness and the metrics read of the broker connection is the [`BrokerConnection`]
//! trait (the broker implements it); the submission gate's state is reported by
//! `cluster::gate::follow_gate`; a publish failure arrives as its fixed reason word.
//!
//! # Layout
//! - [`metrics`]: [`Metrics`], the process's Prometheus registry behind a cheap-to-clone handle.
//! - [`health`]: [`Readiness`] and its checks (broker connected, cluster reachable, consumers running),
//!   and [`BrokerConnection`], what they read of the broker.
//! - [`server`]: [`OpsServer`], `/metrics`, `/healthz` and `/readyz`.
//! - [`telemetry`]: the tracing subscriber (JSON or human-readable, env filter), writing through the
//!   [`redact`] scrubber so that no secret reaches a log line.
//! - [`redact`]: [`Redactor`], which knows the secrets of this process and removes them from text.
//! - [`trace`]: W3C `traceparent` parsing, generation and continuation, and the spans built from it.
//! - [`kube`]: a tower layer on the Kubernetes client that times every API call by verb and resource,
//!   and can record the calls (what the RBAC test checks the Role and ClusterRole against).
//! - [`rbac`]: does a set of RBAC rules grant a recorded call? Used by the deploy tests.

pub mod health;
pub mod kube;
pub mod metrics;
pub mod process;
pub mod rbac;
pub mod redact;
pub mod server;
pub mod telemetry;
pub mod trace;

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

pub use health::{BrokerConnection, BrokerSlot, Condition, Readiness, ReadyFlag, RunningGuard};
pub use kube::{ApiCall, CallRecorder, KubeCallLayer};
pub use metrics::Metrics;
pub use redact::Redactor;
pub use server::OpsServer;
pub use telemetry::{LogFormat, LogSettings};
pub use trace::TraceContext;

/// The operational handles of one process: its metrics and its readiness checks. Cheap to clone. The
/// process makes one with [`Ops::new`], builds its kube client with [`Ops::kube_layer`], serves both on
/// [`OpsServer`], and hands clones to the parts that report (broker, runner, monitor).
#[derive(Debug, Clone)]
pub struct Ops {
    pub metrics: Metrics,
    pub readiness: Readiness,
}

impl Default for Ops {
    fn default() -> Self {
        Self::new()
    }
}

impl Ops {
    /// Fresh metrics and no readiness checks yet.
    pub fn new() -> Self {
        let metrics = Metrics::new();
        Self {
            readiness: Readiness::new(metrics.clone()),
            metrics,
        }
    }

    /// The layer that times every Kubernetes request of a client into these metrics (pass it to
    /// [`crate::cluster::client::connect_with`]).
    pub fn kube_layer(&self) -> KubeCallLayer {
        KubeCallLayer::new().with_metrics(self.metrics.clone())
    }

    /// Binds `[ops] listen` now, so a port in use fails the start; run the server with [`OpsServer::run`].
    pub async fn bind(&self, config: &OpsConfig) -> std::io::Result<OpsServer> {
        OpsServer::bind(
            config.listen_address(),
            self.metrics.clone(),
            self.readiness.clone(),
        )
        .await
    }
}

/// Serde helper for durations written as `"2s"`, `"500ms"` (or ISO 8601), as in `[cluster]`.
mod duration {
    pub use jiff::fmt::serde::unsigned_duration::friendly::compact::required;
}

/// The `[ops]` section of the configuration: where the metrics and health endpoint listens, and how logs
/// look.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OpsConfig {
    /// Address of the HTTP endpoint that serves `/metrics`, `/healthz` and `/readyz`. Unset: port 9090
    /// on every interface inside a Kubernetes pod (where Prometheus scrapes it and the kubelet probes
    /// it), on loopback elsewhere (see [`OpsConfig::listen_address`]). `127.0.0.1:0` runs several
    /// runners on one workstation.
    pub listen: Option<SocketAddr>,
    /// `human` (one readable line per event, for a terminal) or `json` (one JSON object per line with the
    /// span fields, for a log pipeline).
    pub log_format: LogFormat,
    /// Which events to log, in `tracing` env-filter syntax (`info`, `volcano_runner=debug,lapin=warn`).
    /// `VOLCANO_RUNNER_LOG`, when set, takes precedence, so a filter can be changed for one run without
    /// touching the file.
    pub log_filter: String,
    /// How long `/readyz` waits for the API server to answer before it calls the cluster unreachable. The
    /// kubelet's probe has its own timeout (1 s by default); staying under it makes a slow API server
    /// show up as "cluster: timed out" instead of a probe failure without a reason.
    #[serde(with = "duration::required")]
    pub cluster_check_timeout: Duration,
    /// How long one successful cluster check is reused. Probes from the kubelet and from people would
    /// otherwise each cost an API request; a failed check is never reused.
    #[serde(with = "duration::required")]
    pub cluster_check_ttl: Duration,
}

impl Default for OpsConfig {
    fn default() -> Self {
        Self {
            listen: None,
            log_format: LogFormat::Human,
            log_filter: "info".to_owned(),
            cluster_check_timeout: Duration::from_millis(800),
            cluster_check_ttl: Duration::from_secs(5),
        }
    }
}

/// The endpoint's port when `[ops] listen` is not set.
pub const DEFAULT_PORT: u16 = 9090;

/// Whether this process runs in a Kubernetes pod: the kubelet gives every container
/// `KUBERNETES_SERVICE_HOST` (the same variable the kube client's in-cluster configuration reads).
pub fn in_cluster() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|v| !v.is_empty())
}

/// `[ops] listen` when set; otherwise [`DEFAULT_PORT`] on every interface in a pod, on loopback
/// elsewhere.
pub fn listen_address(configured: Option<SocketAddr>, in_cluster: bool) -> SocketAddr {
    configured.unwrap_or_else(|| {
        let ip = if in_cluster {
            std::net::Ipv4Addr::UNSPECIFIED
        } else {
            std::net::Ipv4Addr::LOCALHOST
        };
        SocketAddr::from((ip, DEFAULT_PORT))
    })
}

impl OpsConfig {
    /// Where the endpoint listens. Without `[ops] listen`: in a pod on every interface, because
    /// Prometheus and the kubelet reach it from outside the pod; anywhere else on loopback, because a
    /// runner started by hand has no business on the network, and the port is often a local
    /// Prometheus's own (which then meets a runner on its port from other machines).
    pub fn listen_address(&self) -> SocketAddr {
        listen_address(self.listen, in_cluster())
    }

    /// Checks what serde cannot: the filter parses, the timeouts make sense. The error names the key.
    pub fn check(&self) -> Result<(), OpsConfigError> {
        let invalid = |key: &str, reason: String| OpsConfigError {
            key: format!("ops.{key}"),
            reason,
        };
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log_filter) {
            return Err(invalid("log_filter", format!("not a valid filter: {e}")));
        }
        if self.cluster_check_timeout.is_zero() {
            return Err(invalid(
                "cluster_check_timeout",
                "must be more than 0".into(),
            ));
        }
        Ok(())
    }

    /// The log settings this section asks for, with `VOLCANO_RUNNER_LOG` applied.
    pub fn log_settings(&self) -> LogSettings {
        LogSettings {
            format: self.log_format,
            filter: std::env::var(telemetry::LOG_ENV).unwrap_or_else(|_| self.log_filter.clone()),
        }
    }
}

/// A `[ops]` setting that cannot work: the key (e.g. `ops.listen`) and what is wrong. This
/// section's own error, so the section does not depend on the configuration module that composes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration {key}: {reason}")]
pub struct OpsConfigError {
    pub key: String,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_section_gives_the_defaults() {
        let parsed: OpsConfig = toml::from_str("").unwrap();
        assert_eq!(parsed, OpsConfig::default());
        parsed.check().unwrap();
    }

    #[test]
    fn the_documented_section_is_the_default() {
        #[derive(Deserialize)]
        struct File {
            ops: OpsConfig,
        }
        let text = include_str!("../../deploy/config.d/ops.toml");
        let file: File = toml::from_str(text).unwrap();
        assert_eq!(file.ops, OpsConfig::default());
    }

    #[test]
    fn unset_the_endpoint_is_on_every_interface_in_a_pod_and_on_loopback_elsewhere() {
        assert_eq!(listen_address(None, true).to_string(), "0.0.0.0:9090");
        assert_eq!(listen_address(None, false).to_string(), "127.0.0.1:9090");
        let set = "192.0.2.1:8080".parse().ok();
        assert_eq!(listen_address(set, true).to_string(), "192.0.2.1:8080");
        assert_eq!(listen_address(set, false).to_string(), "192.0.2.1:8080");
    }

    #[test]
    fn values_parse_and_bad_ones_name_the_key() {
        let parsed: OpsConfig = toml::from_str(
            r#"
            listen = "127.0.0.1:0"
            log_format = "json"
            log_filter = "volcano_runner=debug,lapin=warn"
            cluster_check_timeout = "300ms"
            "#,
        )
        .unwrap();
        assert_eq!(parsed.log_format, LogFormat::Json);
        assert_eq!(parsed.listen.map(|l| l.port()), Some(0));
        assert_eq!(parsed.cluster_check_timeout, Duration::from_millis(300));
        parsed.check().unwrap();

        assert!(toml::from_str::<OpsConfig>("log_format = \"xml\"").is_err());
        assert!(toml::from_str::<OpsConfig>("listen = \"nowhere\"").is_err());
        let bad = OpsConfig {
            log_filter: "info,[".into(),
            ..OpsConfig::default()
        };
        let err = bad.check().unwrap_err().to_string();
        assert!(err.contains("ops.log_filter"), "{err}");
        let bad = OpsConfig {
            cluster_check_timeout: Duration::ZERO,
            ..OpsConfig::default()
        };
        assert!(
            bad.check()
                .unwrap_err()
                .to_string()
                .contains("ops.cluster_check_timeout")
        );
    }
}
