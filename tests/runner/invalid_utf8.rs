//! Short strings that are not UTF-8: a SubmitJob whose `type`, `message_id`, `correlation_id`,
//! `reply_to` or a header name carries bytes that are not UTF-8 (published by a raw AMQP client, as lapin
//! cannot send them; RabbitMQ passes them on). lapin's parser used to refuse the whole frame and drop the
//! runner's connection, and every unsettled delivery on it came back again and again, valid submissions
//! of other users included, until their delivery limit dead-lettered them.
//!
//! Now each poison message is dead-lettered once with reason `invalid_property` naming the property, its
//! job hears FAILURE, every valid submission around it is handled exactly once, nothing valid is
//! dead-lettered, and no runner reconnects.

use crate::harness;
use crate::raw_amqp::RawPublisher;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use harness::{Harness, figlet};
use lapin::types::AMQPValue;
use volcano_runner::broker::headers;
use volcano_runner::broker::sanitize::encode::{RawProperties, table};
use volcano_runner::messages::{Format, MessageType, encode};

fn queued_counts(events: &[harness::Captured]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for c in events {
        if let Some(job) = c.message_id.strip_suffix("/QUEUED") {
            *counts.entry(job.to_owned()).or_insert(0) += 1;
        }
    }
    counts
}

/// A poison submission: a valid body under job id `job`, the properties of a submission, spoiled by
/// `spoil`.
fn poison(job: &str, spoil: impl FnOnce(&mut RawProperties)) -> (String, RawProperties, Vec<u8>) {
    let body = encode(Format::Json, &figlet(job)).unwrap();
    let mut traceparent = Vec::new();
    table(
        &mut traceparent,
        &[(
            b"traceparent",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )],
    );
    let mut p = RawProperties {
        content_type: Some(b"application/json".to_vec()),
        headers: Some(traceparent),
        delivery_mode: Some(2),
        message_id: Some(job.as_bytes().to_vec()),
        kind: Some(MessageType::SubmitJob.amqp_type().as_bytes().to_vec()),
        ..RawProperties::default()
    };
    spoil(&mut p);
    (job.to_owned(), p, body)
}

