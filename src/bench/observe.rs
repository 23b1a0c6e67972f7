//! The two observers of a phase: the simulator's word of each VolcanoJob it creates (when each job
//! appeared in the cluster) and a consumer of the events exchange (when each job's QUEUED arrived).
//! Both record the first instant per job id on the same monotonic clock as the publisher.
//!
//! They run on a thread and runtime of their own ([`Observers`]): in the simulator's runtime they would
//! wait behind its work (serving every runner's requests and watches) and stamp events late.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use lapin::options::BasicConsumeOptions;
use lapin::types::FieldTable;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use super::BenchError;
use crate::messages::v1::{JobEvent, JobState};
use crate::messages::{Format, decode};
use crate::pipeline::names::job_id_from_vcjob_name;

/// First-seen instants by job id, shared between an observer and the phase that reads it.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    inner: Arc<(Mutex<HashMap<String, Instant>>, Notify)>,
}

impl Seen {
    fn record(&self, job_id: &str, at: Instant) {
        let mut map = self.inner.0.lock().expect("not poisoned");
        if !map.contains_key(job_id) {
            map.insert(job_id.to_owned(), at);
            self.inner.1.notify_waiters();
        }
    }

    pub fn len(&self) -> usize {
        self.inner.0.lock().expect("not poisoned").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// When `job_id` was first seen.
    pub fn get(&self, job_id: &str) -> Option<Instant> {
        self.inner
            .0
            .lock()
            .expect("not poisoned")
            .get(job_id)
            .copied()
    }

    /// Waits until at least `count` jobs have been seen.
    pub async fn wait_for(&self, count: usize) {
        loop {
            let notified = self.inner.1.notified();
            if self.len() >= count {
                return;
            }
            notified.await;
        }
    }
}

/// Every delivery of the events queue by message id: how many arrived, and how many repeated an id
/// already delivered (a duplicate: the same event published again).
#[derive(Debug, Default, Clone)]
pub struct Deliveries {
    inner: Arc<Mutex<DeliveryCounts>>,
}

#[derive(Debug, Default)]
struct DeliveryCounts {
    seen: std::collections::HashSet<String>,
    delivered: usize,
    duplicates: usize,
    /// The duplicates by kind of event ([`kind_of`]), to tell where they come from.
    by_kind: std::collections::BTreeMap<&'static str, usize>,
}

impl Deliveries {
    fn record(&self, message_id: &str) {
        let mut inner = self.inner.lock().expect("not poisoned");
        inner.delivered += 1;
        if !inner.seen.insert(message_id.to_owned()) {
            inner.duplicates += 1;
            *inner.by_kind.entry(kind_of(message_id)).or_default() += 1;
        }
    }

    /// `(delivered, duplicates)`.
    pub fn counts(&self) -> (usize, usize) {
        let inner = self.inner.lock().expect("not poisoned");
        (inner.delivered, inner.duplicates)
    }

    /// The duplicates by kind of event (`QUEUED`, `RUNNING`, `tick`, `restart`, ...).
    pub fn duplicates_by_kind(&self) -> std::collections::BTreeMap<&'static str, usize> {
        self.inner.lock().expect("not poisoned").by_kind.clone()
    }
}

/// The job an event's id names (`<jobId>/...`).
fn job_of(message_id: &str) -> &str {
    message_id.split('/').next().unwrap_or_default()
}

/// The kind of an event by its id (`<jobId>/RUNNING`, `<jobId>/<n>` for a tick, `<jobId>/status/...`).
fn kind_of(message_id: &str) -> &'static str {
    let mut parts = message_id.split('/');
    let _job = parts.next();
    match parts.next().unwrap_or_default() {
        "QUEUED" => "QUEUED",
        "RUNNING" => "RUNNING",
        "SUCCESS" => "SUCCESS",
        "FAILURE" => "FAILURE",
        "EXPIRED" => "EXPIRED",
        "CANCELLED" => "CANCELLED",
        "status" => "status",
        "restart" => "restart",
        "refund" => "refund",
        "warning" => "warning",
        "proxy" => "proxy",
        n if n.parse::<u64>().is_ok() => "tick",
        _ => "other",
    }
}

/// Records when each VolcanoJob of a job whose id starts with `prefix` was created, from the
/// simulator in this process ([`crate::sim::SimHandle::created_jobs`]), until `stop`. It used to
/// watch every job's metadata over HTTP: the simulator wrote and sent, and this process decoded, each
/// of a job's half a dozen later changes too (a monitored job's status and the runner's patches), a
/// tenth of this process's instructions per monitored job, on the cores the runners are measured on.
pub fn record_created(
    mut created: tokio::sync::mpsc::UnboundedReceiver<crate::sim::store::Created>,
    prefix: String,
    stop: CancellationToken,
) -> (Seen, tokio::task::JoinHandle<()>) {
    let seen = Seen::default();
    let record = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            let (name, at) = tokio::select! {
                _ = stop.cancelled() => return,
                next = created.recv() => match next {
                    Some(next) => next,
                    None => return,
                },
            };
            if let Some(id) = job_id_from_vcjob_name(&name).filter(|id| id.starts_with(&prefix)) {
                record.record(id, at);
            }
        }
    });
    (seen, task)
}

