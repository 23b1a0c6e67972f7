//! RabbitMQ through lapin: the topology, a connection supervisor that reconnects by itself, consumers that
//! survive lost channels and ended streams, a publisher with confirms, dead-lettering with a reason, and a
//! follower of the outbound events.
//!
//! This module owns everything that speaks AMQP. It knows nothing about jobs beyond the message types it
//! carries: deciding what to do with a delivery (ack, requeue, dead-letter) is the runner's business, and the
//! runner never touches lapin types.
//!
//! # Layout
//! - [`topology`]: the exchanges, queues and bindings as data, declared (or passively checked) on every
//!   connection, and rendered as RabbitMQ definitions for operators who pre-provision.
//! - [`connection`]: [`Broker`], the supervisor that owns the one AMQP connection, reconnects with backoff
//!   and re-declares the topology.
//! - [`consumer`]: [`QueueConsumer`], a consumer that re-establishes itself, and [`Delivery`], the handle
//!   that settles one message (ack, requeue, dead-letter with a reason).
//! - [`publisher`]: [`Publisher`], confirmed persistent publishing, retried across reconnects.
//! - [`outbound`]: [`Outbound`], a message ready to publish, with constructors for every message type.
//! - [`dead_letters`]: [`DeadLetterQueue`], the dead letters read, requeued or dropped over AMQP alone,
//!   for `volcano-runner admin dead-letters`.
//! - [`properties`]: reading an inbound message's properties and headers (delivery count, trace context),
//!   pure functions of what lapin parsed.
//! - [`sanitize`] and [`transport`]: the socket under lapin, whose inbound frames are rewritten so that
//!   a short string that is not UTF-8 cannot make lapin drop the connection.
//! - [`follow`]: [`EventsFollower`], a temporary queue on the events and proxy exchanges for
//!   `volcano-runner events`.

pub mod connection;
pub mod consumer;
pub mod dead_letters;
pub mod follow;
pub mod outbound;
pub mod properties;
pub mod publisher;
pub mod sanitize;
pub mod topology;
pub mod transport;

use std::time::Duration;

use serde::Deserialize;

use crate::secret::Secret;

pub use connection::{Broker, BrokerError};
pub use consumer::{
    AckError, ConsumerKind, ConsumerSwitch, DeadLetterError, DeadLetterReason, Delivery,
    QueueConsumer,
};
pub use dead_letters::{DeadLetter, DeadLetterQueue, DeadLetterQueueError};
pub use follow::{EventsFollower, FollowedEvent, OutboundEvent};
pub use outbound::{Outbound, OutboundError};
pub use publisher::{PublishError, Publisher};
pub use topology::{Topology, TopologyError};

/// The encoding of a message body, named by its AMQP `content_type`: the one codec's
/// [`crate::messages::Format`], under the name this module used before.
pub type ContentType = crate::messages::Format;

/// Header names this module writes on dead-lettered copies. They are part of the contract with whoever reads
/// the dead-letter queue (an operator, a replay tool), so they never change silently.
pub mod headers {
    /// Machine-readable reason code, e.g. `invalid_json`, `missing_field`.
    pub const REASON: &str = "x-volcano-runner-reason";
    /// The human-readable explanation, e.g. `parameters.threads: must be at most 64`.
    pub const ERROR: &str = "x-volcano-runner-error";
    /// The field path the problem is about, when known.
    pub const FIELD: &str = "x-volcano-runner-field";
    /// The exchange the message was originally published to.
    pub const ORIGINAL_EXCHANGE: &str = "x-volcano-runner-original-exchange";
    /// The routing key the message was originally published with.
    pub const ORIGINAL_ROUTING_KEY: &str = "x-volcano-runner-original-routing-key";
    /// The queue the message was consumed from.
    pub const ORIGINAL_QUEUE: &str = "x-volcano-runner-original-queue";
    /// How often the message had been delivered before (the quorum queue's `x-delivery-count`, or 1 when the
    /// broker only said "redelivered").
    pub const DELIVERY_COUNT: &str = "x-volcano-runner-delivery-count";
    /// When the runner dead-lettered the message, RFC 3339.
    pub const DEAD_LETTERED_AT: &str = "x-volcano-runner-dead-lettered-at";
    /// The message's own headers that the copy leaves out because together they were too large to copy
    /// (see `consumer::DEAD_LETTER_HEADERS_MAX`): `name (N bytes)`, comma-separated, largest first.
    pub const DROPPED_HEADERS: &str = "x-volcano-runner-dropped-headers";
    /// W3C trace context, read from inbound messages and carried onto outbound ones.
    pub const TRACEPARENT: &str = crate::ops::trace::HEADER;
    /// Set by quorum queues on redeliveries: how often the message was delivered before.
    pub const DELIVERY_COUNT_QUORUM: &str = "x-delivery-count";
}

