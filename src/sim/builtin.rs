//! What the API server does for built-in kinds beyond storing them: decoding into the typed object
//! (which drops unknown fields and refuses wrong types), defaults, and the validation rules the runner
//! could trip over.

use crate::sim::json::JsonPath;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};

use super::error::FieldError;
use super::registry::Builtin;

fn roundtrip<T: DeserializeOwned + Serialize>(v: Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(v).map_err(|e| e.to_string())?;
    serde_json::to_value(&typed).map_err(|e| e.to_string())
}

/// Decodes a built-in object through its `k8s-openapi` type, as the API server decodes into Go structs.
/// Unknown fields disappear; a wrong type is an error text for a 400 BadRequest.
pub fn decode(kind: Builtin, v: Value) -> Result<Value, String> {
    use k8s_openapi::api;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    match kind {
        Builtin::Namespace => roundtrip::<api::core::v1::Namespace>(v),
        Builtin::Node => roundtrip::<api::core::v1::Node>(v),
        Builtin::Pod => roundtrip::<api::core::v1::Pod>(v),
        Builtin::Service => roundtrip::<api::core::v1::Service>(v),
        Builtin::ConfigMap => roundtrip::<api::core::v1::ConfigMap>(v),
        Builtin::Secret => roundtrip::<api::core::v1::Secret>(v),
        Builtin::Event => roundtrip::<api::core::v1::Event>(v),
        Builtin::NetworkPolicy => roundtrip::<api::networking::v1::NetworkPolicy>(v),
        Builtin::Lease => roundtrip::<api::coordination::v1::Lease>(v),
        Builtin::EventV1 => roundtrip::<api::events::v1::Event>(v),
        Builtin::CustomResourceDefinition => roundtrip::<CustomResourceDefinition>(v),
        Builtin::ServiceAccount => roundtrip::<api::core::v1::ServiceAccount>(v),
        Builtin::Role => roundtrip::<api::rbac::v1::Role>(v),
        Builtin::RoleBinding => roundtrip::<api::rbac::v1::RoleBinding>(v),
        Builtin::ClusterRole => roundtrip::<api::rbac::v1::ClusterRole>(v),
        Builtin::ClusterRoleBinding => roundtrip::<api::rbac::v1::ClusterRoleBinding>(v),
        Builtin::Deployment => roundtrip::<api::apps::v1::Deployment>(v),
        Builtin::PodDisruptionBudget => roundtrip::<api::policy::v1::PodDisruptionBudget>(v),
        Builtin::EndpointSlice => roundtrip::<api::discovery::v1::EndpointSlice>(v),
    }
}

