//! [`QueueConsumer`]: deliveries from one queue that keep coming across lost channels, lost connections and
//! consumer streams that end; and [`Delivery`], the handle that settles one message.
//!
//! Each consumer has its own channel and prefetch (`basic.qos` per consumer), so the control consumer is
//! never starved by submissions that fill the submit consumer's prefetch. A consumer re-establishes itself
//! (fresh channel, qos, `basic.consume`) whenever its stream ends or errs, its channel closes, or the broker
//! reconnected; a lapin consumer stream that ends silently (lapin #222, #389) is caught by the same checks.
//! It can be paused and resumed ([`ConsumerSwitch`]) without touching any other consumer.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use futures::StreamExt;
use lapin::{
    Channel,
    options::{
        BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
        BasicQosOptions, QueueBindOptions, QueueDeclareOptions,
    },
    protocol::{AMQPErrorKind, AMQPSoftError},
    types::{AMQPValue, FieldTable, ShortString},
};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::outbound::short;
use super::{Broker, BrokerError, PublishError, Publisher, headers, properties};
use crate::messages::{Contract, DecodeError, Format};

/// Which of the runner's two queues to consume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerKind {
    /// `broker.submit_queue` with `broker.submit_prefetch`.
    Submit,
    /// `broker.control_queue` with `broker.control_prefetch`.
    Control,
}

/// Where a consumer's deliveries come from.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// A queue of the topology (or any existing queue).
    Queue(String),
    /// A server-named, exclusive, auto-delete queue bound to each `(exchange, routing key)`; a new one after
    /// every reconnect (what was published in between is not seen).
    Temporary(Vec<(String, String)>),
}

struct Active {
    generation: u64,
    channel: Channel,
    consumer: lapin::Consumer,
    tag: ShortString,
    queue: Arc<str>,
}

/// Pauses and resumes one consumer from anywhere (e.g. the runner's pause switch), without touching the
/// others. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ConsumerSwitch {
    paused: Arc<watch::Sender<bool>>,
}

impl ConsumerSwitch {
    /// Stops taking deliveries: the consumer is cancelled at the broker, deliveries it received but did not
    /// hand out yet go back to the queue, and those handed out stay valid to settle.
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// Starts consuming again.
    pub fn resume(&self) {
        self.paused.send_replace(false);
    }

    /// Whether the consumer is paused.
    pub fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }
}

/// A consumer that survives. Call [`QueueConsumer::recv`] in a loop; close it with
/// [`QueueConsumer::close`].
pub struct QueueConsumer {
    broker: Broker,
    source: Source,
    label: &'static str,
    prefetch: u16,
    active: Option<Active>,
    /// The channel of a consumer that was cancelled or ended while the channel lived on: the next consume
    /// reuses it (so pausing and resuming opens no new channels), and [`QueueConsumer::close`] closes it.
    /// Deliveries handed out on it stay valid.
    parked: Option<(u64, Channel)>,
    paused: watch::Receiver<bool>,
    switch: ConsumerSwitch,
    restarts: Arc<AtomicU64>,
    /// Counts consumer tags, so each consume on this process is told apart in the management UI.
    tags: u64,
    publisher: Publisher,
    /// When to look at the channel's state, for losses lapin reports no error for.
    health: tokio::time::Interval,
    finished: bool,
}

impl std::fmt::Debug for QueueConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueConsumer")
            .field("source", &self.source)
            .field("prefetch", &self.prefetch)
            .field("consuming", &self.active.is_some())
            .field("restarts", &self.restarts())
            .finish()
    }
}

impl QueueConsumer {
    /// The runner's submit or control consumer, consuming when this returns.
    pub async fn start(broker: Broker, kind: ConsumerKind) -> Result<Self, BrokerError> {
        let c = broker.config();
        let (queue, prefetch, label) = match kind {
            ConsumerKind::Submit => (c.submit_queue.clone(), c.submit_prefetch, "submit"),
            ConsumerKind::Control => (c.control_queue.clone(), c.control_prefetch, "control"),
        };
        Self::start_source(broker, Source::Queue(queue), prefetch, label).await
    }

    /// A consumer of any existing queue (the dead-letter queue, say), consuming when this returns.
    pub async fn start_on(
        broker: Broker,
        queue: impl Into<String>,
        prefetch: u16,
    ) -> Result<Self, BrokerError> {
        Self::start_source(broker, Source::Queue(queue.into()), prefetch, "queue").await
    }

