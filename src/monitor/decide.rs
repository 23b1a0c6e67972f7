//! The monitor's decision for one job: a pure function from what was observed (the VolcanoJob with its
//! annotations, its pods, its PodGroup, its place in the queue) and `now` to the next [`Step`]. The
//! executor carries the step out (publish, then persist, then delete) and asks again; it never decides.
//!
//! # The life of a job, as persisted
//! ```text
//!  QUEUED ──(phase Running)──▶ RUNNING ──(end observed)──▶ outcome recorded ──▶ terminal published ──▶ gone
//!    │  status events when the pending reason changes            │                 (+ final tick,
//!    │  FAILURE after the image-pull grace / queue timeout ──────┘                   proxy remove)
//! ```
//! Checked in this order, each one only when the earlier ones do not apply:
//! 1. The terminal state is published: end the job if Volcano has not (a `TerminateJob` command), delete
//!    its companions, remove our finalizer; Volcano's `ttlSecondsAfterFinished` deletes the job later.
//!    (A job created without the TTL, by an older runner, is released by a deletion that the finalizer
//!    holds until the retention has passed, as before.)
//! 2. An outcome is recorded: publish the final ticks, the proxy remove and the terminal event (RUNNING
//!    first if it was never published), then persist the terminal state.
//! 3. The job was asked to end (`terminationAt`, written with the cause before the `TerminateJob`
//!    command; or a deletion, by an older runner): once its pods have stopped (or `cleanup_grace` has
//!    passed), record the outcome by the persisted termination cause (EXPIRED, CANCELLED, FAILURE with
//!    the cause), W11.
//! 4. Volcano finished the job (or every rank's program ended `cleanup_grace` ago): record SUCCESS when
//!    every rank exited 0, else FAILURE with every exit code (W9: never "Failed becomes SUCCESS"). A
//!    SUCCESS seen whole and final is not recorded first but closed at once: published, then recorded
//!    with the terminal state and the finalizer's removal in one write ([`close_at_once`]).
//!
//!    (4c) A booked job's pods are gated until its booked start: wait for it, then lift the gate
//!    ([`booked_start`], docs/bookings.md); only then do the maintenance windows judge it (4d).
//! 5. Not started, the image cannot be pulled for longer than `image_pull_grace`: record FAILURE.
//! 6. Not started, waiting longer than `queue_timeout`: record FAILURE with the pending reason.
//! 7. Started, RUNNING not yet published: the start hooks (jobStart, expiry, proxy create) and RUNNING.
//! 8. Running: the monitoring hooks (accounting ticks, expiry warnings and deletion, proxy updates).
//! 9. Pending: a status event when the plain-language reason changed.
//!
//! Recording the outcome is the only write before a publication. It records a decision (and the facts it
//! rests on: times, exit codes, log tails), not that anything was published, so a kill right after it
//! loses nothing: whoever looks next publishes from the record, and says exactly the same. A success
//! closed at once needs no such record: the facts it rests on are the finished pods', which whoever
//! looks next reads the same.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Pod, Toleration};

use super::events;
use super::observe::{self, Disruption, PendingInput, PullFailure, RankView};
use super::peers::{self, PeerSeen, PeerView};
use super::record::{Outcome, Published, RankCode, Record, Terminal};
use crate::cluster::Window;
use crate::config::Config;
use crate::durable::AnnotationKeys;
use crate::durable::annotations::format_millis;
use crate::durable::history;
use crate::forecast::Estimate;
use crate::pipeline::hooks::{
    self, FactsError, HookPlan, JobFacts, Outbound, PluginFailure, TerminationCause,
};
use crate::pipeline::plugins::expiry::human;
use crate::volcano::{JobPhase, PodGroup, VolcanoJob};

/// What the decision needs besides the job: configuration and identity.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The whole configuration (the hooks read `[pipeline]`).
    pub config: Arc<Config>,
    pub keys: AnnotationKeys,
    /// `<prefix>cleanup`.
    pub finalizer: String,
    /// Goes into every event's `runner_id`.
    pub runner_id: String,
    /// `<prefix>acceptedBy`: the runner that created the job, which its QUEUED names.
    pub accepted_by: String,
    /// `<prefix>queuedConfirmed` (the job's QUEUED was confirmed) and `<prefix>queuedBy` (with
    /// `monitor`, the job's monitor tells it; see [`crate::monitor::queued`]).
    pub queued: super::queued::QueuedKeys,
    pub image_pull_grace: SignedDuration,
    pub queue_timeout: Option<SignedDuration>,
    /// `[monitor] peer_missing_after` (see [`super::peers::never_comes`]).
    pub peer_missing_after: SignedDuration,
    /// `[monitor] pending_status_after`.
    pub pending_status_after: SignedDuration,
    /// `[monitor] estimate_tolerance`.
    pub estimate_tolerance: SignedDuration,
    /// `[monitor] start_margin`: a told start is this long after the instant the replay places a job.
    pub start_margin: SignedDuration,
    /// `[monitor] log_tails_on_success`.
    pub log_tails_on_success: bool,
    pub cleanup_grace: SignedDuration,
    /// How long an ended job is kept as the record of its submission (`[cluster] ended_job_retention`).
    pub retention: SignedDuration,
    /// `[monitor] maintenance_warn_before`.
    pub maintenance_warn_before: SignedDuration,
}

impl Settings {
    pub fn new(config: Arc<Config>, runner_id: impl Into<String>) -> Self {
        let keys = AnnotationKeys::new(&config.pipeline.annotation_prefix);
        let m = &config.monitor;
        let signed =
            |d: std::time::Duration| SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX);
        Self {
            finalizer: keys.cleanup_finalizer(),
            accepted_by: keys.accepted_by.clone(),
            queued: super::queued::QueuedKeys::new(&keys.prefix),
            keys,
            runner_id: runner_id.into(),
            image_pull_grace: signed(m.image_pull_grace),
            queue_timeout: m.queue_timeout.map(signed),
            peer_missing_after: signed(m.peer_missing_after),
            pending_status_after: signed(m.pending_status_after),
            estimate_tolerance: signed(m.estimate_tolerance),
            start_margin: SignedDuration::try_from(m.start_margin).unwrap_or(SignedDuration::ZERO),
            log_tails_on_success: m.log_tails_on_success,
            cleanup_grace: signed(m.cleanup_grace),
            retention: signed(config.cluster.ended_job_retention),
            maintenance_warn_before: signed(m.maintenance_warn_before),
            config,
        }
    }
}

/// One job as observed.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    pub job: &'a VolcanoJob,
    pub pods: &'a [Pod],
    pub podgroup: Option<&'a PodGroup>,
    /// PodGroups ahead of this job's in its queue.
    pub jobs_ahead: Option<u32>,
    /// When it will start, while it waits and the monitor knows the nodes.
    pub estimate: Option<&'a Estimate>,
    /// Its estimate is being made: a status now would go out again with it a moment later.
    pub estimate_pending: bool,
    /// The last disruption of its ranks the watch saw (a node lost, an eviction), with Volcano's
    /// `retryCount` at the time.
    pub disruption: Option<(i32, &'a Disruption)>,
    /// When the job and pods were read from the API just now: an instant taken before the read, so the
    /// view proves the job's state at least until then. `None` for the watch's view, whose age is
    /// unknown.
    pub fresh_at: Option<Timestamp>,
    /// This process published the job's QUEUED and the broker confirmed it (see
    /// [`crate::monitor::queued`]): the monitor's first event of the job needs no copy of it before.
    pub queued_confirmed: bool,
    /// This runner's view of the cancels has a tombstone of the job: a cancel overtook its submission,
    /// and the runner that took the submission may be claiming the job to tell CANCELLED alone. Only
    /// read for a job whose QUEUED is left to its monitor (see [`tell_queued`]).
    pub cancel_seen: bool,
    /// The maintenance windows as this runner's watch has them (`None` until first listed: nothing is
    /// let go of a window's hold before the monitor knows the windows).
    pub maintenance: Option<&'a [Window]>,
    /// This runner may write the maintenance windows' node taints (see [`super::maintenance`]): `false`
    /// once the cluster refused it the node patch. What holds a job is the taints on the nodes
    /// (`maintenance_tainted`), whoever wrote them; this only tells a window whose taint is not on a
    /// node yet apart: this runner will write it (the job is told when it is there), or it may not
    /// (the job is told it cannot be held, unless another runner writes it).
    pub maintenance_taints: bool,
    /// The windows whose taint is on a node, as the monitor's watch of the nodes has them.
    pub maintenance_tainted: Option<&'a BTreeSet<String>>,
    /// Its peers as the watches show them (see [`super::peers`]); empty for a job without.
    pub peers: &'a [PeerSeen],
    /// When this monitor saw the job enter its current phase, by its own clock (`None`: not known, or
    /// the job came to the cache in it; see [`super::cache::Snapshot::phase_seen`]). A monitor behind
    /// its watches sees a phase late, and its pods' events are then already on their way: the wait for them counts from here, not only from Volcano's transition, or every
    /// start and end of a lagging monitor would cost a read of the job and its pods.
    pub phase_seen: Option<Timestamp>,
}

impl<'a> Observed<'a> {
    /// What a decision sees of `job` and `pods` alone: no PodGroup, queue, estimate, disruption or peer,
    /// no maintenance window, nothing confirmed or read afresh (a job gone from the cluster, whose last
    /// state is all there is; and the decision's tests, which name only what differs).
    pub fn plain(job: &'a VolcanoJob, pods: &'a [Pod]) -> Self {
        Observed {
            job,
            pods,
            podgroup: None,
            jobs_ahead: None,
            estimate: None,
            estimate_pending: false,
            disruption: None,
            fresh_at: None,
            queued_confirmed: false,
            cancel_seen: false,
            maintenance: Some(&[]),
            maintenance_taints: false,
            maintenance_tainted: None,
            peers: &[],
            phase_seen: None,
        }
    }
}

/// What to do next for a job.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Nothing until `next_check` (or until something about the job changes).
    Wait { next_check: Option<Timestamp> },
    /// Record the outcome: read the log tails of these `(rank, pod)`s into it, persist it with `set`
    /// (guarded by a test of the annotations decided on), then decide again.
    Record {
        outcome: Outcome,
        logs: Vec<(u32, String)>,
        set: BTreeMap<String, String>,
        /// Take it only on a view read just now. Not needed when the watch's view already holds the
        /// whole, final end: Volcano has finished the job and every rank's program has ended in it
        /// (an ended program does not change; a read would find the same).
        fresh: bool,
    },
    /// Publish, then persist, then delete and unfinalize.
    Act(Action),
}

impl Step {
    /// Whether this step may only be taken on a view of the job and its pods read just now, not on the
    /// watch's: it fixes a start or an end, or charges up to `now` on the strength of the pods still
    /// running. A watch that lags behind would otherwise let a tick run past the real end.
    pub fn needs_fresh_view(&self) -> bool {
        match self {
            Step::Wait { .. } => false,
            Step::Record { fresh, .. } => *fresh,
            Step::Act(action) => action.fresh,
        }
    }

    /// Whether a fresh view of the pods alone will do: a tick needs only the pods' running state proven
    /// at an instant. The job's own annotations need no read: the write that follows tests them, and a
    /// stale view fails that test and is read whole then.
    pub fn fresh_pods_suffice(&self) -> bool {
        matches!(self, Step::Act(action) if action.what == "monitor")
    }
}

/// Effects, executed in field order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Action {
    /// What this is, for logs and metrics: `start`, `monitor`, `status`, `end`, `close` (an end
    /// published and recorded in one write), `finish`, `gone`.
    pub what: &'static str,
    /// Published in this order, each confirmed before the next group (lifecycle events last).
    pub publish: Vec<Outbound>,
    pub set: BTreeMap<String, String>,
    pub remove: BTreeSet<String>,
    /// End the VolcanoJob (after the patch) with Volcano's `TerminateJob` command: its pods stop, the
    /// job stays (see [`crate::cluster::end`]). Nothing when Volcano is ending it already.
    pub delete: bool,
    /// Delete the VolcanoJob in the foreground (after the patch): its pods, PodGroup and companions go
    /// at once, while our finalizer keeps the job itself as the record of its submission. Only for a job
    /// created without `ttlSecondsAfterFinished` (by an older runner).
    pub release: bool,
    /// Delete the job's companions (its Services, NetworkPolicy, peers' EndpointSlice), before the
    /// finalizer goes: the kept job must not keep a public IP or a proxy Service for the retention.
    pub companions: bool,
    /// Remove our cleanup finalizer (last).
    pub remove_finalizer: bool,
    /// Decide again right after (a multi-step change).
    pub again: bool,
    pub next_check: Option<Timestamp>,
    /// Plugins that could not decide (logged; the rest of the plan stands, W6/W7).
    pub failures: Vec<PluginFailure>,
    /// Take it only on a view read just now (see [`Step::needs_fresh_view`]).
    pub fresh: bool,
    /// Write the job's peer EndpointSlice with these addresses by hostname (first of all).
    pub peer_endpoints: Option<BTreeMap<String, String>>,
    /// Then remove the scheduling gate `.0` (the peers' or the maintenance windows') from the pods `.1`.
    pub ungate: Option<(String, Vec<String>)>,
    /// And add the tolerations `.0` (of maintenance windows' taints) to the pods `.1` that lack them, in
    /// the same write as the gate's removal when both concern a pod.
    pub tolerate: Option<(Vec<Toleration>, Vec<String>)>,
    /// The job's QUEUED is published here, told by its monitor: once confirmed, the record of it rides
    /// on the monitor's next write of the job ([`crate::monitor::ConfirmedQueued::carry`]).
    pub carry_queued: bool,
    /// The outcome this action publishes is recorded by its own write, not before it ([`close_at_once`]).
    /// Once published it is what must be recorded: a write that finds the job changed under it is made
    /// again on the job read then, unless that records an end already.
    pub records_outcome: bool,
}

impl Action {
    fn from_plan(what: &'static str, plan: HookPlan) -> Self {
        Self {
            what,
            publish: plan.publish,
            set: plan.set,
            remove: plan.remove,
            delete: plan.delete.is_some(),
            release: false,
            companions: false,
            remove_finalizer: false,
            again: plan.delete.is_some(),
            next_check: plan.next_check,
            failures: plan.failures,
            fresh: false,
            peer_endpoints: None,
            ungate: None,
            tolerate: None,
            carry_queued: false,
            records_outcome: false,
        }
    }

    /// Whether there is anything to execute.
    pub fn is_empty(&self) -> bool {
        self.publish.is_empty()
            && self.peer_endpoints.is_none()
            && self.ungate.is_none()
            && self.tolerate.is_none()
            && self.set.is_empty()
            && self.remove.is_empty()
            && !self.delete
            && !self.release
            && !self.companions
            && !self.remove_finalizer
    }
}

use crate::interval::earliest;

/// What every step reads of the job first: its facts, its persisted record, and whether it is being
/// deleted and still carries our finalizer.
#[derive(Debug)]
pub struct Seen {
    pub facts: JobFacts,
    pub record: Record,
    pub deleting: Option<Timestamp>,
    pub finalized: bool,
}

impl Seen {
    pub fn read(job: &VolcanoJob, s: &Settings) -> Result<Self, FactsError> {
        Ok(Self {
            facts: JobFacts::read(job, &s.keys, &s.config.pipeline)?,
            record: Record::read(job, &s.keys),
            deleting: job.metadata.deletion_timestamp.as_ref().map(|t| t.0),
            finalized: job
                .metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| *f == s.finalizer),
        })
    }
}

/// How far the job's ranks have come, for the steps of a job whose end is not decided yet.
#[derive(Debug)]
pub struct Progress {
    pub ranks: Vec<RankView>,
    pub phase: JobPhase,
    /// Its start as persisted, else as its pods show it.
    pub started: Option<Timestamp>,
    /// Every rank's program has ended.
    pub all_ended: bool,
}

impl Progress {
    pub fn of(obs: &Observed<'_>, facts: &JobFacts) -> Self {
        let ranks = observe::ranks(&facts.job_id, obs.pods);
        let all_ended = observe::all_ranks_ended(&ranks, facts.replicas);
        Self {
            phase: obs.job.phase(),
            started: facts.start.or_else(|| hooks::pods_started_at(obs.pods)),
            ranks,
            all_ended,
        }
    }
}

/// The deadlines of a job that has not started: the image-pull grace and the queue timeout.
#[derive(Debug)]
pub struct Waits {
    /// Not started, and RUNNING never published.
    pub never_started: bool,
    pub pull: Option<PullFailure>,
    pub pull_deadline: Option<Timestamp>,
    pub queue_deadline: Option<Timestamp>,
    pub created: Option<Timestamp>,
}

impl Waits {
    pub fn of(obs: &Observed<'_>, s: &Settings, seen: &Seen, progress: &Progress) -> Self {
        let never_started =
            seen.record.published == Published::Queued && progress.started.is_none();
        let pull = never_started
            .then(|| observe::pull_failure(obs.pods))
            .flatten();
        let pull_deadline = pull
            .as_ref()
            .map(|p| p.since.checked_add(s.image_pull_grace).unwrap_or(p.since));
        let created = obs.job.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let queue_deadline = match (s.queue_timeout, created, never_started) {
            (Some(t), Some(c), true) => Some(c.checked_add(t).unwrap_or(c)),
            _ => None,
        };
        Self {
            never_started,
            pull,
            pull_deadline,
            queue_deadline,
            created,
        }
    }

    /// The earliest of these deadlines and `other`.
    fn next_check(&self, other: Option<Timestamp>) -> Option<Timestamp> {
        earliest(earliest(self.pull_deadline, self.queue_deadline), other)
    }
}

/// The decision for a job that exists (see the module documentation for the order): each numbered
/// step is a function of its own, tried in that order until one applies.
pub fn decide(obs: &Observed<'_>, s: &Settings, now: Timestamp) -> Result<Step, FactsError> {
    if rolled_back(obs.job) {
        return Ok(Step::Wait { next_check: None });
    }
    let seen = Seen::read(obs.job, s)?;
    // 1. Everything is published.
    if let Published::Ended(_) = seen.record.published {
        return Ok(after_the_end(obs, s, &seen, now));
    }
    // 2. The end is decided: publish it.
    if let Some(outcome) = &seen.record.outcome {
        return publish_outcome(obs, s, &seen, outcome, now);
    }
    // 2b. Its QUEUED is left to its monitor: told now, before anything else.
    if let Some(step) = tell_queued(obs, s, &seen, now) {
        return Ok(step);
    }
    let progress = Progress::of(obs, &seen.facts);
    // 3. Asked to end (or being deleted).
    if let Some(step) = asked_to_end(obs, s, &seen, &progress, now) {
        return Ok(step);
    }
    // 4. Finished.
    if let Some(step) = finished(obs, s, &seen, &progress, now) {
        return Ok(step);
    }
    let waits = Waits::of(obs, s, &seen, &progress);
    // 4b. Peers run together.
    let peers = peers::view(obs.peers, &s.keys);
    if !peers.is_empty()
        && let Some(step) = peer_step(
            obs,
            s,
            &seen.facts,
            &seen.record,
            &peers,
            waits.never_started,
            now,
        )
    {
        return Ok(step);
    }
    // 4c. A booked job waits for its booked start: before it, no maintenance window's toleration is
    // given to its pods (the windows' rule judges a job from now, and a booked job starts later).
    if let Some(step) = booked_start(obs, s, now) {
        return Ok(step);
    }
    // 4d. A maintenance window holds back a job that has not started.
    let hold = match maintenance_hold(obs, s, &seen.facts, waits.never_started, now) {
        Held::Waits(hold) => hold,
        Held::Step(step) => return Ok(*step),
    };
    // 5. The image cannot be pulled. 6. Waited in the queue for too long.
    if let Some(step) = image_pull(s, &seen.facts, &waits, now)
        .or_else(|| queue_timeout(obs, s, &seen.facts, &waits, &progress.phase, now))
    {
        return Ok(step);
    }
    // 7. Started: RUNNING, once.
    if let Some(step) = start(obs, s, &seen, &progress, now)? {
        return Ok(step);
    }
    // 8. Running: ticks, expiry, proxy.
    if seen.record.published == Published::Running {
        return running(obs, s, &seen, &progress, now);
    }
    // 9. Pending.
    Ok(pending_status(obs, s, &seen, &waits, &hold, &peers, now))
}

/// Step 1: everything is published. The job stays, without pods and companions, as the record that
/// its submission was carried out, until the retention has passed; then it goes.
pub fn after_the_end(obs: &Observed<'_>, s: &Settings, seen: &Seen, now: Timestamp) -> Step {
    let job = obs.job;
    let Seen {
        record,
        deleting,
        finalized,
        ..
    } = seen;
    if deleting.is_none() && crate::cluster::end::has_ttl(job) {
        // Kept by Volcano: ended (by Volcano, or by our TerminateJob now), then deleted by its
        // garbage collector `ttlSecondsAfterFinished` after. Nothing holds that deletion: the
        // finalizer goes now, with the companions, so the job never shows as `Terminating`.
        if !crate::cluster::end::is_ending(job) {
            // Asked again at the next look if Volcano has not taken it by then (the same Command
            // name: AlreadyExists while it waits).
            return Step::Act(Action {
                what: "release",
                delete: true,
                next_check: now.checked_add(s.cleanup_grace).ok(),
                ..Action::default()
            });
        }
        if *finalized {
            return Step::Act(Action {
                what: "finish",
                companions: true,
                remove_finalizer: true,
                ..Action::default()
            });
        }
        return Step::Wait { next_check: None };
    }
    if deleting.is_none() {
        return Step::Act(Action {
            what: "release",
            release: true,
            again: true,
            ..Action::default()
        });
    }
    let ended = record
        .outcome
        .as_ref()
        .map(Outcome::ended)
        .or(*deleting)
        .unwrap_or(now);
    let keep_until = ended.checked_add(s.retention).unwrap_or(ended);
    if *finalized && now < keep_until {
        return Step::Wait {
            next_check: Some(keep_until),
        };
    }
    if *finalized {
        return Step::Act(Action {
            what: "finish",
            remove_finalizer: true,
            ..Action::default()
        });
    }
    Step::Wait { next_check: None }
}

