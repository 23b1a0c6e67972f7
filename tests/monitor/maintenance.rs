//! Maintenance windows (`volcano-runner admin maintenance`) against the simulator (stopped clock) and a
//! real RabbitMQ: a running job a window cuts is warned `[monitor] maintenance_warn_before` ahead, then
//! ended at the window's start (FAILURE, reason `maintenance`) and charged up to the start only; a job
//! that expires before the window is left alone; a cancelled window ends nothing; a runner killed at the
//! window's start leaves one end and one final tick.

use crate::monitor_support;

use std::collections::BTreeSet;
use std::time::Duration;

use monitor_support::*;
use volcano_runner::cluster::{MaintenanceWindows, Window};
use volcano_runner::messages::v1::{JobState, SubmitJob};

fn with_allocation(mut job: SubmitJob, secs: i64) -> SubmitJob {
    job.time_allocation = Some(pbjson_types::Duration {
        seconds: secs,
        nanos: 0,
    });
    job
}

/// A window from `start_in` to `end_in` seconds from the simulator's now, on `nodes` (empty: all).
async fn schedule(w: &World, start_in: i64, end_in: i64, nodes: &[&str]) -> Window {
    let now = w.sim.now();
    let window = Window::new(
        now + jiff::SignedDuration::from_secs(start_in),
        now + jiff::SignedDuration::from_secs(end_in),
        nodes
            .iter()
            .map(|n| (*n).to_owned())
            .collect::<BTreeSet<_>>(),
        Some("kernel update".into()),
        "test@host",
        now,
    )
    .expect("a valid window");
    let windows = MaintenanceWindows::new(w.client.clone(), &w.config.cluster);
    assert!(windows.schedule(&window).await.expect("stored"));
    window
}

/// Waits until the job is terminated (a TerminateJob command) at the window's start.
async fn deleted(w: &World, ns: &str, job_id: &str) {
    w.until_ending(ns, job_id).await;
}

fn warning_id(job_id: &str, window: &Window) -> String {
    format!(
        "{job_id}/maintenance/{}/{}/warning",
        window.id,
        window.start.as_millisecond()
    )
}

/// Warned an hour ahead (the default lead), ended at the window's start with reason `maintenance`,
/// ticks adding up to exactly the time until the start; a job that expires before the window starts
/// gets neither.
#[tokio::test]
async fn a_running_job_a_window_cuts_is_warned_then_ended_at_its_start_and_charged_up_to_it() {
    let mut w = World::start("mon-maint-cut", |_| {}, |_| {}).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let cut = with_allocation(job("mw1", "sleep infinity"), 4 * 3600);
    let spared = with_allocation(job("mw2", "sleep infinity"), 3600);
    let ns = w.namespace_of(&cut);
    w.submit(&cut).await;
    w.submit(&spared).await;
    w.advance(2);
    w.until("both RUNNING", |s| {
        s.event("mw1/RUNNING").is_some() && s.event("mw2/RUNNING").is_some()
    })
    .await;
    let start = ms(&w.seen.event("mw1/RUNNING").unwrap().started_at);
    // From two hours from now, for an hour, on every node.
    let window = schedule(&w, 7200, 10800, &[]).await;
    let window_ms = window.start.as_millisecond();

    w.advance_to_ms(window_ms - 3_600_000 - 60_000);
    w.settle(Duration::from_millis(300)).await;
    assert!(
        w.seen.event(&warning_id("mw1", &window)).is_none(),
        "no warning before the lead"
    );
    w.advance(60);
    w.until("the maintenance warning", |s| {
        s.event(&warning_id("mw1", &window)).is_some()
    })
    .await;
    let warning = w.seen.event(&warning_id("mw1", &window)).unwrap().clone();
    assert_eq!(warning.reason, "maintenance_warning");
    assert_eq!(ms(&warning.timestamp), window_ms - 3_600_000);
    assert!(
        warning.status.contains(&window.id) && warning.status.contains("kernel update"),
        "{}",
        warning.status
    );
    assert!(
        w.seen.event(&warning_id("mw2", &window)).is_none(),
        "a job that expires before the window is not warned"
    );

    w.advance_to_ms(window_ms - 1000);
    w.settle(Duration::from_millis(300)).await;
    assert!(
        w.vcjob(&ns, "mw1").is_some() && !w.is_ending(&ns, "mw1"),
        "not ended before the window's start"
    );
    // Looked at late (a minute after the start): still charged up to the start only.
    w.advance(61);
    deleted(&w, &ns, "mw1").await;
    w.advance(5);
    w.until("FAILURE maintenance", |s| s.event("mw1/FAILURE").is_some())
        .await;
    w.until("the final tick", |s| s.of("mw1").has_final_tick())
        .await;
    let failure = w.seen.event("mw1/FAILURE").unwrap().clone();
    assert_eq!(failure.state, JobState::Failure as i32);
    assert_eq!(failure.reason, "maintenance");
    assert!(failure.status.contains(&window.id), "{}", failure.status);
    assert_eq!(
        ms(&failure.ended_at),
        window_ms,
        "ended at the window's start"
    );
    let ticks = w.seen.of("mw1").unique_ticks();
    check_ticks("mw1", &ticks, start, window_ms);
    // The other job expired on its own, before the window, as EXPIRED.
    w.until("mw2 EXPIRED", |s| s.event("mw2/EXPIRED").is_some())
        .await;
    assert!(w.seen.event("mw2/FAILURE").is_none());
    runner.stop().await;
    w.close().await;
}

