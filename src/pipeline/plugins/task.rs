//! Task: the gang, the Volcano policies and the user's container.
//!
//! - One task `job` with `replicas` pods and `minAvailable = replicas` (all ranks or none), scheduler
//!   `volcano`, the queue FairShare chose, the `env` and `svc` job plugins (task index, hostnames).
//! - Policies on purpose (UCloud left them empty): a pod that fails ends the whole job (TerminateJob), so
//!   the other ranks of a multi-node job never wait for a dead peer; an evicted pod (node loss, drain)
//!   restarts the job (RestartJob), at most `max_retry` attempts in total. Both configurable.
//! - Container `user-job`: the image, `IfNotPresent`, requests equal to limits: cpu in millicores,
//!   memory in `Mi`, `nvidia.com/gpu` only when the product has GPUs (UCloud wrote `"0"`).
//! - Tolerations from the configuration, and a node selector by product category when configured.
//! - `sla-waiting-time` on the job when `[pipeline.scheduling] sla_waiting_time` is set (Volcano's `sla`
//!   plugin reserves for a job that has waited that long: docs/estimates.md).
//! - The toleration of `<prefix>reserved=<jobId>:NoSchedule`, its own job's only, on every rank of a job
//!   with a `sla-waiting-time` or whole nodes: the monitor may reserve nodes with that taint for a
//!   whole-node or large gang past its waiting time (`[monitor] reserve_nodes`, `monitor::reserve`).
//!   Whether a gang is large (no node holds two of its ranks) depends on the nodes, which are not known
//!   here, so every job the monitor could reserve for carries it; the job id is known here, so no pod is
//!   changed afterwards, and a toleration of a taint nobody writes changes nothing.
//! - Whole nodes (`exclusiveNodes`): a required pod anti-affinity on `kubernetes.io/hostname` against every
//!   pod of any Volcano job (`volcano.sh/job-name` exists), in every namespace (`namespaceSelector: {}`).
//!   Each rank then lands on a node without another job's pod, its own gang's other ranks included, and
//!   since the scheduler also honours the anti-affinity of pods already running, no job's pod joins it
//!   later. Pods that are not Volcano jobs' (DaemonSets, the cluster's own) may stay: that is what the
//!   cluster reserves. Why this and not another way, against the CRDs: Volcano's Job
//!   (`batch.volcano.sh/v1alpha1`) has no exclusivity field, its task template is a full PodTemplateSpec,
//!   and Volcano's `predicates` plugin runs the upstream inter-pod affinity filter; requests sized to a
//!   node would need the node's size at render time and still let a small pod squeeze in beside a
//!   rank that does not use all of it; a node label would need the operator to keep a pool of nodes
//!   aside. The rank's requests stay the product's (what it is charged for and placed by); its CPU and
//!   memory limits go, so it can use all of the node's CPU and memory; GPUs, which Kubernetes hands out
//!   only as requested, are the product's (a product with all of a node's GPUs gives it all of them).
//!   What one whole node is charged comes from `[pipeline.whole_nodes.products]` (by product id, else
//!   category) and is persisted as `wholeNodeCharge`; a product without an entry is refused whole nodes.
//!   Each rank tolerates its own job's reservation taint (above), with or without a waiting time.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, PodAffinityTerm, PodAntiAffinity, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use super::{Plugin, PluginId};
use crate::durable::AnnotationKeys;
use crate::messages::v1::Product;
use crate::pipeline::context::Context;
use crate::pipeline::draft::Draft;
use crate::pipeline::{PipelineError, names};
use crate::volcano::{LifecyclePolicy, PolicyEvent};

/// The resource name of NVIDIA GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// The Task plugin; the module documentation says what it builds and why.
pub struct Task;

impl Plugin for Task {
    fn id(&self) -> PluginId {
        PluginId::Task
    }

    fn build(&self, cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
        gang(cx, draft)?;
        user_container(cx, draft)?;
        if cx.job.exclusive_nodes {
            whole_nodes(cx, draft)?;
        }
        placement(cx, draft)
    }
}

