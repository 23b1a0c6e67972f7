//! The parts of a job's history the monitor records for people (`volcano-runner job`), beside the facts
//! it decides by: the status events told while the job waited (`statusLog`) and the restarts told
//! (`restartLog`). Each is written in the same patch as the annotation that already records the
//! transition (`statusHash`, `restarts`), so it costs no extra API call, and nothing decides by them: an
//! unreadable log is started afresh, never an error.

use serde::{Deserialize, Serialize};

/// At most this many status entries are kept: the first (why the job began to wait) and the newest.
/// A job behind N others is told about 10 + log10(N) times (docs/monitor.md), so this is rarely reached.
pub const STATUS_LOG_MAX: usize = 24;

/// At most this many restarts are kept (Volcano's `maxRetry` is usually a handful): the newest.
pub const RESTART_LOG_MAX: usize = 32;

/// One status event told while the job waited.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusEntry {
    /// When it was told, epoch ms.
    pub at: i64,
    /// `unschedulable`, `queued`, `starting`, `image_pull_retrying`.
    pub reason: String,
    pub text: String,
    /// The Volcano queue the job waited in.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub queue: String,
    /// Jobs ahead in that queue, as told (exact up to 10, then a power of ten as a lower bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jobs_ahead: Option<u32>,
    /// The estimated start told, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_start_at: Option<i64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub estimate_basis: String,
}

/// One restart told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestartEntry {
    /// The attempt that began with this restart (2 for the first restart).
    pub attempt: i32,
    /// When Volcano restarted the job, epoch ms.
    pub at: i64,
    /// What was lost, in words (`rank 1's node n3 was lost`).
    pub cause: String,
}

/// Reads a log annotation; an absent or unreadable one is empty.
pub fn read<T: for<'de> Deserialize<'de>>(value: Option<&str>) -> Vec<T> {
    value
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

/// The status log with `entry` appended: the first entry and the newest, at most [`STATUS_LOG_MAX`].
pub fn append_status(previous: Option<&str>, entry: StatusEntry) -> String {
    let mut log: Vec<StatusEntry> = read(previous);
    log.push(entry);
    if log.len() > STATUS_LOG_MAX {
        log.drain(1..log.len() - (STATUS_LOG_MAX - 1));
    }
    serde_json::to_string(&log).unwrap_or_default()
}

/// The restart log with `entry` appended (an entry of the same attempt replaced): the newest
/// [`RESTART_LOG_MAX`].
pub fn append_restart(previous: Option<&str>, entry: RestartEntry) -> String {
    let mut log: Vec<RestartEntry> = read(previous);
    log.retain(|e| e.attempt != entry.attempt);
    log.push(entry);
    if log.len() > RESTART_LOG_MAX {
        log.drain(..log.len() - RESTART_LOG_MAX);
    }
    serde_json::to_string(&log).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(at: i64) -> StatusEntry {
        StatusEntry {
            at,
            reason: "queued".into(),
            text: format!("waiting ({at})"),
            queue: "default".into(),
            jobs_ahead: Some(3),
            estimated_start_at: None,
            estimate_basis: String::new(),
        }
    }

    #[test]
    fn the_status_log_keeps_the_first_and_the_newest_entries() {
        let mut value: Option<String> = None;
        for at in 0..(STATUS_LOG_MAX as i64 + 10) {
            value = Some(append_status(value.as_deref(), status(at)));
        }
        let log: Vec<StatusEntry> = read(value.as_deref());
        assert_eq!(log.len(), STATUS_LOG_MAX);
        assert_eq!(log[0].at, 0, "the first reason is kept");
        assert_eq!(log[1].at, 11);
        assert_eq!(log.last().unwrap().at, STATUS_LOG_MAX as i64 + 9);
        assert!(value.unwrap().contains("\"jobsAhead\":3"));
    }

    #[test]
    fn a_restart_is_logged_once_per_attempt_and_garbage_starts_afresh() {
        let entry = |attempt, cause: &str| RestartEntry {
            attempt,
            at: 1_000 * i64::from(attempt),
            cause: cause.into(),
        };
        let one = append_restart(Some("not json"), entry(2, "rank 1's node n3 was lost"));
        let again = append_restart(Some(&one), entry(2, "rank 1's node n3 was lost"));
        let two = append_restart(Some(&again), entry(3, "rank 0's pod was evicted"));
        let log: Vec<RestartEntry> = read(Some(&two));
        assert_eq!(
            log.iter().map(|e| e.attempt).collect::<Vec<_>>(),
            [2, 3],
            "{two}"
        );
        assert_eq!(log[1].cause, "rank 0's pod was evicted");
    }
}
