//! Partial failure: a node lost with a rank on it, a rank's pod evicted. Volcano's policy restarts the
//! whole gang (`PodEvicted` → `RestartJob`) at most `maxRetry` attempts in all; the user is told each
//! restart with the rank and the node, or a FAILURE naming them when the attempts run out; the time
//! around a restart is charged once.

use crate::monitor_support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, EvictParams};
use monitor_support::*;
use volcano_runner::messages::v1::JobState;

/// Advances the simulated clock `step` seconds at a time until `done` holds (at most `max` steps).
async fn advance_until(
    w: &mut World,
    what: &str,
    step: u64,
    max: usize,
    done: impl Fn(&Seen) -> bool,
) {
    for _ in 0..max {
        if done(&w.seen) {
            return;
        }
        w.advance(step);
        w.settle(Duration::from_millis(150)).await;
    }
    assert!(done(&w.seen), "{what} never came: {:#?}", summary(&w.seen));
}

/// The node of a running pod, once it runs (the clock advanced a second at a time meanwhile).
async fn running_on(w: &mut World, ns: &str, pod: &str) -> String {
    for _ in 0..60 {
        if let Some(p) = w.pod(ns, pod)
            && p.pointer("/status/phase").and_then(|v| v.as_str()) == Some("Running")
            && p.pointer("/metadata/deletionTimestamp").is_none()
        {
            return p
                .pointer("/spec/nodeName")
                .and_then(|v| v.as_str())
                .expect("a running pod is bound")
                .to_owned();
        }
        w.advance(1);
        w.settle(Duration::from_millis(50)).await;
    }
    panic!("{pod} never ran:\n{}", w.dump().await);
}

/// The status event of the job's n-th restart: `<jobId>/restart/<n>/<hash of its text>`.
fn restart_event(seen: &Seen, job_id: &str, n: i32) -> volcano_runner::messages::v1::JobEvent {
    let prefix = format!("{job_id}/restart/{n}/");
    let found: Vec<_> = seen
        .of(job_id)
        .lifecycle
        .iter()
        .filter(|e| e.event_id.starts_with(&prefix))
        .cloned()
        .collect();
    assert_eq!(found.len(), 1, "one event for restart {n}: {found:?}");
    assert_eq!(
        found[0].event_id,
        format!(
            "{prefix}{}",
            volcano_runner::durable::ids::body_fingerprint16(found[0].status.as_bytes())
        )
    );
    found[0].clone()
}

fn restarts(seen: &Seen, job_id: &str) -> Vec<String> {
    seen.of(job_id)
        .lifecycle
        .iter()
        .filter(|e| e.reason == "restarting")
        .map(|e| format!("{} {}", e.event_id, e.status))
        .collect()
}

