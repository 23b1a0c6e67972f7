//! Faults around the runner: its broker connection closed by force, the API server answering 503 for ten
//! seconds, and shutdown (SIGTERM to the real binary, or the shutdown token) with messages in flight.

use crate::harness;
use crate::rabbit;

use std::collections::BTreeSet;
use std::time::Duration;

use harness::{Harness, figlet};
use volcano_runner::messages::v1::JobState;
use volcano_runner::sim::FaultRule;

fn queued_ids(events: &[harness::Captured]) -> BTreeSet<String> {
    events
        .iter()
        .filter(|c| c.message_id.ends_with("/QUEUED"))
        .map(|c| c.message_id.clone())
        .collect()
}

pub(crate) fn failures(events: &[harness::Captured]) -> Vec<String> {
    events
        .iter()
        .filter(|c| {
            c.event
                .as_ref()
                .is_some_and(|e| e.state == JobState::Failure as i32)
        })
        .map(|c| c.message_id.clone())
        .collect()
}

/// The runner's connection is closed by force (as an operator or a broker restart would): it reconnects
/// by itself and handles what comes next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_by_force_is_reestablished() {
    let h = Harness::new("fault-close").await;
    let runner = h.start("runner-a");
    h.submit(&figlet("fc-1")).await;
    h.wait_events("the first QUEUED", |e| {
        e.iter().any(|c| c.message_id == "fc-1/QUEUED")
    })
    .await;
    let before = h.vhost.connections_named("runner-runner-a").await;
    for name in &before {
        h.vhost.force_close(name).await;
    }
    for i in 2..=4 {
        h.submit(&figlet(&format!("fc-{i}"))).await;
    }
    h.cancel("fc-1", Some("after the reconnect")).await;
    h.wait_events("QUEUED after the forced close", |e| {
        (2..=4).all(|i| e.iter().any(|c| c.message_id == format!("fc-{i}/QUEUED")))
    })
    .await;
    h.wait_queues_settled().await;
    let after = h.vhost.connections_named("runner-runner-a").await;
    assert!(
        after.iter().all(|n| !before.contains(n)),
        "a new connection: {before:?} -> {after:?}"
    );
    runner.stop().await;
    let vc = h.vcjob("fc-1").await.unwrap();
    assert!(
        vc.phase().is_ending(),
        "the cancel after the reconnect was handled"
    );
    assert_eq!(h.vcjobs().await.len(), 4);
}

/// The API server answers 503 to everything for ten seconds while submissions arrive. Nothing turns
/// into a FAILURE or a dead letter: messages are retried and returned to the queue until the cluster is
/// back, and then every job exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_seconds_of_503_cause_no_failure_and_every_job_exists_after() {
    const JOBS: usize = 10;
    let h = Harness::new("fault-503").await;
    let runner = h.start("runner-a");
    h.submit(&figlet("u-warmup")).await;
    h.wait_events("the runner works", |e| {
        e.iter().any(|c| c.message_id == "u-warmup/QUEUED")
    })
    .await;
    h.sim.faults().unavailable_for(Duration::from_secs(10));
    let outage_ends = tokio::time::Instant::now() + Duration::from_secs(10);
    for i in 0..JOBS {
        h.submit(&figlet(&format!("u-{i}"))).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(h.vcjobs().await.len(), 1, "nothing gets through the outage");
    let events = h
        .wait_events_for("QUEUED for every job", Duration::from_secs(60), |e| {
            (0..JOBS).all(|i| e.iter().any(|c| c.message_id == format!("u-{i}/QUEUED")))
        })
        .await;
    assert!(
        tokio::time::Instant::now() >= outage_ends,
        "only after the outage"
    );
    h.wait_queues_settled().await;
    runner.stop().await;
    assert_eq!(failures(&events), Vec::<String>::new(), "no FAILURE");
    assert!(h.dead_letters().await.is_empty(), "nothing dead-lettered");
    assert_eq!(h.vcjobs().await.len(), JOBS + 1);
}

