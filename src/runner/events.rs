//! The events the runner publishes, built by pure functions.
//!
//! Each event's id comes from [`super::ids`]; its content comes from facts that are persisted (the
//! VolcanoJob's creation time and annotations, a tombstone) or carried by the message itself, so a
//! re-publish after a crash is the same message. The monitor publishes everything after QUEUED.

use jiff::{SignedDuration, Timestamp};

use crate::cluster::Tombstone;
use crate::durable::ids;
use crate::messages::proto_timestamp;
use crate::messages::v1::{JobEvent, JobState};
use crate::pipeline::plugins::expiry::human;

/// Machine-readable reason codes the runner puts on its events. Orchestrators match on them.
pub mod reasons {
    /// QUEUED: the job's objects exist and it waits for the scheduler.
    pub const SUBMITTED: &str = crate::durable::SUBMITTED;
    // FAILURE of a submission that could not be decoded or did not pass validation or rendering, and the
    // status event of such a cancel or extension: the dead-letter code (`missing_field`, `invalid_field`,
    // `invalid_json`, `wrong_queue`, ...; see `crate::validate::ErrorKind::code` and
    // `crate::messages::DecodeError::reason`).
    /// FAILURE: the job id is taken by a submission with other content.
    pub const DUPLICATE_JOB_ID: &str = "duplicate_job_id";
    /// FAILURE: the cluster refused the job (invalid object, admission webhook, closed queue).
    pub const CLUSTER_REJECTED: &str = "cluster_rejected";
    /// FAILURE: the owner holds as many whole nodes as `[pipeline.whole_nodes]` allows.
    pub const WHOLE_NODE_LIMIT: &str = "whole_node_limit";
    /// FAILURE: a companion's name is taken by an object that is not this job's.
    pub const NAME_CONFLICT: &str = "name_conflict";
    /// CANCELLED: the orchestrator cancelled the job.
    pub const CANCELLED: &str = "cancelled";
    /// Extension applied.
    pub const EXTENDED: &str = "extended";
    /// Extension or cancel of a job that does not exist.
    pub const UNKNOWN_JOB: &str = "unknown_job";
    /// Extension of a job that has finished or is being deleted.
    pub const JOB_FINISHED: &str = "job_finished";
    /// Extension of a job without a time allocation.
    pub const NO_TIME_LIMIT: &str = "no_time_limit";
    /// An extension refused because the new time allocation would be out of range.
    pub const LIMIT_EXCEEDED: &str = "limit_exceeded";
}

fn event(job_id: &str, event_id: String, state: JobState, at: Timestamp, runner: &str) -> JobEvent {
    JobEvent {
        event_id,
        job_id: job_id.to_owned(),
        state: state as i32,
        timestamp: Some(proto_timestamp(at)),
        runner_id: runner.to_owned(),
        ..JobEvent::default()
    }
}

/// QUEUED, as the runner and the monitor both publish it: see [`crate::durable::queued_event`].
pub use crate::durable::queued_event as queued;

/// FAILURE for a submission that never became a job: `reason` is one of [`reasons`], `status` says what
/// is wrong in words for the user (for bad input: `<field>: <problem>`).
pub fn submission_rejected(
    job_id: &str,
    fingerprint16: &str,
    reason: &str,
    status: impl Into<String>,
    at: Timestamp,
    runner: &str,
) -> JobEvent {
    JobEvent {
        status: status.into(),
        reason: reason.to_owned(),
        ended_at: Some(proto_timestamp(at)),
        ..event(
            job_id,
            ids::rejected(job_id, fingerprint16),
            JobState::Failure,
            at,
            runner,
        )
    }
}

/// A status-only event (no state change) for a cancel or extension that could not be read: the job it
/// names is not affected, so it gets no FAILURE.
pub fn control_rejected(
    job_id: &str,
    fingerprint16: &str,
    reason: &str,
    status: impl Into<String>,
    at: Timestamp,
    runner: &str,
) -> JobEvent {
    JobEvent {
        status: status.into(),
        reason: reason.to_owned(),
        ..event(
            job_id,
            ids::rejected(job_id, fingerprint16),
            JobState::Unspecified,
            at,
            runner,
        )
    }
}

/// CANCELLED for a job that has no VolcanoJob: cancelled before its submission arrived. Built from the
/// tombstone, so the cancel and the late submission publish the same event.
pub fn cancelled_without_job(tombstone: &Tombstone, runner: &str) -> JobEvent {
    let job_id = &tombstone.job_id;
    JobEvent {
        status: cancel_status(&tombstone.reason),
        reason: reasons::CANCELLED.into(),
        ended_at: Some(proto_timestamp(tombstone.cancelled_at)),
        ..event(
            job_id,
            ids::transition(job_id, JobState::Cancelled),
            JobState::Cancelled,
            tombstone.cancelled_at,
            runner,
        )
    }
}

/// The status text of a cancellation.
pub fn cancel_status(reason: &str) -> String {
    if reason.trim().is_empty() {
        "Cancelled".into()
    } else {
        format!("Cancelled: {}", reason.trim())
    }
}

/// The outcome of an extension request that was applied.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Extended {
    /// The time added by this request.
    pub added: SignedDuration,
    /// The whole time allocation now.
    pub max_time: SignedDuration,
    /// The new expiry, when the job has started (before that, the allocation counts from the start).
    pub expiry: Option<Timestamp>,
}

