//! Who holds each shard, as a watch of the shard leases shows it: for the submit path of any runner
//! (one with the monitoring duty or not), which decides from it who tells a new job's QUEUED
//! (docs/monitor.md, *Order of a job's events*).
//!
//! A holder counts only while its lease is current: renewed (a change this watch saw) within the lease's
//! duration by this process's clock, *and* its `renewTime` within that duration by the wall clock. The
//! first rule is the one [`super::ShardLeases`] uses to take a shard over (no trust in another runner's
//! clock); the second covers a lease this watch has only just listed, whose last change it did not see.
//! Either way the view may lag behind the leases by the watch's delay: its users must stay safe when it
//! is wrong (see [`Holding`]).

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::time::Instant;

use super::{COMPONENT_SHARD, shard_of};
use crate::cluster::ClusterConfig;
use crate::cluster::labels::{COMPONENT, LEASE_GROUP};
use crate::cluster::view::WatchView;

/// Who holds a job's shard, as far as [`ShardHolders`] knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holding {
    /// The view cannot answer: not listed yet, since a watch error, a lease held under this runner's
    /// own name that its leases no longer count as held (a shard being handed over), or one that has
    /// lapsed only lately (its holder overloaded or dead, and another runner may be taking it over).
    Unknown,
    /// No lease, or one neither renewed nor released for [`STALE_AFTER`] lease durations: no runner
    /// has monitored the shard's jobs for a while. (A lease released lately is being handed over: a
    /// runner that joins takes it within a round.)
    Nobody,
    /// Another runner, whose lease is current and says that its monitor tells the QUEUED of the jobs
    /// left to it ([`TELLS_QUEUED`](crate::cluster::labels::TELLS_QUEUED) naming it).
    Other(String),
    /// Another runner, whose lease is current but does not say so: a runner whose monitor is still
    /// listing the shard it gained (it would tell the QUEUED only once its lists are in), or one older
    /// than the jobs left to their monitor (a rolling upgrade), which would never tell it. The submit
    /// path tells it.
    Older(String),
}

/// How many lease durations a holder's lease must have gone unrenewed before its shard counts as
/// nobody's: a lease that lapsed lately is usually being taken over (a runner that could not renew in
/// time under load, or one killed), and a job of it is better told the old way (its submit path writes
/// the record) than left without the record to a monitor that takes it over a moment later.
pub const STALE_AFTER: u32 = 3;

/// A shard lease as the watch saw it.
#[derive(Debug, Clone)]
struct Seen {
    holder: Option<String>,
    /// Whether the lease's [`TELLS_QUEUED`](crate::cluster::labels::TELLS_QUEUED) names its holder.
    tells_queued: bool,
    /// The lease's own duration, or the configured one when longer (as the leases count it).
    duration: Duration,
    renewed: Option<jiff::Timestamp>,
    /// When this process saw this version of the lease.
    at: Instant,
}

/// The shard leases of `[cluster.lease]`, followed by a watch. Cheap to clone (shared).
#[derive(Clone)]
pub struct ShardHolders {
    api: Api<Lease>,
    view: WatchView<Seen>,
    prefix: String,
    shards: u32,
    identity: String,
    duration: Duration,
    /// When [`ShardHolders::follow`] began: [`ShardHolders::listed`] waits for the first list until
    /// [`LIST_WAIT`] after it, never longer.
    started: Arc<OnceLock<Instant>>,
}

/// How long after its start a runner's submissions wait for the first list of the shard leases. Past it
/// (leases that cannot be watched, say without the `watch` grant) nothing waits: the view answers
/// [`Holding::Unknown`] and the submit path tells QUEUED itself, as without the view.
pub const LIST_WAIT: Duration = Duration::from_secs(5);

/// How often [`ShardHolders::listed`] looks while it waits.
const LIST_POLL: Duration = Duration::from_millis(20);

impl std::fmt::Debug for ShardHolders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardHolders")
            .field("prefix", &self.prefix)
            .field("shards", &self.shards)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl ShardHolders {
    /// The view for the runner named `identity` (its name in the leases) of the shard leases in
    /// `config.namespace`. Empty until [`ShardHolders::follow`] has listed.
    pub fn new(client: kube::Client, config: &ClusterConfig, identity: &str) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            view: WatchView::default(),
            prefix: config.lease.name_prefix.clone(),
            shards: config.lease.shards.max(1),
            identity: identity.to_owned(),
            duration: config.lease.duration,
            started: Arc::default(),
        }
    }

    /// Returns once the view has listed, or at once when it has or can no longer be waited for: only
    /// the submissions of the runner's first [`LIST_WAIT`] wait, so that they are not told the slow
    /// way (a fourth request) only because the view was not ready.
    pub async fn listed(&self) {
        let Some(started) = self.started.get().copied() else {
            return;
        };
        let deadline = started + LIST_WAIT;
        while self.view.read(|_| ()).is_none() && Instant::now() < deadline {
            tokio::time::sleep(LIST_POLL).await;
        }
    }

    /// Keeps the view with a watch of the shard leases until `shutdown`.
    pub async fn follow(&self, shutdown: impl Future<Output = ()>) {
        let selector = format!(
            "{LEASE_GROUP}={},{COMPONENT}={COMPONENT_SHARD}",
            self.prefix
        );
        let configured = self.duration;
        let _ = self.started.set(Instant::now());
        self.view
            .follow(
                self.api.clone(),
                watcher::Config::default().labels(&selector),
                "shard leases",
                move |lease: &Lease| seen(lease, configured, Instant::now()),
                shutdown,
            )
            .await;
    }

    /// Who holds the shard of `job_id` now.
    pub fn holding(&self, job_id: &str) -> Holding {
        let name = format!("{}-shard-{}", self.prefix, shard_of(job_id, self.shards));
        let namespace = self.api.namespace().unwrap_or_default().to_owned();
        let (now, wall) = (Instant::now(), jiff::Timestamp::now());
        self.view
            .read(|live| match live.get(&(name, namespace)) {
                None => Holding::Nobody,
                Some(lease) => judge(lease, &self.identity, now, wall),
            })
            .unwrap_or(Holding::Unknown)
    }
}

