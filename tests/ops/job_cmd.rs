//! `volcano-runner job`, `jobs` and `admin pause --wait` as an operator runs them, as processes against a
//! runner's broker and simulator: the answer on stdout, the documented exit codes, a clear error for a
//! job that is not there, and a wait that returns once no runner takes submissions (or says why not).

use crate::cli_client::text;
use crate::ops_common;

use std::process::{Command, Output};
use std::time::Duration;

use lapin::options::BasicConsumeOptions;
use lapin::types::FieldTable;
use ops_common::fleet::{Fleet, sleeping_job};
use serde_json::Value;
use volcano_runner::messages::v1::JobState;
use volcano_runner::ops::Ops;

/// Runs `volcano-runner <args>` against the fleet's simulator and broker.
fn cli(fleet: &Fleet, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
        .args(args)
        .current_dir(ops_common::root())
        .env("VOLCANO_RUNNER_BROKER__URL", fleet.vhost.amqp_url())
        .env("VOLCANO_RUNNER_CLUSTER__TARGET", fleet.sim.url())
        .env(
            "VOLCANO_RUNNER_CLUSTER__NAMESPACE",
            &fleet.config.cluster.namespace,
        )
        .env_remove("VOLCANO_RUNNER_LOG")
        .env_remove("VOLCANO_RUNNER_CONFIG")
        .output()
        .expect("volcano-runner runs")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        text(&out.stderr)
    );
    text(&out.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_tells_the_whole_record_and_jobs_lists_and_filters() {
    let mut fleet = Fleet::start("job-cmd", Ops::new(), |_| {}).await;
    fleet
        .submit(&sleeping_job("jc-1", 150, Some(Duration::from_secs(3600))))
        .await;
    // One that can never start (64 vCPU; the nodes have 16): it waits, and is told why at once.
    let mut huge = sleeping_job("jc-huge", 60, Some(Duration::from_secs(600)));
    huge.product.as_mut().unwrap().cpu = 64;
    fleet.submit(&huge).await;
    fleet
        .wait_state("jc-1", JobState::Running, Some(Duration::from_secs(1)))
        .await;
    let success = fleet
        .wait_state("jc-1", JobState::Success, Some(Duration::from_secs(30)))
        .await;

    // The ended job, in words.
    let shown = ok(&cli(&fleet, &["job", "jc-1"]));
    assert!(shown.contains("State:        SUCCESS\n"), "{shown}");
    assert!(shown.contains("Owner:        alice"), "{shown}");
    assert!(shown.contains("Exit codes:   rank 0: 0"), "{shown}");
    assert!(shown.contains("the last ending at the real end"), "{shown}");
    for state in ["QUEUED", "RUNNING", "SUCCESS"] {
        assert!(
            shown
                .lines()
                .any(|l| l.starts_with("  ") && l.contains(&format!(" {state} "))),
            "no {state} in the history:\n{shown}"
        );
    }

    // And as JSON: the ticks charged add up to the run time the SUCCESS event told.
    let json: Value = serde_json::from_str(&ok(&cli(&fleet, &["job", "jc-1", "-o", "json"])))
        .expect("job -o json is JSON");
    assert_eq!(json["state"], "SUCCESS", "{json:#}");
    assert_eq!(json["endPublished"], true, "{json:#}");
    assert_eq!(json["owner"]["user"], "alice", "{json:#}");
    assert!(
        !json["acceptedBy"].as_str().unwrap_or_default().is_empty(),
        "the runner that accepted it: {json:#}"
    );
    let (start, end) = (
        success.started_at.as_ref().unwrap(),
        success.ended_at.as_ref().unwrap(),
    );
    let run_time = (end.seconds - start.seconds) * 1000
        + (i64::from(end.nanos) - i64::from(start.nanos)) / 1_000_000;
    assert_eq!(
        json["accounting"]["chargedMs"].as_i64(),
        Some(run_time),
        "{json:#}"
    );
    assert_eq!(json["accounting"]["finalTick"], true, "{json:#}");
    assert!(
        json["accounting"]["ticks"].as_u64().unwrap() >= 3,
        "{json:#}"
    );
    assert_eq!(json["outcome"]["exitCodes"][0]["code"], 0, "{json:#}");
    let history: Vec<&str> = json["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["state"].as_str().unwrap())
        .collect();
    assert_eq!(history, ["QUEUED", "RUNNING", "SUCCESS"], "{json:#}");

    // The waiting job: its state, and what it was told while it waited.
    let waiting: Value =
        serde_json::from_str(&ok(&cli(&fleet, &["job", "jc-huge", "-o", "json"]))).unwrap();
    assert_eq!(waiting["state"], "QUEUED", "{waiting:#}");
    let told = waiting["waiting"].as_array().unwrap();
    assert!(
        told.iter()
            .any(|w| w["text"].as_str().unwrap().contains("can never start")),
        "{waiting:#}"
    );

    // The list, and its filters.
    let all = ok(&cli(&fleet, &["jobs"]));
    let line = |id: &str| {
        all.lines()
            .find(|l| l.starts_with(&format!("{id} ")))
            .unwrap_or_else(|| panic!("{id} is not listed:\n{all}"))
            .to_owned()
    };
    assert!(line("jc-1").contains(" SUCCESS "), "{all}");
    assert!(line("jc-huge").contains(" QUEUED "), "{all}");
    let queued = ok(&cli(&fleet, &["jobs", "--state", "QUEUED"]));
    assert!(
        queued.contains("jc-huge ") && !queued.contains("jc-1 "),
        "{queued}"
    );
    let listed: Value = serde_json::from_str(&ok(&cli(
        &fleet,
        &["jobs", "--owner", "alice", "-o", "json"],
    )))
    .unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed:#}");
    assert_eq!(
        ok(&cli(&fleet, &["jobs", "--owner", "nobody"])),
        "no job matches\n"
    );

    // A job that is not there: a clear message, nothing on stdout, exit code 2.
    let missing = cli(&fleet, &["job", "jc-404"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(missing.stdout.is_empty(), "{}", text(&missing.stdout));
    let why = text(&missing.stderr);
    assert!(why.contains("no job jc-404 in the cluster"), "{why}");
    assert!(why.contains("volcano-runner jobs"), "{why}");
    // A state that does not exist is named.
    let bad = cli(&fleet, &["jobs", "--state", "DONE"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        text(&bad.stderr).contains("--state"),
        "{}",
        text(&bad.stderr)
    );
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_wait_returns_once_no_runner_takes_submissions_and_says_who_still_does() {
    let mut fleet = Fleet::start("pause-wait", Ops::new(), |_| {}).await;
    let submit_queue = fleet.config.broker.submit_queue.clone();
    // The runner consumes submissions.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while consumers(&fleet, &submit_queue).await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the runner never consumed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let out = cli(&fleet, &["admin", "pause", "--reason", "upgrade", "--wait"]);
    let said = ok(&out);
    assert!(
        said.starts_with("submissions are PAUSED: upgrade"),
        "{said}"
    );
    assert!(
        said.lines()
            .last()
            .unwrap()
            .starts_with("every runner has stopped taking submissions"),
        "{said}"
    );
    assert_eq!(consumers(&fleet, &submit_queue).await, 0, "{said}");

    // A consumer that is not a runner (or a runner that cannot see the switch): the wait ends with the
    // reason and exit code 2 after its timeout.
    let (_connection, channel) = fleet.vhost.raw().await;
    let _consumer = channel
        .basic_consume(
            submit_queue.as_str().into(),
            "not-a-runner".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("a consumer");
    let out = cli(&fleet, &["admin", "pause", "--wait", "--timeout", "2s"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    let progress = text(&out.stdout);
    assert!(
        progress.contains(&format!(
            "waiting: 1 consumer of {submit_queue} still takes submissions"
        )),
        "{progress}"
    );
    let why = text(&out.stderr);
    assert!(
        why.contains("1 consumer of") && why.contains("still takes them after 2s"),
        "{why}"
    );
    let _ = channel.close(200, "done".into()).await;

    ok(&cli(&fleet, &["admin", "resume"]));
    fleet.stop().await;
}

/// The consumers of `queue` now (a passive declare).
async fn consumers(fleet: &Fleet, queue: &str) -> u32 {
    let (connection, channel) = fleet.vhost.raw().await;
    let q = channel
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("the submit queue exists");
    let _ = connection.close(200, "done".into()).await;
    q.consumer_count()
}

/// `job` tells a job's history on one clock, the cluster's: the runner records the acceptance (QUEUED)
/// by the same clock the monitor records RUNNING by. Here the simulator's clock runs three hours ahead
/// of the wall clock (as it soon does at the demo's speed); by the wall clock, QUEUED read three hours
/// before RUNNING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_reads_on_the_clusters_clock() {
    let mut fleet = Fleet::start("job-clock", Ops::new(), |_| {}).await;
    fleet.sim.advance(Duration::from_secs(3 * 3600));
    let before = fleet.sim.now();
    fleet
        .submit(&sleeping_job(
            "jclk-1",
            600,
            Some(Duration::from_secs(3600)),
        ))
        .await;
    fleet
        .wait_state("jclk-1", JobState::Running, Some(Duration::from_secs(1)))
        .await;
    let json: Value = serde_json::from_str(&ok(&cli(&fleet, &["job", "jclk-1", "-o", "json"])))
        .expect("job -o json is JSON");
    let at = |state: &str| -> jiff::Timestamp {
        json["history"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["state"] == state)
            .unwrap_or_else(|| panic!("no {state} in the history: {json:#}"))["at"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let (queued, running) = (at("QUEUED"), at("RUNNING"));
    assert!(
        queued >= before,
        "QUEUED at {queued} is on the wall clock, not the cluster's (at least {before}): {json:#}"
    );
    let accepted: jiff::Timestamp = json["acceptedAt"].as_str().unwrap().parse().unwrap();
    assert!(accepted >= before, "{json:#}");
    let gap = running.duration_since(queued);
    assert!(
        gap >= -jiff::SignedDuration::from_secs(1) && gap < jiff::SignedDuration::from_secs(600),
        "QUEUED {queued} and RUNNING {running} are on one time line: {json:#}"
    );
    fleet.stop().await;
}
