//! A monitored phase starts once the runners' shards have settled, as in a fleet that has been running:
//! every shard held, every runner holding some, and every holder saying on its lease that its
//! monitor tells the QUEUED of the jobs left to it (it has listed the shard). Submissions published
//! while runners still hand shards to one another measure the hand-over (a newcomer lists every job,
//! pod and PodGroup under the load of the phase), not the capacity of the fleet.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use tokio::time::Instant;

use super::BenchError;
use crate::cluster::labels::{COMPONENT, LEASE_GROUP};
use crate::cluster::lease::{holder, tells_queued};
use crate::config::Config;
use crate::sim::SimHandle;

/// How long a phase waits for the shards to settle before it starts anyway (said at WARN): runners run
/// under a profiler (`--runner-wrap`) take their leases slowly.
const SETTLE_WAIT: Duration = Duration::from_secs(120);

/// How often the leases are listed while waiting.
const POLL: Duration = Duration::from_millis(200);

/// How often the wait says what it waits for.
const PROGRESS: Duration = Duration::from_secs(5);

/// Why the shard leases `leases` (of `shards` shards, `runners` runners) have not settled, or `None`
/// when they have: each shard's lease held, by as many runners as there are (or shards, when fewer),
/// and each lease naming its holder in `volcano-runner/tells-queued` ([`tells_queued`]). Not that the
/// shares are even: the leases move a shard beyond a runner's share only to a runner that holds none
/// (docs/monitor.md, *Failover*), so 4, 2 and 2 of 8 shards among three runners is where they stay.
pub fn unsettled(leases: &[Lease], shards: u32, runners: usize) -> Option<String> {
    let mut held: BTreeMap<&str, u32> = BTreeMap::new();
    let mut silent = 0;
    for lease in leases {
        let Some(holder) = holder(lease) else {
            continue;
        };
        *held.entry(holder).or_default() += 1;
        if !tells_queued(lease) {
            silent += 1;
        }
    }
    let taken: u32 = held.values().sum();
    let holders = held.len();
    let expected = runners.min(shards as usize);
    if taken < shards {
        Some(format!("{taken} of {shards} shards held"))
    } else if holders < expected {
        Some(format!("{holders} of {expected} runners hold shards"))
    } else if silent > 0 {
        Some(format!(
            "{silent} shard leases do not say yet that their holder tells QUEUED (it is listing)"
        ))
    } else {
        None
    }
}

/// Waits until the runners' shards on the simulated cluster `sim` have settled ([`unsettled`]), at
/// most [`SETTLE_WAIT`]; past it the phase starts anyway, and says why at WARN.
pub async fn wait_for_shards(
    sim: &SimHandle,
    config: &Config,
    runners: usize,
) -> Result<(), BenchError> {
    let client = sim
        .client()
        .map_err(|e| BenchError::Cluster(e.to_string()))?;
    let lease = &config.cluster.lease;
    let api: Api<Lease> = Api::namespaced(client, &config.cluster.namespace);
    let selector = format!(
        "{LEASE_GROUP}={},{COMPONENT}={}",
        lease.name_prefix,
        crate::cluster::lease::COMPONENT_SHARD
    );
    let started = Instant::now();
    let deadline = started + SETTLE_WAIT;
    let mut told = started;
    let mut why = String::from("the leases could not be listed");
    while Instant::now() < deadline {
        match api.list(&ListParams::default().labels(&selector)).await {
            Ok(list) => match unsettled(&list.items, lease.shards.max(1), runners) {
                None => {
                    tracing::info!(took = ?started.elapsed(), "The runners' shards have settled.");
                    return Ok(());
                }
                Some(reason) => why = reason,
            },
            Err(e) => why = format!("the leases could not be listed: {e}"),
        }
        if told.elapsed() >= PROGRESS {
            told = Instant::now();
            tracing::info!(why, "Waiting for the runners' shards to settle.");
        }
        tokio::time::sleep(POLL).await;
    }
    tracing::warn!(
        waited = ?SETTLE_WAIT,
        why,
        "The runners' shards did not settle; the phase starts anyway and measures their hand-over too."
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::labels::TELLS_QUEUED;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use kube::api::ObjectMeta;

    fn lease(holder: Option<&str>, tells: Option<&str>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                annotations: tells
                    .map(|t| BTreeMap::from([(TELLS_QUEUED.to_owned(), t.to_owned())])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                ..LeaseSpec::default()
            }),
        }
    }

    fn held(by: &[&str]) -> Vec<Lease> {
        by.iter().map(|h| lease(Some(h), Some(h))).collect()
    }

    #[test]
    fn shards_shared_and_told_are_settled() {
        assert_eq!(
            unsettled(&held(&["a", "b", "c", "a", "b", "c", "a", "b"]), 8, 3),
            None
        );
        assert_eq!(unsettled(&held(&["a"; 8]), 8, 1), None);
        // More runners than shards: each shard held once is enough.
        assert_eq!(unsettled(&held(&["a", "b"]), 2, 3), None);
    }

    #[test]
    fn a_shard_not_held_a_runner_without_shards_or_one_short_is_not_settled() {
        let seven = held(&["a", "b", "c", "a", "b", "c", "a"]);
        assert_eq!(
            unsettled(&seven, 8, 3).as_deref(),
            Some("7 of 8 shards held")
        );
        let mut free = held(&["a", "b", "c", "a", "b", "c", "a"]);
        free.push(lease(None, None));
        assert_eq!(
            unsettled(&free, 8, 3).as_deref(),
            Some("7 of 8 shards held")
        );
        assert_eq!(
            unsettled(&held(&["a", "b", "a", "b", "a", "b", "a", "b"]), 8, 3).as_deref(),
            Some("2 of 3 runners hold shards")
        );
    }

    /// Uneven shares stay as they are once every runner holds one: waiting for even ones waited the
    /// whole two minutes for a state the leases never reach.
    #[test]
    fn uneven_shares_that_the_leases_keep_are_settled() {
        assert_eq!(
            unsettled(&held(&["a", "a", "a", "a", "b", "b", "c", "c"]), 8, 3),
            None
        );
        assert_eq!(
            unsettled(&held(&["a", "b", "c", "a", "a", "a", "a", "b"]), 8, 3),
            None
        );
    }

    #[test]
    fn a_lease_that_does_not_name_its_holder_as_telling_queued_is_not_settled() {
        let mut leases = held(&["a", "b", "c", "a", "b", "c", "a", "b"]);
        leases[2] = lease(Some("c"), None);
        leases[5] = lease(Some("c"), Some("b"));
        assert_eq!(
            unsettled(&leases, 8, 3).as_deref(),
            Some("2 shard leases do not say yet that their holder tells QUEUED (it is listing)")
        );
    }
}
