//! The monitoring duty under failure: the runner holding a job's shard is killed mid-job and another takes
//! over from the annotations; watches cut by the simulator's fault plan; 10 s of API 503s; a job with
//! unreadable annotations next to healthy ones.

use crate::monitor_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use monitor_support::*;
use volcano_runner::cluster::shard_of;
use volcano_runner::messages::v1::JobEvent;
use volcano_runner::sim::FaultRule;

/// Every lifecycle event id was published with one content only (the publishing runner's name aside,
/// which says who sent it), and the transitions are exactly `expected`, in order.
fn check_lifecycle(seen: &Seen, job_id: &str, expected: &[&str]) {
    let mut by_id: BTreeMap<&str, JobEvent> = BTreeMap::new();
    for e in seen.of(job_id).lifecycle.iter() {
        let mut content = e.clone();
        content.runner_id.clear();
        if let Some(old) = by_id.get(e.event_id.as_str()) {
            assert_eq!(
                old, &content,
                "{} published twice with different content",
                e.event_id
            );
        }
        by_id.insert(&e.event_id, content);
    }
    let transitions: Vec<String> = seen
        .of(job_id)
        .transitions()
        .iter()
        .map(|e| e.event_id.clone())
        .collect();
    let expected: Vec<String> = expected.iter().map(|s| format!("{job_id}/{s}")).collect();
    assert_eq!(transitions, expected);
}

/// The runner that holds the job's shard is killed in the middle of the job. Another runner takes the
/// shard over within 15 s and carries on from the annotations: over the whole job the ticks are distinct,
/// gap-free, overlap-free and add up to the real run time, and no lifecycle event is missing or published
/// twice with different content.
#[tokio::test]
async fn the_duty_holder_dies_mid_job_and_another_runner_takes_over() {
    let mut w = World::start(
        "mon-failover",
        |c| {
            // The production lease timing (10 s, renewed every 2 s, 2 s margin).
            c.cluster.lease = Default::default();
            c.cluster.lease.shards = 4;
        },
        |_| {},
    )
    .await;
    let a = w.runner("runner-a").await;
    a.holds(4).await;
    let b = w.runner("runner-b").await;
    b.holds(2).await;
    let job_id = "f1";
    let shard = shard_of(job_id, 4);
    let job = job(job_id, "echo go; sleep 400; echo finished");
    w.submit(&job).await;
    w.advance(3);
    w.until("RUNNING", |s| s.event("f1/RUNNING").is_some())
        .await;
    let start = ms(&w.seen.event("f1/RUNNING").unwrap().started_at);
    w.advance(130);
    w.until("two ticks", |s| s.of("f1").unique_ticks().len() >= 2)
        .await;
    // Kill the holder; the other is the survivor.
    let (holder, survivor) = if a.leases.held().held().contains(&shard) {
        (a, b)
    } else {
        (b, a)
    };
    assert!(
        holder.leases.held().held().contains(&shard),
        "one of them holds shard {shard}"
    );
    let victim = holder.identity.clone();
    holder.kill().await;
    let killed_at = Instant::now();
    // Time goes on while nobody carries the duty: ticks 2 and 3 fall due.
    w.advance(130);
    w.until("a tick published by the survivor", |s| {
        s.of("f1").ticks.len() >= 4
    })
    .await;
    let took_over = killed_at.elapsed();
    assert!(
        survivor.leases.held().held().contains(&shard),
        "{} holds shard {shard} now",
        survivor.identity
    );
    assert!(
        took_over < Duration::from_secs(15),
        "{victim} died and {} published after {took_over:?}",
        survivor.identity
    );
    for _ in 0..5 {
        w.advance(30);
    }
    w.until("SUCCESS and the final tick", |s| {
        s.event("f1/SUCCESS").is_some() && s.of("f1").has_final_tick()
    })
    .await;
    w.settle(Duration::from_millis(500)).await;
    let success = w.seen.event("f1/SUCCESS").unwrap().clone();
    assert_eq!(ms(&success.ended_at) - start, 400_000, "sleep 400");
    let ticks = w.seen.of("f1").unique_ticks();
    check_ticks("f1", &ticks, start, ms(&success.ended_at));
    check_lifecycle(&w.seen, "f1", &["QUEUED", "RUNNING", "SUCCESS"]);
    assert_eq!(success.runner_id, survivor.identity);
    eprintln!("takeover after the kill: {took_over:?}");
    survivor.stop().await;
    w.close().await;
}