/// Consumes `queue` (bound to the events exchange) and records each job's first QUEUED event and its
/// first terminal event (SUCCESS, FAILURE, EXPIRED, CANCELLED).
///
/// Without acknowledgements (`no_ack`): the queue is this observer's own, exclusive and deleted with its
/// connection, so a delivery lost with it would be lost to nobody else. Acknowledging each delivery cost
/// a frame to write here and one for RabbitMQ to handle per event, on the cores the runners are measured
/// on, and a monitored job has four events to an unmonitored one's one: the acknowledgements weighed on
/// the monitored phases four times as much.
pub async fn consume_queued(
    channel: lapin::Channel,
    queue: &str,
    stop: CancellationToken,
    deliveries: Deliveries,
) -> Result<(Seen, Seen, tokio::task::JoinHandle<()>), BenchError> {
    let seen = Seen::default();
    let ended = Seen::default();
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "bench-observer".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| BenchError::Broker(format!("consume {queue}: {e}")))?;
    let record = seen.clone();
    let record_end = ended.clone();
    let task = tokio::spawn(async move {
        loop {
            let delivery = tokio::select! {
                _ = stop.cancelled() => return,
                d = consumer.next() => d,
            };
            let now = Instant::now();
            let Some(Ok(delivery)) = delivery else { return };
            let id = delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.as_str());
            if let Some(id) = id {
                deliveries.record(id);
            }
            // A lifecycle transition's id names its job and state (`<jobId>/QUEUED`), and a tick's,
            // RUNNING's or a status event's says it is neither: only other events are decoded.
            match id.map(|id| (id, kind_of(id))) {
                Some((id, "QUEUED")) => {
                    record.record(job_of(id), now);
                    continue;
                }
                Some((id, "SUCCESS" | "FAILURE" | "EXPIRED" | "CANCELLED")) => {
                    record_end.record(job_of(id), now);
                    continue;
                }
                Some((_, "other")) | None => {}
                Some(_) => continue,
            }
            let format = delivery
                .properties
                .content_type()
                .as_ref()
                .and_then(|c| Format::from_content_type(c.as_str()).ok())
                .unwrap_or(Format::Json);
            if let Ok(event) = decode::<JobEvent>(format, &delivery.data) {
                match event.state() {
                    JobState::Queued => record.record(&event.job_id, now),
                    JobState::Success
                    | JobState::Failure
                    | JobState::Expired
                    | JobState::Cancelled => record_end.record(&event.job_id, now),
                    _ => {}
                }
            }
        }
    });
    Ok((seen, ended, task))
}

/// Both observers on a thread of their own, recording until dropped.
pub struct Observers {
    pub queued: Seen,
    pub created: Seen,
    /// Jobs whose terminal event arrived (phases whose jobs run to their end).
    pub ended: Seen,
    /// Every event delivered, and the duplicates among them.
    pub deliveries: Deliveries,
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Observers {
    /// Connects to RabbitMQ from a new thread, binds `queue` to the events exchange (and, given
    /// `created`, records the VolcanoJobs the simulator creates for jobs whose ids start with its
    /// prefix), and returns once the observers are in place.
    pub async fn start(
        config: &crate::config::Config,
        queue: &str,
        created: Option<(
            tokio::sync::mpsc::UnboundedReceiver<crate::sim::store::Created>,
            String,
        )>,
    ) -> Result<Observers, BenchError> {
        let amqp_url = config.broker.url.expose().to_owned();
        let events_exchange = config.broker.events_exchange.clone();
        let queue = queue.to_owned();
        let stop = CancellationToken::new();
        let deliveries = Deliveries::default();
        let counted = deliveries.clone();
        let (ready_tx, ready_rx) = oneshot::channel::<Result<(Seen, Seen, Seen), BenchError>>();
        let token = stop.clone();
        let thread = std::thread::Builder::new()
            .name("bench-observers".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(BenchError::Setup(e.to_string())));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let started = async {
                        let connection = lapin::Connection::connect(
                            &amqp_url,
                            lapin::ConnectionProperties::default(),
                        )
                        .await
                        .map_err(|e| BenchError::Broker(format!("observer connect: {e}")))?;
                        let channel = connection
                            .create_channel()
                            .await
                            .map_err(|e| BenchError::Broker(format!("channel: {e}")))?;
                        super::declare_observer_queue(&channel, &events_exchange, &queue).await?;
                        let (queued, ended, _) =
                            consume_queued(channel, &queue, token.clone(), counted).await?;
                        let created = match created {
                            Some((created, prefix)) => {
                                record_created(created, prefix, token.clone()).0
                            }
                            None => Seen::default(),
                        };
                        Ok::<_, BenchError>((connection, queued, created, ended))
                    };
                    match started.await {
                        Ok((connection, queued, created, ended)) => {
                            let _ = ready_tx.send(Ok((queued, created, ended)));
                            token.cancelled().await;
                            let _ = connection.close(200, "done".into()).await;
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                });
            })
            .map_err(|e| BenchError::Setup(format!("cannot start the observer thread: {e}")))?;
        let (queued, created, ended) = ready_rx
            .await
            .map_err(|_| BenchError::Setup("the observer thread ended early".into()))??;
        Ok(Observers {
            queued,
            created,
            ended,
            deliveries,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Observers {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
