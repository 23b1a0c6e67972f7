//! Rust types that mirror the Volcano CRDs: the batch.volcano.sh/v1alpha1 `Job` (vcjob), the
//! scheduling.volcano.sh/v1beta1 `PodGroup` and `Queue`.
//!
//! Only the fields volcano-runner writes or reads are modelled; unknown fields in objects read from a
//! cluster are ignored, so never write one of these back with PUT: use patches. Field names, types and
//! bounds follow `crds/batch.volcano.sh_jobs.yaml` (the tests validate every rendered Job against that
//! schema). String enums keep values they do not know as `Other(..)`, because Volcano adds phases and
//! events over time and a monitor must not fail on them.
//!
//! The three kinds implement `k8s_openapi::Resource` and `k8s_openapi::Metadata`, so `kube::Api<VolcanoJob>`
//! works without a CRD derive.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Serialize};

/// API group of the Job kind.
pub const BATCH_GROUP: &str = "batch.volcano.sh";
/// API version of the Job kind.
pub const BATCH_VERSION: &str = "v1alpha1";
/// API group of the PodGroup and Queue kinds.
pub const SCHEDULING_GROUP: &str = "scheduling.volcano.sh";
/// API version of the PodGroup and Queue kinds.
pub const SCHEDULING_VERSION: &str = "v1beta1";

/// Label Volcano puts on every pod (and on its PodGroup) with the job's name.
pub const LABEL_JOB_NAME: &str = "volcano.sh/job-name";
/// Label Volcano puts on every pod with the job's namespace.
pub const LABEL_JOB_NAMESPACE: &str = "volcano.sh/job-namespace";
/// Label/annotation Volcano puts on every pod with its task name.
pub const LABEL_TASK_SPEC: &str = "volcano.sh/task-spec";
/// Label/annotation Volcano puts on every pod with its index within the task (the rank).
pub const LABEL_TASK_INDEX: &str = "volcano.sh/task-index";
/// Annotation with the queue a PodGroup belongs to.
pub const LABEL_QUEUE_NAME: &str = "volcano.sh/queue-name";
/// Annotation Volcano puts on every pod with the job's `status.version` it was created for: the
/// attempt the pod runs in, counted from 0 (one more after each restart of the job).
pub const ANNOTATION_JOB_VERSION: &str = "volcano.sh/job-version";

/// The `(namespace, name)` of the VolcanoJob a pod belongs to, read from Volcano's job-name label (the
/// pod's own namespace: Volcano creates a job's pods beside it). `None` for a pod without the label (not
/// a Volcano job's). The one reading of it: the monitor keys its cache by it and the cluster's bookings
/// match pods to their jobs by it, and neither room may import the other.
pub fn job_of_pod(pod: &k8s_openapi::api::core::v1::Pod) -> Option<(&str, &str)> {
    let name = pod.metadata.labels.as_ref()?.get(LABEL_JOB_NAME)?;
    Some((pod.metadata.namespace.as_deref().unwrap_or_default(), name))
}

/// Declares a string enum that keeps unknown values, with serde as a plain string.
macro_rules! string_enum {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
            /// A value this version of volcano-runner does not know; kept verbatim.
            Other(String),
        }

        impl $name {
            /// The value as Volcano spells it.
            pub fn as_str(&self) -> &str {
                match self {
                    $(Self::$variant => $text,)+
                    Self::Other(other) => other,
                }
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                match value {
                    $($text => Self::$variant,)+
                    other => Self::Other(other.to_owned()),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                Ok(Self::from(text.as_str()))
            }
        }
    };
}

string_enum! {
    /// A vcjob phase (`status.state.phase`).
    pub enum JobPhase {
        /// Waiting in the queue for the whole gang to fit.
        Pending = "Pending",
        /// Being stopped by an AbortJob action; can be resumed.
        Aborting = "Aborting",
        /// Stopped by an AbortJob action; can be resumed.
        Aborted = "Aborted",
        /// At least minAvailable pods run.
        Running = "Running",
        /// Pods are being recreated after a RestartJob action.
        Restarting = "Restarting",
        /// Being completed by a CompleteJob action.
        Completing = "Completing",
        /// Finished successfully.
        Completed = "Completed",
        /// Being stopped by a TerminateJob action.
        Terminating = "Terminating",
        /// Stopped by a TerminateJob action (ended unexpectedly).
        Terminated = "Terminated",
        /// Failed, e.g. the retries ran out.
        Failed = "Failed",
    }
}

