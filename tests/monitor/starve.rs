//! The monitor keeps a whole-node or large gang from starving (`[monitor] reserve_nodes`): while small
//! jobs keep arriving on three nodes, never leaving two of them untouched at once (nor two with room for
//! a 12-CPU rank), a gang of two ranks (whole-node, or of 12 of a node's 16 CPUs) past its
//! `sla-waiting-time` gets two nodes tainted for it by the monitor, is told a bound, starts by it, and
//! the taints are removed once it runs. The jobs are rendered by the pipeline (the ranks' toleration
//! included) and the monitor writes their deadlines at their starts, as in production.

use crate::monitor_support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use monitor_support::*;

use volcano_runner::sim::NodeSpec;

/// The nodes reserved now, by node: the value of their `ucloud.dk/reserved` taint.
async fn reserved(client: &kube::Client) -> Vec<(String, String)> {
    Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .flat_map(|n| {
            let name = n.metadata.name.clone().unwrap_or_default();
            n.spec
                .iter()
                .flat_map(|s| s.taints.iter().flatten())
                .filter(|t| t.key == "ucloud.dk/reserved")
                .map(move |t| (name.clone(), t.value.clone().unwrap_or_default()))
        })
        .collect()
}

/// Three 16-CPU nodes; `sla_waiting_time = "1m"`, `reserve_nodes`, whole nodes of `u1-standard` priced.
async fn world(label: &str) -> World {
    World::start(
        label,
        |c| {
            c.monitor.reserve_nodes = true;
            c.pipeline.scheduling.sla_waiting_time = Some(jiff::SignedDuration::from_secs(60));
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
    .await
}

/// The whole-node gang: two ranks of 8 CPUs, 300 s of a 600 s limit.
fn gang() -> volcano_runner::messages::v1::SubmitJob {
    let mut gang = sized("gang", "sleep 300", 8, 600);
    gang.replicas = 2;
    gang.exclusive_nodes = true;
    gang
}

/// What the gang was told while it waited: (estimate, bound) in seconds after `t0`.
fn told(w: &World, t0: i64) -> Vec<(i64, bool)> {
    w.seen
        .of("gang")
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

/// The large gang: two ranks of 12 CPUs (no 16-CPU node holds two), not whole-node, 300 s of a 600 s
/// limit.
fn large_gang() -> volcano_runner::messages::v1::SubmitJob {
    let mut gang = sized("gang", "sleep 300", 12, 600);
    gang.replicas = 2;
    gang
}

/// One simulated second of the stream: a 3-CPU job every 6 s that runs 60 s of its 120 s, and the
/// gang at 60 s.
async fn step(w: &mut World, second: i64) {
    step_with(w, second, &gang()).await;
}

/// [`step`] with this gang.
async fn step_with(w: &mut World, second: i64, gang: &volcano_runner::messages::v1::SubmitJob) {
    if second % 6 == 0 {
        w.submit(&sized(&format!("s{second:04}"), "sleep 60", 3, 120))
            .await;
    }
    if second == 60 {
        w.submit(gang).await;
    }
    w.advance(1);
    w.settle(Duration::from_millis(40)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_reserves_nodes_for_a_whole_node_gang_that_then_starts_by_its_bound() {
    reserves_for_a_gang_that_then_starts_by_its_bound("mon-starve", gang()).await;
}

/// Not whole-node: its ranks are rendered tolerating their own job's reservation because the job has a
/// `sla-waiting-time`, and the monitor reserves for it because no node holds two of its ranks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_reserves_nodes_for_a_large_gang_that_then_starts_by_its_bound() {
    reserves_for_a_gang_that_then_starts_by_its_bound("mon-starve-large", large_gang()).await;
}

async fn reserves_for_a_gang_that_then_starts_by_its_bound(
    label: &str,
    gang: volcano_runner::messages::v1::SubmitJob,
) {
    let mut w = world(label).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let t0 = w.sim.now().as_second();
    let mut reserved_seen = Vec::new();
    for second in 0..600i64 {
        step_with(&mut w, second, &gang).await;
        if reserved_seen.is_empty() {
            reserved_seen = reserved(&w.client).await;
        }
        if w.seen.event("gang/RUNNING").is_some() {
            break;
        }
    }
    // Let the monitor see the start and release the nodes.
    for _ in 0..20 {
        w.advance(1);
        w.settle(Duration::from_millis(100)).await;
        if reserved(&w.client).await.is_empty() {
            break;
        }
    }
    let left = reserved(&w.client).await;
    let seen = w.seen.of("gang");
    let started = seen
        .event("gang/RUNNING")
        .and_then(|e| e.started_at.as_ref().map(|t| t.seconds - t0))
        .unwrap_or_else(|| panic!("the gang started: {:#?}", summary(&seen)));
    let told: Vec<(i64, bool)> = seen
        .lifecycle
        .iter()
        .filter_map(|e| {
            let p = e.pending.as_ref()?;
            Some((
                p.estimated_start_at.as_ref()?.seconds - t0,
                p.estimate_is_bound,
            ))
        })
        .collect();
    println!("gang: started at {started} s, told {told:?}, reserved {reserved_seen:?}");
    runner.stop().await;
    w.close().await;
    assert_eq!(
        reserved_seen.len(),
        2,
        "two nodes reserved: {reserved_seen:?}"
    );
    assert!(
        reserved_seen.iter().all(|(_, job)| job == "gang"),
        "{reserved_seen:?}"
    );
    let first_bound = told
        .iter()
        .find(|(_, bound)| *bound)
        .map(|(at, _)| *at)
        .unwrap_or_else(|| panic!("the gang was told a bound: {told:?}"));
    assert!(
        started <= first_bound,
        "started at {started} s, after its first bound {first_bound} s"
    );
    assert!(
        left.is_empty(),
        "the reservation is gone once it runs: {left:?}"
    );
}

/// A runner killed while it holds a reservation leaves nothing stuck: the runner that takes its shards
/// over keeps the reservation it finds on the nodes (the scheduler honours it meanwhile), and removes it
/// once the gang runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_outlives_the_runner_that_made_it_and_the_next_one_removes_it() {
    let mut w = world("mon-starve-kill").await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let t0 = w.sim.now().as_second();
    let mut second = 0i64;
    while !told(&w, t0).iter().any(|(_, bound)| *bound) {
        assert!(second < 600, "the gang is told a bound: {:?}", told(&w, t0));
        step(&mut w, second).await;
        second += 1;
    }
    let made = reserved(&w.client).await;
    assert_eq!(made.len(), 2, "{made:?}");
    runner.kill().await;
    let successor = w.runner("runner-b").await;
    successor.holds(4).await;
    let mut kept = Vec::new();
    while w.seen.event("gang/RUNNING").is_none() {
        assert!(second < 900, "the gang starts under the successor");
        step(&mut w, second).await;
        if kept.is_empty() {
            kept = reserved(&w.client).await;
        }
        second += 1;
    }
    let mut left = reserved(&w.client).await;
    for _ in 0..20 {
        if left.is_empty() {
            break;
        }
        w.advance(1);
        w.settle(Duration::from_millis(100)).await;
        left = reserved(&w.client).await;
    }
    successor.stop().await;
    w.close().await;
    assert_eq!(kept, made, "the successor keeps the reservation it found");
    assert!(
        left.is_empty(),
        "and removes it once the gang runs: {left:?}"
    );
}
