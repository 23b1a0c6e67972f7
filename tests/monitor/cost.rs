//! What monitoring a job costs its runner, counted by the monitor's metrics against the simulator and a
//! real RabbitMQ: the watch brings every write of the monitor back (its echo), and an echo is not a
//! change to decide.

use crate::monitor_support;

use std::time::Duration;

use monitor_support::*;
use volcano_runner::ops::Metrics;
use volcano_runner::ops::metrics::Samples;

fn samples(metrics: &Metrics) -> Samples {
    Samples::parse(&metrics.encode()).expect("the exposition parses")
}

const DECISIONS: &str = "volcano_runner_monitor_decisions_total";
const EVENTS: &str = "volcano_runner_monitor_watch_events_total";

/// The job patches the simulator has answered so far.
fn job_patches(w: &World) -> u64 {
    w.served("patch jobs.batch.volcano.sh")
}

/// While a job runs, each tick is one decision: the timer's, which publishes the tick and writes the
/// cursor. The write's echo (the watch bringing the version the patch's answer put in the cache) is
/// counted as no news and decided no more: before, every write of the monitor was followed by a second
/// decision of the job as written, which found nothing to do. Its events and ticks are still told
/// once each.
#[tokio::test]
async fn the_echo_of_the_monitors_own_write_is_not_decided_again() {
    let mut w = World::start("mon-echo", |_| {}, |_| {}).await;
    let metrics = Metrics::new();
    let counted = metrics.clone();
    let runner = w
        .runner_with("runner-a", move |m| m.with_metrics(counted))
        .await;
    runner.holds(4).await;
    let job = job("c1", "echo starting; sleep 150; echo done");
    w.submit(&job).await;
    w.advance(1);
    w.until("a status event or RUNNING", |s| {
        !s.of("c1").lifecycle.is_empty()
    })
    .await;
    w.advance(2);
    w.until("RUNNING", |s| s.event("c1/RUNNING").is_some())
        .await;
    // Let the monitor settle (RUNNING's record and its echo) before counting the ticks.
    w.settle(Duration::from_millis(500)).await;
    let before = samples(&metrics);
    let patches_before = job_patches(&w);
    // One step past the first tick's due time: one timer, one decision.
    w.advance(90);
    w.until("the first tick", |s| !s.unique_ticks().is_empty())
        .await;
    w.settle(Duration::from_millis(500)).await;
    let after = samples(&metrics);
    let decisions = after.value(DECISIONS, &[]) - before.value(DECISIONS, &[]);
    let patches = job_patches(&w) - patches_before;
    let echoes = after.value(EVENTS, &[("watch", "jobs"), ("news", "no")])
        - before.value(EVENTS, &[("watch", "jobs"), ("news", "no")]);
    assert!(patches >= 1, "the tick's cursor is written");
    assert!(
        echoes >= patches as f64,
        "the watch brings each write back: {echoes} echoes of {patches} patches"
    );
    assert!(
        decisions <= patches as f64,
        "one decision per write, none for its echo: {decisions} decisions, {patches} patches"
    );
    for _ in 0..3 {
        w.advance(30);
    }
    w.until("SUCCESS", |s| s.event("c1/SUCCESS").is_some())
        .await;
    w.until("the final tick", Seen::has_final_tick).await;
    w.settle(Duration::from_millis(500)).await;
    let end = samples(&metrics);
    eprintln!(
        "cost: over the job's life {} decisions, {} job patches; watch events with news: jobs {}, \
         pods {}, podgroups {}; echoes dropped {}",
        end.value(DECISIONS, &[]),
        job_patches(&w),
        end.value(EVENTS, &[("watch", "jobs"), ("news", "yes")]),
        end.value(EVENTS, &[("watch", "pods"), ("news", "yes")]),
        end.value(EVENTS, &[("watch", "podgroups"), ("news", "yes")]),
        end.value(EVENTS, &[("watch", "jobs"), ("news", "no")]),
    );
    // Every promise holds: each transition once, in order, and ticks that add up to the run.
    let seen = w.seen.of("c1");
    let states: Vec<&str> = seen
        .transitions()
        .iter()
        .map(|e| e.event_id.as_str())
        .collect();
    assert_eq!(states, ["c1/QUEUED", "c1/RUNNING", "c1/SUCCESS"]);
    let running = seen.event("c1/RUNNING").unwrap();
    let success = seen.event("c1/SUCCESS").unwrap();
    let ticks = seen.unique_ticks();
    check_ticks("c1", &ticks, ms(&running.started_at), ms(&success.ended_at));
    assert_eq!(ticks.len(), 3, "60 s + 60 s + 30 s");
    runner.stop().await;
    w.close().await;
}
