//! Reads and writes of VolcanoJobs by job id, for the runner's handlers and the session issuer: find a
//! job by its id, change its annotations with optimistic concurrency, end it (Volcano's `TerminateJob`
//! command; the job is kept, never deleted).
//! (Creating a job is the [`crate::cluster::Applier`]'s business.)
//!
//! A cancel or an extension names only the job id, and with per-owner namespaces the namespace is not
//! known from it: the job is found by name across namespaces (a list with a field selector on
//! `metadata.name`, narrowed by the managed-by label). With one shared namespace it is a plain GET.
//!
//! A submission only needs that read when a job of its id may exist: [`JobStore::follow`] keeps the names
//! of every managed job from a metadata watch, and [`JobStore::find_if_known`] answers "none" from it
//! without a request. A job the watch has not seen yet is still caught: in the same namespace (a
//! redelivery, the same owner) the create answers 409 and the applier compares it; a job of another
//! owner with the same id is a broken orchestrator, caught once the watch has it. The same watch keeps
//! the whole nodes each job holds, for the per-owner limits ([`super::whole_nodes`]).

use std::future::Future;
use std::sync::Arc;

use jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::watcher;

use crate::cluster::labels::FIELD_MANAGER;
use crate::cluster::view::{WatchView, has_name};
use crate::cluster::{ClusterError, KubeResultExt, RetryPolicy};
use crate::durable::AnnotationKeys;
use crate::pipeline::names::{self, MANAGED_BY, MANAGED_BY_LABEL};
use crate::pipeline::{NamespaceMode, PipelineConfig};
use crate::volcano::VolcanoJob;

use super::whole_nodes::{Hold, HoldMeta, Ledger};

/// Lifecycle states after which a job has had its terminal event.
const TERMINAL_STATES: [&str; 4] = ["SUCCESS", "FAILURE", "EXPIRED", "CANCELLED"];

/// Where jobs live and how to reach them.
#[derive(Clone)]
pub struct JobStore {
    client: kube::Client,
    retry: RetryPolicy,
    /// `Some(ns)` when every job lives in one namespace.
    single_namespace: Option<String>,
    /// The managed jobs a metadata watch has seen: names, namespaces and the whole nodes each holds.
    names: WatchView<Option<Hold>>,
    /// The annotation keys, to read what a job holds.
    keys: AnnotationKeys,
    /// Whole-node jobs this runner created that the watch may not show yet; whole-node submissions
    /// hold it from their check to their create ([`super::whole_nodes`]).
    whole_nodes: Arc<tokio::sync::Mutex<Ledger>>,
}

impl std::fmt::Debug for JobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobStore")
            .field("single_namespace", &self.single_namespace)
            .finish_non_exhaustive()
    }
}

impl JobStore {
    /// The store for the pipeline's placement rules, retrying as `[cluster]` says.
    pub fn new(
        client: kube::Client,
        pipeline: &PipelineConfig,
        cluster: &super::ClusterConfig,
    ) -> Self {
        let per_owner =
            pipeline.plugins.fair_share && pipeline.namespace.mode == NamespaceMode::PerOwner;
        Self {
            client,
            retry: RetryPolicy::from_config(cluster),
            single_namespace: (!per_owner).then(|| pipeline.namespace.name.clone()),
            names: WatchView::default(),
            keys: pipeline.keys().into_owned(),
            whole_nodes: Arc::default(),
        }
    }

    /// The whole-node ledger, locked: a whole-node submission holds it from its limit check until its
    /// job exists (and is recorded in it), so the submissions of one runner are counted one at a time.
    pub async fn lock_whole_nodes(&self) -> tokio::sync::OwnedMutexGuard<Ledger> {
        self.whole_nodes.clone().lock_owned().await
    }

