//! NetworkPolicies evaluated with the API's semantics (networking.k8s.io/v1), so that a test can ask the
//! simulator whether one pod may connect to another pod or to an address, and get the answer a cluster
//! whose network plugin enforces policies would give.
//!
//! The rules, as the API documents them:
//! - A connection needs both directions: the source's egress and the destination's ingress. A pod that
//!   no policy selects for a direction (by `podSelector` in its namespace and `policyTypes`) is not
//!   isolated in that direction; one that some policy selects gets only what some selecting policy's
//!   rules allow (policies add up; none subtracts). An address that is no pod is never isolated.
//! - `policyTypes` absent: `Ingress`, plus `Egress` when the policy has an `egress` section.
//! - A rule allows when one of its peers matches (no `from`/`to`, or an empty list: every peer) and one of
//!   its ports does (none: every port). A peer is an `ipBlock` (the address is in `cidr` and in none of
//!   `except`), or pods: `podSelector` alone selects pods of the policy's own namespace,
//!   `namespaceSelector` alone every pod of the namespaces it selects, both together the pods it selects
//!   in those namespaces. An empty selector selects everything.
//! - A port is a number (with `endPort`, a range) or the name of a container port of the destination
//!   pod, with `protocol` (default TCP); without `port`, every port of that protocol.
//!
//! An `ipBlock` is matched against pod addresses too (most network plugins do; the API leaves it to them).
//! [`evaluate`] is pure; [`connection`] looks the objects up for it, for [`super::SimHandle::connection`]
//! and for `GET /sim/v1/connection?from=<ns>/<pod>|<ip>&to=...&port=<n>&protocol=TCP`.

use std::net::IpAddr;

use serde_json::{Map, Value};

use super::json::JsonPath;
use super::selector::LabelSelector;

/// A transport protocol a policy port names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// `TCP`, `UDP` or `SCTP` (case as the API spells it; lower case accepted).
    pub fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_uppercase().as_str() {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            "SCTP" => Some(Self::Sctp),
            _ => None,
        }
    }

    /// As the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }
}

/// A pod as the policies see it.
#[derive(Debug, Clone, Copy)]
pub struct PodEnd<'a> {
    /// The pod object (labels, namespace, container ports).
    pub pod: &'a Value,
    /// The labels of its namespace.
    pub namespace_labels: Option<&'a Map<String, Value>>,
}

impl PodEnd<'_> {
    fn namespace(&self) -> &str {
        self.pod
            .at("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    fn labels(&self) -> Option<&Map<String, Value>> {
        self.pod.at("/metadata/labels").and_then(Value::as_object)
    }

    /// The port number a container port of this pod is named by, for `protocol`.
    fn named_port(&self, name: &str, protocol: Protocol) -> Option<u16> {
        self.pod
            .at("/spec/containers")?
            .as_array()?
            .iter()
            .filter_map(|c| c.get("ports")?.as_array())
            .flatten()
            .find(|p| {
                p.get("name").and_then(Value::as_str) == Some(name) && proto_of(p) == Some(protocol)
            })
            .and_then(|p| u16::try_from(p.get("containerPort")?.as_u64()?).ok())
    }
}

/// One end of a connection: an address, a pod, or a pod and its address.
#[derive(Debug, Clone, Copy, Default)]
pub struct End<'a> {
    pub ip: Option<IpAddr>,
    pub pod: Option<PodEnd<'a>>,
}

/// What one direction of a connection comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Side {
    /// No policy isolates this end in this direction (or it is no pod).
    Open,
    /// Isolated, and these policies (`namespace/name`) allow it.
    Allowed(Vec<String>),
    /// Isolated by these policies, and none allows it.
    Denied(Vec<String>),
}

impl Side {
    fn lets_through(&self) -> bool {
        !matches!(self, Self::Denied(_))
    }
}

/// The answer for one connection: both directions, and whether it goes through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The source's egress.
    pub egress: Side,
    /// The destination's ingress.
    pub ingress: Side,
}

