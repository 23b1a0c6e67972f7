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
use crate::sim::encode::ObjectKey;
use crate::sim::quantity::Resources;

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

/// A policy's action with the task and pod whose event triggered it (`pod` empty for a task event).
type Trigger = (String, String, String);

/// The phases after which a job's pods are all stopped.
fn is_terminal(phase: &str) -> bool {
    matches!(phase, "Completed" | "Failed" | "Terminated" | "Aborted")
}

/// The task a pod belongs to, from its `volcano.sh/task-spec` label.
fn task_of(pod: &Value) -> &str {
    pod.at("/metadata/labels/volcano.sh~1task-spec")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// What one pass of the controller reads once about a job and passes to each of its steps.
struct Look<'a> {
    job: &'a Value,
    ns: &'a str,
    /// The job's pods now (owned by this incarnation of the job: same uid).
    pods: &'a [std::sync::Arc<Value>],
    /// The job has a deletion timestamp: it only goes towards `Terminating`.
    deleting: bool,
}

/// Where the job goes in this pass: its phase before and after, why, and the counters that move with it.
struct Transition {
    from: String,
    phase: String,
    reason: String,
    retry: i64,
    version: i64,
}

impl Transition {
    fn from_status(phase: &str, status: &Value) -> Self {
        Self {
            from: phase.to_string(),
            phase: phase.to_string(),
            reason: String::new(),
            retry: int(status.get("retryCount")),
            version: int(status.get("version")),
        }
    }

