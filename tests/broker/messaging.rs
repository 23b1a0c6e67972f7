//! Publishing, consuming, dead-lettering, recovery and shutdown against the real RabbitMQ, each test on a
//! vhost of its own.

use crate::rabbit;

use std::collections::BTreeSet;
use std::time::Duration;

use lapin::{
    BasicProperties,
    types::{AMQPValue, FieldTable},
};
use rabbit::{TestVhost, within};
use tokio_util::sync::CancellationToken;
use volcano_runner::broker::{
    Broker, BrokerConfig, ConsumerKind, DeadLetterReason, Delivery, Outbound, OutboundEvent,
    PublishError, headers,
};
use volcano_runner::messages::v1::{
    AccountingTick, CancelJob, JobEvent, JobState, ProxyAction, ProxyEvent, SubmitJob,
};
use volcano_runner::messages::{Format, MessageType, decode};

const SUBMIT_QUEUE: &str = "compute.jobs.submit";
const DEAD_LETTER_QUEUE: &str = "compute.jobs.dead";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn job(i: usize) -> SubmitJob {
    SubmitJob {
        job_id: format!("job-{i}"),
        replicas: 1,
        ..SubmitJob::default()
    }
}

fn submits(range: std::ops::Range<usize>, config: &BrokerConfig) -> Vec<Outbound> {
    range
        .map(|i| Outbound::submit(&job(i), Format::Json, config).with_traceparent(TRACEPARENT))
        .collect()
}

async fn connect(config: BrokerConfig) -> (Broker, CancellationToken) {
    let shutdown = CancellationToken::new();
    let broker = within("connect", Broker::connect(config, shutdown.clone()))
        .await
        .expect("connect");
    (broker, shutdown)
}

/// Asserts that nothing is delivered for a while (for prefetch and pause, where the point is an absence).
async fn assert_quiet(consumer: &mut volcano_runner::broker::QueueConsumer, what: &str) {
    if let Ok(Some(d)) = tokio::time::timeout(Duration::from_millis(700), consumer.recv()).await {
        panic!("{what}, but {:?} was delivered", d.message_id());
    }
}

fn text_header(table: &FieldTable, key: &str) -> Option<String> {
    match table.inner().get(key)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

#[tokio::test]
async fn publish_with_confirms_then_consume_within_the_prefetch() {
    let vhost = TestVhost::new("prefetch").await;
    let config = BrokerConfig {
        submit_prefetch: 5,
        ..vhost.config()
    };
    let (broker, _shutdown) = connect(config.clone()).await;
    let publisher = broker.publisher();
    within(
        "publish 50",
        publisher.publish_all(&submits(0..50, &config)),
    )
    .await
    .expect("every publish confirmed");
    // Confirmed means in the queue.
    assert_eq!(vhost.ready(SUBMIT_QUEUE).await, 50);

    let mut consumer = within("consumer", broker.consumer(ConsumerKind::Submit))
        .await
        .expect("consumer");
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(within("delivery", consumer.recv()).await.expect("delivery"));
    }
    assert_quiet(
        &mut consumer,
        "five unacked deliveries fill a prefetch of five",
    )
    .await;

    let first = &held[0];
    assert_eq!(first.content_type(), Some("application/json"));
    assert_eq!(first.type_name(), Some(MessageType::SubmitJob.amqp_type()));
    assert_eq!(first.message_id(), Some("submit/job-0"));
    assert_eq!(first.traceparent().as_deref(), Some(TRACEPARENT));
    assert_eq!(first.routing_key(), "submit");
    assert!(!first.redelivered());
    assert_eq!(first.delivery_count(), None);
    let sent_at = first.timestamp().expect("timestamp");
    let now = jiff::Timestamp::now().as_second() as u64;
    assert!(
        sent_at <= now && now - sent_at < 60,
        "timestamp {sent_at} vs now {now}"
    );
    assert_eq!(first.decode::<SubmitJob>().unwrap(), job(0));

    let mut seen = BTreeSet::new();
    for d in held {
        seen.insert(d.message_id().unwrap().to_owned());
        d.ack().await.expect("ack");
    }
    while seen.len() < 50 {
        let d = within("delivery", consumer.recv()).await.expect("delivery");
        assert!(
            seen.insert(d.message_id().unwrap().to_owned()),
            "duplicate {d:?}"
        );
        d.ack().await.expect("ack");
    }
    let expected: BTreeSet<String> = (0..50).map(|i| format!("submit/job-{i}")).collect();
    assert_eq!(seen, expected);
    consumer.close().await;
    broker.close().await;
    assert_eq!(vhost.ready(SUBMIT_QUEUE).await, 0);
}

