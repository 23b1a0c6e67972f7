//! [`EventsRoute`]: what a handler does when no queue receives its events.
//!
//! Events are published mandatory, so an event no queue would receive comes back from the broker
//! ([`PublishError::Unroutable`]). That is not a fault of the message being handled (its job may well be
//! created and running): requeueing it would burn its delivery limit, ~20 tries in seconds, and
//! dead-letter a submission whose job runs. So the handler keeps the message in hand and publishes again,
//! with backoff, until someone binds a queue (or the runner shuts down), while `/readyz` says
//! `no queue receives compute.events` and a gauge counts the messages that wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::broker::{Outbound, PublishError, Publisher};
use crate::ops::{Condition, Metrics};

/// The longest pause between two tries of an unroutable event: once a queue is bound, the waiting
/// messages go on within this.
const MAX_WAIT_BETWEEN_TRIES: Duration = Duration::from_secs(5);

/// Whether the events reach a queue, as the last publish found; shared by every handler of a runner.
#[derive(Clone, Debug, Default)]
pub struct EventsRoute {
    /// The readiness check `events routing` (none outside a runner process).
    condition: Option<Condition>,
    metrics: Option<Metrics>,
    /// Publishes waiting for a route right now.
    waiting: Arc<AtomicUsize>,
}

impl EventsRoute {
    /// Reports into `condition` (failing while an event finds no queue) and `metrics`.
    pub fn new(condition: Condition, metrics: Metrics) -> Self {
        condition.set(Ok(()));
        Self {
            condition: Some(condition),
            metrics: Some(metrics),
            waiting: Arc::default(),
        }
    }

    /// Publishes `message` with confirms; while no queue receives it, tries again with backoff (from
    /// `broker.reconnect_min_delay` to 5 s) instead of failing. Other errors, and an unroutable one once
    /// the runner shuts down, are returned.
    pub async fn publish(
        &self,
        publisher: &Publisher,
        message: &Outbound,
    ) -> Result<(), PublishError> {
        let mut waiting: Option<Waiting> = None;
        let mut delays = publisher
            .config()
            .reconnect_backoff()
            .map(|d| d.min(MAX_WAIT_BETWEEN_TRIES));
        loop {
            match publisher.publish(message).await {
                Ok(()) => {
                    self.set(Ok(()));
                    return Ok(());
                }
                Err(e @ PublishError::Unroutable { .. }) => {
                    let why = format!(
                        "no queue receives {} (routing key {}): events wait, and the messages that \
                         caused them stay in hand until a queue is bound",
                        message.exchange, message.routing_key
                    );
                    self.set(Err(why));
                    if waiting.is_none() {
                        tracing::warn!(
                            message_id = %message.message_id,
                            exchange = %message.exchange,
                            routing_key = %message.routing_key,
                            "No queue receives this event; it is published again until one does."
                        );
                        waiting = Some(self.wait());
                    }
                    let delay = delays.next().unwrap_or(MAX_WAIT_BETWEEN_TRIES);
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = publisher.shutdown_token().cancelled() => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn set(&self, result: Result<(), String>) {
        if let Some(condition) = &self.condition
            && condition.get_err() != result.clone().err()
        {
            condition.set(result);
        }
    }

    /// Counts one publish as waiting until dropped.
    fn wait(&self) -> Waiting {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        if let Some(m) = &self.metrics {
            m.waiting_for_route(1);
        }
        Waiting {
            route: self.clone(),
        }
    }

    /// Why events wait, while they do (the readiness check's words).
    pub fn problem(&self) -> Option<String> {
        self.condition.as_ref().and_then(Condition::get_err)
    }

    /// Publishes waiting for a route now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }
}

struct Waiting {
    route: EventsRoute,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.route.waiting.fetch_sub(1, Ordering::SeqCst);
        if let Some(m) = &self.route.metrics {
            m.waiting_for_route(-1);
        }
    }
}