/// A window on other nodes leaves a job alone; a cancelled window ends nothing, even past its start.
#[tokio::test]
async fn a_window_on_other_nodes_or_cancelled_ends_nothing() {
    let mut w = World::start("mon-maint-cancel", |_| {}, |_| {}).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let job1 = with_allocation(job("mw3", "sleep infinity"), 4 * 3600);
    let ns = w.namespace_of(&job1);
    w.submit(&job1).await;
    w.advance(2);
    w.until("RUNNING", |s| s.event("mw3/RUNNING").is_some())
        .await;
    let node = w
        .pod(&ns, "j-mw3-job-0")
        .and_then(|p| p.pointer("/spec/nodeName")?.as_str().map(str::to_owned))
        .expect("the rank is bound to a node");
    let elsewhere = schedule(&w, 600, 1200, &["not-this-node"]).await;
    let everywhere = schedule(&w, 1800, 2400, &[]).await;
    w.advance(60);
    w.until("the warning of the window over every node", |s| {
        s.event(&warning_id("mw3", &everywhere)).is_some()
    })
    .await;
    assert!(
        w.seen.event(&warning_id("mw3", &elsewhere)).is_none(),
        "a window on other nodes than {node} does not concern the job"
    );
    w.advance_to_ms(elsewhere.end.as_millisecond() + 1000);
    w.settle(Duration::from_millis(300)).await;
    assert!(w.seen.event("mw3/FAILURE").is_none());
    let windows = MaintenanceWindows::new(w.client.clone(), &w.config.cluster);
    assert!(windows.cancel(&everywhere.id).await.expect("deleted"));
    w.settle(Duration::from_millis(300)).await;
    w.advance_to_ms(everywhere.start.as_millisecond() + 120_000);
    w.settle(Duration::from_millis(500)).await;
    assert!(
        w.seen.event("mw3/FAILURE").is_none(),
        "a cancelled window ends nothing"
    );
    assert!(
        w.vcjob(&ns, "mw3").is_some() && !w.is_ending(&ns, "mw3"),
        "the job runs on"
    );
    let (left, _) = windows.list().await.unwrap();
    assert_eq!(
        left.iter().map(|w| w.id.as_str()).collect::<Vec<_>>(),
        vec![elsewhere.id.as_str()]
    );
    runner.stop().await;
    w.close().await;
}

/// The runner that ends the job is killed as soon as the job is marked; the one that takes over ends it
/// once, with the same end, and the ticks charge the time until the window's start exactly once.
#[tokio::test]
async fn a_runner_killed_at_the_windows_start_leaves_one_end_and_one_charge() {
    let mut w = World::start("mon-maint-kill", |_| {}, |_| {}).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let job1 = with_allocation(job("mw4", "sleep infinity"), 4 * 3600);
    let ns = w.namespace_of(&job1);
    w.submit(&job1).await;
    w.advance(2);
    w.until("RUNNING", |s| s.event("mw4/RUNNING").is_some())
        .await;
    let start = ms(&w.seen.event("mw4/RUNNING").unwrap().started_at);
    let window = schedule(&w, 1800, 3600, &[]).await;
    w.advance_to_ms(window.start.as_millisecond());
    deleted(&w, &ns, "mw4").await;
    runner.kill().await;
    // Now without the window: the end was decided and recorded before the delete.
    let windows = MaintenanceWindows::new(w.client.clone(), &w.config.cluster);
    windows.cancel(&window.id).await.unwrap();
    let second = w.runner("runner-b").await;
    second.holds(4).await;
    w.advance(5);
    w.until("FAILURE maintenance", |s| s.event("mw4/FAILURE").is_some())
        .await;
    w.until("the final tick", |s| s.of("mw4").has_final_tick())
        .await;
    w.settle(Duration::from_millis(500)).await;
    let ends: Vec<_> = w
        .seen
        .of("mw4")
        .lifecycle
        .iter()
        .filter(|e| e.state == JobState::Failure as i32)
        .map(|e| (e.event_id.clone(), e.reason.clone(), ms(&e.ended_at)))
        .collect();
    let distinct: BTreeSet<_> = ends.iter().cloned().collect();
    assert_eq!(distinct.len(), 1, "one end: {ends:?}");
    let (_, reason, ended) = distinct.into_iter().next().unwrap();
    assert_eq!(reason, "maintenance");
    assert_eq!(ended, window.start.as_millisecond());
    let ticks = w.seen.of("mw4").unique_ticks();
    check_ticks("mw4", &ticks, start, window.start.as_millisecond());
    second.stop().await;
    w.close().await;
}
