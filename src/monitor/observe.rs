//! Reading a job's pods and PodGroup: ranks and their exit codes, real start and end times, image pull
//! failures, and why a job is still pending, in plain language. Pure functions of the observed objects.

use jiff::Timestamp;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodCondition};

use crate::messages::v1::PendingDetails;
use crate::pipeline::hooks::ProductFacts;
use crate::pipeline::names::{self, USER_CONTAINER};
use crate::volcano::{LABEL_TASK_INDEX, PodGroup, PodGroupPhase};

/// A rank's pod taken away by something other than its own program: its node lost, an eviction, a
/// preemption, a deletion. Read from the pod's last state (its `DisruptionTarget` condition, which
/// Kubernetes sets before it removes the pod) the moment the watch shows it, because the pod is gone
/// afterwards; the monitor persists what it tells (`disruption` annotation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disruption {
    pub rank: Option<u32>,
    pub node: Option<String>,
    /// The condition's reason (`DeletionByPodGC`, `EvictionByEvictionAPI`, ...); empty for a plain
    /// deletion.
    pub reason: String,
    pub message: String,
}

impl Disruption {
    /// From a pod's labels, node and conditions; `None` without a `DisruptionTarget` condition.
    pub fn said(
        labels: Option<&BTreeMap<String, String>>,
        node: Option<&str>,
        conditions: Option<&[PodCondition]>,
    ) -> Option<Disruption> {
        let cond = conditions?
            .iter()
            .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")?;
        Some(Disruption {
            reason: cond.reason.clone().unwrap_or_default(),
            message: cond.message.clone().unwrap_or_default(),
            ..Disruption::deleted(labels, node)
        })
    }

    /// A pod deleted without a word of why (`kubectl delete pod`, a drain without the eviction API).
    pub fn deleted(labels: Option<&BTreeMap<String, String>>, node: Option<&str>) -> Disruption {
        Disruption {
            rank: labels
                .and_then(|l| l.get(LABEL_TASK_INDEX))
                .and_then(|r| r.parse().ok()),
            node: node.filter(|n| !n.is_empty()).map(str::to_owned),
            reason: String::new(),
            message: String::new(),
        }
    }

    /// In words, naming the rank and the node: `rank 1's node n3 was lost`.
    pub fn describe(&self) -> String {
        let rank = self
            .rank
            .map_or_else(|| "a rank".to_owned(), |r| format!("rank {r}"));
        // ` <prefix><node>`, or nothing when the node is not known.
        let on = |prefix: &str| {
            self.node
                .as_deref()
                .map_or_else(String::new, |n| format!("{prefix}{n}"))
        };
        let said = |what: String| {
            if self.message.is_empty() {
                what
            } else {
                format!("{what} ({})", self.message)
            }
        };
        match self.reason.as_str() {
            "DeletionByPodGC" => said(format!("{rank}'s node{} was lost", on(" "))),
            "DeletionByTaintManager" => {
                said(format!("{rank}'s node{} became unreachable", on(" ")))
            }
            "EvictionByEvictionAPI" => {
                said(format!("{rank}'s pod was evicted{}", on(" from node ")))
            }
            "PreemptionByScheduler" => said(format!(
                "{rank}'s pod{} was preempted by a job of higher priority",
                on(" on node ")
            )),
            "TerminationByKubelet" => said(format!(
                "{rank}'s pod was stopped by its node{} (out of resources or shutting down)",
                on(" ")
            )),
            "" => format!("{rank}'s pod{} was deleted", on(" on node ")),
            other => said(format!(
                "{rank}'s pod{} was disrupted: {other}",
                on(" on node ")
            )),
        }
    }
}

/// Waiting reasons that mean the image cannot be pulled (the kubelet keeps retrying, forever).
const PULL_FAILURES: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "RegistryUnavailable",
];

/// A pod's rank: Volcano's task-index label, else the suffix of `j-<jobId>-job-<rank>`.
pub fn rank_of(job_id: &str, pod: &Pod) -> Option<u32> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_TASK_INDEX))
        .and_then(|i| i.parse().ok())
        .or_else(|| names::rank_from_pod_name(job_id, pod.metadata.name.as_deref()?))
}

