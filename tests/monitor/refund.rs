//! Time lost to the provider is refundable: after a node loss Volcano restarts the job and the lost
//! attempt's run time stays charged by the ticks; the monitor reports that time once, as a refund event
//! `<jobId>/refund/<attempt>` with `refundableMs`, under the same id and with the same content when a
//! runner dies between publishing it and recording the restart.

use crate::monitor_support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::DeleteParams;
use monitor_support::*;
use volcano_runner::messages::v1::JobEvent;
use volcano_runner::sim::FaultRule;

fn refunds(seen: &Seen, job_id: &str) -> Vec<JobEvent> {
    seen.of(job_id)
        .lifecycle
        .into_iter()
        .filter(|e| e.reason == "refundable")
        .collect()
}

/// Advances the clock a second at a time until the job's RUNNING is published.
async fn until_running(w: &mut World, job_id: &str) {
    let id = format!("{job_id}/RUNNING");
    for _ in 0..30 {
        if w.seen.event(&id).is_some() {
            break;
        }
        w.advance(1);
        w.settle(Duration::from_millis(50)).await;
    }
    w.until("RUNNING", |s| s.event(&id).is_some()).await;
}

/// The time of Volcano's `n`-th `Restarting` phase change, from the job's phase history.
fn restarted_at(w: &World, ns: &str, job_id: &str, n: usize) -> i64 {
    let job = w.vcjob(ns, job_id).expect("the job exists");
    let at = job["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "Restarting")
        .nth(n - 1)
        .and_then(|c| c["lastTransitionTime"].as_str())
        .unwrap_or_else(|| panic!("no restart {n}: {job}"))
        .parse::<jiff::Timestamp>()
        .unwrap();
    at.as_millisecond()
}

/// Rank 1's node is lost 95 s into a 2-rank job; the refund event for attempt 1 carries the time the
/// ticks charged from the first start to the restart (the ticks' overlap with that span), exactly once:
/// the runner that published it could not record the restart (every patch of the job failing) and was
/// killed, and the runner that took over published the same id with the same content. The job runs on
/// and succeeds; no other attempt is refunded.
#[tokio::test]
async fn a_lost_attempt_is_refundable_once_across_a_crash() {
    let mut w = World::start("mon-refund", |_| {}, |_| {}).await;
    let a = w.runner("runner-a").await;
    a.holds(4).await;
    let mut submitted = job("r1", "sleep 200");
    submitted.replicas = 2;
    let ns = w.namespace_of(&submitted);
    w.submit(&submitted).await;
    until_running(&mut w, "r1").await;
    let first_start = ms(&w.seen.event("r1/RUNNING").unwrap().started_at);
    w.advance(95);
    w.until("tick 0", |s| !s.of("r1").unique_ticks().is_empty())
        .await;

    // Every write to the job takes 20 s: the holder records the restart's cause, publishes the restart
    // and the refund, and is killed before it has recorded that it told them.
    w.sim.faults().add_rule(FaultRule {
        resource: "jobs".into(),
        verb: "patch".into(),
        latency_ms: 20_000,
        ..FaultRule::default()
    });
    let pod = w.pod(&ns, "j-r1-job-1").expect("rank 1 runs");
    let lost = pod["spec"]["nodeName"].as_str().unwrap().to_owned();
    Api::<Node>::all(w.client.clone())
        .delete(&lost, &DeleteParams::default())
        .await
        .expect("the node is deleted");
    for _ in 0..24 {
        if !refunds(&w.seen, "r1").is_empty() {
            break;
        }
        w.advance(5);
        w.settle(Duration::from_millis(150)).await;
    }
    w.until("the refund, published but not recorded", |s| {
        !refunds(s, "r1").is_empty()
    })
    .await;
    a.kill().await;
    w.sim.faults().clear();
    let b = w.runner("runner-b").await;
    b.holds(4).await;
    w.until("the refund again, from the new holder", |s| {
        refunds(s, "r1").len() >= 2
    })
    .await;
    for _ in 0..40 {
        if w.seen.event("r1/SUCCESS").is_some() && w.seen.of("r1").has_final_tick() {
            break;
        }
        w.advance(10);
        w.settle(Duration::from_millis(150)).await;
    }
    w.until("SUCCESS and the final tick", |s| {
        s.event("r1/SUCCESS").is_some() && s.of("r1").has_final_tick()
    })
    .await;
    w.settle(Duration::from_millis(300)).await;

    let all = refunds(&w.seen, "r1");
    assert!(all.len() >= 2, "published by both runners: {all:?}");
    for e in &all {
        assert_eq!(e.event_id, "r1/refund/1", "one id for the one lost attempt");
        let mut e = e.clone();
        e.runner_id = all[0].runner_id.clone();
        assert_eq!(e, all[0], "the same content from every runner but its name");
    }
    let refund = &all[0];
    let restart = restarted_at(&w, &ns, "r1", 1);
    assert!(restart >= first_start + 95_000, "the node went 95 s in");
    assert_eq!(refund.refundable_ms, restart - first_start);
    assert_eq!(ms(&refund.timestamp), restart);
    assert_eq!(refund.state, 0, "a status event: no change of state");

    // The refunded span was charged: the ticks' overlap with [first start, restart).
    let success = w.seen.event("r1/SUCCESS").unwrap().clone();
    let ticks = w.seen.of("r1").unique_ticks();
    check_ticks("r1", &ticks, first_start, ms(&success.ended_at));
    let charged: i64 = ticks
        .iter()
        .map(|t| {
            let (from, to) = (ms(&t.interval_start), ms(&t.interval_end));
            (to.min(restart) - from.max(first_start)).max(0)
        })
        .sum();
    assert_eq!(
        refund.refundable_ms, charged,
        "the lost attempt's charged time"
    );
    b.stop().await;
    w.close().await;
}

/// `[pipeline.accounting] refund_lost_attempts = false`: the restart is told, nothing is reported
/// refundable.
#[tokio::test]
async fn refunds_can_be_switched_off() {
    let mut w = World::start(
        "mon-refund-off",
        |c| c.pipeline.accounting.refund_lost_attempts = false,
        |_| {},
    )
    .await;
    let a = w.runner("runner-a").await;
    a.holds(4).await;
    let submitted = job("r2", "sleep 100");
    let ns = w.namespace_of(&submitted);
    w.submit(&submitted).await;
    until_running(&mut w, "r2").await;
    w.advance(30);
    let pod = w.pod(&ns, "j-r2-job-0").expect("rank 0 runs");
    let lost = pod["spec"]["nodeName"].as_str().unwrap().to_owned();
    Api::<Node>::all(w.client.clone())
        .delete(&lost, &DeleteParams::default())
        .await
        .expect("the node is deleted");
    for _ in 0..40 {
        if w.seen.event("r2/SUCCESS").is_some() {
            break;
        }
        w.advance(10);
        w.settle(Duration::from_millis(150)).await;
    }
    w.until("SUCCESS", |s| s.event("r2/SUCCESS").is_some())
        .await;
    assert!(
        w.seen
            .of("r2")
            .lifecycle
            .iter()
            .any(|e| e.reason == "restarting"),
        "the restart is told"
    );
    assert!(
        refunds(&w.seen, "r2").is_empty(),
        "{:?}",
        refunds(&w.seen, "r2")
    );
    a.stop().await;
    w.close().await;
}
