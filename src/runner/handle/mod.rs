//! Handling one delivery: decode it, act on it in the cluster, publish what happened, and decide how to
//! settle it. The consumer loops ([`super::consume`]) own the deliveries; this module never acks.
//!
//! Every path is safe to run twice (a redelivery, a second runner): effects are keyed by the job's name,
//! its fingerprint and its annotations, and events by their deterministic ids.
//!
//! - [`submit`]: SubmitJob → VolcanoJob and companions, QUEUED.
//! - [`cancel`]: CancelJob → tombstone, terminationCause, delete.
//! - [`extend`]: ExtendJob → maxTime/expiry once per request id.
//! - [`reject`]: what cannot be read or is invalid → FAILURE (when the job id is known) and the
//!   dead-letter queue.

pub mod booking;
pub mod cancel;
pub mod extend;
pub mod fates;
pub mod reject;
pub mod route;
pub mod submit;

use std::sync::Arc;

use jiff::Timestamp;
use tracing::warn;

use crate::broker::{DeadLetterReason, Delivery, Outbound, PublishError, Publisher};
use crate::cluster::{
    Applier, ClusterError, PendingExtensions, RetryPolicy, SubmitGate, Tombstones,
};
use crate::config::Config;
use crate::durable::AnnotationKeys;
use crate::messages::v1::JobEvent;
use crate::messages::{Format, Inbound, decode_inbound};

use super::plan::RunnerKeys;
use crate::cluster::jobs::JobStore;
use crate::ops::trace::TraceParent;

/// How to settle a delivery once it has been handled.
#[derive(Debug, Clone, PartialEq)]
pub enum Settle {
    /// Done: its effects are in the cluster and its events are confirmed.
    Ack,
    /// A transient failure (cluster or broker): back to the queue for another try, here or elsewhere. The
    /// delivery limit dead-letters a message that never succeeds. Never a FAILURE event.
    Requeue { why: String },
    /// Bad input: to the dead-letter queue with the reason in its headers (its FAILURE, when the job id
    /// is known, is already published).
    DeadLetter(DeadLetterReason),
}

impl Settle {
    /// How a cluster error settles a delivery: a refusal (400, 403, 413, 422, an admission webhook's
    /// denial) will be the same on every try, so the message goes to the dead-letter queue with the
    /// cluster's words (`cluster_rejected`); anything else is transient here (5xx, 429, timeouts,
    /// conflicts, an object or namespace missing for a moment) and the message goes back to its queue.
    /// Handlers that can tell the orchestrator more (an event naming the field) use
    /// [`reject::cluster_refused`] first.
    pub fn cluster(e: &ClusterError) -> Self {
        match e {
            ClusterError::Rejected { .. } => Self::DeadLetter(DeadLetterReason::new(
                reject::CLUSTER_REJECTED,
                e.to_string(),
            )),
            _ => Self::Requeue { why: e.to_string() },
        }
    }

    /// A requeue for an event that was not confirmed.
    pub fn publish(e: &PublishError) -> Self {
        Self::Requeue {
            why: format!("an event was not confirmed: {e}"),
        }
    }

    /// A short label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Ack => "ack",
            Self::Requeue { .. } => "requeue",
            Self::DeadLetter(_) => "dead_letter",
        }
    }
}

/// What one delivery carries, read once from its properties.
#[derive(Debug, Clone)]
pub struct Message<'a> {
    pub body: &'a [u8],
    pub type_name: Option<&'a str>,
    pub content_type: Option<&'a str>,
    /// Which queue it came from: decides how an unreadable message is reported.
    pub from_submit_queue: bool,
    pub traceparent: Option<TraceParent>,
    /// The `timestamp` property (seconds), when the publisher set one.
    pub sent_at: Option<Timestamp>,
    /// The properties that arrived with bytes that are not UTF-8 (see `broker::sanitize`): such a
    /// message is rejected before anything is read from it.
    pub invalid_properties: Option<Vec<String>>,
}

impl<'a> Message<'a> {
    /// The message of `delivery`.
    pub fn of(delivery: &'a Delivery, from_submit_queue: bool) -> Self {
        Self {
            body: delivery.body(),
            type_name: delivery.type_name(),
            content_type: delivery.content_type(),
            from_submit_queue,
            traceparent: delivery
                .traceparent()
                .as_deref()
                .and_then(TraceParent::parse),
            sent_at: delivery
                .timestamp()
                .and_then(|s| Timestamp::from_second(i64::try_from(s).ok()?).ok()),
            invalid_properties: delivery.invalid_properties(),
        }
    }

    /// A request the runner makes itself (a recorded extension applied later, the cancel of a booking
    /// that cannot be kept): no body or properties to read, only the trace and send time it carries on.
    pub fn internal(traceparent: Option<TraceParent>, sent_at: Option<Timestamp>) -> Self {
        Self {
            body: &[],
            type_name: None,
            content_type: None,
            from_submit_queue: false,
            traceparent,
            sent_at,
            invalid_properties: None,
        }
    }
}

