//! How many whole nodes (`exclusiveNodes`) an owner holds, and whether one more whole-node job fits the
//! operator's limits (`[pipeline.whole_nodes] max_per_owner`, and per whole-node product).
//!
//! The count comes from the cluster, never from a runner's memory: every managed VolcanoJob says on
//! itself whether it holds whole nodes (`exclusiveNodes`), for whom (`ownerUser`, `ownerProject`), as
//! which product (`wholeNodeCharge`, else `productId`) and how many (`replicas`). A job holds its nodes
//! from its creation (a waiting one will hold them when it starts, so it counts too) until it is asked to
//! end (`terminationCause`, written before its TerminateJob command), its end is recorded (`outcome`,
//! `lifecycleState` terminal) or it is being deleted. [`Hold::of`] reads that from a job's
//! metadata, which the runner's metadata watch of the managed jobs already keeps
//! ([`super::jobs::JobStore`]).
//!
//! The watch lags behind the runner's own creates by a moment, so the jobs this runner created and the
//! watch has not shown yet are counted from a [`Ledger`] for up to [`UNSEEN_GRACE`], and whole-node
//! submissions of one runner are checked and created one at a time (the ledger sits behind a lock the
//! submission holds until its job exists). Within one runner the limits are exact; across runners, two
//! submissions checked in the same instant on two runners can both pass (like `max_active_jobs`, a soft
//! limit across runners).

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Deserializer};
use tokio::time::Instant;

use super::kept_map::{Kept, Keys};
use crate::durable::AnnotationKeys;
use crate::pipeline::{WholeNodeCharge, WholeNodeProduct, WholeNodesConfig};
use crate::volcano::VolcanoJob;

/// How long a job this runner created counts without the watch having shown it. Longer than any watch
/// lag; a job created and deleted before the watch saw it stops counting after this.
pub const UNSEEN_GRACE: Duration = Duration::from_secs(120);

/// Lifecycle states after which a job has had its terminal event (its nodes are free).
const TERMINAL_STATES: [&str; 4] = ["SUCCESS", "FAILURE", "EXPIRED", "CANCELLED"];

/// Who a job's whole nodes count against: its project, else its user (as for peers and FairShare).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A project's job.
    Project(String),
    /// A personal job.
    User(String),
}

impl Owner {
    /// The owner of a job of `user`, charged to `project` when it has one (an empty project is none).
    pub fn of(user: &str, project: Option<&str>) -> Self {
        match project.filter(|p| !p.is_empty()) {
            Some(p) => Self::Project(p.to_owned()),
            None => Self::User(user.to_owned()),
        }
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Project(p) => write!(f, "project {p}"),
            Self::User(u) => write!(f, "user {u}"),
        }
    }
}

/// The whole nodes one managed job holds (or will hold once it starts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// Whom they count against.
    pub owner: Owner,
    /// The whole-node product they are charged as (`wholeNodeCharge`'s product, else `productId`).
    pub product: String,
    /// How many nodes: one per rank.
    pub nodes: u32,
}

impl Hold {
    /// What the job with this metadata holds; `None` when it holds no whole node: not a whole-node job,
    /// asked to end, its end recorded, or being deleted.
    pub fn of(meta: &ObjectMeta, keys: &AnnotationKeys) -> Option<Self> {
        let annotations = meta.annotations.as_ref()?;
        let get = |key: &str| annotations.get(key).map(String::as_str);
        // Asked to end (a cancel, an expiry: the cause is recorded before the TerminateJob command), its
        // end recorded, or being deleted: its nodes are on their way back.
        if get(&keys.exclusive_nodes) != Some("true")
            || meta.deletion_timestamp.is_some()
            || get(&keys.termination_cause).is_some()
            || get(&keys.outcome).is_some()
        {
            return None;
        }
        let state = get(&keys.lifecycle_state).map(|s| s.trim_start_matches("JOB_STATE_"));
        if state.is_some_and(|s| TERMINAL_STATES.contains(&s)) {
            return None;
        }
        let product = get(&keys.whole_node_charge)
            .and_then(|c| serde_json::from_str::<WholeNodeCharge>(c).ok())
            .map(|c| c.product)
            .or_else(|| get(&keys.product_id).map(str::to_owned))
            .unwrap_or_default();
        // A job without its replica count (not written by this runner) counts as one node: it holds at
        // least that.
        let nodes = get(&keys.replicas)
            .and_then(|r| r.trim().parse::<u32>().ok())
            .unwrap_or(1)
            .max(1);
        Some(Self {
            owner: Owner::of(
                get(&keys.owner_user).unwrap_or_default(),
                get(&keys.owner_project),
            ),
            product,
            nodes,
        })
    }
}

