//! Nodes reserved for a waiting whole-node or large gang (`[monitor] reserve_nodes`), so that a stream of
//! smaller jobs cannot pass it for ever.
//!
//! Why: Volcano's `sla` plugin keeps, for a gang past its `sla-waiting-time`, only the idle resources it
//! can place ranks on in a session. A whole-node rank needs a node nobody uses, and a large rank (more
//! than half of some resource of a node it fits on, [`crate::forecast::needs_reservation`]) needs most
//! of a node: the room it waits for appears only once most of what runs there has ended, so smaller
//! jobs keep landing on the nodes that are about to have it, and the gang can wait for ever. Volcano's
//! `elect` and `reserve` actions, which locked nodes for a starving job, were removed in v1.1 (the `sla`
//! plugin replaced them); `priorityClassName` with the `preempt` action evicts running jobs, which
//! volcano-runner does not ask for. What Kubernetes and Volcano both honour is a node taint: Volcano's
//! `predicates` plugin runs the upstream `TaintToleration` filter, so a pod that does not tolerate a
//! `NoSchedule` taint is not placed on the node, and `NoSchedule` never evicts what already runs there.
//!
//! How: once such a gang with a waiting time is past it, does not fit, and no gang past its waiting
//! time ahead of it in the `sla` order still waits (a reservation must not take what that order gives a
//! gang ahead, whose bound was told before), the replay ([`crate::forecast::replay`]) gives it the nodes
//! that first have room for one of its ranks (untouched, for whole nodes), enough for all of its ranks
//! (a node counts for as many as it holds empty), reserved for no other gang, whose holders all have a
//! time limit; and the monitor taints each with `<prefix>reserved=<jobId>:NoSchedule`. Every rank of a
//! job with a waiting time or whole nodes is rendered with a toleration for its own job id only (the
//! pipeline's Task plugin): no other job can take a node reserved for this one, and the id is known
//! when the job is rendered, so no pod is changed afterwards. The reserved nodes empty by the deadlines
//! of what runs on them, the gang lands there (or earlier elsewhere), and its estimate is a bound.
//!
//! State: only the taints on the nodes and the jobs in the watch cache. A taint whose job is not a
//! waiting gang that reserves (it started, ended, was cancelled, is gone, or reserves no longer) is
//! removed; the decision needs no memory of its own, so a runner killed between two writes leaves
//! nothing the next pass (of any runner) does not put right. Each runner reserves for, and releases the
//! taints of, the jobs of the shards it holds. Writes carry the node's `resourceVersion`: of two
//! runners that pick the same node at once, one wins and the other decides again on its next pass; a
//! failed write is not retried in place for the same reason.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{Node as KubeNode, Taint};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::cluster::error::{ClusterError, KubeResultExt};
use crate::durable::AnnotationKeys;

/// The taint's effect: nothing new is placed, nothing running is evicted.
pub const EFFECT: &str = crate::durable::annotations::RESERVATION_EFFECT;

/// The taint key: `<prefix>reserved` (`ucloud.dk/reserved` by default).
pub fn taint_key(keys: &AnnotationKeys) -> String {
    keys.reservation_taint()
}

/// The job a node is reserved for: the value of its `key` taint with effect `NoSchedule`.
pub fn reserved_for(taints: &[Taint], key: &str) -> Option<String> {
    taints
        .iter()
        .find(|t| t.key == key && t.effect == EFFECT)
        .map(|t| t.value.clone().unwrap_or_default())
}

/// One node's new taints when the maintenance windows call for a change (planned by
/// `maintenance::plan_taints`). Kept here, with the other node-taint types, so that this file needs
/// nothing of the maintenance windows and the windows build on it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaintChange {
    /// The index of the node in the list planned for.
    pub node: usize,
    /// Its whole new list: its other taints as they were, and the maintenance taint if a window covers
    /// it.
    pub taints: Vec<Taint>,
    /// The window whose id the taint carries now (for the log); empty once none does.
    pub windows: Vec<String>,
}

/// A node's taints as last seen, with the version a write must match.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeTaints {
    pub name: String,
    pub resource_version: Option<String>,
    pub taints: Vec<Taint>,
}

