//! The two limits a runner sits between, measured with the same work the runner does and nothing else:
//! - the broker: the submissions consumed and acked, each answered by one confirmed, persistent event of
//!   the size of QUEUED, by a minimal lapin loop with the runner's concurrency;
//! - the simulator: the same number of VolcanoJobs (as the pipeline renders them) created through the
//!   kube client with the runner's concurrency.

use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use kube::Api;
use kube::api::PostParams;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Confirmation};

use super::BenchError;
use super::stats::rate;
use super::workload::Workload;
use crate::config::Config;
use crate::messages::v1::SubmitJob;
use crate::messages::{decode, encode};
use crate::volcano::VolcanoJob;

/// Messages consumed, acked and answered per second by the minimal loop. The submissions must already
/// be in `config.broker.submit_queue`, and a queue must be bound to the events exchange so that the
/// mandatory events are routed, as in a deployment. The prefetch bounds the work in progress, as it
/// does for a runner; the loop itself never waits for anything but the broker (waiting here for a
/// slot would stop it polling the very publishes that free one).
pub async fn broker(
    connection: &lapin::Connection,
    config: &Config,
    workload: &Workload,
    concurrency: u16,
) -> Result<f64, BenchError> {
    let b = &config.broker;
    let consume = connection
        .create_channel()
        .await
        .map_err(|e| BenchError::Broker(format!("channel: {e}")))?;
    let publish = connection
        .create_channel()
        .await
        .map_err(|e| BenchError::Broker(format!("channel: {e}")))?;
    publish
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| BenchError::Broker(format!("confirm mode: {e}")))?;
    consume
        .basic_qos(concurrency, BasicQosOptions { global: false })
        .await
        .map_err(|e| BenchError::Broker(format!("qos: {e}")))?;
    let mut consumer = consume
        .basic_consume(
            b.submit_queue.as_str().into(),
            "bench-broker-limit".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| BenchError::Broker(format!("consume {}: {e}", b.submit_queue)))?;

    // The answer to each submission: its QUEUED event, encoded as a runner encodes it.
    let event_format: crate::messages::Format = config.runner.output_format.into();
    let mut pending = FuturesUnordered::new();
    let total = workload.messages.len();
    let mut received = 0;
    let mut done = 0;
    let mut started = None;
    while done < total {
        tokio::select! {
            delivery = consumer.next(), if received < total => {
                let delivery = match delivery {
                    Some(Ok(d)) => d,
                    Some(Err(e)) => return Err(BenchError::Broker(format!("consume: {e}"))),
                    None => return Err(BenchError::Broker("the consumer ended".into())),
                };
                started.get_or_insert_with(Instant::now);
                received += 1;
                let job: SubmitJob = decode(workload.format, &delivery.data)
                    .map_err(|e| BenchError::Broker(format!("a submission does not decode: {e}")))?;
                let event = crate::durable::queued_event(&job.job_id, jiff::Timestamp::now(), "bench");
                let body = encode(event_format, &event)
                    .map_err(|e| BenchError::Broker(format!("encode: {e}")))?;
                let publish = publish.clone();
                let exchange = b.events_exchange.clone();
                let key = b.lifecycle_routing_key.clone();
                let content_type = event_format.content_type();
                pending.push(async move {
                    let confirm = publish
                        .basic_publish(
                            exchange.as_str().into(),
                            key.as_str().into(),
                            BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() },
                            &body,
                            BasicProperties::default()
                                .with_delivery_mode(2)
                                .with_content_type(content_type.into())
                                .with_message_id(event.event_id.as_str().into()),
                        )
                        .await
                        .map_err(|e| BenchError::Broker(format!("publish: {e}")))?;
                    match confirm.await.map_err(|e| BenchError::Broker(format!("confirm: {e}")))? {
                        Confirmation::Ack(None) => {}
                        Confirmation::Ack(Some(_)) => {
                            return Err(BenchError::Broker("an event was returned: no queue is bound to the events exchange".into()));
                        }
                        other => return Err(BenchError::Broker(format!("an event was not confirmed: {other:?}"))),
                    }
                    delivery
                        .ack(BasicAckOptions::default())
                        .await
                        .map_err(|e| BenchError::Broker(format!("ack: {e}")))?;
                    Ok::<(), BenchError>(())
                });
            }
            Some(result) = pending.next(), if !pending.is_empty() => {
                result?;
                done += 1;
            }
        }
    }
    let elapsed = started.map_or(Duration::ZERO, |s| s.elapsed());
    let _ = consume.close(200, "done".into()).await;
    let _ = publish.close(200, "done".into()).await;
    Ok(rate(total, elapsed))
}

/// VolcanoJob creates per second through `client`, `concurrency` at a time, of the jobs the pipeline
/// renders for the workload (in the owner's namespace, created first and not timed).
pub async fn simulator(
    client: kube::Client,
    config: &Config,
    workload: &Workload,
    concurrency: usize,
) -> Result<f64, BenchError> {
    let now = jiff::Timestamp::now();
    let mut jobs = Vec::with_capacity(workload.messages.len());
    let mut namespaces = std::collections::BTreeSet::new();
    for (_, body) in &workload.messages {
        let job: SubmitJob = decode(workload.format, body)
            .map_err(|e| BenchError::Setup(format!("a submission does not decode: {e}")))?;
        let desired = crate::pipeline::render(&job, config, now)
            .map_err(|e| BenchError::Setup(format!("the submission does not render: {e}")))?;
        namespaces.extend(desired.vcjob.metadata.namespace.clone());
        jobs.push(desired.vcjob);
    }
    for name in &namespaces {
        crate::cluster::namespaces::create_if_missing(&client, name)
            .await
            .map_err(|e| BenchError::Cluster(format!("create namespace {name}: {e}")))?;
    }
    let started = Instant::now();
    let mut creates = futures::stream::iter(jobs.into_iter().map(|job: VolcanoJob| {
        let client = client.clone();
        async move {
            let ns = job.metadata.namespace.clone().unwrap_or_default();
            let api: Api<VolcanoJob> = Api::namespaced(client, &ns);
            api.create(&PostParams::default(), &job)
                .await
                .map_err(|e| BenchError::Cluster(format!("create VolcanoJob: {e}")))
        }
    }))
    .buffer_unordered(concurrency);
    let mut count = 0;
    while let Some(result) = creates.next().await {
        result?;
        count += 1;
    }
    Ok(rate(count, started.elapsed()))
}
