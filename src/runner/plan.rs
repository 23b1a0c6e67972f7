//! From the pipeline's [`DesiredJob`] to the applier's [`Step`]s, plus what only the runner knows at
//! create time: who accepted the job, the trace context, the cleanup finalizer and the retention
//! (`ttlSecondsAfterFinished`).
//!
//! Pure: the same job, runner and trace context always give the same plan.

use crate::cluster::{PlanError, Role, Step};
use crate::durable::AnnotationKeys;
use crate::pipeline::DesiredJob;
use crate::pipeline::desired::{DesiredObject, ObjectRef, Role as DesiredRole};

use crate::ops::trace::TraceParent;

/// The keys the runner adds to what the pipeline renders. They sit under the same prefix as the
/// pipeline's [`AnnotationKeys`], so one prefix covers every key a job carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerKeys {
    /// The finalizer `<prefix>cleanup` ([`AnnotationKeys::cleanup_finalizer`]) on every VolcanoJob the
    /// runner creates: the job cannot vanish before the monitor has run its cleanup (final accounting tick,
    /// proxy removal, terminal event) exactly once. The monitor removes it last.
    pub cleanup_finalizer: String,
    /// Annotation `<prefix>acceptedBy`: the runner that created the job. The QUEUED event carries it, so
    /// every runner that publishes QUEUED for this job publishes the same message.
    pub accepted_by: String,
    /// Annotations `<prefix>queuedConfirmed` (written once the broker confirmed the job's QUEUED, so
    /// that whoever monitors the job sends no copy of it) and `<prefix>queuedBy` (`monitor` when the
    /// job's monitor, not its submitting runner, tells its QUEUED): the keys the monitor reads them by.
    pub queued: crate::monitor::queued::QueuedKeys,
    /// Annotation `<prefix>sealed`: the job is sealed, which its QUEUED says.
    pub sealed: String,
}

impl RunnerKeys {
    /// The keys that go with `keys`.
    pub fn new(keys: &AnnotationKeys) -> Self {
        Self {
            cleanup_finalizer: keys.cleanup_finalizer(),
            accepted_by: keys.accepted_by.clone(),
            queued: crate::monitor::queued::QueuedKeys::new(&keys.prefix),
            sealed: keys.sealed.clone(),
        }
    }
}

/// Decorations the runner puts on the VolcanoJob.
#[derive(Debug, Clone, Copy)]
pub struct Decorations<'a> {
    pub runner_id: &'a str,
    pub traceparent: Option<&'a TraceParent>,
    /// Whether to add the cleanup finalizer (off only where no monitor runs to remove it).
    pub finalizer: bool,
    /// How long Volcano keeps the job after it finished (`[cluster] ended_job_retention`), set as its
    /// `ttlSecondsAfterFinished`: the ended job is the record of its submission for that long, and its
    /// garbage collector deletes it then. Set only with the finalizer: without it the monitor deletes an
    /// ended job at once, as there is no record to keep (see docs/monitor.md).
    pub retention: Option<std::time::Duration>,
}

/// Builds the plan for `desired`: the shared objects (queue, namespace, baseline policies), the VolcanoJob
/// and its companions, in apply order.
pub fn build(
    mut desired: DesiredJob,
    keys: &AnnotationKeys,
    runner_keys: &RunnerKeys,
    decorations: Decorations<'_>,
) -> Result<Vec<Step>, PlanError> {
    if let Some(tp) = decorations.traceparent {
        desired.set_traceparent(keys, tp.as_str());
    }
    let meta = &mut desired.vcjob.metadata;
    meta.annotations
        .get_or_insert_with(Default::default)
        .insert(
            runner_keys.accepted_by.clone(),
            decorations.runner_id.to_owned(),
        );
    if decorations.finalizer {
        let finalizers = meta.finalizers.get_or_insert_with(Vec::new);
        if !finalizers.contains(&runner_keys.cleanup_finalizer) {
            finalizers.push(runner_keys.cleanup_finalizer.clone());
        }
        if let Some(retention) = decorations.retention {
            desired.vcjob.spec.ttl_seconds_after_finished =
                Some(i32::try_from(retention.as_secs()).unwrap_or(i32::MAX));
            // Kept by the TTL, the job outlives its companions: the monitor deletes them at its end by
            // these names, with no list (see `cluster::end::delete_companions`).
            let companions = desired
                .companions
                .iter()
                .map(|c| {
                    format!(
                        "{}/{}",
                        c.kind(),
                        c.metadata().name.as_deref().unwrap_or_default()
                    )
                })
                .collect::<Vec<_>>()
                .join(",");
            desired
                .vcjob
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(keys.companions.clone(), companions);
        }
    }
    desired.objects().iter().map(step).collect()
}

