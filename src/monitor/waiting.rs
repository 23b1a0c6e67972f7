//! The jobs waiting to be decided, in two lanes: the loop decides a job only once it has waited its hold
//! (so a burst of events about one job makes one decision), and the lane says which hold applies (a job
//! whose QUEUED its user still waits for is not held back by a busy submit path).

use std::collections::BTreeMap;
use std::hash::Hash;

use super::keys::FastMap;

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
