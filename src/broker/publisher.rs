//! [`Publisher`]: persistent messages with publisher confirms, retried across reconnects.
//!
//! Confirms are pipelined: the publisher shares one confirm-mode channel, any number of callers publish on
//! it at once, and each awaits only its own confirm. A message counts as sent only when the broker has
//! confirmed it (for a persistent message to a quorum queue: written to a majority); a nack, a return
//! (mandatory and unroutable), or no confirm within `broker.confirm_timeout` is an error. Transient errors
//! are retried, on a fresh channel after a reconnect if need be, for `broker.publish_timeout`; a retried
//! message keeps its `message_id`, so a consumer drops the duplicate a lost confirm can cause.

use std::sync::Arc;
use std::time::Duration;

use lapin::{
    BasicProperties, Channel, Confirmation,
    options::{BasicPublishOptions, ConfirmSelectOptions},
    protocol::{AMQPErrorKind, AMQPSoftError},
};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::outbound::short;
use super::{Broker, BrokerError, Outbound, OutboundError};

/// Why a message was not confirmed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PublishError {
    /// The message cannot be sent as built (permanent).
    #[error("the message cannot be sent: {0}")]
    Invalid(#[from] OutboundError),
    /// No queue is bound for it (mandatory message returned by the broker). Permanent until someone binds
    /// a queue; retrying at once will not help.
    #[error(
        "no queue receives messages sent to exchange `{exchange}` with routing key `{routing_key}`"
    )]
    Unroutable {
        exchange: String,
        routing_key: String,
    },
    /// The exchange does not exist (permanent until the topology is fixed).
    #[error("exchange `{exchange}` does not exist: {message}")]
    ExchangeNotFound { exchange: String, message: String },
    /// The broker refused the message (an internal error on its side).
    #[error("RabbitMQ nacked the message")]
    Nacked,
    /// No confirm arrived in time; the message may or may not have been taken.
    #[error("no publisher confirm within {0:?} (broker.confirm_timeout)")]
    ConfirmTimeout(Duration),
    /// The channel or connection failed under the message.
    #[error("the channel failed while publishing: {0}")]
    Channel(String),
    /// Transient failures lasted longer than `broker.publish_timeout`.
    #[error("gave up after {after:?} (broker.publish_timeout); last error: {last}")]
    GaveUp {
        after: Duration,
        last: Box<PublishError>,
    },
    /// The broker is shutting down and has no connection any more.
    #[error("the broker connection is shutting down")]
    Shutdown,
}

impl PublishError {
    /// A fixed word for why the publish failed: the `reason` label of the failure metric.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "invalid",
            Self::Unroutable { .. } => "unroutable",
            Self::ExchangeNotFound { .. } => "exchange_not_found",
            Self::Nacked => "nacked",
            Self::ConfirmTimeout(_) => "confirm_timeout",
            Self::Channel(_) => "channel",
            Self::GaveUp { .. } => "gave_up",
            Self::Shutdown => "shutdown",
        }
    }

    /// Whether the same message may be confirmed if tried again later (then nack the delivery that caused
    /// it with requeue); otherwise it will keep failing and needs a person.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Nacked | Self::ConfirmTimeout(_) | Self::Channel(_) | Self::GaveUp { .. } => true,
            Self::Invalid(_)
            | Self::Unroutable { .. }
            | Self::ExchangeNotFound { .. }
            | Self::Shutdown => false,
        }
    }

    fn from_broker(e: BrokerError) -> Self {
        match e {
            BrokerError::Shutdown => Self::Shutdown,
            other => Self::Channel(other.to_string()),
        }
    }
}

/// Publishes with confirms. Cheap to clone; clones share one channel.
#[derive(Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
    /// Where confirmed and failed publishes are counted (see [`Publisher::with_metrics`]).
    metrics: Option<crate::ops::Metrics>,
}

struct Inner {
    broker: Broker,
    channel: Arc<PublisherChannel>,
}

/// A publisher's confirm-mode channel and the connection generation it was opened on (shared by its
/// clones; the broker keeps a reference to close it before the connection).
#[derive(Default)]
pub(crate) struct PublisherChannel {
    slot: Mutex<Option<(u64, Channel)>>,
}

impl PublisherChannel {
    /// Closes the channel, if open, and waits for the broker's close-ok; the next publish opens another.
    pub(crate) async fn close(&self) {
        let taken = self.slot.lock().await.take();
        if let Some((_, channel)) = taken
            && channel.status().connected()
            && let Err(e) = channel.close(200, "publisher closed".into()).await
        {
            tracing::debug!(error = %e, "Closing a publisher channel failed; it is gone either way.");
        }
    }
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").finish_non_exhaustive()
    }
}

impl Publisher {
    pub(crate) fn new(broker: Broker) -> Self {
        Self {
            inner: Arc::new(Inner {
                broker,
                channel: Arc::new(PublisherChannel::default()),
            }),
            metrics: None,
        }
    }

    /// The channel's handle, for the broker to close at shutdown.
    pub(crate) fn channel_handle(&self) -> Arc<PublisherChannel> {
        self.inner.channel.clone()
    }