#[tokio::test]
async fn unroutable_and_missing_exchange_are_errors_and_the_follower_sees_every_event() {
    let vhost = TestVhost::new("events").await;
    let config = vhost.config();
    let (broker, _shutdown) = connect(config.clone()).await;
    let publisher = broker.publisher();

    let queued = JobEvent {
        event_id: "job-1/QUEUED".into(),
        job_id: "job-1".into(),
        state: JobState::Queued as i32,
        status: "Queued".into(),
        ..JobEvent::default()
    };
    // Nobody is bound to the events exchange yet: a mandatory event is returned.
    let event = Outbound::job_event(&queued, Format::Json, &config);
    let err = within("publish", publisher.publish(&event))
        .await
        .unwrap_err();
    assert!(
        matches!(err, PublishError::Unroutable { ref exchange, ref routing_key }
            if exchange == "compute.events" && routing_key == "job.lifecycle"),
        "{err:?}"
    );
    assert!(!err.is_retryable());

    let mut missing = event.clone();
    missing.exchange = "no.such.exchange".into();
    let err = within("publish", publisher.publish(&missing))
        .await
        .unwrap_err();
    assert!(
        matches!(err, PublishError::ExchangeNotFound { .. }),
        "{err:?}"
    );
    assert!(!err.is_retryable());

    // The follower binds a temporary queue to both exchanges; the same publisher works again (its
    // channel, closed by the 404, is replaced).
    let mut follower = within("follow", broker.follow_events())
        .await
        .expect("follower");
    let tick = AccountingTick {
        tick_id: "job-1/0".into(),
        job_id: "job-1".into(),
        sequence: 0,
        ..AccountingTick::default()
    };
    let proxy = ProxyEvent {
        event_id: "job-2/proxy/create/1".into(),
        job_id: "job-2".into(),
        action: ProxyAction::Create as i32,
        ..ProxyEvent::default()
    };
    within(
        "publish events",
        publisher.publish_all(&[
            Outbound::job_event(&queued, Format::Json, &config),
            Outbound::accounting(&tick, Format::Protobuf, &config),
            Outbound::proxy(&proxy, Format::Json, &config),
        ]),
    )
    .await
    .expect("events confirmed once a queue is bound");

    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(within("event", follower.next()).await.expect("event"));
    }
    got.sort_by(|a, b| a.message_id.cmp(&b.message_id));
    assert_eq!(got[0].message_id.as_deref(), Some("job-1/0"));
    assert_eq!(got[0].routing_key, "job.accounting");
    assert_eq!(got[0].event, Ok(OutboundEvent::Accounting(tick)));
    assert_eq!(got[1].message_id.as_deref(), Some("job-1/QUEUED"));
    assert_eq!(got[1].event, Ok(OutboundEvent::Job(queued)));
    assert_eq!(got[2].exchange, "compute.proxy");
    assert_eq!(got[2].event, Ok(OutboundEvent::Proxy(proxy)));
    follower.close().await;
    broker.close().await;
}

