//! The proxy as users meet it once many jobs come and go: through a real Caddy (Debian's 2.6) with
//! proxy-sync's real session check in front of every request, the configuration does not change per
//! job, so a job starting or ending disconnects nobody; the Envoy files of the same instance change only
//! the routes and clusters, never the listener. The session cookie stays in the proxy: the pod gets the
//! application's own cookies and nothing of the session. And a session request cannot make the runner
//! publish its reply into the runners' own queues.

use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::Duration;

use lapin::BasicProperties;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, ShortString};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use volcano_runner::messages::v1::OpenSession;
use volcano_runner::messages::{self, Format, MessageType};
use volcano_runner::proxy::envoy;
use volcano_runner::proxy::{HostNaming, ProxySyncConfig};
use volcano_runner::sessions::Kind;
use volcano_runner::sessions::check::{CheckSettings, SessionCheck};
use volcano_runner::sessions::issuer::Issuer;
use volcano_runner::sessions::record::{SessionRecord, SessionStore};
use volcano_runner::sessions::token::{self, Hash};

use crate::caddy::{event, host, publish};
use crate::live::{COOKIE, Caddy, Role, Server, get, upgrade_head};
use crate::monitor_support::{PATIENCE, World};
use crate::ports::free_port;
use crate::support::{self, Instance};

fn sim_clock(w: &World) -> Arc<dyn Fn() -> jiff::Timestamp + Send + Sync> {
    let sim = w.sim.clone();
    Arc::new(move || sim.now())
}

/// A proxy-sync instance pushing to `caddy` with its session check (and, with `bridge`, the bridges'
/// URL), as `volcano-runner proxy-sync` runs them.
async fn checked(
    w: &World,
    caddy: &Caddy,
    name: &str,
    bridge: Option<SocketAddr>,
) -> (Instance, SessionCheck, CancellationToken) {
    let authz_port = free_port();
    let bridge_url = bridge.map(|b| format!("http://{b}")).unwrap_or_default();
    let instance = support::start_configured(w, name, w.config.broker.clone(), |c| {
        c.caddy_admin = caddy.admin_url.clone();
        c.listen_port = caddy.http_port;
        c.caddy_check = Duration::from_millis(100);
        c.authz_url = format!("http://127.0.0.1:{authz_port}/authz");
        c.bridge_url = bridge_url.clone();
    })
    .await;
    instance.until_ready().await;
    let shutdown = CancellationToken::new();
    let check = SessionCheck::start(
        w.client.clone(),
        instance.routes.clone(),
        CheckSettings {
            namespace: w.config.cluster.namespace.clone(),
            naming: HostNaming {
                prefix: "app-".into(),
                domain: crate::caddy::DOMAIN.into(),
            },
            secure: false,
            allowed_origins: Vec::new(),
            clock: sim_clock(w),
            metrics: None,
        },
        &ProxySyncConfig {
            authz_listen: format!("127.0.0.1:{authz_port}"),
            bridge_url,
            ..ProxySyncConfig::default()
        },
        None,
        shutdown.clone(),
    )
    .await
    .expect("the check binds");
    (instance, check, shutdown)
}

/// A live web session of `job`'s rank 0, stored as the issuer stores one; its id.
async fn session(w: &World, job: &str) -> String {
    let id = token::generate().unwrap();
    let now = w.sim.now();
    let record = SessionRecord {
        hash: Hash::of(&id),
        job_id: job.into(),
        rank: 0,
        kind: Kind::Web,
        issued_at: now,
        expires_at: now + jiff::SignedDuration::from_hours(1),
    };
    SessionStore::new(w.client.clone(), &w.config.cluster)
        .create(&record)
        .await
        .expect("the record is stored");
    id
}

