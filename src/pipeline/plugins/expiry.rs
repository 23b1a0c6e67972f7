//! Expiry: the time allocation and its enforcement.
//!
//! - At create: `maxTime` (ms) when the job has a time allocation; without one the job never expires.
//! - Start hook: `expiry = jobStart + maxTime`, written once (W4: a restarted runner never moves it).
//! - Monitoring hook: at or after `expiry`, "delete now" (cause `expired`); before it, a status event at
//!   each configured time before expiry (`expiry.warn_before`), once per threshold and expiry; and the
//!   next instant to look again, so timers run from the persisted deadline (W2, W3).
//! - [`extend`]: adds the extension to `maxTime` and, once started, to `expiry` (W21: an increment, never
//!   an absolute value), once per request id (the applied ids are persisted with the new values in one
//!   patch guarded by the resourceVersion, W22).

use jiff::{SignedDuration, Timestamp};

use super::{Plugin, PluginId};
use crate::durable::annotations::format_millis;
use crate::messages::v1::{JobEvent, JobState};
use crate::pipeline::context::Context;
use crate::pipeline::draft::Draft;
use crate::pipeline::hooks::{
    FactsError, HookActions, HookContext, HookError, HookPlan, JobFacts, Outbound,
    TerminationCause, proto_timestamp,
};
use crate::pipeline::{PipelineConfig, PipelineError};
use crate::volcano::VolcanoJob;

/// Reason code of the warning events.
pub const WARNING_REASON: &str = "expiry_warning";

/// The Expiry plugin; the module documentation says what it builds and why.
pub struct Expiry;

impl Plugin for Expiry {
    fn id(&self) -> PluginId {
        PluginId::Expiry
    }

    fn build(&self, cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
        let Some(allocation) = &cx.job.time_allocation else {
            return Ok(());
        };
        let millis =
            i128::from(allocation.seconds) * 1000 + i128::from(allocation.nanos) / 1_000_000;
        if millis <= 0 || allocation.nanos < 0 {
            return Err(PipelineError::invalid("timeAllocation", "must be positive"));
        }
        if millis > MAX_ALLOCATION.as_millis() {
            return Err(PipelineError::invalid(
                "timeAllocation",
                "is longer than the longest time allocation, 100 years (36600 days)",
            ));
        }
        draft.annotate(&cx.keys.max_time, millis.to_string());
        Ok(())
    }

    fn on_start(&self, cx: &HookContext<'_>, out: &mut HookActions) -> Result<(), HookError> {
        let facts = cx.facts;
        if facts.expiry.is_some() {
            return Ok(());
        }
        if let (Some(start), Some(max_time)) = (facts.start, facts.max_time) {
            let expiry = add(start, max_time)?;
            out.set
                .insert(cx.keys.expiry.clone(), format_millis(expiry));
            out.check_at(next_check(expiry, cx.now, &cx.pipeline.expiry.warn_before));
        }
        Ok(())
    }

    fn on_monitoring(&self, cx: &HookContext<'_>, out: &mut HookActions) -> Result<(), HookError> {
        let facts = cx.facts;
        let expiry = match (facts.expiry, facts.start, facts.max_time) {
            (Some(expiry), _, _) => expiry,
            (None, Some(start), Some(max_time)) => {
                // The start hook did not get to write it: do it now.
                let expiry = add(start, max_time)?;
                out.set
                    .insert(cx.keys.expiry.clone(), format_millis(expiry));
                expiry
            }
            _ => return Ok(()),
        };
        match decide(
            expiry,
            cx.now,
            &cx.pipeline.expiry.warn_before,
            facts.expiry_warned.map(|w| (w.expiry, w.before)),
        ) {
            Decision::DeleteNow => out.delete = Some(TerminationCause::Expired),
            Decision::Wait { warn, next_check } => {
                if let Some(before) = warn {
                    out.publish.push(Outbound::Lifecycle(warning_event(
                        &facts.job_id,
                        expiry,
                        before,
                        cx.now,
                    )));
                    out.set.insert(
                        cx.keys.expiry_warned.clone(),
                        format!("{}/{}", expiry.as_millisecond(), before.as_secs()),
                    );
                }
                out.check_at(next_check);
            }
        }
        Ok(())
    }
}

/// What the monitoring hook decides for a job with an expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// `now >= expiry`: delete the job.
    DeleteNow,
    /// Not yet: maybe warn (this long before expiry), and look again at `next_check`.
    Wait {
        /// Warn now: the job expires within this threshold.
        warn: Option<SignedDuration>,
        /// The next instant something changes (a threshold, or the expiry).
        next_check: Timestamp,
    },
}

