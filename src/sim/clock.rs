//! Simulated time. Tests advance it by hand (speed 0), so that no test sleeps through simulated minutes;
//! a standalone simulator runs it at a speed factor (1 = real time, 60 = a minute per second).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use jiff::{SignedDuration, Timestamp};

#[derive(Debug, Clone, Copy)]
struct ClockState {
    /// Simulated instant at `base_real`.
    base_sim: Timestamp,
    base_real: Instant,
    speed: f64,
}

/// The simulator's clock. Cheap to read; shared by the API server, the model and the handle.
#[derive(Debug)]
pub struct SimClock {
    state: Mutex<ClockState>,
}

impl SimClock {
    /// A clock starting at `start`, running at `speed` (0 = only moves when advanced).
    pub fn new(start: Timestamp, speed: f64) -> Self {
        let speed = if speed.is_finite() && speed > 0.0 {
            speed
        } else {
            0.0
        };
        Self {
            state: Mutex::new(ClockState {
                base_sim: start,
                base_real: Instant::now(),
                speed,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ClockState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn now_of(state: &ClockState) -> Timestamp {
        if state.speed == 0.0 {
            return state.base_sim;
        }
        let real = state.base_real.elapsed().as_secs_f64() * state.speed;
        let nanos = (real * 1e9).min(i64::MAX as f64) as i64;
        state
            .base_sim
            .saturating_add(SignedDuration::from_nanos(nanos))
            .unwrap_or(state.base_sim)
    }

    /// The current simulated instant.
    pub fn now(&self) -> Timestamp {
        Self::now_of(&self.lock())
    }

    /// Moves simulated time forward by `by` (in addition to any running speed).
    pub fn advance(&self, by: Duration) -> Timestamp {
        let mut s = self.lock();
        let now = Self::now_of(&s);
        let by = SignedDuration::try_from(by).unwrap_or(SignedDuration::MAX);
        s.base_sim = now.saturating_add(by).unwrap_or(now);
        s.base_real = Instant::now();
        s.base_sim
    }

    /// The speed factor (0 when time only moves by [`SimClock::advance`]).
    pub fn speed(&self) -> f64 {
        self.lock().speed
    }

    /// Changes the speed from now on, keeping the current instant.
    pub fn set_speed(&self, speed: f64) {
        let mut s = self.lock();
        let now = Self::now_of(&s);
        s.base_sim = now;
        s.base_real = Instant::now();
        s.speed = if speed.is_finite() && speed > 0.0 {
            speed
        } else {
            0.0
        };
    }

    /// How long in real time until the simulated instant `at`, or `None` when the clock is stopped.
    pub fn real_until(&self, at: Timestamp) -> Option<Duration> {
        let s = self.lock();
        if s.speed == 0.0 {
            return None;
        }
        let now = Self::now_of(&s);
        let sim = at.duration_since(now);
        if sim.is_negative() {
            return Some(Duration::ZERO);
        }
        // A crawling clock (speed 1e-300) puts the instant beyond any duration: as good as never.
        Some(Duration::try_from_secs_f64(sim.as_secs_f64() / s.speed).unwrap_or(Duration::MAX))
    }
}

/// Formats an instant as Kubernetes `metav1.Time` (RFC 3339, whole seconds).
pub fn format_time(t: Timestamp) -> String {
    Timestamp::from_second(t.as_second())
        .map(|t| t.to_string())
        .unwrap_or_else(|_| t.to_string())
}

/// Formats an instant as `metav1.MicroTime` (RFC 3339 with microseconds).
pub fn format_micro_time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()
}

/// A duration the way `kubectl` prints ages: `45s`, `3m12s`, `5h`, `2d3h`, `40d`.
pub fn human_duration(d: SignedDuration) -> String {
    let secs = d.as_secs().max(0);
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 192 {
        let h = hours % 24;
        return if h == 0 {
            format!("{days}d")
        } else {
            format!("{days}d{h}h")
        };
    }
    if days < 365 * 2 {
        return format!("{days}d");
    }
    format!("{}y", days / 365)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crawling_clock_is_never_due_rather_than_a_panic() {
        let start = Timestamp::from_second(1_767_225_600).unwrap();
        let clock = SimClock::new(start, 1e-300);
        let at = start + SignedDuration::from_hours(1);
        assert_eq!(clock.real_until(at), Some(Duration::MAX));
    }

    #[test]
    fn stopped_clock_moves_only_when_advanced() {
        let start: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let c = SimClock::new(start, 0.0);
        assert_eq!(c.now(), start);
        c.advance(Duration::from_secs(90));
        assert_eq!(
            c.now(),
            "2026-01-01T00:01:30Z".parse::<Timestamp>().unwrap()
        );
        assert_eq!(c.real_until(start), None);
    }

    #[test]
    fn running_clock_goes_at_its_speed() {
        let start: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let c = SimClock::new(start, 1000.0);
        std::thread::sleep(Duration::from_millis(20));
        let elapsed = c.now().duration_since(start);
        assert!(elapsed >= SignedDuration::from_secs(19), "{elapsed:?}");
        let until = c
            .real_until(c.now() + SignedDuration::from_secs(10))
            .unwrap();
        assert!(until <= Duration::from_millis(11), "{until:?}");
    }

    #[test]
    fn formats() {
        let t: Timestamp = "2026-01-01T00:00:00.123456789Z".parse().unwrap();
        assert_eq!(format_time(t), "2026-01-01T00:00:00Z");
        assert_eq!(format_micro_time(t), "2026-01-01T00:00:00.123456Z");
        assert_eq!(human_duration(SignedDuration::from_secs(45)), "45s");
        assert_eq!(human_duration(SignedDuration::from_secs(192)), "3m12s");
        assert_eq!(human_duration(SignedDuration::from_secs(3600 * 5)), "5h");
        assert_eq!(human_duration(SignedDuration::from_secs(3600 * 51)), "2d3h");
    }
}
