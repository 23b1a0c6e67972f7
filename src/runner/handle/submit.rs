//! SubmitJob: validate → tombstone check → existing job? → render → whole-node limits → apply (with
//! rollback) → tombstone check again → publish QUEUED → ack.
//!
//! QUEUED is published here unless another runner holds the job's shard: the job is then created with
//! `<prefix>queuedBy: monitor` and that runner's monitor tells it (see [`crate::monitor::queued`]).
//!
//! Redelivery is the normal case, not an error: a job that exists with the same fingerprint is this
//! submission, applied by an earlier delivery (perhaps on another runner that died before its ack, or in
//! the middle of the apply): the apply adopts it, creates whatever it still lacks, and the same QUEUED
//! event is published again. The same job id with other content is `duplicate_job_id`. A job that has
//! ended is kept (terminated or finished, without pods) for `[cluster] ended_job_retention` as the record of its
//! submission: a redelivery finds it, by the lookup or by the create's AlreadyExists, creates nothing and
//! publishes the same QUEUED again. The job never runs twice.
//!
//! # Cancels that overtake their submission
//! A cancel records a tombstone first (see [`crate::cluster::tombstone`]). The submission checks for one
//! before creating the job (in the watch's view, no request: a lagging view only means the work is done
//! and undone) and again after, with a read, which decides. Who publishes CANCELLED is decided by who marks the job:
//! - no job exists: the runner publishes CANCELLED, built from the tombstone (the cancel did so too, with
//!   the same id and content);
//! - the job was created before the tombstone was seen: this handler claims it by writing
//!   `terminationCause=cancelled` *and* `lifecycleState=CANCELLED` (resourceVersion-guarded), publishes
//!   the tombstone's CANCELLED, and terminates the job; the monitor sees a terminal state and publishes no
//!   second terminal event;
//! - the job was already marked by the cancel handler (`terminationCause` without our terminal state):
//!   the monitor publishes CANCELLED when it cleans up; this handler only makes sure it is terminated.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tracing::info;

use crate::cluster::{ApplyError, ApplyOutcome, CapacityPermit, ClusterError, Role, Tombstone};
use crate::messages::v1::{JobState, SubmitJob};
use crate::pipeline;
use crate::validate;
use crate::volcano::VolcanoJob;

use super::super::events;
use super::super::plan::{self, Decorations};
use super::reject::{self, Subject};
use super::{Handler, Message, Settle};
use crate::cluster::jobs::{annotation, is_over};
use crate::cluster::whole_nodes::{self, Hold, Ledger, Owner};
use crate::durable::ids;

/// How often a resourceVersion-guarded write is tried again after a conflict before the message is
/// requeued.
const CONFLICT_ATTEMPTS: usize = 5;

/// Handles one submission.
pub async fn handle(h: &Handler, m: &Message<'_>, job: &SubmitJob) -> Settle {
    let fingerprint = pipeline::fingerprint(job);
    let fingerprint16 = ids::fingerprint16(&fingerprint);
    let subject = Subject {
        job_id: &job.job_id,
        is_submission: true,
        fingerprint16: &fingerprint16,
    };
    if let Err(e) = validate::submit(job, &h.config) {
        return reject::invalid_by(h, m, subject, &e).await;
    }
    let job_id = job.job_id.as_str();

    // From the watch: a cancel that came first spares the work. It may not be seen yet; the check
    // after the create (a read) is the one that decides.
    match h.tombstones.check_cached(job_id, h.now()).await {
        Err(e) => return Settle::cluster(&e),
        Ok(Some(tombstone)) => return cancelled_before_start(h, m, &tombstone).await,
        Ok(None) => {}
    }
    let exists = match existing(h, m, job_id, &fingerprint, &fingerprint16).await {
        Ok(exists) => exists,
        Err(settle) => return settle,
    };

    let (mut desired, booked) = match prepare(h, m, job, subject, exists).await {
        Ok(prepared) => prepared,
        Err(settle) => return settle,
    };
    // Another runner monitors the job: its monitor tells QUEUED (a booked job's `booked` answer, which
    // the submit path tells after QUEUED, keeps both here).
    if !exists
        && booked.is_none()
        && let Some(holders) = &h.shard_holders
    {
        holders.listed().await;
    }
    if !exists && booked.is_none() && another_monitors(h, job_id) {
        desired
            .vcjob
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(
                h.runner_keys.queued.by.clone(),
                crate::monitor::queued::BY_MONITOR.to_owned(),
            );
    }
    let decorations = Decorations {
        runner_id: &h.runner_id,
        traceparent: m.traceparent.as_ref(),
        finalizer: h.config.runner.cleanup_finalizer,
        retention: Some(h.config.cluster.ended_job_retention),
    };
    let plan = match plan::build(desired, &h.keys, &h.runner_keys, decorations) {
        Ok(plan) => plan,
        Err(e) => {
            let what = format!("volcano-runner cannot build the job's objects: {e}");
            return reject::invalid(h, m, subject, "jobId", &what, "invalid_plan").await;
        }
    };

    let (whole_nodes, permit) = match hold_capacity(h, m, job, &fingerprint16, exists).await {
        Ok(held) => held,
        Err(settle) => return settle,
    };
    let (outcome, tombstone) = match apply(h, m, subject, &plan, booked.is_some()).await {
        Ok(applied) => applied,
        Err(settle) => return settle,
    };
    commit(permit, &outcome);
    if let Some(mut ledger) = whole_nodes
        && !outcome.primary_existed
        && let Some(hold) = Hold::of(&outcome.primary, &h.keys)
    {
        let key = (
            outcome.primary.name.clone().unwrap_or_default(),
            outcome.primary.namespace.clone().unwrap_or_default(),
        );
        ledger.record(key, hold, tokio::time::Instant::now());
    }
    if outcome.primary_ended {
        // Ended between the lookup and the create: as above.
        if left_to_monitor(h, &outcome.primary) {
            return Settle::Ack;
        }
        return queued(h, m, job_id, &outcome.primary, Ended::Yes).await;
    }

    accepted(h, m, job_id, &outcome, booked.as_ref(), tombstone).await
}

