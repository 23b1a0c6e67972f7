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
//! This is memory only (and, for the records still carried, the shard leases' lists, below), and only
//! ever spares a copy: a runner that restarts, a runner that monitors a job another one submitted, or a
//! job evicted from here sends the copy, as every runner did before. Never the other way round: a job
//! is recorded (here, or on a lease's list) only once its QUEUED is confirmed.
//!
//! What lasts is on the job: the annotation `<prefix>queuedConfirmed` ([`ANNOTATION`]). Any runner that
//! monitors the job (another one, or this one after a restart) then knows that QUEUED is in the queues
//! and sends no copy. Until it is there, the monitor holds back its first event of the job, at most
//! [`GRACE`] after the job's creation: a copy goes out only when the submitting runner died between its
//! create and the write (its redelivered submission then also publishes QUEUED once more:
//! at-least-once under faults, once without them).
//!
//! **Who writes it.** When another runner monitors the job (or none does yet), the submit path writes
//! it after the confirm, one merge patch. When this runner holds the job's shard, the record rides on
//! the monitor's first write of the job, which comes anyway (its RUNNING, a pending status, its end):
//! the submit path hands the job over with [`ConfirmedQueued::carry`], which costs no request. Until
//! that write, the job's shard is kept from being handed over (a [`Duty`] of it is held): when the
//! shard leaves this runner (a hand-over, a graceful stop), [`ConfirmedQueued::write_on_handover`]
//! writes the record of every job still carried, then lets the shard go, so the next holder reads it
//! (`tests/runner/events_once.rs`).
//!
//! **A kill while a record is carried.** Until the job's first write lands, a runner killed would leave
//! the job without the record, and its next holder would send a copy of QUEUED (six to eight per kill
//! in the chaos test, where that write came 2 s after the confirm at the median, the pod's start then
//! the monitor's `defer_under_load` behind the submissions in hand, and 5 s for jobs waiting for room,
//! at their first pending status). So the shard's lease lists the carried records of its jobs with
//! every write of it, which costs no request ([`crate::cluster::labels::QUEUED_CARRIED`], as
//! [`crate::cluster::lease::CarriedRecords`]: the newest [`LISTED_MAX`], each for [`LISTED_FOR`] after
//! its confirm), and a runner that takes the shard over takes them on from the lease (they are
//! confirmed QUEUEDs) and carries them in turn.
//!
//! What is left: a runner killed between a confirm and its next renewal of the job's shard lease (at
//! most `[cluster.lease] renew_interval`, before the job's first write): the next holder sends the copy,
//! as for a kill between the create and the submit path's write. A record taken on for a job that has
//! ended meanwhile (its end written, and its runner killed before it renewed the lease again) stays
//! carried until its shard leaves this runner, when [`ConfirmedQueued::write_on_handover`] writes it;
//! it is listed no more after [`LISTED_FOR`], so it does not travel from runner to runner.
//!
//! **Who tells it.** The submit path decides at the create, from this runner's shards and its view of
//! the other runners' leases ([`crate::cluster::ShardHolders`]):
//! - this runner holds the job's shard: it publishes QUEUED and the record rides on its monitor's first
//!   write (above);
//! - another runner holds it, and says on its lease that it tells such QUEUEDs
//!   ([`crate::cluster::labels::TELLS_QUEUED`]; a runner older than that does not, and is treated as
//!   the view cannot tell, below): the job is created with `<prefix>queuedBy: monitor` ([`QUEUED_BY`],
//!   [`BY_MONITOR`]) and the submit path publishes nothing; the job's monitor publishes the very same
//!   QUEUED as soon as it sees the job without the record (not waiting for [`GRACE`] nor for its first
//!   event), then carries the record to its first write as above ([`ConfirmedQueued::carry`]; when its shard
//!   is already on its way out, it writes the record at once, before the shard goes). A
//!   redelivered submission of such a job publishes nothing either. When the holder has gone by the
//!   time the create has returned (the view again), the submit path publishes QUEUED and writes the
//!   record after all, so that a job is never left waiting for a monitor that is not there;
//! - nobody holds it (no runner monitors): the submit path publishes QUEUED and writes no record; a
//!   monitor that takes the job over later sends its copy after [`GRACE`], a duplicate that only a
//!   missing monitor causes;
//! - the view cannot tell (not listed yet), or the holder is an older runner: as before, it publishes
//!   QUEUED and writes the record.
//!
//! That costs three requests per submission whoever monitors the job: the two creates and the
//! tombstone read. A cancel that overtook the submission makes the submit path claim the job and tell
//! CANCELLED alone; so the monitor holds a job's QUEUED back while this runner's view of the tombstones
//! has one for it ([`ConfirmedQueued::cancel_seen`]) and the job records no cause of its end, at most
//! [`GRACE`] after the job's creation.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::keys::FastSet;
use crate::cluster::HeldShards;
use crate::cluster::lease::Duty;

