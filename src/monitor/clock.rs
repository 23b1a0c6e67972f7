//! Where the monitor's "now" comes from.
//!
//! Every decision the monitor makes is a pure function of what it observed and of `now`; this trait is the
//! one place `now` comes from. Production uses [`SystemClock`]; tests hand in the simulator's clock, which
//! only moves when a test advances it, so simulated minutes pass without anyone sleeping.

use std::fmt;
use std::time::Duration;

use jiff::Timestamp;

/// A source of the current instant, and of how long to sleep (in real time) until a later one.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current instant.
    fn now(&self) -> Timestamp;

    /// How long, in real time, until `at` has come; zero when it has. `None` when the clock does not run
    /// by itself (a simulated clock that tests advance by hand): the monitor then looks again after its
    /// poll interval.
    fn real_until(&self, at: Timestamp) -> Option<Duration>;
}

/// The system's real-time clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }

    fn real_until(&self, at: Timestamp) -> Option<Duration> {
        let left = at.duration_since(Timestamp::now());
        Some(Duration::try_from(left).unwrap_or(Duration::ZERO))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_sleeps_until_the_instant() {
        let clock = SystemClock;
        let now = clock.now();
        let later = now + jiff::SignedDuration::from_secs(30);
        let wait = clock.real_until(later).unwrap();
        assert!(wait <= Duration::from_secs(30) && wait > Duration::from_secs(29));
        assert_eq!(
            clock.real_until(now - jiff::SignedDuration::from_secs(1)),
            Some(Duration::ZERO)
        );
    }
}
