//! ConnectToJob: the job's own NetworkPolicy `policy-<id>` and its peers.
//!
//! - Pods of the same job may talk to each other, by an explicit rule (W28: UCloud relied on the policy
//!   Volcano's `svc` plugin creates, which can be switched off).
//! - Peers, both ways, without touching the peer (W27). A job that names peer `P` labels its pods
//!   `<prefix>peer-P`; every job's policy admits traffic from, and allows traffic to, pods labelled with
//!   its own id. So the peer's policy never needs a patch, and the permission disappears with the
//!   connecting job's pods. The connecting job's own policy admits the peer's pods.
//! - **Only within the namespace.** Every rule selects pods of the policy's own namespace only (no
//!   `namespaceSelector`): a label is something any job can put on its pods, so a rule that admitted
//!   labelled pods from any namespace would let one owner open another owner's job. In per-owner mode
//!   the namespace is the owner's, so a peer can only be the same owner's job; in single-namespace mode
//!   the runner refuses a submission whose peer belongs to another owner (the rule: a peer must belong to
//!   the same user, or to the same project for a project's job, compared exactly).
//! - **Peers by name, without collisions.** A peer's hostname is what the user's program types (`db`),
//!   and two jobs may both call their peer `db`, in one namespace. So nothing in the namespace is named
//!   after it: the job gets one headless Service of its own without a selector, `j-<jobId>-peers`, whose
//!   EndpointSlice the monitor fills with one endpoint per peer, `hostname: <peer hostname>` and the
//!   peer's rank 0 address. Cluster DNS answers `<hostname>.j-<jobId>-peers.<namespace>.svc.<domain>` for
//!   it, and the job's pods (and only they) search that domain (`dnsConfig.searches`), so a bare `db`
//!   resolves to this job's peer. UCloud made each hostname a name of the namespace (W27 pinned rank 0's
//!   IP in `hostAliases`); an earlier version made it an `ExternalName` Service `<hostname>`, which a
//!   second job with the same hostname could not create.
//! - **Peers run together.** The pods carry the scheduling gate `<prefix>peers`: they are not
//!   scheduled until the monitor has seen every peer run, written their addresses and removed the gate
//!   (docs/monitor.md). The peers are listed in the job's `<prefix>peers` annotation
//!   (`<hostname>=<peerJobId>,...`) for the monitor, which also keeps the addresses right when a peer
//!   restarts on another address, and tells the job when a peer ends.
//! - In single-namespace mode the policy also carries the baseline rules (proxy ingress, DNS and internet
//!   egress), so it is complete on its own; in per-owner mode the namespace's baseline policy has them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodSchedulingGate, Service, ServiceSpec};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};

use super::fair_share::{baseline_egress, baseline_ingress};
use super::{Plugin, PluginId};
use crate::pipeline::context::Context;
use crate::pipeline::desired::Companion;
use crate::pipeline::draft::{Draft, job_selector};
use crate::pipeline::{PipelineError, names};
use crate::volcano::LABEL_JOB_NAME;

/// `policy-<jobId>`, UCloud's name.
pub fn policy_name(job_id: &str) -> String {
    format!("policy-{job_id}")
}

/// `j-<jobId>-peers`: the job's headless Service whose endpoints are its peers by hostname. At most 63
/// characters for the longest job id (55).
pub fn peers_service_name(job_id: &str) -> String {
    format!("j-{job_id}-peers")
}

/// The DNS domain the pods of a job with peers search, under which each peer hostname resolves.
pub fn peers_domain(job_id: &str, namespace: &str, cluster_domain: &str) -> String {
    format!(
        "{}.{namespace}.svc.{cluster_domain}",
        peers_service_name(job_id)
    )
}

/// The peers listed in a job's `<prefix>peers` annotation: `(hostname, peer job id)` by hostname.
pub fn parse_peers(value: &str) -> Vec<(&str, &str)> {
    value
        .split(',')
        .filter_map(|entry| entry.split_once('='))
        .filter(|(hostname, id)| !hostname.is_empty() && !id.is_empty())
        .collect()
}

/// The ConnectToJob plugin; the module documentation says what it builds and why.
pub struct ConnectToJob;

impl Plugin for ConnectToJob {
    fn id(&self) -> PluginId {
        PluginId::ConnectToJob
    }

    fn build(&self, cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
        let mut peers = vec![
            // The job's own pods (same namespace).
            NetworkPolicyPeer {
                pod_selector: Some(own(job_selector(cx))),
                ..NetworkPolicyPeer::default()
            },
            // Pods of any job of this namespace that names this job as its peer.
            NetworkPolicyPeer {
                pod_selector: Some(LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![LabelSelectorRequirement {
                        key: cx.keys.peer_label(cx.job_id),
                        operator: "Exists".to_owned(),
                        values: None,
                    }]),
                }),
                ..NetworkPolicyPeer::default()
            },
        ];
        let hostnames = connect_peers(cx, draft, &mut peers)?;
        if !hostnames.is_empty() {
            name_peers(cx, draft, &hostnames);
        }
        // First among the companions: the sooner it exists, the shorter the window without it.
        draft.companions.insert(0, job_policy(cx, peers));
        Ok(())
    }
}

