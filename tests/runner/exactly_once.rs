//! Exactly-once effects: a submission's effect is recorded in the cluster (the ended VolcanoJob is kept
//! for `ended_job_retention`), so a redelivery at any later time within it is recognised and only
//! acknowledged; every accepted submission gets one QUEUED content, and QUEUED comes before any other
//! event of its job.

use crate::harness;
use crate::rabbit;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use harness::{Captured, EVENTS_QUEUE, Harness, figlet};
use lapin::options::QueueBindOptions;
use lapin::types::FieldTable;
use volcano_runner::cluster::PauseSwitch;
use volcano_runner::config::Config;
use volcano_runner::sim::FaultRule;

/// Binds (or unbinds) the harness's events queue to the events exchange: with nothing bound, a runner's
/// mandatory QUEUED is returned, so it never acknowledges its submission.
async fn events_bound(h: &Harness, bound: bool) {
    let (connection, channel) = h.vhost.raw().await;
    let exchange = h.config.broker.events_exchange.as_str();
    if bound {
        channel
            .queue_bind(
                EVENTS_QUEUE.into(),
                exchange.into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind the events queue");
    } else {
        channel
            .queue_unbind(
                EVENTS_QUEUE.into(),
                exchange.into(),
                "#".into(),
                FieldTable::default(),
            )
            .await
            .expect("unbind the events queue");
    }
    let _ = connection.close(200, "done".into()).await;
}

/// A runner configuration with the monitoring duty on one shard and short leases.
fn monitoring(h: &Harness) -> Config {
    let mut config = h.config.clone();
    config.cluster.lease.shards = 1;
    config.cluster.lease.duration = Duration::from_secs(4);
    config.cluster.lease.renew_interval = Duration::from_millis(500);
    config.cluster.lease.safety_margin = Duration::from_secs(1);
    config
}

/// The job's events in the order the broker delivered them.
fn of_job<'a>(events: &'a [Captured], job_id: &str) -> Vec<&'a Captured> {
    events
        .iter()
        .filter(|c| c.event.as_ref().is_some_and(|e| e.job_id == job_id))
        .collect()
}

/// No event id with two different contents (the publishing runner's name aside).
fn one_content_per_id(events: &[&Captured]) {
    let mut by_id: BTreeMap<&str, BTreeSet<Vec<u8>>> = BTreeMap::new();
    for c in events {
        let mut e = c.event.clone().unwrap();
        if !e.event_id.ends_with("/QUEUED") {
            // QUEUED names the runner that accepted the job, which is part of its content.
            e.runner_id.clear();
        }
        by_id
            .entry(c.message_id.as_str())
            .or_default()
            .insert(serde_json::to_vec(&e).unwrap());
    }
    for (id, contents) in by_id {
        assert_eq!(
            contents.len(),
            1,
            "{id} was published with different contents"
        );
    }
}

