//! `volcano-runner proxy-sync` as a process: configured by file and environment like every command,
//! it serves `/readyz`, which turns ready once the table of the running jobs is built and written to
//! the Envoy directory, and it exits cleanly on SIGTERM. It is a service, not a client command: it logs at
//! INFO by default, and `[ops] log_filter` is what it follows.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::monitor_support::{PATIENCE, World, web_job};
use crate::ports::free_port;

/// `GET path` over plain HTTP/1.0: the status and the body.
async fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await.ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1.to_owned();
    Some((status, body))
}

/// The JSON lines of a log (the others, if any, are skipped).
fn log_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Runs `volcano-runner proxy-sync` until it is ready (checking what it serves when `check`), stops it
/// with SIGTERM, and returns what it logged on stderr (JSON lines; `filter`: `[ops] log_filter`).
async fn run_until_ready_then_stop(
    w: &World,
    dir: &std::path::Path,
    filter: Option<&str>,
    check: bool,
) -> String {
    let listen = format!("127.0.0.1:{}", free_port());
    let bridge = format!("127.0.0.1:{}", free_port());
    let stderr_path = dir.with_extension(format!("{}.log", free_port()));
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_volcano-runner"));
    command
        .args(["proxy-sync", "--cluster", &w.sim.url(), "--id", "proxy-0"])
        .arg("--envoy-dir")
        .arg(dir)
        .env("VOLCANO_RUNNER_BROKER__URL", w.vhost.amqp_url())
        .env("VOLCANO_RUNNER_OPS__LISTEN", &listen)
        .env("VOLCANO_RUNNER_OPS__LOG_FORMAT", "json")
        .env("VOLCANO_RUNNER_PROXY_SYNC__BRIDGE_LISTEN", &bridge)
        .env("VOLCANO_RUNNER_PIPELINE__PROXY__DOMAIN", "apps.example.org")
        .env_remove("VOLCANO_RUNNER_CONFIG")
        .env_remove("RUST_LOG")
        .env_remove("VOLCANO_RUNNER_OPS__LOG_FILTER")
        .stdout(Stdio::null())
        .stderr(stderr);
    if let Some(filter) = filter {
        command.env("VOLCANO_RUNNER_OPS__LOG_FILTER", filter);
    }
    let mut child = command.spawn().expect("volcano-runner starts");
    let ready = async {
        loop {
            if let Some((200, body)) = get(&listen, "/readyz").await {
                return body;
            }
            assert!(
                child.try_wait().unwrap().is_none(),
                "proxy-sync exited before it was ready"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let body = tokio::time::timeout(PATIENCE, ready)
        .await
        .expect("proxy-sync becomes ready");
    if check {
        assert_eq!(body, "ok broker\nok route table\nok cluster\n");
        // Ready means written: both ranks, under the configured domain.
        let rds = std::fs::read_to_string(dir.join("rds.json")).expect("rds.json is written");
        for rank in 0..2 {
            assert!(
                rds.contains(&format!("\"app-cli1-{rank}.apps.example.org\"")),
                "{rds}"
            );
        }
        let bootstrap = std::fs::read_to_string(dir.join("bootstrap.json")).unwrap();
        assert!(bootstrap.contains("\"proxy-0\""), "{bootstrap}");
        // The session bridges are served too: a host no job is routed at gets no bridge.
        let (code, body) = get(&bridge, "/.volcano-runner/terminal")
            .await
            .expect("the bridges answer");
        assert_eq!(code, 404, "{body}");
        assert!(body.contains("no running interactive job"), "{body}");
    }

    let pid = child.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let exited = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exited.success(), "{exited:?}");
    let log = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let _ = std::fs::remove_file(&stderr_path);
    log
}

#[tokio::test]
async fn the_subcommand_is_ready_once_the_routes_are_written_and_stops_on_sigterm() {
    let mut w = World::start("proxy-cli", |_| {}, |_| {}).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    w.submit(&web_job("cli1", 2, "sleep 100000")).await;
    w.advance(2);
    w.advance(2);
    w.until("CREATE cli1", |s| {
        s.proxy.iter().any(|p| p.job_id == "cli1")
    })
    .await;

    let dir = std::env::temp_dir().join(format!("vr-proxy-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let log = run_until_ready_then_stop(&w, &dir, None, true).await;
    // A service's log: INFO by default, in the configured format (JSON here).
    let info: Vec<Value> = log_lines(&log)
        .into_iter()
        .filter(|l| l["level"] == "INFO")
        .collect();
    assert!(
        info.iter()
            .any(|l| l["fields"]["message"] == "Route table built from the cluster."),
        "no INFO line on the table: {log}"
    );
    assert!(
        !log_lines(&log).iter().any(|l| l["level"] == "DEBUG"),
        "{log}"
    );
    // `[ops] log_filter` is what it follows: debug for its own code.
    let log = run_until_ready_then_stop(&w, &dir, Some("info,volcano_runner=debug"), false).await;
    assert!(
        log_lines(&log)
            .iter()
            .any(|l| l["level"] == "DEBUG"
                && l["fields"]["message"] == "Envoy configuration written."),
        "no DEBUG line with the filter: {log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    runner.stop().await;
    w.close().await;
}
