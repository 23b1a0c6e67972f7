//! What the simulator keeps of a job that has ended (issue 46): a cluster keeps an ended VolcanoJob and
//! its finished pods for the job's `ttlSecondsAfterFinished` (the runner asks for a day), and the
//! simulator must not grow by a hundred KiB for each of them, nor keep every change it ever made for
//! watches. Measured with the store's own accounting (`SimHandle::footprint`), not the process's RSS.

use crate::sim_support;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, PostParams, WatchEvent, WatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use sim_support::*;
use volcano_runner::sim::store::HISTORY_FLOOR;

const JOBS: usize = 40;

/// What the simulator may keep per ended job (job, pod, events; the svc plugin's objects and the
/// PodGroup are gone): its JSON text is about 9 KiB; as JSON trees it took over 100 KiB.
const BOUND_PER_JOB: usize = 16 * 1024;

#[tokio::test]
async fn an_ended_job_costs_the_simulator_a_few_kib_and_reads_back_whole() {
    // No window: the history keeps only its floor, so what stays is what the store holds per job.
    let (sim, client) = start_with(|c| c.watch_window = Duration::ZERO).await;
    namespace(&client, "kept").await;
    let api = jobs(&client, "kept");
    let before = sim.footprint();
    for i in 0..JOBS {
        let mut job = appendix_a_job(
            &format!("j-{i}"),
            "kept",
            "busybox:1.36",
            &["sh", "-c", "sleep 5"],
        );
        job["spec"]["ttlSecondsAfterFinished"] = json!(86_400);
        api.create(&PostParams::default(), &dynamic(job))
            .await
            .unwrap();
    }
    sim.advance(Duration::from_secs(60));
    let listed = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), JOBS);
    assert!(
        listed.items.iter().all(|j| phase(j) == "Completed"),
        "every job ended"
    );

    let after = sim.footprint();
    let per_job = (after.object_bytes - before.object_bytes) / JOBS;
    eprintln!("per ended job: {per_job} bytes; {before:?} -> {after:?}");
    assert!(
        per_job <= BOUND_PER_JOB,
        "{per_job} bytes per ended job (bound {BOUND_PER_JOB})"
    );
    assert!(
        after.kept - before.kept >= 2 * JOBS,
        "each ended job and its pod kept as text: {before:?} -> {after:?}"
    );
    assert!(
        after.history <= HISTORY_FLOOR,
        "the history keeps its floor: {after:?}"
    );

    // Kept as text, read back whole: a pod as its watch saw it last, lists by label and field.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kept");
    let pod = pods.get("j-0-job-0").await.unwrap();
    assert_eq!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded")
    );
    let terminated = pod
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0]
        .state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap()
        .exit_code;
    assert_eq!(terminated, 0);
    let watched = pods
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let from_watch: Vec<Pod> = watched
        .take(JOBS)
        .map(|e| match e.unwrap() {
            WatchEvent::Added(p) => p,
            other => panic!("{other:?}"),
        })
        .collect()
        .await;
    let first = from_watch.iter().find(|p| p.name_any() == "j-0-job-0");
    assert_eq!(first, Some(&pod), "get and watch send the same object");

    merge(
        &pods,
        "j-1-job-0",
        json!({"metadata": {"labels": {"volcano-runner/ended": "true"}}}),
    )
    .await
    .unwrap();
    let unlabelled = pods
        .list(&ListParams::default().labels("!volcano-runner/ended"))
        .await
        .unwrap();
    assert_eq!(unlabelled.items.len(), JOBS - 1);
    assert!(unlabelled.items.iter().all(|p| p.name_any() != "j-1-job-0"));
    let labelled = pods
        .list(&ListParams::default().labels("volcano-runner/ended=true"))
        .await
        .unwrap();
    assert_eq!(labelled.items.len(), 1);
    let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    let on_node = pods
        .list(
            &ListParams::default().fields(&format!("spec.nodeName={node},status.phase=Succeeded")),
        )
        .await
        .unwrap();
    assert!(on_node.items.iter().any(|p| p.name_any() == "j-0-job-0"));
    assert!(
        on_node
            .items
            .iter()
            .all(|p| p.spec.as_ref().unwrap().node_name.as_deref() == Some(node.as_str()))
    );

    // At the end of its TTL the job goes with its pod, and its Events an hour after their last repeat.
    sim.advance(Duration::from_secs(86_400 + 60));
    assert!(
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let gone = sim.footprint();
    assert_eq!(
        (gone.objects, gone.kept),
        (before.objects, before.kept),
        "back to what it held before the jobs: {before:?} -> {gone:?}"
    );
}