impl Verdict {
    /// Whether the connection is allowed: both directions let it through.
    pub fn allowed(&self) -> bool {
        self.egress.lets_through() && self.ingress.lets_through()
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = |s: &Side| match s {
            Side::Open => "open".to_owned(),
            Side::Allowed(p) => format!("allowed by {}", p.join(", ")),
            Side::Denied(p) => format!("denied (isolated by {})", p.join(", ")),
        };
        write!(
            f,
            "{}: egress {}; ingress {}",
            if self.allowed() { "allowed" } else { "denied" },
            side(&self.egress),
            side(&self.ingress)
        )
    }
}

/// Whether `policies` (every NetworkPolicy of the cluster) let `from` connect to `to` on `port`/`protocol`.
pub fn evaluate(
    policies: &[&Value],
    from: &End<'_>,
    to: &End<'_>,
    port: u16,
    protocol: Protocol,
) -> Verdict {
    let connection = Connection {
        port,
        protocol,
        destination: to.pod,
    };
    Verdict {
        egress: side(policies, from, to, Direction::Egress, &connection),
        ingress: side(policies, to, from, Direction::Ingress, &connection),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Ingress,
    Egress,
}

struct Connection<'a> {
    port: u16,
    protocol: Protocol,
    destination: Option<PodEnd<'a>>,
}

/// One direction at `subject` (the source for egress, the destination for ingress); `other` is the far end.
fn side(
    policies: &[&Value],
    subject: &End<'_>,
    other: &End<'_>,
    direction: Direction,
    connection: &Connection<'_>,
) -> Side {
    let Some(pod) = subject.pod else {
        return Side::Open;
    };
    let selecting: Vec<&Value> = policies
        .iter()
        .copied()
        .filter(|p| selects(p, &pod, direction))
        .collect();
    if selecting.is_empty() {
        return Side::Open;
    }
    let allowing: Vec<String> = selecting
        .iter()
        .filter(|p| allows(p, other, direction, connection))
        .map(|p| policy_name(p))
        .collect();
    if allowing.is_empty() {
        Side::Denied(selecting.iter().map(|p| policy_name(p)).collect())
    } else {
        Side::Allowed(allowing)
    }
}