/// The `[broker]` section of the configuration: where RabbitMQ is, the names of everything the runner
/// declares or checks, and the knobs of its reliability.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    /// The AMQP URL, with credentials and the vhost (`%2f` is the default vhost `/`). A secret because it
    /// carries the password; it is never logged. Query parameters such as `?heartbeat=30` are honoured;
    /// without `?frame_max=` the runner offers frames of 32 KiB (see `connection::DEFAULT_FRAME_MAX`; a
    /// message with larger headers is still read, its largest headers left out).
    pub url: Secret,
    /// The name the connection carries in the management UI, so an operator can tell runners apart.
    pub connection_name: String,
    /// The `app_id` property of every message the runner publishes, so consumers can see who sent it.
    pub app_id: String,
    /// Only check that the topology exists (passive declares) instead of declaring it. For operators who
    /// pre-provision with `deploy/rabbitmq/definitions.json` and give runners no `configure` permission.
    pub passive: bool,

    /// The direct exchange orchestrators publish submissions, cancels and extensions to.
    pub jobs_exchange: String,
    /// Routing key of `SubmitJob` messages.
    pub submit_routing_key: String,
    /// Routing key of `CancelJob` messages.
    pub cancel_routing_key: String,
    /// Routing key of `ExtendJob` messages.
    pub extend_routing_key: String,
    /// The quorum queue of submissions.
    pub submit_queue: String,
    /// The quorum queue of cancels and extensions. Separate from submissions so that a control message never
    /// waits behind a backlog of submissions, also while submissions are paused.
    pub control_queue: String,
    /// Routing key of `OpenSession` requests on the jobs exchange.
    pub session_routing_key: String,
    /// The quorum queue of `OpenSession` requests (answered on their `reply_to`). Separate, so a session
    /// is never kept waiting behind submissions.
    pub session_queue: String,
    /// The exchange (fanout) that receives what the queues dead-letter, and what the runner rejects with a
    /// reason.
    pub dead_letter_exchange: String,
    /// The queue that keeps dead-lettered messages for an operator to inspect or replay.
    pub dead_letter_queue: String,
    /// How many times a message may be returned to its queue (delivered N+1 times in all) before the
    /// quorum queue dead-letters it. RabbitMQ 3.x has no default: without it a poison message that crashes
    /// runners would circulate forever.
    pub delivery_limit: u32,

    /// The topic exchange lifecycle events and accounting ticks are published to.
    pub events_exchange: String,
    /// Routing key of `JobEvent` (lifecycle) messages.
    pub lifecycle_routing_key: String,
    /// Routing key of `AccountingTick` messages.
    pub accounting_routing_key: String,
    /// The fanout exchange `ProxyEvent` messages are published to, so every proxy instance gets each one.
    pub proxy_exchange: String,
    /// Publish events as mandatory, so that an event no queue receives is an error instead of being lost
    /// silently (the runner then keeps the message that caused it in hand and publishes the event again
    /// until a queue is bound). Switch off only where nobody listens yet.
    pub events_mandatory: bool,

    /// How many unacknowledged submissions the broker hands one runner at a time. Together with the
    /// runner's bound on concurrent handling, this is the runner's in-progress limit. A prefetched
    /// submission waiting for a handler costs only its message (a figlet submission is 1.6 KiB); the
    /// memory goes with `runner.max_in_flight`.
    pub submit_prefetch: u16,
    /// How many unacknowledged control messages (cancels, extends) one runner holds. Its own channel and
    /// prefetch, so a cancel is delivered even while every submit slot is taken.
    pub control_prefetch: u16,

    /// First delay before reconnecting (and before re-establishing a consumer) after a failure.
    #[serde(with = "duration_text")]
    pub reconnect_min_delay: Duration,
    /// Longest delay between reconnect attempts; the delay doubles from the minimum up to this.
    #[serde(with = "duration_text")]
    pub reconnect_max_delay: Duration,
    /// How long the first connection (and topology declaration) may take at start before the runner gives
    /// up, so a wrong URL fails the start instead of hanging; later reconnects go on until shutdown.
    #[serde(with = "duration_text")]
    pub startup_timeout: Duration,
    /// How long one publish waits for the broker's confirm before it counts as failed and is retried.
    #[serde(with = "duration_text")]
    pub confirm_timeout: Duration,
    /// How long a publish is retried across reconnects before it fails, so a caller can nack and move on.
    #[serde(with = "duration_text")]
    pub publish_timeout: Duration,
    /// How often the supervisor and consumers look at the state of their connection and channel, a safety
    /// net for a lost connection that lapin reports no event for (lapin issues #222, #389).
    #[serde(with = "duration_text")]
    pub health_check_interval: Duration,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            url: Secret::new("amqp://guest:guest@127.0.0.1:5672/%2f"),
            connection_name: "volcano-runner".into(),
            app_id: "volcano-runner".into(),
            passive: false,
            jobs_exchange: "compute.jobs".into(),
            submit_routing_key: "submit".into(),
            cancel_routing_key: "cancel".into(),
            extend_routing_key: "extend".into(),
            submit_queue: "compute.jobs.submit".into(),
            control_queue: "compute.jobs.control".into(),
            session_routing_key: "session".into(),
            session_queue: "compute.jobs.sessions".into(),
            dead_letter_exchange: "compute.jobs.dlx".into(),
            dead_letter_queue: "compute.jobs.dead".into(),
            delivery_limit: 20,
            events_exchange: "compute.events".into(),
            lifecycle_routing_key: "job.lifecycle".into(),
            accounting_routing_key: "job.accounting".into(),
            proxy_exchange: "compute.proxy".into(),
            events_mandatory: true,
            submit_prefetch: 32,
            control_prefetch: 16,
            reconnect_min_delay: Duration::from_millis(100),
            reconnect_max_delay: Duration::from_secs(30),
            startup_timeout: Duration::from_secs(60),
            confirm_timeout: Duration::from_secs(10),
            publish_timeout: Duration::from_secs(30),
            health_check_interval: Duration::from_secs(1),
        }
    }
}

