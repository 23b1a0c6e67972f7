//! Events once in steady state (issue 31): with no runner dead, every event of a job goes out once.
//! The job records that its QUEUED was confirmed (carried by the first write of the monitor of the
//! runner that told it, the accepting runner or, for a job accepted by a runner that does not hold its
//! shard, the shard's holder; written before that runner hands the job's shard over), so a runner that
//! takes a shard over from a runner that stopped sends no copy of it,
//! and RUNNING, persisted once confirmed, is not sent again by the runner that takes over.

use crate::harness;
use crate::rabbit;

use std::collections::BTreeMap;
use std::time::Duration;

use harness::{Captured, Harness, figlet};
use volcano_runner::config::Config;

/// A runner configuration with the monitoring duty on one shard and short leases.
fn monitoring(h: &Harness) -> Config {
    let mut config = h.config.clone();
    config.cluster.lease.shards = 1;
    config.cluster.lease.duration = Duration::from_secs(3);
    config.cluster.lease.renew_interval = Duration::from_millis(500);
    config.cluster.lease.safety_margin = Duration::from_secs(1);
    config
}

/// Ids delivered more than once, with how often.
fn delivered_twice(events: &[Captured]) -> BTreeMap<String, usize> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for c in events {
        *counts.entry(c.message_id.clone()).or_default() += 1;
    }
    counts.retain(|_, n| *n > 1);
    counts
}

/// Moves the simulator's clock until every job has `state`.
pub(crate) async fn advance_until(h: &Harness, jobs: &[String], state: &str) {
    let deadline = tokio::time::Instant::now() + rabbit::PATIENCE;
    loop {
        let events = h.events().await;
        if jobs.iter().all(|j| {
            events
                .iter()
                .any(|c| c.message_id == format!("{j}/{state}"))
        }) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{state} for every job"
        );
        h.sim.advance(Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runner B monitors (it holds the shard) and runner A (no monitoring duty) takes submissions beside
/// it: A's jobs are created for B's monitor to tell their QUEUED, B's own jobs get theirs from B's
/// submit path. B stops (as on a SIGTERM) before its first write of any job, so the records of the
/// QUEUED it told or had confirmed are written as it hands the shard over; C takes the shard over and
/// publishes RUNNING and the ends. No runner died, so every id is delivered once: C sends no copy of
/// QUEUED, and QUEUED is each job's first event. (A job accepted while no runner monitored at all gets
/// a copy from the monitor that comes later: docs/monitor.md, "Order of a job's events".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_goes_out_once_across_runners_and_a_handover() {
    let h = Harness::new("once-across").await;
    let b = h.start_with("runner-b", monitoring(&h), true);
    holds_every_shard(&h, "runner-b", 1).await;
    let a = h.start_with("runner-a", monitoring(&h), false);
    h.wait_consumers(&h.config.broker.submit_queue, 2).await;
    let jobs: Vec<String> = (0..6).map(|i| format!("x-{i}")).collect();
    for job in &jobs {
        h.submit(&figlet(job)).await;
    }
    crate::submit::wait_until(&h, &jobs, "QUEUED").await;
    h.wait_queues_settled().await;
    b.stop().await;

    let c = h.start_with("runner-c", monitoring(&h), true);
    advance_until(&h, &jobs, "SUCCESS").await;
    h.wait_queues_settled().await;
    // A late copy would have time to arrive.
    tokio::time::sleep(Duration::from_secs(1)).await;
    c.stop().await;
    a.stop().await;

    let events = h.events().await;
    let twice = delivered_twice(&events);
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    for job in &jobs {
        let first = events
            .iter()
            .find(|c| c.event.as_ref().is_some_and(|e| &e.job_id == job))
            .map(|c| c.message_id.clone());
        assert_eq!(first, Some(format!("{job}/QUEUED")), "QUEUED first");
    }
}

/// A runner configuration with the monitoring duty on eight shards; leases long enough that no shard
/// lapses on a loaded machine, so that every shard that moves is handed over by a live runner.
fn sharded(h: &Harness) -> Config {
    let mut config = h.config.clone();
    config.cluster.lease.shards = 8;
    config.cluster.lease.duration = Duration::from_secs(10);
    config.cluster.lease.renew_interval = Duration::from_secs(1);
    config.cluster.lease.safety_margin = Duration::from_secs(2);
    config
}

/// Shards handed over between live runners while their jobs start, tick and end: runners join (the
/// others hand them their share) and leave gracefully (as on a SIGTERM: their shards go to the others),
/// with every write to a VolcanoJob slowed to 1.5 s, so that a runner always has records of
/// transitions in flight when it hands a shard over. No runner dies, so every id is delivered once:
/// a shard's lease is released only once the old holder's records have landed, and the new holder
/// decides from them. Runner A holds every shard when the jobs are submitted, so the record that
/// their QUEUED was confirmed rides on its monitor's first write of each job: a shard it hands over
/// before that write gets the records of its jobs written first, and the new holder sends no copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_handed_over_between_live_runners_send_nothing_twice() {
    const JOBS: usize = 24;
    let h = Harness::new("once-handover").await;
    let a = h.start_with("runner-a", sharded(&h), true);
    holds_every_shard(&h, "runner-a", 8).await;
    let jobs: Vec<String> = (0..JOBS).map(|i| format!("h-{i}")).collect();
    for job in &jobs {
        h.submit(&crate::chaos::sleeper(job, 150)).await;
    }
    crate::submit::wait_until(&h, &jobs, "QUEUED").await;
    h.sim.faults().add_rule(volcano_runner::sim::FaultRule {
        resource: "jobs.batch.volcano.sh".into(),
        verb: "patch".into(),
        latency_ms: 1500,
        ..volcano_runner::sim::FaultRule::default()
    });

    // The jobs start, tick every simulated minute and end after 150 s, while runners come and go.
    let mut runners = vec![a];
    for step in 0..60 {
        match step {
            3 => runners.push(h.start_with("runner-b", sharded(&h), true)),
            10 => runners.push(h.start_with("runner-c", sharded(&h), true)),
            20 => runners.remove(1).stop().await,
            28 => runners.push(h.start_with("runner-d", sharded(&h), true)),
            38 => runners.remove(0).stop().await,
            _ => {}
        }
        h.sim.advance(Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    advance_until(&h, &jobs, "SUCCESS").await;
    h.wait_queues_settled().await;
    // A late copy would have time to arrive.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for runner in runners {
        runner.stop().await;
    }

    let events = h.events().await;
    let twice = delivered_twice(&events);
    assert!(
        twice.is_empty(),
        "delivered more than once ({} of {} deliveries): {twice:?}",
        twice.values().map(|n| n - 1).sum::<usize>(),
        events.len()
    );
    for job in &jobs {
        assert!(
            events
                .iter()
                .any(|c| c.message_id == format!("{job}/RUNNING")),
            "{job} ran"
        );
    }
}

/// Waits until `runner` holds all `shards` shard leases.
async fn holds_every_shard(h: &Harness, runner: &str, shards: usize) {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(h.client.clone(), &h.config.cluster.namespace);
    rabbit::within("the first runner holds every shard", async {
        loop {
            let listed = leases.list(&Default::default()).await.unwrap();
            let held = listed
                .items
                .iter()
                .filter(|l| {
                    l.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.contains("-shard-"))
                        && l.spec.as_ref().and_then(|s| s.holder_identity.as_deref())
                            == Some(runner)
                })
                .count();
            if held == shards {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
}