/// The holder publishes a tick but cannot persist it (every patch of the job fails) and is killed in that
/// window: the runner that takes over publishes the same tick again, with the same id and content, and
/// the job's accounting stays gap-free and overlap-free.
#[tokio::test]
async fn a_kill_between_publishing_and_persisting_republishes_the_same_tick() {
    let mut w = World::start("mon-window", |_| {}, |_| {}).await;
    let a = w.runner("runner-a").await;
    a.holds(4).await;
    let start = started(&mut w, &job("k1", "sleep 300")).await;
    // The first boundary plus the accounting settle delay (10 s).
    w.advance(70);
    w.until("tick 0", |s| s.of("k1").unique_ticks().len() == 1)
        .await;
    fail_job_patches(&w);
    w.advance(60);
    w.until("tick 1, published but not persisted", |s| {
        s.of("k1").ticks.iter().any(|t| t.tick_id == "k1/1")
    })
    .await;
    a.kill().await;
    w.sim.faults().clear();
    let b = w.runner("runner-b").await;
    b.holds(4).await;
    w.until("tick 1 again, from the new holder", |s| {
        s.of("k1")
            .ticks
            .iter()
            .filter(|t| t.tick_id == "k1/1")
            .count()
            >= 2
    })
    .await;
    for _ in 0..7 {
        w.advance(30);
    }
    w.until("SUCCESS and the final tick", |s| {
        s.event("k1/SUCCESS").is_some() && s.of("k1").has_final_tick()
    })
    .await;
    w.settle(Duration::from_millis(500)).await;
    let success = w.seen.event("k1/SUCCESS").unwrap().clone();
    // `unique_ticks` fails if the two publications of tick 1 differ in any field.
    let ticks = w.seen.of("k1").unique_ticks();
    check_ticks("k1", &ticks, start, ms(&success.ended_at));
    assert_eq!(ms(&success.ended_at) - start, 300_000);
    check_lifecycle(&w.seen, "k1", &["QUEUED", "RUNNING", "SUCCESS"]);
    b.stop().await;
    w.close().await;
}

/// A job succeeds and its monitor publishes the end (the final tick and SUCCESS) before it records it
/// (one write closes a success: the outcome, the terminal state, the finalizer's removal, the label), but
/// every patch of the job fails, and the monitor is killed in that window. The runner that takes over
/// finds the job finished, with no outcome recorded, computes the same end from the same stopped pods and
/// publishes it again under the same ids with the same content (its final tick too), then records it.
/// Fails where the outcome is recorded before it is published: SUCCESS never goes out while the patches
/// fail.
#[tokio::test]
async fn a_kill_between_publishing_a_success_and_its_one_write_republishes_the_same_end() {
    let mut w = World::start("mon-close", |_| {}, |_| {}).await;
    let a = w.runner("runner-a").await;
    a.holds(4).await;
    let job = job("k2", "sleep 30");
    let namespace = w.namespace_of(&job);
    let start = started(&mut w, &job).await;
    let outcome_and_state = |w: &World| {
        (
            w.annotation(&namespace, "k2", &w.keys.outcome).is_some(),
            w.annotation(&namespace, "k2", &w.keys.lifecycle_state),
        )
    };
    w.until_recorded(&namespace, "k2", "RUNNING").await;
    fail_job_patches(&w);
    w.advance(40);
    w.until("SUCCESS published, not recorded", |s| {
        s.event("k2/SUCCESS").is_some() && s.of("k2").has_final_tick()
    })
    .await;
    assert_eq!(
        outcome_and_state(&w),
        (false, Some("RUNNING".to_owned())),
        "nothing of the end is recorded while every patch fails"
    );
    a.kill().await;
    let told_by_a = w
        .seen
        .of("k2")
        .lifecycle
        .iter()
        .filter(|e| e.event_id == "k2/SUCCESS")
        .count();
    w.sim.faults().clear();
    let b = w.runner("runner-b").await;
    b.holds(4).await;
    w.until("SUCCESS again, from the new holder", |s| {
        s.of("k2")
            .lifecycle
            .iter()
            .any(|e| e.event_id == "k2/SUCCESS" && e.runner_id == "runner-b")
    })
    .await;
    w.settle(Duration::from_millis(500)).await;
    assert!(told_by_a >= 1);
    let success = w.seen.event("k2/SUCCESS").unwrap().clone();
    assert_eq!(ms(&success.ended_at) - start, 30_000, "sleep 30");
    // `unique_ticks` fails if two publications of a tick (the final one) differ in any field.
    let ticks = w.seen.of("k2").unique_ticks();
    check_ticks("k2", &ticks, start, ms(&success.ended_at));
    check_lifecycle(&w.seen, "k2", &["QUEUED", "RUNNING", "SUCCESS"]);
    w.until_recorded(&namespace, "k2", "SUCCESS").await;
    assert!(
        w.annotation(&namespace, "k2", &w.keys.outcome).is_some(),
        "the outcome is recorded with the end"
    );
    b.stop().await;
    w.close().await;
}

