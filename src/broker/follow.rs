//! [`EventsFollower`]: what `volcano-runner events` reads. A temporary queue (server-named, exclusive,
//! auto-delete) bound to the events exchange with `#` and to the proxy exchange, yielding each message
//! decoded by its `type` and `content_type`.
//!
//! It sees what is published while it is bound. After a reconnect it binds a new queue, so events published
//! while the connection was down are not seen: it is a window for people, not a durable subscriber.

use super::consumer::Source;
use super::{Broker, BrokerError, Delivery, QueueConsumer};
use crate::messages::v1::{AccountingTick, JobEvent, ProxyEvent};
use crate::messages::{AnyMessage, Contract, DecodeError, Format, MessageType, decode_any};

/// How many events may be in flight to the follower; it acks each at once.
const FOLLOW_PREFETCH: u16 = 256;

/// A message the runners publish, decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum OutboundEvent {
    Job(JobEvent),
    Accounting(AccountingTick),
    Proxy(ProxyEvent),
}

impl OutboundEvent {
    /// The job the event is about.
    pub fn job_id(&self) -> &str {
        match self {
            Self::Job(e) => &e.job_id,
            Self::Accounting(t) => &t.job_id,
            Self::Proxy(p) => &p.job_id,
        }
    }

    /// The message type name, e.g. `volcano_runner.v1.JobEvent`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Job(_) => JobEvent::TYPE.amqp_type(),
            Self::Accounting(_) => AccountingTick::TYPE.amqp_type(),
            Self::Proxy(_) => ProxyEvent::TYPE.amqp_type(),
        }
    }

    /// Decodes a body by its `type` and `content_type` properties.
    pub fn decode(
        type_name: Option<&str>,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Result<Self, DecodeError> {
        let type_name = type_name.ok_or(DecodeError::MissingType)?;
        let message_type = MessageType::from_amqp_type(type_name)
            .ok_or_else(|| DecodeError::UnknownType(type_name.to_owned()))?;
        let format = content_type
            .map(Format::from_content_type)
            .transpose()?
            // A message without a content type is read as JSON, the readable default.
            .unwrap_or(Format::Json);
        match decode_any(message_type, format, body)? {
            AnyMessage::JobEvent(e) => Ok(Self::Job(e)),
            AnyMessage::AccountingTick(t) => Ok(Self::Accounting(t)),
            AnyMessage::ProxyEvent(p) => Ok(Self::Proxy(p)),
            // Inbound messages are never published to the events exchanges.
            other => Err(DecodeError::UnknownType(
                other.message_type().amqp_type().to_owned(),
            )),
        }
    }
}

/// One message seen by the follower.
#[derive(Debug, Clone, PartialEq)]
pub struct FollowedEvent {
    /// The exchange it was published to.
    pub exchange: String,
    /// Its routing key (`job.lifecycle`, `job.accounting`, or empty for the proxy fanout).
    pub routing_key: String,
    /// Its `message_id`, the deterministic id consumers deduplicate by.
    pub message_id: Option<String>,
    /// The decoded message, or why it could not be decoded (shown, not fatal).
    pub event: Result<OutboundEvent, DecodeError>,
}

impl FollowedEvent {
    fn from_delivery(d: &Delivery) -> Self {
        Self {
            exchange: d.exchange().to_owned(),
            routing_key: d.routing_key().to_owned(),
            message_id: d.message_id().map(str::to_owned),
            event: OutboundEvent::decode(d.type_name(), d.content_type(), d.body()),
        }
    }
}

/// A live view of the events and proxy exchanges.
#[derive(Debug)]
pub struct EventsFollower {
    consumer: QueueConsumer,
    /// The acks of deliveries already returned, each on a task of its own (see [`Self::next`]); reaped as
    /// they finish and awaited by [`Self::close`].
    acks: tokio::task::JoinSet<()>,
}

impl EventsFollower {
    /// Binds the temporary queue; events published from the moment this returns are seen.
    pub(crate) async fn start(broker: Broker) -> Result<Self, BrokerError> {
        let c = broker.config();
        let bindings = vec![
            (c.events_exchange.clone(), "#".to_owned()),
            (c.proxy_exchange.clone(), String::new()),
        ];
        let consumer = QueueConsumer::start_source(
            broker,
            Source::Temporary(bindings),
            FOLLOW_PREFETCH,
            "events",
        )
        .await?;
        Ok(Self {
            consumer,
            acks: tokio::task::JoinSet::new(),
        })
    }

    /// The next event; `None` after shutdown.
    ///
    /// Cancel-safe: callers wait for it under a timeout (`events --idle`, the tests' quiet periods), and a
    /// timeout that ends the wait loses nothing. Once a delivery is taken nothing more is awaited here:
    /// its ack goes out on a task of its own. Awaiting the ack here let a timeout firing during that
    /// round trip drop an event that had been received and decoded, which a loaded machine made
    /// happen (a SUCCESS or a final tick never seen although the runner had it confirmed).
    pub async fn next(&mut self) -> Option<FollowedEvent> {
        let delivery = self.consumer.recv().await?;
        let event = FollowedEvent::from_delivery(&delivery);
        while self.acks.try_join_next().is_some() {}
        // Nothing to redo for a viewer: a failed ack only means the queue is gone with its channel.
        self.acks.spawn(async move {
            let _ = delivery.ack().await;
        });
        Some(event)
    }

    /// The temporary queue's name, while bound.
    pub fn queue(&self) -> Option<&str> {
        self.consumer.queue()
    }

    /// Unbinds (the queue is deleted with its channel).
    pub async fn close(mut self) {
        while self.acks.join_next().await.is_some() {}
        self.consumer.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::v1::JobState;

    #[test]
    fn decodes_each_event_type_in_both_encodings() {
        let event = JobEvent {
            event_id: "7/QUEUED".into(),
            job_id: "7".into(),
            state: JobState::Queued as i32,
            ..JobEvent::default()
        };
        for ct in Format::ALL {
            let body = crate::messages::encode(ct, &event).unwrap();
            let decoded = OutboundEvent::decode(
                Some(MessageType::JobEvent.amqp_type()),
                Some(ct.content_type()),
                &body,
            )
            .unwrap();
            assert_eq!(decoded, OutboundEvent::Job(event.clone()));
            assert_eq!(decoded.job_id(), "7");
        }
        let tick = AccountingTick {
            tick_id: "7/0".into(),
            job_id: "7".into(),
            ..AccountingTick::default()
        };
        let decoded = OutboundEvent::decode(
            Some(MessageType::AccountingTick.amqp_type()),
            None,
            &crate::messages::encode(Format::Json, &tick).unwrap(),
        )
        .unwrap();
        assert_eq!(decoded, OutboundEvent::Accounting(tick));
    }

    #[test]
    fn unknown_and_missing_types_are_errors() {
        assert_eq!(
            OutboundEvent::decode(Some("x.Y"), None, b"{}"),
            Err(DecodeError::UnknownType("x.Y".into()))
        );
        assert_eq!(
            OutboundEvent::decode(None, None, b"{}"),
            Err(DecodeError::MissingType)
        );
        assert_eq!(
            OutboundEvent::decode(
                Some(MessageType::JobEvent.amqp_type()),
                Some("text/plain"),
                b"{}"
            ),
            Err(DecodeError::UnsupportedContentType("text/plain".into()))
        );
    }
}