/// Waits until the check, asked through Caddy, knows the session (its URL answers 302).
async fn until_known(caddy: &Caddy, host: &str, id: &str) {
    let path = format!("/.volcano-runner/session?token={id}");
    let wait = async {
        while get(caddy.http_port, host, &path, &[]).await.status != 302 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .expect("the check learns of the session");
}

/// `GET /` of `host` through Caddy until it answers `status` (within patience), the last answer.
async fn until_status(caddy: &Caddy, host: &str, status: u16) -> crate::live::Answer {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let answer = get(caddy.http_port, host, "/", &[]).await;
        if answer.status == status || tokio::time::Instant::now() > deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An upgraded connection through the proxy to a pod that echoes what it gets after the 101.
struct Upgraded {
    reader: BufReader<TcpStream>,
}

impl Upgraded {
    async fn open(port: u16, host: &str, path: &str, cookie: &str) -> (u16, Option<Self>) {
        let origin = format!("http://{host}");
        let (status, reader) =
            upgrade_head(port, host, path, &[("Origin", &origin), ("Cookie", cookie)]).await;
        (status, (status == 101).then_some(Self { reader }))
    }

    /// Sends `payload` and reads it back: an error when the connection was closed or answers otherwise.
    async fn echo(&mut self, payload: &[u8]) -> Result<(), String> {
        self.reader
            .get_mut()
            .write_all(payload)
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut back = vec![0; payload.len()];
        match tokio::time::timeout(PATIENCE, self.reader.read_exact(&mut back)).await {
            Err(_) => Err("no echo within patience".into()),
            Ok(Err(e)) => Err(format!("read: {e}")),
            Ok(Ok(_)) if back != payload => Err(format!(
                "{:?} came back, not the echo",
                String::from_utf8_lossy(&back)
            )),
            Ok(Ok(_)) => Ok(()),
        }
    }
}

/// The file's identity and content: a rewrite (which is what Envoy's watch reacts to) changes it.
fn file_state(path: &std::path::Path) -> (u64, i64, i64, String) {
    let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (
        meta.ino(),
        meta.mtime(),
        meta.mtime_nsec(),
        std::fs::read_to_string(path).unwrap(),
    )
}

/// The cluster of `name` as written in `cds.json`.
fn written_cluster(dir: &std::path::Path, name: &str) -> Option<Value> {
    let cds: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(envoy::CDS_FILE)).ok()?).ok()?;
    cds["resources"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
        .cloned()
}

/// An open connection of job A (an upgraded, echoing WebSocket through Caddy) stays open and keeps
/// echoing while 20 other jobs start and end behind the same Caddy, each of them routed (401 without a
/// session: the check knows it) while it runs and gone (404) after. Caddy's configuration is the same
/// all along: no reload. The same instance's Envoy files change only routes and clusters: the listener
/// file is never rewritten (a listener change is what drains connections) and job A's cluster stays as
/// it was (Envoy keeps the connections of a cluster whose definition is unchanged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_websocket_of_one_job_stays_open_while_twenty_others_start_and_end() {
    let w = World::start("proxy-no-reload", |_| {}, |_| {}).await;
    let caddy = Caddy::start().await;
    let pod_a = Server::pod("127.0.1.30", "wa", 0).await;
    let others = Server::pod("127.0.1.31", "other", 0).await;
    let (instance, check, shutdown) = checked(&w, &caddy, "no-reload", None).await;
    publish(&w, &event("wa", &[pod_a.addr], false)).await;
    instance.until("wa routed", |t| t.job("wa").is_some()).await;
    let id = session(&w, "wa").await;
    until_known(&caddy, &host("wa", 0), &id).await;

    let cookie = format!("{COOKIE}={id}");
    let (status, socket) = Upgraded::open(caddy.http_port, &host("wa", 0), "/ws", &cookie).await;
    assert_eq!(status, 101);
    let mut socket = socket.expect("upgraded");
    socket.echo(b"hello before").await.expect("the echo");

    let before = caddy.admin.config().await.expect("Caddy's configuration");
    instance
        .until_written("job A's Envoy route", |h| h.contains_key(&host("wa", 0)))
        .await;
    let lds = instance.envoy_dir.join(envoy::LDS_FILE);
    let listener = file_state(&lds);
    let cluster_a = written_cluster(&instance.envoy_dir, &envoy::cluster_name("wa", 0))
        .expect("job A's cluster is written");

    for i in 0..20 {
        let job = format!("wb{i}");
        publish(&w, &event(&job, &[others.addr], false)).await;
        instance
            .until("the job routed", |t| t.job(&job).is_some())
            .await;
        // Routed through Caddy as soon as the check has it (a proxy that reloads takes longer: waited
        // for, so that what is tested is the connection of job A, not the timing).
        let routed = until_status(&caddy, &host(&job, 0), 401).await;
        assert_eq!(
            routed.status, 401,
            "{job} is routed, asks for a session: {routed:?}"
        );
        instance
            .until_written("the job's Envoy route", |h| h.contains_key(&host(&job, 0)))
            .await;
        socket
            .echo(format!("while {job} starts").as_bytes())
            .await
            .unwrap_or_else(|e| panic!("job A's connection after {job} started: {e}"));

        publish(&w, &event(&job, &[others.addr], true)).await;
        instance
            .until("the job gone", |t| t.job(&job).is_none())
            .await;
        let gone = until_status(&caddy, &host(&job, 0), 404).await;
        assert_eq!(gone.status, 404, "{job} has ended: {gone:?}");
        assert!(gone.body.contains("No interactive job"), "{gone:?}");
        instance
            .until_written("the job's Envoy route gone", |h| {
                !h.contains_key(&host(&job, 0))
            })
            .await;
        socket
            .echo(format!("while {job} ends").as_bytes())
            .await
            .unwrap_or_else(|e| panic!("job A's connection after {job} ended: {e}"));
    }
    // A little longer than Caddy's check period: nothing pushes a new configuration late either.
    tokio::time::sleep(Duration::from_millis(300)).await;
    socket
        .echo(b"still here")
        .await
        .expect("job A's connection");
    assert_eq!(
        caddy.admin.config().await.expect("Caddy's configuration"),
        before,
        "Caddy was given no new configuration"
    );
    assert_eq!(
        file_state(&lds),
        listener,
        "the Envoy listener file was never rewritten"
    );
    assert_eq!(
        written_cluster(&instance.envoy_dir, &envoy::cluster_name("wa", 0)),
        Some(cluster_a),
        "job A's Envoy cluster is unchanged"
    );
    // And job A's pod saw only its own requests: one upgrade.
    assert_eq!(pod_a.requests(), 1);

    drop(socket);
    shutdown.cancel();
    check.join().await;
    instance.stop().await;
    w.close().await;
}

