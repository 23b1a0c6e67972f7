//! [`DeadLetterQueue`]: reading, requeueing and dropping dead letters over AMQP alone, for
//! `volcano-runner admin dead-letters` (no management plugin needed).
//!
//! AMQP 0.9.1 cannot browse a queue, so a look takes the messages one by one with `basic.get` and manual
//! acks, as many as the queue held when the look began. A message the command leaves alone is put back
//! as a copy at the tail (published to the queue itself, confirmed), and only then is the one taken
//! acked. A pass over the whole queue thus leaves it as it was, in its order, and never sees a message
//! twice (the copies are behind the last one it takes).
//!
//! Why not hand it back with `basic.nack(requeue)`: a quorum queue counts a returned message as
//! delivered once more (`x-delivery-count`), and RabbitMQ 4 gives every quorum queue a delivery limit
//! (20) after which the message is dropped: twenty looks would have lost the dead letters they looked
//! at. A copy is a new message, delivered zero times. Its headers are the original's, without the
//! broker's `x-delivery-count`, and with what `x-death` says also in the runner's own headers, so it
//! reads the same whatever a broker makes of an `x-death` it did not write itself. A command that dies
//! between the copy's confirm and the ack leaves that one message twice in the queue (runners drop
//! the duplicate of a requeued message by its id); one that dies before loses nothing (its channel
//! closes and the broker returns what it held).
//!
//! A requeued dead letter goes back where it came from (its original exchange and routing key) with its
//! original body, properties and `message_id`, without the dead-letter headers, with a publisher confirm;
//! only then is it acked from the dead-letter queue. Runners drop duplicates by job, so a requeue that is
//! confirmed but whose ack is lost (the message is then in both queues) does no harm.

use std::collections::BTreeMap;

use lapin::{
    BasicProperties, Channel,
    options::{BasicAckOptions, BasicGetOptions, BasicNackOptions, QueueDeclareOptions},
    types::{AMQPValue, FieldTable, ShortString},
};
use serde::Serialize;

use super::properties::{as_text, as_u64};
use super::{Broker, BrokerError, PublishError, headers};

/// The `x-death` reason RabbitMQ gives a message that hit its queue's delivery limit.
pub const DELIVERY_LIMIT: &str = "delivery_limit";

/// Header names a requeued message leaves behind: the runner's dead-letter headers (by prefix) and what
/// the broker recorded about the message's deaths and deliveries, so it starts over as it was published.
const PREFIXES_LEFT_BEHIND: [&str; 3] = ["x-volcano-runner-", "x-first-death-", "x-last-death-"];
const NAMES_LEFT_BEHIND: [&str; 2] = ["x-death", headers::DELIVERY_COUNT_QUORUM];

/// One dead letter as read from the queue: its identity, why it is there and where it came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetter {
    /// Its place in the queue when it was read, from 1 (the oldest).
    pub position: usize,
    pub message_id: Option<String>,
    /// The `type` property, e.g. `volcano_runner.v1.SubmitJob`.
    #[serde(rename = "type")]
    pub type_name: Option<String>,
    pub content_type: Option<String>,
    /// The reason code: the runner's (`x-volcano-runner-reason`), else the broker's (`x-death`, e.g.
    /// `delivery_limit`).
    pub reason: Option<String>,
    /// What is wrong, for a person (`x-volcano-runner-error`).
    pub error: Option<String>,
    /// The field the problem is about (`x-volcano-runner-field`).
    pub field: Option<String>,
    /// Where it was published: the runner's header, else the broker's `x-death`.
    pub original_exchange: Option<String>,
    pub original_routing_key: Option<String>,
    /// The queue it was consumed from (or died in).
    pub original_queue: Option<String>,
    /// How often it had been delivered before it was dead-lettered (the runner's header).
    pub delivery_count: Option<u64>,
    /// When the runner dead-lettered it (RFC 3339), else when the broker did (`x-death` time).
    pub dead_lettered_at: Option<String>,
    /// The message's own headers its dead-letter copy left out for size (`x-volcano-runner-dropped-headers`):
    /// a requeued copy goes without them.
    pub dropped_headers: Option<String>,
    /// The broker's record of the latest death (`x-death`), for messages RabbitMQ dead-lettered itself.
    pub death: Option<Death>,
    /// Every header as text, by name (the ones above included).
    pub headers: BTreeMap<String, String>,
    /// The body as it was published.
    #[serde(skip)]
    pub body: Vec<u8>,
    /// The properties as they arrived, to publish a requeued copy with.
    #[serde(skip)]
    properties: BasicProperties,
}

