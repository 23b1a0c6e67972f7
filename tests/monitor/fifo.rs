//! Bounds in a `fifo` queue (issue 45): the monitor watches each Queue's `dequeueStrategy`, so a job
//! behind a blocked gang is not told "its resources are free now"; it knows `[monitor] queue_timeout`,
//! so the gang that will be failed is told when, and the jobs behind it when they start once it is
//! gone; and the simulator's fifo queue moves on when its head ends without ever running. Real
//! RabbitMQ, the pipeline renders the jobs, the simulator plays Volcano.

use crate::monitor_support;

use std::time::Duration;

use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use monitor_support::*;
use serde_json::json;

use volcano_runner::sim::NodeSpec;

/// What `id` was told while it waited: (estimate, bound) in seconds after `t0`.
fn told(w: &World, id: &str, t0: i64) -> Vec<(i64, bool)> {
    w.seen
        .of(id)
        .lifecycle
        .iter()
        .filter_map(|e| {
            let p = e.pending.as_ref()?;
            Some((
                p.estimated_start_at.as_ref()?.seconds - t0,
                p.estimate_is_bound,
            ))
        })
        .collect()
}

/// When `id` started (its RUNNING event), in seconds after `t0`.
fn started(w: &World, id: &str, t0: i64) -> Option<i64> {
    w.seen
        .event(&format!("{id}/RUNNING"))
        .and_then(|e| e.started_at.as_ref().map(|t| t.seconds - t0))
}

/// Two 16-CPU nodes and a fifo queue `f` that every job goes to, with `sla_waiting_time = "1m"` and
/// `queue_timeout = "3m"`. At its head a gang of three 16-CPU ranks, which the nodes can never hold
/// (the scheduler keeps it waiting, and the fifo queue with it); behind it, a minute later, three 2-CPU
/// jobs, on idle nodes. The runner fails the gang at its queue timeout; the small jobs then start. Every bound they
/// are told holds, they start within seconds of the gang's end, and the gang is told when it fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_fifo_queue_the_jobs_behind_a_blocked_gang_are_told_bounds_that_hold() {
    let mut w = World::start(
        "mon-fifo",
        |c| {
            c.pipeline.scheduling.queue = "f".into();
            c.pipeline.scheduling.sla_waiting_time = Some(jiff::SignedDuration::from_secs(60));
            c.monitor.queue_timeout = Some(Duration::from_secs(180));
        },
        |s| {
            s.nodes = vec![NodeSpec::cpu_node("n1"), NodeSpec::cpu_node("n2")];
            s.pod_start_delay = Duration::ZERO;
        },
    )
    .await;
    let queues = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("scheduling.volcano.sh", "v1beta1", "Queue"),
        "queues",
    );
    Api::<DynamicObject>::all_with(w.client.clone(), &queues)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                "metadata": {"name": "f"},
                "spec": {"weight": 1, "reclaimable": true, "dequeueStrategy": "fifo"}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let t0 = w.sim.now().as_second();
    let mut head = sized("head", "sleep 60", 16, 600);
    head.replicas = 3;
    w.submit(&head).await;
    // A minute later (their own queue timeout is well after the gang's).
    for _ in 0..60 {
        w.advance(1);
        w.settle(Duration::from_millis(40)).await;
    }
    let small = ["s1", "s2", "s3"];
    for id in small {
        w.submit(&sized(id, "sleep 60", 2, 600)).await;
    }
    for _ in 0..400 {
        w.advance(1);
        w.settle(Duration::from_millis(40)).await;
        if small.iter().all(|id| started(&w, id, t0).is_some()) {
            break;
        }
    }
    let failed = w
        .seen
        .event("head/FAILURE")
        .and_then(|e| e.timestamp.as_ref().map(|t| t.seconds - t0));
    let head_told: Vec<String> = w
        .seen
        .of("head")
        .lifecycle
        .iter()
        .filter_map(|e| e.pending.as_ref().map(|p| p.estimate_basis.clone()))
        .collect();
    let report: Vec<_> = small
        .iter()
        .map(|id| (*id, told(&w, id, t0), started(&w, id, t0)))
        .collect();
    println!("head failed at {failed:?}, told {head_told:?}; small jobs {report:?}");
    runner.stop().await;
    w.close().await;
    let failed = failed.expect("the runner failed the gang at its queue timeout");
    for (id, told, started) in &report {
        let started = started.unwrap_or_else(|| panic!("{id} started: {report:?}"));
        assert!(
            started <= failed + 15,
            "{id} started once the gang ended ({failed} s), not at {started} s"
        );
        for (at, bound) in told {
            assert!(
                !bound || started <= *at,
                "{id} was told a bound of {at} s and started at {started} s"
            );
        }
    }
    assert!(
        report
            .iter()
            .any(|(_, told, _)| told.iter().any(|(_, bound)| *bound)),
        "past their waiting time the jobs behind the gang are told bounds: {report:?}"
    );
    assert!(
        head_told.iter().any(|b| b.contains("can never")
            || b.contains("queue_timeout")
            || b.contains("no node")
            || b.contains("cannot hold")),
        "the gang is told it never starts: {head_told:?}"
    );
}
