//! The `[runner]` section: how a runner consumes (in-flight limit, shutdown grace, requeue delay), what
//! it publishes in, and its name. Defined with the configuration (the runner consumes the whole of it),
//! re-exported by [`crate::runner`].

use std::time::Duration;

use serde::Deserialize;

use crate::messages::Format;

/// Serde helper for durations written as `"30s"`, `"500ms"`, `"5m"`.
mod duration {
    pub use jiff::fmt::serde::unsigned_duration::friendly::compact::required;
}

/// The encoding of the events the runner publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputFormat {
    /// The proto3 JSON mapping (`application/json`): readable, what `volcano-runner events` shows.
    #[default]
    Json,
    /// Protobuf (`application/x-protobuf`): smaller, for consumers that have the `.proto` files.
    Protobuf,
}

impl From<OutputFormat> for Format {
    fn from(value: OutputFormat) -> Self {
        match value {
            OutputFormat::Json => Format::Json,
            OutputFormat::Protobuf => Format::Protobuf,
        }
    }
}

/// The `[runner]` section of the configuration: who this runner is, how much it handles at once, and how
/// it stops.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunnerConfig {
    /// This runner's name: on the jobs it creates (`acceptedBy`), on its events (`runnerId`), and in the
    /// shard leases. Unset: the host name (a pod's name) plus a random suffix, so a restarted process is a
    /// new member and never inherits its predecessor's leases by accident. Must be a DNS label.
    pub id: Option<String>,
    /// How many submissions one runner handles at the same time. With `broker.submit_prefetch` this is the
    /// runner's in-progress limit: more than this wait, unacknowledged, in the client's buffer.
    ///
    /// It is also what a busy runner's memory grows with: about 100 KiB per submission in hand (measured
    /// with `bench --no-monitor --max-in-flight` 32 and 64, issue 46): one HTTP/1.1 connection to the API
    /// server per request in progress (hyper's buffers and channels, about 24 KiB each, kept in the pool
    /// afterwards), the handling task, the rendered objects (held as the text sent, about 8 KiB for a
    /// figlet job). At 32 an unmonitored runner peaked at 34 to 35 MiB, at 64 at about 38 (most of it the
    /// program's code; 2 to 3 MiB more with the whole program file in the page cache); on a 2-core
    /// machine one runner's unpaced rate at 32 was within the spread of its runs at 64. See README's
    /// Performance.
    pub max_in_flight: u32,
    /// How long in-flight work may take to finish after SIGTERM/SIGINT before it is returned to the queue.
    /// Keep it below the pod's `terminationGracePeriodSeconds` (30 s by default).
    #[serde(with = "duration::required")]
    pub shutdown_grace: Duration,
    /// How long to wait before returning a message to its queue after a transient failure, so an outage
    /// does not spin a message through its delivery limit in a tight loop.
    #[serde(with = "duration::required")]
    pub requeue_delay: Duration,
    /// How long a submission taken just as the cluster reached `cluster.max_active_jobs` waits for a free
    /// slot before it goes back to the queue. Well below the broker's 30-minute acknowledgement timeout.
    #[serde(with = "duration::required")]
    pub capacity_wait: Duration,
    /// How long one message may be in hand before the runner counts as stalled: `/readyz` then fails
    /// (`stalled: ...`), so a runner whose handlers hang is taken out of service instead of holding its
    /// share of the queue while it looks healthy. Longer than `capacity_wait`, which a submission may
    /// spend waiting for a slot, and than the cluster retries of one message.
    #[serde(with = "duration::required")]
    pub stall_after: Duration,
    /// The encoding of every event the runner publishes: `json` or `protobuf`.
    pub output_format: OutputFormat,
    /// Put the `<prefix>cleanup` finalizer on every VolcanoJob, so a job cannot vanish before the monitor
    /// has cleaned up after it (final accounting, proxy removal, terminal event) exactly once. Switch off
    /// only where no runner runs the monitor, or deleted jobs would wait for it forever.
    pub cleanup_finalizer: bool,
    /// A cancel of a job that does not exist publishes CANCELLED at once (built from its tombstone), so
    /// the orchestrator learns that the cancel took effect before the submission arrives. Off: CANCELLED
    /// comes only when the late submission arrives. Off suits orchestrators that often cancel jobs long
    /// after they finished and were cleaned up, which would otherwise get a second terminal event.
    pub announce_cancel_without_job: bool,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        Self {
            id: None,
            max_in_flight: 32,
            shutdown_grace: Duration::from_secs(25),
            requeue_delay: Duration::from_secs(1),
            capacity_wait: Duration::from_secs(300),
            stall_after: Duration::from_secs(600),
            output_format: OutputFormat::Json,
            cleanup_finalizer: true,
            announce_cancel_without_job: true,
        }
    }
}