/// The expiry decision at `now`, given the warning thresholds and the last warning sent
/// (`(expiry it was for, threshold)`). A warning is due for the most urgent threshold crossed, unless one
/// at least as urgent was already sent for this expiry (an extension moves the expiry, so warnings start
/// over).
pub fn decide(
    expiry: Timestamp,
    now: Timestamp,
    warn_before: &[SignedDuration],
    warned: Option<(Timestamp, SignedDuration)>,
) -> Decision {
    if now >= expiry {
        return Decision::DeleteNow;
    }
    let left = expiry.duration_since(now);
    let crossed = warn_before
        .iter()
        .copied()
        .filter(|t| t.is_positive() && left <= *t)
        .min();
    let warn = crossed.filter(|t| !warned.is_some_and(|(e, before)| e == expiry && before <= *t));
    Decision::Wait {
        warn,
        next_check: next_check(expiry, now, warn_before),
    }
}

/// The next instant something changes: the next threshold not yet crossed, else the expiry itself.
fn next_check(expiry: Timestamp, now: Timestamp, warn_before: &[SignedDuration]) -> Timestamp {
    warn_before
        .iter()
        .filter_map(|t| expiry.checked_sub(*t).ok())
        .filter(|at| *at > now)
        .min()
        .unwrap_or(expiry)
        .min(expiry)
}

fn add(at: Timestamp, d: SignedDuration) -> Result<Timestamp, HookError> {
    at.checked_add(d)
        .map_err(|_| HookError::Invalid("expiry is out of range".into()))
}

/// The status event that warns of the expiry, `<jobId>/warning/<expiry ms>/<minutes before>`: an
/// extension moves the expiry, so its warnings get new ids. The content is a pure function of the
/// expiry and the threshold (its timestamp is the instant the threshold was crossed, not when a runner
/// noticed), so a re-publication after a crash is the same message.
pub fn warning_event(
    job_id: &str,
    expiry: Timestamp,
    before: SignedDuration,
    _now: Timestamp,
) -> JobEvent {
    let crossed = expiry.checked_sub(before).unwrap_or(expiry);
    JobEvent {
        event_id: crate::durable::ids::expiry_warning(
            job_id,
            expiry.as_millisecond(),
            before.as_secs() / 60,
        ),
        job_id: job_id.to_owned(),
        state: JobState::Unspecified as i32,
        status: format!("Job expires in {}", human(before)),
        reason: WARNING_REASON.to_owned(),
        expires_at: Some(proto_timestamp(expiry)),
        timestamp: Some(proto_timestamp(crossed)),
        ..JobEvent::default()
    }
}

/// `2 hours`, `30 minutes`, `1 hour 5 minutes`, `45 seconds`.
pub fn human(d: SignedDuration) -> String {
    let secs = d.as_secs().max(0);
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    let unit = |n: i64, one: &str| {
        if n == 1 {
            format!("1 {one}")
        } else {
            format!("{n} {one}s")
        }
    };
    let mut parts = Vec::new();
    if h > 0 {
        parts.push(unit(h, "hour"));
    }
    if m > 0 {
        parts.push(unit(m, "minute"));
    }
    if s > 0 && h == 0 {
        parts.push(unit(s, "second"));
    }
    if parts.is_empty() {
        "0 seconds".into()
    } else {
        parts.join(" ")
    }
}

/// The result of an extension request.
#[derive(Debug, Clone, PartialEq)]
pub enum Extension {
    /// This request id was applied before: nothing to do (acknowledge the message).
    AlreadyApplied,
    /// The job has no time allocation: it never expires, there is nothing to extend.
    NoTimeLimit,
    /// Apply `plan` (a patch guarded by the observed resourceVersion). On 409 Conflict re-read the job and
    /// call [`extend`] again.
    Apply {
        /// The patch to apply.
        plan: Box<HookPlan>,
        /// The new time allocation.
        max_time: SignedDuration,
        /// The new expiry, when the job has started.
        expiry: Option<Timestamp>,
    },
}

/// Why an extension cannot be applied; permanent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExtendError {
    /// The job's annotations are unreadable.
    #[error("{0}")]
    Facts(#[from] FactsError),
    /// Without a request id an extension could not be applied only once.
    #[error("requestId: must not be empty")]
    NoRequestId,
    /// Extensions only add time.
    #[error("extension: must be positive")]
    NotPositive,
    /// The sum does not fit, or is past [`MAX_ALLOCATION`].
    #[error("extension: the new time allocation would be more than 100 years (36600 days)")]
    OutOfRange,
}

/// The longest time allocation, of a submission and after any extensions: 100 years, the bound
/// validation holds submissions and extensions to ([`crate::validate::TIME_ALLOCATION_MAX_SECONDS`]).
/// A technical bound, far above any real job's, so that the start plus the allocation is always a
/// representable instant: an absurd allocation is refused instead of leaving the job with an expiry
/// nobody can compute (and so none at all).
pub const MAX_ALLOCATION: SignedDuration =
    SignedDuration::from_secs(crate::validate::TIME_ALLOCATION_MAX_SECONDS);