/// The read of a cancel's tombstone, made once the job existed (see [`accepted`]).
type TombstoneRead = Option<Result<Option<Tombstone>, ClusterError>>;

/// Creates the job's objects. The read that decides whether a cancel came in while the job was created
/// goes the moment the job exists, alongside its companions' creates: a round trip fewer than after
/// them. `Err` settles the delivery: the apply failed (a booked job's booking is let go unless the
/// failure is retried).
async fn apply(
    h: &Handler,
    m: &Message<'_>,
    subject: Subject<'_>,
    plan: &[crate::cluster::Step],
    booked: bool,
) -> Result<(ApplyOutcome, TombstoneRead), Settle> {
    let job_id = subject.job_id;
    let (primary_in, created) = tokio::sync::oneshot::channel();
    let read_tombstone = async {
        created.await.ok()?;
        Some(h.tombstones.check(job_id, h.now()).await)
    };
    let (applied, tombstone) = tokio::join!(
        h.applier.apply_telling(plan, Some(primary_in)),
        read_tombstone
    );
    match applied {
        Ok(outcome) => Ok((outcome, tombstone)),
        Err(e) => {
            let retried = matches!(&e, ApplyError::Cluster { source, .. } if source.is_retryable());
            if booked && !retried {
                // Never created: what was set aside for it is free again. At worst (this fails too)
                // it stays set aside until the booking's end.
                let _ = h.bookings.cancel(job_id, h.now()).await;
            }
            Err(apply_failed(h, m, subject, &e).await)
        }
    }
}

/// A job of this id may exist: an earlier delivery of this submission (perhaps on a runner that died
/// half-way: the apply adopts it and creates what is missing), or another submission's. Read only when
/// the jobs' watch knows one (or has not listed yet); one it has not seen yet answers the create with
/// 409, and the applier compares it. `Err` settles the delivery: another submission's job, or this
/// one's that has ended.
async fn existing(
    h: &Handler,
    m: &Message<'_>,
    job_id: &str,
    fingerprint: &str,
    fingerprint16: &str,
) -> Result<bool, Settle> {
    match h.jobs.find_if_known(job_id).await {
        Err(e) => Err(Settle::cluster(&e)),
        // An earlier attempt's job, rolled back: not this submission's record. The create finds it
        // if it is still there, removes it, and the submission is tried again.
        Ok(Some(existing)) if crate::cluster::labels::is_rolled_back(&existing.metadata) => {
            Ok(false)
        }
        Ok(Some(existing)) => {
            if annotation(&existing, &h.keys.submission_hash) != Some(fingerprint) {
                return Err(duplicate(h, m, job_id, fingerprint16, &existing).await);
            }
            if is_over(&existing, &h.keys) {
                // This submission's job has ended (it is kept as the record of the submission for
                // `ended_job_retention`): never again. Its QUEUED is published again, the same message:
                // the monitor published it before any other event of the job, so it comes first. Not
                // when its monitor told it: it did so before the end.
                if left_to_monitor(h, &existing.metadata) {
                    return Err(Settle::Ack);
                }
                return Err(queued(h, m, job_id, &existing.metadata, Ended::Yes).await);
            }
            Ok(true)
        }
        Ok(None) => Ok(false),
    }
}

