//! Namespaces (and the namespace-wide objects that come with them) created on demand, and remembered.
//!
//! A namespace per owner is created by the first job of that owner; every later job only needs to know
//! it exists. The cache holds the keys of namespaces and shared objects this runner has seen exist, so
//! the common case costs no API call. It is forgotten for a namespace when a create inside it answers
//! 404 (someone deleted the namespace), and the next attempt creates it again.
//!
//! Namespaces and shared objects are never deleted by a rollback: other jobs may be using them by the
//! time a rollback runs, and an empty namespace costs nothing.

use std::sync::Arc;

use dashmap::{DashMap, DashSet};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;

use super::ClusterError;
use super::error::KubeResultExt;
use super::labels::FIELD_MANAGER;
use super::object_key::ObjectKey;
use super::retry::Budget;

/// The namespaces a runner needs before its first job: its own (tombstones, leases, the pause switch)
/// and, unless every owner gets a namespace of their own, the one every job goes to. A real cluster has
/// them from the deployment; the simulator starts with `default` and the system ones only.
pub fn runner_namespaces(
    cluster: &super::ClusterConfig,
    pipeline: &crate::pipeline::PipelineConfig,
) -> Vec<String> {
    let mut names = vec![cluster.namespace.clone()];
    if pipeline.namespace.mode == crate::pipeline::NamespaceMode::Single
        || !pipeline.plugins.fair_share
    {
        names.push(pipeline.namespace.name.clone());
    }
    names
}

/// Creates a namespace unless it exists; `true` when this call created it.
pub async fn create_if_missing(client: &kube::Client, name: &str) -> Result<bool, kube::Error> {
    use k8s_openapi::api::core::v1::Namespace;
    let api: Api<Namespace> = Api::all(client.clone());
    let namespace = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        ..Namespace::default()
    };
    match api.create(&PostParams::default(), &namespace).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Makes sure the runner's own namespaces exist (see [`runner_namespaces`]): its leases, tombstones and
/// pause switch live there, and without it the monitoring duty silently never starts. Creates a missing
/// one when the runner may; `Err` says, for an operator, what is missing and what to do.
pub async fn ensure_runner_namespaces(
    client: &kube::Client,
    cluster: &super::ClusterConfig,
    pipeline: &crate::pipeline::PipelineConfig,
) -> Result<Vec<String>, String> {
    use k8s_openapi::api::core::v1::Namespace;
    let api: Api<Namespace> = Api::all(client.clone());
    let mut created = Vec::new();
    for name in runner_namespaces(cluster, pipeline) {
        // Create first: with the deployed RBAC (create on namespaces) an existing namespace answers
        // AlreadyExists, and no read permission is needed.
        let forbidden = match create_if_missing(client, &name).await {
            Ok(true) => {
                created.push(name);
                continue;
            }
            Ok(false) => continue,
            Err(kube::Error::Api(s)) if s.code == 403 => s.message,
            Err(e) => return Err(format!("cannot create namespace {name}: {e}")),
        };
        // May not create namespaces: fine if it exists (or if we may not tell).
        match api.get_opt(&name).await {
            Ok(Some(_)) => {}
            Err(kube::Error::Api(s)) if s.code == 403 => {}
            Ok(None) => {
                return Err(format!(
                    "namespace {name} does not exist and this runner may not create it \
                     ({forbidden}): create it (kubectl create namespace {name}) or allow the runner's \
                     service account to create namespaces; until then no shard lease can be written, \
                     so no job is monitored (no RUNNING, ticks, expiry or end)"
                ));
            }
            Err(e) => return Err(format!("cannot read namespace {name}: {e}")),
        }
    }
    Ok(created)
}

/// What [`NamespaceCache::ensure`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// Known from an earlier call: no API request was made.
    Cached,
    /// This call created it.
    Created,
    /// It existed already (created by another runner or an operator).
    Existed,
}

/// The namespaces and shared objects known to exist. Cheap to share (`Arc`) between handlers.
#[derive(Debug, Default)]
pub struct NamespaceCache {
    known: DashSet<ObjectKey>,
    /// One create at a time per object: the first submissions of a new owner arrive together, and
    /// without this each would send its own create (all but one answered 409).
    creating: DashMap<ObjectKey, Arc<tokio::sync::Mutex<()>>>,
}

impl NamespaceCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes sure the object `key` exists: creates it unless it is known or already there. Any existing
    /// object of that name is accepted as it is (a namespace's labels, a baseline policy someone tuned by
    /// hand), but for a NetworkPolicy's pod selector, which is made the runner's (see [`adopt_selector`]).
    ///
    /// `object` gives the object itself, called only when it is to be created: on the submit path the
    /// object is known to exist nearly always, and its caller holds it as text (reading it back into a
    /// tree for nothing was the common case's main cost).
    pub async fn ensure(
        &self,
        client: &kube::Client,
        budget: &Budget<'_>,
        resource: &ApiResource,
        key: &ObjectKey,
        object: impl FnOnce() -> Result<DynamicObject, ClusterError>,
    ) -> Result<Ensured, ClusterError> {
        if self.known.contains(key) {
            return Ok(Ensured::Cached);
        }
        let lock = self.creating.entry(key.clone()).or_default().clone();
        let _creating = lock.lock().await;
        if self.known.contains(key) {
            return Ok(Ensured::Cached);
        }
        let object = object()?;
        let api: Api<DynamicObject> = match &key.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
            None => Api::all_with(client.clone(), resource),
        };
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        let op = format!("create {key}");
        let created = budget
            .run(&op, || async {
                api.create(&params, &object).await.classify(|| op.clone())
            })
            .await;
        let outcome = match created {
            Ok(_) => Ensured::Created,
            Err(e) if e.is_already_exists() => {
                adopt_selector(&api, budget, key, &object).await?;
                Ensured::Existed
            }
            Err(e) => return Err(e),
        };
        self.known.insert(key.clone());
        self.creating.remove(key);
        Ok(outcome)
    }

    /// Forgets a namespace and every shared object in it, after the cluster said it is gone.
    pub fn forget_namespace(&self, namespace: &str) {
        self.known.retain(|key| {
            key.namespace.as_deref() != Some(namespace)
                && !(key.kind == "Namespace" && key.namespace.is_none() && key.name == namespace)
        });
    }

    /// Whether `key` is known to exist.
    pub fn contains(&self, key: &ObjectKey) -> bool {
        self.known.contains(key)
    }

    /// Remembers `key` as existing.
    pub fn insert(&self, key: ObjectKey) {
        self.known.insert(key);
    }
}

