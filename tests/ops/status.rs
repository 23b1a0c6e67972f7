//! `admin status` names what silently keeps work from being done, as `PROBLEM:` lines (and in its JSON):
//! dead letters waiting for a person, shards of the monitoring duty that no live runner holds, and
//! admitted jobs that can never start on the cluster.

use crate::cli_client::text;
use crate::ops_common;

use std::process::Command;
use std::time::Duration;

use lapin::BasicProperties;
use ops_common::fleet::{Fleet, sleeping_job};
use ops_common::rabbit::PATIENCE;
use serde_json::Value;
use volcano_runner::messages::v1::JobState;
use volcano_runner::ops::Ops;

/// `admin status` (text and JSON) against the fleet's broker and simulator.
fn status(fleet: &Fleet) -> (String, Value) {
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
            .args(["admin", "--cluster", &fleet.sim.url(), "status"])
            .args(extra)
            .current_dir(ops_common::root())
            .env("VOLCANO_RUNNER_BROKER__URL", fleet.vhost.amqp_url())
            .env(
                "VOLCANO_RUNNER_CLUSTER__NAMESPACE",
                &fleet.config.cluster.namespace,
            )
            .env(
                "VOLCANO_RUNNER_CLUSTER__LEASE__SHARDS",
                fleet.config.cluster.lease.shards.to_string(),
            )
            .env_remove("VOLCANO_RUNNER_LOG")
            .env_remove("VOLCANO_RUNNER_CONFIG")
            .output()
            .expect("admin status runs");
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    // Text first: every state this test waits for, once seen, stays until the test changes it, so the
    // JSON read after it shows the same.
    let text = run(&[]);
    let json = serde_json::from_str(&run(&["-o", "json"])).expect("status -o json");
    (text, json)
}

/// Polls `status` until `done` holds.
async fn status_until(fleet: &Fleet, what: &str, done: impl Fn(&str) -> bool) -> (String, Value) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (text, json) = status(fleet);
        if done(&text) {
            return (text, json);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "status never showed {what}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_flags_dead_letters_unheld_shards_and_jobs_that_can_never_start() {
    let mut fleet = Fleet::start("status-problems", Ops::new(), |_| {}).await;
    let shard_problem = |t: &str| t.contains("shards of the monitoring duty have no live holder");

    // A running runner holds every shard; nothing is wrong yet.
    let (before, json) = status_until(&fleet, "every shard held", |t| !shard_problem(t)).await;
    assert!(!before.contains("PROBLEM:"), "{before}");
    assert_eq!(json["unheldShards"], serde_json::json!([]));

    // A job no node can hold (64 vCPU; the nodes have 16): admitted, and waiting for ever.
    let mut huge = sleeping_job("huge-1", 60, Some(Duration::from_secs(600)));
    huge.product.as_mut().unwrap().cpu = 64;
    fleet.submit(&huge).await;
    fleet.wait_state("huge-1", JobState::Queued, None).await;
    // A submission that cannot be read: dead-lettered.
    fleet
        .vhost
        .publish_raw(
            "compute.jobs",
            "submit",
            b"{not json",
            BasicProperties::default().with_message_id("submit/garbled".into()),
        )
        .await;
    fleet.vhost.wait_ready("compute.jobs.dead", 1).await;

    let (text, json) = status_until(&fleet, "the job that can never start", |t| {
        t.contains("can never start")
    })
    .await;
    assert!(
        text.contains(
            "PROBLEM: 1 message in the dead-letter queue compute.jobs.dead: submissions, cancels or \
             extensions that were rejected or failed too often"
        ),
        "{text}"
    );
    assert!(text.contains("admin dead-letters list"), "{text}");
    let never = text
        .lines()
        .find(|l| l.contains("can never start"))
        .unwrap();
    assert!(never.starts_with("PROBLEM: "), "{text}");
    assert!(never.contains("j-huge-1 (job huge-1)"), "{text}");
    assert!(never.contains("no node has enough CPU"), "{text}");
    assert!(!shard_problem(&text), "{text}");
    assert_eq!(json["neverStart"].as_array().unwrap().len(), 1, "{json:#}");
    assert!(
        json["neverStart"][0]
            .as_str()
            .unwrap()
            .ends_with("/j-huge-1"),
        "{json:#}"
    );

    // No runner any more: its shards are released or lapse, and nobody monitors the jobs in them.
    fleet.stop().await;
    let (text, json) = status_until(&fleet, "the unheld shards", shard_problem).await;
    let prefix = &fleet.config.cluster.lease.name_prefix;
    assert!(
        text.contains(&format!(
            "PROBLEM: 2 of 2 shards of the monitoring duty have no live holder ({prefix}-shard-0, \
             {prefix}-shard-1)"
        )),
        "{text}"
    );
    assert_eq!(
        json["unheldShards"],
        serde_json::json!([format!("{prefix}-shard-0"), format!("{prefix}-shard-1")])
    );
}

