//! The monitor's view of the cluster: every managed VolcanoJob, its pods, and every PodGroup (for
//! queue positions), fed by the watches and replaced by each full list.
//!
//! Objects are read into slim types ([`WatchedJob`], [`WatchedPod`]) that skip what the monitor never
//! reads (pod specs, task templates, managed fields), so a runner can hold tens of thousands of jobs.
//! The cache is owned by the monitor's loop alone; workers get cheap [`Snapshot`]s (`Arc`s).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodSchedulingGate, PodSpec, PodStatus, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::observe::Disruption;
use super::{inputs, observe};
use crate::durable::AnnotationKeys;
use crate::forecast::{self, Estimate, Node, Resources, Running};
use crate::volcano::{
    JobPhase, JobSpec, JobStatus, LABEL_JOB_NAME, LABEL_TASK_INDEX, PodGroup, PodGroupSpec,
    PodGroupStatus, TaskSpec, VolcanoJob,
};
use jiff::Timestamp;

pub use super::keys::{FastMap, FastSet, JobKey, KeyParts, ObjectKey, job_of_group, job_of_pod};

/// The resource traits of a slim read type from the full type it stands for, so that its watch and lists
/// ask the API for that kind while only the fields the monitor reads are deserialized.
macro_rules! reads_as {
    ($slim:ty, $full:ty) => {
        impl k8s_openapi::Resource for $slim {
            const API_VERSION: &'static str = <$full as k8s_openapi::Resource>::API_VERSION;
            const GROUP: &'static str = <$full as k8s_openapi::Resource>::GROUP;
            const KIND: &'static str = <$full as k8s_openapi::Resource>::KIND;
            const VERSION: &'static str = <$full as k8s_openapi::Resource>::VERSION;
            const URL_PATH_SEGMENT: &'static str =
                <$full as k8s_openapi::Resource>::URL_PATH_SEGMENT;
            type Scope = <$full as k8s_openapi::Resource>::Scope;
        }

        impl k8s_openapi::ListableResource for $slim {
            const LIST_KIND: &'static str = <$full as k8s_openapi::ListableResource>::LIST_KIND;
        }

        impl k8s_openapi::Metadata for $slim {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// A VolcanoJob as read from the API: metadata, the few spec fields the monitor uses, and status.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WatchedJob {
    #[serde(
        default,
        deserialize_with = "super::slim::meta::<super::slim::Whole, _>"
    )]
    pub metadata: ObjectMeta,
    #[serde(default)]
    spec: SlimJobSpec,
    #[serde(default)]
    status: Option<JobStatus>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimJobSpec {
    #[serde(default)]
    min_available: Option<i32>,
    #[serde(default)]
    queue: Option<String>,
    #[serde(default)]
    tasks: Vec<SlimTask>,
    /// Whether Volcano keeps the ended job by its TTL ([`crate::cluster::end::has_ttl`]).
    #[serde(default)]
    ttl_seconds_after_finished: Option<i32>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct SlimTask {
    #[serde(default)]
    name: String,
    #[serde(default)]
    replicas: i32,
}

impl WatchedJob {
    /// The job as the hooks take it (tasks without templates).
    pub fn into_job(mut self) -> VolcanoJob {
        self.metadata.managed_fields = None;
        VolcanoJob {
            metadata: self.metadata,
            spec: JobSpec {
                min_available: self.spec.min_available,
                queue: self.spec.queue,
                tasks: self
                    .spec
                    .tasks
                    .into_iter()
                    .map(|t| TaskSpec {
                        name: t.name,
                        replicas: t.replicas,
                        ..TaskSpec::default()
                    })
                    .collect(),
                ttl_seconds_after_finished: self.spec.ttl_seconds_after_finished,
                ..JobSpec::default()
            },
            status: self.status,
        }
    }
}

reads_as!(WatchedJob, VolcanoJob);

/// A Pod as read from the API: metadata and status, no spec.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WatchedPod {
    #[serde(
        default,
        deserialize_with = "super::slim::meta::<super::slim::PodReads, _>"
    )]
    pub metadata: ObjectMeta,
    /// Of the spec only the node it is bound to (what holds a node, for the start-time estimates).
    #[serde(default)]
    spec: Option<SlimPodSpec>,
    #[serde(default, deserialize_with = "super::slim::pod_status")]
    status: Option<PodStatus>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimPodSpec {
    #[serde(default)]
    node_name: Option<String>,
    /// Read for the peers' gate (see [`super::peers`]); absent on nearly every pod.
    #[serde(default)]
    scheduling_gates: Option<Vec<PodSchedulingGate>>,
    /// Read for the maintenance windows' taints (see [`super::maintenance`]); kept only while the pod
    /// waits to be placed (a placed pod's tolerations no longer matter).
    #[serde(default)]
    tolerations: Option<Vec<Toleration>>,
}

impl WatchedPod {
    /// Why it is being taken away, when its status says so (read before [`WatchedPod::into_pod`] drops
    /// the conditions).
    pub fn disruption(&self) -> Option<Disruption> {
        Disruption::said(
            self.metadata.labels.as_ref(),
            self.node_name(),
            self.status.as_ref().and_then(|s| s.conditions.as_deref()),
        )
    }

    /// The attempt of its job it runs in (Volcano's `volcano.sh/job-version`, from 0), when it says.
    pub fn attempt(&self) -> Option<i32> {
        self.metadata
            .annotations
            .as_ref()?
            .get(crate::volcano::ANNOTATION_JOB_VERSION)?
            .parse()
            .ok()
    }

    /// What its deletion tells without a condition: its rank and node.
    pub fn deleted(&self) -> Disruption {
        Disruption::deleted(self.metadata.labels.as_ref(), self.node_name())
    }

    fn node_name(&self) -> Option<&str> {
        self.spec.as_ref().and_then(|s| s.node_name.as_deref())
    }

    /// The pod as the monitor keeps it: of its metadata only what identifies it and the two Volcano
    /// labels read (its job and its rank; [`super::slim`] decoded no more); of its status everything
    /// decoded but conditions, which nothing reads once [`WatchedPod::disruption`] has.
    /// A runner holds one of these per rank of every job, so each byte counts ten-thousandfold.
    pub fn into_pod(mut self) -> Pod {
        self.metadata.annotations = None;
        if let Some(status) = &mut self.status {
            status.conditions = None;
            // Deserialized vectors of large elements start at four; a pod has one or two containers.
            for statuses in [
                &mut status.container_statuses,
                &mut status.init_container_statuses,
                &mut status.ephemeral_container_statuses,
            ]
            .into_iter()
            .flatten()
            {
                statuses.shrink_to_fit();
            }
        }
        let (node_name, gates, tolerations) = self
            .spec
            .map(|s| {
                let tolerations = s
                    .tolerations
                    .filter(|t| s.node_name.is_none() && !t.is_empty());
                (
                    s.node_name,
                    s.scheduling_gates.filter(|g| !g.is_empty()),
                    tolerations,
                )
            })
            .unwrap_or_default();
        Pod {
            metadata: self.metadata,
            spec: (node_name.is_some() || gates.is_some() || tolerations.is_some()).then(|| {
                PodSpec {
                    node_name,
                    scheduling_gates: gates,
                    tolerations,
                    ..PodSpec::default()
                }
            }),
            status: self.status,
        }
    }
}

reads_as!(WatchedPod, Pod);

/// A Node as read from the API: its name, whether it is cordoned and what it can hold (a node's status
/// lists its images and conditions too, tens of kilobytes the monitor never reads).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WatchedNode {
    #[serde(
        default,
        deserialize_with = "super::slim::meta::<super::slim::Whole, _>"
    )]
    pub metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<SlimNodeSpec>,
    #[serde(default)]
    status: Option<SlimNodeStatus>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct SlimNodeSpec {
    #[serde(default)]
    unschedulable: Option<bool>,
    /// For the node reservations (`[monitor] reserve_nodes`).
    #[serde(default)]
    taints: Option<Vec<k8s_openapi::api::core::v1::Taint>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct SlimNodeStatus {
    #[serde(default)]
    allocatable: Option<std::collections::BTreeMap<String, Quantity>>,
}

impl WatchedNode {
    /// The node as the estimates take it; `None` when it is cordoned. `reservation_key`: the taint
    /// that reserves it for a job ([`super::reserve::taint_key`]).
    pub fn to_node(&self, reservation_key: &str) -> Option<Node> {
        inputs::node(
            self.metadata.name.as_deref().unwrap_or_default(),
            self.spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            self.status.as_ref().and_then(|s| s.allocatable.as_ref()),
            super::reserve::reserved_for(&self.taints().taints, reservation_key),
        )
    }

    /// Its taints and version, for the node reservations.
    pub fn taints(&self) -> super::reserve::NodeTaints {
        super::reserve::NodeTaints {
            name: self.metadata.name.clone().unwrap_or_default(),
            resource_version: self.metadata.resource_version.clone(),
            taints: self
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default(),
        }
    }
}

reads_as!(WatchedNode, k8s_openapi::api::core::v1::Node);

/// A PodGroup as read from the API: its spec and status whole (a few small fields) and its metadata
/// without what the monitor never reads (see [`super::slim`]).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WatchedGroup {
    #[serde(
        default,
        deserialize_with = "super::slim::meta::<super::slim::GroupReads, _>"
    )]
    pub metadata: ObjectMeta,
    #[serde(default)]
    spec: PodGroupSpec,
    #[serde(default)]
    status: Option<PodGroupStatus>,
}

impl WatchedGroup {
    /// The PodGroup as the cache and the decisions take it.
    pub fn into_group(self) -> PodGroup {
        PodGroup {
            metadata: self.metadata,
            spec: self.spec,
            status: self.status,
        }
    }
}

reads_as!(WatchedGroup, PodGroup);

/// A pod as the cache holds it: a [`Pod`] without the spec (whose inline size alone is 1.4 KB, even
/// empty) and without the labels map (a B-tree node of over half a kilobyte for two labels). Its job is
/// the key it is filed under; its rank label is kept as a string. Made back into a [`Pod`] only for the
/// snapshot of a job being decided.
#[derive(Debug, Clone)]
struct CachedPod {
    metadata: ObjectMeta,
    task_index: Option<String>,
    /// The node it is bound to.
    node: Option<String>,
    /// Its scheduling gates, while it has any.
    gates: Option<Vec<PodSchedulingGate>>,
    /// Its tolerations, while it waits to be placed (see [`super::maintenance`]).
    tolerations: Option<Vec<Toleration>>,
    status: Option<PodStatus>,
}

impl CachedPod {
    fn new(pod: Pod) -> Self {
        let mut metadata = pod.metadata;
        let task_index = metadata
            .labels
            .take()
            .and_then(|mut l| l.remove(LABEL_TASK_INDEX));
        Self {
            metadata,
            task_index,
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            gates: pod.spec.as_ref().and_then(|s| s.scheduling_gates.clone()),
            tolerations: pod
                .spec
                .and_then(|s| s.tolerations.filter(|_| s.node_name.is_none())),
            status: pod.status,
        }
    }

    /// The pod as the decision reads it, with the two Volcano labels back.
    fn to_pod(&self, job: &str) -> Pod {
        let mut labels =
            std::collections::BTreeMap::from([(LABEL_JOB_NAME.to_owned(), job.to_owned())]);
        if let Some(index) = &self.task_index {
            labels.insert(LABEL_TASK_INDEX.to_owned(), index.clone());
        }
        let mut metadata = self.metadata.clone();
        metadata.labels = Some(labels);
        Pod {
            metadata,
            // The node too: a window over some nodes cuts the jobs on them ([`super::maintenance`]).
            spec: (self.gates.is_some() || self.node.is_some() || self.tolerations.is_some()).then(
                || PodSpec {
                    node_name: self.node.clone(),
                    scheduling_gates: self.gates.clone(),
                    tolerations: self.tolerations.clone(),
                    ..PodSpec::default()
                },
            ),
            status: self.status.clone(),
        }
    }
}

/// Whether a pod has finished (`Succeeded` or `Failed`): its phase never changes again, and the
/// monitor's pod lists leave it out (see [`super::live_pods`]).
pub fn pod_finished(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed")
}

/// Whether `new` is at least as recent as `old`. Resource versions are opaque, but every API server in
/// practice uses increasing integers; when either does not parse, the newer arrival wins.
pub fn is_newer(new: Option<&str>, old: Option<&str>) -> bool {
    Rv::from(new).at_least(Rv::from(old))
}

/// A resourceVersion as the reconciliation compares it, read once. Every API server we know of writes a
/// number (etcd's revision); the API calls it opaque, so one that is not a number is kept as unknown and
/// never taken as proof that the cache is behind (a watch started over for it would start over forever).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rv(Option<u64>);

impl Rv {
    pub fn parse(rv: &str) -> Self {
        Self(rv.parse().ok())
    }

    /// Whether `self` is `other` or later, or either is unknown (the newer arrival wins).
    pub fn at_least(self, other: Rv) -> bool {
        match (self.0, other.0) {
            (Some(a), Some(b)) => a >= b,
            _ => true,
        }
    }

