//! The busy workload of issue 32 (tests/sim/busy.rs: six nodes of different shapes, 93 jobs in three
//! waves ten minutes apart, small jobs, high-memory and GPU jobs, gangs, whole-node gangs, two that never
//! fit), submitted as SubmitJobs to two runners that share the monitoring duty, against a simulator whose
//! clock runs ten times faster than real time, with `sla_waiting_time = 1m` and `[monitor]
//! reserve_nodes`. What the runners tell the waiting jobs is read from their status events and compared
//! with the starts their RUNNING events give; the figures are printed (docs/estimates.md quotes them).
//! Required: every job that fits starts, no first bound is broken (the scheduler's own latency, ten
//! times as many simulated seconds here, is covered by `[monitor] start_margin`), and no reservation is
//! left on the nodes at the end. How many
//! whole-node gangs wait past their waiting time depends on how fast the runners create the jobs of a
//! wave, so that they were reserved for is printed, not required (tests/monitor/starve.rs requires it
//! of a stream that guarantees the wait).

use crate::harness;

use std::collections::BTreeMap;
use std::time::Duration;

use harness::{Harness, figlet};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use volcano_runner::messages::v1::{
    InvocationParameter, JobState, Owner, Product, WordInvocation, invocation_parameter,
};
use volcano_runner::sim::SimConfig;

use crate::busy_workload::{Spec, nodes, recipe};

/// The recipe of tests/sim/busy.rs (seed 0): every job with a time limit (a SubmitJob of a whole-node
/// job must have one), and its two never-fitting jobs.
fn workload() -> Vec<Spec> {
    recipe(0)
}

fn submission(s: &Spec) -> volcano_runner::messages::v1::SubmitJob {
    let mut job = figlet(s.job_id());
    let word = |w: &str| InvocationParameter {
        kind: Some(invocation_parameter::Kind::Word(WordInvocation {
            word: w.to_owned(),
        })),
    };
    job.application.as_mut().unwrap().invocation =
        vec![word("sh"), word("-c"), word(&format!("sleep {}", s.runs_s))];
    job.product = Some(Product {
        id: format!("p-{}-{}-{}", s.cpu, s.memory_gib, s.gpu),
        category: if s.gpu > 0 { "u1-gpu" } else { "u1-standard" }.into(),
        cpu: s.cpu,
        memory_gib: s.memory_gib,
        gpu: s.gpu,
    });
    job.replicas = s.ranks;
    job.exclusive_nodes = s.whole_nodes;
    job.time_allocation = Some(pbjson_types::Duration {
        seconds: s.limit_s.expect("the recipe gives every job a time limit"),
        nanos: 0,
    });
    job.owner = Some(Owner {
        user: format!("user-{}", s.job_id().len() % 3),
        project: None,
    });
    job
}

/// Reservation taints on the nodes.
async fn reservations(client: &kube::Client) -> usize {
    Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .flat_map(|n| n.spec.iter().flat_map(|s| s.taints.iter().flatten()))
        .filter(|t| t.key == "ucloud.dk/reserved")
        .count()
}

