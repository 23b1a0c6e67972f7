//! From what the cluster shows to start-time estimates: the waiting PodGroups of every queue, what each
//! of their ranks asks for and how long they may run, the nodes, and what holds each node until when.
//! Pure: the caller lists the objects and gives `now`; [`crate::forecast`] does the replay.
//!
//! What counts, and why:
//! - **Nodes**: every node not cordoned (`spec.unschedulable`), with its `status.allocatable` CPU,
//!   memory and `nvidia.com/gpu`.
//! - **What holds a node**: every pod bound to it (`spec.nodeName`) that has not ended, whoever runs it,
//!   grouped by Volcano job. A job volcano-runner created holds until its persisted `expiry` (or, before
//!   its start hook wrote one, now plus its `maxTime`: it started at the latest now); any other pod holds
//!   for as long as the replay looks, so a job waiting for it gets no bound rather than a wrong one.
//! - **Who waits**: every PodGroup that has not started (Pending or Inqueue), in the order the scheduler
//!   tries them: created first, then namespace and name. All queues share the nodes, so the replay goes
//!   through every queue's waiting groups in that one order; a job's position is counted in its own queue.
//!   A gang's ranks each ask for its `minResources` divided by `minMember`; its time allocation is the
//!   job's `maxTime` (none for other workloads, which therefore hold the nodes they get for good).
//! - Pods of a PodGroup still waiting (Inqueue with some ranks bound) are counted with the gang, not
//!   twice.

use std::collections::{BTreeMap, HashMap};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Serialize;

use super::keys::{JobKey, job_of_group};
use super::observe;
use super::reserve::{self, Change, NodeTaints};
use crate::durable::AnnotationKeys;
use crate::durable::annotations::parse_millis;
use crate::forecast::{self, Estimate, Node, Pending, Resources, Running};
use crate::quantity::{cpu_memory_gpu, pod_cpu_memory_gpu};
use crate::volcano::{LABEL_JOB_NAME, PodGroup, Queue, VolcanoJob};

/// The GPU resource name the products ask for.
pub use crate::quantity::GPU;

/// What the cluster shows, as listed.
#[derive(Debug, Clone, Copy)]
pub struct ClusterView<'a> {
    pub nodes: &'a [KubeNode],
    /// Every pod (of any workload): what is bound to a node holds it.
    pub pods: &'a [Pod],
    pub groups: &'a [PodGroup],
    /// The VolcanoJobs volcano-runner manages (their annotations carry the deadlines).
    pub jobs: &'a [VolcanoJob],
    /// The Volcano queues: whether each lets later jobs start first.
    pub queues: &'a [Queue],
}

/// One waiting job and when it will start.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueEntry {
    pub queue: String,
    /// Waiting jobs ahead of it in its queue.
    pub jobs_ahead: u32,
    pub namespace: String,
    pub pod_group: String,
    /// Its VolcanoJob, when one controls the PodGroup.
    pub job: Option<String>,
    /// The orchestrator's job id, for jobs volcano-runner created.
    pub job_id: Option<String>,
    pub ranks: u32,
    pub per_rank: RankResources,
    /// Each rank needs a node to itself (`exclusiveNodes`).
    pub whole_nodes: bool,
    /// Its time allocation in seconds; `None`: no time limit.
    pub time_allocation_s: Option<i64>,
    /// `Pending` (not yet admitted to its queue) or `Inqueue` (admitted, waiting for its gang to fit).
    pub phase: String,
    /// The scheduler's latest word on why it waits (the PodGroup's `Unschedulable` condition).
    pub scheduler_message: Option<String>,
    pub estimate: EstimateView,
}

/// [`Resources`] as printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RankResources {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpu: u64,
}

impl From<Resources> for RankResources {
    fn from(r: Resources) -> Self {
        Self {
            cpu_milli: r.cpu_milli,
            memory_mib: r.memory_mib,
            gpu: r.gpu,
        }
    }
}

/// An [`Estimate`] as printed: `kind` is `at` (with `startAt`), `never`, `unbounded` or `timesOut`
/// (with `failsAt`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EstimateView {
    pub kind: &'static str,
    /// RFC 3339; only for `at`.
    pub start_at: Option<String>,
    /// RFC 3339; only for `timesOut`: when the runner fails the job (`[monitor] queue_timeout`),
    /// before the replay can start it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fails_at: Option<String>,
    /// Only for `at`: `true` when the scheduler reserves for the job, so that `startAt` is a bound
    /// (it starts by then at the latest); `false` when it is what the replay expects.
    pub bound: bool,
    /// One line: why this time, or why none.
    pub basis: String,
}

