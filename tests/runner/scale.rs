//! Several runners on one queue: work is shared and each job is created once; a runner killed in the
//! middle of its work loses nothing, because its unacknowledged messages go to the others.

use crate::harness;
use crate::rabbit;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use harness::{Harness, figlet};
use volcano_runner::sim::FaultRule;

/// Who created each job, from its `acceptedBy` annotation.
async fn accepted_by(h: &Harness) -> BTreeMap<String, String> {
    h.vcjobs()
        .await
        .into_iter()
        .map(|j| {
            let name = j.metadata.name.clone().unwrap_or_default();
            let by = j
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("ucloud.dk/acceptedBy").cloned())
                .unwrap_or_default();
            (name, by)
        })
        .collect()
}

/// Three runners, 300 submissions: every job is created once, all three runners do part of the work,
/// every job gets its QUEUED, and the queue is empty at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_runners_share_300_submissions_and_create_each_job_once() {
    const JOBS: usize = 300;
    let h = Harness::new("scale-300").await;
    let runners: Vec<_> = ["r-1", "r-2", "r-3"].iter().map(|id| h.start(id)).collect();
    // Everyone consumes before the burst, so the broker spreads it.
    h.wait_consumers(&h.config.broker.submit_queue, 3).await;
    let publisher = h.orchestrator.publisher();
    let messages: Vec<_> = (0..JOBS)
        .map(|i| {
            volcano_runner::broker::Outbound::submit(
                &figlet(&format!("s-{i}")),
                volcano_runner::messages::Format::Json,
                &h.config.broker,
            )
        })
        .collect();
    let started = std::time::Instant::now();
    rabbit::within("publish 300", publisher.publish_all(&messages))
        .await
        .unwrap();
    let events = h
        .wait_events_for("QUEUED for every job", Duration::from_secs(120), |e| {
            e.iter()
                .filter(|c| c.message_id.ends_with("/QUEUED"))
                .count()
                >= JOBS
        })
        .await;
    // A figure for the report, not a check: speed is for benchmarks.
    eprintln!(
        "{JOBS} submissions published and applied by 3 runners in {:?}",
        started.elapsed()
    );
    h.wait_queues_settled().await;
    for runner in runners {
        runner.stop().await;
    }
    let queued: BTreeSet<_> = events
        .iter()
        .filter(|c| c.message_id.ends_with("/QUEUED"))
        .map(|c| c.message_id.clone())
        .collect();
    assert_eq!(queued.len(), JOBS, "every job has its QUEUED");
    let by = accepted_by(&h).await;
    assert_eq!(by.len(), JOBS, "each job exists once");
    let per_runner: BTreeMap<&str, usize> = by.values().fold(BTreeMap::new(), |mut m, r| {
        *m.entry(r.as_str()).or_default() += 1;
        m
    });
    assert_eq!(
        per_runner.len(),
        3,
        "every runner did part of the work: {per_runner:?}"
    );
    assert_eq!(h.vhost.ready(&h.config.broker.submit_queue).await, 0);
    assert!(h.dead_letters().await.is_empty());
}

/// A runner killed while it holds messages (its runtime dropped: tasks gone, sockets closed, nothing
/// acked): the broker hands its messages to the other runner, which finishes them, adopting what the
/// dead one created. No job is duplicated and every job has all its objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_mid_flight_loses_nothing_and_duplicates_nothing() {
    const JOBS: usize = 40;
    let h = Harness::new("scale-kill").await;
    // Slow creates, so the victim is in the middle of its work when it dies.
    h.sim.faults().add_rule(FaultRule {
        resource: "jobs.batch.volcano.sh".into(),
        verb: "create".into(),
        latency_ms: 150,
        ..FaultRule::default()
    });
    let victim = h.start_killable("victim");
    for i in 0..JOBS {
        h.submit(&figlet(&format!("k-{i}"))).await;
    }
    // Wait until the victim has made some jobs but not all, then kill it.
    let deadline = tokio::time::Instant::now() + rabbit::PATIENCE;
    loop {
        let made = h.vcjobs().await.len();
        if made >= 3 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the victim starts working"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    victim.kill();
    let killed_at = h.vcjobs().await.len();
    assert!(
        killed_at < JOBS,
        "killed mid-flight ({killed_at} of {JOBS} made)"
    );

    let survivor = h.start("survivor");
    let events = h
        .wait_events_for("QUEUED for every job", Duration::from_secs(90), |e| {
            (0..JOBS).all(|i| e.iter().any(|c| c.message_id == format!("k-{i}/QUEUED")))
        })
        .await;
    h.wait_queues_settled().await;
    survivor.stop().await;

    let by = accepted_by(&h).await;
    assert_eq!(by.len(), JOBS, "each job exists once");
    assert!(by.values().any(|r| r == "victim"), "the victim made some");
    assert!(
        by.values().any(|r| r == "survivor"),
        "the survivor finished the rest"
    );
    // Every job has its companions, whoever started it (a job created just before the kill got its
    // companions from the redelivery).
    for i in 0..JOBS {
        let vc = h.vcjob(&format!("k-{i}")).await.unwrap();
        let ns = vc.metadata.namespace.clone().unwrap();
        let np = h.sim.object(
            "networking.k8s.io",
            "v1",
            "networkpolicies",
            &ns,
            &format!("policy-k-{i}"),
        );
        assert!(np.is_some(), "k-{i} has all its objects");
        assert_eq!(
            np.unwrap()["metadata"]["ownerReferences"][0]["uid"],
            vc.metadata.uid.clone().unwrap(),
            "owned by the job that exists"
        );
    }
    // QUEUED copies of one job (a redelivery after the kill) are identical.
    for i in 0..JOBS {
        let bodies: BTreeSet<_> = events
            .iter()
            .filter(|c| c.message_id == format!("k-{i}/QUEUED"))
            .map(|c| c.body.clone())
            .collect();
        assert_eq!(bodies.len(), 1, "k-{i}: one QUEUED content");
    }
    assert!(h.dead_letters().await.is_empty());
}