/// The annotation (after the prefix) the submit path writes once its QUEUED is confirmed.
pub const ANNOTATION: &str = "queuedConfirmed";

/// The full key of [`ANNOTATION`] under `prefix` (e.g. `ucloud.dk/queuedConfirmed`).
pub fn annotation_key(prefix: &str) -> String {
    format!("{prefix}{ANNOTATION}")
}

/// The annotation (after the prefix) that says who tells the job's QUEUED, written at the create: with
/// [`BY_MONITOR`], the job's monitor does (its submitting runner did not hold the job's shard). Absent:
/// the submitting runner publishes it.
pub const QUEUED_BY: &str = "queuedBy";

/// The value of [`QUEUED_BY`]: the job's monitor tells its QUEUED.
pub const BY_MONITOR: &str = "monitor";

/// The full key of [`QUEUED_BY`] under `prefix` (e.g. `ucloud.dk/queuedBy`).
pub fn queued_by_key(prefix: &str) -> String {
    format!("{prefix}{QUEUED_BY}")
}

/// The annotations on a job that say who tells its QUEUED and whether it was told, under the annotation
/// prefix: what the monitor reads wherever it asks whether a QUEUED is left to it and not told yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedKeys {
    /// `<prefix>queuedBy` ([`QUEUED_BY`]).
    pub by: String,
    /// `<prefix>queuedConfirmed` ([`ANNOTATION`]).
    pub confirmed: String,
}

impl QueuedKeys {
    /// The keys under `prefix` (e.g. `ucloud.dk/`).
    pub fn new(prefix: &str) -> Self {
        Self {
            by: queued_by_key(prefix),
            confirmed: annotation_key(prefix),
        }
    }

    /// Whether the job with `annotations` has its QUEUED left to its monitor ([`BY_MONITOR`]) and not
    /// told yet, as far as the job and this process know: no record of it on the job, and not
    /// `confirmed_here` (this process had it confirmed: its submit path, or its monitor in an earlier
    /// round). The one reading of it: the monitor's decision tells it (step 2b), its executor looks
    /// for a cancel that overtook the submission, its loop decides the job urgently.
    pub fn left_untold(
        &self,
        annotations: Option<&std::collections::BTreeMap<String, String>>,
        confirmed_here: bool,
    ) -> bool {
        !confirmed_here
            && self.left_to_monitor(annotations)
            && annotations.is_some_and(|a| !a.contains_key(&self.confirmed))
    }

    /// Whether the job with `annotations` was created with its QUEUED left to its monitor
    /// ([`BY_MONITOR`]), told or not.
    pub fn left_to_monitor(
        &self,
        annotations: Option<&std::collections::BTreeMap<String, String>>,
    ) -> bool {
        annotations
            .and_then(|a| a.get(&self.by))
            .is_some_and(|v| v == BY_MONITOR)
    }
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
    carried: Arc<Mutex<Carried>>,
    /// The submitting side's view of the cancels (tombstones), for [`ConfirmedQueued::cancel_seen`].
    cancels: Option<crate::cluster::Tombstones>,
}

/// Jobs whose record is left to this runner's monitor, and the shards that tell whether it may be.
#[derive(Default)]
struct Carried {
    /// This runner's shards (`None`: it does not monitor, so nothing is carried).
    shards: Option<watch::Receiver<HeldShards>>,
    jobs: HashMap<Arc<str>, CarriedJob>,
}