impl NodeTaints {
    pub fn of(node: &KubeNode) -> Self {
        Self {
            name: node.metadata.name.clone().unwrap_or_default(),
            resource_version: node.metadata.resource_version.clone(),
            taints: node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default(),
        }
    }
}

/// One node's new taints.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub node: String,
    /// The version the taints were read at: the write fails if the node changed since.
    pub resource_version: Option<String>,
    /// The node's whole new list (a merge patch replaces the list).
    pub taints: Vec<Taint>,
    /// The job it is now reserved for, if any (for the log).
    pub reserved_for: Option<String>,
    /// The job whose reservation was removed, if any.
    pub released: Option<String>,
    /// The maintenance windows whose taints it carries now, when those changed (see
    /// [`super::maintenance::plan_taints`]), for the log.
    pub windows: Option<Vec<String>>,
}

/// What to change on the nodes: release every `key` taint whose job is not in `reserving` (the job ids
/// of the gangs that wait and reserve, as the watch cache shows them), and reserve `reserve_now`
/// (job id, node names) as the replay chose. `owns`: whether this runner looks after a job id (its
/// shards): it touches no other job's taint.
pub fn plan(
    nodes: &[NodeTaints],
    key: &str,
    reserving: &HashSet<String>,
    reserve_now: &[(String, Vec<String>)],
    owns: impl Fn(&str) -> bool,
) -> Vec<Change> {
    let mut wanted: BTreeMap<&str, &str> = BTreeMap::new();
    for (job, names) in reserve_now {
        if owns(job) {
            for n in names {
                wanted.insert(n.as_str(), job.as_str());
            }
        }
    }
    let mut out = Vec::new();
    for node in nodes {
        let current = reserved_for(&node.taints, key);
        let stale = current
            .as_deref()
            .filter(|job| !reserving.contains(*job) && owns(job));
        let want = wanted.get(node.name.as_str()).copied();
        // A node reserved for a gang that still waits keeps its reservation: the replay only picks
        // nodes reserved for nobody who waits.
        let keep_other = current.is_some() && stale.is_none();
        let reserve = want.filter(|job| !keep_other && current.as_deref() != Some(*job));
        if stale.is_none() && reserve.is_none() {
            continue;
        }
        let mut taints: Vec<Taint> = node
            .taints
            .iter()
            .filter(|t| !(t.key == key && t.effect == EFFECT))
            .cloned()
            .collect();
        if let Some(job) = reserve {
            taints.push(Taint {
                key: key.to_owned(),
                value: Some(job.to_owned()),
                effect: EFFECT.to_owned(),
                time_added: None,
            });
        }
        out.push(Change {
            node: node.name.clone(),
            resource_version: node.resource_version.clone(),
            taints,
            reserved_for: reserve.map(str::to_owned),
            released: stale.map(str::to_owned),
            windows: None,
        });
    }
    out
}

/// Folds the maintenance windows' taint changes ([`super::maintenance::plan_taints`], planned on
/// `nodes` as `changes` leave them) into `changes`: one write per node.
pub fn with_maintenance(
    mut changes: Vec<Change>,
    nodes: &[NodeTaints],
    maintenance: Vec<TaintChange>,
) -> Vec<Change> {
    for m in maintenance {
        let Some(node) = nodes.get(m.node) else {
            continue;
        };
        match changes.iter_mut().find(|c| c.node == node.name) {
            Some(c) => {
                c.taints = m.taints;
                c.windows = Some(m.windows);
            }
            None => changes.push(Change {
                node: node.name.clone(),
                resource_version: node.resource_version.clone(),
                taints: m.taints,
                reserved_for: None,
                released: None,
                windows: Some(m.windows),
            }),
        }
    }
    changes
}

/// The nodes as `changes` leave them (the maintenance taints are planned on top of the reservations).
pub fn after(nodes: &[NodeTaints], changes: &[Change]) -> Vec<NodeTaints> {
    nodes
        .iter()
        .map(|n| match changes.iter().find(|c| c.node == n.name) {
            Some(c) => NodeTaints {
                taints: c.taints.clone(),
                ..n.clone()
            },
            None => n.clone(),
        })
        .collect()
}

