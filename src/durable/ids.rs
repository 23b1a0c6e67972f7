//! Deterministic ids of every message published about a job, by the runner and by the monitor: lifecycle
//! events, status-only events, extension answers, rejections, accounting ticks and proxy events.
//!
//! Delivery is at-least-once: a message handled twice (a redelivery after a crash, a second runner
//! racing the first) publishes its events twice. Consumers drop the copies by id, so every id here is a
//! pure function of the job and of what happened to it, never of the time or of the runner.

use sha2::{Digest, Sha256};

use crate::messages::v1::JobState;

/// `<jobId>/<STATE>`: the one event of a lifecycle transition. A job has at most one terminal event, so
/// `<jobId>/FAILURE` and `<jobId>/CANCELLED` never collide.
pub fn transition(job_id: &str, state: JobState) -> String {
    format!("{job_id}/{}", state_name(state))
}

/// `<jobId>/rejected/<fingerprint16>`: a message that never became (or changed) a job: invalid, a
/// duplicate id with other content, or refused by the cluster. A second delivery of the same message
/// gives the same id; a corrected resubmission under the same job id gives a new one.
pub fn rejected(job_id: &str, fingerprint16: &str) -> String {
    format!("{job_id}/rejected/{fingerprint16}")
}

/// `<jobId>/extend/<requestId>`: the outcome of one extension request, however often it is delivered.
pub fn extension(job_id: &str, request_id: &str) -> String {
    format!("{job_id}/extend/{request_id}")
}

/// `<jobId>/status/<hash>`: a status-only event (why the job waits, ...); the hash chains the previous
/// status, so the same reason after another is a new event and a repeat of the last one is not.
pub fn status(job_id: &str, hash: &str) -> String {
    format!("{job_id}/status/{hash}")
}

/// `<jobId>/restart/<retryCount>/<hash>`: the status event telling that Volcano restarted the job,
/// numbered by Volcano's `status.retryCount`; the hash (16 hex digits of the text's SHA-256) keeps the id a
/// function of what it says, since a runner taking over may know less of the cause than the one that
/// published first and crashed before recording it.
pub fn restart(job_id: &str, retry_count: i32, text: &str) -> String {
    format!(
        "{job_id}/restart/{retry_count}/{}",
        body_fingerprint16(text.as_bytes())
    )
}

/// `<jobId>/refund/<attempt>`: the refundable run time of the job's `attempt`-th attempt (from 1), which a
/// restart of Volcano's (`status.retryCount` = `attempt`) lost. A function of the job and the attempt only,
/// so every runner that reports it, before or after a crash, reports it under the same id.
pub fn refund(job_id: &str, attempt: i32) -> String {
    format!("{job_id}/refund/{attempt}")
}

/// `<jobId>/<n>`: the n-th accounting tick (from 0), whose index is recorded in `accountedTicks`.
pub fn tick(job_id: &str, sequence: u64) -> String {
    format!("{job_id}/{sequence}")
}

/// `<jobId>/proxy/<verb>/<generation>`: a proxy event (`create`, `update`, `remove`); the generation (a
/// hash of the targets) is recorded in `proxyGeneration`.
pub fn proxy(job_id: &str, verb: &str, generation: &str) -> String {
    format!("{job_id}/proxy/{verb}/{generation}")
}

/// `<jobId>/warning/<expiry ms>/<minutes before>`: the warning that the job expires soon, one per
/// threshold and expiry (an extension moves the expiry, so the warnings come again for the new one).
pub fn expiry_warning(job_id: &str, expiry_ms: i64, minutes_before: i64) -> String {
    format!("{job_id}/warning/{expiry_ms}/{minutes_before}")
}

/// `<jobId>/maintenance/<window id>/<start ms>/warning`: the warning that a maintenance window will
/// end the job, once per window and start (a window scheduled again at another start warns again).
pub fn maintenance_warning(job_id: &str, window_id: &str, start_ms: i64) -> String {
    format!("{job_id}/maintenance/{window_id}/{start_ms}/warning")
}

/// `<jobId>/maintenance/<window id>/<start ms>/held`: the status that a waiting job waits for a
/// maintenance window, once per window and start. `/queued` instead of `/held` for a job that cannot be
/// held back any more (placed before the window was scheduled, let go and started late, or queued
/// before it where the node patch is refused), which is told what happens instead.
pub fn maintenance_held(job_id: &str, window_id: &str, start_ms: i64, held: bool) -> String {
    let what = if held { "held" } else { "queued" };
    format!("{job_id}/maintenance/{window_id}/{start_ms}/{what}")
}

/// `<jobId>/booked/<start ms>`: the answer that a booking holds, with its guaranteed start; a booking
/// moved to another start is told under the new start's id.
pub fn booked(job_id: &str, start_ms: i64) -> String {
    format!("{job_id}/booked/{start_ms}")
}

/// `<jobId>/booking/<start ms>/<what>`: news of the booking of that start (`cancelled`, `broken`).
pub fn booking_news(job_id: &str, start_ms: i64, what: &str) -> String {
    format!("{job_id}/booking/{start_ms}/{what}")
}

/// The state's name in ids: `QUEUED`, `RUNNING`, `SUCCESS`, `FAILURE`, `EXPIRED`, `CANCELLED`.
pub fn state_name(state: JobState) -> &'static str {
    match state {
        JobState::Unspecified => "UNSPECIFIED",
        JobState::Queued => "QUEUED",
        JobState::Running => "RUNNING",
        JobState::Success => "SUCCESS",
        JobState::Failure => "FAILURE",
        JobState::Expired => "EXPIRED",
        JobState::Cancelled => "CANCELLED",
    }
}

/// The first 16 hex digits of a submission fingerprint (`sha256:<hex>`, see
/// [`crate::pipeline::fingerprint`]), for rejected ids.
pub fn fingerprint16(fingerprint: &str) -> String {
    let hex = fingerprint.strip_prefix("sha256:").unwrap_or(fingerprint);
    hex.chars().take(16).collect()
}

/// The first 16 hex digits of the SHA-256 of raw bytes: the fingerprint of a message that could not be
/// decoded (or of a cancel or extension, which have no submission fingerprint).
pub fn body_fingerprint16(body: &[u8]) -> String {
    Sha256::digest(body)
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_documented_shapes() {
        assert_eq!(transition("42", JobState::Queued), "42/QUEUED");
        assert_eq!(transition("42", JobState::Cancelled), "42/CANCELLED");
        assert_eq!(
            rejected("42", "0123456789abcdef"),
            "42/rejected/0123456789abcdef"
        );
        assert_eq!(extension("42", "r-1"), "42/extend/r-1");
    }

    #[test]
    fn fingerprints_are_cut_to_16_hex_digits() {
        assert_eq!(
            fingerprint16("sha256:0123456789abcdef0123456789abcdef"),
            "0123456789abcdef"
        );
        let a = body_fingerprint16(b"{\"jobId\":\"1\"}");
        assert_eq!(a.len(), 16);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a, body_fingerprint16(b"{\"jobId\":\"1\"}"), "stable");
        assert_ne!(a, body_fingerprint16(b"{\"jobId\":\"2\"}"));
    }
}
