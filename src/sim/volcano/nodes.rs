//! Simulated nodes: capacity, what is allocated on them, pod IPs, and the predicates a pod must pass
//! (node selector, taints, unschedulable, resources), with the scheduler's reasons when it does not fit.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::sim::json::JsonPath;
use serde_json::{Value, json};

use super::affinity::Resident;
use crate::sim::NodeSpec;
use crate::sim::encode::ObjectKey;
use crate::sim::quantity::{Milli, Resources, parse_milli};

/// One node as the scheduler and kubelet see it.
#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub allocatable: Resources,
    pub allocated: Resources,
    pub labels: BTreeMap<String, String>,
    /// `(key, value, effect)`.
    pub taints: Vec<(String, String, String)>,
    pub unschedulable: bool,
    /// Third octet of the node's pod CIDR `10.244.<n>.0/24`.
    pub subnet: u8,
    used_ips: BTreeSet<u8>,
    /// The last pod IP handed out: the next is the first free one after it, as the `host-local` IPAM most
    /// CNIs use allocates, so an IP given back is not reused at once (a pod restarted on its node gets
    /// another address, as on a real node).
    last_ip: u8,
    /// The pods bound here, for inter-pod anti-affinity.
    pub residents: HashMap<ObjectKey, Resident>,
    /// How many of them carry anti-affinity terms.
    pub guards: usize,
    /// Its Node object was deleted (the machine is gone or restarting): nothing is placed here until
    /// a Node of the same name is created again.
    pub lost: bool,
}

/// Why a pod does not fit on a node (the scheduler's wording).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Misfit {
    Insufficient(String),
    TooManyPods,
    Unschedulable,
    Taint(String),
    Selector,
    AntiAffinity,
}

impl Misfit {
    /// The scheduler's wording of this reason.
    pub fn text(&self) -> String {
        match self {
            Misfit::Insufficient(r) => format!("Insufficient {r}"),
            Misfit::TooManyPods => "Too many pods".to_string(),
            Misfit::Unschedulable => "node(s) were unschedulable".to_string(),
            Misfit::Taint(t) => format!("node(s) had untolerated taint {{{t}}}"),
            Misfit::Selector => "node(s) didn't match Pod's node affinity/selector".to_string(),
            Misfit::AntiAffinity => "node(s) didn't match pod anti-affinity rules".to_string(),
        }
    }
}

/// Sums misfits over nodes into `0/5 nodes are unavailable: 4 Insufficient cpu, 1 Too many pods.`
pub fn unavailable_message(total_nodes: usize, misfits: &[Misfit]) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for m in misfits {
        *counts.entry(m.text()).or_insert(0) += 1;
    }
    let parts: Vec<String> = counts.iter().map(|(t, n)| format!("{n} {t}")).collect();
    format!(
        "0/{total_nodes} nodes are unavailable: {}.",
        parts.join(", ")
    )
}

impl Node {
    /// A node from its configuration; `subnet` numbers its pod CIDR and host IP.
    pub fn from_spec(spec: &NodeSpec, subnet: u8) -> Node {
        let mut allocatable = Resources::default();
        allocatable
            .0
            .insert("cpu".into(), parse_milli(&spec.cpu).unwrap_or(0));
        allocatable
            .0
            .insert("memory".into(), parse_milli(&spec.memory).unwrap_or(0));
        if spec.gpus > 0 {
            allocatable
                .0
                .insert("nvidia.com/gpu".into(), Milli::from(spec.gpus) * 1000);
        }
        allocatable
            .0
            .insert("pods".into(), Milli::from(spec.max_pods) * 1000);
        allocatable
            .0
            .insert("ephemeral-storage".into(), 100 * (1i128 << 30) * 1000);
        let mut labels = spec.labels.clone();
        labels.insert("kubernetes.io/hostname".into(), spec.name.clone());
        labels.insert("kubernetes.io/os".into(), "linux".into());
        labels.insert("kubernetes.io/arch".into(), "amd64".into());
        Node {
            name: spec.name.clone(),
            allocatable,
            allocated: Resources::default(),
            labels,
            taints: spec
                .taints
                .iter()
                .map(|t| (t.key.clone(), t.value.clone(), t.effect.clone()))
                .collect(),
            unschedulable: false,
            subnet,
            used_ips: BTreeSet::new(),
            last_ip: 1,
            residents: HashMap::new(),
            guards: 0,
            lost: false,
        }
    }

