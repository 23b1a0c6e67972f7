//! Kubernetes access: the client, error classification and retries, the applier that creates a job's
//! desired objects in order (with rollback), tombstones for cancels that overtake their submit, the
//! submission gate (pause switch and capacity view), and the shard leases that split the monitoring duty.
//!
//! This module owns every call to the Kubernetes API that is not specific to one plugin. It knows
//! nothing about messages or plugins: the runner and the monitor call it with objects and ids.
//!
//! - [`client`]: builds a [`kube::Client`] for the configured [`ClusterTarget`].
//! - [`error`]: [`ClusterError`], which tells a transient cluster problem (retry, requeue) from a
//!   rejection (a FAILURE that carries the cluster's message).
//! - [`retry`]: [`RetryPolicy`], bounded retries with backoff and `Retry-After`.
//! - [`apply`]: [`Applier`], ordered creation with ownerReferences, idempotent redelivery and rollback (W14).
//! - [`namespaces`]: [`NamespaceCache`], namespaces created on demand and remembered.
//! - [`records`]: [`ConfigMapRecords`], the ConfigMaps every durable record kind below is kept in.
//! - [`end`]: ending a job with Volcano's `TerminateJob` command, and deleting its companions at the end.
//! - [`tombstone`]: [`Tombstones`], durable records of cancels that arrived before their submit.
//! - [`pause`], [`capacity`], [`gate`]: the pause switch, the count of active jobs, and the combined
//!   "may take submissions" watch the submit consumer follows.
//! - [`lease`]: [`ShardLeases`], the Lease-based split of the monitoring duty.
//! - [`jobs`]: [`jobs::JobStore`], finding, patching and ending VolcanoJobs by job id: used by the
//!   runner's handlers and by the session issuer, which is why it lives here, below both.
//! - [`logs`]: reading and following a job's logs rank by rank, the engine of `volcano-runner logs` and
//!   of proxy-sync's logs bridge (below both, so the command line and the proxy need not import each
//!   other).
//! - [`bookings`]: [`Bookings`], booked starts: one record of every booking, changed by conditional
//!   writes, and the node taints that keep the booked capacity free.
//! - [`whole_nodes`]: the whole nodes each owner holds (kept by the job store's watch), against the
//!   `[pipeline.whole_nodes]` limits.
//! - [`volcano`]: Rust types that mirror the Volcano CRDs (owned by the pipeline).

pub mod apply;
pub mod bookings;
pub mod capacity;
pub mod client;
pub mod end;
pub mod error;
pub mod gate;
pub mod jobs;
pub mod kept_map;
pub mod labels;
pub mod lease;
pub mod logs;
pub mod maintenance;
pub mod namespaces;
pub mod object_key;
pub mod pause;
pub mod pending_extension;
pub mod records;
pub mod retry;
pub mod tombstone;
pub mod view;
pub mod whole_nodes;

use std::time::Duration;

use serde::Deserialize;

pub use apply::{Applier, ApplyError, ApplyOutcome, PlanError, Role, Rollback, Step};
pub use bookings::{Bookings, BookingsConfig};
pub use client::{ClusterTarget, connect, connect_url};
pub use error::{ClusterError, ErrorClass, KubeResultExt};
pub use gate::{CapacityPermit, GateDriver, GateState, SubmitGate};
pub use lease::{HeldShards, Holding, LeaseHandle, ShardHolders, ShardLeases, shard_of};
pub use maintenance::{MaintenanceWindows, Window, Windows};
pub use namespaces::NamespaceCache;
pub use object_key::ObjectKey;
pub use pause::{PauseState, PauseSwitch};
pub use pending_extension::{PendingExtension, PendingExtensions};
pub use records::ConfigMapRecords;
pub use retry::RetryPolicy;
pub use tombstone::{Tombstone, Tombstones};

/// Serde helper for durations written as `"30s"`, `"500ms"`, `"24h"` (or ISO 8601).
mod duration {
    pub use jiff::fmt::serde::unsigned_duration::friendly::compact::required;
}

