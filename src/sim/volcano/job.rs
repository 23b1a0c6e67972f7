//! The Volcano job controller: PodGroup and plugin objects on first sight, pods once the PodGroup is
//! enqueued, status counters, lifecycle policies (events and exit codes mapped to actions), and the
//! phase state machine (Pending → Running → Completed/Failed, Aborting, Terminating, Restarting, ...).

use crate::sim::json::JsonPath;
use jiff::SignedDuration;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet};

use super::nodes::pod_requests;
use super::{JobMemory, Model, Timer, podgroup_name};
use crate::sim::api::{Core, name_of};
use crate::sim::clock::format_time;
use crate::sim::quantity::Resources;
use crate::sim::store::ObjectKey;

const ACTIVE_PHASES: &[&str] = &["Pending", "Running"];

/// The phases after which Volcano's garbage collector counts `ttlSecondsAfterFinished`: not `Aborted`,
/// which a `ResumeJob` command can take back.
pub(super) fn ttl_applies(phase: &str) -> bool {
    matches!(phase, "Completed" | "Failed" | "Terminated")
}

/// `%s-%s-%d`: the pod name Volcano gives task `task`'s replica `index`.
pub fn pod_name(job: &str, task: &str, index: i64) -> String {
    format!("{job}-{task}-{index}")
}

