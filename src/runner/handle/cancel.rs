//! CancelJob: record a tombstone, mark the job `terminationCause=cancelled` (with the reason and the time),
//! end it with Volcano's `TerminateJob` command.
//!
//! The tombstone comes first, for every cancel: it stops a submission that is still in the queue (or is
//! redelivered later), whatever the order in which the two messages are handled (see
//! [`crate::cluster::tombstone`]). Then:
//! - **no job**: CANCELLED is published at once from the tombstone (unless
//!   `runner.announce_cancel_without_job` is off), and the late submission publishes the same event;
//! - **a running or pending job**: `terminationCause`, `terminationReason` and `terminationAt` are written
//!   (guarded by the resourceVersion) *before* the `TerminateJob` command (W11), so the monitor, which
//!   holds the cleanup finalizer, reports CANCELLED with the reason when it cleans up; the runner publishes
//!   nothing for it. The tails of the ranks' logs go with them ([`crate::monitor::end_tails`]): the pods,
//!   and their logs, go when Volcano terminates the job, which itself stays (`Terminated`) as the record
//!   of its submission until its `ttlSecondsAfterFinished`;
//! - **a job that already ended, or is already being deleted for another cause**: nothing changes; its end
//!   is reported by the monitor as it is.
//!
//! Cancelling twice is harmless: the second cancel finds the tombstone and the marked job, and asks for
//! the termination again only while Volcano has not begun it: under the same Command name (AlreadyExists
//! while Volcano has not taken it), never once the job is `Terminating`, so a cancel redelivered after a
//! runner kill creates no second Command.

use tracing::{info, warn};

use crate::cluster::ClusterError;
use crate::messages::v1::CancelJob;
use crate::validate;
use crate::volcano::VolcanoJob;

use super::super::events;
use super::reject::{self, Subject};
use super::{Handler, Message, Settle};
use crate::cluster::jobs::{annotation, is_over};
use crate::durable::ids;

/// Attempts at the guarded write before the message is requeued.
const CONFLICT_ATTEMPTS: usize = 5;

