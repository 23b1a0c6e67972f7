//! A message ready to publish: where it goes, its body, and the properties every message carries.
//!
//! Building one is pure; [`super::Publisher`] sends it. The constructors put each message type on its
//! exchange with its routing key, `type` and deterministic `message_id`, so callers cannot get them wrong.

use std::collections::BTreeMap;

use lapin::{
    BasicProperties,
    types::{AMQPValue, FieldTable, ShortString},
};

use super::{BrokerConfig, headers};
use crate::messages::v1::{AccountingTick, CancelJob, ExtendJob, JobEvent, ProxyEvent, SubmitJob};
use crate::messages::{Contract, Format};

/// A message with its destination and properties.
#[derive(Debug, Clone, PartialEq)]
pub struct Outbound {
    /// The exchange to publish to.
    pub exchange: String,
    /// The routing key (ignored by fanout exchanges).
    pub routing_key: String,
    /// The encoded body.
    pub body: Vec<u8>,
    /// How the body is encoded (its AMQP `content_type`).
    pub content_type: Format,
    /// The message type, e.g. `volcano_runner.v1.JobEvent`.
    pub type_name: String,
    /// The deterministic id consumers drop duplicates by.
    pub message_id: String,
    /// Extra headers (string values), e.g. `traceparent`.
    pub headers: BTreeMap<String, String>,
    /// When the message was made; the publisher fills in the current time when absent. AMQP keeps seconds.
    pub timestamp: Option<jiff::Timestamp>,
    /// Whether a message that no queue receives is an error (returned by the broker).
    pub mandatory: bool,
}

/// Why a message cannot be sent as built. Permanent: the same message will never pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutboundError {
    #[error("{field} is {len} bytes long; AMQP allows at most 255")]
    TooLong { field: &'static str, len: usize },
}

impl Outbound {
    /// A message of type `M` to `exchange` with `routing_key`; mandatory, no extra headers.
    ///
    /// JSON encoding fails only for values outside the contract (an enum number it does not name, a
    /// timestamp outside the years 0001-9999), which the outbound checks in [`crate::validate`] reject.
    /// Should it happen anyway, the message goes out as protobuf, which always encodes, and its
    /// `content_type` says so: a consumer can still read it, and nothing is lost.
    pub fn new<M: Contract>(
        message: &M,
        content_type: Format,
        exchange: &str,
        routing_key: &str,
        message_id: String,
    ) -> Self {
        let (content_type, body) = match crate::messages::encode(content_type, message) {
            Ok(body) => (content_type, body),
            Err(e) => {
                tracing::warn!(%message_id, error = %e, "A message does not encode as JSON; sending it as protobuf.");
                (Format::Protobuf, message.encode_to_vec())
            }
        };
        Self {
            exchange: exchange.to_owned(),
            routing_key: routing_key.to_owned(),
            body,
            content_type,
            type_name: M::TYPE.amqp_type().to_owned(),
            message_id,
            headers: BTreeMap::new(),
            timestamp: None,
            mandatory: true,
        }
    }

    /// A submission for the jobs exchange. Its id is `submit/<jobId>`.
    pub fn submit(job: &SubmitJob, content_type: Format, c: &BrokerConfig) -> Self {
        let id = format!("submit/{}", job.job_id);
        Self::new(
            job,
            content_type,
            &c.jobs_exchange,
            &c.submit_routing_key,
            id,
        )
    }

    /// A cancel for the jobs exchange. Its id is `cancel/<jobId>`: cancelling twice is the same request.
    pub fn cancel(cancel: &CancelJob, content_type: Format, c: &BrokerConfig) -> Self {
        let id = format!("cancel/{}", cancel.job_id);
        Self::new(
            cancel,
            content_type,
            &c.jobs_exchange,
            &c.cancel_routing_key,
            id,
        )
    }

    /// An extension for the jobs exchange. Its id is `extend/<jobId>/<requestId>`.
    pub fn extend(extend: &ExtendJob, content_type: Format, c: &BrokerConfig) -> Self {
        let id = format!("extend/{}/{}", extend.job_id, extend.request_id);
        Self::new(
            extend,
            content_type,
            &c.jobs_exchange,
            &c.extend_routing_key,
            id,
        )
    }

    /// A lifecycle event for the events exchange; its id is the event's `event_id`.
    pub fn job_event(event: &JobEvent, content_type: Format, c: &BrokerConfig) -> Self {
        let mut m = Self::new(
            event,
            content_type,
            &c.events_exchange,
            &c.lifecycle_routing_key,
            event.event_id.clone(),
        );
        m.mandatory = c.events_mandatory;
        m
    }

    /// An accounting tick for the events exchange; its id is the tick's `tick_id`.
    pub fn accounting(tick: &AccountingTick, content_type: Format, c: &BrokerConfig) -> Self {
        let mut m = Self::new(
            tick,
            content_type,
            &c.events_exchange,
            &c.accounting_routing_key,
            tick.tick_id.clone(),
        );
        m.mandatory = c.events_mandatory;
        m
    }

    /// A proxy event for the proxy (fanout) exchange; its id is the event's `event_id`.
    pub fn proxy(event: &ProxyEvent, content_type: Format, c: &BrokerConfig) -> Self {
        let mut m = Self::new(
            event,
            content_type,
            &c.proxy_exchange,
            "",
            event.event_id.clone(),
        );
        m.mandatory = c.events_mandatory;
        m
    }

