//! Shard leases against the simulator, in real time with short durations (lease 2 s, renew every
//! 300 ms, safety margin 500 ms): runners split the shards, a dead runner's shards are taken over after
//! the lease lapses (never earlier), a clean shutdown hands them over at once, one shard is leader
//! election, a runner that cannot renew stops its duty before its lease can expire, and a shard handed
//! over while its work outlives the deadline lapses instead of being released. Throughout, a
//! sampler checks that no shard is ever held by two runners at the same instant.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::Api;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use volcano_runner::cluster::{ClusterConfig, LeaseHandle, ShardLeases};

const DURATION: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_millis(300);
const MARGIN: Duration = Duration::from_millis(500);
const LIMIT: Duration = Duration::from_secs(10);

fn lease_config(base: &ClusterConfig, identity: &str, shards: u32) -> ClusterConfig {
    let mut config = base.clone();
    config.lease.identity = Some(identity.to_owned());
    config.lease.shards = shards;
    config.lease.duration = DURATION;
    config.lease.renew_interval = RENEW;
    config.lease.safety_margin = MARGIN;
    config.validate().expect("valid lease settings");
    config
}

/// One runner's lease loop, run on its own task.
struct Runner {
    handle: LeaseHandle,
    task: JoinHandle<()>,
    stop: Option<oneshot::Sender<()>>,
}

impl Runner {
    fn start(env: &Env, identity: &str, shards: u32) -> Self {
        let config = lease_config(&env.config, identity, shards);
        let (leases, handle) = ShardLeases::new(env.client.clone(), &config);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(leases.run(async {
            let _ = stopped.await;
        }));
        Self {
            handle,
            task,
            stop: Some(stop),
        }
    }

    /// Shards this runner may act on now (set and deadline).
    fn holding(&self) -> BTreeSet<u32> {
        let held = self.handle.held();
        (0..held.shards()).filter(|s| held.holds(*s)).collect()
    }

    /// Stops the loop as a crash would: no release, no goodbye.
    fn kill(&self) {
        self.task.abort();
    }

    /// Stops the loop cleanly and waits for it to hand its shards back.
    async fn shutdown(&mut self) {
        self.stop.take().unwrap().send(()).unwrap();
        (&mut self.task).await.unwrap();
    }
}

/// `runner-a` started alone, once it holds every one of the `shards`.
async fn alone(env: &Env, shards: u32) -> Runner {
    let a = Runner::start(env, "runner-a", shards);
    eventually("A to hold every shard", LIMIT, || async {
        a.holding().len() == shards as usize
    })
    .await;
    a
}

/// A task that looks at the runners or their leases at a steady pace while the test goes on, and what
/// it gathered once [`Sampling::finish`] stops it.
struct Sampling<T> {
    stop: Arc<AtomicBool>,
    task: JoinHandle<T>,
}