/// The `[cluster]` section of the configuration: how to reach Kubernetes and how hard to try.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Which API server to talk to: `auto` (in-cluster service account, else `KUBECONFIG` /
    /// `~/.kube/config`), `sim` (start the embedded simulator, for a first run without a cluster), or an
    /// explicit `http://` / `https://` URL (a simulator started elsewhere, or `kubectl proxy`).
    pub target: ClusterTarget,
    /// The runner's own namespace. Tombstones, the pause switch and the shard leases live here, so one
    /// RBAC Role in one namespace covers all of the runner's bookkeeping.
    pub namespace: String,
    /// How long to wait for a TCP (and TLS) connection to the API server. A dead endpoint should fail
    /// fast so that the retry budget is spent on attempts, not on one hung connect.
    #[serde(with = "duration::required")]
    pub connect_timeout: Duration,
    /// How long one API request may take before it counts as a transient failure and is retried. Watches
    /// are not bound by it (they have their own idle timeout).
    #[serde(with = "duration::required")]
    pub request_timeout: Duration,
    /// Retries of transient errors (5xx, 429, timeouts, refused connections).
    pub retry: RetryConfig,
    /// How long a tombstone (a cancel that arrived before its submit) is kept. It must outlive the longest
    /// time a submission can wait in the queue (including a pause), or a late submit would run.
    #[serde(with = "duration::required")]
    pub tombstone_ttl: Duration,
    /// How often expired tombstones are deleted. Expired tombstones are already ignored by the check, so
    /// this only bounds how many stale ConfigMaps accumulate.
    #[serde(with = "duration::required")]
    pub tombstone_sweep_interval: Duration,
    /// How often each runner looks at the extensions that arrived before their job (a submission held
    /// by a pause or a backlog) and applies those whose job now exists. They are kept as long as
    /// tombstones (`tombstone_ttl`), then answered `unknown_job`.
    #[serde(with = "duration::required")]
    pub pending_extension_interval: Duration,
    /// How long an ended job's VolcanoJob is kept, without its companions, as the durable record
    /// that its submission was carried out. A redelivery of the submission finds it (the create answers
    /// AlreadyExists) and is only acknowledged, so a job never runs twice; a deleted object and one never
    /// created would look the same. Like `tombstone_ttl`, it must outlive the longest time a submission
    /// can stay in the queue unacknowledged (pauses and backlogs included): only a message still in the
    /// queue can be redelivered. The runner sets it on every job it creates as `ttlSecondsAfterFinished`:
    /// Volcano's garbage collector deletes the job that long after it finished (see docs/monitor.md).
    /// Zero releases the record as soon as the end is published.
    #[serde(with = "duration::required")]
    pub ended_job_retention: Duration,
    /// Name of the ConfigMap (in [`namespace`](Self::namespace)) that pauses submissions on every runner.
    /// `volcano-runner admin pause|resume|status` writes and reads it.
    pub pause_configmap: String,
    /// Cluster-wide cap on active VolcanoJobs managed by volcano-runner. While the cap is reached, runners
    /// leave submissions in the queue. Unset means no cap.
    pub max_active_jobs: Option<u32>,
    /// Label selector that picks out the VolcanoJobs volcano-runner manages, for the capacity count. It
    /// must match the labels the pipeline puts on every VolcanoJob.
    pub managed_selector: String,
    /// How often the pause and capacity watchers start over with a full list, on top of the re-lists the
    /// watcher does by itself after an error. A watch can go quiet without an error (W1); a re-list
    /// bounds how long a missed event can keep the gate wrong.
    #[serde(with = "duration::required")]
    pub relist_interval: Duration,
    /// The Lease-based split of the monitoring duty.
    pub lease: LeaseConfig,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            target: ClusterTarget::Auto,
            namespace: "volcano-runner".to_owned(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            retry: RetryConfig::default(),
            tombstone_ttl: Duration::from_secs(24 * 3600),
            tombstone_sweep_interval: Duration::from_secs(600),
            pending_extension_interval: Duration::from_secs(10),
            ended_job_retention: Duration::from_secs(24 * 3600),
            pause_configmap: "volcano-runner-pause".to_owned(),
            max_active_jobs: None,
            managed_selector: format!("{}={}", labels::MANAGED_BY, labels::MANAGER),
            relist_interval: Duration::from_secs(300),
            lease: LeaseConfig::default(),
        }
    }
}

