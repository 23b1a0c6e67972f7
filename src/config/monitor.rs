//! The `[monitor]` section: how often the monitor reconciles, its grace periods and timeouts, how many
//! jobs it handles at once and how it encodes what it publishes. Defined with the configuration (the
//! monitor consumes the whole of it), re-exported by [`crate::monitor`].

use std::time::Duration;

use serde::Deserialize;

mod duration {
    pub use jiff::fmt::serde::unsigned_duration::friendly::compact::{optional, required};
}

/// How outbound messages are encoded.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// proto3 JSON: readable in the management UI and by `volcano-runner events`.
    #[default]
    Json,
    /// Binary protobuf: smaller, for consumers that prefer it.
    Protobuf,
}

/// The `[monitor]` section: how jobs are watched once they exist.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MonitorConfig {
    /// How often the watches are checked against the API (a metadata list of every kind) and every job
    /// is looked at. A watch can go quiet or lose a change without an error (W1); this bounds how long a
    /// missed change goes unnoticed. Deadlines (expiry, ticks) do not wait for it: they have timers of
    /// their own.
    #[serde(with = "duration::required")]
    pub reconcile_interval: Duration,
    /// How long a job whose image cannot be pulled keeps trying before it ends as FAILURE. Registries
    /// have short outages; a wrong image name never heals.
    #[serde(with = "duration::required")]
    pub image_pull_grace: Duration,
    /// A job that waits in the queue longer than this ends as FAILURE with the pending reason (a job too
    /// large for the cluster would otherwise wait forever, W9). Unset: no limit. It counts the time a
    /// job is held back by a maintenance window too.
    #[serde(with = "duration::optional")]
    pub queue_timeout: Option<Duration>,
    /// A job that has not started, one of whose peers (ConnectToJob) does not exist this long after the
    /// job's creation, ends as FAILURE `peer_missing`: a peer may be submitted after the job that names
    /// it, but a job would otherwise wait for a peer that never comes for good (and hold its place).
    #[serde(with = "duration::required")]
    pub peer_missing_after: Duration,
    /// How long a job waits in the queue before the monitor tells its user why (a status event with the
    /// pending reason, and one more each time the reason changes). Most jobs start within seconds: their
    /// passing reasons (scheduling, pulling the image) would be events nobody reads and an API write
    /// each. 0 tells every reason at once.
    #[serde(with = "duration::required")]
    pub pending_status_after: Duration,
    /// A waiting job is told a new start-time estimate only when it moves later, or earlier by more
    /// than a tolerance that grows with the distance to the start (a minute for ten minutes away, an
    /// hour for a day away) and is never less than this (or when its pending reason changes): estimates
    /// drift by seconds as jobs end, and each event is a write and a message the user's client must
    /// handle.
    #[serde(with = "duration::required")]
    pub estimate_tolerance: Duration,
    /// How long after its resources are free a waiting job is taken to start: the time the job
    /// controller and the scheduler take to place its pods (a session every scheduler period, a second
    /// by default, after the pods are created). A start-time estimate is the instant the replay frees
    /// its resources plus this, and a job started there runs its allocation from then; a bound of "now"
    /// would be broken by that latency (docs/estimates.md).
    #[serde(with = "duration::required")]
    pub start_margin: Duration,
    /// How long the monitor waits for the pods of a deleted job to stop before it closes the job with
    /// the deletion as its end. Long enough for a graceful shutdown, so the log tails and the end time
    /// are the real ones.
    #[serde(with = "duration::required")]
    pub cleanup_grace: Duration,
    /// Bytes of each rank's log kept in the terminal event, so a user sees why a job failed.
    pub log_tail_bytes: usize,
    /// Bytes of log tails per job in all (split between ranks): the tails are persisted on the job with
    /// its outcome, and Kubernetes limits a job's annotations to 256 KiB.
    pub log_tail_total_bytes: usize,
    /// Whether SUCCESS events carry log tails too. Off by default: a tail is there so a user sees why a
    /// job failed, and each costs a log read that the API server proxies to the node's kubelet, the one
    /// per-job read a successful job would otherwise make at its end. FAILURE, EXPIRED and CANCELLED
    /// always carry them (with `log_tail_bytes` above 0).
    pub log_tails_on_success: bool,
    /// Jobs handled at once (each may wait for publisher confirms and API calls).
    pub max_concurrent: usize,
    /// First wait before a job whose handling failed (broker or API trouble) is tried again; it doubles
    /// on every failure up to `retry_max_delay`.
    #[serde(with = "duration::required")]
    pub retry_min_delay: Duration,
    /// Longest wait between two tries of a failing job.
    #[serde(with = "duration::required")]
    pub retry_max_delay: Duration,
    /// How outbound messages are encoded.
    pub encoding: Encoding,
    /// A running job that a maintenance window will cut (`volcano-runner admin maintenance`) is told
    /// this long before the window's start, so its user can save their work or extend nothing in vain;
    /// 0: no warning, only the end at the window's start.
    #[serde(with = "duration::required")]
    pub maintenance_warn_before: Duration,
    /// Whether the monitor reserves nodes for a whole-node or large gang (several ranks, or ranks of
    /// more than half of a node they fit on) past its `sla-waiting-time`, by tainting the nodes the
    /// start-time replay gives it (`<prefix>reserved=<jobId>:NoSchedule`; the pods of a job with a
    /// waiting time or whole nodes tolerate their own job id), so that a stream of smaller jobs cannot
    /// pass it for ever and its estimate is a bound (docs/estimates.md); without it such a gang is told
    /// expectations. Uses `patch` on nodes, cluster-wide, which the base ClusterRole grants for the
    /// maintenance windows' taints. On by default: it acts only for jobs with a waiting time
    /// (`[pipeline.scheduling] sla_waiting_time`, unset by default, and interactive jobs'
    /// `interactive_sla_waiting_time`, 0 s by default), and a waiting time asks for bounds and no
    /// starvation; off trades them for the throughput of the nodes that drain.
    pub reserve_nodes: bool,
    /// Whether the Volcano scheduler runs its `proportion` plugin. It serves the queue with the lowest
    /// share first, whatever a job's `sla-waiting-time`, so while jobs of more than one queue wait or
    /// run no estimate is a bound: they are told as expectations (docs/estimates.md, "Between
    /// queues"). Off by default, as the scheduler configuration deploy/scheduling ships
    /// (`volcano-scheduler.yaml`: `sla` in, `proportion` out) has it; set it true for a scheduler
    /// that keeps Volcano's default configuration, which has `proportion`.
    pub proportion: bool,
    /// How long a job's change waits before the job is decided: the API tells one change as a burst of
    /// events (status, PodGroup, pod created, bound, started), and one decision on the last of them
    /// replaces one per event. 0 decides on every event.
    #[serde(with = "duration::required")]
    pub coalesce: Duration,
    /// While the runner in the same process has submissions in hand, how long a job's change may wait
    /// before the job is decided instead: the submissions get the CPU first (the monitor tolerates lag,
    /// docs/monitor.md). 0 never defers; a runner with cores of its own to spare may set it so.
    #[serde(with = "duration::required")]
    pub defer_under_load: Duration,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        Self {
            reconcile_interval: Duration::from_secs(60),
            image_pull_grace: Duration::from_secs(300),
            queue_timeout: None,
            peer_missing_after: Duration::from_secs(3600),
            pending_status_after: Duration::from_secs(5),
            estimate_tolerance: Duration::from_secs(60),
            start_margin: Duration::from_secs(10),
            cleanup_grace: Duration::from_secs(60),
            log_tail_bytes: 4096,
            log_tail_total_bytes: 65536,
            log_tails_on_success: false,
            max_concurrent: 32,
            retry_min_delay: Duration::from_secs(1),
            retry_max_delay: Duration::from_secs(60),
            encoding: Encoding::Json,
            maintenance_warn_before: Duration::from_secs(3600),
            reserve_nodes: true,
            proportion: false,
            coalesce: Duration::from_millis(50),
            defer_under_load: Duration::from_secs(1),
        }
    }
}

