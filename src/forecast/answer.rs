//! What the forecast tells of a waiting job: when it starts, and whether that is a promise.

use jiff::Timestamp;

/// When a pending job will start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Estimate {
    /// At this instant at the latest, while the queue ahead does not grow. `basis` says why in one line.
    ///
    /// `bound`: the scheduler keeps the order the replay assumes for this job (it reserves for it, see
    /// [`Pending::bound`]), so it is an upper bound; otherwise it is what the replay expects, and jobs
    /// behind it that start in gaps first can make it later.
    At {
        start: Timestamp,
        basis: String,
        bound: bool,
        /// With an expectation: how often earlier expectations held, where the monitor has a record.
        record: Option<ExpectationRecord>,
    },
    /// It can never run here: a rank, or the whole gang, is larger than the cluster even when empty.
    Never { why: String },
    /// No bound: a job it waits for (running or ahead) has no time limit.
    Unbounded { why: String },
    /// It will not have started by `at`, when the runner fails it (`[monitor] queue_timeout`): a start
    /// after that would never come, so it is not told one. `why`: in one line, with `at`.
    TimesOut { at: Timestamp, why: String },
}

/// Of the expectations made for jobs that have started since: how many held (the job started by the
/// time told), and how many there were. Told with every expectation, so that a person can judge one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpectationRecord {
    pub held: u64,
    pub made: u64,
}

/// What a bound's basis ends with: what could still make it later.
pub const LATER_ONLY: &str = " (later only if a job of higher priority arrives or a node fails)";

/// A bound's basis worded as an expectation's, for a bound withdrawn after the replay made it (another
/// queue has jobs, or the telling keeps an expectation): `by T at the latest: ...` becomes `expected by
/// T, not promised: ...`, and nothing of it reads "at the latest" any more. The words follow the flag,
/// so that a person reading only the text is not promised what the flag withdrew.
pub fn as_expectation(basis: &str) -> String {
    let plain = basis.replacen(LATER_ONLY, "", 1);
    if let Some(rest) = plain.strip_prefix("by ")
        && let Some((at, tail)) = rest.split_once(" at the latest: ")
    {
        return format!("expected by {at}, not promised: {tail}");
    }
    plain
        .replace(" at the latest:", ":")
        .replace(" at the latest", "")
        .replace("(by ", "(expected by ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_withdrawn_bound_reads_as_an_expectation() {
        let bound = format!(
            "by 2026-11-25T14:05:00Z at the latest: 2 of 3 running jobs end by then at their time \
             limits{LATER_ONLY}; held back by the maintenance window w until 2026-11-25T15:00:00Z"
        );
        assert_eq!(
            as_expectation(&bound),
            "expected by 2026-11-25T14:05:00Z, not promised: 2 of 3 running jobs end by then at \
             their time limits; held back by the maintenance window w until 2026-11-25T15:00:00Z"
        );
        let free = "its resources are free now (by 2026-11-25T14:05:10Z at the latest: the time the \
                    scheduler takes to place it)";
        assert_eq!(
            as_expectation(free),
            "its resources are free now (expected by 2026-11-25T14:05:10Z: the time the scheduler \
             takes to place it)"
        );
        assert_eq!(
            as_expectation("its resources are free now"),
            "its resources are free now"
        );
    }
}