/// A job whose record the monitor's first write will carry, and the duty that keeps its shard here
/// until then.
struct CarriedJob {
    namespace: String,
    name: String,
    /// The uid of the job whose QUEUED was confirmed (`None` for a record taken on from a shard's lease,
    /// which lists none): a job gone under the same name releases only a record of its own, not one
    /// carried for a job created afresh under that name ([`ConfirmedQueued::gone`]).
    uid: Option<String>,
    /// When the QUEUED was confirmed (ms since the epoch, by this machine's clock; for a job taken on
    /// from a shard's lease, as its earlier holder listed it): listed on the lease only for [`LISTED_FOR`].
    confirmed_ms: i64,
    /// When the record began to be carried here: how long a kill of this runner would have cost a copy
    /// of the job's QUEUED without the lease's list is logged when it ends.
    since: tokio::time::Instant,
    _duty: Duty,
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
            carried: Arc::default(),
            cancels: None,
        }
    }

    /// Answers [`ConfirmedQueued::cancel_seen`] from `tombstones` (the runner's, followed by its watch).
    pub fn with_cancels(mut self, tombstones: crate::cluster::Tombstones) -> Self {
        self.cancels = Some(tombstones);
        self
    }

    /// Whether this process's view of the tombstones has a live one of `job_id` (`false` when it has
    /// none or cannot tell). Only spares a QUEUED told after the CANCELLED of a cancel that overtook the
    /// submission (see the module documentation).
    pub fn cancel_seen(&self, job_id: &str, now: jiff::Timestamp) -> bool {
        self.cancels
            .as_ref()
            .and_then(|t| t.seen(job_id, now))
            .unwrap_or(false)
    }

    /// Whether this runner's monitor holds the shard of `job_id` now (`false` without a monitor).
    pub fn holds(&self, job_id: &str) -> bool {
        self.carried()
            .shards
            .as_ref()
            .is_some_and(|shards| shards.borrow().owns(job_id))
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
        // One lock at a time: `carry` takes the carried jobs' lock, then the newest ids'.
        let remembered = self.lock().ids.contains(job_id);
        remembered || self.is_carried(job_id)
    }

    fn carried(&self) -> std::sync::MutexGuard<'_, Carried> {
        self.carried.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This runner monitors the jobs of `shards`: from now on [`ConfirmedQueued::carry`] can leave the
    /// record of a job of theirs to the monitor.
    pub fn attach(&self, shards: watch::Receiver<HeldShards>) {
        self.carried().shards = Some(shards);
    }

    /// Leaves the record of `job_id`'s confirmed QUEUED (its job `namespace/name`, of `uid`) to this
    /// runner's monitor, when this runner holds the job's shard: `true`, and the submit path writes
    /// nothing. `false`: the submit path writes it. Call only after the confirm, for a job that has not
    /// ended (the monitor writes an ended job no more).
    pub fn carry(&self, job_id: &str, uid: Option<&str>, namespace: &str, name: &str) -> bool {
        let confirmed_ms = jiff::Timestamp::now().as_millisecond();
        self.carry_confirmed_at(job_id, uid, namespace, name, confirmed_ms)
    }

    /// [`ConfirmedQueued::carry`], for a QUEUED confirmed at `confirmed_ms` (ms since the epoch).
    fn carry_confirmed_at(
        &self,
        job_id: &str,
        uid: Option<&str>,
        namespace: &str,
        name: &str,
        confirmed_ms: i64,
    ) -> bool {
        let mut carried = self.carried();
        let Some(shards) = &carried.shards else {
            return false;
        };
        let held = shards.borrow().clone();
        // Begun before the look at the shard (see `Duties`): either the shard is seen gone here, or its
        // hand-over waits for this duty, and [`ConfirmedQueued::write_on_handover`] writes the record.
        let duty = held.begin_duty(job_id);
        if !held.owns(job_id) {
            return false;
        }
        self.record(job_id);
        carried.jobs.insert(
            job_id.into(),
            CarriedJob {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                uid: uid.map(str::to_owned),
                confirmed_ms,
                since: tokio::time::Instant::now(),
                _duty: duty,
            },
        );
        true
    }

    /// Whether the monitor's next write of `job_id` is to carry its record.
    pub fn is_carried(&self, job_id: &str) -> bool {
        self.carried().jobs.contains_key(job_id)
    }

    /// The record of `job_id` is on the job (written, or not needed any more): its shard is free to go.
    /// A record is of the job id (its QUEUED is one message whatever job carries it), so whichever job
    /// of that name a write carries it onto settles it.
    pub fn carried_done(&self, job_id: &str) {
        let done = self.carried().jobs.remove(job_id);
        Self::log_done(job_id, done);
    }

    /// The job `job_id` of `uid` is gone: nothing can be written on it, so its record is carried no
    /// more; unless the record is of a job created afresh under the same name since (another uid: the
    /// submission's next delivery after a rollback), which still needs it on its first write.
    pub fn gone(&self, job_id: &str, uid: Option<&str>) {
        let mut carried = self.carried();
        let of_a_fresh_job = carried
            .jobs
            .get(job_id)
            .and_then(|job| job.uid.as_deref())
            .zip(uid)
            .is_some_and(|(confirmed, gone)| confirmed != gone);
        let done = if of_a_fresh_job {
            None
        } else {
            carried.jobs.remove(job_id)
        };
        drop(carried);
        Self::log_done(job_id, done);
    }

    fn log_done(job_id: &str, done: Option<CarriedJob>) {
        if let Some(job) = done {
            let carried_ms = u64::try_from(job.since.elapsed().as_millis()).unwrap_or(u64::MAX);
            tracing::debug!(
                job_id,
                carried_ms,
                "The record of the job's confirmed QUEUED is carried no more."
            );
        }
    }

    /// The carried jobs of the shards this runner no longer holds (all of them when `all`).
    fn released(&self, all: bool) -> Vec<CarriedJob> {
        let mut carried = self.carried();
        let held = match &carried.shards {
            Some(shards) if !all => shards.borrow().clone(),
            _ => return carried.jobs.drain().map(|(_, job)| job).collect(),
        };
        let gone: Vec<Arc<str>> = carried
            .jobs
            .keys()
            .filter(|id| !held.owns(id))
            .cloned()
            .collect();
        gone.iter()
            .filter_map(|id| carried.jobs.remove(id))
            .collect()
    }

    /// Whenever a shard leaves this runner (handed over, lapsed, or given back at a stop), writes the
    /// record `key` on each job of it still carried, then lets the shard go; until the shards' sender
    /// is gone (the leases have stopped). One attempt per job: a record not written only costs a copy of
    /// QUEUED from the next holder.
    pub async fn write_on_handover(self, client: kube::Client, key: String) {
        let Some(mut shards) = self.carried().shards.clone() else {
            return;
        };
        loop {
            let stopped = shards.changed().await.is_err();
            // All at once: the shards wait for them, within their deadline.
            let released = self.released(stopped);
            futures::future::join_all(released.iter().map(|job| write_record(&client, job, &key)))
                .await;
            if stopped {
                return;
            }
        }
    }
}