/// A success is published and, while its closing write is on its way (every job patch held up 3 s), a
/// cancel's record lands on the job (its cause, at the second Volcano finished it: a cancel that counts
/// as asked before the end). The write's guard fails; the monitor reads the job again and records the
/// SUCCESS it published, rather than deciding anew and telling CANCELLED after it.
#[tokio::test]
async fn a_cancel_recorded_under_a_published_success_does_not_change_its_end() {
    let mut w = World::start("mon-close-conflict", |_| {}, |_| {}).await;
    let a = w.runner("runner-a").await;
    a.holds(4).await;
    let job = job("k3", "sleep 30");
    let namespace = w.namespace_of(&job);
    started(&mut w, &job).await;
    w.until_recorded(&namespace, "k3", "RUNNING").await;
    w.sim.faults().add_rule(FaultRule {
        resource: "jobs".into(),
        verb: "patch".into(),
        latency_ms: 3_000,
        ..FaultRule::default()
    });
    w.advance(40);
    w.until("SUCCESS published", |s| s.event("k3/SUCCESS").is_some())
        .await;
    // The cancel's record, as the runner's cancel writes it, with the finish's own second.
    let jobs: kube::Api<volcano_runner::volcano::VolcanoJob> =
        kube::Api::namespaced(w.client.clone(), &namespace);
    let mut vc = jobs.get("j-k3").await.unwrap();
    let finished_at = vc
        .status
        .as_ref()
        .and_then(|s| s.state.last_transition_time.as_ref())
        .map(|t| t.0)
        .expect("Volcano finished the job");
    let annotations = vc.metadata.annotations.get_or_insert_default();
    annotations.insert(w.keys.termination_cause.clone(), "cancelled".into());
    annotations.insert(
        w.keys.termination_at.clone(),
        volcano_runner::durable::annotations::format_millis(finished_at),
    );
    jobs.replace("j-k3", &Default::default(), &vc)
        .await
        .unwrap();
    w.until_recorded(&namespace, "k3", "SUCCESS").await;
    w.sim.faults().clear();
    w.advance(30);
    w.settle(Duration::from_millis(1_000)).await;
    check_lifecycle(&w.seen, "k3", &["QUEUED", "RUNNING", "SUCCESS"]);
    let recorded = w
        .annotation(&namespace, "k3", &w.keys.outcome)
        .expect("the outcome is recorded");
    assert!(recorded.contains("\"SUCCESS\""), "{recorded}");
    a.stop().await;
    w.close().await;
}

/// Every watch is cut after each event it delivers, and the simulator also drops all watch connections
/// while the job runs: the watcher resumes (or lists again after 410 Gone) and the full reconciliation
/// looks at every job anyway, so no transition is lost.
#[tokio::test]
async fn watches_cut_by_the_fault_plan_lose_no_transition() {
    let mut w = World::start(
        "mon-cuts",
        |c| c.monitor.reconcile_interval = Duration::from_secs(2),
        |s| s.watch_history = 20,
    )
    .await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    on_every_watch(
        &w,
        FaultRule {
            watch_cut_after_events: Some(1),
            ..FaultRule::default()
        },
    );
    let job = job("c1", "sleep 200; exit 4");
    w.submit(&job).await;
    w.advance(3);
    w.until("RUNNING", |s| s.event("c1/RUNNING").is_some())
        .await;
    let start = ms(&w.seen.event("c1/RUNNING").unwrap().started_at);
    for i in 0..8 {
        w.sim.cut_watches();
        if i % 3 == 0 {
            w.sim.compact_history();
        }
        w.advance(30);
    }
    w.until("FAILURE and the final tick", |s| {
        s.event("c1/FAILURE").is_some() && s.of("c1").has_final_tick()
    })
    .await;
    w.settle(Duration::from_millis(500)).await;
    let failure = w.seen.event("c1/FAILURE").unwrap().clone();
    assert_eq!(failure.exit_codes.len(), 1, "{failure:#?}");
    assert_eq!(failure.exit_codes[0].exit_code, 4);
    assert_eq!(ms(&failure.ended_at) - start, 200_000);
    check_ticks(
        "c1",
        &w.seen.of("c1").unique_ticks(),
        start,
        ms(&failure.ended_at),
    );
    check_lifecycle(&w.seen, "c1", &["QUEUED", "RUNNING", "FAILURE"]);
    runner.stop().await;
    w.close().await;
}

