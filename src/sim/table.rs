//! Server-side printing (`meta.k8s.io/v1` Table), which `kubectl get` asks for: the columns kubectl
//! shows for built-in kinds and the `additionalPrinterColumns` of CRDs.

use std::sync::Arc;

use crate::sim::json::JsonPath;
use jiff::Timestamp;
use serde_json::{Value, json};

use super::clock::human_duration;
use super::registry::{Builtin, ResourceType};

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.at(ptr).and_then(Value::as_str).unwrap_or_default()
}

fn age(obj: &Value, now: Timestamp) -> String {
    match s(obj, "/metadata/creationTimestamp").parse::<Timestamp>() {
        Ok(t) => human_duration(now.duration_since(t)),
        Err(_) => "<unknown>".into(),
    }
}

fn col(name: &str, ty: &str, priority: i64, description: &str) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    json!({"name": name, "type": ty, "format": format, "description": description, "priority": priority})
}

/// What `kubectl get pods` shows in STATUS.
pub fn pod_status(pod: &Value) -> String {
    if pod.at("/metadata/deletionTimestamp").is_some() {
        return "Terminating".into();
    }
    let phase = s(pod, "/status/phase");
    let mut reason = phase.to_string();
    if let Some(r) = pod.at("/status/reason").and_then(Value::as_str) {
        reason = r.to_string();
    }
    let init_specs = pod
        .at("/spec/initContainers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if let Some(inits) = pod
        .at("/status/initContainerStatuses")
        .and_then(Value::as_array)
    {
        for (i, c) in inits.iter().enumerate() {
            if let Some(code) = c.at("/state/terminated/exitCode").and_then(Value::as_i64) {
                if code != 0 {
                    return format!(
                        "Init:{}",
                        c.at("/state/terminated/reason")
                            .and_then(Value::as_str)
                            .unwrap_or("Error")
                    );
                }
                continue;
            }
            if let Some(w) = c.at("/state/waiting/reason").and_then(Value::as_str)
                && w != "PodInitializing"
            {
                return format!("Init:{w}");
            }
            return format!("Init:{i}/{init_specs}");
        }
    }
    let mut running = false;
    for c in pod
        .at("/status/containerStatuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(w) = c.at("/state/waiting/reason").and_then(Value::as_str) {
            reason = w.to_string();
        } else if let Some(t) = c.at("/state/terminated") {
            reason = t
                .get("reason")
                .and_then(Value::as_str)
                .map(String::from)
                .unwrap_or_else(|| {
                    format!(
                        "ExitCode:{}",
                        t.get("exitCode").and_then(Value::as_i64).unwrap_or(0)
                    )
                });
        } else if c.at("/state/running").is_some() {
            running = true;
        }
    }
    if running && reason == "Completed" {
        reason = "Running".into();
    }
    if reason.is_empty() {
        "Pending".into()
    } else {
        reason
    }
}

/// Evaluates the simple JSONPath forms CRD printer columns use: `.a.b`, `.a[0].b`,
/// `.a[?(@.type=="Ready")].status`.
pub fn json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = obj;
    let path = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim_start_matches('.');
    let mut rest = path;
    while !rest.is_empty() {
        let end = rest.find(['.', '[']).unwrap_or(rest.len());
        let (field, tail) = rest.split_at(end);
        if !field.is_empty() {
            cur = cur.get(field)?;
        }
        rest = tail;
        if let Some(t) = rest.strip_prefix('[') {
            let close = t.find(']')?;
            let inner = &t[..close];
            rest = &t[close + 1..];
            if let Some(filter) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let (k, v) = filter.split_once("==")?;
                let v = v.trim().trim_matches('"').trim_matches('\'');
                cur = cur
                    .as_array()?
                    .iter()
                    .find(|e| e.get(k.trim()).and_then(Value::as_str) == Some(v))?;
            } else {
                cur = cur.get(inner.parse::<usize>().ok()?)?;
            }
        }
        rest = rest.strip_prefix('.').unwrap_or(rest);
    }
    Some(cur)
}

fn partial(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata").cloned().unwrap_or(json!({}))})
}