/// One entry of RabbitMQ's `x-death` header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Death {
    /// `delivery_limit`, `rejected`, `expired` or `maxlen`.
    pub reason: String,
    pub queue: String,
    pub exchange: String,
    pub routing_keys: Vec<String>,
    /// How often the message died this way in this queue.
    pub count: u64,
    /// When (RFC 3339).
    pub time: Option<String>,
}

impl DeadLetter {
    /// Reads what a dead letter says about itself. Pure, so that every header rule is tested without a
    /// broker.
    pub fn read(position: usize, properties: BasicProperties, body: Vec<u8>) -> Self {
        let table = properties.headers().clone().unwrap_or_default();
        let text = |name: &str| table.inner().get(name).and_then(as_text);
        let death = table.inner().get("x-death").and_then(latest_death);
        let reason = text(headers::REASON).or_else(|| death.as_ref().map(|d| d.reason.clone()));
        let original_exchange =
            text(headers::ORIGINAL_EXCHANGE).or_else(|| death.as_ref().map(|d| d.exchange.clone()));
        let original_routing_key = text(headers::ORIGINAL_ROUTING_KEY)
            .or_else(|| death.as_ref().and_then(|d| d.routing_keys.first().cloned()));
        let original_queue =
            text(headers::ORIGINAL_QUEUE).or_else(|| death.as_ref().map(|d| d.queue.clone()));
        let dead_lettered_at =
            text(headers::DEAD_LETTERED_AT).or_else(|| death.as_ref().and_then(|d| d.time.clone()));
        let delivery_count = table.inner().get(headers::DELIVERY_COUNT).and_then(as_u64);
        let shown = |s: &Option<ShortString>| s.as_ref().map(|s| s.as_str().to_owned());
        Self {
            position,
            message_id: shown(properties.message_id()),
            type_name: shown(properties.kind()),
            content_type: shown(properties.content_type()),
            reason,
            error: text(headers::ERROR),
            field: text(headers::FIELD),
            original_exchange,
            original_routing_key,
            original_queue,
            delivery_count,
            dead_lettered_at,
            dropped_headers: text(headers::DROPPED_HEADERS),
            death,
            headers: table
                .inner()
                .iter()
                .map(|(k, v)| (k.to_string(), value_text(v)))
                .collect(),
            body,
            properties,
        }
    }

    /// Where a requeue publishes it: its original exchange and routing key, when it says.
    pub fn origin(&self) -> Option<(&str, &str)> {
        Some((
            self.original_exchange.as_deref()?,
            self.original_routing_key.as_deref()?,
        ))
    }

    /// The properties of its requeued copy: the original ones without the dead-letter headers and the
    /// broker's death and delivery records, persistent.
    pub fn requeue_properties(&self) -> BasicProperties {
        let mut kept = FieldTable::default();
        if let Some(table) = self.properties.headers() {
            for (name, value) in table.inner() {
                let name = name.as_str();
                let left_behind = NAMES_LEFT_BEHIND.contains(&name)
                    || PREFIXES_LEFT_BEHIND.iter().any(|p| name.starts_with(p));
                if !left_behind {
                    kept.insert(ShortString::from(name), value.clone());
                }
            }
        }
        self.properties
            .clone()
            .with_delivery_mode(2)
            .with_headers(kept)
    }

    /// The properties of the copy that puts it back in the dead-letter queue: the original ones without
    /// the broker's delivery count, and with what the broker's `x-death` says in the runner's own
    /// headers where those are missing (the reading prefers them, and a requeue leaves them behind).
    pub fn put_back_properties(&self) -> BasicProperties {
        let mut table = FieldTable::default();
        if let Some(headers) = self.properties.headers() {
            for (name, value) in headers.inner() {
                if name.as_str() != headers::DELIVERY_COUNT_QUORUM {
                    table.insert(name.clone(), value.clone());
                }
            }
        }
        let mut fill = |name: &str, value: Option<&str>| {
            if let Some(value) = value.filter(|v| !v.is_empty())
                && !table.inner().contains_key(name)
            {
                table.insert(ShortString::from(name), AMQPValue::LongString(value.into()));
            }
        };
        fill(headers::REASON, self.reason.as_deref());
        fill(
            headers::ORIGINAL_EXCHANGE,
            self.original_exchange.as_deref(),
        );
        fill(
            headers::ORIGINAL_ROUTING_KEY,
            self.original_routing_key.as_deref(),
        );
        fill(headers::ORIGINAL_QUEUE, self.original_queue.as_deref());
        fill(headers::DEAD_LETTERED_AT, self.dead_lettered_at.as_deref());
        self.properties
            .clone()
            .with_delivery_mode(2)
            .with_headers(table)
    }
}

