//! `volcano-runner run` started by hand, as a process, in the ways an operator meets in a first week: a
//! wrong password or vhost is told once, in the runner's own words, without the AMQP client's ERROR lines
//! before it; Ctrl-C while RabbitMQ is still being tried is a clean stop (exit code 0, as docs/runner.md
//! says); and the metrics endpoint listens on loopback outside a cluster, on every interface in a pod.

use crate::ops_common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use ops_common::rabbit::TestVhost;

/// `volcano-runner run --cluster sim` with the broker at `url`, logging at INFO, and no inherited
/// configuration; `tweak` adds to the environment.
fn runner(url: &str, tweak: impl FnOnce(&mut Command)) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_volcano-runner"));
    command
        .args(["run", "--cluster", "sim", "--id", "run-cmd-test"])
        .current_dir(ops_common::root())
        .env("VOLCANO_RUNNER_BROKER__URL", url)
        .env("VOLCANO_RUNNER_LOG", "info")
        .env("VOLCANO_RUNNER_OPS__LISTEN", "127.0.0.1:0")
        .env_remove("VOLCANO_RUNNER_CONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    tweak(&mut command);
    command.spawn().expect("volcano-runner run starts")
}

/// The lines of the child's stderr, as they come, from a thread of their own.
fn stderr_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().expect("stderr is piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Reads lines until one passes `wanted` (returned with everything read so far), or the stream ends.
fn read_until(
    lines: &mpsc::Receiver<String>,
    seen: &mut Vec<String>,
    wanted: impl Fn(&str) -> bool,
) -> Option<String> {
    loop {
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                seen.push(line.clone());
                if wanted(&line) {
                    return Some(line);
                }
            }
            Err(_) => return None,
        }
    }
}

/// Waits (bounded) for the child to exit and returns its exit code.
fn exit_code(child: &mut Child) -> Option<i32> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the runner did not exit within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_login_or_vhost_is_said_once_without_the_amqp_clients_lines() {
    let vhost = TestVhost::new("run-refused").await;
    let wrong_password = vhost
        .amqp_url()
        .replace("guest:guest@", "guest:not-the-password@");
    for (url, says) in [
        (
            wrong_password.as_str(),
            "refused the login of user \"guest\"",
        ),
        (
            "amqp://guest:guest@127.0.0.1:5672/no-such-vhost-for-run",
            "has no vhost \"no-such-vhost-for-run\"",
        ),
    ] {
        let mut child = runner(url, |_| {});
        let lines = stderr_lines(&mut child);
        let code = exit_code(&mut child);
        let stderr: Vec<String> = lines.iter().collect();
        let stderr = stderr.join("\n");
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
        assert!(
            !stderr.contains("not-the-password"),
            "the password is not shown: {stderr}"
        );
        // The AMQP client's own lines (its module path is `lapin::...`) say the same thing in protocol
        // terms, at ERROR, before the runner's message: they are left out.
        let noise: Vec<&str> = stderr.lines().filter(|l| l.contains("lapin")).collect();
        assert!(
            noise.is_empty(),
            "the AMQP client's lines: {noise:#?}\n{stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_while_rabbitmq_is_still_tried_is_a_clean_stop() {
    // Nothing listens on port 1: the runner keeps trying for `[broker] startup_timeout` (a minute).
    let mut child = runner("amqp://guest:guest@127.0.0.1:1/%2f", |_| {});
    let lines = stderr_lines(&mut child);
    let mut seen = Vec::new();
    read_until(&lines, &mut seen, |l| {
        l.contains("RabbitMQ is not reachable yet")
    })
    .unwrap_or_else(|| panic!("the runner retries its broker: {seen:#?}"));
    // SAFETY: signals the child this test started, by its id.
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let code = exit_code(&mut child);
    seen.extend(lines.iter());
    assert_eq!(
        code,
        Some(0),
        "a stop asked for is not a failure: {seen:#?}"
    );
}

/// Starts a runner without `[ops] listen` and returns the address it says it serves on (or could not
/// bind: a port already taken is named in the error too), then stops it.
fn default_listen(in_cluster: bool) -> String {
    let mut child = runner("amqp://guest:guest@127.0.0.1:1/%2f", |c| {
        c.env_remove("VOLCANO_RUNNER_OPS__LISTEN");
        if in_cluster {
            c.env("KUBERNETES_SERVICE_HOST", "10.96.0.1");
        }
    });
    let lines = stderr_lines(&mut child);
    let mut seen = Vec::new();
    let line = read_until(&lines, &mut seen, |l| {
        l.contains("Serving /metrics") || l.contains("[ops] listen")
    });
    let _ = child.kill();
    let _ = child.wait();
    let line = line.unwrap_or_else(|| panic!("the runner says where it listens: {seen:#?}"));
    let pattern = regex::Regex::new(r"(?:listen=|\[ops\] listen )([0-9.]+:[0-9]+)").unwrap();
    pattern
        .captures(&line)
        .unwrap_or_else(|| panic!("no address in {line}"))[1]
        .to_owned()
}

#[test]
fn the_endpoint_is_on_loopback_by_hand_and_on_every_interface_in_a_pod() {
    assert_eq!(default_listen(false), "127.0.0.1:9090");
    assert_eq!(default_listen(true), "0.0.0.0:9090");
}

/// Every create of a Lease slowed to a minute (past the lease's request timeout): the runner can take no
/// shard, so it monitors nothing. It says so at WARN, and its /readyz fails the `shard leases` check,
/// instead of answering ok with 0 shards and nothing above DEBUG.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_cannot_write_its_leases_says_so_and_is_not_ready() {
    let vhost = TestVhost::new("run-leases").await;
    let dir = std::env::temp_dir().join(format!("vr-run-leases-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        "[[sim.faults.rules]]\nresource = \"leases\"\nverb = \"create\"\nlatency_ms = 60000\n",
    )
    .unwrap();
    let mut child = runner(&vhost.amqp_url(), |c| {
        c.env("VOLCANO_RUNNER_CONFIG", &config);
    });
    let lines = stderr_lines(&mut child);
    let mut seen = Vec::new();
    let serving = read_until(&lines, &mut seen, |l| l.contains("Serving /metrics"))
        .unwrap_or_else(|| panic!("the endpoint starts: {seen:#?}"));
    let addr: std::net::SocketAddr = regex::Regex::new(r"listen=([0-9.]+:[0-9]+)")
        .unwrap()
        .captures(&serving)
        .unwrap()[1]
        .parse()
        .unwrap();
    let warned = read_until(&lines, &mut seen, |l| {
        l.contains("WARN") && l.contains("cannot write its shard leases")
    });
    let (status, _, body) = ops_common::http_get(addr, "/readyz").await;
    // Killed: its simulator still holds the slowed creates for a minute.
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let warned = warned.unwrap_or_else(|| panic!("no WARN about the leases: {seen:#?}"));
    assert!(warned.contains("it holds 0 of"), "{warned}");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("failed shard leases: cannot write its shard leases"),
        "{body}"
    );
    assert!(body.contains("ok broker"), "{body}");
}