/// What a round of node writes did.
#[derive(Debug, Default)]
pub struct Applied {
    /// The changes written.
    pub written: usize,
    /// The nodes whose write failed (other than by a conflict), with why: decided again on a later
    /// round.
    pub failed: Vec<(String, ClusterError)>,
}

impl Applied {
    /// A write the cluster refused (no grant), if any: the same for every node.
    pub fn refused(&self) -> Option<&ClusterError> {
        self.failed
            .iter()
            .map(|(_, e)| e)
            .find(|e| e.is_forbidden())
    }
}

/// Writes the changes, each guarded by the node's `resourceVersion`. A conflict (someone wrote the node
/// since) is skipped: the next pass decides again from what the watch then shows. Any other failure is
/// kept for the caller and the round goes on with the next node: one node that cannot be written (gone,
/// refused by a webhook) does not hold back the others.
pub async fn apply(client: &kube::Client, changes: &[Change]) -> Applied {
    let api: Api<KubeNode> = Api::all(client.clone());
    let mut out = Applied::default();
    for c in changes {
        let mut patch = json!({"spec": {"taints": c.taints}});
        if let Some(rv) = &c.resource_version {
            patch["metadata"] = json!({"resourceVersion": rv});
        }
        let result = api
            .patch(&c.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .classify(|| format!("patch nodes {} (taints)", c.node));
        match result {
            Ok(_) => {
                out.written += 1;
                tracing::info!(node = %c.node, reserved_for = ?c.reserved_for, released = ?c.released,
                    maintenance_windows = ?c.windows, "Node taints changed.");
            }
            Err(e) if e.is_conflict() => {
                tracing::debug!(node = %c.node, "Node changed since it was read: decided again next pass.");
            }
            Err(e) => out.failed.push((c.node.clone(), e)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: &str) -> Taint {
        Taint {
            key: key.into(),
            value: Some(value.into()),
            effect: EFFECT.into(),
            time_added: None,
        }
    }

    fn node(name: &str, taints: Vec<Taint>) -> NodeTaints {
        NodeTaints {
            name: name.into(),
            resource_version: Some("7".into()),
            taints,
        }
    }

    const KEY: &str = "ucloud.dk/reserved";

    #[test]
    fn a_taint_is_released_once_its_job_no_longer_waits_and_kept_while_it_does() {
        let other = taint("dedicated", "gpu");
        let nodes = [
            node("a", vec![other.clone(), taint(KEY, "started")]),
            node("b", vec![taint(KEY, "waits")]),
            node("c", vec![]),
        ];
        let reserving: HashSet<String> = ["waits".to_owned()].into();
        let changes = plan(&nodes, KEY, &reserving, &[], |_| true);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(changes[0].node, "a");
        assert_eq!(changes[0].taints, vec![other], "other taints stay");
        assert_eq!(changes[0].released.as_deref(), Some("started"));
        assert_eq!(changes[0].resource_version.as_deref(), Some("7"));
        // Another runner's job: not touched.
        assert!(plan(&nodes, KEY, &reserving, &[], |j| j != "started").is_empty());
    }

    #[test]
    fn nodes_chosen_are_tainted_for_the_gang_unless_another_waiting_gang_holds_them() {
        let nodes = [
            node("a", vec![]),
            node("b", vec![taint(KEY, "gone")]),
            node("c", vec![taint(KEY, "first")]),
        ];
        let reserving: HashSet<String> = ["first".to_owned(), "g".to_owned()].into();
        let now = [(
            "g".to_owned(),
            vec!["a".to_owned(), "b".to_owned(), "c".to_owned()],
        )];
        let changes = plan(&nodes, KEY, &reserving, &now, |_| true);
        let by_node: Vec<(&str, Option<&str>, Option<&str>)> = changes
            .iter()
            .map(|c| {
                (
                    c.node.as_str(),
                    c.reserved_for.as_deref(),
                    c.released.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            by_node,
            [("a", Some("g"), None), ("b", Some("g"), Some("gone"))]
        );
        assert_eq!(changes[1].taints, vec![taint(KEY, "g")]);
        // Already reserved for it: nothing to write.
        let done = [node("a", vec![taint(KEY, "g")])];
        assert!(plan(&done, KEY, &reserving, &now, |_| true).is_empty());
    }
}