/// The history is a window of recent changes, as a real API server's watch cache: a watch that resumes
/// from a version older than it gets 410 Gone (and a client lists again), however few changes were made
/// since, where the simulator used to keep the last hundred thousand changes however old.
#[tokio::test]
async fn a_watch_from_before_the_history_window_is_410_gone() {
    let (_sim, client) = start_with(|c| c.watch_window = Duration::from_millis(300)).await;
    namespace(&client, "window").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "window");
    let cm = |name: String| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
    };
    let old = api
        .create(&PostParams::default(), &cm("old".into()))
        .await
        .unwrap();
    // The change after `old` that a watch from its version would miss once it has left the window.
    api.create(&PostParams::default(), &cm("older".into()))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut last = None;
    for i in 0..HISTORY_FLOOR + 5 {
        last = Some(
            api.create(&PostParams::default(), &cm(format!("c{i}")))
                .await
                .unwrap(),
        );
    }
    let mut stream = watch_from(
        &api,
        &WatchParams::default(),
        &old.resource_version().unwrap(),
    )
    .await;
    match tokio::time::timeout(Duration::from_secs(10), stream.try_next())
        .await
        .expect("an answer in time")
    {
        Ok(Some(WatchEvent::Error(e))) => assert_eq!(e.code, 410, "{e:?}"),
        other => panic!("expected 410 Gone, got {other:?}"),
    }
    // A watch from a recent version resumes.
    let recent = last.unwrap().resource_version().unwrap();
    let mut stream = watch_from(&api, &WatchParams::default(), &recent).await;
    api.create(&PostParams::default(), &cm("new".into()))
        .await
        .unwrap();
    match tokio::time::timeout(Duration::from_secs(10), stream.try_next())
        .await
        .expect("an answer in time")
    {
        Ok(Some(WatchEvent::Added(o))) => assert_eq!(o.name_any(), "new"),
        other => panic!("expected the new object, got {other:?}"),
    }
}

/// What a change costs the history once it is a second old (issue 46: ~20 KiB each as trees, and at the
/// benchmark's rates the 100,000-change cap bound first): its watch line and what selectors read, a few
/// KiB. And a watch that resumes from before the changes gets exactly what watches open at the time
/// got, whole or metadata only, with a selector that the changes take objects out of (a DELETED event
/// carrying the object as it was) or none.
#[tokio::test]
async fn a_change_in_the_history_costs_its_text_and_a_watch_from_it_sees_what_a_live_watch_saw() {
    let (sim, client) = start().await;
    namespace(&client, "hist").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "hist");
    let from = version_now(&pods).await;
    let running = || WatchParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
    let labelled = || WatchParams::default().labels("volcano.sh/job-name");
    let watches = || async {
        vec![
            pods.watch(&WatchParams::default(), &from)
                .await
                .unwrap()
                .map_ok(|e| format!("{e:?}"))
                .boxed(),
            pods.watch(&running(), &from)
                .await
                .unwrap()
                .map_ok(|e| format!("{e:?}"))
                .boxed(),
            pods.watch_metadata(&labelled(), &from)
                .await
                .unwrap()
                .map_ok(|e| format!("{e:?}"))
                .boxed(),
        ]
    };
    let live = watches().await;
    let api = jobs(&client, "hist");
    for i in 0..JOBS {
        let job = appendix_a_job(
            &format!("j-{i}"),
            "hist",
            "busybox:1.36",
            &["sh", "-c", "sleep 5"],
        );
        api.create(&PostParams::default(), &dynamic(job))
            .await
            .unwrap();
    }
    sim.advance(Duration::from_secs(60));
    // Every change is over a second old by the next change, which compacts them.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "hist");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "after"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();

    async fn drain(s: futures::stream::BoxStream<'_, kube::Result<String>>) -> Vec<String> {
        let mut s = s;
        let mut out = Vec::new();
        while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(1_000), s.next()).await {
            out.push(e.unwrap());
        }
        out
    }
    let resumed = watches().await;
    for (i, (l, r)) in live.into_iter().zip(resumed).enumerate() {
        let (l, r) = (drain(l).await, drain(r).await);
        assert!(l.len() >= 3 * JOBS, "watch {i}: {} events", l.len());
        assert_eq!(
            l, r,
            "watch {i}: a resumed watch sees what the live one saw"
        );
        if i == 1 {
            let left = l.iter().filter(|e| e.starts_with("Deleted")).count();
            assert_eq!(left, JOBS, "each pod left the selection once it finished");
        }
    }

    let f = sim.footprint();
    let per_change = f.history_bytes / f.history.max(1);
    eprintln!("per change held in the history: {per_change} bytes; {f:?}");
    assert!(
        f.history > 8 * JOBS,
        "the changes are in the history: {f:?}"
    );
    assert!(
        per_change <= BOUND_PER_CHANGE,
        "{per_change} bytes per change (bound {BOUND_PER_CHANGE})"
    );
}

/// What the history may hold per change once compacted (its line is 1 to 5 KiB of JSON); as trees a
/// change took about 20 KiB.
const BOUND_PER_CHANGE: usize = 4 * 1024;