/// The applier's step for one of the pipeline's objects: its role for the applier, and the object
/// written from its type, once, as the text the step holds (no JSON tree on the way: see
/// [`Step::from_typed`]).
pub fn step(object: &DesiredObject<'_>) -> Result<Step, PlanError> {
    let role = match (object.role, object.object) {
        (DesiredRole::Shared, _) => Role::Shared,
        (DesiredRole::Job, ObjectRef::VolcanoJob(_)) => Role::Primary,
        (DesiredRole::Companion, _) => Role::Companion,
        (role, _) => {
            return Err(PlanError(format!(
                "the pipeline gave a {} {} the role {role:?}, which the runner cannot apply",
                object.kind(),
                object.name()
            )));
        }
    };
    match object.object {
        ObjectRef::Queue(o) => Step::from_typed(o, role),
        ObjectRef::Namespace(o) => Step::from_typed(o, role),
        ObjectRef::NetworkPolicy(o) => Step::from_typed(o, role),
        ObjectRef::PersistentVolumeClaim(o) => Step::from_typed(o, role),
        ObjectRef::VolcanoJob(o) => Step::from_typed(o, role),
        ObjectRef::Service(o) => Step::from_typed(o, role),
    }
    .map_err(|e| PlanError(format!("{} (object {})", e.0, object.name())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::messages::v1::SubmitJob;

    fn example() -> SubmitJob {
        let text = include_str!("../../schemas/examples/submit-job.figlet.json");
        serde_json::from_str(text).expect("the example parses")
    }

    fn plan_for(config: &Config, decorations: Decorations<'_>) -> Vec<Step> {
        let desired = crate::pipeline::render(&example(), config, jiff::Timestamp::UNIX_EPOCH)
            .expect("the example renders");
        let keys = AnnotationKeys::new(&config.pipeline.annotation_prefix);
        build(desired, &keys, &RunnerKeys::new(&keys), decorations).expect("a plan")
    }

    #[test]
    fn roles_follow_the_pipeline_and_the_job_is_decorated() {
        let config = Config::default();
        let tp =
            TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let plan = plan_for(
            &config,
            Decorations {
                runner_id: "runner-a",
                traceparent: Some(&tp),
                finalizer: true,
                retention: Some(std::time::Duration::from_secs(86_400)),
            },
        );
        let roles: Vec<Role> = plan.iter().map(|s| s.role).collect();
        assert_eq!(roles.first(), Some(&Role::Shared), "{roles:?}");
        assert_eq!(plan[0].resource.kind, "Namespace");
        assert_eq!(
            roles.iter().filter(|r| **r == Role::Primary).count(),
            1,
            "{roles:?}"
        );
        let primary = plan.iter().position(|s| s.role == Role::Primary).unwrap();
        assert!(roles[primary + 1..].iter().all(|r| *r == Role::Companion));
        assert!(roles[..primary].iter().all(|r| *r != Role::Companion));

        let job = plan[primary].object().unwrap();
        let annotations = job.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations["ucloud.dk/acceptedBy"], "runner-a");
        assert_eq!(annotations["ucloud.dk/traceparent"], tp.as_str());
        assert_eq!(
            job.metadata.finalizers.as_deref(),
            Some(&["ucloud.dk/cleanup".to_owned()][..])
        );
        // Volcano keeps the ended job for the retention, then deletes it.
        assert_eq!(job.data["spec"]["ttlSecondsAfterFinished"], 86_400);
        // Its companions are named on it, for their deletion at its end without a list.
        let companions: Vec<String> = plan[primary + 1..]
            .iter()
            .map(|s| {
                format!(
                    "{}/{}",
                    s.resource.kind,
                    s.metadata.name.as_deref().unwrap()
                )
            })
            .collect();
        assert!(!companions.is_empty());
        assert_eq!(annotations["ucloud.dk/companions"], companions.join(","));
    }

    /// Each object of a rendered job (the shipped defaults: queue, namespace, baseline policies, the
    /// VolcanoJob, its companions) is sent as serde_json writes it: the step written from its type holds
    /// nothing more or less, in no other order.
    #[test]
    fn each_step_sends_its_object_as_serde_json_writes_it() {
        let config = Config::default();
        let desired = crate::pipeline::render(&example(), &config, jiff::Timestamp::UNIX_EPOCH)
            .expect("the example renders");
        let objects = desired.objects();
        assert!(objects.len() >= 4, "{}", objects.len());
        for object in &objects {
            let sent = step(object).unwrap().body(None).unwrap();
            assert_eq!(
                std::str::from_utf8(&sent).unwrap(),
                serde_json::to_string(object).unwrap(),
                "{} {}",
                object.kind(),
                object.name()
            );
        }
    }

    #[test]
    fn without_finalizer_or_trace_the_job_is_as_rendered_plus_its_acceptor() {
        let config = Config::default();
        let plan = plan_for(
            &config,
            Decorations {
                runner_id: "r",
                traceparent: None,
                finalizer: false,
                retention: Some(std::time::Duration::from_secs(86_400)),
            },
        );
        let job = plan
            .iter()
            .find(|s| s.role == Role::Primary)
            .unwrap()
            .object()
            .unwrap();
        assert_eq!(job.metadata.finalizers, None);
        // No finalizer, no record to keep: no TTL either (the monitor deletes the ended job).
        assert!(job.data["spec"].get("ttlSecondsAfterFinished").is_none());
        let annotations = job.metadata.annotations.as_ref().unwrap();
        assert!(!annotations.contains_key("ucloud.dk/traceparent"));
        assert!(!annotations.contains_key("ucloud.dk/companions"));
    }

    #[test]
    fn a_project_queue_comes_first_as_a_shared_object() {
        let mut config = Config::default();
        config.pipeline.scheduling.queue_per_project = true;
        let mut job = example();
        job.owner.get_or_insert_with(Default::default).project = Some("proj-1".into());
        let desired = crate::pipeline::render(&job, &config, jiff::Timestamp::UNIX_EPOCH).unwrap();
        let keys = AnnotationKeys::new("ucloud.dk/");
        let decorations = Decorations {
            runner_id: "r",
            traceparent: None,
            finalizer: true,
            retention: None,
        };
        let plan = build(desired, &keys, &RunnerKeys::new(&keys), decorations).unwrap();
        assert_eq!(plan[0].resource.kind, "Queue");
        assert_eq!(plan[0].role, Role::Shared);
    }
}