fn policy_name(policy: &Value) -> String {
    format!(
        "{}/{}",
        policy
            .at("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default(),
        policy
            .at("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
    )
}

/// Whether `policy` isolates `pod` in `direction`: same namespace, its pod selector matches, and the
/// direction is among its policy types.
fn selects(policy: &Value, pod: &PodEnd<'_>, direction: Direction) -> bool {
    let namespace = policy
        .at("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if namespace != pod.namespace() {
        return false;
    }
    let selector = policy.at("/spec/podSelector").cloned().unwrap_or_default();
    LabelSelector::from_structured(&selector).matches(pod.labels()) && has_type(policy, direction)
}

fn has_type(policy: &Value, direction: Direction) -> bool {
    let wanted = match direction {
        Direction::Ingress => "Ingress",
        Direction::Egress => "Egress",
    };
    match policy.at("/spec/policyTypes").and_then(Value::as_array) {
        Some(types) => types.iter().any(|t| t.as_str() == Some(wanted)),
        None => match direction {
            Direction::Ingress => true,
            Direction::Egress => policy.at("/spec/egress").is_some_and(|e| !e.is_null()),
        },
    }
}

/// Whether one of `policy`'s rules for `direction` allows the far end `other` on the connection's port.
fn allows(
    policy: &Value,
    other: &End<'_>,
    direction: Direction,
    connection: &Connection<'_>,
) -> bool {
    let (section, peers_key) = match direction {
        Direction::Ingress => ("/spec/ingress", "from"),
        Direction::Egress => ("/spec/egress", "to"),
    };
    let namespace = policy
        .at("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let Some(rules) = policy.at(section).and_then(Value::as_array) else {
        return false;
    };
    rules.iter().any(|rule| {
        let peers_ok = match rule.get(peers_key).and_then(Value::as_array) {
            None => true,
            Some(peers) if peers.is_empty() => true,
            Some(peers) => peers
                .iter()
                .any(|peer| peer_matches(peer, namespace, other)),
        };
        peers_ok && ports_match(rule.get("ports"), connection)
    })
}

/// Whether one peer of a rule of a policy in `namespace` matches `end`.
fn peer_matches(peer: &Value, namespace: &str, end: &End<'_>) -> bool {
    let present = |k: &str| peer.get(k).filter(|v| !v.is_null());
    if let Some(block) = present("ipBlock") {
        return end.ip.is_some_and(|ip| in_block(block, ip));
    }
    let (pods, namespaces) = (present("podSelector"), present("namespaceSelector"));
    if pods.is_none() && namespaces.is_none() {
        return false;
    }
    let Some(pod) = end.pod else {
        return false;
    };
    let namespace_ok = match namespaces {
        Some(sel) => LabelSelector::from_structured(sel).matches(pod.namespace_labels),
        None => pod.namespace() == namespace,
    };
    let pod_ok = pods.is_none_or(|sel| LabelSelector::from_structured(sel).matches(pod.labels()));
    namespace_ok && pod_ok
}

fn proto_of(port: &Value) -> Option<Protocol> {
    match port.get("protocol").and_then(Value::as_str) {
        None => Some(Protocol::Tcp),
        Some(p) => Protocol::parse(p),
    }
}

/// Whether one of a rule's ports matches (none listed: every port).
fn ports_match(ports: Option<&Value>, connection: &Connection<'_>) -> bool {
    let Some(list) = ports.and_then(Value::as_array).filter(|l| !l.is_empty()) else {
        return true;
    };
    list.iter().any(|p| {
        if proto_of(p) != Some(connection.protocol) {
            return false;
        }
        match p.get("port") {
            None | Some(Value::Null) => true,
            Some(Value::Number(n)) => {
                let start = n.as_u64().unwrap_or(u64::MAX);
                let end = p.get("endPort").and_then(Value::as_u64).unwrap_or(start);
                (start..=end).contains(&u64::from(connection.port))
            }
            Some(Value::String(name)) => {
                connection
                    .destination
                    .and_then(|d| d.named_port(name, connection.protocol))
                    == Some(connection.port)
            }
            Some(_) => false,
        }
    })
}

/// Whether `ip` is in the block's `cidr` and in none of its `except`.
fn in_block(block: &Value, ip: IpAddr) -> bool {
    let inside = |cidr: &str| cidr_contains(cidr, ip).unwrap_or(false);
    let cidr = block
        .get("cidr")
        .and_then(Value::as_str)
        .unwrap_or_default();
    inside(cidr)
        && !block
            .get("except")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .any(inside)
}

/// Whether `cidr` (`10.0.0.0/8`, `::/0`) contains `ip`; `None` when it is no CIDR. Addresses of the other
/// family are never inside.
pub fn cidr_contains(cidr: &str, ip: IpAddr) -> Option<bool> {
    let (base, bits) = cidr.split_once('/')?;
    let base: IpAddr = base.parse().ok()?;
    let bits: u32 = bits.parse().ok()?;
    match (base, ip) {
        (IpAddr::V4(b), IpAddr::V4(a)) if bits <= 32 => {
            let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
            Some(u32::from(b) & mask == u32::from(a) & mask)
        }
        (IpAddr::V6(b), IpAddr::V6(a)) if bits <= 128 => {
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            Some(u128::from(b) & mask == u128::from(a) & mask)
        }
        (IpAddr::V4(_), IpAddr::V6(_)) | (IpAddr::V6(_), IpAddr::V4(_)) => Some(false),
        _ => None,
    }
}

/// Whether `pod` may open no connection at all: some policy isolates its egress and no policy that does
/// has a single egress rule (a sealed job of one rank). The simulator enforces exactly this case for real:
/// what exec runs in such a pod gets a network namespace of its own, with nothing in it
/// ([`super::exec`]). Anything more open is only evaluated.
pub fn egress_closed(policies: &[&Value], pod: &PodEnd<'_>) -> bool {
    let selecting: Vec<&Value> = policies
        .iter()
        .copied()
        .filter(|p| selects(p, pod, Direction::Egress))
        .collect();
    !selecting.is_empty()
        && selecting.iter().all(|p| {
            p.at("/spec/egress")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty)
        })
}

/// [`egress_closed`] for a stored pod (false when it does not exist).
pub(crate) fn pod_egress_closed(core: &super::api::Core, namespace: &str, name: &str) -> bool {
    let Ok(resolved) = resolve(core, &Peer::pod(namespace, name)) else {
        return false;
    };
    let Some(pod) = resolved.end().pod else {
        return false;
    };
    let stored: Vec<std::sync::Arc<Value>> = core
        .store
        .list(core.ids.networkpolicies, Some(namespace), None)
        .map(super::store::Entry::object)
        .collect();
    let policies: Vec<&Value> = stored.iter().map(|p| &**p).collect();
    egress_closed(&policies, &pod)
}

/// One end of a connection a test asks the simulator about ([`super::SimHandle::connection`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// A pod, by namespace and name: its labels, its namespace's labels and its address count.
    Pod { namespace: String, name: String },
    /// An address: a pod's when some pod has it (then as that pod), else something outside the cluster.
    Address(IpAddr),
}

