//! Ending a VolcanoJob without deleting it, so that the ended job stays, as Volcano keeps it, the record of
//! its submission (see docs/monitor.md, "Cleanup exactly once").
//!
//! - [`terminate`]: Volcano's own job command, a `bus.volcano.sh/v1alpha1` `Command` with the action
//!   `TerminateJob` aimed at the job. Volcano's job controller deletes the Command before it runs the
//!   action (a Command never runs twice), stops the pods and leaves the job `Terminated`, which its garbage
//!   collector deletes `ttlSecondsAfterFinished` later. `TerminateJob`, not `AbortJob`: an `Aborted` job
//!   is resumable, and the garbage collector never counts its TTL. The Command's name is a function of
//!   the job's, so a cancel redelivered before Volcano took the Command meets AlreadyExists (done).
//! - [`delete_companions`]: the objects the runner created beside the job that hold something or are
//!   found by others (its Services, among them a public IP's LoadBalancer, its peers' EndpointSlice)
//!   are owned by the job and would live as long as the kept job (the retention, 24 h): they are deleted
//!   at the end instead. Its NetworkPolicy is not: it selects only the job's own pods, which are gone, so
//!   it holds nothing and is left to the garbage collector, which deletes it with the job at the TTL
//!   (through its ownerReference). That spares a delete per job, the one companion a batch job has
//!   ([`deletes_companions_at_end`] says whether a job has any companion to delete).
//! - [`terminated_at`], [`has_ttl`]: what the job itself says about its end, for the readers that
//!   used to look at the deletion timestamp.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use kube::core::Resource;
use serde::de::DeserializeOwned;

use super::error::{ClusterError, KubeResultExt};
use super::retry::RetryPolicy;
use crate::durable::AnnotationKeys;
use crate::volcano::VolcanoJob;

/// The action of the Command that ends a job.
pub const TERMINATE: &str = "TerminateJob";

/// `bus.volcano.sh/v1alpha1` `Command` (plural `commands`).
pub fn command_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("bus.volcano.sh", "v1alpha1", "Command"),
        "commands",
    )
}

/// The name of the job's TerminateJob Command: one per job, so that every runner that ends the job
/// (a redelivered cancel, a monitor taking over) asks under the same name.
pub fn command_name(job_name: &str) -> String {
    format!("{job_name}-terminate")
}

/// The Command that terminates `job`, as `vcctl job terminate` writes it: the action, the job as its
/// `target` (an ownerReference, uid included) and as its owner, so an untaken Command goes with the job.
/// Without `blockOwnerDeletion`, which would need a grant on the job's `finalizers` subresource.
pub fn terminate_command(job: &VolcanoJob) -> serde_json::Value {
    let name = job.metadata.name.as_deref().unwrap_or_default();
    let target = serde_json::json!({
        "apiVersion": <VolcanoJob as k8s_openapi::Resource>::API_VERSION,
        "kind": <VolcanoJob as k8s_openapi::Resource>::KIND,
        "name": name,
        "uid": job.metadata.uid.as_deref().unwrap_or_default(),
    });
    serde_json::json!({
        "apiVersion": "bus.volcano.sh/v1alpha1",
        "kind": "Command",
        "metadata": {
            "name": command_name(name),
            "namespace": job.metadata.namespace.as_deref().unwrap_or_default(),
            "ownerReferences": [target.clone()],
        },
        "action": TERMINATE,
        "target": target,
    })
}

/// Whether Volcano has taken the job's end in hand already (or it is being deleted, as an older runner
/// did): a Command now would do nothing but cost a call.
pub fn is_ending(job: &VolcanoJob) -> bool {
    job.metadata.deletion_timestamp.is_some() || job.phase().is_ending()
}

/// Asks Volcano to terminate `job` (see the module documentation). Nothing when it is ending already;
/// AlreadyExists (the same Command, not taken yet) is done. A NotFound is not: the job was just read, so
/// its namespace exists, and the likeliest cause is a cluster that does not serve Volcano's `commands`,
/// which must be seen, not taken for an end.
pub async fn terminate(
    client: &kube::Client,
    retry: &RetryPolicy,
    job: &VolcanoJob,
) -> Result<(), ClusterError> {
    if is_ending(job) {
        return Ok(());
    }
    let ns = job.metadata.namespace.as_deref().unwrap_or_default();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &command_resource());
    let command: DynamicObject = serde_json::from_value(terminate_command(job))
        .map_err(kube::Error::SerdeError)
        .classify(|| "build the TerminateJob command".to_owned())?;
    let op = format!(
        "create commands.bus.volcano.sh {ns}/{}",
        command.metadata.name.as_deref().unwrap_or_default()
    );
    match retry
        .run(&op, || async {
            api.create(&PostParams::default(), &command)
                .await
                .classify(|| op.clone())
        })
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_already_exists() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Deletes the objects the runner created beside `job` that must not outlive its end, and the peers'
/// EndpointSlice the monitor wrote: the Services named in its `<prefix>companions` (recorded at its
/// create), and the EndpointSlice of its peers Service when it has peers. Gone already is fine. The
/// names are the job's own (they carry its id), and the job ends once. Its NetworkPolicy is left to the
/// garbage collector (see the module documentation).
pub async fn delete_companions(
    client: &kube::Client,
    retry: &RetryPolicy,
    job: &VolcanoJob,
    keys: &AnnotationKeys,
) -> Result<(), ClusterError> {
    let ns = job.metadata.namespace.as_deref().unwrap_or_default();
    let name = job.metadata.name.as_deref().unwrap_or_default();
    for (kind, object) in recorded_companions(job, keys) {
        match kind {
            "Service" => {
                let api: Api<Service> = Api::namespaced(client.clone(), ns);
                delete_one(retry, &api, ns, object).await?;
            }
            // Holds nothing once the job's pods are gone: deleted with the job at its TTL.
            "NetworkPolicy" => {}
            other => tracing::warn!(
                job = %name,
                kind = other,
                object,
                "A companion of a kind this runner does not delete is left to the job's TTL."
            ),
        }
    }
    if has_peers(job, keys)
        && let Some(job_id) = crate::pipeline::names::job_id_from_vcjob_name(name)
    {
        let slice = crate::pipeline::plugins::connect_to_job::peers_service_name(job_id);
        let api: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
        delete_one(retry, &api, ns, &slice).await?;
    }
    Ok(())
}

