//! The API semantics, without HTTP: get, list, create, update, patch and delete with everything a real
//! API server does around them (metadata, optimistic concurrency, status subresources, pruning and
//! validation, admission, finalizers, graceful deletion). Synchronous and pure apart from the store.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::sim::json::JsonPath;
use jiff::{SignedDuration, Timestamp};
use serde_json::{Map, Value, json};

use super::builtin;
use super::clock::format_time;
use super::encode::ObjectKey;
use super::error::{ApiError, FieldError, FieldErrorKind};
use super::names;
use super::patch::{self, PatchError, PatchKind};
use super::registry::{Builtin, Registry, ResId, ResourceType};
use super::schema;
use super::selector::{FieldSelector, LabelSelector};
use super::store::{Entry, KeepRule, Store};
use super::volcano::admission;

/// Resource ids the simulator itself needs.
#[derive(Debug, Clone, Copy)]
pub struct WellKnown {
    pub namespaces: ResId,
    pub nodes: ResId,
    pub pods: ResId,
    pub services: ResId,
    pub configmaps: ResId,
    pub events: ResId,
    pub networkpolicies: ResId,
    pub leases: ResId,
    pub crds: ResId,
    pub jobs: ResId,
    pub podgroups: ResId,
    pub queues: ResId,
    pub commands: ResId,
}

/// Which part of an object a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    Main,
    Status,
}

/// Query options of a write.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// `dryRun=All`: validate and answer, store nothing.
    pub dry_run: bool,
    pub field_manager: Option<String>,
    /// `fieldValidation=Strict`: unknown fields are an error instead of a warning.
    pub strict: bool,
    pub force: bool,
}

/// The result of a write.
#[derive(Debug, Clone)]
pub struct Written {
    pub object: Arc<Value>,
    /// 201 instead of 200.
    pub created: bool,
    /// `Warning` headers (unknown fields).
    pub warnings: Vec<String>,
}

/// Query options of a list (and of a watch's initial state).
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    pub label: LabelSelector,
    pub field: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}

/// One page of a list.
#[derive(Debug, Clone)]
pub struct ListPage {
    pub items: Vec<Arc<Value>>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
}

/// One page of a list as the store holds it: trees, and objects kept as text that a list in their
/// version sends as they are (see [`Core::list_entries`]).
#[derive(Debug, Clone)]
pub struct EntryPage {
    pub entries: Vec<Entry>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
}

/// `propagationPolicy` of a delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    Orphan,
    Background,
    Foreground,
}

impl Propagation {
    /// Reads `propagationPolicy`, refusing unknown values as the API server does.
    pub fn parse(s: &str) -> Result<Propagation, ApiError> {
        match s {
            "Orphan" => Ok(Propagation::Orphan),
            "Background" => Ok(Propagation::Background),
            "Foreground" => Ok(Propagation::Foreground),
            other => Err(ApiError::bad_request(format!(
                "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: {other:?}: supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
            ))),
        }
    }
}

/// Options of a delete (query parameters or the `DeleteOptions` body).
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub propagation: Option<Propagation>,
    pub grace_seconds: Option<i64>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    pub dry_run: bool,
}

/// What a delete did.
#[derive(Debug, Clone)]
pub enum Deleted {
    /// The object is gone: its last stored state (at the resourceVersion before the removal; the
    /// removal's own version is in its DELETED event).
    Gone(Arc<Value>),
    /// Deletion has started (finalizers, graceful termination, foreground propagation).
    Pending(Arc<Value>),
}

/// The finalizer that holds an owner until its dependents are gone.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";

const META_KEYS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// The API state: registry, store and the current simulated instant.
#[derive(Debug)]
pub struct Core {
    pub registry: Registry,
    pub store: Store,
    /// The simulated instant of the operation in progress.
    pub now: Timestamp,
    pub ids: WellKnown,
    /// Whether Volcano's admission webhooks are installed (they are by default).
    pub volcano_admission: bool,
    cluster_ip_seq: u32,
    event_index: HashMap<(String, String, String), ObjectKey>,
    /// Events by their creation, to expire them [`EVENT_TTL`] after their last repeat.
    event_expiry: std::collections::VecDeque<(Timestamp, EventDedup)>,
}

/// An event's involved uid, reason and message: a repeat of the same is counted on one Event.
type EventDedup = (String, String, String);

/// How long an Event is kept after its last repeat: the API server's `--event-ttl` default. Without it
/// a long-running simulator grew by every job's events for ever.
pub const EVENT_TTL: jiff::SignedDuration = jiff::SignedDuration::from_hours(1);

fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"]
        .as_object_mut()
        .expect("metadata is an object")
}

fn meta_str<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    meta(obj).and_then(|m| m.get(key)).and_then(Value::as_str)
}

/// `metadata.name` of an object.
pub fn name_of(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or_default()
}

/// `metadata.namespace` of an object.
pub fn namespace_of(obj: &Value) -> &str {
    meta_str(obj, "namespace").unwrap_or_default()
}

fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether two versions of an object differ. The controllers write status and metadata, so those are
/// compared first: a change there is found without comparing the (larger, unchanged) spec.
fn differs(a: &Value, b: &Value) -> bool {
    if let (Value::Object(x), Value::Object(y)) = (a, b) {
        for field in ["status", "metadata"] {
            if x.get(field) != y.get(field) {
                return true;
            }
        }
    }
    a != b
}

fn qualified_kind(t: &ResourceType) -> (&str, &str) {
    (&t.kind, &t.group)
}

/// Whether anything but metadata (and status when it is a subresource) differs: a change there bumps
/// `generation`. Compared field by field in place (copying both objects to compare them cost the
/// simulator more than the write itself).
fn spec_changed(t: &ResourceType, new: &Value, old: &Value) -> bool {
    let counted = |k: &str| k != "metadata" && !(t.status_subresource && k == "status");
    let empty = Map::new();
    let new = new.as_object().unwrap_or(&empty);
    let old = old.as_object().unwrap_or(&empty);
    new.keys().filter(|k| counted(k)).count() != old.keys().filter(|k| counted(k)).count()
        || new
            .iter()
            .filter(|(k, _)| counted(k))
            .any(|(k, v)| old.get(k) != Some(v))
}