/// Step 2: the end is decided; publish it (once the job's QUEUED may have gone out).
pub fn publish_outcome(
    obs: &Observed<'_>,
    s: &Settings,
    seen: &Seen,
    outcome: &Outcome,
    now: Timestamp,
) -> Result<Step, FactsError> {
    if let Some(until) = awaiting_queued(obs, &seen.record, s, now) {
        return Ok(Step::Wait {
            next_check: Some(until),
        });
    }
    Ok(Step::Act(publish_end(
        obs,
        s,
        &seen.facts,
        &seen.record,
        outcome,
        now,
    )?))
}

/// Whether the job is an attempt to submit it that was undone ([`crate::cluster::labels::ROLLED_BACK`]):
/// it never runs, and the submission's next delivery creates it afresh, so nothing of it is told, not
/// even that it vanished.
fn rolled_back(job: &VolcanoJob) -> bool {
    crate::cluster::labels::is_rolled_back(&job.metadata)
}

/// Step 3: asked to end (or being deleted): close by the recorded cause once the pods have stopped.
pub fn asked_to_end(
    obs: &Observed<'_>,
    s: &Settings,
    seen: &Seen,
    progress: &Progress,
    now: Timestamp,
) -> Option<Step> {
    let job = obs.job;
    let deleted_at = crate::cluster::end::terminated_at(job, &s.keys)?;
    // The API server keeps a transition time to the second, the request to the millisecond: a
    // phase of the request's own second may be the request's doing, so only an earlier second
    // counts as finished before it.
    let asked_in_second = deleted_at
        .round(
            jiff::TimestampRound::new()
                .smallest(jiff::Unit::Second)
                .mode(jiff::RoundMode::Trunc),
        )
        .unwrap_or(deleted_at);
    let phase = &progress.phase;
    let finished_before =
        phase.is_finished() && phase_time(job).is_some_and(|t| t < asked_in_second);
    if finished_before {
        return None;
    }
    let grace_end = deleted_at
        .checked_add(s.cleanup_grace)
        .unwrap_or(deleted_at);
    // Until Volcano takes the TerminateJob command, the pods it will stop may not have
    // started: wait for it as for the pods, within the same grace.
    let volcano_acting = seen.deleting.is_some() || phase.is_ending();
    if (observe::any_running(obs.pods) || !volcano_acting) && now < grace_end {
        return Some(Step::Wait {
            next_check: Some(grace_end),
        });
    }
    let cut = annotation(job, &s.keys.maintenance_cut)
        .and_then(crate::durable::annotations::parse_millis);
    let outcome = by_cause(
        &seen.facts,
        &seen.record,
        &progress.ranks,
        progress.started,
        deleted_at,
        cut,
    );
    Some(record_step(s, &seen.facts, outcome, &progress.ranks, None))
}

/// Step 4: Volcano finished the job, or every rank's program ended `cleanup_grace` ago.
pub fn finished(
    obs: &Observed<'_>,
    s: &Settings,
    seen: &Seen,
    progress: &Progress,
    now: Timestamp,
) -> Option<Step> {
    let job = obs.job;
    let Progress {
        ranks,
        phase,
        started,
        all_ended,
    } = progress;
    let settled = *all_ended
        && observe::last_finish(ranks)
            .and_then(|t| t.checked_add(s.cleanup_grace).ok())
            .is_some_and(|t| now >= t);
    if !phase.is_finished() && !settled {
        return None;
    }
    let outcome = natural(job, &seen.facts, ranks, *started, to_blame(obs, s), now);
    let cause = match outcome.state {
        Terminal::Success => "completed",
        _ => "failed",
    };
    let whole = phase.is_finished() && *all_ended;
    if !whole
        && phase.is_finished()
        && let Some(until) = lag_wait(
            job,
            seen_with_every_rank(obs, seen.facts.replicas, ranks),
            now,
        )
    {
        // Volcano finished the job, the pods' watch has not delivered every rank's end yet.
        return Some(Step::Wait {
            next_check: Some(until),
        });
    }
    let mut step = record_step(s, &seen.facts, outcome, ranks, Some(cause));
    if let Step::Record { fresh, .. } = &mut step {
        *fresh = !whole;
    }
    if whole && let Some(closing) = close_at_once(obs, s, seen, &step, now) {
        return Some(closing);
    }
    Some(step)
}

/// A job that succeeded, seen whole and final (Volcano finished it and every rank's program ended in
/// the view), is closed in one write: its end is published, then the outcome is recorded together with
/// the terminal state, the finalizer's removal and the `ended` label, instead of the outcome in a write
/// of its own before it is published. `None`: the two writes stay two.
///
/// Why this is safe only here: a runner killed after publishing and before the write leaves its
/// successor the same view (a finished job's stopped pods and their exit codes and end times do not
/// change; they stay until the job's TTL), from which [`natural`] computes the same outcome, and the
/// final tick and the terminal event follow from it under the same ids. A failure is not closed so: its
/// log tails are read from the pods and its cause may be a disruption only this runner's watch saw; a
/// job that must lose companions or be sent `TerminateJob` first is not either (see
/// [`finishes_with_the_end`]). Nor is one whose QUEUED may still be on its way.
fn close_at_once(
    obs: &Observed<'_>,
    s: &Settings,
    seen: &Seen,
    record: &Step,
    now: Timestamp,
) -> Option<Step> {
    let Step::Record {
        outcome, logs, set, ..
    } = record
    else {
        return None;
    };
    // Tails kept before a command would go into the outcome (see `Executor::record`): recorded first.
    if outcome.state != Terminal::Success
        || !logs.is_empty()
        || super::end_tails::kept_on(obs.job, &s.keys.prefix)
        || !finishes_with_the_end(obs.job, s)
        || awaiting_queued(obs, &seen.record, s, now).is_some()
    {
        return None;
    }
    // A job whose facts cannot be read is recorded first: the publication after the record meets the
    // same error and reports it.
    let mut action = publish_end(obs, s, &seen.facts, &seen.record, outcome, now).ok()?;
    action.what = "close";
    action.records_outcome = true;
    action
        .set
        .extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
    action
        .set
        .insert(s.keys.outcome.clone(), outcome.to_annotation());
    Some(Step::Act(action))
}

/// What the maintenance windows decide for a job that has not started ([`maintenance_hold`]): the
/// window it waits for, when to look again, and the windows whose taints keep it off their nodes.
#[derive(Debug, Default)]
pub struct Hold<'a> {
    pub waiting: Option<super::maintenance::Waiting<'a>>,
    pub release_check: Option<Timestamp>,
    pub kept_off: Vec<&'a Window>,
}

/// Step 4d: a maintenance window holds back a job that has not started (see [`super::maintenance`]):
/// by its gate, or by the windows' node taints; it is let go (the gate lifted, its waiting pods made to
/// tolerate every window not in its way) only just in time, when the replay expects it to start now
/// ([`super::maintenance::decide_pending`]). The gate also goes from the pods of a job that started
/// before (a restart's new pods), which tolerate every window: a running job is cut by a window, not
/// held. Nothing is let go before the windows are known.
pub fn maintenance_hold<'a>(
    obs: &Observed<'a>,
    s: &Settings,
    facts: &JobFacts,
    never_started: bool,
    now: Timestamp,
) -> Held<'a> {
    let maintenance_gated = peers::gated_pods(obs.pods, &s.keys.maintenance_gate());
    let taint_prefix = s.keys.maintenance_taint();
    let tolerated = |w: &Window| super::maintenance::job_tolerates(obs.pods, &taint_prefix, &w.id);
    // The windows whose taint is on a node, whoever wrote it: they, not this runner's permission to
    // write them, keep a pod off the nodes.
    let tainted = |w: &Window| obs.maintenance_tainted.is_some_and(|t| t.contains(&w.id));
    let mut release = true;
    let mut hold = Hold::default();
    let tolerate = match obs.maintenance {
        Some(windows) if never_started => {
            let pending = pending_hold(obs, s, facts, windows, !maintenance_gated.is_empty(), now);
            release = pending.release;
            hold = pending.hold;
            pending.tolerate
        }
        Some(windows) => windows
            .iter()
            .filter(|w| w.end > now && tainted(w) && !tolerated(w))
            .collect(),
        _ => Vec::new(),
    };
    if obs.maintenance.is_none() && never_started && !maintenance_gated.is_empty() {
        // Decided again as soon as the windows are listed.
        return Held::Step(Box::new(Step::Wait { next_check: None }));
    }
    let ungate =
        (obs.maintenance.is_some() && !maintenance_gated.is_empty() && release).then(|| {
            (
                s.keys.maintenance_gate(),
                maintenance_gated
                    .iter()
                    .filter_map(|p| p.metadata.name.clone())
                    .collect::<Vec<_>>(),
            )
        });
    let tolerate = tolerations(obs.pods, &taint_prefix, &tolerate);
    if ungate.is_some() || tolerate.is_some() {
        // Not decided again at once: the pods' watch shows them without the gate, with the
        // tolerations.
        return Held::Step(Box::new(Step::Act(Action {
            what: if ungate.is_some() {
                "ungate"
            } else {
                "tolerate"
            },
            ungate,
            tolerate,
            ..Action::default()
        })));
    }
    Held::Waits(hold)
}

/// Step 4c: the pods of a booked job carry the gate `<prefix>booking` until the booked start
/// (`<prefix>bookedStart`), when it goes: the capacity set aside for them is free by then (the booking
/// counted everything that runs past it, and its taints kept the rest off), so they are placed at once.
/// Until then the job only waits: no queue timeout and no pending status, since it is not waiting for
/// room but for its time.
pub fn booked_start(obs: &Observed<'_>, s: &Settings, now: Timestamp) -> Option<Step> {
    let start = annotation(obs.job, &s.keys.booked_start)
        .and_then(crate::durable::annotations::parse_millis)?;
    let gate = s.keys.booking_gate();
    let gated = peers::gated_pods(obs.pods, &gate);
    if now < start
        && obs
            .pods
            .iter()
            .all(|p| gated.iter().any(|g| std::ptr::eq(*g, p)))
    {
        // Its pods may not exist yet (Volcano creates them once its queue admits it, at the start).
        return Some(Step::Wait {
            next_check: Some(start),
        });
    }
    if gated.is_empty() {
        return None;
    }
    Some(Step::Act(Action {
        what: "ungate",
        ungate: Some((
            gate,
            gated
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .collect(),
        )),
        ..Action::default()
    }))
}

/// What [`maintenance_hold`] decides: the job waits (as told by the [`Hold`]), or a step to take now
/// (let go, or wait for the windows to be listed).
#[derive(Debug)]
pub enum Held<'a> {
    Waits(Hold<'a>),
    Step(Box<Step>),
}

/// [`maintenance_hold`] for a job that has not started: whether it is let go now, what holds it, and
/// the windows its waiting pods must tolerate.
struct PendingHold<'a> {
    release: bool,
    hold: Hold<'a>,
    tolerate: Vec<&'a Window>,
}

fn pending_hold<'a>(
    obs: &Observed<'a>,
    s: &Settings,
    facts: &JobFacts,
    windows: &'a [Window],
    any_gated: bool,
    now: Timestamp,
) -> PendingHold<'a> {
    let taint_prefix = s.keys.maintenance_taint();
    let tolerated = |w: &Window| super::maintenance::job_tolerates(obs.pods, &taint_prefix, &w.id);
    let tainted = |w: &Window| obs.maintenance_tainted.is_some_and(|t| t.contains(&w.id));
    let created_held = annotation(obs.job, &s.keys.maintenance_held).is_some();
    let gated = super::maintenance::held_back(created_held, obs.pods.is_empty(), any_gated);
    // When the replay places it: the start it tells is `[monitor] start_margin` later (the
    // time the scheduler takes to place it), and a job is let go when it is placed.
    let margin = s.start_margin;
    let expected = match obs.estimate {
        Some(Estimate::At { start, .. }) => Some(start.checked_sub(margin).unwrap_or(*start)),
        _ => None,
    };
    let d = super::maintenance::decide_pending(
        windows,
        gated,
        obs.maintenance_taints,
        tolerated,
        tainted,
        // Judged from when it is placed: its allocation runs from the margin after, so the
        // margin counts with it (a window right after its end is in its way).
        facts.max_time.map(|m| m.checked_add(margin).unwrap_or(m)),
        expected,
        now,
    );
    // Held by a window whose taint is not on a node yet: not told so until it is (the nodes'
    // watch decides every job again then); meanwhile it is decided as any waiting job (image
    // pull, queue timeout, its statuses).
    let mut release = d.release;
    // Every rank placed, none on a window of some nodes: that window does not concern it.
    let placed_elsewhere = |w: &Window| {
        !w.all_nodes()
            && !obs.pods.is_empty()
            && obs.pods.iter().all(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .is_some_and(|n| !w.covers(n))
            })
    };
    let waiting = d
        .waiting
        .filter(|wt| !matches!(wt, super::maintenance::Waiting::NotHeld(w) if placed_elsewhere(w)));
    // Its estimate is being made (a job just queued): not let go of a window before it is
    // known whether it starts now; decided again with it.
    let live = windows
        .iter()
        .any(|w| w.end > now && super::maintenance::holds_anyone(w, tainted));
    let mut tolerate = d.tolerate;
    if obs.estimate_pending && live {
        release = false;
        tolerate.clear();
    }
    PendingHold {
        release,
        hold: Hold {
            waiting,
            release_check: d.next_check,
            kept_off: d.kept_off,
        },
        tolerate,
    }
}

/// The tolerations of the windows `tolerate` for the job's waiting pods that lack one of them.
fn tolerations(
    pods: &[Pod],
    taint_prefix: &str,
    tolerate: &[&Window],
) -> Option<(Vec<Toleration>, Vec<String>)> {
    if tolerate.is_empty() {
        return None;
    }
    let names: Vec<String> = super::maintenance::unbound(pods)
        .filter(|p| {
            tolerate
                .iter()
                .any(|w| !super::maintenance::tolerates(p, taint_prefix, &w.id))
        })
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let tolerations = tolerate
        .iter()
        .map(|w| super::maintenance::toleration(taint_prefix, &w.id))
        .collect();
    (!names.is_empty()).then_some((tolerations, names))
}

/// Step 5: the image cannot be pulled for longer than `image_pull_grace`.
pub fn image_pull(s: &Settings, facts: &JobFacts, waits: &Waits, now: Timestamp) -> Option<Step> {
    let (Some(failure), Some(deadline)) = (&waits.pull, waits.pull_deadline) else {
        return None;
    };
    if now < deadline {
        return None;
    }
    let outcome = Outcome::never_started(
        "image_pull",
        format!(
            "Unable to pull the container image {} for {}: {}",
            failure.image,
            human(s.image_pull_grace),
            failure.message
        ),
        deadline,
    );
    Some(record_step(s, facts, outcome, &[], Some("image_pull")))
}

/// Step 6: waited in the queue for longer than `queue_timeout`.
pub fn queue_timeout(
    obs: &Observed<'_>,
    s: &Settings,
    facts: &JobFacts,
    waits: &Waits,
    phase: &JobPhase,
    now: Timestamp,
) -> Option<Step> {
    let deadline = waits.queue_deadline?;
    if now < deadline || *phase != JobPhase::Pending {
        return None;
    }
    let why = pending(obs, facts, None).text;
    let outcome = Outcome::never_started(
        "queue_timeout",
        format!(
            "The job was not scheduled within {}: {why}",
            human(s.queue_timeout.unwrap_or_default())
        ),
        deadline,
    );
    Some(record_step(s, facts, outcome, &[], Some("queue_timeout")))
}

/// Step 7: started, RUNNING not yet published: the start hooks (jobStart, expiry, proxy create) and
/// RUNNING.
pub fn start(
    obs: &Observed<'_>,
    s: &Settings,
    seen: &Seen,
    progress: &Progress,
    now: Timestamp,
) -> Result<Option<Step>, FactsError> {
    let job = obs.job;
    let Seen { facts, record, .. } = seen;
    let phase = &progress.phase;
    let running_phase = matches!(
        phase,
        JobPhase::Running
            | JobPhase::Restarting
            | JobPhase::Completing
            | JobPhase::Terminating
            | JobPhase::Aborting
    );
    if record.published != Published::Queued
        || !(*phase == JobPhase::Running || (running_phase && progress.started.is_some()))
    {
        return Ok(None);
    }
    if let Some(until) = awaiting_queued(obs, record, s, now) {
        return Ok(Some(Step::Wait {
            next_check: Some(until),
        }));
    }
    let plan = hooks::on_start(&s.config.pipeline, job, obs.pods, now)?;
    let planned = |key: &str| {
        plan.set
            .get(key)
            .and_then(|v| crate::durable::annotations::parse_millis(v))
    };
    let start = facts
        .start
        .or_else(|| planned(&s.keys.job_start))
        .unwrap_or(now);
    let expiry = facts.expiry.or_else(|| planned(&s.keys.expiry));
    let mut action = Action::from_plan("start", plan);
    let mut running = events::running(&facts.job_id, start, expiry, &s.runner_id);
    running.trace = trace_of(obs, s, facts);
    action.publish.insert(0, Outbound::Lifecycle(running));
    action
        .publish
        .splice(0..0, queued_first(obs, facts, record, s));
    action.set.insert(
        s.keys.lifecycle_state.clone(),
        Published::Running.as_str().into(),
    );
    action.again = true;
    // The start is every rank's container start as the view has it. A view in which a rank has not
    // started yet (the pods' watch behind the job's) waits for the watch a moment, then is read
    // afresh.
    let lagging = facts.start.is_none()
        && !(0..facts.replicas).all(|r| {
            progress
                .ranks
                .iter()
                .any(|v| v.rank == r && v.started_at.is_some())
        });
    let first_sight = seen_with_every_rank(obs, facts.replicas, &progress.ranks);
    if lagging && let Some(until) = lag_wait(job, first_sight, now) {
        return Ok(Some(Step::Wait {
            next_check: Some(until),
        }));
    }
    action.fresh = lagging;
    Ok(Some(Step::Act(action)))
}

/// Step 8: running: the monitoring hooks (accounting ticks, expiry warnings and deletion, proxy
/// updates), a restart's disruption, a maintenance window's end and warning.
pub fn running(
    obs: &Observed<'_>,
    s: &Settings,
    seen: &Seen,
    progress: &Progress,
    now: Timestamp,
) -> Result<Step, FactsError> {
    let facts = &seen.facts;
    if progress.all_ended {
        // Volcano has not caught up yet; the final tick will cover the time until the end.
        return Ok(Step::Wait {
            next_check: observe::last_finish(&progress.ranks)
                .and_then(|t| t.checked_add(s.cleanup_grace).ok()),
        });
    }
    if let Some(step) = restart_step(obs, s, &facts.job_id, now) {
        return Ok(step);
    }
    // A maintenance window: ended at its start (decided once, durable), warned ahead of it.
    if let Some(step) = maintenance_end(obs, s, facts, progress.started, now) {
        return Ok(step);
    }
    let (maintenance_warning, maintenance_check) =
        maintenance_warning(obs, s, facts, progress.started, now);
    // Never decide past the expiry, even when looking late (after a failover): the job is charged up
    // to its expiry at most, and ticks past it are never published.
    // Nor past what the view proves: ticks are charged only up to an instant the pods were seen
    // running at (a lagging watch must never let a tick run past the real end).
    let horizon = facts.expiry.map_or(now, |e| now.min(e));
    let horizon = obs.fresh_at.map_or(horizon, |t| horizon.min(t));
    let plan = hooks::on_monitoring(&s.config.pipeline, obs.job, obs.pods, horizon)?;
    let next_check = earliest(plan.next_check, maintenance_check);
    let mut action = Action::from_plan("monitor", plan);
    action.next_check = next_check;
    if let Some((event, token)) = maintenance_warning {
        action.publish.push(Outbound::Lifecycle(event));
        action.set.insert(s.keys.maintenance_warned.clone(), token);
    }
    action.fresh = action
        .publish
        .iter()
        .any(|o| matches!(o, Outbound::Accounting(_)));
    if action.is_empty() {
        for failure in &action.failures {
            tracing::warn!(job = %facts.job_id, plugin = %failure.plugin, error = %failure.error, "A monitoring hook failed.");
        }
        return Ok(Step::Wait { next_check });
    }
    Ok(Step::Act(action))
}

/// A running job's warning of the maintenance window that will cut it (the event and the token
/// persisted with it), and when to look again for it.
#[allow(clippy::type_complexity)]
fn maintenance_warning(
    obs: &Observed<'_>,
    s: &Settings,
    facts: &JobFacts,
    started: Option<Timestamp>,
    now: Timestamp,
) -> (
    Option<(crate::messages::v1::JobEvent, String)>,
    Option<Timestamp>,
) {
    let Some(window) = super::maintenance::cutting(
        obs.maintenance.unwrap_or_default(),
        obs.pods,
        facts.expiry,
        now,
    ) else {
        return (None, None);
    };
    match super::maintenance::decide(
        &facts.job_id,
        window,
        started,
        annotation(obs.job, &s.keys.maintenance_warned),
        s.maintenance_warn_before,
        now,
    ) {
        super::maintenance::Decision::End { .. } => {
            unreachable!("maintenance_end decides an end")
        }
        super::maintenance::Decision::Warn { window, mut event } => {
            event.runner_id = s.runner_id.clone();
            (
                Some((*event, super::maintenance::warned_token(window))),
                Some(window.start),
            )
        }
        super::maintenance::Decision::Wait { next_check } => (None, Some(next_check)),
    }
}

