//! FairShare: a namespace per owner, as the seed designed it (UCloud switched it off).
//!
//! - The VolcanoJob gets UCloud's `user` annotation (the project, or the user without one).
//! - In per-owner mode (the default) the job lives in its owner's namespace, `<prefix>u-<user>-<hash>` or
//!   `<prefix>p-<project>-<hash>`: readable, DNS-safe, and distinct for distinct owners (see
//!   [`crate::pipeline::names::owner_scoped_name`]). The namespace is declared with the job, labelled,
//!   with the owner's exact name as an annotation, and with its baseline NetworkPolicy: no ingress except
//!   from the proxy, egress only to DNS and to the internet outside private ranges (both configurable),
//!   for every pod but a sealed job's ([`baseline_selector`]).
//!   Jobs add their own rules on top (ConnectToJob). Volcano's fair share tells owners apart by namespace.
//! - With `scheduling.queue_per_project`, a project's jobs go to its own Volcano queue, declared with the
//!   job (Volcano admits jobs only to existing, Open queues). An interactive job goes to
//!   `scheduling.interactive_queue` instead, declared with it too (`fifo`, [`interactive_queue`]).
//! - A PVC is namespaced: with `storage.owner_claim` the storage claim is declared in every owner
//!   namespace too; otherwise the operator provides it there.
//! - In single mode every job goes to `namespace.name`, which the operator provides.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{Plugin, PluginId};
use crate::pipeline::context::Context;
use crate::pipeline::desired::OwnerNamespace;
use crate::pipeline::draft::Draft;
use crate::pipeline::names::{MANAGED_BY, MANAGED_BY_LABEL, OwnerKind};
use crate::pipeline::{NetworkPolicyConfig, PipelineError};
use crate::volcano::{Queue, QueueSpec};

/// Name of the baseline NetworkPolicy in every owner namespace.
pub const BASELINE_POLICY: &str = "ucloud-baseline";

/// The FairShare plugin; the module documentation says what it builds and why.
pub struct FairShare;

impl Plugin for FairShare {
    fn id(&self) -> PluginId {
        PluginId::FairShare
    }

    fn build(&self, cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
        let (kind, owner) = OwnerKind::of(cx.owner);
        draft.annotate(&cx.keys.user, owner);
        let prefix = &cx.keys.prefix;
        let labels = BTreeMap::from([
            (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
            (format!("{prefix}owner-kind"), kind.as_str().to_owned()),
        ]);
        let annotations = BTreeMap::from([(format!("{prefix}owner"), owner.to_owned())]);
        let policy_config = &cx.pipeline().network_policy;

        if cx.placement.per_owner {
            let namespace = cx.placement.namespace.clone();
            let claim = owner_claim(cx, &namespace, &labels);
            draft.namespace = Some(OwnerNamespace {
                namespace: Namespace {
                    metadata: ObjectMeta {
                        name: Some(namespace.clone()),
                        labels: Some(labels.clone()),
                        annotations: Some(annotations.clone()),
                        ..ObjectMeta::default()
                    },
                    ..Namespace::default()
                },
                network_policies: vec![NetworkPolicy {
                    metadata: ObjectMeta {
                        name: Some(BASELINE_POLICY.to_owned()),
                        namespace: Some(namespace),
                        labels: Some(labels.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(NetworkPolicySpec {
                        // Every pod but the sealed ones: policies add up, so a baseline that
                        // selected a sealed pod would open it to DNS and the internet.
                        pod_selector: Some(baseline_selector(cx.pipeline())),
                        policy_types: Some(vec!["Ingress".to_owned(), "Egress".to_owned()]),
                        ingress: Some(baseline_ingress(policy_config)),
                        egress: Some(baseline_egress(policy_config)),
                    }),
                }],
                persistent_volume_claims: claim.into_iter().collect(),
            });
        }
        if cx.placement.interactive_queue {
            draft.queue = Some(interactive_queue(&cx.placement.queue));
        } else if cx.placement.project_queue {
            draft.queue = Some(Queue {
                metadata: ObjectMeta {
                    name: Some(cx.placement.queue.clone()),
                    labels: Some(labels),
                    annotations: Some(annotations),
                    ..ObjectMeta::default()
                },
                spec: QueueSpec {
                    weight: Some(cx.pipeline().scheduling.project_queue_weight),
                    reclaimable: Some(true),
                    ..QueueSpec::default()
                },
                status: None,
            });
        }
        Ok(())
    }
}

/// `[pipeline.scheduling] interactive_queue`, declared with an interactive job as deploy/scheduling
/// declares it: first come, first served (`fifo`), so that no session starts before one that arrived
/// earlier and each is told a start it can count on (docs/estimates.md, *Interactive jobs: a promise by
/// design*). Declared rather than left to the operator because Volcano refuses a job whose queue does
/// not exist; one that exists (made otherwise by an operator) is left alone, and the monitor watches
/// its `dequeueStrategy`.
pub fn interactive_queue(name: &str) -> Queue {
    Queue {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY_LABEL.to_owned(),
                MANAGED_BY.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: QueueSpec {
            weight: Some(1),
            reclaimable: Some(true),
            dequeue_strategy: Some("fifo".to_owned()),
            ..QueueSpec::default()
        },
        status: None,
    }
}

/// The storage claim of an owner namespace, from `storage.owner_claim`.
fn owner_claim(
    cx: &Context<'_>,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Option<PersistentVolumeClaim> {
    let storage = &cx.pipeline().storage;
    let template = storage.owner_claim.as_ref()?;
    Some(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(storage.claim_name.clone()),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(template.access_modes.clone()),
            storage_class_name: template.storage_class_name.clone(),
            volume_name: template
                .volume_name
                .as_ref()
                .map(|v| v.replace("{namespace}", namespace)),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(template.size.clone()),
                )])),
                limits: None,
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    })
}

