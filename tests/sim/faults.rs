//! Fault injection through the real kube client: error fractions with Retry-After, per resource and
//! verb, latency, cut watches, windows of unavailability, and kube's own retries coping with them.

use crate::sim_support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{PostParams, WatchEvent, WatchParams};
use kube::{Api, Client};
use serde_json::json;
use sim_support::*;
use volcano_runner::sim::{FaultPlan, FaultRule, SimHandle};

/// A client without kube's automatic retries, to see each answer as the server gave it.
fn raw_client(sim: &SimHandle) -> Client {
    let mut cfg = sim.kube_config();
    cfg.default_retry = false;
    Client::try_from(cfg).unwrap()
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {}})).unwrap()
}

#[tokio::test]
async fn errors_carry_status_reason_and_retry_after() {
    let (sim, _) = start().await;
    let client = raw_client(&sim);
    namespace(&client, "f").await;
    sim.faults().add_rule(FaultRule {
        resource: "jobs.batch.volcano.sh".into(),
        verb: "create".into(),
        error_503: 1.0,
        retry_after_secs: 7,
        ..Default::default()
    });
    let api = jobs(&client, "f");
    let err = api
        .create(
            &PostParams::default(),
            &dynamic(gang_job("j", "f", 1, "1", &["sleep", "1"])),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), 503);
    assert_eq!(status(&err).reason, "ServiceUnavailable");
    // Other verbs and resources are untouched.
    assert!(api.list(&Default::default()).await.is_ok());
    Api::<ConfigMap>::namespaced(client.clone(), "f")
        .create(&PostParams::default(), &cm("ok"))
        .await
        .unwrap();

    // The raw answer has the Retry-After header; 429 too.
    sim.faults().set(FaultPlan {
        rules: vec![FaultRule {
            resource: "configmaps".into(),
            error_429: 1.0,
            retry_after_secs: 3,
            ..Default::default()
        }],
        ..Default::default()
    });
    let req = axum::http::Request::get("/api/v1/namespaces/f/configmaps")
        .body(Vec::new())
        .unwrap();
    let resp = client.send(req.map(Into::into)).await.unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(resp.headers()["retry-after"], "3");
    let err = Api::<ConfigMap>::namespaced(client.clone(), "f")
        .get("ok")
        .await
        .unwrap_err();
    assert_eq!(
        (code(&err), status(&err).reason.as_str()),
        (429, "TooManyRequests")
    );
    assert_eq!(
        status(&err).details.as_ref().unwrap().retry_after_seconds,
        3
    );

    sim.faults().set(FaultPlan {
        rules: vec![FaultRule {
            verb: "get".into(),
            error_500: 1.0,
            ..Default::default()
        }],
        ..Default::default()
    });
    let err = Api::<ConfigMap>::namespaced(client.clone(), "f")
        .get("ok")
        .await
        .unwrap_err();
    assert_eq!(
        (code(&err), status(&err).reason.as_str()),
        (500, "InternalError")
    );
    sim.faults().clear();
    Api::<ConfigMap>::namespaced(client.clone(), "f")
        .get("ok")
        .await
        .unwrap();
}

#[tokio::test]
async fn error_fractions_are_seeded_and_repeat() {
    async fn failures() -> usize {
        let (sim, _) = start_with(|c| {
            c.faults = FaultPlan {
                rules: vec![FaultRule {
                    verb: "get".into(),
                    error_500: 0.3,
                    ..Default::default()
                }],
                seed: 11,
                ..Default::default()
            }
        })
        .await;
        let client = raw_client(&sim);
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        api.create(&PostParams::default(), &cm("x")).await.unwrap();
        let mut failed = 0;
        for _ in 0..200 {
            if api.get("x").await.is_err() {
                failed += 1;
            }
        }
        failed
    }
    let first = failures().await;
    assert!(
        (35..=85).contains(&first),
        "about 30% of 200 failed: {first}"
    );
    assert_eq!(
        first,
        failures().await,
        "the same seed fails the same requests"
    );
}

#[tokio::test]
async fn kube_retries_ride_out_transient_503s() {
    let (sim, client) = start().await;
    namespace(&client, "retry").await;
    sim.faults().add_rule(FaultRule {
        resource: "configmaps".into(),
        verb: "create".into(),
        error_503: 0.4,
        retry_after_secs: 0,
        ..Default::default()
    });
    let api: Api<ConfigMap> = Api::namespaced(client, "retry");
    for i in 0..40 {
        api.create(&PostParams::default(), &cm(&format!("c{i}")))
            .await
            .expect("kube retried the 503s");
    }
    assert_eq!(api.list(&Default::default()).await.unwrap().items.len(), 40);
}

