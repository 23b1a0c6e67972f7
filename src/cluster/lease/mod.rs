//! Shard leases: which runner carries the monitoring duty for which jobs.
//!
//! Jobs are split into `[cluster.lease] shards` shards by [`shard_of`] (a stable hash of the job id).
//! Each shard has a `coordination.k8s.io/v1` Lease `<prefix>-shard-<n>` in the runner's namespace; the
//! runner named in its `holderIdentity` carries the duty for that shard's jobs. With one shard this is
//! plain leader election.
//!
//! **Membership.** Every runner also renews a Lease of its own, `<prefix>-member-<identity>`. The number
//! of member leases that are alive is the number of runners, and each runner aims for a fair share of
//! `ceil(shards / runners)`: it takes free or abandoned shards up to that number and gives extras back
//! when more runners appear. Shards are preferred by rendezvous hashing, so runners grabbing at the same
//! moment mostly pick different ones; every write uses the lease's resourceVersion, so when two do pick
//! the same shard exactly one wins.
//!
//! **Why only one runner acts on a shard at a time.** A holder renews every `renew_interval`. It counts a
//! shard as lost at `last successful renewal + duration - safety_margin` (the renewal's start, by its own
//! clock), even when it cannot reach the API to learn anything, and [`HeldShards::holds`] checks that
//! deadline on every call. Another runner takes a shard over only when it has seen the lease unchanged
//! for a whole `duration` by its own clock, which starts no earlier than the holder's renewal. So the old
//! holder has stopped `safety_margin` before the new one starts; the margin absorbs clock-rate drift and
//! scheduling delays.
//!
//! **Handing a shard over.** A shard given back voluntarily (to a newcomer, or at shutdown) is first
//! dropped from the held set, so the monitor starts nothing more for its jobs; the lease is released
//! only once the monitor's work on those jobs already under way ([`Duties`]: a publication, its
//! confirm and the write that records it) has ended. A release before that let the new holder read a
//! job before the old holder's record of a transition landed, and publish the transition a second time
//! (18 to 54 duplicates per 1,000 jobs with three runners and no fault). Work still under way at the
//! shard's deadline (a write in flight behind a slow API) is not waited for longer, but the lease is
//! then left to lapse, not released: the next holder starts a whole `duration` after the last renewal
//! instead of at once, which gives that write `safety_margin` and more to land first.
//! Such a lease still names this runner: while the newcomer is short of its share, each round gives
//! it back again without writing it, so it is never renewed.
//!
//! **Takeover time.** With the defaults (duration 10 s, renew every 2 s) a dead runner's shards are
//! taken within about 14 s: up to 2 s until the others see its last renewal, 10 s of silence, and up to
//! 2 s until the next round. A runner that shuts down cleanly releases its shards as soon as its work
//! on them has ended.

mod holders;
mod plan;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};
use tokio::sync::watch;
use tokio::time::Instant;

pub use holders::{Holding, ShardHolders};
pub use plan::shard_of;
use plan::{Decision, Holder, Observations, decide_with};

use super::ClusterConfig;
use super::error::{ClusterError, KubeResultExt};
use super::labels::{
    self, COMPONENT, FIELD_MANAGER, LEASE_GROUP, MANAGED_BY, MANAGER, QUEUED_CARRIED,
    QUEUED_CARRIED_MAX, RUNNER_PROBLEM, TELLS_QUEUED,
};

/// `app.kubernetes.io/component` of a shard lease.
pub const COMPONENT_SHARD: &str = "shard-lease";
/// `app.kubernetes.io/component` of a runner's member lease.
pub const COMPONENT_MEMBER: &str = "runner-member";

/// How many lease durations a dead runner's member lease is left before any runner deletes it.
const MEMBER_GC_FACTOR: u32 = 3;

/// The shards this runner holds. Compare with `==` to see whether the *set* changed; ask
/// [`holds`](Self::holds) or [`owns`](Self::owns) before acting, which also checks the deadline.
#[derive(Debug, Clone)]
pub struct HeldShards {
    shards: u32,
    held: BTreeSet<u32>,
    deadlines: Arc<Mutex<BTreeMap<u32, Instant>>>,
    duties: Duties,
    /// The held shards the monitor has listed since it gained them (see [`HeldShards::set_listed`]).
    listed: Arc<watch::Sender<BTreeSet<u32>>>,
}

/// The monitor's work in progress, by shard: what a shard's lease waits for before it is handed over.
///
/// Work on a job is begun ([`HeldShards::begin_duty`]) *before* the monitor asks whether it holds the
/// job's shard, and the leases drop a shard from the held set *before* they look at its work in
/// progress: so either the work saw the shard gone and does nothing, or the leases see it and wait.
#[derive(Debug, Clone, Default)]
pub struct Duties {
    inner: Arc<DutiesInner>,
}

#[derive(Debug, Default)]
struct DutiesInner {
    counts: Mutex<BTreeMap<u32, usize>>,
    ended: tokio::sync::Notify,
}

/// One piece of work on a job of a shard; it ends when dropped.
#[derive(Debug)]
pub struct Duty {
    duties: Duties,
    shard: u32,
}

impl Drop for Duty {
    fn drop(&mut self) {
        {
            let mut counts = self.duties.counts();
            if let Some(n) = counts.get_mut(&self.shard) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(&self.shard);
                }
            }
        }
        self.duties.inner.ended.notify_waiters();
    }
}