impl JobPhase {
    /// True for phases a job never leaves: Completed, Terminated, Failed, Aborted.
    pub fn is_finished(&self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Terminated | Self::Failed | Self::Aborted
        )
    }

    /// True for phases on the way to a finished one (Completing, Terminating, Aborting) and finished ones.
    pub fn is_ending(&self) -> bool {
        self.is_finished() || matches!(self, Self::Completing | Self::Terminating | Self::Aborting)
    }
}

string_enum! {
    /// An event a lifecycle policy reacts to (bus/v1alpha1 events).
    pub enum PolicyEvent {
        /// Any event; must be the only policy when used.
        Any = "*",
        /// A pod is pending.
        PodPending = "PodPending",
        /// A pod started running.
        PodRunning = "PodRunning",
        /// A pod ended with a non-zero exit code (restartPolicy Never).
        PodFailed = "PodFailed",
        /// A pod was evicted or deleted, e.g. on node loss or drain.
        PodEvicted = "PodEvicted",
        /// Part of a gang cannot be scheduled while other pods already run.
        Unknown = "Unknown",
        /// Every pod of a task succeeded.
        TaskCompleted = "TaskCompleted",
        /// A task failed.
        TaskFailed = "TaskFailed",
        /// Internal to Volcano.
        OutOfSync = "OutOfSync",
        /// Internal to Volcano.
        CommandIssued = "CommandIssued",
        /// The job's spec was updated.
        JobUpdated = "JobUpdated",
    }
}

string_enum! {
    /// What a lifecycle policy does (bus/v1alpha1 actions).
    pub enum PolicyAction {
        /// Evict all pods, recreate none; the job can be resumed.
        AbortJob = "AbortJob",
        /// Kill all pods and start them again; counts against maxRetry.
        RestartJob = "RestartJob",
        /// Restart one task's pods.
        RestartTask = "RestartTask",
        /// Restart one pod.
        RestartPod = "RestartPod",
        /// Evict all pods; the job cannot be resumed.
        TerminateJob = "TerminateJob",
        /// Kill unfinished pods and mark the job Completed.
        CompleteJob = "CompleteJob",
        /// Resume an aborted job.
        ResumeJob = "ResumeJob",
    }
}

string_enum! {
    /// A PodGroup phase.
    pub enum PodGroupPhase {
        /// Not enough resources to enqueue.
        Pending = "Pending",
        /// Admitted; the controller may create pods.
        Inqueue = "Inqueue",
        /// The gang runs.
        Running = "Running",
        /// Part of the gang runs, the rest cannot be scheduled.
        Unknown = "Unknown",
        /// Every pod finished.
        Completed = "Completed",
    }
}

string_enum! {
    /// A Queue state.
    pub enum QueueState {
        /// Accepts jobs.
        Open = "Open",
        /// Accepts no jobs.
        Closed = "Closed",
        /// Closing; still has PodGroups.
        Closing = "Closing",
        /// The controller could not tell.
        Unknown = "Unknown",
    }
}

/// Implements serde and the k8s-openapi resource traits for a top-level kind with metadata, spec and an
/// optional status: `apiVersion` and `kind` are written from constants and ignored when read.
macro_rules! custom_resource {
    ($name:ident, $spec:ty, $status:ty, $group:literal, $version:literal, $kind:literal, $plural:literal, $scope:ty) => {
        impl k8s_openapi::Resource for $name {
            const API_VERSION: &'static str = concat!($group, "/", $version);
            const GROUP: &'static str = $group;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = $scope;
        }

        impl k8s_openapi::ListableResource for $name {
            const LIST_KIND: &'static str = concat!($kind, "List");
        }

        impl k8s_openapi::Metadata for $name {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                #[derive(Serialize)]
                #[serde(rename_all = "camelCase")]
                struct Wire<'a> {
                    api_version: &'static str,
                    kind: &'static str,
                    metadata: &'a ObjectMeta,
                    spec: &'a $spec,
                    #[serde(skip_serializing_if = "Option::is_none")]
                    status: &'a Option<$status>,
                }
                Wire {
                    api_version: <Self as k8s_openapi::Resource>::API_VERSION,
                    kind: $kind,
                    metadata: &self.metadata,
                    spec: &self.spec,
                    status: &self.status,
                }
                .serialize(serializer)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                #[derive(Deserialize)]
                struct Wire {
                    #[serde(default)]
                    metadata: ObjectMeta,
                    #[serde(default)]
                    spec: $spec,
                    #[serde(default)]
                    status: Option<$status>,
                }
                let wire = Wire::deserialize(deserializer)?;
                Ok(Self {
                    metadata: wire.metadata,
                    spec: wire.spec,
                    status: wire.status,
                })
            }
        }
    };
}

