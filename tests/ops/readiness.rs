//! /readyz follows the runner's dependencies: it fails while the broker is gone and recovers when it is
//! back, and the same for the API server. The broker "goes away" by having the test's vhost deleted
//! (RabbitMQ closes every connection to it and refuses new ones, as a stopped broker would) and "comes
//! back" by having it created again; the shared RabbitMQ itself is never stopped.

use crate::ops_common;

use std::time::Duration;

use volcano_runner::ops::Ops;

use ops_common::fleet::Fleet;
use ops_common::rabbit::{management, segment};
use ops_common::*;

/// Polls /readyz until its status is `want`; returns the body.
async fn readyz_becomes(addr: std::net::SocketAddr, want: u16, what: &str) -> String {
    readyz_when(addr, want, what, |_| true).await
}

/// Polls /readyz until its status is `want` and its body passes `check`; returns the body.
async fn readyz_when(
    addr: std::net::SocketAddr,
    want: u16,
    what: &str,
    check: impl Fn(&str) -> bool,
) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _, body) = http_get(addr, "/readyz").await;
        if status == want && check(&body) {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz stayed {status} ({body}) waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_broker_and_the_cluster() {
    let ops = Ops::new();
    let (addr, stop) = serve(&ops).await;
    let mut fleet = Fleet::start("ready", ops.clone(), |c| {
        c.ops.cluster_check_ttl = Duration::ZERO;
    })
    .await;
    let body = readyz_becomes(addr, 200, "the runner to start").await;
    assert_eq!(
        body,
        "ok cluster\nok broker\nok submit consumer\nok control consumer\nok events routing\nok own namespace\nok shard leases\n"
    );

    // Paused: still ready (the runner does what it was told, and a rollout must not stall on it), but
    // /readyz says that the submit consumer takes nothing, and why.
    let switch =
        volcano_runner::cluster::PauseSwitch::new(fleet.admin.clone(), &fleet.config.cluster);
    switch
        .pause("maintenance window", "ops-test", jiff::Timestamp::now())
        .await
        .unwrap();
    let body = readyz_when(addr, 200, "the pause to be seen", |b| b.contains("paused")).await;
    assert!(
        body.contains(
            "ok submit consumer: not taking submissions (paused: maintenance window); they wait in the queue\n"
        ),
        "{body}"
    );
    assert!(body.contains("ok control consumer\n"), "{body}");
    switch
        .resume("ops-test", jiff::Timestamp::now())
        .await
        .unwrap();
    let body = readyz_when(addr, 200, "the resume to be seen", |b| {
        !b.contains("paused")
    })
    .await;
    assert!(body.contains("ok submit consumer\n"), "{body}");

    // The broker goes away.
    let vhost = segment(&fleet.vhost.name);
    let (status, body) = management("DELETE", &format!("/api/vhosts/{vhost}"), None).await;
    assert!(matches!(status, 204 | 200), "{status} {body}");
    // The broker's line and the consumers' lines are each updated by their own task, milliseconds
    // apart: wait for all three to say so (readiness itself is 503 from the first).
    let body = readyz_when(
        addr,
        503,
        "the broker and its consumers to be missed",
        |b| {
            b.contains("failed broker:")
                && b.contains("failed submit consumer:")
                && b.contains("failed control consumer:")
        },
    )
    .await;
    assert!(
        body.contains("failed broker: not connected to RabbitMQ"),
        "{body}"
    );
    // The consumers do not claim to consume while there is no connection to consume on.
    for consumer in ["submit", "control"] {
        assert!(
            body.contains(&format!(
                "failed {consumer} consumer: not consuming: the broker connection is down"
            )),
            "{body}"
        );
    }
    assert!(body.contains("ok cluster"), "{body}");
    // Liveness is not affected: the kubelet must not restart a runner for a broker outage.
    assert_eq!(http_get(addr, "/healthz").await.0, 200);

    // It comes back: the runner reconnects and declares its topology again by itself.
    let (status, body) = management("PUT", &format!("/api/vhosts/{vhost}"), None).await;
    assert!(matches!(status, 201 | 204), "{status} {body}");
    let permissions = serde_json::json!({"configure": ".*", "write": ".*", "read": ".*"});
    let (status, body) = management(
        "PUT",
        &format!("/api/permissions/{vhost}/guest"),
        Some(&permissions),
    )
    .await;
    assert!(matches!(status, 201 | 204), "{status} {body}");
    readyz_becomes(addr, 200, "the broker to be back").await;
    let reconnects =
        volcano_runner::ops::metrics::Samples::parse(&http_get(addr, "/metrics").await.2)
            .unwrap()
            .value("volcano_runner_broker_reconnects_total", &[]);
    assert!(reconnects >= 1.0, "{reconnects}");

    // The API server goes away for a while.
    fleet.sim.faults().unavailable_for(Duration::from_secs(3));
    let body = readyz_becomes(addr, 503, "the API server to be missed").await;
    assert!(
        body.contains("failed cluster: the API server did not answer"),
        "{body}"
    );
    readyz_becomes(addr, 200, "the API server to be back").await;

    // On shutdown the consumers stop and the runner is no longer ready.
    fleet.stop().await;
    let body = readyz_becomes(addr, 503, "the consumers to stop").await;
    assert!(
        body.contains("failed submit consumer: not running"),
        "{body}"
    );
    stop.cancel();
}