impl Duties {
    fn counts(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, usize>> {
        self.inner.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn begin(&self, shard: u32) -> Duty {
        *self.counts().entry(shard).or_default() += 1;
        Duty {
            duties: self.clone(),
            shard,
        }
    }

    /// Those of `shards` with work in progress.
    pub fn busy(&self, shards: &BTreeSet<u32>) -> BTreeSet<u32> {
        let counts = self.counts();
        shards
            .iter()
            .copied()
            .filter(|s| counts.contains_key(s))
            .collect()
    }

    /// Returns once none of `shards` has work in progress (at once if none has).
    async fn ended(&self, shards: &BTreeSet<u32>) {
        self.until(|busy| busy.is_empty(), shards).await;
    }

    /// Returns once one of `shards` has no work in progress (at once if one has none).
    async fn one_ended(&self, shards: &BTreeSet<u32>) {
        self.until(|busy| busy.len() < shards.len(), shards).await;
    }

    async fn until(&self, done: impl Fn(&BTreeSet<u32>) -> bool, shards: &BTreeSet<u32>) {
        loop {
            // Registered before the look, so that work ending in between still wakes this.
            let notified = self.inner.ended.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if done(&self.busy(shards)) {
                return;
            }
            notified.await;
        }
    }
}

impl PartialEq for HeldShards {
    fn eq(&self, other: &Self) -> bool {
        self.shards == other.shards && self.held == other.held
    }
}

impl Eq for HeldShards {}

impl HeldShards {
    /// `held` of `shards` shards, each until `until`, with no work in progress: for the tests of what
    /// depends on the shards held.
    #[cfg(test)]
    pub(crate) fn for_tests(shards: u32, held: BTreeSet<u32>, until: Instant) -> Self {
        let deadlines = held.iter().map(|s| (*s, until)).collect();
        Self {
            shards,
            held,
            deadlines: Arc::new(Mutex::new(deadlines)),
            duties: Duties::default(),
            listed: Arc::new(watch::Sender::new(BTreeSet::new())),
        }
    }

    /// Whether work on a job of `shard` is in progress (a duty not dropped yet).
    #[cfg(test)]
    pub(crate) fn busy(&self, shard: u32) -> bool {
        !self.duties.busy(&BTreeSet::from([shard])).is_empty()
    }

    /// The same shards with `held` held now, sharing the work in progress (as the leases publish it).
    #[cfg(test)]
    pub(crate) fn now_holding(&self, held: BTreeSet<u32>) -> Self {
        Self {
            held,
            ..self.clone()
        }
    }

    /// The total number of shards.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// Whether this runner holds `shard` now: in the set and within its deadline.
    pub fn holds(&self, shard: u32) -> bool {
        if !self.held.contains(&shard) {
            return false;
        }
        let deadlines = self.deadlines.lock().unwrap_or_else(|e| e.into_inner());
        deadlines
            .get(&shard)
            .is_some_and(|until| Instant::now() < *until)
    }

    /// Whether this runner carries the duty for `job_id` now.
    pub fn owns(&self, job_id: &str) -> bool {
        self.holds(shard_of(job_id, self.shards))
    }

    /// The shards held now (in the set and within their deadline): one check for a whole monitoring pass,
    /// then `valid.contains(&shard_of(id, held.shards()))` per job. Re-check before a long pass's writes.
    pub fn valid_now(&self) -> BTreeSet<u32> {
        let now = Instant::now();
        let deadlines = self.deadlines.lock().unwrap_or_else(|e| e.into_inner());
        self.held
            .iter()
            .copied()
            .filter(|s| deadlines.get(s).is_some_and(|until| now < *until))
            .collect()
    }

    /// The shards in the set (some may be past their deadline a moment before the set is updated).
    pub fn held(&self) -> &BTreeSet<u32> {
        &self.held
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Work on `job_id` begins: its shard is not released to another runner until the returned duty is
    /// dropped (or the shard's deadline passes). Begin first, then ask [`owns`](Self::owns).
    pub fn begin_duty(&self, job_id: &str) -> Duty {
        self.duties.begin(shard_of(job_id, self.shards))
    }

    /// The monitor says which held shards it has listed afresh since it gained them: from then on it
    /// tells the QUEUED of their jobs left to it as they come. The leases say so on those shards' leases
    /// ([`TELLS_QUEUED`]) and on no other, so that other runners' submit paths leave it no job of a
    /// shard it is still listing (seconds on a busy API server, with thousands of live jobs), whose
    /// QUEUED would wait for the lists; they tell those themselves.
    pub fn set_listed(&self, shards: BTreeSet<u32>) {
        self.listed.send_if_modified(|listed| {
            let changed = *listed != shards;
            if changed {
                *listed = shards;
            }
            changed
        });
    }
}

/// The monitor's view of the leases: a `watch` of [`HeldShards`].
#[derive(Debug, Clone)]
pub struct LeaseHandle {
    rx: watch::Receiver<HeldShards>,
    identity: String,
}

impl LeaseHandle {
    /// A receiver that wakes when the set of held shards changes.
    pub fn subscribe(&self) -> watch::Receiver<HeldShards> {
        self.rx.clone()
    }

    /// The shards held now.
    pub fn held(&self) -> HeldShards {
        self.rx.borrow().clone()
    }

    /// Whether this runner carries the duty for `job_id` now.
    pub fn owns(&self, job_id: &str) -> bool {
        self.rx.borrow().owns(job_id)
    }

    /// This runner's name in the leases.
    pub fn identity(&self) -> &str {
        &self.identity
    }
}

/// Timing and naming of the leases, from `[cluster.lease]`.
#[derive(Debug, Clone)]
struct Settings {
    identity: String,
    prefix: String,
    shards: u32,
    duration: Duration,
    renew_interval: Duration,
    safety_margin: Duration,
    /// Per-request cut-off: a renewal that cannot finish within a round is abandoned.
    request_timeout: Duration,
}

impl Settings {
    fn shard_name(&self, shard: u32) -> String {
        format!("{}-shard-{shard}", self.prefix)
    }

    fn member_name(&self, identity: &str) -> String {
        format!("{}-member-{identity}", self.prefix)
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.duration.as_secs_f64().ceil() as u64)
            .unwrap_or(i32::MAX)
            .max(1)
    }

    /// How long a renewal that started at `started` keeps a shard.
    fn valid_until(&self, started: Instant) -> Instant {
        started + self.duration.saturating_sub(self.safety_margin)
    }
}

/// Runs the leases of one runner. Create with [`ShardLeases::new`], then run it until shutdown.
pub struct ShardLeases {
    api: Api<Lease>,
    settings: Settings,
    observations: Observations,
    /// When another runner's shard lapses by our observation, if it is not renewed before: a round runs
    /// then rather than at the next tick, so a dead holder's shard is taken within the lease duration
    /// plus the one renewal interval it takes to see its last renewal.
    next_lapse: Option<Instant>,
    /// Shards held, with the deadline of each.
    mine: BTreeMap<u32, Instant>,
    /// Shards given up, no longer in the held set, with their deadline: released once the monitor's
    /// work on them has ended, or at the deadline.
    releasing: BTreeMap<u32, Instant>,
    tx: watch::Sender<HeldShards>,
    deadlines: Arc<Mutex<BTreeMap<u32, Instant>>>,
    duties: Duties,
    /// What this runner says about itself on its member lease ([`RUNNER_PROBLEM`]).
    note: Option<Note>,
    /// Shard lease writes failing (not losing a race: failing): since when, and the last error. The
    /// member lease is left out: it says who is alive, not which jobs are monitored.
    failing: Option<(Instant, String)>,
    /// Whether the failing writes have been told (WARN, readiness), so they are told once.
    told: bool,
    /// Where the runner's readiness hears that its leases cannot be written.
    health: Option<crate::ops::health::Condition>,
    /// The records of confirmed QUEUEDs this runner's monitor carries (`None`: nothing is listed).
    carried: Option<Arc<dyn CarriedRecords>>,
    /// [`QUEUED_CARRIED`] of the leases just taken over, for [`CarriedRecords::adopt`] once their
    /// shards are in the held set.
    taken_over: Vec<String>,
    /// What the monitor has listed ([`HeldShards::set_listed`]): the shards whose leases say
    /// [`TELLS_QUEUED`]. A runner whose monitor never lists (or has none) says it of none, and the other
    /// runners' submit paths tell the QUEUED of its shards' jobs themselves.
    listed: watch::Receiver<BTreeSet<u32>>,
    /// What `listed` held when the last round began: the shards whose leases that round said it of.
    said: BTreeSet<u32>,
}

/// Says what keeps the runner from its work, or `None`.
type Note = Box<dyn Fn() -> Option<String> + Send + Sync>;

/// The records of confirmed QUEUEDs that the monitor carries to its first write of each job
/// (`crate::monitor::queued::ConfirmedQueued`), as the shard leases see them: listed on each shard's
/// lease with every write of it ([`QUEUED_CARRIED`]), and taken on from a lease taken over. A trait, so
/// that the leases need not know the monitor.
pub trait CarriedRecords: Send + Sync {
    /// The value of [`QUEUED_CARRIED`] for the lease of `shard` (of `shards`): `None` when no job of it
    /// is carried.
    fn listed(&self, shard: u32, shards: u32) -> Option<String>;
    /// A shard taken over, now in the held set, whose lease had `value` in [`QUEUED_CARRIED`]: those
    /// QUEUEDs were confirmed, and their records are carried from now on by this runner.
    fn adopt(&self, value: &str);
}

impl ShardLeases {
    /// The leases of this runner in `config.namespace`, and the handle the monitor reads.
    pub fn new(client: kube::Client, config: &ClusterConfig) -> (Self, LeaseHandle) {
        let lease = &config.lease;
        let identity = lease.identity.clone().unwrap_or_else(default_identity);
        let settings = Settings {
            identity: identity.clone(),
            prefix: lease.name_prefix.clone(),
            shards: lease.shards.max(1),
            duration: lease.duration,
            renew_interval: lease.renew_interval,
            safety_margin: lease.safety_margin,
            request_timeout: config.request_timeout.min(lease.renew_interval),
        };
        let deadlines = Arc::new(Mutex::new(BTreeMap::new()));
        let duties = Duties::default();
        let listed = Arc::new(watch::Sender::new(BTreeSet::new()));
        let listed_rx = listed.subscribe();
        let (tx, rx) = watch::channel(HeldShards {
            shards: settings.shards,
            held: BTreeSet::new(),
            deadlines: deadlines.clone(),
            duties: duties.clone(),
            listed,
        });
        let leases = Self {
            api: Api::namespaced(client, &config.namespace),
            settings,
            observations: Observations::default(),
            next_lapse: None,
            mine: BTreeMap::new(),
            releasing: BTreeMap::new(),
            tx,
            deadlines,
            duties,
            note: None,
            failing: None,
            told: false,
            health: None,
            carried: None,
            taken_over: Vec::new(),
            listed: listed_rx,
            said: BTreeSet::new(),
        };
        (leases, LeaseHandle { rx, identity })
    }

    /// Reports into `condition` (a readiness check) whether the leases can be written: it fails once
    /// writes have failed for a whole lease duration, when every shard this runner held has lapsed and
    /// none can be taken, and is fine again at the next write that works.
    pub fn with_health(mut self, condition: crate::ops::health::Condition) -> Self {
        condition.set(Ok(()));
        self.health = Some(condition);
        self
    }

    /// A shard lease write failed (a race lost to another runner is not a failure).
    fn write_failed(&mut self, error: &ClusterError) {
        let since = self.failing.as_ref().map_or_else(Instant::now, |(t, _)| *t);
        self.failing = Some((since, error.to_string()));
    }

    /// A shard lease write worked: whatever failed before is over.
    fn write_worked(&mut self) {
        self.failing = None;
        if std::mem::take(&mut self.told) {
            tracing::info!(
                held = self.mine.len(),
                shards = self.settings.shards,
                "The shard leases can be written again."
            );
            if let Some(health) = &self.health {
                health.set(Ok(()));
            }
        }
    }

    /// Says once, at WARN and in readiness, that the leases have not been writable for a whole lease
    /// duration: by then whatever this runner held has lapsed, and the jobs of shards nobody holds are
    /// not monitored. Below that a failure is a blip a renewal absorbs, and stays at DEBUG.
    fn tell_failing(&mut self, now: Instant) {
        let Some((since, error)) = &self.failing else {
            return;
        };
        let failing_for = now.saturating_duration_since(*since);
        if self.told || failing_for < self.settings.duration {
            return;
        }
        self.told = true;
        let why = format!(
            "cannot write its shard leases for {}s ({error}): it holds {} of {} shards of the \
             monitoring duty; the jobs of a shard nobody holds are not monitored (no RUNNING, ticks, \
             expiry or end)",
            failing_for.as_secs(),
            self.mine.len(),
            self.settings.shards
        );
        tracing::warn!("This runner {why}.");
        if let Some(health) = &self.health {
            health.set(Err(why));
        }
    }

    /// From now on every renewal of this runner's member lease writes what `problem` says (in
    /// [`RUNNER_PROBLEM`], removed when `None`), so that `admin status` can show it.
    pub fn with_note(
        mut self,
        problem: impl Fn() -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.note = Some(Box::new(problem));
        self
    }

    /// From now on every write of a shard lease lists the records of confirmed QUEUEDs that `records`
    /// carries for its jobs ([`QUEUED_CARRIED`]), and a shard taken over hands the ones its lease lists
    /// to `records`.
    pub fn with_carried_records(mut self, records: Arc<dyn CarriedRecords>) -> Self {
        self.carried = Some(records);
        self
    }

    /// Whether this runner's leases say it tells the QUEUED of `shard`'s jobs left to it: only once its
    /// monitor has listed the shard ([`HeldShards::set_listed`]).
    fn tells(&self, shard: u32) -> bool {
        self.listed.borrow().contains(&shard)
    }

    /// Waits until the monitor has listed a shard it had not when the last round began: that round
    /// runs at once then, so that the lease says it without waiting for the next renewal.
    fn newly_listed(&self) -> impl Future<Output = ()> + use<> {
        let mut listed = self.listed.clone();
        let said = self.said.clone();
        async move {
            loop {
                if listed
                    .borrow_and_update()
                    .difference(&said)
                    .next()
                    .is_some()
                {
                    return;
                }
                if listed.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        }
    }

    /// Hands the records listed on the leases just taken over to the monitor's carried records: called
    /// once the shards are in the held set, which the records of their jobs need.
    fn adopt_taken_over(&mut self) {
        let taken = std::mem::take(&mut self.taken_over);
        if let Some(records) = &self.carried {
            for value in &taken {
                records.adopt(value);
            }
        }
    }

    /// Takes part in the leases until `shutdown` completes, then gives every shard back and removes this
    /// runner's member lease, so the others take over at once.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut rounds = tokio::time::interval(self.settings.renew_interval);
        rounds.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next_expiry = self
                .mine
                .values()
                .chain(self.releasing.values())
                .min()
                .copied();
            let handed_over = {
                let duties = self.duties.clone();
                let releasing: BTreeSet<u32> = self.releasing.keys().copied().collect();
                async move {
                    if releasing.is_empty() {
                        std::future::pending::<()>().await;
                    }
                    duties.one_ended(&releasing).await;
                }
            };
            tokio::select! {
                () = &mut shutdown => break,
                // Said on the leases at once: until then other runners' submit paths tell the QUEUED
                // of the shard's jobs themselves, each with a write of its record.
                () = self.newly_listed() => {
                    let round = self.round();
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = round => {}
                    }
                }
                () = handed_over => {
                    let release = self.release_ready(None, Instant::now());
                    tokio::select! {
                        () = &mut shutdown => break,
                        _ = release => {}
                    }
                }
                _ = rounds.tick() => {
                    let round = self.round();
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = round => {}
                    }
                }
                () = sleep_until_opt(next_expiry) => {
                    let now = Instant::now();
                    if self.releasing.values().any(|until| *until <= now) {
                        let release = self.release_ready(None, now);
                        tokio::select! {
                            () = &mut shutdown => break,
                            _ = release => {}
                        }
                    }
                }
                () = sleep_until_opt(self.next_lapse) => {
                    self.next_lapse = None;
                    let round = self.round();
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = round => {}
                    }
                }
            }
            self.drop_expired(Instant::now());
            self.publish();
            self.adopt_taken_over();
        }
        self.leave().await;
    }

    /// One round: list, renew membership, decide, write.
    async fn round(&mut self) {
        self.said = self.listed.borrow().clone();
        let listed = self.list().await;
        let leases = match listed {
            Ok(leases) => leases,
            Err(e) => {
                tracing::warn!(error = %e, "Could not list the shard leases; keeping what is held until it lapses.");
                return;
            }
        };
        let now = Instant::now();
        self.observe(&leases, now);
        let by_name: BTreeMap<&str, &Lease> = leases
            .iter()
            .filter_map(|l| Some((l.metadata.name.as_deref()?, l)))
            .collect();

        self.renew_membership(
            by_name
                .get(self.settings.member_name(&self.settings.identity).as_str())
                .copied(),
        )
        .await;
        let live = self.live_members(&leases, now);

        // Shards handed over whose work has ended (if it had not ended at once): release them now.
        let released = self.release_ready(Some(&leases), now).await;

        let holders: Vec<Holder> = (0..self.settings.shards)
            .map(|shard| {
                let lease = by_name
                    .get(self.settings.shard_name(shard).as_str())
                    .copied();
                if released.contains(&shard) {
                    // Just given back: not ours, and for others to take.
                    return Holder::Other { expired: false };
                }
                self.holder_of(shard, lease, now)
            })
            .collect();
        // Shards we think we hold but the cluster gives to someone else are lost.
        for (shard, holder) in holders.iter().enumerate() {
            if *holder != Holder::Me {
                self.mine.remove(&(shard as u32));
            }
        }
        self.next_lapse = self.next_lapse_of(&holders, &by_name, now);
        let short_member = self.short_member(&holders, &by_name, live);
        let Decision {
            renew,
            acquire,
            release,
        } = decide_with(&self.settings.identity, &holders, live, short_member);
        for shard in release {
            // Not in the set (a renewal failed long enough ago): its deadline has passed.
            let until = self.mine.remove(&shard).unwrap_or(now);
            self.releasing.insert(shard, until);
        }
        self.publish();
        for shard in renew {
            let lease = by_name
                .get(self.settings.shard_name(shard).as_str())
                .copied();
            self.take(shard, lease, false).await;
        }
        for shard in acquire {
            let lease = by_name
                .get(self.settings.shard_name(shard).as_str())
                .copied();
            self.take(shard, lease, true).await;
        }
        self.gc_members(&leases, now).await;
        self.tell_failing(Instant::now());
    }

    /// Notes the version each lease was listed at (a lease's age is how long its version has not
    /// moved, on this runner's clock), and forgets the leases gone.
    fn observe(&mut self, leases: &[Lease], now: Instant) {
        for lease in leases {
            if let (Some(name), Some(rv)) = (&lease.metadata.name, &lease.metadata.resource_version)
            {
                self.observations.observe(name, rv, now);
            }
        }
        self.observations.retain(|name| {
            leases
                .iter()
                .any(|l| l.metadata.name.as_deref() == Some(name))
        });
    }

    /// When the first shard another runner holds lapses if its holder stops renewing it.
    fn next_lapse_of(
        &self,
        holders: &[Holder],
        by_name: &BTreeMap<&str, &Lease>,
        now: Instant,
    ) -> Option<Instant> {
        (0..self.settings.shards)
            .zip(holders)
            .filter(|(_, h)| **h == Holder::Other { expired: false })
            .filter_map(|(shard, _)| {
                let name = self.settings.shard_name(shard);
                let lease = by_name.get(name.as_str())?;
                holder(lease)?;
                let unchanged = self.observations.unchanged_for(&name, now);
                let left = self.lease_duration_of(lease).checked_sub(unchanged)?;
                Some(now + left)
            })
            .min()
    }

    /// Whether a live runner is short of its share (a newcomer holding none, or one that got fewer
    /// than the floor of the share, say because a shard it asked for was taken first): the others then
    /// hand over what it takes.
    fn short_member(
        &self,
        holders: &[Holder],
        by_name: &BTreeMap<&str, &Lease>,
        live: usize,
    ) -> bool {
        let mut holding: BTreeMap<&str, usize> = BTreeMap::new();
        for lease in (0..self.settings.shards)
            .zip(holders)
            .filter(|(_, h)| matches!(h, Holder::Me | Holder::Other { expired: false }))
            .filter_map(|(shard, _)| by_name.get(self.settings.shard_name(shard).as_str()))
        {
            if let Some(name) = holder(lease) {
                *holding.entry(name).or_default() += 1;
            }
        }
        let floor = self.settings.shards as usize / live.max(1);
        live > holding.len() || holding.values().any(|held| *held < floor)
    }

    /// Gives up for good the shards given back whose work has ended, or whose deadline has passed, and
    /// returns them: those whose work has ended are released, the others left to lapse. `leases`: as
    /// listed just now (`None`: listed here). See [`Self::release`] for a release that fails.
    async fn release_ready(&mut self, leases: Option<&[Lease]>, now: Instant) -> BTreeSet<u32> {
        let busy = self.duties.busy(&self.releasing.keys().copied().collect());
        let ready: BTreeSet<u32> = self
            .releasing
            .iter()
            .filter(|(shard, until)| !busy.contains(shard) || now >= **until)
            .map(|(shard, _)| *shard)
            .collect();
        if ready.is_empty() {
            return ready;
        }
        self.releasing.retain(|shard, _| !ready.contains(shard));
        // Work still under way at the deadline (a write in flight behind a slow API): the lease lapses
        // instead, so the next holder starts a whole `duration` after the last renewal, not at once,
        // and the write has that much longer to land first.
        let release: BTreeSet<u32> = ready.difference(&busy).copied().collect();
        if release.len() < ready.len() {
            tracing::debug!(shards = ?ready.intersection(&busy).collect::<Vec<_>>(), "Shards given back still have work under way at their deadline; their leases lapse.");
        }
        self.release(&release, leases).await;
        ready
    }

    /// Writes the leases of `shards` that still name this runner as held by nobody, so that another
    /// runner takes them at once. `leases`: as listed just now (`None`: listed here, if there is
    /// anything to release). A lease that cannot be listed or written still names this runner: the
    /// next round reads it as this runner's again and decides anew, giving it back (without a write
    /// while its work is under way) as long as another runner is short of its share, renewing it when
    /// none is; it lapses only when this runner stops renewing (at shutdown, or dead).
    async fn release(&self, shards: &BTreeSet<u32>, leases: Option<&[Lease]>) {
        if shards.is_empty() {
            return;
        }
        let listed;
        let leases = match leases {
            Some(leases) => leases,
            None => match self.list().await {
                Ok(l) => {
                    listed = l;
                    &listed
                }
                Err(e) => {
                    tracing::debug!(error = %e, "Could not list the leases to release shards; the next round decides on them again.");
                    return;
                }
            },
        };
        for &shard in shards {
            let name = self.settings.shard_name(shard);
            if let Some(lease) = leases
                .iter()
                .find(|l| l.metadata.name.as_deref() == Some(name.as_str()))
                .filter(|l| self.held_by_me(l))
                && let Err(e) = self.write_holder(lease, None).await
            {
                tracing::debug!(shard, error = %e, "Releasing a shard failed; the next round decides on it again.");
            }
        }
    }

    /// Renews (`acquire == false`) or acquires a shard. On success the shard is held until the new
    /// deadline; a conflict means another runner has it.
    async fn take(&mut self, shard: u32, lease: Option<&Lease>, acquire: bool) {
        let started = Instant::now();
        let result = match lease {
            Some(lease) => self.write_holder(lease, Some(acquire)).await,
            None => {
                let tells = self.tells(shard);
                self.create_lease(&self.settings.shard_name(shard), COMPONENT_SHARD, tells)
                    .await
            }
        };
        match result {
            Ok(()) => {
                self.mine.insert(shard, self.settings.valid_until(started));
                self.write_worked();
                if acquire && let Some(value) = lease.and_then(|l| annotation(l, QUEUED_CARRIED)) {
                    self.taken_over.push(value.to_owned());
                }
            }
            Err(e) if e.is_conflict() || e.is_already_exists() => {
                self.mine.remove(&shard);
            }
            Err(e) => {
                tracing::debug!(shard, error = %e, "Lease write failed; the shard lapses if this goes on.");
                self.write_failed(&e);
            }
        }
    }

    fn holder_of(&self, shard: u32, lease: Option<&Lease>, now: Instant) -> Holder {
        let Some(lease) = lease else {
            return Holder::Free;
        };
        match holder(lease) {
            None => Holder::Free,
            Some(h) if h == self.settings.identity && !self.releasing.contains_key(&shard) => {
                Holder::Me
            }
            Some(h) if h == self.settings.identity => Holder::Other { expired: false },
            Some(_) => {
                let name = self.settings.shard_name(shard);
                Holder::Other {
                    expired: self
                        .observations
                        .expired(&name, self.lease_duration_of(lease), now),
                }
            }
        }
    }

    /// [`QUEUED_CARRIED`] for the shard lease `name`, as this runner's monitor carries its records.
    fn listed(&self, name: &str) -> Option<String> {
        let records = self.carried.as_ref()?;
        records.listed(self.shard_number(name)?, self.settings.shards)
    }

    /// The shard whose lease is named `name`.
    fn shard_number(&self, name: &str) -> Option<u32> {
        name.strip_prefix(&format!("{}-shard-", self.settings.prefix))?
            .parse()
            .ok()
    }

    fn held_by_me(&self, lease: &Lease) -> bool {
        holder(lease) == Some(self.settings.identity.as_str())
    }

    /// The longer of our duration and the one the holder wrote: a holder configured with a longer
    /// duration is never cut short.
    fn lease_duration_of(&self, lease: &Lease) -> Duration {
        let theirs = lease
            .spec
            .as_ref()
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs)
            .unwrap_or_default();
        self.settings.duration.max(theirs)
    }

    /// Runners alive: this one plus every other member lease that changed within its duration.
    fn live_members(&self, leases: &[Lease], now: Instant) -> usize {
        let me = self.settings.member_name(&self.settings.identity);
        1 + leases
            .iter()
            .filter(|l| component(l) == Some(COMPONENT_MEMBER))
            .filter_map(|l| Some((l.metadata.name.as_deref()?, l)))
            .filter(|(name, l)| {
                *name != me
                    && !self
                        .observations
                        .expired(name, self.lease_duration_of(l), now)
            })
            .count()
    }

    async fn renew_membership(&self, lease: Option<&Lease>) {
        let name = self.settings.member_name(&self.settings.identity);
        let result = match lease {
            Some(lease) => {
                let mut lease = lease.clone();
                let problem = self.note.as_ref().and_then(|note| note());
                let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
                match problem {
                    Some(problem) => annotations.insert(RUNNER_PROBLEM.to_owned(), problem),
                    None => annotations.remove(RUNNER_PROBLEM),
                };
                self.write_holder(&lease, Some(false)).await
            }
            None => self.create_lease(&name, COMPONENT_MEMBER, false).await,
        };
        if let Err(e) = result {
            tracing::debug!(error = %e, "Could not renew this runner's member lease.");
        }
    }

    /// Deletes member leases of runners that have been silent for several lease durations.
    async fn gc_members(&self, leases: &[Lease], now: Instant) {
        for lease in leases
            .iter()
            .filter(|l| component(l) == Some(COMPONENT_MEMBER))
        {
            let Some(name) = lease.metadata.name.as_deref() else {
                continue;
            };
            let dead_for = self.lease_duration_of(lease) * MEMBER_GC_FACTOR;
            if name == self.settings.member_name(&self.settings.identity)
                || !self.observations.expired(name, dead_for, now)
            {
                continue;
            }
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: lease.metadata.resource_version.clone(),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            let deleted = self.timed(self.api.delete(name, &params)).await;
            if let Err(e) = deleted.classify(|| format!("delete Lease {name}")) {
                tracing::debug!(lease = name, error = %e, "Could not remove a dead runner's member lease.");
            }
        }
    }

    async fn list(&self) -> Result<Vec<Lease>, ClusterError> {
        let selector = format!("{LEASE_GROUP}={}", self.settings.prefix);
        let params = ListParams::default().labels(&selector);
        let listed = self.timed(self.api.list(&params)).await;
        Ok(listed.classify(|| "list Leases".to_owned())?.items)
    }

    /// Creates the lease `name` held by this runner; a shard lease says [`TELLS_QUEUED`] when
    /// `tells_queued`.
    async fn create_lease(
        &self,
        name: &str,
        component: &str,
        tells_queued: bool,
    ) -> Result<(), ClusterError> {
        let now = jiff::Timestamp::now();
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(BTreeMap::from([
                    (MANAGED_BY.to_owned(), MANAGER.to_owned()),
                    (COMPONENT.to_owned(), component.to_owned()),
                    (LEASE_GROUP.to_owned(), self.settings.prefix.clone()),
                ])),
                annotations: tells_queued.then(|| {
                    BTreeMap::from([(TELLS_QUEUED.to_owned(), self.settings.identity.clone())])
                }),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.settings.identity.clone()),
                lease_duration_seconds: Some(self.settings.duration_seconds()),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        let created = self.timed(self.api.create(&params, &lease)).await;
        created
            .classify(|| format!("create Lease {name}"))
            .map(drop)
    }

    /// Writes a lease with its resourceVersion: `Some(false)` renews ours, `Some(true)` takes it over,
    /// `None` releases it.
    async fn write_holder(&self, lease: &Lease, take: Option<bool>) -> Result<(), ClusterError> {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let now = MicroTime(jiff::Timestamp::now());
        let mut updated = lease.clone();
        if component(lease) == Some(COMPONENT_SHARD) {
            // Said with every write of the holder (no request of its own): its monitor tells the
            // QUEUED of the jobs left to it. A release leaves nobody to say it of.
            let annotations = updated
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new);
            let tells = self.shard_number(&name).is_some_and(|s| self.tells(s));
            match take {
                Some(_) if tells => {
                    annotations.insert(TELLS_QUEUED.to_owned(), self.settings.identity.clone())
                }
                _ => annotations.remove(TELLS_QUEUED),
            };
            // Also said with every write: the records this runner carries for the shard's jobs. A
            // lease taken over keeps what its last holder listed (taken on once the write has worked),
            // so that a runner killed before its first renewal loses none of them.
            let listed = self.listed(&name);
            let kept = (take == Some(true))
                .then(|| annotations.get(QUEUED_CARRIED).cloned())
                .flatten();
            match join_listed(kept, listed) {
                Some(value) => annotations.insert(QUEUED_CARRIED.to_owned(), value),
                None => annotations.remove(QUEUED_CARRIED),
            };
        }
        let spec = updated.spec.get_or_insert_with(LeaseSpec::default);
        match take {
            Some(acquire) => {
                if acquire {
                    spec.acquire_time = Some(now.clone());
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.holder_identity = Some(self.settings.identity.clone());
                spec.lease_duration_seconds = Some(self.settings.duration_seconds());
                spec.renew_time = Some(now);
            }
            None => {
                spec.holder_identity = None;
                spec.renew_time = Some(now);
            }
        }
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        let replaced = self.timed(self.api.replace(&name, &params, &updated)).await;
        replaced
            .classify(|| format!("update Lease {name}"))
            .map(drop)
    }

    /// Runs one request with the lease request timeout (a renewal must not outlive its round).
    async fn timed<T>(
        &self,
        fut: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        match tokio::time::timeout(self.settings.request_timeout, fut).await {
            Ok(result) => result,
            Err(_) => Err(kube::Error::Service(
                format!("no answer within {:?}", self.settings.request_timeout).into(),
            )),
        }
    }

    fn drop_expired(&mut self, now: Instant) {
        self.mine.retain(|_, until| now < *until);
    }

    fn publish(&self) {
        {
            let mut deadlines = self.deadlines.lock().unwrap_or_else(|e| e.into_inner());
            deadlines.clone_from(&self.mine);
        }
        let held: BTreeSet<u32> = self.mine.keys().copied().collect();
        self.tx.send_if_modified(|current| {
            let changed = current.held != held;
            if changed {
                current.held = held;
            }
            changed
        });
    }

    /// Stops every duty, lets the work under way end (until the shards' deadlines at most), then
    /// releases the shards whose work has ended (the others lapse) and deletes the member lease (best
    /// effort, bounded).
    async fn leave(mut self) {
        let mut shards = std::mem::take(&mut self.mine);
        shards.append(&mut self.releasing);
        self.publish();
        if let Some(until) = shards.values().max().copied() {
            let held = shards.keys().copied().collect();
            let _ = tokio::time::timeout_at(until, self.duties.ended(&held)).await;
        }
        // A shard whose work is still under way lapses rather than being released (see `release_ready`).
        let held: BTreeSet<u32> = shards.into_keys().collect();
        let busy = self.duties.busy(&held);
        self.release(&held.difference(&busy).copied().collect(), None)
            .await;
        let member = self.settings.member_name(&self.settings.identity);
        let deleted = self
            .timed(self.api.delete(&member, &DeleteParams::default()))
            .await;
        if let Err(e) = deleted.classify(|| format!("delete Lease {member}")) {
            tracing::debug!(error = %e, "Could not remove this runner's member lease at shutdown.");
        }
    }
}