impl From<&Estimate> for EstimateView {
    fn from(e: &Estimate) -> Self {
        match e {
            Estimate::At {
                start,
                basis,
                bound,
                ..
            } => Self {
                kind: "at",
                start_at: Some(start.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
                fails_at: None,
                bound: *bound,
                basis: basis.clone(),
            },
            Estimate::Never { why } => Self {
                kind: "never",
                start_at: None,
                fails_at: None,
                bound: false,
                basis: why.clone(),
            },
            Estimate::Unbounded { why } => Self {
                kind: "unbounded",
                start_at: None,
                fails_at: None,
                bound: false,
                basis: why.clone(),
            },
            Estimate::TimesOut { at, why } => Self {
                kind: "timesOut",
                start_at: None,
                fails_at: Some(at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
                bound: false,
                basis: why.clone(),
            },
        }
    }
}

/// CPU in millicores, memory in MiB (rounded up), GPUs: of one quantity map.
fn resources_of(map: &BTreeMap<String, Quantity>) -> Resources {
    let (cpu_milli, memory_mib, gpu) = cpu_memory_gpu(map);
    Resources {
        cpu_milli,
        memory_mib,
        gpu,
    }
}

/// What a pod asks for, as the scheduler counts it ([`crate::quantity::pod_cpu_memory_gpu`]).
fn pod_requests(pod: &Pod) -> Resources {
    let (cpu_milli, memory_mib, gpu) = pod
        .spec
        .as_ref()
        .map(pod_cpu_memory_gpu)
        .unwrap_or_default();
    Resources {
        cpu_milli,
        memory_mib,
        gpu,
    }
}

/// Whether a pod still holds its node: bound and not ended.
fn holds_a_node(pod: &Pod) -> Option<&str> {
    let node = pod.spec.as_ref()?.node_name.as_deref()?;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    (!matches!(phase, Some("Succeeded" | "Failed"))).then_some(node)
}

fn millis_annotation(job: &VolcanoJob, key: &str) -> Option<i64> {
    job.metadata
        .annotations
        .as_ref()?
        .get(key)?
        .trim()
        .parse()
        .ok()
}

/// What the replay reads, from what the cluster shows.
struct Inputs<'a> {
    nodes: Vec<Node>,
    running: Vec<Running>,
    waiting: Vec<&'a PodGroup>,
    pending: Vec<Pending>,
    maintenance: forecast::Maintenance,
}

/// The waiting jobs of every queue with their estimates, queue by queue in queue order.
/// `reserve_nodes`: `[monitor] reserve_nodes` (nodes are reserved for a whole-node or large gang past
/// its waiting time, see [`super::reserve`]); for a scheduler without the `proportion` plugin (the
/// simulator's default), see [`forecast_with`] for one with it.
pub fn forecast(
    view: ClusterView<'_>,
    keys: &AnnotationKeys,
    now: Timestamp,
    reserve_nodes: bool,
) -> Vec<QueueEntry> {
    forecast_with(
        view,
        &[],
        keys,
        now,
        Replaying {
            reserve_nodes,
            ..Replaying::default()
        },
    )
}

/// How the monitor replays, from its configuration.
#[derive(Debug, Clone, Copy, Default)]
pub struct Replaying {
    /// `[monitor] reserve_nodes`.
    pub reserve_nodes: bool,
    /// `[monitor] proportion`: while jobs of more than one queue wait or run, no estimate is a bound
    /// ([`forecast::across_queues`]).
    pub proportion: bool,
    /// `[monitor] start_margin`: a job is taken to start this long after its resources are free.
    pub start_margin: jiff::SignedDuration,
    /// `[monitor] queue_timeout`: a job of volcano-runner's that has not started this long after its
    /// creation is failed by the runner; the replay takes it out of its queue then, and tells it so
    /// (`timesOut`) rather than a start after its failure, as the monitor does.
    pub queue_timeout: Option<jiff::SignedDuration>,
}

/// [`forecast`] with the maintenance windows in the replay ([`crate::forecast::windows`]): `admin queue`
/// tells what the monitor tells.
pub fn forecast_with(
    view: ClusterView<'_>,
    windows: &[crate::cluster::Window],
    keys: &AnnotationKeys,
    now: Timestamp,
    replaying: Replaying,
) -> Vec<QueueEntry> {
    let Inputs {
        nodes,
        running,
        waiting,
        pending,
        maintenance,
    } = inputs(view, windows, keys, now, replaying);
    let mut estimates = forecast::replay_with(
        &nodes,
        &running,
        &pending,
        &maintenance,
        replaying.start_margin,
        now,
    )
    .estimates;
    if replaying.proportion {
        forecast::across_queues(&mut estimates, observe::queues_in_use(view.groups.iter()));
    }
    entries(&waiting, &pending, &estimates)
}

/// What the monitor with `[monitor] reserve_nodes` changes on the nodes now, as it would decide it from
/// this view (every job taken as its own: no shards). See [`super::reserve::plan`].
pub fn reservations(view: ClusterView<'_>, keys: &AnnotationKeys, now: Timestamp) -> Vec<Change> {
    let Inputs {
        nodes,
        running,
        pending,
        maintenance,
        ..
    } = inputs(
        view,
        &[],
        keys,
        now,
        Replaying {
            reserve_nodes: true,
            ..Replaying::default()
        },
    );
    let replay = forecast::replay_with(
        &nodes,
        &running,
        &pending,
        &maintenance,
        jiff::SignedDuration::ZERO,
        now,
    );
    let taints: Vec<NodeTaints> = view.nodes.iter().map(NodeTaints::of).collect();
    let reserving: std::collections::HashSet<String> =
        pending.iter().filter_map(|p| p.reserves.clone()).collect();
    let reserve_now: Vec<(String, Vec<String>)> = replay
        .reserve_now
        .iter()
        .filter_map(|(g, on)| {
            Some((
                pending[*g].reserves.clone()?,
                on.iter().map(|n| nodes[*n].name.clone()).collect(),
            ))
        })
        .collect();
    reserve::plan(
        &taints,
        &reserve::taint_key(keys),
        &reserving,
        &reserve_now,
        |_| true,
    )
}

fn inputs<'a>(
    view: ClusterView<'a>,
    windows: &[crate::cluster::Window],
    keys: &AnnotationKeys,
    now: Timestamp,
    replaying: Replaying,
) -> Inputs<'a> {
    let nodes = listed_nodes(view, keys);
    let jobs: HashMap<JobKey, &VolcanoJob> = view
        .jobs
        .iter()
        .map(|j| (JobKey::of(&j.metadata), j))
        .collect();
    let mut waiting = waiting_groups(view);
    // A booked job waits for its start, not for room: its room is the booked nodes' hold below.
    waiting.retain(|pg| {
        let job = job_of_group(pg).and_then(|k| jobs.get(&k).copied());
        !booked_later(job, keys, now)
    });
    let (mut running, mut spared) = holders(view, &nodes, &jobs, &waiting, keys, now);
    let booked = booked_nodes(
        view.nodes.iter().map(|n| {
            (
                n.metadata.name.as_deref().unwrap_or_default(),
                n.spec
                    .as_ref()
                    .and_then(|s| s.taints.as_deref())
                    .unwrap_or_default(),
            )
        }),
        keys,
    );
    let held = booked_holds(&nodes, &running, &booked, now);
    // No window ends a booking's hold.
    spared.extend(held.iter().map(|_| true));
    running.extend(held);
    let fifo: std::collections::HashSet<&str> = view
        .queues
        .iter()
        .filter(|q| q.spec.dequeue_strategy.as_deref() == Some("fifo"))
        .filter_map(|q| q.metadata.name.as_deref())
        .collect();
    let pending: Vec<Pending> = waiting
        .iter()
        .map(|pg| {
            let job = job_of_group(pg).and_then(|k| jobs.get(&k).copied());
            let in_fifo = fifo.contains(observe::queue_of(pg).as_str());
            let mut gang = pending_gang(pg, job, keys, in_fifo, replaying.reserve_nodes);
            gang.gives_up_at = gives_up_at(job, replaying.queue_timeout);
            gang
        })
        .collect();
    let maintenance = listed_maintenance(view, &jobs, &waiting, spared, windows, keys, now);
    Inputs {
        nodes,
        running,
        waiting,
        pending,
        maintenance,
    }
}

