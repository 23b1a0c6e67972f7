//! What the monitor decodes of the objects its watches bring: only the fields it reads.
//!
//! Decoding watch events was most of a monitored runner's work (callgrind, issue 46: 63% of its
//! instructions went to `serde_json` building whole objects). A skipped field is still read through
//! (JSON has no lengths), but as `serde`'s `IgnoredAny`: nothing is allocated or converted for it. So
//! what is decoded here is what costs, and this module names it, field by field.
//!
//! Of an object's metadata ([`meta`]): name, namespace, uid, resourceVersion, creation and deletion
//! timestamps, and, as the kind needs them ([`Reads`]), labels, annotations, finalizers and owner
//! references. Never `managedFields` (on a real API server a list of field sets per writer, each a JSON
//! tree, often the largest part of an object's metadata), `generation`, `generateName`, `selfLink` nor
//! `deletionGracePeriodSeconds`: nothing in the monitor reads them. Of a label or annotation map only
//! the keys the kind's [`Reads`] names are kept; the others' values are skipped unread.
//!
//! Of a pod's status ([`pod_status`]): what the pod read type (`cache::WatchedPod`) reads or keeps, no more.

use std::marker::PhantomData;

use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer};

use crate::cluster::kept_map::{Kept, Keys};
use crate::volcano::{ANNOTATION_JOB_VERSION, LABEL_JOB_NAME, LABEL_TASK_INDEX};

/// Which parts of its metadata a kind's readers use.
pub trait Reads {
    /// Whether the label `key` is kept.
    fn label(key: &str) -> bool;
    /// Whether the annotation `key` is kept.
    fn annotation(key: &str) -> bool;
    /// Whether owner references and finalizers are kept.
    const OWNERS_AND_FINALIZERS: bool;
}

/// Every label, annotation, owner and finalizer: VolcanoJobs (their annotations are the monitor's
/// durable records, their finalizer its hold on the job) and Nodes.
#[derive(Debug)]
pub enum Whole {}

impl Reads for Whole {
    fn label(_: &str) -> bool {
        true
    }
    fn annotation(_: &str) -> bool {
        true
    }
    const OWNERS_AND_FINALIZERS: bool = true;
}

/// A pod: the two Volcano labels that say its job and rank, the annotation that says its job's attempt
/// (`cache::WatchedPod::attempt`); no owners, no finalizers (the cache never kept them).
#[derive(Debug)]
pub enum PodReads {}

impl Reads for PodReads {
    fn label(key: &str) -> bool {
        key == LABEL_JOB_NAME || key == LABEL_TASK_INDEX
    }
    fn annotation(key: &str) -> bool {
        key == ANNOTATION_JOB_VERSION
    }
    const OWNERS_AND_FINALIZERS: bool = false;
}

/// A PodGroup: its owner (its job, [`super::keys::job_of_group`]); no labels, no annotations (Volcano
/// copies the job's onto it: read there, not here).
#[derive(Debug)]
pub enum GroupReads {}

impl Reads for GroupReads {
    fn label(_: &str) -> bool {
        false
    }
    fn annotation(_: &str) -> bool {
        false
    }
    const OWNERS_AND_FINALIZERS: bool = true;
}

/// The metadata fields the monitor reads (see the module documentation).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", bound = "")]
struct Meta<R: Reads> {
    #[serde(default)]
    annotations: Kept<AnnotationKeys<R>>,
    #[serde(default)]
    creation_timestamp: Option<Time>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
    #[serde(default)]
    finalizers: IfOwners<R, Vec<String>>,
    #[serde(default)]
    labels: Kept<LabelKeys<R>>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    owner_references: IfOwners<R, Vec<OwnerReference>>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    uid: Option<String>,
}

/// Decodes an object's `metadata` with only what `R` reads (a `deserialize_with` for the slim read
/// types' `metadata`); `null` is empty metadata, as a missing one.
pub fn meta<'de, R: Reads, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let Some(m) = Option::<Meta<R>>::deserialize(d)? else {
        return Ok(ObjectMeta::default());
    };
    Ok(ObjectMeta {
        annotations: m.annotations.into_map(),
        creation_timestamp: m.creation_timestamp,
        deletion_timestamp: m.deletion_timestamp,
        finalizers: m.finalizers.value,
        labels: m.labels.into_map(),
        name: m.name,
        namespace: m.namespace,
        owner_references: m.owner_references.value,
        resource_version: m.resource_version,
        uid: m.uid,
        ..ObjectMeta::default()
    })
}