/// Whether [`delete_companions`] has anything to delete for `job`: a Service of its own or a peers'
/// EndpointSlice. A batch job has neither, so its end costs no delete, and its finalizer can go in the
/// write that records its end.
pub fn deletes_companions_at_end(job: &VolcanoJob, keys: &AnnotationKeys) -> bool {
    has_peers(job, keys) || recorded_companions(job, keys).any(|(kind, _)| kind != "NetworkPolicy")
}

/// The `(kind, name)` of each companion named at create. Only a job kept by a TTL carries the names,
/// and only such a job is released this way: one an older runner created without a TTL is deleted in
/// the foreground, its companions with it.
fn recorded_companions<'a>(
    job: &'a VolcanoJob,
    keys: &AnnotationKeys,
) -> impl Iterator<Item = (&'a str, &'a str)> {
    job.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&keys.companions))
        .into_iter()
        .flat_map(|list| list.split(','))
        .filter_map(|c| c.split_once('/'))
}

fn has_peers(job: &VolcanoJob, keys: &AnnotationKeys) -> bool {
    job.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(&keys.peers))
}

/// Deletes `name`; gone already is done.
async fn delete_one<K>(
    retry: &RetryPolicy,
    api: &Api<K>,
    ns: &str,
    name: &str,
) -> Result<(), ClusterError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let plural = K::plural(&K::DynamicType::default()).into_owned();
    let op = format!("delete {plural} {ns}/{name}");
    let params = DeleteParams::default();
    match retry
        .run(&op, || async {
            api.delete(name, &params).await.classify(|| op.clone())
        })
        .await
    {
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
        Ok(_) => Ok(()),
    }
}

/// When the job was asked to end, by the annotation its ender wrote with the cause (`terminationAt`), or
/// by its deletion timestamp (a job an older runner deleted). `None`: nobody asked it to end.
pub fn terminated_at(job: &VolcanoJob, keys: &AnnotationKeys) -> Option<jiff::Timestamp> {
    job.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&keys.termination_at))
        .and_then(|v| crate::durable::annotations::parse_millis(v))
        .or_else(|| job.metadata.deletion_timestamp.as_ref().map(|t| t.0))
}

/// Whether the job carries `ttlSecondsAfterFinished`: Volcano deletes it once it has finished, so it
/// is kept by the TTL, not by a deletion held by our finalizer (jobs created before the TTL was set).
pub fn has_ttl(job: &VolcanoJob) -> bool {
    job.spec.ttl_seconds_after_finished.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_names_the_job_by_name_and_uid_and_is_named_after_it() {
        let mut job = VolcanoJob::default();
        job.metadata.name = Some("j-42".into());
        job.metadata.namespace = Some("jobs".into());
        job.metadata.uid = Some("u-1".into());
        let c = terminate_command(&job);
        assert_eq!(c["metadata"]["name"], "j-42-terminate");
        assert_eq!(c["metadata"]["namespace"], "jobs");
        assert_eq!(c["action"], "TerminateJob");
        assert_eq!(c["target"]["kind"], "Job");
        assert_eq!(c["target"]["apiVersion"], "batch.volcano.sh/v1alpha1");
        assert_eq!(c["target"]["name"], "j-42");
        assert_eq!(c["target"]["uid"], "u-1");
        assert_eq!(c["metadata"]["ownerReferences"][0]["uid"], "u-1");
        let command: DynamicObject = serde_json::from_value(c).expect("a Command object");
        assert_eq!(command.metadata.name.as_deref(), Some("j-42-terminate"));
    }

    #[test]
    fn the_end_is_read_from_the_annotation_else_the_deletion() {
        let keys = AnnotationKeys::new("ucloud.dk/");
        let mut job = VolcanoJob::default();
        assert_eq!(terminated_at(&job, &keys), None);
        let deleted = jiff::Timestamp::from_second(2_000).unwrap();
        job.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(deleted),
        );
        assert_eq!(terminated_at(&job, &keys), Some(deleted));
        job.metadata.annotations = Some([(keys.termination_at.clone(), "1000000".into())].into());
        assert_eq!(
            terminated_at(&job, &keys),
            Some(jiff::Timestamp::from_second(1_000).unwrap())
        );
    }
}
