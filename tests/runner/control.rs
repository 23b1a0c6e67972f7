//! Cancels and extensions: a cancel that overtakes its submission, cancelling twice, an extension
//! delivered twice with one request id, and extensions of jobs that are unknown or finished.

use crate::harness;
use crate::rabbit;

use std::time::Duration;

use harness::{Harness, figlet};
use kube::api::{Api, Patch, PatchParams};
use volcano_runner::durable::AnnotationKeys;
use volcano_runner::messages::v1::JobState;
use volcano_runner::sim::FaultRule;
use volcano_runner::volcano::{JobPhase, VolcanoJob};

fn keys() -> AnnotationKeys {
    AnnotationKeys::new("ucloud.dk/")
}

fn annotation(job: &VolcanoJob, key: &str) -> Option<String> {
    job.metadata.annotations.as_ref()?.get(key).cloned()
}

/// A cancel that arrives before its submission: CANCELLED at once (from the tombstone), and the late
/// submission is not started but gets the same CANCELLED event (same id, same content).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_before_its_submission_stops_it_from_starting() {
    let h = Harness::new("cancel-first").await;
    let runner = h.start("runner-a");
    h.cancel("early-1", Some("changed my mind")).await;
    let events = h
        .wait_events("CANCELLED from the cancel", |e| {
            e.iter().any(|c| c.message_id == "early-1/CANCELLED")
        })
        .await;
    let first = events
        .iter()
        .find(|c| c.message_id == "early-1/CANCELLED")
        .unwrap()
        .clone();
    let event = first.event.clone().unwrap();
    assert_eq!(event.state, JobState::Cancelled as i32);
    assert_eq!(event.status, "Cancelled: changed my mind");

    h.submit(&figlet("early-1")).await;
    let events = h
        .wait_events("CANCELLED again from the late submission", |e| {
            e.iter()
                .filter(|c| c.message_id == "early-1/CANCELLED")
                .count()
                == 2
        })
        .await;
    h.wait_queues_settled().await;
    runner.stop().await;
    let cancelled: Vec<_> = events
        .iter()
        .filter(|c| c.message_id == "early-1/CANCELLED")
        .collect();
    assert_eq!(
        cancelled[0].body, cancelled[1].body,
        "the same event both times"
    );
    assert!(
        h.vcjob("early-1").await.is_none(),
        "the late submission did not start"
    );
    assert!(events.iter().all(|c| c.message_id != "early-1/QUEUED"));
}

/// The same when the runner's watch of the tombstones is behind (here it loses every event; a loaded
/// machine makes it late): the runner that recorded the tombstone knows it at once, so the late
/// submission still creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_before_its_submission_stops_it_however_late_the_tombstone_watch() {
    let h = Harness::new("cancel-first-blind").await;
    h.sim.faults().add_rule(FaultRule {
        resource: "configmaps".into(),
        verb: "watch".into(),
        watch_lose_events: 1.0,
        ..FaultRule::default()
    });
    let runner = h.start("runner-a");
    // The runner's ConfigMap watches (pause switch, maintenance windows, tombstones) have listed: its
    // view of the tombstones answers, blind.
    let deadline = tokio::time::Instant::now() + rabbit::PATIENCE;
    while h
        .sim
        .request_counts()
        .get("watch configmaps")
        .copied()
        .unwrap_or(0)
        < 3
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the ConfigMap watches"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.cancel("blind-c", Some("changed my mind")).await;
    h.wait_events("CANCELLED from the cancel", |e| {
        e.iter().any(|c| c.message_id == "blind-c/CANCELLED")
    })
    .await;
    h.submit(&figlet("blind-c")).await;
    let events = h
        .wait_events("CANCELLED again from the late submission", |e| {
            e.iter()
                .filter(|c| c.message_id == "blind-c/CANCELLED")
                .count()
                == 2
        })
        .await;
    h.wait_queues_settled().await;
    runner.stop().await;
    assert!(
        h.vcjob("blind-c").await.is_none(),
        "the late submission created nothing"
    );
    assert!(events.iter().all(|c| c.message_id != "blind-c/QUEUED"));
}