struct LabelKeys<R>(PhantomData<R>);
struct AnnotationKeys<R>(PhantomData<R>);

impl<R: Reads> Keys for LabelKeys<R> {
    fn keep(key: &str) -> bool {
        R::label(key)
    }
}

impl<R: Reads> Keys for AnnotationKeys<R> {
    fn keep(key: &str) -> bool {
        R::annotation(key)
    }
}

/// A field decoded only when `R` keeps owners and finalizers (skipped unread otherwise).
struct IfOwners<R, T> {
    value: Option<T>,
    reads: PhantomData<R>,
}

impl<R, T> Default for IfOwners<R, T> {
    fn default() -> Self {
        Self {
            value: None,
            reads: PhantomData,
        }
    }
}

impl<'de, R: Reads, T: Deserialize<'de>> Deserialize<'de> for IfOwners<R, T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = if R::OWNERS_AND_FINALIZERS {
            Option::<T>::deserialize(d)?
        } else {
            IgnoredAny::deserialize(d)?;
            None
        };
        Ok(Self {
            value,
            reads: PhantomData,
        })
    }
}

/// A pod's status as the monitor reads it: its phase and why, where and since when it runs, its
/// conditions (for why it is being taken away, [`super::observe::Disruption::said`]) and of each
/// container its name, image and state, whether ready or started, and its restarts. Not its IPs beyond
/// the first, its resource claims, nor a container's id, image id, last state, resources, user or mounts.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimPodStatus {
    #[serde(default)]
    conditions: Option<Vec<PodCondition>>,
    #[serde(default)]
    container_statuses: Option<Vec<SlimContainerStatus>>,
    #[serde(default)]
    ephemeral_container_statuses: Option<Vec<SlimContainerStatus>>,
    #[serde(default, rename = "hostIP")]
    host_ip: Option<String>,
    #[serde(default)]
    init_container_statuses: Option<Vec<SlimContainerStatus>>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    nominated_node_name: Option<String>,
    #[serde(default)]
    observed_generation: Option<i64>,
    #[serde(default)]
    phase: Option<String>,
    #[serde(default, rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(default)]
    qos_class: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    resize: Option<String>,
    #[serde(default)]
    start_time: Option<Time>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimContainerStatus {
    // Required by the API; `null` or missing reads as the default, as k8s-openapi reads them.
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    ready: Option<bool>,
    #[serde(default)]
    restart_count: Option<i32>,
    #[serde(default)]
    started: Option<bool>,
    #[serde(default)]
    state: Option<ContainerState>,
    #[serde(default)]
    stop_signal: Option<String>,
}

impl From<SlimContainerStatus> for ContainerStatus {
    fn from(c: SlimContainerStatus) -> Self {
        ContainerStatus {
            image: c.image.unwrap_or_default(),
            name: c.name.unwrap_or_default(),
            ready: c.ready.unwrap_or_default(),
            restart_count: c.restart_count.unwrap_or_default(),
            started: c.started,
            state: c.state,
            stop_signal: c.stop_signal,
            ..ContainerStatus::default()
        }
    }
}

