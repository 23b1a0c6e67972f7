//! The submission gate against the simulator: the pause switch flips the watch channel (also through a
//! cut watch), the gate stays closed until the switch has been read, and `max_active_jobs` closes and
//! reopens it as jobs start and finish.

use crate::common;

use std::time::Duration;

use common::*;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use tokio::sync::watch;
use volcano_runner::cluster::capacity::count_active;
use volcano_runner::cluster::{GateState, PauseSwitch, SubmitGate};
use volcano_runner::sim::FaultRule;

const LIMIT: Duration = Duration::from_secs(10);

/// Waits until the gate's state satisfies `f`; returns that state.
async fn until(
    rx: &mut watch::Receiver<GateState>,
    what: &str,
    f: impl FnMut(&GateState) -> bool,
) -> GateState {
    tokio::time::timeout(LIMIT, rx.wait_for(f))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for the gate to be {what}"))
        .expect("the gate is alive")
        .clone()
}

/// Runs `test` while the gate's driver runs; stops the driver afterwards.
async fn with_gate<F, Fut>(env: &Env, test: F)
where
    F: FnOnce(SubmitGate) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (gate, driver) = SubmitGate::new(env.client.clone(), &env.config);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let driver = driver.run(async {
        let _ = stopped.await;
    });
    let test = async {
        test(gate).await;
        stop.send(()).unwrap();
    };
    tokio::join!(driver, test);
}

/// No ConfigMap: open. `pause` closes the gate on the watch channel with the reason; `resume` opens it;
/// deleting the ConfigMap by hand also opens it. `read` agrees with what the gate saw.
#[tokio::test]
async fn the_pause_switch_flips_the_gate() {
    let env = start().await;
    let switch = PauseSwitch::new(env.client.clone(), &env.config);
    let env = &env;
    with_gate(env, |gate| async move {
        let mut rx = gate.subscribe();
        until(&mut rx, "open", GateState::accepts_submissions).await;

        let now: Timestamp = "2026-05-01T10:00:00Z".parse().unwrap();
        switch
            .pause("storage maintenance", "alice", now)
            .await
            .unwrap();
        let closed = until(&mut rx, "paused", |g| !g.accepts_submissions()).await;
        assert_eq!(
            closed.closed_because().as_deref(),
            Some("paused: storage maintenance")
        );
        let read = switch.read().await.unwrap();
        assert!(read.paused);
        assert_eq!(read.changed_by.as_deref(), Some("alice"));
        assert_eq!(read.changed_at, Some(now));

        switch.resume("bob", now).await.unwrap();
        until(&mut rx, "resumed", GateState::accepts_submissions).await;
        assert!(!switch.read().await.unwrap().paused);

        switch.pause("again", "alice", now).await.unwrap();
        until(&mut rx, "paused again", |g| !g.accepts_submissions()).await;
        Api::<ConfigMap>::namespaced(env.client.clone(), &env.config.namespace)
            .delete(switch.name(), &DeleteParams::default())
            .await
            .unwrap();
        until(
            &mut rx,
            "open after the switch was deleted",
            GateState::accepts_submissions,
        )
        .await;
    })
    .await;
}

/// A watch cut by the cluster after every event loses no flip: the watcher resumes and the gate follows.
#[tokio::test]
async fn a_cut_watch_loses_no_flip() {
    let env = start().await;
    env.sim.faults().add_rule(FaultRule {
        resource: "configmaps".into(),
        verb: "watch".into(),
        watch_cut_after_events: Some(1),
        ..FaultRule::default()
    });
    let switch = PauseSwitch::new(env.client.clone(), &env.config);
    with_gate(&env, |gate| async move {
        let mut rx = gate.subscribe();
        until(&mut rx, "open", GateState::accepts_submissions).await;
        let now = Timestamp::UNIX_EPOCH;
        for round in 0..3 {
            switch
                .pause(&format!("round {round}"), "t", now)
                .await
                .unwrap();
            until(&mut rx, "paused", |g| !g.accepts_submissions()).await;
            switch.resume("t", now).await.unwrap();
            until(&mut rx, "resumed", GateState::accepts_submissions).await;
        }
    })
    .await;
}