    /// Every whole node held, by every managed job: from the watch when it has listed, else from a list
    /// of the jobs' metadata; plus what `ledger` holds of this runner's creates the watch does not show.
    pub async fn whole_node_holds(&self, ledger: &mut Ledger) -> Result<Vec<Hold>, ClusterError> {
        let now = tokio::time::Instant::now();
        if let Some(holds) = self.names.read(|live| ledger.holds(live, now)) {
            return Ok(holds);
        }
        let api: Api<VolcanoJob> = match &self.single_namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let params = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
        let op = "list the managed VolcanoJobs' metadata to count whole nodes".to_owned();
        let list = self
            .retry
            .run(&op, || async {
                api.list_metadata(&params).await.classify(|| op.clone())
            })
            .await?;
        let view: Vec<((String, String), Option<Hold>)> = list
            .items
            .iter()
            .map(|j| {
                let key = (
                    j.metadata.name.clone().unwrap_or_default(),
                    j.metadata.namespace.clone().unwrap_or_default(),
                );
                (key, Hold::of(&j.metadata, &self.keys))
            })
            .collect();
        Ok(ledger.holds(view.iter().map(|(k, h)| (k, h)), now))
    }

    /// [`JobStore::find`], unless the watch ([`JobStore::follow`]) has listed and knows no job of this
    /// id: then `None` without a request. A job created a moment ago by another runner may be missing
    /// from the watch; callers that go on to create the job meet it as the create's 409.
    pub async fn find_if_known(&self, job_id: &str) -> Result<Option<VolcanoJob>, ClusterError> {
        let name = names::vcjob_name(job_id);
        if self.names.read(|live| has_name(live, &name)) == Some(false) {
            return Ok(None);
        }
        self.find(job_id).await
    }

    /// Keeps the names of [`JobStore::find_if_known`] with a metadata watch of the managed jobs (in
    /// every namespace), until `shutdown`. A watch error makes every lookup read until it has listed
    /// again.
    pub async fn follow(&self, shutdown: impl Future<Output = ()>) {
        // Metadata only (the names and what a job holds are all this needs, not the jobs' specs), and
        // of the metadata only what the view keeps ([`HoldMeta`]).
        let api: Api<HoldMeta> = match &self.single_namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let config = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
        let keys = &self.keys;
        self.names
            .follow(
                api,
                config,
                "managed jobs' metadata",
                |job| Hold::of(&job.metadata, keys),
                shutdown,
            )
            .await;
    }

    /// The VolcanoJob of `job_id`, wherever it lives; `None` when there is none.
    pub async fn find(&self, job_id: &str) -> Result<Option<VolcanoJob>, ClusterError> {
        let name = names::vcjob_name(job_id);
        if let Some(ns) = &self.single_namespace {
            let api: Api<VolcanoJob> = Api::namespaced(self.client.clone(), ns);
            let op = format!("get VolcanoJob {ns}/{name}");
            return self
                .retry
                .run(&op, || async {
                    api.get_opt(&name).await.classify(|| op.clone())
                })
                .await;
        }
        let api: Api<VolcanoJob> = Api::all(self.client.clone());
        let params = ListParams::default()
            .fields(&format!("metadata.name={name}"))
            .labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
        let op = format!("find VolcanoJob {name} in every namespace");
        let list = self
            .retry
            .run(&op, || async {
                api.list(&params).await.classify(|| op.clone())
            })
            .await?;
        // The oldest if several owners used the same id (only the first one is the job; see submit).
        Ok(list
            .items
            .into_iter()
            .min_by_key(|j| j.metadata.creation_timestamp.as_ref().map(|t| t.0)))
    }

    /// Applies a merge patch (carrying the observed `resourceVersion`, so a concurrent change answers 409
    /// Conflict) and returns the job as it is now.
    pub async fn patch(
        &self,
        job: &VolcanoJob,
        patch: &serde_json::Value,
    ) -> Result<VolcanoJob, ClusterError> {
        let (ns, name) = namespace_and_name(job);
        let api: Api<VolcanoJob> = Api::namespaced(self.client.clone(), ns);
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let op = format!("patch VolcanoJob {ns}/{name}");
        // A 409 is not retried here with the same stale resourceVersion: the caller re-reads and decides
        // again. Everything else transient is retried within the budget.
        self.retry
            .run(&op, || async {
                match api
                    .patch(name, &params, &Patch::Merge(patch))
                    .await
                    .classify(|| op.clone())
                {
                    Err(e) if e.is_conflict() => Ok(Err(e)),
                    Ok(job) => Ok(Ok(job)),
                    Err(e) => Err(e),
                }
            })
            .await?
    }

