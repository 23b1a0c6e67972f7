//! The monitor lets the submissions of its process go first: while the runner has submissions in hand
//! a job's changes wait (up to `[monitor] defer_under_load`), and once the submissions are done the job
//! is decided on what the watches show by then.

use crate::monitor_support;

use std::time::Duration;

use monitor_support::*;

/// With submissions in hand for longer than the job takes to start, the monitor tells the job nothing
/// meanwhile (it runs); it is told RUNNING soon after they are done.
#[tokio::test]
async fn a_job_waits_while_submissions_are_in_hand_and_is_told_once_they_are_done() {
    let mut w = World::start(
        "mon-defer",
        |c| c.monitor.defer_under_load = Duration::from_secs(120),
        |_| {},
    )
    .await;
    let (submitting, load) = tokio::sync::watch::channel(true);
    let runner = w
        .runner_with("runner-a", move |m| m.with_submit_load(load))
        .await;
    runner.holds(4).await;
    let job = job("d1", "echo starting; sleep 150; echo done");
    let ns = w.namespace_of(&job);
    w.submit(&job).await;
    w.advance(1);
    w.advance(2);
    let started = || {
        w.pod(&ns, "j-d1-job-0")
            .and_then(|p| {
                p.pointer("/status/containerStatuses/0/state/running")
                    .cloned()
            })
            .is_some()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !started() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the simulated pod does not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    w.settle(Duration::from_secs(3)).await;
    // Only the submission's own QUEUED (published by the submit path, not the monitor).
    assert!(
        w.seen.event("d1/RUNNING").is_none() && w.seen.of("d1").lifecycle.len() == 1,
        "the monitor tells nothing while submissions are in hand: {:?}",
        summary(&w.seen)
    );
    submitting.send_replace(false);
    let told = tokio::time::Instant::now();
    w.until("RUNNING", |s| s.event("d1/RUNNING").is_some())
        .await;
    assert!(
        told.elapsed() < Duration::from_secs(5),
        "told soon after the submissions are done: {:?}",
        told.elapsed()
    );
    runner.stop().await;
    w.close().await;
}

/// A job whose QUEUED is left to its monitor (its submitting runner did not hold the job's shard) is
/// not deferred behind the monitor's own submissions: its user waits for that QUEUED as for any
/// submission's, so it is told after `coalesce`, however long `defer_under_load` is.
#[tokio::test]
async fn a_queued_left_to_the_monitor_is_told_while_submissions_are_in_hand() {
    let mut w = World::start(
        "mon-defer-queued",
        |c| c.monitor.defer_under_load = Duration::from_secs(120),
        |_| {},
    )
    .await;
    let (_submitting, load) = tokio::sync::watch::channel(true);
    let runner = w
        .runner_with("runner-a", move |m| m.with_submit_load(load))
        .await;
    runner.holds(4).await;
    let key = volcano_runner::monitor::queued::queued_by_key(&w.config.pipeline.annotation_prefix);
    let job = job("d2", "echo starting; sleep 150; echo done");
    // Created as a runner that does not hold the job's shard creates it: no QUEUED of its own.
    w.create_edited(&job, |vcjob| {
        vcjob.metadata.annotations.get_or_insert_default().insert(
            key.clone(),
            volcano_runner::monitor::queued::BY_MONITOR.into(),
        );
    })
    .await;
    let created = tokio::time::Instant::now();
    w.until("QUEUED", |s| s.event("d2/QUEUED").is_some()).await;
    assert!(
        created.elapsed() < Duration::from_secs(20),
        "told by its monitor without waiting for the submissions in hand: {:?}",
        created.elapsed()
    );
    assert_eq!(
        w.seen.of("d2").lifecycle.len(),
        1,
        "QUEUED once: {:?}",
        summary(&w.seen)
    );
    runner.stop().await;
    w.close().await;
}
