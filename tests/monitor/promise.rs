//! Interactive jobs get a promise (issue 45), through the runner: the pipeline routes web jobs to the
//! `fifo` queue `volcano-runner-interactive` with `interactive_sla_waiting_time = "0s"`, the monitor
//! watches the Queues (so it knows that queue is fifo), reserves nodes, and is told the scheduler runs
//! without `proportion`. A stream of sessions beside a batch backlog of gangs, whole-node gangs and
//! wide ranks on three 16-CPU nodes: at least 80% of the sessions that wait are told a bound, no bound
//! breaks, and each waiting job hears a handful of estimates (docs/estimates.md, *Interactive jobs: a
//! promise by design*).

use crate::monitor_support;

use std::collections::BTreeMap;
use std::time::Duration;

use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use monitor_support::*;
use serde_json::json;
use volcano_runner::messages::v1::SubmitJob;
use volcano_runner::sim::NodeSpec;

const QUEUE: &str = "volcano-runner-interactive";

/// What a job was told while it waited: (estimate, bound) in seconds after the start.
type Told = Vec<(i64, bool)>;

/// The batch backlog, at once: a gang of three 4-CPU ranks, a whole-node gang of two, two 12-CPU ranks
/// and two 4-CPU ones, 10 to 20 minutes, ending at half of it.
fn backlog() -> Vec<SubmitJob> {
    let mut gang = sized("b-gang", "sleep 300", 4, 600);
    gang.replicas = 3;
    let mut whole = sized("b-whole", "sleep 450", 8, 900);
    whole.replicas = 2;
    whole.exclusive_nodes = true;
    vec![
        gang,
        whole,
        sized("b-wide-1", "sleep 600", 12, 1200),
        sized("b-wide-2", "sleep 450", 12, 900),
        sized("b-small-1", "sleep 300", 4, 600),
        sized("b-small-2", "sleep 600", 4, 1200),
    ]
}

/// Session `i` (one every 20 s from 20 s on): web applications of 2, 4, 8 or 16 CPUs (a whole node),
/// 10 to 20 minutes, most ending at a quarter or a half of it.
fn session(i: u32) -> SubmitJob {
    let cpu = [2, 4, 2, 8, 4, 16, 2, 4][i as usize % 8];
    let limit = 600 + 300 * i64::from(i % 3);
    let runs = match i % 3 {
        0 => limit / 4,
        1 => limit / 2,
        _ => limit,
    };
    resized(
        web_job(&format!("live-{i:02}"), 1, &format!("sleep {runs}")),
        cpu,
        limit,
    )
}

/// What a job was told while it waited: (estimate, bound) in seconds after `t0`.
fn told(w: &World, id: &str, t0: i64) -> Told {
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

fn started(w: &World, id: &str, t0: i64) -> Option<i64> {
    w.seen
        .event(&format!("{id}/RUNNING"))
        .and_then(|e| e.started_at.as_ref().map(|t| t.seconds - t0))
}

/// Three 16-CPU nodes; the pipeline routes web jobs to the fifo queue `volcano-runner-interactive` (made
/// here, as deploy/scheduling declares it) with a waiting time of 0 s; the monitor reserves nodes and
/// knows the scheduler runs without `proportion`; whole nodes of `u1-standard` priced.
async fn world() -> World {
    let w = World::start(
        "mon-promise",
        |c| {
            c.pipeline.scheduling.interactive_queue = Some(QUEUE.into());
            c.pipeline.scheduling.interactive_sla_waiting_time = Some(jiff::SignedDuration::ZERO);
            c.monitor.proportion = false;
            c.monitor.reserve_nodes = true;
            c.pipeline.whole_nodes.products.insert(
                "u1-standard".into(),
                toml::from_str("product = \"u1-standard-node\"\ncpu = 16\nmemory_gib = 64")
                    .unwrap(),
            );
        },
        |s| {
            s.nodes = vec![
                NodeSpec::cpu_node("n1"),
                NodeSpec::cpu_node("n2"),
                NodeSpec::cpu_node("n3"),
            ];
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
                "metadata": {"name": QUEUE},
                "spec": {"weight": 1, "reclaimable": true, "dequeueStrategy": "fifo"}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    w
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactive_sessions_in_their_fifo_queue_are_told_bounds_that_hold() {
    let mut w = world().await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let t0 = w.sim.now().as_second();
    let batch = backlog();
    for j in &batch {
        w.submit(j).await;
    }
    let sessions: Vec<SubmitJob> = (0..16).map(session).collect();
    let ids: Vec<String> = batch
        .iter()
        .chain(&sessions)
        .map(|j| j.job_id.clone())
        .collect();
    let settle_ms = std::env::var("PROMISE_SETTLE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    for second in 1..3600i64 {
        if second % 20 == 0 && second / 20 <= 16 {
            w.submit(&sessions[(second / 20 - 1) as usize]).await;
        }
        w.advance(1);
        // Long enough for the monitor to keep up on a loaded machine: what it tells must not depend
        // on how fast this machine is.
        // (`PROMISE_SETTLE_MS` gives it less, to see how a loaded machine fares.)
        w.settle(Duration::from_millis(settle_ms)).await;
        if second > 400
            && sessions
                .iter()
                .all(|j| started(&w, &j.job_id, t0).is_some())
        {
            break;
        }
    }
    let report: BTreeMap<String, (Told, Option<i64>)> = ids
        .iter()
        .map(|id| (id.clone(), (told(&w, id, t0), started(&w, id, t0))))
        .collect();
    runner.stop().await;
    w.close().await;
    for (id, (told, started)) in &report {
        println!("{id}: told {told:?}, started {started:?}");
    }
    let waiting: Vec<&String> = report
        .iter()
        .filter(|(id, (told, _))| id.starts_with("live-") && !told.is_empty())
        .map(|(id, _)| id)
        .collect();
    let bound = waiting
        .iter()
        .filter(|id| report[**id].0.iter().any(|(_, b)| *b))
        .count();
    let mut broken = Vec::new();
    let mut tells: Vec<usize> = Vec::new();
    for (id, (told, started)) in &report {
        // Every session has started; a batch job that has not yet was told expectations only.
        let start = started.unwrap_or(i64::MAX);
        if !told.is_empty() {
            tells.push(told.len());
        }
        broken.extend(
            told.iter()
                .filter(|(at, b)| *b && start > *at)
                .map(|(at, _)| format!("{id}: bound {at} s, started {start} s")),
        );
    }
    tells.sort_unstable();
    println!(
        "sessions that waited: {}, told a bound: {bound}; bounds broken: {broken:?}; estimates per \
         waiting job: {tells:?}",
        waiting.len()
    );
    assert!(waiting.len() >= 5, "sessions wait: {waiting:?}");
    // At least 80% of the sessions that waited (were told anything) are told a bound. What made it
    // depend on the machine (7 to 12 of 12-13 in runs paced at 30 to 150 ms per simulated second): a
    // whole-node session was told an expectation by the replay that reserves its node, and its bound
    // only by the next one, so one whose node emptied within that pass never heard it. The monitor
    // now holds such a gang's estimate back until its nodes are reserved
    // (`Cache::hold_back_while_reserving`).
    assert!(
        bound * 10 >= waiting.len() * 8,
        "at least 80% of the waiting sessions are told a bound: {bound} of {}",
        waiting.len()
    );
    assert!(broken.is_empty(), "no bound broken: {broken:?}");
    assert!(
        tells.last().is_some_and(|m| *m <= 10) && tells[tells.len() / 2] <= 3,
        "a handful of estimates per waiting job: {tells:?}"
    );
}