/// While the switch cannot be read (the API server is down at start), the gate stays closed; it opens
/// once the cluster answers.
#[tokio::test]
async fn the_gate_is_closed_until_the_switch_has_been_read() {
    let env = start().await;
    env.sim
        .faults()
        .unavailable_for(Duration::from_millis(1500));
    with_gate(&env, |gate| async move {
        let started = tokio::time::Instant::now();
        let mut rx = gate.subscribe();
        assert!(!rx.borrow().accepts_submissions());
        assert_eq!(
            rx.borrow().closed_because().as_deref(),
            Some("the pause switch has not been read yet")
        );
        until(&mut rx, "open", GateState::accepts_submissions).await;
        assert!(
            started.elapsed() >= Duration::from_millis(1400),
            "{:?}",
            started.elapsed()
        );
    })
    .await;
}

async fn create_job(env: &Env, ns: &str, name: &str, command: &[&str], managed: bool) {
    let mut job = vcjob_value(ns, name, "sha256:x", command);
    if !managed {
        job["metadata"]["labels"] = serde_json::json!({});
    }
    let job: DynamicObject = serde_json::from_value(job).unwrap();
    jobs(&env.client, ns)
        .create(&PostParams::default(), &job)
        .await
        .unwrap();
}

/// With `max_active_jobs = 2`: two managed jobs close the gate (a job someone else made does not count);
/// one finishing reopens it; a reservation counts until it is dropped or committed, and a committed job
/// counts at once.
#[tokio::test]
async fn the_cap_closes_and_reopens_the_gate() {
    let env = start_with(|c| c.max_active_jobs = Some(2)).await;
    create_namespace(&env.client, "alice").await;
    let env = &env;
    with_gate(env, |gate| async move {
        let mut rx = gate.subscribe();
        let open = until(&mut rx, "open", GateState::accepts_submissions).await;
        assert_eq!(open.active_jobs, Some(0));

        create_job(env, "alice", "foreign", &["sleep", "1000"], false).await;
        create_job(env, "alice", "j-short", &["sleep", "5"], true).await;
        until(&mut rx, "counting one job", |g| g.active_jobs == Some(1)).await;
        assert!(rx.borrow().accepts_submissions());

        // A handler reserves the last slot: nobody else may take one.
        let permit = gate.try_reserve().expect("one slot is free");
        assert!(gate.try_reserve().is_none());
        assert!(!gate.state().accepts_submissions());
        // It creates its job and commits: the job counts before the watch reports it.
        create_job(env, "alice", "j-long", &["sleep", "1000"], true).await;
        permit.commit("alice", "j-long");
        let full = gate.state();
        assert_eq!((full.active_jobs, full.reserved), (Some(2), 0));
        assert!(full.closed_because().unwrap().contains("at capacity"));
        assert_eq!(count_active(&env.client, &env.config).await.unwrap(), 2);

        // The short job finishes in simulated time: the gate opens again.
        env.sim.advance(Duration::from_secs(60));
        let reopened = until(
            &mut rx,
            "open after a job finished",
            GateState::accepts_submissions,
        )
        .await;
        assert_eq!(reopened.active_jobs, Some(1));
        assert_eq!(count_active(&env.client, &env.config).await.unwrap(), 1);
    })
    .await;
}

/// A dropped reservation (the apply failed) frees its slot.
#[tokio::test]
async fn a_dropped_reservation_frees_its_slot() {
    let env = start_with(|c| c.max_active_jobs = Some(1)).await;
    with_gate(&env, |gate| async move {
        let mut rx = gate.subscribe();
        until(&mut rx, "open", GateState::accepts_submissions).await;
        let permit = gate.try_reserve().expect("a slot");
        until(&mut rx, "full", |g| !g.accepts_submissions()).await;
        drop(permit);
        until(&mut rx, "open again", GateState::accepts_submissions).await;
        assert!(gate.try_reserve().is_some());
    })
    .await;
}