/// A status-only event: extension `request_id` is applied.
pub fn extended(
    job_id: &str,
    request_id: &str,
    outcome: Extended,
    at: Timestamp,
    runner: &str,
) -> JobEvent {
    let status = match outcome.expiry {
        Some(expiry) => format!(
            "Time allocation extended by {}; the job now expires at {expiry}",
            human(outcome.added)
        ),
        None => format!(
            "Time allocation extended by {} to {}, counted from the job's start",
            human(outcome.added),
            human(outcome.max_time)
        ),
    };
    JobEvent {
        status,
        reason: reasons::EXTENDED.into(),
        expires_at: outcome.expiry.map(proto_timestamp),
        ..event(
            job_id,
            ids::extension(job_id, request_id),
            JobState::Unspecified,
            at,
            runner,
        )
    }
}

/// A status-only event: extension `request_id` changed nothing, because of `reason` (one of
/// [`reasons::UNKNOWN_JOB`], [`reasons::JOB_FINISHED`], [`reasons::NO_TIME_LIMIT`]).
pub fn extension_refused(
    job_id: &str,
    request_id: &str,
    reason: &'static str,
    at: Timestamp,
    runner: &str,
) -> JobEvent {
    let status = match reason {
        reasons::UNKNOWN_JOB => format!("Cannot extend job {job_id}: no such job"),
        reasons::JOB_FINISHED => format!("Cannot extend job {job_id}: it has finished"),
        reasons::NO_TIME_LIMIT => {
            format!("Job {job_id} has no time limit; there is nothing to extend")
        }
        reasons::LIMIT_EXCEEDED => format!(
            "Cannot extend job {job_id}: extension: the new time allocation would be more than 100 years"
        ),
        other => format!("Cannot extend job {job_id}: {other}"),
    };
    JobEvent {
        status,
        reason: reason.to_owned(),
        ..event(
            job_id,
            ids::extension(job_id, request_id),
            JobState::Unspecified,
            at,
            runner,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::validate;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn every_event_passes_the_outbound_checks() {
        let tombstone = Tombstone::new("42", "user asked", at(100), Duration::from_secs(60));
        let events = [
            queued("42", at(1), "runner-a"),
            submission_rejected(
                "42",
                "0123456789abcdef",
                "invalid_field",
                "replicas: must be at least 1",
                at(2),
                "r",
            ),
            control_rejected(
                "42",
                "0123456789abcdef",
                "invalid_field",
                "extension: must be positive",
                at(3),
                "r",
            ),
            cancelled_without_job(&tombstone, "r"),
            extended(
                "42",
                "req-1",
                Extended {
                    added: SignedDuration::from_hours(1),
                    max_time: SignedDuration::from_hours(3),
                    expiry: Some(at(10_000)),
                },
                at(4),
                "r",
            ),
            extension_refused("42", "req-2", reasons::UNKNOWN_JOB, at(5), "r"),
        ];
        for e in &events {
            validate::job_event(e).unwrap_or_else(|err| panic!("{e:?}: {err}"));
        }
    }

    #[test]
    fn queued_depends_only_on_persisted_facts() {
        let a = queued("42", at(1), "runner-a");
        assert_eq!(a, queued("42", at(1), "runner-a"));
        assert_eq!(a.event_id, "42/QUEUED");
        assert_eq!(a.state, JobState::Queued as i32);
        assert_eq!(a.timestamp, Some(proto_timestamp(at(1))));
    }

    #[test]
    fn cancellation_from_a_tombstone_carries_its_reason_and_time() {
        let t = Tombstone::new("7", "  budget exhausted ", at(100), Duration::from_secs(60));
        let e = cancelled_without_job(&t, "r");
        assert_eq!(e.event_id, "7/CANCELLED");
        assert_eq!(e.status, "Cancelled: budget exhausted");
        assert_eq!(e.timestamp, Some(proto_timestamp(at(100))));
        let blank = Tombstone::new("7", "", at(100), Duration::from_secs(60));
        assert_eq!(cancelled_without_job(&blank, "r").status, "Cancelled");
    }

    #[test]
    fn extensions_say_what_changed() {
        let started = extended(
            "9",
            "r1",
            Extended {
                added: SignedDuration::from_mins(30),
                max_time: SignedDuration::from_hours(2),
                expiry: Some(at(7200)),
            },
            at(1),
            "r",
        );
        assert_eq!(started.event_id, "9/extend/r1");
        assert!(started.status.contains("30 minutes"), "{}", started.status);
        assert_eq!(started.expires_at, Some(proto_timestamp(at(7200))));
        let pending = extended(
            "9",
            "r2",
            Extended {
                added: SignedDuration::from_hours(1),
                max_time: SignedDuration::from_hours(2),
                expiry: None,
            },
            at(1),
            "r",
        );
        assert!(pending.status.contains("2 hours"), "{}", pending.status);
        assert_eq!(pending.expires_at, None);
        let refused = extension_refused("9", "r3", reasons::JOB_FINISHED, at(1), "r");
        assert_eq!(refused.reason, "job_finished");
        assert_eq!(refused.event_id, "9/extend/r3");
    }
}
