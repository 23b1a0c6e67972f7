//! The consume loops: one per queue, each with its own consumer (channel and prefetch) and its own bound
//! on concurrent handling, so a cancel never waits behind submissions.
//!
//! A loop takes a handler slot (semaphore permit) *before* it takes a delivery, so at most
//! `runner.max_in_flight` submissions are being handled while the rest of the prefetch waits in the
//! client's buffer. The submit loop also waits for the [`SubmitGate`]: while the runners are paused or the
//! cluster is at `max_active_jobs`, it takes nothing (a pause also cancels the consumer, so the messages
//! wait in the queue, visible to operators). Control messages never look at the gate.
//!
//! # Shutdown
//! When `shutdown` fires, each loop stops taking deliveries (the consumer is cancelled at the broker and
//! what it buffered goes back to the queue), then waits for its handlers until the grace deadline. Handlers
//! still running then are stopped at their next await point and their messages returned to the queue
//! (`nack` with requeue); whatever they created is adopted by the next delivery (fingerprint,
//! ownerReferences). Then the consumer's channel is closed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::broker::{ConsumerKind, ConsumerSwitch, Delivery, QueueConsumer};
use crate::cluster::{GateState, SubmitGate};

use super::handle::{Handler, Message, Settle};
use crate::messages::{Format, MessageType, peek_job_id};
use crate::ops::TraceContext;
use crate::ops::trace::TraceParent;
use crate::ops::trace::message_span;

/// How long handlers stopped at the grace deadline get to return their messages.
const REQUEUE_AFTER_DEADLINE: Duration = Duration::from_secs(5);

/// Counts of what a runner did with its deliveries, for logs and operators.
#[derive(Debug, Default)]
pub struct Stats {
    pub acked: AtomicU64,
    pub requeued: AtomicU64,
    pub dead_lettered: AtomicU64,
    /// Settles that did not reach the broker (the message comes again).
    pub settle_failed: AtomicU64,
    /// Handlers stopped at the grace deadline (their messages were returned).
    pub stopped: AtomicU64,
}

impl Stats {
    fn count(&self, settle: &Settle) {
        let counter = match settle {
            Settle::Ack => &self.acked,
            Settle::Requeue { .. } => &self.requeued,
            Settle::DeadLetter(_) => &self.dead_lettered,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A snapshot `(acked, requeued, dead_lettered)`. `requeued` counts every message given back to its
    /// queue: after a transient failure, and those stopped at the grace deadline.
    pub fn snapshot(&self) -> (u64, u64, u64) {
        (
            self.acked.load(Ordering::Relaxed),
            self.requeued.load(Ordering::Relaxed) + self.stopped.load(Ordering::Relaxed),
            self.dead_lettered.load(Ordering::Relaxed),
        )
    }
}

/// One consume loop's settings.
pub struct Loop {
    /// Which queue: decides whether the gate applies and how an unreadable message is reported.
    pub kind: ConsumerKind,
    pub consumer: QueueConsumer,
    pub handler: Arc<Handler>,
    /// Concurrent handlers of this loop.
    pub slots: Arc<Semaphore>,
    /// The submission gate (submit loop only).
    pub gate: Option<watch::Receiver<GateState>>,
    pub stats: Arc<Stats>,
    /// Wait before returning a message after a transient failure.
    pub requeue_delay: Duration,
    pub grace: Duration,
    /// Where deliveries are counted and timed.
    pub metrics: crate::ops::Metrics,
    /// Up while the loop takes deliveries (readiness).
    pub ready: Option<crate::ops::ReadyFlag>,
}

impl Loop {
    /// Consumes until `shutdown`, then drains as described in the module documentation.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let label = match self.kind {
            ConsumerKind::Submit => "submit",
            ConsumerKind::Control => "control",
        };
        let hard_stop = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let running = self.ready.as_ref().map(crate::ops::ReadyFlag::running);
        'taking: loop {
            reap(&mut tasks, label);
            let permit = tokio::select! {
                permit = self.slots.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => break,
                },
                () = shutdown.cancelled() => break,
            };
            if let Some(gate) = self.gate.as_mut() {
                loop {
                    // A pause takes effect while the gate is waited for too: the consumer the runner
                    // started with (or one established before the pause) is cancelled at the broker
                    // instead of holding deliveries nobody takes.
                    self.consumer.apply_pause().await;
                    tokio::select! {
                        open = gate.wait_for(GateState::accepts_submissions) => {
                            if open.is_err() {
                                break 'taking;
                            }
                            break;
                        }
                        () = self.consumer.switch_flipped() => {}
                        () = shutdown.cancelled() => break 'taking,
                    }
                }
            }
            let delivery = tokio::select! {
                delivery = self.consumer.recv() => match delivery {
                    Some(delivery) => delivery,
                    None => break,
                },
                () = shutdown.cancelled() => break,
            };
            tasks.spawn(settle_one(
                delivery,
                self.kind == ConsumerKind::Submit,
                self.handler.clone(),
                permit,
                hard_stop.clone(),
                self.stats.clone(),
                self.requeue_delay,
                self.metrics.clone(),
            ));
        }
        drop(running);
        self.consumer.stop().await;
        // Handlers that already finished are not in hand: collect them before counting.
        reap(&mut tasks, label);
        let in_flight = tasks.len();
        if in_flight > 0 {
            info!(queue = label, in_flight, grace = ?self.grace, "Stopped consuming; finishing the messages in hand.");
        }
        let deadline = Instant::now() + self.grace;
        drain(&mut tasks, deadline, label).await;
        if !tasks.is_empty() {
            warn!(
                queue = label,
                unfinished = tasks.len(),
                "Grace period over; returning unfinished messages to the queue."
            );
            self.stats
                .stopped
                .fetch_add(tasks.len() as u64, Ordering::Relaxed);
            hard_stop.cancel();
            drain(&mut tasks, Instant::now() + REQUEUE_AFTER_DEADLINE, label).await;
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
        self.consumer.close().await;
    }
}