#[tokio::test]
async fn latency_is_added_before_the_answer() {
    let (sim, client) = start().await;
    sim.faults().add_rule(FaultRule {
        resource: "configmaps".into(),
        verb: "list".into(),
        latency_ms: 300,
        ..Default::default()
    });
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let t = Instant::now();
    api.list(&Default::default()).await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test]
async fn unavailability_windows_fail_everything() {
    let (sim, _) = start_with(|c| {
        c.faults = FaultPlan {
            unavailable_from_secs: Some(0.0),
            unavailable_secs: Some(3600.0),
            ..Default::default()
        }
    })
    .await;
    let client = raw_client(&sim);
    let err = client.apiserver_version().await.unwrap_err();
    assert_eq!(code(&err), 503);
    let err = Api::<ConfigMap>::namespaced(client.clone(), "default")
        .list(&Default::default())
        .await
        .unwrap_err();
    assert_eq!(code(&err), 503);
    sim.faults().clear();
    client.apiserver_version().await.unwrap();

    sim.faults().unavailable_for(Duration::from_secs(3600));
    assert_eq!(
        code(
            &Api::<ConfigMap>::namespaced(client.clone(), "default")
                .get("x")
                .await
                .unwrap_err()
        ),
        503
    );
    sim.faults().clear();
    assert_eq!(
        code(
            &Api::<ConfigMap>::namespaced(client.clone(), "default")
                .get("x")
                .await
                .unwrap_err()
        ),
        404
    );
}

#[tokio::test]
async fn watches_are_cut_after_n_events() {
    let (sim, client) = start().await;
    namespace(&client, "wc").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "wc");
    for i in 0..5 {
        api.create(&PostParams::default(), &cm(&format!("c{i}")))
            .await
            .unwrap();
    }
    sim.faults().add_rule(FaultRule {
        verb: "watch".into(),
        watch_cut_after_events: Some(3),
        ..Default::default()
    });
    let mut stream = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let mut added = 0;
    // kube reports the dropped connection as the end of the stream (and its watcher then resumes).
    while let Some(item) = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("the stream ends in time")
    {
        match item {
            Ok(WatchEvent::Added(_)) => added += 1,
            Ok(other) => panic!("{other:?}"),
            Err(_) => {}
        }
    }
    assert_eq!(
        added, 3,
        "five objects exist, the watch was cut after three"
    );

    // Cut after some seconds instead (a watch that would otherwise stay open).
    sim.faults().set(FaultPlan {
        rules: vec![FaultRule {
            verb: "watch".into(),
            watch_cut_after_secs: Some(0.2),
            ..Default::default()
        }],
        ..Default::default()
    });
    let rv = version_now(&api).await;
    let t = Instant::now();
    let mut stream = watch_from(&api, &WatchParams::default().timeout(290), &rv).await;
    while tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("ends in time")
        .is_some()
    {}
    assert!(t.elapsed() >= Duration::from_millis(200));
}

/// The reconciliation's metadata lists (read as bytes, page by page, not through kube's text helper):
/// every object of a list of several pages is read back with its version, and a refusal of the API comes
/// back as kube's own error with the API's code and reason, as the monitor's restart of the watches
/// expects.
#[tokio::test]
async fn the_reconciliations_metadata_lists_read_every_page_and_report_refusals() {
    use volcano_runner::monitor::verify::list_versions;
    let (sim, _) = start().await;
    let client = raw_client(&sim);
    namespace(&client, "v").await;
    let api = Api::<ConfigMap>::namespaced(client.clone(), "v");
    let mut created = std::collections::BTreeMap::new();
    for i in 0..1_100 {
        let made = api
            .create(&PostParams::default(), &cm(&format!("cm-{i:04}")))
            .await
            .unwrap();
        created.insert(
            made.metadata.name.unwrap(),
            made.metadata.resource_version.unwrap(),
        );
    }
    let url = api.resource_url().to_owned();
    let listed = list_versions(&client, &url, None, None).await.unwrap();
    assert_eq!(listed.len(), 1_100, "three pages of up to 500");
    let mut read = std::collections::BTreeSet::new();
    for v in listed.iter() {
        assert_eq!(v.namespace, "v");
        let expected = volcano_runner::monitor::cache::Rv::parse(&created[v.name]);
        assert_eq!(v.resource_version, expected, "{}'s version", v.name);
        read.insert(v.name.to_owned());
    }
    assert_eq!(read.len(), created.len());

    sim.faults().add_rule(FaultRule {
        resource: "configmaps".into(),
        verb: "list".into(),
        error_403: 1.0,
        ..Default::default()
    });
    let err = list_versions(&client, &url, None, None).await.unwrap_err();
    assert_eq!(
        (code(&err), status(&err).reason.as_str()),
        (403, "Forbidden")
    );
}
