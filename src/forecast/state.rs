//! The replay's own bookkeeping as it moves forward in time: when what a job holds comes back.

use jiff::Timestamp;

/// An instant when resources come back: `(when, what)`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct End {
    pub(crate) at: Timestamp,
    /// Index into `holdings`.
    pub(crate) holding: usize,
}