impl MonitorConfig {
    /// Checks what serde cannot; the error names the key.
    pub fn validate(&self) -> Result<(), MonitorConfigError> {
        let invalid = |key: &str, reason: &str| MonitorConfigError {
            key: format!("monitor.{key}"),
            reason: reason.to_owned(),
        };
        if self.reconcile_interval < Duration::from_secs(1) {
            return Err(invalid("reconcile_interval", "must be at least 1s"));
        }
        if self.max_concurrent == 0 {
            return Err(invalid("max_concurrent", "must be at least 1"));
        }
        if self.retry_min_delay.is_zero() || self.retry_min_delay > self.retry_max_delay {
            return Err(invalid(
                "retry_min_delay",
                "must be more than 0 and at most retry_max_delay",
            ));
        }
        if self.queue_timeout.is_some_and(|t| t.is_zero()) {
            return Err(invalid(
                "queue_timeout",
                "0 would fail every job at once; leave it unset for no limit",
            ));
        }
        if self.peer_missing_after.is_zero() {
            return Err(invalid(
                "peer_missing_after",
                "0 would fail every job whose peer is submitted after it; give the peer time to come",
            ));
        }
        if self.log_tail_total_bytes > 128 * 1024 {
            return Err(invalid(
                "log_tail_total_bytes",
                "must be at most 128 KiB: the tails live in the job's annotations (256 KiB in all)",
            ));
        }
        Ok(())
    }
}

/// A `[monitor]` setting that cannot work: the key (e.g. `monitor.reconcile_interval`) and what is wrong. This
/// section's own error, so the section does not depend on the configuration module that composes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration {key}: {reason}")]
pub struct MonitorConfigError {
    pub key: String,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct File {
        monitor: MonitorConfig,
    }

    #[test]
    fn empty_section_gives_the_defaults_and_they_are_valid() {
        let parsed: MonitorConfig = toml::from_str("").unwrap();
        assert_eq!(parsed, MonitorConfig::default());
        assert_eq!(parsed.reconcile_interval, Duration::from_secs(60));
        parsed.validate().unwrap();
    }

    #[test]
    fn the_documented_section_is_the_default() {
        let text = include_str!("../../deploy/config.d/monitor.toml");
        let file: File = toml::from_str(text).unwrap();
        assert_eq!(file.monitor, MonitorConfig::default());
    }

    #[test]
    fn durations_in_words_and_bad_values_name_the_key() {
        let parsed: MonitorConfig = toml::from_str(
            "reconcile_interval = \"30s\"\nqueue_timeout = \"2h\"\nencoding = \"protobuf\"",
        )
        .unwrap();
        assert_eq!(parsed.reconcile_interval, Duration::from_secs(30));
        assert_eq!(parsed.queue_timeout, Some(Duration::from_secs(7200)));
        assert_eq!(parsed.encoding, Encoding::Protobuf);
        assert!(toml::from_str::<MonitorConfig>("reconcile = \"1s\"").is_err());
        let bad = MonitorConfig {
            max_concurrent: 0,
            ..MonitorConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("monitor.max_concurrent")
        );
        let bad = MonitorConfig {
            queue_timeout: Some(Duration::ZERO),
            ..MonitorConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("monitor.queue_timeout")
        );
    }
}