/// Cancelling a job: the cause and the reason are written on the job before Volcano's TerminateJob command
/// ends it (the monitor, which holds the cleanup finalizer, reports CANCELLED from them); the job is not
/// deleted (no deletionTimestamp: it is kept as the record of its submission); a second cancel changes
/// nothing and sends no second command; a redelivered submission afterwards does not bring the job back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_twice_is_harmless() {
    let h = Harness::new("cancel-twice").await;
    let runner = h.start("runner-a");
    let job = figlet("twice-c");
    h.submit(&job).await;
    h.wait_events("QUEUED", |e| {
        e.iter().any(|c| c.message_id == "twice-c/QUEUED")
    })
    .await;
    h.cancel("twice-c", Some("over budget")).await;
    h.wait_queues_settled().await;
    let marked = wait_job(&h, "twice-c", |j| {
        matches!(j.phase(), JobPhase::Terminating | JobPhase::Terminated)
    })
    .await;
    assert!(marked.metadata.deletion_timestamp.is_none(), "not deleted");
    let k = keys();
    assert_eq!(
        annotation(&marked, &k.termination_cause).as_deref(),
        Some("cancelled")
    );
    assert_eq!(
        annotation(&marked, &k.termination_reason).as_deref(),
        Some("over budget")
    );
    assert!(
        marked
            .metadata
            .finalizers
            .as_deref()
            .unwrap_or_default()
            .contains(&k.cleanup_finalizer()),
        "the finalizer keeps it for the monitor's cleanup"
    );

    h.cancel("twice-c", Some("second thoughts")).await;
    h.submit(&job).await;
    h.wait_all_acked().await;
    runner.stop().await;
    let after = h
        .vcjob("twice-c")
        .await
        .expect("kept as the record of its submission");
    assert!(after.metadata.deletion_timestamp.is_none());
    assert_eq!(
        terminate_commands(&h, &after).await,
        1,
        "one TerminateJob command for two cancels"
    );
    assert_eq!(
        annotation(&after, &k.termination_reason).as_deref(),
        Some("over budget"),
        "the first cancel's reason stands"
    );
    assert_eq!(
        h.vcjobs().await.len(),
        1,
        "the redelivered submission made no new job"
    );
    let events = h.events().await;
    assert!(
        events.iter().all(|c| c.message_id != "twice-c/CANCELLED"),
        "the runner leaves CANCELLED of an existing job to the monitor"
    );
    assert_eq!(
        events
            .iter()
            .filter(|c| c.message_id == "twice-c/QUEUED")
            .count(),
        1,
        "no QUEUED after the end"
    );
}

/// With the monitoring duty running, a cancel ends in exactly one CANCELLED event with the reason, and
/// the job is gone once the monitor has cleaned up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_monitor_a_cancel_ends_in_one_cancelled_event() {
    let h = Harness::new("cancel-monitor").await;
    let mut config = h.config.clone();
    config.cluster.lease.shards = 1;
    config.cluster.lease.duration = Duration::from_secs(4);
    config.cluster.lease.renew_interval = Duration::from_millis(500);
    config.cluster.lease.safety_margin = Duration::from_secs(1);
    let runner = h.start_with("runner-m", config, true);
    h.submit(&figlet("mon-c")).await;
    h.wait_events("QUEUED", |e| {
        e.iter().any(|c| c.message_id == "mon-c/QUEUED")
    })
    .await;
    h.cancel("mon-c", Some("user request")).await;
    // Pods take simulated time to stop.
    let deadline = tokio::time::Instant::now() + rabbit::PATIENCE;
    loop {
        h.sim.advance(Duration::from_secs(5));
        let done = h
            .events()
            .await
            .iter()
            .any(|c| c.message_id == "mon-c/CANCELLED")
            && h.vcjob("mon-c").await.is_some_and(|j| {
                // Kept, not being deleted, as the record of its submission (its end persisted), without
                // our finalizer: Volcano's TTL deletes it.
                j.metadata.deletion_timestamp.is_none()
                    && j.phase() == JobPhase::Terminated
                    && !j
                        .metadata
                        .finalizers
                        .iter()
                        .flatten()
                        .any(|f| f == "ucloud.dk/cleanup")
                    && j.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get("ucloud.dk/lifecycleState"))
                        == Some(&"CANCELLED".to_owned())
            });
        if done {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "CANCELLED and the job kept as the record of its submission"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    runner.stop().await;
    let events = h.events().await;
    let cancelled: Vec<_> = events
        .iter()
        .filter(|c| c.message_id == "mon-c/CANCELLED")
        .collect();
    let bodies: std::collections::BTreeSet<_> = cancelled.iter().map(|c| c.body.clone()).collect();
    assert_eq!(
        bodies.len(),
        1,
        "one CANCELLED event (copies, if any, identical)"
    );
    let event = cancelled[0].event.clone().unwrap();
    assert!(event.status.contains("user request"), "{}", event.status);
    let terminal = events
        .iter()
        .filter_map(|c| c.event.as_ref())
        .filter(|e| e.job_id == "mon-c")
        .filter(|e| {
            [
                JobState::Success,
                JobState::Failure,
                JobState::Expired,
                JobState::Cancelled,
            ]
            .iter()
            .any(|s| *s as i32 == e.state)
        })
        .map(|e| e.event_id.clone())
        .collect::<std::collections::BTreeSet<_>>();
    assert_eq!(
        terminal.len(),
        1,
        "exactly one terminal event: {terminal:?}"
    );
}