/// The follower is waited for under timeouts (`events --idle`, the monitor tests' quiet periods): a wait
/// that times out must lose nothing. Every wait here is a zero timeout, which ends a wait the moment it
/// is not ready at once; the 40 events still all arrive, each once.
#[tokio::test]
async fn a_follower_wait_that_times_out_loses_no_event() {
    let vhost = TestVhost::new("follow-timeout").await;
    let config = vhost.config();
    let (broker, _shutdown) = connect(config.clone()).await;
    let mut follower = within("follow", broker.follow_events())
        .await
        .expect("follower");
    let events: Vec<Outbound> = (0..40)
        .map(|i| {
            let tick = AccountingTick {
                tick_id: format!("job-1/{i}"),
                job_id: "job-1".into(),
                sequence: i,
                ..AccountingTick::default()
            };
            Outbound::accounting(&tick, Format::Json, &config)
        })
        .collect();
    within("publish", broker.publisher().publish_all(&events))
        .await
        .expect("confirmed");
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + rabbit::PATIENCE;
    while seen.len() < events.len() && tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::ZERO, follower.next()).await {
            Ok(Some(e)) => seen.push(e.message_id.unwrap_or_default()),
            Ok(None) => panic!("the follower stopped"),
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
    seen.sort();
    let mut expected: Vec<String> = (0..40).map(|i| format!("job-1/{i}")).collect();
    expected.sort();
    assert_eq!(seen, expected, "every event, each once");
    follower.close().await;
    broker.close().await;
}

#[tokio::test]
async fn the_control_consumer_receives_while_the_submit_prefetch_is_full() {
    let vhost = TestVhost::new("control").await;
    let config = BrokerConfig {
        submit_prefetch: 2,
        ..vhost.config()
    };
    let (broker, _shutdown) = connect(config.clone()).await;
    let publisher = broker.publisher();
    within("publish", publisher.publish_all(&submits(0..10, &config)))
        .await
        .unwrap();
    let mut submit = broker.consumer(ConsumerKind::Submit).await.unwrap();
    let mut control = broker.consumer(ConsumerKind::Control).await.unwrap();
    let held = [
        within("submit", submit.recv()).await.unwrap(),
        within("submit", submit.recv()).await.unwrap(),
    ];
    assert_quiet(&mut submit, "the submit prefetch is full").await;

    let cancel = CancelJob {
        job_id: "job-3".into(),
        reason: Some("user".into()),
    };
    within(
        "publish cancel",
        publisher.publish(&Outbound::cancel(&cancel, Format::Json, &config)),
    )
    .await
    .unwrap();
    let d = within("the cancel, past the full submit consumer", control.recv())
        .await
        .unwrap();
    assert_eq!(d.routing_key(), "cancel");
    assert_eq!(decode::<CancelJob>(Format::Json, d.body()).unwrap(), cancel);
    d.ack().await.unwrap();
    for d in held {
        d.ack().await.unwrap();
    }
    submit.close().await;
    control.close().await;
    broker.close().await;
}

#[tokio::test]
async fn pausing_the_submit_consumer_leaves_control_flowing_and_resuming_drains() {
    let vhost = TestVhost::new("pause").await;
    let config = vhost.config();
    let (broker, _shutdown) = connect(config.clone()).await;
    let publisher = broker.publisher();
    let mut submit = broker.consumer(ConsumerKind::Submit).await.unwrap();
    let mut control = broker.consumer(ConsumerKind::Control).await.unwrap();
    let switch = submit.switch();
    switch.pause();

    within("publish", publisher.publish_all(&submits(0..3, &config)))
        .await
        .unwrap();
    let cancel = CancelJob {
        job_id: "job-0".into(),
        reason: None,
    };
    within(
        "publish cancel",
        publisher.publish(&Outbound::cancel(&cancel, Format::Json, &config)),
    )
    .await
    .unwrap();

    assert_quiet(&mut submit, "the submit consumer is paused").await;
    // Whatever it had buffered went back: all three wait in the queue.
    assert_eq!(vhost.wait_ready(SUBMIT_QUEUE, 3).await, 3);
    let d = within("cancel while paused", control.recv()).await.unwrap();
    assert_eq!(d.message_id(), Some("cancel/job-0"));
    d.ack().await.unwrap();

    switch.resume();
    let mut seen = BTreeSet::new();
    while seen.len() < 3 {
        let d = within("after resume", submit.recv()).await.unwrap();
        seen.insert(d.message_id().unwrap().to_owned());
        d.ack().await.unwrap();
    }
    submit.close().await;
    control.close().await;
    broker.close().await;
}