    /// Whether `self` is provably later than `other` (false when either is unknown).
    pub fn later_than(self, other: Rv) -> bool {
        match (self.0, other.0) {
            (Some(a), Some(b)) => a > b,
            _ => false,
        }
    }
}

impl From<Option<&str>> for Rv {
    fn from(rv: Option<&str>) -> Self {
        rv.map_or(Rv(None), Rv::parse)
    }
}

/// One object's share of its kind's digest: its namespace, name and version, hashed. A kind's digest is
/// the wrapping sum of its objects' shares, so it is the same whatever the order, and an object changes
/// it by taking its old share out and putting its new one in.
pub fn share(namespace: &str, name: &str, rv: Rv) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut h = foldhash::quality::FixedState::with_seed(0x7b1d_5eed).build_hasher();
    namespace.hash(&mut h);
    name.hash(&mut h);
    rv.0.hash(&mut h);
    h.finish()
}

/// Everything a worker needs about one job.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub key: JobKey,
    pub job: Arc<VolcanoJob>,
    pub pods: Arc<Vec<Pod>>,
    pub podgroup: Option<Arc<PodGroup>>,
    pub jobs_ahead: Option<u32>,
    /// When it will start, while it waits (from the last [`Cache::estimate_starts`]).
    pub estimate: Option<Arc<Estimate>>,
    /// It waits and will have an estimate, but the estimates were last made before its PodGroup came:
    /// its status waits for them (they come within seconds), rather than go out twice.
    pub estimate_pending: bool,
    /// The last disruption of its ranks the watch saw, with the attempt it ended (from 0; see
    /// [`Cache::note_disruption`]).
    pub disruption: Option<(i32, Disruption)>,
    /// What this snapshot is, for deciding whether a job needs deciding again.
    pub fingerprint: Fingerprint,
    /// When the cache saw the job enter its current phase, by the monitor's clock (see
    /// [`Cache::with_clock`]; `None` without one, or for a job that came to the cache in this phase):
    /// see [`super::decide::Observed::phase_seen`].
    pub phase_seen: Option<Timestamp>,
    /// Its peers as the watches show them (none for a job without).
    pub peers: Arc<Vec<super::peers::PeerSeen>>,
}

/// What a decision about a job was made on: the cache's generation of the job's view (a fresh one
/// whenever the job, one of its pods or its PodGroup changes to another version) and its place in its
/// queue (which other jobs move). Equal fingerprints, equal decisions, until the next deadline in the
/// clock's time, which has a timer of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    generation: u64,
    jobs_ahead: Option<u32>,
    /// The estimated start in seconds (`i64::MIN`: never, `i64::MIN + 1`: no bound).
    estimate: Option<i64>,
}

/// Which kind of object an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Jobs,
    Pods,
    Groups,
}

#[derive(Debug)]
struct Entry<T> {
    value: T,
    /// The list (epoch) it was last seen in, to drop what a fresh list no longer has.
    epoch: u64,
}

/// A job held, with its view's generation (see [`Fingerprint`]) beside it: a reconciliation pass reads
/// every job's fingerprint, and one lookup per job is cheaper than one in a second map of 10,000.
#[derive(Debug)]
struct JobEntry {
    value: Arc<VolcanoJob>,
    /// As [`Entry::epoch`].
    epoch: u64,
    generation: u64,
    /// When the cache first held the job in its current phase (see [`Snapshot::phase_seen`]).
    phase_seen: Option<Timestamp>,
}

type GroupKey = ObjectKey;

/// The cache. See the module documentation.
#[derive(Debug, Default)]
pub struct Cache {
    jobs: FastMap<JobKey, JobEntry>,
    pods: FastMap<JobKey, Vec<CachedPod>>,
    /// `(namespace, pod)` → its job, the epoch it was last seen in, its version (the reconciliation
    /// compares every pod's version each pass: one lookup, not a search of its job's ranks) and whether
    /// it has finished (see [`pod_finished`]).
    pod_index: FastMap<ObjectKey, (JobKey, u64, Rv, bool)>,
    /// How many of the pods held have finished: the pod lists leave them out (see
    /// [`super::live_pods`]), so the reconciliation compares the others only.
    finished_pods: usize,
    groups: FastMap<GroupKey, Entry<Arc<PodGroup>>>,
    group_of_job: FastMap<JobKey, GroupKey>,
    /// The waiting PodGroups of each queue in queue order, kept up to date with every change, so that a
    /// job's position is a count and not a sort of every group on every event (which made the monitor
    /// quadratic in the number of pending jobs).
    waiting: Waiting,
    epochs: [u64; 3],
    /// Per kind, the digest of every object held (see [`share`]): when a metadata list has the same count
    /// and digest, the reconciliation has nothing to compare object by object.
    digests: [u64; 3],
    /// The annotation that records a job's replicas. A job that has it is kept without its tasks: in
    /// monitoring, tasks are read only for the replicas when that annotation is missing, and each task
    /// carries a whole pod template (nearly 2 KB even when empty).
    replicas_key: Option<String>,
    /// The last view generation handed out (see [`Fingerprint`]; each job's is in its entry).
    last_generation: u64,
    /// The start-time estimate of each waiting PodGroup, as of the last [`Cache::estimate_starts`].
    estimates: FastMap<GroupKey, Arc<Estimate>>,
    /// Whether the last [`Cache::estimate_starts`] had nodes to place on (without, there are none).
    estimating: bool,
    /// The first expectation (an estimate the scheduler does not reserve for) made for each waiting
    /// PodGroup, and of those made for PodGroups that have started since: how many started by then,
    /// and how many there were. The record is told with every expectation, so that a person can judge one.
    expected: FastMap<GroupKey, Timestamp>,
    expectations_held: u64,
    expectations_kept: u64,
    /// The last disruption of each job's ranks seen by the watch: the attempt it ended, whether the pod
    /// said why (a `DisruptionTarget` condition), and what it said.
    disruptions: FastMap<JobKey, (i32, bool, Disruption)>,
    /// The annotation that lists a job's peers (see [`Cache::with_peers_key`]).
    peers_key: Option<String>,
    /// By peer: the jobs that name it as their peer. A change of the peer or of its pods is a change of
    /// theirs (they are decided again, see [`Cache::touch_dependents`]).
    dependents: FastMap<JobKey, FastSet<JobKey>>,
    /// The maintenance windows the replay takes into account (see [`Cache::set_maintenance_windows`]).
    maintenance_windows: Option<crate::cluster::Windows>,
    /// See [`Cache::set_maintenance_tainted`].
    maintenance_tainted: Arc<BTreeSet<String>>,
    /// See [`Cache::set_booked_nodes`].
    booked_nodes: BTreeMap<String, Timestamp>,
    /// `[monitor] reserve_nodes` (see [`Cache::with_reserve_nodes`]).
    reserve_nodes: bool,
    /// `[monitor] proportion` (see [`Cache::with_proportion`]).
    proportion: bool,
    /// `[monitor] start_margin` (see [`Cache::with_start_margin`]).
    start_margin: jiff::SignedDuration,
    /// The Volcano Queues whose `dequeueStrategy` is `fifo` (see [`Cache::set_fifo_queues`]).
    fifo_queues: BTreeSet<String>,
    /// `[monitor] queue_timeout` (see [`Cache::with_queue_timeout`]).
    queue_timeout: Option<jiff::SignedDuration>,
    /// What the last [`Cache::estimate_starts`] found for the node reservations.
    reservations: Reservations,
    /// The waiting gangs the last replay reserves nodes for now (their taints not yet written).
    reserving_now: Vec<GroupKey>,
    /// The gangs whose estimate was held back while their nodes were being reserved (once each).
    held_for_reservation: FastSet<GroupKey>,
    /// The last watch event of each job a worker had in hand when it came (see
    /// [`Cache::take_watched`]), kept aside until the worker's answer is in ([`Cache::release_held`]).
    held: FastMap<JobKey, WatchedJob>,
    /// The monitor's clock, for when a job was first held in its phase (see [`Cache::with_clock`]).
    clock: Option<Arc<dyn super::clock::Clock>>,
}

/// What became of a job's watch event (see [`Cache::take_watched`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Intake {
    /// The job at the version held already (the echo of a worker's write, see [`Cache::seen_again`]):
    /// nothing new, nothing to decide.
    Echo,
    /// Kept aside: the job's worker may be writing it, and the event may be the echo of that write,
    /// which only the worker's answer can tell.
    Held,
    /// Stored (unless older than the job held, see [`Cache::apply_job`]); `news`: its version was not
    /// the one held. The job, and the jobs that read it as their peer, are decided again.
    Stored { key: JobKey, news: bool },
}

/// For [`super::reserve::plan`], from the last replay: the job ids of the waiting gangs that reserve
/// nodes, and the nodes (by name) each gang reserves now.
#[derive(Debug, Clone, Default)]
pub struct Reservations {
    pub reserving: std::collections::HashSet<String>,
    pub reserve_now: Vec<(String, Vec<String>)>,
}

/// A waiting PodGroup's place in its queue: earlier creation first, then namespace and name.
type WaitKey = (Option<jiff::Timestamp>, Arc<str>, Arc<str>);

/// The waiting PodGroups by queue, and where each one is filed.
#[derive(Debug, Default)]
struct Waiting {
    by_queue: FastMap<String, BTreeSet<WaitKey>>,
    filed: FastMap<GroupKey, (String, WaitKey)>,
}

impl Waiting {
    /// Files `pg` (under `gkey`) by its current phase: in its queue while it waits, nowhere otherwise.
    fn update(&mut self, gkey: &GroupKey, pg: &PodGroup) {
        self.remove(gkey);
        if !observe::is_waiting(pg) {
            return;
        }
        let queue = observe::queue_of(pg);
        let key: WaitKey = (
            pg.metadata.creation_timestamp.as_ref().map(|t| t.0),
            gkey.namespace.clone(),
            gkey.name.clone(),
        );
        self.by_queue
            .entry(queue.clone())
            .or_default()
            .insert(key.clone());
        self.filed.insert(gkey.clone(), (queue, key));
    }

    fn remove(&mut self, gkey: &GroupKey) {
        if let Some((queue, key)) = self.filed.remove(gkey)
            && let Some(set) = self.by_queue.get_mut(&queue)
        {
            set.remove(&key);
            if set.is_empty() {
                self.by_queue.remove(&queue);
            }
        }
    }

    /// Waiting groups ahead of `gkey` in its queue; `None` when it is not waiting.
    fn ahead_of(&self, gkey: &GroupKey) -> Option<u32> {
        let (queue, key) = self.filed.get(gkey)?;
        let ahead = self.by_queue.get(queue)?.range(..key).count();
        Some(u32::try_from(ahead).unwrap_or(u32::MAX))
    }
}

/// An object's version as the digests and the reconciliation compare it.
fn rv_of(meta: &ObjectMeta) -> Rv {
    Rv::from(meta.resource_version.as_deref())
}

fn slot(kind: Kind) -> usize {
    match kind {
        Kind::Jobs => 0,
        Kind::Pods => 1,
        Kind::Groups => 2,
    }
}

impl Cache {
    pub fn new() -> Self {
        Self::default()
    }

    /// A cache that keeps jobs annotated with `replicas_key` without their tasks.
    pub fn with_replicas_key(replicas_key: impl Into<String>) -> Self {
        Self {
            replicas_key: Some(replicas_key.into()),
            ..Self::default()
        }
    }

    /// Notes by `clock` when each job is first held in its phase ([`Snapshot::phase_seen`]): a monitor
    /// that sees a phase late waits for the pods' events from then, not from Volcano's transition.
    pub fn with_clock(mut self, clock: Arc<dyn super::clock::Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// When a job that enters the cache as `job` under `key` was first held in its phase: as before while
    /// its phase stays (the job held there keeps when it was first held in its phase), now when it changes.
    /// `None` for a job new to the cache (a list, a takeover, a job first seen late): its pods' events
    /// may have come before it, and a finished pod of a job not held is not taken in, so the pods it
    /// lacks may never come; its wait counts from Volcano's transition, as before.
    fn phase_seen(&self, key: &JobKey, job: &VolcanoJob) -> Option<Timestamp> {
        match self.jobs.get(key) {
            Some(held) if held.value.phase() == job.phase() => held.phase_seen,
            Some(_) => self.clock.as_ref().map(|c| c.now()),
            None => None,
        }
    }

    /// Waiting whole-node and large gangs with a waiting time get nodes reserved
    /// (`[monitor] reserve_nodes`, [`super::reserve`]): the replay models it, and
    /// [`Cache::reservations`] says what to reserve.
    pub fn with_reserve_nodes(mut self, reserve_nodes: bool) -> Self {
        self.reserve_nodes = reserve_nodes;
        self
    }

    /// The scheduler runs Volcano's `proportion` plugin (`[monitor] proportion`): while jobs of more than
    /// one queue wait or run, estimates are expectations ([`forecast::across_queues`]).
    pub fn with_proportion(mut self, proportion: bool) -> Self {
        self.proportion = proportion;
        self
    }

    /// A job is taken to start this long after the replay frees its resources (`[monitor]
    /// start_margin`: the time the scheduler takes to place it, see [`forecast::replay_with`]).
    pub fn with_start_margin(mut self, start_margin: jiff::SignedDuration) -> Self {
        self.start_margin = start_margin;
        self
    }

    /// The runner fails a job that has not started this long after its creation (`[monitor]
    /// queue_timeout`): the replay takes it out of its queue then ([`forecast::Pending::gives_up_at`]).
    pub fn with_queue_timeout(mut self, queue_timeout: Option<jiff::SignedDuration>) -> Self {
        self.queue_timeout = queue_timeout;
        self
    }

    /// The Queues that are `fifo` now (from the monitor's Queue watch): the replay keeps their order.
    pub fn set_fifo_queues(&mut self, fifo: BTreeSet<String>) {
        self.fifo_queues = fifo;
    }

    /// The node reservations the last [`Cache::estimate_starts`] found.
    pub fn reservations(&self) -> &Reservations {
        &self.reservations
    }

    /// Also indexes jobs by the peers their `peers_key` annotation names, for [`Snapshot::peers`].
    pub fn with_peers_key(mut self, peers_key: impl Into<String>) -> Self {
        self.peers_key = Some(peers_key.into());
        self
    }

    /// The peers a job's annotation names, `(hostname, job id)`.
    fn peers_named<'j>(&self, job: &'j VolcanoJob) -> Vec<(&'j str, &'j str)> {
        self.peers_key
            .as_ref()
            .and_then(|k| job.metadata.annotations.as_ref()?.get(k))
            .map(|v| crate::pipeline::plugins::connect_to_job::parse_peers(v))
            .unwrap_or_default()
    }