/// Decodes a pod's `status` with only what the monitor reads (see [`SlimPodStatus`]).
pub fn pod_status<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PodStatus>, D::Error> {
    let Some(s) = Option::<SlimPodStatus>::deserialize(d)? else {
        return Ok(None);
    };
    let containers = |v: Option<Vec<SlimContainerStatus>>| {
        v.map(|v| v.into_iter().map(ContainerStatus::from).collect::<Vec<_>>())
    };
    Ok(Some(PodStatus {
        conditions: s.conditions,
        container_statuses: containers(s.container_statuses),
        ephemeral_container_statuses: containers(s.ephemeral_container_statuses),
        host_ip: s.host_ip,
        init_container_statuses: containers(s.init_container_statuses),
        message: s.message,
        nominated_node_name: s.nominated_node_name,
        observed_generation: s.observed_generation,
        phase: s.phase,
        pod_ip: s.pod_ip,
        qos_class: s.qos_class,
        reason: s.reason,
        resize: s.resize,
        start_time: s.start_time,
        ..PodStatus::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::{GroupReads, PodReads, Reads, Whole};
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde::Deserialize;
    use serde_json::json;

    /// An object read as the slim read types read theirs (without importing them: they are above).
    #[derive(Deserialize)]
    #[serde(bound = "")]
    struct Read<R: Reads> {
        #[serde(default, deserialize_with = "super::meta::<R, _>")]
        metadata: ObjectMeta,
        #[serde(default, deserialize_with = "super::pod_status")]
        status: Option<PodStatus>,
        #[serde(skip)]
        reads: std::marker::PhantomData<R>,
    }

    type WatchedJob = Read<Whole>;
    type WatchedPod = Read<PodReads>;
    type WatchedGroup = Read<GroupReads>;

    fn managed_fields() -> serde_json::Value {
        json!([{"manager": "volcano", "operation": "Update", "apiVersion": "batch.volcano.sh/v1alpha1",
                "time": "2026-11-29T04:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:ucloud.dk/x": {}}}}}])
    }

    #[test]
    fn a_jobs_metadata_is_read_whole_but_its_managed_fields() {
        let text = json!({
            "metadata": {
                "name": "j-1", "namespace": "ns", "uid": "u-1", "resourceVersion": "42",
                "generation": 3, "generateName": "j-", "selfLink": "/x", "deletionGracePeriodSeconds": 0,
                "creationTimestamp": "2026-11-29T04:00:00Z", "deletionTimestamp": "2026-11-29T05:00:00Z",
                "labels": {"a": "1", "b": "2"},
                "annotations": {"ucloud.dk/x": "{\"k\":\"v\"}", "other": "o"},
                "finalizers": ["ucloud.dk/monitor"],
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "ux"}],
                "managedFields": managed_fields(),
            },
        })
        .to_string();
        let m = serde_json::from_str::<WatchedJob>(&text).unwrap().metadata;
        assert_eq!(m.name.as_deref(), Some("j-1"));
        assert_eq!(m.namespace.as_deref(), Some("ns"));
        assert_eq!(m.uid.as_deref(), Some("u-1"));
        assert_eq!(m.resource_version.as_deref(), Some("42"));
        assert!(m.creation_timestamp.is_some() && m.deletion_timestamp.is_some());
        assert_eq!(m.labels.unwrap().len(), 2);
        let annotations = m.annotations.unwrap();
        assert_eq!(annotations["ucloud.dk/x"], "{\"k\":\"v\"}");
        assert_eq!(annotations["other"], "o");
        assert_eq!(m.finalizers.unwrap(), ["ucloud.dk/monitor"]);
        assert_eq!(m.owner_references.unwrap()[0].name, "x");
        assert!(m.managed_fields.is_none() && m.generation.is_none());
        assert!(m.generate_name.is_none() && m.self_link.is_none());
        assert!(m.deletion_grace_period_seconds.is_none());
    }

    #[test]
    fn a_pod_keeps_its_job_and_rank_labels_and_its_attempt() {
        let text = json!({
            "metadata": {
                "name": "j-1-main-0", "namespace": "ns", "resourceVersion": "7",
                "labels": {"volcano.sh/job-name": "j-1", "volcano.sh/task-index": "0",
                           "volcano.sh/queue-name": "q"},
                "annotations": {"volcano.sh/job-version": "2", "volcano.sh/task-spec": "main",
                                "big": {"not": ["a", "string"]}},
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "ux"}],
                "finalizers": ["f"],
                "managedFields": managed_fields(),
            },
        })
        .to_string();
        let pod = serde_json::from_str::<WatchedPod>(&text).unwrap();
        let m = &pod.metadata;
        assert_eq!(
            m.annotations.as_ref().unwrap()["volcano.sh/job-version"],
            "2"
        );
        let labels: Vec<&str> = m.labels.iter().flatten().map(|(k, _)| k.as_str()).collect();
        assert_eq!(labels, ["volcano.sh/job-name", "volcano.sh/task-index"]);
        assert_eq!(m.annotations.as_ref().unwrap().len(), 1);
        assert!(m.owner_references.is_none() && m.finalizers.is_none());
        assert!(m.managed_fields.is_none());

        // An escaped key is compared as decoded.
        let escaped = r#"{"metadata": {"labels": {"volcano.sh\/task-index": "3"}}}"#;
        let pod = serde_json::from_str::<WatchedPod>(escaped).unwrap();
        assert_eq!(pod.metadata.labels.unwrap()["volcano.sh/task-index"], "3");
    }

    #[test]
    fn a_podgroup_keeps_its_owner_and_no_labels_or_annotations() {
        let text = json!({
            "metadata": {
                "name": "j-1-pg", "namespace": "ns", "resourceVersion": "9",
                "labels": {"a": "1"}, "annotations": {"ucloud.dk/x": "y"},
                "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                                     "name": "j-1", "uid": "u"}],
            },
            "spec": {"minMember": 2, "queue": "q"},
            "status": {"phase": "Pending"},
        })
        .to_string();
        let read = serde_json::from_str::<WatchedGroup>(&text).unwrap();
        let pg = crate::volcano::PodGroup {
            metadata: read.metadata,
            ..Default::default()
        };
        assert!(pg.metadata.labels.as_ref().is_none_or(|l| l.is_empty()));
        assert!(
            pg.metadata
                .annotations
                .as_ref()
                .is_none_or(|a| a.is_empty())
        );
        assert_eq!(
            super::super::keys::job_of_group(&pg).unwrap().name.as_ref(),
            "j-1"
        );
    }

    #[test]
    fn null_and_missing_metadata_and_maps_read_as_none() {
        for text in [
            r#"{"metadata": null, "status": null}"#,
            r#"{}"#,
            r#"{"metadata": {"labels": null, "annotations": null, "ownerReferences": null}}"#,
        ] {
            let pod = serde_json::from_str::<WatchedPod>(text).unwrap();
            assert!(
                pod.metadata.labels.is_none() && pod.metadata.annotations.is_none(),
                "{text}"
            );
            let job = serde_json::from_str::<WatchedJob>(text).unwrap();
            assert!(job.metadata.labels.is_none() && job.metadata.owner_references.is_none());
        }
        assert!(serde_json::from_str::<WatchedPod>(r#"{"metadata": {"labels": 3}}"#).is_err());
    }

    #[test]
    fn a_pods_status_keeps_what_the_monitor_reads() {
        let text = json!({
            "metadata": {"name": "p", "namespace": "ns",
                         "labels": {"volcano.sh/job-name": "j-1", "volcano.sh/task-index": "0"}},
            "status": {
                "phase": "Running", "reason": "r", "message": "m", "hostIP": "10.0.0.1",
                "hostIPs": [{"ip": "10.0.0.1"}], "podIP": "10.1.0.5", "podIPs": [{"ip": "10.1.0.5"}],
                "qosClass": "Guaranteed", "startTime": "2026-11-29T04:00:00Z",
                "nominatedNodeName": "n", "observedGeneration": 1, "resize": "InProgress",
                "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
                "containerStatuses": [{
                    "name": "main", "image": "img", "imageID": "sim://img", "containerID": "c://1",
                    "ready": true, "started": true, "restartCount": 2, "stopSignal": "SIGTERM",
                    "state": {"terminated": {"exitCode": 3, "startedAt": "2026-11-29T04:00:00Z",
                                             "finishedAt": "2026-11-29T04:01:00Z"}},
                    "lastState": {"terminated": {"exitCode": 1}},
                    "volumeMounts": [{"name": "v", "mountPath": "/v"}],
                }],
                "initContainerStatuses": [{"name": "init", "image": null, "ready": null,
                                           "restartCount": null}],
            },
        })
        .to_string();
        let pod = serde_json::from_str::<WatchedPod>(&text).unwrap();
        let s = pod.status.unwrap();
        assert_eq!(
            s.conditions.unwrap()[0].reason.as_deref(),
            Some("PreemptionByScheduler")
        );
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(
            (s.reason.as_deref(), s.message.as_deref()),
            (Some("r"), Some("m"))
        );
        assert_eq!(s.host_ip.as_deref(), Some("10.0.0.1"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.1.0.5"));
        assert_eq!(s.qos_class.as_deref(), Some("Guaranteed"));
        assert_eq!(s.nominated_node_name.as_deref(), Some("n"));
        assert_eq!(
            (s.observed_generation, s.resize.as_deref()),
            (Some(1), Some("InProgress"))
        );
        assert!(s.start_time.is_some());
        assert!(s.host_ips.is_none() && s.pod_ips.is_none());
        let c = &s.container_statuses.unwrap()[0];
        assert_eq!((c.name.as_str(), c.image.as_str()), ("main", "img"));
        assert_eq!((c.ready, c.started, c.restart_count), (true, Some(true), 2));
        assert_eq!(c.stop_signal.as_deref(), Some("SIGTERM"));
        let ended = c.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(ended.exit_code, 3);
        assert!(ended.finished_at.is_some());
        assert!(c.image_id.is_empty() && c.container_id.is_none() && c.last_state.is_none());
        assert!(c.volume_mounts.is_none());
        let init = &s.init_container_statuses.unwrap()[0];
        assert_eq!(
            (init.image.as_str(), init.ready, init.restart_count),
            ("", false, 0)
        );
    }
}
