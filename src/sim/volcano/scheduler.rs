//! The gang scheduler. A PodGroup is first enqueued (its `minResources` must fit in the idle capacity
//! times the over-commit factor, within its queue's capability), then, once the job controller has made
//! its pods, allocated all-or-nothing: the pods are bound only when at least `minMember` of them fit on
//! nodes. Otherwise the PodGroup carries an `Unschedulable` condition with Volcano's message and waits.
//! PodGroups are tried in Volcano's job order (created first; in the same second, by namespace and
//! name); a queue with `dequeueStrategy: fifo` lets nothing overtake a
//! waiting gang. A gang that failed is tried again only when capacity, nodes or queues change. A gang
//! whose job's `sla-waiting-time` has run out is enqueued at once, tried first and keeps what it could
//! place ([`super::sla`]). With `proportion` on ([`super::proportion`]), the queues are served lowest
//! share first, each in that order (a gang past its waiting time first within its queue), and a queue
//! that holds what it deserves has nothing allocated.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::sim::json::JsonPath;
use serde_json::{Value, json};

use super::Model;
use super::affinity::{self, Resident};
use super::nodes::{Misfit, pod_requests, unavailable_message};
use super::proportion::{self, QueueShare};
use crate::sim::api::{Core, name_of};
use crate::sim::clock::format_time;
use crate::sim::encode::ObjectKey;
use crate::sim::quantity::Resources;

struct QueueInfo {
    state: String,
    fifo: bool,
    capability: Option<Resources>,
    /// `spec.weight` (Volcano's default 1), for proportion.
    weight: f64,
    /// Creation time (seconds), the queue order between equal shares.
    created: i64,
}

fn without_pods(r: &Resources) -> Resources {
    let mut r = r.clone();
    r.0.remove("pods");
    r
}

/// Sort key of a pod name `<job>-<task>-<index>`: task, then numeric index.
fn pod_order(name: &str) -> (String, u64) {
    match name.rsplit_once('-') {
        Some((prefix, idx)) => (prefix.to_string(), idx.parse().unwrap_or(u64::MAX)),
        None => (name.to_string(), 0),
    }
}

impl Model {
    fn load_queues(&self, core: &Core) -> HashMap<String, QueueInfo> {
        let qt = core.registry.get(core.ids.queues);
        core.store
            .list(qt.storage, None, None)
            .map(crate::sim::store::Entry::object)
            .map(|q| {
                let q: &Value = &q;
                let cap = q
                    .at("/spec/capability")
                    .filter(|c| c.as_object().is_some_and(|m| !m.is_empty()));
                (
                    name_of(q).to_string(),
                    QueueInfo {
                        state: q
                            .at("/status/state")
                            .and_then(Value::as_str)
                            .unwrap_or("Open")
                            .to_string(),
                        fifo: q.at("/spec/dequeueStrategy").and_then(Value::as_str) == Some("fifo"),
                        capability: cap.map(|c| Resources::from_json(Some(c))),
                        weight: q.at("/spec/weight").and_then(Value::as_f64).unwrap_or(1.0),
                        created: q
                            .at("/metadata/creationTimestamp")
                            .and_then(Value::as_str)
                            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                            .map_or(i64::MAX, |t| t.as_second()),
                    },
                )
            })
            .collect()
    }

    /// Writes a PodGroup condition (replacing one of the same type) and the phase; returns whether the
    /// condition's message changed.
    fn set_group_status(
        &mut self,
        core: &mut Core,
        key: &ObjectKey,
        phase: Option<&str>,
        cond: Option<(&str, &str, &str)>,
    ) -> bool {
        // A full pass looks at every waiting gang again: most already say what they would be told, and
        // copying each one to find that out would make a pass cost as much as the whole store.
        if core
            .store
            .get(key)
            .is_none_or(|pg| group_status_holds(&pg, phase, cond))
        {
            return false;
        }
        let now = format_time(core.now);
        let transition = core.store.next_uid();
        let mut changed = false;
        core.update_internal(key, |pg| {
            if !pg.get("status").is_some_and(Value::is_object) {
                pg["status"] = json!({});
            }
            if let Some(p) = phase {
                pg["status"]["phase"] = json!(p);
            }
            if let Some((ty, reason, message)) = cond {
                let list = pg["status"].as_object_mut().expect("status object").entry("conditions").or_insert_with(|| json!([]));
                if let Value::Array(list) = list {
                    let existing = list.iter().position(|c| c["type"] == ty);
                    let same = existing.is_some_and(|i| list[i]["message"].as_str().unwrap_or_default() == message && list[i]["reason"] == reason);
                    if !same {
                        changed = true;
                        let mut c = json!({"type": ty, "status": "True", "reason": reason, "lastTransitionTime": now, "transitionID": transition});
                        if !message.is_empty() {
                            c["message"] = json!(message);
                        }
                        match existing {
                            Some(i) => list[i] = c,
                            None => list.push(c),
                        }
                    }
                }
            }
        });
        changed
    }

