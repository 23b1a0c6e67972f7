//! `volcano-runner logs`: every rank's log through the API, interleaved with a rank prefix, against the
//! simulator's kubelet (which serves pod logs with timestamps, `sinceSeconds` and `follow`).

use std::process::Output;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use std::io::BufRead;

use volcano_runner::sim::SimHandle;

use crate::sim_support::{dynamic, eventually, gang_job, jobs, namespace, start_with};

const NS: &str = "logs";

fn logs(sim: &SimHandle, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
        .args(["logs", "--cluster", &sim.url()])
        .args(args)
        .output()
        .expect("logs runs")
}

fn stdout_lines(out: &Output) -> Vec<String> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The lines of a child's output, read on a thread of their own; the channel closes when it ends.
fn lines_of(
    out: impl std::io::Read + Send + 'static,
) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

async fn pod_phase(pods: &Api<Pod>, name: &str) -> String {
    pods.get_opt(name)
        .await
        .unwrap()
        .and_then(|p| p.status)
        .and_then(|s| s.phase)
        .unwrap_or_default()
}

async fn start_gang(sim: &SimHandle, client: &kube::Client, name: &str, script: &str) {
    jobs(client, NS)
        .create(
            &PostParams::default(),
            &dynamic(gang_job(name, NS, 2, "1", &["sh", "-c", script])),
        )
        .await
        .unwrap();
    sim.advance(Duration::from_secs(1));
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for rank in 0..2 {
        let pod = format!("{name}-job-{rank}");
        eventually(&format!("{pod} running"), || async {
            pod_phase(&pods, &pod).await == "Running"
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ranks_of_a_job_are_read_together_in_time_order() {
    let (sim, client) = start_with(|c| c.pod_start_delay = Duration::ZERO).await;
    namespace(&client, NS).await;
    start_gang(&sim, &client, "j-mpi", "echo hello; sleep 30; echo goodbye").await;
    sim.advance(Duration::from_secs(40));
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    eventually("both ranks done", || async {
        pod_phase(&pods, "j-mpi-job-0").await == "Succeeded"
            && pod_phase(&pods, "j-mpi-job-1").await == "Succeeded"
    })
    .await;

    // Interleaved by time: one rank after the other would print hello, goodbye, hello, goodbye.
    assert_eq!(
        stdout_lines(&logs(&sim, &["mpi"])),
        [
            "[rank 0] hello",
            "[rank 1] hello",
            "[rank 0] goodbye",
            "[rank 1] goodbye"
        ]
    );
    assert_eq!(
        stdout_lines(&logs(&sim, &["mpi", "--rank", "1"])),
        ["[rank 1] hello", "[rank 1] goodbye"]
    );
    // By the cluster's clock, goodbye was written 10 s ago and hello 40 s ago.
    assert_eq!(
        stdout_lines(&logs(&sim, &["mpi", "--since", "20s"])),
        ["[rank 0] goodbye", "[rank 1] goodbye"]
    );
    let stamped = stdout_lines(&logs(&sim, &["mpi", "--rank", "0", "--timestamps"]));
    let hello_at: jiff::Timestamp = stamped[0]
        .strip_prefix("[rank 0] ")
        .and_then(|l| l.split_once(' '))
        .map(|(t, text)| {
            assert_eq!(text, "hello");
            t.parse().unwrap()
        })
        .unwrap();
    let goodbye_at: jiff::Timestamp = stamped[1][9..33].parse().unwrap();
    assert_eq!((goodbye_at - hello_at).get_seconds(), 30, "{stamped:?}");

    let wrong_rank = logs(&sim, &["mpi", "--rank", "2"]);
    assert_eq!(wrong_rank.status.code(), Some(2), "an error: exit 2");
    assert!(
        String::from_utf8_lossy(&wrong_rank.stderr).contains("--rank 2: job mpi has 2 rank(s)"),
        "{}",
        String::from_utf8_lossy(&wrong_rank.stderr)
    );
    let unknown = logs(&sim, &["nope"]);
    assert_eq!(unknown.status.code(), Some(2), "an error: exit 2");
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("no job nope in the cluster"),
        "{}",
        String::from_utf8_lossy(&unknown.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn following_waits_for_the_ranks_prints_lines_as_they_come_and_ends_with_the_job() {
    // Containers start 10 s after their pods are bound: the command begins before there is a log.
    let (sim, client) = start_with(|c| c.pod_start_delay = Duration::from_secs(10)).await;
    namespace(&client, NS).await;
    jobs(&client, NS)
        .create(
            &PostParams::default(),
            &dynamic(gang_job(
                "j-live",
                NS,
                2,
                "1",
                &["sh", "-c", "echo one; sleep 30; echo two"],
            )),
        )
        .await
        .unwrap();
    sim.advance(Duration::from_secs(1));
    // Without --follow there is nothing to show yet, and the exit code says so.
    let nothing = logs(&sim, &["live"]);
    assert_eq!(nothing.status.code(), Some(1), "nothing to show: exit 1");
    let said = String::from_utf8_lossy(&nothing.stderr);
    assert!(
        said.contains(
            "[rank 1] no log: container \"user-job\" in pod \"j-live-job-1\" is waiting to start"
        ) && said.contains("no rank of job live has a log to show"),
        "{said}"
    );
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
        .args(["logs", "--cluster", &sim.url(), "live", "--follow"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("logs --follow starts");
    // It finds no log yet and says so on stderr, once per rank, and waits; then the containers start.
    let mut err_rx = lines_of(child.stderr.take().unwrap());
    let mut said = Vec::new();
    while said.len() < 2 {
        let line = tokio::time::timeout(Duration::from_secs(30), err_rx.recv())
            .await
            .expect("it says why it waits within 30 s")
            .expect("a line on stderr");
        said.push(line);
    }
    said.sort();
    assert!(
        said[0].starts_with(
            "[rank 0] waiting: container \"user-job\" in pod \"j-live-job-0\" is waiting to start"
        ),
        "{said:?}"
    );
    assert!(said[1].starts_with("[rank 1] waiting: "), "{said:?}");
    sim.advance(Duration::from_secs(10));
    let mut rx = lines_of(child.stdout.take().unwrap());
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("a line, or the end, within 30 s")
    };
    let mut first = vec![next().await.unwrap(), next().await.unwrap()];
    first.sort();
    assert_eq!(first, ["[rank 0] one", "[rank 1] one"]);
    // Nothing more until the programs go on: then the second lines come, and the command ends by itself.
    sim.advance(Duration::from_secs(40));
    let mut second = vec![next().await.unwrap(), next().await.unwrap()];
    second.sort();
    assert_eq!(second, ["[rank 0] two", "[rank 1] two"]);
    assert_eq!(next().await, None, "no line twice");
    // Its output has ended: the process has ended or is about to.
    let status = child.wait().unwrap();
    assert!(status.success());
    let mut more = Vec::new();
    while let Ok(line) = err_rx.try_recv() {
        more.push(line);
    }
    assert!(
        more.is_empty(),
        "nothing more said while it waited: {more:?}"
    );
}

/// An ended job (being deleted, kept by a finalizer as the record of its submission, its pods gone):
/// `logs` says where every rank's output was kept and exits 0, and `--follow` ends by itself saying the
/// same; while the job runs nothing is said about files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_jobs_logs_say_where_its_output_was_kept_and_follow_ends() {
    let (sim, client) = start_with(|c| c.pod_start_delay = Duration::ZERO).await;
    namespace(&client, NS).await;
    let mut job = gang_job(
        "j-kept",
        NS,
        2,
        "1",
        &["sh", "-c", "echo one; sleep infinity"],
    );
    job["metadata"]["annotations"] = serde_json::json!({
        "ucloud.dk/outputFolder": "/home/alice/Jobs/kept",
        "ucloud.dk/outputMaxBytes": "1000",
    });
    job["metadata"]["finalizers"] = serde_json::json!(["ucloud.dk/cleanup"]);
    jobs(&client, NS)
        .create(&PostParams::default(), &dynamic(job))
        .await
        .unwrap();
    sim.advance(Duration::from_secs(1));
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for rank in 0..2 {
        let pod = format!("j-kept-job-{rank}");
        eventually(&format!("{pod} running"), || async {
            pod_phase(&pods, &pod).await == "Running"
        })
        .await;
    }
    sim.advance(Duration::from_secs(1));
    let running = logs(&sim, &["kept"]);
    assert_eq!(stdout_lines(&running), ["[rank 0] one", "[rank 1] one"]);
    assert!(
        !String::from_utf8_lossy(&running.stderr).contains("has ended"),
        "{}",
        String::from_utf8_lossy(&running.stderr)
    );
    // Ended: deleted (the finalizer keeps the record), its pods gone.
    jobs(&client, NS)
        .delete("j-kept", &Default::default())
        .await
        .unwrap();
    for rank in 0..2 {
        let _ = pods
            .delete(&format!("j-kept-job-{rank}"), &Default::default())
            .await;
    }
    sim.advance(Duration::from_secs(40));
    eventually("the pods gone", || async {
        pods.get_opt("j-kept-job-0").await.unwrap().is_none()
            && pods.get_opt("j-kept-job-1").await.unwrap().is_none()
    })
    .await;
    let note = "job kept has ended; every rank's output was kept in its output folder \
                /home/alice/Jobs/kept (the first 1000 bytes of each rank's output): \
                /home/alice/Jobs/kept/stdout.txt, /home/alice/Jobs/kept/stdout-1.txt";
    let ended = logs(&sim, &["kept"]);
    let said = String::from_utf8_lossy(&ended.stderr);
    assert_eq!(ended.status.code(), Some(0), "the answer is where: {said}");
    assert!(!said.contains("no rank of job kept has a log"), "{said}");
    assert!(said.contains(note), "{said}");
    // --follow ends by itself (the job has ended), exit 0, saying the same.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
        .args(["logs", "--cluster", &sim.url(), "kept", "--follow"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("logs --follow starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("logs --follow of an ended job did not end within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let out = child.wait_with_output().unwrap();
    assert!(status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains(note), "{said}");
}

/// A job that has ended (here: cancelled while it waited, as the runner records it) and has no pods:
/// nothing will ever come, so `logs` says so instead of pointing at `--follow`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_job_without_pods_is_not_told_to_wait_for_them() {
    let (sim, client) = start_with(|_| {}).await;
    namespace(&client, NS).await;
    // 64 CPUs per rank: no node holds a rank, so no pod is ever created.
    let mut job = gang_job("j-gone", NS, 2, "64", &["sh", "-c", "echo never"]);
    job["metadata"]["annotations"] = serde_json::json!({"ucloud.dk/lifecycleState": "CANCELLED"});
    jobs(&client, NS)
        .create(&PostParams::default(), &dynamic(job))
        .await
        .unwrap();
    sim.advance(Duration::from_secs(1));
    let out = logs(&sim, &["gone"]);
    assert_eq!(out.status.code(), Some(1), "nothing to show: exit 1");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("no rank of job gone has a log to show")
            && said.contains("the job has ended and its pods are gone"),
        "{said}"
    );
    assert!(!said.contains("--follow waits"), "{said}");
}
