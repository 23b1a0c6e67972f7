//! The submission gate: while paused, submissions wait in their queue and cancels and extensions still
//! flow; resuming drains the queue. With `max_active_jobs`, the number of active jobs stays at the cap.

use crate::harness;
use crate::rabbit;

use std::time::Duration;

use harness::{Harness, figlet};
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
    h.wait_events("the control messages' events", |e| {
        e.iter().any(|c| c.message_id == "p-2/CANCELLED")
            && e.iter().any(|c| c.message_id == "p-3/extend/r1")
    })
    .await;
    // The extension came before its job: unknown, and nothing changes.
    let ext = h.events_with_id("p-3/extend/r1").await;
    assert_eq!(ext[0].event.as_ref().unwrap().reason, "unknown_job");
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