    fn unschedulable(&mut self, core: &mut Core, gkey: &ObjectKey, pg: &Value, message: &str) {
        if self.set_group_status(
            core,
            gkey,
            None,
            Some(("Unschedulable", "NotEnoughResources", message)),
        ) {
            self.event(core, pg, "Warning", "Unschedulable", message, "volcano");
            if let Some(job_name) = super::owner_job(pg) {
                let jkey = core.key_of(core.ids.jobs, &gkey.namespace, &job_name);
                if let Some(job) = core.store.get(&jkey) {
                    let text = format!(
                        "PodGroup {}:{} unschedule,reason: {message}",
                        gkey.namespace, gkey.name
                    );
                    self.event(
                        core,
                        &job,
                        "Warning",
                        "PodGroupPending",
                        &text,
                        "vc-controller-manager",
                    );
                }
            }
        }
    }

    /// One scheduling pass: every waiting gang when capacity, nodes or queues changed since the last
    /// full pass, otherwise only the gangs that changed. Then the bare pods the same way.
    pub(super) fn schedule(&mut self, core: &mut Core) {
        // The sla plugin: while a gang past its waiting time waits, every session tries it first and
        // keeps what it locked, so every pass is a full one.
        let overdue = self.overdue_groups(core);
        let epoch = self.epoch;
        let full = self.scanned_epoch != epoch || !overdue.is_empty();
        self.scanned_epoch = epoch;
        let candidates = self.candidates(core, full, &overdue);
        if candidates.is_empty() && self.bare_fresh.is_empty() && !full {
            return;
        }
        let mut session = self.open_session(core, full, overdue);
        // Proportion: the queues are served lowest share first, each in its job order. Without it,
        // every queue's gangs in one order (one lane).
        let mut by_queue: BTreeMap<String, VecDeque<(u64, ObjectKey, String)>> = BTreeMap::new();
        for (seq, key, queue) in candidates {
            let lane = if self.config.proportion {
                queue.clone()
            } else {
                String::new()
            };
            by_queue
                .entry(lane)
                .or_default()
                .push_back((seq, key, queue));
        }
        while let Some((seq, gkey, queue)) =
            next_candidate(&mut by_queue, &session.shares, &session.queues)
        {
            let Some(pg) = core.store.get(&gkey) else {
                self.forget_group(&gkey);
                continue;
            };
            self.gang_turn(core, &mut session, seq, &gkey, queue, &pg);
        }
        self.schedule_bare_pods(core, full);
    }

    /// The end of a session: each queue whose allocation changed since the last one gets
    /// `status.allocated` written, once, and only when it differs from what the status says (an
    /// absent one says nothing is allocated). Volcano's scheduler does the same when it closes a
    /// session (`updateQueueStatus`: it compares, then writes only the queues whose allocation
    /// changed), so a client's Queue watch hears of a queue when what it holds changed, not of every
    /// pod bound or ended on the way.
    pub(super) fn close_session(&mut self, core: &mut Core) {
        for name in std::mem::take(&mut self.alloc_dirty) {
            let key = core.key_of(core.ids.queues, "", &name);
            let Some(q) = core.store.get(&key) else {
                continue;
            };
            let allocated = self
                .queue_alloc
                .get(&name)
                .map(without_pods)
                .unwrap_or_default()
                .to_json();
            let written = q.at("/status/allocated").cloned().unwrap_or(json!({}));
            if written != allocated {
                core.update_internal(&key, |q| {
                    super::set_status_field(q, "allocated", allocated);
                });
            }
        }
    }