#[tokio::test]
async fn the_delivery_limit_dead_letters_after_limit_plus_one_deliveries() {
    let vhost = TestVhost::new("limit").await;
    let config = BrokerConfig {
        delivery_limit: 2,
        ..vhost.config()
    };
    let (broker, _shutdown) = connect(config.clone()).await;
    within(
        "publish",
        broker.publisher().publish_all(&submits(0..1, &config)),
    )
    .await
    .unwrap();
    let mut consumer = broker.consumer(ConsumerKind::Submit).await.unwrap();
    let mut counts = Vec::new();
    for _ in 0..3 {
        let d = within("delivery", consumer.recv()).await.unwrap();
        counts.push((d.redelivered(), d.delivery_count()));
        d.nack_requeue().await.unwrap();
    }
    assert_eq!(
        counts,
        [(false, None), (true, Some(1)), (true, Some(2))],
        "redelivered flag and x-delivery-count per delivery"
    );
    vhost.wait_ready(DEAD_LETTER_QUEUE, 1).await;
    assert_quiet(
        &mut consumer,
        "a message past its delivery limit is not delivered again",
    )
    .await;

    let dead = vhost.drain(DEAD_LETTER_QUEUE).await;
    assert_eq!(dead.len(), 1);
    let properties = &dead[0].delivery.properties;
    assert_eq!(
        properties.message_id().as_ref().map(|s| s.as_str()),
        Some("submit/job-0")
    );
    let Some(AMQPValue::FieldArray(deaths)) = properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("x-death"))
    else {
        panic!("no x-death header: {properties:?}");
    };
    let AMQPValue::FieldTable(death) = &deaths.as_slice()[0] else {
        panic!("x-death entry is not a table: {deaths:?}");
    };
    assert_eq!(
        text_header(death, "reason").as_deref(),
        Some("delivery_limit")
    );
    assert_eq!(text_header(death, "queue").as_deref(), Some(SUBMIT_QUEUE));
    assert_eq!(vhost.ready(SUBMIT_QUEUE).await, 0);
    consumer.close().await;
    broker.close().await;
}

#[tokio::test]
async fn dead_letter_with_reason_puts_the_message_in_the_dead_letter_queue_with_headers() {
    let vhost = TestVhost::new("reason").await;
    let (broker, _shutdown) = connect(vhost.config()).await;
    let mut consumer = broker.consumer(ConsumerKind::Submit).await.unwrap();
    let mut original_headers = FieldTable::default();
    original_headers.insert(
        "traceparent".into(),
        AMQPValue::LongString(TRACEPARENT.into()),
    );
    let body = br#"{"jobId": "bad-1", "replicas": 0"#; // cut off: not even JSON
    vhost
        .publish_raw(
            "compute.jobs",
            "submit",
            body,
            BasicProperties::default()
                .with_content_type("application/json".into())
                .with_type(MessageType::SubmitJob.amqp_type().into())
                .with_message_id("submit/bad-1".into())
                .with_headers(original_headers),
        )
        .await;

    let d: Delivery = within("delivery", consumer.recv()).await.unwrap();
    let undecodable = d.decode::<SubmitJob>().expect_err("a cut-off body");
    assert_eq!(undecodable.reason(), "invalid_json", "{undecodable}");
    let reason = DeadLetterReason::new("invalid_message", "replicas: must be at least 1")
        .with_field("replicas");
    within("dead-letter", d.dead_letter(&reason))
        .await
        .expect("dead-lettered");

    let dead = vhost.drain(DEAD_LETTER_QUEUE).await;
    assert_eq!(dead.len(), 1);
    let m = &dead[0].delivery;
    assert_eq!(m.data, body);
    assert_eq!(m.routing_key.as_str(), "submit");
    let p = &m.properties;
    assert_eq!(
        p.message_id().as_ref().map(|s| s.as_str()),
        Some("submit/bad-1")
    );
    assert_eq!(
        p.kind().as_ref().map(|s| s.as_str()),
        Some(MessageType::SubmitJob.amqp_type())
    );
    assert_eq!(*p.delivery_mode(), Some(2));
    let h = p.headers().as_ref().expect("headers");
    assert_eq!(
        text_header(h, headers::REASON).as_deref(),
        Some("invalid_message")
    );
    assert_eq!(
        text_header(h, headers::ERROR).as_deref(),
        Some("replicas: must be at least 1")
    );
    assert_eq!(text_header(h, headers::FIELD).as_deref(), Some("replicas"));
    assert_eq!(
        text_header(h, headers::ORIGINAL_ROUTING_KEY).as_deref(),
        Some("submit")
    );
    assert_eq!(
        text_header(h, headers::ORIGINAL_EXCHANGE).as_deref(),
        Some("compute.jobs")
    );
    assert_eq!(
        text_header(h, headers::ORIGINAL_QUEUE).as_deref(),
        Some(SUBMIT_QUEUE)
    );
    assert_eq!(
        text_header(h, headers::TRACEPARENT).as_deref(),
        Some(TRACEPARENT)
    );
    assert_eq!(
        h.inner().get(headers::DELIVERY_COUNT),
        Some(&AMQPValue::LongLongInt(0))
    );
    assert!(text_header(h, headers::DEAD_LETTERED_AT).is_some());
    assert!(
        !h.contains_key("x-death"),
        "our own dead-lettering, not the broker's"
    );
    // The original was acked: nothing waits, nothing is redelivered.
    assert_eq!(vhost.ready(SUBMIT_QUEUE).await, 0);
    assert_quiet(&mut consumer, "the dead-lettered original was acked").await;
    consumer.close().await;
    broker.close().await;
}