/// How long after its confirm a carried record is listed on its shard's lease, and taken on from it: a
/// runner that takes a shard over needs what its dead holder listed at its last renewal, at most a lease
/// duration earlier. The bound keeps a record whose job ended meanwhile (written with its end, and the
/// holder killed before it renewed the lease again) from travelling from runner to runner.
pub const LISTED_FOR: Duration = Duration::from_secs(60);

/// How many records a shard's lease lists at most: [`crate::cluster::labels::QUEUED_CARRIED_MAX`].
pub const LISTED_MAX: usize = crate::cluster::labels::QUEUED_CARRIED_MAX;

/// One record as a shard's lease lists it ([`crate::cluster::labels::QUEUED_CARRIED`]):
/// `<namespace>/<name>@<confirmed ms>`.
fn listed_entry(job: &CarriedJob) -> String {
    format!("{}/{}@{}", job.namespace, job.name, job.confirmed_ms)
}

/// The records a lease lists, as `(namespace, name, confirmed ms)`; malformed entries are left out.
fn parse_listed(value: &str) -> impl Iterator<Item = (&str, &str, i64)> {
    value.split_whitespace().filter_map(|entry| {
        let (job, ms) = entry.rsplit_once('@')?;
        let (namespace, name) = job.split_once('/')?;
        Some((namespace, name, ms.parse().ok()?))
    })
}

/// Whether a record confirmed at `confirmed_ms` is still to be listed at `now_ms`.
fn listed_now(confirmed_ms: i64, now_ms: i64) -> bool {
    let window = i64::try_from(LISTED_FOR.as_millis()).unwrap_or(i64::MAX);
    now_ms.saturating_sub(confirmed_ms) < window
}

impl crate::cluster::lease::CarriedRecords for ConfirmedQueued {
    fn listed(&self, shard: u32, shards: u32) -> Option<String> {
        let now_ms = jiff::Timestamp::now().as_millisecond();
        let carried = self.carried();
        let mut jobs: Vec<&CarriedJob> = carried
            .jobs
            .iter()
            .filter(|(id, job)| {
                crate::cluster::shard_of(id, shards) == shard
                    && listed_now(job.confirmed_ms, now_ms)
            })
            .map(|(_, job)| job)
            .collect();
        if jobs.is_empty() {
            return None;
        }
        jobs.sort_unstable_by_key(|job| std::cmp::Reverse(job.confirmed_ms));
        jobs.truncate(LISTED_MAX);
        let entries: Vec<String> = jobs.into_iter().map(listed_entry).collect();
        Some(entries.join(" "))
    }