/// Bounds on retrying a transient cluster error. After the budget the caller gets a retryable error and
/// requeues the message; a transient error never becomes a FAILURE.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Total time spent on one operation (attempts and waits) before giving up for now. Short enough that a
    /// message is requeued (and can go to another runner) during a long outage, long enough to ride out
    /// an API server restart.
    #[serde(with = "duration::required")]
    pub max_elapsed: Duration,
    /// First wait after a failure. Exponential growth with jitter starts here.
    #[serde(with = "duration::required")]
    pub min_delay: Duration,
    /// Longest wait between two attempts (unless the server asks for longer with `Retry-After`).
    #[serde(with = "duration::required")]
    pub max_delay: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_elapsed: Duration::from_secs(30),
            min_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
        }
    }
}

/// The shard leases of the monitoring duty (see `docs/cluster.md`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseConfig {
    /// Number of shards the jobs are split into by a hash of the job id. 1 is plain leader election; more
    /// shards spread the monitoring over up to that many runners. Every runner must use the same value.
    pub shards: u32,
    /// How long a lease stays valid after its last renewal. A dead runner's shards are taken over after
    /// about this long (plus one renew interval).
    #[serde(with = "duration::required")]
    pub duration: Duration,
    /// How often a runner renews its leases and looks for free ones.
    #[serde(with = "duration::required")]
    pub renew_interval: Duration,
    /// A holder gives a shard up this long before its lease could expire when renewals fail, so its duty
    /// has stopped before anyone else can take the shard. Covers clock-rate drift and scheduling delays.
    #[serde(with = "duration::required")]
    pub safety_margin: Duration,
    /// Name of this runner in the leases. Unset: the host name (the pod name) plus a random suffix, so a
    /// restarted process never mistakes its predecessor's leases for its own.
    pub identity: Option<String>,
    /// Prefix of the Lease names (`<prefix>-shard-<n>`, `<prefix>-member-<identity>`). Two runner
    /// deployments in one namespace need different prefixes.
    pub name_prefix: String,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            shards: 8,
            duration: Duration::from_secs(10),
            renew_interval: Duration::from_secs(2),
            safety_margin: Duration::from_secs(2),
            identity: None,
            name_prefix: "volcano-runner".to_owned(),
        }
    }
}

impl ClusterConfig {
    /// Checks the values that serde cannot: names Kubernetes will accept and durations that make sense
    /// together. The error names the key.
    pub fn validate(&self) -> Result<(), ClusterConfigError> {
        let invalid = |key: &str, reason: String| ClusterConfigError {
            key: format!("cluster.{key}"),
            reason,
        };
        for (key, value) in [
            ("namespace", &self.namespace),
            ("pause_configmap", &self.pause_configmap),
            ("lease.name_prefix", &self.lease.name_prefix),
        ] {
            if let Err(why) = labels::check_dns_label(value) {
                return Err(invalid(key, why));
            }
        }
        if let Some(identity) = &self.lease.identity
            && let Err(why) = labels::check_dns_label(identity)
        {
            return Err(invalid("lease.identity", why));
        }
        if self.request_timeout.is_zero() {
            return Err(invalid("request_timeout", "must be more than 0".into()));
        }
        if self.retry.min_delay.is_zero() || self.retry.min_delay > self.retry.max_delay {
            return Err(invalid(
                "retry.min_delay",
                "must be more than 0 and at most retry.max_delay".into(),
            ));
        }
        if self.max_active_jobs == Some(0) {
            return Err(invalid(
                "max_active_jobs",
                "0 would never admit a job; leave it unset for no cap".into(),
            ));
        }
        if self.lease.shards == 0 {
            return Err(invalid("lease.shards", "must be at least 1".into()));
        }
        let lease = &self.lease;
        if lease.renew_interval.is_zero()
            || lease.renew_interval + lease.safety_margin >= lease.duration
        {
            return Err(invalid(
                "lease.renew_interval",
                format!(
                    "renew_interval + safety_margin must be less than duration ({:?} + {:?} >= {:?}): \
                     a holder would lose its shards between two renewals",
                    lease.renew_interval, lease.safety_margin, lease.duration
                ),
            ));
        }
        if let Err(why) = labels::parse_equality_selector(&self.managed_selector) {
            return Err(invalid("managed_selector", why));
        }
        Ok(())
    }
}

