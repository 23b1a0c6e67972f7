//! Shared by the pipeline tests: configurations, rendering, golden files, the CRD-schema check and
//! Volcano's admission rules. Independent of the simulator.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::{Value, json};
use volcano_runner::config::Config;
use volcano_runner::messages::v1::SubmitJob;
use volcano_runner::pipeline::hooks::{HookPlan, Outbound};
use volcano_runner::pipeline::{self, DesiredJob, PipelineError};
use volcano_runner::volcano::VolcanoJob;

/// The instant every golden render happens at.
pub fn now() -> jiff::Timestamp {
    "2024-05-01T12:00:05Z".parse().unwrap()
}

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn golden_dir() -> PathBuf {
    root().join("tests/golden")
}

/// A configuration from `tests/golden/config/<name>.toml`, checked like at start-up.
pub fn config(name: &str) -> Config {
    let path = golden_dir().join("config").join(format!("{name}.toml"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let config: Config =
        toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    config
        .pipeline
        .validate()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    config
}

/// The reference configuration of section 5 of the UCloud reference: one namespace `app-kubernetes`,
/// toleration `sducloud=apps`, no storage subfolder, proxy `app-` on `cloud.sdu.dk`, license table.
pub fn reference() -> Config {
    config("reference")
}

/// The shipped defaults (per-owner namespaces) plus the test license table.
pub fn defaults() -> Config {
    config("default")
}

/// A SubmitJob from `tests/golden/<relative>.json`.
pub fn job(relative: &str) -> SubmitJob {
    let path = golden_dir().join(format!("{relative}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn render(job: &SubmitJob, config: &Config) -> DesiredJob {
    let desired =
        pipeline::render(job, config, now()).unwrap_or_else(|e| panic!("render failed: {e}"));
    assert_cluster_accepts(&desired);
    desired
}

pub fn render_err(job: &SubmitJob, config: &Config) -> PipelineError {
    match pipeline::render(job, config, now()) {
        Ok(_) => panic!("render should have failed"),
        Err(e) => e,
    }
}

/// The VolcanoJob as JSON.
pub fn vcjob_json(desired: &DesiredJob) -> Value {
    serde_json::to_value(&desired.vcjob).unwrap()
}

/// Every object in apply order as JSON.
pub fn objects_json(desired: &DesiredJob) -> Vec<Value> {
    desired
        .objects()
        .iter()
        .map(|o| serde_json::to_value(o).unwrap())
        .collect()
}

/// `value` at a JSON pointer, or `null`.
pub fn at<'a>(value: &'a Value, pointer: &str) -> &'a Value {
    value.pointer(pointer).unwrap_or(&Value::Null)
}

/// The user's container of the VolcanoJob.
pub fn user_container(desired: &DesiredJob) -> Value {
    at(
        &vcjob_json(desired),
        "/spec/tasks/0/template/spec/containers/0",
    )
    .clone()
}

/// The pod spec of the VolcanoJob.
pub fn pod_spec(desired: &DesiredJob) -> Value {
    at(&vcjob_json(desired), "/spec/tasks/0/template/spec").clone()
}

/// Compares `actual` with `tests/golden/<relative>.yaml`; with `UPDATE_GOLDEN=1` writes it instead.
pub fn golden(relative: &str, actual: &Value) {
    let path = golden_dir().join(format!("{relative}.yaml"));
    let text = serde_yaml_ng::to_string(actual).unwrap();
    golden_text(&path, &text);
}

/// Compares text with a golden file; with `UPDATE_GOLDEN=1` writes it instead.
pub fn golden_text(path: &Path, text: &str) {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create it, then review it)",
            path.display()
        )
    });
    if expected != text {
        let diff: Vec<String> = expected
            .lines()
            .zip(text.lines())
            .enumerate()
            .filter(|(_, (e, a))| e != a)
            .take(10)
            .map(|(i, (e, a))| format!("line {}:\n  expected: {e}\n  actual:   {a}", i + 1))
            .collect();
        panic!(
            "{} differs from the rendered output ({} vs {} lines)\n{}\n(run with UPDATE_GOLDEN=1 to accept, then review the diff)",
            path.display(),
            expected.lines().count(),
            text.lines().count(),
            diff.join("\n")
        );
    }
}

/// A hook plan as JSON, for goldens and assertions.
pub fn plan_json(plan: &HookPlan) -> Value {
    let publish: Vec<Value> = plan
        .publish
        .iter()
        .map(|o| match o {
            Outbound::Lifecycle(e) => json!({ "lifecycle": e }),
            Outbound::Accounting(t) => json!({ "accounting": t }),
            Outbound::Proxy(p) => json!({ "proxy": p }),
        })
        .collect();
    json!({
        "job": plan.name,
        "namespace": plan.namespace,
        "resourceVersion": plan.resource_version,
        "publish": publish,
        "mergePatch": plan.merge_patch(),
        "delete": plan.delete.as_ref().map(|c| c.as_str().to_owned()),
        "nextCheck": plan.next_check.map(|t| t.to_string()),
        "failures": plan.failures.iter().map(|f| format!("{}: {}", f.plugin, f.error)).collect::<Vec<_>>(),
    })
}

