//! The lifecycle events the monitor publishes, with their deterministic ids (see `phase2.md`):
//! `<jobId>/RUNNING`, `<jobId>/<SUCCESS|FAILURE|EXPIRED|CANCELLED>`, `<jobId>/status/<hash16>`,
//! `<jobId>/restart/<retryCount>/<hash>`, `<jobId>/refund/<attempt>`.
//!
//! Every field is a pure function of persisted facts or of the objects as observed: the timestamp of a
//! transition is the transition's real time, never the moment a runner published it. Only `runner_id`
//! names the publisher (for operators).

use jiff::Timestamp;

use super::observe::PendingReason;
use super::record::Outcome;
use crate::durable::ids;
use crate::messages::proto_timestamp;
use crate::messages::v1::{JobEvent, JobState, RankExit, RankLog};
use crate::pipeline::names;

/// `<jobId>/RUNNING`, at the real start.
pub fn running(
    job_id: &str,
    started: Timestamp,
    expiry: Option<Timestamp>,
    runner_id: &str,
) -> JobEvent {
    JobEvent {
        event_id: ids::transition(job_id, JobState::Running),
        job_id: job_id.to_owned(),
        state: JobState::Running as i32,
        status: "Job is now running".to_owned(),
        reason: "started".to_owned(),
        expires_at: expiry.map(proto_timestamp),
        timestamp: Some(proto_timestamp(started)),
        runner_id: runner_id.to_owned(),
        started_at: Some(proto_timestamp(started)),
        ..JobEvent::default()
    }
}

/// The one terminal event, from the persisted outcome.
pub fn terminal(
    job_id: &str,
    outcome: &Outcome,
    expiry: Option<Timestamp>,
    runner_id: &str,
) -> JobEvent {
    JobEvent {
        event_id: ids::transition(job_id, outcome.state.job_state()),
        job_id: job_id.to_owned(),
        state: outcome.state.job_state() as i32,
        status: outcome.status.clone(),
        reason: outcome.reason.clone(),
        exit_codes: outcome
            .exit_codes
            .iter()
            .map(|c| RankExit {
                rank: c.rank,
                exit_code: c.code,
            })
            .collect(),
        expires_at: expiry.map(proto_timestamp),
        timestamp: Some(proto_timestamp(outcome.ended())),
        runner_id: runner_id.to_owned(),
        log_tails: outcome
            .log_tails
            .iter()
            .map(|t| RankLog {
                rank: t.rank,
                tail: t.tail.clone(),
            })
            .collect(),
        started_at: outcome.started().map(proto_timestamp),
        ended_at: Some(proto_timestamp(outcome.ended())),
        pending: None,
        refundable_ms: 0,
        output: None,
        trace: None,
        booking: None,
    }
}

/// The hash that names a status event: its text and reason, chained to the previous status event's
/// hash, so that a reason that comes back after another one gets a new id (consumers drop repeated ids).
pub fn status_hash(previous: Option<&str>, reason: &str, text: &str) -> String {
    let input = format!("{}\n{reason}\n{text}", previous.unwrap_or(""));
    names::short_hash(input.as_bytes(), 16)
}

/// `<jobId>/status/<hash>`: why the job still waits, at `at`, the time of the change it tells.
pub fn status(
    job_id: &str,
    hash: &str,
    pending: &PendingReason,
    at: Timestamp,
    runner_id: &str,
) -> JobEvent {
    JobEvent {
        event_id: ids::status(job_id, hash),
        job_id: job_id.to_owned(),
        state: JobState::Unspecified as i32,
        status: pending.text.clone(),
        reason: pending.reason.to_owned(),
        pending: Some(Box::new(pending.details.clone())),
        timestamp: Some(proto_timestamp(at)),
        runner_id: runner_id.to_owned(),
        ..JobEvent::default()
    }
}

/// The status event of a restart, `<jobId>/restart/<retryCount>/<hash of the text>`: Volcano's retry
/// count numbers the restarts and the text completes the id, so one id never has two contents; its time
/// is when Volcano restarted the job.
pub fn restart(
    job_id: &str,
    retry_count: i32,
    text: String,
    at: Timestamp,
    runner_id: &str,
) -> JobEvent {
    JobEvent {
        event_id: crate::durable::ids::restart(job_id, retry_count, &text),
        job_id: job_id.to_owned(),
        state: JobState::Unspecified as i32,
        status: text,
        reason: RESTART_REASON.to_owned(),
        timestamp: Some(proto_timestamp(at)),
        runner_id: runner_id.to_owned(),
        ..JobEvent::default()
    }
}