fn seen(lease: &Lease, configured: Duration, at: Instant) -> Seen {
    let spec = lease.spec.as_ref();
    let own = spec
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .map(Duration::from_secs)
        .unwrap_or_default();
    Seen {
        tells_queued: super::tells_queued(lease),
        holder: super::holder(lease).map(str::to_owned),
        duration: configured.max(own),
        renewed: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
        at,
    }
}

/// Who holds a lease seen as `lease`, for the runner `me`, at `now` (this process's clock) and `wall`.
fn judge(lease: &Seen, me: &str, now: Instant, wall: jiff::Timestamp) -> Holding {
    let long_ago = jiff::SignedDuration::try_from(lease.duration * STALE_AFTER).unwrap_or_default();
    // Written (renewed, or released: a release writes `renewTime` too) that long ago at least.
    let abandoned = lease
        .renewed
        .and_then(|t| t.checked_add(long_ago).ok())
        .is_none_or(|until| wall >= until);
    let Some(holder) = &lease.holder else {
        return if abandoned {
            Holding::Nobody
        } else {
            Holding::Unknown
        };
    };
    let seen_renewed = now.saturating_duration_since(lease.at) < lease.duration;
    let duration = jiff::SignedDuration::try_from(lease.duration).unwrap_or_default();
    let renewed_lately = lease
        .renewed
        .and_then(|t| t.checked_add(duration).ok())
        .is_some_and(|until| wall < until);
    if !(seen_renewed && renewed_lately) {
        return if abandoned {
            Holding::Nobody
        } else {
            Holding::Unknown
        };
    }
    if holder == me {
        // Its leases count it as not held (or this would not be asked): being handed over.
        return Holding::Unknown;
    }
    if lease.tells_queued {
        Holding::Other(holder.clone())
    } else {
        Holding::Older(holder.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::labels::TELLS_QUEUED;

    fn lease(holder: Option<&str>, renewed: jiff::Timestamp) -> Seen {
        Seen {
            holder: holder.map(str::to_owned),
            tells_queued: holder.is_some(),
            duration: Duration::from_secs(10),
            renewed: Some(renewed),
            at: Instant::now(),
        }
    }

    /// Another runner holds a shard only while its lease is current by both clocks; a released lease
    /// is nobody's, and one under this runner's own name is not judged.
    #[test]
    fn a_holder_counts_only_while_its_lease_is_current() {
        let wall = jiff::Timestamp::now();
        let now = Instant::now();
        let fresh = lease(Some("b"), wall);
        assert_eq!(judge(&fresh, "a", now, wall), Holding::Other("b".into()));
        assert_eq!(judge(&fresh, "b", now, wall), Holding::Unknown);
        assert_eq!(
            judge(&lease(None, wall), "a", now, wall),
            Holding::Unknown,
            "released just now: being handed over"
        );
        let long_released = lease(None, wall - jiff::SignedDuration::from_secs(31));
        assert_eq!(judge(&long_released, "a", now, wall), Holding::Nobody);
        // Listed just now, but not renewed for its duration by its own record: lapsed lately, so
        // perhaps being taken over; abandoned after three durations.
        let stale = lease(Some("b"), wall - jiff::SignedDuration::from_secs(11));
        assert_eq!(judge(&stale, "a", now, wall), Holding::Unknown);
        let abandoned = lease(Some("b"), wall - jiff::SignedDuration::from_secs(31));
        assert_eq!(judge(&abandoned, "a", now, wall), Holding::Nobody);
        // Renewed by its record, but this watch has seen no change for a whole duration.
        let later = now + Duration::from_secs(11);
        let wall_later = wall + jiff::SignedDuration::from_secs(1);
        assert_eq!(judge(&fresh, "a", later, wall_later), Holding::Unknown);
    }

    /// A holder is left a job's QUEUED only when its lease says, under its own name, that it tells it:
    /// a lease without the annotation, or with one an older runner kept when it took the lease over
    /// (naming the runner before it), is an older runner's.
    #[test]
    fn a_holder_that_does_not_say_it_tells_queued_is_an_older_runner() {
        use k8s_openapi::api::coordination::v1::LeaseSpec;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        let wall = jiff::Timestamp::now();
        let now = Instant::now();
        let written = |says: Option<&str>| Lease {
            metadata: kube::api::ObjectMeta {
                annotations: says.map(|who| {
                    std::collections::BTreeMap::from([(TELLS_QUEUED.to_owned(), who.to_owned())])
                }),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("b".into()),
                lease_duration_seconds: Some(10),
                renew_time: Some(MicroTime(wall)),
                ..Default::default()
            }),
        };
        let judged = |says| {
            let seen = seen(&written(says), Duration::from_secs(3), now);
            judge(&seen, "a", now, wall)
        };
        assert_eq!(judged(Some("b")), Holding::Other("b".into()));
        assert_eq!(judged(None), Holding::Older("b".into()));
        assert_eq!(
            judged(Some("c")),
            Holding::Older("b".into()),
            "kept from the runner before it"
        );
    }
}