// ---------------------------------------------------------------------------------------------------
// The real CRD schema, as JSON Schema.

/// The openAPIV3Schema of the Volcano Job CRD (crds/batch.volcano.sh_jobs.yaml), as JSON Schema.
/// Objects that list their properties are closed (`additionalProperties: false`): the API server would
/// silently prune an unknown field, so a misspelt field must fail here instead.
pub fn job_schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let path = root().join("crds/batch.volcano.sh_jobs.yaml");
        let crd: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let version = crd["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "v1alpha1")
            .expect("v1alpha1 in the CRD");
        let mut schema = version["schema"]["openAPIV3Schema"].clone();
        to_json_schema(&mut schema);
        schema
    })
}

fn to_json_schema(node: &mut Value) {
    let Some(map) = node.as_object_mut() else {
        return;
    };
    if map.get("nullable") == Some(&Value::Bool(true))
        && let Some(Value::String(t)) = map.get("type").cloned()
    {
        map.insert("type".into(), json!([t, "null"]));
    }
    if map.get("format") == Some(&json!("int32")) {
        map.entry("minimum").or_insert(json!(i32::MIN));
        map.entry("maximum").or_insert(json!(i32::MAX));
    }
    let open = map.contains_key("x-kubernetes-preserve-unknown-fields");
    if map.contains_key("properties") && !map.contains_key("additionalProperties") && !open {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    for child in map.values_mut() {
        match child {
            Value::Object(_) => to_json_schema(child),
            Value::Array(items) => items.iter_mut().for_each(to_json_schema),
            _ => {}
        }
    }
}

fn validator() -> &'static jsonschema::Validator {
    static VALIDATOR: OnceLock<jsonschema::Validator> = OnceLock::new();
    VALIDATOR
        .get_or_init(|| jsonschema::validator_for(job_schema()).expect("the CRD schema compiles"))
}

/// Every reason the CRD schema rejects `job` (empty when it is accepted), including duplicate keys in
/// `x-kubernetes-list-type: map|set` lists, which the API server refuses too.
pub fn schema_errors(job: &Value) -> Vec<String> {
    let mut errors: Vec<String> = validator()
        .iter_errors(job)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    list_type_errors(job_schema(), job, "", &mut errors);
    errors
}

