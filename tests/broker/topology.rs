//! The topology against the real RabbitMQ: declared idempotently, equal to deploy/rabbitmq/definitions.json,
//! importable from that file, and checked passively with a clear error when missing or different.

use crate::rabbit;

use std::collections::BTreeSet;
use std::path::PathBuf;

use lapin::{options::QueueDeclareOptions, types::FieldTable};
use rabbit::{TestVhost, within};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use volcano_runner::broker::{Broker, BrokerConfig, BrokerError, Topology, TopologyError};
use volcano_runner::config::Secret;

fn definitions_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/rabbitmq/definitions.json")
}

fn shipped_definitions() -> Value {
    let text =
        std::fs::read_to_string(definitions_path()).expect("deploy/rabbitmq/definitions.json");
    serde_json::from_str(&text).expect("definitions.json is JSON")
}

/// The parts of definitions that say what the topology is, in a form that compares equal regardless of
/// order, vhost, and RabbitMQ's own additions (built-in `amq.*` exchanges, server-named queues).
fn essence(d: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for e in d["exchanges"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap_or("");
        if name.is_empty() || name.starts_with("amq.") {
            continue;
        }
        out.insert(format!(
            "exchange {name} type={} durable={} auto_delete={} internal={} args={}",
            e["type"], e["durable"], e["auto_delete"], e["internal"], e["arguments"]
        ));
    }
    for q in d["queues"].as_array().into_iter().flatten() {
        out.insert(format!(
            "queue {} durable={} auto_delete={} args={}",
            q["name"], q["durable"], q["auto_delete"], q["arguments"]
        ));
    }
    for b in d["bindings"].as_array().into_iter().flatten() {
        out.insert(format!(
            "binding {} -> {} ({}) key={} args={}",
            b["source"], b["destination"], b["destination_type"], b["routing_key"], b["arguments"]
        ));
    }
    out
}

#[test]
fn definitions_file_is_the_default_topology() {
    let generated = Topology::from_config(&BrokerConfig::default()).definitions("/");
    if std::env::var_os("VOLCANO_RUNNER_BLESS").is_some() {
        let text = serde_json::to_string_pretty(&generated).unwrap() + "\n";
        std::fs::create_dir_all(definitions_path().parent().unwrap()).unwrap();
        std::fs::write(definitions_path(), text).unwrap();
    }
    assert_eq!(
        shipped_definitions(),
        generated,
        "deploy/rabbitmq/definitions.json is stale; regenerate it with VOLCANO_RUNNER_BLESS=1 cargo test --test broker topology::"
    );
}

#[tokio::test]
async fn declaring_twice_is_fine_and_matches_the_definitions_file() {
    let vhost = TestVhost::new("declare-twice").await;
    let shutdown = CancellationToken::new();
    let first = within(
        "first connect",
        Broker::connect(vhost.config(), shutdown.clone()),
    )
    .await
    .expect("first declaration");
    let second = within(
        "second connect",
        Broker::connect(vhost.config(), shutdown.clone()),
    )
    .await
    .expect("declaring an existing, equal topology again");
    first.close().await;
    second.close().await;

    let exported = vhost.exported().await;
    assert_eq!(
        essence(&exported),
        essence(&shipped_definitions()),
        "what the runner declares differs from deploy/rabbitmq/definitions.json"
    );
}

#[tokio::test]
async fn the_definitions_file_imports_and_passes_the_passive_check() {
    let vhost = TestVhost::new("import").await;
    vhost.import_definitions(&shipped_definitions()).await;

    let passive = BrokerConfig {
        passive: true,
        ..vhost.config()
    };
    let broker = within(
        "passive connect",
        Broker::connect(passive, CancellationToken::new()),
    )
    .await
    .expect("the imported topology passes the passive check");
    broker.close().await;
    // Declaring over the imported topology is accepted too: same arguments, same types.
    let broker = within(
        "declare over import",
        Broker::connect(vhost.config(), CancellationToken::new()),
    )
    .await
    .expect("declaring over the imported topology");
    broker.close().await;
}

#[tokio::test]
async fn passive_mode_fails_clearly_when_the_topology_is_missing() {
    let vhost = TestVhost::new("passive-missing").await;
    let config = BrokerConfig {
        passive: true,
        ..vhost.config()
    };
    let started = std::time::Instant::now();
    let err = within(
        "passive connect",
        Broker::connect(config, CancellationToken::new()),
    )
    .await
    .expect_err("nothing is declared in a fresh vhost");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "a missing topology is permanent and must not be retried until the startup timeout"
    );
    assert!(!err.is_retryable());
    let BrokerError::Topology(TopologyError::Missing { missing }) = &err else {
        panic!("expected a missing-topology error, got {err:?}");
    };
    let names: Vec<&str> = missing.0.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "compute.jobs",
            "compute.jobs.dlx",
            "compute.events",
            "compute.proxy",
            "compute.jobs.submit",
            "compute.jobs.control",
            "compute.jobs.sessions",
            "compute.jobs.dead"
        ]
    );
    let text = err.to_string();
    assert!(text.contains("queue `compute.jobs.submit`"), "{text}");
    assert!(text.contains("definitions.json"), "{text}");
    // Passive mode declared nothing.
    let exported = vhost.exported().await;
    assert!(
        essence(&exported).is_empty(),
        "passive mode created {exported}"
    );
}

