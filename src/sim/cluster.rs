//! The whole simulated cluster behind one lock: the API state, the Volcano model and the garbage
//! collector, settled to a fixed point after every write and stepped through simulated time.

use std::collections::BTreeSet;

use crate::sim::json::JsonPath;
use jiff::Timestamp;
use serde_json::Value;

use super::api::{Core, FOREGROUND_FINALIZER, Propagation};
use super::encode::{EventType, ObjectKey, Record};
use super::store::{Entry, owner_uids, uid_of};
use super::volcano::{Model, ModelConfig};

/// Upper bound on controller rounds per settle; reaching it means a controller keeps rewriting.
const MAX_ROUNDS: usize = 10_000;

/// The garbage collector and namespace controller.
#[derive(Debug, Default)]
struct Gc {
    terminating_namespaces: BTreeSet<String>,
}

fn deleting(obj: &Value) -> bool {
    obj.at("/metadata/deletionTimestamp").is_some()
}

fn has_finalizer(obj: &Value, f: &str) -> bool {
    obj.at("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(f)))
}

impl Gc {
    fn on_changes(&mut self, core: &mut Core, records: &[std::sync::Arc<Record>]) {
        let ns_storage = core.registry.get(core.ids.namespaces).storage;
        let crd_storage = core.registry.get(core.ids.crds).storage;
        for r in records {
            match r.kind {
                EventType::Deleted => {
                    if let Some(uid) = uid_of(&r.object) {
                        for dep in core.store.dependents_of(uid) {
                            self.collect_if_orphaned(core, &dep);
                        }
                    }
                    for owner in owner_uids(&r.object) {
                        if let Some(okey) = core.store.by_uid(&owner).cloned() {
                            self.finish_foreground(core, &okey);
                        }
                    }
                    if r.key.res == crd_storage {
                        self.drop_crd(core, &r.object);
                    }
                    if !r.key.namespace.is_empty()
                        && self.terminating_namespaces.contains(&r.key.namespace)
                    {
                        let ns = r.key.namespace.clone();
                        self.check_namespace(core, &ns);
                    }
                    if r.key.res == ns_storage {
                        self.terminating_namespaces.remove(&r.key.name);
                    }
                }
                EventType::Added | EventType::Modified => {
                    if r.key.res == ns_storage && deleting(&r.object) {
                        let ns = r.key.name.clone();
                        if self.terminating_namespaces.insert(ns.clone()) {
                            self.purge_namespace(core, &ns);
                        }
                        self.check_namespace(core, &ns);
                        continue;
                    }
                    if deleting(&r.object) && has_finalizer(&r.object, FOREGROUND_FINALIZER) {
                        if let Some(uid) = uid_of(&r.object) {
                            for dep in core.store.dependents_of(uid) {
                                if core.store.entry(&dep).is_some_and(|d| !d.deleting()) {
                                    core.delete_key(&dep, Some(Propagation::Background), None);
                                }
                            }
                        }
                        self.finish_foreground(core, &r.key);
                    }
                    if r.kind == EventType::Added && !owner_uids(&r.object).is_empty() {
                        self.collect_if_orphaned(core, &r.key);
                    }
                }
            }
        }
    }

    /// Deletes an object whose owners are all gone.
    fn collect_if_orphaned(&self, core: &mut Core, key: &ObjectKey) {
        let Some(obj) = core.store.get(key) else {
            return;
        };
        let owners = owner_uids(&obj);
        if owners.is_empty() || deleting(&obj) {
            return;
        }
        if owners.iter().all(|u| core.store.by_uid(u).is_none()) {
            core.delete_key(key, Some(Propagation::Background), None);
        }
    }

    /// Removes the foreground finalizer once no dependents are left.
    fn finish_foreground(&self, core: &mut Core, key: &ObjectKey) {
        // Asked of the owner of every object deleted (an ended job, kept as text, for each of its
        // objects the svc plugin and the garbage collector delete): a look, not a parse.
        if !core.store.entry(key).is_some_and(Entry::deleting) {
            return;
        }
        let Some(obj) = core.store.get(key) else {
            return;
        };
        if !deleting(&obj) || !has_finalizer(&obj, FOREGROUND_FINALIZER) {
            return;
        }
        let uid = uid_of(&obj).unwrap_or_default().to_string();
        if !core.store.dependents_of(&uid).is_empty() {
            return;
        }
        let updated = core.update_internal(key, |o| {
            if let Some(Value::Array(f)) = o.pointer_mut("/metadata/finalizers") {
                f.retain(|x| x.as_str() != Some(FOREGROUND_FINALIZER));
            }
        });
        if updated.is_some_and(|o| {
            o.at("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty)
        }) {
            core.store.remove(key);
        }
    }

    fn namespaced_storages(core: &Core) -> BTreeSet<usize> {
        core.registry
            .served()
            .map(|id| core.registry.get(id))
            .filter(|t| t.namespaced)
            .map(|t| t.storage)
            .collect()
    }

    fn purge_namespace(&self, core: &mut Core, ns: &str) {
        for storage in Self::namespaced_storages(core) {
            let keys: Vec<ObjectKey> = core
                .store
                .names_in(storage, ns)
                .into_iter()
                .map(|name| ObjectKey::new(storage, ns, name))
                .collect();
            for k in keys {
                core.delete_key(&k, Some(Propagation::Background), None);
            }
        }
    }

    fn check_namespace(&mut self, core: &mut Core, ns: &str) {
        let empty = Self::namespaced_storages(core)
            .into_iter()
            .all(|s| core.store.count(s, Some(ns)) == 0);
        if empty {
            let key = core.key_of(core.ids.namespaces, "", ns);
            if core.store.get(&key).is_some_and(|n| deleting(&n)) {
                core.store.remove(&key);
                self.terminating_namespaces.remove(ns);
            }
        }
    }

    /// A deleted CRD stops being served and its objects go away.
    fn drop_crd(&self, core: &mut Core, crd: &Value) {
        let group = crd
            .at("/spec/group")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let plural = crd
            .at("/spec/names/plural")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let versions: Vec<String> = crd
            .at("/spec/versions")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.get("name").and_then(Value::as_str).map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let storages: BTreeSet<usize> = versions
            .iter()
            .filter_map(|v| core.registry.lookup(&group, v, &plural))
            .map(|id| core.registry.get(id).storage)
            .collect();
        core.registry.unregister(&group, &plural);
        for storage in storages {
            for ns in core.store.namespaces_of(storage) {
                let keys: Vec<ObjectKey> = core
                    .store
                    .names_in(storage, &ns)
                    .into_iter()
                    .map(|name| ObjectKey::new(storage, ns.clone(), name))
                    .collect();
                for k in keys {
                    core.store.remove(&k);
                }
            }
        }
    }
}

/// The cluster: API state, Volcano model, garbage collector.
#[derive(Debug)]
pub struct Cluster {
    pub core: Core,
    pub model: Model,
    gc: Gc,
}

impl Cluster {
    /// A cluster with nodes, queues, namespaces and the Volcano CRDs, settled at `now`.
    pub fn new(history: usize, seed: u64, now: Timestamp, model: ModelConfig) -> Cluster {
        let mut core = Core::new(history, seed, now);
        let mut model = Model::new(model);
        model.bootstrap(&mut core);
        let mut c = Cluster {
            core,
            model,
            gc: Gc::default(),
        };
        c.settle();
        c
    }

    /// Lets the controllers react to every change until nothing changes any more.
    pub fn settle(&mut self) {
        for _ in 0..MAX_ROUNDS {
            let changes = self.core.store.take_changes();
            if changes.is_empty() && !self.model.has_work() {
                return;
            }
            self.gc.on_changes(&mut self.core, &changes);
            self.model.on_changes(&mut self.core, &changes);
            self.model.run(&mut self.core);
        }
        tracing::warn!("cluster simulation did not settle after {MAX_ROUNDS} rounds");
    }

    /// Runs simulated time forward to `until`, firing every timer at its own instant.
    pub fn advance_to(&mut self, until: Timestamp) {
        self.settle();
        while self.model.fire_next(&mut self.core, until) {
            self.settle();
        }
        if until > self.core.now {
            self.core.now = until;
        }
        // A quiet cluster lets its Events expire too (an API server's are leased in etcd).
        self.core.expire_events();
        self.settle();
    }

    /// When the model next needs to act on its own.
    pub fn next_timer(&self) -> Option<Timestamp> {
        self.model.next_timer()
    }
}