    /// The Node object served by the API.
    pub fn to_object(&self, created: &str) -> Value {
        let taints: Vec<Value> = self
            .taints
            .iter()
            .map(|(k, v, e)| json!({"key": k, "value": v, "effect": e}))
            .collect();
        let mut spec = json!({"podCIDR": format!("10.244.{}.0/24", self.subnet), "podCIDRs": [format!("10.244.{}.0/24", self.subnet)]});
        if !taints.is_empty() {
            spec["taints"] = json!(taints);
        }
        json!({
            "metadata": {"name": self.name, "labels": self.labels},
            "spec": spec,
            "status": {
                "capacity": self.allocatable.to_json(),
                "allocatable": self.allocatable.to_json(),
                "addresses": [
                    {"type": "InternalIP", "address": self.host_ip()},
                    {"type": "Hostname", "address": self.name}
                ],
                "conditions": [{
                    "type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "kubelet is posting ready status (simulated)",
                    "lastHeartbeatTime": created, "lastTransitionTime": created
                }],
                "nodeInfo": {
                    "kubeletVersion": "v1.33.0-sim", "kubeProxyVersion": "v1.33.0-sim",
                    "containerRuntimeVersion": "sim://1.0", "operatingSystem": "linux", "architecture": "amd64",
                    "osImage": "volcano-runner simulated node", "kernelVersion": "6.0.0-sim",
                    "machineID": "", "systemUUID": "", "bootID": ""
                }
            }
        })
    }

