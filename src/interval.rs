//! Spans of time, `[start, end)`, and the little arithmetic over them that the bookings (what a booking
//! overlaps), the maintenance windows (what a window is in the way of) and the start-time replay (when
//! a window cuts a job) share. Pure, and below all of them: it knows nothing of bookings, windows or
//! jobs, only of instants, so the cluster room and the forecast room read one definition of "overlaps"
//! instead of each spelling it out.
//!
//! Spans are half-open: one that ends at an instant and one that starts at it do not overlap (a job whose
//! allocation ends when a booking starts leaves the booking its room). An end of `None` is never: a job
//! without a time limit runs on for good.

use jiff::{SignedDuration, Timestamp};

/// `[start, end)`; `end: None` never ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span<T> {
    pub start: T,
    pub end: Option<T>,
}

impl<T: Ord + Copy> Span<T> {
    /// `[start, end)`.
    pub fn new(start: T, end: T) -> Self {
        Self {
            start,
            end: Some(end),
        }
    }

    /// `[start, end)`, or from `start` on for good when `end` is `None`.
    pub fn until(start: T, end: Option<T>) -> Self {
        Self { start, end }
    }

    /// Whether the two share an instant.
    pub fn overlaps(&self, other: &Span<T>) -> bool {
        self.end.is_none_or(|e| other.start < e) && other.end.is_none_or(|e| self.start < e)
    }

    /// Whether `t` lies within it.
    pub fn contains(&self, t: T) -> bool {
        self.start <= t && self.end.is_none_or(|e| t < e)
    }
}

impl Span<Timestamp> {
    /// From `start` for `length` (`None`, or past the end of time: for good).
    pub fn lasting(start: Timestamp, length: Option<SignedDuration>) -> Self {
        Self::until(start, length.and_then(|d| start.checked_add(d).ok()))
    }
}

/// The earlier of two instants either of which may be unset (`None`: the other one, if any).
pub fn earliest<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn spans_that_only_touch_do_not_overlap() {
        let a = Span::new(t(0), t(10));
        assert!(a.overlaps(&Span::new(t(5), t(15))));
        assert!(Span::new(t(5), t(15)).overlaps(&a), "either way round");
        assert!(a.overlaps(&Span::new(t(2), t(3))), "one within the other");
        assert!(!a.overlaps(&Span::new(t(10), t(20))), "starts at its end");
        assert!(!Span::new(t(10), t(20)).overlaps(&a));
        assert!(!a.overlaps(&Span::new(t(-10), t(0))), "ends at its start");
        assert!(!a.overlaps(&Span::new(t(11), t(12))));
    }

    #[test]
    fn a_span_without_an_end_runs_on_for_good() {
        let forever = Span::until(t(100), None);
        assert!(forever.overlaps(&Span::new(t(1_000_000), t(1_000_001))));
        assert!(
            !forever.overlaps(&Span::new(t(0), t(100))),
            "ends at its start"
        );
        assert!(forever.overlaps(&Span::new(t(0), t(101))));
        assert!(forever.overlaps(&Span::until(t(0), None)));
        assert!(!Span::new(t(0), t(100)).overlaps(&forever));
    }

    #[test]
    fn contains_its_start_not_its_end() {
        let a = Span::new(t(0), t(10));
        assert!(a.contains(t(0)));
        assert!(a.contains(t(9)));
        assert!(!a.contains(t(10)));
        assert!(!a.contains(t(-1)));
        assert!(Span::until(t(0), None).contains(t(1_000_000)));
    }

    #[test]
    fn lasting_a_length_or_for_good() {
        let d = SignedDuration::from_secs(60);
        assert_eq!(Span::lasting(t(0), Some(d)), Span::new(t(0), t(60)));
        assert_eq!(Span::lasting(t(0), None), Span::until(t(0), None));
        assert_eq!(
            Span::lasting(t(0), Some(SignedDuration::MAX)).end,
            None,
            "past the end of time: for good"
        );
    }

    #[test]
    fn the_earliest_of_two_maybe_unset() {
        assert_eq!(earliest(Some(t(5)), Some(t(3))), Some(t(3)));
        assert_eq!(earliest(Some(t(5)), None), Some(t(5)));
        assert_eq!(earliest(None, Some(t(3))), Some(t(3)));
        assert_eq!(earliest::<Timestamp>(None, None), None);
    }
}
