//! A message whose headers nest tables thousands deep (RabbitMQ accepts them up to its frame size) once
//! overflowed the stack of the AMQP client's I/O thread and aborted the runner process, and then the next
//! runner that got the message. The program, as deployed, reads such a message and goes on: the nested
//! message and a valid one after it are both handled.

use crate::ops_common;

use std::process::{Command, Stdio};
use std::time::Duration;

use lapin::options::{QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde_json::json;

use ops_common::rabbit::{PATIENCE, TestVhost, management_text, segment};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_nested_thousands_deep_do_not_stop_the_program() {
    let vhost = TestVhost::new("nested-headers").await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
        .args(["run", "--cluster", "sim", "--id", "nested-headers"])
        .env("VOLCANO_RUNNER_BROKER__URL", vhost.amqp_url())
        .env("VOLCANO_RUNNER_OPS__LISTEN", "127.0.0.1:0")
        .env("VOLCANO_RUNNER_LOG", "warn")
        .env_remove("RUST_MIN_STACK")
        .env_remove("VOLCANO_RUNNER_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("volcano-runner starts");
    // The runner declares the topology; then the events get a queue to go to.
    vhost.connections_named("volcano-runner").await;
    let (connection, channel) = vhost.raw().await;
    channel
        .queue_declare(
            "nested.events".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            "nested.events".into(),
            "compute.events".into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();

    let publish = |job_id: &str, headers: String| {
        let job = std::fs::read_to_string(
            ops_common::root().join("schemas/examples/submit-job.figlet.json"),
        )
        .unwrap()
        .replace("\"4817\"", &format!("\"{job_id}\""));
        // Written as text: 10,000 levels (about 70 KB of headers) is deeper than any JSON value this
        // thread could build or print.
        format!(
            r#"{{"routing_key":"submit","payload_encoding":"string","payload":{payload},"properties":{{"content_type":"application/json","type":"volcano_runner.v1.SubmitJob","message_id":"{job_id}","delivery_mode":2,"headers":{headers}}}}}"#,
            payload = json!(job),
        )
    };
    let depth = 10_000;
    let nested = format!(
        r#"{{"x-nest":{}{{}}{}}}"#,
        r#"{"a":"#.repeat(depth),
        "}".repeat(depth)
    );
    let path = format!(
        "/api/exchanges/{}/compute.jobs/publish",
        segment(&vhost.name)
    );
    for (job, headers) in [("nest-deep", nested), ("nest-after", "{}".to_owned())] {
        let (status, body) = management_text("POST", &path, publish(job, headers)).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["routed"], true, "{body}");
    }

    // Both are handled (their QUEUED arrive), and the program is still running.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    while !["nest-deep/QUEUED", "nest-after/QUEUED"]
        .iter()
        .all(|id| seen.iter().any(|s: &String| s == id))
    {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            use std::io::Read;
            let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
            panic!("the runner exited ({status}):\n{stderr}");
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "events so far: {seen:?}"
        );
        for m in vhost.drain("nested.events").await {
            if let Some(id) = m.delivery.properties.message_id() {
                seen.push(id.to_string());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(child.try_wait().unwrap().is_none(), "the runner is running");
    let _ = connection.close(200, "done".into()).await;
    let _ = child.kill();
    let _ = child.wait();
}