/// The job's objects as they are to be created (its peers checked first): rendered, held back for a
/// maintenance window in its way, and booked (or its booking found again) when it has a start window. `Err` settles the
/// delivery: a refusal (told), or a wait for the windows' list or the cluster.
async fn prepare(
    h: &Handler,
    m: &Message<'_>,
    job: &SubmitJob,
    subject: Subject<'_>,
    exists: bool,
) -> Result<
    (
        pipeline::DesiredJob,
        Option<crate::cluster::bookings::Booking>,
    ),
    Settle,
> {
    // A peer must be the same owner's job: its pods are let into this job's network and this job's into
    // its (see the ConnectToJob plugin). And it must not have ended: peers run together.
    if !exists {
        match foreign_peer(h, job).await {
            Err(e) => return Err(Settle::cluster(&e)),
            Ok(Some((field, what, code))) => {
                return Err(reject::invalid(h, m, subject, &field, &what, code).await);
            }
            Ok(None) => {}
        }
    }
    let mut desired = match pipeline::render(job, &*h.config, h.now()) {
        Ok(desired) => desired,
        Err(e) => {
            return Err(reject::invalid(h, m, subject, &e.field(), e.message(), e.code()).await);
        }
    };
    // A maintenance window in the way of the job's time allocation: the job is created with its pods
    // held back, accepted all the same (nothing waits in the queue for a window).
    if !exists {
        let Some(windows) = windows(h).await else {
            return Err(Settle::Requeue {
                why: "the maintenance windows have not been listed yet".into(),
            });
        };
        let max_time = pipeline::hooks::JobFacts::read(&desired.vcjob, &h.keys, &h.config.pipeline)
            .ok()
            .and_then(|f| f.max_time);
        let now = h.windows_clock.now();
        if let Some(window) = crate::cluster::maintenance::holding(&windows, now, max_time) {
            hold_back(&mut desired.vcjob, &h.keys, window);
        }
        // No window's toleration is rendered into the pods' template: whether a window can be in the
        // job's way depends on when it starts (an extension, a monitoring gap), and a template's
        // toleration is on every pod ever made from it. The monitor adds them just in time.
    }
    // A start window: booked before the job exists (refused: never created), or found again.
    let booked = booking(h, m, job, subject.fingerprint16, &mut desired.vcjob, exists).await?;
    Ok((desired, booked))
}

/// Whole nodes within the operator's limits, counted from the cluster, and a permit of this runner's
/// capacity for active jobs. A job that exists already holds both. The ledger stays locked until the
/// job exists, so this runner's whole-node submissions are counted one at a time. `Err` settles the
/// delivery: refused, or no capacity in time.
async fn hold_capacity(
    h: &Handler,
    m: &Message<'_>,
    job: &SubmitJob,
    fingerprint16: &str,
    exists: bool,
) -> Result<
    (
        Option<tokio::sync::OwnedMutexGuard<Ledger>>,
        Option<CapacityPermit>,
    ),
    Settle,
> {
    let mut whole_nodes = None;
    if job.exclusive_nodes && !exists {
        let mut ledger = h.jobs.lock_whole_nodes().await;
        match whole_node_limit(h, job, &mut ledger).await {
            Err(e) => return Err(Settle::cluster(&e)),
            Ok(Some(why)) => {
                return Err(whole_node_refusal(h, m, &job.job_id, fingerprint16, why).await);
            }
            Ok(None) => whole_nodes = Some(ledger),
        }
    }
    if exists {
        return Ok((whole_nodes, None));
    }
    match reserve(h).await {
        Some(permit) => Ok((whole_nodes, Some(permit))),
        None => Err(Settle::Requeue {
            why: "no capacity for another active job within runner.capacity_wait".into(),
        }),
    }
}

