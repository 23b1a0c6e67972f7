//! The simulated kubelet: binding, image pull (or its failure), init containers, running containers
//! for the time their command says, exit codes, restarts, graceful termination, and the pod log.

use std::sync::Arc;
use std::time::Duration;

use crate::sim::json::JsonPath;
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use super::command::{ContainerPlan, plan};
use super::nodes::pod_requests;
use super::{Model, PodRuntime, Timer};
use crate::sim::api::{Core, name_of, namespace_of};
use crate::sim::clock::format_time;
use crate::sim::encode::ObjectKey;
use crate::sim::error::ApiError;

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The plan of one container spec.
pub fn container_plan(c: &Value, default_run: Duration) -> ContainerPlan {
    plan(
        &strings(c.get("command")),
        &strings(c.get("args")),
        c.get("image").and_then(Value::as_str).unwrap_or_default(),
        default_run,
    )
}

/// The pod's containers of one kind (`containers` or `initContainers`), borrowed from it.
fn containers<'a>(pod: &'a Value, field: &str) -> &'a [Value] {
    pod.get("spec")
        .and_then(|spec| spec.get(field))
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn container_id(uid: &str, name: &str, run: u32) -> String {
    format!("sim://{}-{name}-{run}", &uid[..8.min(uid.len())])
}

fn after(t: Timestamp, d: Duration) -> Timestamp {
    t.saturating_add(SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX))
        .unwrap_or(t)
}

fn condition(ty: &str, status: &str, now: &str) -> Value {
    json!({"type": ty, "status": status, "lastProbeTime": null, "lastTransitionTime": now})
}

pub(super) fn set_condition(pod: &mut Value, cond: Value) {
    let ty = cond["type"].clone();
    let list = pod["status"]
        .as_object_mut()
        .map(|s| s.entry("conditions").or_insert_with(|| json!([])));
    if let Some(Value::Array(list)) = list {
        match list.iter_mut().find(|c| c["type"] == ty) {
            Some(existing) => {
                if existing["status"] != cond["status"]
                    || existing.get("reason") != cond.get("reason")
                {
                    *existing = cond;
                }
            }
            None => list.push(cond),
        }
    }
}

fn backoff(restarts: u32) -> Duration {
    let secs = 10u64.saturating_mul(1u64 << restarts.saturating_sub(1).min(5));
    Duration::from_secs(secs.min(300))
}

impl Model {
    /// Binds a pod to a node: capacity is taken and the kubelet starts it after the start delay.
    pub(super) fn bind(&mut self, core: &mut Core, key: &ObjectKey, node: usize, scheduler: &str) {
        let Some(pod) = core.store.get(key) else {
            return;
        };
        let node_name = self.nodes[node].name.clone();
        let now = format_time(core.now);
        let host_ip = self.nodes[node].host_ip();
        let updated = core.update_internal(key, |p| {
            p["spec"]["nodeName"] = json!(node_name);
            set_condition(p, condition("PodScheduled", "True", &now));
            p["status"]["hostIP"] = json!(host_ip);
            p["status"]["hostIPs"] = json!([{"ip": host_ip}]);
            let waiting = |cs: &[Value], reason: &str| -> Vec<Value> {
                cs.iter()
                    .map(|c| json!({"name": c["name"], "image": c["image"], "imageID": "", "ready": false, "restartCount": 0,
                                    "started": false, "state": {"waiting": {"reason": reason}}}))
                    .collect()
            };
            let init = waiting(containers(p, "initContainers"), "PodInitializing");
            if !init.is_empty() {
                p["status"]["initContainerStatuses"] = json!(init);
            }
            let reason = if p.at("/spec/initContainers").is_some() { "PodInitializing" } else { "ContainerCreating" };
            let main = waiting(containers(p, "containers"), reason);
            p["status"]["containerStatuses"] = json!(main);
        });
        let Some(pod_now) = updated else { return };
        self.adopt(core, key, &pod_now);
        self.event(
            core,
            &pod,
            "Normal",
            "Scheduled",
            &format!(
                "Successfully assigned {}/{} to {node_name}",
                namespace_of(&pod),
                name_of(&pod)
            ),
            scheduler,
        );
    }

