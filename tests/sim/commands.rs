//! Volcano's job commands (`bus.volcano.sh/v1alpha1` Command) in the simulator, as the runner would use
//! them to end a job without deleting it: the controller deletes the Command, then runs its action.
//! TerminateJob ends a job as `Terminated` (its pods go, its capacity is freed, no deletion timestamp)
//! and `ttlSecondsAfterFinished` then collects it; AbortJob ends it as `Aborted`, which the TTL does
//! not collect (a ResumeJob can take it back). Volcano's own code (pkg/controllers/job/state,
//! pkg/controllers/garbagecollector) is the reference.

use crate::sim_support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use sim_support::*;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn commands(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("bus.volcano.sh", "v1alpha1", "Command"),
        "commands",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// A Command as `vcctl job suspend` writes one: the action and the job as its target.
fn command(name: &str, ns: &str, action: &str, job: &DynamicObject) -> DynamicObject {
    dynamic(json!({
        "apiVersion": "bus.volcano.sh/v1alpha1", "kind": "Command",
        "metadata": {"name": name, "namespace": ns},
        "action": action,
        "target": {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                   "name": job.name_any(), "uid": job.uid().unwrap()},
    }))
}

async fn pods_of(client: &kube::Client, ns: &str, job: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("volcano.sh/job-name={job}")))
        .await
        .unwrap()
        .items
}

#[tokio::test]
async fn terminate_ends_a_running_job_as_terminated_frees_it_and_the_ttl_collects_it() {
    let (sim, client) = start().await;
    namespace(&client, "cmd").await;
    let api = jobs(&client, "cmd");
    let mut hog = gang_job("hog", "cmd", 5, "16", &["sleep", "infinity"]);
    hog["spec"]["ttlSecondsAfterFinished"] = json!(60);
    api.create(&PostParams::default(), &dynamic(hog))
        .await
        .unwrap();
    api.create(
        &PostParams::default(),
        &dynamic(gang_job("next", "cmd", 1, "4", &["sleep", "infinity"])),
    )
    .await
    .unwrap();
    sim.advance(secs(1));
    let job = api.get("hog").await.unwrap();
    assert_eq!(phase(&job), "Running");
    assert_eq!(phase(&api.get("next").await.unwrap()), "Pending");

    let cmds = commands(&client, "cmd");
    cmds.create(
        &PostParams::default(),
        &command("hog-terminate", "cmd", "TerminateJob", &job),
    )
    .await
    .unwrap();
    // Taken at once, and deleted before it is run, so that it runs at most once.
    assert!(
        cmds.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let j = api.get("hog").await.unwrap();
    assert_eq!(phase(&j), "Terminating");
    assert_eq!(
        j.data["status"]["state"]["reason"],
        "TerminateJob by command"
    );
    assert!(
        pods_of(&client, "cmd", "hog")
            .await
            .iter()
            .all(|p| p.metadata.deletion_timestamp.is_some()),
        "every pod is being stopped"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), "cmd");
    assert!(
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("CommandIssued")
                && e.involved_object.name.as_deref() == Some("hog")),
        "the job's events say a command was issued"
    );

    sim.advance(secs(1));
    let j = api.get("hog").await.unwrap();
    assert_eq!(phase(&j), "Terminated");
    assert!(
        j.metadata.deletion_timestamp.is_none(),
        "ended, not being deleted"
    );
    assert!(pods_of(&client, "cmd", "hog").await.is_empty());
    // Its capacity went to the waiting job.
    sim.advance(secs(1));
    assert_eq!(phase(&api.get("next").await.unwrap()), "Running");

    // A second TerminateJob against an ended job changes nothing.
    cmds.create(
        &PostParams::default(),
        &command("hog-terminate-2", "cmd", "TerminateJob", &j),
    )
    .await
    .unwrap();
    sim.advance(secs(1));
    assert_eq!(phase(&api.get("hog").await.unwrap()), "Terminated");

    // The record stays until ttlSecondsAfterFinished after the end, then Volcano deletes it.
    sim.advance(secs(50));
    assert_eq!(phase(&api.get("hog").await.unwrap()), "Terminated");
    sim.advance(secs(10));
    assert_eq!(code(&api.get("hog").await.unwrap_err()), 404);
}