/// One more whole-node job of `owner` asking for `wanted` nodes charged as `entry`, against what is
/// held: `Err` with the limit it would pass, in words for the FAILURE event.
pub fn check(
    config: &WholeNodesConfig,
    entry: &WholeNodeProduct,
    owner: &Owner,
    wanted: u32,
    holds: &[Hold],
) -> Result<(), String> {
    let mine = || holds.iter().filter(|h| h.owner == *owner);
    let wanted64 = u64::from(wanted);
    if let Some(max) = config.max_per_owner {
        let held = nodes(mine());
        if held + wanted64 > u64::from(max) {
            return Err(format!(
                "{owner} holds {held} whole nodes and this job asks for {wanted} more; at most {max} at \
                 once ([pipeline.whole_nodes] max_per_owner); resubmit once a whole-node job has ended"
            ));
        }
    }
    if let Some(max) = entry.max_per_owner {
        let product = &entry.product;
        let held = nodes(mine().filter(|h| h.product == *product));
        if held + wanted64 > u64::from(max) {
            return Err(format!(
                "{owner} holds {held} whole nodes of {product} and this job asks for {wanted} more; at \
                 most {max} of {product} at once (max_per_owner of its [pipeline.whole_nodes.products] \
                 entry); resubmit once a whole-node job has ended"
            ));
        }
    }
    Ok(())
}

/// The nodes of `holds` together.
fn nodes<'a>(holds: impl Iterator<Item = &'a Hold>) -> u64 {
    holds.map(|h| u64::from(h.nodes)).sum()
}

/// Whole-node jobs this runner created that its watch may not show yet, by `(name, namespace)`.
#[derive(Debug, Default)]
pub struct Ledger {
    created: HashMap<(String, String), (Hold, Instant)>,
}

impl Ledger {
    /// Counts a job this runner has just created, until the watch shows it.
    pub fn record(&mut self, key: (String, String), hold: Hold, now: Instant) {
        self.created.insert(key, (hold, now));
    }

    /// Everything held: the cluster's view (`(name, namespace)` → its hold, for every managed job it
    /// shows, holding or not) and the jobs created here that it does not show yet. Forgets the ones it
    /// shows and the ones past [`UNSEEN_GRACE`].
    pub fn holds<'a>(
        &mut self,
        view: impl IntoIterator<Item = (&'a (String, String), &'a Option<Hold>)>,
        now: Instant,
    ) -> Vec<Hold> {
        let mut holds = Vec::new();
        for (key, hold) in view {
            self.created.remove(key);
            holds.extend(hold.clone());
        }
        self.created
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < UNSEEN_GRACE);
        holds.extend(self.created.values().map(|(h, _)| h.clone()));
        holds
    }
}

/// The names of the annotations [`Hold::of`] reads, without their prefix.
const HOLD_ANNOTATIONS: [&str; 9] = [
    "exclusiveNodes",
    "terminationCause",
    "outcome",
    "lifecycleState",
    "wholeNodeCharge",
    "productId",
    "replicas",
    "ownerUser",
    "ownerProject",
];

/// A managed job's metadata as the submit path's names view keeps it ([`super::jobs::JobStore`]): its
/// name, namespace, deletion time and resourceVersion (kube's watcher resumes from it, and lists again
/// at once when an event has none), and of its annotations those [`Hold::of`] reads. A metadata watch
/// of every managed job feeds that view, so every job event of every runner is decoded here; decoding
/// the whole `ObjectMeta` made a string of each of the runner's records on the job and a JSON tree of
/// its `managedFields` only to drop them (issue 46). An annotation is kept when its name ends in one
/// of [`HOLD_ANNOTATIONS`]: a superset of the prefixed keys, whatever the prefix.
#[derive(Debug, Clone, Default)]
pub struct HoldMeta {
    pub metadata: ObjectMeta,
}

impl kube::Resource for HoldMeta {
    type DynamicType = ();
    type Scope = <VolcanoJob as kube::Resource>::Scope;

    /// Read with metadata-only requests: the API server sends no spec.
    fn metadata_api() -> bool {
        true
    }
    fn kind(dt: &()) -> Cow<'_, str> {
        VolcanoJob::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        VolcanoJob::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        VolcanoJob::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        VolcanoJob::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<'de> Deserialize<'de> for HoldMeta {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default)]
            metadata: Option<WireMeta>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct WireMeta {
            #[serde(default)]
            name: Option<String>,
            #[serde(default)]
            namespace: Option<String>,
            #[serde(default)]
            deletion_timestamp: Option<Time>,
            #[serde(default)]
            annotations: Kept<HoldKeys>,
            #[serde(default)]
            resource_version: Option<String>,
        }
        let Some(m) = Wire::deserialize(d)?.metadata else {
            return Ok(Self::default());
        };
        Ok(Self {
            metadata: ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                deletion_timestamp: m.deletion_timestamp,
                annotations: m.annotations.into_map(),
                resource_version: m.resource_version,
                ..ObjectMeta::default()
            },
        })
    }
}

