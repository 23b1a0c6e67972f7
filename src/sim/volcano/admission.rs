//! Volcano's job admission webhooks (`mutatejob.volcano.sh`, `validatejob.volcano.sh`) as pure functions
//! over the job's JSON, with Volcano's messages. Other parts of volcano-runner can call
//! [`validate_job`] to check a rendered job before it ever reaches a cluster.

use std::collections::{BTreeMap, BTreeSet};

use crate::sim::json::JsonPath;
use serde_json::{Value, json};

use crate::sim::names;

/// Name of the mutating webhook.
pub const MUTATE_WEBHOOK: &str = "mutatejob.volcano.sh";
/// Name of the validating webhook, as it appears in a denial message.
pub const VALIDATE_WEBHOOK: &str = "validatejob.volcano.sh";

/// Events users may name in policies, in the order the denial message lists them.
pub const VALID_EVENTS: &[&str] = &[
    "*",
    "PodFailed",
    "PodEvicted",
    "PodPending",
    "Unknown",
    "TaskCompleted",
    "TaskFailed",
    "JobUpdated",
];
/// Actions users may name in policies.
pub const VALID_ACTIONS: &[&str] = &[
    "AbortJob",
    "RestartJob",
    "RestartTask",
    "RestartPod",
    "TerminateJob",
    "CompleteJob",
    "ResumeJob",
];
/// Job plugins the controller knows.
pub const KNOWN_PLUGINS: &[&str] = &[
    "env",
    "svc",
    "ssh",
    "mpi",
    "pytorch",
    "tensorflow",
    "ray",
    "hcclrank",
];

fn int(v: Option<&Value>) -> Option<i64> {
    v.and_then(Value::as_i64)
}

fn tasks(job: &Value) -> &[Value] {
    job.at("/spec/tasks")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// The defaults the mutating webhook fills in on create: queue `default`, scheduler `volcano`, `maxRetry`
/// 3 when 0, task names `default<i>`, task `minAvailable` = replicas, job `minAvailable` = their sum, and
/// the `svc`/`ssh` plugins that the framework plugins need.
pub fn mutate_job(job: &mut Value) {
    let Some(spec) = job.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if spec
        .get("queue")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        spec.insert("queue".into(), json!("default"));
    }
    if spec
        .get("schedulerName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        spec.insert("schedulerName".into(), json!("volcano"));
    }
    if spec.get("maxRetry").is_none_or(|v| v.as_i64() == Some(0)) {
        spec.insert("maxRetry".into(), json!(3));
    }
    let mut sum = 0i64;
    if let Some(Value::Array(tasks)) = spec.get_mut("tasks") {
        for (i, task) in tasks.iter_mut().enumerate() {
            let Some(t) = task.as_object_mut() else {
                continue;
            };
            if t.get("name")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                t.insert("name".into(), json!(format!("default{i}")));
            }
            let replicas = t.get("replicas").and_then(Value::as_i64);
            if t.get("minAvailable").is_none_or(Value::is_null)
                && let Some(r) = replicas
            {
                t.insert("minAvailable".into(), json!(r));
            }
            if t.get("maxRetry").is_none_or(|v| v.as_i64() == Some(0)) {
                t.insert("maxRetry".into(), json!(3));
            }
            sum += t
                .get("minAvailable")
                .and_then(Value::as_i64)
                .or(replicas)
                .unwrap_or(0);
        }
    }
    if spec
        .get("minAvailable")
        .is_none_or(|v| v.as_i64() == Some(0))
    {
        spec.insert("minAvailable".into(), json!(sum));
    }
    if let Some(Value::Object(plugins)) = spec.get_mut("plugins") {
        if ["tensorflow", "mpi", "pytorch"]
            .iter()
            .any(|p| plugins.contains_key(*p))
            && !plugins.contains_key("svc")
        {
            plugins.insert("svc".into(), json!([]));
        }
        if plugins.contains_key("mpi") && !plugins.contains_key("ssh") {
            plugins.insert("ssh".into(), json!([]));
        }
    }
}