/// Fields that were present before decoding and are gone after it (for strict field validation).
pub fn unknown_fields(before: &Value, after: &Value, path: &str, out: &mut Vec<String>) {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            for (k, v) in b {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match a.get(k) {
                    None if !v.is_null() && !is_empty(v) => out.push(p),
                    Some(av) => unknown_fields(v, av, &p, out),
                    None => {}
                }
            }
        }
        (Value::Array(b), Value::Array(a)) => {
            for (i, (bv, av)) in b.iter().zip(a).enumerate() {
                unknown_fields(bv, av, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Null => true,
    }
}

/// The load balancer's answer to a new Service, modelling MetalLB: a `LoadBalancer` Service that asks for
/// addresses (the `metallb.universe.tf/loadBalancerIPs` annotation, comma-separated, or the deprecated
/// `spec.loadBalancerIP`) gets them in `status.loadBalancer.ingress`; any other stays without one (pending).
fn load_balancer_status(obj: &Value) -> Value {
    if obj.at("/spec/type").and_then(Value::as_str) != Some("LoadBalancer") {
        return json!({});
    }
    let asked = obj
        .at("/metadata/annotations")
        .and_then(|a| a.get("metallb.universe.tf/loadBalancerIPs"))
        .and_then(Value::as_str)
        .or_else(|| obj.at("/spec/loadBalancerIP").and_then(Value::as_str))
        .unwrap_or_default();
    let ingress: Vec<Value> = asked
        .split(',')
        .map(str::trim)
        .filter(|a| a.parse::<std::net::IpAddr>().is_ok())
        .map(|ip| json!({"ip": ip, "ipMode": "VIP"}))
        .collect();
    if ingress.is_empty() {
        json!({})
    } else {
        json!({"ingress": ingress})
    }
}

/// Defaults the API server fills in on create.
pub fn default_on_create(
    kind: Builtin,
    obj: &mut Value,
    next_cluster_ip: &mut dyn FnMut() -> String,
) {
    match kind {
        Builtin::Namespace => {
            let name = obj.at("/metadata/name").cloned().unwrap_or(Value::Null);
            let labels = obj["metadata"]
                .as_object_mut()
                .map(|m| m.entry("labels").or_insert_with(|| json!({})));
            if let Some(Value::Object(l)) = labels {
                l.insert("kubernetes.io/metadata.name".into(), name);
            }
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
            obj["status"] = json!({"phase": "Active"});
        }
        Builtin::Pod => {
            let spec = &mut obj["spec"];
            if let Value::Object(s) = spec {
                s.entry("restartPolicy").or_insert(json!("Always"));
                s.entry("schedulerName")
                    .or_insert(json!("default-scheduler"));
                s.entry("terminationGracePeriodSeconds")
                    .or_insert(json!(30));
                s.entry("dnsPolicy").or_insert(json!("ClusterFirst"));
                s.entry("enableServiceLinks").or_insert(json!(true));
                s.entry("priority").or_insert(json!(0));
            }
            if obj.get("status").is_none_or(|s| s.get("phase").is_none()) {
                obj["status"] = json!({"phase": "Pending", "qosClass": qos_class(&obj["spec"])});
            }
        }
        Builtin::Service => {
            if let Value::Object(s) = &mut obj["spec"] {
                s.entry("type").or_insert(json!("ClusterIP"));
                s.entry("sessionAffinity").or_insert(json!("None"));
                if s.get("clusterIP")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    let ip = next_cluster_ip();
                    s.insert("clusterIP".into(), json!(ip));
                }
                let ip = s["clusterIP"].clone();
                s.insert("clusterIPs".into(), json!([ip]));
                if let Some(Value::Array(ports)) = s.get_mut("ports") {
                    for p in ports {
                        if let Value::Object(p) = p {
                            p.entry("protocol").or_insert(json!("TCP"));
                            if let Some(port) = p.get("port").cloned() {
                                p.entry("targetPort").or_insert(port);
                            }
                        }
                    }
                }
            }
            obj["status"] = json!({"loadBalancer": load_balancer_status(obj)});
        }
        Builtin::CustomResourceDefinition => {
            obj["status"] = json!({
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found"},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"}
                ],
                "acceptedNames": obj.at("/spec/names").cloned().unwrap_or(json!({})),
                "storedVersions": obj.at("/spec/versions").and_then(Value::as_array).map(|vs| {
                    vs.iter().filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true)).filter_map(|v| v.get("name").cloned()).collect::<Vec<_>>()
                }).unwrap_or_default(),
            });
        }
        _ => {}
    }
}

/// The QoS class of a pod spec: Guaranteed when every container's requests equal its limits for cpu
/// and memory, BestEffort when nothing is requested, Burstable otherwise.
pub fn qos_class(spec: &Value) -> &'static str {
    let containers = spec
        .get("containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut any = false;
    let mut guaranteed = !containers.is_empty();
    for c in &containers {
        let limits = c.at("/resources/limits");
        let requests = c.at("/resources/requests").or(limits);
        for r in ["cpu", "memory"] {
            let l = limits.and_then(|l| l.get(r));
            let q = requests.and_then(|q| q.get(r));
            if l.is_some() || q.is_some() {
                any = true;
            }
            if l.is_none() || l != q {
                guaranteed = false;
            }
        }
    }
    if guaranteed {
        "Guaranteed"
    } else if any {
        "Burstable"
    } else {
        "BestEffort"
    }
}

const CONFIG_KEY_MSG: &str = "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')";

/// Validation of built-in objects on create and update (`old` is the stored object on update).
pub fn validate(kind: Builtin, old: Option<&Value>, obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match kind {
        Builtin::Pod => validate_pod(old, obj, &mut errs),
        Builtin::ConfigMap | Builtin::Secret => validate_data(obj, &mut errs),
        Builtin::Event => {
            if obj.at("/involvedObject/name").is_none() && obj.at("/involvedObject/kind").is_none()
            {
                errs.push(FieldError::required("involvedObject", ""));
            }
        }
        Builtin::EventV1 => validate_event_v1(obj, &mut errs),
        Builtin::EndpointSlice => validate_endpoint_slice(old, obj, &mut errs),
        Builtin::Lease
        | Builtin::ServiceAccount
        | Builtin::Role
        | Builtin::RoleBinding
        | Builtin::ClusterRole
        | Builtin::ClusterRoleBinding
        | Builtin::Deployment
        | Builtin::PodDisruptionBudget
        | Builtin::NetworkPolicy
        | Builtin::Namespace
        | Builtin::Node
        | Builtin::Service => {}
        Builtin::CustomResourceDefinition => validate_crd(obj, &mut errs),
    }
    errs
}