/// The annotations [`Hold::of`] reads (by the end of their name, so whatever the prefix); the others'
/// values are skipped, no string made of them.
struct HoldKeys;

impl Keys for HoldKeys {
    fn keep(key: &str) -> bool {
        HOLD_ANNOTATIONS.iter().any(|n| key.ends_with(n))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn keys() -> AnnotationKeys {
        AnnotationKeys::new("ucloud.dk/")
    }

    fn meta(pairs: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            annotations: Some(
                pairs
                    .iter()
                    .map(|(k, v)| (format!("ucloud.dk/{k}"), (*v).to_owned()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..ObjectMeta::default()
        }
    }

    fn hold(owner: Owner, product: &str, nodes: u32) -> Hold {
        Hold {
            owner,
            product: product.into(),
            nodes,
        }
    }

    fn alice() -> Owner {
        Owner::User("alice".into())
    }

    fn gpu_entry(max: Option<u32>) -> WholeNodeProduct {
        WholeNodeProduct {
            product: "gpu-node".into(),
            cpu: 64,
            memory_gib: 512,
            gpu: 4,
            max_per_owner: max,
        }
    }

    /// The annotations of a running job of project `lab` holding three `gpu-node` nodes.
    const RUNNING_WHOLE_NODES: [(&str, &str); 7] = [
        ("exclusiveNodes", "true"),
        ("ownerUser", "alice"),
        ("ownerProject", "lab"),
        ("productId", "gpu-1"),
        (
            "wholeNodeCharge",
            r#"{"product":"gpu-node","cpu":64,"memoryGib":512,"gpu":4}"#,
        ),
        ("replicas", "3"),
        ("lifecycleState", "RUNNING"),
    ];

    #[test]
    fn a_job_holds_whole_nodes_until_its_end_is_recorded() {
        let k = keys();
        let running = meta(&RUNNING_WHOLE_NODES);
        assert_eq!(
            Hold::of(&running, &k),
            Some(hold(Owner::Project("lab".into()), "gpu-node", 3))
        );
        // Without a charge (created before charges existed), the product it asked for.
        let plain = meta(&[
            ("exclusiveNodes", "true"),
            ("ownerUser", "alice"),
            ("productId", "gpu-1"),
        ]);
        assert_eq!(Hold::of(&plain, &k), Some(hold(alice(), "gpu-1", 1)));
        let shared = meta(&[("ownerUser", "alice"), ("productId", "gpu-1")]);
        assert_eq!(Hold::of(&shared, &k), None);
        for state in ["SUCCESS", "JOB_STATE_FAILURE", "EXPIRED", "CANCELLED"] {
            let ended = meta(&[
                ("exclusiveNodes", "true"),
                ("ownerUser", "alice"),
                ("lifecycleState", state),
            ]);
            assert_eq!(Hold::of(&ended, &k), None, "{state}");
        }
        let mut deleting = plain.clone();
        deleting.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::UNIX_EPOCH,
        ));
        assert_eq!(Hold::of(&deleting, &k), None);
        // Asked to end (a cancel, an expiry: the cause comes before the TerminateJob command; the job
        // is not deleted), or its outcome recorded before the terminal state is published.
        for key in ["terminationCause", "outcome"] {
            let ending = meta(&[
                ("exclusiveNodes", "true"),
                ("ownerUser", "alice"),
                ("productId", "gpu-1"),
                (key, "x"),
            ]);
            assert_eq!(Hold::of(&ending, &k), None, "{key}");
        }
    }

    #[test]
    fn limits_count_the_owner_in_total_and_per_product() {
        let bob = Owner::User("bob".into());
        let lab = Owner::Project("alice".into());
        let holds = vec![
            hold(alice(), "gpu-node", 1),
            hold(alice(), "fat-node", 2),
            hold(bob.clone(), "gpu-node", 5),
            // A project named like the user is another owner.
            hold(lab, "gpu-node", 5),
        ];
        let total = WholeNodesConfig {
            max_per_owner: Some(4),
            ..WholeNodesConfig::default()
        };
        assert_eq!(check(&total, &gpu_entry(None), &alice(), 1, &holds), Ok(()));
        let e = check(&total, &gpu_entry(None), &alice(), 2, &holds).unwrap_err();
        assert!(
            e.starts_with("user alice holds 3 whole nodes and this job asks for 2 more; at most 4"),
            "{e}"
        );
        assert!(e.contains("max_per_owner"), "{e}");
        let none = WholeNodesConfig::default();
        assert_eq!(
            check(&none, &gpu_entry(Some(2)), &alice(), 1, &holds),
            Ok(())
        );
        let e = check(&none, &gpu_entry(Some(1)), &alice(), 1, &holds).unwrap_err();
        assert!(
            e.starts_with(
                "user alice holds 1 whole nodes of gpu-node and this job asks for 1 more"
            ),
            "{e}"
        );
        assert_eq!(
            check(
                &none,
                &gpu_entry(Some(1)),
                &Owner::User("carol".into()),
                1,
                &holds
            ),
            Ok(())
        );
        assert!(check(&none, &gpu_entry(Some(1)), &bob, 1, &holds).is_err());
        // Nothing configured: no limit.
        assert_eq!(check(&none, &gpu_entry(None), &bob, 64, &holds), Ok(()));
    }

    #[test]
    fn the_ledger_counts_its_creates_until_the_watch_shows_them() {
        let now = Instant::now();
        let mut ledger = Ledger::default();
        let key = ("j-1".to_owned(), "ns".to_owned());
        ledger.record(key.clone(), hold(alice(), "gpu-node", 2), now);
        let empty: Vec<(&(String, String), &Option<Hold>)> = Vec::new();
        assert_eq!(
            ledger.holds(empty.clone(), now),
            [hold(alice(), "gpu-node", 2)]
        );
        // The watch shows it (ended already): the view decides, the ledger forgets it.
        let ended: Option<Hold> = None;
        assert!(ledger.holds([(&key, &ended)], now).is_empty());
        assert!(ledger.holds(empty.clone(), now).is_empty());
        // One the watch never shows stops counting after the grace.
        ledger.record(key, hold(alice(), "gpu-node", 2), now);
        assert_eq!(ledger.holds(empty.clone(), now + UNSEEN_GRACE / 2).len(), 1);
        assert!(ledger.holds(empty, now + UNSEEN_GRACE).is_empty());
    }

    /// The names view decodes a job's metadata slim ([`HoldMeta`]): it must hold what [`Hold::of`]
    /// reads, under any prefix, and nothing of the rest (other annotations, labels, managed fields).
    #[test]
    fn the_slim_metadata_holds_what_a_hold_is_read_from() {
        for prefix in ["ucloud.dk/", "example.org/runner-"] {
            let k = AnnotationKeys::new(prefix);
            let mut annotations = serde_json::Map::new();
            let others = [("submissionHash", "abc"), ("traceparent", "00-1-2-01")];
            for (name, value) in RUNNING_WHOLE_NODES.into_iter().chain(others) {
                annotations.insert(format!("{prefix}{name}"), value.into());
            }
            let mut job = serde_json::json!({
                "apiVersion": "meta.k8s.io/v1",
                "kind": "PartialObjectMetadata",
                "metadata": {
                    "name": "j-1", "namespace": "ns", "uid": "u", "resourceVersion": "7",
                    "labels": {"app.kubernetes.io/managed-by": "volcano-runner"},
                    "annotations": annotations,
                    "managedFields": [{"manager": "m", "fieldsV1": {"f:metadata": {}}}],
                },
            });
            let full: ObjectMeta = serde_json::from_value(job["metadata"].clone()).unwrap();
            let slim: HoldMeta = serde_json::from_value(job.clone()).unwrap();
            assert_eq!(slim.metadata.name.as_deref(), Some("j-1"));
            assert_eq!(slim.metadata.namespace.as_deref(), Some("ns"));
            assert_eq!(slim.metadata.resource_version.as_deref(), Some("7"));
            assert_eq!(Hold::of(&slim.metadata, &k), Hold::of(&full, &k));
            assert!(Hold::of(&slim.metadata, &k).is_some());
            let kept = slim.metadata.annotations.unwrap();
            assert_eq!(kept.len(), 7, "{kept:?}");
            assert!(slim.metadata.labels.is_none() && slim.metadata.managed_fields.is_none());
            // Asked to end, or being deleted: no longer held, as from the whole metadata.
            job["metadata"]["annotations"][format!("{prefix}terminationCause")] = "CANCEL".into();
            let slim: HoldMeta = serde_json::from_value(job.clone()).unwrap();
            assert_eq!(Hold::of(&slim.metadata, &k), None);
            job["metadata"]["annotations"] = serde_json::Value::Null;
            job["metadata"]["deletionTimestamp"] = "2026-11-29T04:00:00Z".into();
            let slim: HoldMeta = serde_json::from_value(job).unwrap();
            assert!(slim.metadata.deletion_timestamp.is_some());
            assert!(slim.metadata.annotations.is_none());
        }
        let empty: HoldMeta = serde_json::from_str(r#"{"metadata": null}"#).unwrap();
        assert!(empty.metadata.name.is_none());
    }
}
