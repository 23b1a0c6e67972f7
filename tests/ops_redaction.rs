//! Secrets never reach the logs: a runner process (consumers, leases, monitor, the simulator and the
//! orchestrator's connection, all in this process) runs a scripted session with every module logging at
//! TRACE, through the production log layer and the global [`Redactor`] that `volcano-runner` sets up from
//! its configuration. A second layer writes the same events without redaction, to show that the secrets
//! were really there to leak: the test fails if redaction is removed, and if the session never carried
//! the secrets into the logs at all.

mod ops_common;

use std::time::Duration;

use tracing_subscriber::layer::SubscriberExt;
use volcano_runner::config::Config;
use volcano_runner::messages::v1::JobState;
use volcano_runner::ops::telemetry::{RedactingWriter, format_layer};
use volcano_runner::ops::{LogFormat, Ops, Redactor};

use ops_common::capture::Capture;
use ops_common::fleet::Fleet;
use ops_common::rabbit::TestVhost;
use ops_common::secrets::{RabbitUser, Secrets};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_the_logs() {
    let redacted = Capture::default();
    let raw = Capture::default();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("trace"))
        .with(format_layer(
            LogFormat::Json,
            RedactingWriter::new(redacted.clone(), Redactor::global().clone()),
            false,
        ))
        .with(format_layer(LogFormat::Json, raw.clone(), false));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let vhost = TestVhost::new("redact").await;
    let secrets = Secrets::new("redact");
    let user = RabbitUser::create(&vhost, &secrets.amqp_password).await;
    let url = secrets.amqp_url(&user.name, &vhost);
    // What `volcano-runner` does at start with its configuration (cli::init_logging).
    let mut startup = Config::default();
    secrets.configure(&mut startup, &url);
    for secret in startup.secrets() {
        Redactor::global().add(secret);
    }

    let small = Some(Duration::from_secs(1));
    let mut fleet =
        Fleet::start_on(vhost, "redact", Ops::new(), |c| secrets.configure(c, &url)).await;
    // A VNC job with a license server: the password arrives in the message, the license key goes into
    // the pod's environment.
    fleet.submit(&secrets.job("redact-1", 20)).await;
    fleet.wait_state("redact-1", JobState::Running, small).await;
    let job_namespace = fleet
        .recorder
        .calls()
        .iter()
        .find_map(|c| match &c.call {
            volcano_runner::ops::ApiCall::Resource(r)
                if r.verb == "create" && r.resource == "jobs" =>
            {
                r.namespace.clone()
            }
            _ => None,
        })
        .expect("a job was created");
    // The secrets are in play: the runner authenticated with the password, the license key is in the
    // job's environment in the cluster, the VNC password travelled in the messages.
    let job = fleet
        .sim
        .object(
            "batch.volcano.sh",
            "v1alpha1",
            "jobs",
            &job_namespace,
            "j-redact-1",
        )
        .expect("the job is in the cluster");
    assert!(
        job.to_string().contains(&secrets.license_key),
        "the license key reached the job"
    );

    fleet.wait_state("redact-1", JobState::Success, small).await;
    // An invalid one (a license server that does not exist) and a cancel, for the error paths.
    let mut invalid = secrets.job("redact-2", 20);
    invalid.parameters.insert(
        "license".into(),
        serde_json::from_value(serde_json::json!({"licenseServer": {"id": "nowhere"}})).unwrap(),
    );
    fleet.submit(&invalid).await;
    fleet.wait_state("redact-2", JobState::Failure, None).await;
    fleet.submit(&secrets.job("redact-3", 3600)).await;
    fleet.wait_state("redact-3", JobState::Running, small).await;
    fleet.cancel("redact-3").await;
    fleet
        .wait_state("redact-3", JobState::Cancelled, small)
        .await;
    fleet.stop().await;

    // Control lines through the same pipeline, as a library or an error message might write them: the
    // URL with its password, a Debug of a submission (prost prints the VNC password), the rendered
    // license argument. They are in the unredacted output, so a missing redaction would show.
    tracing::warn!(url = %url, "control: a line that quotes the AMQP URL");
    tracing::warn!(job = ?secrets.job("control", 1), "control: a Debug of a submission");
    tracing::warn!(
        "control: MLM_LICENSE_FILE=license.cloud.sdu.dk:27000/{}",
        secrets.license_key
    );

    let raw = raw.text();
    let redacted = redacted.text();
    if let Ok(path) = std::env::var("OPS_REDACTION_DUMP") {
        std::fs::write(format!("{path}.raw"), &raw).unwrap();
        std::fs::write(format!("{path}.redacted"), &redacted).unwrap();
    }
    assert!(
        raw.lines().count() > 1000,
        "TRACE logging of a whole session should be long: {} lines",
        raw.lines().count()
    );
    // Read after the raw text, so background tasks may have added a line or two since, never fewer.
    assert!(
        redacted.lines().count() >= raw.lines().count(),
        "redaction must not drop lines"
    );
    let session_raw: String = raw.lines().filter(|l| !l.contains("control: ")).collect();
    eprintln!(
        "secrets the session itself logged before redaction: {:?}",
        secrets.found_in(&session_raw)
    );
    let control_raw: String = raw.lines().filter(|l| l.contains("control: ")).collect();
    for what in [
        "AMQP password (URL form)",
        "license key",
        "VNC password (escaped twice)",
    ] {
        assert!(
            secrets.found_in(&control_raw).contains(&what),
            "the control lines do not carry the {what}"
        );
    }
    // With redaction: none of them, anywhere.
    let leaked = secrets.found_in(&redacted);
    if !leaked.is_empty() {
        let lines: Vec<&str> = redacted
            .lines()
            .filter(|l| secrets.forms().iter().any(|(_, f)| l.contains(f.as_str())))
            .take(5)
            .collect();
        panic!("secrets in the logs: {leaked:?}\n{}", lines.join("\n"));
    }
    // And the logs are still useful: job ids, trace ids, the masked URL.
    assert!(redacted.contains("redact-1"));
    assert!(redacted.contains("\"trace_id\""));
    assert!(
        redacted.contains(&format!("{}:***@", user_name_in(&url))),
        "the URL is logged, masked"
    );
    drop(user);
}

/// `amqp://USER:...` → `USER`.
fn user_name_in(url: &str) -> &str {
    let rest = &url["amqp://".len()..];
    &rest[..rest.find(':').unwrap()]
}