/// A Volcano Job (`vcjob`), `batch.volcano.sh/v1alpha1`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VolcanoJob {
    /// Name, namespace, labels and annotations (the job's durable facts live in annotations).
    pub metadata: ObjectMeta,
    /// What Volcano should run.
    pub spec: JobSpec,
    /// Written by Volcano's job controller; `None` in objects volcano-runner builds.
    pub status: Option<JobStatus>,
}

custom_resource!(
    VolcanoJob,
    JobSpec,
    JobStatus,
    "batch.volcano.sh",
    "v1alpha1",
    "Job",
    "jobs",
    k8s_openapi::NamespaceResourceScope
);

/// `spec` of a Volcano Job. Only `minAvailable`, `tasks[*].replicas`, `maxRetry` and
/// `priorityClassName` may change after creation (admission rule); everything else is immutable, so
/// mutable job facts (expiry, extensions, accounting) live in annotations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSpec {
    /// The scheduler that places the pods; `volcano` for gang scheduling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    /// Gang size: no pod starts until this many can start together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<i32>,
    /// PVCs Volcano mounts into every pod; volcano-runner uses pod volumes instead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeSpec>,
    /// The job's tasks; volcano-runner uses exactly one, `job`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskSpec>,
    /// Job-wide reactions to pod events.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<LifecyclePolicy>,
    /// Job plugins by name (`env`, `svc`, `ssh`, ...), each with its arguments.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plugins: BTreeMap<String, Vec<String>>,
    /// The Volcano queue; it must exist and be Open when the job is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Attempts in total before the job goes Failed (RestartJob increments the retry count and the job
    /// fails once the count reaches this). Volcano's webhook turns 0 into 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retry: Option<i32>,
    /// Volcano deletes a finished job this long after it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<i32>,
    /// PriorityClass of the pods; may change after creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// The job completes once this many pods succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_success: Option<i32>,
    /// The user's own estimate of the run time, for schedulers that use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_estimate: Option<String>,
}

/// A PVC mount declared at job level (`spec.volumes[]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSpec {
    /// Where the claim is mounted in every container.
    pub mount_path: String,
    /// An existing PVC to mount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_claim_name: Option<String>,
}

/// One task of a job: a set of identical pods (`<job>-<task>-<index>`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskSpec {
    /// A DNS-1123 label; part of every pod name.
    #[serde(default)]
    pub name: String,
    /// Number of pods (ranks); may change after creation.
    #[serde(default)]
    pub replicas: i32,
    /// Pods that must be schedulable together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<i32>,
    /// Attempts of this task before it fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retry: Option<i32>,
    /// The pod template every replica is made from.
    #[serde(default)]
    pub template: PodTemplateSpec,
    /// Reactions to events of this task's pods; job-level policies apply when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<LifecyclePolicy>,
    /// NUMA placement (`none`, `best-effort`, `restricted`, `single-numa-node`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_policy: Option<String>,
}

/// What Volcano does when an event happens (or a pod exits with a given code).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LifecyclePolicy {
    /// What to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<PolicyAction>,
    /// The event that triggers the action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<PolicyEvent>,
    /// Several triggering events.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<PolicyEvent>,
    /// Exclusive with `event`/`events`; 0 is not allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// A grace period before the action runs, as a Go duration (`30s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

impl LifecyclePolicy {
    /// A policy that runs `action` on `event`.
    pub fn on(event: PolicyEvent, action: PolicyAction) -> Self {
        Self {
            action: Some(action),
            event: Some(event),
            ..Self::default()
        }
    }
}

/// `status` of a Volcano Job, written by its controller.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    /// The phase and why.
    #[serde(default)]
    pub state: JobState,
    /// Pods that must be schedulable together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<i32>,
    /// Pods pending.
    #[serde(default)]
    pub pending: i32,
    /// Pods running.
    #[serde(default)]
    pub running: i32,
    /// Pods that succeeded.
    #[serde(default)]
    pub succeeded: i32,
    /// Pods that failed.
    #[serde(default)]
    pub failed: i32,
    /// Pods terminating.
    #[serde(default)]
    pub terminating: i32,
    /// Pods in an unknown state.
    #[serde(default)]
    pub unknown: i32,
    /// Increments on every restart of the job.
    #[serde(default)]
    pub version: i32,
    /// Restarts so far; the job fails when it reaches `spec.maxRetry`.
    #[serde(default)]
    pub retry_count: i32,
    /// How long the job has run, as Volcano computes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_duration: Option<String>,
    /// Pod counts per task and pod phase.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub task_status_count: BTreeMap<String, TaskState>,
    /// Objects the job plugins created (e.g. `plugin-svc: svc`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub controlled_resources: BTreeMap<String, String>,
    /// The phase history.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<JobCondition>,
}