    fn index_peers(&mut self, key: &JobKey, job: &VolcanoJob, add: bool) {
        let peers: Vec<JobKey> = self
            .peers_named(job)
            .into_iter()
            .map(|(_, id)| JobKey::new(&key.namespace, &crate::pipeline::names::vcjob_name(id)))
            .collect();
        for peer in peers {
            if add {
                self.dependents.entry(peer).or_default().insert(key.clone());
            } else if let Some(set) = self.dependents.get_mut(&peer) {
                set.remove(key);
                if set.is_empty() {
                    self.dependents.remove(&peer);
                }
            }
        }
    }

    /// The job `key` (or one of its pods) changed or went: the jobs that have it as their peer are
    /// decided again. Returns them.
    pub fn touch_dependents(&mut self, key: &JobKey) -> Vec<JobKey> {
        let Some(set) = self.dependents.get(key) else {
            return Vec::new();
        };
        let dependents: Vec<JobKey> = set.iter().cloned().collect();
        for d in &dependents {
            self.touch(d);
        }
        dependents
    }

    /// What the watches show of each peer a job names.
    fn peers_seen(&self, key: &JobKey, job: &VolcanoJob) -> Vec<super::peers::PeerSeen> {
        self.peers_named(job)
            .into_iter()
            .map(|(hostname, id)| {
                let pkey = JobKey::new(&key.namespace, &crate::pipeline::names::vcjob_name(id));
                let rank0 = crate::pipeline::names::pod_name(id, 0);
                let rank0_address = self
                    .pods
                    .get(&pkey)
                    .and_then(|pods| {
                        pods.iter()
                            .find(|p| p.metadata.name.as_deref() == Some(rank0.as_str()))
                    })
                    .and_then(|p| p.status.as_ref())
                    .filter(|st| st.phase.as_deref() == Some("Running"))
                    .and_then(|st| st.pod_ip.clone())
                    .filter(|ip| !ip.is_empty());
                super::peers::PeerSeen {
                    hostname: hostname.to_owned(),
                    job_id: id.to_owned(),
                    job: self.jobs.get(&pkey).map(|e| e.value.clone()),
                    rank0_address,
                }
            })
            .collect()
    }