/// The lease's holder, if any.
pub fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// Whether a shard lease says that its holder's monitor tells the QUEUED of the jobs left to it
/// ([`TELLS_QUEUED`] naming the holder; an annotation naming another runner is a leftover of an older
/// holder, which keeps what it finds).
pub fn tells_queued(lease: &Lease) -> bool {
    holder(lease).is_some_and(|h| annotation(lease, TELLS_QUEUED) == Some(h))
}

fn component(lease: &Lease) -> Option<&str> {
    value_of(lease.metadata.labels.as_ref(), COMPONENT)
}

fn annotation<'a>(lease: &'a Lease, key: &str) -> Option<&'a str> {
    value_of(lease.metadata.annotations.as_ref(), key)
}

/// The value of `key` in a label or annotation map.
fn value_of<'a>(
    map: Option<&'a std::collections::BTreeMap<String, String>>,
    key: &str,
) -> Option<&'a str> {
    map.and_then(|m| m.get(key)).map(String::as_str)
}

/// [`QUEUED_CARRIED`] of a lease taken over: what this runner lists, then what its last holder listed
/// (`kept`) and this runner does not, at most [`QUEUED_CARRIED_MAX`] records; `None` when there is none.
fn join_listed(kept: Option<String>, listed: Option<String>) -> Option<String> {
    let mut seen = std::collections::HashSet::new();
    let records: Vec<&str> = listed
        .iter()
        .chain(kept.iter())
        .flat_map(|value| value.split_whitespace())
        .filter(|record| seen.insert(*record))
        .take(QUEUED_CARRIED_MAX)
        .collect();
    (!records.is_empty()).then(|| records.join(" "))
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The host name (a pod's name) made into a DNS label, plus a random suffix so that a restarted process
/// is a new member and never inherits its predecessor's leases by accident.
fn default_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .unwrap_or_default();
    identity_from(&host, random_suffix())
}

fn identity_from(host: &str, suffix: u32) -> String {
    let mut name: String = host
        .trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(40)
        .collect();
    name = name.trim_matches('-').to_owned();
    if name.is_empty() {
        name = "runner".to_owned();
    }
    let identity = format!("{name}-{suffix:06x}");
    debug_assert!(labels::check_dns_label(&identity).is_ok(), "{identity}");
    identity
}

fn random_suffix() -> u32 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    (hasher.finish() & 0x00ff_ffff) as u32
}