/// Waits for the tasks until `deadline`.
async fn drain(tasks: &mut JoinSet<()>, deadline: Instant, label: &str) {
    while !tasks.is_empty() {
        match tokio::time::timeout_at(deadline, tasks.join_next()).await {
            Ok(Some(result)) => log_join(result, label),
            Ok(None) | Err(_) => return,
        }
    }
}

/// Collects finished handler tasks, so a panic is logged when it happens and not at shutdown.
fn reap(tasks: &mut JoinSet<()>, label: &str) {
    while let Some(result) = tasks.try_join_next() {
        log_join(result, label);
    }
}

fn log_join(result: Result<(), tokio::task::JoinError>, label: &str) {
    if let Err(e) = result
        && e.is_panic()
    {
        // The delivery was dropped unsettled and returns to the queue with its channel.
        warn!(queue = label, error = %e, "A message handler panicked.");
    }
}

/// Handles one delivery and settles it, in a span that carries the message type, the job id and the trace
/// (continued from the delivery's `traceparent`, which the handlers pass on to what they publish and create).
#[allow(clippy::too_many_arguments)]
async fn settle_one(
    delivery: Delivery,
    from_submit_queue: bool,
    handler: Arc<Handler>,
    permit: OwnedSemaphorePermit,
    hard_stop: CancellationToken,
    stats: Arc<Stats>,
    requeue_delay: Duration,
    metrics: crate::ops::Metrics,
) {
    use tracing::Instrument;
    let message_type = delivery
        .type_name()
        .and_then(MessageType::from_amqp_type)
        .map_or("unknown", MessageType::name);
    let trace = TraceContext::continue_from(delivery.traceparent().as_deref());
    let job_id = delivery
        .content_type()
        .and_then(|c| Format::from_content_type(c).ok())
        .and_then(|f| peek_job_id(f, delivery.body()))
        .unwrap_or_default();
    let span = message_span(message_type, &job_id, &trace);
    let measured = Measured {
        metrics,
        message_type,
        traceparent: TraceParent::parse(&trace.traceparent()),
    };
    settle_traced(
        delivery,
        from_submit_queue,
        handler,
        permit,
        hard_stop,
        stats,
        requeue_delay,
        measured,
    )
    .instrument(span)
    .await
}

/// What [`settle_one`] hands on: where to count the delivery, as what, and the trace context to pass on.
struct Measured {
    metrics: crate::ops::Metrics,
    message_type: &'static str,
    traceparent: Option<TraceParent>,
}

#[allow(clippy::too_many_arguments)]
async fn settle_traced(
    delivery: Delivery,
    from_submit_queue: bool,
    handler: Arc<Handler>,
    permit: OwnedSemaphorePermit,
    hard_stop: CancellationToken,
    stats: Arc<Stats>,
    requeue_delay: Duration,
    measured: Measured,
) {
    let _permit = permit;
    let metrics = &measured.metrics;
    let _in_flight = metrics.in_flight();
    let started = Instant::now();
    let settle = {
        let mut message = Message::of(&delivery, from_submit_queue);
        message.traceparent = measured.traceparent.clone();
        tokio::select! {
            settle = handler.handle(&message) => Some(settle),
            () = hard_stop.cancelled() => None,
        }
    };
    let message_id = delivery.message_id().unwrap_or("").to_owned();
    let Some(settle) = settle else {
        if let Err(e) = delivery.nack_requeue().await {
            debug!(%message_id, error = %e, "Returning a stopped message failed; the broker returns it with the channel.");
        }
        metrics.message_handled(measured.message_type, "stopped", started.elapsed());
        return;
    };
    let outcome = settle.label();
    stats.count(&settle);
    let result = match settle {
        Settle::Ack => delivery.ack().await.map_err(|e| e.to_string()),
        Settle::Requeue { why } => {
            warn!(%message_id, reason = %why, delay = ?requeue_delay, "Transient failure; the message goes back to the queue.");
            tokio::select! {
                () = tokio::time::sleep(requeue_delay) => {}
                () = hard_stop.cancelled() => {}
            }
            delivery.nack_requeue().await.map_err(|e| e.to_string())
        }
        Settle::DeadLetter(reason) => delivery
            .dead_letter(&reason)
            .await
            .map_err(|e| e.to_string()),
    };
    metrics.message_handled(measured.message_type, outcome, started.elapsed());
    if let Err(e) = result {
        stats.settle_failed.fetch_add(1, Ordering::Relaxed);
        // Every effect is idempotent: the redelivery finds the work done and settles it then.
        warn!(%message_id, error = %e, "Settling a message failed; it will be delivered again.");
    }
}

/// Follows the pause switch: cancels the submit consumer while paused (so submissions wait in the queue)
/// and resumes it after. An unknown switch (not read yet) counts as paused.
pub async fn follow_pause(gate: SubmitGate, switch: ConsumerSwitch, shutdown: CancellationToken) {
    let mut rx = gate.subscribe();
    loop {
        let paused = rx
            .borrow_and_update()
            .pause
            .as_ref()
            .is_none_or(|p| p.paused);
        if paused != switch.is_paused() {
            if paused {
                info!("Submissions paused; they wait in the queue.");
                switch.pause();
            } else {
                info!("Submissions resumed.");
                switch.resume();
            }
        }
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            () = shutdown.cancelled() => return,
        }
    }
}