#[tokio::test]
async fn a_conflicting_queue_is_reported_with_its_name() {
    let vhost = TestVhost::new("mismatch").await;
    let (connection, channel) = vhost.raw().await;
    // A classic queue where the runner wants a quorum queue.
    channel
        .queue_declare(
            "compute.jobs.submit".into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    connection.close(200, "done".into()).await.unwrap();

    let err = within(
        "connect",
        Broker::connect(vhost.config(), CancellationToken::new()),
    )
    .await
    .expect_err("a classic queue of the same name cannot become a quorum queue");
    assert!(!err.is_retryable());
    let BrokerError::Topology(TopologyError::Mismatch { kind, name, .. }) = &err else {
        panic!("expected a mismatch, got {err:?}");
    };
    assert_eq!((*kind, name.as_str()), ("queue", "compute.jobs.submit"));
}

#[tokio::test]
async fn refused_credentials_fail_at_once_without_the_password_in_the_error() {
    let vhost = TestVhost::new("auth").await;
    let config = BrokerConfig {
        url: Secret::new(
            vhost
                .amqp_url()
                .replace("guest:guest", "guest:wrong-secret"),
        ),
        ..vhost.config()
    };
    let err = within("connect", Broker::connect(config, CancellationToken::new()))
        .await
        .expect_err("wrong password");
    assert!(
        !err.is_retryable(),
        "refused credentials are permanent: {err}"
    );
    assert!(!err.to_string().contains("wrong-secret"), "{err}");
}

#[tokio::test]
async fn an_unreachable_broker_fails_the_start_after_the_startup_timeout() {
    let config = BrokerConfig {
        // Nothing listens on port 1: every attempt is refused at once.
        url: Secret::new("amqp://guest:guest@127.0.0.1:1/%2f"),
        startup_timeout: std::time::Duration::from_secs(1),
        reconnect_min_delay: std::time::Duration::from_millis(50),
        reconnect_max_delay: std::time::Duration::from_millis(200),
        ..BrokerConfig::default()
    };
    let err = within("connect", Broker::connect(config, CancellationToken::new()))
        .await
        .expect_err("nothing listens there");
    assert!(matches!(err, BrokerError::StartupTimeout { .. }), "{err:?}");
    assert!(err.is_retryable(), "a broker that is down may come up");
    let text = err.to_string();
    assert!(
        text.contains("startup_timeout") && text.contains("refused"),
        "{text}"
    );
    // Where, and what to do; never the password.
    assert!(text.contains("at 127.0.0.1:1 (vhost \"/\")"), "{text}");
    assert!(text.contains("VOLCANO_RUNNER_BROKER__URL"), "{text}");
    assert!(!text.contains("guest:guest"), "{text}");
}

/// The runner offers frames of 32 KiB (below RabbitMQ's default of 128 KiB: lapin's buffers hold 32 frames
/// each way) unless the URL says otherwise; a message with larger headers is still read (the sanitizer
/// leaves its largest headers out, `tests/runner/hostile.rs`). `?frame_max=` still rules.
#[tokio::test]
async fn frames_are_32_kib_unless_the_url_says_otherwise() {
    let vhost = TestVhost::new("frame-max").await;
    let frame_max_of = |config: BrokerConfig| {
        let vhost = &vhost;
        async move {
            let broker = within(
                "connect",
                Broker::connect(config.clone(), CancellationToken::new()),
            )
            .await
            .expect("connects");
            let names = vhost.connections_named(&config.connection_name).await;
            let (status, body) = rabbit::management(
                "GET",
                &format!("/api/connections/{}", rabbit::segment(&names[0])),
                None,
            )
            .await;
            assert_eq!(status, 200, "{body}");
            broker.close().await;
            body["frame_max"].as_u64()
        }
    };
    assert_eq!(frame_max_of(vhost.config()).await, Some(32 * 1024));
    let mut config = vhost.config();
    config.url = Secret::new(format!("{}?frame_max=65536", vhost.amqp_url()));
    config.connection_name = format!("{}-url", config.connection_name);
    assert_eq!(frame_max_of(config).await, Some(65536));
}