#[cfg(test)]
mod tests {

    /// A lease taken over lists this runner's records and the dead holder's once each, at most
    /// `QUEUED_CARRIED_MAX` of them.
    #[test]
    fn a_lease_taken_over_lists_each_record_once_and_no_more_than_the_bound() {
        assert_eq!(join_listed(None, None), None);
        assert_eq!(join_listed(Some(String::new()), None), None);
        assert_eq!(
            join_listed(
                Some("a/j-1@1 a/j-2@2".into()),
                Some("a/j-2@2 a/j-3@3".into())
            )
            .as_deref(),
            Some("a/j-2@2 a/j-3@3 a/j-1@1")
        );
        let many: Vec<String> = (0..QUEUED_CARRIED_MAX + 10)
            .map(|n| format!("a/j-{n}@{n}"))
            .collect();
        let joined = join_listed(Some(many.join(" ")), Some("b/j-x@1".into())).unwrap();
        let records: Vec<&str> = joined.split(' ').collect();
        assert_eq!(records.len(), QUEUED_CARRIED_MAX);
        assert_eq!(records[0], "b/j-x@1", "this runner's own first");
    }
    use super::*;

    #[test]
    fn identities_are_dns_labels() {
        assert_eq!(
            identity_from("runner-7f9c-abcde", 0xabc),
            "runner-7f9c-abcde-000abc"
        );
        assert_eq!(
            identity_from("My_Host.example\n", 1),
            "my-host-example-000001"
        );
        assert_eq!(identity_from("", 2), "runner-000002");
        let long = identity_from(&"x".repeat(200), 0xffffff);
        assert!(labels::check_dns_label(&long).is_ok(), "{long}");
        assert_ne!(default_identity(), default_identity());
    }