/// Ingress every job pod gets: from the proxy pods only.
pub fn baseline_ingress(config: &NetworkPolicyConfig) -> Vec<NetworkPolicyIngressRule> {
    vec![NetworkPolicyIngressRule {
        from: Some(vec![NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "kubernetes.io/metadata.name".to_owned(),
                    config.proxy_namespace.clone(),
                )])),
                match_expressions: None,
            }),
            pod_selector: Some(LabelSelector {
                match_labels: Some(config.proxy_pod_labels.clone()),
                match_expressions: None,
            }),
            ip_block: None,
        }]),
        ports: None,
    }]
}

/// Egress every job pod gets: DNS anywhere, the internet except private ranges, and the extra CIDRs.
pub fn baseline_egress(config: &NetworkPolicyConfig) -> Vec<NetworkPolicyEgressRule> {
    let mut rules = Vec::new();
    if config.allow_dns {
        rules.push(NetworkPolicyEgressRule {
            to: None,
            ports: Some(
                ["UDP", "TCP"]
                    .into_iter()
                    .map(|protocol| NetworkPolicyPort {
                        port: Some(IntOrString::Int(53)),
                        protocol: Some(protocol.to_owned()),
                        end_port: None,
                    })
                    .collect(),
            ),
        });
    }
    let ip_block = |cidr: &String, except: Vec<String>| NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: cidr.clone(),
            except: (!except.is_empty()).then_some(except),
        }),
        ..NetworkPolicyPeer::default()
    };
    let mut to: Vec<NetworkPolicyPeer> = config
        .egress_cidrs
        .iter()
        .map(|cidr| {
            // An exception must be of the same address family as the block it is cut from.
            let v6 = cidr.contains(':');
            let except = config
                .egress_except
                .iter()
                .filter(|e| e.contains(':') == v6)
                .cloned()
                .collect();
            ip_block(cidr, except)
        })
        .collect();
    to.extend(
        config
            .extra_egress_cidrs
            .iter()
            .map(|cidr| ip_block(cidr, Vec::new())),
    );
    if !to.is_empty() {
        rules.push(NetworkPolicyEgressRule {
            to: Some(to),
            ports: None,
        });
    }
    rules
}

/// The selector of the namespace-wide baseline policy: every pod but the sealed ones (labelled by
/// [`crate::pipeline::sealed`]). Policies add up, so a baseline that selected a sealed pod would open it
/// to DNS and the internet.
pub fn baseline_selector(pipeline: &crate::pipeline::PipelineConfig) -> LabelSelector {
    LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: pipeline.keys().sealed.clone(),
            operator: "DoesNotExist".to_owned(),
            values: None,
        }]),
    }
}