impl Peer {
    /// The pod `namespace/name`.
    pub fn pod(namespace: &str, name: &str) -> Self {
        Self::Pod {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    /// `<namespace>/<pod>` or an IP address, as `GET /sim/v1/connection` takes them.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Ok(ip) = text.parse::<IpAddr>() {
            return Ok(Self::Address(ip));
        }
        match text.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self::pod(ns, name))
            }
            _ => Err(format!(
                "{text:?} is neither <namespace>/<pod> nor an IP address"
            )),
        }
    }
}

impl Side {
    fn to_json(&self) -> Value {
        match self {
            Self::Open => serde_json::json!({"isolated": false}),
            Self::Allowed(p) => serde_json::json!({"isolated": true, "allowedBy": p}),
            Self::Denied(p) => serde_json::json!({"isolated": true, "isolatedBy": p}),
        }
    }
}

impl Verdict {
    /// The answer of `GET /sim/v1/connection`.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "allowed": self.allowed(),
            "egress": self.egress.to_json(),
            "ingress": self.ingress.to_json(),
            "verdict": self.to_string(),
        })
    }
}

/// `GET /sim/v1/connection?from=<ns>/<pod>|<ip>&to=...&port=<n>[&protocol=TCP|UDP|SCTP]`: the verdict as
/// JSON, or a 400 naming the parameter.
pub(crate) fn answer(
    core: &super::api::Core,
    get: impl Fn(&str) -> Option<String>,
) -> Result<Value, super::ApiError> {
    let bad = |name: &str, why: String| super::ApiError::bad_request(format!("{name}: {why}"));
    let peer = |name: &str| {
        let text = get(name).ok_or_else(|| bad(name, "is required".into()))?;
        Peer::parse(&text).map_err(|e| bad(name, e))
    };
    let (from, to) = (peer("from")?, peer("to")?);
    let port = get("port")
        .ok_or_else(|| bad("port", "is required".into()))?
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| bad("port", "must be a port number (1 to 65535)".into()))?;
    let protocol = match get("protocol") {
        None => Protocol::Tcp,
        Some(p) => Protocol::parse(&p)
            .ok_or_else(|| bad("protocol", format!("{p:?} is not TCP, UDP or SCTP")))?,
    };
    connection(core, &from, &to, port, protocol).map(|v| v.to_json())
}

/// A peer's objects, looked up in the store.
struct Resolved {
    ip: Option<IpAddr>,
    pod: Option<std::sync::Arc<Value>>,
    namespace: Option<std::sync::Arc<Value>>,
}

impl Resolved {
    fn end(&self) -> End<'_> {
        End {
            ip: self.ip,
            pod: self.pod.as_deref().map(|pod| PodEnd {
                pod,
                namespace_labels: self
                    .namespace
                    .as_deref()
                    .and_then(|n| n.at("/metadata/labels"))
                    .and_then(Value::as_object),
            }),
        }
    }
}

fn pod_ip(pod: &Value) -> Option<IpAddr> {
    pod.at("/status/podIP")?.as_str()?.parse().ok()
}

fn resolve(core: &super::api::Core, peer: &Peer) -> Result<Resolved, super::ApiError> {
    let ids = &core.ids;
    let pod = match peer {
        Peer::Pod { namespace, name } => Some(core.get(ids.pods, namespace, name)?),
        Peer::Address(ip) => core
            .store
            .list(ids.pods, None, None)
            .map(super::store::Entry::object)
            .find(|p| pod_ip(p) == Some(*ip)),
    };
    let namespace = pod.as_deref().and_then(|p| {
        let ns = p.at("/metadata/namespace")?.as_str()?;
        core.get(ids.namespaces, "", ns).ok()
    });
    let ip = match peer {
        Peer::Address(ip) => Some(*ip),
        Peer::Pod { .. } => pod.as_deref().and_then(pod_ip),
    };
    Ok(Resolved { ip, pod, namespace })
}

