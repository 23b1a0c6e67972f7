//! The real RabbitMQ for tests: a fresh vhost per test through the management API (deleted afterwards),
//! raw AMQP access for what the code under test must not do for itself, and a few management calls (force a
//! connection closed, import definitions, read the declared topology).
//!
//! RabbitMQ must be running on 127.0.0.1:5672 with the management plugin on :15672 (guest/guest);
//! `scripts/test` starts it. A test fails, never skips, when it is not there.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use lapin::{
    BasicProperties, Channel, Connection, ConnectionProperties,
    options::{BasicGetOptions, BasicPublishOptions, QueueDeclareOptions},
    types::FieldTable,
};
use serde_json::Value;
use volcano_runner::broker::BrokerConfig;
use volcano_runner::config::Secret;

pub const AMQP_ADDR: &str = "127.0.0.1:5672";
pub const MANAGEMENT: &str = "http://127.0.0.1:15672";
/// `guest:guest` in base64.
const AUTHORIZATION: &str = "Basic Z3Vlc3Q6Z3Vlc3Q=";

/// Bounds every wait in a test, so a broken behaviour fails instead of hanging.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Calls the management API; the body is JSON (or empty).
pub async fn management(method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    management_text(
        method,
        path,
        body.map(|b| b.to_string()).unwrap_or_default(),
    )
    .await
}

/// Calls the management API with a JSON body given as text (for a document too deep to build as a
/// `Value` on a test thread's stack).
pub async fn management_text(method: &str, path: &str, payload: String) -> (u16, Value) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = hyper::Request::builder()
        .method(method)
        .uri(format!("{MANAGEMENT}{path}"))
        .header("authorization", AUTHORIZATION)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(payload)))
        .expect("request");
    let response = client.request(request).await.unwrap_or_else(|e| {
        panic!("RabbitMQ's management API is not reachable on {MANAGEMENT} ({e}); run scripts/test")
    });
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("management body")
        .to_bytes();
    let value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
    };
    (status, value)
}

