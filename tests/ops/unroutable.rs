//! Nothing bound to the events exchange: a submission whose job was created is not dead-lettered while it
//! waits for a queue to receive its QUEUED (its delivery limit stays untouched: it stays in hand),
//! `/readyz` says why and a gauge counts it; once a queue is bound, QUEUED arrives there and the
//! submission is acked.

use crate::ops_common;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use lapin::BasicProperties;
use lapin::options::{QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use ops_common::fleet::{sleeping_job, test_config};
use ops_common::rabbit::{PATIENCE, TestVhost};
use tokio_util::sync::CancellationToken;
use volcano_runner::messages::{Format, encode};
use volcano_runner::ops::Ops;
use volcano_runner::ops::metrics::Samples;
use volcano_runner::runner::service::Service;
use volcano_runner::sim::{SimConfig, Simulator};
use volcano_runner::volcano::VolcanoJob;

const WAITING: &str = "volcano_runner_events_waiting_for_route";

/// `admin status` against the test's broker and simulator, as text.
fn admin_status(vhost: &TestVhost, sim_url: &str, namespace: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
        .args(["admin", "--cluster", sim_url, "status"])
        .current_dir(ops_common::root())
        .env("VOLCANO_RUNNER_BROKER__URL", vhost.amqp_url())
        .env("VOLCANO_RUNNER_CLUSTER__NAMESPACE", namespace)
        .env_remove("VOLCANO_RUNNER_LOG")
        .env_remove("VOLCANO_RUNNER_CONFIG")
        .output()
        .expect("admin status runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `admin status` until `done` holds for its text.
async fn status_until(
    vhost: &TestVhost,
    sim_url: &str,
    namespace: &str,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let text = admin_status(vhost, sim_url, namespace);
        if done(&text) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "status never showed {what}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn waiting(ops: &Ops) -> f64 {
    Samples::parse(&ops.metrics.encode())
        .unwrap()
        .get(WAITING, &[])
        .unwrap_or(-1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_waits_in_hand_while_no_queue_receives_its_events() {
    let vhost = TestVhost::new("unroutable").await;
    let sim = Arc::new(Simulator::start(SimConfig::for_tests()).await.unwrap());
    let admin = sim.client().unwrap();
    let mut config = test_config(&vhost, &sim);
    // A low limit: requeued for every failed publish, the submission would be dead-lettered at once.
    config.broker.delivery_limit = 2;
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(config.cluster.namespace.clone()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .unwrap();
    let ops = Ops::new();
    let service = Service {
        config: config.clone(),
        client: sim.client().unwrap(),
        runner_id: "runner-unroutable".into(),
        monitor: true,
        monitor_clock: None,
    };
    let token = CancellationToken::new();
    let runner = tokio::spawn(service.run_with_ops(token.clone(), ops.clone()));
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !ops
        .readiness
        .evaluate()
        .await
        .text()
        .contains("ok submit consumer\n")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the runner never consumed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The orchestrator submits, but has bound no queue to compute.events yet.
    let job = sleeping_job("route-1", 60, Some(Duration::from_secs(600)));
    vhost
        .publish_raw(
            "compute.jobs",
            "submit",
            &encode(Format::Json, &job).unwrap(),
            BasicProperties::default()
                .with_message_id("submit/route-1".into())
                .with_content_type("application/json".into())
                .with_type("volcano_runner.v1.SubmitJob".into()),
        )
        .await;

    // The job is created; readiness says why its QUEUED waits; the gauge counts it.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let report = loop {
        let report = ops.readiness.evaluate().await;
        if report.text().contains("failed events routing") {
            break report;
        }
        assert!(tokio::time::Instant::now() < deadline, "{}", report.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        report.text().contains(
            "failed events routing: no queue receives compute.events (routing key job.lifecycle)"
        ),
        "{}",
        report.text()
    );
    let jobs = Api::<VolcanoJob>::all(admin.clone())
        .list(&ListParams::default().labels(&config.cluster.managed_selector))
        .await
        .unwrap();
    assert_eq!(jobs.items.len(), 1, "the job was created");
    // Well past the delivery limit's worth of redeliveries (at `requeue_delay` 100 ms), nothing is
    // dead-lettered: the message stays in hand.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(vhost.ready("compute.jobs.dead").await, 0);
    assert_eq!(
        vhost.ready("compute.jobs.submit").await,
        0,
        "in hand, not requeued"
    );
    assert_eq!(waiting(&ops), 1.0);
    // `admin status` says it too, from what the runner writes on its member lease.
    let namespace = config.cluster.namespace.clone();
    let said = "PROBLEM: runner runner-unroutable: no queue receives compute.events (routing key \
                job.lifecycle)";
    status_until(
        &vhost,
        &sim.url(),
        &namespace,
        "the runner's problem",
        |t| t.contains(said),
    )
    .await;

    // The orchestrator binds its queue: QUEUED arrives, and the submission is acked.
    let (connection, channel) = vhost.raw().await;
    channel
        .queue_declare(
            "orchestrator.events".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            "orchestrator.events".into(),
            "compute.events".into(),
            "job.#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let _ = connection.close(200, "done".into()).await;
    vhost.wait_ready("orchestrator.events", 1).await;
    let events = vhost.drain("orchestrator.events").await;
    let ids: Vec<String> = events
        .iter()
        .filter_map(|m| {
            m.delivery
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.to_string())
        })
        .collect();
    assert!(ids.contains(&"route-1/QUEUED".to_owned()), "{ids:?}");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while waiting(&ops) != 0.0
        || !ops
            .readiness
            .evaluate()
            .await
            .text()
            .contains("ok events routing")
    {
        assert!(tokio::time::Instant::now() < deadline, "still waiting");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    status_until(&vhost, &sim.url(), &namespace, "the problem gone", |t| {
        !t.contains("compute.events")
    })
    .await;
    // Acked: once the runner stops, nothing returns to the submit queue, and nothing was dead-lettered.
    token.cancel();
    runner.await.unwrap().unwrap();
    assert_eq!(vhost.ready("compute.jobs.submit").await, 0);
    assert_eq!(vhost.ready("compute.jobs.dead").await, 0);
}