/// The columns and one row's cells, as the API server prints objects of type `t`.
fn columns_and_cells(t: &ResourceType, obj: &Value, now: Timestamp) -> Row {
    let name = json!(s(obj, "/metadata/name"));
    match t.builtin {
        Some(Builtin::Pod) => pod_row(obj, name, now),
        Some(Builtin::Node) => node_row(obj, name, now),
        Some(Builtin::Namespace) => namespace_row(obj, name, now),
        Some(Builtin::Service) => service_row(obj, name, now),
        Some(Builtin::ConfigMap) => data_row(obj, name, now, false),
        Some(Builtin::Secret) => data_row(obj, name, now, true),
        Some(Builtin::Event) => event_row(obj, name, now),
        Some(Builtin::EventV1) => event_v1_row(obj, name, now),
        Some(Builtin::Lease) => lease_row(obj, name, now),
        Some(Builtin::NetworkPolicy) => network_policy_row(obj, name, now),
        Some(Builtin::CustomResourceDefinition) => crd_row(obj, name),
        Some(
            Builtin::ServiceAccount
            | Builtin::Role
            | Builtin::RoleBinding
            | Builtin::ClusterRole
            | Builtin::ClusterRoleBinding
            | Builtin::Deployment
            | Builtin::PodDisruptionBudget
            | Builtin::EndpointSlice,
        ) => name_age_row(obj, name, now),
        None => custom_row(t, obj, name, now),
    }
}

/// A Table's column definitions and one row's cells.
type Row = (Vec<Value>, Vec<Value>);