    fn adopt(&self, value: &str) {
        let now_ms = jiff::Timestamp::now().as_millisecond();
        for (namespace, name, confirmed_ms) in parse_listed(value) {
            if !listed_now(confirmed_ms, now_ms) {
                continue;
            }
            if let Some(job_id) = crate::pipeline::names::job_id_from_vcjob_name(name) {
                self.carry_confirmed_at(job_id, None, namespace, name, confirmed_ms);
            }
        }
    }
}

/// Writes `key` on the carried job (a merge patch); a job that is gone needs none.
async fn write_record(client: &kube::Client, job: &CarriedJob, key: &str) {
    use kube::api::{Api, Patch, PatchParams};
    let api: Api<crate::volcano::VolcanoJob> = Api::namespaced(client.clone(), &job.namespace);
    let params = PatchParams {
        field_manager: Some(crate::cluster::labels::FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let patch = serde_json::json!({"metadata": {"annotations": {key: "true"}}});
    match api.patch(&job.name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => tracing::warn!(
            job = %job.name,
            error = %e,
            "Could not record on a job handed over that its QUEUED was confirmed; its next monitor will send a copy of QUEUED."
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Left to the monitor and not told: `queuedBy: monitor`, no record on the job, and not confirmed
    /// in this process; anything else is either told or not the monitor's to tell.
    #[test]
    fn a_queued_is_left_untold_only_by_monitor_without_a_record() {
        use std::collections::BTreeMap;
        let keys = QueuedKeys::new("ucloud.dk/");
        assert_eq!(keys.by, "ucloud.dk/queuedBy");
        assert_eq!(keys.confirmed, "ucloud.dk/queuedConfirmed");
        let on = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let left = on(&[("ucloud.dk/queuedBy", "monitor")]);
        assert!(keys.left_untold(Some(&left), false));
        assert!(!keys.left_untold(Some(&left), true), "confirmed here");
        let told = on(&[
            ("ucloud.dk/queuedBy", "monitor"),
            ("ucloud.dk/queuedConfirmed", "true"),
        ]);
        assert!(!keys.left_untold(Some(&told), false), "recorded on the job");
        let other = on(&[("ucloud.dk/queuedBy", "submit")]);
        assert!(!keys.left_untold(Some(&other), false), "not the monitor's");
        assert!(!keys.left_untold(Some(&on(&[])), false));
        assert!(!keys.left_untold(None, false));
        let elsewhere = on(&[("other.io/queuedBy", "monitor")]);
        assert!(!keys.left_untold(Some(&elsewhere), false), "another prefix");
    }

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

    /// The record of a job of a shard held here is left to the monitor, and keeps the shard from being
    /// handed over until it is written; a job of another runner's shard, or with no monitor here, is
    /// the submit path's to write.
    #[tokio::test]
    async fn a_job_of_a_shard_held_here_is_carried_until_its_shard_goes() {
        use std::collections::BTreeSet;
        let until = tokio::time::Instant::now() + Duration::from_secs(60);
        let confirmed = ConfirmedQueued::default();
        assert!(!confirmed.carry("a", None, "ns", "j-a"), "no monitor here");

        let mine = crate::cluster::shard_of("a", 2);
        let theirs = 1 - mine;
        let other = (0..)
            .map(|i| format!("o{i}"))
            .find(|id| crate::cluster::shard_of(id, 2) == theirs)
            .unwrap();
        let held = HeldShards::for_tests(2, BTreeSet::from([mine]), until);
        let (tx, rx) = watch::channel(held.clone());
        confirmed.attach(rx);
        assert!(
            !confirmed.carry(&other, None, "ns", "j-other"),
            "another runner's shard"
        );
        assert!(!held.busy(theirs));
        assert!(confirmed.carry("a", None, "ns", "j-a"));
        assert!(confirmed.is_carried("a") && confirmed.contains("a"));
        assert!(held.busy(mine), "the shard waits for the record");
        assert!(
            confirmed.released(false).is_empty(),
            "its shard is still held"
        );

        tx.send_replace(held.now_holding(BTreeSet::new()));
        let released = confirmed.released(false);
        assert_eq!(released.len(), 1);
        assert_eq!(
            (released[0].namespace.as_str(), released[0].name.as_str()),
            ("ns", "j-a")
        );
        assert!(!confirmed.is_carried("a"));
        assert!(confirmed.contains("a"), "still known to be confirmed");
        assert!(held.busy(mine), "until the record is written");
        drop(released);
        assert!(!held.busy(mine));

        tx.send_replace(held.now_holding(BTreeSet::from([mine])));
        assert!(confirmed.carry("a", None, "ns", "j-a"));
        confirmed.carried_done("a");
        assert!(!held.busy(mine), "written by the monitor");
    }

    /// A job gone releases its own record, and a record taken on from a lease (no uid), but not one
    /// carried for a job created afresh under its name (another uid), which its first write needs.
    #[tokio::test]
    async fn a_gone_job_releases_only_a_record_of_its_own() {
        use std::collections::BTreeSet;
        let until = tokio::time::Instant::now() + Duration::from_secs(60);
        let held = HeldShards::for_tests(1, BTreeSet::from([0]), until);
        let (_tx, rx) = watch::channel(held.clone());
        let confirmed = ConfirmedQueued::default();
        confirmed.attach(rx);

        assert!(confirmed.carry("a", Some("uid-2"), "ns", "j-a"));
        confirmed.gone("a", Some("uid-1"));
        assert!(confirmed.is_carried("a"), "carried for the fresh job");
        assert!(held.busy(0), "its shard still waits for the record");
        confirmed.gone("a", Some("uid-2"));
        assert!(!confirmed.is_carried("a"), "its own job gone");
        assert!(!held.busy(0));

        assert!(
            confirmed.carry("a", None, "ns", "j-a"),
            "as taken on from a lease"
        );
        confirmed.gone("a", Some("uid-1"));
        assert!(
            !confirmed.is_carried("a"),
            "a record of no known job goes with any"
        );
        assert!(confirmed.carry("a", Some("uid-3"), "ns", "j-a"));
        confirmed.gone("a", None);
        assert!(
            !confirmed.is_carried("a"),
            "a gone job of no known uid releases it"
        );
        assert!(confirmed.contains("a"), "still known to be confirmed");
    }

    /// The records carried for a shard's jobs are what its lease lists, and a runner that takes the shard
    /// over carries them in turn; an entry older than [`LISTED_FOR`], malformed, or of a shard the
    /// taker does not hold is not taken on.
    #[tokio::test]
    async fn the_records_carried_are_listed_on_the_lease_and_taken_on_from_it() {
        use crate::cluster::lease::CarriedRecords;
        use std::collections::BTreeSet;
        let until = tokio::time::Instant::now() + Duration::from_secs(60);
        let mine = crate::cluster::shard_of("a", 2);
        let of_shard = |shard: u32, from: u32| {
            (from..)
                .map(|i| format!("o{i}"))
                .find(|id| crate::cluster::shard_of(id, 2) == shard)
                .unwrap()
        };
        let held = HeldShards::for_tests(2, BTreeSet::from([mine]), until);
        let (_tx, rx) = watch::channel(held);
        let killed = ConfirmedQueued::default();
        killed.attach(rx);
        assert_eq!(killed.listed(mine, 2), None, "nothing carried");
        assert!(killed.carry("a", None, "ns", "j-a"));
        let listed = killed.listed(mine, 2).expect("listed");
        assert!(listed.starts_with("ns/j-a@"), "{listed}");
        assert_eq!(killed.listed(1 - mine, 2), None, "another shard's lease");

        let taker = ConfirmedQueued::default();
        let (_tx, rx) = watch::channel(HeldShards::for_tests(2, BTreeSet::from([mine]), until));
        taker.attach(rx);
        let (old, theirs) = (of_shard(mine, 0), of_shard(1 - mine, 0));
        let now_ms = jiff::Timestamp::now().as_millisecond();
        let stale = now_ms - i64::try_from(LISTED_FOR.as_millis()).unwrap() - 1;
        taker.adopt(&format!(
            "{listed} ns/j-{old}@{stale} ns/j-{theirs}@{now_ms} garbage ns/j-x@soon"
        ));
        assert!(taker.contains("a") && taker.is_carried("a"), "taken on");
        assert!(!taker.contains(&old), "too old");
        assert!(!taker.contains(&theirs), "a shard the taker does not hold");
        assert!(!taker.contains("x"));
        assert_eq!(
            taker.listed(mine, 2),
            Some(listed),
            "listed in turn, as confirmed"
        );
    }
}