/// Step 9: pending. Held back by a maintenance window: told at once, once per window, and looked at
/// again at its end. Queued before the window was scheduled (not held): told once what the window will
/// do to it, and its statuses go on. Otherwise a status event when the plain-language reason (or the
/// estimate, enough to tell) changed.
pub fn pending_status(
    obs: &Observed<'_>,
    s: &Settings,
    seen: &Seen,
    waits: &Waits,
    hold: &Hold<'_>,
    peers: &[PeerView],
    now: Timestamp,
) -> Step {
    // A peer that does not exist is given up on at a deadline: decided again then.
    let peer_check = peers::missing_deadline(peers, waits.created, s.peer_missing_after);
    let next_check = waits.next_check(earliest(hold.release_check, peer_check));
    if let Some(super::maintenance::Waiting::NotHeld(window)) = hold.waiting
        && let Some(step) = window_told(obs, s, seen, window, next_check, now)
    {
        return step;
    }
    if let Some(waiting @ super::maintenance::Waiting::Held(_)) = hold.waiting {
        return maintenance_status(obs, s, &seen.facts, &seen.record, waiting, next_check, now);
    }
    // A job waiting for its peer is told so, not the replay's start (which does not know the gate).
    let peer_estimate = peers::gated_estimate(peers, obs.estimate);
    let obs = &Observed {
        estimate: peer_estimate.as_ref().or(obs.estimate),
        ..*obs
    };
    if let Some(step) = status_not_yet(obs, s, seen, waits, next_check, now) {
        return step;
    }
    let reason = pending_reason(obs, seen, waits, hold, peers);
    status_event(obs, s, seen, reason, next_check, now)
}

/// A job queued before a window was scheduled, which the window will concern: told once what the
/// window will do to it.
fn window_told(
    obs: &Observed<'_>,
    s: &Settings,
    seen: &Seen,
    window: &Window,
    next_check: Option<Timestamp>,
    now: Timestamp,
) -> Option<Step> {
    let token = super::maintenance::warned_token(window);
    if annotation(obs.job, &s.keys.maintenance_told) == Some(token.as_str()) {
        return None;
    }
    if let Some(until) = awaiting_queued(obs, &seen.record, s, now) {
        return Some(Step::Wait {
            next_check: earliest(Some(until), next_check),
        });
    }
    let created = obs.job.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let mut event = super::maintenance::Waiting::NotHeld(window).event(&seen.facts.job_id, created);
    event.runner_id = s.runner_id.clone();
    let mut publish: Vec<Outbound> = queued_first(obs, &seen.facts, &seen.record, s)
        .into_iter()
        .collect();
    publish.push(Outbound::Lifecycle(event));
    Some(Step::Act(Action {
        what: "status",
        publish,
        set: BTreeMap::from([(s.keys.maintenance_told.clone(), token)]),
        again: true,
        ..Action::default()
    }))
}

/// No status yet: the job has waited less than `pending_status_after` (a job that starts at once has
/// no reason worth an event, nor a write), or its estimate is being made (decided again with it).
fn status_not_yet(
    obs: &Observed<'_>,
    s: &Settings,
    seen: &Seen,
    waits: &Waits,
    next_check: Option<Timestamp>,
    now: Timestamp,
) -> Option<Step> {
    let never = matches!(obs.estimate, Some(Estimate::Never { .. }));
    if let Some(created) = waits.created
        && seen.record.status_hash.is_none()
        && !never
    {
        let tell_at = created
            .checked_add(s.pending_status_after)
            .unwrap_or(created);
        if now < tell_at {
            return Some(Step::Wait {
                next_check: earliest(Some(tell_at), next_check),
            });
        }
    }
    obs.estimate_pending.then_some(Step::Wait { next_check })
}

/// Why the job waits, in plain language: the scheduler's reason, or its peer; with the windows that
/// keep it off their nodes and whether it can ever start.
fn pending_reason(
    obs: &Observed<'_>,
    seen: &Seen,
    waits: &Waits,
    hold: &Hold<'_>,
    peers: &[PeerView],
) -> observe::PendingReason {
    let mut reason = pending(
        obs,
        &seen.facts,
        waits.pull.as_ref().zip(waits.pull_deadline),
    );
    if let Some(peer) = peers::waiting_for(peers) {
        // Its pods are gated until the peer runs: that is why it waits, whatever else holds.
        reason.reason = peers::WAITING_REASON;
        reason.text = format!("The job waits for its peer {} to start", peer.named());
        reason.since = None;
    }
    if let Some(text) = super::maintenance::kept_off_text(&hold.kept_off) {
        // Kept off a window's nodes by its taint, not held: it may start on others.
        reason.text.push_str(&format!("; {text}"));
    }
    if let Some(Estimate::Never { why }) = obs.estimate {
        reason
            .text
            .push_str(&format!("; it can never start on this cluster: {why}"));
    }
    reason
}

/// What a job was last told, as persisted: `<chained>/<plain>[/<estimate told>]`.
fn last_told(record: &Record) -> (Option<&str>, Option<&str>, &str) {
    let mut told = record.status_hash.as_deref().map(|v| v.splitn(3, '/'));
    let previous = told.as_mut().and_then(Iterator::next);
    let last_plain = told.as_mut().and_then(Iterator::next);
    let last_estimate = told.as_mut().and_then(Iterator::next).unwrap_or("");
    (previous, last_plain, last_estimate)
}

/// The status event of a waiting job, when its reason or its estimate changed enough to tell.
fn status_event(
    obs: &Observed<'_>,
    s: &Settings,
    seen: &Seen,
    mut reason: observe::PendingReason,
    next_check: Option<Timestamp>,
    now: Timestamp,
) -> Step {
    let Seen { facts, record, .. } = seen;
    // What the job is told again for: the reason's category, not its counts and wording.
    let category = super::telling::reason_category(reason.reason, &reason.text);
    let plain = events::status_hash(None, reason.reason, &category);
    let (previous, last_plain, last_estimate) = last_told(record);
    // An estimate not known right now (the nodes not yet seen) leaves what was told standing.
    let estimate = obs
        .estimate
        .map_or_else(|| last_estimate.to_owned(), estimate_token);
    if last_plain == Some(plain.as_str())
        && !estimate_moved(last_estimate, &estimate, now, s.estimate_tolerance)
    {
        return Step::Wait { next_check };
    }
    if let Some(until) = awaiting_queued(obs, record, s, now) {
        return Step::Wait {
            next_check: earliest(Some(until), next_check),
        };
    }
    if let Some(e) = obs.estimate {
        tell_estimate(&mut reason.details, e);
    }
    // The time of the change told. A job's first status tells a reason that holds since the objects
    // say (an unschedulable condition's transition, the PodGroup's creation: it has waited since). A
    // later one tells a change since the last status (a queue position, an estimate, a rank that
    // started, another reason), which the monitor decides on as soon as it sees it: it carries the
    // time it was seen, never the job's creation.
    let created = obs.job.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let at = if record.status_hash.is_some() {
        now
    } else {
        reason.since.or(created).unwrap_or(now)
    };
    // The id is a function of everything the event says: its text, every detail (the estimate, its
    // basis, the position) and its time, so two runners that see the job differently (or at different
    // times) publish two ids, never one id with two contents.
    let chained = events::status_hash(previous, reason.reason, &status_content(&reason, at));
    let event = events::status(&facts.job_id, &chained, &reason, at, &s.runner_id);
    let mut publish: Vec<Outbound> = queued_first(obs, facts, record, s).into_iter().collect();
    publish.push(Outbound::Lifecycle(event));
    // Counted when this event tells it (an estimate not known now leaves what was told standing).
    let estimate = if obs.estimate.is_some() {
        count_told(last_estimate, &estimate)
    } else {
        estimate
    };
    let log = status_log(obs, s, &reason, now);
    Step::Act(Action {
        what: "status",
        publish,
        set: BTreeMap::from([
            (
                s.keys.status_hash.clone(),
                told_value(&chained, &plain, &estimate),
            ),
            (s.keys.status_log.clone(), log),
        ]),
        next_check,
        ..Action::default()
    })
}

/// What a status's id is made of: its text, every detail, its time.
fn status_content(reason: &observe::PendingReason, at: Timestamp) -> String {
    format!(
        "{}\n{}\n{}",
        reason.text,
        crate::durable::ids::body_fingerprint16(&prost::Message::encode_to_vec(&reason.details)),
        at.as_millisecond()
    )
}

/// The persisted status hash: `<chained>/<plain>[/<estimate told>]`.
fn told_value(chained: &str, plain: &str, estimate: &str) -> String {
    if estimate.is_empty() {
        format!("{chained}/{plain}")
    } else {
        format!("{chained}/{plain}/{estimate}")
    }
}

/// The job's status log for people ([`history`]) with this status appended.
fn status_log(
    obs: &Observed<'_>,
    s: &Settings,
    reason: &observe::PendingReason,
    now: Timestamp,
) -> String {
    history::append_status(
        annotation(obs.job, &s.keys.status_log),
        history::StatusEntry {
            at: now.as_millisecond(),
            reason: reason.reason.to_owned(),
            text: reason.text.clone(),
            queue: reason.details.queue.clone(),
            jobs_ahead: reason.details.jobs_ahead,
            estimated_start_at: reason
                .details
                .estimated_start_at
                .as_ref()
                .map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000),
            estimate_basis: reason.details.estimate_basis.clone(),
        },
    )
}

/// The status of a job held back by a maintenance window (see [`super::maintenance::Waiting`]), told
/// once per window: its id and time are the window's and the job's, so every runner tells the same, and
/// so is what it tells as the estimated start, the window's end. It is recorded like any status, so the
/// next one (after the window) is told as a change. While it is held, a replayed start later than the
/// window's end (the replay keeps a held gang out of every window in its way and counts what runs after
/// it) is told as a change of that status, under the rule every estimate is told by
/// ([`super::telling::tell_again`]): rarely.
fn maintenance_status(
    obs: &Observed<'_>,
    s: &Settings,
    facts: &JobFacts,
    record: &Record,
    waiting: super::maintenance::Waiting<'_>,
    other_check: Option<Timestamp>,
    now: Timestamp,
) -> Step {
    let window = waiting.window();
    let next_check = earliest(Some(window.end), other_check);
    let text = waiting.text();
    let plain = events::status_hash(None, super::maintenance::REASON, &text);
    let (previous, last_plain, last_estimate) = last_told(record);
    let held = matches!(waiting, super::maintenance::Waiting::Held(_));
    let mut reason = observe::PendingReason {
        reason: super::maintenance::REASON,
        text,
        details: crate::messages::v1::PendingDetails {
            queue: obs.job.spec.queue.clone().unwrap_or_default(),
            ..Default::default()
        },
        since: None,
    };
    let (event, chained, estimate_told) = if last_plain == Some(plain.as_str()) {
        // Told for this window: only a replayed start that moved is news.
        if !held {
            return Step::Wait { next_check };
        }
        match held_start_moved(obs, s, facts, record, window, &mut reason, now) {
            Ok((event, chained, token)) => (event, chained, count_told(last_estimate, &token)),
            Err(until) => {
                return Step::Wait {
                    next_check: earliest(until, next_check),
                };
            }
        }
    } else {
        if let Some(until) = awaiting_queued(obs, record, s, now) {
            return Step::Wait {
                next_check: earliest(Some(until), next_check),
            };
        }
        let created = obs.job.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let mut event = waiting.event(&facts.job_id, created);
        event.runner_id = s.runner_id.clone();
        if held {
            // The window's end, the earliest the hold lets it start: the same from every runner. A
            // later replayed start follows as a change.
            held_until_end(&mut reason.details, window);
        }
        event.pending = Some(Box::new(reason.details.clone()));
        let chained = events::status_hash(previous, super::maintenance::REASON, &event.event_id);
        let token = if held {
            count_told(
                last_estimate,
                &format!("at:{}", window.end.as_millisecond()),
            )
        } else {
            String::new()
        };
        (event, chained, token)
    };
    let mut publish: Vec<Outbound> = queued_first(obs, facts, record, s).into_iter().collect();
    publish.push(Outbound::Lifecycle(event));
    let log = status_log(obs, s, &reason, now);
    Step::Act(Action {
        what: "status",
        publish,
        set: BTreeMap::from([
            (
                s.keys.status_hash.clone(),
                told_value(&chained, &plain, &estimate_told),
            ),
            (s.keys.status_log.clone(), log),
        ]),
        next_check,
        ..Action::default()
    })
}

/// The estimate of a job held until a window's end: the window's end, and why.
fn held_until_end(details: &mut crate::messages::v1::PendingDetails, window: &Window) {
    details.estimated_start_at = Some(crate::pipeline::hooks::proto_timestamp(window.end));
    details.estimate_basis = format!(
        "held back by the maintenance window {} until its end",
        window.id
    );
}

/// A held job already told of its window: the status that tells a replayed start that moved enough
/// (the event, its chained hash, the estimate's token), into `reason`. The replay keeps a held gang out
/// of the window, so what it says is never before the window's end; an estimate made before the hold
/// was known counts as the window's end. `Err`: nothing to tell now (`Some`: not before then).
#[allow(clippy::type_complexity)]
fn held_start_moved(
    obs: &Observed<'_>,
    s: &Settings,
    facts: &JobFacts,
    record: &Record,
    window: &Window,
    reason: &mut observe::PendingReason,
    now: Timestamp,
) -> Result<(crate::messages::v1::JobEvent, String, String), Option<Timestamp>> {
    let (previous, _, last_estimate) = last_told(record);
    // (The replay tells a start `[monitor] start_margin` after it places the gang: at the window's
    // end it says the end plus the margin, which is no news.)
    let held_until = window.end.checked_add(s.start_margin).unwrap_or(window.end);
    let replayed = match obs.estimate {
        Some(e @ Estimate::At { start, .. }) if *start > held_until => Some(e),
        Some(Estimate::At { .. }) => None,
        _ => return Err(None),
    };
    let end_token = format!("at:{}", window.end.as_millisecond());
    let token = replayed.map_or_else(|| end_token.clone(), estimate_token);
    let last = if last_estimate.is_empty() {
        end_token
    } else {
        last_estimate.to_owned()
    };
    if !estimate_moved(&last, &token, now, s.estimate_tolerance) {
        return Err(None);
    }
    if let Some(until) = awaiting_queued(obs, record, s, now) {
        return Err(Some(until));
    }
    match replayed {
        Some(e) => tell_estimate(&mut reason.details, e),
        None => held_until_end(&mut reason.details, window),
    }
    // Its id is a function of everything it says, as every status's.
    let chained = events::status_hash(previous, reason.reason, &status_content(reason, now));
    let event = events::status(&facts.job_id, &chained, reason, now, &s.runner_id);
    Ok((event, chained, token))
}

/// The end of a running job for a maintenance window: once the window has begun, or once it was
/// decided (recorded on the job, the delete not yet done: a runner killed in between), record the cause
/// and the instant charged up to, and delete, as at the expiry.
fn maintenance_end(
    obs: &Observed<'_>,
    s: &Settings,
    facts: &JobFacts,
    started: Option<Timestamp>,
    now: Timestamp,
) -> Option<Step> {
    let recorded = matches!(&facts.termination_cause, Some(TerminationCause::Other(c)) if c == super::maintenance::CAUSE)
        && annotation(obs.job, &s.keys.maintenance_cut).is_some();
    let mut set = BTreeMap::new();
    if !recorded {
        let window = super::maintenance::cutting(
            obs.maintenance.unwrap_or_default(),
            obs.pods,
            facts.expiry,
            now,
        )?;
        let super::maintenance::Decision::End { window, at } = super::maintenance::decide(
            &facts.job_id,
            window,
            started,
            None,
            s.maintenance_warn_before,
            now,
        ) else {
            return None;
        };
        set.insert(
            s.keys.termination_cause.clone(),
            super::maintenance::CAUSE.to_owned(),
        );
        set.insert(
            s.keys.termination_reason.clone(),
            super::maintenance::end_status(window),
        );
        set.insert(s.keys.maintenance_cut.clone(), format_millis(at));
    }
    if annotation(obs.job, &s.keys.termination_at).is_none() {
        set.insert(s.keys.termination_at.clone(), format_millis(now));
    }
    Some(Step::Act(Action {
        what: "maintenance",
        set,
        delete: true,
        again: true,
        ..Action::default()
    }))
}

/// The end of a job that has not started and whose peer will never run: a peer that names it back (a
/// ring of two submitted at once), or one still missing `[monitor] peer_missing_after` after its creation.
fn peer_never_comes(
    obs: &Observed<'_>,
    s: &Settings,
    facts: &JobFacts,
    peers: &[PeerView],
    now: Timestamp,
) -> Option<Step> {
    let created = obs.job.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let (reason, status) = peers::never_comes(
        &facts.job_id,
        obs.peers,
        peers,
        &s.keys,
        created,
        s.peer_missing_after,
        now,
    )?;
    let outcome = Outcome::never_started(reason, status, now);
    Some(record_step(s, facts, outcome, &[], Some(reason)))
}

/// What the job's peers call for (see [`super::peers`]), if anything: the end of a job whose peer ended
/// before it started, its pods let go once every peer runs (after their addresses are written), the
/// addresses kept right while it runs, and a peer's end told once.
fn peer_step(
    obs: &Observed<'_>,
    s: &Settings,
    facts: &JobFacts,
    record: &Record,
    peers: &[PeerView],
    never_started: bool,
    now: Timestamp,
) -> Option<Step> {
    if never_started && let Some(step) = peer_never_comes(obs, s, facts, peers, now) {
        return Some(step);
    }
    let ended = peers::ended(peers);
    if never_started && let Some((peer, how, _)) = ended.first() {
        let outcome = Outcome::never_started(
            peers::ENDED_REASON,
            format!(
                "The job did not start: its peer {} {how}, and a job runs only while its peer runs",
                peer.named()
            ),
            now,
        );
        return Some(record_step(
            s,
            facts,
            outcome,
            &[],
            Some(peers::ENDED_REASON),
        ));
    }
    let recorded = peers::parse_addresses(annotation(obs.job, &s.keys.peer_addresses));
    let gated = peers::gated_pods(obs.pods, &s.keys.peers_gate());
    if !gated.is_empty()
        && let Some(addresses) = peers::all_addresses(peers)
    {
        // Every peer runs: their names first, then the pods may be scheduled. Not decided again at
        // once: the pods' watch shows them without the gate.
        return Some(Step::Act(Action {
            what: "ungate",
            set: BTreeMap::from([(
                s.keys.peer_addresses.clone(),
                peers::format_addresses(&addresses),
            )]),
            peer_endpoints: Some(addresses),
            ungate: Some((
                s.keys.peers_gate(),
                gated
                    .iter()
                    .filter_map(|p| p.metadata.name.clone())
                    .collect(),
            )),
            ..Action::default()
        }));
    }
    if record.published != Published::Running {
        return None;
    }
    let mut action = Action {
        what: "peers",
        again: true,
        ..Action::default()
    };
    let current = peers::current_addresses(peers, &recorded);
    if current != recorded && !current.is_empty() {
        action.set.insert(
            s.keys.peer_addresses.clone(),
            peers::format_addresses(&current),
        );
        action.peer_endpoints = Some(current);
    }
    let mut told = peers::parse_told(annotation(obs.job, &s.keys.peer_ended));
    for (peer, how, at) in ended {
        if told.contains(&peer.job_id) {
            continue;
        }
        action.publish.push(Outbound::Lifecycle(events::peer_ended(
            &facts.job_id,
            peer,
            how,
            at.unwrap_or(now),
            &s.runner_id,
        )));
        told.push(peer.job_id.clone());
    }
    if !action.publish.is_empty() {
        action.set.insert(s.keys.peer_ended.clone(), told.join(","));
    }
    (!action.is_empty()).then_some(Step::Act(action))
}

