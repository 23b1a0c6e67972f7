//! NetworkIp (public IPs): a public IP is attached or the submission is refused, never dropped.
//!
//! - An address can be attached to one pod only, so a job with public IPs and more than one replica is
//!   refused, with UCloud's message.
//! - How an address reaches a pod is the operator's choice (`[pipeline.public_ip] attach`). Without one
//!   (`refuse`, the default) a job with a public IP is refused with reason `not_offered`, naming the
//!   field: UCloud accepted it and ran the job without the address, so the user found out only by trying.
//! - `load-balancer`: per public IP a LoadBalancer Service `j-<jobId>-ip-<n>` in front of the job's pod,
//!   with exactly the open ports (a range is one Service port per port, up to `max_ports` per job), the
//!   address asked for in the annotation of the cluster's load balancer (`address_annotation`, MetalLB's
//!   `metallb.universe.tf/loadBalancerIPs` by default; `spec.loadBalancerIP` is deprecated since
//!   Kubernetes 1.24), `externalTrafficPolicy: Local` (the application sees its clients' addresses) and
//!   optionally `loadBalancerClass`. It is a companion: created after the job, owned by it, deleted with
//!   it. The job's NetworkPolicy admits traffic from anywhere (of the address's family) on exactly those
//!   ports.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;

use super::connect_to_job::policy_name;
use super::{Plugin, PluginId};
use crate::messages::v1::{NetworkIpValue, Protocol};
use crate::pipeline::context::Context;
use crate::pipeline::desired::Companion;
use crate::pipeline::draft::{Draft, job_selector};
use crate::pipeline::{PipelineError, names};
use crate::volcano::LABEL_JOB_NAME;

/// UCloud's message.
pub const MULTIPLE_REPLICAS: &str =
    "UCloud/compute does not currently support IPs with multiple nodes";

/// MetalLB's annotation for the address(es) a LoadBalancer Service asks for.
pub const METALLB_ADDRESS_ANNOTATION: &str = "metallb.universe.tf/loadBalancerIPs";

/// How public IPs are attached (`[pipeline.public_ip] attach`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum PublicIpAttach {
    /// No way is configured: a submission with a public IP is refused (`not_offered`).
    Refuse,
    /// A LoadBalancer Service per public IP, the address in `address_annotation`.
    LoadBalancer,
}

/// `[pipeline.public_ip]`: how a job's public IPs reach its pod.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct PublicIpConfig {
    /// `refuse` (default: the cluster offers no way, so a job asking for one is refused) or
    /// `load-balancer`.
    pub attach: PublicIpAttach,
    /// The Service annotation that asks the load balancer for an address (MetalLB's by default; e.g.
    /// `kube-vip.io/loadbalancerIPs` for kube-vip).
    pub address_annotation: String,
    /// `spec.loadBalancerClass`, when the cluster has several load balancer implementations.
    pub load_balancer_class: Option<String>,
    /// Open ports per job, summed over its public IPs (a range counts each of its ports): each is a
    /// Service port, and a Service of thousands of ports is a burden on every node's proxy.
    pub max_ports: u32,
}

impl Default for PublicIpConfig {
    fn default() -> Self {
        Self {
            attach: PublicIpAttach::Refuse,
            address_annotation: METALLB_ADDRESS_ANNOTATION.to_owned(),
            load_balancer_class: None,
            max_ports: 100,
        }
    }
}

impl PublicIpConfig {
    /// Checked at start-up: `Err((key below pipeline, reason))`.
    pub fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        if !names::is_qualified_name(&self.address_annotation) {
            return Err((
                "public_ip.address_annotation",
                "must be an annotation key such as metallb.universe.tf/loadBalancerIPs",
            ));
        }
        if self
            .load_balancer_class
            .as_deref()
            .is_some_and(|c| !names::is_qualified_name(c))
        {
            return Err((
                "public_ip.load_balancer_class",
                "must be a label-style name such as metallb.io/metallb",
            ));
        }
        if self.max_ports == 0 {
            return Err((
                "public_ip.max_ports",
                "must be at least 1 (to offer no public IPs, set attach = \"refuse\")",
            ));
        }
        Ok(())
    }
}

/// `j-<jobId>-ip-<n>`: the Service of the job's `n`th public IP.
pub fn service_name(job_id: &str, n: usize) -> String {
    format!("j-{job_id}-ip-{n}")
}