    /// The gangs this pass looks at (all waiting ones, or those that changed), in Volcano's job order:
    /// past the sla waiting time first (the earlier deadline first), then by creation, and among gangs
    /// created in the same second by their id (the PodGroup's namespace and name), not by when the
    /// scheduler first saw them: the API server keeps creation times to the second, and the scheduler's
    /// cache has no other order.
    fn candidates(
        &mut self,
        core: &Core,
        full: bool,
        overdue: &BTreeMap<u64, jiff::Timestamp>,
    ) -> Vec<(u64, ObjectKey, String)> {
        let mut candidates: Vec<(u64, ObjectKey, String)> = if full {
            self.pending_groups
                .iter()
                .map(|(s, (k, q))| (*s, k.clone(), q.clone()))
                .collect()
        } else {
            self.fresh_groups
                .iter()
                .filter_map(|s| {
                    self.pending_groups
                        .get(s)
                        .map(|(k, q)| (*s, k.clone(), q.clone()))
                })
                .collect()
        };
        self.fresh_groups.clear();
        let created = |key: &ObjectKey| {
            core.store
                .get(key)
                .and_then(|pg| {
                    pg.at("/metadata/creationTimestamp")
                        .and_then(Value::as_str)
                        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                })
                .map_or(i64::MAX, |t| t.as_second())
        };
        candidates.sort_by_cached_key(|(seq, key, _)| {
            (
                overdue.get(seq).map_or((1, None), |d| (0, Some(*d))),
                created(key),
                key.namespace.clone(),
                key.name.clone(),
            )
        });
        candidates
    }

    /// The session's view at its start: the queues, what the enqueued gangs reserve, and (with
    /// proportion) each queue's deserved share.
    fn open_session(
        &self,
        core: &Core,
        full: bool,
        overdue: BTreeMap<u64, jiff::Timestamp>,
    ) -> Session {
        let queues = self.load_queues(core);
        let mut reserved: HashMap<String, Resources> = HashMap::new();
        let mut reserved_total = Resources::default();
        for (q, min) in self.inqueue.values() {
            reserved.entry(q.clone()).or_default().add(min);
            reserved_total.add(min);
        }
        let shares = if self.config.proportion {
            self.queue_shares(&queues)
        } else {
            BTreeMap::new()
        };
        Session {
            full,
            overdue,
            queues,
            reserved,
            reserved_total,
            blocked: BTreeSet::new(),
            idle_nodes: None,
            shares,
            held: Held {
                extra: vec![Resources::default(); self.nodes.len()],
                placing: Vec::new(),
            },
        }
    }

