//! `volcano-runner admin dead-letters` run as a process against a real RabbitMQ, as an operator runs it
//! without the management plugin: dead letters a runner made (invalid submissions) and one RabbitMQ made
//! (past the delivery limit) are listed with their reasons, shown, requeued to where they came from with
//! their message id and without the dead-letter headers, and dropped by reason; whatever a command leaves
//! alone stays in the queue, in its order.

use crate::cli_client::{assert_no_noise, client, text};
use crate::ops_common;

use std::time::Duration;

use lapin::BasicProperties;
use lapin::options::{BasicGetOptions, BasicNackOptions};
use lapin::types::{AMQPValue, FieldTable};
use ops_common::fleet::Fleet;
use ops_common::rabbit::{PATIENCE, TestVhost};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use volcano_runner::broker::Broker;
use volcano_runner::ops::Ops;

const DEAD: &str = "compute.jobs.dead";
const SUBMIT: &str = "compute.jobs.submit";

fn properties(message_id: &str) -> BasicProperties {
    BasicProperties::default()
        .with_message_id(message_id.into())
        .with_content_type("application/json".into())
        .with_type("volcano_runner.v1.SubmitJob".into())
        .with_delivery_mode(2)
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(ops_common::root().join("tests/fixtures/invalid").join(name)).unwrap()
}