    /// Takes on a pod bound to one of the nodes: accounts its requests and schedules its start.
    pub(super) fn adopt(&mut self, core: &mut Core, key: &ObjectKey, pod: &Value) {
        let Some(node_name) = pod.at("/spec/nodeName").and_then(Value::as_str) else {
            return;
        };
        let Some(node) = self.nodes.iter().position(|n| n.name == node_name) else {
            return;
        };
        let uid = pod
            .at("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let requests = pod_requests(&pod["spec"]);
        self.nodes[node].allocated.add(&requests);
        self.nodes[node].settle(key, super::affinity::Resident::of(pod));
        let queue = pod
            .at("/metadata/annotations/volcano.sh~1queue-name")
            .or_else(|| pod.at("/metadata/labels/volcano.sh~1queue-name"))
            .and_then(Value::as_str)
            .map(String::from);
        if let Some(q) = &queue {
            self.queue_alloc
                .entry(q.clone())
                .or_default()
                .add(&requests);
            self.alloc_dirty.insert(q.clone());
        }
        let n = containers(pod, "containers").len();
        self.pods.insert(
            key.clone(),
            PodRuntime {
                uid: uid.clone(),
                node,
                requests,
                queue,
                ip: None,
                released: false,
                terminating: false,
                runs: vec![0; n],
            },
        );
        let at = after(core.now, self.config.pod_start_delay);
        self.timer(
            at,
            Timer::PodStart {
                key: key.clone(),
                uid,
            },
        );
    }

    /// The stored pod (shared, not copied) while it is the one with `uid` and is not being deleted.
    fn live(&self, core: &Core, key: &ObjectKey, uid: &str) -> Option<Arc<Value>> {
        let pod = core.store.get(key)?;
        if pod.at("/metadata/uid").and_then(Value::as_str) != Some(uid) {
            return None;
        }
        if pod.at("/metadata/deletionTimestamp").is_some() {
            return None;
        }
        Some(pod.clone())
    }

    /// Pulls images (or fails to), runs init containers, then starts the main containers.
    pub(super) fn pod_start(&mut self, core: &mut Core, key: &ObjectKey, uid: &str) {
        let Some(pod) = self.live(core, key, uid) else {
            return;
        };
        let marker = self.config.image_pull_failure_marker.clone();
        if let Some(bad) = containers(&pod, "initContainers")
            .iter()
            .chain(containers(&pod, "containers"))
            .find(|c| {
                !marker.is_empty() && c["image"].as_str().is_some_and(|i| i.contains(&marker))
            })
        {
            let image = bad["image"].as_str().unwrap_or_default().to_string();
            self.image_pull_failed(core, key, uid, &pod, &image);
            return;
        }
        let now = format_time(core.now);
        let InitRun {
            ended: t,
            statuses: init_statuses,
            failed: failed_init,
        } = run_init_containers(&pod, uid, core.now);
        core.update_internal(key, |p| {
            p["status"]["startTime"] = json!(now);
            if !init_statuses.is_empty() {
                p["status"]["initContainerStatuses"] = json!(init_statuses);
            }
        });
        if let Some((name, code)) = failed_init {
            if code.is_some() {
                let restart = pod
                    .at("/spec/restartPolicy")
                    .and_then(Value::as_str)
                    .unwrap_or("Always");
                let finished = format_time(t);
                core.update_internal(key, |p| {
                    if restart == "Never" {
                        p["status"]["phase"] = json!("Failed");
                    }
                    set_condition(p, json!({"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized",
                        "message": format!("containers with incomplete status: [{}]", name.as_str().unwrap_or_default()), "lastProbeTime": null, "lastTransitionTime": finished}));
                });
                if restart == "Never" {
                    self.release(core, key, false);
                }
            }
            return;
        }
        self.timer(
            t,
            Timer::MainStart {
                key: key.clone(),
                uid: uid.to_string(),
            },
        );
    }

    /// An image marked to fail its pull: the container waits in `ErrImagePull` with containerd's message,
    /// the kubelet's events are recorded, and the back-off follows ten seconds later.
    fn image_pull_failed(
        &mut self,
        core: &mut Core,
        key: &ObjectKey,
        uid: &str,
        pod: &Value,
        image: &str,
    ) {
        let now = format_time(core.now);
        let message = format!(
            "rpc error: code = NotFound desc = failed to pull and unpack image \"{image}\": failed to resolve reference \"{image}\": {image}: not found"
        );
        core.update_internal(key, |p| {
            p["status"]["startTime"] = json!(now);
            for field in ["initContainerStatuses", "containerStatuses"] {
                if let Some(Value::Array(list)) = p["status"].get_mut(field) {
                    for cs in list {
                        if cs["image"].as_str() == Some(image) {
                            cs["state"] =
                                json!({"waiting": {"reason": "ErrImagePull", "message": message}});
                        }
                    }
                }
            }
        });
        self.event(
            core,
            pod,
            "Normal",
            "Pulling",
            &format!("Pulling image \"{image}\""),
            "kubelet",
        );
        self.event(
            core,
            pod,
            "Warning",
            "Failed",
            &format!("Failed to pull image \"{image}\": {message}"),
            "kubelet",
        );
        self.event(
            core,
            pod,
            "Warning",
            "Failed",
            "Error: ErrImagePull",
            "kubelet",
        );
        let at = after(core.now, Duration::from_secs(10));
        self.timer(
            at,
            Timer::ImagePullBackOff {
                key: key.clone(),
                uid: uid.to_string(),
            },
        );
    }

    /// The main containers start: the pod gets its IP and is Running.
    pub(super) fn main_start(&mut self, core: &mut Core, key: &ObjectKey, uid: &str) {
        let Some(pod) = self.live(core, key, uid) else {
            return;
        };
        let Some(rt) = self.pods.get(key).cloned() else {
            return;
        };
        let ip = match (self.interactive.start(key, &pod), rt.ip) {
            (Some(loopback), _) => Some(loopback.to_string()),
            (None, Some(o)) => Some(format!("10.244.{}.{o}", self.nodes[rt.node].subnet)),
            (None, None) => self.nodes[rt.node].take_ip().map(|(o, ip)| {
                if let Some(r) = self.pods.get_mut(key) {
                    r.ip = Some(o);
                }
                ip
            }),
        };
        let now = format_time(core.now);
        let mut exits = Vec::new();
        let mut statuses = Vec::new();
        for (i, c) in containers(&pod, "containers").iter().enumerate() {
            let p = container_plan(c, self.config.default_run);
            if let Some(d) = p.duration {
                exits.push((i, after(core.now, d)));
            }
            let name = c["name"].as_str().unwrap_or_default();
            statuses.push(json!({"name": name, "image": c["image"], "imageID": format!("sim://{}", c["image"].as_str().unwrap_or_default()),
                "containerID": container_id(uid, name, 1), "ready": true, "started": true, "restartCount": 0,
                "state": {"running": {"startedAt": now}}}));
        }
        core.update_internal(key, |p| {
            p["status"]["phase"] = json!("Running");
            if let Some(ip) = &ip {
                p["status"]["podIP"] = json!(ip);
                p["status"]["podIPs"] = json!([{"ip": ip}]);
            }
            p["status"]["containerStatuses"] = json!(statuses);
            for ty in ["Initialized", "Ready", "ContainersReady"] {
                set_condition(p, condition(ty, "True", &now));
            }
        });
        for c in containers(&pod, "containers") {
            self.event(
                core,
                &pod,
                "Normal",
                "Started",
                &format!(
                    "Started container {}",
                    c["name"].as_str().unwrap_or_default()
                ),
                "kubelet",
            );
        }
        if let Some(r) = self.pods.get_mut(key) {
            r.runs = vec![1; r.runs.len().max(statuses.len())];
        }
        for (i, at) in exits {
            self.timer(
                after(at, self.config.status_report_delay),
                Timer::ContainerExit {
                    key: key.clone(),
                    uid: uid.to_string(),
                    container: i,
                    run: 1,
                },
            );
        }
    }

    /// A container's command finished.
    pub(super) fn container_exit(
        &mut self,
        core: &mut Core,
        key: &ObjectKey,
        uid: &str,
        index: usize,
        run: u32,
    ) {
        let Some(pod) = self.live(core, key, uid) else {
            return;
        };
        if self.pods.get(key).and_then(|r| r.runs.get(index)).copied() != Some(run) {
            return;
        }
        let specs = containers(&pod, "containers");
        let Some(spec) = specs.get(index) else { return };
        let p = container_plan(spec, self.config.default_run);
        let restart_policy = pod
            .at("/spec/restartPolicy")
            .and_then(Value::as_str)
            .unwrap_or("Always")
            .to_string();
        let restarts =
            restart_policy == "Always" || (restart_policy == "OnFailure" && p.exit_code != 0);
        let now = format_time(core.now);
        // Reported now, ended when it really did.
        let ended = format_time(
            jiff::SignedDuration::try_from(self.config.status_report_delay)
                .ok()
                .and_then(|d| core.now.checked_sub(d).ok())
                .unwrap_or(core.now),
        );
        let name = spec["name"].as_str().unwrap_or_default().to_string();
        let pod_name = name_of(&pod).to_string();
        let mut all_done = false;
        let mut all_ok = true;
        core.update_internal(key, |pod| {
            let Some(Value::Array(list)) = pod["status"].get_mut("containerStatuses") else { return };
            let Some(cs) = list.iter_mut().find(|c| c["name"] == name.as_str()) else { return };
            let started = cs.at("/state/running/startedAt").cloned().unwrap_or(json!(now));
            let terminated = json!({"exitCode": p.exit_code, "reason": if p.exit_code == 0 { "Completed" } else { "Error" },
                "startedAt": started, "finishedAt": ended, "containerID": container_id(uid, &name, run)});
            cs["ready"] = json!(false);
            cs["started"] = json!(false);
            if restarts {
                cs["lastState"] = json!({"terminated": terminated});
                let count = cs["restartCount"].as_u64().unwrap_or(0) + 1;
                cs["restartCount"] = json!(count);
                cs["state"] = json!({"waiting": {"reason": "CrashLoopBackOff",
                    "message": format!("back-off {}s restarting failed container={name} pod={}", backoff(count as u32).as_secs(), pod_name)}});
            } else {
                cs["state"] = json!({"terminated": terminated});
            }
            end_tracers(list, &ended);
            all_done = list.iter().all(|c| c.at("/state/terminated").is_some());
            all_ok = list.iter().all(|c| c.at("/state/terminated/exitCode").and_then(Value::as_i64) == Some(0));
            set_condition(pod, json!({"type": "Ready", "status": "False", "reason": if all_done { "PodCompleted" } else { "ContainersNotReady" }, "lastProbeTime": null, "lastTransitionTime": now}));
            set_condition(pod, json!({"type": "ContainersReady", "status": "False", "reason": if all_done { "PodCompleted" } else { "ContainersNotReady" }, "lastProbeTime": null, "lastTransitionTime": now}));
            if all_done {
                pod["status"]["phase"] = json!(if all_ok { "Succeeded" } else { "Failed" });
            }
        });
        // The container stopped: its output wrapper's file is what it wrote.
        if let Some(storage) = &self.config.storage_dir
            && let Some(pod) = core.store.get(key)
        {
            keep_output(storage, &pod, self.config.default_run, core.now);
        }
        if restarts {
            let count = core
                .store
                .get(key)
                .and_then(|p| {
                    p.at("/status/containerStatuses")?
                        .as_array()?
                        .iter()
                        .find(|c| c["name"] == name.as_str())?
                        .get("restartCount")?
                        .as_u64()
                })
                .unwrap_or(1);
            let at = after(core.now, backoff(count as u32));
            self.timer(
                at,
                Timer::ContainerRestart {
                    key: key.clone(),
                    uid: uid.to_string(),
                    container: index,
                },
            );
        } else if all_done {
            self.release(core, key, true);
        }
    }

    /// A crashed (or, under `Always`, finished) container starts again after its back-off.
    pub(super) fn container_restart(
        &mut self,
        core: &mut Core,
        key: &ObjectKey,
        uid: &str,
        index: usize,
    ) {
        let Some(pod) = self.live(core, key, uid) else {
            return;
        };
        let specs = containers(&pod, "containers");
        let Some(spec) = specs.get(index) else { return };
        let Some(rt) = self.pods.get_mut(key) else {
            return;
        };
        if index >= rt.runs.len() {
            rt.runs.resize(index + 1, 0);
        }
        rt.runs[index] += 1;
        let run = rt.runs[index];
        let name = spec["name"].as_str().unwrap_or_default().to_string();
        let now = format_time(core.now);
        core.update_internal(key, |p| {
            if let Some(Value::Array(list)) = p["status"].get_mut("containerStatuses")
                && let Some(cs) = list.iter_mut().find(|c| c["name"] == name.as_str())
            {
                cs["state"] = json!({"running": {"startedAt": now}});
                cs["ready"] = json!(true);
                cs["started"] = json!(true);
                cs["containerID"] = json!(container_id(uid, &name, run));
            }
        });
        if let Some(d) = container_plan(spec, self.config.default_run).duration {
            let at = after(after(core.now, d), self.config.status_report_delay);
            self.timer(
                at,
                Timer::ContainerExit {
                    key: key.clone(),
                    uid: uid.to_string(),
                    container: index,
                    run,
                },
            );
        }
    }

    pub(super) fn image_pull_backoff(&mut self, core: &mut Core, key: &ObjectKey, uid: &str) {
        let Some(pod) = self.live(core, key, uid) else {
            return;
        };
        let mut images = Vec::new();
        core.update_internal(key, |p| {
            for field in ["initContainerStatuses", "containerStatuses"] {
                if let Some(Value::Array(list)) = p["status"].get_mut(field) {
                    for cs in list {
                        if cs.at("/state/waiting/reason").and_then(Value::as_str) == Some("ErrImagePull") {
                            let image = cs["image"].as_str().unwrap_or_default().to_string();
                            cs["state"] = json!({"waiting": {"reason": "ImagePullBackOff", "message": format!("Back-off pulling image \"{image}\"")}});
                            images.push(image);
                        }
                    }
                }
            }
        });
        for image in images {
            self.event(
                core,
                &pod,
                "Normal",
                "BackOff",
                &format!("Back-off pulling image \"{image}\""),
                "kubelet",
            );
        }
    }

    /// A delete request reached a running pod: it stops after the termination delay (at most its grace).
    pub(super) fn begin_termination(&mut self, core: &mut Core, key: &ObjectKey, pod: &Value) {
        let Some(rt) = self.pods.get_mut(key) else {
            return;
        };
        if rt.terminating {
            return;
        }
        rt.terminating = true;
        let uid = rt.uid.clone();
        let deadline = pod
            .at("/metadata/deletionTimestamp")
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<Timestamp>().ok())
            .unwrap_or(core.now);
        let at = after(core.now, self.config.pod_termination_delay).min(deadline.max(core.now));
        for c in containers(pod, "containers") {
            self.event(
                core,
                pod,
                "Normal",
                "Killing",
                &format!(
                    "Stopping container {}",
                    c["name"].as_str().unwrap_or_default()
                ),
                "kubelet",
            );
        }
        self.timer(
            at,
            Timer::PodGone {
                key: key.clone(),
                uid,
            },
        );
    }