    /// One waiting gang's turn: a Pending gang is enqueued or told why not (the enqueue action), an
    /// enqueued one gets its pods placed (the allocate action).
    fn gang_turn(
        &mut self,
        core: &mut Core,
        s: &mut Session,
        seq: u64,
        gkey: &ObjectKey,
        queue: String,
        pg: &Value,
    ) {
        let fifo = s.queues.get(&queue).is_some_and(|q| q.fifo);
        // In a fifo queue nothing overtakes a gang that is still waiting.
        if fifo
            && !s.full
            && self
                .pending_groups
                .range(..seq)
                .any(|(_, (_, q))| *q == queue)
        {
            s.blocked.insert(queue.clone());
        }
        let phase = pg
            .at("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("Pending")
            .to_string();
        match phase.as_str() {
            "Pending" => self.enqueue(core, s, seq, gkey, queue, pg),
            // Volcano's fifo blocks the queue for the rest of the session: an admitted gang behind a
            // waiting one does not start either.
            "Inqueue" | "Running" if fifo && s.blocked.contains(&queue) => {}
            // The allocate action skips a queue that holds what it deserves (proportion).
            "Inqueue" | "Running" if s.shares.get(&queue).is_some_and(QueueShare::overused) => {
                if fifo {
                    s.blocked.insert(queue);
                }
            }
            "Inqueue" | "Running" => {
                s.idle_nodes = None;
                let outcome =
                    self.allocate(core, gkey, pg, &mut s.held, s.overdue.contains_key(&seq));
                if let Some(share) = s.shares.get_mut(&queue) {
                    share.allocated = self
                        .queue_alloc
                        .get(&queue)
                        .map(without_pods)
                        .unwrap_or_default();
                }
                match outcome {
                    Allocation::Waiting => {}
                    Allocation::Done => {
                        if let Some((q, min)) = self.inqueue.remove(gkey) {
                            s.reserved_total.sub(&min);
                            if let Some(r) = s.reserved.get_mut(&q) {
                                r.sub(&min);
                            }
                        }
                        self.forget_group(gkey);
                    }
                    Allocation::Failed => {
                        if fifo {
                            s.blocked.insert(queue);
                        }
                    }
                }
            }
            _ => self.forget_group(gkey),
        }
    }

    /// The enqueue action: a Pending gang goes Inqueue and reserves its `minResources`, or carries an
    /// `Unschedulable` condition saying why not (and blocks its queue when that is fifo).
    fn enqueue(
        &mut self,
        core: &mut Core,
        s: &mut Session,
        seq: u64,
        gkey: &ObjectKey,
        queue: String,
        pg: &Value,
    ) {
        let min = Resources::from_json(pg.at("/spec/minResources"));
        let min_member = pg
            .at("/spec/minMember")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        match self.enqueue_refusal(s, seq, &queue, &min) {
            None => {
                self.set_group_status(core, gkey, Some("Inqueue"), None);
                s.reserved.entry(queue.clone()).or_default().add(&min);
                s.reserved_total.add(&min);
                self.inqueue.insert(gkey.clone(), (queue, min));
            }
            Some(reason) => {
                let message = format!(
                    "{min_member}/0 tasks in gang unschedulable: pod group is not ready, {min_member} minAvailable. Origin reason is: {reason}"
                );
                self.unschedulable(core, gkey, pg, &message);
                if s.queues.get(&queue).is_some_and(|q| q.fifo) {
                    s.blocked.insert(queue);
                }
            }
        }
    }

    /// Why a gang needing `min` may not be enqueued now, if it may not: its fifo queue is blocked, the
    /// queue is missing or closed, over its capability, or the cluster's idle capacity (times the
    /// over-commit factor, less what enqueued gangs reserve) is short.
    fn enqueue_refusal(
        &self,
        s: &mut Session,
        seq: u64,
        queue: &str,
        min: &Resources,
    ) -> Option<String> {
        if s.blocked.contains(queue) {
            return Some(format!("waiting behind earlier jobs in fifo queue {queue}"));
        }
        let q = match s.queues.get(queue) {
            None => return Some(format!("queue {queue} does not exist")),
            Some(q) if q.state != "Open" => return Some(format!("queue {queue} is {}", q.state)),
            Some(q) => q,
        };
        let mut used = self
            .queue_alloc
            .get(queue)
            .map(without_pods)
            .unwrap_or_default();
        used.add(&without_pods(
            s.reserved.get(queue).unwrap_or(&Resources::default()),
        ));
        used.add(&without_pods(min));
        let over_cap = q.capability.as_ref().map(|cap| {
            used.0
                .iter()
                .filter(|(k, v)| cap.0.contains_key(*k) && **v > cap.get(k))
                .map(|(k, _)| k.clone())
                .collect::<Vec<_>>()
        });
        let mut idle = s
            .idle_nodes
            .get_or_insert_with(|| self.cluster_idle().scaled(self.config.overcommit_factor))
            .clone();
        idle.sub(&s.reserved_total);
        let short = without_pods(min).shortfall(&idle);
        match over_cap {
            Some(over) if !over.is_empty() => Some(format!(
                "queue resource quota insufficient: {}",
                over.join(", ")
            )),
            // The sla plugin lets a gang past its waiting time in at once.
            _ if !short.is_empty() && !s.overdue.contains_key(&seq) => Some(format!(
                "resource in cluster is overused: insufficient {}",
                short.join(", ")
            )),
            _ => None,
        }
    }

    /// Proportion's inputs for this session: every queue with bound pods or waiting gangs, what it holds
    /// and requests (what it holds plus the minimum resources of its enqueued gangs: the simulator does
    /// not add up the pending pods of a running gang), and what it deserves of the schedulable nodes.
    fn queue_shares(&self, queues: &HashMap<String, QueueInfo>) -> BTreeMap<String, QueueShare> {
        let mut shares: BTreeMap<String, QueueShare> = BTreeMap::new();
        let make = |name: &str| {
            let info = queues.get(name);
            let allocated = self
                .queue_alloc
                .get(name)
                .map(without_pods)
                .unwrap_or_default();
            QueueShare {
                weight: info.map_or(1.0, |q| q.weight),
                capability: info.and_then(|q| q.capability.clone()),
                request: allocated.clone(),
                allocated,
                deserved: BTreeMap::new(),
            }
        };
        let busy = self
            .queue_alloc
            .iter()
            .filter(|(_, a)| a.0.values().any(|v| *v > 0))
            .map(|(q, _)| q);
        for q in busy.chain(self.pending_groups.values().map(|(_, q)| q)) {
            if !shares.contains_key(q) {
                shares.insert(q.clone(), make(q));
            }
        }
        for (q, min) in self.inqueue.values() {
            shares
                .entry(q.clone())
                .or_insert_with(|| make(q))
                .request
                .add(&without_pods(min));
        }
        let mut total = Resources::default();
        for n in self.nodes.iter().filter(|n| !n.unschedulable && !n.lost) {
            total.add(&n.allocatable);
        }
        proportion::deserve(&total, &mut shares);
        shares
    }

    /// What the anti-affinity filter needs of `pod`, when anything it could say matters: the pod has a
    /// term, or a pod bound or being placed has one.
    fn resident(&self, pod: &Value, placing: &[Vec<Resident>]) -> Option<Resident> {
        (affinity::has_terms(pod)
            || self.nodes.iter().any(|n| n.guards > 0)
            || placing.iter().flatten().any(Resident::guards))
        .then(|| Resident::of(pod))
    }

    /// Picks the least loaded node that fits, trying `extra` as already allocated and `placing` as
    /// already there.
    fn pick_node(
        &self,
        spec: &Value,
        requests: &Resources,
        extra: &[Resources],
        incoming: Option<&Resident>,
        placing: &[Vec<Resident>],
    ) -> Result<usize, Vec<Misfit>> {
        let mut best: Option<(f64, usize)> = None;
        let mut misfits = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let fits = node
                .fits_with(spec, requests, &extra[i])
                .and_then(|()| match incoming {
                    Some(r) if !node.admits(r, placing.get(i).map_or(&[], Vec::as_slice)) => {
                        Err(vec![Misfit::AntiAffinity])
                    }
                    _ => Ok(()),
                });
            match fits {
                Ok(()) => {
                    let load = node.load_with(&extra[i]);
                    if best.is_none_or(|(l, _)| load < l) {
                        best = Some((load, i));
                    }
                }
                Err(why) => misfits.push(why.into_iter().next().expect("a misfit has a reason")),
            }
        }
        best.map(|(_, i)| i).ok_or(misfits)
    }