fn secs(t: &Option<pbjson_types::Timestamp>) -> Option<i64> {
    t.as_ref().map(|t| t.seconds)
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runners_at_ten_times_speed_keep_the_busy_workloads_bounds() {
    let sim = SimConfig {
        clock_speed: 10.0,
        nodes: nodes(),
        pod_start_delay: Duration::ZERO,
        ..SimConfig::for_tests()
    };
    let h = Harness::with_sim("busy-runners", sim).await;
    let mut config = h.config.clone();
    config.monitor.reserve_nodes = true;
    // The start margin covers the real latency of the job controller and the scheduler, which a ×10
    // clock makes ten times as many simulated seconds: 20 s here is 2 real seconds, a fifth of what the
    // default (10 s) leaves a cluster at real speed.
    config.monitor.start_margin = Duration::from_secs(20);
    config.pipeline.scheduling.sla_waiting_time = Some(jiff::SignedDuration::from_secs(60));
    config.pipeline.whole_nodes.products.insert(
        "u1-standard".into(),
        toml::from_str("product = \"u1-standard-node\"\ncpu = 16\nmemory_gib = 64").unwrap(),
    );
    let runners = [
        h.start_with("busy-1", config.clone(), true),
        h.start_with("busy-2", config, true),
    ];
    h.wait_consumers(&h.config.broker.submit_queue, 2).await;

    let workload = workload();
    let t0 = h.sim.now().as_second();
    for wave in 0..3 {
        while h.sim.now().as_second() < t0 + 600 * wave {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for s in workload.iter().filter(|s| s.arrives_s == 600 * wave) {
            h.submit(&submission(s)).await;
        }
    }
    let fitting: Vec<&str> = workload
        .iter()
        .filter(|s| !s.job_id().contains('-'))
        .map(|s| s.job_id())
        .collect();
    let running_id = |id: &str| format!("{id}/RUNNING");
    let events = h
        .wait_events_for(
            "every job that fits running",
            Duration::from_secs(900),
            |e| {
                fitting
                    .iter()
                    .all(|id| e.iter().any(|c| c.message_id == running_id(id)))
            },
        )
        .await;
    // What each job was told while it waited, in order, and when it started.
    let mut told: BTreeMap<String, Vec<(i64, bool)>> = BTreeMap::new();
    let mut started: BTreeMap<String, i64> = BTreeMap::new();
    // Jobs told they wait (a status event with the pending reason), with or without an estimate.
    let mut waited: std::collections::BTreeSet<String> = Default::default();
    for c in &events {
        let Some(e) = &c.event else { continue };
        if e.pending.is_some() {
            waited.insert(e.job_id.clone());
        }
        if e.state == JobState::Running as i32
            && let Some(at) = secs(&e.started_at)
        {
            started.entry(e.job_id.clone()).or_insert(at);
        }
        if let Some(p) = &e.pending
            && let Some(at) = secs(&p.estimated_start_at)
        {
            let list = told.entry(e.job_id.clone()).or_default();
            if list.last() != Some(&(at, p.estimate_is_bound)) {
                list.push((at, p.estimate_is_bound));
            }
        }
    }
    // The last reservations go once their gangs started (the next monitor pass after the start).
    let mut taints_left = usize::MAX;
    for _ in 0..300 {
        taints_left = reservations(&h.client).await;
        if taints_left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for r in runners {
        r.stop().await;
    }
    let by_id: BTreeMap<&str, &Spec> = workload.iter().map(|s| (s.job_id(), s)).collect();
    let (mut first, mut first_broken, mut all, mut all_broken) = (0, 0, 0, 0);
    let (mut first_expected, mut first_expected_held) = (0, 0);
    let mut whole_bounds = 0;
    let mut early = Vec::new();
    let mut tells: Vec<i64> = Vec::new();
    let mut broken = Vec::new();
    for (id, list) in &told {
        let Some(start) = started.get(id) else {
            continue;
        };
        tells.push(list.len() as i64);
        if let Some((at, _)) = list.iter().find(|(_, b)| *b) {
            first += 1;
            whole_bounds += usize::from(by_id.get(id.as_str()).is_some_and(|s| s.whole_nodes));
            if start > at {
                first_broken += 1;
                broken.push(format!(
                    "{id}: bound {} s, started {} s",
                    at - t0,
                    start - t0
                ));
            } else {
                early.push(at - start);
            }
        }
        if let Some((at, false)) = list.first() {
            first_expected += 1;
            first_expected_held += usize::from(start <= at);
        }
        for (at, bound) in list {
            if *bound {
                all += 1;
                all_broken += usize::from(start > at);
            }
        }
    }
    early.sort_unstable();
    tells.sort_unstable();
    println!(
        "two runners at x10, sla 1m, reserve_nodes: {} of {} jobs that fit started; {} told they wait, {} of them an estimate; {first} first bounds, {first_broken} broken {broken:?}; \
         first bound minus start: median {} s, p90 {} s; {all} bounds told, {all_broken} broken; whole-node gangs told a bound: {whole_bounds}; \
         first expectations held: {first_expected_held} of {first_expected}; estimate events per waiting job: median {}, p90 {}, max {}",
        started.len(),
        fitting.len(),
        waited.len(),
        told.len(),
        percentile(&early, 0.5),
        percentile(&early, 0.9),
        percentile(&tells, 0.5),
        percentile(&tells, 0.9),
        tells.last().copied().unwrap_or(0),
    );
    assert_eq!(started.len(), fitting.len(), "every job that fits started");
    assert_eq!(
        first_broken, 0,
        "no first bound is broken (not even by the scheduler's latency): {broken:?}"
    );
    assert_eq!(
        taints_left, 0,
        "no reservation is left once every job started"
    );
}