/// The gang: scheduler, `minAvailable` (all ranks or none), queue, retries, priority, the sla waiting
/// time, the lifecycle policies and the `env` and `svc` job plugins.
fn gang(cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
    let scheduling = &cx.pipeline().scheduling;
    if scheduling.max_retry < 1 {
        return Err(PipelineError::config(
            "scheduling.max_retry",
            "must be at least 1: Volcano turns 0 into 3",
        ));
    }
    let spec = &mut draft.spec;
    spec.scheduler_name = Some(scheduling.scheduler_name.clone());
    spec.min_available = Some(cx.replicas_i32());
    spec.queue = Some(cx.placement.queue.clone());
    spec.max_retry = Some(scheduling.max_retry);
    spec.priority_class_name = scheduling.priority_class_name.clone();
    if let Some(wait) = sla_waiting_time(cx) {
        // A Go duration, as the `sla` plugin parses it.
        draft.meta.annotations.get_or_insert_default().insert(
            SLA_WAITING_TIME.to_owned(),
            format!("{}s", wait.as_secs().max(0)),
        );
    }
    spec.policies = [
        (PolicyEvent::PodFailed, scheduling.on_pod_failed),
        (PolicyEvent::PodEvicted, scheduling.on_pod_evicted),
    ]
    .into_iter()
    .filter_map(|(event, choice)| {
        choice
            .action()
            .map(|action| LifecyclePolicy::on(event, action))
    })
    .collect();
    // env: VC_TASK_INDEX (the rank); svc: hostnames `j-<id>-job-<rank>.j-<id>` through a headless
    // Service, published before the pods are ready so ranks that start together resolve each other.
    spec.plugins = BTreeMap::from([
        ("env".to_owned(), Vec::new()),
        (
            "svc".to_owned(),
            vec!["--publish-not-ready-addresses=true".to_owned()],
        ),
    ]);
    Ok(())
}

/// The user's container: its image, pulled if not present, and the product's resources.
fn user_container(cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
    if cx.app.image.trim().is_empty() {
        return Err(PipelineError::invalid(
            "application.image",
            "must not be empty",
        ));
    }
    draft.user.image = Some(cx.app.image.clone());
    draft.user.image_pull_policy = Some("IfNotPresent".to_owned());
    draft.user.resources = resources(cx.product);
    Ok(())
}

/// Whole nodes: the charge of one node (a product without one is refused), the anti-affinity that
/// keeps each rank alone on its node, and no CPU or memory limit.
fn whole_nodes(cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
    // A whole node is charged as a whole node: a product the operator has not priced for that
    // is refused, so nobody holds a node for the price of a slice of it.
    let product = cx.product;
    let entry = cx
        .pipeline()
        .whole_nodes
        .entry(&product.id, &product.category)
        .ok_or_else(|| {
            PipelineError::invalid(
                "exclusiveNodes",
                format!(
                    "whole nodes are not offered for product {} (category {}): the operator \
                     has set no whole-node charge for it in [pipeline.whole_nodes.products]",
                    product.id, product.category
                ),
            )
        })?;
    let charge = serde_json::to_string(&entry.charge()).map_err(|e| {
        PipelineError::config(
            "whole_nodes.products",
            format!("the charge cannot be written: {e}"),
        )
    })?;
    draft
        .meta
        .annotations
        .get_or_insert_default()
        .insert(cx.keys.whole_node_charge.clone(), charge);
    draft.pod.affinity = Some(exclusive_affinity());
    // Alone on the node, the rank may use all of its CPU and memory: the requests (the product,
    // what is charged and what the scheduler places by) stay, the CPU and memory limits go.
    if let Some(resources) = draft.user.resources.as_mut()
        && let Some(limits) = resources.limits.as_mut()
    {
        limits.remove("cpu");
        limits.remove("memory");
        if limits.is_empty() {
            resources.limits = None;
        }
    }
    let flag = (cx.keys.exclusive_nodes.clone(), "true".to_owned());
    draft
        .meta
        .annotations
        .get_or_insert_default()
        .insert(flag.0.clone(), flag.1.clone());
    draft
        .pod_meta
        .labels
        .get_or_insert_default()
        .insert(flag.0, flag.1);
    Ok(())
}

/// Where the ranks may run: the configured tolerations, their own reservation's toleration when the
/// monitor may reserve nodes for the job, and the node selector by product category.
fn placement(cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
    let scheduling = &cx.pipeline().scheduling;
    if !scheduling.tolerations.is_empty() {
        draft.pod.tolerations = Some(
            scheduling
                .tolerations
                .iter()
                .map(|t| Toleration {
                    key: Some(t.key.clone()),
                    operator: Some(t.operator.clone()),
                    value: t.value.clone(),
                    effect: Some(t.effect.clone()),
                    toleration_seconds: None,
                })
                .collect(),
        );
    }
    if cx.job.exclusive_nodes || sla_waiting_time(cx).is_some() {
        // The monitor may reserve nodes for this gang (`[monitor] reserve_nodes`) by tainting them
        // `<prefix>reserved=<jobId>:NoSchedule`: its ranks tolerate their own job's reservation
        // only, so no other job lands on a node reserved for this one.
        draft
            .pod
            .tolerations
            .get_or_insert_default()
            .push(reservation_toleration(&cx.keys, &cx.job.job_id));
        // Says so on the job: a job rendered before the toleration came with a waiting time has
        // the waiting time without it, and nodes reserved for it would hold it back for good.
        draft
            .meta
            .annotations
            .get_or_insert_default()
            .insert(cx.keys.reservable.clone(), "true".to_owned());
    }
    if let Some(label) = &scheduling.node_selector_label {
        let category = &cx.product.category;
        let value = scheduling
            .node_selector_by_category
            .get(category)
            .unwrap_or(category);
        if !names::is_label_value(value) || value.is_empty() {
            return Err(PipelineError::invalid(
                "product.category",
                format!("`{value}` cannot select nodes: it is not a label value"),
            ));
        }
        draft.pod.node_selector = Some(BTreeMap::from([(label.clone(), value.clone())]));
    }
    Ok(())
}