    /// Number of jobs held.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    pub fn job(&self, key: &JobKey) -> Option<&Arc<VolcanoJob>> {
        self.jobs.get(key).map(|e| &e.value)
    }

    pub fn pods(&self, key: &JobKey) -> Arc<Vec<Pod>> {
        let pods = self
            .pods
            .get(key)
            .map(|pods| pods.iter().map(|p| p.to_pod(&key.name)).collect::<Vec<_>>());
        Arc::new(pods.unwrap_or_default())
    }

    /// An object of `kind` is held at `new` instead of `old` (`None`: not held).
    fn redigest(&mut self, kind: Kind, key: &ObjectKey, old: Option<Rv>, new: Option<Rv>) {
        let d = &mut self.digests[slot(kind)];
        if let Some(old) = old {
            *d = d.wrapping_sub(share(&key.namespace, &key.name, old));
        }
        if let Some(new) = new {
            *d = d.wrapping_add(share(&key.namespace, &key.name, new));
        }
    }

    /// The digest of every object of `kind` held (see [`share`]).
    pub fn digest(&self, kind: Kind) -> u64 {
        self.digests[slot(kind)]
    }

    /// A generation no view has had.
    fn next_generation(&mut self) -> u64 {
        self.last_generation += 1;
        self.last_generation
    }

    /// The job's view changed: it gets a generation no view has had. A job not held yet gets its own
    /// when it comes.
    fn touch(&mut self, key: &JobKey) {
        let g = self.next_generation();
        if let Some(entry) = self.jobs.get_mut(key) {
            entry.generation = g;
        }
    }

    /// A fresh list of `kind` starts: what it does not contain is dropped at [`Cache::init_done`]. A job
    /// event held from before (see [`Cache::take_watched`]) may be of a job the list no longer has, and
    /// the list brings every job as it is now: it is dropped.
    pub fn init_start(&mut self, kind: Kind) {
        self.epochs[slot(kind)] += 1;
        if kind == Kind::Jobs {
            self.held.clear();
        }
    }

    /// A job as its watch brings it. The echo of a worker's write whose answer is held already is
    /// nothing new ([`Intake::Echo`]). While `in_hand` says a worker has the job, the event is kept
    /// aside until [`Cache::release_held`] ([`Intake::Held`], the last one: each holds the whole job):
    /// it may be the echo of the write that worker is making, known for one only once its answer is in,
    /// and stored before that it would have the job decided again for nothing. Otherwise it is stored
    /// as [`Cache::apply_job`] stores it.
    pub fn take_watched(&mut self, w: WatchedJob, in_hand: impl FnOnce(&JobKey) -> bool) -> Intake {
        if self.seen_again(&w.metadata) {
            return Intake::Echo;
        }
        let key = JobKey::of(&w.metadata);
        if in_hand(&key) {
            self.held.insert(key, w);
            return Intake::Held;
        }
        self.take_listed(w)
    }

    /// A job as a list shows it (or a watch event not held): stored as [`Cache::apply_job`] stores it.
    pub fn take_listed(&mut self, w: WatchedJob) -> Intake {
        let news = !self.holds_version(Kind::Jobs, &w.metadata);
        let key = self.apply_job(w.into_job());
        Intake::Stored { key, news }
    }

    /// The worker that had `key` in hand is done, its answer kept ([`Cache::refresh_job`]): the event
    /// held meanwhile, if any, is taken in now, an echo of that answer as such.
    pub fn release_held(&mut self, key: &JobKey) -> Option<Intake> {
        let w = self.held.remove(key)?;
        Some(if self.seen_again(&w.metadata) {
            Intake::Echo
        } else {
            self.take_listed(w)
        })
    }

    /// A job from the watch or a list. Returns its key. What was held of it (see
    /// [`Cache::take_watched`]) is older, and dropped.
    pub fn apply_job(&mut self, mut job: VolcanoJob) -> JobKey {
        let key = JobKey::of(&job.metadata);
        self.held.remove(&key);
        let epoch = self.epochs[0];
        // A watch event older than what a worker wrote (an update the watch delivers after the answer
        // to our own patch) does not replace it: the job would be decided again on annotations that no
        // longer hold, and what was just published and recorded (the end, its final tick) would go out
        // a second time before the guarded write found out.
        if let Some(entry) = self.jobs.get_mut(&key)
            && entry.value.metadata.resource_version != job.metadata.resource_version
            && entry.value.metadata.uid == job.metadata.uid
            && let (Some(cached), Some(arrived)) = (
                Rv::from(entry.value.metadata.resource_version.as_deref()).0,
                Rv::from(job.metadata.resource_version.as_deref()).0,
            )
            && cached > arrived
        {
            entry.epoch = epoch;
            return key;
        }
        self.slim_job(&mut job);
        if self.peers_key.is_some() {
            if let Some(old) = self.jobs.get(&key).map(|e| e.value.clone()) {
                self.index_peers(&key, &old, false);
            }
            self.index_peers(&key, &job, true);
        }
        let generation = match self.jobs.get(&key) {
            Some(e) if e.value.metadata.resource_version == job.metadata.resource_version => {
                e.generation
            }
            _ => self.next_generation(),
        };
        let phase_seen = self.phase_seen(&key, &job);
        let new = rv_of(&job.metadata);
        let old = self.jobs.insert(
            key.clone(),
            JobEntry {
                value: Arc::new(job),
                epoch,
                generation,
                phase_seen,
            },
        );
        self.redigest(
            Kind::Jobs,
            &key,
            old.map(|e| rv_of(&e.value.metadata)),
            Some(new),
        );
        key
    }

    /// Drops from a job what the monitor never reads: labels, managed fields, Volcano's per-task counts,
    /// controlled resources and conditions other than its restarts (the refund of a lost attempt is
    /// measured by them; a job that never restarted keeps none), and (when the replicas are annotated)
    /// the tasks, each of which carries a whole pod template.
    fn slim_job(&self, job: &mut VolcanoJob) {
        job.metadata.labels = None;
        job.metadata.managed_fields = None;
        if let Some(replicas) = &self.replicas_key
            && job
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(replicas))
        {
            job.spec.tasks = Vec::new();
        }
        if let Some(status) = &mut job.status {
            status
                .conditions
                .retain(|c| c.status == crate::volcano::JobPhase::Restarting);
            status.task_status_count.clear();
            status.controlled_resources.clear();
        }
    }

    /// The watch brings a job at the version the cache holds (the echo of a worker's write, whose
    /// answer [`Cache::refresh_job`] put here): nothing about it is new, so it is not slimmed and stored
    /// again, and its view keeps its generation. Returns `false` (nothing done) for any other version.
    /// The version names the object's content (one per write in the whole store), so an equal one
    /// is the same job.
    pub fn seen_again(&mut self, meta: &ObjectMeta) -> bool {
        let epoch = self.epochs[0];
        let key: &dyn KeyParts = &(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        );
        match self.jobs.get_mut(key) {
            Some(entry)
                if meta.resource_version.is_some()
                    && entry.value.metadata.resource_version == meta.resource_version
                    && entry.value.metadata.uid == meta.uid =>
            {
                entry.epoch = epoch;
                true
            }
            _ => false,
        }
    }

    /// The job's current [`Fingerprint`], `None` when it is not held.
    pub fn fingerprint(&self, key: &JobKey) -> Option<Fingerprint> {
        let entry = self.jobs.get(key)?;
        Some(self.fingerprint_of(key, entry))
    }

    /// A job a worker wrote (the API's answer to a patch): kept unless the cache already has a newer one.
    /// Returns whether it was kept (the job's view has a new generation).
    pub fn refresh_job(&mut self, job: Arc<VolcanoJob>) -> bool {
        let key = JobKey::of(&job.metadata);
        if let Some(entry) = self.jobs.get(&key)
            // The job a worker read and left unchanged is the cached one: copying it back would only
            // clone it (this is every settled job, every pass).
            && !Arc::ptr_eq(&entry.value, &job)
            && entry.value.metadata.resource_version != job.metadata.resource_version
            && is_newer(
                job.metadata.resource_version.as_deref(),
                entry.value.metadata.resource_version.as_deref(),
            )
        {
            let mut job = Arc::unwrap_or_clone(job);
            self.slim_job(&mut job);
            // Its watch event is not stored again (see `seen_again`): the peers it names are indexed
            // here.
            if self.peers_key.is_some() {
                if let Some(old) = self.jobs.get(&key).map(|e| e.value.clone()) {
                    self.index_peers(&key, &old, false);
                }
                self.index_peers(&key, &job, true);
            }
            let phase_seen = self.phase_seen(&key, &job);
            let Some(entry) = self.jobs.get_mut(&key) else {
                return false;
            };
            let (old, new) = (rv_of(&entry.value.metadata), rv_of(&job.metadata));
            entry.value = Arc::new(job);
            entry.phase_seen = phase_seen;
            self.redigest(Kind::Jobs, &key, Some(old), Some(new));
            self.touch(&key);
            return true;
        }
        false
    }

    /// A job was deleted, or left the job watch (its end recorded): returns its last state and its pods.
    /// Its finished pods go with it: Volcano keeps them until the job's TTL, no list has them (see
    /// [`super::live_pods`]) and no event may come for them before their deletion, so nothing else
    /// would drop them. Pods not finished stay until their own deletion (a job deleted and created
    /// again under its name may already have new ones).
    pub fn remove_job(&mut self, key: &JobKey) -> Option<(Arc<VolcanoJob>, Arc<Vec<Pod>>)> {
        // An event held for it came before its deletion.
        self.held.remove(key);
        let job = self.jobs.remove(key)?.value;
        self.index_peers(key, &job, false);
        self.redigest(Kind::Jobs, key, Some(rv_of(&job.metadata)), None);
        self.disruptions.remove(key);
        let pods = self.pods(key);
        let finished: Vec<&str> = pods
            .iter()
            .filter(|p| pod_finished(p))
            .filter_map(|p| p.metadata.name.as_deref())
            .collect();
        for name in finished {
            self.remove_pod(&key.namespace, name);
        }
        Some((job, pods))
    }

    /// A rank's pod is being taken away (`said`: its status says why) or was deleted. Kept when its job
    /// runs and is not being deleted (a plain deletion only while Volcano has the job `Running`: the
    /// pods Volcano itself removes to restart or end a job are no disruption), one per restart of the
    /// job, a said reason over a plain deletion. The job is decided again.
    ///
    /// `attempt`: the attempt the pod ran in, from the pod itself (Volcano's job version on it). The
    /// job's `retryCount` as the watch has it is only a guess (used when the pod does not say): the job's
    /// watch may bring Volcano's restart before the pods' watch brings the pod that caused it, and the
    /// disruption was then taken for the next attempt's, and the next attempt's own one dropped as a
    /// second one of the same restart: the next restart named the node lost the time before.
    pub fn note_disruption(
        &mut self,
        key: &JobKey,
        d: Disruption,
        said: bool,
        attempt: Option<i32>,
    ) {
        let Some(job) = self.job(key) else {
            return;
        };
        let phase = job.phase();
        if job.metadata.deletion_timestamp.is_some()
            || phase.is_ending()
            || (!said && phase != JobPhase::Running)
        {
            return;
        }
        let generation = attempt.unwrap_or_else(|| job.retries());
        if let Some((g, s, _)) = self.disruptions.get(key)
            && *g == generation
            && (*s || !said)
        {
            return;
        }
        self.disruptions.insert(key.clone(), (generation, said, d));
        self.touch(key);
    }

    /// A pod from the watch or a list. Returns its job (`None`: not held).
    ///
    /// A finished pod is held only while its job is: one whose job is not held belongs to an ended job
    /// (left the job watch, see [`crate::cluster::labels::ENDED`]), and it is dropped if held. (A job not
    /// listed yet when its pod finished, as a monitor starts, reads its pods at its end: the decision
    /// reads them afresh when Volcano's phase is ahead of the pods it holds.)
    pub fn apply_pod(&mut self, pod: Pod) -> Option<JobKey> {
        let key = job_of_pod(&pod)?;
        let name: Arc<str> = pod.metadata.name.as_deref().unwrap_or_default().into();
        let finished = pod_finished(&pod);
        if finished && !self.jobs.contains_key(&key) {
            self.remove_pod(&key.namespace, &name);
            return None;
        }
        let epoch = self.epochs[1];
        let version = rv_of(&pod.metadata);
        let pkey = ObjectKey {
            namespace: key.namespace.clone(),
            name: name.clone(),
        };
        // The digest follows what the pod lists have: the pods not finished.
        let old = self.pod_index.get(&pkey).map(|(_, _, v, f)| (*v, *f));
        self.redigest(
            Kind::Pods,
            &pkey,
            old.filter(|(_, f)| !f).map(|(v, _)| v),
            (!finished).then_some(version),
        );
        let was_finished = old.is_some_and(|(_, f)| f);
        self.finished_pods = self.finished_pods + usize::from(finished) - usize::from(was_finished);
        self.pod_index
            .insert(pkey, (key.clone(), epoch, version, finished));
        let pod = CachedPod::new(pod);
        let pods = self.pods.entry(key.clone()).or_default();
        let changed = match pods
            .iter_mut()
            .find(|p| p.metadata.name.as_deref() == Some(&*name))
        {
            Some(old) => {
                let changed = old.metadata.resource_version != pod.metadata.resource_version;
                *old = pod;
                changed
            }
            None => {
                pods.push(pod);
                pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
                // A Vec grows to four at its first push; most jobs have one pod.
                pods.shrink_to_fit();
                true
            }
        };
        if changed {
            self.touch(&key);
        }
        Some(key)
    }

    /// A pod was deleted. Returns its job.
    pub fn remove_pod(&mut self, namespace: &str, name: &str) -> Option<JobKey> {
        let pkey = ObjectKey::new(namespace, name);
        let (key, _, version, finished) = self.pod_index.remove(&pkey)?;
        if finished {
            self.finished_pods -= 1;
        } else {
            self.redigest(Kind::Pods, &pkey, Some(version), None);
        }
        if let Some(pods) = self.pods.get_mut(&key) {
            pods.retain(|p| p.metadata.name.as_deref() != Some(name));
            if pods.is_empty() {
                self.pods.remove(&key);
            }
        }
        self.touch(&key);
        Some(key)
    }

    /// A PodGroup from the watch or a list. Returns its job, when it has one.
    pub fn apply_group(&mut self, mut pg: PodGroup) -> Option<JobKey> {
        // Read: name, namespace, owner, creation time, version, spec and status; never the rest.
        pg.metadata.managed_fields = None;
        pg.metadata.annotations = None;
        pg.metadata.labels = None;
        if let Some(status) = &mut pg.status {
            status.conditions.shrink_to_fit();
        }
        let gkey = ObjectKey::of(&pg.metadata);
        let job = job_of_group(&pg);
        if let Some(job) = &job {
            self.group_of_job.insert(job.clone(), gkey.clone());
            let changed = self
                .groups
                .get(&gkey)
                .is_none_or(|e| e.value.metadata.resource_version != pg.metadata.resource_version);
            if changed {
                self.touch(job);
            }
        }
        let epoch = self.epochs[2];
        self.waiting.update(&gkey, &pg);
        let new = rv_of(&pg.metadata);
        let old = self.groups.insert(
            gkey.clone(),
            Entry {
                value: Arc::new(pg),
                epoch,
            },
        );
        self.redigest(
            Kind::Groups,
            &gkey,
            old.map(|e| rv_of(&e.value.metadata)),
            Some(new),
        );
        job
    }

    /// Drops a PodGroup from the map (and the digest); its other records are the caller's.
    fn forget_group(&mut self, gkey: &GroupKey) -> Option<Entry<Arc<PodGroup>>> {
        let entry = self.groups.remove(gkey)?;
        self.redigest(Kind::Groups, gkey, Some(rv_of(&entry.value.metadata)), None);
        Some(entry)
    }

    /// A PodGroup was deleted. Returns its job.
    pub fn remove_group(&mut self, pg: &PodGroup) -> Option<JobKey> {
        let gkey = ObjectKey::of(&pg.metadata);
        self.forget_group(&gkey);
        self.waiting.remove(&gkey);
        let job = job_of_group(pg)?;
        if self.group_of_job.get(&job) == Some(&gkey) {
            self.group_of_job.remove(&job);
        }
        self.touch(&job);
        Some(job)
    }

    /// The fresh list of `kind` is complete: drops what it did not contain. Returns the jobs affected:
    /// for [`Kind::Jobs`] the jobs that are gone (with their last state and pods); for the others, the
    /// jobs whose pods or PodGroup went away (with their current state).
    pub fn init_done(&mut self, kind: Kind) -> Vec<(JobKey, Arc<VolcanoJob>, Arc<Vec<Pod>>)> {
        let epoch = self.epochs[slot(kind)];
        match kind {
            Kind::Jobs => {
                let stale: Vec<JobKey> = self
                    .jobs
                    .iter()
                    .filter(|(_, e)| e.epoch < epoch)
                    .map(|(k, _)| k.clone())
                    .collect();
                stale
                    .into_iter()
                    .filter_map(|k| {
                        let (job, pods) = self.remove_job(&k)?;
                        Some((k, job, pods))
                    })
                    .collect()
            }
            Kind::Pods => {
                // Finished pods are not listed (see [`super::live_pods`]): they stay with their job.
                let stale: Vec<ObjectKey> = self
                    .pod_index
                    .iter()
                    .filter(|(_, (_, e, _, finished))| *e < epoch && !finished)
                    .map(|(k, _)| k.clone())
                    .collect();
                let mut affected: Vec<JobKey> = stale
                    .into_iter()
                    .filter_map(|k| self.remove_pod(&k.namespace, &k.name))
                    .collect();
                affected.sort();
                affected.dedup();
                self.with_state(affected)
            }
            Kind::Groups => {
                let stale: Vec<GroupKey> = self
                    .groups
                    .iter()
                    .filter(|(_, e)| e.epoch < epoch)
                    .map(|(k, _)| k.clone())
                    .collect();
                let mut affected = Vec::new();
                for g in stale {
                    if let Some(entry) = self.forget_group(&g) {
                        affected.extend(self.remove_group(&entry.value));
                    }
                }
                self.with_state(affected)
            }
        }
    }

    fn with_state(&self, keys: Vec<JobKey>) -> Vec<(JobKey, Arc<VolcanoJob>, Arc<Vec<Pod>>)> {
        keys.into_iter()
            .filter_map(|k| {
                let job = self.job(&k)?.clone();
                let pods = self.pods(&k);
                Some((k, job, pods))
            })
            .collect()
    }

    /// The latest version of one object of `kind` the watches have brought (pods and PodGroups by their
    /// own namespace and name), as a list of that kind would have it: a finished pod, which no pod list
    /// has, reads as not held, and a job's event held while its worker runs (see
    /// [`Cache::take_watched`]) counts when it is the later one: it was not missed.
    pub fn version(&self, kind: Kind, key: &JobKey) -> Option<Rv> {
        match kind {
            Kind::Pods => {
                let parts: &dyn KeyParts = &(&*key.namespace, &*key.name);
                self.pod_index
                    .get(parts)
                    .filter(|(_, _, _, finished)| !finished)
                    .map(|(_, _, rv, _)| *rv)
            }
            Kind::Jobs => {
                let stored = self.version_of(kind, &key.namespace, &key.name);
                match self.held.get(key).map(|w| rv_of(&w.metadata)) {
                    Some(held) if stored.is_none_or(|s| held.later_than(s)) => Some(held),
                    _ => stored,
                }
            }
            Kind::Groups => self.version_of(kind, &key.namespace, &key.name),
        }
    }

    /// The version of one object of `kind` stored (not a job's event held, see [`Cache::version`]), by
    /// borrowed namespace and name.
    pub fn version_of(&self, kind: Kind, namespace: &str, name: &str) -> Option<Rv> {
        let key: &dyn KeyParts = &(namespace, name);
        let meta = match kind {
            Kind::Jobs => &self.jobs.get(key)?.value.metadata,
            Kind::Pods => return self.pod_index.get(key).map(|(_, _, rv, _)| *rv),
            Kind::Groups => &self.groups.get(key)?.value.metadata,
        };
        Some(meta.resource_version.as_deref().into())
    }

    /// Whether the object `meta` names is held at `meta`'s version: a watch event that brings nothing
    /// new (counted as such by the monitor's metrics).
    pub fn holds_version(&self, kind: Kind, meta: &ObjectMeta) -> bool {
        self.version_of(
            kind,
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        ) == Some(Rv::from(meta.resource_version.as_deref()))
    }

    /// How many objects of `kind` are held.
    pub fn count(&self, kind: Kind) -> usize {
        match kind {
            Kind::Jobs => self.jobs.len(),
            Kind::Pods => self.pod_index.len(),
            Kind::Groups => self.groups.len(),
        }
    }

    /// How many objects of `kind` held a list of that kind would have: the pods not finished (see
    /// [`super::live_pods`]).
    pub fn listed_count(&self, kind: Kind) -> usize {
        match kind {
            Kind::Pods => self.pod_index.len() - self.finished_pods,
            _ => self.count(kind),
        }
    }

    /// Every object of `kind` held that a list of that kind would have (not the finished pods), with
    /// its version.
    pub fn versions(&self, kind: Kind) -> Vec<(JobKey, Rv)> {
        let rv = |m: &ObjectMeta| Rv::from(m.resource_version.as_deref());
        match kind {
            Kind::Jobs => self
                .jobs
                .iter()
                .map(|(k, e)| (k.clone(), rv(&e.value.metadata)))
                .collect(),
            Kind::Pods => self
                .pod_index
                .iter()
                .filter(|(_, (_, _, _, finished))| !finished)
                .map(|(k, (_, _, v, _))| (k.clone(), *v))
                .collect(),
            Kind::Groups => self
                .groups
                .values()
                .map(|e| (JobKey::of(&e.value.metadata), rv(&e.value.metadata)))
                .collect(),
        }
    }

    /// Every job held with its current [`Fingerprint`], as a reconciliation pass reads them all.
    pub fn fingerprints(&self) -> impl Iterator<Item = (&JobKey, Fingerprint)> {
        self.jobs
            .iter()
            .map(|(key, entry)| (key, self.fingerprint_of(key, entry)))
    }

    fn fingerprint_of(&self, key: &JobKey, entry: &JobEntry) -> Fingerprint {
        // A place in a queue or an estimate needs the job's PodGroup; with no job waiting and no
        // estimate (a cluster where everything runs), that lookup is skipped.
        let gkey = if self.waiting.filed.is_empty() && self.estimates.is_empty() {
            None
        } else {
            self.group_of_job.get(key)
        };
        let jobs_ahead = gkey.and_then(|g| self.waiting.ahead_of(g));
        let estimate = gkey.and_then(|g| self.estimates.get(g));
        Self::fingerprint_with(entry.generation, jobs_ahead, estimate.map(|e| &**e))
    }

    fn fingerprint_with(
        generation: u64,
        jobs_ahead: Option<u32>,
        estimate: Option<&Estimate>,
    ) -> Fingerprint {
        Fingerprint {
            generation,
            jobs_ahead,
            estimate: estimate.map(|e| match e {
                Estimate::At { start, .. } => start.as_second(),
                Estimate::Never { .. } => i64::MIN,
                Estimate::Unbounded { .. } => i64::MIN + 1,
                Estimate::TimesOut { .. } => i64::MIN + 2,
            }),
        }
    }

    /// Everything a worker needs about `key`, or `None` when the job is not held.
    pub fn snapshot(&self, key: &JobKey) -> Option<Snapshot> {
        let entry = self.jobs.get(key)?;
        let (job, generation) = (entry.value.clone(), entry.generation);
        let gkey = self.group_of_job.get(key).cloned();
        let podgroup = gkey
            .as_ref()
            .and_then(|g| self.groups.get(g))
            .map(|e| e.value.clone());
        let jobs_ahead = gkey.as_ref().and_then(|g| self.waiting.ahead_of(g));
        let estimate = gkey.as_ref().and_then(|g| self.estimates.get(g)).cloned();
        let estimate_pending = self.estimating
            && estimate.is_none()
            && gkey
                .as_ref()
                .is_some_and(|g| self.waiting.filed.contains_key(g));
        Some(Snapshot {
            key: key.clone(),
            job,
            pods: self.pods(key),
            podgroup,
            jobs_ahead,
            fingerprint: Self::fingerprint_with(generation, jobs_ahead, estimate.as_deref()),
            phase_seen: entry.phase_seen,
            estimate,
            estimate_pending,
            disruption: self.disruptions.get(key).map(|(g, _, d)| (*g, d.clone())),
            peers: Arc::new(self.peers_seen(key, &entry.value)),
        })
    }

    /// The maintenance windows the next [`Cache::estimate_starts`] replays: they cut running jobs and
    /// hold back gated ones ([`crate::forecast::windows`]).
    pub fn set_maintenance_windows(&mut self, windows: Option<crate::cluster::Windows>) {
        self.maintenance_windows = windows;
    }

    /// The windows whose taint is on a node, as the nodes' watch has them (the decisions' input too):
    /// a waiting gang that does not tolerate one is held back by it
    /// ([`super::maintenance::replay_hold`]), whoever wrote the taint, and a window of some nodes
    /// whose taint is on no node holds nobody ([`super::maintenance::holds_anyone`]).
    pub fn set_maintenance_tainted(&mut self, tainted: Arc<BTreeSet<String>>) {
        self.maintenance_tainted = tainted;
    }

    /// The booked nodes and until when (their `<prefix>booked` taints, docs/bookings.md): the replay
    /// holds what is free on them until then ([`inputs::booked_holds`]).
    pub fn set_booked_nodes(&mut self, booked: BTreeMap<String, Timestamp>) {
        self.booked_nodes = booked;
    }

    /// Estimates the start of every waiting PodGroup (any workload's: they all go ahead of someone) on
    /// `nodes`, from what the cache holds: the pods of the jobs volcano-runner runs, bound to their nodes
    /// and held until each job's deadline, and the waiting gangs in the scheduler's order. Pods of other
    /// workloads are not watched, so on a cluster shared with them an estimate can be early; `admin
    /// queue` lists every pod and counts them. The estimates stay for the snapshots until the next call.
    /// Returns the jobs held whose estimate changed.
    pub fn estimate_starts(
        &mut self,
        nodes: &[Node],
        keys: &AnnotationKeys,
        now: Timestamp,
    ) -> Vec<JobKey> {
        let before = std::mem::take(&mut self.estimates);
        self.estimating = !nodes.is_empty();
        // Expectations of PodGroups that have started since: held when they started by then (seen now,
        // at most one estimate interval after the start).
        let expected = std::mem::take(&mut self.expected);
        for (gkey, at) in expected {
            if self.waiting.filed.contains_key(&gkey) {
                self.expected.insert(gkey, at);
            } else if self
                .groups
                .get(&gkey)
                .is_some_and(|g| !observe::is_waiting(&g.value))
            {
                self.expectations_kept += 1;
                self.expectations_held += u64::from(now <= at);
            }
        }
        self.reservations = Reservations::default();
        self.reserving_now.clear();
        if !nodes.is_empty() && !self.waiting.filed.is_empty() {
            self.estimates = self.replay(nodes, keys, now);
        }
        self.hold_back_while_reserving();
        for (gkey, e) in &self.estimates {
            if let Estimate::At {
                start,
                bound: false,
                ..
            } = **e
            {
                self.expected.entry(gkey.clone()).or_insert(start);
            }
        }
        let mut changed: Vec<JobKey> = Vec::new();
        for (gkey, e) in &self.estimates {
            if before.get(gkey) != Some(e) {
                changed.extend(self.groups.get(gkey).and_then(|g| job_of_group(&g.value)));
            }
        }
        for gkey in before.keys() {
            if !self.estimates.contains_key(gkey) {
                changed.extend(self.groups.get(gkey).and_then(|g| job_of_group(&g.value)));
            }
        }
        changed.retain(|k| self.jobs.contains_key(k));
        changed
    }

    /// A gang whose nodes this replay reserves is told once they are reserved: this replay makes its
    /// start an expectation (it holds no reserved nodes yet), the next one, with the taints, a bound.
    /// Told now, it would hear an expectation and a bound one pass later, and a session whose nodes
    /// empty within that pass would start never having heard its bound (issue 45: the whole-node
    /// sessions of `tests/monitor/promise.rs`). Its estimate is left out, so its status waits for the
    /// next replay ([`Snapshot::estimate_pending`]), and so are those of the gangs behind it in a
    /// `fifo` queue; once per gang, so that a taint that cannot be written (no grant, a conflict each
    /// time) never keeps a job untold.
    fn hold_back_while_reserving(&mut self) {
        let reserving = std::mem::take(&mut self.reserving_now);
        // In a fifo queue the gangs behind it are expectations for as long as it is one (a bound holds
        // only behind bounds): they too wait for the replay with its taints.
        let mut held: Vec<GroupKey> = Vec::new();
        for g in &reserving {
            let Some((queue, at)) = self.waiting.filed.get(g) else {
                continue;
            };
            held.push(g.clone());
            if self.fifo_queues.contains(queue) {
                held.extend(
                    self.waiting
                        .filed
                        .iter()
                        .filter(|(_, (q, w))| q == queue && w > at)
                        .map(|(behind, _)| behind.clone()),
                );
            }
        }
        for g in held {
            let expectation = self
                .estimates
                .get(&g)
                .is_some_and(|e| matches!(**e, Estimate::At { bound: false, .. }));
            if expectation && self.held_for_reservation.insert(g.clone()) {
                self.estimates.remove(&g);
            }
        }
        let waiting = &self.waiting.filed;
        self.held_for_reservation
            .retain(|g| waiting.contains_key(g));
    }

    /// The forecast of the waiting gangs ([`crate::forecast`]) from what the watches show: the
    /// snapshot read from the cache, the replay, then the nodes to reserve and what the record of
    /// expectations adds.
    fn replay(
        &mut self,
        nodes: &[Node],
        keys: &AnnotationKeys,
        now: Timestamp,
    ) -> FastMap<GroupKey, Arc<Estimate>> {
        let running = self.running(nodes, keys, now);
        let (groups, gangs) = self.pending_gangs(keys, now);
        let maintenance = self.window_holds(&groups, keys, now);
        let replay = forecast::replay_with(
            nodes,
            &running,
            &gangs,
            &maintenance,
            self.start_margin,
            now,
        );
        if self.reserve_nodes {
            self.reserving_now = replay
                .reserve_now
                .iter()
                .filter(|(g, _)| gangs[*g].reserves.is_some())
                .map(|(g, _)| groups[*g].clone())
                .collect();
            self.reservations = Reservations {
                reserving: gangs.iter().filter_map(|p| p.reserves.clone()).collect(),
                reserve_now: replay
                    .reserve_now
                    .iter()
                    .filter_map(|(g, on)| {
                        Some((
                            gangs[*g].reserves.clone()?,
                            on.iter().map(|n| nodes[*n].name.clone()).collect(),
                        ))
                    })
                    .collect(),
            };
        }
        let mut estimates = replay.estimates;
        if self.proportion {
            let in_use = observe::queues_in_use(self.groups.values().map(|g| &*g.value));
            forecast::across_queues(&mut estimates, in_use);
        }
        if self.expectations_kept > 0 {
            for e in &mut estimates {
                if let Estimate::At {
                    basis,
                    bound: false,
                    record,
                    ..
                } = e
                {
                    basis.push_str(&format!(
                        "; of such expectations made since this runner started, {} of {} held",
                        self.expectations_held, self.expectations_kept
                    ));
                    *record = Some(forecast::ExpectationRecord {
                        held: self.expectations_held,
                        made: self.expectations_kept,
                    });
                }
            }
        }
        groups
            .into_iter()
            .zip(estimates)
            .map(|(g, e)| (g, Arc::new(e)))
            .collect()
    }

    /// The running jobs the replay frees resources from: every job's ranks on their nodes (all of a
    /// node for a whole-node job), with its deadline.
    fn running(&self, nodes: &[Node], keys: &AnnotationKeys, now: Timestamp) -> Vec<Running> {
        let index: FastMap<&str, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect();
        let mut running = Vec::new();
        for (jkey, pods) in &self.pods {
            let Some(gkey) = self.group_of_job.get(jkey) else {
                continue;
            };
            let Some(group) = self.groups.get(gkey) else {
                continue;
            };
            if self.waiting.filed.contains_key(gkey) {
                continue;
            }
            let (_, per_rank) = inputs::gang(&group.value);
            let whole = self
                .jobs
                .get(jkey)
                .is_some_and(|j| inputs::exclusive(&j.value, keys));
            let ranks: Vec<(usize, Resources)> = pods
                .iter()
                .filter(|p| {
                    !matches!(
                        p.status.as_ref().and_then(|s| s.phase.as_deref()),
                        Some("Succeeded" | "Failed")
                    )
                })
                .filter_map(|p| {
                    let i = *index.get(p.node.as_deref()?)?;
                    Some((
                        i,
                        if whole {
                            nodes[i].allocatable
                        } else {
                            per_rank
                        },
                    ))
                })
                .collect();
            if ranks.is_empty() {
                continue;
            }
            let ends_by = self
                .jobs
                .get(jkey)
                .and_then(|j| inputs::deadline(&j.value, keys, now));
            running.push(Running { ranks, ends_by });
        }
        let held = inputs::booked_holds(nodes, &running, &self.booked_nodes, now);
        running.extend(held);
        running
    }

    /// The waiting gangs in the scheduler's list order, with their PodGroups' keys.
    fn pending_gangs(
        &self,
        keys: &AnnotationKeys,
        now: Timestamp,
    ) -> (Vec<GroupKey>, Vec<forecast::Pending>) {
        let mut order: Vec<(&WaitKey, &GroupKey)> = self
            .waiting
            .filed
            .iter()
            .map(|(g, (_, w))| (w, g))
            .collect();
        order.sort_unstable();
        let pending: Vec<_> = order
            .iter()
            .filter_map(|(_, g)| {
                let pg = &self.groups.get(*g)?.value;
                let job = job_of_group(pg).and_then(|k| self.jobs.get(&k).map(|e| &*e.value));
                // A booked job waits for its start, not for room (its booking holds its nodes).
                if inputs::booked_later(job, keys, now) {
                    return None;
                }
                let fifo = self.fifo_queues.contains(&observe::queue_of(pg));
                let mut gang = inputs::pending_gang(pg, job, keys, fifo, self.reserve_nodes);
                gang.gives_up_at = inputs::gives_up_at(job, self.queue_timeout);
                Some(((*g).clone(), gang))
            })
            .collect();
        pending.into_iter().unzip()
    }

    /// The maintenance windows as the replay sees them, and which waiting gangs (`groups`) they hold.
    fn window_holds(
        &self,
        groups: &[GroupKey],
        keys: &AnnotationKeys,
        now: Timestamp,
    ) -> forecast::Maintenance {
        // A gang is held back by a window while the maintenance gate holds it (the monitor lifts the
        // gate only when it starts with no window in the way), or while it does not tolerate one not
        // over whose taint is on a node (the monitor adds a toleration only then). The windows' taints
        // are read as the decisions read them: from the nodes' watch.
        let gate = keys.maintenance_gate();
        let taint_prefix = keys.maintenance_taint();
        let windows_now = self
            .maintenance_windows
            .as_deref()
            .map_or(&[][..], Vec::as_slice);
        let tainted = |w: &crate::cluster::Window| self.maintenance_tainted.contains(&w.id);
        let (held, kept_off): (Vec<bool>, Vec<Vec<usize>>) = groups
            .iter()
            .map(|g| {
                let Some(jkey) = self.groups.get(g).and_then(|pg| job_of_group(&pg.value)) else {
                    return (false, Vec::new());
                };
                let created_held = self.jobs.get(&jkey).is_some_and(|j| {
                    j.value
                        .metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key(&keys.maintenance_held))
                });
                let pods = self.pods.get(&jkey).map_or(&[][..], Vec::as_slice);
                let gate_holds = super::maintenance::held_back(
                    created_held,
                    pods.is_empty(),
                    pods.iter().any(|p| {
                        p.gates
                            .as_ref()
                            .is_some_and(|g| g.iter().any(|g| g.name == gate))
                    }),
                );
                let tolerated = |w: &crate::cluster::Window| {
                    !pods.is_empty()
                        && pods.iter().filter(|p| p.node.is_none()).all(|p| {
                            super::maintenance::tolerates(
                                &p.to_pod(&jkey.name),
                                &taint_prefix,
                                &w.id,
                            )
                        })
                };
                super::maintenance::replay_hold(windows_now, gate_holds, tainted, tolerated, now)
            })
            .unzip();
        forecast::Maintenance {
            windows: windows_now.to_vec(),
            holds: windows_now
                .iter()
                .map(|w| super::maintenance::holds_anyone(w, tainted))
                .collect(),
            held,
            kept_off,
            // Every running job here is the runner's.
            spared: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volcano::PodGroupPhase;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use std::collections::BTreeMap;

    fn job(ns: &str, name: &str, rv: &str) -> VolcanoJob {
        let mut j = VolcanoJob::default();
        j.metadata.namespace = Some(ns.into());
        j.metadata.name = Some(name.into());
        j.metadata.resource_version = Some(rv.into());
        j
    }

    /// Job `ns/j-1` as a worker wrote it: at `rv`, recording the lifecycle state `state`.
    fn written_job(rv: &str, state: &str) -> VolcanoJob {
        let mut j = job("ns", "j-1", rv);
        j.metadata
            .annotations
            .get_or_insert_default()
            .insert("lifecycleState".into(), state.into());
        j
    }

    fn pod(ns: &str, job: &str, name: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some(ns.into());
        p.metadata.name = Some(name.into());
        p.metadata.labels = Some(BTreeMap::from([(LABEL_JOB_NAME.into(), job.into())]));
        p
    }

    #[test]
    fn slim_reads_skip_templates_and_specs() {
        let w: WatchedJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": "j-1", "namespace": "ns", "annotations": {"a": "b"},
                         "managedFields": [{"manager": "x"}]},
            "spec": {"queue": "q", "minAvailable": 2, "ttlSecondsAfterFinished": 60,
                     "tasks": [{"name": "job", "replicas": 2, "template": {"spec": {"containers": []}}}]},
            "status": {"state": {"phase": "Running"}, "running": 2}
        }))
        .unwrap();
        let j = w.into_job();
        assert_eq!(j.spec.queue.as_deref(), Some("q"));
        assert_eq!(
            j.spec.ttl_seconds_after_finished,
            Some(60),
            "kept by its TTL"
        );
        assert_eq!(j.spec.tasks[0].replicas, 2);
        assert_eq!(j.spec.tasks[0].template, Default::default());
        assert!(j.metadata.managed_fields.is_none());
        assert_eq!(j.status.unwrap().running, 2);
        let p: WatchedPod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "j-1-job-0"}, "spec": {"containers": [{"name": "user-job"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1"}
        }))
        .unwrap();
        let p = p.into_pod();
        assert!(p.spec.is_none());
        assert_eq!(p.status.unwrap().pod_ip.as_deref(), Some("10.0.0.1"));
    }

    #[test]
    fn pods_keep_only_what_the_monitor_reads() {
        let w: WatchedPod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "j-1-job-0", "namespace": "ns", "resourceVersion": "9",
                         "labels": {LABEL_JOB_NAME: "j-1", LABEL_TASK_INDEX: "0", "queue": "default"},
                         "annotations": {"scheduling.k8s.io/group-name": "pg"},
                         "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                                              "name": "j-1", "uid": "u"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "user-job", "image": "i", "imageID": "",
                                              "ready": true, "restartCount": 0,
                                              "state": {"running": {"startedAt": "2026-11-22T08:00:00Z"}}}]}
        }))
        .unwrap();
        let p = w.into_pod();
        let labels = p.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.len(), 2, "{labels:?}");
        assert_eq!(&*job_of_pod(&p).unwrap().name, "j-1");
        assert_eq!(observe::rank_of("1", &p), Some(0));
        assert!(p.metadata.annotations.is_none() && p.metadata.owner_references.is_none());
        assert_eq!(p.metadata.resource_version.as_deref(), Some("9"));
        let status = p.status.as_ref().unwrap();
        assert!(status.conditions.is_none());
        assert!(observe::user_container(&p).is_some());
    }

    /// A pod keeps its tolerations while it waits to be placed (the maintenance windows' taints), not
    /// once placed, and its node: the snapshot gives both back to the decision.
    #[test]
    fn a_waiting_pod_keeps_its_tolerations_and_a_placed_one_its_node() {
        let pod = |node: Option<&str>| -> Pod {
            let w: WatchedPod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "j-1-job-0", "namespace": "ns", "resourceVersion": "3",
                             "labels": {LABEL_JOB_NAME: "j-1", LABEL_TASK_INDEX: "0"}},
                "spec": {"nodeName": node, "containers": [],
                         "tolerations": [{"key": "ucloud.dk/maintenance", "operator": "Equal",
                                          "value": "w", "effect": "NoSchedule"}]},
            }))
            .unwrap();
            w.into_pod()
        };
        for node in [None, Some("n1")] {
            let mut c = Cache::new();
            let key = c.apply_job(job("ns", "j-1", "1"));
            c.apply_pod(pod(node));
            let seen = c.snapshot(&key).unwrap().pods;
            let spec = seen[0].spec.as_ref().unwrap();
            assert_eq!(spec.node_name.as_deref(), node);
            assert_eq!(
                crate::monitor::maintenance::tolerates(&seen[0], "ucloud.dk/maintenance", "w"),
                node.is_none(),
                "placed: {node:?}"
            );
        }
    }

    /// The watch may deliver an update made before our own write after the answer to that write: the
    /// job as written stays (deciding on the older one published a SUCCESS and its final tick twice).
    #[test]
    fn a_late_watch_event_does_not_undo_a_workers_write() {
        let mut c = Cache::new();
        let key = c.apply_job(job("ns", "j-1", "5"));
        let written = written_job("8", "SUCCESS");
        c.refresh_job(Arc::new(written));
        c.apply_job(job("ns", "j-1", "7"));
        let kept = c.snapshot(&key).unwrap().job;
        assert_eq!(kept.metadata.resource_version.as_deref(), Some("8"));
        assert!(kept.metadata.annotations.is_some(), "the written job stays");
        // A later version replaces it, as does one whose version is not a number.
        c.apply_job(job("ns", "j-1", "9"));
        assert_eq!(
            c.snapshot(&key)
                .unwrap()
                .job
                .metadata
                .resource_version
                .as_deref(),
            Some("9")
        );
        c.apply_job(job("ns", "j-1", "x"));
        assert_eq!(
            c.snapshot(&key)
                .unwrap()
                .job
                .metadata
                .resource_version
                .as_deref(),
            Some("x")
        );
    }

    /// The cache notes, by the monitor's clock, when it first held each job in its phase: a job held
    /// before that enters a new phase is noted now, one whose phase stays keeps its first sight (another
    /// version, a worker's write alike), and a job new to the cache has none (its pods may never come).
    #[test]
    fn a_job_is_noted_when_first_held_in_its_phase() {
        let clock = Arc::new(crate::monitor::clock::ManualClock::at(
            "2026-01-01T00:00:00Z".parse().unwrap(),
        ));
        let mut c = Cache::new().with_clock(clock.clone());
        let at = |secs: u64| {
            "2026-01-01T00:00:00Z"
                .parse::<Timestamp>()
                .unwrap()
                .checked_add(jiff::SignedDuration::from_secs(secs as i64))
                .unwrap()
        };
        let in_phase = |rv: &str, phase: JobPhase| {
            let mut j = job("ns", "j-1", rv);
            j.status.get_or_insert_default().state.phase = phase;
            j
        };
        let seen = |c: &Cache, key: &JobKey| c.snapshot(key).unwrap().phase_seen;
        clock.advance(std::time::Duration::from_secs(10));
        let key = c.apply_job(in_phase("1", JobPhase::Pending));
        assert_eq!(seen(&c, &key), None, "new to the cache");
        c.apply_job(in_phase("2", JobPhase::Running));
        assert_eq!(seen(&c, &key), Some(at(10)), "a new phase");
        clock.advance(std::time::Duration::from_secs(5));
        c.apply_job(in_phase("3", JobPhase::Running));
        assert_eq!(seen(&c, &key), Some(at(10)), "same phase, another version");
        clock.advance(std::time::Duration::from_secs(5));
        c.refresh_job(Arc::new(in_phase("4", JobPhase::Running)));
        assert_eq!(seen(&c, &key), Some(at(10)), "a worker's write, same phase");
        c.refresh_job(Arc::new(in_phase("5", JobPhase::Completed)));
        assert_eq!(
            seen(&c, &key),
            Some(at(20)),
            "a worker's write read a new phase"
        );
        let mut without = Cache::new();
        let key = without.apply_job(in_phase("1", JobPhase::Pending));
        without.apply_job(in_phase("2", JobPhase::Running));
        assert_eq!(seen(&without, &key), None, "no clock, no first sight");
    }

    #[test]
    fn the_echo_of_a_workers_write_is_seen_again_and_changes_nothing() {
        let mut c = Cache::new();
        let key = c.apply_job(job("ns", "j-1", "5"));
        let written = written_job("8", "RUNNING");
        assert!(
            c.refresh_job(Arc::new(written.clone())),
            "the answer is kept"
        );
        let decided = c.fingerprint(&key).unwrap();
        let digest = c.digest(Kind::Jobs);
        // The watch brings the write back: the same job, nothing to store or decide.
        assert!(c.seen_again(&written.metadata));
        assert_eq!(c.fingerprint(&key), Some(decided));
        assert_eq!(c.digest(Kind::Jobs), digest);
        // An answer older than what is held is not kept, and says so.
        assert!(!c.refresh_job(Arc::new(job("ns", "j-1", "7"))));
        // Any other version is news, as is another job of the name.
        assert!(!c.seen_again(&job("ns", "j-1", "9").metadata));
        let mut other = job("ns", "j-1", "8");
        other.metadata.uid = Some("another".into());
        assert!(!c.seen_again(&other.metadata));
        assert!(!c.seen_again(&job("ns", "j-2", "8").metadata));
        c.apply_job(job("ns", "j-1", "9"));
        assert_ne!(c.fingerprint(&key), Some(decided));
    }

    /// A job's watch event that comes while a worker has the job in hand waits for the worker's
    /// answer: the echo of its write is then known for one (neither stored nor decided again), anything
    /// else is stored. Meanwhile the reconciliation counts it as seen, not missed; a deletion or a fresh
    /// list drops it.
    #[test]
    fn an_event_for_a_job_in_hand_waits_for_the_workers_answer() {
        let watched = |rv: &str| WatchedJob {
            metadata: written_job(rv, "RUNNING").metadata,
            ..WatchedJob::default()
        };
        let rv = |v: &str| Some(Rv::parse(v));
        let mut c = Cache::new();
        let key = c.apply_job(job("ns", "j-1", "5"));
        let decided = c.fingerprint(&key);
        // The echo of the worker's write comes before its answer.
        assert_eq!(c.take_watched(watched("8"), |_| true), Intake::Held);
        assert_eq!(c.fingerprint(&key), decided, "nothing to decide yet");
        assert_eq!(c.version_of(Kind::Jobs, "ns", "j-1"), rv("5"));
        assert_eq!(c.version(Kind::Jobs, &key), rv("8"), "seen, not missed");
        assert!(c.refresh_job(Arc::new(written_job("8", "RUNNING"))));
        let written = c.fingerprint(&key);
        assert_eq!(c.release_held(&key), Some(Intake::Echo));
        assert_eq!(c.fingerprint(&key), written, "the echo changes nothing");
        assert_eq!(c.release_held(&key), None, "released once");
        // Someone else's change while the worker runs is stored once the answer is in.
        assert_eq!(c.take_watched(watched("9"), |_| true), Intake::Held);
        assert!(!c.refresh_job(Arc::new(written_job("8", "RUNNING"))));
        let stored = Intake::Stored {
            key: key.clone(),
            news: true,
        };
        assert_eq!(c.release_held(&key), Some(stored.clone()));
        assert_eq!(c.version_of(Kind::Jobs, "ns", "j-1"), rv("9"));
        assert_ne!(c.fingerprint(&key), written);
        // A job not in hand: its echo is nothing new, another version is stored at once.
        assert_eq!(c.take_watched(watched("9"), |_| false), Intake::Echo);
        let mut in_hand = Vec::new();
        let stored_at_once = c.take_watched(watched("10"), |k| {
            in_hand.push(k.clone());
            false
        });
        assert_eq!((stored_at_once, in_hand), (stored, vec![key.clone()]));
        // An event held older than the job stored does not hide the newer version.
        assert_eq!(c.take_watched(watched("7"), |_| true), Intake::Held);
        assert_eq!(c.version(Kind::Jobs, &key), rv("10"));
        // A fresh list, and a deletion, drop what is held.
        c.init_start(Kind::Jobs);
        assert_eq!(c.release_held(&key), None);
        assert_eq!(c.take_watched(watched("11"), |_| true), Intake::Held);
        assert!(c.remove_job(&key).is_some());
        assert_eq!(c.version(Kind::Jobs, &key), None);
        assert_eq!(c.release_held(&key), None);
    }

    #[test]
    fn the_fingerprint_changes_with_any_new_version_and_only_then() {
        let mut c = Cache::new();
        let key = c.apply_job(job("ns", "j-1", "1"));
        let mut p = pod("ns", "j-1", "j-1-job-0");
        p.metadata.resource_version = Some("2".into());
        c.apply_pod(p.clone());
        let first = c.snapshot(&key).unwrap().fingerprint;
        assert_eq!(c.fingerprints().next().map(|(_, f)| f), Some(first));
        // The same versions again (a fresh list, a watch event after the worker's own write).
        c.apply_job(job("ns", "j-1", "1"));
        c.apply_pod(p.clone());
        c.refresh_job(Arc::new(job("ns", "j-1", "1")));
        assert_eq!(c.fingerprints().next().map(|(_, f)| f), Some(first));
        // A new version of the pod, then of the job.
        p.metadata.resource_version = Some("3".into());
        c.apply_pod(p.clone());
        let second = c.snapshot(&key).unwrap().fingerprint;
        assert_ne!(second, first);
        c.refresh_job(Arc::new(job("ns", "j-1", "4")));
        let third = c.snapshot(&key).unwrap().fingerprint;
        assert_ne!(third, second);
        // The pod goes away.
        c.remove_pod("ns", "j-1-job-0");
        assert_ne!(c.snapshot(&key).unwrap().fingerprint, third);
        assert!(
            c.snapshot(&JobKey::of(&job("ns", "j-2", "1").metadata))
                .is_none()
        );
    }

    #[test]
    fn tasks_are_kept_only_when_the_replicas_are_not_annotated() {
        let mut c = Cache::with_replicas_key("x/replicas");
        let mut with = job("ns", "j-a", "1");
        with.spec.tasks = vec![TaskSpec::default()];
        with.metadata.annotations = Some(BTreeMap::from([("x/replicas".into(), "2".into())]));
        let mut without = job("ns", "j-b", "1");
        without.spec.tasks = vec![TaskSpec {
            replicas: 3,
            ..TaskSpec::default()
        }];
        let a = c.apply_job(with);
        let b = c.apply_job(without);
        assert!(c.job(&a).unwrap().spec.tasks.is_empty());
        assert_eq!(c.job(&b).unwrap().spec.tasks[0].replicas, 3);
    }

    /// The positions kept up to date through any sequence of changes, deletions and fresh lists are
    /// the ones computed from scratch.
    #[test]
    fn incremental_queue_positions_match_the_definition() {
        use crate::volcano::{PodGroupPhase, PodGroupStatus};
        let mut rng = fastrand::Rng::with_seed(7);
        let mut c = Cache::new();
        let phases = [
            None,
            Some(PodGroupPhase::Pending),
            Some(PodGroupPhase::Inqueue),
            Some(PodGroupPhase::Running),
        ];
        let group = |rng: &mut fastrand::Rng| {
            let mut pg = PodGroup::default();
            pg.metadata.namespace = Some(format!("ns-{}", rng.u8(0..3)));
            pg.metadata.name = Some(format!("pg-{}", rng.u8(0..40)));
            // Few distinct times, so ties are ordered by namespace and name.
            pg.metadata.creation_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    jiff::Timestamp::from_second(i64::from(rng.u8(0..10))).unwrap(),
                ));
            pg.spec.queue =
                [None, Some("default".to_owned()), Some("q2".to_owned())][rng.usize(0..3)].clone();
            pg.status = phases[rng.usize(0..4)].clone().map(|phase| PodGroupStatus {
                phase: Some(phase),
                ..PodGroupStatus::default()
            });
            pg
        };
        for step in 0..3000 {
            match rng.u8(0..20) {
                0 => {
                    // A fresh list that keeps about half the groups.
                    c.init_start(Kind::Groups);
                    let keep: Vec<PodGroup> = c
                        .groups
                        .values()
                        .filter(|_| rng.bool())
                        .map(|e| (*e.value).clone())
                        .collect();
                    for pg in keep {
                        c.apply_group(pg);
                    }
                    c.init_done(Kind::Groups);
                }
                1..=4 => {
                    let pg = group(&mut rng);
                    c.remove_group(&pg);
                }
                _ => {
                    c.apply_group(group(&mut rng));
                }
            }
            let expected = observe::queue_positions(c.groups.values().map(|e| e.value.as_ref()));
            for key in c.groups.keys() {
                assert_eq!(
                    c.waiting.ahead_of(key),
                    expected
                        .get(&(key.namespace.to_string(), key.name.to_string()))
                        .copied(),
                    "step {step}: {key:?}"
                );
            }
            assert_eq!(c.waiting.filed.len(), expected.len(), "step {step}");
        }
    }

    #[test]
    fn a_fresh_list_drops_what_it_no_longer_has() {
        let mut c = Cache::new();
        c.apply_job(job("ns", "j-1", "5"));
        c.apply_job(job("ns", "j-2", "6"));
        c.apply_pod(pod("ns", "j-1", "j-1-job-0"));
        c.apply_pod(pod("ns", "j-1", "j-1-job-1"));
        c.init_start(Kind::Jobs);
        c.apply_job(job("ns", "j-2", "7"));
        let gone = c.init_done(Kind::Jobs);
        assert_eq!(gone.len(), 1);
        assert_eq!(&*gone[0].0.name, "j-1");
        assert_eq!(gone[0].2.len(), 2, "a gone job comes with its last pods");
        assert_eq!(c.len(), 1);
        c.init_start(Kind::Pods);
        c.apply_pod(pod("ns", "j-1", "j-1-job-1"));
        c.init_done(Kind::Pods);
        let key = JobKey {
            namespace: "ns".into(),
            name: "j-1".into(),
        };
        assert_eq!(c.pods(&key).len(), 1);
    }

    /// A pod of `job` at version `rv` in `phase`.
    fn pod_in(job: &str, name: &str, rv: &str, phase: &str) -> Pod {
        let mut p = pod("ns", job, name);
        p.metadata.resource_version = Some(rv.into());
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            ..PodStatus::default()
        });
        p
    }

    /// Finished pods (which the pod lists leave out, `super::live_pods`) are held while their job is:
    /// the reconciliation does not expect them in its list, a relist keeps them, and they go with their
    /// job; one whose job is not held is not taken in.
    #[test]
    fn finished_pods_are_held_with_their_job_and_not_expected_in_a_list() {
        let mut c = Cache::new();
        let key = JobKey::new("ns", "j-1");
        c.apply_job(job("ns", "j-1", "1"));
        c.apply_pod(pod_in("j-1", "j-1-job-0", "2", "Running"));
        c.apply_pod(pod_in("j-1", "j-1-job-1", "3", "Running"));
        c.apply_pod(pod_in("j-1", "j-1-job-0", "4", "Succeeded"));
        assert_eq!(c.pods(&key).len(), 2, "its exit code is the job's to read");
        assert_eq!((c.count(Kind::Pods), c.listed_count(Kind::Pods)), (2, 1));
        assert_eq!(c.digest(Kind::Pods), recomputed(&c, Kind::Pods));
        assert_eq!(c.versions(Kind::Pods).len(), 1);
        let finished = JobKey::new("ns", "j-1-job-0");
        assert_eq!(
            c.version(Kind::Pods, &finished),
            None,
            "not expected listed"
        );
        assert_eq!(
            c.version_of(Kind::Pods, "ns", "j-1-job-0"),
            Some(Rv::parse("4"))
        );

        // A relist (which has the running pod only) keeps it.
        c.init_start(Kind::Pods);
        c.apply_pod(pod_in("j-1", "j-1-job-1", "3", "Running"));
        c.init_done(Kind::Pods);
        assert_eq!(c.pods(&key).len(), 2);

        // The job leaves (its end recorded): its finished pod goes with it, the running one stays until
        // its own deletion.
        let (_, last_pods) = c.remove_job(&key).unwrap();
        assert_eq!(last_pods.len(), 2, "the gone path sees them all");
        assert_eq!(c.pods(&key).len(), 1);
        assert_eq!((c.count(Kind::Pods), c.listed_count(Kind::Pods)), (1, 1));
        // That one finishes afterwards: not taken in again.
        assert_eq!(c.apply_pod(pod_in("j-1", "j-1-job-1", "6", "Failed")), None);
        assert_eq!(c.count(Kind::Pods), 0);
        assert_eq!(c.digest(Kind::Pods), 0);
    }

    /// The digest of what `versions` lists, computed afresh.
    fn recomputed(c: &Cache, kind: Kind) -> u64 {
        c.versions(kind).iter().fold(0u64, |d, (k, rv)| {
            d.wrapping_add(share(&k.namespace, &k.name, *rv))
        })
    }

    #[test]
    fn each_kinds_digest_follows_every_change_and_only_its_objects() {
        let mut c = Cache::new();
        let check = |c: &Cache, when: &str| {
            for kind in [Kind::Jobs, Kind::Pods, Kind::Groups] {
                assert_eq!(c.digest(kind), recomputed(c, kind), "{kind:?} {when}");
            }
        };
        let pod_at = |name: &str, rv: &str| {
            let mut p = pod("ns", "j-1", name);
            p.metadata.resource_version = Some(rv.into());
            p
        };
        let group_at = |rv: &str| {
            let mut g = group("ns", "j-1-pg", "j-1", 0, PodGroupPhase::Running);
            g.metadata.resource_version = Some(rv.into());
            g
        };
        c.apply_job(job("ns", "j-1", "5"));
        c.apply_job(job("ns", "j-2", "6"));
        c.apply_pod(pod_at("j-1-job-0", "7"));
        c.apply_pod(pod_at("j-1-job-1", "8"));
        c.apply_group(group_at("9"));
        check(&c, "after the first objects");
        let before = c.digest(Kind::Jobs);
        c.apply_job(job("ns", "j-1", "10"));
        assert_ne!(
            c.digest(Kind::Jobs),
            before,
            "a new version changes the digest"
        );
        c.apply_job(job("ns", "j-1", "10"));
        c.refresh_job(Arc::new(job("ns", "j-1", "9")));
        c.refresh_job(Arc::new(job("ns", "j-2", "12")));
        c.apply_pod(pod_at("j-1-job-0", "13"));
        c.apply_group(group_at("14"));
        check(&c, "after updates, repeats and a refused older write");
        c.remove_pod("ns", "j-1-job-1");
        c.remove_job(&JobKey {
            namespace: "ns".into(),
            name: "j-2".into(),
        });
        c.remove_group(&group_at("14"));
        check(&c, "after deletions");
        c.init_start(Kind::Pods);
        c.init_done(Kind::Pods);
        c.init_start(Kind::Jobs);
        c.init_done(Kind::Jobs);
        check(&c, "after lists that no longer had them");
        assert_eq!(c.digest(Kind::Pods), 0);
        assert_eq!(c.digest(Kind::Jobs), 0);
        assert_eq!(c.digest(Kind::Groups), 0);
    }

    #[test]
    fn a_workers_write_never_replaces_a_newer_watch_event() {
        let mut c = Cache::new();
        c.apply_job(job("ns", "j-1", "10"));
        c.refresh_job(Arc::new(job("ns", "j-1", "9")));
        let key = JobKey {
            namespace: "ns".into(),
            name: "j-1".into(),
        };
        assert_eq!(
            c.job(&key).unwrap().metadata.resource_version.as_deref(),
            Some("10")
        );
        c.refresh_job(Arc::new(job("ns", "j-1", "11")));
        assert_eq!(
            c.job(&key).unwrap().metadata.resource_version.as_deref(),
            Some("11")
        );
    }

    #[test]
    fn snapshots_carry_the_podgroup_and_queue_position() {
        let mut c = Cache::new();
        let key = c.apply_job(job("ns", "j-1", "1"));
        for (name, owner, created) in [("pg-0", "other", 1), ("pg-1", "j-1", 2)] {
            let mut pg = PodGroup::default();
            pg.metadata.namespace = Some("ns".into());
            pg.metadata.name = Some(name.into());
            pg.metadata.creation_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    jiff::Timestamp::from_second(created).unwrap(),
                ));
            pg.metadata.owner_references = Some(vec![OwnerReference {
                api_version: "batch.volcano.sh/v1alpha1".into(),
                kind: "Job".into(),
                name: owner.into(),
                ..OwnerReference::default()
            }]);
            c.apply_group(pg);
        }
        let snap = c.snapshot(&key).unwrap();
        assert_eq!(
            snap.podgroup.unwrap().metadata.name.as_deref(),
            Some("pg-1")
        );
        assert_eq!(snap.jobs_ahead, Some(1));
        // A pass reads every fingerprint at once: the same as each job's snapshot, waiting or not.
        let all = |c: &Cache| {
            c.fingerprints()
                .map(|(k, f)| (k.clone(), f))
                .collect::<Vec<_>>()
        };
        assert_eq!(all(&c), [(key.clone(), snap.fingerprint)]);
        c.remove_group(&c.groups.values().next().unwrap().value.as_ref().clone());
        c.remove_group(&c.groups.values().next().unwrap().value.as_ref().clone());
        assert!(c.waiting.filed.is_empty());
        let after = c.snapshot(&key).unwrap();
        assert_eq!(after.jobs_ahead, None);
        assert_ne!(after.fingerprint, snap.fingerprint);
        assert_eq!(all(&c), [(key.clone(), after.fingerprint)]);
    }

    fn running(ns: &str, name: &str, rv: &str, phase: JobPhase, retries: i32) -> VolcanoJob {
        let mut j = job(ns, name, rv);
        j.status = Some(JobStatus {
            state: crate::volcano::JobState {
                phase,
                ..Default::default()
            },
            retry_count: retries,
            ..Default::default()
        });
        j
    }

    fn lost(node: &str, reason: &str) -> Disruption {
        Disruption {
            rank: Some(1),
            node: Some(node.into()),
            reason: reason.into(),
            message: String::new(),
        }
    }

    #[test]
    fn a_disruption_is_kept_once_per_restart_and_volcanos_own_deletions_are_none() {
        let mut c = Cache::new();
        let key = c.apply_job(running("ns", "j-1", "1", JobPhase::Running, 0));
        let kept = |c: &Cache| c.snapshot(&key).unwrap().disruption.unwrap();
        // A plain deletion while Running counts, until a said reason for the same restart replaces it.
        c.note_disruption(&key, lost("n1", ""), false, None);
        assert_eq!(kept(&c).1.node.as_deref(), Some("n1"));
        c.note_disruption(&key, lost("n2", "DeletionByPodGC"), true, None);
        let (generation, d) = kept(&c);
        assert_eq!((generation, d.reason.as_str()), (0, "DeletionByPodGC"));
        // Neither a later plain deletion nor a second said one replaces it within that restart.
        c.note_disruption(&key, lost("n3", ""), false, None);
        c.note_disruption(&key, lost("n4", "EvictionByEvictionAPI"), true, None);
        assert_eq!(kept(&c).1.node.as_deref(), Some("n2"));
        // Volcano restarts the job: the pods it deletes itself are no disruption.
        c.apply_job(running("ns", "j-1", "2", JobPhase::Restarting, 1));
        c.note_disruption(&key, lost("n5", ""), false, None);
        assert_eq!(c.snapshot(&key).unwrap().disruption.unwrap().0, 0);
        // The next said one belongs to the next restart.
        c.note_disruption(&key, lost("n6", "EvictionByEvictionAPI"), true, None);
        let (generation, d) = kept(&c);
        assert_eq!((generation, d.node.as_deref()), (1, Some("n6")));
        // A job on its way out takes none.
        c.apply_job(running("ns", "j-1", "3", JobPhase::Terminating, 1));
        c.note_disruption(&key, lost("n7", "DeletionByPodGC"), true, None);
        assert_eq!(kept(&c).1.node.as_deref(), Some("n6"));
    }

    fn group(ns: &str, name: &str, owner: &str, created: i64, phase: PodGroupPhase) -> PodGroup {
        let mut pg = PodGroup::default();
        pg.metadata.namespace = Some(ns.into());
        pg.metadata.name = Some(name.into());
        pg.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::from_second(1_800_000_000 + created).unwrap(),
            ));
        pg.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "batch.volcano.sh/v1alpha1".into(),
            kind: "Job".into(),
            name: owner.into(),
            ..OwnerReference::default()
        }]);
        pg.spec.min_member = Some(1);
        pg.spec.min_resources = BTreeMap::from([
            ("cpu".to_owned(), Quantity("15".into())),
            ("memory".to_owned(), Quantity("1Gi".into())),
        ]);
        pg.status = Some(crate::volcano::PodGroupStatus {
            phase: Some(phase),
            ..Default::default()
        });
        pg
    }

    #[test]
    fn the_monitors_estimates_hold_a_whole_node_ranks_node_whole() {
        let keys = AnnotationKeys::new("ucloud.dk/");
        let now = Timestamp::from_second(1_800_000_100).unwrap();
        let nodes: Vec<Node> = ["n0", "n1"]
            .iter()
            .map(|n| Node {
                name: (*n).into(),
                allocatable: Resources {
                    cpu_milli: 16_000,
                    memory_mib: 65_536,
                    gpu: 0,
                },
                reserved_for: None,
            })
            .collect();
        let estimate_of = |exclusive: bool| {
            let mut c = Cache::new();
            // j-a: one rank of 1 CPU on n0 until +200 s (its node whole when `exclusive`); j-b: one
            // rank of 15 CPUs on n1 until +400 s.
            for (name, node, cpu, ends) in [("j-a", "n0", "1", 200), ("j-b", "n1", "15", 400)] {
                let mut j = job("ns", name, "1");
                let mut annotations = BTreeMap::from([(
                    keys.expiry.clone(),
                    (1_800_000_000_000i64 + ends * 1000).to_string(),
                )]);
                if exclusive && name == "j-a" {
                    annotations.insert(keys.exclusive_nodes.clone(), "true".into());
                }
                j.metadata.annotations = Some(annotations);
                c.apply_job(j);
                let mut g = group("ns", &format!("{name}-pg"), name, 0, PodGroupPhase::Running);
                g.spec.min_resources = BTreeMap::from([("cpu".to_owned(), Quantity(cpu.into()))]);
                c.apply_group(g);
                let mut p = pod("ns", name, &format!("{name}-job-0"));
                p.spec = Some(PodSpec {
                    node_name: Some(node.into()),
                    ..PodSpec::default()
                });
                c.apply_pod(p);
            }
            // A waiting job of 15 CPUs: room beside j-a at once, unless j-a holds n0 whole.
            let wait = c.apply_job(job("ns", "j-wait", "1"));
            c.apply_group(group(
                "ns",
                "j-wait-pg",
                "j-wait",
                50,
                PodGroupPhase::Inqueue,
            ));
            c.estimate_starts(&nodes, &keys, now);
            match c.snapshot(&wait).unwrap().estimate.as_deref() {
                Some(Estimate::At { start, .. }) => *start,
                other => panic!("an estimate: {other:?}"),
            }
        };
        assert_eq!(estimate_of(false), now, "15 CPUs are free beside j-a");
        assert_eq!(
            estimate_of(true),
            Timestamp::from_second(1_800_000_200).unwrap(),
            "n0 is j-a's whole until it ends"
        );
    }

    /// Review findings 5 and 7: the monitor's replay reads the windows' taints as its decisions and
    /// `admin queue` do, from the nodes: a waiting job that does not tolerate a window whose taint is on
    /// a node is held by it, whether this runner may write taints or not, and a window of some nodes
    /// whose taint is on no node holds nobody, not even a job created gated for it.
    #[test]
    fn the_replay_holds_a_job_by_the_taints_on_the_nodes() {
        let keys = AnnotationKeys::new("ucloud.dk/");
        let at = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        let nodes = [Node {
            name: "n0".into(),
            allocatable: Resources {
                cpu_milli: 16_000,
                memory_mib: 65_536,
                gpu: 0,
            },
            reserved_for: None,
        }];
        let window = |nodes: &[&str]| crate::cluster::Window {
            id: "w".into(),
            start: at(100),
            end: at(200),
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            reason: None,
            created_at: Some(at(0)),
            created_by: None,
        };
        let start_of = |windows: Vec<crate::cluster::Window>, tainted: &[&str], gated: bool| {
            let mut c = Cache::new();
            let mut j = job("ns", "j-wait", "1");
            if gated {
                j.metadata.annotations = Some(BTreeMap::from([(
                    keys.maintenance_held.clone(),
                    "w".to_owned(),
                )]));
            }
            let wait = c.apply_job(j);
            c.apply_group(group(
                "ns",
                "j-wait-pg",
                "j-wait",
                0,
                PodGroupPhase::Inqueue,
            ));
            c.set_maintenance_windows(Some(Arc::new(windows)));
            c.set_maintenance_tainted(Arc::new(tainted.iter().map(|t| (*t).to_owned()).collect()));
            c.estimate_starts(&nodes, &keys, at(0));
            match c.snapshot(&wait).unwrap().estimate.as_deref() {
                Some(Estimate::At { start, .. }) => *start,
                other => panic!("an estimate: {other:?}"),
            }
        };
        // Without a time limit the window is in its way: held by its taint until its end.
        assert_eq!(start_of(vec![window(&[])], &["w"], false), at(200));
        assert_eq!(start_of(vec![window(&[])], &[], false), at(0), "no taint");
        // Gated for a window of a node whose taint is on no node: nothing holds it.
        assert_eq!(start_of(vec![window(&["gone"])], &[], true), at(0));
        assert_eq!(start_of(vec![window(&[])], &[], true), at(200), "gated");
    }

    /// An expectation (no reservation: no `sla-waiting-time`) is told with how many of the expectations
    /// made before, for jobs that have started since, held; a bound is not.
    #[test]
    fn expectations_carry_the_record_of_those_before_them() {
        let keys = AnnotationKeys::new("ucloud.dk/");
        let at = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        let nodes = [Node {
            name: "n0".into(),
            allocatable: Resources {
                cpu_milli: 16_000,
                memory_mib: 65_536,
                gpu: 0,
            },
            reserved_for: None,
        }];
        let mut c = Cache::new();
        // j-run holds the node until +100 s; j-a waits for it, then j-b.
        let mut run = job("ns", "j-run", "1");
        run.metadata.annotations = Some(BTreeMap::from([(
            keys.expiry.clone(),
            at(100).as_millisecond().to_string(),
        )]));
        c.apply_job(run);
        let mut g = group("ns", "j-run-pg", "j-run", 0, PodGroupPhase::Running);
        g.spec.min_resources = BTreeMap::from([("cpu".to_owned(), Quantity("16".into()))]);
        c.apply_group(g);
        let mut p = pod("ns", "j-run", "j-run-job-0");
        p.spec = Some(PodSpec {
            node_name: Some("n0".into()),
            ..PodSpec::default()
        });
        c.apply_pod(p);
        let waiting = |c: &mut Cache, name: &str, created: i64, phase| {
            let mut j = job("ns", name, "1");
            j.metadata.annotations = Some(BTreeMap::from([(
                keys.max_time.clone(),
                "60000".to_owned(),
            )]));
            c.apply_job(j);
            let mut g = group("ns", &format!("{name}-pg"), name, created, phase);
            g.spec.min_resources = BTreeMap::from([("cpu".to_owned(), Quantity("16".into()))]);
            c.apply_group(g);
        };
        waiting(&mut c, "j-a", 10, PodGroupPhase::Inqueue);
        c.estimate_starts(&nodes, &keys, at(20));
        let basis = |c: &Cache, name: &str| match c
            .snapshot(&JobKey::new("ns", name))
            .unwrap()
            .estimate
            .as_deref()
        {
            Some(Estimate::At {
                basis,
                bound: false,
                ..
            }) => basis.clone(),
            other => panic!("an expectation: {other:?}"),
        };
        assert!(
            basis(&c, "j-a").starts_with("expected by "),
            "{}",
            basis(&c, "j-a")
        );
        assert!(!basis(&c, "j-a").contains("held"), "no record yet");
        // j-a starts (later than expected, at +150 s), j-b waits: its expectation carries 0 of 1.
        waiting(&mut c, "j-a", 10, PodGroupPhase::Running);
        waiting(&mut c, "j-b", 140, PodGroupPhase::Inqueue);
        c.estimate_starts(&nodes, &keys, at(150));
        assert!(
            basis(&c, "j-b").ends_with("0 of 1 held"),
            "{}",
            basis(&c, "j-b")
        );
        // The same record, as numbers for the event's pending details.
        let record = match c
            .snapshot(&JobKey::new("ns", "j-b"))
            .unwrap()
            .estimate
            .as_deref()
        {
            Some(Estimate::At { record, .. }) => *record,
            other => panic!("an expectation: {other:?}"),
        };
        assert_eq!(
            record,
            Some(forecast::ExpectationRecord { held: 0, made: 1 })
        );
    }
}