/// After the create: a cancel that came in meanwhile wins; otherwise QUEUED, and for a booked job its
/// `booked` answer after it. `tombstone`: the read of the tombstone made once the job existed (`None`:
/// not made, read now).
async fn accepted(
    h: &Handler,
    m: &Message<'_>,
    job_id: &str,
    outcome: &ApplyOutcome,
    booked: Option<&crate::cluster::bookings::Booking>,
    tombstone: TombstoneRead,
) -> Settle {
    // A cancel may have come in while we created the job.
    let tombstone = match tombstone {
        Some(read) => read,
        None => h.tombstones.check(job_id, h.now()).await,
    };
    match tombstone {
        Err(e) => return Settle::cluster(&e),
        Ok(Some(tombstone)) => {
            return match h.jobs.find(job_id).await {
                Err(e) => Settle::cluster(&e),
                Ok(None) => publish_tombstone(h, m, &tombstone).await,
                Ok(Some(job)) => cancel_after_create(h, m, job, &tombstone).await,
            };
        }
        Ok(None) => {}
    }
    // Created (by this delivery or an earlier one) for its monitor to tell QUEUED, and a monitor is
    // there to tell it: nothing to publish. When its shard's holder has gone meanwhile, QUEUED is told
    // here after all, with the record, so that the job does not wait for a monitor to come.
    if left_to_monitor(h, &outcome.primary)
        && (h.confirmed_queued.holds(job_id) || another_monitors(h, job_id))
    {
        info!(
            job_id,
            created = outcome.created.len(),
            reused = outcome.reused.len(),
            "Accepted a job; its monitor tells its QUEUED."
        );
        return Settle::Ack;
    }
    info!(
        job_id,
        created = outcome.created.len(),
        reused = outcome.reused.len(),
        "Accepted a job."
    );
    let settle = queued(h, m, job_id, &outcome.primary, Ended::No).await;
    match (&settle, booked) {
        (Settle::Ack, Some(b)) => super::booking::tell_booked(h, m, b).await,
        _ => settle,
    }
}

/// Whether the job of a QUEUED has ended: the monitor writes an ended job no more, so the record of
/// its confirmed QUEUED cannot ride on a write of the monitor's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Yes,
    No,
}

/// The booking of a submission with a start window: made now for a job that does not exist yet (its
/// pods then wait for the booked start), found again for one that does (a redelivery). `Err` settles
/// the delivery: a refusal (told), or a cluster problem.
async fn booking(
    h: &Handler,
    m: &Message<'_>,
    job: &SubmitJob,
    fingerprint16: &str,
    vcjob: &mut VolcanoJob,
    exists: bool,
) -> Result<Option<crate::cluster::bookings::Booking>, Settle> {
    use crate::cluster::bookings::Answer;
    let Some(request) = super::booking::request(job, vcjob, fingerprint16) else {
        return Ok(None);
    };
    if exists {
        let all = h.bookings.list().await.map_err(|e| Settle::cluster(&e))?;
        return Ok(all.into_iter().find(|b| b.job_id == job.job_id));
    }
    match super::booking::book(h, &request).await {
        Err(e) => Err(Settle::cluster(&e)),
        // A message that reaches here is valid: acknowledged once the refusal is told.
        Ok(Answer::Refused { why, earliest }) => {
            Err(super::booking::refuse(h, m, &job.job_id, fingerprint16, &why, earliest).await)
        }
        Ok(Answer::Booked(b)) => {
            super::booking::hold_until_start(vcjob, &h.keys, &b, h.now());
            Ok(Some(b))
        }
    }
}

/// How long a submission waits for the runner's first list of the maintenance windows before it goes
/// back to the queue.
const WINDOWS_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The maintenance windows as the runner's watch has them, once listed.
async fn windows(h: &Handler) -> Option<crate::cluster::Windows> {
    let mut rx = h.maintenance.clone();
    let listed = tokio::time::timeout(WINDOWS_WAIT, rx.wait_for(Option::is_some)).await;
    listed.ok()?.ok()?.clone()
}

/// Holds the job's pods back for `window`: the scheduling gate `<prefix>maintenance` on every task's
/// pods (Kubernetes lets a gate be removed later, never added), and `<prefix>maintenanceHeld` naming
/// the window, for the monitor, whose view of the job has no pod templates.
fn hold_back(
    vcjob: &mut VolcanoJob,
    keys: &crate::durable::AnnotationKeys,
    window: &crate::cluster::Window,
) {
    let gate = keys.maintenance_gate();
    for task in &mut vcjob.spec.tasks {
        let gates = task
            .template
            .spec
            .get_or_insert_default()
            .scheduling_gates
            .get_or_insert_default();
        if !gates.iter().any(|g| g.name == gate) {
            gates.push(k8s_openapi::api::core::v1::PodSchedulingGate { name: gate.clone() });
        }
    }
    vcjob
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(keys.maintenance_held.clone(), window.id.clone());
}

/// Publishes the job's QUEUED and settles. Built from the job as it exists (created now or by an
/// earlier delivery), so every delivery, and the monitor, publish the same message.
async fn queued(
    h: &Handler,
    m: &Message<'_>,
    job_id: &str,
    meta: &ObjectMeta,
    ended: Ended,
) -> Settle {
    let created_at = meta
        .creation_timestamp
        .as_ref()
        .map_or(jiff::Timestamp::UNIX_EPOCH, |t| t.0);
    let accepted_by = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(&h.runner_keys.accepted_by))
        .map_or(h.runner_id.as_str(), String::as_str);
    let mut event = events::queued(job_id, created_at, accepted_by);
    crate::pipeline::sealed::tell_queued(
        &mut event.status,
        meta.annotations.as_ref(),
        &h.runner_keys.sealed,
    );
    match h.publish(&event, m.traceparent.as_ref()).await {
        Ok(()) => {
            // Confirmed: in the events queues ahead of anything the monitor publishes from now on.
            h.confirmed_queued.record(job_id);
            record_queued_confirmed(h, job_id, meta, ended).await;
            Settle::Ack
        }
        Err(e) => Settle::publish(&e),
    }
}

