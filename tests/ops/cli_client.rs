//! The client commands as a person at a terminal meets them, run as processes: the answer and nothing
//! else on a good day; on a bad one, an error within seconds that names the host, the vhost, the user and
//! the setting to fix, without the AMQP client's protocol frames and without a panic on the way out; and
//! `admin status` looks at a broker without creating anything on it.

use crate::ops_common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use ops_common::rabbit::{TestVhost, management, segment};
use volcano_runner::sim::{SimConfig, Simulator};

fn root() -> &'static std::path::Path {
    ops_common::root()
}

/// Runs `volcano-runner` with `args`, the broker URL `url`, and no inherited log filter.
pub(crate) fn client(url: &str, args: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
        .args(args)
        .current_dir(root())
        .env("VOLCANO_RUNNER_BROKER__URL", url)
        .env_remove("VOLCANO_RUNNER_LOG")
        .env_remove("VOLCANO_RUNNER_CONFIG")
        .output()
        .expect("volcano-runner runs");
    (output, started.elapsed())
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// What no client command prints, whatever happens.
pub(crate) fn assert_no_noise(stderr: &str) {
    for noise in [
        " INFO ",
        " WARN ",
        "lapin",
        "panicked",
        "UNEXPECTED-FRAME",
        "close-ok",
    ] {
        assert!(!stderr.contains(noise), "{noise:?} in stderr:\n{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_command_prints_its_answer_and_logs_only_when_asked() {
    let vhost = TestVhost::new("cli-quiet").await;
    let (out, _) = client(
        &vhost.amqp_url(),
        &["submit", "schemas/examples/submit-job.figlet.json"],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout, "sent job 4817 (message id submit/4817)\n");
    assert_eq!(
        stderr, "",
        "a successful client command prints no log lines"
    );

    // Asked for, the logs are there.
    let (out, _) = client(
        &vhost.amqp_url(),
        &["-v", "submit", "schemas/examples/submit-job.figlet.json"],
    );
    assert!(out.status.success());
    assert!(
        text(&out.stderr).contains("Connected to RabbitMQ"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_is_not_there_or_refuses_is_named_within_seconds() {
    let vhost = TestVhost::new("cli-refused").await;
    let figlet = ["submit", "schemas/examples/submit-job.figlet.json"];

    // Nothing listens on port 1: the command gives up within its few seconds, not the runner's minute.
    let (out, took) = client("amqp://guest:guest@127.0.0.1:1/%2f", &figlet);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(took < Duration::from_secs(30), "gave up after {took:?}");
    assert!(stderr.contains("127.0.0.1:1"), "{stderr}");
    assert!(stderr.contains("vhost \"/\""), "{stderr}");
    assert!(stderr.contains("VOLCANO_RUNNER_BROKER__URL"), "{stderr}");
    assert!(stderr.contains("connection refused"), "{stderr}");
    assert_no_noise(&stderr);

    // A wrong password: the user is named, and where to fix it.
    let url = vhost
        .amqp_url()
        .replace("guest:guest@", "guest:not-the-password@");
    let (out, took) = client(&url, &figlet);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(took < Duration::from_secs(30), "gave up after {took:?}");
    assert!(
        stderr.contains("refused the login of user \"guest\""),
        "{stderr}"
    );
    assert!(stderr.contains("password"), "{stderr}");
    assert!(!stderr.contains("not-the-password"), "{stderr}");
    assert_no_noise(&stderr);

    // A vhost that does not exist.
    let (out, _) = client(
        "amqp://guest:guest@127.0.0.1:5672/no-such-vhost-here",
        &figlet,
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("has no vhost \"no-such-vhost-here\""),
        "{stderr}"
    );
    assert_no_noise(&stderr);

    // A host name that does not resolve.
    let (out, _) = client("amqp://guest:guest@no-such-host.invalid:5672/%2f", &figlet);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("host name \"no-such-host.invalid\" does not resolve"),
        "{stderr}"
    );
    assert_no_noise(&stderr);
}

/// The names of the queues and the non-default exchanges of a vhost.
async fn declared(vhost: &TestVhost) -> Vec<String> {
    let mut names = Vec::new();
    for kind in ["queues", "exchanges"] {
        let (status, body) = management(
            "GET",
            &format!("/api/{kind}/{}", segment(&vhost.name)),
            None,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        for item in body.as_array().into_iter().flatten() {
            let name = item["name"].as_str().unwrap_or_default();
            if !name.is_empty() && !name.starts_with("amq.") {
                names.push(format!("{kind}/{name}"));
            }
        }
    }
    names
}

/// On a vhost where no runner has declared the topology, `admin status`, `admin dead-letters` and
/// `admin pause --wait` answer, say what is missing, and declare nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_status_creates_nothing_on_the_broker_it_looks_at() {
    let vhost = TestVhost::new("cli-status-passive").await;
    let sim = Simulator::start(SimConfig::for_tests()).await.unwrap();
    assert_eq!(declared(&vhost).await, Vec::<String>::new());
    let (out, _) = client(
        &vhost.amqp_url(),
        &["admin", "--cluster", &sim.url(), "status"],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    // No runner has declared the topology on this vhost: status shows what it can read, says what is
    // missing (not the advice for broker.passive, which is off), and declares nothing itself.
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("pause switch:"), "{stdout}");
    assert!(
        stdout.contains("compute.jobs.submit") && stdout.contains("(missing)"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "PROBLEM: compute.jobs.submit, compute.jobs.control, compute.jobs.dead do not exist"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("no runner has declared the topology"),
        "{stdout}"
    );
    assert!(!stdout.contains("passive off") && !stderr.contains("passive off"));
    assert_no_noise(&stderr);
    let json = client(
        &vhost.amqp_url(),
        &["admin", "--cluster", &sim.url(), "status", "-o", "json"],
    )
    .0;
    assert!(json.status.success(), "{}", text(&json.stderr));
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["queues"][0]["exists"], false, "{json:#}");

    // The dead letters: there are none, and why.
    let (out, _) = client(&vhost.amqp_url(), &["admin", "dead-letters", "list"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("no dead letters")
            && stdout.contains("compute.jobs.dead")
            && stdout.contains("does not exist"),
        "{stdout}"
    );
    assert!(!stderr.contains("passive off"), "{stderr}");
    // One dead letter asked for by id is not there (exit code 1), with the same reason.
    let (out, _) = client(
        &vhost.amqp_url(),
        &["admin", "dead-letters", "show", "submit/1"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("does not exist"),
        "{}",
        text(&out.stderr)
    );

    // Pausing and waiting: no submit queue, so nothing takes submissions. (The switch lives in the
    // runner's namespace, which a runner would have created.)
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(sim.client().unwrap());
    namespaces
        .create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "volcano-runner"}}))
                .unwrap(),
        )
        .await
        .unwrap();
    let (out, _) = client(
        &vhost.amqp_url(),
        &[
            "admin",
            "--cluster",
            &sim.url(),
            "pause",
            "--wait",
            "--timeout",
            "5s",
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(
            "no runner takes submissions: the submit queue compute.jobs.submit does not exist"
        ),
        "{stdout}"
    );
    assert_no_noise(&stderr);
    assert_eq!(declared(&vhost).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_whose_name_does_not_resolve_is_named() {
    let (out, took) = client(
        "amqp://guest:guest@127.0.0.1:5672/%2f",
        &[
            "admin",
            "--cluster",
            "http://no-such-host.invalid:6443",
            "status",
        ],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(took < Duration::from_secs(60), "gave up after {took:?}");
    assert!(stderr.contains("no-such-host.invalid"), "{stderr}");
    // The cause, not only the HTTP client's `client error (Connect)`.
    assert!(
        stderr.contains("dns error") || stderr.contains("lookup"),
        "{stderr}"
    );
    assert_no_noise(&stderr);
}