/// The user's container status in a pod.
pub fn user_container(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == USER_CONTAINER)
}

/// What one rank's user container did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankView {
    pub rank: u32,
    pub pod: String,
    pub running: bool,
    pub started_at: Option<Timestamp>,
    /// Set once the program ended.
    pub terminated: Option<Ended>,
}

/// How a rank's program ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub code: i32,
    pub finished_at: Option<Timestamp>,
    /// The kubelet's reason, e.g. `OOMKilled`, `Error`, `Completed`.
    pub reason: Option<String>,
}

/// One view per rank that has a pod, in rank order. When a rank has several pods (a restart), the one
/// not being deleted wins, else the newest.
pub fn ranks(job_id: &str, pods: &[Pod]) -> Vec<RankView> {
    let mut best: std::collections::BTreeMap<u32, &Pod> = std::collections::BTreeMap::new();
    for pod in pods {
        let Some(rank) = rank_of(job_id, pod) else {
            continue;
        };
        let better = match best.get(&rank) {
            None => true,
            Some(old) => {
                let key = |p: &Pod| {
                    (
                        p.metadata.deletion_timestamp.is_none(),
                        p.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    )
                };
                key(pod) > key(old)
            }
        };
        if better {
            best.insert(rank, pod);
        }
    }
    best.into_iter()
        .map(|(rank, pod)| {
            let state = user_container(pod).and_then(|c| c.state.as_ref());
            let running = state.and_then(|s| s.running.as_ref());
            let terminated = state.and_then(|s| s.terminated.as_ref());
            RankView {
                rank,
                pod: pod.metadata.name.clone().unwrap_or_default(),
                running: running.is_some(),
                started_at: running
                    .and_then(|r| r.started_at.as_ref())
                    .or_else(|| terminated.and_then(|t| t.started_at.as_ref()))
                    .map(|t| t.0),
                terminated: terminated.map(|t| Ended {
                    code: t.exit_code,
                    finished_at: t.finished_at.as_ref().map(|f| f.0),
                    reason: t.reason.clone(),
                }),
            }
        })
        .collect()
}

/// Whether the user's program runs in any pod of the job.
pub fn any_running(pods: &[Pod]) -> bool {
    pods.iter()
        .filter_map(user_container)
        .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

/// Whether every one of `replicas` ranks has a pod whose program has ended.
pub fn all_ranks_ended(ranks: &[RankView], replicas: u32) -> bool {
    replicas > 0
        && (0..replicas).all(|r| {
            ranks
                .iter()
                .any(|v| v.rank == r && v.terminated.is_some() && !v.running)
        })
}

/// The last instant any rank's program ended.
pub fn last_finish(ranks: &[RankView]) -> Option<Timestamp> {
    ranks
        .iter()
        .filter_map(|r| r.terminated.as_ref().and_then(|t| t.finished_at))
        .max()
}

/// An image that cannot be pulled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullFailure {
    /// Since when the pod has been trying: the kubelet's start of the pod, else its creation.
    pub since: Timestamp,
    pub image: String,
    pub message: String,
}

/// The first container (init or main, any pod) whose image cannot be pulled, with the earliest start.
pub fn pull_failure(pods: &[Pod]) -> Option<PullFailure> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|pod| {
            let status = pod.status.as_ref()?;
            let failing = status
                .init_container_statuses
                .iter()
                .flatten()
                .chain(status.container_statuses.iter().flatten())
                .find(|c| {
                    c.state
                        .as_ref()
                        .and_then(|s| s.waiting.as_ref())
                        .and_then(|w| w.reason.as_deref())
                        .is_some_and(|r| PULL_FAILURES.contains(&r))
                })?;
            let since = status
                .start_time
                .as_ref()
                .or(pod.metadata.creation_timestamp.as_ref())
                .map(|t| t.0)?;
            let waiting = failing.state.as_ref()?.waiting.as_ref()?;
            Some(PullFailure {
                since,
                image: failing.image.clone(),
                message: waiting
                    .message
                    .clone()
                    .or_else(|| waiting.reason.clone())
                    .unwrap_or_default(),
            })
        })
        .min_by_key(|f| f.since)
}