async fn twenty_valid_and_the_poison_among_them(label: &str, runners: usize) {
    let h = Harness::new(label).await;
    let ids: Vec<String> = (0..runners).map(|i| format!("runner-{i}")).collect();
    let _runners: Vec<_> = ids.iter().map(|id| h.start(id)).collect();
    h.wait_consumers(&h.config.broker.submit_queue, runners as u32)
        .await;
    let mut connections = Vec::new();
    for id in &ids {
        connections.push(h.vhost.connections_named(&format!("runner-{id}")).await);
    }

    let type_bytes = b"volcano_runner.v1.Submit\xc3Job".to_vec();
    let poisons = vec![
        ("type", poison("poison-type", |p| p.kind = Some(type_bytes))),
        (
            "message_id",
            poison("poison-message-id", |p| {
                p.message_id = Some(b"poison-\xffmessage-id".to_vec())
            }),
        ),
        (
            "correlation_id",
            poison("poison-correlation-id", |p| {
                p.correlation_id = Some(b"corr-\xfe\xff".to_vec())
            }),
        ),
        (
            "reply_to",
            poison("poison-reply-to", |p| {
                p.reply_to = Some(b"amq.\x80reply".to_vec())
            }),
        ),
        (
            "headers",
            poison("poison-header-name", |p| {
                let mut t = Vec::new();
                table(&mut t, &[(b"x-bad-\xc3(", b"v"), (b"traceparent", b"00-x")]);
                p.headers = Some(t);
            }),
        ),
    ];
    // A header *value* that is not UTF-8 is a long string, which AMQP and lapin take as bytes: that
    // submission is valid and is handled like any other.
    let (value_job, value_props, value_body) = poison("odd-header-value", |p| {
        let mut t = Vec::new();
        table(&mut t, &[(b"x-note", b"caf\xe9 \xff\xfe")]);
        p.headers = Some(t);
    });

    let started = Instant::now();
    let mut raw = RawPublisher::connect(&h.vhost.name).await;
    let exchange = h.config.broker.jobs_exchange.clone();
    let key = h.config.broker.submit_routing_key.clone();
    let mut valid = Vec::new();
    for (n, (_, (_, props, body))) in poisons.iter().enumerate() {
        for i in 0..4 {
            let id = format!("valid-{n}-{i}");
            h.submit(&figlet(&id)).await;
            valid.push(id);
        }
        raw.publish(&exchange, key.as_bytes(), props, body).await;
    }
    raw.publish(&exchange, key.as_bytes(), &value_props, &value_body)
        .await;
    valid.push(value_job.clone());
    raw.close().await;
    assert_eq!(valid.len(), 21);

    // Every valid submission is QUEUED, and every poison one FAILED, within seconds.
    let poison_jobs: Vec<String> = poisons.iter().map(|(_, (job, ..))| job.clone()).collect();
    h.wait_events_for(
        "a QUEUED for every valid submission and a rejection for every poison one",
        Duration::from_secs(30),
        |events| {
            let counts = queued_counts(events);
            valid.iter().all(|j| counts.contains_key(j))
                && poison_jobs.iter().all(|j| {
                    events
                        .iter()
                        .any(|c| c.message_id.starts_with(&format!("{j}/rejected/")))
                })
        },
    )
    .await;
    let took = started.elapsed();
    h.wait_queues_settled().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let events = h.events().await;
    let counts = queued_counts(&events);
    for j in &valid {
        assert_eq!(counts.get(j), Some(&1), "{j} QUEUED once: {counts:?}");
    }
    for j in &poison_jobs {
        assert!(!counts.contains_key(j), "{j} was acted on");
        let failed: Vec<_> = events
            .iter()
            .filter(|c| c.message_id.starts_with(&format!("{j}/rejected/")))
            .collect();
        assert_eq!(failed.len(), 1, "{j}: one FAILURE");
        let event = failed[0].event.as_ref().expect("a JobEvent");
        assert_eq!(event.reason, "invalid_property", "{event:?}");
    }
    // Created once each, nothing else.
    assert_eq!(
        h.vcjobs().await.len(),
        valid.len(),
        "one VolcanoJob per valid submission"
    );

    // The poison ones, and only they, are dead-lettered, each once, naming the property.
    let dead = h.dead_letters().await;
    let mut reasons = BTreeMap::new();
    for d in &dead {
        let table = d.delivery.properties.headers().clone().unwrap_or_default();
        let text = |name: &str| match table.inner().get(name) {
            Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(text(headers::REASON), "invalid_property");
        let body: serde_json::Value = serde_json::from_slice(&d.delivery.data).unwrap();
        let job = body["jobId"].as_str().unwrap().to_owned();
        reasons.insert(job, (text(headers::FIELD), text(headers::ERROR)));
    }
    assert_eq!(dead.len(), poisons.len(), "{reasons:?}");
    for (property, (job, ..)) in &poisons {
        let (field, error) = reasons
            .get(job)
            .unwrap_or_else(|| panic!("{job} dead-lettered"));
        assert_eq!(field, property, "{job}: {error}");
        assert!(error.contains("not UTF-8"), "{error}");
    }

    // No runner lost its connection on the way.
    for (id, before) in ids.iter().zip(&connections) {
        assert_eq!(
            &h.vhost.connections_named(&format!("runner-{id}")).await,
            before,
            "{id} reconnected"
        );
    }
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_strings_that_are_not_utf8_cost_no_other_message_anything() {
    twenty_valid_and_the_poison_among_them("utf8-one", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_strings_that_are_not_utf8_cost_nothing_with_three_runners() {
    twenty_valid_and_the_poison_among_them("utf8-three", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_strings_that_are_not_utf8_cost_nothing_with_ten_runners() {
    twenty_valid_and_the_poison_among_them("utf8-ten", 10).await;
}