/// Whether another runner holds the shard of `job_id`, by its current lease as this runner's watch
/// has it (and this runner does not hold it itself), and says on that lease that it tells the QUEUED of
/// the jobs left to it: that runner's monitor is to tell the job's QUEUED. `false` when the view cannot
/// tell, or the holder is an older runner that would not tell it (a rolling upgrade): the submit path
/// then tells it, which is always safe.
fn another_monitors(h: &Handler, job_id: &str) -> bool {
    !h.confirmed_queued.holds(job_id)
        && h.shard_holders
            .as_ref()
            .is_some_and(|v| matches!(v.holding(job_id), crate::cluster::Holding::Other(_)))
}

/// Whether no runner monitors `job_id` now, by this runner's view of the leases.
fn nobody_monitors(h: &Handler, job_id: &str) -> bool {
    !h.confirmed_queued.holds(job_id)
        && h.shard_holders
            .as_ref()
            .is_some_and(|v| v.holding(job_id) == crate::cluster::Holding::Nobody)
}

/// Whether the job was created with `<prefix>queuedBy: monitor`: its monitor tells its QUEUED.
fn left_to_monitor(h: &Handler, meta: &ObjectMeta) -> bool {
    h.runner_keys
        .queued
        .left_to_monitor(meta.annotations.as_ref())
}

/// The reason of a submission refused because a peer of it has ended.
pub const PEER_ENDED: &str = "peer_ended";

/// Writes `<prefix>queuedConfirmed` on the job (once: not when it is there already), so that whichever
/// runner monitors it knows that its QUEUED is in the queues and sends no copy (see
/// [`crate::monitor::queued`]). One attempt: without it the monitor sends a copy, which is always safe.
/// When this runner monitors the job, the record rides on its monitor's first write of the job
/// instead: no request here; when no runner monitors it, nothing is written either.
async fn record_queued_confirmed(h: &Handler, job_id: &str, meta: &ObjectMeta, ended: Ended) {
    let key = &h.runner_keys.queued.confirmed;
    if meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(key))
    {
        return;
    }
    let (namespace, name) = (
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    );
    if ended == Ended::No
        && h.confirmed_queued
            .carry(job_id, meta.uid.as_deref(), namespace, name)
    {
        return;
    }
    // No runner monitors the job: no monitor to spare a copy of QUEUED. One that takes the job over
    // later sends its copy, a duplicate that only a missing monitor causes (docs/monitor.md). A job left
    // to a monitor that has gone needs the record: its next monitor would tell QUEUED again at once.
    if !left_to_monitor(h, meta) && nobody_monitors(h, job_id) {
        return;
    }
    if let Err(e) = h.jobs.annotate_once(meta, key, "true").await {
        tracing::warn!(job_id, error = %e, "Could not record on the job that its QUEUED was confirmed; its monitor will send a copy of QUEUED.");
    }
}

