//! W3C trace context end to end: the `traceparent` of a submission continues into the runner's message
//! span, onto the events it publishes, onto the VolcanoJob as an annotation, and from there into the
//! monitor's job span and the events the monitor publishes, all in the same trace.

mod ops_common;

use std::time::Duration;

use lapin::options::{QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use tracing_subscriber::layer::SubscriberExt;
use volcano_runner::broker::Outbound;
use volcano_runner::messages::Format;
use volcano_runner::messages::v1::JobState;
use volcano_runner::ops::telemetry::format_layer;
use volcano_runner::ops::{LogFormat, Ops, TraceContext};

use ops_common::capture::Capture;
use ops_common::fleet::{Fleet, sleeping_job};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SENDER_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_continues_from_the_submission_to_the_monitor() {
    let logs = Capture::default();
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry()
            .with(
                // The kube client's requests log at TRACE through tower's buffer, inside the caller's span:
                // every API call of a round of work shows that round's span.
                tracing_subscriber::EnvFilter::new("volcano_runner=debug,tower::buffer=trace"),
            )
            .with(format_layer(LogFormat::Json, logs.clone(), false)),
    )
    .unwrap();

    let mut fleet = Fleet::start("trace", Ops::new(), |_| {}).await;
    // A queue of our own on the events exchange, to read the headers of what is published.
    let (connection, channel) = fleet.vhost.raw().await;
    channel
        .queue_declare(
            "trace.events".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            "trace.events".into(),
            fleet.config.broker.events_exchange.as_str().into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let _ = connection.close(200, "done".into()).await;

    let sender = format!("00-{TRACE_ID}-{SENDER_SPAN}-01");
    let job = sleeping_job("trace-1", 60, None);
    fleet
        .publish(
            Outbound::submit(&job, Format::Json, &fleet.config.broker),
            Some(&sender),
        )
        .await;
    fleet.wait_state("trace-1", JobState::Queued, None).await;
    fleet
        .wait_state("trace-1", JobState::Running, Some(Duration::from_secs(1)))
        .await;

    // The VolcanoJob carries the runner's span: same trace, the runner's own span id.
    let job_ns = fleet
        .recorder
        .calls()
        .iter()
        .find_map(|c| match &c.call {
            volcano_runner::ops::ApiCall::Resource(r)
                if r.verb == "create" && r.resource == "jobs" =>
            {
                r.namespace.clone()
            }
            _ => None,
        })
        .unwrap();
    let stored = fleet
        .sim
        .object("batch.volcano.sh", "v1alpha1", "jobs", &job_ns, "j-trace-1")
        .unwrap();
    let annotation = stored["metadata"]["annotations"]["ucloud.dk/traceparent"]
        .as_str()
        .expect("the traceparent annotation")
        .to_owned();
    let runner_span = TraceContext::parse(&annotation).unwrap();
    assert_eq!(runner_span.trace_id().to_string(), TRACE_ID);
    assert_ne!(
        runner_span.span_id().to_string(),
        SENDER_SPAN,
        "continued, not copied"
    );

    // The events: QUEUED (from the runner) and RUNNING (from the monitor) in the same trace.
    let published = fleet.vhost.drain("trace.events").await;
    let header = |m: &lapin::message::BasicGetMessage| {
        m.delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("traceparent").cloned())
            .and_then(|v| match v {
                AMQPValue::LongString(s) => Some(s.to_string()),
                AMQPValue::ShortString(s) => Some(s.to_string()),
                _ => None,
            })
    };
    let by_id = |id: &str| {
        published
            .iter()
            .find(|m| {
                m.delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|s| s.as_str())
                    == Some(id)
            })
            .unwrap_or_else(|| panic!("{id} was not published"))
    };
    for id in ["trace-1/QUEUED", "trace-1/RUNNING"] {
        let tp = header(by_id(id)).unwrap_or_else(|| panic!("{id} has no traceparent"));
        let ctx = TraceContext::parse(&tp).unwrap();
        assert_eq!(ctx.trace_id().to_string(), TRACE_ID, "{id}");
    }
    assert_eq!(header(by_id("trace-1/QUEUED")).unwrap(), annotation);
    fleet.stop().await;

    // The logs: the runner's message span and the monitor's job span both name the job and the trace.
    let text = logs.text();
    let spans: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|l| l.get("span").cloned())
        .filter(|s| s["job_id"] == "trace-1")
        .collect();
    for name in ["message", "job"] {
        let span = spans
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no log line in a `{name}` span of trace-1"));
        assert_eq!(span["trace_id"], TRACE_ID, "{name}");
    }
    // At info: the accepted job, and each lifecycle transition, with the job and its trace.
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["level"] == "INFO")
        .filter(|l| l["span"]["job_id"] == "trace-1" && l["span"]["trace_id"] == TRACE_ID)
        .collect();
    let said = |what: &str| {
        lines.iter().any(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(what))
        })
    };
    assert!(said("Accepted a job."), "{lines:?}");
    assert!(said("Published a lifecycle transition."), "{lines:?}");
}

/// A message without a traceparent starts a trace of its own, and it is still carried through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_without_trace_context_starts_a_trace() {
    let mut fleet = Fleet::start("trace-new", Ops::new(), |_| {}).await;
    fleet.submit(&sleeping_job("trace-2", 60, None)).await;
    fleet.wait_state("trace-2", JobState::Queued, None).await;
    let job_ns = fleet
        .recorder
        .calls()
        .iter()
        .find_map(|c| match &c.call {
            volcano_runner::ops::ApiCall::Resource(r)
                if r.verb == "create" && r.resource == "jobs" =>
            {
                r.namespace.clone()
            }
            _ => None,
        })
        .unwrap();
    let stored = fleet
        .sim
        .object("batch.volcano.sh", "v1alpha1", "jobs", &job_ns, "j-trace-2")
        .unwrap();
    let annotation = stored["metadata"]["annotations"]["ucloud.dk/traceparent"]
        .as_str()
        .expect("a new trace is recorded too");
    assert!(TraceContext::parse(annotation).is_ok(), "{annotation}");
    fleet.stop().await;
}
