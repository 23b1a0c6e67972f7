//! Volcano's `proportion` plugin: what each queue deserves of the cluster, and in which order the
//! queues are served. At the start of a session every queue that has jobs gets a `deserved` share by
//! water-filling the cluster's allocatable resources by `spec.weight`: a queue never deserves more than
//! it requests (what it holds plus what its enqueued gangs still need) nor more than its `capability`,
//! and what one queue does not need is shared among the others, round after round until nothing
//! changes. The enqueue and allocate actions then serve the queue with the lowest share
//! (allocated / deserved) first, and allocate skips a queue that is overused (it holds at least what it
//! deserves in every resource). Pure: the scheduler feeds it and applies the order.

use std::collections::BTreeMap;

use crate::sim::quantity::Resources;

/// The resources proportion weighs: everything a pod requests but the pod count.
fn dims(r: &Resources) -> impl Iterator<Item = (&String, f64)> {
    r.0.iter()
        .filter(|(k, _)| k.as_str() != "pods")
        .map(|(k, v)| (k, *v as f64))
}

/// Below this (in milli-units) two amounts are the same: Volcano compares with a small tolerance too.
const TOLERANCE: f64 = 1.0;

/// One queue's inputs and what it deserves.
#[derive(Debug, Clone, Default)]
pub(super) struct QueueShare {
    pub weight: f64,
    pub capability: Option<Resources>,
    /// Requests of the queue's bound pods.
    pub allocated: Resources,
    /// `allocated` plus what its enqueued gangs still need.
    pub request: Resources,
    /// Set by [`deserve`].
    pub deserved: BTreeMap<String, f64>,
}

impl QueueShare {
    /// The queue's share: the largest of allocated / deserved over the resources (a resource it deserves
    /// none of counts 1 when it holds some, 0 otherwise).
    pub fn share(&self) -> f64 {
        dims(&self.allocated)
            .map(|(k, a)| {
                let d = self.deserved.get(k).copied().unwrap_or(0.0);
                if d <= 0.0 {
                    if a > 0.0 { 1.0 } else { 0.0 }
                } else {
                    a / d
                }
            })
            .fold(0.0, f64::max)
    }

    /// Overused: it deserves no more than it holds, in every resource.
    pub fn overused(&self) -> bool {
        self.deserved
            .iter()
            .all(|(k, d)| *d <= self.allocated.get(k) as f64 + TOLERANCE)
    }
}

/// Water-fills `total` over the queues by weight (see the module's doc), setting each `deserved`.
pub(super) fn deserve(total: &Resources, queues: &mut BTreeMap<String, QueueShare>) {
    let mut remaining: BTreeMap<String, f64> = dims(total).map(|(k, v)| (k.clone(), v)).collect();
    for q in queues.values_mut() {
        q.deserved = remaining.keys().map(|k| (k.clone(), 0.0)).collect();
    }
    let mut met: Vec<String> = Vec::new();
    // Each round either meets a queue or leaves `remaining` smaller; the bound only guards rounding.
    for _ in 0..64 {
        let weight: f64 = queues
            .iter()
            .filter(|(n, _)| !met.contains(n))
            .map(|(_, q)| q.weight.max(0.0))
            .sum();
        if weight <= 0.0 {
            break;
        }
        let before = remaining.clone();
        let mut given: BTreeMap<String, f64> = BTreeMap::new();
        let mut newly_met = Vec::new();
        for (name, q) in queues.iter_mut().filter(|(n, _)| !met.contains(n)) {
            let part = q.weight.max(0.0) / weight;
            for (k, rest) in &before {
                let d = q.deserved.entry(k.clone()).or_insert(0.0);
                let old = *d;
                let mut new = old + rest * part;
                if let Some(cap) = q.capability.as_ref().filter(|c| c.0.contains_key(k)) {
                    new = new.min(cap.get(k) as f64);
                }
                new = new.min(q.request.get(k) as f64).max(old);
                *d = new;
                *given.entry(k.clone()).or_insert(0.0) += new - old;
            }
            let wants_more = dims(&q.request)
                .any(|(k, r)| r > q.deserved.get(k).copied().unwrap_or(0.0) + TOLERANCE);
            if !wants_more {
                newly_met.push(name.clone());
            }
        }
        met.extend(newly_met);
        for (k, g) in given {
            if let Some(r) = remaining.get_mut(&k) {
                *r = (*r - g).max(0.0);
            }
        }
        let unchanged = remaining
            .iter()
            .all(|(k, r)| (r - before.get(k).copied().unwrap_or(0.0)).abs() < TOLERANCE);
        if unchanged || remaining.values().all(|r| *r < TOLERANCE) {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(n: i128) -> Resources {
        Resources([("cpu".to_string(), n * 1000)].into_iter().collect())
    }

    fn queue(weight: f64, allocated: i128, request: i128) -> QueueShare {
        QueueShare {
            weight,
            allocated: cpu(allocated),
            request: cpu(request),
            ..QueueShare::default()
        }
    }

    fn deserved(q: &QueueShare) -> f64 {
        (q.deserved["cpu"] / 1000.0).round()
    }

    #[test]
    fn two_queues_that_want_everything_split_it_by_weight() {
        let mut qs: BTreeMap<String, QueueShare> = [
            ("a".into(), queue(1.0, 8, 12)),
            ("b".into(), queue(3.0, 0, 12)),
        ]
        .into();
        deserve(&cpu(8), &mut qs);
        assert_eq!(deserved(&qs["a"]), 2.0);
        assert_eq!(deserved(&qs["b"]), 6.0);
        assert!(qs["a"].overused());
        assert!(!qs["b"].overused());
        assert!(qs["b"].share() < qs["a"].share());
    }

    #[test]
    fn what_a_queue_does_not_request_goes_to_the_others() {
        let mut qs: BTreeMap<String, QueueShare> = [
            ("a".into(), queue(1.0, 0, 12)),
            ("b".into(), queue(3.0, 1, 1)),
        ]
        .into();
        deserve(&cpu(8), &mut qs);
        assert_eq!(deserved(&qs["b"]), 1.0);
        assert_eq!(deserved(&qs["a"]), 7.0);
    }

    #[test]
    fn capability_caps_what_a_queue_deserves() {
        let mut capped = queue(3.0, 0, 12);
        capped.capability = Some(cpu(3));
        let mut qs: BTreeMap<String, QueueShare> =
            [("a".into(), queue(1.0, 0, 12)), ("b".into(), capped)].into();
        deserve(&cpu(8), &mut qs);
        assert_eq!(deserved(&qs["b"]), 3.0);
        assert_eq!(deserved(&qs["a"]), 5.0);
    }

    #[test]
    fn a_queue_that_requests_nothing_is_overused_and_holds_share_zero() {
        let mut qs: BTreeMap<String, QueueShare> = [("a".into(), queue(1.0, 0, 0))].into();
        deserve(&cpu(8), &mut qs);
        assert!(qs["a"].overused());
        assert_eq!(qs["a"].share(), 0.0);
    }
}