    /// This publisher (same channel), counting every publish in `metrics`: confirmed messages and their
    /// confirm latency by type, and failures by reason.
    pub fn with_metrics(mut self, metrics: crate::ops::Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Publishes one message and waits for its confirm, retrying transient failures for
    /// `broker.publish_timeout`.
    pub async fn publish(&self, message: &Outbound) -> Result<(), PublishError> {
        message.check()?;
        let properties =
            message.properties(&self.inner.broker.config().app_id, jiff::Timestamp::now())?;
        let started = Instant::now();
        let result = self
            .publish_raw(
                &message.exchange,
                &message.routing_key,
                &message.body,
                properties,
                message.mandatory,
            )
            .await;
        if let Some(metrics) = &self.metrics {
            metrics.published(
                &message.type_name,
                started.elapsed(),
                result.as_ref().err().map(PublishError::reason),
            );
        }
        result
    }

    /// Publishes many messages with their confirms in flight together; fails with the first error. Every
    /// message that did not fail has been confirmed when this returns `Ok`.
    pub async fn publish_all(&self, messages: &[Outbound]) -> Result<(), PublishError> {
        futures::future::try_join_all(messages.iter().map(|m| self.publish(m)))
            .await
            .map(drop)
    }

    /// The `[broker]` configuration of its connection.
    pub fn config(&self) -> &super::BrokerConfig {
        self.inner.broker.config()
    }

    /// The process's shutdown signal (see [`Broker::connect`]), for callers that wait between publishes.
    pub fn shutdown_token(&self) -> &tokio_util::sync::CancellationToken {
        self.inner.broker.shutdown_token()
    }

    pub(crate) fn dead_letter_exchange(&self) -> &str {
        &self.inner.broker.config().dead_letter_exchange
    }

    /// Publishes a body with ready-made properties (the dead-letter copy keeps the original's).
    pub(crate) async fn publish_raw(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
        mandatory: bool,
    ) -> Result<(), PublishError> {
        let config = self.inner.broker.config();
        let started = Instant::now();
        let deadline = started + config.publish_timeout;
        let mut delays = config.reconnect_backoff();
        loop {
            let attempt = tokio::time::timeout_at(
                deadline,
                self.attempt(exchange, routing_key, body, properties.clone(), mandatory),
            )
            .await
            .unwrap_or_else(|_| {
                Err(PublishError::Channel(
                    "still waiting for a connection or a confirm".into(),
                ))
            });
            let error = match attempt {
                Ok(()) => return Ok(()),
                Err(e) if !e.is_retryable() => return Err(e),
                Err(e) => e,
            };
            let delay = delays.next().unwrap_or(config.reconnect_max_delay);
            if Instant::now() + delay >= deadline {
                return Err(PublishError::GaveUp {
                    after: config.publish_timeout,
                    last: Box::new(error),
                });
            }
            debug!(%exchange, %routing_key, error = %error, ?delay, "Publish failed; retrying.");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.inner.broker.closing_token().cancelled() => return Err(PublishError::Shutdown),
            }
        }
    }

    async fn attempt(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
        mandatory: bool,
    ) -> Result<(), PublishError> {
        let (generation, channel) = self.channel().await?;
        let options = BasicPublishOptions {
            mandatory,
            ..BasicPublishOptions::default()
        };
        let confirm = match channel
            .basic_publish(
                short("exchange", exchange)?,
                short("routing_key", routing_key)?,
                options,
                body,
                properties,
            )
            .await
        {
            Ok(confirm) => confirm,
            Err(e) => {
                self.discard(generation, &channel).await;
                return Err(classify(exchange, e));
            }
        };
        let timeout = self.inner.broker.config().confirm_timeout;
        let confirmation = match tokio::time::timeout(timeout, confirm).await {
            Err(_) => return Err(PublishError::ConfirmTimeout(timeout)),
            Ok(Err(e)) => {
                self.discard(generation, &channel).await;
                return Err(classify(exchange, e));
            }
            Ok(Ok(c)) => c,
        };
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_returned)) => Err(PublishError::Unroutable {
                exchange: exchange.to_owned(),
                routing_key: routing_key.to_owned(),
            }),
            Confirmation::Nack(_) => Err(PublishError::Nacked),
            Confirmation::NotRequested => {
                warn!("A publish was not in confirm mode; reopening the channel.");
                self.discard(generation, &channel).await;
                Err(PublishError::Channel(
                    "the channel was not in confirm mode".into(),
                ))
            }
        }
    }

    /// The shared confirm-mode channel, opened (again) when it is missing, failed or from an old connection.
    async fn channel(&self) -> Result<(u64, Channel), PublishError> {
        let mut slot = self.inner.channel.slot.lock().await;
        if let Some((generation, channel)) = slot.as_ref()
            && channel.status().connected()
            && *generation == self.inner.broker.generation()
        {
            return Ok((*generation, channel.clone()));
        }
        let (generation, channel) = self
            .inner
            .broker
            .channel()
            .await
            .map_err(PublishError::from_broker)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| PublishError::Channel(e.to_string()))?;
        *slot = Some((generation, channel.clone()));
        Ok((generation, channel))
    }

    /// Forgets a failed channel (only if it is still the current one) and tells the supervisor.
    async fn discard(&self, generation: u64, channel: &Channel) {
        let mut slot = self.inner.channel.slot.lock().await;
        if slot
            .as_ref()
            .is_some_and(|(g, c)| *g == generation && c.id() == channel.id())
        {
            *slot = None;
        }
        self.inner.broker.suspect();
    }
}

fn classify(exchange: &str, e: lapin::Error) -> PublishError {
    if let lapin::ErrorKind::ProtocolError(amqp) = e.kind()
        && let AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) = amqp.kind()
    {
        return PublishError::ExchangeNotFound {
            exchange: exchange.to_owned(),
            message: amqp.get_message().to_string(),
        };
    }
    PublishError::Channel(e.to_string())
}