impl<T> Sampling<T> {
    /// Runs `body` on its own task; its loop asks [`Looks::next`] before each look.
    fn start<F>(every: Duration, body: impl FnOnce(Looks) -> F) -> Self
    where
        F: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let looks = Looks {
            stop: stop.clone(),
            every,
            first: true,
        };
        Self {
            stop,
            task: tokio::spawn(body(looks)),
        }
    }

    /// Stops the looking and returns what it gathered.
    async fn finish(self) -> T {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// The pace of a [`Sampling`]: the first look at once, then one every `every` until it is stopped.
struct Looks {
    stop: Arc<AtomicBool>,
    every: Duration,
    first: bool,
}

impl Looks {
    /// Whether to look again (after the pause since the last look).
    async fn next(&mut self) -> bool {
        if !std::mem::take(&mut self.first) {
            tokio::time::sleep(self.every).await;
        }
        !self.stop.load(Ordering::Relaxed)
    }
}

/// Checks every 5 ms, until finished, that no shard is held by two runners at once.
fn sampler(runners: Vec<LeaseHandle>) -> Sampling<Vec<String>> {
    Sampling::start(Duration::from_millis(5), |mut looks| async move {
        let mut violations = Vec::new();
        while looks.next().await {
            let views: Vec<_> = runners.iter().map(LeaseHandle::held).collect();
            let shards = views.first().map(|v| v.shards()).unwrap_or(0);
            for shard in 0..shards {
                let holders: Vec<&str> = views
                    .iter()
                    .zip(&runners)
                    .filter(|(v, _)| v.holds(shard))
                    .map(|(_, r)| r.identity())
                    .collect();
                if holders.len() > 1 {
                    violations.push(format!("shard {shard} held by {holders:?}"));
                }
            }
        }
        violations
    })
}

async fn no_overlap(sampler: Sampling<Vec<String>>) {
    let violations = sampler.finish().await;
    assert!(violations.is_empty(), "{violations:?}");
}

/// A alone takes all four shards; B joins and they settle on two each; B dies and A takes B's shards
/// only after B's leases have lapsed, within duration + a few rounds. No shard is ever held twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_split_the_shards_and_take_over_a_dead_runners() {
    let env = start().await;
    let a = alone(&env, 4).await;

    let b = Runner::start(&env, "runner-b", 4);
    let check = sampler(vec![a.handle.clone(), b.handle.clone()]);
    eventually("A and B to hold two shards each", LIMIT, || async {
        a.holding().len() == 2 && b.holding().len() == 2
    })
    .await;
    let b_shards = b.holding();
    assert!(a.holding().is_disjoint(&b_shards));

    let killed = Instant::now();
    b.kill();
    let took = eventually("A to take over B's shards", LIMIT, || async {
        a.holding().len() == 4
    })
    .await;
    assert!(
        took >= DURATION - RENEW - Duration::from_millis(100),
        "taken after {took:?}, before B's lease could have lapsed"
    );
    assert!(
        took <= DURATION + RENEW * 4 + Duration::from_secs(1),
        "taken only after {took:?}"
    );
    assert!(
        b.holding().is_empty(),
        "B's own view lapsed with its deadlines"
    );
    assert!(killed.elapsed() >= took);
    no_overlap(check).await;
}

/// A runner that shuts down cleanly releases its shards, so the other takes them in a few rounds, far
/// sooner than a lease duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_shutdown_hands_the_shards_over_at_once() {
    let env = start().await;
    let a = Runner::start(&env, "runner-a", 4);
    let mut b = Runner::start(&env, "runner-b", 4);
    let check = sampler(vec![a.handle.clone(), b.handle.clone()]);
    eventually("A and B to hold two shards each", LIMIT, || async {
        a.holding().len() == 2 && b.holding().len() == 2
    })
    .await;

    b.shutdown().await;
    assert!(b.holding().is_empty());
    let took = eventually("A to take the released shards", LIMIT, || async {
        a.holding().len() == 4
    })
    .await;
    assert!(took < DURATION - MARGIN, "released shards took {took:?}");
    no_overlap(check).await;
}

/// Every shard lease as it last was while it named `identity`, by name, looked at every 10 ms until
/// finished: a renewal the old holder made is seen before the next holder's write replaces it (a
/// round writes once per `RENEW`).
fn renewals_by(env: &Env, identity: &str) -> Sampling<BTreeMap<String, Lease>> {
    let api: Api<Lease> = Api::namespaced(env.client.clone(), &env.config.namespace);
    let identity = identity.to_owned();
    Sampling::start(Duration::from_millis(10), |mut looks| async move {
        let mut last = BTreeMap::new();
        while looks.next().await {
            for lease in api.list(&Default::default()).await.unwrap().items {
                let name = lease.metadata.name.clone().unwrap_or_default();
                let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
                if name.contains("-shard-") && holder.as_deref() == Some(identity.as_str()) {
                    last.insert(name, lease);
                }
            }
        }
        last
    })
}

/// The shards `runner` comes to hold again after it let them go, looked at every 5 ms until finished.
fn regains_of(runner: LeaseHandle) -> Sampling<Vec<u32>> {
    Sampling::start(Duration::from_millis(5), |mut looks| async move {
        let holding = || {
            let held = runner.held();
            (0..held.shards())
                .filter(|s| held.holds(*s))
                .collect::<BTreeSet<u32>>()
        };
        let mut before = holding();
        let mut let_go: BTreeSet<u32> = BTreeSet::new();
        let mut regained = Vec::new();
        while looks.next().await {
            let now = holding();
            let_go.extend(before.difference(&now));
            regained.extend(now.difference(&before).filter(|s| let_go.contains(*s)));
            before = now;
        }
        regained
    })
}

/// A lease's spec, as every lease written by a runner has one.
fn spec(lease: &Lease) -> &LeaseSpec {
    lease
        .spec
        .as_ref()
        .expect("a lease written by a runner has a spec")
}