    pub(crate) async fn start_source(
        broker: Broker,
        source: Source,
        prefetch: u16,
        label: &'static str,
    ) -> Result<Self, BrokerError> {
        let (tx, rx) = watch::channel(false);
        let publisher = broker.publisher();
        let period = broker.config().health_check_interval;
        let mut health = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut consumer = Self {
            broker,
            source,
            label,
            prefetch: prefetch.max(1),
            active: None,
            parked: None,
            paused: rx,
            switch: ConsumerSwitch {
                paused: Arc::new(tx),
            },
            restarts: Arc::new(AtomicU64::new(0)),
            tags: 0,
            publisher,
            health,
            finished: false,
        };
        // The first consume fails loudly (a missing queue in passive mode, no permission); later ones retry.
        consumer.active = Some(consumer.establish().await?);
        Ok(consumer)
    }

    /// The switch that pauses and resumes this consumer.
    pub fn switch(&self) -> ConsumerSwitch {
        self.switch.clone()
    }

    /// How often the consumer was re-established after its stream ended or its channel was lost (a metric).
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// The queue consumed right now (for a temporary queue, its server-given name), if consuming.
    pub fn queue(&self) -> Option<&str> {
        self.active.as_ref().map(|a| &*a.queue)
    }

    /// The next delivery. Waits while paused, and re-establishes the consumer as often as needed. Returns
    /// `None` once shutdown has begun (or after [`QueueConsumer::stop`]): the consumer is then cancelled at
    /// the broker, deliveries not handed out yet are back in the queue, and those handed out can still be
    /// settled until [`QueueConsumer::close`].
    ///
    /// A pause is carried out here, so it takes effect the next time `recv` runs; a caller that stops
    /// calling `recv` (all its slots busy) holds at most the prefetch. Dropping the future while it waits
    /// for a delivery loses nothing, so `recv` can sit in a `select!`.
    pub async fn recv(&mut self) -> Option<Delivery> {
        // Backoff between failed attempts to consume, made only when one fails.
        let mut delays: Option<Box<dyn Iterator<Item = std::time::Duration> + Send>> = None;
        loop {
            if self.finished {
                return None;
            }
            if self.broker.is_shutting_down() {
                self.stop().await;
                return None;
            }
            if *self.paused.borrow_and_update() {
                if self.active.is_some() {
                    info!(queue = self.label, "Consumer paused.");
                    self.cancel_active().await;
                }
                tokio::select! {
                    _ = self.paused.changed() => {}
                    _ = self.broker.shutdown_token().cancelled() => {}
                    _ = self.broker.closing_token().cancelled() => {}
                }
                continue;
            }
            if self.active.is_none() {
                match self.establish().await {
                    Ok(active) => {
                        self.restarts.fetch_add(1, Ordering::Relaxed);
                        info!(queue = %active.queue, "Consumer re-established.");
                        self.active = Some(active);
                        delays = None;
                    }
                    Err(BrokerError::Shutdown) => continue,
                    Err(e) => {
                        let config = self.broker.config();
                        let delay = delays
                            .get_or_insert_with(|| Box::new(config.reconnect_backoff()))
                            .next()
                            .unwrap_or(config.reconnect_max_delay);
                        warn!(queue = self.label, error = %e, ?delay, "Consumer could not start; retrying.");
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = self.paused.changed() => {}
                            _ = self.broker.shutdown_token().cancelled() => {}
                            _ = self.broker.closing_token().cancelled() => {}
                        }
                    }
                }
                continue;
            }
            let active = self.active.as_mut().expect("checked above");
            tokio::select! {
                next = active.consumer.next() => match next {
                    Some(Ok(delivery)) if !delivery.acker.usable() || !active.channel.status().connected() => {
                        // Buffered before its channel died: the broker has requeued it already and no ack
                        // can reach it any more. Handing it out would only make its handler's ack fail.
                        debug!(queue = %active.queue, "Dropped a delivery of a lost channel; it comes again.");
                        self.drop_active();
                    }
                    Some(Ok(delivery)) => {
                        return Some(Delivery::new(
                            delivery,
                            active.channel.clone(),
                            active.queue.clone(),
                            self.publisher.clone(),
                        ));
                    }
                    Some(Err(e)) => {
                        warn!(queue = %active.queue, error = %e, "Consumer failed; re-establishing it.");
                        self.broker.suspect();
                        self.drop_active();
                    }
                    None => {
                        warn!(queue = %active.queue, "Consumer stream ended; re-establishing it.");
                        self.broker.suspect();
                        self.drop_active();
                    }
                },
                _ = self.health.tick() => {
                    let stale = active.generation != self.broker.generation()
                        || !active.channel.status().connected();
                    if stale {
                        warn!(queue = %active.queue, "Consumer channel is gone; re-establishing it.");
                        self.drop_active();
                    }
                }
                _ = self.paused.changed() => {}
                _ = self.broker.shutdown_token().cancelled() => {}
                _ = self.broker.closing_token().cancelled() => {}
            }
        }
    }

    /// Carries out a pause now, for a caller that waits for something else before it asks for a delivery
    /// (the runner's gate): a consumer established while the switch says paused (at start, or paused
    /// meanwhile) is cancelled at the broker, so no delivery waits in a runner that will not take it.
    pub async fn apply_pause(&mut self) {
        if *self.paused.borrow() && self.active.is_some() {
            info!(queue = self.label, "Consumer paused.");
            self.cancel_active().await;
        }
    }

    /// Completes when the switch is flipped. Cancel-safe, for a `select!` next to other waits.
    pub async fn switch_flipped(&mut self) {
        if self.paused.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Stops taking deliveries for good (as on shutdown): cancels the consumer at the broker and returns
    /// deliveries not handed out yet to the queue. Handed-out deliveries can still be settled.
    pub async fn stop(&mut self) {
        self.cancel_active().await;
        self.finished = true;
    }

    /// Stops and closes the consumer's channels. Deliveries still unsettled go back to the queue (the
    /// broker requeues what a closed channel held).
    pub async fn close(mut self) {
        self.stop().await;
        if let Some((_, channel)) = self.parked.take()
            && channel.status().connected()
            && let Err(e) = channel.close(200, "consumer closed".into()).await
        {
            debug!(error = %e, "Closing a consumer channel failed; it is gone either way.");
        }
    }

    fn drop_active(&mut self) {
        if let Some(active) = self.active.take() {
            self.park(active.generation, active.channel);
        }
    }

    /// Cancels the consumer at the broker and returns what it buffered but never handed out.
    async fn cancel_active(&mut self) {
        let Some(mut active) = self.active.take() else {
            return;
        };
        if active.channel.status().connected() {
            match active
                .channel
                .basic_cancel(active.tag.clone(), BasicCancelOptions::default())
                .await
            {
                Ok(()) => {
                    // After cancel-ok the stream yields what it buffered, then ends.
                    let drain = async {
                        let mut requeued = 0u32;
                        while let Some(next) = active.consumer.next().await {
                            if let Ok(d) = next
                                && d.acker
                                    .nack(BasicNackOptions {
                                        requeue: true,
                                        multiple: false,
                                    })
                                    .await
                                    .unwrap_or(false)
                            {
                                requeued += 1;
                            }
                        }
                        requeued
                    };
                    let timeout = self.broker.config().confirm_timeout;
                    match tokio::time::timeout(timeout, drain).await {
                        Ok(requeued) if requeued > 0 => {
                            debug!(queue = %active.queue, requeued, "Returned buffered deliveries to the queue.");
                        }
                        Ok(_) => {}
                        Err(_) => {
                            warn!(queue = %active.queue, "The cancelled consumer did not end in time.")
                        }
                    }
                }
                Err(e) => {
                    debug!(error = %e, "Cancelling the consumer failed; its channel is gone.")
                }
            }
        }
        self.park(active.generation, active.channel);
    }

    /// Keeps a still-open channel for the next consume; a lost one is simply dropped.
    fn park(&mut self, generation: u64, channel: Channel) {
        if channel.status().connected() && generation == self.broker.generation() {
            self.parked = Some((generation, channel));
        }
    }

    /// The parked channel if it is still good, or a new one.
    async fn take_channel(&mut self) -> Result<(u64, Channel), BrokerError> {
        if let Some((generation, channel)) = self.parked.take()
            && channel.status().connected()
            && generation == self.broker.generation()
        {
            return Ok((generation, channel));
        }
        self.broker.channel().await
    }

    async fn establish(&mut self) -> Result<Active, BrokerError> {
        let (generation, channel) = self.take_channel().await?;
        match self.consume_on(generation, channel.clone()).await {
            Ok(active) => Ok(active),
            Err(e) => {
                if is_not_found(&e) {
                    // The queue was deleted under us: put the topology back (or, in passive mode, report
                    // clearly that it is missing) before the next attempt.
                    warn!(
                        queue = self.label,
                        "Queue not found; declaring the topology again."
                    );
                    self.broker.redeclare().await?;
                }
                // If the channel survived, the next attempt reuses it (it may carry handed-out deliveries).
                self.park(generation, channel);
                Err(BrokerError::Channel(e))
            }
        }
    }

    async fn consume_on(
        &mut self,
        generation: u64,
        channel: Channel,
    ) -> Result<Active, lapin::Error> {
        // Per-consumer prefetch (global = false): this consumer's in-flight limit, nobody else's.
        channel
            .basic_qos(self.prefetch, BasicQosOptions { global: false })
            .await?;
        let queue: Arc<str> = match &self.source {
            Source::Queue(name) => Arc::from(name.as_str()),
            Source::Temporary(bindings) => {
                let declared = channel
                    .queue_declare(
                        ShortString::from(""),
                        QueueDeclareOptions {
                            exclusive: true,
                            auto_delete: true,
                            ..QueueDeclareOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await?;
                let name = declared.name().clone();
                for (exchange, key) in bindings {
                    channel
                        .queue_bind(
                            name.clone(),
                            ShortString::from(exchange.as_str()),
                            ShortString::from(key.as_str()),
                            QueueBindOptions::default(),
                            FieldTable::default(),
                        )
                        .await?;
                }
                Arc::from(name.as_str())
            }
        };
        self.tags += 1;
        let tag = short(
            "consumer tag",
            &format!(
                "{}.{}.{}.{}",
                self.broker.config().connection_name,
                self.label,
                std::process::id(),
                self.tags
            ),
        )
        // An overlong connection name: let the broker choose the tag.
        .unwrap_or_else(|_| ShortString::from(""));
        let consumer = channel
            .basic_consume(
                ShortString::from(&*queue),
                tag,
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(Active {
            generation,
            tag: consumer.tag(),
            channel,
            consumer,
            queue,
        })
    }
}

fn is_not_found(e: &lapin::Error) -> bool {
    matches!(e.kind(), lapin::ErrorKind::ProtocolError(amqp)
        if matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND)))
}

/// Why a message was put in the dead-letter queue: a reason code for machines, a message for people, and
/// the field it is about when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterReason {
    /// A short code, e.g. `invalid_json`, `missing_field`, `unknown_message_type`.
    pub code: String,
    /// What is wrong, for a person, e.g. `replicas: must be at least 1`.
    pub message: String,
    /// The field path, e.g. `parameters.threads`, when the problem is about one field.
    pub field: Option<String>,
}