/// The NetworkIp plugin; the module documentation says what it builds and why.
pub struct NetworkIp;

impl Plugin for NetworkIp {
    fn id(&self) -> PluginId {
        PluginId::NetworkIp
    }

    fn build(&self, cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
        let Some(first) = cx.network_ips.first() else {
            return Ok(());
        };
        if cx.replicas > 1 {
            return Err(PipelineError::invalid(
                first.origin.field("networkIp"),
                MULTIPLE_REPLICAS,
            ));
        }
        let config = &cx.pipeline().public_ip;
        if config.attach == PublicIpAttach::Refuse {
            return Err(not_offered(&first.origin.field("networkIp")));
        }
        if let Err((key, reason)) = config.validate() {
            return Err(PipelineError::config(key, reason));
        }
        let mut total = 0u64;
        let mut rules = Vec::new();
        for (n, ip) in cx.network_ips.iter().enumerate() {
            let field = ip.origin.field("networkIp");
            let (service, rule) = attach(cx, n, &field, ip.value)?;
            total += service
                .spec
                .as_ref()
                .and_then(|s| s.ports.as_ref())
                .map_or(0, |p| p.len() as u64);
            if total > u64::from(config.max_ports) {
                return Err(PipelineError::invalid(
                    format!("{field}.openPorts"),
                    format!(
                        "{total} open ports or more; this cluster opens at most {} per job \
                         (pipeline.public_ip.max_ports): open fewer ports or narrower ranges",
                        config.max_ports
                    ),
                ));
            }
            draft.companions.push(Companion::Service(Box::new(service)));
            rules.push(rule);
        }
        admit(cx, draft, rules);
        Ok(())
    }
}

/// The refusal of a public IP where the operator configured no way to attach one.
pub fn not_offered(field: &str) -> PipelineError {
    PipelineError::not_offered(
        field,
        "public IPs are not offered on this cluster (no way to attach one is configured: \
         [pipeline.public_ip] attach); submit the job without a public IP or to a cluster that offers them",
    )
}

/// The Service of one public IP and the policy rule that lets its traffic in.
fn attach(
    cx: &Context<'_>,
    n: usize,
    field: &str,
    ip: &NetworkIpValue,
) -> Result<(Service, NetworkPolicyIngressRule), PipelineError> {
    let config = &cx.pipeline().public_ip;
    let address: IpAddr = ip.ip_address.parse().map_err(|_| {
        PipelineError::invalid(format!("{field}.ipAddress"), "is not an IP address")
    })?;
    if ip.open_ports.is_empty() {
        return Err(PipelineError::invalid(
            format!("{field}.openPorts"),
            "a public IP needs at least one open port (a load balancer without ports is refused \
             by Kubernetes)",
        ));
    }
    let name = service_name(cx.job_id, n);
    if !names::is_dns1035_label(&name) {
        return Err(PipelineError::invalid(
            "jobId",
            format!("is too long for the public IP's Service name {name} (at most 63 characters)"),
        ));
    }
    let (ports, policy_ports) = open_ports(field, ip, config.max_ports)?;
    let service = Service {
        metadata: ObjectMeta {
            name: Some(name),
            annotations: Some(BTreeMap::from([(
                config.address_annotation.clone(),
                address.to_string(),
            )])),
            labels: Some(BTreeMap::from([(
                format!("{}networkIp", cx.keys.prefix),
                ip.id.clone(),
            )]))
            .filter(|_| names::is_label_value(&ip.id)),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".to_owned()),
            load_balancer_class: config.load_balancer_class.clone(),
            external_traffic_policy: Some("Local".to_owned()),
            ip_families: Some(vec![
                if address.is_ipv4() { "IPv4" } else { "IPv6" }.to_owned(),
            ]),
            ports: Some(ports),
            selector: Some(BTreeMap::from([(
                LABEL_JOB_NAME.to_owned(),
                cx.vcjob_name.clone(),
            )])),
            ..ServiceSpec::default()
        }),
        status: None,
    };
    Ok((service, from_anywhere(address, policy_ports)))
}