/// The listed nodes jobs can be placed on, with the gang each is reserved for.
fn listed_nodes(view: ClusterView<'_>, keys: &AnnotationKeys) -> Vec<Node> {
    let taint = reserve::taint_key(keys);
    view.nodes
        .iter()
        .filter_map(|n| {
            node(
                n.metadata.name.as_deref().unwrap_or_default(),
                n.spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false),
                n.status.as_ref().and_then(|s| s.allocatable.as_ref()),
                reserve::reserved_for(
                    n.spec
                        .as_ref()
                        .and_then(|s| s.taints.as_deref())
                        .unwrap_or_default(),
                    &taint,
                ),
            )
        })
        .collect()
}

/// The waiting PodGroups in the scheduler's list order: created first.
fn waiting_groups<'a>(view: ClusterView<'a>) -> Vec<&'a PodGroup> {
    let mut waiting: Vec<&PodGroup> = view
        .groups
        .iter()
        .filter(|pg| observe::is_waiting(pg))
        .collect();
    waiting.sort_by_key(|pg| {
        (
            pg.metadata.creation_timestamp.as_ref().map(|t| t.0),
            pg.metadata.namespace.clone(),
            pg.metadata.name.clone(),
        )
    });
    waiting
}

/// What holds each node: pods grouped by their Volcano job (or alone), with the job's deadline; and
/// for each, whether it is not volcano-runner's (no window ends what it does not run).
fn holders(
    view: ClusterView<'_>,
    nodes: &[Node],
    jobs: &HashMap<JobKey, &VolcanoJob>,
    waiting: &[&PodGroup],
    keys: &AnnotationKeys,
    now: Timestamp,
) -> (Vec<Running>, Vec<bool>) {
    let node_index: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let waiting_jobs: std::collections::HashSet<JobKey> =
        waiting.iter().filter_map(|pg| job_of_group(pg)).collect();
    let mut holders: BTreeMap<(String, String), Running> = BTreeMap::new();
    let mut managed_ids: std::collections::HashSet<(String, String)> =
        std::collections::HashSet::new();
    for pod in view.pods {
        let Some(node) = holds_a_node(pod).and_then(|n| node_index.get(n)) else {
            continue;
        };
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let job_name = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_JOB_NAME))
            .cloned();
        let job = job_name.as_ref().map(|name| JobKey::new(&namespace, name));
        if job.as_ref().is_some_and(|j| waiting_jobs.contains(j)) {
            continue;
        }
        let managed = job.as_ref().and_then(|j| jobs.get(j));
        let id = (
            namespace,
            job_name
                .unwrap_or_else(|| format!("pod/{}", pod.metadata.name.as_deref().unwrap_or(""))),
        );
        if managed.is_some() {
            managed_ids.insert(id.clone());
        }
        let ends_by = managed.and_then(|j| deadline(j, keys, now));
        let holds = if managed.is_some_and(|j| exclusive(j, keys)) {
            nodes[*node].allocatable
        } else {
            pod_requests(pod)
        };
        holders
            .entry(id)
            .or_insert_with(|| Running {
                ranks: Vec::new(),
                ends_by,
            })
            .ranks
            .push((*node, holds));
    }
    // No window ends what volcano-runner does not run.
    let spared: Vec<bool> = holders.keys().map(|id| !managed_ids.contains(id)).collect();
    (holders.into_values().collect(), spared)
}