/// SIGTERM to the real `volcano-runner run` with 20 submissions in flight (each waiting on a slow
/// create): it stops taking messages, finishes the 20 within its grace period, and exits 0. Nothing is
/// lost (20 jobs, 20 QUEUED, the queue empty) and nothing is done twice (no QUEUED published twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_20_in_flight_finishes_them_and_exits() {
    const JOBS: usize = 20;
    let h = Harness::new("fault-sigterm").await;
    h.sim.faults().add_rule(FaultRule {
        resource: "jobs.batch.volcano.sh".into(),
        verb: "create".into(),
        latency_ms: 1500,
        ..FaultRule::default()
    });
    let log = std::env::temp_dir().join(format!("runner-sigterm-{}.log", std::process::id()));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
        .args(["run", "--no-monitor", "--id", "sigterm-runner"])
        .env("VOLCANO_RUNNER_BROKER__URL", h.vhost.amqp_url())
        .env("VOLCANO_RUNNER_BROKER__CONNECTION_NAME", "runner-sigterm")
        .env("VOLCANO_RUNNER_CLUSTER__TARGET", h.sim.url())
        .env("VOLCANO_RUNNER_RUNNER__SHUTDOWN_GRACE", "20s")
        .env("VOLCANO_RUNNER_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("the binary starts");
    let show_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let submit_queue = h.config.broker.submit_queue.clone();
    // Consuming once the pause switch has been read: the submit queue has a consumer.
    let deadline = tokio::time::Instant::now() + rabbit::PATIENCE;
    while h.consumers(&submit_queue).await != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the runner consumes:\n{}",
            show_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..JOBS {
        h.submit(&figlet(&format!("t-{i}"))).await;
    }
    // Delivered at once (prefetch 32) and stuck in the 1.5 s creates.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        h.vcjobs().await.len() < JOBS,
        "still in flight when the signal comes"
    );
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let exit = rabbit::within(
        "the runner exits",
        tokio::task::spawn_blocking(move || child.wait()),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(exit.success(), "exit status {exit:?}:\n{}", show_log());

    let events = h.events().await;
    let queued: Vec<_> = events
        .iter()
        .filter(|c| c.message_id.ends_with("/QUEUED"))
        .collect();
    assert_eq!(
        queued_ids(&events).len(),
        JOBS,
        "every job got its QUEUED:\n{}",
        show_log()
    );
    assert_eq!(queued.len(), JOBS, "none twice");
    assert_eq!(h.vcjobs().await.len(), JOBS);
    h.wait_queues_settled().await;
    let _ = std::fs::remove_file(&log);
}

/// Shutdown with a grace period shorter than the work in flight: what cannot finish goes back to the
/// queue, and a second runner completes it. Each job exists once, every job gets QUEUED, and copies of
/// one job's QUEUED (a publish cut off before its ack) are the same message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_cut_off_by_the_grace_period_is_returned_and_finished_elsewhere() {
    const JOBS: usize = 20;
    let h = Harness::new("fault-grace").await;
    h.sim.faults().add_rule(FaultRule {
        resource: "jobs.batch.volcano.sh".into(),
        verb: "create".into(),
        latency_ms: 2000,
        ..FaultRule::default()
    });
    let mut config = h.config.clone();
    config.runner.shutdown_grace = Duration::from_millis(300);
    let first = h.start_with("first", config, false);
    for i in 0..JOBS {
        h.submit(&figlet(&format!("g-{i}"))).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    first.stop().await;
    let events = h.events().await;
    let done_by_first = queued_ids(&events).len();
    assert!(
        done_by_first < JOBS,
        "the grace period cut work off ({done_by_first} done)"
    );

    h.sim.faults().clear();
    let second = h.start("second");
    let events = h
        .wait_events("QUEUED for every job", |e| {
            (0..JOBS).all(|i| e.iter().any(|c| c.message_id == format!("g-{i}/QUEUED")))
        })
        .await;
    h.wait_queues_settled().await;
    second.stop().await;
    assert_eq!(h.vcjobs().await.len(), JOBS, "each job once");
    for i in 0..JOBS {
        let bodies: BTreeSet<_> = events
            .iter()
            .filter(|c| c.message_id == format!("g-{i}/QUEUED"))
            .map(|c| c.body.clone())
            .collect();
        assert_eq!(bodies.len(), 1, "g-{i}: copies of QUEUED are identical");
    }
    assert!(h.dead_letters().await.is_empty());
}