/// The repro: runner A creates the job while nothing is bound to the events exchange (its QUEUED
/// keeps being returned, so it never acknowledges), and is killed. Runner B, started while submissions
/// are paused, monitors the job to its end and releases it. On resume B handles the redelivered
/// submission: the job is never created again (one VolcanoJob uid over its whole life), QUEUED is
/// published again with the same content, and QUEUED came before every other event of the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_the_job_ended_and_was_cleaned_up_does_not_run_it_again() {
    let h = Harness::new("once-ended").await;
    events_bound(&h, false).await;
    let a = h.start_killable("runner-a");
    h.submit(&figlet("e1")).await;
    let created = async {
        loop {
            if let Some(job) = h.vcjob("e1").await {
                return job;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let job = rabbit::within("runner A creates the job", created).await;
    let uid = job.metadata.uid.clone().expect("a uid");
    // A's QUEUED is returned at least once, so the submission is not acknowledged.
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.kill();

    events_bound(&h, true).await;
    let switch = PauseSwitch::new(h.client.clone(), &h.config.cluster);
    switch
        .pause("repro", "test", jiff::Timestamp::now())
        .await
        .unwrap();
    let b = h.start_with("runner-b", monitoring(&h), true);
    // B's monitor runs the job to its end and releases it, in simulated time.
    let deadline = tokio::time::Instant::now() + rabbit::PATIENCE;
    loop {
        h.sim.advance(Duration::from_secs(10));
        let ended = h
            .events()
            .await
            .iter()
            .any(|c| c.message_id == "e1/SUCCESS");
        let released = h.vcjob("e1").await.is_some_and(|j| {
            // Kept by Volcano (finished, its TTL set), not being deleted, our finalizer gone.
            j.metadata.deletion_timestamp.is_none()
                && j.phase().is_finished()
                && j.spec.ttl_seconds_after_finished.is_some()
                && j.metadata
                    .finalizers
                    .as_deref()
                    .unwrap_or_default()
                    .is_empty()
        });
        if ended && released {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "SUCCESS and the job released"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = h.events_with_id("e1/QUEUED").await.len();
    switch.resume("test", jiff::Timestamp::now()).await.unwrap();
    h.wait_events("QUEUED again for the redelivery", |e| {
        e.iter().filter(|c| c.message_id == "e1/QUEUED").count() > before
    })
    .await;
    h.wait_queues_settled().await;
    // Give a wrong second job time to show.
    for _ in 0..5 {
        h.sim.advance(Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.stop().await;

    let jobs = h.vcjobs().await;
    let uids: Vec<_> = jobs.iter().filter_map(|j| j.metadata.uid.clone()).collect();
    assert_eq!(uids, [uid], "one VolcanoJob over the job's whole life");
    let events = h.events().await;
    let mine = of_job(&events, "e1");
    one_content_per_id(&mine);
    assert_eq!(mine[0].message_id, "e1/QUEUED", "QUEUED first");
    let running = mine.iter().filter(|c| c.message_id == "e1/RUNNING").count();
    assert!(running >= 1);
    let terminal: BTreeSet<_> = mine
        .iter()
        .map(|c| c.message_id.as_str())
        .filter(|id| ["e1/SUCCESS", "e1/FAILURE", "e1/CANCELLED", "e1/EXPIRED"].contains(id))
        .collect();
    assert_eq!(
        terminal,
        BTreeSet::from(["e1/SUCCESS"]),
        "one terminal state"
    );
    assert!(h.dead_letters().await.is_empty());
}

/// A job whose companions are slow to create is seen (and reported pending) by the monitor before the
/// submitting runner has published QUEUED: the consumer still sees QUEUED first, and one QUEUED
/// content for every job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_comes_before_any_other_event_of_the_job() {
    let h = Harness::new("once-order").await;
    // The figlet job's companions are ConfigMaps and NetworkPolicies: slow their creates, so the
    // VolcanoJob exists (and is watched) well before the submission is done.
    for resource in ["configmaps", "networkpolicies", "services"] {
        h.sim.faults().add_rule(FaultRule {
            resource: resource.into(),
            verb: "create".into(),
            latency_ms: 700,
            ..FaultRule::default()
        });
    }
    let runner = h.start_with("runner-m", monitoring(&h), true);
    for i in 0..3 {
        h.submit(&figlet(&format!("o-{i}"))).await;
    }
    h.wait_events("QUEUED and a status event for each", |e| {
        (0..3).all(|i| {
            let job = format!("o-{i}");
            e.iter().any(|c| c.message_id == format!("{job}/QUEUED"))
                && e.iter()
                    .any(|c| c.message_id.starts_with(&format!("{job}/status/")))
        })
    })
    .await;
    h.wait_queues_settled().await;
    runner.stop().await;
    let events = h.events().await;
    for i in 0..3 {
        let job = format!("o-{i}");
        let mine = of_job(&events, &job);
        assert_eq!(
            mine[0].message_id,
            format!("{job}/QUEUED"),
            "QUEUED first: {:?}",
            mine.iter().map(|c| &c.message_id).collect::<Vec<_>>()
        );
        one_content_per_id(&mine);
    }
}

/// The runner that accepted a job also monitors it (one shard): the consumer gets the job's QUEUED once,
/// the submit path's, before every other event. The monitor sends its copy of QUEUED only when it cannot
/// know that one was confirmed (another runner's job, a restart: the two tests above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_that_accepted_a_job_sends_its_queued_once() {
    let h = Harness::new("once-queued").await;
    let runner = h.start_with("runner-q", monitoring(&h), true);
    h.submit(&figlet("q1")).await;
    h.wait_events("QUEUED", |e| e.iter().any(|c| c.message_id == "q1/QUEUED"))
        .await;
    // The broker may deliver a persistent message before it confirms it to the publisher; the runner
    // counts on the confirm. Nothing moves in the cluster meanwhile (its clock is stopped).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let deadline = tokio::time::Instant::now() + rabbit::PATIENCE;
    loop {
        h.sim.advance(Duration::from_secs(10));
        let events = h.events().await;
        if events.iter().any(|c| c.message_id == "q1/SUCCESS") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "SUCCESS");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    h.wait_queues_settled().await;
    runner.stop().await;
    let events = h.events().await;
    let mine = of_job(&events, "q1");
    one_content_per_id(&mine);
    let ids: Vec<&str> = mine.iter().map(|c| c.message_id.as_str()).collect();
    assert_eq!(ids.first(), Some(&"q1/QUEUED"), "QUEUED first: {ids:?}");
    assert_eq!(
        ids.iter().filter(|id| **id == "q1/QUEUED").count(),
        1,
        "one QUEUED: {ids:?}"
    );
    assert!(
        ids.contains(&"q1/RUNNING") && ids.contains(&"q1/SUCCESS"),
        "{ids:?}"
    );
}

/// The lookup of an existing job comes from the jobs' watch; a watch that has not seen a job (here it
/// loses every event, so it never does) costs no safety: a redelivery is adopted through the create's
/// 409 (one VolcanoJob, the same QUEUED), another submission with the same id is refused as a
/// duplicate, and a redelivery of a job that has ended only gets its QUEUED again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_the_watch_has_not_seen_is_still_found_by_the_create() {
    let h = Harness::new("once-blind").await;
    h.sim.faults().add_rule(FaultRule {
        resource: "jobs.batch.volcano.sh".into(),
        verb: "watch".into(),
        watch_lose_events: 1.0,
        ..FaultRule::default()
    });
    let runner = h.start("runner-a");
    // The runner's jobs watch has listed (and watches, blind).
    let deadline = tokio::time::Instant::now() + rabbit::PATIENCE;
    while !h
        .sim
        .request_counts()
        .contains_key("watch jobs.batch.volcano.sh")
    {
        assert!(tokio::time::Instant::now() < deadline, "the jobs watch");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = figlet("blind-1");
    h.submit(&first).await;
    h.wait_events("QUEUED", |e| {
        e.iter().any(|c| c.message_id == "blind-1/QUEUED")
    })
    .await;
    // (The harness's own look at the job is a list too: before the count.)
    let job = h.vcjob("blind-1").await.unwrap();
    let uid = job.metadata.uid.clone().unwrap();
    let lists = || async {
        h.sim
            .request_counts()
            .get("list jobs.batch.volcano.sh")
            .copied()
            .unwrap_or(0)
    };
    let lists_before = lists().await;

    // The same submission again: adopted, the same QUEUED.
    h.submit(&first).await;
    h.wait_events("QUEUED again", |e| {
        e.iter()
            .filter(|c| c.message_id == "blind-1/QUEUED")
            .count()
            == 2
    })
    .await;
    // Other content under the same id: a duplicate.
    let mut second = first.clone();
    second.product.as_mut().unwrap().cpu += 1;
    let fingerprint16 =
        volcano_runner::pipeline::fingerprint(&second)["sha256:".len()..][..16].to_owned();
    let rejected_id = format!("blind-1/rejected/{fingerprint16}");
    h.submit(&second).await;
    h.wait_events("the duplicate's FAILURE", |e| {
        e.iter().any(|c| c.message_id == rejected_id)
    })
    .await;
    // The job ends (as the monitor records it); a redelivery gets QUEUED and nothing runs again.
    let keys = volcano_runner::durable::AnnotationKeys::new(&h.config.pipeline.annotation_prefix);
    let api: kube::Api<volcano_runner::volcano::VolcanoJob> =
        kube::Api::namespaced(h.client.clone(), job.metadata.namespace.as_deref().unwrap());
    api.patch(
        "j-blind-1",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {
            keys.lifecycle_state.as_str(): "SUCCESS"
        }}})),
    )
    .await
    .unwrap();
    h.submit(&first).await;
    h.wait_events("QUEUED a third time", |e| {
        e.iter()
            .filter(|c| c.message_id == "blind-1/QUEUED")
            .count()
            == 3
    })
    .await;
    h.wait_queues_settled().await;
    let lists_after = lists().await;
    runner.stop().await;

    assert_eq!(
        lists_after, lists_before,
        "the lookups came from the watch (which knows no job of this id)"
    );
    let jobs = h.vcjobs().await;
    let uids: Vec<_> = jobs.iter().filter_map(|j| j.metadata.uid.clone()).collect();
    assert_eq!(uids, [uid], "one VolcanoJob");
    let events = h.events().await;
    one_content_per_id(&of_job(&events, "blind-1"));
    let failure = events
        .iter()
        .find(|c| c.message_id == rejected_id)
        .and_then(|c| c.event.clone())
        .unwrap();
    assert_eq!(failure.reason, "duplicate_job_id");
    assert!(h.dead_letters().await.is_empty());
}
