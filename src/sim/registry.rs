//! The resource types the simulator serves: built-in kinds and every registered CustomResourceDefinition.
//! Discovery, routing, validation and `kubectl` tables are all driven from here.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::names::NameRule;
use super::schema::Schema;

/// Index of a resource type in the [`Registry`].
pub type ResId = usize;

/// The built-in kinds, which are checked by decoding into their `k8s-openapi` type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    Namespace,
    Node,
    Pod,
    Service,
    ConfigMap,
    Secret,
    Event,
    NetworkPolicy,
    Lease,
    /// `events.k8s.io/v1` Event, which kube-runtime's event recorder writes.
    EventV1,
    CustomResourceDefinition,
    // The kinds of the deploy manifests (deploy/base, deploy/scheduling), stored and served without a controller, so that
    // the base can be applied to the simulator as to a cluster.
    ServiceAccount,
    Role,
    RoleBinding,
    ClusterRole,
    ClusterRoleBinding,
    Deployment,
    PodDisruptionBudget,
    /// `discovery.k8s.io/v1` EndpointSlice: the runner writes the endpoints of a job's peers Service.
    EndpointSlice,
}

/// One column of a CRD's `additionalPrinterColumns`.
#[derive(Debug, Clone)]
pub struct PrinterColumn {
    pub name: String,
    pub ty: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

/// One resource type at one group/version.
#[derive(Debug, Clone)]
pub struct ResourceType {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub list_kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Whether `/status` is a subresource (then the main resource ignores status changes).
    pub status_subresource: bool,
    pub name_rule: NameRule,
    /// The structural schema of a custom resource.
    pub schema: Option<Arc<Schema>>,
    pub builtin: Option<Builtin>,
    pub printer_columns: Vec<PrinterColumn>,
    /// Field-selector labels this kind supports besides `metadata.name` and `metadata.namespace`.
    pub field_selectors: Vec<&'static str>,
    /// The resource type whose storage holds these objects (itself unless a CRD serves several versions).
    pub storage: ResId,
}

impl ResourceType {
    /// `group/version`, or just `v1` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether this is a custom resource (validated by its CRD schema, no strategic merge).
    pub fn is_custom(&self) -> bool {
        self.builtin.is_none()
    }

    /// Subresources served under `<name>/`, for discovery.
    pub fn subresources(&self) -> Vec<&'static str> {
        let mut subs = Vec::new();
        if self.status_subresource {
            subs.push("status");
        }
        if self.builtin == Some(Builtin::Pod) {
            subs.push("log");
            subs.push("eviction");
        }
        subs
    }
}

/// Why a CRD could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    #[error("CustomResourceDefinition: {0}")]
    Invalid(String),
    #[error("CustomResourceDefinition YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
}

/// The Volcano CRDs, embedded so that the binary needs no files at run time.
pub const VOLCANO_CRDS: [(&str, &str); 4] = [
    (
        "batch.volcano.sh_jobs.yaml",
        include_str!("../../crds/batch.volcano.sh_jobs.yaml"),
    ),
    (
        "scheduling.volcano.sh_podgroups.yaml",
        include_str!("../../crds/scheduling.volcano.sh_podgroups.yaml"),
    ),
    (
        "scheduling.volcano.sh_queues.yaml",
        include_str!("../../crds/scheduling.volcano.sh_queues.yaml"),
    ),
    (
        "bus.volcano.sh_commands.yaml",
        include_str!("../../crds/bus.volcano.sh_commands.yaml"),
    ),
];

/// Every served resource type, with lookup by path and by kind.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    types: Vec<Arc<ResourceType>>,
    by_path: HashMap<(String, String, String), ResId>,
}

struct BuiltinDef {
    group: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
    status: bool,
    rule: NameRule,
    builtin: Builtin,
    fields: &'static [&'static str],
    categories: &'static [&'static str],
}

