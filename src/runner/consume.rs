//! The consume loops: one per queue, each with its own consumer (channel and prefetch) and its own bound
//! on concurrent handling, so a cancel never waits behind submissions.
//!
//! A loop takes a handler slot (semaphore permit) *before* it takes a delivery, so at most
//! `runner.max_in_flight` submissions are being handled while the rest of the prefetch waits in the
//! client's buffer. The submit loop also waits for the [`SubmitGate`]: while the runners are paused or the
//! cluster is at `max_active_jobs`, it takes nothing (a pause also cancels the consumer, so the messages
//! wait in the queue, visible to operators). Control messages never look at the gate.
//!
//! # A handler that fails
//! A panic anywhere in handling a delivery (a bug, or input nobody foresaw) never leaves the delivery
//! unsettled: an unsettled delivery keeps its prefetch slot until the channel closes, and a few such
//! messages would stop every submission while the process looks healthy. The panic is caught, the message
//! goes to the dead-letter queue with the reason `internal_error` (what panicked, in its words), and the
//! outcome `internal_error` is counted in `volcano_runner_messages_handled_total`. A handler that hangs
//! instead is seen by readiness: a loop whose oldest message has been in hand for longer than
//! `runner.stall_after` reports `stalled` on `/readyz`, so the runner is taken out of service rather
//! than holding its share of the queue while it says it is fine.
//!
//! # Shutdown
//! When `shutdown` fires, each loop stops taking deliveries (the consumer is cancelled at the broker and
//! what it buffered goes back to the queue), then waits for its handlers until the grace deadline. Handlers
//! still running then are stopped at their next await point and their messages returned to the queue
//! (`nack` with requeue); whatever they created is adopted by the next delivery (fingerprint,
//! ownerReferences). Then the consumer's channel is closed.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::broker::{ConsumerKind, ConsumerSwitch, DeadLetterReason, Delivery, QueueConsumer};
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
    /// Handlers that panicked (their messages were dead-lettered as `internal_error`).
    pub panicked: AtomicU64,
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
    /// The messages in hand and since when; readiness fails once the oldest is older than `stall_after`.
    pub progress: Progress,
}

/// The reason code of a message whose handler panicked.
pub const INTERNAL_ERROR: &str = "internal_error";

/// The messages a loop has in hand and since when, so readiness can tell a loop that works from one whose
/// handlers hang. Cheap to clone; clones share the record.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    in_hand: Arc<Mutex<InHand>>,
}

#[derive(Debug)]
struct InHand {
    next: u64,
    /// Start of each message in hand, by a counter that grows with time: the first entry is the oldest.
    started: BTreeMap<u64, Instant>,
    /// Whether any message is in hand, told when that changes (see [`Progress::busy`]). Written under
    /// the same lock as `started`, so the two never disagree.
    busy: tokio::sync::watch::Sender<bool>,
}

