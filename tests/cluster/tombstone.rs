//! Tombstones against the simulator: a cancel recorded before its submit is found by the check, keeps
//! its first reason, stops counting when it expires, and is swept; the sweeper loop stops on shutdown.

use crate::common;

use std::time::Duration;

use common::*;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use volcano_runner::cluster::Tombstones;
use volcano_runner::cluster::tombstone::name_for;

fn t(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn tombstones(env: &Env) -> Tombstones {
    Tombstones::new(env.client.clone(), &env.config)
}

async fn stored(env: &Env) -> Vec<String> {
    let api: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.config.namespace);
    let list = api
        .list(&ListParams::default().labels("app.kubernetes.io/component=tombstone"))
        .await
        .unwrap();
    let mut names: Vec<String> = list
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    names.sort();
    names
}

/// A recorded cancel is found by the check (with its reason and expiry); another job is not affected; a
/// second cancel of the same job is harmless and keeps the first reason.
#[tokio::test]
async fn a_recorded_cancel_is_found_and_a_second_one_changes_nothing() {
    let env = start_with(|c| c.tombstone_ttl = Duration::from_secs(3600)).await;
    let tombstones = tombstones(&env);
    let now = t("2026-05-01T10:00:00Z");
    assert_eq!(tombstones.check("42", now).await.unwrap(), None);

    let recorded = tombstones.record("42", "user asked", now).await.unwrap();
    assert_eq!(recorded.expires_at, t("2026-05-01T11:00:00Z"));
    let found = tombstones
        .check("42", now)
        .await
        .unwrap()
        .expect("a tombstone");
    assert_eq!(found.reason, "user asked");
    assert_eq!(found.cancelled_at, now);
    assert_eq!(tombstones.check("43", now).await.unwrap(), None);

    let again = tombstones
        .record("42", "second reason", t("2026-05-01T10:30:00Z"))
        .await
        .unwrap();
    assert_eq!(again, recorded, "the first cancel's record stands");
    assert_eq!(stored(&env).await, ["tombstone-42"]);
}

/// An expired tombstone no longer stops a submit, and recording a cancel over it starts a fresh one.
#[tokio::test]
async fn an_expired_tombstone_is_ignored_and_replaced() {
    let env = start_with(|c| c.tombstone_ttl = Duration::from_secs(60)).await;
    let tombstones = tombstones(&env);
    tombstones
        .record("7", "old", t("2026-05-01T10:00:00Z"))
        .await
        .unwrap();
    let later = t("2026-05-01T10:01:00Z");
    assert_eq!(tombstones.check("7", later).await.unwrap(), None);
    let fresh = tombstones.record("7", "new", later).await.unwrap();
    assert_eq!(fresh.reason, "new");
    assert_eq!(fresh.expires_at, t("2026-05-01T10:02:00Z"));
    assert_eq!(
        tombstones.check("7", later).await.unwrap().unwrap().reason,
        "new"
    );
}

/// The sweep deletes exactly the expired tombstones; ids that are not valid names are stored under a
/// hash and still found.
#[tokio::test]
async fn the_sweep_deletes_only_expired_tombstones() {
    let env = start_with(|c| c.tombstone_ttl = Duration::from_secs(3600)).await;
    let tombstones = tombstones(&env);
    tombstones
        .record("old", "r", t("2026-05-01T08:00:00Z"))
        .await
        .unwrap();
    tombstones
        .record("Odd Id/1", "r", t("2026-05-01T09:30:00Z"))
        .await
        .unwrap();
    tombstones
        .record("young", "r", t("2026-05-01T09:50:00Z"))
        .await
        .unwrap();
    assert!(
        tombstones
            .check("Odd Id/1", t("2026-05-01T10:00:00Z"))
            .await
            .unwrap()
            .is_some()
    );
    let now = t("2026-05-01T10:40:00Z");

    let report = tombstones.sweep(now).await.unwrap();
    assert_eq!((report.deleted, report.kept), (2, 1));
    assert_eq!(stored(&env).await, ["tombstone-young"]);
    assert!(tombstones.check("Odd Id/1", now).await.unwrap().is_none());
    assert!(name_for("Odd Id/1").starts_with("tombstone-") && !name_for("Odd Id/1").contains(' '));
}

/// The sweeper loop sweeps on its interval and returns when shutdown completes.
#[tokio::test]
async fn the_sweeper_runs_until_shutdown() {
    let env = start_with(|c| c.tombstone_ttl = Duration::from_secs(60)).await;
    let tombstones = tombstones(&env);
    tombstones
        .record("1", "r", t("2026-05-01T10:00:00Z"))
        .await
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let sweeper = tombstones.run_sweeper(
        Duration::from_millis(50),
        || t("2026-05-01T11:00:00Z"),
        async {
            let _ = stopped.await;
        },
    );
    let check = async {
        eventually(
            "the sweeper to delete the tombstone",
            Duration::from_secs(5),
            || async { stored(&env).await.is_empty() },
        )
        .await;
        stop.send(()).unwrap();
    };
    let ((), ()) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(sweeper, check)
    })
    .await
    .expect("the sweeper returns after shutdown");
}

/// Recording rides out a short outage instead of losing the cancel.
#[tokio::test]
async fn recording_rides_out_a_short_outage() {
    let env = start_with(|c| c.retry.max_elapsed = Duration::from_secs(10)).await;
    env.sim.faults().unavailable_for(Duration::from_millis(800));
    let tombstones = tombstones(&env);
    tombstones
        .record("9", "r", t("2026-05-01T10:00:00Z"))
        .await
        .unwrap();
    assert_eq!(stored(&env).await, ["tombstone-9"]);
}
