//! Required inter-pod anti-affinity on the host name, as the scheduler's inter-pod affinity filter applies
//! it in both directions: a pod does not go to a node where one of its terms selects a pod already there,
//! nor where a term of a pod already there selects it.
//!
//! Modelled: `requiredDuringSchedulingIgnoredDuringExecution` terms with `topologyKey:
//! kubernetes.io/hostname`, `labelSelector` (`matchLabels`, `matchExpressions`), and the namespaces a
//! term covers: `namespaceSelector: {}` for all of them, else `namespaces`, else the pod's own. Not
//! modelled: other topology keys, preferred terms, pod affinity (attraction), and a non-empty
//! `namespaceSelector` (taken as all namespaces, the stricter reading).

use serde_json::{Map, Value};

use crate::sim::json::JsonPath;
use crate::sim::selector::LabelSelector;

/// The only topology this model knows: one node.
pub const HOSTNAME: &str = "kubernetes.io/hostname";

/// Which namespaces a term looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scope {
    All,
    Only(Vec<String>),
}

/// One required anti-affinity term.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Term {
    /// `None`: no selector, which selects nothing (as upstream).
    selector: Option<LabelSelector>,
    scope: Scope,
}

impl Term {
    fn selects(&self, other: &Resident) -> bool {
        let in_scope = match &self.scope {
            Scope::All => true,
            Scope::Only(list) => list.contains(&other.namespace),
        };
        in_scope
            && self
                .selector
                .as_ref()
                .is_some_and(|s| s.matches(Some(&other.labels)))
    }
}

/// What the filter needs of a pod on (or coming to) a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resident {
    namespace: String,
    labels: Map<String, Value>,
    terms: Vec<Term>,
}

/// Whether the pod has a required anti-affinity term this model honours.
pub fn has_terms(pod: &Value) -> bool {
    !terms(pod).is_empty()
}

fn terms(pod: &Value) -> Vec<&Value> {
    pod.at("/spec/affinity/podAntiAffinity/requiredDuringSchedulingIgnoredDuringExecution")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter(|t| t["topologyKey"].as_str() == Some(HOSTNAME))
                .collect()
        })
        .unwrap_or_default()
}

impl Resident {
    /// The pod's namespace, labels and honoured terms.
    pub fn of(pod: &Value) -> Self {
        let namespace = pod
            .at("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let terms = terms(pod)
            .into_iter()
            .map(|t| {
                let scope = if t.get("namespaceSelector").is_some_and(Value::is_object) {
                    Scope::All
                } else {
                    match t["namespaces"].as_array() {
                        Some(list) if !list.is_empty() => Scope::Only(
                            list.iter()
                                .filter_map(|n| n.as_str().map(str::to_owned))
                                .collect(),
                        ),
                        _ => Scope::Only(vec![namespace.clone()]),
                    }
                };
                Term {
                    selector: t
                        .get("labelSelector")
                        .filter(|sel| sel.is_object())
                        .map(LabelSelector::from_structured),
                    scope,
                }
            })
            .collect();
        Self {
            labels: pod
                .at("/metadata/labels")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            namespace,
            terms,
        }
    }

    /// Whether it carries a term (counted, so that nodes without such pods skip the check).
    pub fn guards(&self) -> bool {
        !self.terms.is_empty()
    }

    /// Whether `self` may join the pods already on a node.
    pub fn fits_beside<'a>(&self, residents: impl IntoIterator<Item = &'a Resident>) -> bool {
        residents.into_iter().all(|r| {
            !self.terms.iter().any(|t| t.selects(r)) && !r.terms.iter().any(|t| t.selects(self))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, job: Option<&str>, exclusive: bool) -> Resident {
        let mut p = json!({"metadata": {"namespace": ns, "labels": {}}, "spec": {}});
        if let Some(j) = job {
            p["metadata"]["labels"]["volcano.sh/job-name"] = json!(j);
        }
        if exclusive {
            p["spec"]["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchExpressions": [{"key": "volcano.sh/job-name", "operator": "Exists"}]},
                "namespaceSelector": {}, "topologyKey": HOSTNAME
            }]}});
        }
        Resident::of(&p)
    }

    #[test]
    fn an_exclusive_pod_shares_its_node_with_no_job_pod_in_either_direction() {
        let whole = pod("alice", Some("j-1"), true);
        let other = pod("bob", Some("j-2"), false);
        let own_rank = pod("alice", Some("j-1"), true);
        let daemon = pod("kube-system", None, false);
        assert!(!whole.fits_beside([&other]), "it does not join a job's pod");
        assert!(!other.fits_beside([&whole]), "no job's pod joins it");
        assert!(!own_rank.fits_beside([&whole]), "its own ranks are apart");
        assert!(
            whole.fits_beside([&daemon]),
            "what the cluster runs may stay"
        );
        assert!(daemon.fits_beside([&whole]));
        assert!(other.fits_beside([&pod("carol", Some("j-3"), false)]));
    }

    #[test]
    fn without_a_namespace_selector_a_term_covers_its_own_namespace() {
        let mut p = json!({"metadata": {"namespace": "alice", "labels": {"app": "x"}}, "spec": {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": HOSTNAME
        }]}}}});
        let a = Resident::of(&p);
        p["metadata"]["namespace"] = json!("bob");
        let b = Resident::of(&p);
        assert!(a.fits_beside([&b]));
        assert!(!a.fits_beside([&a.clone()]));
        // Another topology is not modelled: no term.
        p["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            [0]["topologyKey"] = json!("topology.kubernetes.io/zone");
        assert!(!has_terms(&p));
    }
}