/// Go's `%v` of a string slice: `[a b c]`.
fn go_list(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}

/// `go-multierror`'s rendering of a list of errors.
fn multierror(errs: &[String]) -> String {
    let head = if errs.len() == 1 {
        "1 error occurred:".to_string()
    } else {
        format!("{} errors occurred:", errs.len())
    };
    let body: Vec<String> = errs.iter().map(|e| format!("\t* {e}")).collect();
    format!("{head}\n{}\n\n", body.join("\n"))
}

fn policy_events(policy: &Value) -> Vec<String> {
    let mut events: Vec<String> = policy
        .get("events")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|e| e.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if let Some(e) = policy
        .get("event")
        .and_then(Value::as_str)
        .filter(|e| !e.is_empty())
    {
        events.push(e.to_string());
    }
    let mut seen = BTreeSet::new();
    events.retain(|e| seen.insert(e.clone()));
    events
}

/// Validates `policies` (job- or task-level); `None` when they are fine.
fn validate_policies(policies: Option<&Value>, path: &str) -> Option<String> {
    let policies = policies.and_then(Value::as_array)?;
    let mut errs = Vec::new();
    let mut seen_events = BTreeSet::new();
    let mut exit_codes = BTreeSet::new();
    for policy in policies {
        let events = policy_events(policy);
        let exit_code = int(policy.get("exitCode"));
        if !events.is_empty() && exit_code.is_some() {
            errs.push("must not specify event and exitCode simultaneously".to_string());
            break;
        }
        if events.is_empty() && exit_code.is_none() {
            errs.push("either event and exitCode should be specified".to_string());
            break;
        }
        if !events.is_empty() {
            let action = policy
                .get("action")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let mut stop = false;
            for event in events {
                if !VALID_EVENTS.contains(&event.as_str()) {
                    errs.push(format!(
                        "{path}: Invalid value: {event:?}: invalid policy event"
                    ));
                    stop = true;
                    break;
                }
                if !VALID_ACTIONS.contains(&action) {
                    errs.push(format!(
                        "{path}: Invalid value: {action:?}: invalid policy action"
                    ));
                    stop = true;
                    break;
                }
                if !seen_events.insert(event.clone()) {
                    errs.push(format!("duplicate event {event}  across different policy"));
                    stop = true;
                    break;
                }
            }
            if stop {
                break;
            }
        } else if let Some(code) = exit_code {
            if code == 0 {
                errs.push("0 is not a valid error code".to_string());
                break;
            }
            if !exit_codes.insert(code) {
                errs.push(format!("duplicate exitCode {code}"));
                break;
            }
        }
    }
    if seen_events.contains("*") && seen_events.len() > 1 {
        errs.push("if there's * here, no other policy should be here".to_string());
    }
    if errs.is_empty() {
        None
    } else {
        let events: Vec<String> = VALID_EVENTS.iter().map(|s| s.to_string()).collect();
        let actions: Vec<String> = VALID_ACTIONS.iter().map(|s| s.to_string()).collect();
        Some(format!(
            "{} valid events are {}, valid actions are {};",
            multierror(&errs),
            go_list(&events),
            go_list(&actions)
        ))
    }
}

fn mpi_task_names(job: &Value) -> Option<(String, String)> {
    let args = job.at("/spec/plugins/mpi").and_then(Value::as_array)?;
    let mut master = "master".to_string();
    let mut worker = "worker".to_string();
    for a in args.iter().filter_map(Value::as_str) {
        if let Some(m) = a.strip_prefix("--master=") {
            master = m.to_string();
        }
        if let Some(w) = a.strip_prefix("--worker=") {
            worker = w.to_string();
        }
    }
    Some((master, worker))
}

fn validate_template(task: &Value, index: usize) -> String {
    let empty = json!({});
    let spec = task.at("/template/spec").unwrap_or(&empty);
    let errs = crate::sim::builtin::validate_pod_spec(spec);
    if errs.is_empty() {
        return String::new();
    }
    let mut msg = format!("spec.task[{index}].");
    for e in errs {
        msg.push_str(&format!("template.{e}. "));
    }
    msg
}