/// Every watch stays open but silently loses every event (its bookmarks go on, so it never errs and
/// never lists again by itself). Only the full reconciliation sees the job at all: its metadata lists
/// show what the watches missed, and the watches of those kinds list afresh. No transition is lost.
#[tokio::test]
async fn watches_that_silently_lose_every_event_lose_no_transition() {
    let mut w = World::start(
        "mon-lose",
        |c| c.monitor.reconcile_interval = Duration::from_secs(2),
        |_| {},
    )
    .await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    on_every_watch(
        &w,
        FaultRule {
            watch_lose_events: 1.0,
            ..FaultRule::default()
        },
    );
    // The watches open now lose events too: they start over under the new plan.
    w.sim.cut_watches();
    let job = job("q1", "sleep 100");
    w.submit(&job).await;
    w.advance(3);
    w.until("RUNNING", |s| s.event("q1/RUNNING").is_some())
        .await;
    let start = ms(&w.seen.event("q1/RUNNING").unwrap().started_at);
    w.advance(120);
    w.until("SUCCESS and the final tick", |s| {
        s.event("q1/SUCCESS").is_some() && s.of("q1").has_final_tick()
    })
    .await;
    w.settle(Duration::from_millis(500)).await;
    let success = w.seen.event("q1/SUCCESS").unwrap().clone();
    assert_eq!(ms(&success.ended_at) - start, 100_000);
    check_ticks(
        "q1",
        &w.seen.of("q1").unique_ticks(),
        start,
        ms(&success.ended_at),
    );
    check_lifecycle(&w.seen, "q1", &["QUEUED", "RUNNING", "SUCCESS"]);
    runner.stop().await;
    w.close().await;
}

/// The API answers 503 to everything for 10 s (real time) while a job ends: the monitor (and its leases)
/// ride it out and nothing is lost once the API is back. The watches already open keep streaming (as
/// through an overloaded API server's 503s), so a success seen whole may be told during the outage: it
/// is told before its one write, and what is told is the true end; the write follows once the API is back.
#[tokio::test]
async fn ten_seconds_of_503_lose_nothing() {
    let mut w = World::start("mon-503", |_| {}, |_| {}).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let job = job("u1", "sleep 90");
    let ns = w.namespace_of(&job);
    let start = started(&mut w, &job).await;
    w.until_recorded(&ns, "u1", "RUNNING").await;
    w.sim.faults().unavailable_for(Duration::from_secs(10));
    let outage = Instant::now();
    // The job ends and a tick falls due during the outage.
    w.advance(100);
    w.settle(Duration::from_secs(2)).await;
    let state = &w.keys.lifecycle_state;
    assert_eq!(
        w.annotation(&ns, "u1", state).as_deref(),
        Some("RUNNING"),
        "the outage holds: nothing of the end is recorded while the API is down"
    );
    w.until_recorded(&ns, "u1", "SUCCESS").await;
    assert!(outage.elapsed() >= Duration::from_secs(10));
    w.until("SUCCESS and the final tick", |s| {
        s.event("u1/SUCCESS").is_some() && s.of("u1").has_final_tick()
    })
    .await;
    w.settle(Duration::from_millis(500)).await;
    let success = w.seen.event("u1/SUCCESS").unwrap().clone();
    assert_eq!(
        ms(&success.ended_at) - start,
        90_000,
        "{:#?}",
        summary(&w.seen)
    );
    check_ticks(
        "u1",
        &w.seen.of("u1").unique_ticks(),
        start,
        ms(&success.ended_at),
    );
    check_lifecycle(&w.seen, "u1", &["QUEUED", "RUNNING", "SUCCESS"]);
    w.released_then_gone(&ns, "u1").await;
    runner.stop().await;
    w.close().await;
}