/// The ports an IP opens, each range checked (a protocol, 1 to 65535, start to end, at most
/// `max_ports`): one Service port per port and protocol, and one policy port per range.
fn open_ports(
    field: &str,
    ip: &NetworkIpValue,
    max_ports: u32,
) -> Result<(Vec<ServicePort>, Vec<NetworkPolicyPort>), PipelineError> {
    let mut ports: BTreeMap<(&str, i32), ServicePort> = BTreeMap::new();
    let mut policy_ports = Vec::new();
    for (j, range) in ip.open_ports.iter().enumerate() {
        let range_field = format!("{field}.openPorts[{j}]");
        let protocol = match Protocol::try_from(range.protocol) {
            Ok(Protocol::Tcp) => "TCP",
            Ok(Protocol::Udp) => "UDP",
            _ => {
                return Err(PipelineError::invalid(
                    format!("{range_field}.protocol"),
                    "required: PROTOCOL_TCP or PROTOCOL_UDP",
                ));
            }
        };
        let port = |p: u32, which: &str| {
            i32::try_from(p)
                .ok()
                .filter(|p| (1..=65535).contains(p))
                .ok_or_else(|| {
                    PipelineError::invalid(format!("{range_field}.{which}"), "must be 1 to 65535")
                })
        };
        let (start, end) = (port(range.start, "start")?, port(range.end, "end")?);
        if end < start {
            return Err(PipelineError::invalid(
                format!("{range_field}.end"),
                format!("end {end} is before start {start}"),
            ));
        }
        if end - start >= i32::try_from(max_ports).unwrap_or(i32::MAX) {
            return Err(PipelineError::invalid(
                range_field,
                format!(
                    "{} ports; this cluster opens at most {} per job (pipeline.public_ip.max_ports)",
                    end - start + 1,
                    max_ports
                ),
            ));
        }
        for p in start..=end {
            ports.entry((protocol, p)).or_insert_with(|| ServicePort {
                name: Some(format!("{}-{p}", protocol.to_ascii_lowercase())),
                port: p,
                target_port: Some(IntOrString::Int(p)),
                protocol: Some(protocol.to_owned()),
                ..ServicePort::default()
            });
        }
        policy_ports.push(NetworkPolicyPort {
            protocol: Some(protocol.to_owned()),
            port: Some(IntOrString::Int(start)),
            end_port: (end > start).then_some(end),
        });
    }
    Ok((ports.into_values().collect(), policy_ports))
}

/// The policy rule that lets traffic to `ports` in from anywhere (IPv4 or IPv6, as the address is).
fn from_anywhere(address: IpAddr, ports: Vec<NetworkPolicyPort>) -> NetworkPolicyIngressRule {
    let anywhere = if address.is_ipv4() {
        "0.0.0.0/0"
    } else {
        "::/0"
    };
    NetworkPolicyIngressRule {
        from: Some(vec![NetworkPolicyPeer {
            ip_block: Some(IPBlock {
                cidr: anywhere.to_owned(),
                except: None,
            }),
            ..NetworkPolicyPeer::default()
        }]),
        ports: Some(ports),
    }
}

/// Lets the public IPs' traffic through the job's policies: a rule of the job's own policy
/// (ConnectToJob's `policy-<jobId>`); without that policy, in an owner's namespace (whose baseline admits
/// only the proxy), a policy `policy-<jobId>-ip` of its own. Without either nothing restricts ingress.
fn admit(cx: &Context<'_>, draft: &mut Draft, rules: Vec<NetworkPolicyIngressRule>) {
    let own = policy_name(cx.job_id);
    let existing = draft.companions.iter_mut().find_map(|c| match c {
        Companion::NetworkPolicy(p) if p.metadata.name.as_deref() == Some(own.as_str()) => Some(p),
        _ => None,
    });
    if let Some(policy) = existing {
        if let Some(spec) = policy.spec.as_mut() {
            spec.ingress.get_or_insert_with(Vec::new).extend(rules);
        }
        return;
    }
    if cx.placement.per_owner {
        draft
            .companions
            .push(Companion::NetworkPolicy(Box::new(NetworkPolicy {
                metadata: ObjectMeta {
                    name: Some(format!("{own}-ip")),
                    ..ObjectMeta::default()
                },
                spec: Some(NetworkPolicySpec {
                    pod_selector: Some(LabelSelector {
                        match_labels: Some(job_selector(cx)),
                        match_expressions: None,
                    }),
                    policy_types: Some(vec!["Ingress".to_owned()]),
                    ingress: Some(rules),
                    egress: None,
                }),
            })));
    }
}
