//! Lifecycle hooks: pure functions from what a runner observed (the VolcanoJob, its pods, `now`) to what
//! should happen (publish these events, patch these annotations, delete the job). The monitor executes
//! the returned [`HookPlan`]; nothing here does I/O.
//!
//! # When to call what
//! - [`on_start`]: the job is seen `Running` (any number of times: every part is idempotent against the
//!   annotations, so a restart of the runner or a repeated event changes nothing, W4/W5).
//! - [`on_monitoring`]: periodically while the job runs, and at [`HookPlan::next_check`]; decides expiry
//!   (delete now, warn), accounting ticks and proxy target changes.
//! - [`on_completion`]: the job reached a finished phase or was deleted; publishes the final accounting
//!   tick up to the real end.
//! - [`on_cleanup`]: the job is gone; tells the proxies to drop its routes.
//!
//! # Executing a plan
//! In this order: (1) publish every event in [`HookPlan::publish`] (ids are deterministic, so publishing
//! twice is harmless); (2) apply [`HookPlan::merge_patch`], which carries the observed resourceVersion:
//! on 409 Conflict re-read the job and call the hook again (the annotations now say what was done);
//! (3) if [`HookPlan::delete`] is set, delete the VolcanoJob (the patch already recorded the cause, W11).
//! Failures of one plugin are isolated in [`HookPlan::failures`]; the other plugins' actions still stand
//! (W6, W7).

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use super::PipelineConfig;
use super::names::USER_CONTAINER;
use super::plugins::{PluginId, REGISTRY};
use crate::durable::annotations::format_millis;
use crate::volcano::{JobPhase, VolcanoJob};

pub use super::facts::{
    ExpiryWarned, FactsError, HookActions, HookContext, HookError, JobFacts, Outbound, OwnerFacts,
    ProductFacts, ProxyFacts, TerminationCause,
};

/// A plugin whose hook failed, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginFailure {
    /// The plugin.
    pub plugin: PluginId,
    /// Its error.
    pub error: HookError,
}

/// The merged actions of every plugin for one job; see the module docs for how to execute it.
#[derive(Debug, Clone, PartialEq)]
pub struct HookPlan {
    /// The job id.
    pub job_id: String,
    /// The VolcanoJob's name.
    pub name: String,
    /// The VolcanoJob's namespace.
    pub namespace: String,
    /// The resourceVersion the decisions were made on; the patch only applies to that version.
    pub resource_version: Option<String>,
    /// Annotations to set.
    pub set: BTreeMap<String, String>,
    /// Annotations to remove.
    pub remove: BTreeSet<String>,
    /// Messages to publish, first.
    pub publish: Vec<Outbound>,
    /// End the VolcanoJob (Volcano's `TerminateJob` command) after the patch, for this reason.
    pub delete: Option<TerminationCause>,
    /// Look at the job again at this instant at the latest.
    pub next_check: Option<Timestamp>,
    /// Plugins whose hook failed; their actions are not in the plan.
    pub failures: Vec<PluginFailure>,
}

impl HookPlan {
    pub(crate) fn new(facts: &JobFacts) -> Self {
        Self {
            job_id: facts.job_id.clone(),
            name: facts.name.clone(),
            namespace: facts.namespace.clone(),
            resource_version: facts.resource_version.clone(),
            set: BTreeMap::new(),
            remove: BTreeSet::new(),
            publish: Vec::new(),
            delete: None,
            next_check: None,
            failures: Vec::new(),
        }
    }

    /// Adds one plugin's actions, or its failure. A key another plugin already set to a different value
    /// is a conflict: that plugin's actions are dropped.
    fn merge(&mut self, plugin: PluginId, result: Result<HookActions, HookError>) {
        let actions = match result {
            Ok(actions) => actions,
            Err(error) => {
                self.failures.push(PluginFailure { plugin, error });
                return;
            }
        };
        if let Some((key, _)) = actions
            .set
            .iter()
            .find(|(k, v)| self.set.get(*k).is_some_and(|old| old != *v))
        {
            self.failures.push(PluginFailure {
                plugin,
                error: HookError::Conflict { key: key.clone() },
            });
            return;
        }
        self.set.extend(actions.set);
        self.remove.extend(actions.remove);
        self.publish.extend(actions.publish);
        if self.delete.is_none() {
            self.delete = actions.delete;
        }
        if let Some(at) = actions.next_check {
            self.next_check = Some(self.next_check.map_or(at, |t| t.min(at)));
        }
    }

