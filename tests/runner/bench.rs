//! `volcano-runner bench` end to end, small: the real RabbitMQ (a vhost of the test's own), the
//! simulator in the benchmark's process, runner processes of the built binary. The figures of a debug
//! build on a shared machine mean nothing; what is checked is that every submission is accounted for,
//! the report carries every figure it promises, and the benchmark leaves nothing behind on the broker.

use std::process::Command;

use crate::rabbit;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_measures_limits_and_two_phases_and_cleans_up() {
    let vhost = rabbit::TestVhost::new("bench").await;
    let dir = std::env::temp_dir().join(format!("vr-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("results.json");
    let url = vhost.amqp_url();
    let output = tokio::task::spawn_blocking({
        let out = out.clone();
        let dir = dir.clone();
        move || {
            Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
                .args([
                    "bench",
                    "--submissions",
                    "40",
                    "--runners",
                    "2",
                    "--rate",
                    "100",
                ])
                .args(["--max-in-flight", "8", "--runner-threads", "2"])
                .args(["--phase-timeout", "60", "--out"])
                .arg(&out)
                .arg("--log-dir")
                .arg(dir.join("logs"))
                .env("VOLCANO_RUNNER_BROKER__URL", url)
                .output()
                .expect("volcano-runner bench runs")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench failed:\n{stdout}\n{stderr}");

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert!(report["limits"]["broker_msgs_per_s"].as_f64().unwrap() > 0.0);
    assert!(report["limits"]["sim_creates_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(report["workload"]["submissions"], 40);
    assert_eq!(report["workload"]["max_in_flight"], 8);
    assert_eq!(report["workload"]["runner_threads"], 2);
    // Both kinds of phase run on the same cluster, with the same jobs.
    assert_eq!(report["workload"]["cluster_nodes"], 40);
    assert_eq!(report["workload"]["job_run_s"], 2.0);
    let phases = report["phases"].as_array().unwrap();
    // Unpaced without and with the monitoring duty, then 100/s without and with it; two runners each.
    let shape: Vec<(u64, Option<f64>, bool)> = phases
        .iter()
        .map(|p| {
            (
                p["runners"].as_u64().unwrap(),
                p["target_rate"].as_f64(),
                p["monitor"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            (2, None, false),
            (2, None, true),
            (2, Some(100.0), false),
            (2, Some(100.0), true)
        ]
    );
    for p in phases {
        // The API requests of the phase, counted by the simulator: every job's VolcanoJob create is
        // among them, and the per-job figure is their sum over the jobs.
        let by_kind = p["api_requests_by_kind"].as_object().unwrap();
        assert_eq!(by_kind["create jobs.batch.volcano.sh"], 40, "{p}");
        let total: u64 = by_kind.values().map(|v| v.as_u64().unwrap()).sum();
        let per_job = p["api_requests_per_job"].as_f64().unwrap();
        assert!((per_job - total as f64 / 40.0).abs() < 1e-9, "{p}");
        assert!(p["api_requests_per_s"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["ratio_to_api_limit"].as_f64().unwrap() > 0.0, "{p}");
        // The runners' CPU per job: QUEUED without monitoring, ended with it.
        assert!(p["runner_cpu_ms_per_job"].as_f64().unwrap() > 0.0, "{p}");
        if p["monitor"] == true {
            // Every job ran to its end inside the phase, and the monitor's work is counted.
            assert_eq!(p["ended"], 40, "{p}");
            let overlap = p["monitoring_overlap"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&overlap), "{p}");
            assert!(by_kind.keys().any(|k| k.starts_with("patch jobs")), "{p}");
            assert!(p["ended_jobs_per_s"].as_f64().unwrap() > 0.0, "{p}");
        } else {
            assert_eq!(p["ended"], 0, "{p}");
            assert!(p["ended_jobs_per_s"].is_null(), "{p}");
            assert!(p["monitoring_overlap"].is_null(), "{p}");
            // No write of the job by the submit path: with no runner monitoring, nothing needs the
            // record that its QUEUED was confirmed (docs/monitor.md, "Order of a job's events").
            let patches: u64 = by_kind
                .iter()
                .filter(|(k, _)| k.starts_with("patch jobs"))
                .map(|(_, v)| v.as_u64().unwrap())
                .sum();
            assert_eq!(patches, 0, "{p}");
        }
        assert_eq!(p["published"], 40, "{p}");
        assert_eq!(p["created"], 40, "{p}");
        assert_eq!(p["queued"], 40, "{p}");
        assert_eq!(p["complete"], true, "{p}");
        // No runner died: every event was delivered once.
        assert_eq!(p["duplicate_deliveries"], 0, "{p}");
        assert!(p["events_delivered"].as_u64().unwrap() >= 40, "{p}");
        let created = &p["publish_to_created"];
        let queued = &p["publish_to_queued"];
        assert_eq!(created["count"], 40);
        // Both latencies are measured for every job. They are not compared with each other: the
        // creation is seen through a cluster watch and the QUEUED through the broker, two observers
        // whose delays differ, so either may be seen first.
        assert_eq!(queued["count"], 40);
        assert!(created["p50_ms"].as_f64().unwrap() > 0.0, "{created}");
        assert!(queued["p50_ms"].as_f64().unwrap() > 0.0, "{queued}");
        assert!(p["sustained_jobs_per_s"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["ratio_to_smaller_limit"].as_f64().unwrap() > 0.0, "{p}");
        // RabbitMQ runs on this machine (scripts/test makes sure of it): its CPU in the phase is read.
        let broker_cpu = p["broker_cpu_s"].as_f64();
        assert!(broker_cpu.is_some_and(|s| s >= 0.0), "{p}");
        assert!(p["harness_cpu_s"].as_f64().unwrap() > 0.0, "{p}");
        let runners = p["per_runner"].as_array().unwrap();
        assert_eq!(runners.len() as u64, p["runners"].as_u64().unwrap());
        for r in runners {
            assert!(r["cpu_s"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["peak_rss_mib"].as_f64().unwrap() > 1.0, "{r}");
            assert_eq!(
                r["exit_ok"], true,
                "a runner did not stop cleanly on SIGTERM: {r}"
            );
        }
    }
    // What monitoring cost, per rate run both ways: the CPU ratio always; the QUEUED-rate ratio only
    // when the monitored phase's monitoring overlapped its steady window enough, else why not (40 jobs
    // of 2 s: their window usually closes before the first ends).
    let cost = report["monitoring_cost"].as_array().unwrap();
    let rates: Vec<Option<f64>> = cost.iter().map(|c| c["target_rate"].as_f64()).collect();
    assert_eq!(rates, vec![None, Some(100.0)]);
    for c in cost {
        assert_eq!(c["runners"], 2, "{c}");
        assert_eq!(c["goal"], 0.6, "{c}");
        assert!(c["cpu_per_job_ratio"].as_f64().unwrap() > 0.0, "{c}");
        let overlap = c["monitoring_overlap"].as_f64().unwrap();
        match c["queued_rate_ratio"].as_f64() {
            Some(ratio) => {
                assert!(ratio > 0.0 && overlap >= 0.75, "{c}");
                assert!(c["queued_rate_ratio_withheld"].is_null(), "{c}");
            }
            None => {
                assert!(overlap < 0.75, "{c}");
                let why = c["queued_rate_ratio_withheld"].as_str().unwrap();
                assert!(why.contains("at least 75% needed"), "{c}");
            }
        }
    }
    assert!(
        stdout.contains("2 runners unpaced: QUEUED rate "),
        "{stdout}"
    );
    assert!(stdout.contains("2 runners 100/s: QUEUED rate "), "{stdout}");

    // The fixed-rate phases published at about the rate asked for, not as fast as they could.
    let paced = phases[2]["publish_rate"].as_f64().unwrap();
    assert!(paced < 150.0, "publish rate {paced} at --rate 100");
    // The printed table has a row per phase.
    assert_eq!(
        stdout.lines().filter(|l| l.contains(" | ")).count(),
        1 + 4,
        "{stdout}"
    );

    // Nothing left on the broker: every phase deleted its exchanges and queues.
    let exported = vhost.exported().await;
    let leftovers: Vec<&str> = ["queues", "exchanges"]
        .iter()
        .flat_map(|kind| exported[kind].as_array().unwrap().iter())
        .filter_map(|o| o["name"].as_str())
        .filter(|n| n.starts_with("volcano-runner-bench."))
        .collect();
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two runs started together against one broker (the same second, as two terminals or a CI matrix do)
/// each get exchanges and queues of their own: both finish, and each accounts for its own submissions
/// only. With run ids of the second alone they shared every name, and the second failed with
/// RESOURCE_LOCKED on the first's exclusive observer queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runs_started_together_each_use_names_of_their_own() {
    let vhost = rabbit::TestVhost::new("bench-two").await;
    let dir = std::env::temp_dir().join(format!("vr-bench-two-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |n: usize| {
        let (dir, url) = (dir.clone(), vhost.amqp_url());
        tokio::task::spawn_blocking(move || {
            let out = dir.join(format!("results-{n}.json"));
            let output = Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
                .args(["bench", "--submissions", "10", "--runners", "1"])
                .args(["--no-monitor", "--skip-limits", "--max-in-flight", "4"])
                .args(["--phase-timeout", "60", "--out"])
                .arg(&out)
                .arg("--log-dir")
                .arg(dir.join(format!("logs-{n}")))
                .env("VOLCANO_RUNNER_BROKER__URL", url)
                .output()
                .expect("volcano-runner bench runs");
            (output, out)
        })
    };
    let (first, second) = tokio::join!(run(1), run(2));
    for (output, out) in [first.unwrap(), second.unwrap()] {
        assert!(
            output.status.success(),
            "bench failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        for p in report["phases"].as_array().unwrap() {
            assert_eq!(p["published"], 10, "{p}");
            assert_eq!(p["queued"], 10, "{p}");
            assert_eq!(p["complete"], true, "{p}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
