//! ExtendJob: add time to a job's allocation, once per request id.
//!
//! The new values are computed from what is persisted on the VolcanoJob (the pipeline's
//! [`expiry::extend`]: `maxTime += d`, `expiry += d` once the job has started, the request id appended to
//! `extensions`) and written with the observed resourceVersion, so a concurrent write (the monitor
//! recording the start, another runner applying another extension) makes us re-read and compute again.
//! The event `<jobId>/extend/<requestId>` follows the write; a redelivery finds the request id applied and
//! publishes the event again, with the values now persisted.
//!
//! A job that does not exist may be a submission still waiting in its queue (held by the pause, or
//! behind a backlog): the extension is recorded in the cluster ([`crate::cluster::pending_extension`])
//! and applied, with its answer, once the job exists ([`apply_recorded`], from the runner's periodic
//! pass); a job that never comes within `[cluster] tombstone_ttl` gets `unknown_job` then. A job that
//! has ended and a job without a time limit get an event with a reason (`job_finished`,
//! `no_time_limit`) and no change. An extension longer than 100 years
//! (36,600 days), or one that would take the job's allocation past that, gets one with `limit_exceeded`
//! and is dead-lettered with that reason.

use jiff::SignedDuration;
use tracing::{info, warn};

use crate::broker::DeadLetterReason;
use crate::cluster::ClusterError;
use crate::messages::v1::ExtendJob;
use crate::ops::trace::TraceParent;
use crate::pipeline::hooks::JobFacts;
use crate::pipeline::plugins::expiry::{self, ExtendError, Extension};
use crate::validate::{self, ErrorKind};

use super::super::events::{self, Extended, reasons};
use super::reject::{self, Subject};
use super::{Handler, Message, Settle};
use crate::cluster::jobs::is_over;
use crate::durable::ids;

/// Attempts at the guarded write before the message is requeued.
const CONFLICT_ATTEMPTS: usize = 8;

/// Handles one extension request.
pub async fn handle(h: &Handler, m: &Message<'_>, extend: &ExtendJob) -> Settle {
    let fingerprint16 = ids::body_fingerprint16(m.body);
    let subject = Subject {
        job_id: &extend.job_id,
        is_submission: false,
        fingerprint16: &fingerprint16,
    };
    let (job_id, request_id) = (extend.job_id.as_str(), extend.request_id.as_str());
    // The answer's time is the request's (its AMQP timestamp) when it has one, so every delivery of the
    // request publishes the same answer under its id.
    let at = m.sent_at.unwrap_or_else(|| h.now());
    let refuse = |reason: &'static str| {
        events::extension_refused(job_id, request_id, reason, at, &h.runner_id)
    };
    if let Err(e) = validate::extend(extend) {
        if e.kind() == ErrorKind::LimitExceeded {
            // Longer than any allocation may be: refused like an extension that would take the job's
            // allocation past the bound, with the answer the orchestrator waits for.
            return limit_exceeded(h, m, &refuse(reasons::LIMIT_EXCEEDED), e.to_string()).await;
        }
        return reject::invalid_by(h, m, subject, &e).await;
    }
    let Some(added) = extend.extension.as_ref().and_then(to_signed) else {
        let what = "must be a duration of at most 10000 years";
        return reject::invalid(h, m, subject, "extension", what, "invalid_field").await;
    };

    let mut recorded = false;
    loop {
        if let Some(settle) = apply(h, m, job_id, request_id, added).await {
            return settle;
        }
        if recorded {
            info!(
                job_id,
                request_id,
                "An extension arrived before its job; it is applied once the job exists."
            );
            return Settle::Ack;
        }
        // No such job (yet): its submission may still wait in its queue. Record the extension first,
        // then look again, so the job's creation cannot slip in between unseen (see
        // [`crate::cluster::pending_extension`]).
        let seconds = extend
            .extension
            .as_ref()
            .map_or((0, 0), |d| (d.seconds, d.nanos));
        let record = h.pending_extensions.draft(
            job_id,
            request_id,
            seconds,
            Some(at),
            m.traceparent.as_ref().map(|t| t.as_str().to_owned()),
            h.now(),
        );
        if let Err(e) = h.pending_extensions.record(&record).await {
            return Settle::cluster(&e);
        }
        recorded = true;
    }
}

/// Applies an extension that was recorded before its job existed (`m` carries the request's time and
/// trace context): `None` while the job still does not exist.
pub async fn apply_recorded(h: &Handler, m: &Message<'_>, extend: &ExtendJob) -> Option<Settle> {
    // Validated when it was recorded; a record that does not convert has nothing to apply.
    let added = extend.extension.as_ref().and_then(to_signed)?;
    apply(h, m, &extend.job_id, &extend.request_id, added).await
}