    /// Sets one annotation on the job described by `meta` with a merge patch, in one attempt (no
    /// retries: for a write whose absence is safe). A job that is gone is fine.
    pub async fn annotate_once(
        &self,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        key: &str,
        value: &str,
    ) -> Result<(), ClusterError> {
        let ns = meta.namespace.as_deref().unwrap_or_default();
        let name = meta.name.as_deref().unwrap_or_default();
        let api: Api<VolcanoJob> = Api::namespaced(self.client.clone(), ns);
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
        let op = format!("annotate VolcanoJob {ns}/{name}");
        match api
            .patch(name, &params, &Patch::Merge(&patch))
            .await
            .classify(|| op.clone())
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Ends the job with Volcano's `TerminateJob` command ([`crate::cluster::end::terminate`]): its pods
    /// stop, the job stays `Terminated` as the record of its submission until its TTL. Nothing when it is
    /// ending already; a Command not taken yet (the same name) counts as done.
    pub async fn terminate(&self, job: &VolcanoJob) -> Result<(), ClusterError> {
        crate::cluster::end::terminate(&self.client, &self.retry, job).await
    }
}

fn namespace_and_name(job: &VolcanoJob) -> (&str, &str) {
    (
        job.metadata.namespace.as_deref().unwrap_or_default(),
        job.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// An annotation of the job.
pub fn annotation<'a>(job: &'a VolcanoJob, key: &str) -> Option<&'a str> {
    job.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Whether the job has had (or is having) its end: a terminal lifecycle state was published, its outcome
/// recorded, Volcano is ending or has finished it (a `TerminateJob` leaves it `Terminating`, then
/// `Terminated`), or it is being deleted (by an older runner, or by Volcano's TTL).
pub fn is_over(job: &VolcanoJob, keys: &AnnotationKeys) -> bool {
    let state = annotation(job, &keys.lifecycle_state).map(|s| s.trim_start_matches("JOB_STATE_"));
    state.is_some_and(|s| TERMINAL_STATES.contains(&s))
        || annotation(job, &keys.outcome).is_some()
        || crate::cluster::end::is_ending(job)
}

/// When the job was created (the QUEUED event's time); the epoch if the server did not say.
pub fn created_at(job: &VolcanoJob) -> Timestamp {
    job.metadata
        .creation_timestamp
        .as_ref()
        .map_or(Timestamp::UNIX_EPOCH, |t| t.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volcano::{JobPhase, JobState, JobStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn job(state: Option<&str>, phase: Option<JobPhase>) -> VolcanoJob {
        let mut job = VolcanoJob::default();
        if let Some(state) = state {
            job.metadata.annotations =
                Some([("ucloud.dk/lifecycleState".to_owned(), state.to_owned())].into());
        }
        if let Some(phase) = phase {
            job.status = Some(JobStatus {
                state: JobState {
                    phase,
                    ..JobState::default()
                },
                ..JobStatus::default()
            });
        }
        job
    }

    #[test]
    fn a_job_is_over_once_terminal_recorded_ending_finished_or_deleted() {
        let keys = AnnotationKeys::new("ucloud.dk/");
        assert!(!is_over(&job(None, None), &keys));
        assert!(!is_over(
            &job(Some("QUEUED"), Some(JobPhase::Running)),
            &keys
        ));
        assert!(is_over(&job(Some("SUCCESS"), None), &keys));
        assert!(is_over(&job(Some("JOB_STATE_CANCELLED"), None), &keys));
        assert!(is_over(&job(None, Some(JobPhase::Failed)), &keys));
        assert!(is_over(&job(None, Some(JobPhase::Terminating)), &keys));
        assert!(is_over(&job(None, Some(JobPhase::Terminated)), &keys));
        let mut recorded = job(None, Some(JobPhase::Running));
        recorded.metadata.annotations =
            Some([("ucloud.dk/outcome".to_owned(), "{}".to_owned())].into());
        assert!(is_over(&recorded, &keys));
        let mut deleting = job(None, Some(JobPhase::Running));
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert!(is_over(&deleting, &keys));
    }
}