/// How many Commands Volcano's controller took for `job`: it records each as an Event `CommandIssued` on
/// the job before it deletes the Command (so the Commands themselves cannot be counted afterwards).
async fn terminate_commands(h: &Harness, job: &VolcanoJob) -> usize {
    let ns = job.metadata.namespace.as_deref().unwrap();
    let name = job.metadata.name.as_deref().unwrap();
    Api::<k8s_openapi::api::core::v1::Event>::namespaced(h.client.clone(), ns)
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| {
            e.reason.as_deref() == Some("CommandIssued")
                && e.involved_object.name.as_deref() == Some(name)
                && e.message
                    .as_deref()
                    .is_some_and(|m| m.contains("TerminateJob"))
        })
        .count()
}

/// A cancel whose runner is killed while it cannot create the TerminateJob command (the cause is written
/// already), then handled again by another runner, and delivered once more after that: Volcano gets
/// exactly one TerminateJob command, and the job is ended without being deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_through_a_runner_kill_sends_one_terminate_command() {
    use volcano_runner::sim::FaultRule;
    let h = Harness::new("cancel-kill").await;
    let first = h.start_killable("runner-k1");
    h.submit(&figlet("kill-c")).await;
    h.wait_events("QUEUED", |e| {
        e.iter().any(|c| c.message_id == "kill-c/QUEUED")
    })
    .await;
    h.sim.advance(Duration::from_secs(2));
    h.sim.faults().add_rule(FaultRule {
        resource: "commands".into(),
        verb: "create".into(),
        error_500: 1.0,
        ..FaultRule::default()
    });
    h.cancel("kill-c", Some("killed on the way")).await;
    let marked = wait_job(&h, "kill-c", |j| {
        annotation(j, &keys().termination_cause).as_deref() == Some("cancelled")
    })
    .await;
    assert!(
        !marked.phase().is_ending(),
        "no command got through: {:?}",
        marked.phase()
    );
    first.kill();
    h.sim.faults().clear();
    let second = h.start("runner-k2");
    let ended = wait_job(&h, "kill-c", |j| {
        matches!(j.phase(), JobPhase::Terminating | JobPhase::Terminated)
    })
    .await;
    h.wait_queues_settled().await;
    // Delivered again (as after a kill between the command and the acknowledgement).
    h.cancel("kill-c", Some("killed on the way")).await;
    // Not `wait_all_acked`: the acknowledgements counted on the killed runner's channel may leave the
    // queue's counts with it.
    h.wait_queues_settled().await;
    second.stop().await;
    let job = h.vcjob("kill-c").await.expect("kept");
    assert!(job.metadata.deletion_timestamp.is_none(), "not deleted");
    assert_eq!(terminate_commands(&h, &ended).await, 1);
}