/// A managed job whose annotations cannot be read is reported and skipped; the job next to it runs its
/// whole life (W6, W7).
#[tokio::test]
async fn a_broken_job_does_not_stop_the_others() {
    let mut w = World::start("mon-isolation", |_| {}, |_| {}).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let broken = job("b0", "sleep 30");
    let key = w.keys.accounted_ticks.clone();
    w.submit_edited(&broken, |j| {
        j.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(key, "many".into());
    })
    .await;
    let healthy = job("h1", "sleep 30");
    w.submit(&healthy).await;
    w.advance(3);
    for _ in 0..3 {
        w.advance(15);
    }
    w.until("the healthy job's end", |s| {
        s.event("h1/SUCCESS").is_some() && s.of("h1").has_final_tick()
    })
    .await;
    w.settle(Duration::from_millis(300)).await;
    assert_eq!(
        w.seen
            .of("b0")
            .lifecycle
            .iter()
            .map(|e| e.event_id.clone())
            .collect::<Vec<_>>(),
        ["b0/QUEUED"],
        "nothing but the submit path's QUEUED is published on the strength of unreadable annotations: {:?}",
        summary(&w.seen.of("b0"))
    );
    runner.stop().await;
    w.close().await;
}

/// Submits `job`, lets its pods start and waits for its RUNNING: its start, in milliseconds.
async fn started(w: &mut World, job: &volcano_runner::messages::v1::SubmitJob) -> i64 {
    w.submit(job).await;
    w.advance(3);
    let running = format!("{}/RUNNING", job.job_id);
    w.until("RUNNING", |s| s.event(&running).is_some()).await;
    ms(&w.seen.event(&running).unwrap().started_at)
}

/// Every patch of a VolcanoJob is answered 503 from now on, until the faults are cleared: the monitor
/// can publish but not record.
fn fail_job_patches(w: &World) {
    w.sim.faults().add_rule(FaultRule {
        resource: "jobs".into(),
        verb: "patch".into(),
        error_503: 1.0,
        ..FaultRule::default()
    });
}

/// Adds `rule` to the watches of the three kinds the monitor watches.
fn on_every_watch(w: &World, rule: FaultRule) {
    for resource in ["jobs", "pods", "podgroups"] {
        w.sim.faults().add_rule(FaultRule {
            resource: resource.into(),
            verb: "watch".into(),
            ..rule.clone()
        });
    }
}

/// A runner killed while it carries the record of a confirmed QUEUED to its first write of the job (the
/// job's pod has not started: no write has come) has listed the job on the shard's lease with its
/// renewals (`volcano-runner/queued-carried`): the runner that takes the shard over takes the record on
/// from the lease and sends no copy of QUEUED, where without the list it sends one 10 s after the
/// job's creation.
#[tokio::test]
async fn a_record_carried_by_a_killed_runner_is_taken_on_from_the_shard_lease() {
    let mut w = World::start("mon-carried-lease", |_| {}, |_| {}).await;
    let (a, confirmed) = w.carrying_runner_with("runner-a", |m| m).await;
    a.holds(4).await;
    let job = job("cl1", "echo starting; sleep 150; echo done");
    // As A's submit path: the job created, its QUEUED told and confirmed, the record left to A's monitor.
    let meta = w.create_edited(&job, |_| {}).await;
    w.tell_queued("cl1", &meta).await;
    let (ns, name) = (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    );
    assert!(
        confirmed.carry("cl1", meta.uid.as_deref(), &ns, &name),
        "A holds the job's shard"
    );
    // The simulated clock stands still: the job's pod does not start, and A writes nothing of it. Two
    // renewals (every 500 ms) list the record on the lease, if A lists it.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    a.kill().await;

    let (b, _) = w.carrying_runner_with("runner-b", |m| m).await;
    b.holds(4).await;
    // Past the 10 s a monitor waits for the record before it sends its own copy of QUEUED; the pod
    // starts.
    w.advance(10);
    w.advance(2);
    w.until("RUNNING", |s| s.event("cl1/RUNNING").is_some())
        .await;
    w.settle(Duration::from_secs(3)).await;
    let queued = w
        .seen
        .of("cl1")
        .lifecycle
        .iter()
        .filter(|e| e.event_id == "cl1/QUEUED")
        .count();
    assert_eq!(
        queued,
        1,
        "QUEUED once: B took the record on from the lease; seen {:?}",
        summary(&w.seen)
    );
    b.stop().await;
    w.close().await;
}