/// Why a job is pending, for the status event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingReason {
    /// `unschedulable`, `queued`, `starting`, `image_pull_retrying`.
    pub reason: &'static str,
    pub text: String,
    pub details: PendingDetails,
    /// When this reason arose, as far as the objects tell (so the event does not depend on who looked).
    pub since: Option<Timestamp>,
}

/// The queue position as told: exact up to 10 jobs ahead, then only its order of magnitude (at least
/// 10, 100, 1,000, ...). A status event is told again whenever what it says changes, so an exact count
/// would mean an event and a write for every waiting job each time a job ahead starts; this way a job
/// behind N others is told at most about 10 + log10(N) times, and the count becomes exact when its start
/// is near. Returns the number and whether it is a lower bound.
pub fn told_position(jobs_ahead: u32) -> (u32, bool) {
    if jobs_ahead <= 10 {
        return (jobs_ahead, false);
    }
    let mut bound = 10;
    while bound <= jobs_ahead / 10 {
        bound *= 10;
    }
    (bound, true)
}

/// What the pending reason is built from.
#[derive(Debug, Clone, Copy)]
pub struct PendingInput<'a> {
    pub queue: &'a str,
    pub replicas: u32,
    pub product: &'a ProductFacts,
    pub podgroup: Option<&'a PodGroup>,
    pub jobs_ahead: Option<u32>,
    pub pods: &'a [Pod],
    /// When an image pull failure turns into FAILURE, if one is happening.
    pub pull: Option<(&'a PullFailure, Timestamp)>,
}

/// Plain-language reason a job waits, e.g. `waiting for resources: 2 of 2 pods need 4 GPUs each; 3 jobs
/// ahead in queue default`.
pub fn pending_reason(input: PendingInput<'_>) -> PendingReason {
    let queue = input
        .podgroup
        .and_then(|pg| pg.spec.queue.clone())
        .unwrap_or_else(|| input.queue.to_owned());
    let told = input.jobs_ahead.map(told_position);
    let ahead = |text: &mut String| {
        if let Some((n, at_least)) = told {
            let jobs = if n == 1 { "job" } else { "jobs" };
            let bound = if at_least { "at least " } else { "" };
            text.push_str(&format!("; {bound}{n} {jobs} ahead in queue {queue}"));
        }
    };
    let mut details = PendingDetails {
        queue: queue.clone(),
        jobs_ahead: told.map(|(n, _)| n),
        unschedulable_pods: 0,
        total_pods: input.replicas,
        message: String::new(),
        ..PendingDetails::default()
    };
    if let Some((failure, deadline)) = input.pull {
        details.message = failure.message.clone();
        return PendingReason {
            reason: "image_pull_retrying",
            text: format!(
                "cannot pull the container image {} yet ({}); giving up at {}",
                failure.image,
                failure.message,
                deadline.strftime("%Y-%m-%dT%H:%M:%SZ")
            ),
            details,
            since: Some(failure.since),
        };
    }
    let unschedulable = input.podgroup.and_then(|pg| {
        pg.status
            .as_ref()?
            .conditions
            .iter()
            .rev()
            .find(|c| c.type_ == "Unschedulable" && c.status == "True")
    });
    if let Some(cond) = unschedulable {
        let mut text = String::new();
        let (blocked, total) = unschedulable_counts(&input, cond, &mut details);
        let pods = if total == 1 { "pod" } else { "pods" };
        text.push_str(&format!(
            "waiting for resources: {blocked} of {total} {pods} need {} each",
            needs(&details.message, input.product)
        ));
        ahead(&mut text);
        return PendingReason {
            reason: "unschedulable",
            text,
            details,
            since: cond.last_transition_time.as_ref().map(|t| t.0),
        };
    }
    let phase = input
        .podgroup
        .and_then(|pg| pg.status.as_ref())
        .and_then(|s| s.phase.clone());
    match phase {
        Some(PodGroupPhase::Inqueue | PodGroupPhase::Running) => starting(&input, details),
        _ => {
            let mut text = format!("waiting in queue {queue}");
            ahead(&mut text);
            PendingReason {
                reason: "queued",
                text,
                details,
                since: input
                    .podgroup
                    .and_then(|pg| pg.metadata.creation_timestamp.as_ref())
                    .map(|t| t.0),
            }
        }
    }
}