const BUILTINS: &[BuiltinDef] = &[
    BuiltinDef {
        group: "",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        short: &["ns"],
        status: true,
        rule: NameRule::Label,
        builtin: Builtin::Namespace,
        fields: &["status.phase"],
        categories: &[],
    },
    BuiltinDef {
        group: "",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        short: &["no"],
        status: true,
        rule: NameRule::Subdomain,
        builtin: Builtin::Node,
        fields: &["spec.unschedulable"],
        categories: &[],
    },
    BuiltinDef {
        group: "",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        short: &["po"],
        status: true,
        rule: NameRule::Subdomain,
        builtin: Builtin::Pod,
        fields: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        categories: &["all"],
    },
    BuiltinDef {
        group: "",
        plural: "services",
        singular: "service",
        kind: "Service",
        namespaced: true,
        short: &["svc"],
        status: true,
        rule: NameRule::Dns1035,
        builtin: Builtin::Service,
        fields: &["spec.clusterIP", "spec.type"],
        categories: &["all"],
    },
    BuiltinDef {
        group: "",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        namespaced: true,
        short: &["cm"],
        status: false,
        rule: NameRule::Subdomain,
        builtin: Builtin::ConfigMap,
        fields: &[],
        categories: &[],
    },
    BuiltinDef {
        group: "",
        plural: "secrets",
        singular: "secret",
        kind: "Secret",
        namespaced: true,
        short: &[],
        status: false,
        rule: NameRule::Subdomain,
        builtin: Builtin::Secret,
        fields: &["type"],
        categories: &[],
    },
    BuiltinDef {
        group: "",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short: &["ev"],
        status: false,
        rule: NameRule::PathSegment,
        builtin: Builtin::Event,
        fields: &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        categories: &[],
    },
    BuiltinDef {
        group: "networking.k8s.io",
        plural: "networkpolicies",
        singular: "networkpolicy",
        kind: "NetworkPolicy",
        namespaced: true,
        short: &["netpol"],
        status: false,
        rule: NameRule::Subdomain,
        builtin: Builtin::NetworkPolicy,
        fields: &[],
        categories: &[],
    },
    BuiltinDef {
        group: "coordination.k8s.io",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        short: &[],
        status: false,
        rule: NameRule::Subdomain,
        builtin: Builtin::Lease,
        fields: &[],
        categories: &[],
    },
    BuiltinDef {
        group: "events.k8s.io",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short: &["ev"],
        status: false,
        rule: NameRule::PathSegment,
        builtin: Builtin::EventV1,
        fields: &[
            "reason",
            "type",
            "reportingController",
            "regarding.kind",
            "regarding.name",
            "regarding.namespace",
            "regarding.uid",
        ],
        categories: &[],
    },
    BuiltinDef {
        group: "apiextensions.k8s.io",
        plural: "customresourcedefinitions",
        singular: "customresourcedefinition",
        kind: "CustomResourceDefinition",
        namespaced: false,
        short: &["crd", "crds"],
        status: true,
        rule: NameRule::Subdomain,
        builtin: Builtin::CustomResourceDefinition,
        fields: &[],
        categories: &["api-extensions"],
    },
    BuiltinDef {
        group: "",
        plural: "serviceaccounts",
        singular: "serviceaccount",
        kind: "ServiceAccount",
        namespaced: true,
        short: &["sa"],
        status: false,
        rule: NameRule::Subdomain,
        builtin: Builtin::ServiceAccount,
        fields: &[],
        categories: &[],
    },
    BuiltinDef {
        group: "rbac.authorization.k8s.io",
        plural: "roles",
        singular: "role",
        kind: "Role",
        namespaced: true,
        short: &[],
        status: false,
        rule: NameRule::PathSegment,
        builtin: Builtin::Role,
        fields: &[],
        categories: &[],
    },
    BuiltinDef {
        group: "rbac.authorization.k8s.io",
        plural: "rolebindings",
        singular: "rolebinding",
        kind: "RoleBinding",
        namespaced: true,
        short: &[],
        status: false,
        rule: NameRule::PathSegment,
        builtin: Builtin::RoleBinding,
        fields: &[],
        categories: &[],
    },
    BuiltinDef {
        group: "rbac.authorization.k8s.io",
        plural: "clusterroles",
        singular: "clusterrole",
        kind: "ClusterRole",
        namespaced: false,
        short: &[],
        status: false,
        rule: NameRule::PathSegment,
        builtin: Builtin::ClusterRole,
        fields: &[],
        categories: &[],
    },
    BuiltinDef {
        group: "rbac.authorization.k8s.io",
        plural: "clusterrolebindings",
        singular: "clusterrolebinding",
        kind: "ClusterRoleBinding",
        namespaced: false,
        short: &[],
        status: false,
        rule: NameRule::PathSegment,
        builtin: Builtin::ClusterRoleBinding,
        fields: &[],
        categories: &[],
    },
    BuiltinDef {
        group: "apps",
        plural: "deployments",
        singular: "deployment",
        kind: "Deployment",
        namespaced: true,
        short: &["deploy"],
        status: true,
        rule: NameRule::Subdomain,
        builtin: Builtin::Deployment,
        fields: &[],
        categories: &[],
    },
    BuiltinDef {
        group: "policy",
        plural: "poddisruptionbudgets",
        singular: "poddisruptionbudget",
        kind: "PodDisruptionBudget",
        namespaced: true,
        short: &["pdb"],
        status: true,
        rule: NameRule::Subdomain,
        builtin: Builtin::PodDisruptionBudget,
        fields: &[],
        categories: &[],
    },
    BuiltinDef {
        group: "discovery.k8s.io",
        plural: "endpointslices",
        singular: "endpointslice",
        kind: "EndpointSlice",
        namespaced: true,
        short: &[],
        status: false,
        rule: NameRule::Subdomain,
        builtin: Builtin::EndpointSlice,
        fields: &[],
        categories: &[],
    },
];