/// Whether `job` is a booked job before its booked start (`<prefix>bookedStart`): it is not placed
/// before then, so the replay leaves it out (what it will use is held by its booking).
pub fn booked_later(job: Option<&VolcanoJob>, keys: &AnnotationKeys, now: Timestamp) -> bool {
    job.and_then(|j| j.metadata.annotations.as_ref()?.get(&keys.booked_start))
        .and_then(|v| parse_millis(v))
        .is_some_and(|start| start > now)
}

/// Until when each booked node is booked (docs/bookings.md), from its taint `<prefix>booked`.
pub fn booked_nodes<'a>(
    nodes: impl Iterator<Item = (&'a str, &'a [k8s_openapi::api::core::v1::Taint])>,
    keys: &AnnotationKeys,
) -> BTreeMap<String, Timestamp> {
    nodes
        .filter_map(|(name, taints)| {
            Some((
                name.to_owned(),
                crate::cluster::bookings::booked_until(keys, taints)?,
            ))
        })
        .collect()
}

/// What the bookings hold, for the replay: a booked node's taint keeps every job that is not booked off
/// it until the booking's end, so whatever is free on it now is held until then, as if a job ran there
/// until that end. (Booked jobs wait for their start and are not estimated.)
pub fn booked_holds(
    nodes: &[Node],
    running: &[Running],
    booked: &BTreeMap<String, Timestamp>,
    now: Timestamp,
) -> Vec<Running> {
    let mut out = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let Some(until) = booked.get(&node.name).filter(|u| **u > now) else {
            continue;
        };
        let mut free = node.allocatable;
        for (_, r) in running
            .iter()
            .flat_map(|j| &j.ranks)
            .filter(|(n, _)| *n == i)
        {
            free.cpu_milli = free.cpu_milli.saturating_sub(r.cpu_milli);
            free.memory_mib = free.memory_mib.saturating_sub(r.memory_mib);
            free.gpu = free.gpu.saturating_sub(r.gpu);
        }
        if free != Resources::default() {
            out.push(Running {
                ranks: vec![(i, free)],
                ends_by: Some(*until),
            });
        }
    }
    out
}

/// The maintenance windows as the replay sees them, from the listing.
fn listed_maintenance(
    view: ClusterView<'_>,
    jobs: &HashMap<JobKey, &VolcanoJob>,
    waiting: &[&PodGroup],
    spared: Vec<bool>,
    windows: &[crate::cluster::Window],
    keys: &AnnotationKeys,
    now: Timestamp,
) -> forecast::Maintenance {
    // The windows whose taint is on a node, read as the monitor reads them: a job that does not
    // tolerate one is held by it, and a window of some nodes whose taint is on no node holds nobody.
    let tainted = super::maintenance::tainted_windows(
        view.nodes
            .iter()
            .flat_map(|n| n.spec.iter().flat_map(|s| s.taints.iter().flatten())),
        &keys.maintenance_taint(),
    );
    let (held, kept_off): (Vec<bool>, Vec<Vec<usize>>) = waiting
        .iter()
        .map(|pg| {
            job_of_group(pg)
                .and_then(|k| jobs.get(&k).map(|j| (k, j)))
                .map_or((false, Vec::new()), |(k, j)| {
                    held(j, &k, view.pods, keys, windows, &tainted, now)
                })
        })
        .unzip();
    forecast::Maintenance {
        windows: windows.to_vec(),
        holds: windows
            .iter()
            .map(|w| super::maintenance::holds_anyone(w, |w| tainted.contains(&w.id)))
            .collect(),
        held,
        kept_off,
        spared,
    }
}

/// The entries of the waiting PodGroups, queue by queue in queue order.
fn entries(waiting: &[&PodGroup], pending: &[Pending], estimates: &[Estimate]) -> Vec<QueueEntry> {
    let mut ahead: HashMap<String, u32> = HashMap::new();
    let mut out: Vec<QueueEntry> = waiting
        .iter()
        .zip(pending.iter().zip(estimates))
        .map(|(pg, (p, e))| {
            let queue = observe::queue_of(pg);
            let position = ahead.entry(queue.clone()).or_default();
            let jobs_ahead = *position;
            *position += 1;
            let job = job_of_group(pg);
            QueueEntry {
                queue,
                jobs_ahead,
                namespace: pg.metadata.namespace.clone().unwrap_or_default(),
                pod_group: pg.metadata.name.clone().unwrap_or_default(),
                job_id: job.as_ref().and_then(|k| k.job_id()).map(str::to_owned),
                job: job.map(|k| k.name.to_string()),
                ranks: p.replicas,
                per_rank: p.per_rank.into(),
                whole_nodes: p.exclusive,
                time_allocation_s: p.runs_for.map(|d| d.as_secs()),
                phase: pg
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.as_ref())
                    .map_or_else(|| "Pending".to_owned(), |p| p.as_str().to_owned()),
                scheduler_message: pg.status.as_ref().and_then(|s| {
                    s.conditions
                        .iter()
                        .rev()
                        .find(|c| c.type_ == "Unschedulable" && c.status == "True")
                        .and_then(|c| c.message.clone())
                }),
                estimate: e.into(),
            }
        })
        .collect();
    out.sort_by(|a, b| a.queue.cmp(&b.queue).then(a.jobs_ahead.cmp(&b.jobs_ahead)));
    out
}

