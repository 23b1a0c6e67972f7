//! The submission gate: while paused, submissions wait in their queue and cancels and extensions still
//! flow; resuming drains the queue. With `max_active_jobs`, the number of active jobs stays at the cap.

use crate::harness;
use crate::rabbit;

use std::time::Duration;

use harness::{Harness, figlet};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use volcano_runner::cluster::PauseSwitch;

/// Paused: submissions wait in the queue (none is taken, none rejected) while a cancel and an extension
/// are handled. Resumed: the runner drains the queue by itself, and the cancelled one does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_submissions_wait_while_control_messages_flow() {
    let h = Harness::new("gate-pause").await;
    let runner = h.start("runner-a");
    let submit_queue = h.config.broker.submit_queue.clone();
    h.wait_consumers(&submit_queue, 1).await;
    let switch = PauseSwitch::new(h.client.clone(), &h.config.cluster);
    switch
        .pause("maintenance", "test", jiff::Timestamp::now())
        .await
        .unwrap();
    h.wait_consumers(&submit_queue, 0).await;

    for i in 0..5 {
        h.submit(&figlet(&format!("p-{i}"))).await;
    }
    h.cancel("p-2", Some("not needed")).await;
    h.extend("p-3", "r1", 600).await;
    h.wait_events("the cancel's event", |e| {
        e.iter().any(|c| c.message_id == "p-2/CANCELLED")
    })
    .await;
    // The extension came before its job: it waits for it (tests/runner/gate.rs
    // an_extension_of_a_held_submission_applies_once_the_job_exists).
    wait_pending_extensions(&h, 1).await;
    rabbit::within(
        "5 submissions waiting",
        h.vhost.wait_ready(&submit_queue, 5),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(h.vhost.ready(&submit_queue).await, 5, "all five still wait");
    assert!(h.vcjobs().await.is_empty(), "nothing started while paused");
    assert!(h.dead_letters().await.is_empty(), "nothing rejected");

    switch.resume("test", jiff::Timestamp::now()).await.unwrap();
    h.wait_events("QUEUED for the four", |e| {
        [0, 1, 3, 4]
            .iter()
            .all(|i| e.iter().any(|c| c.message_id == format!("p-{i}/QUEUED")))
    })
    .await;
    h.wait_queues_settled().await;
    runner.stop().await;
    let jobs = h.vcjobs().await;
    assert_eq!(jobs.len(), 4);
    assert!(
        h.vcjob("p-2").await.is_none(),
        "the cancelled submission never started"
    );
    let cancelled = h.events_with_id("p-2/CANCELLED").await;
    assert_eq!(
        cancelled.len(),
        2,
        "from the cancel, and again from the late submission"
    );
}

/// The pending extensions recorded in the runner's namespace, once there are `n`.
async fn wait_pending_extensions(h: &Harness, n: usize) -> Vec<ConfigMap> {
    let api: Api<ConfigMap> = Api::namespaced(h.client.clone(), &h.config.cluster.namespace);
    let params = ListParams::default().labels("app.kubernetes.io/component=pending-extension");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let items = api.list(&params).await.unwrap().items;
        if items.len() == n {
            return items;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} pending extensions, not {n}",
            items.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An extension of a submission held by the pause is not lost (issue 30): it is recorded in the cluster
/// and, once the pause is lifted and the job exists, applied once (the request delivered twice extends
/// once) and answered `extended` under the request's id; its record is then gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_of_a_held_submission_applies_once_the_job_exists() {
    let h = Harness::new("gate-extend-held").await;
    let mut config = h.config.clone();
    config.cluster.pending_extension_interval = Duration::from_millis(200);
    let runner = h.start_with("runner-a", config, false);
    let submit_queue = h.config.broker.submit_queue.clone();
    h.wait_consumers(&submit_queue, 1).await;
    let switch = PauseSwitch::new(h.client.clone(), &h.config.cluster);
    switch
        .pause("maintenance", "test", jiff::Timestamp::now())
        .await
        .unwrap();
    h.wait_consumers(&submit_queue, 0).await;

    let job = figlet("held-1");
    let allocation_ms = job.time_allocation.as_ref().unwrap().seconds * 1000;
    h.submit(&job).await;
    h.extend("held-1", "r1", 600).await;
    h.extend("held-1", "r1", 600).await;
    wait_pending_extensions(&h, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        h.events_with_id("held-1/extend/r1").await.is_empty(),
        "no answer while the job does not exist"
    );
    assert!(h.vcjobs().await.is_empty(), "nothing started while paused");

    switch.resume("test", jiff::Timestamp::now()).await.unwrap();
    let events = h
        .wait_events("QUEUED and the extension's answer", |e| {
            e.iter().any(|c| c.message_id == "held-1/QUEUED")
                && e.iter().any(|c| c.message_id == "held-1/extend/r1")
        })
        .await;
    wait_pending_extensions(&h, 0).await;
    h.wait_queues_settled().await;
    runner.stop().await;
    let answer = events
        .iter()
        .find(|c| c.message_id == "held-1/extend/r1")
        .and_then(|c| c.event.clone())
        .unwrap();
    assert_eq!(answer.reason, "extended");
    let keys = volcano_runner::durable::AnnotationKeys::new(&h.config.pipeline.annotation_prefix);
    let vc = h.vcjob("held-1").await.unwrap();
    let annotations = vc.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get(&keys.max_time),
        Some(&(allocation_ms + 600_000).to_string()),
        "extended once"
    );
    assert_eq!(
        annotations.get(&keys.extensions).map(String::as_str),
        Some("[\"r1\"]")
    );
}

