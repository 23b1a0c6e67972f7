//! What the monitor itself persists on a VolcanoJob, next to the pipeline's facts: the last published
//! lifecycle state, the last status-only event, the decided outcome, and the reason a deleter gave.
//!
//! These annotations are the monitor's whole memory of a job (W5, W8, W10): a runner that takes a job
//! over reads them and continues, and nothing here lives in a time-limited cache.

use std::collections::BTreeMap;
use std::fmt;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::durable::AnnotationKeys;
use crate::messages::v1::JobState;
use crate::volcano::VolcanoJob;

/// The four ways a job can end. Exactly one is published per job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Terminal {
    Success,
    Failure,
    Expired,
    Cancelled,
}

impl Terminal {
    /// The name in event ids and in the `lifecycleState` annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "SUCCESS",
            Self::Failure => "FAILURE",
            Self::Expired => "EXPIRED",
            Self::Cancelled => "CANCELLED",
        }
    }

    /// The state in the message contract.
    pub fn job_state(self) -> JobState {
        match self {
            Self::Success => JobState::Success,
            Self::Failure => JobState::Failure,
            Self::Expired => JobState::Expired,
            Self::Cancelled => JobState::Cancelled,
        }
    }
}

impl fmt::Display for Terminal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The last lifecycle state published for a job (`lifecycleState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// The runner published QUEUED (or nothing is recorded yet).
    Queued,
    Running,
    Ended(Terminal),
}

impl Published {
    /// Reads the annotation value; anything unknown counts as not yet running.
    pub fn parse(value: &str) -> Self {
        match value {
            "RUNNING" => Self::Running,
            "SUCCESS" => Self::Ended(Terminal::Success),
            "FAILURE" => Self::Ended(Terminal::Failure),
            "EXPIRED" => Self::Ended(Terminal::Expired),
            "CANCELLED" => Self::Ended(Terminal::Cancelled),
            _ => Self::Queued,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "QUEUED",
            Self::Running => "RUNNING",
            Self::Ended(t) => t.as_str(),
        }
    }
}

/// One rank's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankCode {
    pub rank: u32,
    pub code: i32,
}

/// The end of one rank's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankTail {
    pub rank: u32,
    pub tail: String,
}

/// How a job ended, decided once and persisted (annotation `outcome`) before anything about the end is
/// published, so that every later publication (after a crash, by another runner) says the same thing even
/// when the pods that told us are gone by then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub state: Terminal,
    /// Machine-readable reason code (`exit_code`, `image_pull`, `queue_timeout`, ...).
    pub reason: String,
    /// The sentence for the user.
    pub status: String,
    /// The real start, epoch ms, when the job ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<i64>,
    /// The real end, epoch ms: accounting closes here.
    pub ended_at: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exit_codes: Vec<RankCode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log_tails: Vec<RankTail>,
}

impl Outcome {
    /// The failure of a job that never started (an image that cannot be pulled, a queue timeout, a
    /// peer that never comes): nothing ran, so no start, exit codes or log tails.
    pub fn never_started(reason: &str, status: String, ended: Timestamp) -> Self {
        Self {
            state: Terminal::Failure,
            reason: reason.into(),
            status,
            started_at: None,
            ended_at: ended.as_millisecond(),
            exit_codes: Vec::new(),
            log_tails: Vec::new(),
        }
    }

    pub fn ended(&self) -> Timestamp {
        Timestamp::from_millisecond(self.ended_at).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    pub fn started(&self) -> Option<Timestamp> {
        self.started_at
            .and_then(|ms| Timestamp::from_millisecond(ms).ok())
    }

    /// The annotation value.
    pub fn to_annotation(&self) -> String {
        // Serializing plain data cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Everything the monitor reads back from a job's annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub published: Published,
    /// Hash of the last status-only event.
    pub status_hash: Option<String>,
    /// `None` also when the annotation is unreadable (then the outcome is decided again).
    pub outcome: Option<Outcome>,
    /// The deleter's words for why (a cancel's reason).
    pub termination_reason: Option<String>,
    /// The submission's W3C trace context, carried onto every message about the job.
    pub traceparent: Option<String>,
}

impl Record {
    pub fn read(job: &VolcanoJob, keys: &AnnotationKeys) -> Self {
        let empty = BTreeMap::new();
        let a = job.metadata.annotations.as_ref().unwrap_or(&empty);
        let get = |k: &str| a.get(k).map(String::as_str).filter(|v| !v.is_empty());
        Self {
            published: get(&keys.lifecycle_state).map_or(Published::Queued, Published::parse),
            status_hash: get(&keys.status_hash).map(str::to_owned),
            outcome: get(&keys.outcome).and_then(|v| serde_json::from_str(v).ok()),
            termination_reason: get(&keys.termination_reason).map(str::to_owned),
            traceparent: get(&keys.traceparent).map(str::to_owned),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_round_trips_through_its_annotation() {
        let outcome = Outcome {
            state: Terminal::Failure,
            reason: "exit_code".into(),
            status: "Rank 1 exited with code 3".into(),
            started_at: Some(1_000),
            ended_at: 61_000,
            exit_codes: vec![RankCode { rank: 0, code: 0 }, RankCode { rank: 1, code: 3 }],
            log_tails: vec![RankTail {
                rank: 1,
                tail: "boom\n".into(),
            }],
        };
        let text = outcome.to_annotation();
        assert!(text.contains("\"state\":\"FAILURE\""), "{text}");
        assert!(text.contains("\"endedAt\":61000"), "{text}");
        assert_eq!(serde_json::from_str::<Outcome>(&text).unwrap(), outcome);
    }

    #[test]
    fn lifecycle_states_parse_and_unknown_is_queued() {
        for t in [
            Terminal::Success,
            Terminal::Failure,
            Terminal::Expired,
            Terminal::Cancelled,
        ] {
            assert_eq!(Published::parse(t.as_str()), Published::Ended(t));
        }
        assert_eq!(Published::parse("RUNNING"), Published::Running);
        assert_eq!(Published::parse("weird"), Published::Queued);
    }
}