/// The guarded write of one extension and its answer; `None` when the job does not exist.
async fn apply(
    h: &Handler,
    m: &Message<'_>,
    job_id: &str,
    request_id: &str,
    added: SignedDuration,
) -> Option<Settle> {
    let at = m.sent_at.unwrap_or_else(|| h.now());
    let refuse = |reason: &'static str| {
        events::extension_refused(job_id, request_id, reason, at, &h.runner_id)
    };
    for _ in 0..CONFLICT_ATTEMPTS {
        let job = match h.jobs.find(job_id).await {
            Ok(Some(job)) => job,
            Ok(None) => return None,
            Err(e) => return Some(Settle::cluster(&e)),
        };
        if is_over(&job, &h.keys) {
            return Some(publish(h, m, &refuse(reasons::JOB_FINISHED)).await);
        }
        let outcome = match expiry::extend(&job, &h.config.pipeline, request_id, added) {
            Ok(outcome) => outcome,
            Err(ExtendError::OutOfRange) => {
                let text = format!(
                    "extension: job {job_id}'s time allocation would be more than 100 years \
                     (36600 days)"
                );
                return Some(limit_exceeded(h, m, &refuse(reasons::LIMIT_EXCEEDED), text).await);
            }
            Err(e) => {
                // The job's own annotations are unreadable: nothing this message can fix.
                let reason = DeadLetterReason::new(
                    "job_state_unreadable",
                    format!("cannot extend job {job_id}: {e}"),
                );
                return Some(Settle::DeadLetter(reason));
            }
        };
        let applied = match outcome {
            Extension::NoTimeLimit => {
                return Some(publish(h, m, &refuse(reasons::NO_TIME_LIMIT)).await);
            }
            Extension::AlreadyApplied => match JobFacts::read(&job, &h.keys, &h.config.pipeline) {
                Ok(facts) => Extended {
                    added,
                    max_time: facts.max_time.unwrap_or_default(),
                    expiry: facts.expiry,
                },
                Err(e) => {
                    let reason = DeadLetterReason::new(
                        "job_state_unreadable",
                        format!("cannot extend job {job_id}: {e}"),
                    );
                    return Some(Settle::DeadLetter(reason));
                }
            },
            Extension::Apply {
                plan,
                max_time,
                expiry,
            } => {
                match into_booking(h, &job, expiry).await {
                    Err(e) => return Some(Settle::cluster(&e)),
                    Ok(Some(why)) => {
                        let mut event = refuse(super::booking::BOOKED_CAPACITY);
                        event.status = format!("Cannot extend job {job_id}: {why}");
                        return Some(publish(h, m, &event).await);
                    }
                    Ok(None) => {}
                }
                let Some(patch) = plan.merge_patch() else {
                    return Some(Settle::Ack);
                };
                match h.jobs.patch(&job, &patch).await {
                    Ok(_) => {
                        info!(job_id, request_id, "Extended a job's time allocation.");
                        Extended {
                            added,
                            max_time,
                            expiry,
                        }
                    }
                    Err(e) if e.is_conflict() => continue,
                    Err(e) => return Some(Settle::cluster(&e)),
                }
            }
        };
        let event = events::extended(job_id, request_id, applied, at, &h.runner_id);
        return Some(publish(h, m, &event).await);
    }
    Some(Settle::Requeue {
        why: format!("the VolcanoJob of {job_id} kept changing while it was being extended"),
    })
}

/// Why extending the running `job` to `new_expiry` would run into a booking of its nodes' capacity
/// (docs/bookings.md), if it would. A job that has not started has no nodes yet: its booked-node taints
/// keep it off booked capacity whatever its allocation.
async fn into_booking(
    h: &Handler,
    job: &crate::volcano::VolcanoJob,
    new_expiry: Option<jiff::Timestamp>,
) -> Result<Option<String>, ClusterError> {
    let Some(new_expiry) = new_expiry else {
        return Ok(None);
    };
    let Ok(facts) = JobFacts::read(job, &h.keys, &h.config.pipeline) else {
        return Ok(None);
    };
    let Some(old_expiry) = facts.expiry else {
        return Ok(None);
    };
    let all = h.bookings.list().await?;
    if all.is_empty() {
        return Ok(None);
    }
    let namespace = job.metadata.namespace.as_deref().unwrap_or_default();
    let nodes = crate::cluster::bookings::nodes_of(&h.client, namespace, &facts.job_id).await?;
    let found =
        crate::cluster::bookings::in_the_way(&all, &facts.job_id, &nodes, old_expiry, new_expiry);
    Ok(found.map(|b| {
        format!(
            "its node's capacity is booked from {} (job {}): it may run until then, at most {} longer",
            b.start,
            b.job_id,
            crate::pipeline::plugins::expiry::human(b.start.duration_since(old_expiry))
        )
    }))
}