impl Registry {
    /// The built-in kinds plus the Volcano CRDs.
    pub fn with_volcano() -> Registry {
        let mut r = Registry::builtins();
        for (file, yaml) in VOLCANO_CRDS {
            let crd: Value = serde_yaml_ng::from_str(yaml)
                .unwrap_or_else(|e| panic!("embedded CRD {file} is not YAML: {e}"));
            r.register_crd(&crd)
                .unwrap_or_else(|e| panic!("embedded CRD {file}: {e}"));
        }
        r
    }

    /// Only the built-in kinds.
    pub fn builtins() -> Registry {
        let mut r = Registry::default();
        for b in BUILTINS {
            let id = r.types.len();
            r.insert(ResourceType {
                group: b.group.to_string(),
                version: "v1".to_string(),
                plural: b.plural.to_string(),
                singular: b.singular.to_string(),
                kind: b.kind.to_string(),
                list_kind: format!("{}List", b.kind),
                namespaced: b.namespaced,
                short_names: b.short.iter().map(|s| s.to_string()).collect(),
                categories: b.categories.iter().map(|s| s.to_string()).collect(),
                status_subresource: b.status,
                name_rule: b.rule,
                schema: None,
                builtin: Some(b.builtin),
                printer_columns: Vec::new(),
                field_selectors: b.fields.to_vec(),
                storage: id,
            });
        }
        r
    }

    fn insert(&mut self, t: ResourceType) -> ResId {
        let key = (t.group.clone(), t.version.clone(), t.plural.clone());
        if let Some(&existing) = self.by_path.get(&key) {
            let storage = self.types[existing].storage;
            self.types[existing] = Arc::new(ResourceType { storage, ..t });
            return existing;
        }
        let id = self.types.len();
        self.types.push(Arc::new(t));
        self.by_path.insert(key, id);
        id
    }