fn is_dag(job: &Value) -> bool {
    let mut indegree: BTreeMap<String, usize> = BTreeMap::new();
    let mut edges: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for t in tasks(job) {
        let name = t
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        indegree.entry(name.clone()).or_insert(0);
        if let Some(deps) = t.at("/dependsOn/name").and_then(Value::as_array) {
            for d in deps.iter().filter_map(Value::as_str) {
                edges.entry(d.to_string()).or_default().push(name.clone());
                *indegree.entry(name.clone()).or_insert(0) += 1;
            }
        }
    }
    let total = indegree.len();
    let mut ready: Vec<String> = indegree
        .iter()
        .filter(|(_, d)| **d == 0)
        .map(|(n, _)| n.clone())
        .collect();
    let mut done = 0;
    while let Some(n) = ready.pop() {
        done += 1;
        for next in edges.get(&n).cloned().unwrap_or_default() {
            if let Some(d) = indegree.get_mut(&next) {
                *d -= 1;
                if *d == 0 {
                    ready.push(next);
                }
            }
        }
    }
    done == total
}

/// Volcano's validating webhook for a job being created. `queues` maps queue names to their
/// `status.state`. The error is the denial message, as the webhook returns it.
pub fn validate_job(job: &Value, queues: &BTreeMap<String, String>) -> Result<(), String> {
    let spec = job.get("spec").cloned().unwrap_or(json!({}));
    let job_name = job
        .at("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if int(spec.get("minAvailable")).is_some_and(|m| m < 0) {
        return Err("job 'minAvailable' must be >= 0.".into());
    }
    if int(spec.get("maxRetry")).is_some_and(|m| m < 0) {
        return Err("'maxRetry' cannot be less than zero.".into());
    }
    if int(spec.get("ttlSecondsAfterFinished")).is_some_and(|m| m < 0) {
        return Err("'ttlSecondsAfterFinished' cannot be less than zero.".into());
    }
    let tasks = tasks(job);
    if tasks.is_empty() {
        return Err("No task specified in job spec".into());
    }
    let task_index = |n: &str| {
        tasks
            .iter()
            .position(|t| t.get("name").and_then(Value::as_str) == Some(n))
    };
    if let Some((master, worker)) = mpi_task_names(job) {
        if task_index(&master).is_none() {
            return Err("The specified mpi master task was not found".into());
        }
        if task_index(&worker).is_none() {
            return Err("The specified mpi worker task was not found".into());
        }
    }
    let mut msg = String::new();
    let (total_replicas, has_deps) = check_tasks(job_name, tasks, &mut msg);
    let job_errs = names::qualified_name(job_name);
    if !job_errs.is_empty() {
        msg.push_str(&format!(
            "create job with name {job_name} validate failed {}",
            go_list(&job_errs)
        ));
    }
    if total_replicas < int(spec.get("minAvailable")).unwrap_or(0) {
        msg.push_str(" job 'minAvailable' should not be greater than total replicas in tasks;");
    }
    if let Some(e) = validate_policies(spec.get("policies"), "spec.policies") {
        msg.push_str(&e);
    }
    if let Some(Value::Object(plugins)) = spec.get("plugins") {
        for name in plugins.keys() {
            if !KNOWN_PLUGINS.contains(&name.as_str()) {
                msg.push_str(&format!(" unable to find job plugin: {name};"));
            }
        }
    }
    if let Some(Value::Array(volumes)) = spec.get("volumes") {
        check_volumes(volumes, &mut msg);
    }
    check_queue(&spec, queues, &mut msg);
    if has_deps && !is_dag(job) {
        msg.push_str(
            " job has dependencies between tasks, but doesn't form a directed acyclic graph(DAG);",
        );
    }
    let msg = msg.trim();
    if msg.is_empty() {
        Ok(())
    } else {
        Err(msg.to_string())
    }
}