    /// Places the gang's unbound pods, beside what `held` already holds in this pass; a `pipelined` gang
    /// (sla: past its waiting time) that does not fit whole leaves what it placed in `held`.
    fn allocate(
        &mut self,
        core: &mut Core,
        gkey: &ObjectKey,
        pg: &Value,
        held: &mut Held,
        pipelined: bool,
    ) -> Allocation {
        let Some(job_name) = super::owner_job(pg) else {
            return Allocation::Done;
        };
        let jkey = core.key_of(core.ids.jobs, &gkey.namespace, &job_name);
        let gang = self.gang_pods(core, gkey, &jkey);
        let min_member = pg
            .at("/spec/minMember")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        if !gang.gated.is_empty() {
            // Pod scheduling readiness (Volcano since v1.11, volcano-sh/volcano#3658): a gated pod is not
            // allocated, and a gang that needs it waits whole until its gates are removed, without
            // counting as a scheduling failure. Kubernetes tells it by the pod's condition.
            let now = format_time(core.now);
            for key in &gang.gated {
                core.update_internal(key, |p| pod_gated(p, &now));
            }
            if gang.active_bound + (gang.unbound.len() as i64) < min_member {
                return Allocation::Waiting;
            }
        }
        if gang.unbound.is_empty() {
            return if gang.active_bound > 0 {
                Allocation::Done
            } else {
                Allocation::Waiting
            };
        }
        let trial = self.place(&gang.unbound, held);
        if gang.active_bound + trial.placements.len() as i64 >= min_member {
            return self.bind_gang(core, gkey, pg, &gang, trial);
        }
        self.gang_unschedulable(core, gkey, pg, &gang, &trial, min_member);
        if pipelined {
            held.extra = trial.extra;
            held.placing = trial.placing;
        }
        Allocation::Failed
    }