/// Volcano restarted the job (a rank's pod was taken away and the policy restarts the whole gang): tell
/// the user, once per restart, why and where (`<jobId>/restart/<retryCount>/<hash>`), and record it. A restart
/// whose cause the pods' watch has not shown yet waits for it a moment (`VIEW_LAG_GRACE`), then is told
/// without it. The ticks go on by the job's first start: the time of a restart is charged once, like
/// any other.
///
/// The cause is recorded on the job (`disruption`, `disruptionRetry`) before the restart is told: what
/// was lost is known only to the runners whose watch saw the pod go, and a runner that takes the job
/// over after its holder died between telling and recording (one started since, say) would tell the same
/// restart again in other words, under another id, naming no rank or the one lost the time before. It
/// costs one write per restart (a node lost, a pod evicted), none per tick or transition.
fn restart_step(obs: &Observed<'_>, s: &Settings, job_id: &str, now: Timestamp) -> Option<Step> {
    let job = obs.job;
    let retries = job.retries();
    let told: i32 = job
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&s.keys.restarts))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if retries <= told {
        return None;
    }
    let max = job.max_attempts();
    let Some(why) = recorded_disruption(job, s, retries) else {
        // A disruption of an attempt since the last restart told (attempts count from 0: after `told`
        // restarts the job runs its attempt `told`), and not of one after this restart.
        let seen = obs
            .disruption
            .filter(|(attempt, _)| (told..retries).contains(attempt))
            .map(|(_, d)| d);
        // Counted from Volcano's transition alone: the phase seen may be one after the restart's (a
        // lagging monitor skips Restarting and Pending), so when this monitor first saw it says nothing
        // of when the lost pod's event came; and a restart is rare, not a read per job.
        if seen.is_none()
            && let Some(until) = lag_wait(job, None, now)
        {
            return Some(Step::Wait {
                next_check: Some(until),
            });
        }
        let why = seen.map_or_else(|| "a rank's pod was lost".to_owned(), Disruption::describe);
        let mut set = BTreeMap::from([
            (s.keys.disruption.clone(), why),
            (s.keys.disruption_retry.clone(), retries.to_string()),
        ]);
        if retries >= max {
            // Its attempts are used up: Volcano fails the job rather than starting it again, and the
            // FAILURE (reason `disrupted`) tells this disruption. No restart to tell (never `attempt 4
            // of 3`); the disruption is recorded for that FAILURE, which a runner that takes over
            // (without the watch's memory of the pod) must tell all the same.
            set.insert(s.keys.restarts.clone(), retries.to_string());
        }
        return Some(Step::Act(Action {
            what: "restart",
            set,
            again: true,
            ..Action::default()
        }));
    };
    if retries >= max {
        return Some(Step::Act(Action {
            what: "restart",
            set: BTreeMap::from([(s.keys.restarts.clone(), retries.to_string())]),
            again: true,
            ..Action::default()
        }));
    }
    let at = phase_time(job).unwrap_or(now);
    let event = events::restart(
        job_id,
        retries,
        format!(
            "The job is restarting after {why}: every rank starts again (attempt {} of {max})",
            retries + 1
        ),
        at,
        &s.runner_id,
    );
    let mut publish = vec![Outbound::Lifecycle(event)];
    if s.config.pipeline.accounting.refund_lost_attempts {
        publish.extend(refunds(job, &s.keys, told, retries).into_iter().map(
            |(attempt, from, to)| {
                Outbound::Lifecycle(events::refund(job_id, attempt, from, to, &s.runner_id))
            },
        ));
    }
    let log = history::append_restart(
        annotation(job, &s.keys.restart_log),
        history::RestartEntry {
            attempt: retries + 1,
            at: at.as_millisecond(),
            cause: why.clone(),
        },
    );
    Some(Step::Act(Action {
        what: "restart",
        publish,
        set: BTreeMap::from([
            (s.keys.restarts.clone(), retries.to_string()),
            (s.keys.restart_log.clone(), log),
        ]),
        again: true,
        ..Action::default()
    }))
}

/// The disruption recorded on the job as the cause of its `retries`-th restart, in words.
fn recorded_disruption(job: &VolcanoJob, s: &Settings, retries: i32) -> Option<String> {
    let annotations = job.metadata.annotations.as_ref()?;
    let recorded_for: i32 = annotations.get(&s.keys.disruption_retry)?.parse().ok()?;
    (recorded_for == retries)
        .then(|| annotations.get(&s.keys.disruption).cloned())
        .flatten()
}

/// The attempts `told + 1 ..= retries` that restarts ended, each with the span it was charged for: from its
/// start (the job's first start, `jobStart`, for the first; the previous restart for the others) to its
/// restart, the `attempt`-th `Restarting` entry of Volcano's phase history. Both are recorded (the
/// annotation, the job's status), so the spans are the same for every runner that computes them, and the
/// spans of consecutive attempts meet without overlap. An attempt whose restart the history does not hold
/// (a controller that keeps no history) is left out rather than guessed; an empty span is left out.
fn refunds(
    job: &VolcanoJob,
    keys: &AnnotationKeys,
    told: i32,
    retries: i32,
) -> Vec<(i32, Timestamp, Timestamp)> {
    let Some(start) = job
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&keys.job_start))
        .and_then(|v| crate::durable::annotations::parse_millis(v))
    else {
        return Vec::new();
    };
    let restarts: Vec<Timestamp> = job
        .status
        .as_ref()
        .map(|s| {
            s.conditions
                .iter()
                .filter(|c| c.status == JobPhase::Restarting)
                .filter_map(|c| c.last_transition_time.as_ref().map(|t| t.0))
                .collect()
        })
        .unwrap_or_default();
    let mut out = Vec::new();
    for attempt in (told + 1).max(1)..=retries {
        let index = usize::try_from(attempt - 1).unwrap_or(usize::MAX);
        let Some(&to) = restarts.get(index) else {
            continue;
        };
        let from = index
            .checked_sub(1)
            .and_then(|i| restarts.get(i))
            .map_or(start, |&previous| previous.max(start));
        if to > from {
            out.push((attempt, from, to));
        }
    }
    out
}

/// The disruption a job that Volcano failed or terminated ended by, in words: one in its current attempt
/// (seen by the watch), or, once its attempts are used up, the one recorded as the cause of the last
/// restart Volcano did not make, else the one the watch saw end the last attempt. An older one that the
/// job was restarted after and went on from is not blamed (nor recorded for an earlier restart).
fn to_blame(obs: &Observed<'_>, s: &Settings) -> Option<String> {
    let job = obs.job;
    let retries = job.retries();
    if retries >= job.max_attempts() {
        return recorded_disruption(job, s, retries).or_else(|| {
            obs.disruption
                .filter(|(attempt, _)| *attempt >= retries - 1)
                .map(|(_, d)| d.describe())
        });
    }
    obs.disruption
        .filter(|(attempt, _)| *attempt == retries)
        .map(|(_, d)| d.describe())
}

/// An annotation's value, for the logs kept for people ([`history`]).
fn annotation<'a>(job: &'a VolcanoJob, key: &str) -> Option<&'a str> {
    job.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// An estimate as made now: `at:<epoch ms>` (an expectation), `by:<epoch ms>` (a bound), `never`,
/// `unbounded`; persisted with the status it was told in with the count of estimates told appended
/// ([`count_told`]).
fn estimate_token(e: &Estimate) -> String {
    match e {
        Estimate::At {
            start, bound: true, ..
        } => format!("by:{}", start.as_millisecond()),
        Estimate::At { start, .. } => format!("at:{}", start.as_millisecond()),
        Estimate::Never { .. } => "never".to_owned(),
        Estimate::Unbounded { .. } => "unbounded".to_owned(),
        Estimate::TimesOut { at, .. } => format!("fails:{}", at.as_millisecond()),
    }
}

/// A told estimate as persisted: `at:<epoch ms>[:<times told>[:b]]` or `by:...` (an estimate told
/// before the count was kept counts as told once; `b`: a bound was told before it). `None`: `never`,
/// `unbounded`, `fails:...` or nothing.
fn told_estimate(token: &str) -> Option<super::telling::Told> {
    let mut parts = token.split(':');
    let bound = match parts.next()? {
        "by" => true,
        "at" => false,
        _ => return None,
    };
    let start = Timestamp::from_millisecond(parts.next()?.parse::<i64>().ok()?).ok()?;
    let times = parts.next().map_or(Some(1), |n| n.parse::<u32>().ok())?;
    let was_bound = parts.next() == Some("b");
    Some(super::telling::Told {
        start,
        bound,
        times,
        was_bound,
    })
}

/// The token of an estimate told now (`fresh`, as [`estimate_token`] makes it) after `last`: a time
/// carries how many estimates the job has heard, this one included, for the tolerance that grows with
/// them ([`super::telling::tell_again`]).
fn count_told(last: &str, fresh: &str) -> String {
    if told_estimate(fresh).is_none() {
        return fresh.to_owned();
    }
    let last = told_estimate(last);
    let times = last.map_or(1, |t| t.times.saturating_add(1));
    if last.is_some_and(|t| t.bound || t.was_bound) {
        format!("{fresh}:{times}:b")
    } else {
        format!("{fresh}:{times}")
    }
}

/// Whether the estimate changed enough to tell ([`super::telling::tell_again`]: a bound
/// later, or a move past a tolerance that grows with the distance and doubles with every estimate told,
/// at least `tolerance`), or is a different kind of answer: an expectation that became a bound (a
/// whole-node gang whose nodes were just reserved) is told even at the same time, since the job may
/// now count on it, and a bound that became an expectation since the promise is withdrawn.
fn estimate_moved(told: &str, fresh: &str, now: Timestamp, tolerance: SignedDuration) -> bool {
    match (told_estimate(told), told_estimate(fresh)) {
        (Some(a), Some(b)) => super::telling::tell_again(a, b.start, b.bound, now, tolerance),
        _ => told != fresh,
    }
}

/// The estimate into the event's pending details.
fn tell_estimate(details: &mut crate::messages::v1::PendingDetails, e: &Estimate) {
    match e {
        Estimate::At {
            start,
            basis,
            bound,
            record,
        } => {
            details.estimated_start_at = Some(crate::pipeline::hooks::proto_timestamp(*start));
            details.estimate_basis = basis.clone();
            details.estimate_is_bound = *bound;
            if let Some(r) = record.filter(|_| !bound) {
                let count = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
                details.expectations_held = Some(count(r.held));
                details.expectations_made = Some(count(r.made));
            }
        }
        Estimate::Never { why } => {
            details.never_fits = true;
            details.estimate_basis = why.clone();
        }
        Estimate::Unbounded { why } | Estimate::TimesOut { why, .. } => {
            details.estimate_basis = why.clone();
        }
    }
}

/// The job vanished (a DELETED event, or absent from a full list and from a GET) before its terminal
/// state was published: publish the end from what was last seen. Nothing can be persisted any more.
/// `None` when there is nothing to say (the end was published, or the job is not one of ours).
/// `queued_confirmed` as in [`Observed::queued_confirmed`].
pub fn decide_gone(
    last: &VolcanoJob,
    pods: &[Pod],
    s: &Settings,
    now: Timestamp,
    queued_confirmed: bool,
) -> Result<Option<Action>, FactsError> {
    if rolled_back(last) {
        return Ok(None);
    }
    let facts = JobFacts::read(last, &s.keys, &s.config.pipeline)?;
    let record = Record::read(last, &s.keys);
    if let Published::Ended(_) = record.published {
        return Ok(None);
    }
    let started = facts.start.or_else(|| hooks::pods_started_at(pods));
    let outcome = match &record.outcome {
        Some(outcome) => outcome.clone(),
        None => {
            let ranks = observe::ranks(&facts.job_id, pods);
            let end = crate::cluster::end::terminated_at(last, &s.keys)
                .or_else(|| observe::last_finish(&ranks))
                .unwrap_or(now)
                .min(now);
            let cut = annotation(last, &s.keys.maintenance_cut)
                .and_then(crate::durable::annotations::parse_millis);
            let mut outcome = by_cause(&facts, &record, &ranks, started, end, cut);
            if facts.termination_cause.is_none() {
                outcome.reason = "lost_track".into();
                outcome.status =
                    "volcano-runner lost track of this job: its VolcanoJob disappeared \
                                  before the job's end was recorded"
                        .into();
            }
            outcome
        }
    };
    // The hooks read the start from the annotations: give them the one the outcome rests on.
    let mut job = last.clone();
    if facts.start.is_none()
        && let Some(start) = outcome.started()
    {
        job.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(s.keys.job_start.clone(), format_millis(start));
    }
    let obs = Observed {
        queued_confirmed,
        ..Observed::plain(&job, pods)
    };
    let facts = JobFacts::read(&job, &s.keys, &s.config.pipeline)?;
    let mut action = publish_end(&obs, s, &facts, &record, &outcome, now)?;
    action.what = "gone";
    action.set.clear();
    action.remove.clear();
    action.release = false;
    action.again = false;
    Ok(Some(action))
}

/// Until when the monitor holds back its first event of the job: while its QUEUED may still be on its
/// way from the submit path, which records `<prefix>queuedConfirmed` on the job once the broker confirmed
/// it (see [`crate::monitor::queued`]), at most [`super::queued::GRACE`] after the job's creation.
/// `None`: go ahead (with a copy of QUEUED first when [`queued_first`] says so). A job whose QUEUED is
/// left to its monitor waits for nothing (nobody else tells it), unless a cancel overtook its
/// submission and no cause of its end is recorded yet: the runner that took the submission is then
/// claiming it, to tell CANCELLED alone, and a QUEUED now could follow that CANCELLED.
fn awaiting_queued(
    obs: &Observed<'_>,
    record: &Record,
    s: &Settings,
    now: Timestamp,
) -> Option<Timestamp> {
    if !needs_queued(obs, record, s) {
        return None;
    }
    if left_untold(obs, s)
        && !(obs.cancel_seen && annotation(obs.job, &s.keys.termination_cause).is_none())
    {
        return None;
    }
    let created = obs.job.metadata.creation_timestamp.as_ref()?.0;
    let grace = SignedDuration::try_from(super::queued::GRACE).unwrap_or(SignedDuration::ZERO);
    let until = created.checked_add(grace).unwrap_or(created);
    (now < until).then_some(until)
}

/// Whether the job was created with `<prefix>queuedBy: monitor` (its submitting runner did not hold its
/// shard and left its QUEUED to whichever runner monitors it) and its QUEUED is not told yet.
fn left_untold(obs: &Observed<'_>, s: &Settings) -> bool {
    s.queued
        .left_untold(obs.job.metadata.annotations.as_ref(), obs.queued_confirmed)
}

/// Step 2b: the job's QUEUED is left to its monitor and nothing says it went out: publish it now, the
/// very message the submit path would have (see [`queued_first`]), without waiting for the job's first
/// event; the record of it rides on the monitor's next write. Held back only while a cancel that
/// overtook the submission may be claiming the job ([`awaiting_queued`]).
fn tell_queued(obs: &Observed<'_>, s: &Settings, seen: &Seen, now: Timestamp) -> Option<Step> {
    if !left_untold(obs, s) {
        return None;
    }
    if let Some(until) = awaiting_queued(obs, &seen.record, s, now) {
        return Some(Step::Wait {
            next_check: Some(until),
        });
    }
    let queued = queued_first(obs, &seen.facts, &seen.record, s)?;
    Some(Step::Act(Action {
        what: "queued",
        publish: vec![queued],
        carry_queued: true,
        again: true,
        ..Action::default()
    }))
}

/// Whether the monitor's first event of the job must be preceded by QUEUED, as far as anyone knows: no
/// status event and no later state is persisted, this process did not have it confirmed, and the job
/// does not say that its submit path did.
fn needs_queued(obs: &Observed<'_>, record: &Record, s: &Settings) -> bool {
    record.published == Published::Queued
        && record.status_hash.is_none()
        && !obs.queued_confirmed
        && !obs
            .job
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(&s.queued.confirmed))
}

/// The job's QUEUED, when nothing the monitor publishes about the job can have gone out before: no
/// status event (its hash is persisted) and no later state. A consumer sees QUEUED before any other
/// event of the job, whoever publishes first: the submitting runner publishes the very same message
/// (same id, same content: from the job's creation time and `acceptedBy`), possibly later. None either
/// when this process's submit path already had it confirmed ([`Observed::queued_confirmed`]).
fn queued_first(
    obs: &Observed<'_>,
    facts: &JobFacts,
    record: &Record,
    s: &Settings,
) -> Option<Outbound> {
    if !needs_queued(obs, record, s) {
        return None;
    }
    let job = obs.job;
    let created = job
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(Timestamp::UNIX_EPOCH, |t| t.0);
    let accepted_by = job
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&s.accepted_by))
        .map_or(s.runner_id.as_str(), String::as_str);
    let mut event = crate::durable::queued_event(&facts.job_id, created, accepted_by);
    crate::pipeline::sealed::tell_queued(
        &mut event.status,
        job.metadata.annotations.as_ref(),
        &s.keys.sealed,
    );
    Some(Outbound::Lifecycle(event))
}

/// Where a traced job's system calls are recorded, for its RUNNING and terminal events (a traced job
/// says so in its events); `None` for a job that is not traced.
fn trace_of(
    obs: &Observed<'_>,
    s: &Settings,
    facts: &JobFacts,
) -> Option<Box<crate::messages::v1::KeptTrace>> {
    crate::pipeline::plugins::traced::location(
        obs.job.metadata.annotations.as_ref(),
        &s.keys.prefix,
        facts.replicas,
    )
    .map(Box::new)
}

/// Step 2: the final ticks, the proxy remove and the terminal event, then the terminal state.
fn publish_end(
    obs: &Observed<'_>,
    s: &Settings,
    facts: &JobFacts,
    record: &Record,
    outcome: &Outcome,
    now: Timestamp,
) -> Result<Action, FactsError> {
    let ended = outcome.ended();
    let completion =
        hooks::on_completion(&s.config.pipeline, obs.job, obs.pods, ended, now.max(ended))?;
    let cleanup = hooks::on_cleanup(&s.config.pipeline, obs.job, ended)?;
    let expiry = facts.expiry.or_else(|| {
        let start = facts.start.or(outcome.started())?;
        start.checked_add(facts.max_time?).ok()
    });
    // A job kept by its TTL is ended and loses its companions in the next step (1), or its finalizer in
    // this write when it has none to lose ([`finishes_with_the_end`]). One created without it (by an
    // older runner) is released right after the terminal state is persisted: if it is being deleted
    // already, it still has its companions, which only a foreground deletion removes before the
    // record ends.
    let mut action = Action {
        what: "end",
        again: true,
        release: !crate::cluster::end::has_ttl(obs.job),
        ..Action::default()
    };
    action.publish.extend(queued_first(obs, facts, record, s));
    if record.published == Published::Queued
        && let Some(start) = outcome.started().or(facts.start)
    {
        let mut running = events::running(&facts.job_id, start, expiry, &s.runner_id);
        running.trace = trace_of(obs, s, facts);
        action.publish.push(Outbound::Lifecycle(running));
    }
    action.failures.extend(completion.failures.iter().cloned());
    action.failures.extend(cleanup.failures.iter().cloned());
    action.publish.extend(completion.publish.iter().cloned());
    action.publish.extend(cleanup.publish.iter().cloned());
    let mut terminal = events::terminal(&facts.job_id, outcome, expiry, &s.runner_id);
    terminal.output = crate::pipeline::plugins::output_files::location(
        obs.job.metadata.annotations.as_ref(),
        &s.keys.prefix,
        facts.replicas,
    )
    .map(Box::new);
    terminal.trace = trace_of(obs, s, facts);
    action.publish.push(Outbound::Lifecycle(terminal));
    action.set = completion.set.clone();
    action.remove = completion.remove.clone();
    action.set.insert(
        s.keys.lifecycle_state.clone(),
        outcome.state.as_str().to_owned(),
    );
    action.remove_finalizer = finishes_with_the_end(obs.job, s);
    Ok(action)
}

/// Whether the finalizer can go in the write that records the end, instead of a write of its own
/// after it (step 1): once the end is published, nothing is left for it to hold when the job is kept by
/// its TTL, Volcano has taken the job's end in hand (no `TerminateJob` to send first), and no companion
/// must be deleted before it goes. A batch job's end is then one write, not two.
fn finishes_with_the_end(job: &VolcanoJob, s: &Settings) -> bool {
    job.metadata.deletion_timestamp.is_none()
        && crate::cluster::end::has_ttl(job)
        && crate::cluster::end::is_ending(job)
        && !crate::cluster::end::deletes_companions_at_end(job, &s.keys)
        && job
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| *f == s.finalizer)
}

/// The outcome of a job that was deleted (or vanished), by the cause its deleter recorded (W11).
fn by_cause(
    facts: &JobFacts,
    record: &Record,
    ranks: &[RankView],
    started: Option<Timestamp>,
    deleted_at: Timestamp,
    maintenance_cut: Option<Timestamp>,
) -> Outcome {
    // The programs' real end once they have all stopped; while one still runs (the grace is over), the
    // deletion, which is when the job was asked to stop.
    let mut end = if ranks.iter().any(|r| r.running) {
        deleted_at
    } else {
        observe::last_finish(ranks).unwrap_or(deleted_at)
    };
    let words = record.termination_reason.clone();
    let (state, reason, status) = match &facts.termination_cause {
        Some(TerminationCause::Expired) => {
            if let Some(expiry) = facts.expiry {
                // Never charged past the allocation, even when the deletion came late.
                end = end.min(expiry);
            }
            let status = match facts.max_time {
                Some(t) => format!(
                    "Job has expired: its time allocation of {} ran out",
                    human(t)
                ),
                None => "Job has expired".to_owned(),
            };
            (Terminal::Expired, "expired".to_owned(), status)
        }
        Some(TerminationCause::Cancelled) => (
            Terminal::Cancelled,
            "cancelled".to_owned(),
            match words {
                Some(w) => format!("Job was cancelled: {w}"),
                None => "Job was cancelled".to_owned(),
            },
        ),
        Some(TerminationCause::Other(cause)) => {
            if cause == super::maintenance::CAUSE
                && let Some(cut) = maintenance_cut
            {
                // Charged up to the window's start, however late the pods stopped.
                end = end.min(cut);
            }
            (
                Terminal::Failure,
                cause.clone(),
                words.unwrap_or_else(|| format!("Job was stopped ({cause})")),
            )
        }
        None => (
            Terminal::Failure,
            "deleted".to_owned(),
            "Job was stopped: its VolcanoJob was deleted without a recorded cause".to_owned(),
        ),
    };
    if let Some(start) = started {
        end = end.max(start);
    }
    Outcome {
        state,
        reason,
        status,
        started_at: started.map(|t| t.as_millisecond()),
        ended_at: end.as_millisecond(),
        exit_codes: exit_codes(ranks),
        log_tails: Vec::new(),
    }
}

