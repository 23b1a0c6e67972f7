//! How far behind a job's accounting is, for the `accounting_lag_seconds` gauge: the time since its
//! oldest unpublished tick became due. A tick is due at its end plus `[pipeline.accounting] settle`
//! (the monitor charges it then, docs/monitor.md); the final tick of an ended job at the end plus the
//! settle delay. Read from the job's record alone, once per reconciliation pass, so a job whose ticks
//! stopped (failing patches, an unconfirmed publish, a stuck worker) shows however long it stays stuck.

use jiff::{SignedDuration, Timestamp};

use crate::durable::AnnotationKeys;
use crate::durable::annotations::parse_millis;
use crate::volcano::VolcanoJob;

/// How long the job's oldest unpublished tick has been due at `now` (zero when none is), or `None` when
/// the job is not being charged (never started, or its final tick is published).
pub fn overdue(
    job: &VolcanoJob,
    keys: &AnnotationKeys,
    default_period: SignedDuration,
    settle: SignedDuration,
    now: Timestamp,
) -> Option<SignedDuration> {
    let a = job.metadata.annotations.as_ref()?;
    let start = parse_millis(a.get(&keys.job_start)?)?;
    if a.get(&keys.accounting_final).map(String::as_str) == Some("true") {
        return None;
    }
    let period = a
        .get(&keys.accounting_period)
        .and_then(|v| v.trim().parse::<i64>().ok())
        .filter(|p| *p > 0)
        .map_or(default_period, SignedDuration::from_millis);
    let ticks: i64 = a
        .get(&keys.accounted_ticks)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut due = start
        .checked_add(period.checked_mul(i32::try_from(ticks + 1).ok()?)?)
        .ok()?;
    // An ended job's last tick ends at its end (decided and recorded before it is published).
    if let Some(outcome) = a.get(&keys.outcome)
        && let Ok(outcome) = serde_json::from_str::<super::record::Outcome>(outcome)
    {
        due = due.min(outcome.ended());
    }
    let due = due.checked_add(settle).ok()?;
    Some(now.duration_since(due).max(SignedDuration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(pairs: &[(&str, &str)]) -> VolcanoJob {
        let mut job = VolcanoJob::default();
        job.metadata.annotations = Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        job
    }

    #[test]
    fn a_tick_is_late_from_its_end_plus_the_settle_delay() {
        let k = AnnotationKeys::new("ucloud.dk/");
        let minute = SignedDuration::from_secs(60);
        let settle = SignedDuration::from_secs(10);
        let at = |s: i64| Timestamp::from_second(s).unwrap();
        let running = job(&[
            (&k.job_start, "100000"),
            (&k.accounting_period, "60000"),
            (&k.accounted_ticks, "2"),
        ]);
        // Tick 2 covers [220 s, 280 s): due at 290 s.
        let lag = |now| overdue(&running, &k, minute, settle, at(now));
        assert_eq!(lag(250), Some(SignedDuration::ZERO));
        assert_eq!(lag(290), Some(SignedDuration::ZERO));
        assert_eq!(lag(395), Some(SignedDuration::from_secs(105)));

        // Ended at 230 s: its final tick was due at 240 s.
        let outcome = r#"{"state":"SUCCESS","reason":"success","status":"ok","startedAt":100000,"endedAt":230000}"#;
        let ended = job(&[
            (&k.job_start, "100000"),
            (&k.accounted_ticks, "2"),
            (&k.outcome, outcome),
        ]);
        assert_eq!(
            overdue(&ended, &k, minute, settle, at(300)),
            Some(SignedDuration::from_secs(60))
        );
        // Charged in full, or never started: not counted.
        let done = job(&[(&k.job_start, "100000"), (&k.accounting_final, "true")]);
        assert_eq!(overdue(&done, &k, minute, settle, at(900)), None);
        assert_eq!(overdue(&job(&[]), &k, minute, settle, at(900)), None);
    }
}