/// The `reason` of a restart's status event.
pub const RESTART_REASON: &str = "restarting";

/// A running job's peer has ended: told once per job and peer (`<jobId>/peer-ended/<peerJobId>`). Its
/// content is a function of the peer's recorded end, so a runner repeating it after a crash repeats it
/// exactly.
pub fn peer_ended(
    job_id: &str,
    peer: &super::peers::PeerView,
    how: &str,
    at: Timestamp,
    runner_id: &str,
) -> JobEvent {
    JobEvent {
        event_id: super::peers::ended_event_id(job_id, &peer.job_id),
        job_id: job_id.to_owned(),
        state: JobState::Unspecified as i32,
        status: format!(
            "Its peer {} {how}; the job runs on, but `{}` no longer answers",
            peer.named(),
            peer.hostname
        ),
        reason: super::peers::ENDED_REASON.to_owned(),
        timestamp: Some(proto_timestamp(at)),
        runner_id: runner_id.to_owned(),
        ..JobEvent::default()
    }
}

/// The `reason` of a refund event.
pub const REFUND_REASON: &str = "refundable";

/// `<jobId>/refund/<attempt>`: the run time of `attempt`, charged from `from` to `to` (its restart), is
/// refundable. Every field is a function of the job's recorded start and Volcano's phase history, so a
/// runner that reports it again after a crash sends the same message.
pub fn refund(
    job_id: &str,
    attempt: i32,
    from: Timestamp,
    to: Timestamp,
    runner_id: &str,
) -> JobEvent {
    let lost = to.duration_since(from);
    let at = |t: Timestamp| t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string();
    JobEvent {
        event_id: crate::durable::ids::refund(job_id, attempt),
        job_id: job_id.to_owned(),
        state: JobState::Unspecified as i32,
        status: format!(
            "Attempt {attempt} of the job was lost to the provider (a rank's node was lost or its pod \
             evicted) and the job restarted: its run time, {} per rank from {} to {}, is refundable",
            crate::pipeline::plugins::expiry::human(lost),
            at(from),
            at(to)
        ),
        reason: REFUND_REASON.to_owned(),
        timestamp: Some(proto_timestamp(to)),
        runner_id: runner_id.to_owned(),
        refundable_ms: lost.as_millis() as i64,
        ..JobEvent::default()
    }
}

/// Cuts a log to its last `max` bytes, at a character boundary and, when possible, a line start.
pub fn tail(log: &str, max: usize) -> String {
    if log.len() <= max {
        return log.to_owned();
    }
    let mut start = log.len() - max;
    while !log.is_char_boundary(start) {
        start += 1;
    }
    let cut = &log[start..];
    match cut.find('\n') {
        Some(i) if i + 1 < cut.len() => cut[i + 1..].to_owned(),
        _ => cut.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::record::{RankCode, Terminal};

    #[test]
    fn terminal_event_is_a_function_of_the_outcome() {
        let outcome = Outcome {
            state: Terminal::Failure,
            reason: "exit_code".into(),
            status: "Rank 1 exited with code 3".into(),
            started_at: Some(1_000),
            ended_at: 9_000,
            exit_codes: vec![RankCode { rank: 1, code: 3 }],
            log_tails: vec![],
        };
        let a = terminal("42", &outcome, None, "r1");
        assert_eq!(a.event_id, "42/FAILURE");
        assert_eq!(a.state, JobState::Failure as i32);
        assert_eq!(a.timestamp, a.ended_at);
        assert_eq!(a.exit_codes[0].exit_code, 3);
        assert_eq!(a, terminal("42", &outcome, None, "r1"));
        crate::validate::job_event(&a).unwrap();
    }

    #[test]
    fn status_hashes_chain() {
        let a = status_hash(None, "queued", "waiting");
        let b = status_hash(Some(&a), "unschedulable", "no GPUs");
        let a2 = status_hash(Some(&b), "queued", "waiting");
        assert_eq!(a.len(), 16);
        assert_ne!(a, a2, "a reason that returns gets a new id");
        assert_eq!(a, status_hash(None, "queued", "waiting"));
    }

    #[test]
    fn tails_keep_the_end_at_a_line_start() {
        assert_eq!(tail("short", 10), "short");
        assert_eq!(tail("one\ntwo\nthree\n", 9), "three\n");
        let utf8 = "ææææ\nøø\n";
        assert!(tail(utf8, 5).is_char_boundary(0));
        assert!(tail(utf8, 5).len() <= 5);
    }
}