/// The first peer that is not this owner's job, is sealed, or has ended: `(field, what is wrong, reason)`. A peer
/// belongs to the same owner when it has the same project (a project's job) or, for a personal job, the
/// same user and no project; names are compared exactly (`Alice` is not `alice`).
async fn foreign_peer(
    h: &Handler,
    job: &SubmitJob,
) -> Result<Option<(String, String, &'static str)>, crate::cluster::ClusterError> {
    use crate::messages::v1::{parameter_value, resource_value};
    let mut peers: Vec<(String, &str)> = Vec::new();
    for (i, r) in job.resources.iter().enumerate() {
        if let Some(resource_value::Value::Peer(p)) = &r.value {
            peers.push((format!("resources[{i}].peer.jobId"), p.job_id.as_str()));
        }
    }
    for (name, v) in &job.parameters {
        if let Some(parameter_value::Value::Peer(p)) = &v.value {
            peers.push((format!("parameters.{name}.peer.jobId"), p.job_id.as_str()));
        }
    }
    let owner = job.owner.clone().unwrap_or_default();
    let project = owner.project.as_deref().filter(|p| !p.is_empty());
    // Per owner, every job of a namespace is the owner's, and the policies admit only their namespace:
    // a peer that does not exist yet cannot be another owner's. In one shared namespace it could be
    // created later by anyone, so it must exist now.
    let pipeline = &h.config.pipeline;
    let per_owner = pipeline.plugins.fair_share
        && pipeline.namespace.mode == crate::pipeline::NamespaceMode::PerOwner;
    for (field, peer_id) in peers {
        let Some(peer) = h.jobs.find(peer_id).await? else {
            if per_owner {
                continue;
            }
            return Ok(Some((
                field,
                format!("job {peer_id} does not exist (a peer must be running)"),
                "invalid_field",
            )));
        };
        let theirs_user = annotation(&peer, &h.keys.owner_user);
        let theirs_project = annotation(&peer, &h.keys.owner_project);
        let same = match project {
            Some(p) => theirs_project == Some(p),
            None => theirs_project.is_none() && theirs_user == Some(owner.user.as_str()),
        };
        if !same {
            return Ok(Some((
                field,
                format!(
                    "job {peer_id} belongs to another owner; a peer must be a job of the same user or project"
                ),
                "invalid_field",
            )));
        }
        // A sealed job admits nothing from outside it: a job that names it could never reach it.
        if annotation(&peer, &h.keys.sealed).is_some() {
            return Ok(Some((
                field,
                format!(
                    "job {peer_id} is sealed: nothing outside it may reach it, so it cannot be a peer"
                ),
                "invalid_field",
            )));
        }
        // Peers run together: a job whose peer has ended would start without it.
        if is_over(&peer, &h.keys) {
            return Ok(Some((
                field,
                format!(
                    "job {peer_id} has ended; a job runs only while its peer runs: submit it again with \
                     a peer that is waiting or running"
                ),
                PEER_ENDED,
            )));
        }
        if let Some(ring) = names_back(h, peer_id, &peer, &job.job_id).await? {
            return Ok(Some((
                field,
                format!(
                    "job {peer_id} waits for this job in turn ({ring}): peers wait for each other to \
                     run, so neither would start; submit this job without it as peer"
                ),
                crate::monitor::peers::CYCLE_REASON,
            )));
        }
    }
    Ok(None)
}

/// How deep [`names_back`] follows peers of peers: rings longer than this are ended by the monitor's
/// `peer_missing_after` or `queue_timeout` instead.
const RING_DEPTH: usize = 8;

/// The ring `peer -> ... -> job_id` when `peer`, or a peer of its peers (existing jobs, their `peers`
/// annotations), names the job being submitted: `job a -> job b -> this job`.
async fn names_back(
    h: &Handler,
    peer_id: &str,
    peer: &VolcanoJob,
    job_id: &str,
) -> Result<Option<String>, crate::cluster::ClusterError> {
    use crate::monitor::peers::named_by;
    let mut frontier: Vec<(Vec<String>, Vec<String>)> =
        vec![(vec![peer_id.to_owned()], named_by(peer, &h.keys))];
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..RING_DEPTH {
        let mut next = Vec::new();
        for (path, named) in frontier {
            for id in named {
                if id == job_id {
                    let ring: Vec<String> = path.iter().map(|p| format!("job {p}")).collect();
                    return Ok(Some(format!("{} -> this job", ring.join(" -> "))));
                }
                if !seen.insert(id.clone()) {
                    continue;
                }
                if let Some(found) = h.jobs.find(&id).await?
                    && !is_over(&found, &h.keys)
                {
                    let mut path = path.clone();
                    path.push(id);
                    next.push((path, named_by(&found, &h.keys)));
                }
            }
        }
        if next.is_empty() {
            break;
        }
        frontier = next;
    }
    Ok(None)
}

/// Why one more whole-node job of this owner would pass `[pipeline.whole_nodes]` limits; `None` when it
/// fits (or no limit applies).
async fn whole_node_limit(
    h: &Handler,
    job: &SubmitJob,
    ledger: &mut Ledger,
) -> Result<Option<String>, crate::cluster::ClusterError> {
    let config = &h.config.pipeline.whole_nodes;
    let product = job.product.clone().unwrap_or_default();
    // Rendering refused a product without an entry already.
    let Some(entry) = config.entry(&product.id, &product.category) else {
        return Ok(None);
    };
    if config.max_per_owner.is_none() && entry.max_per_owner.is_none() {
        return Ok(None);
    }
    let holds = h.jobs.whole_node_holds(ledger).await?;
    let owner = job.owner.clone().unwrap_or_default();
    let owner = Owner::of(&owner.user, owner.project.as_deref());
    Ok(whole_nodes::check(config, entry, &owner, job.replicas.max(1), &holds).err())
}

