//! Discovery documents: `/version`, `/api`, `/apis`, `/apis/{group}`, `/api/v1`, `/apis/{group}/{version}`,
//! and aggregated discovery (`apidiscovery.k8s.io/v2`) when a client asks for it.

use serde_json::{Value, json};

use super::registry::{Registry, ResourceType};

/// The Accept value of aggregated discovery responses.
pub const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `/version`: a 1.33 server, so that clients enable the features they would against a current cluster.
pub fn version() -> Value {
    json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-volcano-runner-sim",
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc",
        "platform": "linux/amd64", "emulationMajor": "1", "emulationMinor": "33"
    })
}

/// `/api`: the legacy core group list.
pub fn api_versions(server_address: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
           "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]})
}

fn group_entry(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(json!({}))})
}

/// `/apis`: every named group with its versions.
pub fn api_group_list(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .groups()
        .iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_entry(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/{group}`.
pub fn api_group(registry: &Registry, group: &str) -> Option<Value> {
    let (g, vs) = registry
        .groups()
        .into_iter()
        .find(|(g, _)| g == group && !g.is_empty())?;
    let mut v = group_entry(&g, &vs);
    v["kind"] = json!("APIGroup");
    v["apiVersion"] = json!("v1");
    Some(v)
}

fn types_at<'a>(
    registry: &'a Registry,
    group: &'a str,
    version: &'a str,
) -> impl Iterator<Item = std::sync::Arc<ResourceType>> + 'a {
    registry
        .served()
        .map(|id| registry.get(id))
        .filter(move |t| t.group == group && t.version == version)
}

/// `/api/v1` or `/apis/{group}/{version}`: kinds, scope, verbs, short names and subresources, which
/// kube's `Discovery` and kubectl read.
pub fn api_resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for t in types_at(registry, group, version) {
        resources.push(json!({
            "name": t.plural, "singularName": t.singular, "namespaced": t.namespaced, "kind": t.kind,
            "verbs": VERBS, "shortNames": t.short_names, "categories": t.categories,
        }));
        for sub in t.subresources() {
            let (verbs, kind) = subresource_shape(sub, &t.kind);
            resources.push(json!({"name": format!("{}/{sub}", t.plural), "singularName": "", "namespaced": t.namespaced,
                                  "kind": kind, "verbs": verbs}));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

fn aggregated_group(registry: &Registry, group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| {
            let resources: Vec<Value> = types_at(registry, group, v)
                .map(|t| {
                    let subs: Vec<Value> = t
                        .subresources()
                        .into_iter()
                        .map(|s| {
                            let (verbs, kind) = subresource_shape(s, &t.kind);
                            let group = if s == "eviction" { "policy" } else { t.group.as_str() };
                            json!({"subresource": s, "responseKind": {"group": group, "version": t.version, "kind": kind}, "verbs": verbs})
                        })
                        .collect();
                    json!({
                        "resource": t.plural,
                        "responseKind": {"group": t.group, "version": t.version, "kind": t.kind},
                        "scope": if t.namespaced { "Namespaced" } else { "Cluster" },
                        "singularResource": t.singular, "verbs": VERBS, "shortNames": t.short_names,
                        "categories": t.categories, "subresources": subs,
                    })
                })
                .collect();
            json!({"version": v, "resources": resources, "freshness": "Current"})
        })
        .collect();
    json!({"metadata": {"name": group}, "versions": vs})
}

/// Aggregated discovery of the core group (`/api`) or of every other group (`/apis`).
pub fn aggregated(registry: &Registry, core: bool) -> Value {
    let items: Vec<Value> = registry
        .groups()
        .iter()
        .filter(|(g, _)| g.is_empty() == core)
        .map(|(g, vs)| aggregated_group(registry, g, vs))
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

/// The title and version of the simulator's (empty) Swagger 2.0 document.
const OPENAPI_V2_TITLE: &str = "volcano-runner sim";
const OPENAPI_V2_VERSION: &str = "v1.33.0";

/// The Swagger 2.0 document, in JSON: no paths and no definitions, so a client validates nothing itself.
pub fn openapi_v2() -> Value {
    json!({
        "swagger": "2.0",
        "info": {"title": OPENAPI_V2_TITLE, "version": OPENAPI_V2_VERSION},
        "paths": {},
        "definitions": {},
    })
}

/// The same document in the protobuf form (gnostic's `openapi.v2.Document`) that older kubectl asks for:
/// `swagger` is field 1, `info` field 2, and in `Info` `title` is field 1 and `version` field 2.
pub fn openapi_v2_protobuf() -> Vec<u8> {
    fn field(number: u8, bytes: &[u8], out: &mut Vec<u8>) {
        out.push(number << 3 | 2); // length-delimited
        out.push(u8::try_from(bytes.len()).expect("short fields"));
        out.extend_from_slice(bytes);
    }
    let mut info = Vec::new();
    field(1, OPENAPI_V2_TITLE.as_bytes(), &mut info);
    field(2, OPENAPI_V2_VERSION.as_bytes(), &mut info);
    let mut doc = Vec::new();
    field(1, b"2.0", &mut doc);
    field(2, &info, &mut doc);
    doc
}

/// The OpenAPI v3 root document. It lists the built-in group versions only: for custom resources
/// `kubectl` then checks field-validation support on the Namespace document and validates on the
/// server, as it does against a real cluster whose CRD documents it cannot find.
pub fn openapi_v3_root(registry: &Registry) -> Value {
    let mut paths = serde_json::Map::new();
    for (group, versions) in registry.groups() {
        for v in versions {
            if types_at(registry, &group, &v).any(|t| t.builtin.is_some()) {
                let key = if group.is_empty() {
                    format!("api/{v}")
                } else {
                    format!("apis/{group}/{v}")
                };
                paths.insert(
                    key.clone(),
                    json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash=sim")}),
                );
            }
        }
    }
    json!({"paths": paths})
}

/// The OpenAPI v3 document of a built-in group version: one PATCH operation per kind with its
/// group-version-kind and the `fieldValidation` parameter, which is what `kubectl` looks for before it
/// leaves validation to the server. Strategic merge is not advertised, so `kubectl apply` computes it
/// from its built-in types.
pub fn openapi_v3_group_version(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    for t in types_at(registry, group, version).filter(|t| t.builtin.is_some()) {
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let path = if t.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", t.plural)
        } else {
            format!("{prefix}/{}/{{name}}", t.plural)
        };
        let params: Vec<Value> = ["dryRun", "fieldManager", "fieldValidation", "force"]
            .iter()
            .map(|p| json!({"name": p, "in": "query", "schema": {"type": "string", "uniqueItems": true}}))
            .collect();
        paths.insert(
            path,
            json!({"patch": {
                "operationId": format!("patch{}", t.kind),
                "x-kubernetes-group-version-kind": {"group": t.group, "version": t.version, "kind": t.kind},
                "x-kubernetes-action": "patch",
                "parameters": params,
                "requestBody": {"content": {
                    "application/json-patch+json": {"schema": {"type": "object"}},
                    "application/merge-patch+json": {"schema": {"type": "object"}},
                    "application/apply-patch+yaml": {"schema": {"type": "object"}}
                }},
                "responses": {"200": {"description": "OK"}}
            }}),
        );
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0-volcano-runner-sim"},
        "paths": paths,
        "components": {"schemas": {}}
    }))
}

/// The verbs and response kind of a subresource, as a real API server lists them.
fn subresource_shape(sub: &str, kind: &str) -> (&'static [&'static str], String) {
    match sub {
        "log" => (&["get"], "Pod".to_owned()),
        "eviction" => (&["create"], "Eviction".to_owned()),
        _ => (&["get", "patch", "update"], kind.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volcano_group_is_listed_with_short_names_and_status() {
        let r = Registry::with_volcano();
        let list = api_resource_list(&r, "batch.volcano.sh", "v1alpha1").unwrap();
        let res = list["resources"].as_array().unwrap();
        assert!(res.iter().any(|x| x["name"] == "jobs"
            && x["shortNames"][0] == "vcjob"
            && x["namespaced"] == true));
        assert!(res.iter().any(|x| x["name"] == "jobs/status"));
        let core = api_resource_list(&r, "", "v1").unwrap();
        assert!(
            core["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["name"] == "pods/log")
        );
        let groups = api_group_list(&r);
        assert!(
            groups["groups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["name"] == "scheduling.volcano.sh")
        );
        assert!(api_resource_list(&r, "nope", "v1").is_none());
        let agg = aggregated(&r, false);
        assert!(
            agg["items"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["metadata"]["name"] == "batch.volcano.sh")
        );
    }
}