async fn wait_job(h: &Harness, job_id: &str, done: impl Fn(&VolcanoJob) -> bool) -> VolcanoJob {
    let deadline = tokio::time::Instant::now() + rabbit::PATIENCE;
    loop {
        if let Some(job) = h.vcjob(job_id).await
            && done(&job)
        {
            return job;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "job {job_id} did not get there"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An extension delivered twice with one request id applies once; a second request id applies again;
/// once the job has started, its expiry moves with it. Each request's event says what changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_applies_once_per_request_id() {
    let h = Harness::new("extend-once").await;
    let runner = h.start("runner-a");
    let job = figlet("ext-1");
    let allocation_ms = job.time_allocation.as_ref().unwrap().seconds * 1000;
    h.submit(&job).await;
    h.wait_events("QUEUED", |e| {
        e.iter().any(|c| c.message_id == "ext-1/QUEUED")
    })
    .await;
    let k = keys();

    h.extend("ext-1", "r1", 1800).await;
    h.extend("ext-1", "r1", 1800).await;
    let events = h
        .wait_events("both events of r1", |e| {
            e.iter()
                .filter(|c| c.message_id == "ext-1/extend/r1")
                .count()
                == 2
        })
        .await;
    h.wait_queues_settled().await;
    let vc = h.vcjob("ext-1").await.unwrap();
    assert_eq!(
        annotation(&vc, &k.max_time),
        Some((allocation_ms + 1_800_000).to_string()),
        "applied once"
    );
    assert_eq!(annotation(&vc, &k.extensions).as_deref(), Some("[\"r1\"]"));
    let r1 = events
        .iter()
        .find(|c| c.message_id == "ext-1/extend/r1")
        .unwrap();
    let e = r1.event.clone().unwrap();
    assert_eq!(
        (e.state, e.reason.as_str()),
        (JobState::Unspecified as i32, "extended")
    );
    assert_eq!(e.expires_at, None, "not started: no expiry yet");

    // The job starts (the monitor would write this): the expiry now moves too.
    let started = jiff::Timestamp::from_second(1_800_000_000).unwrap();
    let expiry = started.as_millisecond() + allocation_ms + 1_800_000;
    let api: Api<VolcanoJob> =
        Api::namespaced(h.client.clone(), vc.metadata.namespace.as_deref().unwrap());
    api.patch(
        "j-ext-1",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
            k.job_start.as_str(): started.as_millisecond().to_string(),
            k.expiry.as_str(): expiry.to_string(),
        }}})),
    )
    .await
    .unwrap();
    h.extend("ext-1", "r2", 600).await;
    let events = h
        .wait_events("the event of r2", |e| {
            e.iter().any(|c| c.message_id == "ext-1/extend/r2")
        })
        .await;
    h.wait_queues_settled().await;
    runner.stop().await;
    let vc = h.vcjob("ext-1").await.unwrap();
    assert_eq!(
        annotation(&vc, &k.max_time),
        Some((allocation_ms + 2_400_000).to_string())
    );
    assert_eq!(
        annotation(&vc, &k.expiry),
        Some((expiry + 600_000).to_string())
    );
    assert_eq!(
        annotation(&vc, &k.extensions).as_deref(),
        Some("[\"r1\",\"r2\"]")
    );
    let e = events
        .iter()
        .find(|c| c.message_id == "ext-1/extend/r2")
        .and_then(|c| c.event.clone())
        .unwrap();
    let expires = e.expires_at.expect("the new expiry");
    assert_eq!(expires.seconds * 1000, expiry + 600_000);
}

/// Extending a job that does not exist, or that has finished, publishes an event with the reason and
/// changes nothing. A job that does not exist may still be waiting in its queue, so its extension waits
/// for it, as long as a tombstone would (`tombstone_ttl`, 1 s here), before the answer `unknown_job`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extensions_of_unknown_or_finished_jobs_change_nothing() {
    let h = Harness::new("extend-unknown").await;
    let mut config = h.config.clone();
    config.cluster.tombstone_ttl = Duration::from_secs(1);
    config.cluster.pending_extension_interval = Duration::from_millis(200);
    let runner = h.start_with("runner-a", config, false);
    h.extend("ghost-1", "r1", 600).await;
    let events = h
        .wait_events("the unknown_job event", |e| {
            e.iter().any(|c| c.message_id == "ghost-1/extend/r1")
        })
        .await;
    let e = events
        .iter()
        .find(|c| c.message_id == "ghost-1/extend/r1")
        .and_then(|c| c.event.clone())
        .unwrap();
    assert_eq!(e.reason, "unknown_job");
    assert_eq!(e.state, JobState::Unspecified as i32);
    assert!(h.vcjobs().await.is_empty(), "nothing created");

    h.submit(&figlet("done-1")).await;
    h.wait_events("QUEUED", |e| {
        e.iter().any(|c| c.message_id == "done-1/QUEUED")
    })
    .await;
    let k = keys();
    let vc = h.vcjob("done-1").await.unwrap();
    let api: Api<VolcanoJob> =
        Api::namespaced(h.client.clone(), vc.metadata.namespace.as_deref().unwrap());
    api.patch(
        "j-done-1",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
            k.lifecycle_state.as_str(): "SUCCESS",
        }}})),
    )
    .await
    .unwrap();
    let before = annotation(&h.vcjob("done-1").await.unwrap(), &k.max_time);
    h.extend("done-1", "r1", 600).await;
    let events = h
        .wait_events("the job_finished event", |e| {
            e.iter().any(|c| c.message_id == "done-1/extend/r1")
        })
        .await;
    h.wait_queues_settled().await;
    runner.stop().await;
    let e = events
        .iter()
        .find(|c| c.message_id == "done-1/extend/r1")
        .and_then(|c| c.event.clone())
        .unwrap();
    assert_eq!(e.reason, "job_finished");
    let after = h.vcjob("done-1").await.unwrap();
    assert_eq!(annotation(&after, &k.max_time), before, "unchanged");
    assert_eq!(annotation(&after, &k.extensions), None);
}