    /// Re-reads what a user may change on the Node object (labels, taints, `spec.unschedulable`).
    /// Returns whether scheduling-relevant fields changed.
    pub fn refresh_from(&mut self, obj: &Value) -> bool {
        let labels: BTreeMap<String, String> = obj
            .at("/metadata/labels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        let taints: Vec<(String, String, String)> = obj
            .at("/spec/taints")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|t| {
                        let s = |k: &str| {
                            t.get(k)
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_string()
                        };
                        (s("key"), s("value"), s("effect"))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let unschedulable = obj
            .at("/spec/unschedulable")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let changed =
            labels != self.labels || taints != self.taints || unschedulable != self.unschedulable;
        self.labels = labels;
        self.taints = taints;
        self.unschedulable = unschedulable;
        changed
    }

    /// The node's InternalIP (pods' `hostIP`).
    pub fn host_ip(&self) -> String {
        format!("192.168.0.{}", 10 + u16::from(self.subnet))
    }

    /// Allocatable minus what bound pods request.
    pub fn free(&self) -> Resources {
        let mut f = self.allocatable.clone();
        f.sub(&self.allocated);
        f
    }

    /// Whether `pod` (its spec) with `requests` fits on this node now; the reasons when it does not.
    pub fn fits(&self, pod_spec: &Value, requests: &Resources) -> Result<(), Vec<Misfit>> {
        self.fits_with(pod_spec, requests, &Resources::default())
    }

    /// [`Node::fits`] as if `extra` were allocated on this node as well (pods placed in the same pass).
    pub fn fits_with(
        &self,
        pod_spec: &Value,
        requests: &Resources,
        extra: &Resources,
    ) -> Result<(), Vec<Misfit>> {
        let mut why = Vec::new();
        if self.unschedulable || self.lost {
            why.push(Misfit::Unschedulable);
        }
        if let Some(sel) = pod_spec.get("nodeSelector").and_then(Value::as_object) {
            let ok = sel
                .iter()
                .all(|(k, v)| self.labels.get(k).map(String::as_str) == v.as_str());
            if !ok {
                why.push(Misfit::Selector);
            }
        }
        let tolerations: &[Value] = pod_spec
            .get("tolerations")
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice);
        for (k, v, effect) in &self.taints {
            if effect != "NoSchedule" && effect != "NoExecute" {
                continue;
            }
            let tolerated = tolerations.iter().any(|t| {
                let s = |f: &str| t.get(f).and_then(Value::as_str).unwrap_or_default();
                let key_ok = s("key").is_empty() && s("operator") == "Exists" || s("key") == k;
                let value_ok = s("operator") == "Exists" || s("value") == v;
                let effect_ok = s("effect").is_empty() || s("effect") == effect;
                key_ok && value_ok && effect_ok
            });
            if !tolerated {
                why.push(Misfit::Taint(format!("{k}: {v}")));
            }
        }
        let mut free = self.free();
        free.sub(extra);
        for r in requests.shortfall(&free) {
            if r == "pods" {
                why.push(Misfit::TooManyPods);
            } else {
                why.push(Misfit::Insufficient(r));
            }
        }
        if why.is_empty() { Ok(()) } else { Err(why) }
    }

    /// Whether `incoming` may join the pods here and `extra` (placed here in the same pass), by their
    /// anti-affinity terms. Cheap when neither it nor anything here carries a term.
    pub fn admits(&self, incoming: &Resident, extra: &[Resident]) -> bool {
        if !incoming.guards() && self.guards == 0 && !extra.iter().any(Resident::guards) {
            return true;
        }
        incoming.fits_beside(self.residents.values().chain(extra))
    }

    /// A pod bound here.
    pub fn settle(&mut self, key: &ObjectKey, resident: Resident) {
        self.guards += usize::from(resident.guards());
        if let Some(old) = self.residents.insert(key.clone(), resident) {
            self.guards -= usize::from(old.guards());
        }
    }

    /// A pod that ended or went.
    pub fn leave(&mut self, key: &ObjectKey) {
        if let Some(old) = self.residents.remove(key) {
            self.guards -= usize::from(old.guards());
        }
    }

    /// Takes the first free pod IP on this node after the last one handed out (wrapping round).
    pub fn take_ip(&mut self) -> Option<(u8, String)> {
        let octet = (self.last_ip.saturating_add(1).max(2)..=254)
            .chain(2..=self.last_ip)
            .find(|o| !self.used_ips.contains(o))?;
        self.last_ip = octet;
        self.used_ips.insert(octet);
        Some((octet, format!("10.244.{}.{octet}", self.subnet)))
    }

    /// Gives a pod IP back for reuse.
    pub fn release_ip(&mut self, octet: u8) {
        self.used_ips.remove(&octet);
    }

    /// Fraction of cpu in use, for spreading pods over nodes.
    pub fn load(&self) -> f64 {
        self.load_with(&Resources::default())
    }

    /// [`Node::load`] as if `extra` were allocated on this node as well.
    pub fn load_with(&self, extra: &Resources) -> f64 {
        let cap = self.allocatable.get("cpu").max(1) as f64;
        (self.allocated.get("cpu") + extra.get("cpu")) as f64 / cap
    }
}

/// A pod's effective requests, by Kubernetes' rule ([`crate::quantity::requests_of_parts`], the one
/// the runner's bookings and estimates count by): its containers and sidecars (init containers with
/// `restartPolicy: Always`) added up, at least the init phase's peak, plus the pod's `overhead`; a
/// container's limits stand in for its missing requests. Plus one `pods` slot.
pub fn pod_requests(spec: &Value) -> Resources {
    let container_requests = |c: &Value| -> BTreeMap<String, Milli> {
        let mut req = Resources::from_json(c.at("/resources/requests")).0;
        for (k, v) in Resources::from_json(c.at("/resources/limits")).0 {
            req.entry(k).or_insert(v);
        }
        req
    };
    let list = |field: &str| {
        spec.get(field)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
    };
    let mut total = Resources(crate::quantity::requests_of_parts(
        list("containers").map(container_requests),
        list("initContainers").map(|c| {
            (
                container_requests(c),
                c.get("restartPolicy").and_then(Value::as_str) == Some("Always"),
            )
        }),
        spec.get("overhead")
            .map(|o| Resources::from_json(Some(o)).0),
    ));
    total.0.insert("pods".into(), 1000);
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::TaintSpec;

    fn node(gpus: u32) -> Node {
        Node::from_spec(
            &NodeSpec {
                name: "n1".into(),
                cpu: "16".into(),
                memory: "64Gi".into(),
                gpus,
                max_pods: 110,
                labels: BTreeMap::from([("zone".to_string(), "a".to_string())]),
                taints: vec![TaintSpec {
                    key: "sducloud".into(),
                    value: "apps".into(),
                    effect: "NoSchedule".into(),
                }],
            },
            1,
        )
    }

    #[test]
    fn requests_sum_containers_and_respect_init_containers() {
        let spec = json!({
            "initContainers": [{"resources": {"requests": {"cpu": "4"}}}],
            "containers": [
                {"resources": {"limits": {"cpu": "2000m", "memory": "4Gi"}}},
                {"resources": {"requests": {"cpu": "1"}}}
            ]
        });
        let r = pod_requests(&spec);
        assert_eq!(r.get("cpu"), 4000);
        assert_eq!(r.get("memory"), 4 * (1i128 << 30) * 1000);
        assert_eq!(r.get("pods"), 1000);
    }

    /// A sidecar (an init container with `restartPolicy: Always`) runs beside the containers, so it
    /// holds capacity with them, and the pod's `overhead` (its RuntimeClass's) is added: the rule the
    /// runner's bookings and estimates count by. The scheduler counted neither: a pod the runner
    /// expects to wait was placed.
    #[test]
    fn requests_add_sidecars_and_overhead_as_kubernetes_does() {
        let spec = json!({
            "overhead": {"cpu": "250m", "memory": "64Mi"},
            "initContainers": [
                {"name": "proxy", "restartPolicy": "Always",
                 "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
                {"name": "migrate", "resources": {"requests": {"cpu": "3"}}}
            ],
            "containers": [{"name": "app", "resources": {"requests": {"cpu": "2", "memory": "2Gi"}}}]
        });
        let r = pod_requests(&spec);
        // Running: app 2 + proxy 1 = 3 cpu; init peak: proxy 1 + migrate 3 = 4 cpu; plus 250m.
        assert_eq!(r.get("cpu"), 4250);
        assert_eq!(r.get("memory"), (3 * 1024 + 64) * (1i128 << 20) * 1000);
        assert_eq!(r.get("pods"), 1000);
        let typed: k8s_openapi::api::core::v1::PodSpec = serde_json::from_value(spec).unwrap();
        let (cpu, memory, gpu) = crate::quantity::pod_cpu_memory_gpu(&typed);
        assert_eq!(
            (cpu as i128, memory as i128, gpu),
            (r.get("cpu"), r.get("memory") / ((1 << 20) * 1000), 0),
            "the simulator's scheduler counts a pod as the runner does"
        );
    }

    #[test]
    fn taints_selectors_and_resources() {
        let n = node(0);
        let tolerating = json!({"tolerations": [{"key": "sducloud", "operator": "Equal", "value": "apps", "effect": "NoSchedule"}]});
        let small =
            pod_requests(&json!({"containers": [{"resources": {"requests": {"cpu": "2"}}}]}));
        assert!(n.fits(&tolerating, &small).is_ok());
        assert_eq!(
            n.fits(&json!({}), &small).unwrap_err(),
            vec![Misfit::Taint("sducloud: apps".into())]
        );
        let big = pod_requests(
            &json!({"containers": [{"resources": {"requests": {"cpu": "20", "nvidia.com/gpu": "1"}}}]}),
        );
        let why = n.fits(&tolerating, &big).unwrap_err();
        assert_eq!(
            why,
            vec![
                Misfit::Insufficient("cpu".into()),
                Misfit::Insufficient("nvidia.com/gpu".into())
            ]
        );
        let mut sel = tolerating.clone();
        sel["nodeSelector"] = json!({"zone": "b"});
        assert_eq!(n.fits(&sel, &small).unwrap_err(), vec![Misfit::Selector]);
        assert_eq!(
            unavailable_message(
                5,
                &[
                    Misfit::Insufficient("cpu".into()),
                    Misfit::Insufficient("cpu".into()),
                    Misfit::Selector
                ]
            ),
            "0/5 nodes are unavailable: 2 Insufficient cpu, 1 node(s) didn't match Pod's node affinity/selector."
        );
    }

    #[test]
    fn ips_are_handed_out_round_and_reused_only_after_the_rest() {
        let mut n = node(4);
        let (a, ip) = n.take_ip().unwrap();
        assert_eq!(ip, "10.244.1.2");
        let (b, _) = n.take_ip().unwrap();
        n.release_ip(a);
        let (c, _) = n.take_ip().unwrap();
        assert!(c != a && c != b, "a freed IP is not reused at once");
        for _ in 0..250 {
            n.take_ip().unwrap();
        }
        assert_eq!(n.take_ip().unwrap().0, a, "after a round, the freed one is");
        assert!(n.take_ip().is_none(), "the /24 is full");
        assert_eq!(n.allocatable.get("nvidia.com/gpu"), 4000);
    }
}
