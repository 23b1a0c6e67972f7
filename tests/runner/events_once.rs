//! Events once in steady state (issue 31): with no runner dead, every event of a job goes out once.
//! The submit path records on the job that its QUEUED was confirmed, so a runner that monitors a job
//! another runner accepted (or that takes a shard over from a runner that stopped) sends no copy of it,
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
async fn advance_until(h: &Harness, jobs: &[String], state: &str) {
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

/// Runner A (no monitoring duty) accepts the jobs; runner B, started afterwards, monitors them and
/// publishes RUNNING; B stops (as on a SIGTERM) and C takes its shard over and publishes the ends. No
/// runner died, so every id is delivered once: B sends no copy of the QUEUED that A had confirmed, and
/// C sends neither QUEUED nor RUNNING again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_goes_out_once_across_runners_and_a_handover() {
    let h = Harness::new("once-across").await;
    let a = h.start_with("runner-a", h.config.clone(), false);
    let jobs: Vec<String> = (0..4).map(|i| format!("x-{i}")).collect();
    for job in &jobs {
        h.submit(&figlet(job)).await;
    }
    h.wait_events("QUEUED of every job", |e| {
        jobs.iter()
            .all(|j| e.iter().any(|c| c.message_id == format!("{j}/QUEUED")))
    })
    .await;
    // The submit path's record of the confirm follows its QUEUED by a write.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let b = h.start_with("runner-b", monitoring(&h), true);
    advance_until(&h, &jobs, "RUNNING").await;
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