/// Pod: READY, STATUS, RESTARTS, AGE, and the wide columns (IP, NODE, ...).
fn pod_row(obj: &Value, name: Value, now: Timestamp) -> Row {
    let statuses = obj
        .at("/status/containerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let total = obj
        .at("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let ready = statuses
        .iter()
        .filter(|c| c.get("ready").and_then(Value::as_bool) == Some(true))
        .count();
    let restarts: i64 = statuses
        .iter()
        .filter_map(|c| c.get("restartCount").and_then(Value::as_i64))
        .sum();
    let ip = obj
        .at("/status/podIP")
        .and_then(Value::as_str)
        .unwrap_or("<none>");
    let node = obj
        .at("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("<none>");
    (
        vec![
            col("Name", "string", 0, "Name of the pod"),
            col(
                "Ready",
                "string",
                0,
                "The aggregate readiness state of this pod for accepting traffic.",
            ),
            col(
                "Status",
                "string",
                0,
                "The aggregate status of the containers in this pod.",
            ),
            col(
                "Restarts",
                "string",
                0,
                "The number of times the containers in this pod have been restarted.",
            ),
            col("Age", "string", 0, "Time since the pod was created."),
            col("IP", "string", 1, "IP address allocated to the pod."),
            col(
                "Node",
                "string",
                1,
                "Name of the node where the pod is scheduled.",
            ),
            col(
                "Nominated Node",
                "string",
                1,
                "Name of the node where the pod is nominated.",
            ),
            col("Readiness Gates", "string", 1, "Pod readiness gates."),
        ],
        vec![
            name,
            json!(format!("{ready}/{total}")),
            json!(pod_status(obj)),
            json!(restarts.to_string()),
            json!(age(obj, now)),
            json!(ip),
            json!(node),
            json!("<none>"),
            json!("<none>"),
        ],
    )
}

/// Node: STATUS (with `SchedulingDisabled` when cordoned), ROLES, AGE, VERSION and the wide columns.
fn node_row(obj: &Value, name: Value, now: Timestamp) -> Row {
    let ready = obj
        .at("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    let mut status = if ready {
        "Ready".to_string()
    } else {
        "NotReady".to_string()
    };
    if obj.at("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push_str(",SchedulingDisabled");
    }
    let ip = obj
        .at("/status/addresses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|a| a["type"] == "InternalIP")
        .and_then(|a| a["address"].as_str())
        .unwrap_or("<none>");
    (
        vec![
            col("Name", "string", 0, "Name of the node"),
            col("Status", "string", 0, "The status of the node"),
            col("Roles", "string", 0, "The roles of the node"),
            col("Age", "string", 0, "Time since the node was created."),
            col("Version", "string", 0, "Kubelet version"),
            col("Internal-IP", "string", 1, "Internal IP"),
            col("External-IP", "string", 1, "External IP"),
            col("OS-Image", "string", 1, "OS image"),
            col("Kernel-Version", "string", 1, "Kernel version"),
            col("Container-Runtime", "string", 1, "Container runtime"),
        ],
        vec![
            name,
            json!(status),
            json!("<none>"),
            json!(age(obj, now)),
            json!(s(obj, "/status/nodeInfo/kubeletVersion")),
            json!(ip),
            json!("<none>"),
            json!(s(obj, "/status/nodeInfo/osImage")),
            json!(s(obj, "/status/nodeInfo/kernelVersion")),
            json!(s(obj, "/status/nodeInfo/containerRuntimeVersion")),
        ],
    )
}

/// Namespace: STATUS, AGE.
fn namespace_row(obj: &Value, name: Value, now: Timestamp) -> Row {
    (
        vec![
            col("Name", "string", 0, "Name"),
            col("Status", "string", 0, "The status of the namespace"),
            col("Age", "string", 0, "Age"),
        ],
        vec![name, json!(s(obj, "/status/phase")), json!(age(obj, now))],
    )
}

/// Service: TYPE, CLUSTER-IP, EXTERNAL-IP, PORT(S), AGE, and SELECTOR when wide.
fn service_row(obj: &Value, name: Value, now: Timestamp) -> Row {
    let ports: Vec<String> = obj
        .at("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| format!("{}/{}", p["port"], p["protocol"].as_str().unwrap_or("TCP")))
        .collect();
    let ports = if ports.is_empty() {
        "<none>".to_string()
    } else {
        ports.join(",")
    };
    let selector: Vec<String> = obj
        .at("/spec/selector")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    (
        vec![
            col("Name", "string", 0, "Name"),
            col("Type", "string", 0, "Type"),
            col("Cluster-IP", "string", 0, "Cluster IP"),
            col("External-IP", "string", 0, "External IP"),
            col("Port(s)", "string", 0, "Ports"),
            col("Age", "string", 0, "Age"),
            col("Selector", "string", 1, "Selector"),
        ],
        vec![
            name,
            json!(s(obj, "/spec/type")),
            json!(s(obj, "/spec/clusterIP")),
            json!("<none>"),
            json!(ports),
            json!(age(obj, now)),
            json!(if selector.is_empty() {
                "<none>".to_string()
            } else {
                selector.join(",")
            }),
        ],
    )
}

/// ConfigMap and Secret: how many keys, and a Secret's TYPE.
fn data_row(obj: &Value, name: Value, now: Timestamp, secret: bool) -> Row {
    let data = ["data", "binaryData"]
        .iter()
        .filter_map(|f| obj.get(*f).and_then(Value::as_object))
        .map(|m| m.len())
        .sum::<usize>();
    if secret {
        (
            vec![
                col("Name", "string", 0, "Name"),
                col("Type", "string", 0, "Type"),
                col("Data", "string", 0, "Data"),
                col("Age", "string", 0, "Age"),
            ],
            vec![
                name,
                json!(obj.get("type").and_then(Value::as_str).unwrap_or("Opaque")),
                json!(data.to_string()),
                json!(age(obj, now)),
            ],
        )
    } else {
        (
            vec![
                col("Name", "string", 0, "Name"),
                col("Data", "string", 0, "Data"),
                col("Age", "string", 0, "Age"),
            ],
            vec![name, json!(data.to_string()), json!(age(obj, now))],
        )
    }
}

/// Core Event: LAST SEEN, TYPE, REASON, OBJECT, MESSAGE.
fn event_row(obj: &Value, name: Value, now: Timestamp) -> Row {
    let last = obj
        .get("lastTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<Timestamp>().ok())
        .map(|t| human_duration(now.duration_since(t)))
        .unwrap_or_else(|| "<unknown>".into());
    let object = format!(
        "{}/{}",
        s(obj, "/involvedObject/kind").to_lowercase(),
        s(obj, "/involvedObject/name")
    );
    (
        vec![
            col("Last Seen", "string", 0, "Last seen"),
            col("Type", "string", 0, "Type"),
            col("Reason", "string", 0, "Reason"),
            col("Object", "string", 0, "Object"),
            col("Message", "string", 0, "Message"),
            col("Name", "string", 1, "Name"),
        ],
        vec![
            json!(last),
            json!(s(obj, "/type")),
            json!(s(obj, "/reason")),
            json!(object),
            json!(s(obj, "/message")),
            name,
        ],
    )
}

/// `events.k8s.io/v1` Event: TYPE, REASON, NOTE, AGE.
fn event_v1_row(obj: &Value, name: Value, now: Timestamp) -> Row {
    (
        vec![
            col("Name", "string", 0, "Name"),
            col("Type", "string", 0, "Type"),
            col("Reason", "string", 0, "Reason"),
            col("Note", "string", 0, "Note"),
            col("Age", "string", 0, "Age"),
        ],
        vec![
            name,
            json!(s(obj, "/type")),
            json!(s(obj, "/reason")),
            json!(s(obj, "/note")),
            json!(age(obj, now)),
        ],
    )
}

/// Lease: HOLDER, AGE.
fn lease_row(obj: &Value, name: Value, now: Timestamp) -> Row {
    (
        vec![
            col("Name", "string", 0, "Name"),
            col("Holder", "string", 0, "Holder"),
            col("Age", "string", 0, "Age"),
        ],
        vec![
            name,
            json!(s(obj, "/spec/holderIdentity")),
            json!(age(obj, now)),
        ],
    )
}

/// NetworkPolicy: POD-SELECTOR, AGE.
fn network_policy_row(obj: &Value, name: Value, now: Timestamp) -> Row {
    let sel: Vec<String> = obj
        .at("/spec/podSelector/matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    (
        vec![
            col("Name", "string", 0, "Name"),
            col("Pod-Selector", "string", 0, "Pod selector"),
            col("Age", "string", 0, "Age"),
        ],
        vec![
            name,
            json!(if sel.is_empty() {
                "<none>".to_string()
            } else {
                sel.join(",")
            }),
            json!(age(obj, now)),
        ],
    )
}

/// CustomResourceDefinition: CREATED AT.
fn crd_row(obj: &Value, name: Value) -> Row {
    (
        vec![
            col("Name", "string", 0, "Name"),
            col("Created At", "date", 0, "Created"),
        ],
        vec![name, json!(s(obj, "/metadata/creationTimestamp"))],
    )
}

/// The deploy manifests' kinds: name and age, as kubectl prints any object it has no columns for.
fn name_age_row(obj: &Value, name: Value, now: Timestamp) -> Row {
    (
        vec![
            col("Name", "string", 0, "Name"),
            col("Age", "string", 0, "Age"),
        ],
        vec![name, json!(age(obj, now))],
    )
}

/// A custom resource: NAME and its CRD's `additionalPrinterColumns` (AGE when it has none).
fn custom_row(t: &ResourceType, obj: &Value, name: Value, now: Timestamp) -> Row {
    let mut cols = vec![col(
        "Name",
        "string",
        0,
        "Name must be unique within a namespace.",
    )];
    let mut cells = vec![name];
    if t.printer_columns.is_empty() {
        cols.push(col("Age", "date", 0, "CreationTimestamp"));
        cells.push(json!(age(obj, now)));
    }
    for c in &t.printer_columns {
        let mut d = col(&c.name, &c.ty, c.priority, &c.description);
        d["format"] = json!(c.format);
        cols.push(d);
        let cell = json_path(obj, &c.json_path).cloned().unwrap_or(Value::Null);
        // The API server prints date columns as ages, as kubectl shows them.
        let cell = match (&cell, c.ty.as_str()) {
            (Value::String(t), "date") => match t.parse::<Timestamp>() {
                Ok(t) => json!(human_duration(now.duration_since(t))),
                Err(_) => cell,
            },
            _ => cell,
        };
        cells.push(cell);
    }
    (cols, cells)
}

/// A Table of `objects` of type `t`. `include_object` is `None`, `Metadata` (default) or `Object`.
pub fn to_table(
    t: &ResourceType,
    objects: &[Arc<Value>],
    now: Timestamp,
    resource_version: u64,
    continue_token: Option<&str>,
    include_object: &str,
) -> Value {
    let mut columns = None;
    let mut rows = Vec::new();
    for obj in objects {
        let (cols, cells) = columns_and_cells(t, obj, now);
        if columns.is_none() {
            columns = Some(cols);
        }
        let mut row = json!({"cells": cells});
        match include_object {
            "None" => {}
            "Object" => row["object"] = (**obj).clone(),
            _ => row["object"] = partial(obj),
        }
        rows.push(row);
    }
    let columns = columns.unwrap_or_else(|| columns_and_cells(t, &json!({}), now).0);
    let mut meta = json!({"resourceVersion": resource_version.to_string()});
    if let Some(c) = continue_token {
        meta["continue"] = json!(c);
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": columns, "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_path_forms() {
        let o = json!({"status": {"state": {"phase": "Running"}, "conditions": [{"type": "A", "status": "x"}, {"type": "Ready", "status": "True"}]}, "l": [1, 2]});
        assert_eq!(
            json_path(&o, ".status.state.phase"),
            Some(&json!("Running"))
        );
        assert_eq!(
            json_path(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            Some(&json!("True"))
        );
        assert_eq!(json_path(&o, ".l[1]"), Some(&json!(2)));
        assert_eq!(json_path(&o, ".status.missing"), None);
    }

    #[test]
    fn pod_status_column() {
        let waiting = json!({"status": {"phase": "Pending", "containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff"}}}]}});
        assert_eq!(pod_status(&waiting), "ImagePullBackOff");
        let done = json!({"status": {"phase": "Succeeded", "containerStatuses": [{"state": {"terminated": {"reason": "Completed", "exitCode": 0}}}]}});
        assert_eq!(pod_status(&done), "Completed");
        let failed = json!({"status": {"phase": "Failed", "containerStatuses": [{"state": {"terminated": {"reason": "Error", "exitCode": 2}}}]}});
        assert_eq!(pod_status(&failed), "Error");
        let dying = json!({"metadata": {"deletionTimestamp": "x"}, "status": {"phase": "Running"}});
        assert_eq!(pod_status(&dying), "Terminating");
    }
}