    /// Pending → Running once the gang has started; Running → Completed or Failed once every pod has
    /// ended (or `minSuccess` pods have succeeded), judged by `minAvailable` per task and per job.
    fn follow_pods(&mut self, job: &Value, counts: &Counts) {
        let min_available = int(job.at("/spec/minAvailable"));
        let total_replicas: i64 = tasks(job).iter().map(|t| int(t.get("replicas"))).sum();
        match self.phase.as_str() {
            "Pending"
                if min_available <= counts.running + counts.succeeded + counts.failed
                    && total_replicas > 0 =>
            {
                self.phase = "Running".into();
            }
            "Running" => {
                let min_success = job.at("/spec/minSuccess").and_then(Value::as_i64);
                if min_success.is_some_and(|m| counts.succeeded >= m) {
                    self.phase = "Completed".into();
                } else if total_replicas > 0 && counts.succeeded + counts.failed == total_replicas {
                    let mut failed_task = false;
                    for t in tasks(job) {
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
                    self.phase = if failed_task
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
    }
}

/// Counts the pods by phase (Volcano's status counters) and remembers each one's phase; the first pod that
/// failed or is newly pending since the last look, and has a policy for that event, triggers its action.
fn count_pods(
    job: &Value,
    pods: &[std::sync::Arc<Value>],
    mem: &mut JobMemory,
) -> (Counts, Option<Trigger>) {
    let mut counts = Counts::default();
    let mut action: Option<Trigger> = None;
    for pod in pods {
        let name = name_of(pod).to_string();
        let task = task_of(pod).to_string();
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
            if let Some(a) = policy_action(job, &task, "PodFailed", code) {
                action = Some((a, task.clone(), name.clone()));
            }
        }
        if pod_phase == "Pending"
            && before.is_none()
            && action.is_none()
            && let Some(a) = policy_action(job, &task, "PodPending", None)
        {
            action = Some((a, task.clone(), name.clone()));
        }
    }
    (counts, action)
}

/// Forgets the pods that are gone; one that vanished while the job was active, had not ended and was not
/// killed by the controller was evicted, and the first such with a `PodEvicted` policy triggers it.
fn vanished_pods(
    job: &Value,
    pods: &[std::sync::Arc<Value>],
    phase: &str,
    mem: &mut JobMemory,
) -> Option<Trigger> {
    let job_name = name_of(job);
    let present: BTreeSet<&str> = pods.iter().map(|p| name_of(p)).collect();
    let vanished: Vec<String> = mem
        .seen
        .keys()
        .filter(|n| !present.contains(n.as_str()))
        .cloned()
        .collect();
    let mut action = None;
    for name in vanished {
        let last = mem.seen.remove(&name).unwrap_or_default();
        let killed = mem.killed.remove(&name);
        if !killed
            && ACTIVE_PHASES.contains(&phase)
            && last != "Succeeded"
            && last != "Failed"
            && action.is_none()
        {
            let task = name
                .strip_prefix(&format!("{job_name}-"))
                .and_then(|r| r.rsplit_once('-'))
                .map(|(t, _)| t.to_string())
                .unwrap_or_default();
            if let Some(a) = policy_action(job, &task, "PodEvicted", None) {
                action = Some((a, task, name.clone()));
            }
        }
    }
    action
}

/// The first task whose replicas have all succeeded for the first time, if it has a `TaskCompleted` policy.
fn completed_task(job: &Value, counts: &Counts, mem: &mut JobMemory) -> Option<Trigger> {
    for t in tasks(job) {
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
            && let Some(a) = policy_action(job, task, "TaskCompleted", None)
        {
            return Some((a, task.to_string(), String::new()));
        }
    }
    None
}

/// The job's status with this pass's transition and pod counters written in (a condition per new phase,
/// `runningDuration` once it ends); stored only when it changed.
fn write_job_status(
    core: &mut Core,
    key: &ObjectKey,
    job: &Value,
    mut status: Value,
    step: &Transition,
    counts: &Counts,
    mem: &mut JobMemory,
) {
    let now = format_time(core.now);
    if step.phase != step.from {
        status["state"] = json!({"phase": step.phase, "lastTransitionTime": now});
        if !step.reason.is_empty() {
            status["state"]["reason"] = json!(step.reason);
        }
        let conds = status
            .as_object_mut()
            .expect("status object")
            .entry("conditions")
            .or_insert_with(|| json!([]));
        if let Value::Array(list) = conds {
            list.push(json!({"status": step.phase, "lastTransitionTime": now}));
        }
        if step.phase == "Running" {
            mem.running_since = Some(core.now);
        }
        if is_terminal(&step.phase)
            && let Some(since) = mem.running_since
        {
            status["runningDuration"] =
                json!(go_duration(core.now.duration_since(since).as_secs()));
        }
    }
    status["minAvailable"] = json!(int(job.at("/spec/minAvailable")));
    status["version"] = json!(step.version);
    status["retryCount"] = json!(step.retry);
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
    super::svc::release_when_finished(core, job, ttl_applies(&step.phase), &mut status);
    if job.get("status") != Some(&status) {
        core.replace_status(key, status);
    }
}

/// PodGroup counters: worked out on a copy of the group's status alone, and written only when they
/// change (most reconciles change nothing there). A job that finished (`ended`: completed, failed or
/// terminated) loses its PodGroup, as Volcano's `killJob` deletes it: a kept job's group would be
/// watched and listed by every scheduler and monitor for the job's whole retention. An aborted job
/// keeps it (a `ResumeJob` takes the job back).
fn write_podgroup_status(core: &mut Core, pg_key: &ObjectKey, counts: &Counts, ended: bool) {
    let Some(pg) = core.store.get(pg_key) else {
        return;
    };
    if ended {
        core.delete_key(pg_key, None, None);
        return;
    }
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
    if current != Some(&pg_status) {
        core.replace_status(pg_key, pg_status);
    }
}

impl Model {
    /// Brings a job (and its PodGroup, plugin objects and pods) in line with its spec and its pods, in
    /// the order of Volcano's job controller: observe the pods, execute a command or a policy's action,
    /// move the phase, stop or create pods, then write the job's and the PodGroup's status.
    pub(super) fn reconcile_job(&mut self, core: &mut Core, key: &ObjectKey) {
        let Some(job) = core.store.get(key) else {
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
        let status = self.status_or_initiate(core, &job);
        let phase = status
            .at("/state/phase")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let pods = self.owned_pods(core, key, &uid);
        let look = Look {
            job: &job,
            ns: &key.namespace,
            pods: &pods,
            deleting: job.at("/metadata/deletionTimestamp").is_some(),
        };

        let (counts, mut trigger) = count_pods(&job, &pods, &mut mem);
        let evicted = vanished_pods(&job, &pods, &phase, &mut mem);
        trigger = trigger.or(evicted);
        if trigger.is_none() {
            trigger = completed_task(&job, &counts, &mut mem);
        }
        let command = self.next_command(key).filter(|_| !look.deleting);

        let mut step = Transition::from_status(&phase, &status);
        self.execute_action(
            core,
            &look,
            &mut mem,
            command.as_deref(),
            trigger,
            &mut step,
        );
        if look.deleting && !matches!(step.phase.as_str(), "Terminating" | "Terminated") {
            step.phase = "Terminating".into();
        }
        step.follow_pods(&job, &counts);
        self.stop_pods(core, &look, &mut mem, &mut step);

        let pg_key = core.key_of(core.ids.podgroups, look.ns, &podgroup_name(&job));
        self.create_pods_if_enqueued(core, &look, &pg_key, &step);
        write_job_status(core, key, &job, status, &step, &counts, &mut mem);
        write_podgroup_status(core, &pg_key, &counts, ttl_applies(&step.phase));
        self.schedule_ttl(core, key, &job, &step.phase, &mut mem);
        self.jobs.insert(key.clone(), mem);
    }

    /// The job's status; a job seen for the first time (no phase yet) gets its PodGroup and plugin objects
    /// and starts `Pending`.
    fn status_or_initiate(&mut self, core: &mut Core, job: &Value) -> Value {
        let status = job
            .get("status")
            .cloned()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        if status
            .at("/state/phase")
            .and_then(Value::as_str)
            .is_some_and(|p| !p.is_empty())
        {
            return status;
        }
        self.initiate(core, job);
        let now = format_time(core.now);
        json!({
            "state": {"phase": "Pending", "lastTransitionTime": now},
            "minAvailable": int(job.at("/spec/minAvailable")),
            "version": 0, "retryCount": 0,
            "conditions": [{"status": "Pending", "lastTransitionTime": now}],
            "controlledResources": self.controlled_resources(job),
        })
    }

    /// The pods of this incarnation of the job (owner uid `uid`), shared with the store (read only here:
    /// copying every pod on every look was most of a pass).
    fn owned_pods(&self, core: &Core, key: &ObjectKey, uid: &str) -> Vec<std::sync::Arc<Value>> {
        let pt = core.registry.get(core.ids.pods);
        self.pods_of(key)
            .iter()
            .filter_map(|n| {
                core.store.get(&ObjectKey::new(
                    pt.storage,
                    key.namespace.clone(),
                    n.clone(),
                ))
            })
            .filter(|p| {
                p.at("/metadata/ownerReferences/0/uid")
                    .and_then(Value::as_str)
                    == Some(uid)
            })
            .collect()
    }

    /// A Command's action, one per look (the next one is looked at in the next pass).
    fn next_command(&mut self, key: &ObjectKey) -> Option<String> {
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
        command
    }

    /// Executes a command's action or else a policy's, while the job is active: as in Volcano, the request
    /// that carries an action executes it whatever the event. `ResumeJob` takes an aborted job back.
    fn execute_action(
        &mut self,
        core: &mut Core,
        look: &Look,
        mem: &mut JobMemory,
        command: Option<&str>,
        trigger: Option<Trigger>,
        step: &mut Transition,
    ) {
        let active = ACTIVE_PHASES.contains(&step.from.as_str());
        let by_command = command
            .filter(|a| {
                active
                    && matches!(
                        *a,
                        "AbortJob" | "TerminateJob" | "CompleteJob" | "RestartJob"
                    )
            })
            .map(|a| (a.to_string(), String::new(), String::new(), "command"));
        let chosen = by_command.or_else(|| {
            trigger
                .filter(|_| active && !look.deleting)
                .map(|(a, task, pod)| (a, task, pod, "policy"))
        });
        if command == Some("ResumeJob") && matches!(step.from.as_str(), "Aborting" | "Aborted") {
            // An aborted job starts again as after a restart (its attempts count it).
            step.phase = "Restarting".into();
            step.reason = "ResumeJob by command".into();
            step.retry += 1;
            for p in look.pods {
                self.kill(core, mem, look.ns, name_of(p));
            }
        }
        let Some((a, task, pod, source)) = chosen else {
            return;
        };
        self.event(
            core,
            look.job,
            "Normal",
            "ExecuteAction",
            &format!("Start to execute action {a} "),
            "vc-controller-manager",
        );
        step.reason = format!("{a} by {source}");
        match a.as_str() {
            "AbortJob" => step.phase = "Aborting".into(),
            "TerminateJob" => step.phase = "Terminating".into(),
            "CompleteJob" => step.phase = "Completing".into(),
            "RestartJob" => {
                step.phase = "Restarting".into();
                step.retry += 1;
                for p in look.pods {
                    self.kill(core, mem, look.ns, name_of(p));
                }
            }
            "RestartTask" => {
                for p in look.pods.iter().filter(|p| {
                    p.at("/metadata/labels/volcano.sh~1task-spec")
                        .and_then(Value::as_str)
                        == Some(task.as_str())
                }) {
                    self.kill(core, mem, look.ns, name_of(p));
                }
            }
            "RestartPod" if !pod.is_empty() => self.kill(core, mem, look.ns, &pod),
            _ => {}
        }
    }

    /// Phases that stop pods, and the ones that follow when they are gone: a restart starts the gang
    /// again (a new version, the PodGroup back to Pending) until `maxRetry`.
    fn stop_pods(
        &mut self,
        core: &mut Core,
        look: &Look,
        mem: &mut JobMemory,
        step: &mut Transition,
    ) {
        let active: Vec<&Value> = look
            .pods
            .iter()
            .map(|p| &**p)
            .filter(|p| {
                !matches!(
                    p.at("/status/phase").and_then(Value::as_str),
                    Some("Succeeded" | "Failed")
                )
            })
            .collect();
        match step.phase.as_str() {
            "Aborting" | "Terminating" | "Completing" => {
                for p in &active {
                    self.kill(core, mem, look.ns, name_of(p));
                }
                if active.is_empty() && !look.deleting {
                    step.phase = match step.phase.as_str() {
                        "Aborting" => "Aborted",
                        "Terminating" => "Terminated",
                        _ => "Completed",
                    }
                    .into();
                }
            }
            "Restarting" if look.pods.is_empty() => {
                let max_retry = look
                    .job
                    .at("/spec/maxRetry")
                    .and_then(Value::as_i64)
                    .unwrap_or(3);
                if step.retry >= max_retry {
                    step.phase = "Failed".into();
                    step.reason = format!("retried {} times, maxRetry is {max_retry}", step.retry);
                } else {
                    step.phase = "Pending".into();
                    step.version += 1;
                    let pg_key = core.key_of(core.ids.podgroups, look.ns, &podgroup_name(look.job));
                    core.update_internal(&pg_key, |pg| {
                        pg["status"] = json!({"phase": "Pending"});
                    });
                }
            }
            phase if is_terminal(phase) => {
                for p in &active {
                    self.kill(core, mem, look.ns, name_of(p));
                }
            }
            _ => {}
        }
    }

    /// Pods for an enqueued gang: an active job whose PodGroup the scheduler let in gets the replicas it
    /// lacks.
    fn create_pods_if_enqueued(
        &mut self,
        core: &mut Core,
        look: &Look,
        pg_key: &ObjectKey,
        step: &Transition,
    ) {
        let pg_phase = core.store.get(pg_key).and_then(|pg| {
            pg.at("/status/phase")
                .and_then(Value::as_str)
                .map(String::from)
        });
        if ACTIVE_PHASES.contains(&step.phase.as_str())
            && !look.deleting
            && matches!(pg_phase.as_deref(), Some("Inqueue" | "Running"))
        {
            let present: BTreeSet<String> =
                look.pods.iter().map(|p| name_of(p).to_string()).collect();
            self.create_missing_pods(core, look.job, &present, step.version);
        }
    }

    /// `ttlSecondsAfterFinished`: a timer, set once, that deletes the job that long after it finished.
    fn schedule_ttl(
        &mut self,
        core: &Core,
        key: &ObjectKey,
        job: &Value,
        phase: &str,
        mem: &mut JobMemory,
    ) {
        if ttl_applies(phase)
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
                    uid: mem.uid.clone(),
                },
            );
        }
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
        let (labels, annotations) = pod_labels(job, &template, task_name, index, queue, version);
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
        let svc_map = has_plugin(job, "svc").then(|| {
            extra_env.extend(svc_plugin(&mut spec, &name, job_name, all_tasks));
            format!("{job_name}-svc")
        });
        into_containers(&mut spec, &extra_env, svc_map.as_deref());
        json!({
            "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations,
                         "ownerReferences": controller_ref(job)},
            "spec": spec,
            "status": {"phase": "Pending"},
        })
    }
}