/// The message ids in the dead-letter queue, oldest first, as `list -o json` reports them.
fn listed_ids(url: &str) -> Vec<String> {
    let (out, _) = client(url, &["admin", "dead-letters", "list", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listing: Value = serde_json::from_slice(&out.stdout).unwrap();
    listing["letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["messageId"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Header names of a message that start like the dead-letter ones or the broker's death records.
fn dead_letter_headers(properties: &BasicProperties) -> Vec<String> {
    properties
        .headers()
        .as_ref()
        .map(|h| {
            h.inner()
                .keys()
                .map(|k| k.to_string())
                .filter(|k| k.starts_with("x-volcano-runner-") || k.contains("death"))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runners_dead_letters_are_listed_shown_requeued_by_id_and_dropped_by_reason() {
    let mut fleet = Fleet::start("dlq-cli", Ops::new(), |_| {}).await;
    let vhost = &fleet.vhost;
    let url = vhost.amqp_url();
    // Three submissions a runner cannot take, in this order.
    let sent = [
        ("submit/4817", fixture("submit-job.zero-memory.json")),
        (
            "submit/4818",
            fixture("submit-job.dotdot-output-folder.json"),
        ),
        ("submit/garbled", b"{\"jobId\": ".to_vec()),
    ];
    for (id, body) in &sent {
        vhost
            .publish_raw("compute.jobs", "submit", body, properties(id))
            .await;
        // One at a time, so the dead-letter queue has them in this order.
        let want = sent.iter().position(|(i, _)| i == id).unwrap() as u32 + 1;
        vhost.wait_ready(DEAD, want).await;
    }
    // No runner takes the requeued one again: what reaches the submit queue stays there to be looked at.
    fleet.stop().await;
    let vhost = &fleet.vhost;

    // list: the reason and the field of each, and what is wrong.
    let (out, _) = client(&url, &["admin", "dead-letters", "list"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stderr, "");
    assert!(
        stdout.starts_with("compute.jobs.dead: 3 dead letters\n"),
        "{stdout}"
    );
    let line = |id: &str| {
        stdout
            .lines()
            .find(|l| l.contains(id))
            .unwrap_or_else(|| panic!("{id} not listed:\n{stdout}"))
            .to_owned()
    };
    assert!(line("submit/4817").contains("invalid_field"), "{stdout}");
    assert!(
        line("submit/4817").contains("product.memoryGib"),
        "{stdout}"
    );
    assert!(line("submit/4817").contains(SUBMIT), "{stdout}");
    assert!(line("submit/4818").contains("outputFolder"), "{stdout}");
    assert!(line("submit/garbled").contains("invalid_json"), "{stdout}");
    assert!(stdout.contains("at least 1 GiB"), "{stdout}");
    // Looking changed nothing.
    assert_eq!(vhost.ready(DEAD).await, 3);
    assert_eq!(
        listed_ids(&url),
        ["submit/4817", "submit/4818", "submit/garbled"]
    );

    // list -o json, filtered by reason.
    let (out, _) = client(
        &url,
        &[
            "admin",
            "dead-letters",
            "list",
            "--reason",
            "invalid_field",
            "-o",
            "json",
        ],
    );
    let listing: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listing["total"], 3, "{listing}");
    let letters = listing["letters"].as_array().unwrap();
    assert_eq!(letters.len(), 2, "{listing}");
    assert_eq!(letters[0]["field"], "product.memoryGib");
    assert_eq!(letters[0]["originalExchange"], "compute.jobs");
    assert_eq!(letters[0]["originalRoutingKey"], "submit");
    assert_eq!(letters[0]["type"], "volcano_runner.v1.SubmitJob");

    // show: everything about one, its body included.
    let (out, _) = client(&url, &["admin", "dead-letters", "show", "submit/4818"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("reason:           invalid_field"),
        "{stdout}"
    );
    assert!(
        stdout.contains("field:            outputFolder"),
        "{stdout}"
    );
    assert!(
        stdout.contains("exchange compute.jobs, routing key submit"),
        "{stdout}"
    );
    assert!(stdout.contains("\"jobId\": \"4818\""), "{stdout}");
    let (out, _) = client(&url, &["admin", "dead-letters", "show", "submit/none"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no dead letter with message id \"submit/none\""),
        "{}",
        text(&out.stderr)
    );

    // requeue by id: back to the submit queue with its message id and body, without the reason headers.
    let (out, _) = client(&url, &["admin", "dead-letters", "requeue", "submit/4818"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("requeued submit/4818 (invalid_field) to compute.jobs/submit"),
        "{stdout}"
    );
    let requeued = vhost.drain(SUBMIT).await;
    assert_eq!(requeued.len(), 1);
    let message = &requeued[0].delivery;
    assert_eq!(
        message.properties.message_id().as_ref().map(|s| s.as_str()),
        Some("submit/4818")
    );
    assert_eq!(message.data, sent[1].1);
    assert_eq!(
        dead_letter_headers(&message.properties),
        Vec::<String>::new()
    );
    assert_eq!(
        message.properties.kind().as_ref().map(|s| s.as_str()),
        Some("volcano_runner.v1.SubmitJob")
    );
    // The others stayed, in their order.
    assert_eq!(listed_ids(&url), ["submit/4817", "submit/garbled"]);

    // An id that is not there: exit 1, named; nothing changes.
    let (out, _) = client(&url, &["admin", "dead-letters", "requeue", "submit/4818"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no dead letter with message id \"submit/4818\""),
        "{}",
        text(&out.stderr)
    );
    assert_no_noise(&text(&out.stderr));

    // drop by reason: only those go.
    let (out, _) = client(
        &url,
        &[
            "admin",
            "dead-letters",
            "drop",
            "--reason",
            "invalid_json",
            "-o",
            "json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["settled"][0]["messageId"], "submit/garbled");
    assert_eq!(report["settled"][0]["outcome"], "dropped");
    assert_eq!(listed_ids(&url), ["submit/4817"]);
    assert_eq!(vhost.ready(SUBMIT).await, 0, "a drop publishes nothing");

    // Without a selection, nothing is touched.
    let (out, _) = client(&url, &["admin", "dead-letters", "drop"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(vhost.ready(DEAD).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_past_its_delivery_limit_is_listed_from_x_death_and_requeued_to_its_queue() {
    let vhost = TestVhost::new("dlq-limit").await;
    let url = vhost.amqp_url();
    // The topology, with a delivery limit of 1: the second return dead-letters the message.
    let mut config = vhost.config();
    config.delivery_limit = 1;
    let token = CancellationToken::new();
    let broker = Broker::connect(config, token.clone()).await.unwrap();
    let mut traced = FieldTable::default();
    traced.insert(
        "traceparent".into(),
        AMQPValue::LongString("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
    );
    vhost
        .publish_raw(
            "compute.jobs",
            "submit",
            br#"{"jobId":"77"}"#,
            properties("submit/77").with_headers(traced),
        )
        .await;
    let (connection, channel) = vhost.raw().await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while vhost.ready(DEAD).await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never dead-lettered"
        );
        if let Some(m) = channel
            .basic_get(SUBMIT.into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap()
        {
            m.delivery
                .acker
                .nack(BasicNackOptions {
                    requeue: true,
                    multiple: false,
                })
                .await
                .unwrap();
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let _ = connection.close(200, "done".into()).await;

    let (out, _) = client(
        &url,
        &[
            "admin",
            "dead-letters",
            "list",
            "--reason",
            "delivery_limit",
        ],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = stdout
        .lines()
        .find(|l| l.contains("submit/77"))
        .unwrap_or_else(|| panic!("not listed:\n{stdout}"));
    assert!(line.contains("delivery_limit"), "{stdout}");
    assert!(line.contains(SUBMIT), "{stdout}");
    let (out, _) = client(&url, &["admin", "dead-letters", "show", "submit/77"]);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("x-death:          delivery_limit in compute.jobs.submit"),
        "{stdout}"
    );

    let (out, _) = client(
        &url,
        &[
            "admin",
            "dead-letters",
            "requeue",
            "--reason",
            "delivery_limit",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(vhost.ready(DEAD).await, 0);
    let requeued = vhost.drain(SUBMIT).await;
    assert_eq!(requeued.len(), 1);
    let message = &requeued[0].delivery;
    assert_eq!(
        message.properties.message_id().as_ref().map(|s| s.as_str()),
        Some("submit/77")
    );
    assert_eq!(
        dead_letter_headers(&message.properties),
        Vec::<String>::new()
    );
    // Its own headers travel on.
    let headers = message.properties.headers().clone().unwrap_or_default();
    assert!(headers.inner().contains_key("traceparent"), "{headers:?}");
    token.cancel();
    broker.close().await;
}

/// The delivery count the quorum queue gives a message (`x-delivery-count`, absent before the first
/// redelivery).
fn delivery_count(properties: &BasicProperties) -> i64 {
    match properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("x-delivery-count").cloned())
    {
        None => 0,
        Some(AMQPValue::LongLongInt(n)) => n,
        Some(AMQPValue::LongInt(n)) => i64::from(n),
        Some(AMQPValue::LongUInt(n)) => i64::from(n),
        Some(other) => panic!("x-delivery-count is {other:?}"),
    }
}

/// Looking does not count as a delivery: on RabbitMQ 4 a quorum queue drops a message delivered more
/// often than its delivery limit (20 by default), so every `list` or `show` that handed the dead letters
/// back with a requeueing nack brought them one look closer to being lost. After many looks (and a
/// `drop` of another one) the dead letters are still there, in their order, delivered zero times, and
/// read as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn looking_at_dead_letters_does_not_count_as_delivering_them() {
    let vhost = TestVhost::new("dlq-look").await;
    let url = vhost.amqp_url();
    let token = CancellationToken::new();
    let broker = Broker::connect(vhost.config(), token.clone())
        .await
        .unwrap();
    let mut why = FieldTable::default();
    why.insert(
        "x-volcano-runner-reason".into(),
        AMQPValue::LongString("invalid_field".into()),
    );
    for id in ["submit/1", "submit/2", "submit/3"] {
        vhost
            .publish_raw(
                "",
                DEAD,
                br#"{"jobId":"1"}"#,
                properties(id).with_headers(why.clone()),
            )
            .await;
    }
    vhost.wait_ready(DEAD, 3).await;
    for _ in 0..3 {
        assert_eq!(listed_ids(&url), ["submit/1", "submit/2", "submit/3"]);
    }
    let (out, _) = client(&url, &["admin", "dead-letters", "show", "submit/2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (out, _) = client(&url, &["admin", "dead-letters", "drop", "submit/3"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(listed_ids(&url), ["submit/1", "submit/2"]);
    let (out, _) = client(
        &url,
        &["admin", "dead-letters", "list", "--reason", "invalid_field"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let left = vhost.drain(DEAD).await;
    assert_eq!(left.len(), 2);
    for message in &left {
        assert_eq!(
            delivery_count(&message.delivery.properties),
            0,
            "{:?} was counted as delivered by the looks",
            message.delivery.properties.message_id()
        );
    }
    token.cancel();
    broker.close().await;
}