/// A selector of the pods with these labels.
fn own(labels: BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels),
        match_expressions: None,
    }
}

/// Checks each peer the submission names, labels the pods as reaching it and adds its pods to `peers`;
/// returns the peers by hostname (one hostname names one peer; a peer named twice under the same
/// hostname counts once).
fn connect_peers<'c>(
    cx: &'c Context<'_>,
    draft: &mut Draft,
    peers: &mut Vec<NetworkPolicyPeer>,
) -> Result<BTreeMap<&'c str, &'c str>, PipelineError> {
    let mut hostnames: BTreeMap<&str, &str> = BTreeMap::new();
    for peer in &cx.peers {
        let field = peer.origin.field("peer");
        let (peer_id, hostname) = (peer.value.job_id.as_str(), peer.value.hostname.as_str());
        let label = cx.keys.peer_label(peer_id);
        if !names::is_dns1123_label(peer_id) || !names::is_qualified_name(&label) {
            return Err(PipelineError::invalid(
                format!("{field}.jobId"),
                "is not a job id",
            ));
        }
        if peer_id == cx.job_id {
            return Err(PipelineError::invalid(
                format!("{field}.jobId"),
                "a job cannot be its own peer",
            ));
        }
        if !crate::validate::names::is_peer_hostname(hostname) {
            return Err(PipelineError::invalid(
                format!("{field}.hostname"),
                "must be lowercase letters, digits and '-', start with a letter, and not start with `j-`",
            ));
        }
        match hostnames.insert(hostname, peer_id) {
            Some(other) if other != peer_id => {
                return Err(PipelineError::invalid(
                    format!("{field}.hostname"),
                    format!("`{hostname}` already names peer {other}"),
                ));
            }
            Some(_) => continue,
            None => {}
        }
        draft.label_pods(&label, "true");
        peers.push(NetworkPolicyPeer {
            pod_selector: Some(own(BTreeMap::from([(
                LABEL_JOB_NAME.to_owned(),
                names::vcjob_name(peer_id),
            )]))),
            ..NetworkPolicyPeer::default()
        });
    }
    Ok(hostnames)
}

/// The peers by hostname: recorded on the job, the pods gated until the monitor has written the peers'
/// endpoints, searching the peers' domain, and the headless Service whose endpoints those are.
fn name_peers(cx: &Context<'_>, draft: &mut Draft, hostnames: &BTreeMap<&str, &str>) {
    let service = peers_service_name(cx.job_id);
    draft.annotate(
        &cx.keys.peers,
        hostnames
            .iter()
            .map(|(hostname, id)| format!("{hostname}={id}"))
            .collect::<Vec<_>>()
            .join(","),
    );
    draft
        .pod
        .scheduling_gates
        .get_or_insert_default()
        .push(PodSchedulingGate {
            name: cx.keys.peers_gate(),
        });
    draft
        .pod
        .dns_config
        .get_or_insert_default()
        .searches
        .get_or_insert_default()
        .push(peers_domain(
            cx.job_id,
            &cx.placement.namespace,
            &cx.pipeline().cluster_domain,
        ));
    draft.companions.push(Companion::Service(Box::new(Service {
        metadata: ObjectMeta {
            name: Some(service),
            labels: Some(BTreeMap::from([(
                format!("{}peers-of", cx.keys.prefix),
                cx.job_id.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        // Headless and without a selector: its endpoints are the peers, written by the monitor,
        // and DNS answers each by its hostname. No ports: a peer is reached on any.
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            ..ServiceSpec::default()
        }),
        status: None,
    })));
}

/// The job's NetworkPolicy: in from and out to `peers` (its own pods and its peers'), plus the
/// baseline rules when the namespace is shared (a per-owner namespace has its own baseline policies).
fn job_policy(cx: &Context<'_>, peers: Vec<NetworkPolicyPeer>) -> Companion {
    let mut ingress = vec![NetworkPolicyIngressRule {
        from: Some(peers.clone()),
        ports: None,
    }];
    let mut egress = vec![NetworkPolicyEgressRule {
        to: Some(peers),
        ports: None,
    }];
    if !cx.placement.per_owner {
        let config = &cx.pipeline().network_policy;
        ingress.extend(baseline_ingress(config));
        egress.extend(baseline_egress(config));
    }
    Companion::NetworkPolicy(Box::new(NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(policy_name(cx.job_id)),
            ..ObjectMeta::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(own(job_selector(cx))),
            policy_types: Some(vec!["Ingress".to_owned(), "Egress".to_owned()]),
            ingress: Some(ingress),
            egress: Some(egress),
        }),
    }))
}