/// Which dead letters a command acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Those with one of these message ids (every copy: a message dead-lettered twice has two).
    Ids(Vec<String>),
    /// Those with this reason code (the runner's or the broker's, e.g. `delivery_limit`).
    Reason(String),
    All,
}

impl Selection {
    pub fn matches(&self, letter: &DeadLetter) -> bool {
        match self {
            Self::Ids(ids) => letter
                .message_id
                .as_ref()
                .is_some_and(|id| ids.contains(id)),
            Self::Reason(reason) => letter.reason.as_deref() == Some(reason.as_str()),
            Self::All => true,
        }
    }
}

/// What to do with the selected dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Republish to the original exchange and routing key, then ack from the dead-letter queue.
    Requeue,
    /// Ack from the dead-letter queue: the message is gone.
    Drop,
}

/// What became of one selected dead letter.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settled {
    pub position: usize,
    pub message_id: Option<String>,
    pub reason: Option<String>,
    /// `requeued`, `dropped`, or `kept` when it failed (it is still in the dead-letter queue).
    pub outcome: &'static str,
    /// Where it was requeued to, `exchange/routing key`.
    pub to: Option<String>,
    /// Why it was kept.
    pub error: Option<String>,
}

/// What a look at the queue found.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Listing {
    pub queue: String,
    /// Messages in the queue when the look began.
    pub total: u32,
    /// Those that matched the filter, oldest first, at most the limit.
    pub letters: Vec<DeadLetter>,
    /// How many more matched beyond the limit.
    pub more: usize,
}

/// Why the dead-letter queue could not be read or settled.
#[derive(Debug, thiserror::Error)]
pub enum DeadLetterQueueError {
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The queue does not exist in the vhost: no runner has declared the topology there.
    #[error(
        "dead-letter queue `{queue}` does not exist in this vhost: no runner has declared the topology \
         here (a runner declares it when it starts; with broker.passive, import \
         deploy/rabbitmq/definitions.json)"
    )]
    Missing { queue: String },
    /// An AMQP operation on the queue failed (the channel was closed, ...).
    #[error("dead-letter queue `{queue}`: {what} failed: {message}")]
    Amqp {
        queue: String,
        what: &'static str,
        message: String,
    },
}

/// The dead-letter queue (`broker.dead_letter_queue`) of a broker connection.
pub struct DeadLetterQueue {
    broker: Broker,
}

impl DeadLetterQueue {
    pub fn new(broker: Broker) -> Self {
        Self { broker }
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.broker.config().dead_letter_queue
    }

    /// The dead letters that `filter` accepts (all without one), oldest first, at most `limit`. Every
    /// message goes back to the queue unchanged.
    pub async fn list(
        &self,
        filter: Option<&Selection>,
        limit: usize,
    ) -> Result<Listing, DeadLetterQueueError> {
        let mut scan = Scan::open(self).await?;
        let total = scan.depth;
        let mut letters = Vec::new();
        let mut more = 0;
        let result = async {
            while let Some((tag, letter)) = scan.next().await? {
                scan.put_back(tag, &letter).await?;
                if filter.is_none_or(|f| f.matches(&letter)) {
                    if letters.len() < limit {
                        letters.push(letter);
                    } else {
                        more += 1;
                    }
                }
            }
            Ok::<(), DeadLetterQueueError>(())
        }
        .await;
        scan.finish().await;
        result?;
        Ok(Listing {
            queue: self.name().to_owned(),
            total,
            letters,
            more,
        })
    }