/// Extends the job by `extension`, once per `request_id`, against the persisted values.
pub fn extend(
    vcjob: &VolcanoJob,
    config: &(impl AsRef<PipelineConfig> + ?Sized),
    request_id: &str,
    extension: SignedDuration,
) -> Result<Extension, ExtendError> {
    if request_id.is_empty() {
        return Err(ExtendError::NoRequestId);
    }
    if !extension.is_positive() {
        return Err(ExtendError::NotPositive);
    }
    let keys = config.as_ref().keys();
    let facts = JobFacts::read(vcjob, &keys, config)?;
    if facts.extensions.iter().any(|id| id == request_id) {
        return Ok(Extension::AlreadyApplied);
    }
    let Some(max_time) = facts.max_time else {
        return Ok(Extension::NoTimeLimit);
    };
    let max_time = max_time
        .checked_add(extension)
        .filter(|t| *t <= MAX_ALLOCATION)
        .ok_or(ExtendError::OutOfRange)?;
    let expiry = facts
        .expiry
        .map(|e| {
            e.checked_add(extension)
                .map_err(|_| ExtendError::OutOfRange)
        })
        .transpose()?;
    let mut applied = facts.extensions.clone();
    applied.push(request_id.to_owned());
    let keep = config.as_ref().expiry.max_remembered_extensions.max(1);
    if applied.len() > keep {
        applied.drain(..applied.len() - keep);
    }
    let mut plan = HookPlan::new(&facts);
    plan.set
        .insert(keys.max_time.clone(), max_time.as_millis().to_string());
    if let Some(expiry) = expiry {
        plan.set.insert(keys.expiry.clone(), format_millis(expiry));
    }
    plan.set.insert(
        keys.extensions.clone(),
        serde_json::to_string(&applied).unwrap_or_else(|_| "[]".into()),
    );
    Ok(Extension::Apply {
        plan: Box::new(plan),
        max_time,
        expiry,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    const WARN: [SignedDuration; 2] = [SignedDuration::from_mins(30), SignedDuration::from_mins(5)];

    #[test]
    fn delete_at_and_after_expiry() {
        assert_eq!(decide(ts(1000), ts(1000), &WARN, None), Decision::DeleteNow);
        assert_eq!(decide(ts(1000), ts(5000), &WARN, None), Decision::DeleteNow);
    }

    #[test]
    fn warns_once_per_threshold_most_urgent_first() {
        let expiry = ts(10_000);
        // 40 minutes left: nothing yet, look again when 30 minutes are left.
        assert_eq!(
            decide(expiry, ts(10_000 - 2400), &WARN, None),
            Decision::Wait {
                warn: None,
                next_check: ts(10_000 - 1800)
            }
        );
        // 20 minutes left: the 30-minute warning, next look at 5 minutes.
        assert_eq!(
            decide(expiry, ts(10_000 - 1200), &WARN, None),
            Decision::Wait {
                warn: Some(WARN[0]),
                next_check: ts(10_000 - 300)
            }
        );
        // Already warned at 30 minutes for this expiry: no repeat.
        let warned = Some((expiry, WARN[0]));
        assert!(matches!(
            decide(expiry, ts(10_000 - 1100), &WARN, warned),
            Decision::Wait { warn: None, .. }
        ));
        // 3 minutes left, only the 30-minute warning sent: the 5-minute one now; next look at expiry.
        assert_eq!(
            decide(expiry, ts(10_000 - 180), &WARN, warned),
            Decision::Wait {
                warn: Some(WARN[1]),
                next_check: expiry
            }
        );
        // A runner that was away sees 3 minutes left and nothing sent: only the most urgent warning.
        assert!(
            matches!(decide(expiry, ts(10_000 - 180), &WARN, None), Decision::Wait { warn: Some(w), .. } if w == WARN[1])
        );
        // After an extension the expiry moved: warnings start over.
        let moved = ts(20_000);
        assert!(
            matches!(decide(moved, ts(20_000 - 1200), &WARN, Some((expiry, WARN[1]))), Decision::Wait { warn: Some(w), .. } if w == WARN[0])
        );
    }

    #[test]
    fn warning_ids_and_timestamps_follow_the_expiry_not_the_clock() {
        let expiry = ts(10_000);
        let a = warning_event("42", expiry, WARN[1], ts(9_800));
        let b = warning_event("42", expiry, WARN[1], ts(9_900));
        assert_eq!(a, b, "a later look publishes the same message");
        assert_eq!(a.event_id, "42/warning/10000000/5");
        assert_eq!(a.timestamp.unwrap().seconds, 10_000 - 300);
        let moved = warning_event("42", ts(20_000), WARN[1], ts(19_800));
        assert_ne!(moved.event_id, a.event_id, "an extension gives new ids");
    }

    #[test]
    fn human_durations() {
        assert_eq!(human(SignedDuration::from_mins(30)), "30 minutes");
        assert_eq!(human(SignedDuration::from_mins(65)), "1 hour 5 minutes");
        assert_eq!(human(SignedDuration::from_secs(45)), "45 seconds");
        assert_eq!(human(SignedDuration::from_hours(2)), "2 hours");
    }
}