fn list_type_errors(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    match value {
        Value::Array(items) => {
            match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
                Some("map") => {
                    let keys: Vec<&str> = schema["x-kubernetes-list-map-keys"]
                        .as_array()
                        .map(|k| k.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    let mut seen = BTreeSet::new();
                    for item in items {
                        let key: Vec<String> = keys.iter().map(|k| item[*k].to_string()).collect();
                        if !seen.insert(key.clone()) {
                            errors.push(format!("{path}: duplicate entry with {keys:?} = {key:?}"));
                        }
                    }
                }
                Some("set") => {
                    let mut seen = BTreeSet::new();
                    for item in items {
                        if !seen.insert(item.to_string()) {
                            errors.push(format!("{path}: duplicate entry {item}"));
                        }
                    }
                }
                _ => {}
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    list_type_errors(item_schema, item, &format!("{path}/{i}"), errors);
                }
            }
        }
        Value::Object(fields) => {
            for (name, child) in fields {
                let child_schema = schema
                    .get("properties")
                    .and_then(|p| p.get(name))
                    .or_else(|| schema.get("additionalProperties").filter(|a| a.is_object()));
                if let Some(child_schema) = child_schema {
                    list_type_errors(child_schema, child, &format!("{path}/{name}"), errors);
                }
            }
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------------
// Volcano's admission rules (pkg/webhooks/admission/jobs/validate) and the pod-template checks of the
// API server that a rendered job could plausibly break.

const VALID_EVENTS: [&str; 7] = [
    "*",
    "PodFailed",
    "PodEvicted",
    "Unknown",
    "TaskCompleted",
    "TaskFailed",
    "JobUpdated",
];
const VALID_ACTIONS: [&str; 6] = [
    "AbortJob",
    "RestartJob",
    "RestartTask",
    "TerminateJob",
    "CompleteJob",
    "ResumeJob",
];
const KNOWN_PLUGINS: [&str; 8] = [
    "env",
    "svc",
    "ssh",
    "mpi",
    "pytorch",
    "tensorflow",
    "ray",
    "hcclrank",
];

/// Every reason Volcano's validating webhook (or the pod-template validation it runs) would refuse `job`.
pub fn admission_errors(job: &VolcanoJob) -> Vec<String> {
    use volcano_runner::pipeline::names::{is_dns1123_label, is_label_value, is_qualified_name};
    let mut errors = Vec::new();
    let spec = &job.spec;
    let name = job.metadata.name.clone().unwrap_or_default();
    if !is_qualified_name(&name) || name.contains('/') {
        errors.push(format!("job name {name} is not a qualified name"));
    }
    if spec.tasks.is_empty() {
        errors.push("No task specified in job spec".into());
    }
    if spec.min_available.unwrap_or(0) < 0 {
        errors.push("job 'minAvailable' must be >= 0.".into());
    }
    match spec.max_retry {
        Some(r) if r < 0 => errors.push("'maxRetry' cannot be less than zero.".into()),
        Some(0) | None => errors.push("maxRetry 0 (or unset) becomes 3 silently".into()),
        _ => {}
    }
    let mut total = 0;
    let mut task_names = BTreeSet::new();
    for (index, task) in spec.tasks.iter().enumerate() {
        total += task.replicas;
        if task.replicas < 0 {
            errors.push(format!("'replicas' < 0 in task {}", task.name));
        }
        if task.min_available.is_some_and(|m| m > task.replicas) {
            errors.push(format!(
                "'minAvailable' is greater than 'replicas' in task {}",
                task.name
            ));
        }
        if !is_dns1123_label(&task.name) {
            errors.push(format!("task name {} is not a DNS-1123 label", task.name));
        }
        if !task_names.insert(task.name.clone()) {
            errors.push(format!("duplicated task name {}", task.name));
        }
        let pod = format!(
            "{name}-{}-{}",
            task.name,
            index.max(task.replicas.max(1) as usize - 1)
        );
        if pod.len() > 63 {
            errors.push(format!("pod name {pod} is longer than 63 characters"));
        }
        errors.extend(policy_errors(&task.policies));
        errors.extend(template_errors(&task.template));
    }
    if total < spec.min_available.unwrap_or(0) {
        errors.push("job 'minAvailable' should not be greater than total replicas in tasks".into());
    }
    errors.extend(policy_errors(&spec.policies));
    for plugin in spec.plugins.keys() {
        if !KNOWN_PLUGINS.contains(&plugin.as_str()) {
            errors.push(format!("unable to find job plugin: {plugin}"));
        }
    }
    if let Some(queue) = &spec.queue
        && !volcano_runner::pipeline::names::is_dns1123_subdomain(queue)
    {
        errors.push(format!("queue {queue} is not a DNS subdomain"));
    }
    for (key, value) in job.metadata.labels.iter().flatten() {
        if !is_qualified_name(key) || !is_label_value(value) {
            errors.push(format!("job label {key}={value} is invalid"));
        }
    }
    for key in job.metadata.annotations.iter().flatten().map(|(k, _)| k) {
        if !is_qualified_name(key) {
            errors.push(format!("job annotation key {key} is invalid"));
        }
    }
    errors
}

fn policy_errors(policies: &[volcano_runner::volcano::LifecyclePolicy]) -> Vec<String> {
    let mut errors = Vec::new();
    let mut events = BTreeSet::new();
    for policy in policies {
        let mut list: Vec<String> = policy.events.iter().map(|e| e.to_string()).collect();
        if let Some(e) = &policy.event {
            list.push(e.to_string());
        }
        if !list.is_empty() && policy.exit_code.is_some() {
            errors.push("must not specify event and exitCode simultaneously".into());
        }
        if list.is_empty() && policy.exit_code.is_none() {
            errors.push("either event and exitCode should be specified".into());
        }
        if policy.exit_code == Some(0) {
            errors.push("0 is not a valid error code".into());
        }
        for event in list {
            if !VALID_EVENTS.contains(&event.as_str()) {
                errors.push(format!("invalid policy event {event}"));
            }
            let action = policy
                .action
                .as_ref()
                .map(|a| a.to_string())
                .unwrap_or_default();
            if !VALID_ACTIONS.contains(&action.as_str()) {
                errors.push(format!("invalid policy action {action}"));
            }
            if !events.insert(event.clone()) {
                errors.push(format!("duplicate event {event} across different policy"));
            }
        }
    }
    if events.contains("*") && events.len() > 1 {
        errors.push("if there's * here, no other policy should be here".into());
    }
    errors
}

fn template_errors(template: &k8s_openapi::api::core::v1::PodTemplateSpec) -> Vec<String> {
    use volcano_runner::pipeline::names::{
        is_dns1123_label, is_label_value, is_qualified_name, is_quantity,
    };
    let mut errors = Vec::new();
    let meta = template.metadata.clone().unwrap_or_default();
    for (key, value) in meta.labels.iter().flatten() {
        if !is_qualified_name(key) || !is_label_value(value) {
            errors.push(format!("pod label {key}={value} is invalid"));
        }
    }
    for key in meta.annotations.iter().flatten().map(|(k, _)| k) {
        if !is_qualified_name(key) {
            errors.push(format!("pod annotation key {key} is invalid"));
        }
    }
    let Some(spec) = &template.spec else {
        errors.push("task template has no spec".into());
        return errors;
    };
    if spec.containers.is_empty() {
        errors.push("a pod needs at least one container".into());
    }
    if spec
        .restart_policy
        .as_deref()
        .is_some_and(|p| !["Always", "OnFailure", "Never"].contains(&p))
    {
        errors.push("invalid restartPolicy".into());
    }
    let volumes: BTreeMap<&str, &k8s_openapi::api::core::v1::Volume> = spec
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v))
        .collect();
    if volumes.len() != spec.volumes.as_ref().map_or(0, Vec::len) {
        errors.push("duplicate volume names".into());
    }
    for volume in volumes.keys() {
        if !is_dns1123_label(volume) {
            errors.push(format!("volume name {volume} is not a DNS-1123 label"));
        }
    }
    let mut container_names = BTreeSet::new();
    for container in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        if !container_names.insert(container.name.clone()) || !is_dns1123_label(&container.name) {
            errors.push(format!(
                "container name {} is invalid or duplicated",
                container.name
            ));
        }
        if container
            .image
            .as_deref()
            .is_none_or(|i| i.trim().is_empty())
        {
            errors.push(format!("container {} has no image", container.name));
        }
        let mut paths = BTreeSet::new();
        for mount in container.volume_mounts.iter().flatten() {
            if !volumes.contains_key(mount.name.as_str()) {
                errors.push(format!(
                    "{}: volumeMount {} names no volume",
                    container.name, mount.name
                ));
            }
            if !paths.insert(mount.mount_path.clone()) {
                errors.push(format!(
                    "{}: mountPath {} must be unique",
                    container.name, mount.mount_path
                ));
            }
            if !mount.mount_path.starts_with('/') {
                errors.push(format!(
                    "{}: mountPath {} is not absolute",
                    container.name, mount.mount_path
                ));
            }
            if let Some(sub) = &mount.sub_path
                && (sub.starts_with('/') || sub.split('/').any(|c| c == ".."))
            {
                errors.push(format!(
                    "{}: subPath {sub} must be relative, without '..'",
                    container.name
                ));
            }
        }
        let mut env_names = BTreeSet::new();
        for env in container.env.iter().flatten() {
            if !volcano_runner::pipeline::plugins::parameter::is_env_name(&env.name) {
                errors.push(format!(
                    "{}: env name {} is invalid",
                    container.name, env.name
                ));
            }
            if !env_names.insert(env.name.clone()) {
                errors.push(format!("{}: env {} is set twice", container.name, env.name));
            }
        }
        if let Some(resources) = &container.resources {
            let limits = resources.limits.clone().unwrap_or_default();
            for (name, quantity) in resources.requests.iter().flatten().chain(limits.iter()) {
                if !is_quantity(&quantity.0) {
                    errors.push(format!(
                        "{}: {name} quantity {} is invalid",
                        container.name, quantity.0
                    ));
                }
            }
            for (name, request) in resources.requests.iter().flatten() {
                if let Some(limit) = limits.get(name)
                    && limit != request
                    && (name == "nvidia.com/gpu")
                {
                    errors.push(format!(
                        "{}: {name} request must equal its limit",
                        container.name
                    ));
                }
            }
        }
    }
    for (key, value) in spec.node_selector.iter().flatten() {
        if !is_qualified_name(key) || !is_label_value(value) {
            errors.push(format!("nodeSelector {key}={value} is invalid"));
        }
    }
    errors
}

/// Fails the test unless every VolcanoJob of `desired` passes the CRD schema and the admission rules,
/// and the other objects have names the API server accepts.
pub fn assert_cluster_accepts(desired: &DesiredJob) {
    let value = vcjob_json(desired);
    let mut errors = schema_errors(&value);
    errors.extend(admission_errors(&desired.vcjob));
    for object in desired.objects() {
        let name = object.name();
        let ok = match object.kind() {
            "Service" => volcano_runner::pipeline::names::is_dns1035_label(name),
            "Namespace" => volcano_runner::pipeline::names::is_dns1123_label(name),
            _ => volcano_runner::pipeline::names::is_dns1123_subdomain(name),
        };
        if !ok {
            errors.push(format!("{} name {name} is invalid", object.kind()));
        }
        if object.kind() != "Namespace" && object.kind() != "Queue" && object.namespace().is_none()
        {
            errors.push(format!("{} {name} has no namespace", object.kind()));
        }
    }
    assert!(
        errors.is_empty(),
        "the cluster would refuse {}:\n{}",
        desired.name(),
        errors.join("\n")
    );
}