    /// True when there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
            && self.remove.is_empty()
            && self.publish.is_empty()
            && self.delete.is_none()
    }

    /// A JSON merge patch (`application/merge-patch+json`) with the annotation changes and the observed
    /// `metadata.resourceVersion`, so the API server refuses it (409) if the job changed meanwhile.
    /// `None` when no annotation changes.
    pub fn merge_patch(&self) -> Option<serde_json::Value> {
        if self.set.is_empty() && self.remove.is_empty() {
            return None;
        }
        let mut annotations = serde_json::Map::new();
        for key in &self.remove {
            annotations.insert(key.clone(), serde_json::Value::Null);
        }
        for (key, value) in &self.set {
            annotations.insert(key.clone(), serde_json::Value::String(value.clone()));
        }
        let mut metadata = serde_json::Map::new();
        metadata.insert("annotations".into(), serde_json::Value::Object(annotations));
        if let Some(rv) = &self.resource_version {
            metadata.insert(
                "resourceVersion".into(),
                serde_json::Value::String(rv.clone()),
            );
        }
        Some(serde_json::json!({ "metadata": metadata }))
    }
}

/// Which hook to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Start,
    Monitoring,
    Completion,
    Cleanup,
}

fn run(stage: Stage, cx: &HookContext<'_>, plan: &mut HookPlan) {
    for plugin in REGISTRY {
        if !cx.pipeline.plugins.is_on(plugin.id()) {
            continue;
        }
        let mut actions = HookActions::default();
        let result = match stage {
            Stage::Start => plugin.on_start(cx, &mut actions),
            Stage::Monitoring => plugin.on_monitoring(cx, &mut actions),
            Stage::Completion => plugin.on_completion(cx, &mut actions),
            Stage::Cleanup => plugin.on_cleanup(cx, &mut actions),
        };
        plan.merge(plugin.id(), result.map(|()| actions));
    }
    if let Some(cause) = &plan.delete {
        plan.set
            .insert(cx.keys.termination_cause.clone(), cause.as_str().to_owned());
        plan.set
            .insert(cx.keys.termination_at.clone(), format_millis(cx.now));
    }
}

/// The job is running. Records `jobStart` once (when the user's program first started in any rank, from
/// the container statuses, else the first time Volcano reported Running; never the time a runner
/// happened to look), then every plugin's start hook: the expiry, the
/// accounting baseline, the proxy routes.
pub fn on_start(
    config: &(impl AsRef<PipelineConfig> + ?Sized),
    vcjob: &VolcanoJob,
    pods: &[Pod],
    now: Timestamp,
) -> Result<HookPlan, FactsError> {
    let keys = config.as_ref().keys();
    let mut facts = JobFacts::read(vcjob, &keys, config)?;
    let mut plan = HookPlan::new(&facts);
    if facts.start.is_none() {
        // The real start: the first rank's program, else Volcano's Running transition.
        let start = pods_started_at(pods)
            .map(|t| t.min(now))
            .unwrap_or_else(|| running_since(vcjob, now));
        plan.set
            .insert(keys.job_start.clone(), format_millis(start));
        facts.start = Some(start);
    }
    let cx = HookContext {
        facts: &facts,
        vcjob,
        pods,
        pipeline: config.as_ref(),
        keys: &keys,
        now,
        ended_at: None,
    };
    run(Stage::Start, &cx, &mut plan);
    Ok(plan)
}

/// Periodic check of a running job: expiry (delete now, or warn), accounting ticks, proxy targets.
/// A job that has not started yet (no `jobStart`) gets an empty plan.
pub fn on_monitoring(
    config: &(impl AsRef<PipelineConfig> + ?Sized),
    vcjob: &VolcanoJob,
    pods: &[Pod],
    now: Timestamp,
) -> Result<HookPlan, FactsError> {
    let keys = config.as_ref().keys();
    let facts = JobFacts::read(vcjob, &keys, config)?;
    let mut plan = HookPlan::new(&facts);
    if facts.start.is_none() {
        return Ok(plan);
    }
    let cx = HookContext {
        facts: &facts,
        vcjob,
        pods,
        pipeline: config.as_ref(),
        keys: &keys,
        now,
        ended_at: None,
    };
    run(Stage::Monitoring, &cx, &mut plan);
    Ok(plan)
}