impl DeadLetterReason {
    /// A reason with a code and a message.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            field: None,
        }
    }

    /// Names the field the problem is about.
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }
}

/// Why an ack or nack did not reach the broker.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AckError {
    /// The channel the message came on is gone; the broker has requeued the message and will deliver it
    /// again (possibly to another runner). Effects must therefore be idempotent.
    #[error("the channel closed before the message was settled; the broker will deliver it again")]
    ChannelClosed,
    #[error("settling the message failed: {0}")]
    Amqp(String),
}

/// Why dead-lettering did not complete.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DeadLetterError {
    /// The copy was not confirmed by the dead-letter exchange; the original was returned to its queue
    /// (`requeued`) so nothing is lost, and its delivery limit will dead-letter it eventually.
    #[error("the dead-letter copy was not confirmed ({source}); the message was {}", if *requeued { "returned to its queue" } else { "left to the broker to redeliver" })]
    Publish {
        #[source]
        source: PublishError,
        requeued: bool,
    },
    /// The copy is in the dead-letter queue but the original could not be acked; it will be delivered
    /// again, and dead-lettered again (the copies share their `message_id`).
    #[error("the message was dead-lettered but the ack failed: {0}")]
    Ack(#[source] AckError),
}

/// One message from a queue. Settle it exactly once: [`Delivery::ack`], [`Delivery::nack_requeue`] or
/// [`Delivery::dead_letter`] (each takes the delivery, so a second settle cannot compile). One dropped
/// unsettled stays unacknowledged until its channel closes, then returns to the queue.
pub struct Delivery {
    inner: lapin::message::Delivery,
    /// Keeps the channel open while the delivery is unsettled: it can only be acked on the channel it came on.
    _channel: Channel,
    queue: Arc<str>,
    publisher: Publisher,
    settled: bool,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("queue", &self.queue)
            .field("routing_key", &self.routing_key())
            .field("message_id", &self.message_id())
            .field("type", &self.type_name())
            .field("redelivered", &self.redelivered())
            .field("bytes", &self.body().len())
            .finish()
    }
}