#[tokio::test]
async fn a_connection_closed_by_force_is_recovered_and_no_message_is_lost() {
    let vhost = TestVhost::new("forced").await;
    let config = vhost.config();
    let (broker, _shutdown) = connect(config.clone()).await;
    let publisher = broker.publisher();
    let mut consumer = broker.consumer(ConsumerKind::Submit).await.unwrap();
    within(
        "publish first half",
        publisher.publish_all(&submits(0..30, &config)),
    )
    .await
    .unwrap();

    let mut seen = BTreeSet::new();
    let mut held = Vec::new();
    for i in 0..10 {
        let d = within("delivery", consumer.recv()).await.unwrap();
        if i < 5 {
            seen.insert(d.message_id().unwrap().to_owned());
            d.ack().await.unwrap();
        } else {
            held.push(d); // unacked when the connection dies: must come back
        }
    }
    let held_ids: BTreeSet<String> = held
        .iter()
        .map(|d| d.message_id().unwrap().to_owned())
        .collect();

    let generation = broker.generation();
    for name in vhost.connections_named(&config.connection_name).await {
        vhost.force_close(&name).await;
    }
    // Acks on the dead channel cannot succeed; the broker requeued those messages.
    for d in held {
        let _ = d.ack().await;
    }
    // Publishing right after the close is retried across the reconnect.
    within(
        "publish second half",
        publisher.publish_all(&submits(30..60, &config)),
    )
    .await
    .expect("publishes survive the reconnect");
    within("reconnect", broker.wait_for_generation_after(generation))
        .await
        .unwrap();

    let mut redelivered = BTreeSet::new();
    while seen.len() < 60 {
        let d = within("delivery after the reconnect", consumer.recv())
            .await
            .unwrap();
        let id = d.message_id().unwrap().to_owned();
        if d.redelivered() {
            redelivered.insert(id.clone());
        }
        seen.insert(id);
        d.ack().await.unwrap();
    }
    let expected: BTreeSet<String> = (0..60).map(|i| format!("submit/job-{i}")).collect();
    assert_eq!(seen, expected, "every message arrived");
    assert!(
        held_ids.is_subset(&redelivered),
        "unacked deliveries come back marked redelivered: held {held_ids:?}, redelivered {redelivered:?}"
    );
    assert!(broker.reconnects() >= 1);
    assert!(consumer.restarts() >= 1);
    consumer.close().await;
    broker.close().await;
    assert_eq!(vhost.ready(SUBMIT_QUEUE).await, 0);
}