    /// The job's pods as the allocate action sees them: bound (and not failed), gated, or to place.
    fn gang_pods(&self, core: &Core, gkey: &ObjectKey, jkey: &ObjectKey) -> GangPods {
        let pt = core.registry.get(core.ids.pods);
        let mut gang = GangPods {
            unbound: Vec::new(),
            gated: Vec::new(),
            active_bound: 0,
            total: 0,
        };
        for name in self.pods_of(jkey) {
            let key = ObjectKey::new(pt.storage, gkey.namespace.clone(), name.clone());
            let Some(pod) = core.store.get(&key) else {
                continue;
            };
            gang.total += 1;
            if pod.at("/metadata/deletionTimestamp").is_some() {
                continue;
            }
            let bound = pod
                .at("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            let phase = pod
                .at("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("Pending");
            if bound {
                if phase != "Failed" {
                    gang.active_bound += 1;
                }
            } else if is_gated(&pod) {
                gang.gated.push(key);
            } else {
                gang.unbound.push((key, (*pod).clone()));
            }
        }
        gang.unbound.sort_by_key(|(k, _)| pod_order(&k.name));
        gang
    }

    /// Where each pod would go, in pod order, on the least loaded node that fits beside what `held`
    /// holds and the pods placed before it.
    fn place(&self, unbound: &[(ObjectKey, Value)], held: &Held) -> Trial {
        let mut trial = Trial {
            extra: held.extra.clone(),
            placing: held.placing.clone(),
            placements: Vec::new(),
            first_failure: None,
        };
        for (key, pod) in unbound {
            let req = pod_requests(&pod["spec"]);
            let incoming = self.resident(pod, &trial.placing);
            match self.pick_node(
                &pod["spec"],
                &req,
                &trial.extra,
                incoming.as_ref(),
                &trial.placing,
            ) {
                Ok(i) => {
                    trial.extra[i].add(&req);
                    if let Some(r) = incoming {
                        trial.placing.resize_with(self.nodes.len(), Vec::new);
                        trial.placing[i].push(r);
                    }
                    trial.placements.push((key.clone(), i));
                }
                Err(why) => {
                    if trial.first_failure.is_none() {
                        trial.first_failure = Some((key.name.clone(), why));
                    }
                }
            }
        }
        trial
    }

    /// Enough of the gang fits: binds what was placed (the PodGroup goes Running); a pod left over is
    /// told why it did not fit.
    fn bind_gang(
        &mut self,
        core: &mut Core,
        gkey: &ObjectKey,
        pg: &Value,
        gang: &GangPods,
        trial: Trial,
    ) -> Allocation {
        let now = format_time(core.now);
        let placed: BTreeSet<ObjectKey> = trial.placements.iter().map(|(k, _)| k.clone()).collect();
        for (key, node) in trial.placements {
            self.bind(core, &key, node, "volcano");
        }
        if pg.at("/status/phase").and_then(Value::as_str) == Some("Inqueue") {
            self.set_group_status(
                core,
                gkey,
                Some("Running"),
                Some(("Scheduled", "tasks in gang are ready to be scheduled", "")),
            );
            self.event(
                core,
                pg,
                "Normal",
                "Scheduled",
                "pod group is ready",
                "volcano",
            );
        }
        let mut left = false;
        for (key, pod) in gang.unbound.iter().filter(|(k, _)| !placed.contains(k)) {
            left = true;
            let msg = trial
                .first_failure
                .as_ref()
                .map(|(_, w)| unavailable_message(self.node_count(), w))
                .unwrap_or_default();
            core.update_internal(key, |p| pod_unschedulable(p, &msg, &now));
            self.event(core, pod, "Warning", "FailedScheduling", &msg, "volcano");
        }
        if left {
            Allocation::Failed
        } else {
            Allocation::Done
        }
    }

    /// Too little of the gang fits: nothing is bound, and the pods and the PodGroup say why, in Volcano's
    /// words.
    fn gang_unschedulable(
        &mut self,
        core: &mut Core,
        gkey: &ObjectKey,
        pg: &Value,
        gang: &GangPods,
        trial: &Trial,
        min_member: i64,
    ) {
        let now = format_time(core.now);
        let pending = gang.unbound.len();
        let schedulable = trial.placements.len();
        let mut hist = Vec::new();
        if schedulable > 0 {
            hist.push(format!("{schedulable} Schedulable"));
        }
        if pending > schedulable {
            hist.push(format!("{} Unschedulable", pending - schedulable));
        }
        let mut message = format!(
            "{pending}/{} tasks in gang unschedulable: pod group is not ready, {pending} Pending, {min_member} minAvailable; Pending: {}",
            gang.total,
            hist.join(", ")
        );
        if let Some((pod, why)) = &trial.first_failure {
            message.push_str(&format!(
                ". Origin reason is {pod}: {}",
                unavailable_message(self.node_count(), why)
            ));
        }
        for (key, _) in &gang.unbound {
            core.update_internal(key, |p| pod_unschedulable(p, &message, &now));
        }
        self.unschedulable(core, gkey, pg, &message);
    }

    fn schedule_bare_pods(&mut self, core: &mut Core, full: bool) {
        let keys: Vec<ObjectKey> = if full {
            self.bare_pending.iter().cloned().collect()
        } else {
            self.bare_fresh.iter().cloned().collect()
        };
        self.bare_fresh.clear();
        for key in keys {
            let Some(pod) = core.store.get(&key) else {
                self.bare_pending.remove(&key);
                continue;
            };
            let req = pod_requests(&pod["spec"]);
            let extra = vec![Resources::default(); self.nodes.len()];
            let incoming = self.resident(&pod, &[]);
            let scheduler = pod
                .at("/spec/schedulerName")
                .and_then(Value::as_str)
                .unwrap_or("default-scheduler")
                .to_string();
            match self.pick_node(&pod["spec"], &req, &extra, incoming.as_ref(), &[]) {
                Ok(node) => {
                    self.bare_pending.remove(&key);
                    self.bind(core, &key, node, &scheduler);
                }
                Err(why) => {
                    let now = format_time(core.now);
                    let msg = unavailable_message(self.node_count(), &why);
                    core.update_internal(&key, |p| pod_unschedulable(p, &msg, &now));
                    self.event(core, &pod, "Warning", "FailedScheduling", &msg, &scheduler);
                }
            }
        }
    }
}

/// The next gang to try: the first of the queue with the lowest share (proportion's queue order; equal
/// shares by the queue's creation, then name). Without `shares` (proportion off), every queue's gangs
/// in one lane.
fn next_candidate(
    by_queue: &mut BTreeMap<String, VecDeque<(u64, ObjectKey, String)>>,
    shares: &BTreeMap<String, QueueShare>,
    queues: &HashMap<String, QueueInfo>,
) -> Option<(u64, ObjectKey, String)> {
    let lane = by_queue
        .iter()
        .filter(|(_, c)| !c.is_empty())
        .map(|(q, _)| {
            let share = shares.get(q).map_or(0.0, QueueShare::share);
            let created = queues.get(q).map_or(i64::MAX, |i| i.created);
            (share, created, q)
        })
        .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(b.2)))?
        .2
        .clone();
    by_queue.get_mut(&lane)?.pop_front()
}