    /// Requeues or drops every dead letter `selection` accepts; the others go back to the queue
    /// unchanged, in their order. A requeue that fails (nowhere to send it, no confirm) leaves the
    /// message in the dead-letter queue and says why.
    pub async fn settle(
        &self,
        selection: &Selection,
        action: Action,
    ) -> Result<Vec<Settled>, DeadLetterQueueError> {
        let publisher = self.broker.publisher();
        let mut scan = Scan::open(self).await?;
        let mut settled = Vec::new();
        let result = async {
            while let Some((tag, letter)) = scan.next().await? {
                if !selection.matches(&letter) {
                    scan.put_back(tag, &letter).await?;
                    continue;
                }
                let mut outcome = Settled {
                    position: letter.position,
                    message_id: letter.message_id.clone(),
                    reason: letter.reason.clone(),
                    outcome: "kept",
                    to: None,
                    error: None,
                };
                match action {
                    Action::Drop => match scan.ack(tag).await {
                        Ok(()) => outcome.outcome = "dropped",
                        Err(e) => outcome.error = Some(e),
                    },
                    Action::Requeue => match requeue(&publisher, &letter).await {
                        Err(e) => {
                            outcome.error = Some(e);
                            scan.put_back(tag, &letter).await?;
                        }
                        Ok(to) => {
                            outcome.to = Some(to);
                            match scan.ack(tag).await {
                                Ok(()) => outcome.outcome = "requeued",
                                Err(e) => {
                                    outcome.error = Some(format!(
                                        "requeued, but its ack failed, so it is in the dead-letter \
                                         queue too (runners drop the duplicate): {e}"
                                    ));
                                }
                            }
                        }
                    },
                }
                settled.push(outcome);
            }
            Ok::<(), DeadLetterQueueError>(())
        }
        .await;
        scan.finish().await;
        result?;
        Ok(settled)
    }
}

/// Publishes a requeued copy where the dead letter came from, mandatory and confirmed; the destination
/// as `exchange/routing key`, or why not.
async fn requeue(publisher: &super::Publisher, letter: &DeadLetter) -> Result<String, String> {
    let Some((exchange, routing_key)) = letter.origin() else {
        return Err(format!(
            "it does not say where it was published (no {} and {} headers, no x-death): publish its \
             body yourself",
            headers::ORIGINAL_EXCHANGE,
            headers::ORIGINAL_ROUTING_KEY
        ));
    };
    publisher
        .publish_raw(
            exchange,
            routing_key,
            &letter.body,
            letter.requeue_properties(),
            true,
        )
        .await
        .map_err(|e: PublishError| e.to_string())?;
    Ok(format!("{exchange}/{routing_key}"))
}

/// One pass over the queue: every message taken with `basic.get`, then acked (settled) or put back as
/// a copy at the tail ([`Scan::put_back`]) before the next is taken.
struct Scan {
    channel: Channel,
    queue: String,
    /// Messages ready when the pass began: it stops there, never chasing what arrives meanwhile (nor its
    /// own copies).
    depth: u32,
    taken: u32,
    /// Publishes the copies that put messages back, with confirms.
    publisher: super::Publisher,
}