/// Handles one cancel.
pub async fn handle(h: &Handler, m: &Message<'_>, cancel: &CancelJob) -> Settle {
    if let Err(e) = validate::cancel(cancel) {
        let fingerprint16 = ids::body_fingerprint16(m.body);
        let subject = Subject {
            job_id: &cancel.job_id,
            is_submission: false,
            fingerprint16: &fingerprint16,
        };
        return reject::invalid_by(h, m, subject, &e).await;
    }
    let job_id = cancel.job_id.as_str();
    // Cut, never refused: a cancel always cancels, whatever its reason's length.
    let reason = validate::text::cancel_reason(cancel.reason.as_deref().unwrap_or_default());
    let reason = reason.as_str();
    let tombstone = match h.tombstones.record(job_id, reason, h.now()).await {
        Ok(t) => t,
        Err(e) => return Settle::cluster(&e),
    };
    // A booking is freed at once, before the job ends: its capacity can be booked again now.
    if let Err(settle) = super::booking::cancel(h, m, job_id).await {
        return settle;
    }
    let mut job = match h.jobs.find(job_id).await {
        Ok(Some(job)) => job,
        Ok(None) => {
            info!(job_id, "Cancelled a job that has not been submitted (yet).");
            if !h.config.runner.announce_cancel_without_job {
                return Settle::Ack;
            }
            let event = events::cancelled_without_job(&tombstone, &h.runner_id);
            return match h.publish(&event, m.traceparent.as_ref()).await {
                Ok(()) => Settle::Ack,
                Err(e) => Settle::publish(&e),
            };
        }
        Err(e) => return Settle::cluster(&e),
    };
    for _ in 0..CONFLICT_ATTEMPTS {
        match decide(h, &job) {
            Decision::Leave => return Settle::Ack,
            Decision::Terminate => {
                return match h.jobs.terminate(&job).await {
                    Ok(()) => Settle::Ack,
                    Err(e) => Settle::cluster(&e),
                };
            }
            Decision::Mark => {}
        }
        let mut annotations = serde_json::json!({
            h.keys.termination_cause.as_str(): "cancelled",
            h.keys.termination_reason.as_str(): tombstone.reason,
            h.keys.termination_at.as_str(): crate::durable::annotations::format_millis(h.now()),
        });
        // The logs' tails, read before the pods go (W15), for the CANCELLED event.
        let budget = crate::monitor::end_tails::Budget::of(&h.config);
        if let Some((key, tails)) =
            crate::monitor::end_tails::snapshot(&h.client, &job, &h.keys.prefix, budget).await
        {
            annotations[key] = serde_json::Value::String(tails);
        }
        let patch = serde_json::json!({
            "metadata": {
                "resourceVersion": job.metadata.resource_version,
                "annotations": annotations,
            }
        });
        match h.jobs.patch(&job, &patch).await {
            Ok(marked) => {
                info!(job_id, "Cancelling a job.");
                return match h.jobs.terminate(&marked).await {
                    Ok(()) => Settle::Ack,
                    Err(e) => Settle::cluster(&e),
                };
            }
            Err(e) if e.is_conflict() => match h.jobs.find(job_id).await {
                Ok(Some(fresh)) => job = fresh,
                // Gone meanwhile: its end has been reported by whoever removed it.
                Ok(None) => return Settle::Ack,
                Err(e) => return Settle::cluster(&e),
            },
            Err(e @ ClusterError::Rejected { .. }) => {
                return refused_mark(h, m, job_id, &job, &e).await;
            }
            Err(e) => return Settle::cluster(&e),
        }
    }
    Settle::Requeue {
        why: format!("the VolcanoJob of {job_id} kept changing while it was being cancelled"),
    }
}

/// The cluster refused the cancel's annotations for good (not their size: the reason is bounded). A
/// cancel still cancels: the cause alone is recorded if the cluster takes that, the job is terminated either
/// way, and the orchestrator hears about the refusal (naming `reason` when the cause alone was taken).
async fn refused_mark(
    h: &Handler,
    m: &Message<'_>,
    job_id: &str,
    job: &VolcanoJob,
    e: &ClusterError,
) -> Settle {
    warn!(job_id, error = %e, "The cluster refused the cancel's annotations; cancelling without them.");
    let cause_only = serde_json::json!({
        "metadata": {
            "resourceVersion": job.metadata.resource_version,
            "annotations": {
                h.keys.termination_cause.as_str(): "cancelled",
                h.keys.termination_at.as_str(): crate::durable::annotations::format_millis(h.now()),
            }
        }
    });
    let field = match h.jobs.patch(job, &cause_only).await {
        Ok(_) => "reason",
        Err(_) => "jobId",
    };
    if let Err(e) = h.jobs.terminate(job).await {
        return Settle::cluster(&e);
    }
    let fingerprint16 = ids::body_fingerprint16(m.body);
    let subject = Subject {
        job_id,
        is_submission: false,
        fingerprint16: &fingerprint16,
    };
    reject::cluster_refused(h, m, subject, Some(field), e).await
}

/// What a cancel does to an existing job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    /// Write the cause, then terminate.
    Mark,
    /// The cause is written already (an earlier cancel, a claim by a late submission): terminate, unless
    /// Volcano is at it already.
    Terminate,
    /// The job has ended by itself, or is being removed for another cause: leave it.
    Leave,
}

fn decide(h: &Handler, job: &VolcanoJob) -> Decision {
    match annotation(job, &h.keys.termination_cause) {
        Some("cancelled") => Decision::Terminate,
        Some(_) => Decision::Leave,
        None if is_over(job, &h.keys) => Decision::Leave,
        None => Decision::Mark,
    }
}