/// How the maintenance windows hold the job back ([`super::maintenance::replay_hold`]): the
/// monitor lifts the gate, or adds a window's toleration, only when the window is not in the way.
/// `tainted`: the windows whose taint is on a node.
fn held(
    job: &VolcanoJob,
    key: &JobKey,
    pods: &[Pod],
    keys: &AnnotationKeys,
    windows: &[crate::cluster::Window],
    tainted: &std::collections::BTreeSet<String>,
    now: Timestamp,
) -> (bool, Vec<usize>) {
    let created_held = job
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(&keys.maintenance_held));
    let gate = keys.maintenance_gate();
    let own: Vec<&Pod> = pods
        .iter()
        .filter(|p| {
            p.metadata.namespace.as_deref() == Some(&*key.namespace)
                && p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_JOB_NAME))
                    .is_some_and(|n| *n == *key.name)
        })
        .collect();
    let gate_holds = super::maintenance::held_back(
        created_held,
        own.is_empty(),
        own.iter().any(|p| super::peers::is_gated(p, &gate)),
    );
    let own: Vec<Pod> = own.into_iter().cloned().collect();
    let prefix = keys.maintenance_taint();
    super::maintenance::replay_hold(
        windows,
        gate_holds,
        |w| tainted.contains(&w.id),
        |w| super::maintenance::job_tolerates(&own, &prefix, &w.id),
        now,
    )
}

/// A node the replay may place ranks on; `None` for a cordoned node. `reserved_for`: see
/// [`Node::reserved_for`].
pub fn node(
    name: &str,
    unschedulable: bool,
    allocatable: Option<&BTreeMap<String, Quantity>>,
    reserved_for: Option<String>,
) -> Option<Node> {
    (!unschedulable).then(|| Node {
        name: name.to_owned(),
        allocatable: allocatable.map(resources_of).unwrap_or_default(),
        reserved_for,
    })
}

/// What one rank of a PodGroup's gang asks for (`minResources` / `minMember`) and how many ranks.
pub fn gang(pg: &PodGroup) -> (u32, Resources) {
    let members = u32::try_from(pg.spec.min_member.unwrap_or(1).max(1)).unwrap_or(1);
    let total = resources_of(&pg.spec.min_resources);
    let n = u64::from(members);
    (
        members,
        Resources {
            cpu_milli: total.cpu_milli.div_ceil(n),
            memory_mib: total.memory_mib.div_ceil(n),
            gpu: total.gpu.div_ceil(n),
        },
    )
}

/// A waiting PodGroup as the replay takes it; `job` is its VolcanoJob when volcano-runner made it (its
/// `maxTime` is the gang's time allocation; without one it holds what it gets for good); `fifo`: its
/// queue's `dequeueStrategy` is `fifo`; `reserve_nodes`: `[monitor] reserve_nodes`, so that a gang
/// whose ranks tolerate their own job's reservation may get nodes reserved ([`Pending::reserves`]: its
/// job id; the replay reserves only for one that [`forecast::needs_reservation`]). Its ranks tolerate
/// it when its job says so (`reservable`, written by the pipeline's Task plugin with the toleration, for
/// a job with a `sla-waiting-time` or whole nodes; a whole-node job rendered before the marker came
/// had the toleration already): a job rendered earlier with a waiting time but no toleration is not
/// reserved for, since it could not use what is reserved.
pub fn pending_gang(
    pg: &PodGroup,
    job: Option<&VolcanoJob>,
    keys: &AnnotationKeys,
    fifo: bool,
    reserve_nodes: bool,
) -> Pending {
    let (replicas, per_rank) = gang(pg);
    let whole = job.is_some_and(|j| exclusive(j, keys));
    let reserved_from = reserved_from(pg, job);
    let tolerates = job.is_some_and(|j| {
        whole
            || j.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.get(&keys.reservable).is_some_and(|v| v == "true"))
    });
    let reserves = (reserve_nodes && tolerates && reserved_from.is_some())
        .then(|| job_of_group(pg).and_then(|k| k.job_id().map(str::to_owned)))
        .flatten();
    Pending {
        reserves,
        queue: observe::queue_of(pg),
        fifo,
        reserved_from,
        inqueue: pg
            .status
            .as_ref()
            .and_then(|s| s.phase.as_ref())
            .is_some_and(|p| p.as_str() == "Inqueue"),
        exclusive: whole,
        job_id: pg.metadata.name.clone().unwrap_or_default(),
        replicas,
        per_rank,
        runs_for: job
            .and_then(|j| millis_annotation(j, &keys.max_time))
            .map(SignedDuration::from_millis),
        gives_up_at: None,
    }
}

/// When the runner fails a job of its own that has not started (`[monitor] queue_timeout` after its
/// creation, as `decide` counts it): `None` without a timeout or for a PodGroup of another workload.
pub fn gives_up_at(
    job: Option<&VolcanoJob>,
    queue_timeout: Option<SignedDuration>,
) -> Option<Timestamp> {
    let created = job?.metadata.creation_timestamp.as_ref()?.0;
    created.checked_add(queue_timeout?).ok()
}