/// Resources locked in a pass for gangs that are not bound yet, node by node, and the pods placed there
/// (for anti-affinity).
/// What one scheduling pass knows of the cluster and changes as it goes through the waiting gangs.
struct Session {
    /// Every waiting gang is looked at, not only those that changed.
    full: bool,
    /// Gangs past their sla waiting time (by their order), with the deadline.
    overdue: BTreeMap<u64, jiff::Timestamp>,
    queues: HashMap<String, QueueInfo>,
    /// The `minResources` of the enqueued gangs, per queue and in all.
    reserved: HashMap<String, Resources>,
    reserved_total: Resources,
    /// Fifo queues with a gang still waiting: nothing behind it is enqueued or allocated.
    blocked: BTreeSet<String>,
    /// The nodes' idle capacity changes only when something is allocated: worked out once per change,
    /// not once per waiting gang.
    idle_nodes: Option<Resources>,
    /// Proportion: each queue's deserved share for this session (empty without it).
    shares: BTreeMap<String, QueueShare>,
    /// What gangs past their waiting time hold in this pass without being bound (sla: pipelined).
    held: Held,
}

/// A gang's pods as the allocate action sees them.
struct GangPods {
    /// Not bound, not gated, not being deleted: what the pass tries to place, in pod order.
    unbound: Vec<(ObjectKey, Value)>,
    /// Waiting for their scheduling gates to be removed.
    gated: Vec<ObjectKey>,
    /// Bound and not failed.
    active_bound: i64,
    /// Every pod of the job that exists (for the message).
    total: usize,
}

