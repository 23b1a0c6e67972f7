//! Per-job deadlines: one pending instant per job, the earliest first. Used twice: for the next check each
//! decision asks for (in the clock's time: expiry, warnings, the next tick), and for retries after a
//! failure (in real time, with backoff). Timers fire whatever the event traffic (W2): the loop sleeps
//! until the earliest one as one of its branches. And the jobs waiting to be decided ([`Waiting`]), in
//! two lanes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;
use std::time::Duration;

use super::keys::FastMap;

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

/// The lane a job waits in to be decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Decided once the loop's hold (`coalesce`, or `defer_under_load` while the submit path is busy)
    /// has passed since it came.
    Ready,
    /// Decided once `coalesce` has passed, however busy the submit path: a job whose QUEUED its monitor
    /// is to tell (the job's user waits for it as for the submit path's own).
    Urgent,
}

/// Jobs waiting to be decided, each in one lane at most, in the order they came to it, with when. A job
/// that comes again keeps its place, except that one moved from [`Lane::Ready`] to [`Lane::Urgent`]
/// leaves the first for the end of the second (never the other way: once urgent, it is decided as
/// such).
#[derive(Debug)]
pub struct Waiting<K, T> {
    lanes: [BTreeMap<u64, (K, T)>; 2],
    /// Each waiting job's lane and place in it.
    places: FastMap<K, (Lane, u64)>,
    /// The next place given (places only grow, so a lane's order is the order jobs came to it).
    next: u64,
}

impl<K, T> Default for Waiting<K, T> {
    fn default() -> Self {
        Self {
            lanes: [BTreeMap::new(), BTreeMap::new()],
            places: FastMap::default(),
            next: 0,
        }
    }
}

impl<K: Clone + Eq + Hash, T: Copy> Waiting<K, T> {
    fn lane(&mut self, lane: Lane) -> &mut BTreeMap<u64, (K, T)> {
        &mut self.lanes[lane as usize]
    }

    /// `key` waits in `lane` from `at` on, unless it waits already: in the same lane, or urgent, it
    /// keeps its place; waiting ready and now urgent, it moves to the end of the urgent lane.
    pub fn push(&mut self, key: K, lane: Lane, at: T) {
        match self.places.get(&key).copied() {
            Some((Lane::Ready, place)) if lane == Lane::Urgent => {
                self.lane(Lane::Ready).remove(&place);
            }
            Some(_) => return,
            None => {}
        }
        let place = self.next;
        self.next += 1;
        self.lane(lane).insert(place, (key.clone(), at));
        self.places.insert(key, (lane, place));
    }

    /// When the first job of `lane` came.
    pub fn first(&self, lane: Lane) -> Option<T> {
        self.lanes[lane as usize]
            .first_key_value()
            .map(|(_, (_, at))| *at)
    }

    /// Takes the first job of `lane`: it waits no more.
    pub fn pop(&mut self, lane: Lane) -> Option<K> {
        let (_, (key, _)) = self.lane(lane).pop_first()?;
        self.places.remove(&key);
        Some(key)
    }

    /// The lane `key` waits in.
    pub fn lane_of(&self, key: &K) -> Option<Lane> {
        self.places.get(key).map(|(lane, _)| *lane)
    }

    /// How many jobs wait, in both lanes.
    pub fn len(&self) -> usize {
        self.places.len()
    }

    /// Whether no job waits.
    pub fn is_empty(&self) -> bool {
        self.places.is_empty()
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

    /// A job is in one lane at most: one that becomes urgent leaves the ready lane (it is not decided a
    /// second time from there), and one that comes again keeps its place.
    #[test]
    fn a_job_waits_in_one_lane_at_most() {
        let mut w: Waiting<&str, u32> = Waiting::default();
        w.push("a", Lane::Ready, 1);
        w.push("b", Lane::Ready, 2);
        w.push("a", Lane::Ready, 3);
        assert_eq!(w.first(Lane::Ready), Some(1), "came again: keeps its place");
        w.push("a", Lane::Urgent, 4);
        assert_eq!(w.lane_of(&"a"), Some(Lane::Urgent));
        assert_eq!(w.len(), 2, "moved, not copied");
        assert_eq!(w.first(Lane::Ready), Some(2));
        assert_eq!(w.first(Lane::Urgent), Some(4));
        w.push("a", Lane::Ready, 5);
        assert_eq!(w.lane_of(&"a"), Some(Lane::Urgent), "once urgent, stays so");
        assert_eq!(w.pop(Lane::Urgent), Some("a"));
        assert_eq!(w.pop(Lane::Urgent), None);
        assert_eq!(w.pop(Lane::Ready), Some("b"));
        assert_eq!(w.pop(Lane::Ready), None, "no stale entry of a");
        assert!(w.is_empty());
        w.push("a", Lane::Ready, 6);
        assert_eq!(w.first(Lane::Ready), Some(6), "waits again once taken");
    }
}
