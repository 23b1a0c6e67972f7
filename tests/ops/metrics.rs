//! The metrics endpoint after a scripted run reports what happened: messages by type and outcome, their
//! latency counts, the events the broker confirmed (as many as the orchestrator saw), every Kubernetes
//! request (as many as were made), the gate, the leases and the broker connection.

use crate::ops_common;

use std::time::Duration;

use volcano_runner::broker::{Outbound, OutboundEvent};
use volcano_runner::cluster::PauseSwitch;
use volcano_runner::messages::Format;
use volcano_runner::messages::v1::JobState;
use volcano_runner::ops::Ops;
use volcano_runner::ops::metrics::{CONTENT_TYPE, Samples};

use ops_common::fleet::{Fleet, sleeping_job};
use ops_common::*;

async fn scrape(addr: std::net::SocketAddr) -> Samples {
    let (status, content_type, body) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(content_type, CONTENT_TYPE);
    assert!(body.ends_with("# EOF\n"));
    Samples::parse(&body).unwrap()
}

/// A message published as the orchestrator would, but with a body of our choosing.
fn raw_submission(fleet: &Fleet, body: &[u8], id: &str) -> Outbound {
    Outbound {
        exchange: fleet.config.broker.jobs_exchange.clone(),
        routing_key: fleet.config.broker.submit_routing_key.clone(),
        body: body.to_vec(),
        content_type: Format::Json,
        type_name: "volcano_runner.v1.SubmitJob".into(),
        message_id: id.into(),
        headers: Default::default(),
        timestamp: None,
        mandatory: true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_count_a_scripted_run() {
    let small = Some(Duration::from_secs(1));
    let big = Some(Duration::from_secs(30));
    let ops = Ops::new();
    let (addr, stop_endpoint) = serve(&ops).await;
    let mut fleet = Fleet::start("metrics", ops.clone(), |_| {}).await;

    // Two good submissions: one runs to its end, one is extended and cancelled.
    fleet
        .submit(&sleeping_job("m-1", 120, Some(Duration::from_secs(3600))))
        .await;
    fleet.wait_state("m-1", JobState::Running, small).await;
    fleet.wait_state("m-1", JobState::Success, big).await;
    fleet.submit(&sleeping_job("m-2", 3600, None)).await;
    fleet.wait_state("m-2", JobState::Queued, None).await;
    fleet.extend("m-2", "ext-1", Duration::from_secs(60)).await;
    fleet
        .wait_until("the extension's event", |f| {
            f.count("m-2/extend/ext-1") == 1
        })
        .await;
    fleet.cancel("m-2").await;
    fleet.wait_state("m-2", JobState::Cancelled, small).await;
    // Two bad ones: invalid (too many replicas; its job id is readable, so a FAILURE goes out) and
    // undecodable. Both are dead-lettered.
    let mut invalid = sleeping_job("m-3", 10, None);
    invalid.replicas = 1000;
    fleet.submit(&invalid).await;
    fleet.wait_state("m-3", JobState::Failure, None).await;
    fleet
        .publish(raw_submission(&fleet, b"{not json", "garbage-1"), None)
        .await;
    let dead = fleet
        .vhost
        .wait_ready(&fleet.config.broker.dead_letter_queue, 2)
        .await;
    assert_eq!(dead, 2);
    fleet.collect(Duration::from_secs(1)).await;

    let s = scrape(addr).await;
    let handled = |t, o| {
        s.value(
            "volcano_runner_messages_handled_total",
            &[("type", t), ("outcome", o)],
        )
    };
    assert_eq!(handled("SubmitJob", "ack"), 2.0);
    assert_eq!(handled("SubmitJob", "dead_letter"), 2.0);
    assert_eq!(handled("SubmitJob", "requeue"), 0.0);
    assert_eq!(handled("ExtendJob", "ack"), 1.0);
    assert_eq!(handled("CancelJob", "ack"), 1.0);
    assert_eq!(
        s.sum("volcano_runner_messages_handled_total", &[]),
        6.0,
        "six messages were published"
    );
    for (t, n) in [("SubmitJob", 4.0), ("ExtendJob", 1.0), ("CancelJob", 1.0)] {
        assert_eq!(
            s.value(
                "volcano_runner_message_handling_seconds_count",
                &[("type", t)]
            ),
            n
        );
        let inf = s.value(
            "volcano_runner_message_handling_seconds_bucket",
            &[("type", t), ("le", "+Inf")],
        );
        assert_eq!(inf, n);
    }
    assert_eq!(s.value("volcano_runner_messages_in_flight", &[]), 0.0);

    // Every event the orchestrator saw was counted once, by type, with a confirm latency.
    let count = |type_name: &str| {
        fleet
            .seen
            .iter()
            .filter(|e| matches!(&e.event, Ok(ev) if ev.type_name() == type_name))
            .count() as f64
    };
    let job_events = count("volcano_runner.v1.JobEvent");
    let ticks = count("volcano_runner.v1.AccountingTick");
    // At least m-1's QUEUED, RUNNING and SUCCESS, m-2's QUEUED, extension and CANCELLED, and m-3's
    // FAILURE (the monitor sends no copy of a QUEUED its own process had confirmed).
    assert!(job_events >= 7.0 && ticks >= 1.0, "{job_events} {ticks}");
    assert_eq!(
        s.value(
            "volcano_runner_events_published_total",
            &[("type", "JobEvent")]
        ),
        job_events
    );
    assert_eq!(
        s.value(
            "volcano_runner_events_published_total",
            &[("type", "AccountingTick")]
        ),
        ticks
    );
    assert_eq!(
        s.value(
            "volcano_runner_event_confirm_seconds_count",
            &[("type", "JobEvent")]
        ),
        job_events
    );
    assert_eq!(
        s.sum("volcano_runner_event_publish_failures_total", &[]),
        0.0
    );
    assert!(fleet.seen.iter().all(|e| e.event.is_ok()));
    assert!(
        fleet
            .seen
            .iter()
            .any(|e| matches!(&e.event, Ok(OutboundEvent::Job(j)) if j.job_id == "m-3"))
    );

    // One runner holds every shard; the broker is connected and never reconnected; the gate is open.
    assert_eq!(s.get("volcano_runner_lease_shards", &[]), Some(2.0));
    assert_eq!(s.get("volcano_runner_lease_shards_held", &[]), Some(2.0));
    assert_eq!(s.get("volcano_runner_broker_connected", &[]), Some(1.0));
    assert_eq!(
        s.get("volcano_runner_broker_reconnects_total", &[]),
        Some(0.0)
    );
    assert_eq!(s.get("volcano_runner_submissions_paused", &[]), Some(0.0));
    assert_eq!(s.get("volcano_runner_submission_gate_open", &[]), Some(1.0));

    // An operator pauses submissions: the gate metrics follow.
    let switch = PauseSwitch::new(fleet.admin.clone(), &fleet.config.cluster);
    switch
        .pause("maintenance", "ops-test", jiff::Timestamp::now())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = scrape(addr).await;
        if s.get("volcano_runner_submissions_paused", &[]) == Some(1.0) {
            assert_eq!(s.get("volcano_runner_submission_gate_open", &[]), Some(0.0));
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pause never showed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Readiness is reported as metrics too once /readyz has been asked.
    let (status, _, body) = http_get(addr, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    let s = scrape(addr).await;
    for check in ["broker", "cluster", "submit consumer", "control consumer"] {
        assert_eq!(
            s.get("volcano_runner_ready", &[("check", check)]),
            Some(1.0),
            "{check}"
        );
    }

    // Once the runner has stopped, every Kubernetes request it made was counted exactly once, by verb
    // and resource, and the failed ones as errors.
    fleet.stop().await;
    let s = scrape(addr).await;
    let calls = fleet.recorder.calls();
    assert_eq!(
        s.sum("volcano_runner_kube_requests_total", &[]),
        calls.len() as f64
    );
    let failed = calls
        .iter()
        .filter(|c| c.status.is_none_or(|s| s >= 400))
        .count();
    assert_eq!(
        s.sum("volcano_runner_kube_request_errors_total", &[]),
        failed as f64
    );
    let creates = calls
        .iter()
        .filter(|c| {
            c.call
                .to_string()
                .starts_with("create jobs.batch.volcano.sh")
        })
        .count();
    assert_eq!(creates, 2);
    assert_eq!(
        s.value(
            "volcano_runner_kube_requests_total",
            &[("verb", "create"), ("resource", "jobs.batch.volcano.sh")]
        ),
        2.0
    );
    assert_eq!(
        s.value(
            "volcano_runner_kube_request_duration_seconds_count",
            &[("verb", "create"), ("resource", "jobs.batch.volcano.sh")]
        ),
        2.0
    );
    stop_endpoint.cancel();
}

/// /healthz answers while the process serves HTTP at all, with nothing else registered.
#[tokio::test]
async fn healthz_is_plain_liveness() {
    let ops = Ops::new();
    let _flag = ops.readiness.flag("never running");
    let (addr, stop) = serve(&ops).await;
    let (status, _, body) = http_get(addr, "/readyz").await;
    assert_eq!(
        (status, body.as_str()),
        (
            503,
            "failed startup: still starting\nfailed never running: not running\n"
        )
    );
    ops.readiness.seal();
    let (status, _, body) = http_get(addr, "/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, _, body) = http_get(addr, "/readyz").await;
    assert_eq!(status, 503);
    assert_eq!(body, "failed never running: not running\n");
    let (status, _, _) = http_get(addr, "/nothing").await;
    assert_eq!(status, 404);
    stop.cancel();
}