/// A shard handed to a newcomer while work on its jobs is still under way at its deadline (a write in
/// flight behind a slow API) is not released but left to lapse: the newcomer takes it a whole lease
/// duration after the old holder's last renewal instead of at the deadline, which gives that write
/// the safety margin and more to land first; the old holder does not renew it for itself meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_whose_work_outlives_its_deadline_lapses_instead_of_being_released() {
    let env = start().await;
    let a = alone(&env, 2).await;
    // Work on jobs of both shards begins and never ends while the test runs.
    let held = a.handle.held();
    let duties: Vec<_> = (0..32)
        .map(|i| held.begin_duty(&format!("job-{i}")))
        .collect();
    let renewals = renewals_by(&env, "runner-a");
    let regains = regains_of(a.handle.clone());

    let b = Runner::start(&env, "runner-b", 2);
    let check = sampler(vec![a.handle.clone(), b.handle.clone()]);
    eventually("B to take a shard", LIMIT, || async {
        b.holding().len() == 1
    })
    .await;
    let by_a = renewals.finish().await;
    let taken = *b.holding().first().unwrap();
    let api: Api<Lease> = Api::namespaced(env.client.clone(), &env.config.namespace);
    let name = by_a
        .keys()
        .find(|n| n.ends_with(&format!("-shard-{taken}")))
        .expect("A held the shard B took")
        .clone();
    let now_held = api.get(&name).await.unwrap();
    assert_eq!(spec(&now_held).holder_identity.as_deref(), Some("runner-b"));
    let last_renewal = spec(&by_a[&name]).renew_time.as_ref().expect("renewed");
    let acquired = spec(&now_held).acquire_time.as_ref().expect("acquired");
    let gap = acquired.0.duration_since(last_renewal.0);
    assert!(
        gap >= jiff::SignedDuration::try_from(DURATION).unwrap(),
        "B took the shard {gap:?} after A's last renewal: released at A's deadline with its work under way"
    );
    // A keeps the other shard and does not take this one back for itself.
    tokio::time::sleep(RENEW * 4).await;
    assert_eq!(a.holding().len(), 1, "A holds {:?}", a.holding());
    assert_eq!(b.holding(), BTreeSet::from([taken]));
    let regained = regains.finish().await;
    assert!(
        regained.is_empty(),
        "A took back {regained:?} it had given up"
    );
    drop(duties);
    no_overlap(check).await;
}

/// With one shard it is leader election: of three runners exactly one leads; when it dies another
/// takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shard_is_leader_election() {
    let env = start().await;
    let runners: Vec<Runner> = ["r-1", "r-2", "r-3"]
        .into_iter()
        .map(|id| Runner::start(&env, id, 1))
        .collect();
    let check = sampler(runners.iter().map(|r| r.handle.clone()).collect());
    let leaders = || runners.iter().filter(|r| r.holding().contains(&0)).count();
    eventually("a leader", LIMIT, || async { leaders() == 1 }).await;
    let leader = runners
        .iter()
        .position(|r| !r.holding().is_empty())
        .unwrap();
    assert!(runners[leader].handle.owns("any job id"));

    runners[leader].kill();
    eventually("a new leader", LIMIT, || async {
        runners
            .iter()
            .enumerate()
            .any(|(i, r)| i != leader && r.holding().contains(&0))
    })
    .await;
    no_overlap(check).await;
}

/// When the API server goes away, a holder stops its duty within duration - margin of its last renewal
/// (well before anyone could take over), and takes the shards up again once it can renew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_cannot_renew_stops_before_its_lease_expires() {
    let env = start().await;
    let a = alone(&env, 4).await;

    env.sim.faults().unavailable_for(Duration::from_secs(4));
    let outage = Instant::now();
    let stopped = eventually("A to stop its duty", LIMIT, || async {
        a.holding().is_empty()
    })
    .await;
    // The last successful renewal was at most one round before the outage.
    assert!(
        stopped <= DURATION - MARGIN + Duration::from_millis(100),
        "duty kept for {stopped:?} without renewing"
    );
    assert!(
        stopped >= DURATION - MARGIN - RENEW - Duration::from_millis(100),
        "{stopped:?}"
    );

    eventually("A to hold its shards again", LIMIT, || async {
        a.holding().len() == 4
    })
    .await;
    assert!(
        outage.elapsed() >= Duration::from_secs(4),
        "renewed during the outage?"
    );
}
