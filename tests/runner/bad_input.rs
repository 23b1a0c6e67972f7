//! Bad input: every kind of message that cannot be handled ends in the dead-letter queue with a reason
//! header, with a FAILURE event when its job id can be read (a status-only event for a bad cancel or
//! extension, whose job is not affected), and the runner keeps running.

use crate::harness;
use crate::rabbit;

use std::collections::BTreeMap;

use harness::{Harness, figlet};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use volcano_runner::broker::headers;
use volcano_runner::messages::v1::JobState;
use volcano_runner::messages::{Format, MessageType, encode};

/// One bad message and what must come of it.
struct Case {
    /// Its `message_id`, to find its dead-lettered copy.
    id: &'static str,
    routing_key: &'static str,
    content_type: Option<&'static str>,
    type_name: Option<&'static str>,
    body: Vec<u8>,
    /// The reason header of the dead-lettered copy.
    reason: &'static str,
    /// The field header, when the problem is about one field.
    field: Option<&'static str>,
    /// The job the event is about and whether it is a FAILURE (else status-only); `None`: no event.
    event: Option<(&'static str, JobState)>,
}

fn text(value: Option<&AMQPValue>) -> Option<String> {
    match value? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

fn cases() -> Vec<Case> {
    let submit = MessageType::SubmitJob.amqp_type();
    let json = Some("application/json");
    let mut zero_replicas = figlet("bad-replicas");
    zero_replicas.replicas = 0;
    let mut upper = figlet("x");
    upper.job_id = "NOT-A-NAME".into();
    let queued_event = volcano_runner::messages::v1::JobEvent {
        event_id: "bad-event/QUEUED".into(),
        job_id: "bad-event".into(),
        ..Default::default()
    };
    vec![
        Case {
            id: "wrong-type-of-value",
            routing_key: "submit",
            content_type: json,
            type_name: Some(submit),
            body: br#"{"jobId":"bad-json","replicas":"many"}"#.to_vec(),
            reason: "invalid_json",
            field: Some("replicas"),
            event: Some(("bad-json", JobState::Failure)),
        },
        Case {
            id: "cut-off",
            routing_key: "submit",
            content_type: json,
            type_name: Some(submit),
            body: br#"{"jobId":"cut-off","owner":{"us"#.to_vec(),
            reason: "invalid_json",
            field: None,
            event: None,
        },
        Case {
            id: "text-plain",
            routing_key: "submit",
            content_type: Some("text/plain"),
            type_name: Some(submit),
            body: br#"{"jobId":"bad-ct"}"#.to_vec(),
            reason: "unsupported_content_type",
            field: None,
            event: Some(("bad-ct", JobState::Failure)),
        },
        Case {
            id: "no-content-type",
            routing_key: "submit",
            content_type: None,
            type_name: Some(submit),
            body: br#"{"jobId":"no-ct"}"#.to_vec(),
            reason: "missing_content_type",
            field: None,
            event: Some(("no-ct", JobState::Failure)),
        },
        Case {
            id: "no-type",
            routing_key: "submit",
            content_type: json,
            type_name: None,
            body: br#"{"jobId":"no-type"}"#.to_vec(),
            reason: "missing_message_type",
            field: None,
            event: Some(("no-type", JobState::Failure)),
        },
        Case {
            id: "unknown-type",
            routing_key: "submit",
            content_type: json,
            type_name: Some("volcano_runner.v1.Nope"),
            body: br#"{"jobId":"odd-type"}"#.to_vec(),
            reason: "unknown_message_type",
            field: None,
            event: Some(("odd-type", JobState::Failure)),
        },
        Case {
            id: "an-event-as-input",
            routing_key: "submit",
            content_type: json,
            type_name: Some(MessageType::JobEvent.amqp_type()),
            body: encode(Format::Json, &queued_event).unwrap(),
            reason: "not_inbound",
            field: None,
            event: Some(("bad-event", JobState::Failure)),
        },
        Case {
            id: "protobuf-garbage",
            routing_key: "submit",
            content_type: Some("application/x-protobuf"),
            type_name: Some(submit),
            body: vec![0xff, 0xff, 0xff, 0xff, 0x0f],
            reason: "invalid_protobuf",
            field: None,
            event: None,
        },
        Case {
            id: "zero-replicas",
            routing_key: "submit",
            content_type: json,
            type_name: Some(submit),
            body: encode(Format::Json, &zero_replicas).unwrap(),
            reason: "invalid_field",
            field: Some("replicas"),
            event: Some(("bad-replicas", JobState::Failure)),
        },
        Case {
            id: "not-a-job-id",
            routing_key: "submit",
            content_type: json,
            type_name: Some(submit),
            body: encode(Format::Json, &upper).unwrap(),
            reason: "invalid_field",
            field: Some("jobId"),
            // Not a valid job id, but readable: the orchestrator hears about it under the id it sent.
            event: Some(("NOT-A-NAME", JobState::Failure)),
        },
        Case {
            id: "negative-extension",
            routing_key: "extend",
            content_type: json,
            type_name: Some(MessageType::ExtendJob.amqp_type()),
            body: br#"{"jobId":"ext-bad","requestId":"r1","extension":"-60s"}"#.to_vec(),
            reason: "invalid_field",
            field: Some("extension"),
            event: Some(("ext-bad", JobState::Unspecified)),
        },
        Case {
            id: "cancel-without-id",
            routing_key: "cancel",
            content_type: json,
            type_name: Some(MessageType::CancelJob.amqp_type()),
            body: br#"{"reason":"x"}"#.to_vec(),
            reason: "missing_field",
            field: Some("jobId"),
            event: None,
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_bad_message_is_dead_lettered_with_its_reason_and_reported() {
    let h = Harness::new("bad-input").await;
    let runner = h.start("runner-a");
    let cases = cases();
    for case in &cases {
        let mut properties = BasicProperties::default().with_message_id(case.id.into());
        if let Some(ct) = case.content_type {
            properties = properties.with_content_type(ct.into());
        }
        if let Some(t) = case.type_name {
            properties = properties.with_type(t.into());
        }
        properties = properties.with_headers(FieldTable::default());
        h.publish_raw(case.routing_key, &case.body, properties)
            .await;
    }
    // The runner keeps going: a good submission after all of them is handled.
    h.submit(&figlet("good-after-bad")).await;
    h.wait_events("QUEUED of the good submission", |e| {
        e.iter().any(|c| c.message_id == "good-after-bad/QUEUED")
    })
    .await;
    h.wait_queues_settled().await;

    let mut dead: BTreeMap<String, FieldTable> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + rabbit::PATIENCE;
    while dead.len() < cases.len() && tokio::time::Instant::now() < deadline {
        for m in h.dead_letters().await {
            let props = &m.delivery.properties;
            let id = props
                .message_id()
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default();
            dead.insert(id, props.headers().clone().unwrap_or_default());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let events = h.events().await;
    for case in &cases {
        let headers = dead
            .get(case.id)
            .unwrap_or_else(|| panic!("{} is in the dead-letter queue", case.id));
        let table = headers.inner();
        assert_eq!(
            text(table.get(headers::REASON)).as_deref(),
            Some(case.reason),
            "{}: reason header",
            case.id
        );
        assert!(
            text(table.get(headers::ERROR)).is_some_and(|e| !e.is_empty()),
            "{}: error header",
            case.id
        );
        assert_eq!(
            text(table.get(headers::FIELD)).as_deref(),
            case.field,
            "{}: field header",
            case.id
        );
        match case.event {
            Some((job_id, state)) => {
                let event = events
                    .iter()
                    .filter_map(|c| c.event.as_ref())
                    .find(|e| {
                        e.job_id == job_id && e.event_id.starts_with(&format!("{job_id}/rejected/"))
                    })
                    .unwrap_or_else(|| panic!("{}: an event about {job_id}", case.id));
                assert_eq!(event.state, state as i32, "{}", case.id);
                assert_eq!(
                    event.reason, case.reason,
                    "{}: the event carries the dead-letter code",
                    case.id
                );
                if let Some(field) = case.field {
                    assert!(
                        event.status.starts_with(&format!("{field}: ")),
                        "{}: the event names the field: {}",
                        case.id,
                        event.status
                    );
                }
            }
            None => {
                let about: Vec<_> = events
                    .iter()
                    .filter(|c| c.message_id.contains("/rejected/"))
                    .filter(|c| c.event.as_ref().is_some_and(|e| e.job_id == "cut-off"))
                    .collect();
                assert!(
                    about.is_empty(),
                    "{}: no event without a usable job id",
                    case.id
                );
            }
        }
    }
    let rejected = events
        .iter()
        .filter(|c| c.message_id.contains("/rejected/"))
        .count();
    let expected = cases.iter().filter(|c| c.event.is_some()).count();
    assert_eq!(
        rejected, expected,
        "one event per bad message with a job id"
    );
    assert!(h.vcjob("bad-replicas").await.is_none());
    runner.stop().await;
}