/// A create that times out half-way through a submission (the NetworkPolicy's takes 6 s; the runner's
/// client waits 5 s) rolls the job back and requeues the submission, and the next delivery creates the
/// job afresh. Before, the rolled-back job kept its cleanup finalizer and stayed, being deleted, until a
/// monitor took it off: a runner without a monitor (or one whose monitor had not got to it within the
/// requeue's 100 ms) took it for the submission's ended job at the next delivery, published QUEUED and
/// dropped the submission. The rollback now marks the job (`volcano-runner/rolled-back`) and takes its
/// finalizer off before the delete, and every reader passes such a job by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_whose_create_timed_out_half_way_is_created_afresh() {
    let h = Harness::new("fault-rollback").await;
    let runner = h.start("runner-a");
    rolled_back_once(&h, "rb-1").await;
    let vcjobs: kube::Api<volcano_runner::volcano::VolcanoJob> = kube::Api::all(h.client.clone());
    let policies: kube::Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        kube::Api::all(h.client.clone());
    rabbit::within("rb-1's job created afresh, with its NetworkPolicy", async {
        loop {
            let jobs = vcjobs.list(&Default::default()).await.unwrap();
            let job = jobs
                .items
                .into_iter()
                .find(|j| j.metadata.name.as_deref() == Some("j-rb-1"));
            let policy = policies.list(&Default::default()).await.unwrap();
            let fresh = job.is_some_and(|j| {
                j.metadata.deletion_timestamp.is_none()
                    && !j
                        .metadata
                        .annotations
                        .unwrap_or_default()
                        .contains_key(volcano_runner::cluster::labels::ROLLED_BACK)
            });
            let owned = policy
                .items
                .iter()
                .any(|p| p.metadata.name.as_deref() == Some("policy-rb-1"));
            if fresh && owned {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    h.wait_queues_settled().await;
    runner.stop().await;
    let events = h.events().await;
    assert_eq!(failures(&events), Vec::<String>::new(), "no FAILURE");
    assert!(h.dead_letters().await.is_empty(), "nothing dead-lettered");
}

/// The same with a monitoring runner and the simulator's clock at real speed: the job created afresh
/// runs and succeeds, and no FAILURE is told. This one passes on the build before the fix too (the
/// redelivery here does not meet the half-deleted job, which the runner's own monitor handles first):
/// it holds the whole path (release, the job created afresh and monitored) end to end; that a monitor
/// tells nothing of a rolled-back job, deleted or vanished, is held by
/// `monitor::decide::tests::a_rolled_back_job_is_passed_by_deleted_or_vanished`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_created_afresh_after_a_rollback_runs_and_succeeds() {
    let sim = volcano_runner::sim::SimConfig {
        clock_speed: 1.0,
        default_run: Duration::from_secs(2),
        ..volcano_runner::sim::SimConfig::for_tests()
    };
    let h = Harness::with_sim("fault-rollback-run", sim).await;
    let mut config = h.config.clone();
    config.cluster.lease.shards = 1;
    let runner = h.start_with("runner-a", config, true);
    let success = |id: &'static str| {
        move |e: &[harness::Captured]| {
            e.iter().any(|c| {
                c.message_id.starts_with(&format!("{id}/"))
                    && c.event
                        .as_ref()
                        .is_some_and(|e| e.state == JobState::Success as i32)
            })
        }
    };
    rolled_back_once(&h, "rb-2").await;
    let events = h
        .wait_events_for("rb-2's SUCCESS", Duration::from_secs(60), success("rb-2"))
        .await;
    h.wait_queues_settled().await;
    runner.stop().await;
    assert_eq!(failures(&events), Vec::<String>::new(), "no FAILURE");
    assert!(
        events.iter().any(|c| c.message_id == "rb-2/RUNNING"),
        "rb-2 ran"
    );
    assert!(h.dead_letters().await.is_empty(), "nothing dead-lettered");
}

/// Runs a first job through, then submits `id` while the NetworkPolicy's create takes longer than the
/// runner's client waits, and lifts that once the first attempt has rolled the job back.
async fn rolled_back_once(h: &Harness, id: &str) {
    h.submit(&figlet(&format!("{id}-warm-up"))).await;
    h.wait_events("the runner works", |e| {
        e.iter()
            .any(|c| c.message_id == format!("{id}-warm-up/QUEUED"))
    })
    .await;
    slow_policy_creates(h);
    let deletes = || h.sim.request_count("delete jobs.batch.volcano.sh");
    let before = deletes();
    h.submit(&figlet(id)).await;
    rabbit::within("the first attempt rolled back", async {
        while deletes() == before {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    h.sim.faults().clear();
}

/// Every NetworkPolicy's create takes 6 s, longer than a runner's client waits (5 s): each submission's
/// attempt rolls its job back, until the test clears the simulator's faults.
pub(crate) fn slow_policy_creates(h: &Harness) {
    h.sim.faults().add_rule(FaultRule {
        resource: "networkpolicies".into(),
        verb: "create".into(),
        latency_ms: 6_000,
        ..FaultRule::default()
    });
}