/// ConfigMap and Secret: valid keys, and at most 1 MiB of data.
fn validate_data(obj: &Value, errs: &mut Vec<FieldError>) {
    let mut size = 0usize;
    for field in ["data", "binaryData", "stringData"] {
        if let Some(Value::Object(m)) = obj.get(field) {
            for (k, v) in m {
                size += v.as_str().map_or(0, str::len);
                let ok = !k.is_empty()
                    && k.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c));
                if !ok || k == "." || k == ".." {
                    errs.push(FieldError::invalid(
                        format!("{field}[{k}]"),
                        &json!(k),
                        CONFIG_KEY_MSG,
                    ));
                }
            }
        }
    }
    if size > 1 << 20 {
        errs.push(FieldError {
            field: String::new(),
            kind: super::error::FieldErrorKind::TooLong { max: 1 << 20 },
        });
    }
}

/// `events.k8s.io/v1` Event: the fields that API requires.
fn validate_event_v1(obj: &Value, errs: &mut Vec<FieldError>) {
    for field in [
        "eventTime",
        "reportingController",
        "reportingInstance",
        "action",
        "reason",
        "type",
    ] {
        if obj
            .get(field)
            .is_none_or(|v| v.is_null() || v.as_str() == Some(""))
        {
            errs.push(FieldError::required(field, ""));
        }
    }
}

/// EndpointSlice: a known, immutable address type; 1 to 100 addresses and a DNS label hostname per
/// endpoint.
fn validate_endpoint_slice(old: Option<&Value>, obj: &Value, errs: &mut Vec<FieldError>) {
    let ty = obj.get("addressType").and_then(Value::as_str);
    match ty {
        Some("IPv4" | "IPv6" | "FQDN") => {}
        Some(t) => errs.push(FieldError::invalid(
            "addressType",
            &json!(t),
            "supported values: \"FQDN\", \"IPv4\", \"IPv6\"",
        )),
        None => errs.push(FieldError::required("addressType", "")),
    }
    if let Some(old) = old
        && old.get("addressType") != obj.get("addressType")
    {
        errs.push(FieldError::invalid(
            "addressType",
            obj.get("addressType").unwrap_or(&Value::Null),
            "field is immutable",
        ));
    }
    for (i, e) in obj
        .get("endpoints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let n = e
            .get("addresses")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        if !(1..=100).contains(&n) {
            errs.push(FieldError::required(
                format!("endpoints[{i}].addresses"),
                "must contain at least 1 address",
            ));
        }
        if let Some(h) = e.get("hostname").and_then(Value::as_str) {
            for m in super::names::dns1123_label(h) {
                errs.push(FieldError::invalid(
                    format!("endpoints[{i}].hostname"),
                    &json!(h),
                    m,
                ));
            }
        }
    }
}

