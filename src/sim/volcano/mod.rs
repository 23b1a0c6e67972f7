//! The Volcano model: the job controller (PodGroups, pods, the `svc` and `env` plugins, phases and
//! policies), the gang scheduler (enqueue, then all-or-nothing allocation onto simulated nodes), the
//! queue controller, and a kubelet that runs each container by the rules of [`command`].
//!
//! It is a deterministic step function: the API server calls [`Model::on_changes`] and [`Model::run`]
//! after every write until nothing changes, and fires the model's timers (pod start, container exit,
//! graceful termination, TTL) in time order as the simulated clock passes them.

pub mod admission;
mod affinity;
pub mod command;
mod job;
mod kubelet;
pub mod nodes;
mod proportion;
mod scheduler;
pub mod sla;
pub mod storage;
mod svc;

pub use kubelet::pod_log as kubelet_log;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use crate::sim::json::JsonPath;
use jiff::Timestamp;
use serde_json::{Value, json};

use super::api::{Core, name_of};
use super::clock::format_time;
use super::encode::{EventType, ObjectKey, Record};
use super::store::FastMap;
use nodes::Node;

/// Marks a pod as about to go for a reason that is not its own doing (the `DisruptionTarget` condition
/// Kubernetes sets before an eviction, a preemption or a garbage collection).
pub fn disruption(pod: &mut Value, reason: &str, message: &str, now: &str) {
    if !pod["status"].is_object() {
        pod["status"] = json!({});
    }
    kubelet::set_condition(
        pod,
        json!({"type": "DisruptionTarget", "status": "True", "reason": reason,
               "message": message, "lastTransitionTime": now}),
    );
}

/// The model's settings (from [`crate::sim::SimConfig`]).
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub nodes: Vec<crate::sim::NodeSpec>,
    /// How long a container whose command the rules do not understand runs.
    pub default_run: Duration,
    /// An image whose name contains this never pulls.
    pub image_pull_failure_marker: String,
    /// From binding to the containers starting (image pull, sandbox).
    pub pod_start_delay: Duration,
    /// From a delete request to a running pod being gone (it exits on SIGTERM), capped by its grace period.
    pub pod_termination_delay: Duration,
    /// How late a container's end is reported (its `finishedAt` stays the real one).
    pub status_report_delay: Duration,
    /// Volcano's enqueue over-commit factor.
    pub overcommit_factor: f64,
    /// Volcano's `proportion` plugin: fair share between queues ([`proportion`]).
    pub proportion: bool,
    /// Whether to record Kubernetes Events.
    pub events: bool,
    /// The directory that stands for the claims' storage; `None`: no files are written.
    pub storage_dir: Option<std::path::PathBuf>,
}

/// Something the model does at a simulated instant.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Timer {
    PodStart {
        key: ObjectKey,
        uid: String,
    },
    MainStart {
        key: ObjectKey,
        uid: String,
    },
    ContainerExit {
        key: ObjectKey,
        uid: String,
        container: usize,
        run: u32,
    },
    ContainerRestart {
        key: ObjectKey,
        uid: String,
        container: usize,
    },
    ImagePullBackOff {
        key: ObjectKey,
        uid: String,
    },
    PodGone {
        key: ObjectKey,
        uid: String,
    },
    JobTtl {
        key: ObjectKey,
        uid: String,
    },
}

/// What the kubelet keeps about a bound pod.
#[derive(Debug, Clone)]
struct PodRuntime {
    uid: String,
    node: usize,
    requests: super::quantity::Resources,
    queue: Option<String>,
    /// Host octet of the pod IP on its node, while the pod holds one.
    ip: Option<u8>,
    /// Capacity has been given back (the pod ended).
    released: bool,
    terminating: bool,
    /// Per main container: how many times it has started.
    runs: Vec<u32>,
}