/// Where a gang's pods would go: the resources and residents per node with them, each placed pod's
/// node, and the first pod that fit nowhere with why.
struct Trial {
    extra: Vec<Resources>,
    placing: Vec<Vec<Resident>>,
    placements: Vec<(ObjectKey, usize)>,
    first_failure: Option<(String, Vec<Misfit>)>,
}

struct Held {
    extra: Vec<Resources>,
    placing: Vec<Vec<Resident>>,
}

enum Allocation {
    /// Nothing to place yet (the pods are not created).
    Waiting,
    /// Every pod of the gang is bound.
    Done,
    /// The gang (or some of its pods) could not be placed.
    Failed,
}

/// Whether a pod still has scheduling gates (`spec.schedulingGates` not empty).
pub(crate) fn is_gated(pod: &Value) -> bool {
    pod.at("/spec/schedulingGates")
        .and_then(Value::as_array)
        .is_some_and(|g| !g.is_empty())
}

/// The condition Kubernetes puts on a pod that waits for its scheduling gates to be removed.
fn pod_gated(p: &mut Value, now: &str) {
    let cond = json!({"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                      "message": "Scheduling is blocked due to non-empty scheduling gates",
                      "lastProbeTime": null, "lastTransitionTime": now});
    set_pod_scheduled(p, cond, |c| c["reason"] != "SchedulingGated");
}

fn pod_unschedulable(p: &mut Value, message: &str, now: &str) {
    let cond = json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                      "lastProbeTime": null, "lastTransitionTime": now});
    set_pod_scheduled(p, cond, |c| c["message"] != message);
}

/// Sets the pod's `PodScheduled` condition to `cond` where it has none, or where `differs` says the one it
/// has says something else (an unchanged condition keeps its transition time, as the scheduler's does).
fn set_pod_scheduled(p: &mut Value, cond: Value, differs: impl Fn(&Value) -> bool) {
    if !p.get("status").is_some_and(Value::is_object) {
        p["status"] = json!({"phase": "Pending"});
    }
    let list = p["status"]
        .as_object_mut()
        .expect("status object")
        .entry("conditions")
        .or_insert_with(|| json!([]));
    if let Value::Array(list) = list {
        match list.iter_mut().find(|c| c["type"] == "PodScheduled") {
            Some(c) => {
                if differs(c) {
                    *c = cond;
                }
            }
            None => list.push(cond),
        }
    }
}

/// Whether a PodGroup's status already has `phase` and the condition `cond` (type, reason, message), so
/// setting them would change nothing.
fn group_status_holds(pg: &Value, phase: Option<&str>, cond: Option<(&str, &str, &str)>) -> bool {
    let status = pg.get("status");
    let phase_holds = phase
        .is_none_or(|p| status.and_then(|s| s.get("phase")).and_then(Value::as_str) == Some(p));
    let cond_holds = cond.is_none_or(|(ty, reason, message)| {
        status
            .and_then(|s| s.get("conditions"))
            .and_then(Value::as_array)
            .and_then(|list| list.iter().find(|c| c["type"] == ty))
            .is_some_and(|c| {
                c["message"].as_str().unwrap_or_default() == message && c["reason"] == reason
            })
    });
    phase_holds && cond_holds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_that_already_says_it_needs_no_write() {
        let pg = json!({"status": {"phase": "Pending", "conditions": [
            {"type": "Unschedulable", "reason": "NotEnoughResources", "message": "full"}]}});
        let cond = |m| Some(("Unschedulable", "NotEnoughResources", m));
        assert!(group_status_holds(&pg, None, cond("full")));
        assert!(group_status_holds(&pg, Some("Pending"), cond("full")));
        assert!(!group_status_holds(&pg, Some("Inqueue"), None));
        assert!(!group_status_holds(&pg, None, cond("other")));
        assert!(!group_status_holds(&json!({}), None, cond("full")));
    }
}