/// CustomResourceDefinition: its name is `<plural>.<group>`.
fn validate_crd(obj: &Value, errs: &mut Vec<FieldError>) {
    let name = obj
        .at("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let plural = obj
        .at("/spec/names/plural")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let group = obj
        .at("/spec/group")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if name != format!("{plural}.{group}") {
        errs.push(FieldError::invalid(
            "metadata.name",
            &json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
}

/// The checks of a pod spec on create (containers with names and images, hostname and subdomain),
/// also used on the pod templates of Volcano jobs.
pub fn validate_pod_spec(spec: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check_pod_spec(spec, &mut errs);
    errs
}

fn validate_pod(old: Option<&Value>, obj: &Value, errs: &mut Vec<FieldError>) {
    check_pod_spec(obj.get("spec").unwrap_or(&Value::Null), errs);
    if let Some(old) = old {
        check_pod_update(old, obj, errs);
    }
}

fn check_pod_spec(spec: &Value, errs: &mut Vec<FieldError>) {
    let containers = spec.get("containers").and_then(Value::as_array);
    match containers {
        None => errs.push(FieldError::required("spec.containers", "")),
        Some(list) if list.is_empty() => errs.push(FieldError::required("spec.containers", "")),
        Some(_) => {}
    }
    let mut seen = std::collections::BTreeSet::new();
    for field in ["initContainers", "containers"] {
        let Some(list) = spec.get(field).and_then(Value::as_array) else {
            continue;
        };
        for (i, c) in list.iter().enumerate() {
            let path = format!("spec.{field}[{i}]");
            let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
            if name.is_empty() {
                errs.push(FieldError::required(format!("{path}.name"), ""));
            } else {
                for m in super::names::dns1123_label(name) {
                    errs.push(FieldError::invalid(format!("{path}.name"), &json!(name), m));
                }
                if !seen.insert(name.to_string()) {
                    errs.push(FieldError {
                        field: format!("{path}.name"),
                        kind: super::error::FieldErrorKind::Duplicate {
                            value: format!("{name:?}"),
                        },
                    });
                }
            }
            if c.get("image")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                errs.push(FieldError::required(format!("{path}.image"), ""));
            }
        }
    }
    for field in ["hostname", "subdomain"] {
        if let Some(h) = spec.get(field).and_then(Value::as_str) {
            for m in super::names::dns1123_label(h) {
                errs.push(FieldError::invalid(format!("spec.{field}"), &json!(h), m));
            }
        }
    }
}

fn check_pod_update(old: &Value, obj: &Value, errs: &mut Vec<FieldError>) {
    {
        // Pod specs are immutable except for images, activeDeadlineSeconds and added tolerations.
        let strip = |spec: &Value| -> Value {
            let mut s = spec.clone();
            for field in ["containers", "initContainers"] {
                if let Some(Value::Array(list)) = s.get_mut(field) {
                    for c in list {
                        if let Value::Object(c) = c {
                            c.remove("image");
                        }
                    }
                }
            }
            if let Value::Object(m) = &mut s {
                m.remove("activeDeadlineSeconds");
                m.remove("tolerations");
                // The scheduler binds pods: nodeName may be set once.
                m.remove("nodeName");
                // Scheduling gates may be removed (checked below), never added.
                m.remove("schedulingGates");
            }
            s
        };
        let gates = |pod: &Value| -> Vec<Value> {
            pod.at("/spec/schedulingGates")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let (old_gates, new_gates) = (gates(old), gates(obj));
        if new_gates.iter().any(|g| !old_gates.contains(g)) {
            errs.push(FieldError::forbidden(
                "spec.schedulingGates",
                "only deletion is allowed, but found new scheduling gate",
            ));
        }
        // Tolerations may be added, never changed nor removed: each one the pod had must still be there.
        let tolerations = |pod: &Value| -> Vec<Value> {
            pod.at("/spec/tolerations")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let new_tolerations = tolerations(obj);
        for (i, t) in tolerations(old).iter().enumerate() {
            if !new_tolerations.contains(t) {
                errs.push(FieldError::forbidden(
                    format!("spec.tolerations[{i}]"),
                    "existing toleration can not be modified except its tolerationSeconds",
                ));
            }
        }
        let old_spec = strip(&old["spec"]);
        let new_spec = strip(&obj["spec"]);
        if old_spec != new_spec {
            errs.push(FieldError::forbidden(
                "spec",
                "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
            ));
        }
        let old_node = old
            .at("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let new_node = obj
            .at("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !old_node.is_empty() && old_node != new_node {
            errs.push(FieldError::forbidden(
                "spec.nodeName",
                "may not be changed once set",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_drops_unknown_fields_and_refuses_wrong_types() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "i", "bogus": 1}]}});
        let out = decode(Builtin::Pod, pod.clone()).unwrap();
        assert!(out.at("/spec/containers/0/bogus").is_none());
        let mut unknown = Vec::new();
        unknown_fields(&pod, &out, "", &mut unknown);
        assert_eq!(unknown, vec!["spec.containers[0].bogus".to_string()]);
        let bad = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": "nope"}});
        assert!(decode(Builtin::Pod, bad).is_err());
    }

    #[test]
    fn pod_needs_containers_with_images() {
        let errs = validate(
            Builtin::Pod,
            None,
            &json!({"spec": {"containers": [{"name": "a"}, {"name": "a", "image": "x"}]}}),
        );
        let msgs: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert_eq!(
            msgs,
            vec![
                "spec.containers[0].image: Required value".to_string(),
                "spec.containers[1].name: Duplicate value: \"a\"".to_string(),
            ]
        );
        assert_eq!(
            validate(Builtin::Pod, None, &json!({"spec": {}}))[0].to_string(),
            "spec.containers: Required value"
        );
    }

    #[test]
    fn pod_spec_is_immutable_except_images() {
        let old = json!({"spec": {"containers": [{"name": "a", "image": "x", "command": ["sleep", "1"]}]}});
        let image = json!({"spec": {"containers": [{"name": "a", "image": "y", "command": ["sleep", "1"]}]}});
        assert!(validate(Builtin::Pod, Some(&old), &image).is_empty());
        let command = json!({"spec": {"containers": [{"name": "a", "image": "x", "command": ["sleep", "2"]}]}});
        assert!(
            validate(Builtin::Pod, Some(&old), &command)[0]
                .to_string()
                .starts_with("spec: Forbidden: pod updates may not change")
        );
    }

    #[test]
    fn configmap_keys() {
        let errs = validate(
            Builtin::ConfigMap,
            None,
            &json!({"data": {"ok.key": "1", "bad/key": "2"}}),
        );
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "data[bad/key]");
    }

    #[test]
    fn qos() {
        let g = json!({"containers": [{"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]});
        assert_eq!(qos_class(&g), "Guaranteed");
        let b = json!({"containers": [{"resources": {"requests": {"cpu": "1"}}}]});
        assert_eq!(qos_class(&b), "Burstable");
        assert_eq!(qos_class(&json!({"containers": [{}]})), "BestEffort");
    }
}