impl Delivery {
    fn new(
        inner: lapin::message::Delivery,
        channel: Channel,
        queue: Arc<str>,
        publisher: Publisher,
    ) -> Self {
        Self {
            inner,
            _channel: channel,
            queue,
            publisher,
            settled: false,
        }
    }

    /// The message body.
    pub fn body(&self) -> &[u8] {
        &self.inner.data
    }

    /// The AMQP `reply_to` property: where a request's answer goes (a queue, or direct reply-to).
    pub fn reply_to(&self) -> Option<&str> {
        self.inner
            .properties
            .reply_to()
            .as_ref()
            .map(|s| s.as_str())
    }

    /// The AMQP `correlation_id` property, which a request's answer carries back.
    pub fn correlation_id(&self) -> Option<&str> {
        self.inner
            .properties
            .correlation_id()
            .as_ref()
            .map(|s| s.as_str())
    }

    /// The queue it came from.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The exchange it was published to.
    pub fn exchange(&self) -> &str {
        self.inner.exchange.as_str()
    }

    /// The routing key it was published with (`submit`, `cancel`, `extend`, ...).
    pub fn routing_key(&self) -> &str {
        self.inner.routing_key.as_str()
    }

    /// The `content_type` property.
    pub fn content_type(&self) -> Option<&str> {
        self.inner
            .properties
            .content_type()
            .as_ref()
            .map(|s| s.as_str())
    }