    #[test]
    fn a_renewal_holds_until_duration_minus_margin() {
        let s = Settings {
            identity: "a".into(),
            prefix: "vr".into(),
            shards: 4,
            duration: Duration::from_secs(10),
            renew_interval: Duration::from_secs(2),
            safety_margin: Duration::from_secs(2),
            request_timeout: Duration::from_secs(2),
        };
        let t = Instant::now();
        assert_eq!(s.valid_until(t), t + Duration::from_secs(8));
        assert_eq!(s.shard_name(3), "vr-shard-3");
        assert_eq!(s.member_name("a"), "vr-member-a");
        assert_eq!(s.duration_seconds(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn held_shards_lapse_at_their_deadline_without_any_update() {
        let deadlines = Arc::new(Mutex::new(BTreeMap::new()));
        let shards = 4;
        let job = "42";
        let shard = shard_of(job, shards);
        deadlines
            .lock()
            .unwrap()
            .insert(shard, Instant::now() + Duration::from_secs(8));
        let held = HeldShards {
            shards,
            held: BTreeSet::from([shard]),
            deadlines,
            duties: Duties::default(),
            listed: Arc::new(watch::Sender::new(BTreeSet::new())),
        };
        assert!(held.owns(job));
        assert!(!held.holds((shard + 1) % shards));
        assert_eq!(held.valid_now(), BTreeSet::from([shard]));
        tokio::time::advance(Duration::from_secs(8)).await;
        assert!(!held.owns(job), "the deadline alone ends the duty");
        assert!(held.valid_now().is_empty());
    }
}