/// The outcome of a job that ended by itself.
fn natural(
    job: &VolcanoJob,
    facts: &JobFacts,
    ranks: &[RankView],
    started: Option<Timestamp>,
    disrupted: Option<String>,
    now: Timestamp,
) -> Outcome {
    let codes = exit_codes(ranks);
    let mut failed: Vec<&RankView> = ranks
        .iter()
        .filter(|r| r.terminated.as_ref().is_some_and(|t| t.code != 0))
        .collect();
    failed.sort_by_key(|r| (r.terminated.as_ref().and_then(|t| t.finished_at), r.rank));
    let phase = job.phase();
    let state = job.status.as_ref().map(|s| &s.state);
    let volcano_words = || {
        let reason = state.and_then(|s| s.reason.clone()).unwrap_or_default();
        let message = state.and_then(|s| s.message.clone()).unwrap_or_default();
        match (reason.is_empty(), message.is_empty()) {
            (false, false) => format!(": {reason}: {message}"),
            (false, true) => format!(": {reason}"),
            (true, false) => format!(": {message}"),
            (true, true) => String::new(),
        }
    };
    let all_zero = (0..facts.replicas).all(|r| codes.iter().any(|c| c.rank == r && c.code == 0));
    let (terminal, reason, status) = if phase == JobPhase::Aborted {
        (
            Terminal::Failure,
            "aborted".to_owned(),
            format!("Volcano aborted the job{}", volcano_words()),
        )
    } else if let Some(status) = failed_ranks(&failed) {
        (Terminal::Failure, "exit_code".to_owned(), status)
    } else if matches!(phase, JobPhase::Failed | JobPhase::Terminated)
        && let Some(why) = disrupted
    {
        // A rank's pod was taken away (its node lost, an eviction) and the job could not go on.
        let max = job.max_attempts();
        let status = if job.retries() >= max {
            format!("The job failed after {why}: all {max} of its attempts (maxRetry) are used up")
        } else {
            format!("The job failed after {why}{}", volcano_words())
        };
        (Terminal::Failure, "disrupted".to_owned(), status)
    } else if matches!(phase, JobPhase::Failed | JobPhase::Terminated) {
        (
            Terminal::Failure,
            format!("volcano_{}", phase.as_str().to_ascii_lowercase()),
            format!("Volcano ended the job as {}{}", phase, volcano_words()),
        )
    } else if all_zero
        || job
            .status
            .as_ref()
            .is_some_and(|s| s.succeeded >= facts.replicas as i32 && s.failed == 0)
    {
        (
            Terminal::Success,
            "completed".to_owned(),
            "Job has completed".to_owned(),
        )
    } else {
        (
            Terminal::Failure,
            "unknown_exit".to_owned(),
            "The job ended, but not every rank's exit code could be read".to_owned(),
        )
    };
    // Facts from the objects are never clamped to `now`: the view may be newer than the clock reading.
    let end = observe::last_finish(ranks)
        .or_else(|| phase_time(job))
        .unwrap_or(now);
    let end = started.map_or(end, |s| end.max(s));
    Outcome {
        state: terminal,
        reason,
        status,
        started_at: started.map(|t| t.as_millisecond()),
        ended_at: end.as_millisecond(),
        exit_codes: codes,
        log_tails: Vec::new(),
    }
}

/// The status of a job whose ranks exited with an error, `failed` in the order they ended: the first,
/// then the others. `None`: none did.
fn failed_ranks(failed: &[&RankView]) -> Option<String> {
    let first = failed.first()?;
    let t = first
        .terminated
        .as_ref()
        .map(|t| (t.code, t.reason.clone()));
    let (code, why) = t.unwrap_or((1, None));
    let mut status = format!("Rank {} exited with code {code}", first.rank);
    if let Some(why) = why.filter(|w| w == "OOMKilled") {
        status.push_str(&format!(" ({why}: out of memory)"));
    }
    if failed.len() > 1 {
        let others: Vec<String> = failed[1..]
            .iter()
            .filter_map(|r| {
                Some(format!(
                    "rank {} with {}",
                    r.rank,
                    r.terminated.as_ref()?.code
                ))
            })
            .collect();
        status.push_str(&format!("; then {}", others.join(", ")));
    }
    Some(status)
}

fn exit_codes(ranks: &[RankView]) -> Vec<RankCode> {
    ranks
        .iter()
        .filter_map(|r| {
            Some(RankCode {
                rank: r.rank,
                code: r.terminated.as_ref()?.code,
            })
        })
        .collect()
}

/// How long a view in which the job's phase is ahead of its pods waits for the pods' watch before it is
/// read afresh. The watches deliver a change within milliseconds; the wait turns the read every job's
/// start and end would otherwise cost into a rare one (a watch that lost an event, or a lagging API).
pub const VIEW_LAG_GRACE: SignedDuration = SignedDuration::from_secs(3);

/// Until when a view whose job phase is ahead of its pods waits for the watch: `VIEW_LAG_GRACE` after
/// the later of Volcano entering the phase and this monitor first seeing the job in it (`seen`): a
/// monitor behind its watches by more than the grace (a busy runner, a burst) has the pods' events in
/// its own buffer, and reading them from the API would add two requests per start and end just when the
/// API server is loaded. The wait is at most the grace after `seen` (clamped to `now`). `None` (read
/// afresh now) once that has passed, when the phase has no time, or when its
/// time is implausibly far ahead of the clock (skew must not stretch the wait).
fn lag_wait(job: &VolcanoJob, seen: Option<Timestamp>, now: Timestamp) -> Option<Timestamp> {
    let entered = phase_time(job)?;
    if entered > now.checked_add(VIEW_LAG_GRACE).ok()? {
        return None;
    }
    let since = seen.map_or(entered, |seen| entered.max(seen.min(now)));
    let until = since.checked_add(VIEW_LAG_GRACE).ok()?;
    (now < until).then_some(until)
}

/// The monitor's first sight of the job's phase ([`Observed::phase_seen`]), while its view holds a pod
/// of every rank: the events of the pods it holds come to it, but a pod it lacks may have finished
/// before its job was held (a finished pod of a job not held is not taken in) and never come; such a
/// view counts from Volcano's transition alone.
fn seen_with_every_rank(
    obs: &Observed<'_>,
    replicas: u32,
    ranks: &[RankView],
) -> Option<Timestamp> {
    obs.phase_seen
        .filter(|_| (0..replicas).all(|r| ranks.iter().any(|v| v.rank == r)))
}

/// When Volcano entered the current phase.
fn phase_time(job: &VolcanoJob) -> Option<Timestamp> {
    job.status
        .as_ref()?
        .state
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
}

/// Builds the "record the outcome" step: the outcome with the log tails still to read, plus the start
/// (for the final tick) and the cause (W11, before anything deletes the job).
fn record_step(
    s: &Settings,
    facts: &JobFacts,
    outcome: Outcome,
    ranks: &[RankView],
    cause: Option<&str>,
) -> Step {
    let mut set = BTreeMap::new();
    if facts.start.is_none()
        && let Some(start) = outcome.started()
    {
        set.insert(s.keys.job_start.clone(), format_millis(start));
    }
    if facts.termination_cause.is_none()
        && let Some(cause) = cause
    {
        set.insert(s.keys.termination_cause.clone(), cause.to_owned());
    }
    // A successful job's tails would cost a log read each and tell no one why it failed.
    let logs = if outcome.state == Terminal::Success && !s.log_tails_on_success {
        Vec::new()
    } else {
        ranks
            .iter()
            .filter(|r| r.started_at.is_some() || r.terminated.is_some())
            .map(|r| (r.rank, r.pod.clone()))
            .collect()
    };
    Step::Record {
        outcome,
        logs,
        set,
        fresh: true,
    }
}

fn pending(
    obs: &Observed<'_>,
    facts: &JobFacts,
    pull: Option<(&PullFailure, Timestamp)>,
) -> observe::PendingReason {
    let queue = obs.job.spec.queue.as_deref().unwrap_or("default");
    observe::pending_reason(PendingInput {
        queue,
        replicas: facts.replicas,
        product: &facts.product,
        podgroup: obs.podgroup,
        jobs_ahead: obs.jobs_ahead,
        pods: obs.pods,
        pull,
    })
}

#[cfg(test)]
mod tests {
    //! The decision driven through whole lives in memory: a rendered job, statuses and pods set by
    //! hand, and a tiny executor that applies each step the way the real one does.

    use super::*;
    use crate::messages::v1::{JobEvent, JobState, SubmitJob};
    use crate::volcano::{JobCondition, JobState as VcState, JobStatus};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
        ContainerStatus, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const START: i64 = 1_800_000_000;