/// FAILURE `whole_node_limit`: the owner holds as many whole nodes as the operator allows. The message is
/// valid, so it is acknowledged, not dead-lettered; the orchestrator may submit again later.
async fn whole_node_refusal(
    h: &Handler,
    m: &Message<'_>,
    job_id: &str,
    fingerprint16: &str,
    why: String,
) -> Settle {
    info!(
        job_id,
        why, "Refused a whole-node job: its owner is at the limit."
    );
    let at = m.sent_at.unwrap_or_else(|| h.now());
    let event = events::submission_rejected(
        job_id,
        fingerprint16,
        events::reasons::WHOLE_NODE_LIMIT,
        format!("exclusiveNodes: {why}"),
        at,
        &h.runner_id,
    );
    match h.publish(&event, m.traceparent.as_ref()).await {
        Ok(()) => Settle::Ack,
        Err(e) => Settle::publish(&e),
    }
}

/// A capacity slot, waiting up to `runner.capacity_wait` for one. Without `max_active_jobs` this never
/// waits.
async fn reserve(h: &Handler) -> Option<CapacityPermit> {
    let mut rx = h.gate.subscribe();
    let wait = async {
        loop {
            if let Some(permit) = h.gate.try_reserve() {
                return Some(permit);
            }
            if rx.changed().await.is_err() {
                return None;
            }
        }
    };
    tokio::time::timeout(h.config.runner.capacity_wait, wait)
        .await
        .ok()
        .flatten()
}

/// Counts the job as active once this attempt created it (a job found existing is counted by the watch).
fn commit(permit: Option<CapacityPermit>, outcome: &ApplyOutcome) {
    let Some(permit) = permit else { return };
    if outcome.primary_existed {
        return;
    }
    let meta = &outcome.primary;
    permit.commit(
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    );
}

/// The job id is taken by a job of another submission.
async fn duplicate(
    h: &Handler,
    m: &Message<'_>,
    job_id: &str,
    fingerprint16: &str,
    existing: &VolcanoJob,
) -> Settle {
    let status = format!(
        "Job id {job_id} is taken by another submission (VolcanoJob {}/{}); resubmit under a new id",
        existing.metadata.namespace.as_deref().unwrap_or_default(),
        existing.metadata.name.as_deref().unwrap_or_default(),
    );
    info!(
        job_id,
        "Refused a submission: its job id is taken by another submission."
    );
    let at = m.sent_at.unwrap_or_else(|| h.now());
    let event = events::submission_rejected(
        job_id,
        fingerprint16,
        events::reasons::DUPLICATE_JOB_ID,
        status,
        at,
        &h.runner_id,
    );
    match h.publish(&event, m.traceparent.as_ref()).await {
        Ok(()) => Settle::Ack,
        Err(e) => Settle::publish(&e),
    }
}

/// Maps a failed apply (already rolled back) to its outcome.
async fn apply_failed(
    h: &Handler,
    m: &Message<'_>,
    subject: Subject<'_>,
    error: &ApplyError,
) -> Settle {
    let job_id = subject.job_id;
    let at = m.sent_at.unwrap_or_else(|| h.now());
    let (reason, status) = match error {
        ApplyError::Conflict {
            role: Role::Primary,
            ..
        } => (
            events::reasons::DUPLICATE_JOB_ID,
            format!("Job id {job_id} is taken by another submission: {error}"),
        ),
        ApplyError::Conflict { .. } => (
            events::reasons::NAME_CONFLICT,
            format!("The job's objects cannot be created: {error}"),
        ),
        ApplyError::Cluster { source, .. } if source.is_retryable() => {
            return Settle::Requeue {
                why: error.to_string(),
            };
        }
        ApplyError::Cluster {
            source: source @ crate::cluster::ClusterError::Rejected { .. },
            ..
        } => (
            events::reasons::CLUSTER_REJECTED,
            format!("The cluster refused the job: {}", source.cluster_message()),
        ),
        // Not a rejection of the job (a missing resource type, a response we do not understand): a
        // problem of the installation. Requeue; the delivery limit parks the message if it persists.
        ApplyError::Cluster { .. } => {
            return Settle::Requeue {
                why: error.to_string(),
            };
        }
        ApplyError::InvalidPlan(e) => {
            let what = format!("volcano-runner cannot build the job's objects: {e}");
            return reject::invalid(h, m, subject, "jobId", &what, "invalid_plan").await;
        }
    };
    info!(job_id, reason, error = %error, "The cluster did not take a job.");
    let event = events::submission_rejected(
        job_id,
        subject.fingerprint16,
        reason,
        status,
        at,
        &h.runner_id,
    );
    match h.publish(&event, m.traceparent.as_ref()).await {
        Ok(()) => Settle::Ack,
        Err(e) => Settle::publish(&e),
    }
}

