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

/// A clock that moves only when a test moves it: the monitor's unit tests decide on simulated minutes
/// without sleeping and without the simulator.
#[cfg(test)]
#[derive(Debug)]
pub struct ManualClock(std::sync::Mutex<Timestamp>);

#[cfg(test)]
impl ManualClock {
    pub fn at(now: Timestamp) -> Self {
        Self(std::sync::Mutex::new(now))
    }

    pub fn advance(&self, by: Duration) {
        let mut now = self.0.lock().unwrap();
        *now = now.checked_add(by).expect("in range");
    }
}

#[cfg(test)]
impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap()
    }

    fn real_until(&self, _: Timestamp) -> Option<Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_moved() {
        let start: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let clock = ManualClock::at(start);
        assert_eq!(clock.now(), start);
        clock.advance(Duration::from_secs(90));
        assert_eq!(clock.now(), start + jiff::SignedDuration::from_secs(90));
        assert_eq!(clock.real_until(start), None, "it does not run by itself");
    }

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