#[tokio::test]
async fn terminate_ends_a_pending_job_without_ever_starting_it() {
    let (sim, client) = start().await;
    namespace(&client, "cmdp").await;
    let api = jobs(&client, "cmdp");
    // More than any node has: never scheduled.
    api.create(
        &PostParams::default(),
        &dynamic(gang_job("huge", "cmdp", 1, "1000", &["sleep", "5"])),
    )
    .await
    .unwrap();
    sim.advance(secs(1));
    let job = api.get("huge").await.unwrap();
    assert_eq!(phase(&job), "Pending");
    commands(&client, "cmdp")
        .create(
            &PostParams::default(),
            &command("huge-terminate", "cmdp", "TerminateJob", &job),
        )
        .await
        .unwrap();
    sim.advance(secs(1));
    assert_eq!(phase(&api.get("huge").await.unwrap()), "Terminated");
    sim.advance(secs(60));
    assert_eq!(phase(&api.get("huge").await.unwrap()), "Terminated");
    assert!(pods_of(&client, "cmdp", "huge").await.is_empty());
}

#[tokio::test]
async fn an_aborted_job_is_not_collected_by_the_ttl_and_resumes() {
    let (sim, client) = start().await;
    namespace(&client, "cmda").await;
    let api = jobs(&client, "cmda");
    let mut job = gang_job("paused", "cmda", 2, "1", &["sleep", "infinity"]);
    job["spec"]["ttlSecondsAfterFinished"] = json!(5);
    api.create(&PostParams::default(), &dynamic(job))
        .await
        .unwrap();
    sim.advance(secs(1));
    let job = api.get("paused").await.unwrap();
    assert_eq!(phase(&job), "Running");
    let cmds = commands(&client, "cmda");
    cmds.create(
        &PostParams::default(),
        &command("paused-abort", "cmda", "AbortJob", &job),
    )
    .await
    .unwrap();
    sim.advance(secs(1));
    let j = api.get("paused").await.unwrap();
    assert_eq!(phase(&j), "Aborted");
    assert!(pods_of(&client, "cmda", "paused").await.is_empty());
    // Aborted is not an end for Volcano's garbage collector.
    sim.advance(secs(30));
    assert_eq!(phase(&api.get("paused").await.unwrap()), "Aborted");

    cmds.create(
        &PostParams::default(),
        &command("paused-resume", "cmda", "ResumeJob", &j),
    )
    .await
    .unwrap();
    sim.advance(secs(1));
    let j = api.get("paused").await.unwrap();
    assert_eq!(j.data["status"]["retryCount"], 1);
    sim.advance(secs(2));
    assert_eq!(phase(&api.get("paused").await.unwrap()), "Running");
    assert_eq!(pods_of(&client, "cmda", "paused").await.len(), 2);
}

#[tokio::test]
async fn a_command_aimed_at_something_else_is_left_alone() {
    let (sim, client) = start().await;
    namespace(&client, "cmdx").await;
    let api = jobs(&client, "cmdx");
    api.create(
        &PostParams::default(),
        &dynamic(gang_job("keep", "cmdx", 1, "1", &["sleep", "infinity"])),
    )
    .await
    .unwrap();
    sim.advance(secs(1));
    let job = api.get("keep").await.unwrap();
    let mut other = command("not-for-volcano", "cmdx", "TerminateJob", &job);
    other.data["target"]["apiVersion"] = Value::from("example.com/v1");
    let cmds = commands(&client, "cmdx");
    cmds.create(&PostParams::default(), &other).await.unwrap();
    sim.advance(secs(1));
    assert_eq!(phase(&api.get("keep").await.unwrap()), "Running");
    assert_eq!(
        cmds.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
}