/// The template's labels and annotations with the ones Volcano's job controller adds to every pod.
fn pod_labels(
    job: &Value,
    template: &Value,
    task_name: &str,
    index: i64,
    queue: &str,
    version: i64,
) -> (Value, Value) {
    let ns = crate::sim::api::namespace_of(job);
    let job_name = name_of(job);
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
    (labels, annotations)
}

/// The svc plugin's part of a pod: its hostname and subdomain (unless the template sets them) and the
/// hosts ConfigMap as a volume; returns the environment variables that read each task's hosts from it.
fn svc_plugin(spec: &mut Value, name: &str, job_name: &str, all_tasks: &[String]) -> Vec<Value> {
    let cm_name = format!("{job_name}-svc");
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
    let mut env = Vec::new();
    for t in all_tasks {
        for var in [
            format!("VC_{}_HOSTS", env_key(t)),
            format!("VC_{}_NUM", env_key(t)),
        ] {
            env.push(json!({"name": var, "valueFrom": {"configMapKeyRef": {"name": cm_name, "key": var}}}));
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
    env
}

/// Adds `extra_env` to every container and init container, and mounts the svc plugin's ConfigMap
/// `svc_map` at `/etc/volcano` when there is one.
fn into_containers(spec: &mut Value, extra_env: &[Value], svc_map: Option<&str>) {
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
                if let Some(cm_name) = svc_map {
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