#[tokio::test]
async fn a_lost_node_restarts_the_whole_job_told_once_and_charged_once() {
    let mut w = World::start("mon-nodelost", |_| {}, |_| {}).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let mut submitted = job("d1", "echo starting; sleep 200; echo done");
    submitted.replicas = 2;
    let ns = w.namespace_of(&submitted);
    w.submit(&submitted).await;
    advance_until(&mut w, "RUNNING", 1, 30, |s| {
        s.event("d1/RUNNING").is_some()
    })
    .await;
    let first_start = ms(&w.seen.event("d1/RUNNING").unwrap().started_at);
    advance_until(&mut w, "the first tick", 10, 12, |s| {
        !s.unique_ticks().is_empty()
    })
    .await;

    // Rank 1's machine goes away: its Node object is deleted, the pod garbage collector removes the pod.
    let lost = running_on(&mut w, &ns, "j-d1-job-1").await;
    Api::<Node>::all(w.client.clone())
        .delete(&lost, &DeleteParams::default())
        .await
        .expect("the node is deleted");
    advance_until(&mut w, "the restart's status event", 5, 24, |s| {
        !restarts(s, "d1").is_empty()
    })
    .await;
    let told = restart_event(&w.seen, "d1", 1);
    assert_eq!(told.state, JobState::Unspecified as i32, "a status event");
    assert_eq!(
        told.status,
        format!(
            "The job is restarting after rank 1's node {lost} was lost (PodGC: node no longer exists): \
             every rank starts again (attempt 2 of 3)"
        )
    );
    // Both ranks run again, elsewhere.
    for rank in 0..2 {
        let node = running_on(&mut w, &ns, &format!("j-d1-job-{rank}")).await;
        assert_ne!(node, lost, "rank {rank} runs on a node that exists");
    }
    advance_until(&mut w, "SUCCESS", 10, 40, |s| {
        s.event("d1/SUCCESS").is_some()
    })
    .await;
    advance_until(&mut w, "the final tick", 10, 6, Seen::has_final_tick).await;
    w.settle(Duration::from_millis(300)).await;

    let seen = w.seen.of("d1");
    let states: Vec<&str> = seen
        .transitions()
        .iter()
        .map(|e| e.event_id.as_str())
        .collect();
    assert_eq!(
        states,
        ["d1/QUEUED", "d1/RUNNING", "d1/SUCCESS"],
        "RUNNING once"
    );
    assert_eq!(
        restarts(&seen, "d1").len(),
        1,
        "{:?}",
        restarts(&seen, "d1")
    );
    let success = seen.event("d1/SUCCESS").unwrap();
    assert_eq!(
        ms(&success.started_at),
        first_start,
        "the job started once, at its first start"
    );
    // One tick per period from the first start to the real end, the restart included once: no period
    // is charged twice, none is left out.
    let ticks = seen.unique_ticks();
    check_ticks("d1", &ticks, first_start, ms(&success.ended_at));
    let charged: i64 = ticks.iter().map(|t| t.duration_ms).sum();
    assert!(
        charged > 200_000,
        "the second run's 200 s and the time before it: {charged} ms"
    );
    // The record tells it too (`volcano-runner job d1`): the restart with its cause, and the ticks'
    // sum.
    let vcjob = Api::<volcano_runner::volcano::VolcanoJob>::namespaced(w.client.clone(), &ns)
        .get("j-d1")
        .await
        .expect("the ended job is kept as its record");
    let view = volcano_runner::cli::job::view(&vcjob, &w.keys).expect("a runner's job");
    assert_eq!(view.restarts.len(), 1, "{view:?}");
    assert_eq!(view.restarts[0].attempt, 2);
    assert!(
        view.restarts[0]
            .cause
            .contains(&format!("rank 1's node {lost} was lost")),
        "{view:?}"
    );
    assert_eq!(view.accounting.charged_ms, u64::try_from(charged).unwrap());
    assert!(
        view.history.iter().any(|h| h.state == "RESTARTING"),
        "{view:?}"
    );
    runner.stop().await;
    w.close().await;
}

#[tokio::test]
async fn evictions_past_max_retry_fail_the_job_naming_the_rank_and_node() {
    let mut w = World::start("mon-evicted", |_| {}, |_| {}).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let submitted = job("d2", "sleep 1000");
    let ns = w.namespace_of(&submitted);
    w.submit(&submitted).await;
    advance_until(&mut w, "RUNNING", 1, 30, |s| {
        s.event("d2/RUNNING").is_some()
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(w.client.clone(), &ns);
    let mut last_node = String::new();
    // maxRetry 3 (the default): three attempts in all, so the third eviction ends the job.
    for eviction in 1..=3 {
        last_node = running_on(&mut w, &ns, "j-d2-job-0").await;
        pods.evict("j-d2-job-0", &EvictParams::default())
            .await
            .expect("the pod is evicted");
        if eviction < 3 {
            advance_until(&mut w, "the restart's status event", 5, 24, |s| {
                restarts(s, "d2").len() == eviction
            })
            .await;
            let told = restart_event(&w.seen, "d2", eviction as i32);
            assert_eq!(
                told.status,
                format!(
                    "The job is restarting after rank 0's pod was evicted from node {last_node} \
                     (Eviction API: evicting): every rank starts again (attempt {} of 3)",
                    eviction + 1
                )
            );
        }
    }
    advance_until(&mut w, "FAILURE", 5, 40, |s| {
        s.event("d2/FAILURE").is_some()
    })
    .await;
    let failure = w.seen.event("d2/FAILURE").unwrap().clone();
    assert_eq!(failure.reason, "disrupted");
    assert_eq!(
        failure.status,
        format!(
            "The job failed after rank 0's pod was evicted from node {last_node} (Eviction API: \
             evicting): all 3 of its attempts (maxRetry) are used up"
        )
    );
    assert_eq!(
        restarts(&w.seen, "d2").len(),
        2,
        "{:?}",
        restarts(&w.seen, "d2")
    );
    runner.stop().await;
    w.close().await;
}
