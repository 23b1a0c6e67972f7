//! Partial failure: a node lost with a rank on it, a rank's pod evicted. Volcano's policy restarts the
//! whole gang (`PodEvicted` → `RestartJob`) at most `maxRetry` attempts in all; the user is told each
//! restart with the rank and the node, or a FAILURE naming them when the attempts run out; the time
//! around a restart is charged once.

use crate::monitor_support;

use std::collections::{BTreeMap, BTreeSet};
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

/// Told right under kills (issue 31): a two-rank job loses the node of one of its ranks in each of three
/// rounds, and the runner holding its shard is killed right after it told the restart (before it could
/// record that it had: every write to the job takes 6 s); a runner started after the kill, whose watch
/// never saw the pod go, takes the shard over. Every restart is told under one id only, naming the node
/// lost and a rank that was on it, with the right attempt; the third loss uses the attempts up, and the
/// FAILURE names it.
#[tokio::test]
async fn restarts_and_the_failure_are_told_right_through_kills_of_the_holder() {
    let mut w = World::start("mon-nodelost-kills", |_| {}, |_| {}).await;
    let mut holder = w.runner("runner-0").await;
    holder.holds(4).await;
    let mut submitted = job("k1", "sleep 5000");
    submitted.replicas = 2;
    let ns = w.namespace_of(&submitted);
    w.submit(&submitted).await;
    advance_until(&mut w, "RUNNING", 1, 30, |s| {
        s.event("k1/RUNNING").is_some()
    })
    .await;
    w.sim.faults().add_rule(volcano_runner::sim::FaultRule {
        resource: "jobs.batch.volcano.sh".into(),
        verb: "patch".into(),
        latency_ms: 6000,
        ..volcano_runner::sim::FaultRule::default()
    });
    let restarts_key = w.keys.restarts.clone();
    let mut lost_in_round = Vec::new();
    for round in 1..=3usize {
        let mut on = BTreeMap::new();
        for rank in 0..2u32 {
            on.insert(
                rank,
                running_on(&mut w, &ns, &format!("j-k1-job-{rank}")).await,
            );
        }
        let lost = on[&((round % 2) as u32)].clone();
        let ranks: Vec<u32> = on
            .iter()
            .filter(|(_, node)| **node == lost)
            .map(|(rank, _)| *rank)
            .collect();
        lost_in_round.push((lost.clone(), ranks));
        Api::<Node>::all(w.client.clone())
            .delete(&lost, &DeleteParams::default())
            .await
            .expect("the node is deleted");
        if round < 3 {
            let prefix = format!("k1/restart/{round}/");
            advance_until(&mut w, "the restart's status event", 1, 120, |s| {
                restarts(s, "k1").iter().any(|t| t.starts_with(&prefix))
            })
            .await;
        } else {
            // No restart is left to tell: the holder records the disruption for the FAILURE.
            for _ in 0..240 {
                let recorded = w
                    .vcjob(&ns, "k1")
                    .and_then(|j| {
                        j.pointer(&format!(
                            "/metadata/annotations/{}",
                            restarts_key.replace('/', "~1")
                        ))
                        .and_then(|v| v.as_str())
                        .map(str::to_owned)
                    })
                    .is_some_and(|v| v == "3");
                if recorded {
                    break;
                }
                w.advance(1);
                w.settle(Duration::from_millis(100)).await;
            }
        }
        holder.kill().await;
        holder = w.runner(&format!("runner-{round}")).await;
        holder.holds(4).await;
    }
    advance_until(&mut w, "FAILURE", 2, 120, |s| {
        s.event("k1/FAILURE").is_some()
    })
    .await;
    w.settle(Duration::from_millis(500)).await;

    let told = restarts(&w.seen, "k1");
    for (n, (lost, ranks)) in lost_in_round.iter().take(2).enumerate() {
        let n = n + 1;
        let prefix = format!("k1/restart/{n}/");
        let events: Vec<_> = w
            .seen
            .of("k1")
            .lifecycle
            .iter()
            .filter(|e| e.event_id.starts_with(&prefix))
            .cloned()
            .collect();
        let ids: BTreeSet<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids.len(), 1, "restart {n} told once, in one way: {told:#?}");
        let rank = events[0]
            .status
            .strip_prefix("The job is restarting after rank ")
            .and_then(|rest| rest.split('\'').next())
            .and_then(|r| r.parse::<u32>().ok());
        assert!(
            rank.is_some_and(|r| ranks.contains(&r)),
            "restart {n} names a rank that was on {lost} ({ranks:?}): {told:#?}"
        );
        assert_eq!(
            events[0].status,
            format!(
                "The job is restarting after rank {}'s node {lost} was lost (PodGC: node no longer \
                 exists): every rank starts again (attempt {} of 3)",
                rank.unwrap(),
                n + 1
            )
        );
    }
    assert!(
        told.iter().all(|t| !t.starts_with("k1/restart/3/")),
        "no attempt 4 of 3: {told:#?}"
    );
    let (lost, ranks) = &lost_in_round[2];
    let failure = w.seen.event("k1/FAILURE").unwrap().clone();
    assert_eq!(failure.reason, "disrupted");
    assert!(
        ranks.iter().any(|rank| failure.status
            == format!(
                "The job failed after rank {rank}'s node {lost} was lost (PodGC: node no longer \
                 exists): all 3 of its attempts (maxRetry) are used up"
            )),
        "the FAILURE names {lost} and a rank on it ({ranks:?}): {}",
        failure.status
    );
    holder.stop().await;
    w.close().await;
}
