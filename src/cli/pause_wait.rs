//! `admin pause --wait`: returns once every runner has stopped taking submissions.
//!
//! A runner stops taking submissions by cancelling its consumer of the submit queue when it sees the
//! pause switch ([`crate::runner::consume::follow_pause`]; the broker returns what it had not handed out
//! yet to the queue). So the broker's consumer count of the submit queue, read with a passive declare
//! (exact now, no management plugin), is how the runners report that they paused: at 0, no runner can
//! receive a submission. Submissions already handed out finish; none is started after. Each change is
//! printed as a progress line, with the live runners (member leases) for context.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use tokio_util::sync::CancellationToken;

use super::CliError;
use crate::cluster::labels::COMPONENT;
use crate::cluster::lease::COMPONENT_MEMBER;
use crate::config::Config;

/// How often the consumer count is read.
const POLL: Duration = Duration::from_millis(500);

/// A queue's ready messages and consumers, right now (a passive declare: exact, creates nothing), or
/// `None` when the queue does not exist (no runner has declared the topology in the vhost). Each read
/// has a channel of its own: the broker closes the channel of a passive declare that finds nothing.
pub(super) async fn depth(
    broker: &crate::broker::Broker,
    queue: &str,
) -> Result<Option<(u32, u32)>, CliError> {
    let (_, channel) = broker
        .channel()
        .await
        .map_err(|e| CliError::Other(format!("RabbitMQ: {e}")))?;
    let declared = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await;
    let read = match declared {
        Ok(q) => Ok(Some((q.message_count(), q.consumer_count()))),
        Err(e) if crate::broker::topology::is_not_found(&e) => Ok(None),
        Err(e) => Err(CliError::Other(format!("queue {queue}: {e}"))),
    };
    let _ = channel.close(200, "depth read".into()).await;
    read
}

/// Runners whose member lease is live now (`None`: the leases cannot be read, e.g. no permission).
async fn live_runners(client: &kube::Client, config: &Config) -> Option<usize> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &config.cluster.namespace);
    let params = ListParams::default().labels(&format!("{COMPONENT}={COMPONENT_MEMBER}"));
    let leases = api.list(&params).await.ok()?;
    let now = jiff::Timestamp::now();
    Some(leases.items.iter().filter(|l| live(l, now)).count())
}

/// Whether a lease was renewed within its duration at `now`.
pub(super) fn live(lease: &Lease, now: jiff::Timestamp) -> bool {
    let Some(spec) = &lease.spec else {
        return false;
    };
    spec.renew_time.as_ref().is_some_and(|r| {
        let duration = i64::from(spec.lease_duration_seconds.unwrap_or(0));
        r.0.checked_add(jiff::SignedDuration::from_secs(duration))
            .is_ok_and(|until| until > now)
    })
}

/// One progress line.
pub fn progress(consumers: u32, queue: &str, runners: Option<usize>) -> String {
    let runners = runners
        .map(|n| format!(" ({n} live runner{})", if n == 1 { "" } else { "s" }))
        .unwrap_or_default();
    format!(
        "waiting: {consumers} consumer{} of {queue} still take{} submissions{runners}",
        if consumers == 1 { "" } else { "s" },
        if consumers == 1 { "s" } else { "" },
    )
}

/// Waits until no consumer is left on the submit queue, printing each change; an error after `timeout`.
pub async fn wait(
    config: &Config,
    client: &kube::Client,
    timeout: Duration,
) -> Result<(), CliError> {
    let shutdown = CancellationToken::new();
    // Waiting declares nothing, and a vhost without the topology is an answer, not an error.
    let broker = super::inspect_broker(config, shutdown).await?;
    let queue = config.broker.submit_queue.as_str();
    let started = Instant::now();
    let mut last: Option<(u32, Option<usize>)> = None;
    let result = loop {
        let (ready, consumers) = match depth(&broker, queue).await {
            Ok(Some(read)) => read,
            Ok(None) => {
                println!(
                    "no runner takes submissions: the submit queue {queue} does not exist in {} (no \
                     runner has declared the topology there)",
                    config.broker.endpoint()
                );
                break Ok(());
            }
            Err(e) => break Err(e),
        };
        if consumers == 0 {
            println!(
                "every runner has stopped taking submissions: no consumer of {queue} is left; {ready} \
                 submission{} wait{} in it ({:.1}s)",
                if ready == 1 { "" } else { "s" },
                if ready == 1 { "s" } else { "" },
                started.elapsed().as_secs_f64()
            );
            break Ok(());
        }
        let runners = live_runners(client, config).await;
        if last != Some((consumers, runners)) {
            println!("{}", progress(consumers, queue, runners));
            last = Some((consumers, runners));
        }
        if started.elapsed() >= timeout {
            break Err(CliError::Other(format!(
                "submissions are paused, but {consumers} consumer{} of {queue} still take{} them after \
                 {timeout:?}: a runner that cannot read the pause switch (its /readyz and log say why), or a \
                 consumer that is not a runner. `admin status` shows the consumers; wait longer with \
                 --timeout",
                if consumers == 1 { "" } else { "s" },
                if consumers == 1 { "s" } else { "" },
            )));
        }
        tokio::time::sleep(POLL).await;
    };
    broker.close().await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_progress_line_counts_consumers_and_runners() {
        assert_eq!(
            progress(2, "compute.submit", Some(3)),
            "waiting: 2 consumers of compute.submit still take submissions (3 live runners)"
        );
        assert_eq!(
            progress(1, "q", None),
            "waiting: 1 consumer of q still takes submissions"
        );
    }
}