/// With `max_active_jobs = 3`, never more than three jobs are active; as jobs finish, the waiting
/// submissions follow until all are done.
/// A runner that starts while submissions are paused holds no consumer on the submit queue (it would
/// be sent up to its prefetch of submissions and sit on them), and takes them once resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_started_while_paused_holds_no_submit_consumer() {
    let h = Harness::new("gate-start-paused").await;
    let switch = PauseSwitch::new(h.client.clone(), &h.config.cluster);
    switch
        .pause("maintenance", "test", jiff::Timestamp::now())
        .await
        .unwrap();
    let submit_queue = h.config.broker.submit_queue.clone();
    for i in 0..3 {
        h.submit(&figlet(&format!("sp-{i}"))).await;
    }
    let runner = h.start("runner-a");
    // The control consumer is up: the runner has started and read the switch by the time it settles.
    h.wait_consumers(&h.config.broker.control_queue, 1).await;
    h.wait_consumers(&submit_queue, 0).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        h.consumers(&submit_queue).await,
        0,
        "still none while paused"
    );
    assert_eq!(
        h.vhost.ready(&submit_queue).await,
        3,
        "all three wait, none held"
    );

    switch.resume("test", jiff::Timestamp::now()).await.unwrap();
    h.wait_events("QUEUED for the three", |e| {
        (0..3).all(|i| e.iter().any(|c| c.message_id == format!("sp-{i}/QUEUED")))
    })
    .await;
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_active_jobs_holds_the_count_at_the_cap() {
    let h = Harness::new("gate-cap").await;
    let mut config = h.config.clone();
    config.cluster.max_active_jobs = Some(3);
    let runner = h.start_with("runner-a", config, false);
    const JOBS: usize = 8;
    for i in 0..JOBS {
        h.submit(&figlet(&format!("cap-{i}"))).await;
    }
    let active = |jobs: &[volcano_runner::volcano::VolcanoJob]| {
        jobs.iter()
            .filter(|j| !j.phase().is_finished() && j.metadata.deletion_timestamp.is_none())
            .count()
    };
    // The first three are created, and no more while they run.
    let deadline = tokio::time::Instant::now() + rabbit::PATIENCE;
    while h.vcjobs().await.len() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "three jobs start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(h.vcjobs().await.len(), 3, "held at the cap");

    // Let simulated time pass so jobs finish; never more than three active at once.
    let deadline = tokio::time::Instant::now() + rabbit::PATIENCE;
    loop {
        let jobs = h.vcjobs().await;
        assert!(active(&jobs) <= 3, "{} active jobs", active(&jobs));
        if jobs.len() == JOBS && active(&jobs) == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "all jobs ran ({} created)",
            jobs.len()
        );
        h.sim.advance(Duration::from_secs(20));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    h.wait_queues_settled().await;
    runner.stop().await;
    let events = h.events().await;
    for i in 0..JOBS {
        assert_eq!(
            events
                .iter()
                .filter(|c| c.message_id == format!("cap-{i}/QUEUED"))
                .count(),
            1
        );
    }
}