impl Scan {
    async fn open(queue: &DeadLetterQueue) -> Result<Self, DeadLetterQueueError> {
        let name = queue.name().to_owned();
        let amqp = |what: &'static str, e: lapin::Error| DeadLetterQueueError::Amqp {
            queue: name.clone(),
            what,
            message: e.to_string(),
        };
        let (_, channel) = queue.broker.channel().await?;
        let declared = channel
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await;
        let declared = match declared {
            Ok(declared) => declared,
            Err(e) if super::topology::is_not_found(&e) => {
                return Err(DeadLetterQueueError::Missing { queue: name });
            }
            Err(e) => return Err(amqp("a passive declare", e)),
        };
        Ok(Self {
            channel,
            queue: name.clone(),
            depth: declared.message_count(),
            taken: 0,
            publisher: queue.broker.publisher(),
        })
    }

    /// The next message and its delivery tag, held; `None` at the end of the pass.
    async fn next(&mut self) -> Result<Option<(u64, DeadLetter)>, DeadLetterQueueError> {
        if self.taken >= self.depth {
            return Ok(None);
        }
        let got = self
            .channel
            .basic_get(
                self.queue.as_str().into(),
                BasicGetOptions { no_ack: false },
            )
            .await
            .map_err(|e| DeadLetterQueueError::Amqp {
                queue: self.queue.clone(),
                what: "basic.get",
                message: e.to_string(),
            })?;
        let Some(got) = got else {
            return Ok(None);
        };
        self.taken += 1;
        let delivery = got.delivery;
        let tag = delivery.delivery_tag;
        let letter = DeadLetter::read(self.taken as usize, delivery.properties, delivery.data);
        Ok(Some((tag, letter)))
    }

    /// Acks one message: it leaves the queue.
    async fn ack(&self, tag: u64) -> Result<(), String> {
        self.channel
            .basic_ack(tag, BasicAckOptions { multiple: false })
            .await
            .map_err(|e| e.to_string())
    }

    /// Puts a message the command leaves alone back, delivered zero times: a copy published to the
    /// queue and confirmed, then the one taken acked. When the copy cannot be published, the message
    /// is handed back as it is (`nack`, requeue: it counts one more delivery, but nothing is lost) and
    /// the pass ends with the error.
    async fn put_back(&self, tag: u64, letter: &DeadLetter) -> Result<(), DeadLetterQueueError> {
        let published = self
            .publisher
            .publish_raw(
                "",
                &self.queue,
                &letter.body,
                letter.put_back_properties(),
                true,
            )
            .await;
        let failed = |what: &'static str, message: String| DeadLetterQueueError::Amqp {
            queue: self.queue.clone(),
            what,
            message,
        };
        if let Err(e) = published {
            let _ = self
                .channel
                .basic_nack(
                    tag,
                    BasicNackOptions {
                        multiple: false,
                        requeue: true,
                    },
                )
                .await;
            return Err(failed("putting a message back", e.to_string()));
        }
        self.ack(tag)
            .await
            .map_err(|e| failed("the ack of a message put back", e))
    }

    /// Closes the channel: a message still taken (after an error) goes back to the queue.
    async fn finish(self) {
        let _ = self.channel.close(200, "dead letters read".into()).await;
    }
}

/// The latest entry of an `x-death` header (RabbitMQ puts the most recent first).
fn latest_death(value: &AMQPValue) -> Option<Death> {
    let AMQPValue::FieldArray(entries) = value else {
        return None;
    };
    let AMQPValue::FieldTable(entry) = entries.as_slice().first()? else {
        return None;
    };
    let field = |name: &str| entry.inner().get(name);
    let text = |name: &str| field(name).and_then(as_text).unwrap_or_default();
    let routing_keys = match field("routing-keys") {
        Some(AMQPValue::FieldArray(keys)) => keys.as_slice().iter().filter_map(as_text).collect(),
        _ => Vec::new(),
    };
    Some(Death {
        reason: text("reason"),
        queue: text("queue"),
        exchange: text("exchange"),
        routing_keys,
        count: field("count").and_then(as_u64).unwrap_or(0),
        time: field("time").map(value_text),
    })
}