/// [`evaluate`] over the simulator's stored pods, namespaces and policies. A pod that does not exist is
/// a 404, as the API would answer.
pub(crate) fn connection(
    core: &super::api::Core,
    from: &Peer,
    to: &Peer,
    port: u16,
    protocol: Protocol,
) -> Result<Verdict, super::ApiError> {
    let (from, to) = (resolve(core, from)?, resolve(core, to)?);
    let stored: Vec<std::sync::Arc<Value>> = core
        .store
        .list(core.ids.networkpolicies, None, None)
        .map(super::store::Entry::object)
        .collect();
    let policies: Vec<&Value> = stored.iter().map(|p| &**p).collect();
    Ok(evaluate(&policies, &from.end(), &to.end(), port, protocol))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, labels: Value) -> Value {
        json!({"metadata": {"namespace": ns, "name": "p", "labels": labels},
               "spec": {"containers": [{"name": "c", "ports": [{"name": "web", "containerPort": 8080}]}]}})
    }

    fn ns_labels(name: &str) -> Map<String, Value> {
        json!({"kubernetes.io/metadata.name": name})
            .as_object()
            .unwrap()
            .clone()
    }

    fn end<'a>(ip: &str, pod: &'a Value, labels: &'a Map<String, Value>) -> End<'a> {
        End {
            ip: Some(ip.parse().unwrap()),
            pod: Some(PodEnd {
                pod,
                namespace_labels: Some(labels),
            }),
        }
    }

    fn address(ip: &str) -> End<'static> {
        End {
            ip: Some(ip.parse().unwrap()),
            pod: None,
        }
    }

    fn policy(ns: &str, name: &str, spec: Value) -> Value {
        json!({"metadata": {"namespace": ns, "name": name}, "spec": spec})
    }

    #[test]
    fn without_policies_everything_connects() {
        let (a, la) = (pod("x", json!({"app": "a"})), ns_labels("x"));
        let v = evaluate(
            &[],
            &end("10.0.0.1", &a, &la),
            &address("8.8.8.8"),
            53,
            Protocol::Udp,
        );
        assert!(v.allowed());
        assert_eq!(v.egress, Side::Open);
        assert_eq!(v.ingress, Side::Open);
    }

    #[test]
    fn an_isolating_policy_without_rules_denies_both_directions() {
        let deny = policy(
            "x",
            "deny",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "egress": []}),
        );
        let (a, la) = (pod("x", json!({"app": "a"})), ns_labels("x"));
        let (b, lb) = (pod("y", json!({"app": "b"})), ns_labels("y"));
        let out = evaluate(
            &[&deny],
            &end("10.0.0.1", &a, &la),
            &end("10.0.1.1", &b, &lb),
            80,
            Protocol::Tcp,
        );
        assert!(!out.allowed());
        assert_eq!(out.egress, Side::Denied(vec!["x/deny".into()]));
        assert_eq!(out.ingress, Side::Open);
        let back = evaluate(
            &[&deny],
            &end("10.0.1.1", &b, &lb),
            &end("10.0.0.1", &a, &la),
            80,
            Protocol::Tcp,
        );
        assert!(!back.allowed());
        assert_eq!(back.ingress, Side::Denied(vec!["x/deny".into()]));
        // An address that is no pod is never isolated.
        let v = evaluate(
            &[&deny],
            &address("1.2.3.4"),
            &address("5.6.7.8"),
            80,
            Protocol::Tcp,
        );
        assert!(v.allowed());
    }

    #[test]
    fn policies_add_up_and_policy_types_default_from_the_sections() {
        let ingress_only = policy(
            "x",
            "in",
            json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "b"}}}]}]}),
        );
        let (a, la) = (pod("x", json!({"app": "a"})), ns_labels("x"));
        // No egress section and no policyTypes: egress is not isolated.
        assert!(
            evaluate(
                &[&ingress_only],
                &end("10.0.0.1", &a, &la),
                &address("1.1.1.1"),
                443,
                Protocol::Tcp
            )
            .allowed()
        );
        let (b, lb) = (pod("x", json!({"app": "b"})), ns_labels("x"));
        let (c, lc) = (pod("x", json!({"app": "c"})), ns_labels("x"));
        assert!(
            evaluate(
                &[&ingress_only],
                &end("10.0.0.2", &b, &lb),
                &end("10.0.0.1", &a, &la),
                1,
                Protocol::Tcp
            )
            .allowed()
        );
        assert!(
            !evaluate(
                &[&ingress_only],
                &end("10.0.0.3", &c, &lc),
                &end("10.0.0.1", &a, &la),
                1,
                Protocol::Tcp
            )
            .allowed()
        );
        let also_c = policy(
            "x",
            "c",
            json!({"podSelector": {"matchLabels": {"app": "a"}}, "ingress": [{"from": [{"podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["c"]}]}}]}]}),
        );
        let v = evaluate(
            &[&ingress_only, &also_c],
            &end("10.0.0.3", &c, &lc),
            &end("10.0.0.1", &a, &la),
            1,
            Protocol::Tcp,
        );
        assert!(v.allowed());
        assert_eq!(v.ingress, Side::Allowed(vec!["x/c".into()]));
    }

    #[test]
    fn pod_selectors_alone_stay_in_the_policy_namespace_and_namespace_selectors_reach_out() {
        let same_ns = policy(
            "x",
            "p",
            json!({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "proxy"}}}]}]}),
        );
        let (a, la) = (pod("x", json!({})), ns_labels("x"));
        let (proxy, lp) = (pod("proxy", json!({"app": "proxy"})), ns_labels("proxy"));
        let from_proxy = end("10.0.9.9", &proxy, &lp);
        assert!(
            !evaluate(
                &[&same_ns],
                &from_proxy,
                &end("10.0.0.1", &a, &la),
                80,
                Protocol::Tcp
            )
            .allowed()
        );
        let both = policy(
            "x",
            "q",
            json!({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "proxy"}},
            "podSelector": {"matchLabels": {"app": "proxy"}}}]}]}),
        );
        assert!(
            evaluate(
                &[&both],
                &from_proxy,
                &end("10.0.0.1", &a, &la),
                80,
                Protocol::Tcp
            )
            .allowed()
        );
        let (other, lo) = (pod("proxy", json!({"app": "other"})), ns_labels("proxy"));
        assert!(
            !evaluate(
                &[&both],
                &end("10.0.9.8", &other, &lo),
                &end("10.0.0.1", &a, &la),
                80,
                Protocol::Tcp
            )
            .allowed()
        );
        let any_in_ns = policy(
            "x",
            "r",
            json!({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "proxy"}}}]}]}),
        );
        assert!(
            evaluate(
                &[&any_in_ns],
                &end("10.0.9.8", &other, &lo),
                &end("10.0.0.1", &a, &la),
                80,
                Protocol::Tcp
            )
            .allowed()
        );
        // A selector that excludes a label (the baseline excludes sealed pods).
        let not_sealed = policy(
            "x",
            "s",
            json!({"podSelector": {"matchExpressions": [{"key": "sealed", "operator": "DoesNotExist"}]}, "policyTypes": ["Egress"], "egress": []}),
        );
        let (s, ls) = (pod("x", json!({"sealed": "true"})), ns_labels("x"));
        assert!(
            evaluate(
                &[&not_sealed],
                &end("10.0.0.5", &s, &ls),
                &address("1.1.1.1"),
                80,
                Protocol::Tcp
            )
            .allowed()
        );
        assert!(
            !evaluate(
                &[&not_sealed],
                &end("10.0.0.1", &a, &la),
                &address("1.1.1.1"),
                80,
                Protocol::Tcp
            )
            .allowed()
        );
    }

    #[test]
    fn ip_blocks_ports_and_protocols() {
        let out = policy(
            "x",
            "out",
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [
            {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
            {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "192.168.0.0/16"]}}]},
            {"to": [{"ipBlock": {"cidr": "10.1.0.0/16"}}], "ports": [{"port": 8000, "endPort": 8010}]}]}),
        );
        let (a, la) = (pod("x", json!({})), ns_labels("x"));
        let from = end("10.0.0.1", &a, &la);
        let ok =
            |to: &str, port, proto| evaluate(&[&out], &from, &address(to), port, proto).allowed();
        assert!(ok("10.96.0.10", 53, Protocol::Udp), "DNS anywhere");
        assert!(!ok("10.96.0.10", 54, Protocol::Udp));
        assert!(!ok("10.96.0.10", 53, Protocol::Sctp));
        assert!(
            ok("127.0.0.1", 443, Protocol::Tcp),
            "outside the private ranges"
        );
        assert!(!ok("10.2.3.4", 443, Protocol::Tcp), "excepted");
        assert!(!ok("192.168.1.1", 22, Protocol::Tcp), "excepted");
        assert!(ok("10.1.2.3", 8005, Protocol::Tcp), "a port range");
        assert!(!ok("10.1.2.3", 8011, Protocol::Tcp));
        assert!(!ok("10.1.2.3", 8005, Protocol::Udp), "TCP by default");
        assert!(!ok("::1", 443, Protocol::Tcp), "another family");
    }

    #[test]
    fn named_ports_are_the_destination_pods() {
        let web = policy(
            "x",
            "web",
            json!({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"ports": [{"port": "web"}]}]}),
        );
        let (a, la) = (pod("x", json!({})), ns_labels("x"));
        let to = end("10.0.0.1", &a, &la);
        assert!(evaluate(&[&web], &address("1.1.1.1"), &to, 8080, Protocol::Tcp).allowed());
        assert!(!evaluate(&[&web], &address("1.1.1.1"), &to, 8081, Protocol::Tcp).allowed());
    }

    #[test]
    fn egress_is_closed_only_when_isolated_without_any_rule() {
        let (a, la) = (pod("x", json!({"job": "a"})), ns_labels("x"));
        let me = PodEnd {
            pod: &a,
            namespace_labels: Some(&la),
        };
        assert!(!egress_closed(&[], &me), "not isolated");
        let none = policy(
            "x",
            "none",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "egress": []}),
        );
        assert!(egress_closed(&[&none], &me));
        let ranks = policy(
            "x",
            "ranks",
            json!({"podSelector": {"matchLabels": {"job": "a"}}, "policyTypes": ["Egress"],
            "egress": [{"to": [{"podSelector": {"matchLabels": {"job": "a"}}}]}]}),
        );
        assert!(!egress_closed(&[&none, &ranks], &me), "its ranks are open");
        let ingress_only = policy(
            "x",
            "in",
            json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        );
        assert!(!egress_closed(&[&ingress_only], &me));
        let elsewhere = policy(
            "y",
            "none",
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": []}),
        );
        assert!(
            !egress_closed(&[&elsewhere], &me),
            "another namespace's policy"
        );
    }

    #[test]
    fn peers_parse_as_the_endpoint_takes_them() {
        assert_eq!(Peer::parse("ns/pod-0"), Ok(Peer::pod("ns", "pod-0")));
        assert_eq!(
            Peer::parse("10.96.0.10"),
            Ok(Peer::Address("10.96.0.10".parse().unwrap()))
        );
        assert_eq!(
            Peer::parse("::1"),
            Ok(Peer::Address("::1".parse().unwrap()))
        );
        for bad in ["pod", "/pod", "ns/", "a/b/c", ""] {
            assert!(Peer::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cidrs() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(cidr_contains("10.0.0.0/8", ip("10.255.1.1")), Some(true));
        assert_eq!(cidr_contains("10.0.0.0/8", ip("11.0.0.1")), Some(false));
        assert_eq!(cidr_contains("0.0.0.0/0", ip("127.0.0.1")), Some(true));
        assert_eq!(cidr_contains("1.2.3.4/32", ip("1.2.3.4")), Some(true));
        assert_eq!(cidr_contains("fd00::/8", ip("fd12::1")), Some(true));
        assert_eq!(cidr_contains("::/0", ip("1.2.3.4")), Some(false));
        assert_eq!(cidr_contains("10.0.0.0", ip("10.0.0.1")), None);
        assert_eq!(cidr_contains("10.0.0.0/33", ip("10.0.0.1")), None);
    }
}
