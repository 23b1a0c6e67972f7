//! Jobs whose QUEUED this process has published and the broker has confirmed.
//!
//! A consumer must see a job's QUEUED before any other event of it, so the monitor publishes the job's
//! QUEUED itself (the very same message) before its first event of a job, unless what is persisted on
//! the job shows that something later went out (see `docs/monitor.md`). Nothing persisted says whether
//! the submitting runner's QUEUED went out, so without more the monitor sends a copy of every job's
//! QUEUED: one message in five of a short job's life, a publication, a confirm and a delivery each.
//!
//! When the runner that submitted a job also monitors it (one runner, or the shard of the job held by
//! the runner that took its submission), it knows better: its submit path had that QUEUED confirmed by
//! the broker, and a confirmed message is already in every queue it was routed to, ahead of anything
//! published after the confirm arrived. The submit path records the job here after the confirm, and
//! the monitor sends no copy for a job recorded here.
//!
//! This is memory only, and only ever spares a copy: a runner that restarts, a runner that monitors a
//! job another one submitted, or a job evicted from here sends the copy, as every runner did before.
//! Never the other way round: a job is recorded only once its QUEUED is confirmed.
//!
//! What lasts is on the job: after the confirm, the submit path writes the annotation
//! `<prefix>queuedConfirmed` ([`ANNOTATION`]) on the VolcanoJob, one merge patch per job. Any runner that
//! monitors the job (another one, or this one after a restart) then knows that QUEUED is in the queues
//! and sends no copy. Until it is there, the monitor holds back its first event of the job, at most
//! [`GRACE`] after the job's creation: the submit path normally writes it milliseconds after the create,
//! so the monitor's first event waits for the watch to deliver it, and a copy goes out only when the
//! submitting runner died between its create and its write (its redelivered submission then also
//! publishes QUEUED once more: at-least-once under faults, once without them).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::keys::FastSet;

/// The annotation (after the prefix) the submit path writes once its QUEUED is confirmed.
pub const ANNOTATION: &str = "queuedConfirmed";

/// The full key of [`ANNOTATION`] under `prefix` (e.g. `ucloud.dk/queuedConfirmed`).
pub fn annotation_key(prefix: &str) -> String {
    format!("{prefix}{ANNOTATION}")
}

/// How long after a job's creation the monitor waits for [`ANNOTATION`] before its first event of the
/// job, then sends its own copy of QUEUED. The submit path writes it right after the create returns
/// and the broker confirms; a runner killed in between is the only usual reason to run out of it.
pub const GRACE: Duration = Duration::from_secs(10);

/// How many jobs are remembered: the newest ones. A job is looked up from its creation until the
/// monitor's first event of it (its start, or a pending status after `pending_status_after`), seconds to
/// minutes later in a cluster that keeps up; a job evicted sooner (a backlog of more submissions than
/// this waiting in Volcano's queue) only gets the copy. A few megabytes at most.
pub const CAPACITY: usize = 65_536;

/// Job ids whose QUEUED this process had confirmed, the newest [`CAPACITY`] of them. Cheap to clone
/// (shared): the submit path records, the monitor looks up.
#[derive(Clone)]
pub struct ConfirmedQueued {
    inner: Arc<Mutex<Newest>>,
}

struct Newest {
    capacity: usize,
    order: VecDeque<Arc<str>>,
    ids: FastSet<Arc<str>>,
}

impl Default for ConfirmedQueued {
    fn default() -> Self {
        Self::with_capacity(CAPACITY)
    }
}

impl std::fmt::Debug for ConfirmedQueued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let newest = self.lock();
        f.debug_struct("ConfirmedQueued")
            .field("jobs", &newest.order.len())
            .field("capacity", &newest.capacity)
            .finish()
    }
}

impl ConfirmedQueued {
    /// Remembers the newest `capacity` jobs (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            inner: Arc::new(Mutex::new(Newest {
                capacity,
                order: VecDeque::new(),
                ids: FastSet::default(),
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Newest> {
        // Nothing here can panic half-way through a change; a poisoned lock still holds a whole set.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `job_id`'s QUEUED was confirmed by the broker. Call only after the confirm.
    pub fn record(&self, job_id: &str) {
        let mut newest = self.lock();
        if newest.ids.contains(job_id) {
            return;
        }
        if newest.order.len() >= newest.capacity
            && let Some(oldest) = newest.order.pop_front()
        {
            newest.ids.remove(&oldest);
        }
        let id: Arc<str> = job_id.into();
        newest.order.push_back(id.clone());
        newest.ids.insert(id);
    }

    /// Whether `job_id`'s QUEUED was confirmed in this process (and is still remembered).
    pub fn contains(&self, job_id: &str) -> bool {
        self.lock().ids.contains(job_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_what_was_recorded_and_nothing_else() {
        let confirmed = ConfirmedQueued::default();
        assert!(!confirmed.contains("a"));
        confirmed.record("a");
        let shared = confirmed.clone();
        assert!(shared.contains("a"), "clones share one set");
        assert!(!shared.contains("b"));
        assert!(!shared.contains("a "), "exact ids only");
    }

    #[test]
    fn keeps_the_newest_when_full() {
        let confirmed = ConfirmedQueued::with_capacity(3);
        for id in ["a", "b", "c"] {
            confirmed.record(id);
        }
        // Recording a remembered job again neither evicts nor refreshes anything.
        confirmed.record("a");
        assert!(["a", "b", "c"].iter().all(|id| confirmed.contains(id)));
        confirmed.record("d");
        assert!(!confirmed.contains("a"), "the oldest goes first");
        assert!(["b", "c", "d"].iter().all(|id| confirmed.contains(id)));
        confirmed.record("e");
        assert!(!confirmed.contains("b"));
        assert_eq!(confirmed.lock().order.len(), 3);
        assert_eq!(confirmed.lock().ids.len(), 3);
    }

    #[test]
    fn the_operators_documentation_states_the_capacity() {
        let docs = include_str!("../../docs/monitor.md");
        // In the documentation's style: thousands separated by commas.
        let digits = CAPACITY.to_string();
        let mut grouped = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                grouped.push(',');
            }
            grouped.push(c);
        }
        let said = format!("the newest {grouped} such jobs");
        assert!(docs.contains(&said), "docs/monitor.md should say {said:?}");
    }
}