    /// The `type` property, naming the message type.
    pub fn type_name(&self) -> Option<&str> {
        self.inner.properties.kind().as_ref().map(|s| s.as_str())
    }

    /// The `message_id` property.
    pub fn message_id(&self) -> Option<&str> {
        self.inner
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str())
    }

    /// The `timestamp` property (seconds since the epoch), when set.
    pub fn timestamp(&self) -> Option<u64> {
        *self.inner.properties.timestamp()
    }

    /// Whether the broker delivered this message before (to this or another consumer).
    pub fn redelivered(&self) -> bool {
        self.inner.redelivered
    }

    /// How often a quorum queue delivered the message before (`x-delivery-count`); absent on the first
    /// delivery and on classic queues.
    pub fn delivery_count(&self) -> Option<u64> {
        properties::delivery_count(&self.inner.properties)
    }

    /// The W3C trace context of the message, when it has one.
    pub fn traceparent(&self) -> Option<String> {
        properties::traceparent(&self.inner.properties)
    }

    /// The properties that arrived with bytes that are not UTF-8 (rewritten by the connection's sanitizer,
    /// see [`super::sanitize`]); `None` when the message arrived as sent. A consumer must not act on such
    /// a message: dead-letter it with [`properties::invalid_properties_reason`].
    pub fn invalid_properties(&self) -> Option<Vec<String>> {
        properties::invalid_properties(&self.inner.properties)
    }

    /// A header as text, when it is a string.
    pub fn header_str(&self, name: &str) -> Option<String> {
        properties::header_str(&self.inner.properties, name)
    }

    /// A header as it arrived.
    pub fn header(&self, name: &str) -> Option<&AMQPValue> {
        properties::header(&self.inner.properties, name)
    }

    /// The body decoded as `M` by the `content_type` property (JSON when absent). An error here means the
    /// message can never succeed: dead-letter it with reason `undecodable`.
    pub fn decode<M: Contract>(&self) -> Result<M, DecodeError> {
        let format = self
            .content_type()
            .map(Format::from_content_type)
            .transpose()?
            .unwrap_or(Format::Json);
        crate::messages::decode(format, self.body())
    }

    /// Acknowledges: the message is done and leaves the queue.
    pub async fn ack(mut self) -> Result<(), AckError> {
        self.settled = true;
        settle(self.inner.acker.ack(BasicAckOptions::default()).await)
    }

    /// Returns the message to its queue, for another try (here or on another runner). On a quorum queue this
    /// counts towards the delivery limit.
    pub async fn nack_requeue(mut self) -> Result<(), AckError> {
        self.settled = true;
        settle(
            self.inner
                .acker
                .nack(BasicNackOptions {
                    requeue: true,
                    multiple: false,
                })
                .await,
        )
    }

    /// Moves the message to the dead-letter queue with the reason in its headers: publishes a copy (same
    /// body and properties, plus `x-volcano-runner-*` headers) to the dead-letter exchange with the original
    /// routing key, waits for the confirm, then acks the original. If the copy is not confirmed, the
    /// original is returned to its queue instead, so the message is never lost.
    pub async fn dead_letter(mut self, reason: &DeadLetterReason) -> Result<(), DeadLetterError> {
        self.settled = true;
        let exchange = self.publisher.dead_letter_exchange().to_owned();
        let properties = self
            .inner
            .properties
            .clone()
            .with_headers(self.dead_letter_headers(reason, jiff::Timestamp::now()))
            .with_delivery_mode(2);
        let published = self
            .publisher
            .publish_raw(
                &exchange,
                self.inner.routing_key.as_str(),
                &self.inner.data,
                properties,
                true,
            )
            .await;
        if let Err(source) = published {
            let requeued = self
                .inner
                .acker
                .nack(BasicNackOptions {
                    requeue: true,
                    multiple: false,
                })
                .await
                .unwrap_or(false);
            return Err(DeadLetterError::Publish { source, requeued });
        }
        settle(self.inner.acker.ack(BasicAckOptions::default()).await).map_err(DeadLetterError::Ack)
    }

    /// The original headers (within [`DEAD_LETTER_HEADERS_MAX`]) plus the reason, the origin and the delivery
    /// count.
    fn dead_letter_headers(&self, reason: &DeadLetterReason, now: jiff::Timestamp) -> FieldTable {
        let (mut table, dropped) =
            within_budget(self.inner.properties.headers().clone().unwrap_or_default());
        if !dropped.is_empty() {
            table.insert(
                ShortString::from(headers::DROPPED_HEADERS),
                AMQPValue::LongString(dropped.as_str().into()),
            );
        }
        let mut text = |key: &str, value: &str| {
            table.insert(ShortString::from(key), AMQPValue::LongString(value.into()));
        };
        text(headers::REASON, &reason.code);
        text(headers::ERROR, &reason.message);
        if let Some(field) = &reason.field {
            text(headers::FIELD, field);
        }
        text(headers::ORIGINAL_EXCHANGE, self.inner.exchange.as_str());
        text(
            headers::ORIGINAL_ROUTING_KEY,
            self.inner.routing_key.as_str(),
        );
        text(headers::ORIGINAL_QUEUE, &self.queue);
        text(headers::DEAD_LETTERED_AT, &now.to_string());
        let count = self
            .delivery_count()
            .unwrap_or(u64::from(self.inner.redelivered));
        table.insert(
            ShortString::from(headers::DELIVERY_COUNT),
            AMQPValue::LongLongInt(i64::try_from(count).unwrap_or(i64::MAX)),
        );
        table
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if !self.settled {
            warn!(
                queue = %self.queue,
                message_id = self.message_id().unwrap_or(""),
                "A delivery was dropped unsettled; it returns to the queue when its channel closes."
            );
        }
    }
}