/// The pods of the gang the scheduler could not place, and of how many, from its unschedulable
/// condition (Volcano's `N/M tasks in gang unschedulable`), into `details`.
fn unschedulable_counts(
    input: &PendingInput<'_>,
    cond: &crate::volcano::PodGroupCondition,
    details: &mut PendingDetails,
) -> (u32, u32) {
    let message = cond.message.clone().unwrap_or_default();
    let (blocked, of) = gang_counts(&message).unwrap_or((input.replicas, input.replicas));
    let blocked = blocked.min(input.replicas).max(1);
    let total = if of == 0 {
        input.replicas
    } else {
        of.min(input.replicas).max(blocked)
    };
    details.unschedulable_pods = blocked;
    details.total_pods = total.max(input.replicas);
    details.message = message;
    (blocked, details.total_pods)
}

/// A gang the scheduler has placed whose pods are starting.
fn starting(input: &PendingInput<'_>, details: PendingDetails) -> PendingReason {
    let running = input
        .pods
        .iter()
        .filter_map(user_container)
        .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        .count();
    PendingReason {
        reason: "starting",
        text: format!(
            "starting: resources are reserved, {running} of {} pods running",
            input.replicas
        ),
        details,
        // Starting since its gang was scheduled (the condition's transition), not since the
        // job was created.
        since: input
            .podgroup
            .and_then(|pg| {
                pg.status
                    .as_ref()?
                    .conditions
                    .iter()
                    .rev()
                    .find(|c| c.type_ == "Scheduled" && c.status == "True")?
                    .last_transition_time
                    .as_ref()
            })
            .or_else(|| {
                input
                    .podgroup
                    .and_then(|pg| pg.metadata.creation_timestamp.as_ref())
            })
            .map(|t| t.0),
    }
}