impl Default for InHand {
    fn default() -> Self {
        Self {
            next: 0,
            started: BTreeMap::new(),
            busy: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl Progress {
    /// Records a message taken in hand until the guard is dropped (settled, stopped or unwound alike).
    pub fn begin(&self) -> InHandGuard {
        let mut in_hand = self.in_hand.lock().unwrap_or_else(|e| e.into_inner());
        let id = in_hand.next;
        in_hand.next += 1;
        in_hand.started.insert(id, Instant::now());
        in_hand
            .busy
            .send_if_modified(|busy| !std::mem::replace(busy, true));
        InHandGuard {
            progress: self.clone(),
            id,
        }
    }

    /// How many messages are in hand.
    pub fn in_hand(&self) -> usize {
        self.in_hand
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .started
            .len()
    }

    /// Whether any message is in hand, as a watch that changes only when that does (the first message
    /// taken, the last one settled): a monitor in the same process waits on it rather than asking
    /// [`Progress::in_hand`] over and over.
    pub fn busy(&self) -> tokio::sync::watch::Receiver<bool> {
        self.in_hand
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .busy
            .subscribe()
    }

    /// How long the oldest message in hand has been there; `None` when there is none.
    pub fn oldest(&self) -> Option<Duration> {
        let in_hand = self.in_hand.lock().unwrap_or_else(|e| e.into_inner());
        in_hand.started.values().next().map(|t| t.elapsed())
    }

    /// Why the loop counts as stalled: its oldest message has been in hand for longer than `limit`.
    pub fn stalled(&self, limit: Duration) -> Option<String> {
        let oldest = self.oldest()?;
        (oldest > limit).then(|| {
            format!(
                "stalled: a message has been in hand for {} s, longer than runner.stall_after ({} s), with {} in hand",
                oldest.as_secs(),
                limit.as_secs(),
                self.in_hand()
            )
        })
    }
}

/// Keeps one message on the [`Progress`] record while it lives.
#[derive(Debug)]
pub struct InHandGuard {
    progress: Progress,
    id: u64,
}

impl Drop for InHandGuard {
    fn drop(&mut self) {
        let mut in_hand = self
            .progress
            .in_hand
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        in_hand.started.remove(&self.id);
        if in_hand.started.is_empty() {
            in_hand
                .busy
                .send_if_modified(|busy| std::mem::replace(busy, false));
        }
    }
}

/// How a panic in a handler settles its delivery: the dead-letter queue, with what panicked in the reason.
pub fn panicked(payload: &(dyn std::any::Any + Send)) -> Settle {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    // A panic's message can quote the input; the reason header stays short.
    let what: String = what.chars().take(300).collect();
    Settle::DeadLetter(DeadLetterReason::new(
        INTERNAL_ERROR,
        format!(
            "the runner failed while handling this message ({}); it was set aside so that it cannot stop the runner. Please report it together with this message",
            what
        ),
    ))
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
            let in_hand = self.progress.begin();
            tasks.spawn(settle_one(
                delivery,
                self.kind == ConsumerKind::Submit,
                self.handler.clone(),
                (permit, in_hand),
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
        // Handling panics are caught and their messages dead-lettered (`settle_traced`); this is a panic in
        // settling itself. The delivery was dropped unsettled and returns to the queue with its channel.
        error!(queue = label, error = %e, "Settling a message panicked.");
    }
}

/// Handles one delivery and settles it, in a span that carries the message type, the job id and the trace
/// (continued from the delivery's `traceparent`, which the handlers pass on to what they publish and create).
#[allow(clippy::too_many_arguments)]
async fn settle_one(
    delivery: Delivery,
    from_submit_queue: bool,
    handler: Arc<Handler>,
    permit: (OwnedSemaphorePermit, InHandGuard),
    hard_stop: CancellationToken,
    stats: Arc<Stats>,
    requeue_delay: Duration,
    metrics: crate::ops::Metrics,
) {
    use tracing::Instrument;
    // What the span names, read from the delivery's properties and body. Whatever a sender put there, a
    // panic reading it must not leave the delivery unsettled: the message is then handled with a new trace
    // and no job id in its span (and, if the handler panics on the same input, dead-lettered).
    let read = std::panic::catch_unwind(AssertUnwindSafe(|| {
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
        (message_type, trace, job_id)
    }));
    let (message_type, trace, job_id) =
        read.unwrap_or_else(|_| ("unknown", TraceContext::new_root(), String::new()));
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
    permit: (OwnedSemaphorePermit, InHandGuard),
    hard_stop: CancellationToken,
    stats: Arc<Stats>,
    requeue_delay: Duration,
    measured: Measured,
) {
    let _permit = permit;
    let metrics = &measured.metrics;
    let _in_flight = metrics.in_flight();
    let started = Instant::now();
    let mut panic_caught = false;
    let settle = {
        let handled = AssertUnwindSafe(async {
            let mut message = Message::of(&delivery, from_submit_queue);
            message.traceparent = measured.traceparent.clone();
            // On the heap: a submission's future is tens of kilobytes, and each future it is nested in
            // (the panic guard, the select, this task) would otherwise hold and move a copy of it
            // (callgrind, issue 46: memcpy was a tenth of a monitored runner's instructions).
            Box::pin(handler.handle(&message)).await
        })
        .catch_unwind();
        tokio::select! {
            handled = handled => Some(handled.unwrap_or_else(|payload| {
                panic_caught = true;
                panicked(&*payload)
            })),
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
    let outcome = if panic_caught {
        stats.panicked.fetch_add(1, Ordering::Relaxed);
        if let Settle::DeadLetter(reason) = &settle {
            error!(%message_id, reason = %reason.message, "A message handler panicked; the message goes to the dead-letter queue.");
        }
        INTERNAL_ERROR
    } else {
        settle.label()
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_handler_settles_as_a_dead_letter_naming_the_panic() {
        let caught = AssertUnwindSafe(async {
            let index: usize = "3".parse().unwrap();
            let bytes = "0é".as_bytes();
            // Slicing through a character, as the traceparent parser once did.
            std::str::from_utf8(&bytes[..index - 1]).unwrap().len()
        })
        .catch_unwind()
        .await;
        let payload = caught.expect_err("the future panics");
        let Settle::DeadLetter(reason) = panicked(&*payload) else {
            panic!("a panic must dead-letter its message");
        };
        assert_eq!(reason.code, INTERNAL_ERROR);
        assert!(reason.message.contains("Utf8Error"), "{}", reason.message);
        assert!(reason.field.is_none());

        let formatted = AssertUnwindSafe(async { panic!("{}", "y".repeat(5_000)) })
            .catch_unwind()
            .await
            .expect_err("panics");
        let Settle::DeadLetter(reason) = panicked(&*formatted) else {
            panic!("dead letter");
        };
        assert!(reason.message.len() < 600, "the reason stays short");
    }

    #[tokio::test(start_paused = true)]
    async fn progress_reports_a_stall_only_while_a_message_is_held_too_long() {
        let progress = Progress::default();
        let limit = Duration::from_secs(600);
        assert_eq!(progress.stalled(limit), None);
        let first = progress.begin();
        tokio::time::advance(Duration::from_secs(400)).await;
        let second = progress.begin();
        assert_eq!(progress.in_hand(), 2);
        assert_eq!(progress.stalled(limit), None);
        tokio::time::advance(Duration::from_secs(201)).await;
        let why = progress
            .stalled(limit)
            .expect("the first is older than the limit");
        assert!(
            why.starts_with("stalled: a message has been in hand for 601 s"),
            "{why}"
        );
        assert!(why.ends_with("with 2 in hand"), "{why}");
        // The oldest settles: the next one is 201 s old, within the limit.
        drop(first);
        assert_eq!(progress.stalled(limit), None);
        assert_eq!(progress.oldest(), Some(Duration::from_secs(201)));
        drop(second);
        assert_eq!(progress.in_hand(), 0);
        assert_eq!(progress.oldest(), None);
    }

    /// The busy watch tells the first message taken and the last one settled, nothing in between.
    #[test]
    fn busy_changes_only_when_the_first_message_is_taken_and_the_last_settled() {
        let progress = Progress::default();
        let mut busy = progress.busy();
        assert!(!*busy.borrow_and_update());
        let first = progress.begin();
        assert!(busy.has_changed().unwrap(), "the first message taken");
        assert!(*busy.borrow_and_update());
        let second = progress.begin();
        drop(first);
        assert!(!busy.has_changed().unwrap(), "one still in hand: no news");
        drop(second);
        assert!(busy.has_changed().unwrap(), "the last one settled");
        assert!(!*busy.borrow_and_update());
        // A clone of the record shares the watch.
        let _third = progress.clone().begin();
        assert!(*busy.borrow_and_update());
    }
}
