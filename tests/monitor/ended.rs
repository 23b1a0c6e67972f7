//! Ended jobs leave the monitor (issue 46): once a job's end is recorded (the write that removes the
//! cleanup finalizer labels it `volcano-runner/ended`; its finished pods are left out of the pod lists
//! by a field selector and dropped from the cache with their job, without a write), the monitor's
//! watches and reconciliation lists no longer hold it, so a runner's memory and periodic work follow the
//! live jobs, not the jobs kept for the retention. Nothing about an ended job is told again when it leaves:
//! not when its watch event says it left, not when a relist or a restart no longer lists it, not when a
//! runner whose cache saw an old version of it takes its shard over.

use crate::monitor_support;

use std::time::Duration;

use monitor_support::*;
use volcano_runner::cluster::shard_of;
use volcano_runner::monitor::PassReport;
use volcano_runner::sim::FaultRule;

const ENDED: &str = "volcano-runner/ended";

fn labelled_ended(object: Option<serde_json::Value>) -> bool {
    object
        .and_then(|o| o.pointer("/metadata/labels").cloned())
        .and_then(|l| l.get(ENDED).cloned())
        .is_some()
}

/// Moves time on until every job of `ids` carries the ended label (its last write done).
async fn until_labelled(w: &World, ns: &str, ids: &[&str]) {
    let labelled = async {
        while !ids.iter().all(|id| labelled_ended(w.vcjob(ns, id))) {
            w.advance(5);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    if tokio::time::timeout(PATIENCE, labelled).await.is_err() {
        panic!(
            "the ended jobs were not labelled ended:\n{}",
            w.dump().await
        );
    }
}

/// Waits for a pass after `after` whose report `ok` accepts.
async fn pass_where(
    runner: &TestRunner,
    after: u64,
    what: &str,
    ok: impl Fn(&PassReport) -> bool,
) -> PassReport {
    let mut rx = runner.reports.clone();
    let found = tokio::time::timeout(PATIENCE, rx.wait_for(|r| r.passes > after && ok(r)))
        .await
        .ok()
        .and_then(|r| r.ok().map(|r| r.clone()));
    found.unwrap_or_else(|| panic!("no pass with {what}; the last: {:?}", *rx.borrow()))
}

/// Every message id was delivered once.
fn no_duplicates(w: &World) {
    let mut ids: Vec<&str> = w
        .raw
        .iter()
        .filter_map(|e| e.message_id.as_deref())
        .collect();
    ids.sort_unstable();
    let mut twice: Vec<&str> = ids
        .windows(2)
        .filter(|p| p[0] == p[1])
        .map(|p| p[0])
        .collect();
    twice.dedup();
    assert!(
        twice.is_empty(),
        "delivered more than once: {twice:?}\n{:#?}",
        summary(&w.seen)
    );
}

/// Three jobs end (two successes, one a minute after the other, and a failure), one runs on. Once
/// their ends are recorded, the runner's cache holds the live job and its pod alone; a relist after
/// every watch is cut and the history compacted, and a restart of the monitor, find the same, and not
/// one event of the ended jobs goes out again.
#[tokio::test]
async fn ended_jobs_leave_the_caches_and_a_relist_or_a_restart_tells_them_nothing_again() {
    let mut w = World::start(
        "mon-ended",
        |c| c.monitor.reconcile_interval = Duration::from_secs(1),
        |_| {},
    )
    .await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let jobs = [
        job("e1", "sleep 20"),
        job("e2", "sleep 20; exit 3"),
        job("e3", "sleep 80"),
        job("live", "sleep 5000"),
    ];
    for j in &jobs {
        w.submit(j).await;
    }
    let ns = w.namespace_of(&jobs[0]);
    w.advance(3);
    w.until("every job RUNNING", |s| {
        ["e1", "e2", "e3", "live"]
            .iter()
            .all(|id| s.event(&format!("{id}/RUNNING")).is_some())
    })
    .await;
    for _ in 0..4 {
        w.advance(30);
    }
    w.until("the three ends with their final ticks", |s| {
        s.event("e1/SUCCESS").is_some()
            && s.event("e2/FAILURE").is_some()
            && s.event("e3/SUCCESS").is_some()
            && ["e1", "e2", "e3"]
                .iter()
                .all(|id| s.of(id).has_final_tick())
    })
    .await;
    until_labelled(&w, &ns, &["e1", "e2", "e3"]).await;
    for id in ["e1", "e2", "e3"] {
        // Kept by Volcano until the TTL, and not written: no request per pod.
        let pod = w.pod(&ns, &format!("j-{id}-job-0"));
        assert!(
            !labelled_ended(pod.clone()),
            "the finished pod of {id} is not written: {pod:#?}"
        );
    }
    assert!(!labelled_ended(w.vcjob(&ns, "live")), "the live job is not");

    let report = pass_where(&runner, 0, "the live job alone", |r| r.jobs == 1).await;
    assert_eq!(
        (report.jobs, report.pods, report.groups),
        (1, 1, 1),
        "the live job, its pod and its PodGroup: {report:?}"
    );
    // Every watch starts over, with a full list (410 Gone).
    w.sim.compact_history();
    w.sim.cut_watches();
    w.advance(1);
    let relisted = pass_where(
        &runner,
        report.passes + 1,
        "a pass after the relist",
        |_| true,
    )
    .await;
    assert_eq!((relisted.jobs, relisted.pods), (1, 1), "{relisted:?}");
    runner.stop().await;

    let again = w.runner("runner-b").await;
    again.holds(4).await;
    let fresh = pass_where(&again, 0, "a pass over its shards", |r| r.owned > 0).await;
    assert_eq!(
        (fresh.jobs, fresh.pods, fresh.owned),
        (1, 1, 1),
        "a monitor that starts lists the live job alone: {fresh:?}"
    );
    w.advance(60);
    w.advance(60);
    w.until("the live job's next tick", |s| {
        s.of("live").unique_ticks().len() >= 3
    })
    .await;
    w.settle(Duration::from_millis(500)).await;
    no_duplicates(&w);
    for (id, end) in [("e1", "SUCCESS"), ("e2", "FAILURE"), ("e3", "SUCCESS")] {
        let ids: Vec<String> = w
            .seen
            .of(id)
            .transitions()
            .iter()
            .map(|e| e.event_id.clone())
            .collect();
        assert_eq!(
            ids,
            [
                format!("{id}/QUEUED"),
                format!("{id}/RUNNING"),
                format!("{id}/{end}")
            ]
        );
    }
    again.stop().await;
    w.close().await;
}

/// A runner's cache can hold an old version of a job that another runner has since ended (here every
/// job watch loses its events while the job ends): when that runner takes the job's shard over, its
/// full list no longer has the job (labelled ended), and "not listed" must not be taken for "gone
/// without its end told". The cluster is asked: the job is there, its end recorded, so nothing goes
/// out again (before, a relist that missed a job published its end from the cache: the duplicates of
/// the first attempt at this change).
#[tokio::test]
async fn a_runner_whose_cache_is_behind_tells_nothing_again_when_it_takes_an_ended_job_over() {
    let mut w = World::start("mon-ended-stale", |_| {}, |_| {}).await;
    let a = w.runner("runner-a").await;
    a.holds(4).await;
    let b = w.runner("runner-b").await;
    b.holds(2).await;
    a.holds(2).await;
    let job = job("st1", "sleep 20");
    let ns = w.namespace_of(&job);
    let shard = shard_of("st1", w.config.cluster.lease.shards);
    let (owner, other) = if a.leases.subscribe().borrow().held().contains(&shard) {
        (a, b)
    } else {
        (b, a)
    };
    w.submit(&job).await;
    w.advance(3);
    w.until("RUNNING", |s| s.event("st1/RUNNING").is_some())
        .await;
    // Both caches have the job (a watch delivers within milliseconds); from now on no job watch
    // delivers anything.
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.sim.faults().add_rule(FaultRule {
        resource: "jobs".into(),
        verb: "watch".into(),
        watch_lose_events: 1.0,
        ..FaultRule::default()
    });
    w.sim.cut_watches();
    let ended = async {
        while !labelled_ended(w.vcjob(&ns, "st1")) {
            w.advance(10);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    if tokio::time::timeout(PATIENCE, ended).await.is_err() {
        panic!(
            "{} did not end the job:\n{}",
            owner.identity,
            w.dump().await
        );
    }
    w.until("SUCCESS", |s| s.event("st1/SUCCESS").is_some())
        .await;
    w.settle(Duration::from_millis(300)).await;
    let told = w.raw.len();
    // The owner goes; the other runner takes every shard and lists every kind afresh.
    w.sim.faults().clear();
    let passes = other.reports.borrow().passes;
    owner.stop().await;
    other.holds(4).await;
    let _ = pass_where(&other, passes, "a pass after the takeover", |r| r.jobs == 0).await;
    w.settle(Duration::from_millis(500)).await;
    assert_eq!(
        w.raw.len(),
        told,
        "nothing more is told: {:#?}",
        summary(&w.seen)
    );
    no_duplicates(&w);
    other.stop().await;
    w.close().await;
}