    /// Graceful termination is over: the pod object goes away.
    pub(super) fn pod_gone(&mut self, core: &mut Core, key: &ObjectKey, uid: &str) {
        let Some(pod) = core.store.get(key) else {
            return;
        };
        if pod.at("/metadata/uid").and_then(Value::as_str) != Some(uid) {
            return;
        }
        self.release(core, key, true);
        core.delete_key(key, None, Some(0));
    }
}

/// Writes the output wrapper's file of every wrapped container of `pod` ([`super::storage`]), with
/// the container's log up to `now` as [`pod_log`] gives it.
pub(super) fn keep_output(
    storage: &std::path::Path,
    pod: &Value,
    default_run: Duration,
    now: Timestamp,
) {
    super::storage::keep_output(storage, pod, |name| {
        pod_log(pod, name, default_run, now, false, None).ok()
    });
}

/// The log of a pod's container as its command would have written it up to `now`.
pub fn pod_log(
    pod: &Value,
    container: Option<&str>,
    default_run: Duration,
    now: Timestamp,
    timestamps: bool,
    since: Option<Timestamp>,
) -> Result<String, ApiError> {
    let pod_name = name_of(pod);
    let name = match container {
        Some(c) => c.to_string(),
        None => {
            let main = containers(pod, "containers");
            if main.len() != 1 {
                let names: Vec<String> = main
                    .iter()
                    .filter_map(|c| c["name"].as_str().map(String::from))
                    .collect();
                return Err(ApiError::bad_request(format!(
                    "a container name must be specified for pod {pod_name}, choose one of: [{}]",
                    names.join(" ")
                )));
            }
            main[0]["name"].as_str().unwrap_or_default().to_string()
        }
    };
    let Some(spec) = containers(pod, "containers")
        .iter()
        .chain(containers(pod, "initContainers"))
        .find(|c| c["name"].as_str() == Some(name.as_str()))
    else {
        return Err(ApiError::bad_request(format!(
            "container {name} is not valid for pod {pod_name}"
        )));
    };
    let status = ["containerStatuses", "initContainerStatuses"]
        .iter()
        .filter_map(|f| pod.at(&format!("/status/{f}")).and_then(Value::as_array))
        .flatten()
        .find(|c| c["name"].as_str() == Some(name.as_str()));
    let state = status.and_then(|s| s.get("state"));
    let (started, finished) = match state {
        Some(s) if s.get("running").is_some() => (s.at("/running/startedAt"), None),
        Some(s) if s.get("terminated").is_some() => (
            s.at("/terminated/startedAt"),
            s.at("/terminated/finishedAt"),
        ),
        _ => {
            let reason = state
                .and_then(|s| s.at("/waiting/reason"))
                .and_then(Value::as_str)
                .unwrap_or("ContainerCreating");
            let why = if reason.contains("ImagePull") {
                "trying and failing to pull image".to_string()
            } else {
                reason.to_string()
            };
            return Err(ApiError::bad_request(format!(
                "container {name:?} in pod {pod_name:?} is waiting to start: {why}"
            )));
        }
    };
    let parse = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .and_then(|s| s.parse::<Timestamp>().ok())
    };
    let started = parse(started).unwrap_or(now);
    let until = parse(finished).unwrap_or(now).min(now);
    let is_init = containers(pod, "initContainers")
        .iter()
        .any(|c| c["name"].as_str() == Some(name.as_str()));
    let plan = container_plan(spec, if is_init { Duration::ZERO } else { default_run });
    let mut out = String::new();
    for (offset, line) in plan.lines {
        let at = after(started, offset);
        if at > until {
            break;
        }
        if since.is_some_and(|since| at < since) {
            continue;
        }
        if timestamps {
            out.push_str(&at.strftime("%Y-%m-%dT%H:%M:%S.%9fZ ").to_string());
        }
        out.push_str(&line);
        out.push('\n');
    }
    Ok(out)
}

