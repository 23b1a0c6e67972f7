//! Hostile headers: no header, however malformed or large, stops a runner or makes it handle another
//! message twice. Each poison message travels beside valid submissions, and each valid one is handled
//! exactly once (one QUEUED, from a runner without the monitor, which publishes it only on handling).

use crate::harness;

use std::collections::BTreeMap;
use std::time::Duration;

use harness::{Harness, figlet};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use volcano_runner::broker::headers;
use volcano_runner::messages::{Format, MessageType, encode};

/// QUEUED events by job id, among everything captured.
fn queued_counts(events: &[harness::Captured]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for c in events {
        if let Some(job) = c.message_id.strip_suffix("/QUEUED") {
            *counts.entry(job.to_owned()).or_insert(0) += 1;
        }
    }
    counts
}

/// Waits until every job in `jobs` has its QUEUED, then a little longer for any duplicate to show.
async fn each_queued_once(h: &Harness, jobs: &[String]) {
    h.wait_events_for(
        "a QUEUED for every submission",
        Duration::from_secs(60),
        |events| {
            let counts = queued_counts(events);
            jobs.iter().all(|j| counts.contains_key(j))
        },
    )
    .await;
    h.wait_queues_settled().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let counts = queued_counts(&h.events().await);
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "handled more than once: {twice:?}");
}

/// A runner's AMQP connections, as the management API names them (a reconnect makes a new name).
async fn runner_connections(h: &Harness, id: &str) -> Vec<String> {
    h.vhost.connections_named(&format!("runner-{id}")).await
}

/// A `traceparent` of 55 bytes whose second character is two bytes long: slicing it at the format's
/// fixed offsets cuts through the character. More of them than the prefetch holds, with valid submissions
/// between and after: each is handled (in a new trace) exactly once, and nothing is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traceparent_that_splits_a_character_is_ignored_and_stops_nothing() {
    let h = Harness::new("hostile-traceparent").await;
    let _runner = h.start("runner-a");
    let hostile = format!("0é{}", "x".repeat(52));
    assert_eq!(hostile.len(), 55);
    let mut jobs = Vec::new();
    let poison = usize::from(h.config.broker.submit_prefetch) + 8;
    for i in 0..poison {
        let id = format!("tp-bad-{i}");
        h.submit_traced(&figlet(&id), &hostile).await;
        jobs.push(id);
        if i % 8 == 0 {
            let id = format!("tp-good-{i}");
            h.submit(&figlet(&id)).await;
            jobs.push(id);
        }
    }
    let id = "tp-good-last".to_owned();
    h.submit(&figlet(&id)).await;
    jobs.push(id);

    each_queued_once(&h, &jobs).await;
    assert_eq!(h.vcjobs().await.len(), jobs.len());
    assert!(h.dead_letters().await.is_empty());
    // The hostile value was not spread: the events of its jobs carry a new, well-formed trace.
    let events = h.events_with_id("tp-bad-0/QUEUED").await;
    let tp = events[0].traceparent.as_deref().expect("a trace");
    assert!(
        tp.is_ascii() && tp.len() == 55 && tp.starts_with("00-"),
        "{tp}"
    );
}

/// Headers larger than the 32 KiB frames the runner offers (RabbitMQ accepts up to its own `frame_max`,
/// 128 KiB by default, and delivers such a header frame whole): a valid submission carrying one is handled
/// once like any other (the sanitizer leaves the large header out, its `traceparent` stays); an invalid one
/// is dead-lettered once, with its reason, its large header left out of the copy and named; and the
/// submissions around them are each handled once, on the runner's one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_larger_than_a_small_frame_are_read_and_stop_nothing() {
    let h = Harness::new("hostile-large-header").await;
    let _runner = h.start("runner-a");
    let connections = runner_connections(&h, "runner-a").await;

    let big = |bytes: usize| {
        let mut table = FieldTable::default();
        table.insert(
            "x-hostile".into(),
            AMQPValue::LongString("h".repeat(bytes).into()),
        );
        table.insert(
            headers::TRACEPARENT.into(),
            AMQPValue::LongString("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        );
        table
    };
    let submit_type = MessageType::SubmitJob.amqp_type();
    let mut jobs = Vec::new();
    for i in 0..5 {
        let id = format!("hdr-before-{i}");
        h.submit(&figlet(&id)).await;
        jobs.push(id);
    }
    // Valid, with a 40 KiB header.
    let valid = figlet("hdr-valid-big");
    h.publish_raw(
        "submit",
        &encode(Format::Json, &valid).unwrap(),
        BasicProperties::default()
            .with_message_id("hdr-valid-big".into())
            .with_content_type("application/json".into())
            .with_type(submit_type.into())
            .with_headers(big(40 * 1024)),
    )
    .await;
    jobs.push("hdr-valid-big".into());
    // Invalid JSON, with a 100 KiB header: its dead-letter copy could not carry the header and the reason.
    h.publish_raw(
        "submit",
        br#"{"jobId":"hdr-bad-big","replicas":"many"}"#,
        BasicProperties::default()
            .with_message_id("hdr-bad-big".into())
            .with_content_type("application/json".into())
            .with_type(submit_type.into())
            .with_headers(big(100 * 1024)),
    )
    .await;
    for i in 0..5 {
        let id = format!("hdr-after-{i}");
        h.submit(&figlet(&id)).await;
        jobs.push(id);
    }

    each_queued_once(&h, &jobs).await;
    assert_eq!(h.vcjobs().await.len(), jobs.len());

    let dead = h.dead_letters().await;
    assert_eq!(dead.len(), 1, "one dead letter, once");
    let props = &dead[0].delivery.properties;
    assert_eq!(
        props.message_id().as_ref().map(|s| s.as_str()),
        Some("hdr-bad-big")
    );
    let table = props.headers().clone().unwrap_or_default();
    let text = |name: &str| match table.inner().get(name) {
        Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(text(headers::REASON), "invalid_json");
    assert!(
        text(headers::DROPPED_HEADERS).starts_with("x-hostile ("),
        "{}",
        text(headers::DROPPED_HEADERS)
    );
    assert!(table.inner().get("x-hostile").is_none());
    // The small headers are kept.
    assert!(table.inner().contains_key(headers::TRACEPARENT));

    // No reconnect happened on the way: the runner's connection is the one it started with.
    assert_eq!(runner_connections(&h, "runner-a").await, connections);
}