    /// Registers (or re-registers) a CRD given as JSON (`apiextensions.k8s.io/v1`), returning the ids of
    /// its served versions.
    pub fn register_crd(&mut self, crd: &Value) -> Result<Vec<ResId>, CrdError> {
        let spec = crd
            .get("spec")
            .ok_or_else(|| CrdError::Invalid("spec: Required value".into()))?;
        let s = |v: Option<&Value>, what: &str| -> Result<String, CrdError> {
            v.and_then(Value::as_str)
                .map(String::from)
                .ok_or_else(|| CrdError::Invalid(format!("{what}: Required value")))
        };
        let group = s(spec.get("group"), "spec.group")?;
        let names = spec
            .get("names")
            .ok_or_else(|| CrdError::Invalid("spec.names: Required value".into()))?;
        let kind = s(names.get("kind"), "spec.names.kind")?;
        let plural = s(names.get("plural"), "spec.names.plural")?;
        let singular = names
            .get("singular")
            .and_then(Value::as_str)
            .map(String::from)
            .unwrap_or_else(|| kind.to_lowercase());
        let list_kind = names
            .get("listKind")
            .and_then(Value::as_str)
            .map(String::from)
            .unwrap_or_else(|| format!("{kind}List"));
        let strings = |v: Option<&Value>| -> Vec<String> {
            v.and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default()
        };
        let short_names = strings(names.get("shortNames"));
        let categories = strings(names.get("categories"));
        let namespaced = match spec.get("scope").and_then(Value::as_str) {
            Some("Namespaced") => true,
            Some("Cluster") => false,
            other => {
                return Err(CrdError::Invalid(format!(
                    "spec.scope: Unsupported value: {other:?}"
                )));
            }
        };
        let versions = spec
            .get("versions")
            .and_then(Value::as_array)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| CrdError::Invalid("spec.versions: Required value".into()))?;
        let mut ids = Vec::new();
        let mut storage_id = None;
        for v in storage_first(versions) {
            if v.get("served").and_then(Value::as_bool) == Some(false) {
                continue;
            }
            let version = s(v.get("name"), "spec.versions[].name")?;
            let schema = v
                .get("schema")
                .and_then(|s| s.get("openAPIV3Schema"))
                .map(|s| Arc::new(Schema::from_json(s)));
            let printer_columns = printer_columns(v);
            let status_subresource = v
                .get("subresources")
                .and_then(|s| s.get("status"))
                .is_some();
            let next_id = self.types.len();
            let id = self.insert(ResourceType {
                group: group.clone(),
                version,
                plural: plural.clone(),
                singular: singular.clone(),
                kind: kind.clone(),
                list_kind: list_kind.clone(),
                namespaced,
                short_names: short_names.clone(),
                categories: categories.clone(),
                status_subresource,
                name_rule: NameRule::Subdomain,
                schema,
                builtin: None,
                printer_columns,
                field_selectors: Vec::new(),
                storage: storage_id.unwrap_or(next_id),
            });
            if storage_id.is_none() {
                storage_id = Some(self.types[id].storage);
            }
            ids.push(id);
        }
        Ok(ids)
    }

    /// Removes a CRD's versions from routing (its objects stay unreachable, as after a CRD deletion).
    pub fn unregister(&mut self, group: &str, plural: &str) {
        self.by_path
            .retain(|(g, _, p), _| !(g == group && p == plural));
    }

    /// The resource type with this id (a cheap shared handle).
    pub fn get(&self, id: ResId) -> Arc<ResourceType> {
        self.types[id].clone()
    }

    /// The resource type served at `/apis/{group}/{version}/{plural}` (group empty for `/api/v1`).
    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<ResId> {
        self.by_path
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
            .copied()
    }

    /// The served resource type for a kind in an apiVersion (`batch.volcano.sh/v1alpha1`, `Job`).
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<ResId> {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        self.served().find(|&id| {
            let t = &self.types[id];
            t.group == group && t.version == version && t.kind == kind
        })
    }

    /// Ids of every served resource type, in registration order.
    pub fn served(&self) -> impl Iterator<Item = ResId> + '_ {
        let mut ids: Vec<ResId> = self.by_path.values().copied().collect();
        ids.sort_unstable();
        ids.into_iter()
    }

    /// The `(group, [versions])` pairs served, core group first.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for id in self.served() {
            let t = &self.types[id];
            match out.iter_mut().find(|(g, _)| *g == t.group) {
                Some((_, versions)) => {
                    if !versions.contains(&t.version) {
                        versions.push(t.version.clone());
                    }
                }
                None => out.push((t.group.clone(), vec![t.version.clone()])),
            }
        }
        out
    }

    /// Number of resource types ever registered (ids are below this).
    pub fn len(&self) -> usize {
        self.types.len()
    }

    /// Whether no resource type is registered.
    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }
}

