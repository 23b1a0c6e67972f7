//! A graceful hand-over right after the holder published a job's RUNNING and recorded it: the runner that
//! takes the shard over decides the job on the lists its gain starts, not on a cache that has not seen
//! that record, and publishes no second RUNNING (`monitor::run::may_decide`).

use crate::monitor_support;

use std::time::{Duration, Instant};

use monitor_support::*;
use volcano_runner::sim::FaultRule;

/// How long the new holder's lists of jobs take, once its gain has started them.
const SLOW_LISTS: Duration = Duration::from_secs(10);

/// The runners that published the job's RUNNING, one per delivery.
fn told_running(w: &World, job_id: &str) -> Vec<String> {
    let running = format!("{job_id}/RUNNING");
    w.seen
        .of(job_id)
        .lifecycle
        .iter()
        .filter(|e| e.event_id == running)
        .map(|e| e.runner_id.clone())
        .collect()
}

/// Runner A holds the only shard; runner B has seen the job running (its pod, and Volcano's phase) but
/// not A's record of RUNNING (its watch of jobs loses every event from then on), as a watch behind its
/// events would. A publishes RUNNING, records it, and stops, handing the shard over. B gains it while the
/// job waits in its queue (its submit path is busy, so it defers decisions), and the job comes due while
/// B's lists are still coming in: B holds it back until they are in, finds RUNNING recorded there, and
/// publishes nothing.
#[tokio::test]
async fn the_new_holder_of_a_shard_handed_over_after_running_publishes_no_second_running() {
    let defer = Duration::from_secs(6);
    let mut w = World::start(
        "mon-handover",
        |c| {
            c.cluster.lease.shards = 1;
            // While a runner's submit path says it is busy, a job waits this long after its last change.
            c.monitor.defer_under_load = defer;
        },
        |_| {},
    )
    .await;
    // A defers too until told otherwise: the job runs before A decides it.
    let (a_busy, a_load) = tokio::sync::watch::channel(true);
    let a = w
        .runner_with("runner-a", |m| m.with_submit_load(a_load))
        .await;
    a.holds(1).await;
    let job = job("h1", "sleep 20");
    w.submit(&job).await;
    let namespace = w.namespace_of(&job);
    w.advance(3);
    let phase = |w: &World| {
        w.vcjob(&namespace, "h1")
            .and_then(|j| j["status"]["state"]["phase"].as_str().map(str::to_owned))
    };
    let deadline = Instant::now() + PATIENCE;
    while phase(&w).as_deref() != Some("Running") {
        assert!(Instant::now() < deadline, "the job never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // B's watch of jobs, started from here on, loses every event: its cache keeps the job as its first
    // list found it (running, QUEUED recorded), whatever A writes.
    w.sim.faults().add_rule(FaultRule {
        resource: "jobs".into(),
        verb: "watch".into(),
        watch_lose_events: 1.0,
        ..FaultRule::default()
    });
    let (_b_busy, b_load) = tokio::sync::watch::channel(true);
    let b = w
        .runner_with("runner-b", |m| m.with_submit_load(b_load))
        .await;
    let listed_at = Instant::now();
    let mut reports = b.reports.clone();
    let first = tokio::time::timeout(PATIENCE, reports.wait_for(|r| r.passes > 0 && r.jobs == 1))
        .await
        .is_ok_and(|r| r.is_ok());
    assert!(
        first,
        "B's first lists hold the job: {:?}",
        *reports.borrow()
    );
    assert!(
        w.seen.event("h1/RUNNING").is_none(),
        "A has not decided the job yet"
    );
    // The lists B's gain starts take a while (A lists nothing more).
    w.sim.faults().add_rule(FaultRule {
        resource: "jobs".into(),
        verb: "list".into(),
        latency_ms: u64::try_from(SLOW_LISTS.as_millis()).unwrap(),
        ..FaultRule::default()
    });

    // A decides now: RUNNING, then its record.
    a_busy.send_replace(false);
    w.until("RUNNING", |s| s.event("h1/RUNNING").is_some())
        .await;
    w.until_recorded(&namespace, "h1", "RUNNING").await;
    let passes = b.reports.borrow().passes;
    a.stop().await;
    b.holds(1).await;
    let gained = listed_at.elapsed();
    assert!(
        gained < defer,
        "B gained the shard {gained:?} after it listed the job, after the job came due in its queue: \
         the race is not set up"
    );

    // The job came due in B's queue (`defer` after B listed it) while its lists were coming in; they are
    // in now, and what B decided on them has gone out.
    let listed = tokio::time::timeout(PATIENCE, reports.wait_for(|r| r.passes > passes))
        .await
        .is_ok_and(|r| r.is_ok());
    assert!(
        listed,
        "B's lists after its gain came in: {:?}",
        *reports.borrow()
    );
    assert_eq!(
        reports.borrow().owned,
        1,
        "B's pass on those lists looked at the job as its own"
    );
    assert!(
        listed_at.elapsed() > defer,
        "the job came due before B's lists were in"
    );
    w.settle(Duration::from_millis(500)).await;
    assert_eq!(
        told_running(&w, "h1"),
        ["runner-a"],
        "RUNNING went out once, from A"
    );
    b.stop().await;
    w.close().await;
}

/// Runner A publishes a job's RUNNING, and the write that records it fails its guard (another write on
/// the job came first, as the record of a confirmed QUEUED written when a shard goes does): A reads the
/// job again, slowly, and is stopped meanwhile, its shard given back. A still records what it told before
/// the shard goes (its duty holds the release), so runner B, taking the shard, reads RUNNING recorded and
/// tells nothing again. Before, A gave the job up at the next round (no shard), RUNNING unrecorded, and B
/// published it a second time (the duplicates seen with three runners starting together).
#[tokio::test]
async fn a_holder_stopped_while_its_running_record_conflicts_records_it_before_letting_go() {
    let mut w = World::start(
        "mon-handover-conflict",
        |c| c.cluster.lease.shards = 1,
        |_| {},
    )
    .await;
    let a = w.runner("runner-a").await;
    a.holds(1).await;
    let job = job("h2", "sleep 60");
    w.submit(&job).await;
    let namespace = w.namespace_of(&job);
    let (patch, get) = ("patch jobs.batch.volcano.sh", "get jobs.batch.volcano.sh");
    let (patches, gets) = (w.served(patch), w.served(get));
    // Every patch of the job fails its guard, and a read of it takes 2 s.
    w.sim.faults().add_rule(FaultRule {
        resource: "jobs".into(),
        verb: "patch".into(),
        error_422: 1.0,
        ..FaultRule::default()
    });
    w.sim.faults().add_rule(FaultRule {
        resource: "jobs".into(),
        verb: "get".into(),
        latency_ms: 2000,
        ..FaultRule::default()
    });
    w.advance(3);
    w.until("RUNNING", |s| s.event("h2/RUNNING").is_some())
        .await;
    // The record's patch has failed its guard, and A's read of the job after it (its second: the first
    // was the fresh view RUNNING is decided on) is under way.
    crate::rabbit::within("A's read of the job after the conflict", async {
        while w.served(patch) == patches || w.served(get) < gets + 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    w.sim.faults().clear();
    assert_ne!(
        w.annotation(&namespace, "h2", &w.keys.lifecycle_state)
            .as_deref(),
        Some("RUNNING"),
        "the record is not written yet: the race is not set up"
    );
    a.stop().await;
    let b = w.runner("runner-b").await;
    b.holds(1).await;
    w.until_recorded(&namespace, "h2", "RUNNING").await;
    for _ in 0..3 {
        w.advance(5);
        w.settle(Duration::from_millis(300)).await;
    }
    assert_eq!(
        told_running(&w, "h2"),
        ["runner-a"],
        "RUNNING went out once, from A"
    );
    b.stop().await;
    w.close().await;
}