/// `admin` with `args` against the fleet's simulator: (success, stdout, stderr).
fn admin(fleet: &Fleet, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
        .args(["admin", "--cluster", &fleet.sim.url()])
        .args(args)
        .current_dir(ops_common::root())
        .env("VOLCANO_RUNNER_BROKER__URL", fleet.vhost.amqp_url())
        .env(
            "VOLCANO_RUNNER_CLUSTER__NAMESPACE",
            &fleet.config.cluster.namespace,
        )
        .env_remove("VOLCANO_RUNNER_LOG")
        .env_remove("VOLCANO_RUNNER_CONFIG")
        .output()
        .expect("admin runs");
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// `admin maintenance schedule|list|cancel` store a window in the cluster and remove it; `admin status`
/// shows it (text and JSON) while it is scheduled, and not once it is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_maintenance_schedules_lists_and_cancels_and_status_shows_it() {
    let fleet = Fleet::start("status-maintenance", Ops::new(), |_| {}).await;
    let (before, json) = status(&fleet);
    assert!(before.contains("maintenance:   none scheduled"), "{before}");
    assert_eq!(json["maintenance"], serde_json::json!([]));

    let (ok, out, err) = admin(
        &fleet,
        &[
            "maintenance",
            "schedule",
            "--start",
            "+2h",
            "--end",
            "+3h",
            "--nodes",
            "n1,n2",
            "--reason",
            "kernel update",
        ],
    );
    assert!(ok, "{err}");
    let id = out
        .strip_prefix("scheduled ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("the id is printed: {out}"))
        .to_owned();
    let (ok, listed, err) = admin(&fleet, &["maintenance", "list", "-o", "json"]);
    assert!(ok, "{err}");
    let listed: Value = serde_json::from_str(&listed).expect("list -o json");
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed:#}");
    assert_eq!(listed[0]["id"], id.as_str());
    assert_eq!(listed[0]["nodes"], serde_json::json!(["n1", "n2"]));
    assert_eq!(listed[0]["reason"], "kernel update");
    assert_eq!(listed[0]["state"], "scheduled");

    let (text, json) = status(&fleet);
    let line = text
        .lines()
        .find(|l| l.contains(&id))
        .unwrap_or_else(|| panic!("status shows the window:\n{text}"));
    assert!(
        line.contains("n1,n2") && line.contains("(scheduled): kernel update"),
        "{text}"
    );
    assert_eq!(json["maintenance"][0]["id"], id.as_str(), "{json:#}");

    // A window that ends before it starts is refused, naming why; nothing is stored.
    let (ok, _, err) = admin(
        &fleet,
        &["maintenance", "schedule", "--start", "+2h", "--end", "+1h"],
    );
    assert!(!ok && err.contains("ends"), "{err}");
    // An empty node list (an empty shell variable) is refused, not read as every node (issue 41,
    // point 3); so is an empty entry. On main `--nodes ""` scheduled a window over every node.
    for nodes in ["", "n1,,n2"] {
        let (ok, out, err) = admin(
            &fleet,
            &[
                "maintenance",
                "schedule",
                "--start",
                "+2h",
                "--end",
                "+3h",
                "--nodes",
                nodes,
            ],
        );
        assert!(
            !ok && err.contains("--nodes: the node list is empty"),
            "{out} {err}"
        );
    }
    // A window written by hand that ends before it starts is no window: not listed as scheduled, and
    // named as a problem with why. On main it was listed as scheduled.
    let configmaps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(fleet.admin.clone(), &fleet.config.cluster.namespace);
    let inverted: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "volcano-runner-maintenance-by-hand", "labels": {
                "app.kubernetes.io/component": "maintenance-window",
                "volcano-runner/maintenance-window": "by-hand"}},
            "data": {"start": "2099-01-01T10:00:00Z", "end": "2099-01-01T08:00:00Z", "nodes": ""}
        }))
        .unwrap();
    configmaps
        .create(&kube::api::PostParams::default(), &inverted)
        .await
        .unwrap();
    let (ok, listed, err) = admin(&fleet, &["maintenance", "list", "-o", "json"]);
    assert!(ok, "{err}");
    let listed: Value = serde_json::from_str(&listed).expect("list -o json");
    assert_eq!(
        listed.as_array().unwrap().len(),
        1,
        "only the CLI's: {listed:#}"
    );
    assert!(
        err.contains("volcano-runner-maintenance-by-hand") && err.contains("ends"),
        "{err}"
    );
    let (text, _) = status(&fleet);
    assert!(
        text.contains("PROBLEM: ConfigMap volcano-runner-maintenance-by-hand (the window ends"),
        "{text}"
    );
    configmaps
        .delete("volcano-runner-maintenance-by-hand", &Default::default())
        .await
        .unwrap();

    let (ok, out, err) = admin(&fleet, &["maintenance", "cancel", &id]);
    assert!(
        ok && out.contains(&format!("cancelled maintenance window {id}")),
        "{err}"
    );
    let (ok, _, err) = admin(&fleet, &["maintenance", "cancel", &id]);
    assert!(
        !ok && err.contains(&format!("no maintenance window {id}")),
        "{err}"
    );
    let (after, json) = status(&fleet);
    assert!(after.contains("maintenance:   none scheduled"), "{after}");
    assert_eq!(json["maintenance"], serde_json::json!([]));
}