/// A CRD version's `additionalPrinterColumns`, with the API server's defaults (type `string`, priority 0).
fn printer_columns(v: &Value) -> Vec<PrinterColumn> {
    v.get("additionalPrinterColumns")
        .and_then(Value::as_array)
        .map(|cols| {
            cols.iter()
                .map(|c| PrinterColumn {
                    name: c
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    ty: c
                        .get("type")
                        .and_then(Value::as_str)
                        .unwrap_or("string")
                        .to_string(),
                    format: c
                        .get("format")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    description: c
                        .get("description")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                    json_path: c
                        .get("jsonPath")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A CRD's versions with the storage version first (the one marked `storage`, else the first), so the
/// others can point at it once registered.
fn storage_first(versions: &[Value]) -> Vec<&Value> {
    let storage_version = versions
        .iter()
        .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .or(versions.first())
        .and_then(|v| v.get("name").and_then(Value::as_str))
        .map(String::from)
        .unwrap_or_default();
    let mut ordered: Vec<&Value> = versions.iter().collect();
    ordered
        .sort_by_key(|v| v.get("name").and_then(Value::as_str) != Some(storage_version.as_str()));
    ordered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volcano_crds_register_with_short_names_and_schemas() {
        let r = Registry::with_volcano();
        let jobs = r
            .lookup("batch.volcano.sh", "v1alpha1", "jobs")
            .expect("jobs");
        let t = r.get(jobs);
        assert_eq!(t.kind, "Job");
        assert!(t.namespaced);
        assert!(t.status_subresource);
        assert!(t.short_names.contains(&"vcjob".to_string()));
        let schema = t.schema.as_ref().unwrap();
        assert_eq!(
            schema.at("spec.tasks.[].replicas").unwrap().ty.as_deref(),
            Some("integer")
        );
        let pg = r.get(
            r.lookup("scheduling.volcano.sh", "v1beta1", "podgroups")
                .unwrap(),
        );
        assert!(pg.short_names.contains(&"pg".to_string()));
        let q = r.get(
            r.lookup("scheduling.volcano.sh", "v1beta1", "queues")
                .unwrap(),
        );
        assert!(!q.namespaced);
        assert!(q.short_names.contains(&"q".to_string()));
        assert_eq!(r.by_kind("batch.volcano.sh/v1alpha1", "Job"), Some(jobs));
        assert_eq!(r.by_kind("v1", "Pod"), r.lookup("", "v1", "pods"));
    }

    #[test]
    fn groups_list_core_first() {
        let r = Registry::with_volcano();
        let groups = r.groups();
        assert_eq!(groups[0].0, "");
        assert!(
            groups
                .iter()
                .any(|(g, v)| g == "batch.volcano.sh" && v == &vec!["v1alpha1".to_string()])
        );
    }

    #[test]
    fn crd_without_scope_is_refused() {
        let mut r = Registry::builtins();
        let crd = serde_json::json!({"spec": {"group": "x.io", "names": {"kind": "X", "plural": "xs"}, "versions": [{"name": "v1"}]}});
        assert!(r.register_crd(&crd).is_err());
    }
}
