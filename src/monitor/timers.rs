//! Per-job deadlines: one pending instant per job, the earliest first. Used twice: for the next check each
//! decision asks for (in the clock's time: expiry, warnings, the next tick), and for retries after a
//! failure (in real time, with backoff). Timers fire whatever the event traffic (W2): the loop sleeps
//! until the earliest one as one of its branches.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::time::Duration;

/// How often the start-time estimates are made again while things change: often enough that a job
/// is told its estimate with its first status event, seldom enough that a busy cluster does not replay
/// the queue on every event.
pub const ESTIMATE_EVERY: jiff::SignedDuration = jiff::SignedDuration::from_secs(2);

/// At most one instant per key.
#[derive(Debug)]
pub struct Deadlines<K, T> {
    order: BTreeSet<(T, K)>,
    at: HashMap<K, T>,
}

impl<K, T> Default for Deadlines<K, T> {
    fn default() -> Self {
        Self {
            order: BTreeSet::new(),
            at: HashMap::new(),
        }
    }
}

impl<K: Clone + Ord + Hash, T: Copy + Ord> Deadlines<K, T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the key's instant (replacing the one it had), or clears it with `None`.
    pub fn set(&mut self, key: &K, at: Option<T>) {
        if let Some(old) = self.at.remove(key) {
            self.order.remove(&(old, key.clone()));
        }
        if let Some(at) = at {
            self.at.insert(key.clone(), at);
            self.order.insert((at, key.clone()));
        }
    }

    /// Keeps the earlier of the key's instant and `at`.
    pub fn set_earliest(&mut self, key: &K, at: T) {
        match self.at.get(key) {
            Some(old) if *old <= at => {}
            _ => self.set(key, Some(at)),
        }
    }

    /// The earliest instant.
    pub fn next(&self) -> Option<T> {
        self.order.first().map(|(t, _)| *t)
    }

    /// Removes and returns every key whose instant is at or before `now`.
    pub fn pop_due(&mut self, now: T) -> Vec<K> {
        let mut due = Vec::new();
        while let Some((t, _)) = self.order.first()
            && *t <= now
        {
            if let Some((_, key)) = self.order.pop_first() {
                self.at.remove(&key);
                due.push(key);
            }
        }
        due
    }

    pub fn get(&self, key: &K) -> Option<T> {
        self.at.get(key).copied()
    }

    pub fn len(&self) -> usize {
        self.at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }
}

/// Exponential backoff per key: `min · 2^failures`, capped at `max`.
#[derive(Debug)]
pub struct Backoff<K> {
    failures: HashMap<K, u32>,
    min: Duration,
    max: Duration,
}

impl<K: Clone + Eq + Hash> Backoff<K> {
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            failures: HashMap::new(),
            min,
            max,
        }
    }

    /// Counts a failure and returns how long to wait before the next try.
    pub fn fail(&mut self, key: &K) -> Duration {
        let n = self.failures.entry(key.clone()).or_insert(0);
        let delay = self
            .min
            .checked_mul(1u32 << (*n).min(20))
            .unwrap_or(self.max)
            .min(self.max);
        *n = n.saturating_add(1);
        delay
    }

    /// A success: the next failure starts from `min` again.
    pub fn succeed(&mut self, key: &K) {
        self.failures.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_one_per_key() {
        let mut d: Deadlines<&str, u32> = Deadlines::new();
        d.set(&"a", Some(30));
        d.set(&"b", Some(10));
        d.set(&"a", Some(20));
        assert_eq!(d.next(), Some(10));
        assert_eq!(d.len(), 2);
        d.set_earliest(&"b", 15);
        assert_eq!(d.get(&"b"), Some(10));
        d.set_earliest(&"b", 5);
        assert_eq!(d.get(&"b"), Some(5));
        assert_eq!(d.pop_due(19), vec!["b"]);
        assert_eq!(d.pop_due(25), vec!["a"]);
        assert!(d.is_empty());
        d.set(&"c", Some(1));
        d.set(&"c", None);
        assert_eq!(d.next(), None);
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        assert_eq!(b.fail(&1), Duration::from_secs(1));
        assert_eq!(b.fail(&1), Duration::from_secs(2));
        assert_eq!(b.fail(&1), Duration::from_secs(4));
        assert_eq!(b.fail(&1), Duration::from_secs(5));
        b.succeed(&1);
        assert_eq!(b.fail(&1), Duration::from_secs(1));
    }
}