/// Through Caddy with proxy-sync's check: the pod gets the application's own cookies exactly as sent,
/// and no session cookie (whatever its form: the base name, a kind's, `__Host-` prefixed), on a page
/// request and on a WebSocket upgrade; with nothing but the session cookie it gets no `Cookie` at all. A
/// client's own copies of the check's headers choose nothing: a decoy upstream named in them is never
/// reached, and the pod never sees them. The check's answer says the same to Envoy: the `cookie` to put
/// in place, or `x-envoy-auth-headers-to-remove: cookie`; a bridge path keeps its cookies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_gets_the_applications_cookies_and_never_the_session() {
    let w = World::start("proxy-cookie", |_| {}, |_| {}).await;
    let caddy = Caddy::start().await;
    let pod = Server::pod("127.0.1.32", "ck", 0).await;
    let decoy = Server::pod("127.0.1.33", "decoy", 0).await;
    let bridge = Server::start("127.0.0.1", Role::Bridge).await;
    let (instance, check, shutdown) = checked(&w, &caddy, "cookie", Some(bridge.addr)).await;
    publish(&w, &event("ck", &[pod.addr], false)).await;
    instance.until("ck routed", |t| t.job("ck").is_some()).await;
    let id = session(&w, "ck").await;
    let h = host("ck", 0);
    until_known(&caddy, &h, &id).await;

    let sent = format!(
        "_xsrf=2|abc|def; {COOKIE}={id}; theme=dark; __Host-{COOKIE}-web=other; {COOKIE}-terminal=x; username-app=\"a=b\""
    );
    let kept = "_xsrf=2|abc|def; theme=dark; username-app=\"a=b\"";
    let spoofed = [
        ("Cookie", sent.as_str()),
        ("X-Volcano-Runner-Upstream", &decoy.addr.to_string()),
        ("X-Volcano-Runner-Cookie", "ucloud-compute-session=evil"),
        ("X-Volcano-Runner-Job", "someone-else"),
    ];
    let page = get(caddy.http_port, &h, "/lab?x=1", &spoofed).await;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(page.body.contains("job ck rank 0"), "{page:?}");
    let seen = pod.last();
    assert_eq!(seen.target, "/lab?x=1");
    assert_eq!(seen.header("cookie"), Some(kept), "{seen:?}");
    assert_eq!(seen.header("x-volcano-runner-job"), Some("ck"), "{seen:?}");
    for (name, value) in &seen.headers {
        assert!(
            !value.contains(&id),
            "the session id reached the pod in {name}"
        );
        assert!(
            !value.contains("evil"),
            "a client's header reached the pod: {name}"
        );
        assert!(
            !name.eq_ignore_ascii_case("x-volcano-runner-upstream")
                && !name.eq_ignore_ascii_case("x-volcano-runner-cookie"),
            "{name} reached the pod"
        );
    }
    assert_eq!(decoy.requests(), 0, "a client cannot choose the upstream");

    // Only the session cookie: no Cookie header at all.
    let only = format!("{COOKIE}={id}");
    let page = get(caddy.http_port, &h, "/", &[("Cookie", &only)]).await;
    assert_eq!(page.status, 200, "{page:?}");
    let seen = pod.last();
    assert_eq!(seen.header("cookie"), None, "{seen:?}");

    // A WebSocket upgrade: the same.
    let (status, socket) = Upgraded::open(caddy.http_port, &h, "/api/kernels/ws", &sent).await;
    assert_eq!(status, 101);
    let mut socket = socket.expect("upgraded");
    socket.echo(b"kernel").await.expect("the echo");
    let seen = pod.last();
    assert_eq!(seen.target, "/api/kernels/ws");
    assert_eq!(seen.header("cookie"), Some(kept), "{seen:?}");
    drop(socket);

    // A bridge path keeps its cookies (proxy-sync's own bridges, not the pod).
    let logs = get(
        caddy.http_port,
        &h,
        "/.volcano-runner/logs",
        &[("Cookie", &sent)],
    )
    .await;
    assert_eq!(logs.status, 200, "{logs:?}");
    assert_eq!(bridge.last().header("cookie"), Some(sent.as_str()));

    // What Envoy's ext_authz is told, asked as Envoy asks (the original path after the check's).
    let ask = |path: &str, cookie: &str| {
        let head = format!(
            "GET /authz{path} HTTP/1.1\r\nHost: {h}:8080\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n"
        );
        raw(check.addr, head)
    };
    let answer = ask("/lab", &sent).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(&format!("cookie: {kept}\r\n")), "{answer}");
    assert!(
        !answer.contains("x-envoy-auth-headers-to-remove"),
        "{answer}"
    );
    let answer = ask("/lab", &only).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains("x-envoy-auth-headers-to-remove: cookie\r\n"),
        "{answer}"
    );
    assert!(!answer.contains("\r\ncookie:"), "{answer}");
    let answer = ask("/.volcano-runner/logs", &sent).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        !answer.contains("\r\ncookie:") && !answer.contains("x-envoy-auth-headers-to-remove"),
        "a bridge request keeps its cookies: {answer}"
    );

    shutdown.cancel();
    check.join().await;
    instance.stop().await;
    w.close().await;
}