/// AMQP short strings (names, routing keys) are at most 255 bytes.
const MAX_NAME_BYTES: usize = 255;

/// Where a [`BrokerConfig`] points, without its password: what messages about the broker name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Place {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub vhost: String,
}

impl BrokerConfig {
    /// Where the broker is, for messages: `host:port (vhost "v")`, never the credentials.
    pub fn endpoint(&self) -> String {
        match self.place() {
            Some(p) => format!("{}:{} (vhost {:?})", p.host, p.port, p.vhost),
            None => "(an unreadable [broker] url)".to_owned(),
        }
    }

    /// Host, port, user and vhost of the URL (never the password), for messages; `None` when it does
    /// not parse (the configuration check refuses such a URL).
    pub fn place(&self) -> Option<Place> {
        let uri = self.url.expose().parse::<lapin::uri::AMQPUri>().ok()?;
        Some(Place {
            host: uri.authority.host,
            port: uri.authority.port,
            user: uri.authority.userinfo.username,
            vhost: uri.vhost,
        })
    }

    /// Checks what serde cannot: names fit AMQP, bounds are ordered, the URL parses. A bad value fails the
    /// start with the key and the reason, never a message later.
    pub fn check(&self) -> Result<(), BrokerConfigError> {
        self.url
            .expose()
            .parse::<lapin::uri::AMQPUri>()
            // The parser's message can quote the URL, password included: never pass it on.
            .map_err(|_| {
                invalid(
                    "url",
                    "is not an AMQP URL (amqp://user:password@host:port/vhost)".into(),
                )
            })?;
        self.check_names()?;
        self.check_distinct()?;
        self.check_limits()
    }

