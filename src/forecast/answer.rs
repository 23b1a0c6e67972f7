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
}

/// Of the expectations made for jobs that have started since: how many held (the job started by the
/// time told), and how many there were. Told with every expectation, so that a person can judge one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpectationRecord {
    pub held: u64,
    pub made: u64,
}
