//! The same promise for the real program: `volcano-runner run` with a configuration file that holds the
//! AMQP password and a license key, logging JSON at TRACE (`VOLCANO_RUNNER_LOG=trace`), handles a VNC job
//! with a password, a job with a license that does not exist, and a cancel, then stops on SIGTERM. Nothing
//! it wrote to stderr or stdout holds any of the secrets.

use crate::ops_common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use volcano_runner::broker::BrokerConfig;
use volcano_runner::broker::{Broker, Outbound, OutboundEvent};
use volcano_runner::messages::Format;
use volcano_runner::messages::v1::{CancelJob, JobState};

use ops_common::rabbit::{PATIENCE, TestVhost};
use ops_common::secrets::{RabbitUser, Secrets};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_program_never_logs_a_secret() {
    let vhost = TestVhost::new("redact-cli").await;
    let secrets = Secrets::new("cli");
    let user = RabbitUser::create(&vhost, &secrets.amqp_password).await;
    let dir = std::env::temp_dir().join(format!("vr-redact-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config_path = dir.join("runner.toml");
    std::fs::write(
        &config_path,
        format!(
            r#"
[broker]
url = "{url}"
reconnect_max_delay = "1s"

[licenses.matlab-campus]
address = "license.cloud.sdu.dk"
port = 27000
license = "{license}"

[cluster]
target = "sim"

[cluster.retry]
max_elapsed = "3s"
min_delay = "100ms"

[sim]
clock_speed = 20.0

[ops]
listen = "127.0.0.1:0"
log_format = "json"
"#,
            url = secrets.amqp_url(&user.name, &vhost),
            license = secrets.license_key,
        ),
    )
    .unwrap();

    // The orchestrator's side, with the guest account: declares the topology and follows the events.
    let orchestrator_token = tokio_util::sync::CancellationToken::new();
    let config = BrokerConfig {
        connection_name: "orchestrator-redact-cli".into(),
        ..vhost.config()
    };
    let orchestrator = Broker::connect(config.clone(), orchestrator_token.clone())
        .await
        .unwrap();
    let mut events = orchestrator.follow_events().await.unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
        .arg("--config")
        .arg(&config_path)
        .args(["run", "--id", "redact-cli"])
        .env("VOLCANO_RUNNER_LOG", "trace")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("volcano-runner starts");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            let _ = pipe.read_to_end(&mut out);
            String::from_utf8_lossy(&out).into_owned()
        })
    };
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let stdout = drain(Box::new(child.stdout.take().unwrap()));

    let publisher = orchestrator.publisher();
    let submit = |job| Outbound::submit(&job, Format::Json, &config);
    publisher
        .publish(&submit(secrets.job("cli-1", 20)))
        .await
        .unwrap();
    let mut invalid = secrets.job("cli-2", 20);
    invalid.parameters.insert(
        "license".into(),
        serde_json::from_value(serde_json::json!({"licenseServer": {"id": "nowhere"}})).unwrap(),
    );
    publisher.publish(&submit(invalid)).await.unwrap();
    publisher
        .publish(&submit(secrets.job("cli-3", 36000)))
        .await
        .unwrap();

    let mut seen: Vec<(String, i32)> = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE * 2;
    let wanted = [
        ("cli-1", JobState::Success),
        ("cli-2", JobState::Failure),
        ("cli-3", JobState::Running),
    ];
    while !wanted
        .iter()
        .all(|(id, state)| seen.contains(&(id.to_string(), *state as i32)))
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the program did not get through the script; events: {seen:?}"
        );
        if let Ok(Some(event)) = tokio::time::timeout(Duration::from_secs(1), events.next()).await
            && let Ok(OutboundEvent::Job(job)) = event.event
        {
            seen.push((job.job_id, job.state));
        }
    }
    let cancel = CancelJob {
        job_id: "cli-3".into(),
        reason: Some("no longer needed".into()),
    };
    publisher
        .publish(&Outbound::cancel(&cancel, Format::Json, &config))
        .await
        .unwrap();
    while !seen.contains(&("cli-3".to_string(), JobState::Cancelled as i32)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no CANCELLED for cli-3"
        );
        if let Ok(Some(event)) = tokio::time::timeout(Duration::from_secs(1), events.next()).await
            && let Ok(OutboundEvent::Job(job)) = event.event
        {
            seen.push((job.job_id, job.state));
        }
    }

    // SIGTERM, as the kubelet sends it; the program shuts down cleanly.
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let exit = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    let stderr = stderr.join().unwrap();
    let stdout = stdout.join().unwrap();
    assert!(
        exit.success(),
        "exit {exit:?}; stderr tail:\n{}",
        tail(&stderr)
    );
    orchestrator_token.cancel();
    orchestrator.close().await;
    let _ = std::fs::remove_dir_all(&dir);

    // TRACE was on for the whole run (what would have carried a secret, had one leaked): the count
    // of TRACE lines, not of all lines, which falls with every request the runner saves.
    let traces = stderr
        .lines()
        .filter(|l| l.contains("\"level\":\"TRACE\""))
        .count();
    assert!(
        traces > 200,
        "TRACE logs of the whole run: {traces} of {} lines\n{}",
        stderr.lines().count(),
        tail(&stderr)
    );
    assert!(
        stderr.lines().all(|l| l.starts_with('{')),
        "every log line is JSON ([ops] log_format)"
    );
    let leaked = secrets.found_in(&stderr);
    assert!(leaked.is_empty(), "secrets on stderr: {leaked:?}");
    let leaked = secrets.found_in(&stdout);
    assert!(leaked.is_empty(), "secrets on stdout: {leaked:?}");
    // The logs are about the jobs: their spans carry the job ids.
    for id in ["cli-1", "cli-2", "cli-3"] {
        assert!(
            stderr.contains(&format!("\"job_id\":\"{id}\"")),
            "{id} in no span"
        );
    }
    // The metrics endpoint was up: its address is in the log.
    assert!(stderr.contains("Serving /metrics, /healthz and /readyz."));
    drop(user);
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