/// The annotation Volcano's `sla` plugin reads (on the PodGroup, where the job controller copies the
/// job's annotations).
const SLA_WAITING_TIME: &str = "sla-waiting-time";

/// When Volcano's `sla` plugin starts reserving for a waiting gang: its PodGroup's creation plus its
/// `sla-waiting-time` (read on the PodGroup, else on its job, whose annotations the job controller
/// copies there). `None` without a valid one: the plugin ignores a waiting time it cannot parse.
pub fn reserved_from(pg: &PodGroup, job: Option<&VolcanoJob>) -> Option<Timestamp> {
    let text = pg
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SLA_WAITING_TIME))
        .or_else(|| job?.metadata.annotations.as_ref()?.get(SLA_WAITING_TIME))?;
    let wait: SignedDuration = text.trim().parse().ok()?;
    let created = pg.metadata.creation_timestamp.as_ref()?.0;
    created.checked_add(wait).ok()
}

/// Whether the job asked for whole nodes (its ranks hold every node they run on).
pub fn exclusive(job: &VolcanoJob, keys: &AnnotationKeys) -> bool {
    job.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&keys.exclusive_nodes))
        .is_some_and(|v| v == "true")
}

/// When a running job volcano-runner created ends at the latest: its persisted expiry, or, before the
/// start hook wrote one, now plus its time allocation. `None`: no time limit.
pub fn deadline(job: &VolcanoJob, keys: &AnnotationKeys, now: Timestamp) -> Option<Timestamp> {
    let annotations = job.metadata.annotations.as_ref()?;
    if let Some(expiry) = annotations.get(&keys.expiry).and_then(|v| parse_millis(v)) {
        return Some(expiry);
    }
    let max_time = millis_annotation(job, &keys.max_time)?;
    now.checked_add(SignedDuration::from_millis(max_time)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn keys() -> AnnotationKeys {
        AnnotationKeys::new("ucloud.dk/")
    }

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    /// The cluster of a test: these nodes, pods, groups and jobs, and no Volcano queues.
    fn cluster_view<'a>(
        nodes: &'a [KubeNode],
        pods: &'a [Pod],
        groups: &'a [PodGroup],
        jobs: &'a [VolcanoJob],
    ) -> ClusterView<'a> {
        ClusterView {
            nodes,
            pods,
            groups,
            jobs,
            queues: &[],
        }
    }

    fn node(name: &str, cpu: &str, gpus: u32) -> KubeNode {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {"allocatable": {"cpu": cpu, "memory": "64Gi", GPU: gpus.to_string()}}
        }))
        .unwrap()
    }

    fn job(name: &str, annotations: serde_json::Value) -> VolcanoJob {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "annotations": annotations},
            "spec": {"tasks": []}
        }))
        .unwrap()
    }

    fn group(job: &str, created: i64, phase: &str, members: i32, cpu: &str) -> PodGroup {
        serde_json::from_value(json!({
            "metadata": {
                "name": format!("{job}-pg"), "namespace": "ns",
                "creationTimestamp": t(created).strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
                "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                                     "name": job, "uid": "u", "controller": true}]
            },
            "spec": {"minMember": members, "queue": "q", "minResources": {"cpu": cpu, "memory": "8Gi"}},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    fn pod(job: &str, node: &str, cpu: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("{job}-0"), "namespace": "ns",
                         "labels": {LABEL_JOB_NAME: job}},
            "spec": {"nodeName": node, "containers": [{"name": "c",
                     "resources": {"requests": {"cpu": cpu, "memory": "4Gi"}}}]},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    /// A gang is reserved for only when its job says its ranks tolerate the reservation (`reservable`):
    /// one rendered before the toleration came with the waiting time would be held off the nodes
    /// reserved for it.
    #[test]
    fn only_a_job_whose_ranks_tolerate_the_reservation_reserves() {
        let pg = group("j-w", 0, "Inqueue", 2, "32");
        let sla = json!({"sla-waiting-time": "60s"});
        let marked = json!({"sla-waiting-time": "60s", "ucloud.dk/reservable": "true"});
        let reserves = |annotations: &serde_json::Value, on: bool| {
            pending_gang(
                &pg,
                Some(&job("j-w", annotations.clone())),
                &keys(),
                false,
                on,
            )
            .reserves
        };
        assert_eq!(reserves(&marked, true).as_deref(), Some("w"));
        assert_eq!(
            reserves(&sla, true),
            None,
            "rendered without the toleration"
        );
        assert_eq!(reserves(&marked, false), None, "reserve_nodes off");
        let whole = json!({"sla-waiting-time": "60s", "ucloud.dk/exclusiveNodes": "true"});
        assert_eq!(
            reserves(&whole, true).as_deref(),
            Some("w"),
            "whole-node ranks always tolerated it"
        );
    }

    #[test]
    fn a_waiting_gang_starts_when_the_running_job_it_needs_reaches_its_expiry() {
        let nodes = [node("a", "16", 0), node("b", "16", 0)];
        let jobs = [
            job(
                "j-run",
                json!({"ucloud.dk/expiry": (t(600).as_millisecond()).to_string()}),
            ),
            job("j-wait", json!({"ucloud.dk/maxTime": "3600000"})),
        ];
        let groups = [
            group("j-run", 0, "Running", 1, "16"),
            group("j-wait", 10, "Inqueue", 2, "32"),
        ];
        let pods = [
            pod("j-run", "a", "16", "Running"),
            // Ended: holds nothing.
            pod("j-old", "b", "16", "Succeeded"),
        ];
        let view = cluster_view(&nodes, &pods, &groups, &jobs);
        let out = forecast(view, &keys(), t(100), false);
        assert_eq!(out.len(), 1, "only the waiting group: {out:?}");
        let e = &out[0];
        assert_eq!((e.job_id.as_deref(), e.ranks), (Some("wait"), 2));
        assert_eq!(e.per_rank.cpu_milli, 16_000);
        assert_eq!(e.per_rank.memory_mib, 4096);
        assert_eq!(e.time_allocation_s, Some(3600));
        assert_eq!(e.estimate.kind, "at");
        assert_eq!(
            e.estimate.start_at.as_deref(),
            Some(t(600).strftime("%Y-%m-%dT%H:%M:%SZ").to_string().as_str())
        );
    }

    /// `admin queue` knows the runner's `[monitor] queue_timeout` as the monitor does: a job the replay
    /// would start only after it is failed is shown `timesOut`, with when (`failsAt`), never that start.
    #[test]
    fn a_job_failed_by_the_queue_timeout_before_it_could_start_is_shown_when() {
        let nodes = [node("a", "16", 0)];
        let mut waiting = job("j-wait", json!({"ucloud.dk/maxTime": "3600000"}));
        waiting.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(10)));
        let jobs = [
            job(
                "j-run",
                json!({"ucloud.dk/expiry": (t(600).as_millisecond()).to_string()}),
            ),
            waiting,
        ];
        let groups = [
            group("j-run", 0, "Running", 1, "16"),
            group("j-wait", 10, "Inqueue", 1, "16"),
        ];
        let pods = [pod("j-run", "a", "16", "Running")];
        let view = cluster_view(&nodes, &pods, &groups, &jobs);
        let replay = |queue_timeout: Option<i64>| {
            forecast_with(
                view,
                &[],
                &keys(),
                t(100),
                Replaying {
                    queue_timeout: queue_timeout.map(SignedDuration::from_secs),
                    ..Replaying::default()
                },
            )
            .remove(0)
            .estimate
        };
        let e = replay(Some(300));
        assert_eq!(e.kind, "timesOut", "{e:?}");
        assert_eq!(e.start_at, None);
        let fails = t(310).strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        assert_eq!(e.fails_at.as_deref(), Some(fails.as_str()));
        assert!(e.basis.contains("queue_timeout"), "{}", e.basis);
        assert_eq!(serde_json::to_value(&e).unwrap()["failsAt"], json!(fails));
        // Later than the replay's start, or none: the start.
        for timeout in [Some(3600), None] {
            let e = replay(timeout);
            assert_eq!((e.kind, e.fails_at.as_deref()), ("at", None), "{timeout:?}");
            assert!(serde_json::to_value(&e).unwrap().get("failsAt").is_none());
        }
    }

    #[test]
    fn a_pod_of_another_workload_holds_its_node_without_a_bound() {
        let nodes = [node("a", "16", 0)];
        let groups = [group("j-wait", 10, "Pending", 1, "16")];
        let pods = [pod("someone-else", "a", "8", "Running")];
        let view = cluster_view(&nodes, &pods, &groups, &[]);
        let out = forecast(view, &keys(), t(100), false);
        assert_eq!(out[0].estimate.kind, "unbounded", "{out:?}");
    }

    #[test]
    fn positions_count_within_a_queue_and_a_job_too_big_says_never() {
        let nodes = [node("a", "16", 0)];
        let mut other = group("j-other", 5, "Pending", 1, "1");
        other.spec.queue = Some("other".into());
        let groups = [
            group("j-1", 10, "Pending", 1, "4"),
            other,
            group("j-2", 20, "Pending", 1, "64"),
        ];
        let view = cluster_view(&nodes, &[], &groups, &[]);
        let out = forecast(view, &keys(), t(100), false);
        let pos: Vec<(&str, u32, &str)> = out
            .iter()
            .map(|e| (e.pod_group.as_str(), e.jobs_ahead, e.estimate.kind))
            .collect();
        assert_eq!(
            pos,
            [
                ("j-other-pg", 0, "at"),
                ("j-1-pg", 0, "at"),
                ("j-2-pg", 1, "never")
            ]
        );
    }

    #[test]
    fn a_running_job_before_its_start_hook_is_bounded_by_now_plus_its_allocation() {
        let nodes = [node("a", "16", 0)];
        let jobs = [job("j-run", json!({"ucloud.dk/maxTime": "60000"}))];
        let groups = [
            group("j-run", 0, "Running", 1, "16"),
            group("j-wait", 10, "Pending", 1, "16"),
        ];
        let pods = [pod("j-run", "a", "16", "Running")];
        let view = cluster_view(&nodes, &pods, &groups, &jobs);
        let out = forecast(view, &keys(), t(100), false);
        assert_eq!(
            out[0].estimate.start_at.as_deref(),
            Some(t(160).strftime("%Y-%m-%dT%H:%M:%SZ").to_string().as_str())
        );
    }

    /// `admin queue` replays the windows as the monitor does: a job created held (no pods yet, or its
    /// pods gated) waits for the window's end; the same job let go (its pods without the gate) does not.
    /// The maintenance window `w`, from 1,000 s to 5,000 s, over every node.
    fn window_w() -> crate::cluster::Window {
        crate::cluster::Window {
            id: "w".into(),
            start: t(1000),
            end: t(5000),
            nodes: Default::default(),
            reason: None,
            created_at: Some(t(0)),
            created_by: None,
        }
    }

    /// The estimated start of the first waiting job at 100 s.
    fn first_start(
        nodes: &[KubeNode],
        pods: &[Pod],
        groups: &[PodGroup],
        jobs: &[VolcanoJob],
        windows: &[crate::cluster::Window],
    ) -> Option<String> {
        let view = cluster_view(nodes, pods, groups, jobs);
        forecast_with(view, windows, &keys(), t(100), Replaying::default())[0]
            .estimate
            .start_at
            .clone()
    }

    #[test]
    fn a_job_held_by_a_window_is_estimated_after_it() {
        let nodes = [node("a", "16", 0)];
        let jobs = [job(
            "j-held",
            json!({"ucloud.dk/maxTime": "3600000", "ucloud.dk/maintenanceHeld": "w"}),
        )];
        let groups = [group("j-held", 10, "Pending", 1, "4")];
        let windows = [window_w()];
        let at = |pods: &[Pod]| first_start(&nodes, pods, &groups, &jobs, &windows);
        let end = Some(t(5000).strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
        assert_eq!(at(&[]), end, "created held, no pods yet");
        let mut gated: Pod = serde_json::from_value(json!({
            "metadata": {"name": "j-held-0", "namespace": "ns", "labels": {LABEL_JOB_NAME: "j-held"}},
            "spec": {"containers": [], "schedulingGates": [{"name": "ucloud.dk/maintenance"}]}
        }))
        .unwrap();
        assert_eq!(at(std::slice::from_ref(&gated)), end, "its pod gated");
        gated.spec.as_mut().unwrap().scheduling_gates = None;
        let now = Some(t(100).strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
        assert_eq!(at(&[gated]), now, "let go: the scheduler may start it");
    }

    /// A job queued before the window (no gate) is held as the monitor holds it while the window's taint
    /// is on the nodes and its pods do not tolerate it; once they do, it may start.
    /// A booked node is held, what is free on it, until its bookings' end; a node whose booking is over,
    /// or not booked, is not.
    #[test]
    fn a_booked_node_holds_its_free_room_until_the_booking_ends() {
        let keys = AnnotationKeys::new("ucloud.dk/");
        let t = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        let taint = |end: Timestamp| k8s_openapi::api::core::v1::Taint {
            key: "ucloud.dk/booked".into(),
            value: Some(end.as_millisecond().to_string()),
            effect: "NoSchedule".into(),
            time_added: None,
        };
        let (on_n0, on_n1) = ([taint(t(3600))], [taint(t(-10))]);
        let booked = booked_nodes(
            [("n0", &on_n0[..]), ("n1", &on_n1[..]), ("n2", &[][..])].into_iter(),
            &keys,
        );
        assert_eq!(booked.len(), 2);
        let room = Resources {
            cpu_milli: 16_000,
            memory_mib: 65_536,
            gpu: 0,
        };
        let nodes: Vec<Node> = ["n0", "n1", "n2"]
            .iter()
            .map(|n| Node {
                name: (*n).into(),
                allocatable: room,
                reserved_for: None,
            })
            .collect();
        let busy = Running {
            ranks: vec![(
                0,
                Resources {
                    cpu_milli: 4_000,
                    memory_mib: 1_024,
                    gpu: 0,
                },
            )],
            ends_by: None,
        };
        let held = booked_holds(&nodes, &[busy], &booked, t(0));
        assert_eq!(
            held,
            vec![Running {
                ranks: vec![(
                    0,
                    Resources {
                        cpu_milli: 12_000,
                        memory_mib: 64_512,
                        gpu: 0,
                    }
                )],
                ends_by: Some(t(3600)),
            }]
        );
    }

    #[test]
    fn a_queued_job_kept_off_by_a_windows_taint_is_estimated_after_it() {
        let mut tainted = node("a", "16", 0);
        tainted.spec.get_or_insert_default().taints =
            Some(vec![crate::monitor::maintenance::taint(
                "ucloud.dk/maintenance",
                "w",
            )]);
        let nodes = [tainted];
        let jobs = [job("j-q", json!({"ucloud.dk/maxTime": "3600000"}))];
        let groups = [group("j-q", 10, "Pending", 1, "4")];
        let windows = [window_w()];
        let at = |pods: &[Pod]| first_start(&nodes, pods, &groups, &jobs, &windows);
        let end = Some(t(5000).strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
        let mut waiting: Pod = serde_json::from_value(json!({
            "metadata": {"name": "j-q-0", "namespace": "ns", "labels": {LABEL_JOB_NAME: "j-q"}},
            "spec": {"containers": []}
        }))
        .unwrap();
        assert_eq!(
            at(std::slice::from_ref(&waiting)),
            end,
            "kept off by the taint"
        );
        waiting.spec.as_mut().unwrap().tolerations =
            Some(vec![crate::monitor::maintenance::toleration(
                "ucloud.dk/maintenance",
                "w",
            )]);
        let now = Some(t(100).strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
        assert_eq!(at(&[waiting]), now, "it tolerates the window: it may start");
    }
}