/// What one pass over the pending extensions did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PendingReport {
    /// Answered (applied, or refused now that the job exists) and deleted.
    pub answered: usize,
    /// Their job never came: answered `unknown_job` and deleted.
    pub expired: usize,
    /// Still waiting for their job.
    pub waiting: usize,
}

/// One pass over the extensions that arrived before their job: each whose job now exists is applied
/// (once per request id, whoever else applies it too) and its record deleted; one that expired is
/// answered `unknown_job` and deleted. A record whose answer was not confirmed stays for the next pass.
pub async fn pending_pass(h: &Handler) -> Result<PendingReport, ClusterError> {
    let mut report = PendingReport::default();
    for record in h.pending_extensions.list().await? {
        let request = ExtendJob {
            job_id: record.job_id.clone(),
            request_id: record.request_id.clone(),
            extension: Some(pbjson_types::Duration {
                seconds: record.seconds,
                nanos: record.nanos,
            }),
        };
        let m = Message::internal(
            record.traceparent.as_deref().and_then(TraceParent::parse),
            record.sent_at,
        );
        let settled = match apply_recorded(h, &m, &request).await {
            Some(settle) => settle,
            None if record.is_expired(h.now()) => {
                let at = record.sent_at.unwrap_or(record.recorded_at);
                let event = events::extension_refused(
                    &record.job_id,
                    &record.request_id,
                    reasons::UNKNOWN_JOB,
                    at,
                    &h.runner_id,
                );
                match publish(h, &m, &event).await {
                    Settle::Ack => {
                        report.expired += 1;
                        h.pending_extensions.delete(&record).await?;
                        continue;
                    }
                    other => other,
                }
            }
            None => {
                report.waiting += 1;
                continue;
            }
        };
        match settled {
            Settle::Requeue { why } => {
                report.waiting += 1;
                warn!(
                    job_id = %record.job_id,
                    request_id = %record.request_id,
                    why,
                    "A pending extension could not be applied yet; trying again at the next pass."
                );
            }
            Settle::Ack | Settle::DeadLetter(_) => {
                if let Settle::DeadLetter(reason) = &settled {
                    warn!(
                        job_id = %record.job_id,
                        request_id = %record.request_id,
                        reason = ?reason,
                        "A pending extension was refused."
                    );
                }
                report.answered += 1;
                h.pending_extensions.delete(&record).await?;
            }
        }
    }
    Ok(report)
}

/// Runs [`pending_pass`] every `interval` until `shutdown` completes. A failed pass is logged and tried
/// again at the next interval.
pub async fn run_pending(
    h: std::sync::Arc<Handler>,
    interval: std::time::Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    super::every(interval, shutdown, || async {
        match pending_pass(&h).await {
            Ok(report) if report.answered + report.expired > 0 => info!(
                answered = report.answered,
                expired = report.expired,
                waiting = report.waiting,
                "Applied extensions that arrived before their jobs."
            ),
            Ok(_) => {}
            Err(e) => {
                warn!(error = %e, "The pass over pending extensions failed; trying again later.")
            }
        }
    })
    .await;
}

/// An extension past the longest time allocation is the request's fault, not the job's: the orchestrator
/// gets its answer (`event`, reason `limit_exceeded`), and the message goes to the dead-letter queue like
/// any invalid one, with `text` and the field `extension`.
async fn limit_exceeded(
    h: &Handler,
    m: &Message<'_>,
    event: &crate::messages::v1::JobEvent,
    text: String,
) -> Settle {
    if let Err(e) = h.publish(event, m.traceparent.as_ref()).await {
        return Settle::publish(&e);
    }
    let reason = DeadLetterReason::new(reasons::LIMIT_EXCEEDED, text).with_field("extension");
    Settle::DeadLetter(reason)
}

async fn publish(h: &Handler, m: &Message<'_>, event: &crate::messages::v1::JobEvent) -> Settle {
    match h.publish(event, m.traceparent.as_ref()).await {
        Ok(()) => Settle::Ack,
        Err(e) => Settle::publish(&e),
    }
}

/// A protobuf duration as a signed one; `None` when out of range.
fn to_signed(d: &pbjson_types::Duration) -> Option<SignedDuration> {
    // The proto3 range: about 10,000 years either way.
    const MAX_SECONDS: i64 = 315_576_000_000;
    (d.seconds.abs() <= MAX_SECONDS && d.nanos.abs() < 1_000_000_000)
        .then(|| SignedDuration::new(d.seconds, d.nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_convert_and_are_bounded() {
        let d = pbjson_types::Duration {
            seconds: 3600,
            nanos: 500,
        };
        assert_eq!(to_signed(&d), Some(SignedDuration::new(3600, 500)));
        let huge = pbjson_types::Duration {
            seconds: i64::MAX / 2,
            nanos: 0,
        };
        assert_eq!(to_signed(&huge), None);
    }
}