/// An existing NetworkPolicy whose `spec.podSelector` is not the desired one gets it (a merge patch; its
/// rules stay as they are): the baseline's selector keeps sealed pods out of it (policies add up, so a
/// baseline written before sealing existed, selecting every pod, would give a sealed pod DNS and the
/// internet). Read once per namespace and runner, when the policy first turns out to exist; written only
/// when it differs.
async fn adopt_selector(
    api: &Api<DynamicObject>,
    budget: &Budget<'_>,
    key: &ObjectKey,
    object: &DynamicObject,
) -> Result<(), ClusterError> {
    let Some(selector) = object
        .data
        .get("spec")
        .and_then(|s| s.get("podSelector"))
        .filter(|_| key.kind == "NetworkPolicy")
    else {
        return Ok(());
    };
    let op = format!("get {key}");
    let existing = budget
        .run(&op, || async {
            api.get(&key.name).await.classify(|| op.clone())
        })
        .await?;
    let current = existing.data.get("spec").and_then(|s| s.get("podSelector"));
    if current.map(normal_selector) == Some(normal_selector(selector)) {
        return Ok(());
    }
    // A merge patch merges objects: what the desired selector lacks is set to null (removed), so that a
    // hand-made matchLabels does not stay beside it.
    let mut replace = serde_json::json!({"matchLabels": null, "matchExpressions": null});
    if let (Some(r), Some(desired)) = (replace.as_object_mut(), selector.as_object()) {
        r.extend(desired.clone());
    }
    let body = serde_json::json!({"spec": {"podSelector": replace}});
    let params = kube::api::PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..kube::api::PatchParams::default()
    };
    let op = format!("patch {key} spec.podSelector");
    budget
        .run(&op, || async {
            api.patch(&key.name, &params, &kube::api::Patch::Merge(&body))
                .await
                .classify(|| op.clone())
        })
        .await?;
    Ok(())
}

/// A label selector without its empty parts (`{}` and `{"matchLabels": {}}` select the same pods).
fn normal_selector(selector: &serde_json::Value) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for key in ["matchLabels", "matchExpressions"] {
        let value = selector.get(key).filter(|v| match v {
            serde_json::Value::Object(o) => !o.is_empty(),
            serde_json::Value::Array(a) => !a.is_empty(),
            _ => false,
        });
        if let Some(v) = value {
            out.insert(key.to_owned(), v.clone());
        }
    }
    serde_json::Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kind: &str, ns: Option<&str>, name: &str) -> ObjectKey {
        ObjectKey {
            api_version: "v1".into(),
            kind: kind.into(),
            namespace: ns.map(Into::into),
            name: name.into(),
        }
    }

    /// The object is made (the applier reads it back from its text) only when it is to be created: a
    /// known one costs neither that nor a request.
    #[tokio::test]
    async fn a_known_object_is_not_read_back_nor_requested() {
        // Nothing listens there: a request would fail.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let policy =
            super::super::RetryPolicy::from_config(&super::super::ClusterConfig::default());
        let budget = policy.budget();
        let resource = ApiResource::erase::<k8s_openapi::api::core::v1::Namespace>(&());
        let cache = NamespaceCache::new();
        let alice = key("Namespace", None, "alice");
        cache.insert(alice.clone());
        let ensured = cache
            .ensure(&client, &budget, &resource, &alice, || {
                unreachable!("alice is known to exist: nothing to create")
            })
            .await
            .unwrap();
        assert_eq!(ensured, Ensured::Cached);

        let mut made = false;
        let failed = cache
            .ensure(
                &client,
                &budget,
                &resource,
                &key("Namespace", None, "bob"),
                || {
                    made = true;
                    Err(ClusterError::Internal {
                        op: "create Namespace bob".into(),
                        message: "unreadable".into(),
                    })
                },
            )
            .await
            .unwrap_err();
        assert!(made, "bob is not known: it is made to be created");
        assert!(failed.to_string().contains("unreadable"), "{failed}");
        assert!(!cache.contains(&key("Namespace", None, "bob")));
    }

    #[test]
    fn forgetting_a_namespace_forgets_what_was_in_it() {
        let cache = NamespaceCache::new();
        cache.insert(key("Namespace", None, "alice"));
        cache.insert(key("NetworkPolicy", Some("alice"), "baseline"));
        cache.insert(key("Namespace", None, "bob"));
        cache.insert(key("NetworkPolicy", Some("bob"), "baseline"));
        cache.forget_namespace("alice");
        assert!(!cache.contains(&key("Namespace", None, "alice")));
        assert!(!cache.contains(&key("NetworkPolicy", Some("alice"), "baseline")));
        assert!(cache.contains(&key("Namespace", None, "bob")));
        assert!(cache.contains(&key("NetworkPolicy", Some("bob"), "baseline")));
    }
}