    #[test]
    fn an_expectation_that_becomes_a_bound_is_told_even_at_the_same_time() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let tolerance = SignedDuration::from_secs(60);
        let at = |kind: &str, s: i64| format!("{kind}:{}", (1_800_000_000 + s) * 1000);
        assert!(estimate_moved(
            &at("at", 600),
            &at("by", 600),
            now,
            tolerance
        ));
        assert!(estimate_moved(
            &at("by", 600),
            &at("at", 600),
            now,
            tolerance
        ));
        assert!(!estimate_moved(
            &at("by", 600),
            &at("by", 600),
            now,
            tolerance
        ));
        assert!(!estimate_moved(
            &at("at", 600),
            &at("at", 605),
            now,
            tolerance
        ));
        assert!(
            estimate_moved(&at("by", 600), &at("by", 700), now, tolerance),
            "later"
        );
        assert!(estimate_moved(&at("at", 600), "never", now, tolerance));
    }

    /// The persisted estimate counts the estimates told, and an expectation needs a larger move for
    /// each: a job hears a handful while it waits (a bound later is told however often told).
    #[test]
    fn the_estimates_told_are_counted_and_each_expectation_needs_a_larger_move() {
        let now = Timestamp::from_second(START).unwrap();
        let tolerance = SignedDuration::from_secs(60);
        let at = |kind: &str, s: i64| format!("{kind}:{}", (START + s) * 1000);
        let times = |token: String, n: u32| format!("{token}:{n}");
        assert_eq!(count_told("", &at("at", 600)), times(at("at", 600), 1));
        assert_eq!(
            count_told(&times(at("at", 600), 1), &at("at", 700)),
            times(at("at", 700), 2)
        );
        assert_eq!(
            count_told(&at("by", 600), &at("at", 700)),
            format!("{}:b", times(at("at", 700), 2)),
            "a token persisted before the count was kept counts as told once; a bound was told"
        );
        assert_eq!(
            count_told(&format!("{}:b", times(at("at", 700), 2)), &at("at", 800)),
            format!("{}:b", times(at("at", 800), 3)),
            "that a bound was told is kept"
        );
        assert_eq!(count_told(&times(at("at", 600), 3), "never"), "never");
        assert_eq!(count_told("never", &at("by", 600)), times(at("by", 600), 1));
        // 160 s later, ten minutes away: past the tolerance of a first expectation (and a quarter of
        // its wait), within that of a third.
        assert!(estimate_moved(
            &times(at("at", 600), 1),
            &at("at", 760),
            now,
            tolerance
        ));
        assert!(!estimate_moved(
            &times(at("at", 600), 3),
            &at("at", 760),
            now,
            tolerance
        ));
        assert!(estimate_moved(
            &times(at("by", 600), 9),
            &at("by", 611),
            now,
            tolerance
        ));
        assert!(estimate_moved(
            &times(at("by", 600), 9),
            &at("at", 600),
            now,
            tolerance
        ));
        // An estimate not known now leaves the told token standing: no move.
        let told = times(at("at", 600), 4);
        assert!(!estimate_moved(&told, &told, now, tolerance));
    }

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(START + s).unwrap()
    }

    fn settings(f: impl FnOnce(&mut Config)) -> Settings {
        let mut config = Config::default();
        f(&mut config);
        Settings::new(Arc::new(config), "runner-a")
    }

    /// The figlet example (1 replica, 1 h), as the runner creates it.
    fn observed<'a>(job: &'a VolcanoJob, pods: &'a [Pod]) -> Observed<'a> {
        Observed::plain(job, pods)
    }

    fn job(s: &Settings) -> VolcanoJob {
        let submit: SubmitJob = serde_json::from_str(include_str!(
            "../../schemas/examples/submit-job.figlet.json"
        ))
        .unwrap();
        let mut job = crate::pipeline::render(&submit, &*s.config, ts(0))
            .unwrap()
            .vcjob;
        job.metadata.creation_timestamp = Some(Time(ts(0)));
        job.metadata.resource_version = Some("1".into());
        job.metadata.finalizers = Some(vec![s.finalizer.clone()]);
        job.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(s.keys.lifecycle_state.clone(), "QUEUED".into());
        job
    }

    /// As the submit path leaves a job once the broker confirmed its QUEUED: `queuedConfirmed`.
    fn queued_recorded(job: &mut VolcanoJob, s: &Settings) {
        job.metadata
            .annotations
            .get_or_insert_default()
            .insert(s.queued.confirmed.clone(), "true".into());
    }

    /// As the monitor leaves a job once RUNNING is published: the state and the start it persisted.
    fn mark_running(job: &mut VolcanoJob, s: &Settings, started: i64) {
        let annotations = job.metadata.annotations.get_or_insert_default();
        annotations.insert(s.keys.lifecycle_state.clone(), "RUNNING".into());
        annotations.insert(s.keys.job_start.clone(), format_millis(ts(started)));
    }

    fn set_phase(job: &mut VolcanoJob, phase: JobPhase, at: i64) {
        let status = job.status.get_or_insert_with(JobStatus::default);
        status.state = VcState {
            phase: phase.clone(),
            reason: None,
            message: None,
            last_transition_time: Some(Time(ts(at))),
        };
        status.conditions.push(JobCondition {
            status: phase,
            last_transition_time: Some(Time(ts(at))),
        });
    }

    fn pod(job_id: &str, rank: u32, state: ContainerState) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(crate::pipeline::names::pod_name(job_id, rank));
        p.metadata.creation_timestamp = Some(Time(ts(1)));
        p.status = Some(PodStatus {
            phase: Some(
                if state.running.is_some() {
                    "Running"
                } else {
                    "Pending"
                }
                .into(),
            ),
            start_time: Some(Time(ts(1))),
            pod_ip: Some(format!("10.0.0.{}", rank + 1)),
            container_statuses: Some(vec![ContainerStatus {
                name: "user-job".into(),
                image: "dreg.cloud.sdu.dk/ucloud/figlet:1.0.0".into(),
                state: Some(state),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        });
        p
    }

    fn running(at: i64) -> ContainerState {
        ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(ts(at))),
            }),
            ..ContainerState::default()
        }
    }

    fn exited(code: i32, start: i64, end: i64) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                started_at: Some(Time(ts(start))),
                finished_at: Some(Time(ts(end))),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        }
    }

    /// What the in-memory executor saw.
    #[derive(Default)]
    struct World {
        published: Vec<Outbound>,
        /// Asked to end: a TerminateJob command, or a deletion.
        deleted: bool,
        /// TerminateJob commands sent.
        commands: u32,
        companions_deleted: bool,
        /// Actions that removed the finalizer without recording anything (a write of their own).
        finish_writes: u32,
        /// Gone: deleted, and the finalizer removed.
        gone: bool,
        next_check: Option<Timestamp>,
        /// What `Observed::queued_confirmed` says for every decision (set, as the executor does, once
        /// the monitor told QUEUED itself).
        queued_confirmed: bool,
        /// What `Observed::cancel_seen` says for every decision.
        cancel_seen: bool,
    }

    /// Decides and applies until the job waits, like `Executor::handle` (log tails are not read).
    fn drive(s: &Settings, job: &mut VolcanoJob, pods: &[Pod], now: Timestamp, world: &mut World) {
        drive_with(s, job, pods, None, now, world);
    }

    fn drive_with(
        s: &Settings,
        job: &mut VolcanoJob,
        pods: &[Pod],
        estimate: Option<&Estimate>,
        now: Timestamp,
        world: &mut World,
    ) {
        drive_seen(s, job, (pods, None, None), estimate, now, world);
    }

    /// [`drive_with`] with the job's PodGroup and its place in its queue.
    fn drive_seen(
        s: &Settings,
        job: &mut VolcanoJob,
        (pods, podgroup, jobs_ahead): (&[Pod], Option<&PodGroup>, Option<u32>),
        estimate: Option<&Estimate>,
        now: Timestamp,
        world: &mut World,
    ) {
        for _ in 0..20 {
            let obs = Observed {
                podgroup,
                jobs_ahead,
                estimate,
                fresh_at: Some(now),
                queued_confirmed: world.queued_confirmed,
                cancel_seen: world.cancel_seen,
                ..observed(job, pods)
            };
            match decide(&obs, s, now).unwrap() {
                Step::Wait { next_check } => {
                    world.next_check = next_check;
                    return;
                }
                Step::Record {
                    outcome, mut set, ..
                } => {
                    set.insert(s.keys.outcome.clone(), outcome.to_annotation());
                    job.metadata.annotations.as_mut().unwrap().extend(set);
                }
                Step::Act(action) => {
                    world.published.extend(action.publish.iter().cloned());
                    world.queued_confirmed |= action.carry_queued;
                    let a = job.metadata.annotations.as_mut().unwrap();
                    a.extend(action.set.clone());
                    for k in &action.remove {
                        a.remove(k);
                    }
                    if action.delete && !crate::cluster::end::is_ending(job) {
                        // The TerminateJob command, taken by Volcano at once.
                        let status = job.status.get_or_insert_with(JobStatus::default);
                        status.state = VcState {
                            phase: JobPhase::Terminating,
                            reason: None,
                            message: None,
                            last_transition_time: Some(Time(now)),
                        };
                        world.deleted = true;
                        world.commands += 1;
                    }
                    if action.release && job.metadata.deletion_timestamp.is_none() {
                        job.metadata.deletion_timestamp = Some(Time(now));
                        world.deleted = true;
                    }
                    if action.companions {
                        world.companions_deleted = true;
                    }
                    if action.remove_finalizer {
                        if action.set.is_empty() && action.remove.is_empty() {
                            world.finish_writes += 1;
                        }
                        job.metadata.finalizers = Some(Vec::new());
                        world.gone = job.metadata.deletion_timestamp.is_some();
                        return;
                    }
                    if !action.again {
                        world.next_check = action.next_check;
                        return;
                    }
                }
            }
        }
        panic!("the decision did not settle");
    }

    fn lifecycle(world: &World) -> Vec<JobEvent> {
        world
            .published
            .iter()
            .filter_map(|o| match o {
                Outbound::Lifecycle(e) => Some(e.clone()),
                _ => None,
            })
            .collect()
    }

    fn ticks(world: &World) -> Vec<crate::messages::v1::AccountingTick> {
        world
            .published
            .iter()
            .filter_map(|o| match o {
                Outbound::Accounting(t) => Some(t.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn queued_running_success_with_ticks_to_the_real_end() {
        let s = settings(|_| {});
        let mut job = job(&s);
        let mut world = World::default();
        // Pending for less than `pending_status_after`: nothing to tell yet.
        drive(&s, &mut job, &[], ts(0), &mut world);
        assert!(world.published.is_empty(), "{:?}", world.published);
        // Pending for 5 s, but nothing says QUEUED went out yet: the submit path's record of it is
        // awaited, until 10 s after the creation at most.
        drive(&s, &mut job, &[], ts(5), &mut world);
        assert!(world.published.is_empty(), "{:?}", world.published);
        assert_eq!(world.next_check, Some(ts(10)));
        // The submit path recorded it: the status event alone, at the time the job began to wait.
        queued_recorded(&mut job, &s);
        drive(&s, &mut job, &[], ts(6), &mut world);
        assert_eq!(lifecycle(&world).len(), 1);
        assert_eq!(lifecycle(&world)[0].state, JobState::Unspecified as i32);
        assert_eq!(lifecycle(&world)[0].timestamp.unwrap().seconds, START);
        // Running from t=5 (the container's start, not the time we look).
        set_phase(&mut job, JobPhase::Running, 6);
        let pods = vec![pod("4817", 0, running(5))];
        drive(&s, &mut job, &pods, ts(20), &mut world);
        let events = lifecycle(&world);
        let started = events.last().unwrap();
        assert_eq!(started.event_id, "4817/RUNNING");
        assert_eq!(started.started_at.unwrap().seconds, START + 5);
        assert_eq!(started.expires_at.unwrap().seconds, START + 5 + 3600);
        assert_eq!(
            world.next_check,
            Some(ts(75)),
            "the first tick boundary, plus the settle delay"
        );
        // Looking again changes nothing: RUNNING is persisted, not cached (W4, W5).
        let before = world.published.len();
        drive(&s, &mut job, &pods, ts(30), &mut world);
        assert_eq!(world.published.len(), before);
        // Two ticks are due at t=135 (the second boundary, 125, plus the settle delay), one before.
        drive(&s, &mut job, &pods, ts(134), &mut world);
        assert_eq!(ticks(&world).len(), 1);
        drive(&s, &mut job, &pods, ts(135), &mut world);
        assert_eq!(ticks(&world).len(), 2);
        // The program ends at t=150 with 0; Volcano says Completed.
        set_phase(&mut job, JobPhase::Completed, 151);
        let pods = vec![pod("4817", 0, exited(0, 5, 150))];
        drive(&s, &mut job, &pods, ts(200), &mut world);
        let all = ticks(&world);
        let total: i64 = all.iter().map(|t| t.duration_ms).sum();
        assert_eq!(total, 145_000, "ticks add up to the real run time");
        assert!(all.last().unwrap().r#final);
        assert_eq!(
            all.last().unwrap().interval_end.unwrap().seconds,
            START + 150
        );
        let end = lifecycle(&world).pop().unwrap();
        assert_eq!(end.event_id, "4817/SUCCESS");
        assert_eq!(end.ended_at.unwrap().seconds, START + 150);
        assert_eq!(end.exit_codes.len(), 1);
        assert!(
            world.deleted && !world.gone,
            "released (pods and companions go), kept as the record of the submission"
        );
        assert_eq!(world.next_check, Some(ts(150 + 24 * 3600)));
        drive(&s, &mut job, &pods, ts(150 + 24 * 3600 - 1), &mut world);
        assert!(!world.gone, "kept for the whole retention");
        drive(&s, &mut job, &pods, ts(150 + 24 * 3600), &mut world);
        assert!(world.gone, "then the finalizer is removed");
    }

    /// A 59 s job whose end the kubelet reports a second late: at the boundary (60 s) the view still
    /// says running, but nothing is charged before the settle delay, by when the end is seen; one final
    /// tick of 59 s, never a 60 s tick plus a zero-length one.
    #[test]
    fn an_end_reported_late_is_not_charged_past() {
        let s = settings(|_| {});
        let mut job = job(&s);
        let mut world = World::default();
        set_phase(&mut job, JobPhase::Running, 1);
        let running_pods = vec![pod("4817", 0, running(0))];
        drive(&s, &mut job, &running_pods, ts(1), &mut world);
        // The boundary has passed and the lagging view still shows the container running.
        drive(&s, &mut job, &running_pods, ts(60), &mut world);
        drive(
            &s,
            &mut job,
            &running_pods,
            ts(60) + SignedDuration::from_millis(999),
            &mut world,
        );
        assert!(
            ticks(&world).is_empty(),
            "nothing charged within the settle delay"
        );
        // A second later the view catches up: the container ended at 59 s.
        set_phase(&mut job, JobPhase::Completed, 61);
        let ended = vec![pod("4817", 0, exited(0, 0, 59))];
        drive(&s, &mut job, &ended, ts(70), &mut world);
        let all = ticks(&world);
        assert_eq!(all.len(), 1, "{all:?}");
        assert_eq!(all[0].duration_ms, 59_000);
        assert!(all[0].r#final);
        assert_eq!(all[0].interval_end.unwrap().seconds, START + 59);
    }

    /// A restart is told with its attempt among `maxRetry`; a disruption after which no attempt is left
    /// is no restart (Volcano fails the job: never `attempt 4 of 3`), but it is recorded, so that the
    /// FAILURE names it even when told by a runner that did not see the pod go.
    #[test]
    fn a_restart_is_told_within_its_attempts_and_the_last_disruption_is_recorded() {
        let s = settings(|_| {});
        let mut job = job(&s);
        queued_recorded(&mut job, &s);
        mark_running(&mut job, &s, 3);
        set_phase(&mut job, JobPhase::Running, 3);
        let pods = [pod("4817", 0, running(3))];
        let lost = |node: &str| Disruption {
            rank: Some(0),
            node: Some(node.into()),
            reason: "DeletionByPodGC".into(),
            message: "node no longer exists".into(),
        };
        let decide_on = |job: &VolcanoJob, d: &Disruption, now: i64| {
            let obs = Observed {
                // The attempt the restart ended.
                disruption: Some((job.retries() - 1, d)),
                fresh_at: Some(ts(now)),
                ..observed(job, &pods)
            };
            decide(&obs, &s, ts(now)).unwrap()
        };
        job.status.as_mut().unwrap().retry_count = 2;
        // The cause is recorded first, then told from the record.
        let Step::Act(recorded) = decide_on(&job, &lost("n2"), 20) else {
            panic!("the cause to record");
        };
        assert!(
            recorded.publish.is_empty(),
            "recorded before told: {recorded:?}"
        );
        assert_eq!(recorded.set[&s.keys.disruption_retry], "2");
        job.metadata
            .annotations
            .get_or_insert_default()
            .extend(recorded.set.clone());
        // Whoever tells it (a runner whose watch saw another pod go, or none) tells what was recorded.
        let Step::Act(told) = decide_on(&job, &lost("elsewhere"), 21) else {
            panic!("a restart to tell");
        };
        let Some(Outbound::Lifecycle(event)) = told.publish.first() else {
            panic!("{told:?}");
        };
        assert!(
            event.status.contains("rank 0's node n2") && event.status.ends_with("(attempt 3 of 3)"),
            "{}",
            event.status
        );
        job.metadata
            .annotations
            .get_or_insert_default()
            .extend(told.set.clone());

        job.status.as_mut().unwrap().retry_count = 3;
        let Step::Act(last) = decide_on(&job, &lost("n3"), 40) else {
            panic!("the disruption to record");
        };
        assert!(last.publish.is_empty(), "no restart event: {last:?}");
        let d = &last.set[&s.keys.disruption];
        assert!(d.contains("rank 0's node n3"), "{d}");
        assert_eq!(last.set[&s.keys.restarts], "3");
        assert_eq!(last.set[&s.keys.disruption_retry], "3");
    }

    #[test]
    fn a_failure_blames_a_disruption_of_its_own_attempt_or_the_last_once_the_attempts_are_used_up()
    {
        let s = settings(|_| {});
        let mut job = job(&s);
        set_phase(&mut job, JobPhase::Failed, 50);
        job.metadata.annotations.get_or_insert_default().insert(
            s.keys.disruption.clone(),
            "rank 0's node n1 was lost".into(),
        );
        let seen = Disruption {
            rank: Some(0),
            node: Some("n2".into()),
            reason: "EvictionByEvictionAPI".into(),
            message: String::new(),
        };
        let blame = |job: &VolcanoJob, disruption: Option<(i32, &Disruption)>| {
            to_blame(
                &Observed {
                    disruption,
                    ..observed(job, &[])
                },
                &s,
            )
        };
        job.status.as_mut().unwrap().retry_count = 1;
        // Restarted after n1 and went on: a later failure is not n1's doing, nor an older eviction's.
        assert_eq!(blame(&job, None), None);
        assert_eq!(blame(&job, Some((0, &seen))), None);
        // A disruption in this attempt is.
        assert_eq!(
            blame(&job, Some((1, &seen))).as_deref(),
            Some("rank 0's pod was evicted from node n2")
        );
        // Attempts used up (3 of 3): the one recorded for the last restart, else the last one seen; never
        // one recorded for an earlier restart, nor one that ended an earlier attempt.
        job.status.as_mut().unwrap().retry_count = 3;
        assert_eq!(
            blame(&job, Some((2, &seen))).as_deref(),
            Some("rank 0's pod was evicted from node n2")
        );
        assert_eq!(blame(&job, Some((1, &seen))), None);
        job.metadata
            .annotations
            .get_or_insert_default()
            .insert(s.keys.disruption_retry.clone(), "2".into());
        assert_eq!(blame(&job, None), None, "recorded for the second restart");
        job.metadata
            .annotations
            .get_or_insert_default()
            .insert(s.keys.disruption_retry.clone(), "3".into());
        assert_eq!(
            blame(&job, Some((2, &seen))).as_deref(),
            Some("rank 0's node n1 was lost"),
            "the record over what this runner saw"
        );
    }

    #[test]
    fn a_non_zero_exit_is_a_failure_with_the_codes() {
        let s = settings(|_| {});
        let mut job = job(&s);
        let mut world = World::default();
        set_phase(&mut job, JobPhase::Running, 2);
        drive(
            &s,
            &mut job,
            &[pod("4817", 0, running(2))],
            ts(3),
            &mut world,
        );
        set_phase(&mut job, JobPhase::Failed, 41);
        drive(
            &s,
            &mut job,
            &[pod("4817", 0, exited(3, 2, 40))],
            ts(45),
            &mut world,
        );
        let end = lifecycle(&world).pop().unwrap();
        assert_eq!(end.event_id, "4817/FAILURE");
        assert_eq!(end.reason, "exit_code");
        assert_eq!(end.status, "Rank 0 exited with code 3");
        assert_eq!(end.exit_codes[0].exit_code, 3);
    }

    /// A success seen whole (Volcano finished the job, every rank's program ended in the view) is
    /// published and then recorded in one write with the terminal state and the finalizer's removal; a
    /// failure's outcome is recorded first (its tails are read from the pods, and a successor could not
    /// compute its cause again), as is a success whose ranks' ends the view has not all seen.
    #[test]
    fn only_a_success_seen_whole_is_closed_in_one_write() {
        let s = settings(|_| {});
        let look = |phase: JobPhase, pods: &[Pod], now: i64| {
            let mut job = job(&s);
            queued_recorded(&mut job, &s);
            mark_running(&mut job, &s, 2);
            set_phase(&mut job, phase, 41);
            // Kept by its TTL, as every job this runner creates (the tests' jobs are rendered without).
            job.spec.ttl_seconds_after_finished = Some(86_400);
            decide(&observed(&job, pods), &s, ts(now)).unwrap()
        };
        let success = look(JobPhase::Completed, &[pod("4817", 0, exited(0, 2, 40))], 45);
        let Step::Act(close) = success else {
            panic!("one action: {success:?}");
        };
        assert_eq!(close.what, "close");
        assert!(close.records_outcome && close.remove_finalizer && close.again);
        let recorded: Outcome = serde_json::from_str(&close.set[&s.keys.outcome]).unwrap();
        assert_eq!(recorded.state, Terminal::Success);
        assert_eq!(recorded.ended_at, ts(40).as_millisecond());
        assert_eq!(close.set[&s.keys.lifecycle_state], "SUCCESS");
        let told: Vec<String> = close
            .publish
            .iter()
            .filter_map(|o| match o {
                Outbound::Lifecycle(e) => Some(e.event_id.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(told, ["4817/SUCCESS"]);

        let failure = look(JobPhase::Failed, &[pod("4817", 0, exited(3, 2, 40))], 45);
        assert!(
            matches!(&failure, Step::Record { outcome, .. } if outcome.state == Terminal::Failure),
            "{failure:?}"
        );
        // Volcano finished it, but the pods' watch has not brought the rank's end yet: after the lag
        // wait the view is read afresh and the outcome recorded first.
        let late = look(JobPhase::Completed, &[pod("4817", 0, running(2))], 300);
        assert!(
            matches!(&late, Step::Record { fresh: true, .. }),
            "{late:?}"
        );
    }

    #[test]
    fn a_job_that_ran_between_two_looks_still_gets_running_then_its_end() {
        let s = settings(|_| {});
        let mut job = job(&s);
        let mut world = World::default();
        set_phase(&mut job, JobPhase::Completed, 90);
        drive(
            &s,
            &mut job,
            &[pod("4817", 0, exited(0, 10, 89))],
            ts(100),
            &mut world,
        );
        let ids: Vec<String> = lifecycle(&world).into_iter().map(|e| e.event_id).collect();
        assert_eq!(ids, ["4817/QUEUED", "4817/RUNNING", "4817/SUCCESS"]);
        let total: i64 = ticks(&world).iter().map(|t| t.duration_ms).sum();
        assert_eq!(total, 79_000);
    }

    /// Every first event of a job (a pending status, RUNNING, an end that came before either, the end
    /// of a job that vanished) is preceded by the job's QUEUED, unless this process had that QUEUED
    /// confirmed already or the job says that its submit path had (`queuedConfirmed`). Without either,
    /// the first event waits for that record until 10 s after the creation, then goes with a copy.
    #[test]
    fn no_copy_of_queued_once_this_process_or_the_job_says_it_was_confirmed() {
        let s = settings(|_| {});
        // (confirmed in this process, recorded on the job)
        for (confirmed, recorded) in [(false, false), (true, false), (false, true)] {
            let copied = !confirmed && !recorded;
            let ids = |world: &World| -> Vec<String> {
                lifecycle(world).into_iter().map(|e| e.event_id).collect()
            };
            let queued = |then: &[&str]| -> Vec<String> {
                let copy = copied.then_some("4817/QUEUED");
                copy.into_iter()
                    .chain(then.iter().copied())
                    .map(String::from)
                    .collect()
            };
            let fresh = || World {
                queued_confirmed: confirmed,
                ..World::default()
            };
            let job = || {
                let mut job = self::job(&s);
                if recorded {
                    queued_recorded(&mut job, &s);
                }
                job
            };
            let case = format!("confirmed: {confirmed}, recorded: {recorded}");

            // Pending past `pending_status_after`: the status event; without a record, only once the
            // record's grace has passed.
            let mut job1 = job();
            let mut world = fresh();
            drive(&s, &mut job1, &[], ts(5), &mut world);
            if copied {
                assert!(world.published.is_empty(), "{case}");
                assert_eq!(world.next_check, Some(ts(10)), "{case}");
                drive(&s, &mut job1, &[], ts(10), &mut world);
            }
            let status = lifecycle(&world).last().unwrap().event_id.clone();
            assert!(status.starts_with("4817/status/"), "{status}");
            assert_eq!(ids(&world), queued(&[status.as_str()]), "{case}");

            // Started at once: RUNNING.
            let mut job2 = job();
            let mut world = fresh();
            set_phase(&mut job2, JobPhase::Running, 3);
            let pods = [pod("4817", 0, running(3))];
            drive(&s, &mut job2, &pods, ts(4), &mut world);
            if copied {
                assert!(world.published.is_empty(), "{case}");
                drive(&s, &mut job2, &pods, ts(10), &mut world);
            }
            assert_eq!(ids(&world), queued(&["4817/RUNNING"]), "{case}");

            // Ended between two looks: RUNNING and the end.
            let mut job3 = job();
            let mut world = fresh();
            set_phase(&mut job3, JobPhase::Completed, 90);
            let pods = [pod("4817", 0, exited(0, 10, 89))];
            drive(&s, &mut job3, &pods, ts(100), &mut world);
            assert_eq!(
                ids(&world),
                queued(&["4817/RUNNING", "4817/SUCCESS"]),
                "{case}"
            );

            // Vanished before anything was published: its lost-track end (nothing left to wait for).
            let job4 = job();
            let gone = decide_gone(&job4, &[], &s, ts(4), confirmed)
                .unwrap()
                .unwrap();
            let world = World {
                published: gone.publish,
                ..fresh()
            };
            assert_eq!(ids(&world), queued(&["4817/FAILURE"]), "{case}");
        }
    }

    /// A job whose submitting runner left its QUEUED to its monitor (`queuedBy: monitor`: another
    /// runner held its shard) is told QUEUED at once, not at its first event nor after the 10 s that
    /// wait for a submit path's record, and once: the monitor carries the record. While a cancel that
    /// overtook the submission is seen and the job records no cause of its end, QUEUED waits (at most
    /// those 10 s): the submit path's claim (the terminal state CANCELLED) then leaves it untold, the
    /// cancel handler's mark (a cause) lets it go first.
    #[test]
    fn a_job_left_to_its_monitor_is_told_queued_at_once_and_once() {
        let s = settings(|_| {});
        let left = || {
            let mut job = self::job(&s);
            job.metadata
                .annotations
                .get_or_insert_default()
                .insert(s.queued.by.clone(), "monitor".into());
            job
        };
        let ids = |world: &World| -> Vec<String> {
            lifecycle(world).into_iter().map(|e| e.event_id).collect()
        };

        // At once, alone; the next event (a status past `pending_status_after`) without a copy.
        let mut job = left();
        let mut world = World::default();
        drive(&s, &mut job, &[], ts(1), &mut world);
        assert_eq!(ids(&world), ["4817/QUEUED"]);
        assert!(world.queued_confirmed, "its record carried");
        drive(&s, &mut job, &[], ts(6), &mut world);
        let told = ids(&world);
        assert_eq!(told.len(), 2, "{told:?}");
        assert!(told[1].starts_with("4817/status/"), "{told:?}");

        // Started at once: QUEUED, then RUNNING, within the 10 s.
        let mut job = left();
        let mut world = World::default();
        set_phase(&mut job, JobPhase::Running, 1);
        let pods = [pod("4817", 0, running(1))];
        drive(&s, &mut job, &pods, ts(2), &mut world);
        assert_eq!(ids(&world), ["4817/QUEUED", "4817/RUNNING"]);

        // Without the annotation the same job waits for the submit path's record.
        let mut job = self::job(&s);
        let mut world = World::default();
        drive(&s, &mut job, &[], ts(1), &mut world);
        assert!(world.published.is_empty());

        // A cancel seen, no cause recorded: QUEUED waits for the claim, at most 10 s.
        let mut job = left();
        let mut world = World {
            cancel_seen: true,
            ..World::default()
        };
        drive(&s, &mut job, &[], ts(1), &mut world);
        assert!(world.published.is_empty());
        assert_eq!(world.next_check, Some(ts(10)));
        // The submit path's claim: the cause and the terminal state, its CANCELLED told by it.
        let mut claimed = job.clone();
        let a = claimed.metadata.annotations.get_or_insert_default();
        a.insert(s.keys.termination_cause.clone(), "cancelled".into());
        a.insert(s.keys.termination_at.clone(), "2000".into());
        a.insert(s.keys.lifecycle_state.clone(), "CANCELLED".into());
        drive(&s, &mut claimed, &[], ts(3), &mut world);
        assert!(
            !ids(&world).contains(&"4817/QUEUED".to_owned()),
            "{:?}",
            ids(&world)
        );
        // The cancel handler's mark (a cause, no terminal state): QUEUED first.
        let mut marked = job.clone();
        let a = marked.metadata.annotations.get_or_insert_default();
        a.insert(s.keys.termination_cause.clone(), "cancelled".into());
        a.insert(s.keys.termination_at.clone(), "2000".into());
        let mut world = World {
            cancel_seen: true,
            ..World::default()
        };
        drive(&s, &mut marked, &[], ts(3), &mut world);
        assert_eq!(ids(&world).first().map(String::as_str), Some("4817/QUEUED"));
        // Past the 10 s with the cancel still unclaimed: told.
        let mut world = World {
            cancel_seen: true,
            ..World::default()
        };
        drive(&s, &mut job, &[], ts(10), &mut world);
        assert_eq!(ids(&world).first().map(String::as_str), Some("4817/QUEUED"));
    }

    #[test]
    fn image_pull_failure_after_the_grace() {
        let s = settings(|c| c.monitor.image_pull_grace = std::time::Duration::from_secs(120));
        let mut job = job(&s);
        let mut world = World::default();
        let waiting = ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ImagePullBackOff".into()),
                message: Some("Back-off pulling image".into()),
            }),
            ..ContainerState::default()
        };
        let pods = vec![pod("4817", 0, waiting)];
        drive(&s, &mut job, &pods, ts(60), &mut world);
        let status = lifecycle(&world).pop().unwrap();
        assert_eq!(status.reason, "image_pull_retrying");
        assert_eq!(world.next_check, Some(ts(121)), "pod start + grace");
        drive(&s, &mut job, &pods, ts(121), &mut world);
        let end = lifecycle(&world).pop().unwrap();
        assert_eq!(end.event_id, "4817/FAILURE");
        assert_eq!(end.reason, "image_pull");
        assert_eq!(end.timestamp.unwrap().seconds, START + 121);
        assert!(
            ticks(&world).is_empty(),
            "a job that never ran is not charged"
        );
        assert!(world.deleted);
    }

    #[test]
    fn queue_timeout_fails_a_job_that_never_starts() {
        let s = settings(|c| c.monitor.queue_timeout = Some(std::time::Duration::from_secs(600)));
        let mut job = job(&s);
        let mut world = World::default();
        drive(&s, &mut job, &[], ts(10), &mut world);
        assert_eq!(world.next_check, Some(ts(600)));
        drive(&s, &mut job, &[], ts(600), &mut world);
        let end = lifecycle(&world).pop().unwrap();
        assert_eq!(end.reason, "queue_timeout");
        assert!(
            end.status
                .starts_with("The job was not scheduled within 10 minutes: "),
            "{}",
            end.status
        );
    }

    #[test]
    fn expiry_warns_deletes_and_ends_expired_at_the_expiry() {
        let s = settings(|_| {});
        let mut job = job(&s);
        let mut world = World::default();
        set_phase(&mut job, JobPhase::Running, 0);
        let pods = vec![pod("4817", 0, running(0))];
        drive(&s, &mut job, &pods, ts(1), &mut world);
        // 15 and 5 minutes before the expiry at t=3600.
        drive(&s, &mut job, &pods, ts(3600 - 900), &mut world);
        drive(&s, &mut job, &pods, ts(3600 - 300), &mut world);
        let warnings: Vec<String> = lifecycle(&world)
            .into_iter()
            .filter(|e| e.reason == "expiry_warning")
            .map(|e| e.event_id)
            .collect();
        let expiry_ms = (START + 3600) * 1000;
        assert_eq!(
            warnings,
            [
                format!("4817/warning/{expiry_ms}/15"),
                format!("4817/warning/{expiry_ms}/5")
            ]
        );
        // Looked at 10 s late (a failover): deleted, and never charged past the expiry.
        drive(&s, &mut job, &pods, ts(3610), &mut world);
        assert!(world.deleted);
        let cause = job.metadata.annotations.as_ref().unwrap()[&s.keys.termination_cause].clone();
        assert_eq!(cause, "expired");
        // Volcano kills the pod 2 s after the delete.
        let pods = vec![pod("4817", 0, exited(143, 0, 3612))];
        drive(&s, &mut job, &pods, ts(3613), &mut world);
        let end = lifecycle(&world).pop().unwrap();
        assert_eq!(end.event_id, "4817/EXPIRED");
        let total: i64 = ticks(&world).iter().map(|t| t.duration_ms).sum();
        assert_eq!(total, 3_600_000);
        assert!(!world.gone);
        drive(&s, &mut job, &pods, ts(3612 + 24 * 3600), &mut world);
        assert!(
            world.gone,
            "released after the retention, counted from the end"
        );
    }

    #[test]
    fn cancel_reports_the_reason_the_runner_recorded() {
        let s = settings(|_| {});
        let mut job = job(&s);
        let mut world = World::default();
        let a = job.metadata.annotations.as_mut().unwrap();
        a.insert(s.keys.termination_cause.clone(), "cancelled".into());
        a.insert(s.keys.termination_reason.clone(), "user asked".into());
        job.metadata.deletion_timestamp = Some(Time(ts(30)));
        drive(&s, &mut job, &[], ts(31), &mut world);
        let end = lifecycle(&world).pop().unwrap();
        assert_eq!(end.event_id, "4817/CANCELLED");
        assert_eq!(end.status, "Job was cancelled: user asked");
        assert_eq!(end.ended_at.unwrap().seconds, START + 30);
        let ids: Vec<String> = lifecycle(&world).into_iter().map(|e| e.event_id).collect();
        assert_eq!(ids, ["4817/QUEUED", "4817/CANCELLED"], "QUEUED first");
        assert!(!world.gone);
        drive(&s, &mut job, &[], ts(30 + 24 * 3600), &mut world);
        assert!(world.gone);
    }

    /// Drives `job` (4817) from QUEUED recorded through a run of one rank to its SUCCESS at 200 s.
    fn run_to_success(s: &Settings, job: &mut VolcanoJob) -> (World, Vec<Pod>) {
        let mut world = World::default();
        queued_recorded(job, s);
        set_phase(job, JobPhase::Running, 6);
        let pods = vec![pod("4817", 0, running(5))];
        drive(s, job, &pods, ts(20), &mut world);
        set_phase(job, JobPhase::Completed, 151);
        let pods = vec![pod("4817", 0, exited(0, 5, 150))];
        drive(s, job, &pods, ts(200), &mut world);
        assert_eq!(lifecycle(&world).pop().unwrap().event_id, "4817/SUCCESS");
        (world, pods)
    }

    /// A job as the runner now creates it: kept by Volcano's TTL after it finished.
    fn job_with_ttl(s: &Settings) -> VolcanoJob {
        let mut job = job(s);
        job.spec.ttl_seconds_after_finished = Some(86_400);
        job
    }

    #[test]
    fn a_finished_job_with_a_ttl_loses_its_finalizer_and_companions_at_the_end_not_the_retention() {
        let s = settings(|_| {});
        let mut job = job_with_ttl(&s);
        // A Service of its own (a public IP's, say) must go at the end; its NetworkPolicy need not.
        job.metadata.annotations.as_mut().unwrap().insert(
            s.keys.companions.clone(),
            "NetworkPolicy/policy-4817,Service/j-4817-ip".into(),
        );
        let (mut world, pods) = run_to_success(&s, &mut job);
        assert!(world.companions_deleted, "its companions go at the end");
        assert_eq!(world.finish_writes, 1, "the finalizer after them");
        assert_eq!(job.metadata.finalizers, Some(Vec::new()), "unfinalized now");
        assert!(
            job.metadata.deletion_timestamp.is_none() && !world.deleted,
            "not deleted: Volcano's TTL deletes it, nothing holds it as Terminating"
        );
        assert_eq!(world.commands, 0, "Volcano finished it: no command");
        let published = world.published.len();
        drive(&s, &mut job, &pods, ts(200 + 24 * 3600), &mut world);
        assert_eq!(world.published.len(), published, "nothing more to do");
        assert_eq!(
            world.next_check, None,
            "nothing to wait for: the TTL ends it"
        );
    }

    /// A batch job kept by its TTL has no companion to delete (its NetworkPolicy goes with the job at
    /// the TTL): the write that records its end removes the finalizer too, no write of its own after.
    #[test]
    fn a_finished_batch_job_loses_its_finalizer_in_the_write_that_records_its_end() {
        let s = settings(|_| {});
        let mut job = job_with_ttl(&s);
        job.metadata.annotations.as_mut().unwrap().insert(
            s.keys.companions.clone(),
            "NetworkPolicy/policy-4817".into(),
        );
        let (mut world, pods) = run_to_success(&s, &mut job);
        assert_eq!(job.metadata.finalizers, Some(Vec::new()), "unfinalized");
        assert!(!world.companions_deleted, "nothing deleted");
        assert_eq!(world.finish_writes, 0, "no write after the end's");
        assert_eq!(world.commands, 0);
        let published = world.published.len();
        drive(&s, &mut job, &pods, ts(200 + 24 * 3600), &mut world);
        assert_eq!(world.published.len(), published, "nothing more to do");
    }

    #[test]
    fn an_expiry_terminates_the_job_once_and_keeps_it_undeleted() {
        let s = settings(|_| {});
        let mut job = job_with_ttl(&s);
        let mut world = World::default();
        queued_recorded(&mut job, &s);
        set_phase(&mut job, JobPhase::Running, 0);
        let pods = vec![pod("4817", 0, running(0))];
        drive(&s, &mut job, &pods, ts(1), &mut world);
        drive(&s, &mut job, &pods, ts(3600), &mut world);
        assert_eq!(world.commands, 1);
        let a = job.metadata.annotations.as_ref().unwrap();
        assert_eq!(a[&s.keys.termination_cause], "expired");
        assert_eq!(a[&s.keys.termination_at], format_millis(ts(3600)));
        // Volcano stops the pod 2 s later; looking in between asks for nothing more.
        drive(&s, &mut job, &pods, ts(3601), &mut world);
        assert_eq!(world.commands, 1, "the command is not sent again");
        assert_eq!(world.next_check, Some(ts(3660)), "the pods get the grace");
        let pods = vec![pod("4817", 0, exited(143, 0, 3602))];
        set_phase(&mut job, JobPhase::Terminated, 3603);
        drive(&s, &mut job, &pods, ts(3603), &mut world);
        let end = lifecycle(&world).pop().unwrap();
        assert_eq!(end.event_id, "4817/EXPIRED");
        assert_eq!(end.ended_at.unwrap().seconds, START + 3600);
        assert_eq!(world.commands, 1);
        assert!(
            !world.companions_deleted,
            "none to delete: its NetworkPolicy goes at the TTL"
        );
        assert_eq!(job.metadata.finalizers, Some(Vec::new()));
        assert_eq!(world.finish_writes, 0, "in the write of its end");
        assert!(job.metadata.deletion_timestamp.is_none());
    }

    /// A job with a TTL whose cancel (with `reason`) was asked at `at`, as the runner's cancel writes it.
    fn cancelled(s: &Settings, at: Timestamp, reason: Option<&str>) -> VolcanoJob {
        let mut job = job_with_ttl(s);
        let a = job.metadata.annotations.as_mut().unwrap();
        a.insert(s.keys.termination_cause.clone(), "cancelled".into());
        if let Some(reason) = reason {
            a.insert(s.keys.termination_reason.clone(), reason.into());
        }
        a.insert(s.keys.termination_at.clone(), format_millis(at));
        job
    }

    #[test]
    fn a_cancelled_job_ends_when_volcano_has_terminated_it_or_after_the_grace() {
        let s = settings(|_| {});
        // Cancelled while pending: the cause and its time written, the command taken by Volcano.
        let mut job = cancelled(&s, ts(30), Some("user asked"));
        let mut world = World::default();
        drive(&s, &mut job, &[], ts(31), &mut world);
        assert!(lifecycle(&world).is_empty(), "Volcano has not taken it yet");
        assert_eq!(world.next_check, Some(ts(90)));
        set_phase(&mut job, JobPhase::Terminated, 32);
        drive(&s, &mut job, &[], ts(32), &mut world);
        let end = lifecycle(&world).pop().unwrap();
        assert_eq!(end.event_id, "4817/CANCELLED");
        assert_eq!(end.status, "Job was cancelled: user asked");
        assert_eq!(end.ended_at.unwrap().seconds, START + 30);
        assert_eq!(world.commands, 0, "the cancel sent the command");
        assert_eq!(job.metadata.finalizers, Some(Vec::new()));

        // The canceller was killed before its command: after the grace the end is recorded and the
        // monitor sends the command itself, once.
        let mut job = cancelled(&s, ts(30), None);
        let mut world = World::default();
        drive(&s, &mut job, &[], ts(90), &mut world);
        assert_eq!(lifecycle(&world).pop().unwrap().event_id, "4817/CANCELLED");
        assert_eq!(world.commands, 1);
        assert_eq!(job.phase(), JobPhase::Terminating);
        // Volcano took it: the companions and the finalizer go.
        drive(&s, &mut job, &[], ts(91), &mut world);
        assert_eq!(world.commands, 1);
        assert!(world.companions_deleted);
        assert_eq!(job.metadata.finalizers, Some(Vec::new()));
        assert!(job.metadata.deletion_timestamp.is_none());
    }

    #[test]
    fn a_cancel_terminated_within_the_second_it_was_asked_is_told_as_cancelled() {
        // The API server keeps the Terminated transition to the second (30 s), the cancel was asked at
        // 30.5 s: the phase is the cancel's doing, not an end that came first.
        let s = settings(|_| {});
        let asked = ts(30)
            .checked_add(SignedDuration::from_millis(500))
            .unwrap();
        let mut job = cancelled(&s, asked, Some("user asked"));
        let mut world = World::default();
        set_phase(&mut job, JobPhase::Terminated, 30);
        drive(&s, &mut job, &[], ts(31), &mut world);
        let end = lifecycle(&world).pop().unwrap();
        assert_eq!(
            (end.event_id.as_str(), end.reason.as_str()),
            ("4817/CANCELLED", "cancelled")
        );
    }

    #[test]
    fn a_deleted_job_waits_for_its_pods_within_the_grace() {
        let s = settings(|_| {});
        let mut job = job(&s);
        let mut world = World::default();
        set_phase(&mut job, JobPhase::Running, 0);
        let pods = vec![pod("4817", 0, running(0))];
        drive(&s, &mut job, &pods, ts(1), &mut world);
        job.metadata.deletion_timestamp = Some(Time(ts(100)));
        drive(&s, &mut job, &pods, ts(101), &mut world);
        assert_eq!(world.next_check, Some(ts(160)));
        assert!(
            !lifecycle(&world)
                .iter()
                .any(|e| e.state == JobState::Failure as i32)
        );
        // The grace is over and the pod still runs: closed at the deletion, a FAILURE without a cause.
        drive(&s, &mut job, &pods, ts(160), &mut world);
        let end = lifecycle(&world).pop().unwrap();
        assert_eq!(
            (end.event_id.as_str(), end.reason.as_str()),
            ("4817/FAILURE", "deleted")
        );
        assert_eq!(end.ended_at.unwrap().seconds, START + 100);
    }

    /// A job an attempt to submit it created and rolled back (`volcano-runner/rolled-back`, written
    /// with its finalizer's removal just before the delete) never runs: its submission is created
    /// afresh. Nothing is told of it, neither an end for its deletion nor that it vanished, where the
    /// same job unmarked gets both.
    #[test]
    fn a_rolled_back_job_is_passed_by_deleted_or_vanished() {
        let s = settings(|_| {});
        let mut job = job(&s);
        set_phase(&mut job, JobPhase::Running, 0);
        let pods = vec![pod("4817", 0, running(0))];
        job.metadata.deletion_timestamp = Some(Time(ts(60)));
        assert!(
            decide_gone(&job, &pods, &s, ts(100), false)
                .unwrap()
                .is_some(),
            "unmarked, it is lost track of"
        );
        job.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(crate::cluster::labels::ROLLED_BACK.into(), "true".into());
        assert_eq!(decide_gone(&job, &pods, &s, ts(100), false).unwrap(), None);
        let mut world = World::default();
        drive(&s, &mut job, &pods, ts(100), &mut world);
        assert!(world.published.is_empty(), "{:?}", world.published);
        assert_eq!(world.next_check, None);
        assert_eq!(world.finish_writes, 0);
    }

    #[test]
    fn a_vanished_job_is_lost_track_once_and_a_finished_one_is_not() {
        let s = settings(|_| {});
        let mut job = job(&s);
        set_phase(&mut job, JobPhase::Running, 0);
        let pods = vec![pod("4817", 0, running(0))];
        let mut world = World::default();
        drive(&s, &mut job, &pods, ts(70), &mut world);
        let action = decide_gone(&job, &pods, &s, ts(100), false)
            .unwrap()
            .unwrap();
        let end = action
            .publish
            .iter()
            .rev()
            .find_map(|o| match o {
                Outbound::Lifecycle(e) => Some(e.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(
            (end.event_id.as_str(), end.reason.as_str()),
            ("4817/FAILURE", "lost_track")
        );
        assert!(
            action.set.is_empty(),
            "nothing to persist on a job that is gone"
        );
        job.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(s.keys.lifecycle_state.clone(), "SUCCESS".into());
        assert_eq!(decide_gone(&job, &pods, &s, ts(100), false).unwrap(), None);
    }

    #[test]
    fn the_pending_reason_is_published_once_per_change() {
        let s = settings(|_| {});
        let mut job = job(&s);
        let mut world = World::default();
        drive(&s, &mut job, &[], ts(10), &mut world);
        drive(&s, &mut job, &[], ts(11), &mut world);
        assert_eq!(
            lifecycle(&world).len(),
            2,
            "QUEUED once, and the same reason is not repeated"
        );
        assert_eq!(lifecycle(&world)[0].event_id, "4817/QUEUED");
        let first = lifecycle(&world)[1].event_id.clone();
        assert!(first.starts_with("4817/status/"), "{first}");
    }

    /// Told calmly: the jobs ahead and the scheduler's shortfall text change while the estimate stays:
    /// no event. A bound withdrawn (jobs of another queue arrived) is told, in an expectation's words;
    /// the bound that comes back at the same time is not told again (no flip-flopping).
    #[test]
    fn a_wiggling_reason_is_no_news_and_a_withdrawn_bound_reads_as_an_expectation() {
        use crate::volcano::{PodGroupCondition, PodGroupPhase, PodGroupStatus};
        let s = settings(|_| {});
        let mut job = job(&s);
        queued_recorded(&mut job, &s);
        let mut world = World::default();
        let group = |short: &str| {
            let mut pg = PodGroup::default();
            pg.spec.queue = Some("default".into());
            pg.status = Some(PodGroupStatus {
                phase: Some(PodGroupPhase::Pending),
                conditions: vec![PodGroupCondition {
                    type_: "Unschedulable".into(),
                    status: "True".into(),
                    message: Some(format!(
                        "1/1 tasks in gang unschedulable: pod group is not ready, 1 Pending, 1 \
                         minAvailable; Pending: 1 Unschedulable. Origin reason is j-job-0: 0/3 \
                         nodes are unavailable: {short}."
                    )),
                    last_transition_time: Some(Time(ts(1))),
                    ..PodGroupCondition::default()
                }],
                ..PodGroupStatus::default()
            });
            pg
        };
        let both = group("3 Insufficient cpu, 3 Insufficient memory");
        let memory = group("3 Insufficient memory");
        let bound = Estimate::At {
            start: ts(600),
            basis: format!(
                "by {} at the latest: 1 of 2 running jobs end by then at their time limits{}",
                ts(600),
                crate::forecast::answer::LATER_ONLY
            ),
            bound: true,
            record: None,
        };
        let seen = |pg, ahead| (&[][..], Some(pg), Some(ahead));
        drive_seen(
            &s,
            &mut job,
            seen(&both, 3),
            Some(&bound),
            ts(5),
            &mut world,
        );
        assert_eq!(lifecycle(&world).len(), 1, "the first status");
        // The shortfall's wording flips, the jobs ahead count down, the estimate stays.
        for (k, pg) in [&memory, &both, &memory, &both].into_iter().enumerate() {
            let ahead = 2 - u32::try_from(k).unwrap().min(2);
            drive_seen(
                &s,
                &mut job,
                seen(pg, ahead),
                Some(&bound),
                ts(6 + k as i64),
                &mut world,
            );
        }
        assert_eq!(
            lifecycle(&world).len(),
            1,
            "no news: {:?}",
            lifecycle(&world)
        );
        // Jobs of a second queue: the bound is withdrawn, told at once, and worded as what it is.
        let mut withdrawn = vec![bound.clone()];
        crate::forecast::across_queues(&mut withdrawn, 2);
        drive_seen(
            &s,
            &mut job,
            seen(&memory, 0),
            Some(&withdrawn[0]),
            ts(20),
            &mut world,
        );
        let told = lifecycle(&world);
        assert_eq!(told.len(), 2);
        let pending = told[1].pending.clone().unwrap();
        assert!(!pending.estimate_is_bound);
        assert!(
            pending.estimate_basis.starts_with("expected by ")
                && !pending.estimate_basis.contains("at the latest"),
            "{}",
            pending.estimate_basis
        );
        // The other queue's jobs are gone a moment later: the same bound again is not told.
        drive_seen(
            &s,
            &mut job,
            seen(&memory, 0),
            Some(&bound),
            ts(21),
            &mut world,
        );
        assert_eq!(lifecycle(&world).len(), 2, "no flip-flop");
    }

    /// A waiting job is told its estimated start with its status, again only when the estimate moves
    /// later or earlier by more than the tolerance (at least `estimate_tolerance`; or its reason
    /// changes), and a job that can never fit says so at once, without waiting `pending_status_after`.
    #[test]
    fn the_start_estimate_is_told_when_it_moves_by_more_than_the_tolerance() {
        let s = settings(|_| {});
        let mut job = job(&s);
        queued_recorded(&mut job, &s);
        let mut world = World::default();
        let at = |secs: i64| Estimate::At {
            start: ts(secs),
            basis: format!("by {} at the latest", ts(secs)),
            bound: true,
            record: None,
        };
        drive_with(&s, &mut job, &[], Some(&at(600)), ts(5), &mut world);
        let told = lifecycle(&world);
        assert_eq!(told.len(), 1, "the status: {told:?}");
        let pending = told[0].pending.clone().unwrap();
        assert_eq!(
            pending.estimated_start_at,
            Some(crate::pipeline::hooks::proto_timestamp(ts(600)))
        );
        assert!(pending.estimate_basis.starts_with("by "), "{pending:?}");
        assert!(!pending.never_fits);

        // 5 s later than told: noise of the replay, nothing to tell.
        drive_with(&s, &mut job, &[], Some(&at(605)), ts(6), &mut world);
        assert_eq!(lifecycle(&world).len(), 1);
        // 50 s earlier, ten minutes away: within the minute, nothing to tell.
        drive_with(&s, &mut job, &[], Some(&at(550)), ts(6), &mut world);
        assert_eq!(lifecycle(&world).len(), 1);
        // Not known for a moment (the nodes not yet listed): what was told stands.
        drive_with(&s, &mut job, &[], None, ts(7), &mut world);
        assert_eq!(lifecycle(&world).len(), 1);
        // 90 s earlier than told: a new status with the new estimate, under a new id.
        drive_with(&s, &mut job, &[], Some(&at(510)), ts(8), &mut world);
        let told = lifecycle(&world);
        assert_eq!(told.len(), 2);
        assert_eq!(
            told[1].pending.as_ref().unwrap().estimated_start_at,
            Some(crate::pipeline::hooks::proto_timestamp(ts(510)))
        );
        assert_ne!(told[1].event_id, told[0].event_id);
        // A change told after the first status carries the time it was seen, not the creation's.
        assert_eq!(told[1].timestamp.unwrap().seconds, START + 8);
        // No bound any more: told, without a time.
        let unbounded = Estimate::Unbounded {
            why: "1 running job(s) without a time limit hold the resources it needs".into(),
        };
        drive_with(&s, &mut job, &[], Some(&unbounded), ts(9), &mut world);
        let told = lifecycle(&world);
        assert_eq!(told.len(), 3);
        let pending = told[2].pending.clone().unwrap();
        assert_eq!(pending.estimated_start_at, None);
        assert!(pending.estimate_basis.contains("without a time limit"));

        let mut huge = self::job(&s);
        queued_recorded(&mut huge, &s);
        let mut world = World::default();
        let never = Estimate::Never {
            why: "no node has enough GPUs for one rank".into(),
        };
        drive_with(&s, &mut huge, &[], Some(&never), ts(1), &mut world);
        let told = lifecycle(&world);
        assert_eq!(
            told.len(),
            1,
            "told at once, before pending_status_after: {told:?}"
        );
        assert!(told[0].pending.as_ref().unwrap().never_fits);
        assert!(
            told[0]
                .status
                .contains("it can never start on this cluster: no node has enough GPUs"),
            "{}",
            told[0].status
        );
    }

    /// The watch's view is enough (no read) when it already holds the whole fact: RUNNING once every
    /// rank's program has started in it, the end once Volcano finished the job and every rank's program
    /// ended in it. A view that lags behind (the job's phase ahead of its pods) waits `VIEW_LAG_GRACE`
    /// after the phase began for the watch, and is read afresh after that.
    #[test]
    fn the_watch_view_decides_when_it_holds_the_whole_fact() {
        let s = settings(|_| {});
        let mut job = job(&s);
        queued_recorded(&mut job, &s);
        let decide_on = |job: &VolcanoJob, pods: &[Pod], now: i64| {
            decide(&observed(job, pods), &s, ts(now)).unwrap()
        };
        set_phase(&mut job, JobPhase::Running, 3);
        assert_eq!(
            decide_on(&job, &[], 4),
            Step::Wait {
                next_check: Some(ts(6))
            },
            "Running, but no rank seen started: the watch gets a moment"
        );
        let step = decide_on(&job, &[], 6);
        assert!(
            matches!(&step, Step::Act(a) if a.what == "start"),
            "{step:?}"
        );
        assert!(
            step.needs_fresh_view(),
            "Running, no rank seen started, the moment passed"
        );
        let step = decide_on(&job, &[pod("4817", 0, running(2))], 4);
        assert!(
            matches!(&step, Step::Act(a) if a.what == "start"),
            "{step:?}"
        );
        assert!(!step.needs_fresh_view(), "every rank seen started");

        mark_running(&mut job, &s, 2);
        set_phase(&mut job, JobPhase::Completed, 9);
        assert_eq!(
            decide_on(&job, &[pod("4817", 0, running(2))], 10),
            Step::Wait {
                next_check: Some(ts(12))
            },
            "Completed, the rank still runs in the view: the watch gets a moment"
        );
        let step = decide_on(&job, &[pod("4817", 0, running(2))], 12);
        assert!(matches!(step, Step::Record { .. }), "{step:?}");
        assert!(
            step.needs_fresh_view(),
            "Completed, but the rank still runs in the view"
        );
        let step = decide_on(&job, &[pod("4817", 0, exited(0, 2, 8))], 10);
        assert!(matches!(step, Step::Record { .. }), "{step:?}");
        assert!(!step.needs_fresh_view(), "Completed and every rank ended");

        // A phase time far ahead of the clock (skew) does not stretch the wait: read afresh at once.
        set_phase(&mut job, JobPhase::Completed, 100);
        let step = decide_on(&job, &[pod("4817", 0, running(2))], 10);
        assert!(step.needs_fresh_view(), "{step:?}");
    }

    /// A monitor behind its watches (busy, a burst, a slow machine) sees a phase later than Volcano
    /// entered it: the pods' events are then in its own buffer, and the watch gets its moment from when
    /// this monitor first saw the phase, not only from the transition. Without that, every start and end
    /// of a lagging monitor costs a read of the job and its pods.
    #[test]
    fn a_lagging_monitor_gives_the_watch_its_moment_from_its_own_first_sight() {
        let s = settings(|_| {});
        let mut job = job(&s);
        queued_recorded(&mut job, &s);
        let decide_on = |job: &VolcanoJob, pods: &[Pod], seen: Option<i64>, now: i64| {
            let obs = Observed {
                phase_seen: seen.map(ts),
                ..observed(job, pods)
            };
            decide(&obs, &s, ts(now)).unwrap()
        };
        let waits_until = |job: &VolcanoJob, pods: &[Pod], seen: i64, now: i64, until: i64, why| {
            assert_eq!(
                decide_on(job, pods, Some(seen), now),
                Step::Wait {
                    next_check: Some(ts(until))
                },
                "{why}"
            );
        };
        set_phase(&mut job, JobPhase::Running, 3);
        let not_started = [pod("4817", 0, ContainerState::default())];
        waits_until(
            &job,
            &not_started,
            20,
            21,
            23,
            "Running since 3, first seen at 20: the watch gets its moment from 20",
        );
        let step = decide_on(&job, &not_started, Some(20), 23);
        assert!(step.needs_fresh_view(), "the moment passed: {step:?}");
        let step = decide_on(&job, &not_started, None, 21);
        assert!(step.needs_fresh_view(), "first sight unknown: {step:?}");
        // A rank without a pod in the view: its pod may have come before the job was held, and never
        // come again. From the transition.
        let step = decide_on(&job, &[], Some(20), 21);
        assert!(step.needs_fresh_view(), "a rank without a pod: {step:?}");
        waits_until(
            &job,
            &not_started,
            1,
            4,
            6,
            "seen before the transition (a clock behind the cluster's): from the transition",
        );

        mark_running(&mut job, &s, 2);
        set_phase(&mut job, JobPhase::Completed, 9);
        let still_running = [pod("4817", 0, running(2))];
        waits_until(
            &job,
            &still_running,
            40,
            41,
            43,
            "Completed since 9, first seen at 40, the rank still runs in the view",
        );
        let step = decide_on(&job, &still_running, Some(40), 43);
        assert!(
            matches!(step, Step::Record { .. }) && step.needs_fresh_view(),
            "{step:?}"
        );
        waits_until(
            &job,
            &still_running,
            50,
            41,
            44,
            "a first sight ahead of the clock counts as now: at most the grace",
        );

        // The skew guard stands: a phase time far ahead of the clock is read afresh at once.
        set_phase(&mut job, JobPhase::Completed, 100);
        let step = decide_on(&job, &still_running, Some(10), 10);
        assert!(step.needs_fresh_view(), "{step:?}");
    }

    /// Log tails are read for every end but a success, and for a success too when asked to: each is a
    /// log read the API server proxies to a kubelet.
    #[test]
    fn a_success_reads_log_tails_only_when_asked_to() {
        let logs_of = |s: &Settings, code: i32| {
            let mut job = job(s);
            mark_running(&mut job, s, 2);
            let phase = if code == 0 {
                JobPhase::Completed
            } else {
                JobPhase::Failed
            };
            set_phase(&mut job, phase, 9);
            let pods = [pod("4817", 0, exited(code, 2, 8))];
            match decide(&observed(&job, &pods), s, ts(10)).unwrap() {
                Step::Record { logs, outcome, .. } => (outcome.state, logs.len()),
                other => panic!("{other:?}"),
            }
        };
        let default = settings(|_| {});
        assert_eq!(logs_of(&default, 0), (Terminal::Success, 0));
        assert_eq!(logs_of(&default, 3), (Terminal::Failure, 1));
        let asked = settings(|c| c.monitor.log_tails_on_success = true);
        assert_eq!(logs_of(&asked, 0), (Terminal::Success, 1));
    }

    /// A job that starts before `pending_status_after` has passed gets no status event (and no write for
    /// one): QUEUED and RUNNING only. Until then the decision waits for that instant.
    #[test]
    fn a_job_that_starts_at_once_gets_no_pending_status() {
        let s = settings(|_| {});
        let mut job = job(&s);
        queued_recorded(&mut job, &s);
        let obs = observed(&job, &[]);
        assert_eq!(
            decide(&obs, &s, ts(2)).unwrap(),
            Step::Wait {
                next_check: Some(ts(5))
            }
        );
        let mut world = World::default();
        drive(&s, &mut job, &[], ts(2), &mut world);
        set_phase(&mut job, JobPhase::Running, 3);
        let pods = vec![pod("4817", 0, running(3))];
        drive(&s, &mut job, &pods, ts(4), &mut world);
        let ids: Vec<_> = lifecycle(&world)
            .iter()
            .map(|e| e.event_id.clone())
            .collect();
        assert_eq!(
            ids,
            ["4817/RUNNING"],
            "QUEUED went out from the submit path"
        );
        assert!(
            !job.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(&s.keys.status_hash)),
            "no status recorded"
        );

        // With 0, the reason is told at once.
        let s = settings(|c| c.monitor.pending_status_after = std::time::Duration::ZERO);
        let mut job = self::job(&s);
        queued_recorded(&mut job, &s);
        let mut world = World::default();
        drive(&s, &mut job, &[], ts(0), &mut world);
        assert_eq!(lifecycle(&world).len(), 1);
    }

    #[test]
    fn an_estimate_tells_whether_it_is_a_bound_and_an_expectation_its_record() {
        let mut details = crate::messages::v1::PendingDetails::default();
        tell_estimate(
            &mut details,
            &Estimate::At {
                start: ts(600),
                basis: "expected".into(),
                bound: false,
                record: Some(crate::forecast::ExpectationRecord { held: 41, made: 43 }),
            },
        );
        assert!(!details.estimate_is_bound);
        assert_eq!(
            (details.expectations_held, details.expectations_made),
            (Some(41), Some(43))
        );
        let mut details = crate::messages::v1::PendingDetails::default();
        tell_estimate(
            &mut details,
            &Estimate::At {
                start: ts(600),
                basis: "by then at the latest".into(),
                bound: true,
                record: Some(crate::forecast::ExpectationRecord { held: 1, made: 2 }),
            },
        );
        assert!(details.estimate_is_bound);
        assert_eq!(details.expectations_made, None, "a bound carries no record");
    }

    /// A job created held by a window: told once, by the window's id, until when it waits (at once, not
    /// after `pending_status_after`); nothing let go while the windows are not known; its gate removed
    /// once no window is in the way, and the status told again as a change.
    #[test]
    fn a_held_job_is_told_once_and_let_go_when_no_window_is_in_the_way() {
        let s = settings(|_| {});
        let mut vc = job(&s);
        vc.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(s.keys.maintenance_held.clone(), "w".into());
        let job_id = JobFacts::read(&vc, &s.keys, &s.config.pipeline)
            .unwrap()
            .job_id;
        let gated = Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("p0".into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                scheduling_gates: Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate {
                    name: s.keys.maintenance_gate(),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pods = [gated];
        let windows = [Window {
            id: "w".into(),
            start: ts(1800),
            end: ts(5400),
            nodes: BTreeSet::new(),
            reason: None,
            created_at: Some(ts(0)),
            created_by: None,
        }];
        let observe = |vc: &VolcanoJob, maintenance: Option<&[Window]>, now: i64| {
            let obs = Observed {
                queued_confirmed: true,
                maintenance,
                ..observed(vc, &pods)
            };
            decide(&obs, &s, ts(now)).unwrap()
        };
        let Step::Act(told) = observe(&vc, Some(&windows), 1) else {
            panic!("a held job is told at once");
        };
        assert_eq!(told.what, "status");
        assert_eq!(told.next_check, Some(ts(5400)));
        let Some(Outbound::Lifecycle(event)) = told.publish.last() else {
            panic!("a status event");
        };
        assert_eq!(
            event.event_id,
            format!("{job_id}/maintenance/w/{}/held", ts(1800).as_millisecond())
        );
        assert_eq!(event.reason, "maintenance");
        let details = event.pending.as_ref().unwrap();
        assert_eq!(
            details.estimated_start_at.as_ref().unwrap().seconds,
            ts(5400).as_second()
        );
        vc.metadata.annotations.as_mut().unwrap().extend(told.set);
        assert_eq!(
            observe(&vc, Some(&windows), 600),
            Step::Wait {
                next_check: Some(ts(5400))
            },
            "told once"
        );
        assert!(
            matches!(observe(&vc, None, 6000), Step::Wait { .. }),
            "nothing let go before the windows are known"
        );
        let Step::Act(release) = observe(&vc, Some(&windows), 5400) else {
            panic!("let go at the window's end");
        };
        assert_eq!(
            release.ungate,
            Some((s.keys.maintenance_gate(), vec!["p0".to_owned()]))
        );
        // Cancelled: let go at once.
        let Step::Act(release) = observe(&vc, Some(&[]), 700) else {
            panic!("let go once the window is cancelled");
        };
        assert_eq!(release.what, "ungate");
        // Not in the way now, but at the start the estimate expects: still held.
        let later_windows = [Window {
            id: "later".into(),
            start: ts(7200),
            end: ts(9000),
            ..windows[0].clone()
        }];
        let later = Estimate::At {
            start: ts(4000),
            basis: String::new(),
            bound: false,
            record: None,
        };
        assert!(
            matches!(observe(&vc, Some(&later_windows), 600), Step::Act(a) if a.what == "ungate"),
            "an hour's job two hours before the window goes"
        );
        let obs = Observed {
            estimate: Some(&later),
            queued_confirmed: true,
            maintenance: Some(&later_windows),
            ..observed(&vc, &pods)
        };
        let Step::Act(told) = decide(&obs, &s, ts(600)).unwrap() else {
            panic!("expected to start into the window: held, and told");
        };
        assert_eq!(told.ungate, None);
        assert!(told.publish.iter().any(|o| matches!(o, Outbound::Lifecycle(e)
            if e.event_id.ends_with(&format!("/maintenance/later/{}/held", ts(7200).as_millisecond())))));
    }

    /// A job queued without the gate, with the windows' taints written: held by a window in its way
    /// once its taint is on the nodes (told so, not that it cannot be held), given the toleration of a
    /// window not in its way, and a gated job let go gets the tolerations in the same write.
    #[test]
    fn with_the_taints_a_queued_job_is_held_or_tolerates_the_window() {
        let s = settings(|_| {});
        let vc = job(&s);
        let job_id = JobFacts::read(&vc, &s.keys, &s.config.pipeline)
            .unwrap()
            .job_id;
        let pod = |gates: Vec<String>| Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("p0".into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                scheduling_gates: Some(
                    gates
                        .into_iter()
                        .map(|name| k8s_openapi::api::core::v1::PodSchedulingGate { name })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        let window = |id: &str, start: i64, end: i64| Window {
            id: id.into(),
            start: ts(start),
            end: ts(end),
            nodes: BTreeSet::new(),
            reason: None,
            created_at: Some(ts(0)),
            created_by: None,
        };
        let in_the_way = [window("w", 1800, 5400)];
        let later = [window("later", 7200, 9000)];
        let observe = |vc: &VolcanoJob,
                       pods: &[Pod],
                       windows: &[Window],
                       tainted: &BTreeSet<String>,
                       now: i64| {
            let obs = Observed {
                queued_confirmed: true,
                maintenance: Some(windows),
                maintenance_taints: true,
                maintenance_tainted: Some(tainted),
                ..observed(vc, pods)
            };
            decide(&obs, &s, ts(now)).unwrap()
        };
        let queued = [pod(Vec::new())];
        let none = BTreeSet::new();
        let w: BTreeSet<String> = ["w".to_owned()].into();
        // The taint not written yet: nothing told.
        assert!(matches!(
            observe(&vc, &queued, &in_the_way, &none, 1),
            Step::Wait { .. }
        ));
        let Step::Act(told) = observe(&vc, &queued, &in_the_way, &w, 1) else {
            panic!("held by the taint, and told");
        };
        assert_eq!((told.ungate.as_ref(), told.tolerate.as_ref()), (None, None));
        assert!(
            told.publish
                .iter()
                .any(|o| matches!(o, Outbound::Lifecycle(e)
            if e.event_id == format!("{job_id}/maintenance/w/{}/held", ts(1800).as_millisecond())))
        );
        // Not in its way, but its estimate still being made: not let go yet.
        let later_on_a_node: BTreeSet<String> = ["later".to_owned()].into();
        let pending_estimate = Observed {
            estimate_pending: true,
            queued_confirmed: true,
            maintenance: Some(&later),
            maintenance_taints: true,
            maintenance_tainted: Some(&later_on_a_node),
            ..observed(&vc, &queued)
        };
        assert!(!matches!(
            decide(&pending_estimate, &s, ts(1)).unwrap(),
            Step::Act(a) if a.tolerate.is_some() || a.ungate.is_some()
        ));
        // Not in its way: nothing to tolerate until its taint is on a node (whoever wrote it, this
        // runner's permission aside); then the toleration, and nothing told.
        assert!(!matches!(
            observe(&vc, &queued, &later, &none, 1),
            Step::Act(a) if a.tolerate.is_some()
        ));
        let later_tainted: BTreeSet<String> = ["later".to_owned()].into();
        let Step::Act(tolerate) = observe(&vc, &queued, &later, &later_tainted, 1) else {
            panic!("given the toleration");
        };
        assert_eq!(tolerate.what, "tolerate");
        assert!(tolerate.publish.is_empty());
        let toleration =
            crate::monitor::maintenance::toleration(&s.keys.maintenance_taint(), "later");
        assert_eq!(
            tolerate.tolerate,
            Some((vec![toleration.clone()], vec!["p0".to_owned()]))
        );
        // Once it tolerates it: nothing more to write.
        let mut tolerating = queued[0].clone();
        tolerating.spec.as_mut().unwrap().tolerations = Some(vec![toleration.clone()]);
        assert!(!matches!(
            observe(&vc, &[tolerating], &later, &later_tainted, 1),
            Step::Act(a) if a.tolerate.is_some()
        ));
        // A gated job let go: the gate goes and the toleration comes in one action.
        let gated = [pod(vec![s.keys.maintenance_gate()])];
        let Step::Act(release) = observe(&vc, &gated, &later, &later_tainted, 1) else {
            panic!("let go");
        };
        assert_eq!(release.what, "ungate");
        assert_eq!(
            release.ungate,
            Some((s.keys.maintenance_gate(), vec!["p0".to_owned()]))
        );
        assert_eq!(
            release.tolerate,
            Some((vec![toleration], vec!["p0".to_owned()]))
        );
    }

    /// A held job is told the window's end first (the same from every runner), then, as a change, a
    /// replayed start later than that, and not again while it stays within the telling rule.
    #[test]
    fn a_held_job_is_told_a_replayed_start_after_the_window_as_a_change() {
        let s = settings(|_| {});
        let mut vc = job(&s);
        vc.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(s.keys.maintenance_held.clone(), "w".into());
        let windows = [Window {
            id: "w".into(),
            start: ts(1800),
            end: ts(5400),
            nodes: BTreeSet::new(),
            reason: None,
            created_at: Some(ts(0)),
            created_by: None,
        }];
        let at = |secs: i64| Estimate::At {
            start: ts(secs),
            basis: format!("expected by {}", ts(secs)),
            bound: false,
            record: None,
        };
        let observe = |vc: &VolcanoJob, estimate: Option<&Estimate>, now: i64| {
            let obs = Observed {
                estimate,
                queued_confirmed: true,
                maintenance: Some(&windows),
                ..observed(vc, &[])
            };
            decide(&obs, &s, ts(now)).unwrap()
        };
        let told_start = |a: &Action| match a.publish.last() {
            Some(Outbound::Lifecycle(e)) => (
                e.event_id.clone(),
                e.pending
                    .as_ref()
                    .unwrap()
                    .estimated_start_at
                    .unwrap()
                    .seconds,
            ),
            other => panic!("a status event: {other:?}"),
        };
        // First the window's end, whatever the replay says.
        let Step::Act(first) = observe(&vc, Some(&at(9000)), 1) else {
            panic!("a held job is told at once");
        };
        let (id, start) = told_start(&first);
        assert!(id.ends_with("/held"), "{id}");
        assert_eq!(start, ts(5400).as_second());
        vc.metadata.annotations.as_mut().unwrap().extend(first.set);
        // The replay's start at the window's end is nothing new.
        assert!(matches!(
            observe(&vc, Some(&at(5400)), 2),
            Step::Wait { .. }
        ));
        // A later one is told, as a change.
        let Step::Act(change) = observe(&vc, Some(&at(9000)), 3) else {
            panic!("a later replayed start is told");
        };
        assert_eq!(change.ungate, None, "still held");
        let (id, start) = told_start(&change);
        assert!(!id.ends_with("/held"), "a change has its own id: {id}");
        assert_eq!(start, ts(9000).as_second());
        let Some(Outbound::Lifecycle(event)) = change.publish.last() else {
            unreachable!()
        };
        assert_eq!(event.reason, "maintenance");
        assert_eq!(
            event.pending.as_ref().unwrap().estimate_basis,
            format!("expected by {}", ts(9000))
        );
        vc.metadata.annotations.as_mut().unwrap().extend(change.set);
        // Within the rule: not told again.
        assert!(matches!(
            observe(&vc, Some(&at(9000)), 4),
            Step::Wait { .. }
        ));
        assert!(matches!(
            observe(&vc, Some(&at(9005)), 5),
            Step::Wait { .. }
        ));
        let Step::Act(later) = observe(&vc, Some(&at(20_000)), 6) else {
            panic!("a much later start is told");
        };
        assert_eq!(later.what, "status");
        vc.metadata.annotations.as_mut().unwrap().extend(later.set);
        // Back at the window's end: told that too (four hours earlier, more than half of the wait it
        // was told, is news).
        let Step::Act(back) = observe(&vc, Some(&at(5400)), 7) else {
            panic!("an earlier start is told");
        };
        assert_eq!(told_start(&back).1, ts(5400).as_second());
    }

    /// A job queued before a window in its way was scheduled (its pods not gated): told once, by the
    /// window's id, that the window can stop it; then its statuses go on as before.
    #[test]
    fn a_job_queued_before_a_window_is_told_once_and_its_statuses_go_on() {
        let s = settings(|_| {});
        let mut vc = job(&s);
        let windows = [Window {
            id: "w".into(),
            start: ts(1800),
            end: ts(5400),
            nodes: BTreeSet::new(),
            reason: None,
            created_at: Some(ts(100)),
            created_by: None,
        }];
        let mut published = Vec::new();
        for _ in 0..5 {
            let obs = Observed {
                queued_confirmed: true,
                maintenance: Some(&windows),
                ..observed(&vc, &[])
            };
            match decide(&obs, &s, ts(200)).unwrap() {
                Step::Act(action) => {
                    published.extend(action.publish.iter().filter_map(|o| match o {
                        Outbound::Lifecycle(e) => Some(e.clone()),
                        _ => None,
                    }));
                    vc.metadata.annotations.as_mut().unwrap().extend(action.set);
                }
                Step::Wait { .. } => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        let told: Vec<_> = published
            .iter()
            .filter(|e| e.reason == "maintenance")
            .collect();
        assert_eq!(told.len(), 1, "{published:#?}");
        assert!(told[0].event_id.ends_with(&format!(
            "/maintenance/w/{}/queued",
            ts(1800).as_millisecond()
        )));
        assert_eq!(
            told[0].timestamp.as_ref().unwrap().seconds,
            ts(100).as_second()
        );
        assert!(
            published.iter().any(|e| e.reason != "maintenance"),
            "the pending status is told as well: {published:#?}"
        );
    }
}