/// Everything a handler needs, shared by all handlers of one runner.
pub struct Handler {
    pub config: Arc<Config>,
    pub runner_id: String,
    pub keys: AnnotationKeys,
    pub runner_keys: RunnerKeys,
    pub client: kube::Client,
    pub retry: RetryPolicy,
    pub applier: Applier,
    pub jobs: JobStore,
    pub tombstones: Tombstones,
    /// Extensions that arrived before their job.
    pub pending_extensions: PendingExtensions,
    pub gate: SubmitGate,
    pub publisher: Publisher,
    /// The encoding of every event the runner publishes.
    pub format: Format,
    /// Jobs whose QUEUED the broker confirmed here, for this runner's monitor (it then sends no copy).
    pub confirmed_queued: crate::monitor::ConfirmedQueued,
    /// Waits, instead of failing the message, while no queue receives the events.
    pub events_route: route::EventsRoute,
    /// The maintenance windows, from the runner's watch of them (`None` until first listed): a
    /// submission a window is in the way of is created held back.
    pub maintenance: tokio::sync::watch::Receiver<Option<crate::cluster::Windows>>,
    /// The runner's clock: the monitor's (the simulator's, with the embedded simulator), for every
    /// instant the runner writes or judges by ([`Handler::now`]): a job's acceptance, a cancel's
    /// tombstone, a window in the way. One clock with the monitor, so that a job's QUEUED and the
    /// events after it read on one time line, and the submit path and the monitor, which lets a held
    /// job go, agree on what is in the way.
    pub windows_clock: Arc<dyn crate::monitor::Clock>,
    /// The bookings' record: a submission with a start window is booked there, a cancel frees its
    /// booking.
    pub bookings: crate::cluster::Bookings,
    /// Who holds each shard of the monitoring duty, from a watch of the shard leases: a job whose shard
    /// another runner holds is created with its QUEUED left to that runner's monitor (see
    /// [`crate::monitor::queued`]). `None` (a runner built without it): the submit path always tells
    /// QUEUED and records the confirm itself, as before.
    pub shard_holders: Option<crate::cluster::ShardHolders>,
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handler")
            .field("runner_id", &self.runner_id)
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

impl Handler {
    /// Handles one message and says how to settle it.
    pub async fn handle(&self, message: &Message<'_>) -> Settle {
        if let Some(names) = &message.invalid_properties {
            return reject::invalid_properties(self, message, names).await;
        }
        match decode_inbound(message.type_name, message.content_type, message.body) {
            Err(e) => reject::undecodable(self, message, &e).await,
            // The queue a message arrived on decides what it may be, not its type: a submission on the
            // control queue would bypass the pause switch and the capacity cap.
            Ok(inbound) if inbound.is_submission() != message.from_submit_queue => {
                reject::wrong_queue(self, message, &inbound).await
            }
            Ok(Inbound::Submit(job)) => {
                // The VNC password is kept out of every log line while the submission is handled.
                let _vnc_password = job
                    .application
                    .as_ref()
                    .and_then(|a| a.vnc_password.as_deref())
                    .map(|p| crate::ops::Redactor::global().hold(p));
                submit::handle(self, message, &job).await
            }
            Ok(Inbound::Cancel(cancel)) => cancel::handle(self, message, &cancel).await,
            Ok(Inbound::Extend(extend)) => extend::handle(self, message, &extend).await,
        }
    }

    /// Publishes one event with confirms, carrying the message's trace context. While no queue receives
    /// it, it is published again until one does ([`route::EventsRoute`]): the message being handled is
    /// not at fault and stays in hand, its delivery limit untouched.
    pub async fn publish(
        &self,
        event: &JobEvent,
        traceparent: Option<&TraceParent>,
    ) -> Result<(), PublishError> {
        let mut outbound = Outbound::job_event(event, self.format, &self.config.broker);
        if let Some(tp) = traceparent {
            outbound = outbound.with_traceparent(tp.as_str());
        }
        self.events_route
            .publish(&self.publisher, &outbound)
            .await
            .inspect_err(|e| {
                warn!(event_id = %event.event_id, error = %e, "An event was not confirmed.");
            })
    }

    /// The current time, by the monitor's clock: the wall clock in production, the simulator's with
    /// the embedded simulator (whose clock may run many times faster). The wall clock here put a job's
    /// acceptance (QUEUED) minutes away from its RUNNING at the demo's clock speed.
    pub fn now(&self) -> Timestamp {
        self.windows_clock.now()
    }
}

/// Runs `pass` every `interval` (at least 100 ms) until `shutdown` completes: the runner's periodic
/// duties (pending extensions, bookings). A pass that overruns delays the next rather than bunching the
/// missed ones; a pass logs its own failures and is simply tried again at the next tick.
pub async fn every<F, Fut>(
    interval: std::time::Duration,
    shutdown: impl std::future::Future<Output = ()>,
    mut pass: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut shutdown = std::pin::pin!(shutdown);
    let mut ticks = tokio::time::interval(interval.max(std::time::Duration::from_millis(100)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            _ = ticks.tick() => {}
        }
        pass().await;
    }
}