/// Each rank alone on its node: no pod of any Volcano job (its own gang's other ranks included) on the
/// same host, in any namespace. Required, so it holds at scheduling; running pods' terms keep others out.
pub fn exclusive_affinity() -> Affinity {
    Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                label_selector: Some(LabelSelector {
                    match_expressions: Some(vec![LabelSelectorRequirement {
                        key: crate::volcano::LABEL_JOB_NAME.to_owned(),
                        operator: "Exists".to_owned(),
                        values: None,
                    }]),
                    match_labels: None,
                }),
                namespace_selector: Some(LabelSelector::default()),
                topology_key: HOSTNAME_LABEL.to_owned(),
                ..PodAffinityTerm::default()
            }]),
            ..PodAntiAffinity::default()
        }),
        ..Affinity::default()
    }
}

/// What a rank of a job the monitor may reserve nodes for tolerates: the taint by which the monitor reserves a node for its own job
/// (`<prefix>reserved=<jobId>:NoSchedule`, see `monitor::reserve`), and no other job's.
pub fn reservation_toleration(keys: &AnnotationKeys, job_id: &str) -> Toleration {
    Toleration {
        key: Some(keys.reservation_taint()),
        operator: Some("Equal".to_owned()),
        value: Some(job_id.to_owned()),
        effect: Some(crate::durable::annotations::RESERVATION_EFFECT.to_owned()),
        toleration_seconds: None,
    }
}

/// The job annotation Volcano's `sla` scheduler plugin reads: how long the job may wait before the
/// scheduler reserves for it.
pub const SLA_WAITING_TIME: &str = "sla-waiting-time";

/// The job's `sla-waiting-time`: an interactive job's own when one is set, else every job's.
fn sla_waiting_time(cx: &Context<'_>) -> Option<jiff::SignedDuration> {
    let scheduling = &cx.pipeline().scheduling;
    scheduling
        .interactive_sla_waiting_time
        .filter(|_| crate::pipeline::context::interactive(cx.app))
        .or(scheduling.sla_waiting_time)
}

/// The node label every kubelet sets to the node's name.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// Requests equal to limits (Guaranteed QoS): cpu `<cpu·1000>m`, memory `<GiB·1024>Mi`, GPUs only when
/// the product has some. `None` when the product has none of the three (a BestEffort pod, as UCloud).
pub fn resources(product: &Product) -> Option<ResourceRequirements> {
    let mut map = BTreeMap::new();
    if product.cpu > 0 {
        map.insert(
            "cpu".to_owned(),
            Quantity(format!("{}m", u64::from(product.cpu) * 1000)),
        );
    }
    if product.memory_gib > 0 {
        map.insert(
            "memory".to_owned(),
            Quantity(format!("{}Mi", u64::from(product.memory_gib) * 1024)),
        );
    }
    if product.gpu > 0 {
        map.insert(GPU_RESOURCE.to_owned(), Quantity(product.gpu.to_string()));
    }
    (!map.is_empty()).then(|| ResourceRequirements {
        limits: Some(map.clone()),
        requests: Some(map),
        claims: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn product(cpu: u32, memory_gib: u32, gpu: u32) -> Product {
        Product {
            id: "p".into(),
            category: "c".into(),
            cpu,
            memory_gib,
            gpu,
        }
    }

    #[test]
    fn requests_equal_limits_in_millicores_and_mebibytes() {
        let r = resources(&product(4, 16, 1)).unwrap();
        let limits = r.limits.unwrap();
        assert_eq!(limits["cpu"].0, "4000m");
        assert_eq!(limits["memory"].0, "16384Mi");
        assert_eq!(limits[GPU_RESOURCE].0, "1");
        assert_eq!(r.requests.unwrap(), limits);
    }

    #[test]
    fn zero_gpus_are_left_out() {
        let r = resources(&product(2, 4, 0)).unwrap();
        assert!(!r.limits.unwrap().contains_key(GPU_RESOURCE));
    }

    #[test]
    fn a_product_without_resources_gives_none() {
        assert!(resources(&product(0, 0, 0)).is_none());
    }
}