/// Each task's checks, in Volcano's words, added to `msg` (a duplicated name stops there); returns the
/// total replicas and whether any task depends on another.
fn check_tasks(job_name: &str, tasks: &[Value], msg: &mut String) -> (i64, bool) {
    let mut names = BTreeSet::new();
    let mut total_replicas = 0i64;
    let mut has_deps = false;
    for (index, task) in tasks.iter().enumerate() {
        let name = task.get("name").and_then(Value::as_str).unwrap_or_default();
        let replicas = int(task.get("replicas")).unwrap_or(0);
        if task.get("dependsOn").is_some() {
            has_deps = true;
        }
        if replicas < 0 {
            msg.push_str(&format!(
                " 'replicas' < 0 in task: {name}, job: {job_name};"
            ));
        }
        if let Some(min) = int(task.get("minAvailable")) {
            if min < 0 {
                msg.push_str(&format!(
                    " 'minAvailable' < 0 in task: {name}, job: {job_name};"
                ));
            } else if min > replicas {
                msg.push_str(&format!(
                    " 'minAvailable' is greater than 'replicas' in task: {name}, job: {job_name};"
                ));
            }
        }
        total_replicas += replicas;
        let label_errs = names::dns1123_label(name);
        if !label_errs.is_empty() {
            msg.push_str(&format!(" {};", go_list(&label_errs)));
        }
        if !names.insert(name.to_string()) {
            msg.push_str(&format!(" duplicated task name {name};"));
            break;
        }
        if let Some(e) = validate_policies(task.get("policies"), "spec.tasks.policies") {
            msg.push_str(&e);
        }
        let pod_name = format!("{job_name}-{name}-{index}");
        let pod_errs = names::qualified_name(&pod_name);
        if !pod_errs.is_empty() {
            msg.push_str(&format!(
                "create pod with name {pod_name} validate failed {};",
                go_list(&pod_errs)
            ));
        }
        msg.push_str(&validate_template(task, index));
    }
    (total_replicas, has_deps)
}

/// The job's volumes: each needs a mount path, unique, and either a claim to create or an existing
/// claim's name, not both. The first problem is added to `msg`.
fn check_volumes(volumes: &[Value], msg: &mut String) {
    let mut mounts = BTreeSet::new();
    for v in volumes {
        let mount = v
            .get("mountPath")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let claim_name = v
            .get("volumeClaimName")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let claim = v.get("volumeClaim");
        if mount.is_empty() {
            msg.push_str(" mountPath is required;");
            break;
        }
        if !mounts.insert(mount.to_string()) {
            msg.push_str(&format!(" duplicated mountPath: {mount};"));
            break;
        }
        if claim.is_none() && claim_name.is_empty() {
            msg.push_str(" either VolumeClaim or VolumeClaimName must be specified;");
            break;
        }
        if !claim_name.is_empty() && claim.is_some() {
            msg.push_str("conflict: If you want to use an existing PVC, just specify VolumeClaimName.If you want to create a new PVC, you do not need to specify VolumeClaimName");
            break;
        }
    }
}

/// The job's queue must exist and be `Open`.
fn check_queue(spec: &Value, queues: &BTreeMap<String, String>, msg: &mut String) {
    let queue = spec
        .get("queue")
        .and_then(Value::as_str)
        .unwrap_or("default");
    match queues.get(queue) {
        None => msg.push_str(&format!(
            " unable to find job queue: queues.scheduling.volcano.sh {queue:?} not found;"
        )),
        Some(state) if state != "Open" => msg.push_str(&format!(
            " can only submit job to queue with state `Open`, queue `{queue}` status is `{state}`;"
        )),
        Some(_) => {}
    }
}