/// Percent-encodes one path segment of the management API.
pub fn segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A vhost of its own for one test, with full permissions for guest. Deleted on drop (which also closes
/// every connection to it).
pub struct TestVhost {
    pub name: String,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

impl TestVhost {
    pub async fn new(label: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!(
            "vr-{label}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let (status, body) =
            management("PUT", &format!("/api/vhosts/{}", segment(&name)), None).await;
        assert!(
            matches!(status, 201 | 204),
            "creating vhost {name}: {status} {body}"
        );
        let permissions = serde_json::json!({"configure": ".*", "write": ".*", "read": ".*"});
        let (status, body) = management(
            "PUT",
            &format!("/api/permissions/{}/guest", segment(&name)),
            Some(&permissions),
        )
        .await;
        assert!(
            matches!(status, 201 | 204),
            "permissions on {name}: {status} {body}"
        );
        Self { name }
    }

    pub fn amqp_url(&self) -> String {
        format!("amqp://guest:guest@{AMQP_ADDR}/{}", segment(&self.name))
    }

    /// The runner's defaults on this vhost, with reconnect delays short enough for tests.
    pub fn config(&self) -> BrokerConfig {
        BrokerConfig {
            url: Secret::new(self.amqp_url()),
            connection_name: format!("test-{}", self.name),
            reconnect_min_delay: Duration::from_millis(50),
            reconnect_max_delay: Duration::from_millis(500),
            startup_timeout: Duration::from_secs(10),
            confirm_timeout: Duration::from_secs(5),
            publish_timeout: Duration::from_secs(20),
            health_check_interval: Duration::from_millis(200),
            ..BrokerConfig::default()
        }
    }

    /// A plain lapin connection and channel, for doing what the code under test must not do itself.
    pub async fn raw(&self) -> (Connection, Channel) {
        let connection = Connection::connect(&self.amqp_url(), ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| {
                panic!("RabbitMQ is not reachable on {AMQP_ADDR} ({e}); run scripts/test")
            });
        let channel = connection.create_channel().await.expect("channel");
        (connection, channel)
    }

    /// Publishes without confirms or checks, e.g. a malformed message.
    pub async fn publish_raw(
        &self,
        exchange: &str,
        key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) {
        let (connection, channel) = self.raw().await;
        channel
            .confirm_select(Default::default())
            .await
            .expect("confirm mode");
        channel
            .basic_publish(
                exchange.into(),
                key.into(),
                BasicPublishOptions::default(),
                body,
                properties,
            )
            .await
            .expect("publish")
            .await
            .expect("confirm");
        let _ = connection.close(200, "done".into()).await;
    }

    /// Ready messages in a queue, right now (AMQP passive declare; the management API lags by seconds).
    pub async fn ready(&self, queue: &str) -> u32 {
        let (connection, channel) = self.raw().await;
        let q = channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("queue {queue}: {e}"));
        let _ = connection.close(200, "done".into()).await;
        q.message_count()
    }

    /// Takes every message now in `queue` (acked), in order.
    pub async fn drain(&self, queue: &str) -> Vec<lapin::message::BasicGetMessage> {
        let (connection, channel) = self.raw().await;
        let mut out = Vec::new();
        while let Some(m) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            out.push(m);
        }
        let _ = connection.close(200, "done".into()).await;
        out
    }

    /// Waits until `queue` holds at least `n` ready messages.
    pub async fn wait_ready(&self, queue: &str, n: u32) -> u32 {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let ready = self.ready(queue).await;
            if ready >= n {
                return ready;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{queue} has {ready} ready messages, expected {n}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The names of the connections to this vhost whose client-given name is `connection_name`, as the
    /// management API lists them (it learns of a new connection within its stats interval, so this polls).
    pub async fn connections_named(&self, connection_name: &str) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let (status, body) = management(
                "GET",
                &format!("/api/vhosts/{}/connections", segment(&self.name)),
                None,
            )
            .await;
            assert_eq!(status, 200, "{body}");
            let names: Vec<String> = body
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| c["client_properties"]["connection_name"] == connection_name)
                .filter_map(|c| c["name"].as_str().map(str::to_owned))
                .collect();
            if !names.is_empty() {
                return names;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no connection named {connection_name} on {}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Closes a connection by force, as an operator (or a broker restart) would.
    pub async fn force_close(&self, connection: &str) {
        let (status, body) = management(
            "DELETE",
            &format!("/api/connections/{}", segment(connection)),
            None,
        )
        .await;
        assert!(
            matches!(status, 204 | 200),
            "closing {connection}: {status} {body}"
        );
    }

    /// Imports RabbitMQ definitions into this vhost.
    pub async fn import_definitions(&self, definitions: &Value) {
        let (status, body) = management(
            "POST",
            &format!("/api/definitions/{}", segment(&self.name)),
            Some(definitions),
        )
        .await;
        assert!(matches!(status, 200 | 201 | 204), "import: {status} {body}");
    }

    /// The vhost's exchanges, queues and bindings as the management API reports them.
    pub async fn exported(&self) -> Value {
        let (status, body) = management(
            "GET",
            &format!("/api/definitions/{}", segment(&self.name)),
            None,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        body
    }

    pub async fn delete_queue(&self, queue: &str) {
        let (status, body) = management(
            "DELETE",
            &format!("/api/queues/{}/{}", segment(&self.name), segment(queue)),
            None,
        )
        .await;
        assert!(
            matches!(status, 204 | 200),
            "deleting {queue}: {status} {body}"
        );
    }
}

impl Drop for TestVhost {
    fn drop(&mut self) {
        let path = format!("/api/vhosts/{}", segment(&self.name));
        // Drop cannot await, and may run inside the test's runtime: use a runtime of its own on a thread.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(management("DELETE", &path, None));
        })
        .join();
    }
}

/// Awaits `f`, failing the test after [`PATIENCE`].
pub async fn within<F: std::future::IntoFuture>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(PATIENCE, f.into_future())
        .await
        .unwrap_or_else(|_| panic!("timed out after {PATIENCE:?}: {what}"))
}
