//! SIGTERM to a `volcano-runner run` process, as the kubelet sends it: while messages are in hand, the
//! runner drains them, `/readyz` answers 503 `draining` until the process exits, the counters it logs
//! add up, and nothing is logged at ERROR (no lapin connection error from a channel closed under the
//! connection's close). Idle, it stops without claiming messages in hand.

use crate::harness;
use crate::ports::free_port;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use harness::Harness;
use volcano_runner::sim::{FaultRule, SimConfig};

/// `GET path` on the runner's endpoint: the status and the body, or `None` when nothing answers.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n")?.1.to_owned();
    Some((status, body))
}

/// The value of an unlabelled metric.
fn metric(port: u16, name: &str) -> Option<f64> {
    let (_, body) = get(port, "/metrics")?;
    body.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

fn start_runner(h: &Harness, port: u16, log: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
        .args(["run", "--cluster", &h.sim.url(), "--id", "sigterm-1"])
        .env("VOLCANO_RUNNER_BROKER__URL", h.vhost.amqp_url())
        .env("VOLCANO_RUNNER_OPS__LISTEN", format!("127.0.0.1:{port}"))
        .env("VOLCANO_RUNNER_OPS__LOG_FORMAT", "human")
        .env("VOLCANO_RUNNER_LOG", "info")
        .env("VOLCANO_RUNNER_RUNNER__SHUTDOWN_GRACE", "30s")
        .env("VOLCANO_RUNNER_CLUSTER__LEASE__SHARDS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("the runner starts")
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits for the process to exit (at most a minute) and returns whether it exited with 0.
fn wait_exit(child: &mut Child) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.success();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the runner did not exit within a minute of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The log's lines at ERROR level (human format: `<time> ERROR <target>: ...`).
fn errors(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("ERROR"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_says_draining_and_logs_true_counters_without_errors() {
    let h = Harness::with_sim("sigterm", SimConfig::for_tests()).await;
    let dir = std::env::temp_dir().join(format!("vr-sigterm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();

    // Busy: four submissions in hand, each waiting 3 s for its VolcanoJob create.
    h.sim.faults().add_rule(FaultRule {
        resource: "jobs.batch.volcano.sh".into(),
        verb: "create".into(),
        latency_ms: 3000,
        ..FaultRule::default()
    });
    let busy_log = dir.join("busy.log");
    let mut runner = start_runner(&h, port, &busy_log);
    h.wait_consumers(&h.config.broker.submit_queue, 1).await;
    for n in 1..=4 {
        h.submit(&harness::figlet(&format!("term-{n}"))).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(port, "volcano_runner_messages_in_flight") != Some(4.0) {
        assert!(
            Instant::now() < deadline,
            "the four submissions are not in hand"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sigterm(&runner);
    // Until the process exits, /readyz answers (it does not refuse connections) and says draining.
    let mut draining_seen = false;
    while runner.try_wait().unwrap().is_none() {
        // Before the signal is handled the condition reads `ok not draining`; afterwards it fails
        // with `draining: finishing the messages in hand, ...`.
        if let Some((status, body)) = get(port, "/readyz")
            && body.contains("draining: finishing")
        {
            assert_eq!(status, 503, "{body}");
            draining_seen = true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(wait_exit(&mut runner), "a clean exit after the drain");
    assert!(draining_seen, "/readyz said draining during the drain");
    let log = std::fs::read_to_string(&busy_log).unwrap();
    assert!(errors(&log).is_empty(), "ERROR lines: {:#?}", errors(&log));
    assert!(
        log.contains(
            "Stopped consuming; finishing the messages in hand. queue=\"submit\" in_flight=4"
        ),
        "{log}"
    );
    assert!(
        log.contains("Runner stopped. acked=4 requeued=0 returned_at_shutdown=0 dead_lettered=0"),
        "{log}"
    );
    for n in 1..=4 {
        assert!(
            !h.events_with_id(&format!("term-{n}/QUEUED"))
                .await
                .is_empty(),
            "term-{n} was created and reported before the exit"
        );
    }

    // Idle: nothing in hand, so nothing is said to be; the counters are this process's.
    h.sim.faults().clear();
    let idle_log = dir.join("idle.log");
    let mut runner = start_runner(&h, port, &idle_log);
    h.wait_consumers(&h.config.broker.submit_queue, 1).await;
    h.submit(&harness::figlet("term-5")).await;
    h.wait_events_for("QUEUED of term-5", Duration::from_secs(30), |e| {
        e.iter().any(|c| c.message_id == "term-5/QUEUED")
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(port, "volcano_runner_messages_in_flight") != Some(0.0) {
        assert!(Instant::now() < deadline, "the runner is not idle");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sigterm(&runner);
    assert!(wait_exit(&mut runner), "a clean exit");
    let log = std::fs::read_to_string(&idle_log).unwrap();
    assert!(errors(&log).is_empty(), "ERROR lines: {:#?}", errors(&log));
    assert!(
        !log.contains("finishing the messages in hand"),
        "idle, nothing is in hand: {log}"
    );
    assert!(
        log.contains("Runner stopped. acked=1 requeued=0 returned_at_shutdown=0 dead_lettered=0"),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