/// A header value as text for a person: strings as they are, numbers, AMQP timestamps as RFC 3339,
/// arrays and tables spelled out.
pub fn value_text(value: &AMQPValue) -> String {
    match value {
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(v) => v.to_string(),
        AMQPValue::ShortShortUInt(v) => v.to_string(),
        AMQPValue::ShortInt(v) => v.to_string(),
        AMQPValue::ShortUInt(v) => v.to_string(),
        AMQPValue::LongInt(v) => v.to_string(),
        AMQPValue::LongUInt(v) => v.to_string(),
        AMQPValue::LongLongInt(v) => v.to_string(),
        AMQPValue::Float(v) => v.to_string(),
        AMQPValue::Double(v) => v.to_string(),
        AMQPValue::DecimalValue(d) => format!("{}e-{}", d.value, d.scale),
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::Timestamp(t) => i64::try_from(*t)
            .ok()
            .and_then(|s| jiff::Timestamp::from_second(s).ok())
            .map_or_else(|| t.to_string(), |t| t.to_string()),
        AMQPValue::ByteArray(b) => format!("({} bytes)", b.as_slice().len()),
        AMQPValue::FieldArray(a) => format!(
            "[{}]",
            a.as_slice()
                .iter()
                .map(value_text)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        AMQPValue::FieldTable(t) => format!(
            "{{{}}}",
            t.inner()
                .iter()
                .map(|(k, v)| format!("{k}: {}", value_text(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        AMQPValue::Void => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in entries {
            t.insert((*k).into(), v.clone());
        }
        t
    }

    fn text(s: &str) -> AMQPValue {
        AMQPValue::LongString(s.into())
    }

    fn runner_copy() -> DeadLetter {
        let headers = table(&[
            ("traceparent", text("00-ab")),
            (headers::REASON, text("invalid_field")),
            (headers::ERROR, text("replicas: must be at least 1")),
            (headers::FIELD, text("replicas")),
            (headers::ORIGINAL_EXCHANGE, text("compute.jobs")),
            (headers::ORIGINAL_ROUTING_KEY, text("submit")),
            (headers::ORIGINAL_QUEUE, text("compute.jobs.submit")),
            (headers::DELIVERY_COUNT, AMQPValue::LongLongInt(2)),
            (headers::DEAD_LETTERED_AT, text("2026-01-01T00:00:00Z")),
            (headers::DELIVERY_COUNT_QUORUM, AMQPValue::LongLongInt(1)),
        ]);
        let properties = BasicProperties::default()
            .with_message_id("submit/1".into())
            .with_type("volcano_runner.v1.SubmitJob".into())
            .with_headers(headers);
        DeadLetter::read(1, properties, b"{}".to_vec())
    }

    fn broker_copy() -> DeadLetter {
        let death = table(&[
            ("count", AMQPValue::LongLongInt(1)),
            ("reason", text("delivery_limit")),
            ("queue", text("compute.jobs.control")),
            ("time", AMQPValue::Timestamp(1_767_225_600)),
            ("exchange", text("compute.jobs")),
            (
                "routing-keys",
                AMQPValue::FieldArray(vec![text("cancel")].into()),
            ),
        ]);
        let headers = table(&[
            (
                "x-death",
                AMQPValue::FieldArray(vec![AMQPValue::FieldTable(death)].into()),
            ),
            ("x-first-death-reason", text("delivery_limit")),
            ("x-last-death-queue", text("compute.jobs.control")),
        ]);
        let properties = BasicProperties::default()
            .with_message_id("cancel/9".into())
            .with_headers(headers);
        DeadLetter::read(2, properties, Vec::new())
    }

    #[test]
    fn a_runners_copy_says_why_and_where_from() {
        let letter = runner_copy();
        assert_eq!(letter.reason.as_deref(), Some("invalid_field"));
        assert_eq!(letter.field.as_deref(), Some("replicas"));
        assert_eq!(letter.delivery_count, Some(2));
        assert_eq!(letter.origin(), Some(("compute.jobs", "submit")));
        assert_eq!(
            letter.original_queue.as_deref(),
            Some("compute.jobs.submit")
        );
        assert_eq!(letter.death, None);
    }

    #[test]
    fn a_brokers_copy_is_read_from_x_death() {
        let letter = broker_copy();
        assert_eq!(letter.reason.as_deref(), Some(DELIVERY_LIMIT));
        assert_eq!(letter.origin(), Some(("compute.jobs", "cancel")));
        assert_eq!(
            letter.original_queue.as_deref(),
            Some("compute.jobs.control")
        );
        assert_eq!(
            letter.dead_lettered_at.as_deref(),
            Some("2026-01-01T00:00:00Z")
        );
        assert_eq!(letter.death.as_ref().map(|d| d.count), Some(1));
        assert!(letter.headers["x-death"].contains("delivery_limit"));
    }

    #[test]
    fn a_requeued_copy_leaves_the_dead_letter_headers_behind() {
        for letter in [runner_copy(), broker_copy()] {
            let properties = letter.requeue_properties();
            let kept: Vec<String> = properties
                .headers()
                .as_ref()
                .unwrap()
                .inner()
                .keys()
                .map(|k| k.to_string())
                .collect();
            let expected: Vec<&str> = if letter.death.is_none() {
                vec!["traceparent"]
            } else {
                vec![]
            };
            assert_eq!(kept, expected);
            assert_eq!(properties.message_id(), letter.properties.message_id());
            assert_eq!(*properties.delivery_mode(), Some(2));
        }
    }

    #[test]
    fn selections_match_by_id_reason_or_all() {
        let (runner, broker) = (runner_copy(), broker_copy());
        let ids = Selection::Ids(vec!["cancel/9".into()]);
        assert!(!ids.matches(&runner) && ids.matches(&broker));
        let reason = Selection::Reason("invalid_field".into());
        assert!(reason.matches(&runner) && !reason.matches(&broker));
        assert!(Selection::Reason(DELIVERY_LIMIT.into()).matches(&broker));
        assert!(Selection::All.matches(&runner) && Selection::All.matches(&broker));
    }
}