/// The most of a message's own headers (encoded) that its dead-letter copy carries. The copy's properties
/// travel in one frame, with the reason headers added: a copy of a message whose headers nearly fill a
/// frame would be refused by the broker, which closes the connection for it, and the message would never
/// leave its queue. Real headers (`traceparent`, `x-death`, a publisher's own) are far smaller; the largest
/// are left out first and named in [`headers::DROPPED_HEADERS`].
pub const DEAD_LETTER_HEADERS_MAX: usize = 16 * 1024;

/// `table` without its largest headers until the rest encode to at most [`DEAD_LETTER_HEADERS_MAX`] bytes,
/// and what was left out (`name (N bytes)`, largest first; empty when nothing was).
pub fn within_budget(table: FieldTable) -> (FieldTable, String) {
    let mut sizes: Vec<(usize, String)> = table
        .inner()
        .iter()
        .map(|(name, value)| {
            (
                1 + name.as_str().len() + encoded_len(value),
                name.to_string(),
            )
        })
        .collect();
    let mut total: usize = sizes.iter().map(|(size, _)| size).sum();
    if total <= DEAD_LETTER_HEADERS_MAX {
        return (table, String::new());
    }
    sizes.sort_by(|a, b| b.cmp(a));
    let mut kept = table.inner().clone();
    let mut dropped = Vec::new();
    for (size, name) in sizes {
        if total <= DEAD_LETTER_HEADERS_MAX {
            break;
        }
        kept.remove(name.as_str());
        total -= size;
        let shown: String = name.chars().take(64).collect();
        dropped.push(format!("{shown} ({size} bytes)"));
    }
    let mut text = String::new();
    for (i, d) in dropped.iter().enumerate() {
        if i == 20 {
            text.push_str(&format!(", and {} more", dropped.len() - 20));
            break;
        }
        if i > 0 {
            text.push_str(", ");
        }
        text.push_str(d);
    }
    (FieldTable::from(kept), text)
}