/// A `[cluster]` setting that cannot work: the key (e.g. `cluster.namespace`) and what is wrong. This
/// section's own error, so the section does not depend on the configuration module that composes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration {key}: {reason}")]
pub struct ClusterConfigError {
    pub key: String,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_section_gives_the_documented_defaults() {
        let parsed: ClusterConfig = toml::from_str("").unwrap();
        assert_eq!(parsed, ClusterConfig::default());
        assert_eq!(parsed.lease.duration, Duration::from_secs(10));
        parsed.validate().unwrap();
    }

    #[test]
    fn the_documented_section_is_the_default() {
        #[derive(Deserialize)]
        struct File {
            cluster: ClusterConfig,
        }
        let text = include_str!("../../deploy/config.d/cluster.toml");
        let file: File = toml::from_str(text).unwrap();
        assert_eq!(file.cluster, ClusterConfig::default());
    }

    #[test]
    fn durations_are_written_in_words() {
        let parsed: ClusterConfig = toml::from_str(
            r#"
            target = "http://127.0.0.1:8080"
            request_timeout = "1500ms"
            tombstone_ttl = "72h"
            max_active_jobs = 100
            [retry]
            max_elapsed = "1m"
            [lease]
            shards = 1
            duration = "4s"
            renew_interval = "1s"
            safety_margin = "1s"
            "#,
        )
        .unwrap();
        assert_eq!(parsed.request_timeout, Duration::from_millis(1500));
        assert_eq!(parsed.tombstone_ttl, Duration::from_secs(72 * 3600));
        assert_eq!(parsed.retry.max_elapsed, Duration::from_secs(60));
        assert_eq!(parsed.max_active_jobs, Some(100));
        assert_eq!(parsed.lease.shards, 1);
        assert!(matches!(parsed.target, ClusterTarget::Url(ref u) if u.port_u16() == Some(8080)));
        parsed.validate().unwrap();
    }

    #[test]
    fn unknown_keys_and_bad_targets_are_rejected() {
        assert!(toml::from_str::<ClusterConfig>("namespaces = \"x\"").is_err());
        let err = toml::from_str::<ClusterConfig>("target = \"k8s.example.org\"").unwrap_err();
        assert!(err.to_string().contains("auto"), "{err}");
    }

    #[test]
    fn validation_names_the_key() {
        let mut c = ClusterConfig::default();
        c.lease.renew_interval = Duration::from_secs(9);
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("cluster.lease.renew_interval"), "{err}");

        let c = ClusterConfig {
            namespace: "Not_A_Name".into(),
            ..ClusterConfig::default()
        };
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("cluster.namespace")
        );

        let c = ClusterConfig {
            max_active_jobs: Some(0),
            ..ClusterConfig::default()
        };
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("max_active_jobs")
        );

        let c = ClusterConfig {
            managed_selector: "a in (b)".into(),
            ..ClusterConfig::default()
        };
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("managed_selector")
        );
    }
}