/// The current phase with its reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobState {
    /// The phase; unknown values are kept.
    pub phase: JobPhase,
    /// Why the phase changed (machine-readable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

impl Default for JobState {
    fn default() -> Self {
        Self {
            phase: JobPhase::Pending,
            reason: None,
            message: None,
            last_transition_time: None,
        }
    }
}

/// Pod counts of one task by pod phase (`Running`, `Succeeded`, ...).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskState {
    /// The phase; unknown values are kept.
    #[serde(default)]
    pub phase: BTreeMap<String, i32>,
}

/// One entry of the phase history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobCondition {
    /// Written by the controller.
    pub status: JobPhase,
    /// When it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

/// A PodGroup, `scheduling.volcano.sh/v1beta1`: the gang Volcano schedules for a job, named
/// `<job>-<jobUID>`. Its conditions say why a job is still pending.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodGroup {
    /// Name, namespace, labels and annotations (the job's durable facts live in annotations).
    pub metadata: ObjectMeta,
    /// What Volcano should run.
    pub spec: PodGroupSpec,
    /// Written by the controller.
    pub status: Option<PodGroupStatus>,
}

custom_resource!(
    PodGroup,
    PodGroupSpec,
    PodGroupStatus,
    "scheduling.volcano.sh",
    "v1beta1",
    "PodGroup",
    "podgroups",
    k8s_openapi::NamespaceResourceScope
);

/// `spec` of a PodGroup.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupSpec {
    /// The gang size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_member: Option<i32>,
    /// The queue the gang waits in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// PriorityClass of the pods; may change after creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Resources the whole gang needs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub min_resources: BTreeMap<String, Quantity>,
}

/// `status` of a PodGroup.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupStatus {
    /// The phase; unknown values are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<PodGroupPhase>,
    /// Scheduling conditions, the latest last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<PodGroupCondition>,
    /// Pods running.
    #[serde(default)]
    pub running: i32,
    /// Pods that succeeded.
    #[serde(default)]
    pub succeeded: i32,
    /// Pods that failed.
    #[serde(default)]
    pub failed: i32,
}

/// A PodGroup condition: `Unschedulable` or `Scheduled`, with the scheduler's reason and message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupCondition {
    /// `Unschedulable` or `Scheduled`.
    #[serde(rename = "type", default)]
    pub type_: String,
    /// Written by the controller.
    #[serde(default)]
    pub status: String,
    #[serde(
        rename = "transitionID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    /// Identifies the scheduling session that set the condition.
    pub transition_id: Option<String>,
    /// When it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// NotEnoughResources, NotEnoughTasks, NotEnoughPodsOfTask, PodFailed, PodDeleted, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A Queue, `scheduling.volcano.sh/v1beta1`, cluster-scoped. Jobs are admitted only to Open queues.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Queue {
    /// Name, namespace, labels and annotations (the job's durable facts live in annotations).
    pub metadata: ObjectMeta,
    /// What Volcano should run.
    pub spec: QueueSpec,
    /// Written by the controller.
    pub status: Option<QueueStatus>,
}

custom_resource!(
    Queue,
    QueueSpec,
    QueueStatus,
    "scheduling.volcano.sh",
    "v1beta1",
    "Queue",
    "queues",
    k8s_openapi::ClusterResourceScope
);

/// `spec` of a Queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueSpec {
    /// Share of the cluster relative to other queues (proportion plugin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    /// Hard cap on the resources the queue's jobs may use.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capability: BTreeMap<String, Quantity>,
    /// Whether other queues may reclaim resources this queue borrowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaimable: Option<bool>,
    /// Parent queue (hierarchical queues).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Queue priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// `fifo`: no later job of the queue starts while an earlier one waits; `traverse` (the default):
    /// a later one that fits starts first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dequeue_strategy: Option<String>,
}

/// `status` of a Queue: what Volcano writes there. The CRD also has PodGroup counts (`pending`,
/// `inqueue`, `running`, `unknown`, `completed`), which Volcano's queue controller has not written since
/// v1.11 (volcano-sh/volcano#3751: they are metrics now, and `vcctl` counts a queue's PodGroups
/// itself); they are left out so that nothing comes to rely on them. Whoever needs them counts the
/// PodGroups by `spec.queue` and `status.phase`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    /// Open, Closing or Closed (the queue controller writes it when it changes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<QueueState>,
    /// What the queue's pods hold (the scheduler writes it at the end of a session when it changed).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocated: BTreeMap<String, Quantity>,
}