/// The bytes `value` takes in an AMQP field table (its type tag included), as RabbitMQ's encoding counts
/// them; nested tables and arrays are counted whole.
pub fn encoded_len(value: &AMQPValue) -> usize {
    1 + match value {
        AMQPValue::Boolean(_) | AMQPValue::ShortShortInt(_) | AMQPValue::ShortShortUInt(_) => 1,
        AMQPValue::ShortInt(_) | AMQPValue::ShortUInt(_) => 2,
        AMQPValue::LongInt(_) | AMQPValue::LongUInt(_) | AMQPValue::Float(_) => 4,
        AMQPValue::LongLongInt(_) | AMQPValue::Double(_) | AMQPValue::Timestamp(_) => 8,
        AMQPValue::DecimalValue(_) => 5,
        AMQPValue::ShortString(s) => 1 + s.as_str().len(),
        AMQPValue::LongString(s) => 4 + s.as_bytes().len(),
        AMQPValue::ByteArray(b) => 4 + b.as_slice().len(),
        AMQPValue::FieldArray(a) => 4 + a.as_slice().iter().map(encoded_len).sum::<usize>(),
        AMQPValue::FieldTable(t) => {
            4 + t
                .inner()
                .iter()
                .map(|(k, v)| 1 + k.as_str().len() + encoded_len(v))
                .sum::<usize>()
        }
        AMQPValue::Void => 0,
    }
}

fn settle(result: Result<bool, lapin::Error>) -> Result<(), AckError> {
    match result {
        Ok(true) => Ok(()),
        Ok(false) => Err(AckError::ChannelClosed),
        Err(e) => match e.kind() {
            lapin::ErrorKind::InvalidChannelState(..)
            | lapin::ErrorKind::InvalidConnectionState(_) => Err(AckError::ChannelClosed),
            _ => Err(AckError::Amqp(e.to_string())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_copy_leaves_out_the_largest_headers_beyond_its_budget() {
        let mut table = FieldTable::default();
        table.insert("traceparent".into(), AMQPValue::LongString("00-ab".into()));
        table.insert(
            "huge".into(),
            AMQPValue::LongString("x".repeat(40_000).into()),
        );
        table.insert(
            "large".into(),
            AMQPValue::LongString("y".repeat(10_000).into()),
        );
        let (kept, dropped) = within_budget(table.clone());
        // Dropping the largest alone brings the rest within the budget: the others stay.
        assert!(kept.inner().get("huge").is_none());
        assert!(kept.inner().contains_key("large"));
        assert!(kept.inner().contains_key("traceparent"));
        assert_eq!(dropped, "huge (40010 bytes)");

        // Small headers are copied as they are.
        let mut small = FieldTable::default();
        small.insert("traceparent".into(), AMQPValue::LongString("00-ab".into()));
        let (kept, dropped) = within_budget(small.clone());
        assert_eq!(kept, small);
        assert!(dropped.is_empty());

        // A nested table counts whole.
        let mut nested = FieldTable::default();
        nested.insert(
            "inner".into(),
            AMQPValue::LongString("z".repeat(20_000).into()),
        );
        let mut outer = FieldTable::default();
        outer.insert("x-death".into(), AMQPValue::FieldTable(nested));
        let (kept, dropped) = within_budget(outer);
        assert!(kept.inner().is_empty());
        assert!(dropped.starts_with("x-death ("), "{dropped}");
    }

    #[test]
    fn a_closed_channel_is_reported_as_redelivery_to_come() {
        assert!(matches!(settle(Ok(false)), Err(AckError::ChannelClosed)));
        assert!(settle(Ok(true)).is_ok());
    }
}