/// The job finished (or was deleted) at `ended_at` (see [`ended_at`]): the final accounting tick.
/// A job whose start was never recorded (it ran and ended between two looks) takes its start from its
/// pods; a job that never ran is not charged.
pub fn on_completion(
    config: &(impl AsRef<PipelineConfig> + ?Sized),
    vcjob: &VolcanoJob,
    pods: &[Pod],
    ended_at: Timestamp,
    now: Timestamp,
) -> Result<HookPlan, FactsError> {
    let keys = config.as_ref().keys();
    let mut facts = JobFacts::read(vcjob, &keys, config)?;
    let mut plan = HookPlan::new(&facts);
    if facts.start.is_none()
        && let Some(start) = pods_started_at(pods)
    {
        plan.set
            .insert(keys.job_start.clone(), format_millis(start));
        facts.start = Some(start);
    }
    let cx = HookContext {
        facts: &facts,
        vcjob,
        pods,
        pipeline: config.as_ref(),
        keys: &keys,
        now,
        ended_at: Some(ended_at.min(now)),
    };
    run(Stage::Completion, &cx, &mut plan);
    Ok(plan)
}

/// The job is gone: `vcjob` is its last known state (e.g. from the DELETED watch event).
pub fn on_cleanup(
    config: &(impl AsRef<PipelineConfig> + ?Sized),
    vcjob: &VolcanoJob,
    now: Timestamp,
) -> Result<HookPlan, FactsError> {
    let keys = config.as_ref().keys();
    let facts = JobFacts::read(vcjob, &keys, config)?;
    let mut plan = HookPlan::new(&facts);
    let cx = HookContext {
        facts: &facts,
        vcjob,
        pods: &[],
        pipeline: config.as_ref(),
        keys: &keys,
        now,
        ended_at: None,
    };
    run(Stage::Cleanup, &cx, &mut plan);
    // The job is gone: there is nothing to patch or delete.
    plan.set.clear();
    plan.remove.clear();
    plan.delete = None;
    Ok(plan)
}

/// When the job first ran: the first `Running` entry of Volcano's phase history, else the current
/// state's transition time when Running, else `now`; never later than `now`.
pub fn running_since(vcjob: &VolcanoJob, now: Timestamp) -> Timestamp {
    let Some(status) = &vcjob.status else {
        return now;
    };
    let first = status
        .conditions
        .iter()
        .filter(|c| c.status == JobPhase::Running)
        .filter_map(|c| c.last_transition_time.as_ref().map(|t| t.0))
        .min();
    let current = (status.state.phase == JobPhase::Running)
        .then(|| status.state.last_transition_time.as_ref().map(|t| t.0))
        .flatten();
    first.or(current).map_or(now, |t| t.min(now))
}

/// When the user's program first started in any rank, from the pods' container states.
pub fn pods_started_at(pods: &[Pod]) -> Option<Timestamp> {
    user_states(pods)
        .filter_map(|state| {
            state
                .running
                .as_ref()
                .and_then(|r| r.started_at.as_ref())
                .or_else(|| {
                    state
                        .terminated
                        .as_ref()
                        .and_then(|t| t.started_at.as_ref())
                })
                .map(|t| t.0)
        })
        .min()
}

/// The job's real end (W18: charge to the end, not to when a runner noticed): the last time the user's
/// program ended in any rank; else, for a finished phase, when Volcano recorded it; else `now`. Never
/// later than `now`.
pub fn ended_at(vcjob: &VolcanoJob, pods: &[Pod], now: Timestamp) -> Timestamp {
    let from_pods = user_states(pods)
        .filter_map(|state| {
            state
                .terminated
                .as_ref()
                .and_then(|t| t.finished_at.as_ref())
                .map(|t| t.0)
        })
        .max();
    let from_phase = vcjob
        .status
        .as_ref()
        .filter(|s| s.state.phase.is_ending())
        .and_then(|s| s.state.last_transition_time.as_ref())
        .map(|t| t.0);
    from_pods.or(from_phase).map_or(now, |t| t.min(now))
}

fn user_states(pods: &[Pod]) -> impl Iterator<Item = &k8s_openapi::api::core::v1::ContainerState> {
    pods.iter()
        .filter_map(|p| p.status.as_ref())
        .filter_map(|s| s.container_statuses.as_ref())
        .flatten()
        .filter(|c| c.name == USER_CONTAINER)
        .filter_map(|c| c.state.as_ref())
}

pub use crate::messages::proto_timestamp;