/// What the job controller remembers between reconciles.
#[derive(Debug, Clone, Default)]
struct JobMemory {
    uid: String,
    /// Pod phases seen last time, to turn transitions into policy events.
    seen: HashMap<String, String>,
    /// Pods the controller itself deleted (their disappearance is no eviction).
    killed: BTreeSet<String>,
    /// Tasks whose TaskCompleted event has been handled.
    completed_tasks: BTreeSet<String>,
    /// When the job last became Running (for `runningDuration`).
    running_since: Option<Timestamp>,
    ttl_set: bool,
}

/// The Volcano model's state.
#[derive(Debug)]
pub struct Model {
    pub config: ModelConfig,
    nodes: Vec<Node>,
    pods: FastMap<ObjectKey, PodRuntime>,
    timers: BTreeMap<(Timestamp, u64), Timer>,
    timer_seq: u64,
    jobs: FastMap<ObjectKey, JobMemory>,
    /// Job key → names of its pods.
    job_pods: FastMap<ObjectKey, BTreeSet<String>>,
    dirty_jobs: BTreeSet<ObjectKey>,
    /// PodGroups waiting for the scheduler, by arrival order, with their queue.
    pending_groups: BTreeMap<u64, (ObjectKey, String)>,
    group_order: FastMap<ObjectKey, u64>,
    group_seq: u64,
    /// Waiting PodGroups that changed since the last pass (new, or new pods): tried in the next pass
    /// even when capacity did not change.
    fresh_groups: BTreeSet<u64>,
    /// Bumped whenever capacity is freed or nodes and queues change; a pass at a new epoch tries every
    /// waiting gang, otherwise only the fresh ones.
    epoch: u64,
    scanned_epoch: u64,
    /// Enqueued PodGroups whose pods are not all bound yet, with their queue and minimum resources
    /// (held back from later enqueues).
    inqueue: FastMap<ObjectKey, (String, super::quantity::Resources)>,
    /// Requests of running pods by queue.
    queue_alloc: FastMap<String, super::quantity::Resources>,
    /// Queues whose `queue_alloc` changed since the last session close, which writes their
    /// `status.allocated` if it differs ([`Model::close_session`]).
    alloc_dirty: BTreeSet<String>,
    /// PodGroups that hold their queue open (Pending, Inqueue or Running), by queue: the queue
    /// controller's own count, which decides when a Closing queue is Closed. Volcano keeps such counts to
    /// itself since v1.11 (metrics, not status), and so does the simulator.
    queue_active: FastMap<String, i64>,
    bare_pending: BTreeSet<ObjectKey>,
    bare_fresh: BTreeSet<ObjectKey>,
    /// Queues whose state the queue controller looks at again (the queue changed, or its active
    /// PodGroups came to or went from none).
    queues_dirty: BTreeSet<String>,
    queue_signatures: FastMap<String, String>,
    /// Jobs with an `sla-waiting-time` ([`sla`]): the waiting time and the job's PodGroup name.
    sla_jobs: FastMap<ObjectKey, (jiff::SignedDuration, String)>,
    /// `bus.volcano.sh` Commands created since the last pass: the controller takes them in the next.
    new_commands: BTreeSet<ObjectKey>,
    /// Actions Commands issued against a job (by the job's key), in order, not executed yet.
    commands: FastMap<ObjectKey, std::collections::VecDeque<String>>,
    /// What running pods serve on loopback, their scratch directories and exec sessions.
    pub interactive: crate::sim::interactive::Interactive,
}

/// Whether a PodGroup keeps its queue from closing: it has not finished (Pending, Inqueue, Running).
fn holds_queue(pg: &Value) -> bool {
    matches!(
        pg.at("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("Pending"),
        "Pending" | "Inqueue" | "Running"
    )
}

/// The state the queue controller gives a queue whose state is `current` and which holds `active`
/// unfinished PodGroups: a closed queue is `Closing` until they are gone, then `Closed`; any other is
/// `Open`.
fn queue_state(current: Option<&str>, active: i64) -> &'static str {
    match current {
        Some("Closed" | "Closing") if active > 0 => "Closing",
        Some("Closed" | "Closing") => "Closed",
        _ => "Open",
    }
}