impl RunnerConfig {
    /// Checks what serde cannot; the error names the key.
    pub fn check(&self) -> Result<(), RunnerConfigError> {
        let invalid = |key: &str, reason: &str| RunnerConfigError {
            key: format!("runner.{key}"),
            reason: reason.to_owned(),
        };
        if let Some(id) = &self.id
            && let Err(why) = crate::cluster::labels::check_dns_label(id)
        {
            return Err(invalid("id", &why));
        }
        if self.max_in_flight == 0 {
            return Err(invalid("max_in_flight", "must be at least 1"));
        }
        if self.capacity_wait.is_zero() {
            return Err(invalid("capacity_wait", "must be longer than zero"));
        }
        if self.stall_after <= self.capacity_wait {
            return Err(invalid(
                "stall_after",
                &format!(
                    "must be longer than runner.capacity_wait ({} s), which a submission may spend waiting for a slot",
                    self.capacity_wait.as_secs()
                ),
            ));
        }
        Ok(())
    }

    /// The configured id, or the host name plus a random suffix.
    pub fn runner_id(&self) -> String {
        self.id.clone().unwrap_or_else(default_id)
    }
}

/// The host name made into a DNS label, plus six random hex digits.
fn default_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .unwrap_or_default();
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    id_from(&host, (hasher.finish() & 0x00ff_ffff) as u32)
}

fn id_from(host: &str, suffix: u32) -> String {
    let name: String = host
        .trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(40)
        .collect();
    let name = name.trim_matches('-');
    let name = if name.is_empty() { "runner" } else { name };
    format!("{name}-{suffix:06x}")
}

/// A `[runner]` setting that cannot work: the key (e.g. `runner.max_in_flight`) and what is wrong. This
/// section's own error, so the section does not depend on the configuration module that composes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration {key}: {reason}")]
pub struct RunnerConfigError {
    pub key: String,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_section_is_the_default() {
        #[derive(Deserialize)]
        struct File {
            runner: RunnerConfig,
        }
        let text = include_str!("../../deploy/config.d/runner.toml");
        let file: File = toml::from_str(text).expect("deploy/config.d/runner.toml parses");
        assert_eq!(file.runner, RunnerConfig::default());
    }

    #[test]
    fn keys_read_as_documented() {
        let c: RunnerConfig = toml::from_str(
            "id = \"r-1\"\nmax_in_flight = 4\nshutdown_grace = \"5s\"\noutput_format = \"protobuf\"",
        )
        .unwrap();
        assert_eq!(c.runner_id(), "r-1");
        assert_eq!(c.max_in_flight, 4);
        assert_eq!(c.shutdown_grace, Duration::from_secs(5));
        assert_eq!(Format::from(c.output_format), Format::Protobuf);
        assert!(toml::from_str::<RunnerConfig>("prefetch = 3").is_err());
    }

    #[test]
    fn checks_name_the_key() {
        let c = RunnerConfig {
            max_in_flight: 0,
            ..RunnerConfig::default()
        };
        assert!(
            c.check()
                .unwrap_err()
                .to_string()
                .contains("runner.max_in_flight")
        );
        let c = RunnerConfig {
            id: Some("Not A Label".into()),
            ..RunnerConfig::default()
        };
        assert!(c.check().unwrap_err().to_string().contains("runner.id"));
    }

    #[test]
    fn default_ids_are_dns_labels_from_the_host_name() {
        assert_eq!(
            id_from("Worker_7.example.org\n", 0xabc),
            "worker-7-example-org-000abc"
        );
        assert_eq!(id_from("", 1), "runner-000001");
        let id = RunnerConfig::default().runner_id();
        crate::cluster::labels::check_dns_label(&id).unwrap();
    }
}