/// Go's `time.Duration.String()` for whole seconds: `1h2m3s`, `45s`, `0s`.
fn go_duration(secs: i64) -> String {
    let secs = secs.max(0);
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

fn env_key(task: &str) -> String {
    task.replace('-', "_").to_uppercase()
}

fn int(v: Option<&Value>) -> i64 {
    v.and_then(Value::as_i64).unwrap_or(0)
}

fn tasks(job: &Value) -> &[Value] {
    job.at("/spec/tasks")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn has_plugin(job: &Value, name: &str) -> bool {
    job.at("/spec/plugins")
        .and_then(Value::as_object)
        .is_some_and(|p| p.contains_key(name))
}

fn plugin_args(job: &Value, name: &str) -> Vec<String> {
    job.at(&format!("/spec/plugins/{name}"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn controller_ref(job: &Value) -> Value {
    json!([{
        "apiVersion": job["apiVersion"], "kind": "Job", "name": name_of(job),
        "uid": job.at("/metadata/uid"), "controller": true, "blockOwnerDeletion": true
    }])
}

/// The svc plugin's host file: `<task>.host`, `VC_<TASK>_HOSTS`, `VC_<TASK>_NUM` per task.
pub fn svc_hosts(job: &Value) -> BTreeMap<String, String> {
    let job_name = name_of(job);
    let mut out = BTreeMap::new();
    for t in tasks(job) {
        let task = t["name"].as_str().unwrap_or_default();
        let replicas = int(t.get("replicas"));
        let fixed_host = t
            .at("/template/spec/hostname")
            .and_then(Value::as_str)
            .filter(|h| !h.is_empty());
        let subdomain = t
            .at("/template/spec/subdomain")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .unwrap_or(job_name);
        let mut hosts = Vec::new();
        for i in 0..replicas {
            let host = fixed_host
                .map(String::from)
                .unwrap_or_else(|| pod_name(job_name, task, i));
            hosts.push(format!("{host}.{subdomain}"));
            if fixed_host.is_some() {
                break;
            }
        }
        let key = task.replace('-', "_");
        out.insert(format!("{key}.host"), hosts.join("\n"));
        out.insert(format!("VC_{}_HOSTS", env_key(task)), hosts.join(","));
        out.insert(format!("VC_{}_NUM", env_key(task)), hosts.len().to_string());
    }
    out
}

/// The policy action for an event (or exit code) of a pod of `task`: task policies first, then job ones.
fn policy_action(job: &Value, task: &str, event: &str, exit_code: Option<i64>) -> Option<String> {
    let matches = |policies: Option<&Value>| -> Option<String> {
        for p in policies.and_then(Value::as_array).into_iter().flatten() {
            let mut events: Vec<&str> = p
                .get("events")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            if let Some(e) = p.get("event").and_then(Value::as_str) {
                events.push(e);
            }
            if !events.is_empty() && (events.contains(&event) || events.contains(&"*")) {
                return p.get("action").and_then(Value::as_str).map(String::from);
            }
            if let (Some(code), Some(want)) = (exit_code, p.get("exitCode").and_then(Value::as_i64))
                && code == want
            {
                return p.get("action").and_then(Value::as_str).map(String::from);
            }
        }
        None
    };
    let task_spec = tasks(job).iter().find(|t| t["name"].as_str() == Some(task));
    task_spec
        .and_then(|t| matches(t.get("policies")))
        .or_else(|| matches(job.at("/spec/policies")))
        .filter(|a| a != "SyncJob")
}

#[derive(Debug, Default)]
struct Counts {
    pending: i64,
    running: i64,
    succeeded: i64,
    failed: i64,
    terminating: i64,
    unknown: i64,
    by_task: BTreeMap<String, BTreeMap<String, i64>>,
}

impl Model {
    /// Brings a job (and its PodGroup, plugin objects and pods) in line with its spec and its pods.
    pub(super) fn reconcile_job(&mut self, core: &mut Core, key: &ObjectKey) {
        let Some(job) = core.store.get(key).cloned() else {
            self.jobs.remove(key);
            self.commands.remove(key);
            return;
        };
        let uid = job
            .at("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let mut mem = self
            .jobs
            .remove(key)
            .filter(|m| m.uid == uid)
            .unwrap_or_else(|| JobMemory {
                uid: uid.clone(),
                ..Default::default()
            });
        let now = format_time(core.now);
        let mut status = job
            .get("status")
            .cloned()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        let mut phase = status
            .at("/state/phase")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let deleting = job.at("/metadata/deletionTimestamp").is_some();
        let job_name = name_of(&job).to_string();
        let ns = key.namespace.clone();
        let min_available = int(job.at("/spec/minAvailable"));
        let total_replicas: i64 = tasks(&job).iter().map(|t| int(t.get("replicas"))).sum();

        if phase.is_empty() {
            self.initiate(core, &job);
            phase = "Pending".into();
            status = json!({
                "state": {"phase": "Pending", "lastTransitionTime": now},
                "minAvailable": min_available,
                "version": 0, "retryCount": 0,
                "conditions": [{"status": "Pending", "lastTransitionTime": now}],
                "controlledResources": self.controlled_resources(&job),
            });
        }

        // Pods and what happened to them since the last look.
        let pt = core.registry.get(core.ids.pods);
        let pod_names = self.pods_of(key);
        // Shared with the store (read only here): copying every pod on every look was most of it.
        let pods: Vec<std::sync::Arc<Value>> = pod_names
            .iter()
            .filter_map(|n| {
                core.store
                    .get(&ObjectKey::new(pt.storage, ns.clone(), n.clone()))
                    .cloned()
            })
            .filter(|p| {
                p.at("/metadata/ownerReferences/0/uid")
                    .and_then(Value::as_str)
                    == Some(uid.as_str())
            })
            .collect();
        let mut counts = Counts::default();
        let mut action: Option<(String, String, String)> = None; // (action, task, pod)
        let present: BTreeSet<String> = pods.iter().map(|p| name_of(p).to_string()).collect();
        for pod in &pods {
            let name = name_of(pod).to_string();
            let task = pod
                .at("/metadata/labels/volcano.sh~1task-spec")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let pod_phase = pod
                .at("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("Pending")
                .to_string();
            let terminating = pod.at("/metadata/deletionTimestamp").is_some();
            let bucket = if terminating && pod_phase != "Succeeded" && pod_phase != "Failed" {
                "Terminating"
            } else {
                pod_phase.as_str()
            };
            match bucket {
                "Pending" => counts.pending += 1,
                "Running" => counts.running += 1,
                "Succeeded" => counts.succeeded += 1,
                "Failed" => counts.failed += 1,
                "Terminating" => counts.terminating += 1,
                _ => counts.unknown += 1,
            }
            *counts
                .by_task
                .entry(task.clone())
                .or_default()
                .entry(pod_phase.clone())
                .or_insert(0) += 1;
            let before = mem.seen.insert(name.clone(), pod_phase.clone());
            if pod_phase == "Failed" && before.as_deref() != Some("Failed") && action.is_none() {
                let code = pod
                    .at("/status/containerStatuses")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.at("/state/terminated/exitCode").and_then(Value::as_i64))
                    .find(|c| *c != 0);
                if let Some(a) = policy_action(&job, &task, "PodFailed", code) {
                    action = Some((a, task.clone(), name.clone()));
                }
            }
            if pod_phase == "Pending"
                && before.is_none()
                && action.is_none()
                && let Some(a) = policy_action(&job, &task, "PodPending", None)
            {
                action = Some((a, task.clone(), name.clone()));
            }
        }
        let vanished: Vec<String> = mem
            .seen
            .keys()
            .filter(|n| !present.contains(*n))
            .cloned()
            .collect();
        for name in vanished {
            let last = mem.seen.remove(&name).unwrap_or_default();
            let killed = mem.killed.remove(&name);
            if !killed
                && ACTIVE_PHASES.contains(&phase.as_str())
                && last != "Succeeded"
                && last != "Failed"
                && action.is_none()
            {
                let task = name
                    .strip_prefix(&format!("{job_name}-"))
                    .and_then(|r| r.rsplit_once('-'))
                    .map(|(t, _)| t.to_string())
                    .unwrap_or_default();
                if let Some(a) = policy_action(&job, &task, "PodEvicted", None) {
                    action = Some((a, task, name.clone()));
                }
            }
        }
        if action.is_none() {
            for t in tasks(&job) {
                let task = t["name"].as_str().unwrap_or_default();
                let done = counts
                    .by_task
                    .get(task)
                    .and_then(|m| m.get("Succeeded"))
                    .copied()
                    .unwrap_or(0);
                let replicas = int(t.get("replicas"));
                if replicas > 0
                    && done == replicas
                    && mem.completed_tasks.insert(task.to_string())
                    && let Some(a) = policy_action(&job, task, "TaskCompleted", None)
                {
                    action = Some((a, task.to_string(), String::new()));
                    break;
                }
            }
        }

        // A Command's action, one per look (the next one is looked at in the next pass), before the
        // policies: as in Volcano, the request that carries an action executes it whatever the event.
        let command = self.commands.get_mut(key).and_then(|q| q.pop_front());
        match self.commands.get(key) {
            Some(q) if q.is_empty() => {
                self.commands.remove(key);
            }
            Some(_) => {
                self.dirty_jobs.insert(key.clone());
            }
            None => {}
        }
        let command = command.filter(|_| !deleting);

        // Policy actions.
        let mut retry = int(status.get("retryCount"));
        let mut version = int(status.get("version"));
        let mut new_phase = phase.clone();
        let mut reason = String::new();
        let by_command = command
            .as_deref()
            .filter(|a| {
                ACTIVE_PHASES.contains(&phase.as_str())
                    && matches!(
                        *a,
                        "AbortJob" | "TerminateJob" | "CompleteJob" | "RestartJob"
                    )
            })
            .map(|a| (a.to_string(), String::new(), String::new(), "command"));
        let chosen = by_command.or_else(|| {
            action
                .filter(|_| ACTIVE_PHASES.contains(&phase.as_str()) && !deleting)
                .map(|(a, task, pod)| (a, task, pod, "policy"))
        });
        if command.as_deref() == Some("ResumeJob")
            && matches!(phase.as_str(), "Aborting" | "Aborted")
        {
            // An aborted job starts again as after a restart (its attempts count it).
            new_phase = "Restarting".into();
            reason = "ResumeJob by command".into();
            retry += 1;
            for p in &pods {
                self.kill(core, &mut mem, &ns, name_of(p));
            }
        }
        if let Some((a, task, pod, source)) = chosen {
            self.event(
                core,
                &job,
                "Normal",
                "ExecuteAction",
                &format!("Start to execute action {a} "),
                "vc-controller-manager",
            );
            reason = format!("{a} by {source}");
            match a.as_str() {
                "AbortJob" => new_phase = "Aborting".into(),
                "TerminateJob" => new_phase = "Terminating".into(),
                "CompleteJob" => new_phase = "Completing".into(),
                "RestartJob" => {
                    new_phase = "Restarting".into();
                    retry += 1;
                    for p in &pods {
                        self.kill(core, &mut mem, &ns, name_of(p));
                    }
                }
                "RestartTask" => {
                    for p in pods.iter().filter(|p| {
                        p.at("/metadata/labels/volcano.sh~1task-spec")
                            .and_then(Value::as_str)
                            == Some(task.as_str())
                    }) {
                        self.kill(core, &mut mem, &ns, name_of(p));
                    }
                }
                "RestartPod" if !pod.is_empty() => self.kill(core, &mut mem, &ns, &pod),
                _ => {}
            }
        }
        if deleting && !matches!(new_phase.as_str(), "Terminating" | "Terminated") {
            new_phase = "Terminating".into();
        }

        // The state machine.
        let active: Vec<&Value> = pods
            .iter()
            .map(|p| &**p)
            .filter(|p| {
                !matches!(
                    p.at("/status/phase").and_then(Value::as_str),
                    Some("Succeeded" | "Failed")
                )
            })
            .collect();
        match new_phase.as_str() {
            "Pending"
                if min_available <= counts.running + counts.succeeded + counts.failed
                    && total_replicas > 0 =>
            {
                new_phase = "Running".into();
            }
            "Running" => {
                let min_success = job.at("/spec/minSuccess").and_then(Value::as_i64);
                if min_success.is_some_and(|m| counts.succeeded >= m) {
                    new_phase = "Completed".into();
                } else if total_replicas > 0 && counts.succeeded + counts.failed == total_replicas {
                    let mut failed_task = false;
                    for t in tasks(&job) {
                        if let Some(tm) = t.get("minAvailable").and_then(Value::as_i64) {
                            let ok = counts
                                .by_task
                                .get(t["name"].as_str().unwrap_or_default())
                                .and_then(|m| m.get("Succeeded"))
                                .copied()
                                .unwrap_or(0);
                            if ok < tm {
                                failed_task = true;
                            }
                        }
                    }
                    new_phase = if failed_task
                        || min_success.is_some_and(|m| counts.succeeded < m)
                        || counts.succeeded < min_available
                    {
                        "Failed".into()
                    } else {
                        "Completed".into()
                    };
                }
            }
            _ => {}
        }
        // Phases that stop pods, and the ones that follow when they are gone.
        match new_phase.as_str() {
            "Aborting" | "Terminating" | "Completing" => {
                for p in &active {
                    self.kill(core, &mut mem, &ns, name_of(p));
                }
                if active.is_empty() && !deleting {
                    new_phase = match new_phase.as_str() {
                        "Aborting" => "Aborted",
                        "Terminating" => "Terminated",
                        _ => "Completed",
                    }
                    .into();
                }
            }
            "Restarting" if pods.is_empty() => {
                let max_retry = job
                    .at("/spec/maxRetry")
                    .and_then(Value::as_i64)
                    .unwrap_or(3);
                if retry >= max_retry {
                    new_phase = "Failed".into();
                    reason = format!("retried {retry} times, maxRetry is {max_retry}");
                } else {
                    new_phase = "Pending".into();
                    version += 1;
                    let pg_key = core.key_of(core.ids.podgroups, &ns, &podgroup_name(&job));
                    core.update_internal(&pg_key, |pg| {
                        pg["status"] = json!({"phase": "Pending"});
                    });
                }
            }
            "Completed" | "Failed" | "Terminated" | "Aborted" => {
                for p in &active {
                    self.kill(core, &mut mem, &ns, name_of(p));
                }
            }
            _ => {}
        }

        // Pods for an enqueued gang.
        let pg_key = core.key_of(core.ids.podgroups, &ns, &podgroup_name(&job));
        let pg_phase = core.store.get(&pg_key).and_then(|pg| {
            pg.at("/status/phase")
                .and_then(Value::as_str)
                .map(String::from)
        });
        if ACTIVE_PHASES.contains(&new_phase.as_str())
            && !deleting
            && matches!(pg_phase.as_deref(), Some("Inqueue" | "Running"))
        {
            self.create_missing_pods(core, &job, &present, version);
        }

        // Status.
        let terminal = matches!(
            new_phase.as_str(),
            "Completed" | "Failed" | "Terminated" | "Aborted"
        );
        if new_phase != phase {
            status["state"] = json!({"phase": new_phase, "lastTransitionTime": now});
            if !reason.is_empty() {
                status["state"]["reason"] = json!(reason);
            }
            let conds = status
                .as_object_mut()
                .expect("status object")
                .entry("conditions")
                .or_insert_with(|| json!([]));
            if let Value::Array(list) = conds {
                list.push(json!({"status": new_phase, "lastTransitionTime": now}));
            }
            if new_phase == "Running" {
                mem.running_since = Some(core.now);
            }
            if terminal && let Some(since) = mem.running_since {
                status["runningDuration"] =
                    json!(go_duration(core.now.duration_since(since).as_secs()));
            }
        }
        status["minAvailable"] = json!(min_available);
        status["version"] = json!(version);
        status["retryCount"] = json!(retry);
        for (k, v) in [
            ("pending", counts.pending),
            ("running", counts.running),
            ("succeeded", counts.succeeded),
            ("failed", counts.failed),
            ("terminating", counts.terminating),
            ("unknown", counts.unknown),
        ] {
            if v > 0 {
                status[k] = json!(v);
            } else if let Some(o) = status.as_object_mut() {
                o.remove(k);
            }
        }
        let by_task: Map<String, Value> = counts
            .by_task
            .iter()
            .map(|(t, m)| (t.clone(), json!({"phase": m})))
            .collect();
        if by_task.is_empty() {
            if let Some(o) = status.as_object_mut() {
                o.remove("taskStatusCount");
            }
        } else {
            status["taskStatusCount"] = Value::Object(by_task);
        }
        super::svc::release_when_finished(core, &job, &new_phase, &mut status);
        if job.get("status") != Some(&status) {
            core.update_internal(key, |j| j["status"] = status.clone());
        }

        // PodGroup counters, and completion: worked out on a copy of the group's status alone, and
        // written only when they change (most reconciles change nothing there).
        if let Some(pg) = core.store.get(&pg_key).cloned() {
            let current = pg.get("status");
            let mut pg_status = current
                .filter(|s| s.is_object())
                .cloned()
                .unwrap_or_else(|| json!({"phase": "Pending"}));
            for (k, v) in [
                ("running", counts.running),
                ("succeeded", counts.succeeded),
                ("failed", counts.failed),
            ] {
                if v > 0 {
                    pg_status[k] = json!(v);
                } else if let Some(o) = pg_status.as_object_mut() {
                    o.remove(k);
                }
            }
            if terminal {
                pg_status["phase"] = json!("Completed");
            }
            if current != Some(&pg_status) {
                core.update_internal(&pg_key, |pg| pg["status"] = pg_status);
            }
        }

        // TTL after finishing.
        if ttl_applies(&new_phase)
            && !mem.ttl_set
            && let Some(ttl) = job
                .at("/spec/ttlSecondsAfterFinished")
                .and_then(Value::as_i64)
        {
            mem.ttl_set = true;
            let at = core
                .now
                .saturating_add(SignedDuration::from_secs(ttl.max(0)))
                .unwrap_or(core.now);
            self.timer(
                at,
                Timer::JobTtl {
                    key: key.clone(),
                    uid: uid.clone(),
                },
            );
        }
        self.jobs.insert(key.clone(), mem);
    }

    fn kill(&mut self, core: &mut Core, mem: &mut JobMemory, ns: &str, pod: &str) {
        let pkey = core.key_of(core.ids.pods, ns, pod);
        if core
            .store
            .get(&pkey)
            .is_some_and(|p| p.at("/metadata/deletionTimestamp").is_none())
        {
            mem.killed.insert(pod.to_string());
            core.delete_key(&pkey, None, None);
        }
    }

    fn controlled_resources(&self, job: &Value) -> Value {
        let mut m = Map::new();
        for p in ["env", "svc"] {
            if has_plugin(job, p) {
                m.insert(format!("plugin-{p}"), json!(p));
            }
        }
        Value::Object(m)
    }

    /// First sight of a job: its PodGroup and the svc plugin's Service, ConfigMap and NetworkPolicy.
    fn initiate(&mut self, core: &mut Core, job: &Value) {
        let ns = crate::sim::api::namespace_of(job).to_string();
        let job_name = name_of(job).to_string();
        let min_available = int(job.at("/spec/minAvailable"));
        let mut min_task = Map::new();
        let mut min_res = Resources::default();
        let mut left = min_available;
        for t in tasks(job) {
            let name = t["name"].as_str().unwrap_or_default().to_string();
            if let Some(m) = t.get("minAvailable").and_then(Value::as_i64) {
                min_task.insert(name, json!(m));
            }
            let req = pod_requests(t.at("/template/spec").unwrap_or(&Value::Null));
            for _ in 0..int(t.get("replicas")) {
                if left <= 0 {
                    break;
                }
                min_res.add(&req);
                left -= 1;
            }
        }
        let mut pg_spec = json!({
            "minMember": min_available,
            "minTaskMember": min_task,
            "queue": job.at("/spec/queue").and_then(Value::as_str).unwrap_or("default"),
            "minResources": min_res.to_json(),
        });
        if let Some(p) = job.at("/spec/priorityClassName") {
            pg_spec["priorityClassName"] = p.clone();
        }
        let pg = json!({
            "metadata": {"name": podgroup_name(job), "namespace": ns, "ownerReferences": controller_ref(job),
                         "annotations": {}, "labels": {"volcano.sh/job-namespace": ns}},
            "spec": pg_spec,
            "status": {"phase": "Pending"},
        });
        let _ = core.create_internal(core.ids.podgroups, &ns, pg);
        if has_plugin(job, "svc") {
            let args = plugin_args(job, "svc");
            let selector = json!({"volcano.sh/job-name": job_name, "volcano.sh/job-namespace": ns});
            let data: Map<String, Value> = svc_hosts(job)
                .into_iter()
                .map(|(k, v)| (k, json!(v)))
                .collect();
            let _ = core.create_internal(
                core.ids.configmaps,
                &ns,
                json!({"metadata": {"name": format!("{job_name}-svc"), "namespace": ns, "ownerReferences": controller_ref(job)}, "data": data}),
            );
            let _ = core.create_internal(
                core.ids.services,
                &ns,
                json!({"metadata": {"name": job_name, "namespace": ns, "ownerReferences": controller_ref(job)},
                       "spec": {"clusterIP": "None", "selector": selector,
                                "publishNotReadyAddresses": args.iter().any(|a| a == "--publish-not-ready-addresses" || a == "--publish-not-ready-addresses=true")}}),
            );
            if !args
                .iter()
                .any(|a| a == "--disable-network-policy" || a == "--disable-network-policy=true")
            {
                let _ = core.create_internal(
                    core.ids.networkpolicies,
                    &ns,
                    json!({"metadata": {"name": job_name, "namespace": ns, "ownerReferences": controller_ref(job)},
                           "spec": {"podSelector": {"matchLabels": selector},
                                    "ingress": [{"from": [{"podSelector": {"matchLabels": selector}}]}],
                                    "policyTypes": ["Ingress"]}}),
                );
            }
        }
    }

    fn create_missing_pods(
        &mut self,
        core: &mut Core,
        job: &Value,
        present: &BTreeSet<String>,
        version: i64,
    ) {
        let ns = crate::sim::api::namespace_of(job).to_string();
        let job_name = name_of(job).to_string();
        let queue = job
            .at("/spec/queue")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        let task_list = tasks(job);
        let all_tasks: Vec<String> = task_list
            .iter()
            .filter_map(|t| t["name"].as_str().map(String::from))
            .collect();
        for t in task_list {
            let task = t["name"].as_str().unwrap_or_default();
            for i in 0..int(t.get("replicas")) {
                let name = pod_name(&job_name, task, i);
                if present.contains(&name) {
                    continue;
                }
                let pod = self.build_pod(job, t, i, &queue, version, &all_tasks);
                let mut errors =
                    crate::sim::builtin::validate(crate::sim::registry::Builtin::Pod, None, &pod);
                for m in crate::sim::names::dns1123_subdomain(&name) {
                    errors.push(crate::sim::error::FieldError::invalid(
                        "metadata.name",
                        &json!(name),
                        m,
                    ));
                }
                if !errors.is_empty() {
                    let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
                    let msg = format!("Pod {name:?} is invalid: [{}]", list.join(", "));
                    self.event(
                        core,
                        job,
                        "Warning",
                        "FailedCreatePodError",
                        &msg,
                        "vc-controller-manager",
                    );
                    continue;
                }
                let _ = core.create_internal(core.ids.pods, &ns, pod);
            }
        }
    }

    /// A pod from a task template, with Volcano's names, labels, annotations and the plugins' changes.
    fn build_pod(
        &self,
        job: &Value,
        task: &Value,
        index: i64,
        queue: &str,
        version: i64,
        all_tasks: &[String],
    ) -> Value {
        let ns = crate::sim::api::namespace_of(job);
        let job_name = name_of(job);
        let task_name = task["name"].as_str().unwrap_or_default();
        let name = pod_name(job_name, task_name, index);
        let template = task.get("template").cloned().unwrap_or_else(|| json!({}));
        let mut labels = template
            .at("/metadata/labels")
            .cloned()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        let mut annotations = template
            .at("/metadata/annotations")
            .cloned()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        for (k, v) in [
            ("volcano.sh/task-spec", task_name.to_string()),
            ("scheduling.k8s.io/group-name", podgroup_name(job)),
            ("volcano.sh/job-name", job_name.to_string()),
            ("volcano.sh/queue-name", queue.to_string()),
            ("volcano.sh/job-version", version.to_string()),
            ("volcano.sh/template-uid", format!("{job_name}-{task_name}")),
            ("volcano.sh/task-index", index.to_string()),
        ] {
            annotations[k] = json!(v);
        }
        for (k, v) in [
            ("volcano.sh/job-name", job_name.to_string()),
            ("volcano.sh/task-spec", task_name.to_string()),
            ("volcano.sh/job-namespace", ns.to_string()),
            ("volcano.sh/queue-name", queue.to_string()),
            ("volcano.sh/task-index", index.to_string()),
        ] {
            labels[k] = json!(v);
        }
        let mut spec = template
            .get("spec")
            .cloned()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        if spec
            .get("schedulerName")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            spec["schedulerName"] = job
                .at("/spec/schedulerName")
                .cloned()
                .unwrap_or(json!("volcano"));
        }
        let mut extra_env: Vec<Value> = Vec::new();
        if has_plugin(job, "env") {
            extra_env.push(json!({"name": "VK_TASK_INDEX", "value": index.to_string()}));
            extra_env.push(json!({"name": "VC_TASK_INDEX", "value": index.to_string()}));
        }
        let svc = has_plugin(job, "svc");
        let cm_name = format!("{job_name}-svc");
        if svc {
            if spec
                .get("hostname")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                spec["hostname"] = json!(name);
            }
            if spec
                .get("subdomain")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                spec["subdomain"] = json!(job_name);
            }
            for t in all_tasks {
                for var in [
                    format!("VC_{}_HOSTS", env_key(t)),
                    format!("VC_{}_NUM", env_key(t)),
                ] {
                    extra_env.push(json!({"name": var, "valueFrom": {"configMapKeyRef": {"name": cm_name, "key": var}}}));
                }
            }
            let volumes = spec
                .as_object_mut()
                .expect("spec object")
                .entry("volumes")
                .or_insert_with(|| json!([]));
            if let Value::Array(v) = volumes {
                v.push(json!({"name": cm_name, "configMap": {"name": cm_name}}));
            }
        }
        for field in ["containers", "initContainers"] {
            if let Some(Value::Array(list)) = spec.get_mut(field) {
                for c in list.iter_mut().filter(|c| c.is_object()) {
                    if !extra_env.is_empty() {
                        let env = c
                            .as_object_mut()
                            .expect("object")
                            .entry("env")
                            .or_insert_with(|| json!([]));
                        if let Value::Array(env) = env {
                            env.extend(extra_env.iter().cloned());
                        }
                    }
                    if svc {
                        let mounts = c
                            .as_object_mut()
                            .expect("object")
                            .entry("volumeMounts")
                            .or_insert_with(|| json!([]));
                        if let Value::Array(m) = mounts {
                            m.push(json!({"name": cm_name, "mountPath": "/etc/volcano"}));
                        }
                    }
                }
            }
        }
        json!({
            "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations,
                         "ownerReferences": controller_ref(job)},
            "spec": spec,
            "status": {"phase": "Pending"},
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_file_per_task() {
        let job = json!({"metadata": {"name": "j-42"}, "spec": {"tasks": [
            {"name": "job", "replicas": 2},
            {"name": "ps-server", "replicas": 1, "template": {"spec": {"hostname": "fixed"}}}
        ]}});
        let h = svc_hosts(&job);
        assert_eq!(h["job.host"], "j-42-job-0.j-42\nj-42-job-1.j-42");
        assert_eq!(h["VC_JOB_HOSTS"], "j-42-job-0.j-42,j-42-job-1.j-42");
        assert_eq!(h["VC_JOB_NUM"], "2");
        assert_eq!(h["ps_server.host"], "fixed.j-42");
        assert_eq!(h["VC_PS_SERVER_NUM"], "1");
    }

    #[test]
    fn policies_task_level_first_then_job_level() {
        let job = json!({"spec": {
            "policies": [{"event": "PodFailed", "action": "AbortJob"}, {"exitCode": 3, "action": "RestartJob"}],
            "tasks": [{"name": "a", "policies": [{"events": ["PodFailed"], "action": "TerminateJob"}]}, {"name": "b"}]
        }});
        assert_eq!(
            policy_action(&job, "a", "PodFailed", Some(1)).as_deref(),
            Some("TerminateJob")
        );
        assert_eq!(
            policy_action(&job, "b", "PodFailed", Some(3)).as_deref(),
            Some("AbortJob")
        );
        assert_eq!(
            policy_action(&job, "b", "PodEvicted", Some(3)).as_deref(),
            Some("RestartJob")
        );
        assert_eq!(policy_action(&job, "b", "PodEvicted", None), None);
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(0), "0s");
        assert_eq!(go_duration(95), "1m35s");
        assert_eq!(go_duration(3723), "1h2m3s");
    }
}