impl VolcanoJob {
    /// The current phase, `Pending` when the controller has not written a status yet.
    pub fn phase(&self) -> JobPhase {
        self.status
            .as_ref()
            .map(|s| s.state.phase.clone())
            .unwrap_or(JobPhase::Pending)
    }

    /// How many times Volcano has restarted the job (`status.retryCount`).
    pub fn retries(&self) -> i32 {
        self.status.as_ref().map_or(0, |s| s.retry_count).max(0)
    }

    /// The attempts it is allowed in all: `spec.maxRetry`, or Volcano's default of 3 when unset.
    pub fn max_attempts(&self) -> i32 {
        self.spec.max_retry.filter(|m| *m > 0).unwrap_or(3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_job_is_its_job_name_label_in_its_own_namespace() {
        let mut pod = k8s_openapi::api::core::v1::Pod::default();
        pod.metadata.namespace = Some("ns-a".into());
        pod.metadata.name = Some("j-1-job-0".into());
        assert_eq!(job_of_pod(&pod), None, "no labels");
        pod.metadata.labels = Some(BTreeMap::from([("app".into(), "x".into())]));
        assert_eq!(job_of_pod(&pod), None, "not a Volcano job's pod");
        pod.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_JOB_NAME.into(), "j-1".into());
        assert_eq!(job_of_pod(&pod), Some(("ns-a", "j-1")));
        pod.metadata.namespace = None;
        assert_eq!(job_of_pod(&pod), Some(("", "j-1")));
    }

    #[test]
    fn job_round_trips_with_api_version_and_kind() {
        let mut job = VolcanoJob::default();
        job.metadata.name = Some("j-42".into());
        job.spec.policies.push(LifecyclePolicy::on(
            PolicyEvent::PodFailed,
            PolicyAction::TerminateJob,
        ));
        let value = serde_json::to_value(&job).unwrap();
        assert_eq!(value["apiVersion"], "batch.volcano.sh/v1alpha1");
        assert_eq!(value["kind"], "Job");
        assert_eq!(value["spec"]["policies"][0]["event"], "PodFailed");
        assert_eq!(value["spec"]["policies"][0]["action"], "TerminateJob");
        assert!(value.get("status").is_none());
        let back: VolcanoJob = serde_json::from_value(value).unwrap();
        assert_eq!(back, job);
    }

    #[test]
    fn unknown_phase_is_kept_not_rejected() {
        let job: VolcanoJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": "j-1"},
            "spec": {"someFutureField": 1},
            "status": {"state": {"phase": "Hibernating"}, "running": 2}
        }))
        .unwrap();
        assert_eq!(job.phase(), JobPhase::Other("Hibernating".into()));
        assert_eq!(job.status.unwrap().running, 2);
    }

    #[test]
    fn finished_phases() {
        for phase in ["Completed", "Terminated", "Failed", "Aborted"] {
            assert!(JobPhase::from(phase).is_finished(), "{phase}");
        }
        for phase in [
            "Pending",
            "Running",
            "Restarting",
            "Completing",
            "Terminating",
            "Aborting",
        ] {
            assert!(!JobPhase::from(phase).is_finished(), "{phase}");
        }
        assert!(JobPhase::Terminating.is_ending());
        assert!(!JobPhase::Running.is_ending());
    }

    #[test]
    fn resource_constants_match_the_crds() {
        use k8s_openapi::Resource;
        assert_eq!(
            VolcanoJob::API_VERSION,
            format!("{BATCH_GROUP}/{BATCH_VERSION}")
        );
        assert_eq!(VolcanoJob::URL_PATH_SEGMENT, "jobs");
        assert_eq!(
            PodGroup::API_VERSION,
            format!("{SCHEDULING_GROUP}/{SCHEDULING_VERSION}")
        );
        assert_eq!(Queue::URL_PATH_SEGMENT, "queues");
    }

    #[test]
    fn podgroup_conditions_read() {
        let pg: PodGroup = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "j-1-uid"},
            "spec": {"minMember": 2, "queue": "default"},
            "status": {"phase": "Pending", "conditions": [{"type": "Unschedulable", "status": "True",
                "transitionID": "t1", "reason": "NotEnoughResources", "message": "0/2 nodes"}]}
        }))
        .unwrap();
        let status = pg.status.unwrap();
        assert_eq!(status.phase, Some(PodGroupPhase::Pending));
        assert_eq!(status.conditions[0].type_, "Unschedulable");
        assert_eq!(status.conditions[0].transition_id.as_deref(), Some("t1"));
    }
}