/// A tombstone was there before we created anything.
async fn cancelled_before_start(h: &Handler, m: &Message<'_>, tombstone: &Tombstone) -> Settle {
    match h.jobs.find(&tombstone.job_id).await {
        Err(e) => Settle::cluster(&e),
        Ok(None) => publish_tombstone(h, m, tombstone).await,
        Ok(Some(job)) => cancel_after_create(h, m, job, tombstone).await,
    }
}

/// CANCELLED from the tombstone, for a job that never got (or no longer has) a VolcanoJob.
async fn publish_tombstone(h: &Handler, m: &Message<'_>, tombstone: &Tombstone) -> Settle {
    info!(job_id = %tombstone.job_id, "A submission arrived after its cancel; it will not run.");
    let event = events::cancelled_without_job(tombstone, &h.runner_id);
    match h.publish(&event, m.traceparent.as_ref()).await {
        Ok(()) => Settle::Ack,
        Err(e) => Settle::publish(&e),
    }
}

/// The job exists and a tombstone says it is cancelled. See the module documentation.
async fn cancel_after_create(
    h: &Handler,
    m: &Message<'_>,
    mut job: VolcanoJob,
    tombstone: &Tombstone,
) -> Settle {
    let keys = &h.keys;
    let cancelled = ids::state_name(JobState::Cancelled);
    for _ in 0..CONFLICT_ATTEMPTS {
        let ours = match annotation(&job, &keys.termination_cause) {
            None => {
                let patch = serde_json::json!({
                    "metadata": {
                        "resourceVersion": job.metadata.resource_version,
                        "annotations": {
                            keys.termination_cause.as_str(): "cancelled",
                            keys.termination_reason.as_str(): tombstone.reason,
                            keys.lifecycle_state.as_str(): cancelled,
                            keys.termination_at.as_str():
                                crate::durable::annotations::format_millis(h.now()),
                        }
                    }
                });
                match h.jobs.patch(&job, &patch).await {
                    Ok(patched) => {
                        job = patched;
                        true
                    }
                    Err(e) if e.is_conflict() => {
                        match h.jobs.find(&tombstone.job_id).await {
                            Ok(Some(fresh)) => job = fresh,
                            Ok(None) => return publish_tombstone(h, m, tombstone).await,
                            Err(e) => return Settle::cluster(&e),
                        }
                        continue;
                    }
                    Err(e) => return Settle::cluster(&e),
                }
            }
            // Claimed by a submission (ours, or an earlier delivery's) only when no outcome is recorded:
            // the monitor's CANCELLED records one, and its event is not the tombstone's.
            Some(cause) => {
                cause == "cancelled"
                    && annotation(&job, &keys.lifecycle_state) == Some(cancelled)
                    && annotation(&job, &keys.outcome).is_none()
            }
        };
        let event = events::cancelled_without_job(tombstone, &h.runner_id);
        if ours && let Err(e) = h.publish(&event, m.traceparent.as_ref()).await {
            return Settle::publish(&e);
        }
        return match h.jobs.terminate(&job).await {
            Ok(()) => Settle::Ack,
            Err(e) => Settle::cluster(&e),
        };
    }
    Settle::Requeue {
        why: format!(
            "the VolcanoJob of {} kept changing while it was being cancelled",
            tombstone.job_id
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every task's pods get the gate once, and the job names the window for the monitor.
    #[test]
    fn a_held_job_is_gated_in_every_task_once_and_names_its_window() {
        let config = crate::config::Config::default();
        let submit: SubmitJob = serde_json::from_str(include_str!(
            "../../../schemas/examples/submit-job.figlet.json"
        ))
        .unwrap();
        let mut vcjob = pipeline::render(&submit, &config, jiff::Timestamp::UNIX_EPOCH)
            .unwrap()
            .vcjob;
        let keys = crate::durable::AnnotationKeys::new(&config.pipeline.annotation_prefix);
        let window = crate::cluster::Window {
            id: "202612010600-3fa9c1".into(),
            start: jiff::Timestamp::UNIX_EPOCH,
            end: jiff::Timestamp::MAX,
            nodes: Default::default(),
            reason: None,
            created_at: None,
            created_by: None,
        };
        hold_back(&mut vcjob, &keys, &window);
        hold_back(&mut vcjob, &keys, &window);
        assert!(!vcjob.spec.tasks.is_empty());
        for task in &vcjob.spec.tasks {
            let gates: Vec<_> = task
                .template
                .spec
                .iter()
                .flat_map(|s| s.scheduling_gates.iter().flatten())
                .map(|g| g.name.as_str())
                .collect();
            assert_eq!(gates, ["ucloud.dk/maintenance"]);
        }
        assert_eq!(
            annotation(&vcjob, &keys.maintenance_held),
            Some("202612010600-3fa9c1")
        );
    }
}