    /// Carries the W3C trace context (`traceparent` header) from the work that caused this message.
    pub fn with_traceparent(mut self, traceparent: impl Into<String>) -> Self {
        self.headers
            .insert(headers::TRACEPARENT.to_owned(), traceparent.into());
        self
    }

    /// Adds a string header.
    pub fn with_header(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(key.into(), value.into());
        self
    }

    /// The AMQP properties: persistent, with id, content type, type, timestamp, app id and headers.
    pub(crate) fn properties(
        &self,
        app_id: &str,
        now: jiff::Timestamp,
    ) -> Result<BasicProperties, OutboundError> {
        let mut table = FieldTable::default();
        for (key, value) in &self.headers {
            table.insert(
                short("header name", key)?,
                AMQPValue::LongString(value.as_str().into()),
            );
        }
        let at = self.timestamp.unwrap_or(now).as_second().max(0) as u64;
        Ok(BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(short("message_id", &self.message_id)?)
            .with_content_type(ShortString::from(self.content_type.content_type()))
            .with_type(short("type", &self.type_name)?)
            .with_timestamp(at)
            .with_app_id(short("app_id", app_id)?)
            .with_headers(table))
    }

    /// Checks what the broker would refuse, before anything is sent.
    pub(crate) fn check(&self) -> Result<(), OutboundError> {
        short("exchange", &self.exchange)?;
        short("routing_key", &self.routing_key)?;
        Ok(())
    }
}

/// An AMQP short string, or which field is too long.
pub(crate) fn short(field: &'static str, value: &str) -> Result<ShortString, OutboundError> {
    ShortString::try_new(value).map_err(|_| OutboundError::TooLong {
        field,
        len: value.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(p: &Option<ShortString>) -> &str {
        p.as_ref().map(|s| s.as_str()).unwrap_or("")
    }

    #[test]
    fn control_messages_go_to_the_jobs_exchange_with_their_keys() {
        let c = BrokerConfig::default();
        let s = Outbound::submit(
            &SubmitJob {
                job_id: "42".into(),
                ..SubmitJob::default()
            },
            Format::Json,
            &c,
        );
        assert_eq!(
            (
                s.exchange.as_str(),
                s.routing_key.as_str(),
                s.message_id.as_str()
            ),
            ("compute.jobs", "submit", "submit/42")
        );
        assert_eq!(s.type_name, "volcano_runner.v1.SubmitJob");
        let x = Outbound::extend(
            &ExtendJob {
                job_id: "42".into(),
                request_id: "r7".into(),
                extension: None,
            },
            Format::Protobuf,
            &c,
        );
        assert_eq!(
            (x.routing_key.as_str(), x.message_id.as_str()),
            ("extend", "extend/42/r7")
        );
        let k = Outbound::cancel(
            &CancelJob {
                job_id: "42".into(),
                reason: None,
            },
            Format::Json,
            &c,
        );
        assert_eq!(k.routing_key, "cancel");
    }

    #[test]
    fn events_use_their_deterministic_ids_and_exchanges() {
        let c = BrokerConfig {
            events_mandatory: false,
            ..BrokerConfig::default()
        };
        let e = Outbound::job_event(
            &JobEvent {
                event_id: "42/QUEUED".into(),
                ..JobEvent::default()
            },
            Format::Json,
            &c,
        );
        assert_eq!(
            (
                e.exchange.as_str(),
                e.routing_key.as_str(),
                e.message_id.as_str()
            ),
            ("compute.events", "job.lifecycle", "42/QUEUED")
        );
        assert!(!e.mandatory);
        let t = Outbound::accounting(
            &AccountingTick {
                tick_id: "42/3".into(),
                ..AccountingTick::default()
            },
            Format::Json,
            &c,
        );
        assert_eq!(
            (t.routing_key.as_str(), t.message_id.as_str()),
            ("job.accounting", "42/3")
        );
        let p = Outbound::proxy(&ProxyEvent::default(), Format::Json, &c);
        assert_eq!(p.exchange, "compute.proxy");
    }

    #[test]
    fn properties_are_persistent_and_complete() {
        let c = BrokerConfig::default();
        let m = Outbound::cancel(
            &CancelJob {
                job_id: "9".into(),
                reason: None,
            },
            Format::Protobuf,
            &c,
        )
        .with_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        let now: jiff::Timestamp = "2026-01-02T03:04:05Z".parse().unwrap();
        let p = m.properties("runner-a", now).unwrap();
        assert_eq!(*p.delivery_mode(), Some(2));
        assert_eq!(text(p.message_id()), "cancel/9");
        assert_eq!(text(p.content_type()), "application/x-protobuf");
        assert_eq!(text(p.kind()), "volcano_runner.v1.CancelJob");
        assert_eq!(text(p.app_id()), "runner-a");
        assert_eq!(*p.timestamp(), Some(now.as_second() as u64));
        let tp = p
            .headers()
            .as_ref()
            .unwrap()
            .inner()
            .get("traceparent")
            .cloned();
        assert_eq!(
            tp,
            Some(AMQPValue::LongString(
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()
            ))
        );
    }

    #[test]
    fn an_overlong_id_is_an_error_not_a_panic() {
        let c = BrokerConfig::default();
        let m = Outbound::cancel(
            &CancelJob {
                job_id: "x".repeat(300),
                reason: None,
            },
            Format::Json,
            &c,
        );
        let err = m.properties("a", jiff::Timestamp::UNIX_EPOCH).unwrap_err();
        assert_eq!(
            err,
            OutboundError::TooLong {
                field: "message_id",
                len: 307
            }
        );
    }
}