/// One HTTP/1.1 exchange, the whole answer as text.
async fn raw(addr: SocketAddr, head: String) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut out))
        .await
        .expect("an answer")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// A session request whose `reply_to` names one of the runners' own queues (submit, control, session,
/// dead-letter) or the dead-letter exchange is dead-lettered with `forbidden_reply_to` and the field,
/// and nothing is published to any of them: not the reply, not a refusal. A request with its own reply
/// queue is still answered.
#[tokio::test]
async fn a_reply_goes_only_where_replies_belong() {
    let w = World::start("sessions-reply-to", |_| {}, |_| {}).await;
    let mut broker_config = w.config.broker.clone();
    broker_config.connection_name = "session-issuer".into();
    let broker = volcano_runner::broker::Broker::connect(broker_config, CancellationToken::new())
        .await
        .expect("RabbitMQ");
    let issuer = Issuer::new(
        broker.clone(),
        w.client.clone(),
        w.config.clone(),
        sim_clock(&w),
    );
    let stop = CancellationToken::new();
    let running = tokio::spawn({
        let stop = stop.clone();
        async move { issuer.run(stop).await }
    });
    let (connection, channel) = w.vhost.raw().await;
    let c = &w.config.broker;
    let own = [
        c.submit_queue.clone(),
        c.control_queue.clone(),
        c.session_queue.clone(),
        c.dead_letter_queue.clone(),
        c.dead_letter_exchange.clone(),
    ];
    let body = messages::encode(
        Format::Json,
        &OpenSession {
            job_id: "nosuchjob".into(),
            rank: 0,
            kind: volcano_runner::messages::v1::SessionKind::Web as i32,
            lifetime: None,
        },
    )
    .unwrap();
    let mine = "orchestrator-replies-reply-to-test";
    channel
        .queue_declare(
            mine.into(),
            lapin::options::QueueDeclareOptions::default(),
            Default::default(),
        )
        .await
        .unwrap();
    for reply_to in own.iter().map(String::as_str).chain([mine]) {
        channel
            .basic_publish(
                c.jobs_exchange.as_str().into(),
                c.session_routing_key.as_str().into(),
                BasicPublishOptions::default(),
                &body,
                BasicProperties::default()
                    .with_content_type(ShortString::from("application/json"))
                    .with_type(ShortString::from(MessageType::OpenSession.amqp_type()))
                    .with_correlation_id(ShortString::from(reply_to))
                    .with_reply_to(ShortString::from(reply_to)),
            )
            .await
            .expect("publish")
            .await
            .expect("confirm");
    }
    // The last request, with a reply queue of the requester's own, is answered: so every one before it
    // has been handled (one at a time, in order).
    w.vhost.wait_ready(mine, 1).await;
    let answered = w.vhost.drain(mine).await;
    assert_eq!(answered.len(), 1);
    assert_eq!(
        answered[0].properties.kind().as_ref().map(|t| t.as_str()),
        Some(MessageType::SessionReply.amqp_type())
    );
    // Every other request is dead-lettered with the reason and the field.
    let dead = w.vhost.wait_ready(&c.dead_letter_queue, 5).await;
    assert_eq!(dead, 5);
    let dead_lettered = w.vhost.drain(&c.dead_letter_queue).await;
    let mut refused = Vec::new();
    for m in &dead_lettered {
        assert_eq!(
            m.properties.kind().as_ref().map(|t| t.as_str()),
            Some(MessageType::OpenSession.amqp_type()),
            "only the requests, never a reply, are in the dead-letter queue"
        );
        let headers = m.properties.headers().clone().unwrap_or_default();
        let text = |name: &str| match headers.inner().get(name) {
            Some(AMQPValue::LongString(s)) => s.to_string(),
            other => panic!("no {name} header: {other:?}"),
        };
        assert_eq!(text("x-volcano-runner-reason"), "forbidden_reply_to");
        assert_eq!(text("x-volcano-runner-field"), "reply_to");
        refused.push(
            m.properties
                .reply_to()
                .as_ref()
                .map(|r| r.as_str().to_owned())
                .unwrap_or_default(),
        );
    }
    refused.sort();
    let mut want = own.to_vec();
    want.sort();
    assert_eq!(refused, want);
    for queue in [&c.submit_queue, &c.control_queue] {
        assert_eq!(
            w.vhost.ready(queue).await,
            0,
            "nothing was published to {queue}"
        );
    }
    stop.cancel();
    let _ = running.await;
    let _ = connection.close(200, "done".into()).await;
    broker.close().await;
    w.close().await;
}