/// Sets one field of an object's `status` and leaves the others (a status apply of that field).
fn set_status_field(obj: &mut Value, field: &str, value: Value) {
    if !obj.get("status").is_some_and(Value::is_object) {
        obj["status"] = json!({});
    }
    obj["status"][field] = value;
}

fn group_queue(pg: &Value) -> String {
    pg.at("/spec/queue")
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_string()
}

/// The PodGroup name Volcano uses for a job.
pub fn podgroup_name(job: &Value) -> String {
    format!(
        "{}-{}",
        name_of(job),
        job.at("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
    )
}

fn owner_job(obj: &Value) -> Option<String> {
    obj.at("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| {
            r.get("kind").and_then(Value::as_str) == Some("Job")
                && r.get("apiVersion")
                    .and_then(Value::as_str)
                    .is_some_and(|a| a.starts_with("batch.volcano.sh/"))
        })
        .and_then(|r| r.get("name").and_then(Value::as_str))
        .map(String::from)
}

impl Model {
    /// A model with the configured nodes and nothing running.
    pub fn new(config: ModelConfig) -> Model {
        let nodes = config
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| Node::from_spec(n, i as u8 + 1))
            .collect();
        Model {
            config,
            nodes,
            pods: FastMap::default(),
            timers: BTreeMap::new(),
            timer_seq: 0,
            jobs: FastMap::default(),
            job_pods: FastMap::default(),
            dirty_jobs: BTreeSet::new(),
            pending_groups: BTreeMap::new(),
            group_order: FastMap::default(),
            group_seq: 0,
            fresh_groups: BTreeSet::new(),
            epoch: 1,
            scanned_epoch: 0,
            inqueue: FastMap::default(),
            queue_alloc: FastMap::default(),
            alloc_dirty: BTreeSet::new(),
            queue_active: FastMap::default(),
            bare_pending: BTreeSet::new(),
            bare_fresh: BTreeSet::new(),
            queues_dirty: BTreeSet::new(),
            queue_signatures: FastMap::default(),
            sla_jobs: FastMap::default(),
            new_commands: BTreeSet::new(),
            commands: FastMap::default(),
            interactive: Default::default(),
        }
    }

    /// Creates the Node objects and the `root` and `default` queues.
    pub fn bootstrap(&mut self, core: &mut Core) {
        let created = format_time(core.now);
        for n in &self.nodes {
            let _ = core.create_internal(core.ids.nodes, "", n.to_object(&created));
        }
        for (name, spec) in [
            ("root", json!({"weight": 1, "reclaimable": false})),
            (
                "default",
                json!({"weight": 1, "reclaimable": true, "parent": "root"}),
            ),
        ] {
            let _ = core.create_internal(
                core.ids.queues,
                "",
                json!({"metadata": {"name": name}, "spec": spec}),
            );
        }
    }

    fn timer(&mut self, at: Timestamp, t: Timer) {
        self.timer_seq += 1;
        self.timers.insert((at, self.timer_seq), t);
    }

    /// The instant of the next timer, if any.
    pub fn next_timer(&self) -> Option<Timestamp> {
        self.timers.keys().next().map(|(t, _)| *t)
    }

    /// Fires the earliest timer if it is due at or before `until`; returns whether one fired.
    pub fn fire_next(&mut self, core: &mut Core, until: Timestamp) -> bool {
        let Some((&(at, seq), _)) = self.timers.iter().next() else {
            return false;
        };
        if at > until {
            return false;
        }
        let timer = self.timers.remove(&(at, seq)).expect("just seen");
        if at > core.now {
            core.now = at;
        }
        match timer {
            Timer::PodStart { key, uid } => self.pod_start(core, &key, &uid),
            Timer::MainStart { key, uid } => self.main_start(core, &key, &uid),
            Timer::ContainerExit {
                key,
                uid,
                container,
                run,
            } => self.container_exit(core, &key, &uid, container, run),
            Timer::ContainerRestart {
                key,
                uid,
                container,
            } => self.container_restart(core, &key, &uid, container),
            Timer::ImagePullBackOff { key, uid } => self.image_pull_backoff(core, &key, &uid),
            Timer::PodGone { key, uid } => self.pod_gone(core, &key, &uid),
            Timer::JobTtl { key, uid } => {
                // Volcano's garbage collector looks again before it deletes (the job may have been
                // deleted, or replaced by a newer one of the same name), then deletes in the
                // foreground with the uid as precondition.
                let due = core.store.get(&key).is_some_and(|j| {
                    j.at("/metadata/uid").and_then(Value::as_str) == Some(uid.as_str())
                        && j.at("/metadata/deletionTimestamp").is_none()
                        && j.at("/status/state/phase")
                            .and_then(Value::as_str)
                            .is_some_and(job::ttl_applies)
                });
                if due {
                    core.delete_key(&key, Some(super::api::Propagation::Foreground), None);
                }
            }
        }
        true
    }

    fn is(&self, core: &Core, key: &ObjectKey, res: usize) -> bool {
        key.res == core.registry.get(res).storage
    }

    /// Takes note of what changed in the store.
    pub fn on_changes(&mut self, core: &mut Core, records: &[std::sync::Arc<Record>]) {
        for r in records {
            if self.is(core, &r.key, core.ids.jobs) {
                // A write that touched only status or annotations (the controller's own status updates,
                // the runner's annotations) gives the controller nothing to do; nor does one that
                // changed the finalizers of a job not being deleted (the runner removes its finalizer
                // with the write that records a job's end: reconciling the ended job for it read the
                // job and its pods back from their text for nothing).
                let same = |p: &str| {
                    r.prev
                        .as_ref()
                        .is_some_and(|prev| prev.at(p) == r.object.at(p))
                };
                let idle = r.kind == EventType::Modified
                    && same("/metadata/generation")
                    && same("/metadata/deletionTimestamp")
                    && (same("/metadata/finalizers")
                        || r.object.at("/metadata/deletionTimestamp").is_none());
                if !idle {
                    self.dirty_jobs.insert(r.key.clone());
                }
                if r.kind == EventType::Deleted {
                    self.jobs.remove(&r.key);
                }
                let job = (r.kind != EventType::Deleted).then_some(&r.object);
                self.note_sla(&r.key, job.map(|j| &**j));
            } else if self.is(core, &r.key, core.ids.commands) {
                if r.kind == EventType::Added {
                    self.new_commands.insert(r.key.clone());
                }
            } else if self.is(core, &r.key, core.ids.pods) {
                self.on_pod_change(core, r);
            } else if self.is(core, &r.key, core.ids.podgroups) {
                self.on_group_change(core, r);
            } else if self.is(core, &r.key, core.ids.queues) {
                if r.kind != EventType::Deleted {
                    self.queues_dirty.insert(r.key.name.clone());
                }
                let name = r.key.name.clone();
                if r.kind == EventType::Deleted {
                    self.queue_signatures.remove(&name);
                    self.epoch += 1;
                } else {
                    let sig = format!(
                        "{}|{}",
                        r.object
                            .get("spec")
                            .map(Value::to_string)
                            .unwrap_or_default(),
                        r.object
                            .at("/status/state")
                            .map(Value::to_string)
                            .unwrap_or_default()
                    );
                    if self.queue_signatures.insert(name, sig.clone()).as_ref() != Some(&sig) {
                        self.epoch += 1;
                    }
                }
            } else if self.is(core, &r.key, core.ids.nodes) {
                let Some(i) = self.nodes.iter().position(|n| n.name == r.key.name) else {
                    continue;
                };
                if r.kind == EventType::Deleted {
                    self.lose_node(core, i);
                } else {
                    let n = &mut self.nodes[i];
                    let back = std::mem::take(&mut n.lost);
                    if n.refresh_from(&r.object) || back {
                        self.epoch += 1;
                    }
                }
            }
        }
    }

    fn on_pod_change(&mut self, core: &mut Core, r: &Record) {
        let pod = &r.object;
        let job = pod
            .at("/metadata/labels/volcano.sh~1job-name")
            .and_then(Value::as_str)
            .map(|j| core.key_of(core.ids.jobs, &r.key.namespace, j));
        match r.kind {
            EventType::Deleted => {
                // The pod stops now (a cancel, an expiry, a node lost): its wrapper's file is final.
                if let Some(storage) = &self.config.storage_dir {
                    kubelet::keep_output(storage, pod, self.config.default_run, core.now);
                }
                self.release(core, &r.key, true);
                self.pods.remove(&r.key);
                self.bare_pending.remove(&r.key);
                self.bare_fresh.remove(&r.key);
                if let Some(j) = &job
                    && let Some(set) = self.job_pods.get_mut(j)
                {
                    set.remove(&r.key.name);
                }
            }
            _ => {
                if let Some(j) = &job {
                    self.job_pods
                        .entry(j.clone())
                        .or_default()
                        .insert(r.key.name.clone());
                }
                let bound = pod
                    .at("/spec/nodeName")
                    .and_then(Value::as_str)
                    .is_some_and(|n| !n.is_empty());
                let deleting = pod.at("/metadata/deletionTimestamp").is_some();
                let group = pod
                    .at("/metadata/annotations/scheduling.k8s.io~1group-name")
                    .and_then(Value::as_str);
                if !bound && !deleting {
                    match group {
                        Some(g) => {
                            let gkey = core.key_of(core.ids.podgroups, &r.key.namespace, g);
                            let queue = core
                                .store
                                .get(&gkey)
                                .map(|pg| group_queue(&pg))
                                .unwrap_or_else(|| "default".into());
                            self.enqueue_group(gkey, queue);
                        }
                        None => {
                            self.bare_pending.insert(r.key.clone());
                            self.bare_fresh.insert(r.key.clone());
                        }
                    }
                } else {
                    self.bare_pending.remove(&r.key);
                    self.bare_fresh.remove(&r.key);
                }
                if bound && !self.pods.contains_key(&r.key) && !deleting {
                    // Bound by someone else (a user setting nodeName): the kubelet takes it on.
                    self.adopt(core, &r.key, pod);
                }
                if deleting {
                    self.begin_termination(core, &r.key, pod);
                }
            }
        }
        if let Some(j) = job {
            self.dirty_jobs.insert(j);
        }
    }

    /// Puts a PodGroup on the scheduler's list (keeping its place if it is already there) and marks it
    /// for the next pass.
    fn enqueue_group(&mut self, key: ObjectKey, queue: String) {
        let seq = match self.group_order.get(&key) {
            Some(seq) => *seq,
            None => {
                self.group_seq += 1;
                self.group_order.insert(key.clone(), self.group_seq);
                self.pending_groups.insert(self.group_seq, (key, queue));
                self.group_seq
            }
        };
        self.fresh_groups.insert(seq);
    }

    /// Takes a PodGroup off the scheduler's list.
    fn forget_group(&mut self, key: &ObjectKey) {
        if let Some(seq) = self.group_order.remove(key) {
            self.pending_groups.remove(&seq);
            self.fresh_groups.remove(&seq);
        }
    }

    fn on_group_change(&mut self, core: &mut Core, r: &Record) {
        if let Some(prev) = r.prev.as_ref().filter(|p| holds_queue(p)) {
            self.count_active(group_queue(prev), -1);
        }
        if r.kind == EventType::Deleted {
            self.forget_group(&r.key);
            self.inqueue.remove(&r.key);
            self.epoch += 1;
            return;
        }
        if holds_queue(&r.object) {
            self.count_active(group_queue(&r.object), 1);
        }
        let phase = r
            .object
            .at("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("Pending");
        let relevant_change = r.prev.as_ref().is_none_or(|p| {
            p.at("/status/phase") != r.object.at("/status/phase")
                || p.get("spec") != r.object.get("spec")
        });
        if (phase == "Pending" || phase == "Inqueue") && relevant_change {
            self.enqueue_group(r.key.clone(), group_queue(&r.object));
        }
        if phase != "Inqueue" {
            self.inqueue.remove(&r.key);
        }
        // A gang whose job ended without running (failed by its runner, terminated, aborted): it no
        // longer waits, and what waits behind it in a fifo queue is tried at once, in a full pass.
        if !matches!(phase, "Pending" | "Inqueue" | "Running")
            && self.group_order.contains_key(&r.key)
        {
            self.forget_group(&r.key);
            self.epoch += 1;
        }
        let phase_changed = r
            .prev
            .as_ref()
            .is_none_or(|p| p.at("/status/phase") != r.object.at("/status/phase"));
        if phase_changed && let Some(job) = owner_job(&r.object) {
            self.dirty_jobs
                .insert(core.key_of(core.ids.jobs, &r.key.namespace, &job));
        }
    }

    /// Adds `delta` to a queue's unfinished PodGroups; the queue controller looks at the queue again
    /// when they come to or go from none (all its state depends on).
    fn count_active(&mut self, queue: String, delta: i64) {
        let n = self.queue_active.entry(queue.clone()).or_insert(0);
        let was = *n;
        *n += delta;
        if (was > 0) != (*n > 0) {
            self.queues_dirty.insert(queue);
        }
    }

    /// Whether [`Model::run`] has work left.
    pub fn has_work(&self) -> bool {
        !self.dirty_jobs.is_empty() || !self.queues_dirty.is_empty() || !self.alloc_dirty.is_empty()
    }

    /// Reconciles dirty jobs, schedules (a session, closed by writing what changed of the queues'
    /// allocations), and updates queue state.
    pub fn run(&mut self, core: &mut Core) {
        self.take_commands(core);
        let dirty = std::mem::take(&mut self.dirty_jobs);
        for key in dirty {
            self.reconcile_job(core, &key);
        }
        self.schedule(core);
        self.close_session(core);
        let queues = std::mem::take(&mut self.queues_dirty);
        if !queues.is_empty() {
            self.sync_queues(core, queues);
        }
    }

    /// The job controller's command handler. A Command aimed at a Job is deleted before its action is
    /// queued for the job, as Volcano does ("clean it up to make sure executed not more than once"): a
    /// Command never runs twice. The job is found by name,
    /// not uid, as in Volcano; a Command aimed at anything else is left alone.
    fn take_commands(&mut self, core: &mut Core) {
        for key in std::mem::take(&mut self.new_commands) {
            let Some(cmd) = core.store.get(&key) else {
                continue;
            };
            let target = |field: &str| cmd.at(&format!("/target/{field}")).and_then(Value::as_str);
            if target("kind") != Some("Job")
                || target("apiVersion") != Some("batch.volcano.sh/v1alpha1")
            {
                continue;
            }
            let Some(job_name) = target("name").map(String::from) else {
                continue;
            };
            let action = cmd
                .get("action")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            core.delete_key(&key, None, None);
            let job_key = core.key_of(core.ids.jobs, &key.namespace, &job_name);
            let Some(job) = core.store.get(&job_key) else {
                continue;
            };
            self.event(
                core,
                &job,
                "Normal",
                "CommandIssued",
                &format!(
                    "Start to execute command {action}, and clean it up to make sure executed not \
                     more than once."
                ),
                "vc-controller-manager",
            );
            self.commands
                .entry(job_key.clone())
                .or_default()
                .push_back(action);
            self.dirty_jobs.insert(job_key);
        }
    }

    /// Queue controller: `Open` by default, `Closing` until a closed queue's PodGroups are gone. It writes
    /// `status.state` alone, and only when it changes: since v1.11 (volcano-sh/volcano#3751) Volcano's
    /// `syncQueue` no longer writes the PodGroup counts (`pending`, `inqueue`, `running`, `unknown`,
    /// `completed`) into a queue's status, only the state with `ApplyStatus` when it changed; the
    /// counts are metrics, and `vcctl` counts the PodGroups itself. Writing them made every PodGroup
    /// change an event on every client's Queue watch.
    fn sync_queues(&mut self, core: &mut Core, names: BTreeSet<String>) {
        for name in names {
            let key = core.key_of(core.ids.queues, "", &name);
            let Some(q) = core.store.get(&key) else {
                continue;
            };
            let current = q.at("/status/state").and_then(Value::as_str);
            let active = self.queue_active.get(&name).copied().unwrap_or(0);
            let state = queue_state(current, active);
            if current != Some(state) {
                core.update_internal(&key, |q| set_status_field(q, "state", json!(state)));
            }
        }
    }

    /// Gives back a pod's capacity and IP (when it ends or is removed).
    fn release(&mut self, _core: &mut Core, key: &ObjectKey, removed: bool) {
        let Some(rt) = self.pods.get_mut(key) else {
            return;
        };
        if !rt.released {
            rt.released = true;
            let node = &mut self.nodes[rt.node];
            node.allocated.sub(&rt.requests);
            node.leave(key);
            if let Some(q) = &rt.queue
                && let Some(a) = self.queue_alloc.get_mut(q)
            {
                a.sub(&rt.requests);
                self.alloc_dirty.insert(q.clone());
            }
            self.epoch += 1;
        }
        self.interactive.stop(key);
        if removed && let Some(octet) = rt.ip.take() {
            self.nodes[rt.node].release_ip(octet);
        }
    }

    /// Total and free capacity over schedulable nodes.
    fn cluster_idle(&self) -> super::quantity::Resources {
        let mut idle = super::quantity::Resources::default();
        for n in self.nodes.iter().filter(|n| !n.unschedulable && !n.lost) {
            idle.add(&n.free());
        }
        idle
    }

    /// Records an Event when events are switched on.
    fn event(
        &self,
        core: &mut Core,
        involved: &Value,
        ty: &str,
        reason: &str,
        message: &str,
        component: &str,
    ) {
        if self.config.events {
            core.record_event(involved, ty, reason, message, component);
        }
    }

    /// The namespace/name pairs of a job's pods.
    fn pods_of(&self, job: &ObjectKey) -> Vec<String> {
        self.job_pods
            .get(job)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Number of nodes (for scheduler messages).
    fn node_count(&self) -> usize {
        self.nodes.iter().filter(|n| !n.lost).count()
    }

    /// A Node object was deleted: the machine is gone (or restarting, until its Node comes back). As the
    /// pod garbage collector does for pods bound to a node that no longer exists, every pod on it is
    /// marked `DisruptionTarget` (reason `DeletionByPodGC`) and removed at once; their jobs' controllers
    /// see them vanish (Volcano's `PodEvicted`).
    fn lose_node(&mut self, core: &mut Core, node: usize) {
        self.nodes[node].lost = true;
        self.epoch += 1;
        let now = format_time(core.now);
        let mut on_it: Vec<ObjectKey> = self
            .pods
            .iter()
            .filter(|(_, rt)| rt.node == node)
            .map(|(k, _)| k.clone())
            .collect();
        on_it.sort();
        for key in on_it {
            core.update_internal(&key, |p| {
                disruption(p, "DeletionByPodGC", "PodGC: node no longer exists", &now);
            });
            core.delete_key(&key, None, Some(0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_queue_is_closing_while_it_holds_unfinished_podgroups() {
        assert_eq!(queue_state(None, 0), "Open");
        assert_eq!(queue_state(Some("Open"), 3), "Open");
        assert_eq!(queue_state(Some("Closed"), 1), "Closing");
        assert_eq!(queue_state(Some("Closing"), 1), "Closing");
        assert_eq!(queue_state(Some("Closing"), 0), "Closed");
        assert_eq!(queue_state(Some("Closed"), 0), "Closed");
    }

    #[test]
    fn a_podgroup_holds_its_queue_until_it_has_finished() {
        for (phase, holds) in [
            (None, true),
            (Some("Pending"), true),
            (Some("Inqueue"), true),
            (Some("Running"), true),
            (Some("Completed"), false),
            (Some("Unknown"), false),
        ] {
            let pg = match phase {
                Some(p) => json!({"status": {"phase": p}}),
                None => json!({}),
            };
            assert_eq!(holds_queue(&pg), holds, "{phase:?}");
        }
    }
}