/// `(blocked, total)` from Volcano's `N/M tasks in gang unschedulable` message.
fn gang_counts(message: &str) -> Option<(u32, u32)> {
    let head = message.split(" tasks in gang unschedulable").next()?;
    if head.len() == message.len() {
        return None;
    }
    let counts = head.rsplit(' ').next()?;
    let (a, b) = counts.split_once('/')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

/// What each pod needs, naming the resources the scheduler said are short (`insufficient cpu`,
/// `Insufficient nvidia.com/gpu`), or everything the product asks for when it did not say.
fn needs(message: &str, product: &ProductFacts) -> String {
    let lower = message.to_ascii_lowercase();
    let short: Vec<&str> = lower
        .match_indices("insufficient ")
        .flat_map(|(i, m)| {
            // Up to the end of the sentence; resource names contain dots (`nvidia.com/gpu`).
            let rest = &lower[i + m.len()..];
            let end = [rest.find(". "), rest.find(';'), rest.find('\n')]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(rest.len());
            rest[..end]
                .trim_end_matches('.')
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
        })
        .collect();
    let cpu = format!("{} vCPU", product.cpu);
    let memory = format!("{} GiB memory", product.memory_gib);
    let gpu = format!(
        "{} GPU{}",
        product.gpu,
        if product.gpu == 1 { "" } else { "s" }
    );
    let mut parts: Vec<String> = Vec::new();
    fn push(parts: &mut Vec<String>, p: &str) {
        if !parts.iter().any(|x| x == p) {
            parts.push(p.to_owned());
        }
    }
    for s in &short {
        if s.contains("gpu") {
            push(&mut parts, &gpu);
        } else if s.starts_with("cpu") {
            push(&mut parts, &cpu);
        } else if s.starts_with("memory") {
            push(&mut parts, &memory);
        } else if s.starts_with("pods") {
            push(&mut parts, "a free pod slot on a node");
        }
    }
    if parts.is_empty() {
        push(&mut parts, &cpu);
        push(&mut parts, &memory);
        if product.gpu > 0 {
            push(&mut parts, &gpu);
        }
    }
    parts.join(" and ")
}

/// Whether a PodGroup waits in its queue (not yet running): it counts towards the positions of the
/// groups created after it.
pub fn is_waiting(pg: &PodGroup) -> bool {
    matches!(
        pg.status.as_ref().and_then(|s| s.phase.as_ref()),
        None | Some(PodGroupPhase::Pending) | Some(PodGroupPhase::Inqueue)
    )
}

/// How many Volcano queues have jobs that wait or run: the queues of the PodGroups not completed.
pub fn queues_in_use<'a>(groups: impl Iterator<Item = &'a PodGroup>) -> usize {
    groups
        .filter(|pg| {
            !matches!(
                pg.status.as_ref().and_then(|s| s.phase.as_ref()),
                Some(PodGroupPhase::Completed)
            )
        })
        .map(queue_of)
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

/// The Volcano queue a PodGroup waits in.
pub fn queue_of(pg: &PodGroup) -> String {
    pg.spec.queue.clone().unwrap_or_else(|| "default".into())
}

/// Jobs ahead of each waiting PodGroup in its queue: the PodGroups of that queue that are not yet
/// running and were created earlier (any workload, not only ours). The definition, computed from
/// scratch; the monitor's cache keeps the same order up to date incrementally (and is tested against
/// this).
#[cfg(test)]
pub fn queue_positions<'a>(
    groups: impl Iterator<Item = &'a PodGroup>,
) -> std::collections::HashMap<(String, String), u32> {
    let mut by_queue: std::collections::HashMap<String, Vec<(Option<Timestamp>, String, String)>> =
        std::collections::HashMap::new();
    for pg in groups {
        if !is_waiting(pg) {
            continue;
        }
        by_queue.entry(queue_of(pg)).or_default().push((
            pg.metadata.creation_timestamp.as_ref().map(|t| t.0),
            pg.metadata.namespace.clone().unwrap_or_default(),
            pg.metadata.name.clone().unwrap_or_default(),
        ));
    }
    let mut out = std::collections::HashMap::new();
    for (_, mut waiting) in by_queue {
        waiting.sort();
        for (i, (_, ns, name)) in waiting.into_iter().enumerate() {
            out.insert((ns, name), u32::try_from(i).unwrap_or(u32::MAX));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volcano::{PodGroupCondition, PodGroupStatus};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
        PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn pod(rank: u32, state: ContainerState) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(names::pod_name("7", rank));
        p.metadata.creation_timestamp = Some(Time(ts(100)));
        p.status = Some(PodStatus {
            start_time: Some(Time(ts(110))),
            container_statuses: Some(vec![ContainerStatus {
                name: USER_CONTAINER.into(),
                image: "img:1".into(),
                state: Some(state),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        });
        p
    }

    fn ended(code: i32, start: i64, end: i64) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                started_at: Some(Time(ts(start))),
                finished_at: Some(Time(ts(end))),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        }
    }

    fn product() -> ProductFacts {
        ProductFacts {
            id: "gpu-4".into(),
            category: "gpu".into(),
            cpu: 16,
            memory_gib: 64,
            gpu: 4,
        }
    }

    #[test]
    fn ranks_exit_codes_and_end() {
        let running = ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(ts(120))),
            }),
            ..ContainerState::default()
        };
        let pods = vec![pod(1, ended(3, 120, 180)), pod(0, running)];
        let view = ranks("7", &pods);
        assert_eq!(view.len(), 2);
        assert_eq!(view[0].rank, 0);
        assert!(view[0].running);
        let end = view[1].terminated.as_ref().unwrap();
        assert_eq!((end.code, end.finished_at), (3, Some(ts(180))));
        assert!(!all_ranks_ended(&view, 2));
        let pods = vec![pod(1, ended(3, 120, 180)), pod(0, ended(0, 120, 200))];
        let view = ranks("7", &pods);
        assert!(all_ranks_ended(&view, 2));
        assert!(
            !all_ranks_ended(&view, 3),
            "a rank without a pod has not ended"
        );
        assert_eq!(last_finish(&view), Some(ts(200)));
    }

    #[test]
    fn pull_failures_are_seen_with_their_start() {
        let waiting = ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ImagePullBackOff".into()),
                message: Some("Back-off pulling image \"img:1\"".into()),
            }),
            ..ContainerState::default()
        };
        let f = pull_failure(&[pod(0, waiting)]).unwrap();
        assert_eq!(f.since, ts(110));
        assert_eq!(f.image, "img:1");
        assert!(f.message.contains("Back-off"));
        let creating = ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ContainerCreating".into()),
                message: None,
            }),
            ..ContainerState::default()
        };
        assert_eq!(pull_failure(&[pod(0, creating)]), None);
    }

    #[test]
    fn unschedulable_reason_names_the_short_resource_and_the_queue() {
        let mut pg = PodGroup::default();
        pg.spec.queue = Some("default".into());
        pg.status = Some(PodGroupStatus {
            phase: Some(PodGroupPhase::Pending),
            conditions: vec![PodGroupCondition {
                type_: "Unschedulable".into(),
                status: "True".into(),
                message: Some(
                    "2/2 tasks in gang unschedulable: pod group is not ready, 2 Pending, 2 \
                     minAvailable; Pending: 2 Unschedulable. Origin reason is j-7-job-0: 0/3 nodes \
                     are unavailable: 3 Insufficient nvidia.com/gpu."
                        .into(),
                ),
                last_transition_time: Some(Time(ts(500))),
                ..PodGroupCondition::default()
            }],
            ..PodGroupStatus::default()
        });
        let product = product();
        let r = pending_reason(PendingInput {
            queue: "default",
            replicas: 2,
            product: &product,
            podgroup: Some(&pg),
            jobs_ahead: Some(3),
            pods: &[],
            pull: None,
        });
        assert_eq!(r.reason, "unschedulable");
        assert_eq!(
            r.text,
            "waiting for resources: 2 of 2 pods need 4 GPUs each; 3 jobs ahead in queue default"
        );
        assert_eq!(r.details.unschedulable_pods, 2);
        assert_eq!(r.since, Some(ts(500)));
        // Far back in the queue only the order of magnitude is told: a job ahead starting changes
        // nothing the user is told (and so publishes and writes nothing).
        let at = |jobs_ahead| {
            pending_reason(PendingInput {
                queue: "default",
                replicas: 2,
                product: &product,
                podgroup: Some(&pg),
                jobs_ahead: Some(jobs_ahead),
                pods: &[],
                pull: None,
            })
        };
        assert_eq!(
            at(437).text,
            "waiting for resources: 2 of 2 pods need 4 GPUs each; at least 100 jobs ahead in queue default"
        );
        assert_eq!(at(437).text, at(100).text);
        assert_eq!(at(437).details.jobs_ahead, Some(100));
        assert_ne!(at(99).text, at(100).text);
        assert!(at(10).text.ends_with("; 10 jobs ahead in queue default"));
        assert!(
            at(11)
                .text
                .ends_with("; at least 10 jobs ahead in queue default")
        );
        // Without a named resource, everything the product asks for.
        assert_eq!(
            needs("no nodes", &product),
            "16 vCPU and 64 GiB memory and 4 GPUs"
        );
    }

    #[test]
    fn a_deep_queue_tells_a_job_its_position_a_few_times_only() {
        assert_eq!(told_position(0), (0, false));
        assert_eq!(told_position(10), (10, false));
        assert_eq!(told_position(11), (10, true));
        assert_eq!(told_position(99), (10, true));
        assert_eq!(told_position(100), (100, true));
        assert_eq!(told_position(12_345), (10_000, true));
        assert_eq!(told_position(u32::MAX), (1_000_000_000, true));
        // Draining a queue of 5,000 jobs ahead changes what is told 13 times, not 5,000.
        let changes = (0..5_000u32)
            .rev()
            .map(told_position)
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] != w[1])
            .count();
        assert_eq!(changes, 13);
    }

    #[test]
    fn the_queues_in_use_are_those_of_groups_that_wait_or_run() {
        let group = |queue: Option<&str>, phase: Option<PodGroupPhase>| {
            let mut pg = PodGroup::default();
            pg.spec.queue = queue.map(Into::into);
            pg.status = phase.map(|phase| PodGroupStatus {
                phase: Some(phase),
                ..PodGroupStatus::default()
            });
            pg
        };
        let groups = [
            group(Some("a"), Some(PodGroupPhase::Running)),
            group(Some("a"), Some(PodGroupPhase::Pending)),
            group(Some("b"), Some(PodGroupPhase::Completed)),
            group(None, None),
        ];
        // `a` twice and `default` (no queue named) once; `b` only has an ended job.
        assert_eq!(queues_in_use(groups.iter()), 2);
        assert_eq!(queues_in_use(groups[..3].iter()), 1);
        assert_eq!(queues_in_use(groups[2..3].iter()), 0);
    }

    #[test]
    fn queue_positions_count_earlier_waiting_groups_of_the_same_queue() {
        let group = |name: &str, queue: &str, created: i64, phase: PodGroupPhase| {
            let mut pg = PodGroup::default();
            pg.metadata.name = Some(name.into());
            pg.metadata.namespace = Some("ns".into());
            pg.metadata.creation_timestamp = Some(Time(ts(created)));
            pg.spec.queue = Some(queue.into());
            pg.status = Some(PodGroupStatus {
                phase: Some(phase),
                ..PodGroupStatus::default()
            });
            pg
        };
        let groups = [
            group("a", "default", 1, PodGroupPhase::Running),
            group("b", "default", 2, PodGroupPhase::Pending),
            group("c", "other", 3, PodGroupPhase::Pending),
            group("d", "default", 4, PodGroupPhase::Pending),
        ];
        let pos = queue_positions(groups.iter());
        let at = |n: &str| pos.get(&("ns".to_owned(), n.to_owned())).copied();
        assert_eq!(at("a"), None);
        assert_eq!(at("b"), Some(0));
        assert_eq!(at("c"), Some(0));
        assert_eq!(at("d"), Some(1));
    }

    #[test]
    fn a_disruption_names_the_rank_and_the_node_from_the_pods_last_state() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "j-1-job-2", "labels": {LABEL_TASK_INDEX: "2"}},
            "spec": {"nodeName": "n7", "containers": []},
            "status": {"conditions": [{"type": "DisruptionTarget", "status": "True",
                "reason": "DeletionByTaintManager", "message": "Taint manager: deleting due to NoExecute taint"}]}
        }))
        .unwrap();
        let labels = pod.metadata.labels.as_ref();
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        fn conditions(p: &Pod) -> Option<&[PodCondition]> {
            p.status.as_ref().and_then(|s| s.conditions.as_deref())
        }
        assert_eq!(
            Disruption::said(labels, node, conditions(&pod))
                .unwrap()
                .describe(),
            "rank 2's node n7 became unreachable (Taint manager: deleting due to NoExecute taint)"
        );
        assert_eq!(
            Disruption::deleted(labels, node).describe(),
            "rank 2's pod on node n7 was deleted"
        );
        let mut plain = pod.clone();
        plain.status = None;
        assert_eq!(
            Disruption::said(labels, node, conditions(&plain)),
            None,
            "no condition, no said reason"
        );
        let unknown = Disruption {
            rank: None,
            node: None,
            reason: "Something".into(),
            message: String::new(),
        };
        assert_eq!(unknown.describe(), "a rank's pod was disrupted: Something");
    }
}