#[tokio::test]
async fn a_consumer_whose_stream_ended_is_reestablished() {
    let vhost = TestVhost::new("stream-end").await;
    let config = vhost.config();
    let (broker, _shutdown) = connect(config.clone()).await;
    let publisher = broker.publisher();
    let mut consumer = broker.consumer(ConsumerKind::Submit).await.unwrap();
    within("publish", publisher.publish_all(&submits(0..1, &config)))
        .await
        .unwrap();
    within("first", consumer.recv())
        .await
        .unwrap()
        .ack()
        .await
        .unwrap();

    // Deleting the queue makes the broker cancel the consumer: its stream ends, though the connection and
    // channel are fine. The consumer must notice, put the queue back and consume again.
    vhost.delete_queue(SUBMIT_QUEUE).await;
    let message = submits(1..2, &config).remove(0);
    let publish_until_routable = async {
        loop {
            match publisher.publish(&message).await {
                Ok(()) => return,
                Err(PublishError::Unroutable { .. }) => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("{e}"),
            }
        }
    };
    let (delivery, ()) = within("delivery after the stream ended", async {
        tokio::join!(consumer.recv(), publish_until_routable)
    })
    .await;
    let d = delivery.expect("delivery");
    assert_eq!(d.message_id(), Some("submit/job-1"));
    d.ack().await.unwrap();
    assert!(consumer.restarts() >= 1);
    assert_eq!(
        broker.reconnects(),
        0,
        "the connection itself was never lost"
    );
    consumer.close().await;
    broker.close().await;
}

#[tokio::test]
async fn shutdown_with_unacked_deliveries_returns_them_to_the_queue() {
    let vhost = TestVhost::new("shutdown").await;
    let config = vhost.config();
    let (broker, shutdown) = connect(config.clone()).await;
    within(
        "publish",
        broker.publisher().publish_all(&submits(0..5, &config)),
    )
    .await
    .unwrap();
    let mut consumer = broker.consumer(ConsumerKind::Submit).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(within("delivery", consumer.recv()).await.unwrap());
    }

    shutdown.cancel();
    assert!(
        within("recv after shutdown", consumer.recv())
            .await
            .is_none(),
        "no new deliveries after shutdown"
    );
    // In-flight work may still finish during the grace period.
    for d in held.drain(..2) {
        d.ack()
            .await
            .expect("acks still work after consuming stopped");
    }
    consumer.close().await;
    broker.close().await;
    drop(held); // unsettled: the closed channel gave them back
    assert_eq!(vhost.wait_ready(SUBMIT_QUEUE, 3).await, 3);
}

#[tokio::test]
async fn publishing_gives_up_after_the_publish_timeout_while_the_broker_is_unreachable() {
    let vhost = TestVhost::new("gone").await;
    let config = BrokerConfig {
        publish_timeout: Duration::from_secs(1),
        ..vhost.config()
    };
    let (broker, _shutdown) = connect(config.clone()).await;
    let publisher = broker.publisher();
    within("publish", publisher.publish_all(&submits(0..1, &config)))
        .await
        .unwrap();

    // Deleting the vhost drops the connection, and every reconnect is refused until it exists again.
    let (status, body) = rabbit::management(
        "DELETE",
        &format!("/api/vhosts/{}", rabbit::segment(&vhost.name)),
        None,
    )
    .await;
    assert_eq!(status, 204, "{body}");
    let started = std::time::Instant::now();
    let err = within("publish", publisher.publish(&submits(1..2, &config)[0]))
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert!(matches!(err, PublishError::GaveUp { .. }), "{err:?}");
    assert!(
        err.is_retryable(),
        "the caller should requeue and try later"
    );
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(5),
        "gave up after {waited:?}"
    );
    assert!(!broker.is_connected());
    // Closing ends the reconnect loop promptly.
    within("close", broker.close()).await;
}