/// Volcano's validating webhook for an update: only `minAvailable`, `maxRetry`, `tasks[*].replicas`,
/// `tasks[*].minAvailable`, `tasks[*].maxRetry` and `priorityClassName` may change under `spec`.
pub fn validate_job_update(old: &Value, new: &Value) -> Result<(), String> {
    let new_tasks = tasks(new);
    let mut total = 0i64;
    for task in new_tasks {
        let name = task.get("name").and_then(Value::as_str).unwrap_or_default();
        let replicas = int(task.get("replicas")).unwrap_or(0);
        if replicas < 0 {
            return Err(format!("'replicas' must be >= 0 in task: {name}"));
        }
        if let Some(min) = int(task.get("minAvailable")) {
            if min < 0 {
                return Err(format!("'minAvailable' must be >= 0 in task: {name}"));
            }
            if min > replicas {
                return Err(format!(
                    "'minAvailable' must be <= 'replicas' in task: {name}"
                ));
            }
        }
        total += replicas;
    }
    let min = int(new.at("/spec/minAvailable")).unwrap_or(0);
    if min > total {
        return Err("job 'minAvailable' must not be greater than total replicas".into());
    }
    if min < 0 {
        return Err("job 'minAvailable' must be >= 0".into());
    }
    if tasks(old).len() != new_tasks.len() {
        return Err("job updates may not add or remove tasks".into());
    }
    // Most updates leave the spec alone (annotations, finalizers): nothing to strip and compare.
    if old.get("spec") == new.get("spec") {
        return Ok(());
    }
    let strip = |job: &Value| -> Value {
        let mut spec = job.get("spec").cloned().unwrap_or(json!({}));
        if let Some(s) = spec.as_object_mut() {
            s.remove("minAvailable");
            s.remove("priorityClassName");
            s.remove("maxRetry");
            if let Some(Value::Array(tasks)) = s.get_mut("tasks") {
                for t in tasks.iter_mut().filter_map(Value::as_object_mut) {
                    t.remove("replicas");
                    t.remove("minAvailable");
                    t.remove("maxRetry");
                }
            }
        }
        spec
    };
    if strip(old) != strip(new) {
        return Err("job updates may not change fields other than `minAvailable`, `maxRetry`, `tasks[*].replicas under spec`, `tasks[*].maxRetry under spec`".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Value {
        json!({
            "metadata": {"name": "j-42", "namespace": "ns"},
            "spec": {
                "minAvailable": 1, "queue": "default", "maxRetry": 0,
                "plugins": {"env": [], "svc": []},
                "tasks": [{"name": "job", "replicas": 1, "template": {"spec": {"containers": [{"name": "user-job", "image": "alpine"}]}}}]
            }
        })
    }

    fn open() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("default".to_string(), "Open".to_string()),
            ("closed".to_string(), "Closed".to_string()),
        ])
    }

    #[test]
    fn mutation_fills_defaults() {
        let mut j = job();
        j["spec"]["minAvailable"] = json!(0);
        j["spec"]["tasks"][0]["replicas"] = json!(3);
        j["spec"]["tasks"]
            .as_array_mut()
            .unwrap()
            .push(json!({"replicas": 2, "minAvailable": 1}));
        mutate_job(&mut j);
        assert_eq!(j["spec"]["maxRetry"], 3);
        assert_eq!(j["spec"]["schedulerName"], "volcano");
        assert_eq!(j["spec"]["tasks"][0]["minAvailable"], 3);
        assert_eq!(j["spec"]["tasks"][1]["name"], "default1");
        assert_eq!(j["spec"]["minAvailable"], 4);
    }

    #[test]
    fn a_good_job_passes() {
        let mut j = job();
        mutate_job(&mut j);
        assert_eq!(validate_job(&j, &open()), Ok(()));
    }

    #[test]
    fn min_available_above_replicas_is_denied() {
        let mut j = job();
        j["spec"]["minAvailable"] = json!(5);
        assert_eq!(
            validate_job(&j, &open()).unwrap_err(),
            "job 'minAvailable' should not be greater than total replicas in tasks;"
        );
    }

    #[test]
    fn duplicate_and_bad_task_names() {
        let mut j = job();
        let t = j["spec"]["tasks"][0].clone();
        j["spec"]["tasks"].as_array_mut().unwrap().push(t);
        assert_eq!(
            validate_job(&j, &open()).unwrap_err(),
            "duplicated task name job;"
        );
        let mut j = job();
        j["spec"]["tasks"][0]["name"] = json!("Job_1");
        let err = validate_job(&j, &open()).unwrap_err();
        assert!(
            err.starts_with("[a lowercase RFC 1123 label must consist of"),
            "{err}"
        );
    }

    #[test]
    fn queue_must_exist_and_be_open() {
        let mut j = job();
        j["spec"]["queue"] = json!("closed");
        assert_eq!(
            validate_job(&j, &open()).unwrap_err(),
            "can only submit job to queue with state `Open`, queue `closed` status is `Closed`;"
        );
        j["spec"]["queue"] = json!("nope");
        assert_eq!(
            validate_job(&j, &open()).unwrap_err(),
            "unable to find job queue: queues.scheduling.volcano.sh \"nope\" not found;"
        );
    }

    #[test]
    fn bad_policies_list_the_valid_ones() {
        let mut j = job();
        j["spec"]["policies"] = json!([{"event": "PodExploded", "action": "AbortJob"}]);
        let err = validate_job(&j, &open()).unwrap_err();
        assert!(err.starts_with("1 error occurred:\n\t* spec.policies: Invalid value: \"PodExploded\": invalid policy event"), "{err}");
        assert!(err.ends_with("valid events are [* PodFailed PodEvicted PodPending Unknown TaskCompleted TaskFailed JobUpdated], valid actions are [AbortJob RestartJob RestartTask RestartPod TerminateJob CompleteJob ResumeJob];"), "{err}");
        j["spec"]["policies"] = json!([{"event": "PodFailed", "action": "Explode"}]);
        assert!(
            validate_job(&j, &open())
                .unwrap_err()
                .contains("Invalid value: \"Explode\": invalid policy action")
        );
        j["spec"]["policies"] = json!([{"exitCode": 0, "action": "AbortJob"}]);
        assert!(
            validate_job(&j, &open())
                .unwrap_err()
                .contains("0 is not a valid error code")
        );
        j["spec"]["policies"] = json!([{"event": "PodFailed", "action": "AbortJob"}, {"exitCode": 3, "action": "RestartJob"}]);
        assert_eq!(validate_job(&j, &open()), Ok(()));
    }

    #[test]
    fn unknown_plugin_and_long_pod_name() {
        let mut j = job();
        j["spec"]["plugins"] = json!({"teleport": []});
        assert_eq!(
            validate_job(&j, &open()).unwrap_err(),
            "unable to find job plugin: teleport;"
        );
        let mut j = job();
        j["metadata"]["name"] = json!("j".repeat(60));
        let err = validate_job(&j, &open()).unwrap_err();
        assert!(err.starts_with(&format!("create pod with name {}-job-0 validate failed [name part must be no more than 63 characters]", "j".repeat(60))), "{err}");
    }

    #[test]
    fn template_without_image_is_denied() {
        let mut j = job();
        j["spec"]["tasks"][0]["template"]["spec"]["containers"][0] = json!({"name": "user-job"});
        assert_eq!(
            validate_job(&j, &open()).unwrap_err(),
            "spec.task[0].template.spec.containers[0].image: Required value."
        );
    }

    #[test]
    fn updates_may_only_scale() {
        let old = job();
        let mut scaled = job();
        scaled["spec"]["tasks"][0]["replicas"] = json!(2);
        assert_eq!(validate_job_update(&old, &scaled), Ok(()));
        let mut changed = job();
        changed["spec"]["queue"] = json!("other");
        assert!(
            validate_job_update(&old, &changed)
                .unwrap_err()
                .starts_with("job updates may not change fields")
        );
        let mut annotated = job();
        annotated["metadata"]["annotations"] = json!({"ucloud.dk/expiry": "1"});
        assert_eq!(validate_job_update(&old, &annotated), Ok(()));
    }
}