/// A traced job's tracer ([`crate::pipeline::plugins::traced`]) ends when the last traced process has
/// ended: once every other container of the pod has terminated, a running tracer terminates too, with
/// exit code 0, at the same moment.
fn end_tracers(list: &mut [Value], ended: &str) {
    use crate::pipeline::plugins::traced::TRACER_CONTAINER;
    let others_done = list
        .iter()
        .filter(|c| c["name"] != TRACER_CONTAINER)
        .all(|c| c.at("/state/terminated").is_some());
    if !others_done {
        return;
    }
    for c in list
        .iter_mut()
        .filter(|c| c["name"] == TRACER_CONTAINER && c.at("/state/running").is_some())
    {
        let started = c.at("/state/running/startedAt").cloned();
        c["ready"] = json!(false);
        c["started"] = json!(false);
        c["state"] = json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started,
            "finishedAt": ended, "containerID": c["containerID"].clone()}});
    }
}

/// Init containers run one after another from `start`; their time adds up before the main containers
/// start. Returns when the last one ended, their statuses, and the first that failed (its name, and its
/// exit code unless its command could not run).
fn run_init_containers(pod: &Value, uid: &str, start: Timestamp) -> InitRun {
    let mut t = start;
    let mut init_statuses = Vec::new();
    let mut failed_init = None;
    for c in containers(pod, "initContainers") {
        // Init containers are set-up steps: only an explicit `sleep` makes them take time.
        let p = container_plan(c, Duration::ZERO);
        let Some(d) = p.duration else {
            failed_init = Some((c["name"].clone(), None));
            break;
        };
        let started = t;
        t = after(t, d);
        let reason = if p.exit_code == 0 {
            "Completed"
        } else {
            "Error"
        };
        init_statuses.push(json!({"name": c["name"], "image": c["image"], "imageID": format!("sim://{}", c["image"].as_str().unwrap_or_default()),
            "containerID": container_id(uid, c["name"].as_str().unwrap_or_default(), 1), "ready": true, "restartCount": 0, "started": false,
            "state": {"terminated": {"exitCode": p.exit_code, "reason": reason, "startedAt": format_time(started), "finishedAt": format_time(t)}}}));
        if p.exit_code != 0 {
            failed_init = Some((c["name"].clone(), Some(p.exit_code)));
            break;
        }
    }
    InitRun {
        ended: t,
        statuses: init_statuses,
        failed: failed_init,
    }
}

/// How a pod's init containers ran: see [`run_init_containers`].
struct InitRun {
    ended: Timestamp,
    statuses: Vec<Value>,
    /// The first that failed: its name, and its exit code unless its command could not run.
    failed: Option<(Value, Option<i32>)>,
}