impl Core {
    /// A fresh API state with the built-in kinds, the Volcano CRDs, the usual namespaces and the CRD
    /// objects themselves (so that `kubectl get crd` lists them).
    pub fn new(history: usize, seed: u64, now: Timestamp) -> Core {
        let registry = Registry::with_volcano();
        let id = |g: &str, v: &str, p: &str| registry.lookup(g, v, p).expect("built-in resource");
        let ids = WellKnown {
            namespaces: id("", "v1", "namespaces"),
            nodes: id("", "v1", "nodes"),
            pods: id("", "v1", "pods"),
            services: id("", "v1", "services"),
            configmaps: id("", "v1", "configmaps"),
            events: id("", "v1", "events"),
            networkpolicies: id("networking.k8s.io", "v1", "networkpolicies"),
            leases: id("coordination.k8s.io", "v1", "leases"),
            crds: id("apiextensions.k8s.io", "v1", "customresourcedefinitions"),
            jobs: id("batch.volcano.sh", "v1alpha1", "jobs"),
            podgroups: id("scheduling.volcano.sh", "v1beta1", "podgroups"),
            queues: id("scheduling.volcano.sh", "v1beta1", "queues"),
            commands: id("bus.volcano.sh", "v1alpha1", "commands"),
        };
        let mut core = Core {
            registry,
            store: Store::new(history, seed),
            now,
            ids,
            volcano_admission: true,
            cluster_ip_seq: 10,
            event_index: HashMap::new(),
            event_expiry: std::collections::VecDeque::new(),
        };
        core.keep_ended_as_text();
        for id in core.registry.served().collect::<Vec<_>>() {
            let t = core.registry.get(id);
            core.store
                .set_selectable_fields(t.storage, &t.field_selectors);
        }
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            core.create_internal(ids.namespaces, "", json!({"metadata": {"name": ns}}))
                .expect("fresh store has no namespaces");
        }
        for (_, yaml) in super::registry::VOLCANO_CRDS {
            let crd: Value = serde_yaml_ng::from_str(yaml)
                .expect("embedded CRDs parse (checked by the registry)");
            core.create_internal(ids.crds, "", crd)
                .expect("fresh store has no CRDs");
        }
        core
    }

    /// What the store keeps as text rather than as trees: what a cluster keeps only to be read until
    /// it is deleted, which is most of what it holds once it has run jobs for a while. A finished pod
    /// (kept with its job, until the job's `ttlSecondsAfterFinished`), a VolcanoJob in a phase it does
    /// not leave on its own, an Event (kept an hour), a NetworkPolicy (written once; the runner's for a
    /// job stays until the garbage collector takes it with the job). Each is parsed again when read: by
    /// a client's list or get, by its job's controller, by a label patch, by the policy evaluator.
    fn keep_ended_as_text(&mut self) {
        let fields = |core: &Core, id: ResId| core.registry.get(id).field_selectors.clone();
        let rules = [
            (
                self.ids.pods,
                KeepRule {
                    when: Some(("/status/phase", &["Succeeded", "Failed"])),
                    fields: fields(self, self.ids.pods),
                },
            ),
            (
                self.ids.jobs,
                KeepRule {
                    when: Some((
                        "/status/state/phase",
                        &["Completed", "Failed", "Terminated", "Aborted"],
                    )),
                    fields: fields(self, self.ids.jobs),
                },
            ),
            (
                self.ids.events,
                KeepRule {
                    when: None,
                    fields: fields(self, self.ids.events),
                },
            ),
            (
                self.ids.networkpolicies,
                KeepRule {
                    when: None,
                    fields: fields(self, self.ids.networkpolicies),
                },
            ),
        ];
        for (id, rule) in rules {
            let storage = self.registry.get(id).storage;
            self.store.keep_as_text(storage, rule);
        }
    }

    fn key(&self, t: &ResourceType, ns: &str, name: &str) -> ObjectKey {
        ObjectKey::new(t.storage, if t.namespaced { ns } else { "" }, name)
    }

    /// The key of an object of resource `res`.
    pub fn key_of(&self, res: ResId, ns: &str, name: &str) -> ObjectKey {
        let t = self.registry.get(res);
        self.key(&t, ns, name)
    }

    /// The object as served at `t`'s version (CRDs served at several versions share one storage).
    pub fn present(&self, t: &ResourceType, obj: Arc<Value>) -> Arc<Value> {
        let api_version = t.api_version();
        if obj.get("apiVersion").and_then(Value::as_str) == Some(api_version.as_str()) {
            return obj;
        }
        let mut copy = (*obj).clone();
        copy["apiVersion"] = Value::String(api_version);
        Arc::new(copy)
    }

    // ----- reads -----

    /// GET of one object (404 NotFound with the group-qualified resource name when absent).
    pub fn get(&self, res: ResId, ns: &str, name: &str) -> Result<Arc<Value>, ApiError> {
        let t = self.registry.get(res);
        let key = self.key(&t, ns, name);
        self.store
            .get(&key)
            .map(|o| self.present(&t, o))
            .ok_or_else(|| ApiError::not_found(&t.plural, &t.group, name))
    }

    /// Lists objects (all namespaces when `ns` is `None`), filtered and paginated.
    pub fn list(
        &self,
        res: ResId,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> Result<ListPage, ApiError> {
        let t = self.registry.get(res);
        let page = self.list_entries(res, ns, opts)?;
        Ok(ListPage {
            items: page
                .entries
                .iter()
                .map(|e| self.present(&t, e.object()))
                .collect(),
            resource_version: page.resource_version,
            continue_token: page.continue_token,
        })
    }

    /// [`Core::list`] as the store holds the objects: an object kept as text stays text (a list
    /// sends it as it is; parsing it into a tree to write it out again, and freeing the tree, was
    /// what a page of ended jobs or finished pods cost).
    pub fn list_entries(
        &self,
        res: ResId,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> Result<EntryPage, ApiError> {
        let t = self.registry.get(res);
        let ns = if t.namespaced {
            ns.or(opts.field.pinned("metadata.namespace"))
        } else {
            None
        };
        let mut rv = self.store.resource_version();
        let mut after: Option<(String, String)> = None;
        if let Some(token) = &opts.continue_token {
            let mut parts = token.splitn(3, '/');
            let (Some(r), Some(tns), Some(tname)) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(ApiError::bad_request(format!(
                    "continue key is not valid: {token:?}"
                )));
            };
            let r: u64 = r.parse().map_err(|_| {
                ApiError::bad_request(format!("continue key is not valid: {token:?}"))
            })?;
            if r < self.store.compacted() {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            rv = r;
            after = Some((tns.to_string(), tname.to_string()));
        }
        let limit = opts.limit.filter(|l| *l > 0);
        let mut items = Vec::new();
        let mut continue_token = None;
        let after_ref = after.as_ref().map(|(a, b)| (a.as_str(), b.as_str()));
        let candidates = match opts.field.pinned("metadata.name") {
            Some(name) => self.store.named(t.storage, ns, name, after_ref),
            None => self.store.list(t.storage, ns, after_ref),
        };
        for entry in candidates {
            if !entry.selected_by(&opts.label, &opts.field) {
                continue;
            }
            if let Some(l) = limit
                && items.len() == l
            {
                let last: &Entry = items.last().expect("limit > 0");
                continue_token = Some(format!(
                    "{rv}/{}/{}",
                    last.field("metadata.namespace"),
                    last.field("metadata.name")
                ));
                break;
            }
            items.push(entry.clone());
        }
        Ok(EntryPage {
            entries: items,
            resource_version: rv,
            continue_token,
        })
    }

    // ----- writes through the API -----

    fn ensure_object(body: &Value) -> Result<(), ApiError> {
        if body.is_object() {
            Ok(())
        } else {
            Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ))
        }
    }

    fn set_type_meta(t: &ResourceType, body: &mut Value) -> Result<(), ApiError> {
        let expected = t.api_version();
        match body.get("apiVersion").and_then(Value::as_str) {
            Some(v) if v != expected => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({v}) does not match the expected API version ({expected})"
                )));
            }
            _ => body["apiVersion"] = Value::String(expected),
        }
        match body.get("kind").and_then(Value::as_str) {
            Some(k) if k != t.kind => {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({k}) does not match the expected kind ({})",
                    t.kind
                )));
            }
            _ => body["kind"] = Value::String(t.kind.clone()),
        }
        Ok(())
    }

    fn check_namespace(&self, t: &ResourceType, ns: &str, name: &str) -> Result<(), ApiError> {
        if !t.namespaced {
            return Ok(());
        }
        let nst = self.registry.get(self.ids.namespaces);
        match self.store.get(&self.key(&nst, "", ns)) {
            None => Err(ApiError::not_found("namespaces", "", ns)),
            Some(n) if meta(&n).is_some_and(|m| m.contains_key("deletionTimestamp")) => {
                Err(ApiError::forbidden(
                    &t.plural,
                    &t.group,
                    name,
                    &format!(
                        "unable to create new content in namespace {ns} because it is being terminated"
                    ),
                ))
            }
            Some(_) => Ok(()),
        }
    }

    fn validate_metadata(t: &ResourceType, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let name = name_of(obj);
        for m in names::check_name(t.name_rule, name) {
            errs.push(FieldError::invalid("metadata.name", &json!(name), m));
        }
        if let Some(labels) = meta(obj).and_then(|m| m.get("labels")) {
            match labels.as_object() {
                Some(labels) => {
                    for (k, v) in labels {
                        for m in names::qualified_name(k) {
                            errs.push(FieldError::invalid("metadata.labels", &json!(k), m));
                        }
                        match v.as_str() {
                            Some(s) => {
                                for m in names::label_value(s) {
                                    errs.push(FieldError::invalid("metadata.labels", v, m));
                                }
                            }
                            None => errs.push(FieldError::invalid(
                                "metadata.labels",
                                v,
                                "label values must be strings",
                            )),
                        }
                    }
                }
                None if labels.is_null() => {}
                None => errs.push(FieldError::invalid(
                    "metadata.labels",
                    labels,
                    "must be a map of strings",
                )),
            }
        }
        if let Some(annotations) = meta(obj).and_then(|m| m.get("annotations")) {
            match annotations.as_object() {
                Some(a) => {
                    let mut size = 0usize;
                    for (k, v) in a {
                        size += k.len() + v.as_str().map_or(0, str::len);
                        for m in names::qualified_name(k) {
                            errs.push(FieldError::invalid("metadata.annotations", &json!(k), m));
                        }
                        if !v.is_string() {
                            errs.push(FieldError::invalid(
                                format!("metadata.annotations[{k}]"),
                                v,
                                "annotation values must be strings",
                            ));
                        }
                    }
                    if size > 256 * 1024 {
                        errs.push(FieldError {
                            field: "metadata.annotations".into(),
                            kind: FieldErrorKind::TooLong { max: 256 * 1024 },
                        });
                    }
                }
                None if annotations.is_null() => {}
                None => errs.push(FieldError::invalid(
                    "metadata.annotations",
                    annotations,
                    "must be a map of strings",
                )),
            }
        }
        if let Some(refs) = meta(obj)
            .and_then(|m| m.get("ownerReferences"))
            .and_then(Value::as_array)
        {
            for (i, r) in refs.iter().enumerate() {
                for field in ["apiVersion", "kind", "name", "uid"] {
                    if r.get(field)
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                    {
                        errs.push(FieldError::invalid(
                            format!("metadata.ownerReferences[{i}].{field}"),
                            &json!(""),
                            format!("{field} must not be empty"),
                        ));
                    }
                }
            }
        }
        errs
    }

    /// Mutating admission (Volcano's job webhook fills in defaults on create).
    fn mutate(&self, res_storage: ResId, obj: &mut Value) {
        if self.volcano_admission && res_storage == self.registry.get(self.ids.jobs).storage {
            admission::mutate_job(obj);
        }
    }

    /// The queues by name with their `status.state`, for job admission.
    pub fn queue_states(&self) -> BTreeMap<String, String> {
        let qt = self.registry.get(self.ids.queues);
        self.store
            .list(qt.storage, None, None)
            .map(|q| {
                let q = q.object();
                let state = q
                    .at("/status/state")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                (name_of(&q).to_string(), state)
            })
            .collect()
    }

    fn validating_admission(
        &self,
        t: &ResourceType,
        old: Option<&Value>,
        obj: &Value,
    ) -> Result<(), ApiError> {
        if self.volcano_admission && t.storage == self.registry.get(self.ids.jobs).storage {
            let result = match old {
                None => admission::validate_job(obj, &self.queue_states()),
                Some(old) => admission::validate_job_update(old, obj),
            };
            return result.map_err(|m| ApiError::webhook_denied(admission::VALIDATE_WEBHOOK, &m));
        }
        Ok(())
    }

    /// Decoding (pruning, typing), defaults, validation and admission of an object about to be stored.
    fn prepare(
        &self,
        t: &ResourceType,
        old: Option<&Value>,
        mut obj: Value,
        sub: Subresource,
        opts: &WriteOptions,
    ) -> Result<(Value, Vec<String>), ApiError> {
        if old.is_none() {
            self.mutate(t.storage, &mut obj);
        }
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.retain(|k, _| META_KEYS.contains(&k.as_str()));
        }
        let name = name_of(&obj).to_string();
        let mut errors = Self::validate_metadata(t, &obj);
        let mut unknown = Vec::new();
        if let Some(b) = t.builtin {
            let before = obj.clone();
            obj = builtin::decode(b, obj).map_err(|e| {
                ApiError::bad_request(format!(
                    "{} in version {:?} cannot be handled as a {}: {e}",
                    t.kind, t.version, t.kind
                ))
            })?;
            builtin::unknown_fields(&before, &obj, "", &mut unknown);
            errors.extend(builtin::validate(b, old, &obj));
        } else if let Some(schema) = &t.schema {
            let out = match old {
                Some(old) => schema::apply_update(schema, &mut obj, old),
                None => schema::apply(schema, &mut obj),
            };
            errors.extend(out.errors);
            unknown = out.unknown;
        }
        if opts.strict && !unknown.is_empty() {
            let list: Vec<String> = unknown
                .iter()
                .map(|u| format!("unknown field {u:?}"))
                .collect();
            return Err(ApiError::bad_request(format!(
                "strict decoding error: {}",
                list.join(", ")
            )));
        }
        if !errors.is_empty() {
            let (kind, group) = qualified_kind(t);
            return Err(ApiError::invalid(kind, group, &name, &errors));
        }
        if sub == Subresource::Main {
            self.validating_admission(t, old, &obj)?;
        }
        let warnings = unknown
            .iter()
            .map(|u| format!("unknown field {u:?}"))
            .collect();
        Ok((obj, warnings))
    }

    fn generate_name(&mut self, prefix: &str, t: &ResourceType, ns: &str) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        loop {
            let seed = self.store.next_uid();
            let suffix: String = seed
                .bytes()
                .filter(u8::is_ascii_hexdigit)
                .take(5)
                .map(|b| ALPHABET[(b as usize * 7) % ALPHABET.len()] as char)
                .collect();
            let name = format!("{prefix}{suffix}");
            if !self.store.contains(&self.key(t, ns, &name)) {
                return name;
            }
        }
    }

    fn next_cluster_ip(&mut self) -> String {
        self.cluster_ip_seq += 1;
        let n = self.cluster_ip_seq;
        format!("10.96.{}.{}", (n / 250) % 256, n % 250 + 1)
    }

    fn stamp_new(
        &mut self,
        t: &ResourceType,
        ns: &str,
        obj: &mut Value,
        manager: Option<(&str, &str)>,
    ) {
        let uid = self.store.next_uid();
        let now = format_time(self.now);
        let m = meta_mut(obj);
        m.insert("uid".into(), json!(uid));
        m.insert("creationTimestamp".into(), json!(now));
        m.insert("generation".into(), json!(1));
        if t.namespaced {
            m.insert("namespace".into(), json!(ns));
        } else {
            m.remove("namespace");
        }
        if let Some((manager, operation)) = manager {
            m.insert(
                "managedFields".into(),
                json!([{"manager": manager, "operation": operation, "apiVersion": t.api_version(),
                         "time": now, "fieldsType": "FieldsV1", "fieldsV1": {}}]),
            );
        }
        if let Some(b) = t.builtin {
            let mut ip = || self.next_cluster_ip();
            builtin::default_on_create(b, obj, &mut ip);
        }
    }

    /// POST: creates an object.
    pub fn create(
        &mut self,
        res: ResId,
        ns: &str,
        mut body: Value,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        self.create_as(res, ns, &mut body, opts, "Update")
    }

    fn create_as(
        &mut self,
        res: ResId,
        ns: &str,
        body: &mut Value,
        opts: &WriteOptions,
        operation: &str,
    ) -> Result<Written, ApiError> {
        let t = self.registry.get(res);
        Self::ensure_object(body)?;
        Self::set_type_meta(&t, body)?;
        if t.namespaced
            && let Some(body_ns) = meta_str(body, "namespace")
            && !body_ns.is_empty()
            && body_ns != ns
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let mut name = meta_str(body, "name").unwrap_or_default().to_string();
        if name.is_empty() {
            match meta_str(body, "generateName")
                .filter(|g| !g.is_empty())
                .map(String::from)
            {
                Some(prefix) => name = self.generate_name(&prefix, &t, ns),
                None => {
                    let (kind, group) = qualified_kind(&t);
                    return Err(ApiError::invalid(
                        kind,
                        group,
                        "",
                        &[FieldError::required(
                            "metadata.name",
                            "name or generateName is required",
                        )],
                    ));
                }
            }
        }
        {
            let m = meta_mut(body);
            m.insert("name".into(), json!(name));
            for k in [
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "managedFields",
            ] {
                m.remove(k);
            }
        }
        if t.status_subresource
            && let Some(o) = body.as_object_mut()
        {
            o.remove("status");
        }
        self.check_namespace(&t, ns, &name)?;
        let key = self.key(&t, ns, &name);
        if self.store.contains(&key) {
            return Err(ApiError::already_exists(&t.plural, &t.group, &name));
        }
        let (mut obj, warnings) =
            self.prepare(&t, None, std::mem::take(body), Subresource::Main, opts)?;
        let manager = opts.field_manager.as_deref().map(|m| (m, operation));
        self.stamp_new(&t, ns, &mut obj, manager);
        if t.builtin == Some(Builtin::CustomResourceDefinition) {
            self.registry
                .register_crd(&obj)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
        }
        if opts.dry_run {
            return Ok(Written {
                object: Arc::new(obj),
                created: true,
                warnings,
            });
        }
        let stored = self.store.put(key, obj);
        Ok(Written {
            object: self.present(&t, stored),
            created: true,
            warnings,
        })
    }

    /// PUT: replaces an object (or its status), with optimistic concurrency on `resourceVersion`.
    pub fn update(
        &mut self,
        res: ResId,
        ns: &str,
        name: &str,
        mut body: Value,
        sub: Subresource,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let t = self.registry.get(res);
        Self::ensure_object(&body)?;
        Self::set_type_meta(&t, &mut body)?;
        match meta_str(&body, "name") {
            Some(n) if !n.is_empty() && n != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
            _ => {
                meta_mut(&mut body).insert("name".into(), json!(name));
            }
        }
        let key = self.key(&t, ns, name);
        let old = self
            .store
            .get(&key)
            .ok_or_else(|| ApiError::not_found(&t.plural, &t.group, name))?;
        if let Some(rv) = meta_str(&body, "resourceVersion").filter(|r| !r.is_empty())
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::stale(&t.plural, &t.group, name));
        }
        if let Some(uid) = meta_str(&body, "uid").filter(|u| !u.is_empty())
            && Some(uid) != meta_str(&old, "uid")
        {
            return Err(ApiError::conflict(
                &t.plural,
                &t.group,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&old, "uid").unwrap_or_default()
                ),
            ));
        }
        self.finish_update(&t, key, &old, body, sub, opts)
    }

    /// PATCH: applies a patch of the given kind to an object (or its status). Server-side apply creates
    /// the object when it does not exist.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        res: ResId,
        ns: &str,
        name: &str,
        kind: PatchKind,
        body: &[u8],
        sub: Subresource,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let t = self.registry.get(res);
        let patch_value: Value = match kind {
            PatchKind::Apply => serde_json::from_slice(body)
                .or_else(|_| serde_yaml_ng::from_slice(body))
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
            _ => serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?,
        };
        if kind == PatchKind::Strategic && t.is_custom() {
            return Err(ApiError::unsupported_media_type(
                "application/strategic-merge-patch+json",
                &[
                    "application/json-patch+json",
                    "application/merge-patch+json",
                    "application/apply-patch+yaml",
                ],
            ));
        }
        if kind == PatchKind::Apply {
            if opts.field_manager.as_deref().is_none_or(str::is_empty) {
                return Err(ApiError::unprocessable(
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                ));
            }
            Self::ensure_object(&patch_value)?;
            for field in ["apiVersion", "kind"] {
                if patch_value
                    .get(field)
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    return Err(ApiError::bad_request(format!(
                        "invalid object type: {field} must be set for apply"
                    )));
                }
            }
        }
        let key = self.key(&t, ns, name);
        let Some(old) = self.store.get(&key) else {
            if kind == PatchKind::Apply && sub == Subresource::Main {
                let mut body = patch_value;
                match meta_str(&body, "name") {
                    Some(n) if n != name => {
                        return Err(ApiError::bad_request(format!(
                            "the name of the object ({n}) does not match the name on the URL ({name})"
                        )));
                    }
                    _ => {
                        meta_mut(&mut body).insert("name".into(), json!(name));
                    }
                }
                return self.create_as(res, ns, &mut body, opts, "Apply");
            }
            return Err(ApiError::not_found(&t.plural, &t.group, name));
        };
        let mut base = (*old).clone();
        match kind {
            PatchKind::Merge => patch::merge(&mut base, &patch_value),
            PatchKind::Json => patch::json_patch(&mut base, &patch_value).map_err(|e| match e {
                PatchError::Malformed(m) => ApiError::bad_request(m),
                PatchError::Failed(m) => ApiError::unprocessable(m),
            })?,
            PatchKind::Strategic => patch::strategic_merge(&mut base, &patch_value)
                .map_err(|e| ApiError::bad_request(e.to_string()))?,
            PatchKind::Apply => {
                if t.is_custom() {
                    patch::merge(&mut base, &patch_value);
                } else {
                    patch::strategic_merge(&mut base, &patch_value)
                        .map_err(|e| ApiError::bad_request(e.to_string()))?;
                }
            }
        }
        if meta_str(&base, "resourceVersion") != meta_str(&old, "resourceVersion") {
            return Err(ApiError::stale(&t.plural, &t.group, name));
        }
        if meta_str(&base, "uid") != meta_str(&old, "uid") || meta_str(&base, "name") != Some(name)
        {
            return Err(ApiError::bad_request(
                "metadata.uid and metadata.name cannot be changed by a patch",
            ));
        }
        self.finish_update(&t, key, &old, base, sub, opts)
    }

    fn finish_update(
        &mut self,
        t: &ResourceType,
        key: ObjectKey,
        old: &Arc<Value>,
        mut new: Value,
        sub: Subresource,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        Self::set_type_meta(t, &mut new)?;
        let no_meta = Map::new();
        let old_meta = meta(old).unwrap_or(&no_meta);
        keep_server_metadata(old_meta, &mut new);
        let new = through_subresource(t, old, new, sub)?;
        let (mut new, warnings) = self.prepare(t, Some(old), new, sub, opts)?;
        if spec_changed(t, &new, old) {
            let generation = old_meta
                .get("generation")
                .and_then(Value::as_i64)
                .unwrap_or(1)
                + 1;
            meta_mut(&mut new).insert("generation".into(), json!(generation));
        }
        if new == **old {
            return Ok(Written {
                object: self.present(t, old.clone()),
                created: false,
                warnings,
            });
        }
        if let Some(manager) = opts.field_manager.as_deref().filter(|m| !m.is_empty()) {
            record_update_manager(&mut new, t, manager, sub, self.now);
        }
        if opts.dry_run {
            return Ok(Written {
                object: Arc::new(new),
                created: false,
                warnings,
            });
        }
        if meta(&new).is_some_and(|m| m.contains_key("deletionTimestamp"))
            && finalizers(&new).is_empty()
        {
            self.store.put(key.clone(), new);
            let last = self.store.remove(&key).expect("just written");
            let gone = self.store.removed_at(&last);
            return Ok(Written {
                object: self.present(t, gone),
                created: false,
                warnings,
            });
        }
        let stored = self.store.put(key, new);
        Ok(Written {
            object: self.present(t, stored),
            created: false,
            warnings,
        })
    }

    /// DELETE of one object.
    pub fn delete(
        &mut self,
        res: ResId,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Deleted, ApiError> {
        let t = self.registry.get(res);
        let key = self.key(&t, ns, name);
        let old = self
            .store
            .get(&key)
            .ok_or_else(|| ApiError::not_found(&t.plural, &t.group, name))?;
        if let Some(uid) = &opts.precondition_uid
            && Some(uid.as_str()) != meta_str(&old, "uid")
        {
            return Err(ApiError::conflict(
                &t.plural,
                &t.group,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&old, "uid").unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = &opts.precondition_rv
            && Some(rv.as_str()) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::conflict(
                &t.plural,
                &t.group,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&old, "resourceVersion").unwrap_or_default()
                ),
            ));
        }
        if opts.dry_run {
            return Ok(Deleted::Pending(self.present(&t, old)));
        }
        let result = self.delete_key(&key, opts.propagation, opts.grace_seconds);
        Ok(match result {
            Deleted::Gone(o) => Deleted::Gone(self.present(&t, o)),
            Deleted::Pending(o) => Deleted::Pending(self.present(&t, o)),
        })
    }

    /// DELETE of a collection: deletes every object the list options select.
    pub fn delete_collection(
        &mut self,
        res: ResId,
        ns: Option<&str>,
        list: &ListOptions,
        opts: &DeleteOptions,
    ) -> Result<Vec<Arc<Value>>, ApiError> {
        let page = self.list(
            res,
            ns,
            &ListOptions {
                limit: None,
                continue_token: None,
                ..list.clone()
            },
        )?;
        let mut out = Vec::new();
        for obj in page.items {
            let (ns, name) = (namespace_of(&obj).to_string(), name_of(&obj).to_string());
            match self.delete(res, &ns, &name, opts) {
                Ok(Deleted::Gone(o) | Deleted::Pending(o)) => out.push(o),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Deletion as the API server and garbage collector carry it out (no preconditions).
    pub fn delete_key(
        &mut self,
        key: &ObjectKey,
        propagation: Option<Propagation>,
        grace: Option<i64>,
    ) -> Deleted {
        let Some(old) = self.store.get(key) else {
            return Deleted::Gone(Arc::new(Value::Null));
        };
        let is_pod = key.res == self.registry.get(self.ids.pods).storage;
        let is_namespace = key.res == self.registry.get(self.ids.namespaces).storage;
        let deleting = meta(&old).is_some_and(|m| m.contains_key("deletionTimestamp"));
        if deleting {
            return self.delete_again(key, old, propagation, grace, is_pod);
        }
        let now = format_time(self.now);
        if is_namespace {
            let mut obj = (*old).clone();
            meta_mut(&mut obj).insert("deletionTimestamp".into(), json!(now));
            meta_mut(&mut obj).insert("deletionGracePeriodSeconds".into(), json!(0));
            obj["status"] = json!({"phase": "Terminating"});
            return Deleted::Pending(self.store.put(key.clone(), obj));
        }
        let propagation = propagation.unwrap_or(Propagation::Background);
        if propagation == Propagation::Orphan {
            self.orphan_dependents(&old);
        }
        // The object is copied only when it stays (marked for deletion): one that goes at once is
        // removed as it is.
        let mut fins = finalizers(&old);
        let mut add_foreground = false;
        if propagation == Propagation::Foreground {
            let has_dependents =
                meta_str(&old, "uid").is_some_and(|u| !self.store.dependents_of(u).is_empty());
            if has_dependents && !fins.iter().any(|f| f == FOREGROUND_FINALIZER) {
                fins.push(FOREGROUND_FINALIZER.to_string());
                add_foreground = true;
            }
        }
        let marked = || {
            let mut obj = (*old).clone();
            if add_foreground {
                meta_mut(&mut obj).insert("finalizers".into(), json!(fins));
            }
            obj
        };
        if is_pod && let Some(grace) = pod_grace_period(&old, grace) {
            let mut obj = marked();
            let at = self
                .now
                .saturating_add(SignedDuration::from_secs(grace))
                .unwrap_or(self.now);
            meta_mut(&mut obj).insert("deletionTimestamp".into(), json!(format_time(at)));
            meta_mut(&mut obj).insert("deletionGracePeriodSeconds".into(), json!(grace));
            return Deleted::Pending(self.store.put(key.clone(), obj));
        }
        if !fins.is_empty() {
            let mut obj = marked();
            meta_mut(&mut obj).insert("deletionTimestamp".into(), json!(now));
            meta_mut(&mut obj).insert("deletionGracePeriodSeconds".into(), json!(0));
            return Deleted::Pending(self.store.put(key.clone(), obj));
        }
        Deleted::Gone(self.store.remove(key).expect("exists"))
    }

    /// A delete of an object already marked for deletion: it can only shorten a pod's grace period to
    /// zero, or add the foreground finalizer.
    fn delete_again(
        &mut self,
        key: &ObjectKey,
        old: Arc<Value>,
        propagation: Option<Propagation>,
        grace: Option<i64>,
        is_pod: bool,
    ) -> Deleted {
        if is_pod && grace == Some(0) && finalizers(&old).is_empty() {
            return Deleted::Gone(self.store.remove(key).expect("exists"));
        }
        // As the API server does for an object its finalizers hold: a later delete asking for
        // foreground propagation adds the finalizer that has the dependents removed first.
        let mut fins = finalizers(&old);
        let has_dependents =
            meta_str(&old, "uid").is_some_and(|u| !self.store.dependents_of(u).is_empty());
        if propagation == Some(Propagation::Foreground)
            && has_dependents
            && !fins.iter().any(|f| f == FOREGROUND_FINALIZER)
        {
            fins.push(FOREGROUND_FINALIZER.to_string());
            let mut obj = (*old).clone();
            meta_mut(&mut obj).insert("finalizers".into(), json!(fins));
            return Deleted::Pending(self.store.put(key.clone(), obj));
        }
        Deleted::Pending(old)
    }

    /// Orphan propagation: the dependents of `old` lose their owner reference to it and stay.
    fn orphan_dependents(&mut self, old: &Value) {
        let Some(uid) = meta_str(old, "uid").map(String::from) else {
            return;
        };
        for dep in self.store.dependents_of(&uid) {
            self.update_internal(&dep, |d| {
                if let Some(Value::Array(refs)) = d.pointer_mut("/metadata/ownerReferences") {
                    refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid.as_str()));
                }
            });
        }
    }

    // ----- writes by the simulated controllers -----

    /// Creates an object without admission or validation (the controllers write well-formed objects).
    pub fn create_internal(
        &mut self,
        res: ResId,
        ns: &str,
        mut obj: Value,
    ) -> Result<Arc<Value>, ApiError> {
        let t = self.registry.get(res);
        Self::set_type_meta(&t, &mut obj)?;
        let name = name_of(&obj).to_string();
        self.check_namespace(&t, ns, &name)?;
        let key = self.key(&t, ns, &name);
        if self.store.contains(&key) {
            return Err(ApiError::already_exists(&t.plural, &t.group, &name));
        }
        self.stamp_new(&t, ns, &mut obj, None);
        Ok(self.store.put(key, obj))
    }

    /// Changes an object in place; writes (and bumps the resourceVersion) only when something changed.
    pub fn update_internal(
        &mut self,
        key: &ObjectKey,
        f: impl FnOnce(&mut Value),
    ) -> Option<Arc<Value>> {
        let old = self.store.get(key)?;
        let mut new = (*old).clone();
        f(&mut new);
        if !differs(&old, &new) {
            return Some(old);
        }
        Some(self.store.put(key.clone(), new))
    }

    /// Sets an object's `status` (a controller's status write); writes only when it changed. The
    /// new version is built around the new status rather than from a copy of the whole object whose
    /// status is then replaced: copying the old status only to free it, and the new one once more,
    /// was a third of what a job's status write copied.
    pub fn replace_status(&mut self, key: &ObjectKey, status: Value) -> Option<Arc<Value>> {
        let old = self.store.get(key)?;
        let Value::Object(fields) = &*old else {
            return self.update_internal(key, |o| o["status"] = status);
        };
        if fields.get("status") == Some(&status) {
            return Some(old);
        }
        let mut new: Map<String, Value> = fields
            .iter()
            .filter(|(k, _)| *k != "status")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        new.insert("status".into(), status);
        Some(self.store.put(key.clone(), Value::Object(new)))
    }

    /// Records a Kubernetes Event about `involved`, counting repeats of the same reason and message.
    pub fn record_event(
        &mut self,
        involved: &Value,
        ty: &str,
        reason: &str,
        message: &str,
        component: &str,
    ) {
        self.expire_events();
        let uid = meta_str(involved, "uid").unwrap_or_default().to_string();
        let ns = match namespace_of(involved) {
            "" => "default".to_string(),
            ns => ns.to_string(),
        };
        let now = format_time(self.now);
        let dedup = (uid.clone(), reason.to_string(), message.to_string());
        if let Some(key) = self.event_index.get(&dedup).cloned()
            && self.store.contains(&key)
        {
            self.update_internal(&key, |e| {
                let count = e.get("count").and_then(Value::as_i64).unwrap_or(1) + 1;
                e["count"] = json!(count);
                e["lastTimestamp"] = json!(now);
            });
            return;
        }
        let name = format!(
            "{}.{:x}",
            name_of(involved),
            self.now.as_nanosecond() as u64 ^ self.store.resource_version()
        );
        let event = json!({
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": name_of(involved),
                "namespace": namespace_of(involved),
                "uid": uid,
                "resourceVersion": meta_str(involved, "resourceVersion"),
            },
            "reason": reason,
            "message": message,
            "type": ty,
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": component},
            "reportingComponent": component,
            "reportingInstance": "",
        });
        if let Ok(stored) = self.create_internal(self.ids.events, &ns, event) {
            let key = self.key_of(self.ids.events, &ns, name_of(&stored));
            self.event_index.insert(dedup.clone(), key);
            self.event_expiry.push_back((self.now, dedup));
        }
    }

    /// Deletes the Events not repeated for [`EVENT_TTL`], as the API server lets them expire. Looked at
    /// when an Event is recorded and when the clock moves: the oldest first, and one repeated since is
    /// looked at again later.
    pub fn expire_events(&mut self) {
        while let Some((since, _)) = self.event_expiry.front() {
            if since.checked_add(EVENT_TTL).is_ok_and(|due| due > self.now) {
                return;
            }
            let Some((_, dedup)) = self.event_expiry.pop_front() else {
                return;
            };
            let Some(key) = self.event_index.get(&dedup).cloned() else {
                continue;
            };
            let last = self
                .store
                .get(&key)
                .and_then(|e| {
                    e.get("lastTimestamp")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .and_then(|t| t.parse::<Timestamp>().ok());
            match last {
                Some(last) if last.checked_add(EVENT_TTL).is_ok_and(|due| due > self.now) => {
                    self.event_expiry.push_back((last, dedup));
                }
                _ => {
                    self.event_index.remove(&dedup);
                    self.delete_key(&key, None, None);
                }
            }
        }
    }
}

/// The grace period a pod's deletion waits for: the one asked for, else the pod's own, else 30 s; none
/// for a pod that is not bound, has ended, or is given zero.
fn pod_grace_period(pod: &Value, grace: Option<i64>) -> Option<i64> {
    let bound = pod
        .at("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let phase = pod
        .at("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let terminal = phase == "Succeeded" || phase == "Failed";
    let grace = grace
        .or_else(|| {
            pod.at("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
        })
        .unwrap_or(30)
        .max(0);
    (bound && !terminal && grace > 0).then_some(grace)
}

/// An update leaves the server-owned metadata as it was: whatever the client sent for it is replaced.
fn keep_server_metadata(old_meta: &Map<String, Value>, new: &mut Value) {
    let m = meta_mut(new);
    for k in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "name",
        "namespace",
        "resourceVersion",
        "managedFields",
    ] {
        match old_meta.get(k) {
            Some(v) => m.insert(k.into(), v.clone()),
            None => m.remove(k),
        };
    }
}

/// With a status subresource, an update of the main resource keeps the old status, and an update of
/// `/status` changes nothing but the status.
fn through_subresource(
    t: &ResourceType,
    old: &Value,
    mut new: Value,
    sub: Subresource,
) -> Result<Value, ApiError> {
    match sub {
        Subresource::Main if t.status_subresource => match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(o) = new.as_object_mut() {
                    o.remove("status");
                }
            }
        },
        Subresource::Status => {
            if !t.status_subresource {
                return Err(ApiError::no_route(&format!("{}/status", t.plural)));
            }
            let status = new.get("status").cloned();
            new = old.clone();
            match status {
                Some(s) => new["status"] = s,
                None => {
                    if let Some(o) = new.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
        }
        Subresource::Main => {}
    }
    Ok(new)
}

/// The `managedFields` entry of an Update by `manager`, replacing its earlier one.
fn record_update_manager(
    new: &mut Value,
    t: &ResourceType,
    manager: &str,
    sub: Subresource,
    now: Timestamp,
) {
    let now = format_time(now);
    let entry = json!({"manager": manager, "operation": "Update", "apiVersion": t.api_version(),
                       "time": now, "fieldsType": "FieldsV1", "fieldsV1": {},
                       "subresource": if sub == Subresource::Status { "status" } else { "" }});
    let m = meta_mut(new);
    let list = m.entry("managedFields").or_insert_with(|| json!([]));
    if let Value::Array(list) = list {
        list.retain(|e| e.get("manager").and_then(Value::as_str) != Some(manager));
        list.push(entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn core() -> Core {
        Core::new(1000, 7, "2026-01-01T00:00:00Z".parse().unwrap())
    }

    fn cm(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "1"}})
    }

    /// Creates the ConfigMap `name` in `default`, as a client would.
    fn create_cm(c: &mut Core, name: &str) -> Written {
        let res = c.ids.configmaps;
        c.create(res, "default", cm(name), &WriteOptions::default())
            .unwrap()
    }

    /// The Events of `default`, by reason.
    fn event_reasons(c: &Core) -> Vec<String> {
        let page = c
            .list(c.ids.events, Some("default"), &ListOptions::default())
            .unwrap();
        page.items
            .iter()
            .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    #[test]
    fn events_expire_an_hour_after_their_last_repeat() {
        let mut c = core();
        let x = create_cm(&mut c, "x").object;
        let y = create_cm(&mut c, "y").object;
        c.record_event(&x, "Normal", "Old", "once", "test");
        c.record_event(&y, "Normal", "Repeated", "again and again", "test");
        c.now = c
            .now
            .checked_add(jiff::SignedDuration::from_mins(50))
            .unwrap();
        c.record_event(&y, "Normal", "Repeated", "again and again", "test");
        c.now = c
            .now
            .checked_add(jiff::SignedDuration::from_mins(11))
            .unwrap();
        c.record_event(&x, "Normal", "New", "later", "test");
        let mut reasons = event_reasons(&c);
        reasons.sort();
        assert_eq!(
            reasons,
            ["New", "Repeated"],
            "61 min after it, the first one went"
        );
        c.now = c
            .now
            .checked_add(jiff::SignedDuration::from_mins(50))
            .unwrap();
        c.record_event(&x, "Normal", "Newer", "later still", "test");
        let mut reasons = event_reasons(&c);
        reasons.sort();
        assert_eq!(reasons, ["New", "Newer"], "an hour after its last repeat");
        assert_eq!(c.event_index.len(), 2, "the index forgets them too");
    }

    #[test]
    fn create_assigns_metadata_and_refuses_duplicates() {
        let mut c = core();
        let w = create_cm(&mut c, "x");
        let m = &w.object["metadata"];
        assert_eq!(m["namespace"], "default");
        assert_eq!(m["generation"], 1);
        assert_eq!(m["creationTimestamp"], "2026-01-01T00:00:00Z");
        assert!(m["uid"].as_str().unwrap().len() == 36);
        assert!(
            m["resourceVersion"]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
                > 0
        );
        let err = c
            .create(
                c.ids.configmaps,
                "default",
                cm("x"),
                &WriteOptions::default(),
            )
            .unwrap_err();
        assert_eq!(err.code, 409);
        assert_eq!(err.reason, "AlreadyExists");
        let err = c
            .create(c.ids.configmaps, "nope", cm("y"), &WriteOptions::default())
            .unwrap_err();
        assert_eq!(err.message, "namespaces \"nope\" not found");
    }

    #[test]
    fn an_internal_update_writes_only_what_changes_wherever_it_is() {
        let mut c = core();
        let w = create_cm(&mut c, "x");
        let key = c.key_of(c.ids.configmaps, "default", "x");
        let rv = |v: &Value| v["metadata"]["resourceVersion"].clone();
        let same = c
            .update_internal(&key, |o| o["data"]["a"] = json!("1"))
            .unwrap();
        assert!(Arc::ptr_eq(&same, &w.object), "no change, no write");
        // A change outside status and metadata (the fields looked at first) is still a change.
        let data = c
            .update_internal(&key, |o| o["data"]["a"] = json!("2"))
            .unwrap();
        assert_ne!(rv(&data), rv(&w.object));
        let status = c
            .update_internal(&key, |o| o["status"] = json!({"x": 1}))
            .unwrap();
        assert_ne!(rv(&status), rv(&data));
        let meta = c
            .update_internal(&key, |o| o["metadata"]["labels"] = json!({"l": "v"}))
            .unwrap();
        assert_ne!(rv(&meta), rv(&status));
        assert_eq!(meta["data"]["a"], "2");
        assert_eq!(meta["status"]["x"], 1);
        let again = c
            .update_internal(&key, |o| o["status"] = json!({"x": 1}))
            .unwrap();
        assert!(
            Arc::ptr_eq(&again, &meta),
            "the same status again is no change"
        );
    }

    #[test]
    fn a_status_write_keeps_the_rest_and_writes_only_a_change() {
        let mut c = core();
        let w = create_cm(&mut c, "s");
        let key = c.key_of(c.ids.configmaps, "default", "s");
        let rv = c.store.resource_version();
        let same = c.replace_status(&key, json!({"phase": "A"})).unwrap();
        assert_eq!(c.store.resource_version(), rv + 1);
        let mut expected = (*w.object).clone();
        expected["status"] = json!({"phase": "A"});
        expected["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
        assert_eq!(*same, expected);
        let again = c.replace_status(&key, json!({"phase": "A"})).unwrap();
        assert!(Arc::ptr_eq(&again, &same), "unchanged: not written");
        assert_eq!(c.store.resource_version(), rv + 1);
        c.replace_status(&key, json!({"phase": "B"})).unwrap();
        assert_eq!(c.store.get(&key).unwrap()["status"]["phase"], "B");
        assert_eq!(c.store.resource_version(), rv + 2);
        assert!(
            c.replace_status(&c.key_of(c.ids.configmaps, "default", "none"), json!({}))
                .is_none()
        );
    }

    #[test]
    fn differs_finds_a_change_in_any_part() {
        let base = json!({"metadata": {"name": "a"}, "spec": {"x": [1, 2]}, "status": {"p": "A"}});
        assert!(!differs(&base, &base.clone()));
        for (path, value) in [
            ("/metadata/name", json!("b")),
            ("/spec/x/1", json!(3)),
            ("/status/p", json!("B")),
        ] {
            let mut other = base.clone();
            *other.pointer_mut(path).unwrap() = value;
            assert!(differs(&base, &other), "{path}");
            assert!(differs(&other, &base), "{path}");
        }
        let mut extra = base.clone();
        extra["kind"] = json!("K");
        assert!(differs(&base, &extra));
        assert!(differs(&json!(1), &json!(2)));
        assert!(!differs(&json!(null), &json!(null)));
    }

    #[test]
    fn update_with_stale_resource_version_conflicts_and_noop_keeps_version() {
        let mut c = core();
        let w = create_cm(&mut c, "x");
        let rv = w.object["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        let mut changed = (*w.object).clone();
        changed["data"]["a"] = json!("2");
        let w2 = c
            .update(
                c.ids.configmaps,
                "default",
                "x",
                changed.clone(),
                Subresource::Main,
                &WriteOptions::default(),
            )
            .unwrap();
        assert_ne!(w2.object["metadata"]["resourceVersion"], json!(rv));
        let err = c
            .update(
                c.ids.configmaps,
                "default",
                "x",
                changed,
                Subresource::Main,
                &WriteOptions::default(),
            )
            .unwrap_err();
        assert_eq!(err.code, 409);
        assert_eq!(err.reason, "Conflict");
        let same = c
            .update(
                c.ids.configmaps,
                "default",
                "x",
                (*w2.object).clone(),
                Subresource::Main,
                &WriteOptions::default(),
            )
            .unwrap();
        assert_eq!(
            same.object["metadata"]["resourceVersion"],
            w2.object["metadata"]["resourceVersion"]
        );
    }

    #[test]
    fn status_subresource_separates_spec_and_status() {
        let mut c = core();
        let q = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "q1"},
                       "spec": {"weight": 1}, "status": {"state": "Closed"}});
        let w = c
            .create(c.ids.queues, "", q, &WriteOptions::default())
            .unwrap();
        assert!(
            w.object.get("status").is_none(),
            "status is dropped on create"
        );
        let mut upd = (*w.object).clone();
        upd["status"] = json!({"state": "Open"});
        upd["spec"]["weight"] = json!(2);
        let w = c
            .update(
                c.ids.queues,
                "",
                "q1",
                upd.clone(),
                Subresource::Main,
                &WriteOptions::default(),
            )
            .unwrap();
        assert!(w.object.get("status").is_none());
        assert_eq!(w.object["metadata"]["generation"], 2);
        upd["metadata"]["resourceVersion"] = w.object["metadata"]["resourceVersion"].clone();
        upd["spec"]["weight"] = json!(5);
        let w = c
            .update(
                c.ids.queues,
                "",
                "q1",
                upd,
                Subresource::Status,
                &WriteOptions::default(),
            )
            .unwrap();
        assert_eq!(w.object["status"]["state"], "Open");
        assert_eq!(
            w.object["spec"]["weight"], 2,
            "status writes leave spec alone"
        );
        assert_eq!(w.object["metadata"]["generation"], 2);
    }

    #[test]
    fn finalizers_hold_deletion_until_removed() {
        let mut c = core();
        let mut obj = cm("f");
        obj["metadata"]["finalizers"] = json!(["example.com/hold"]);
        c.create(c.ids.configmaps, "default", obj, &WriteOptions::default())
            .unwrap();
        let d = c
            .delete(c.ids.configmaps, "default", "f", &DeleteOptions::default())
            .unwrap();
        let Deleted::Pending(o) = d else {
            panic!("finalizer should hold the object")
        };
        assert!(o["metadata"]["deletionTimestamp"].is_string());
        let patch = br#"{"metadata":{"finalizers":null}}"#;
        c.patch(
            c.ids.configmaps,
            "default",
            "f",
            PatchKind::Merge,
            patch,
            Subresource::Main,
            &WriteOptions::default(),
        )
        .unwrap();
        assert_eq!(
            c.get(c.ids.configmaps, "default", "f").unwrap_err().code,
            404
        );
    }

    #[test]
    fn invalid_names_and_labels_are_422() {
        let mut c = core();
        let mut bad = cm("Bad_Name");
        bad["metadata"]["labels"] = json!({"user": "alice@example.com"});
        let err = c
            .create(c.ids.configmaps, "default", bad, &WriteOptions::default())
            .unwrap_err();
        assert_eq!(err.code, 422);
        assert!(err.message.starts_with("ConfigMap \"Bad_Name\" is invalid: [metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"), "{}", err.message);
        assert!(
            err.message
                .contains("metadata.labels: Invalid value: \"alice@example.com\""),
            "{}",
            err.message
        );
    }

    #[test]
    fn pagination_walks_every_object_once() {
        let mut c = core();
        for i in 0..25 {
            c.create(
                c.ids.configmaps,
                "default",
                cm(&format!("c{i:02}")),
                &WriteOptions::default(),
            )
            .unwrap();
        }
        let mut seen = Vec::new();
        let mut token = None;
        loop {
            let page = c
                .list(
                    c.ids.configmaps,
                    Some("default"),
                    &ListOptions {
                        limit: Some(10),
                        continue_token: token,
                        ..Default::default()
                    },
                )
                .unwrap();
            seen.extend(page.items.iter().map(|o| name_of(o).to_string()));
            token = page.continue_token;
            if token.is_none() {
                break;
            }
        }
        assert_eq!(seen.len(), 25);
        assert_eq!(seen[0], "c00");
        assert_eq!(seen[24], "c24");
    }

    #[test]
    fn generate_name_and_dry_run() {
        let mut c = core();
        let obj = json!({"metadata": {"generateName": "gen-"}, "data": {}});
        let w = c
            .create(
                c.ids.configmaps,
                "default",
                obj.clone(),
                &WriteOptions::default(),
            )
            .unwrap();
        assert!(name_of(&w.object).starts_with("gen-") && name_of(&w.object).len() == 9);
        let before = c.store.resource_version();
        let w = c
            .create(
                c.ids.configmaps,
                "default",
                cm("dry"),
                &WriteOptions {
                    dry_run: true,
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(name_of(&w.object), "dry");
        assert_eq!(c.store.resource_version(), before);
        assert!(c.get(c.ids.configmaps, "default", "dry").is_err());
    }
}
