//! Shard leases against the simulator, in real time with short durations (lease 2 s, renew every
//! 300 ms, safety margin 500 ms): runners split the shards, a dead runner's shards are taken over after
//! the lease lapses (never earlier), a clean shutdown hands them over at once, one shard is leader
//! election, and a runner that cannot renew stops its duty before its lease can expire. Throughout, a
//! sampler checks that no shard is ever held by two runners at the same instant.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
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

/// Checks every 5 ms, until stopped, that no shard is held by two runners at once.
fn sampler(runners: Vec<LeaseHandle>) -> (Arc<AtomicBool>, JoinHandle<Vec<String>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let task = tokio::spawn(async move {
        let mut violations = Vec::new();
        while !flag.load(Ordering::Relaxed) {
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
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        violations
    });
    (stop, task)
}

async fn no_overlap(sampler: (Arc<AtomicBool>, JoinHandle<Vec<String>>)) {
    sampler.0.store(true, Ordering::Relaxed);
    let violations = sampler.1.await.unwrap();
    assert!(violations.is_empty(), "{violations:?}");
}

/// A alone takes all four shards; B joins and they settle on two each; B dies and A takes B's shards
/// only after B's leases have lapsed, within duration + a few rounds. No shard is ever held twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_split_the_shards_and_take_over_a_dead_runners() {
    let env = start().await;
    let a = Runner::start(&env, "runner-a", 4);
    eventually("A to hold every shard", LIMIT, || async {
        a.holding().len() == 4
    })
    .await;

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
    let a = Runner::start(&env, "runner-a", 4);
    eventually("A to hold every shard", LIMIT, || async {
        a.holding().len() == 4
    })
    .await;

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