    /// Every name AMQP carries: not empty, and within what a short string holds.
    fn check_names(&self) -> Result<(), BrokerConfigError> {
        let names = [
            ("jobs_exchange", &self.jobs_exchange),
            ("submit_routing_key", &self.submit_routing_key),
            ("cancel_routing_key", &self.cancel_routing_key),
            ("extend_routing_key", &self.extend_routing_key),
            ("submit_queue", &self.submit_queue),
            ("control_queue", &self.control_queue),
            ("session_routing_key", &self.session_routing_key),
            ("session_queue", &self.session_queue),
            ("dead_letter_exchange", &self.dead_letter_exchange),
            ("dead_letter_queue", &self.dead_letter_queue),
            ("events_exchange", &self.events_exchange),
            ("lifecycle_routing_key", &self.lifecycle_routing_key),
            ("accounting_routing_key", &self.accounting_routing_key),
            ("proxy_exchange", &self.proxy_exchange),
            ("connection_name", &self.connection_name),
            ("app_id", &self.app_id),
        ];
        for (key, value) in names {
            if value.is_empty() {
                return Err(invalid(key, "must not be empty".into()));
            }
            if value.len() > MAX_NAME_BYTES {
                return Err(invalid(
                    key,
                    format!(
                        "is {} bytes long, AMQP allows at most {MAX_NAME_BYTES}",
                        value.len()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The queues and routing keys that must differ, so that each kind of message has its own way in.
    fn check_distinct(&self) -> Result<(), BrokerConfigError> {
        if self.submit_queue == self.control_queue {
            return Err(invalid(
                "control_queue",
                "must differ from submit_queue, or a cancel waits behind submissions".into(),
            ));
        }
        if self.session_queue == self.submit_queue || self.session_queue == self.control_queue {
            return Err(invalid(
                "session_queue",
                "must differ from submit_queue and control_queue: session requests have a consumer of their own".into(),
            ));
        }
        if [
            &self.submit_routing_key,
            &self.cancel_routing_key,
            &self.extend_routing_key,
        ]
        .contains(&&self.session_routing_key)
        {
            return Err(invalid(
                "session_routing_key",
                "must differ from submit_routing_key, cancel_routing_key and extend_routing_key"
                    .into(),
            ));
        }
        if self.cancel_routing_key == self.submit_routing_key
            || self.extend_routing_key == self.submit_routing_key
        {
            return Err(invalid(
                "submit_routing_key",
                "must differ from cancel_routing_key and extend_routing_key".into(),
            ));
        }
        Ok(())
    }

    /// Delivery limit, prefetches and durations: at least one, or longer than zero; reconnect delays in order.
    fn check_limits(&self) -> Result<(), BrokerConfigError> {
        if self.delivery_limit == 0 || self.delivery_limit > i32::MAX as u32 {
            return Err(invalid(
                "delivery_limit",
                "must be at least 1 (a message is delivered delivery_limit + 1 times)".into(),
            ));
        }
        for (key, value) in [
            ("submit_prefetch", self.submit_prefetch),
            ("control_prefetch", self.control_prefetch),
        ] {
            if value == 0 {
                return Err(invalid(
                    key,
                    "must be at least 1 (0 would mean unlimited)".into(),
                ));
            }
        }
        for (key, value) in [
            ("reconnect_min_delay", self.reconnect_min_delay),
            ("reconnect_max_delay", self.reconnect_max_delay),
            ("startup_timeout", self.startup_timeout),
            ("confirm_timeout", self.confirm_timeout),
            ("publish_timeout", self.publish_timeout),
            ("health_check_interval", self.health_check_interval),
        ] {
            if value.is_zero() {
                return Err(invalid(key, "must be longer than zero".into()));
            }
        }
        if self.reconnect_min_delay > self.reconnect_max_delay {
            return Err(invalid(
                "reconnect_min_delay",
                "must not be longer than reconnect_max_delay".into(),
            ));
        }
        Ok(())
    }

    /// The delays between reconnect attempts: exponential from the minimum to the maximum, with jitter so
    /// that a fleet of runners does not reconnect in lockstep after a broker restart. Endless: callers stop
    /// on shutdown or their own deadline.
    pub fn reconnect_backoff(&self) -> impl Iterator<Item = Duration> + Send + use<> {
        use backon::BackoffBuilder;
        let max = self.reconnect_max_delay;
        backon::ExponentialBuilder::default()
            .with_min_delay(self.reconnect_min_delay)
            .with_max_delay(max)
            .with_jitter()
            .without_max_times()
            .build()
            // backon's jitter adds up to one more delay on top; keep the documented ceiling.
            .map(move |d| d.min(max))
    }
}

/// Durations in the configuration are written like `500ms`, `30s`, `2m` (or ISO 8601 `PT30S`).
mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        let signed: jiff::SignedDuration = text.trim().parse().map_err(|e| {
            serde::de::Error::custom(format!(
                "`{text}` is not a duration like `500ms`, `30s` or `2m`: {e}"
            ))
        })?;
        Duration::try_from(signed).map_err(|_| {
            serde::de::Error::custom(format!("`{text}` is negative; durations must be positive"))
        })
    }
}

/// A `[broker]` setting that cannot work: the key (e.g. `broker.url`) and what is wrong. This
/// section's own error, so the section does not depend on the configuration module that composes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration {key}: {reason}")]
pub struct BrokerConfigError {
    pub key: String,
    pub reason: String,
}

/// A `[broker]` error at `key` (under `broker.`).
fn invalid(key: &str, reason: String) -> BrokerConfigError {
    BrokerConfigError {
        key: format!("broker.{key}"),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<BrokerConfig, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn defaults_are_the_documented_names() {
        let c = BrokerConfig::default();
        assert_eq!(c.jobs_exchange, "compute.jobs");
        assert_eq!(c.submit_queue, "compute.jobs.submit");
        assert_eq!(c.control_queue, "compute.jobs.control");
        assert_eq!(c.events_exchange, "compute.events");
        assert_eq!(c.proxy_exchange, "compute.proxy");
        assert_eq!(
            (c.submit_routing_key.as_str(), c.cancel_routing_key.as_str()),
            ("submit", "cancel")
        );
        c.check().expect("defaults are valid");
    }

    #[test]
    fn the_documented_example_is_the_defaults() {
        #[derive(Deserialize)]
        struct File {
            broker: BrokerConfig,
        }
        let text = include_str!("../../deploy/config.d/broker.toml");
        let file: File = toml::from_str(text).expect("deploy/config.d/broker.toml parses");
        assert_eq!(file.broker, BrokerConfig::default());
    }

    #[test]
    fn durations_read_as_friendly_text() {
        let c = parse(
            "reconnect_min_delay = \"250ms\"\nconfirm_timeout = \"PT2S\"\npublish_timeout = \"1m\"",
        )
        .unwrap();
        assert_eq!(c.reconnect_min_delay, Duration::from_millis(250));
        assert_eq!(c.confirm_timeout, Duration::from_secs(2));
        assert_eq!(c.publish_timeout, Duration::from_secs(60));
    }

    #[test]
    fn bad_durations_name_the_problem() {
        let err = parse("confirm_timeout = \"soon\"").unwrap_err().to_string();
        assert!(err.contains("`soon` is not a duration"), "{err}");
        let err = parse("confirm_timeout = \"-5s\"").unwrap_err().to_string();
        assert!(err.contains("negative"), "{err}");
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = parse("prefetch = 3").unwrap_err().to_string();
        assert!(err.contains("unknown field `prefetch`"), "{err}");
    }

    #[test]
    fn check_names_the_key_and_reason() {
        let mut c = BrokerConfig {
            submit_queue: "x".repeat(256),
            ..BrokerConfig::default()
        };
        let err = c.check().unwrap_err().to_string();
        assert!(
            err.contains("broker.submit_queue") && err.contains("at most 255"),
            "{err}"
        );

        c = BrokerConfig {
            control_queue: "compute.jobs.submit".into(),
            ..BrokerConfig::default()
        };
        assert!(
            c.check()
                .unwrap_err()
                .to_string()
                .contains("broker.control_queue")
        );

        c = BrokerConfig {
            submit_prefetch: 0,
            ..BrokerConfig::default()
        };
        assert!(
            c.check()
                .unwrap_err()
                .to_string()
                .contains("broker.submit_prefetch")
        );

        c = BrokerConfig {
            reconnect_min_delay: Duration::from_secs(60),
            ..BrokerConfig::default()
        };
        assert!(
            c.check()
                .unwrap_err()
                .to_string()
                .contains("reconnect_min_delay")
        );
    }

    #[test]
    fn a_bad_url_is_reported_without_its_password() {
        let c = BrokerConfig {
            url: Secret::new("amqq://user:hunter2@host"),
            ..BrokerConfig::default()
        };
        let err = c.check().unwrap_err().to_string();
        assert!(err.contains("broker.url"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        assert!(!format!("{c:?}").contains("guest:guest"));
    }

    #[test]
    fn reconnect_backoff_grows_and_stays_within_bounds() {
        let c = BrokerConfig {
            reconnect_min_delay: Duration::from_millis(100),
            reconnect_max_delay: Duration::from_secs(2),
            ..BrokerConfig::default()
        };
        let delays: Vec<Duration> = c.reconnect_backoff().take(40).collect();
        assert_eq!(delays.len(), 40, "the backoff never runs out");
        assert!(delays.iter().all(|d| *d >= Duration::from_millis(100)));
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(2)));
        assert_eq!(*delays.last().unwrap(), Duration::from_secs(2));
    }
}
