//! Interactive sessions end to end: `OpenSession` requests answered by the runner's issuer over real
//! RabbitMQ (direct reply-to), decided from the jobs the simulator runs; and the `/authz` check of a
//! proxy-sync instance over HTTP, answering from its watch of the session records and its route table.
//! Hostile input: forged ids, oversize heads, another job's host, a flood; no session id in any log.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lapin::BasicProperties;
use lapin::options::{BasicConsumeOptions, BasicPublishOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use volcano_runner::broker::Broker;
use volcano_runner::messages::v1::{
    OpenSession, SessionKind, SessionReply, session_reply::Result as Outcome,
};
use volcano_runner::messages::{self, Format, MessageType};
use volcano_runner::ops::{Metrics, Readiness};
use volcano_runner::proxy::{HostNaming, ProxySyncConfig};
use volcano_runner::sessions::check::{CheckSettings, SessionCheck};
use volcano_runner::sessions::issuer::Issuer;
use volcano_runner::sessions::record::{LABEL_JOB, selector};
use volcano_runner::sessions::token;

use crate::monitor_support::{PATIENCE, TestRunner, World, job, web_job};
use crate::support::{self, Instance};

// ---------------------------------------------------------------------------------------------------
// The pieces.

/// A world with one runner's monitor holding every shard.
pub(crate) async fn world(label: &str) -> (World, TestRunner) {
    let w = World::start(label, |_| {}, |_| {}).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    (w, runner)
}

/// Submits web jobs and waits until each is routed (its CREATE published).
pub(crate) async fn running(w: &mut World, jobs: &[(&str, u32)]) {
    for (id, replicas) in jobs {
        w.submit(&web_job(id, *replicas, "sleep 100000")).await;
    }
    for _ in 0..4 {
        w.advance(2);
    }
    let want: Vec<String> = jobs.iter().map(|(id, _)| (*id).to_owned()).collect();
    w.until("a CREATE for every job", |s| {
        want.iter()
            .all(|id| s.proxy.iter().any(|p| &p.job_id == id))
    })
    .await;
}

pub(crate) fn sim_clock(w: &World) -> Arc<dyn Fn() -> jiff::Timestamp + Send + Sync> {
    let sim = w.sim.clone();
    Arc::new(move || sim.now())
}

/// A runner's session issuer, on a connection of its own (so it can be killed).
pub(crate) struct RunningIssuer {
    issuer: Issuer,
    broker: Broker,
    task: JoinHandle<()>,
}

pub(crate) async fn issuer(w: &World) -> RunningIssuer {
    let mut config = w.config.broker.clone();
    config.connection_name = "session-issuer".into();
    let broker = Broker::connect(config, CancellationToken::new())
        .await
        .expect("RabbitMQ is reachable");
    let issuer = Issuer::new(
        broker.clone(),
        w.client.clone(),
        w.config.clone(),
        sim_clock(w),
    );
    let running = issuer.clone();
    let task = tokio::spawn(async move {
        running
            .run(CancellationToken::new())
            .await
            .expect("the session queue is consumed");
    });
    RunningIssuer {
        issuer,
        broker,
        task,
    }
}

impl RunningIssuer {
    /// A crash: the task stops where it is and the connection goes.
    pub(crate) async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
        self.broker.close().await;
    }
}

/// A proxy-sync instance with its session check on a port of its own, ready.
async fn proxy(w: &World, name: &str) -> (Instance, SessionCheck, CancellationToken) {
    let instance = support::start(w, name).await;
    instance.until_ready().await;
    let readiness = Readiness::new(Metrics::new());
    let ready = readiness.condition("sessions", "not listed yet");
    let shutdown = CancellationToken::new();
    let check = SessionCheck::start(
        w.client.clone(),
        instance.routes.clone(),
        CheckSettings {
            namespace: w.config.cluster.namespace.clone(),
            naming: HostNaming {
                prefix: w.config.pipeline.proxy.prefix.clone(),
                domain: w.config.pipeline.proxy.domain.clone(),
            },
            secure: true,
            allowed_origins: Vec::new(),
            clock: sim_clock(w),
            metrics: None,
        },
        &ProxySyncConfig {
            authz_listen: "127.0.0.1:0".into(),
            ..ProxySyncConfig::default()
        },
        Some(ready.clone()),
        shutdown.clone(),
    )
    .await
    .expect("the check binds");
    let wait = async {
        while ready.get_err().is_some() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .expect("the session check becomes ready");
    (instance, check, shutdown)
}

/// The orchestrator's side: requests with direct reply-to.
pub(crate) struct Requester {
    connection: lapin::Connection,
    channel: lapin::Channel,
    replies: lapin::Consumer,
    /// The correlation ids answered so far.
    answered: std::collections::BTreeSet<String>,
}

pub(crate) async fn requester(w: &World) -> Requester {
    let (connection, channel) = w.vhost.raw().await;
    let replies = channel
        .basic_consume(
            "amq.rabbitmq.reply-to".into(),
            "orchestrator".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("direct reply-to");
    Requester {
        connection,
        channel,
        replies,
        answered: Default::default(),
    }
}

impl Requester {
    /// Publishes a request body with direct reply-to (or none) and returns the reply's body and
    /// correlation id, or `None` when nothing comes within a second.
    async fn send(
        &mut self,
        w: &World,
        body: &[u8],
        correlation_id: &str,
        reply: bool,
    ) -> Option<(SessionReply, Option<String>)> {
        let mut properties = BasicProperties::default()
            .with_content_type(ShortString::from("application/json"))
            .with_type(ShortString::from(MessageType::OpenSession.amqp_type()))
            .with_correlation_id(ShortString::from(correlation_id));
        if reply {
            properties = properties.with_reply_to(ShortString::from("amq.rabbitmq.reply-to"));
        }
        self.channel
            .basic_publish(
                w.config.broker.jobs_exchange.as_str().into(),
                w.config.broker.session_routing_key.as_str().into(),
                BasicPublishOptions::default(),
                body,
                properties,
            )
            .await
            .expect("publish");
        let wait = if reply {
            PATIENCE
        } else {
            Duration::from_secs(1)
        };
        self.receive(wait).await
    }

    /// The next reply within `wait`, with its correlation id.
    async fn receive(&mut self, wait: Duration) -> Option<(SessionReply, Option<String>)> {
        let delivery = tokio::time::timeout(wait, self.replies.next())
            .await
            .ok()??
            .expect("a reply delivery");
        assert_eq!(
            delivery.properties.kind().as_ref().map(|t| t.as_str()),
            Some(MessageType::SessionReply.amqp_type())
        );
        let reply: SessionReply =
            messages::decode(Format::Json, &delivery.data).expect("the reply decodes");
        volcano_runner::validate::session_reply(&reply).expect("the reply is valid");
        let correlation = delivery
            .properties
            .correlation_id()
            .as_ref()
            .map(|c| c.as_str().to_owned());
        Some((reply, correlation))
    }

    /// Asks for a session and returns the reply (checking the correlation id).
    pub(crate) async fn open(
        &mut self,
        w: &World,
        job_id: &str,
        rank: u32,
        kind: SessionKind,
        lifetime_s: Option<i64>,
    ) -> SessionReply {
        let request = OpenSession {
            job_id: job_id.into(),
            rank,
            kind: kind as i32,
            lifetime: lifetime_s.map(|seconds| pbjson_types::Duration { seconds, nanos: 0 }),
        };
        let body = messages::encode(Format::Json, &request).unwrap();
        let correlation = format!("{job_id}/{rank}/{}", kind as i32);
        let (mut reply, mut got) = self
            .send(w, &body, &correlation, true)
            .await
            .expect("a reply");
        // Replies are at least once: a request whose issuer died before its ack is answered again by
        // the next issuer. As RabbitMQ's request/reply convention says, a reply to an earlier request
        // (a correlation id already answered) is dropped.
        while got.as_deref() != Some(correlation.as_str()) {
            let earlier = got.clone().unwrap_or_default();
            assert!(
                self.answered.contains(&earlier),
                "a reply to a request never made: {earlier:?}"
            );
            (reply, got) = self.receive(PATIENCE).await.expect("a reply");
        }
        self.answered.insert(correlation.clone());
        assert_eq!(
            (reply.job_id.as_str(), reply.rank, reply.kind),
            (job_id, rank, kind as i32)
        );
        reply
    }

    pub(crate) async fn close(self) {
        let _ = self.connection.close(200, "done".into()).await;
    }
}

/// The session id of an opened reply, after checking its URL.
pub(crate) fn token_of(reply: &SessionReply, host: &str) -> String {
    let Some(Outcome::Opened(opened)) = &reply.result else {
        panic!("no session: {reply:?}");
    };
    // `https` unless the test configured plain http ([sessions] scheme).
    let scheme = if opened.url.starts_with("http://") {
        "http"
    } else {
        "https"
    };
    let prefix = format!("{scheme}://{host}/.volcano-runner/session?token=");
    let id = opened
        .url
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{} does not start with {prefix}", opened.url));
    assert!(token::well_formed(id), "{id}");
    id.to_owned()
}

fn refusal(reply: &SessionReply) -> &str {
    match &reply.result {
        Some(Outcome::Refused(r)) => &r.reason,
        other => panic!("not refused: {other:?}"),
    }
}

/// One HTTP/1.1 request to the check, raw: the status and the response headers (lower-case names).
async fn raw_request(addr: SocketAddr, head: &str) -> (u16, Vec<(String, String)>) {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("the check accepts");
    // A server that answers before reading all of an oversize head may close the socket under us.
    let _ = stream.write_all(head.as_bytes()).await;
    let mut text = Vec::new();
    let _ = stream.read_to_end(&mut text).await;
    let text = String::from_utf8_lossy(&text).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {text:?}"));
    let headers = text
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers)
}

/// A check as Caddy's forward_auth asks it: `X-Forwarded-Host` and `X-Forwarded-Uri`, and the cookie.
async fn ask(
    check: &SessionCheck,
    host: &str,
    path: &str,
    cookie: Option<&str>,
) -> (u16, Vec<(String, String)>) {
    let cookie = cookie
        .map(|c| format!("Cookie: theme=dark; ucloud-compute-session={c}\r\n"))
        .unwrap_or_default();
    raw_request(
        check.addr,
        &format!(
            "GET /authz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-Host: {host}\r\nX-Forwarded-Uri: {path}\r\n{cookie}Connection: close\r\n\r\n"
        ),
    )
    .await
}

/// Waits until the check knows a session just issued (its watch brings the record a moment after the
/// reply): until its session URL answers 302.
pub(crate) async fn until_known(check: &SessionCheck, host: &str, id: &str) {
    let path = format!("/.volcano-runner/session?token={id}");
    let wait = async {
        while ask(check, host, &path, None).await.0 != 302 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .expect("the check learns of the session");
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The session records of a job in the runner's namespace.
async fn records_of(w: &World, job_id: &str) -> usize {
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(w.client.clone(), &w.config.cluster.namespace);
    let params =
        kube::api::ListParams::default().labels(&format!("{},{LABEL_JOB}={job_id}", selector()));
    api.list(&params).await.expect("list").items.len()
}

// ---------------------------------------------------------------------------------------------------
// The tests.

/// A session opened over direct reply-to opens exactly its job's rank and kind through the check: the
/// session URL sets the cookie, the cookie lets the request through, and every other combination is
/// refused; an expired session is refused; after the job ends its session is dead, and the sweep
/// deletes its records.
#[tokio::test]
async fn a_session_opens_its_rank_and_kind_and_nothing_else_until_it_expires_or_its_job_ends() {
    let (mut w, runner) = world("sessions-open").await;
    running(&mut w, &[("sa", 2), ("sb", 1)]).await;
    let issuer = issuer(&w).await;
    let (instance, check, shutdown) = proxy(&w, "open").await;
    let mut orchestrator = requester(&w).await;

    let reply = orchestrator.open(&w, "sa", 0, SessionKind::Web, None).await;
    let id = token_of(&reply, "app-sa-0.cloud.sdu.dk");
    let Some(Outcome::Opened(opened)) = &reply.result else {
        unreachable!()
    };
    // The job has a one-hour allocation: the session (8 hours by default) ends with it.
    let expires = opened.expires_at.as_ref().unwrap().seconds;
    let now = w.sim.now().as_second();
    assert!(expires > now && expires <= now + 3600, "{expires} vs {now}");
    assert_eq!(records_of(&w, "sa").await, 1);

    let a0 = "app-sa-0.cloud.sdu.dk";
    let a1 = "app-sa-1.cloud.sdu.dk";
    let session_url = format!("/.volcano-runner/session?token={id}");
    until_known(&check, a0, &id).await;
    let (status, headers) = ask(&check, a0, &session_url, None).await;
    assert_eq!(status, 302);
    assert_eq!(
        header(&headers, "set-cookie"),
        Some(
            // Under https: the web kind's own cookie, bound to this host.
            format!(
                "__Host-ucloud-compute-session-web={id}; Path=/; HttpOnly; SameSite=Lax; Secure"
            )
            .as_str()
        )
    );
    assert_eq!(header(&headers, "location"), Some("/"));
    assert_eq!(
        ask(&check, a1, &session_url, None).await.0,
        403,
        "another rank's host"
    );
    let forged = format!(
        "/.volcano-runner/session?token={}",
        token::generate().unwrap()
    );
    assert_eq!(
        ask(&check, a0, &forged, None).await.0,
        403,
        "a forged session URL"
    );

    let (status, headers) = ask(&check, a0, "/lab/tree", Some(&id)).await;
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "x-volcano-runner-job"), Some("sa"));
    assert_eq!(header(&headers, "x-volcano-runner-rank"), Some("0"));
    assert_eq!(ask(&check, a0, "/lab/tree", None).await.0, 401, "no cookie");
    let wrong = token::generate().unwrap();
    assert_eq!(
        ask(&check, a0, "/", Some(&wrong)).await.0,
        403,
        "a wrong id"
    );
    assert_eq!(
        ask(&check, a0, "/", Some("short")).await.0,
        403,
        "a malformed id"
    );
    assert_eq!(ask(&check, a1, "/", Some(&id)).await.0, 403, "another rank");
    assert_eq!(
        ask(&check, "app-sb-0.cloud.sdu.dk", "/", Some(&id)).await.0,
        403,
        "job A's session on job B's host"
    );
    assert_eq!(
        ask(&check, a0, "/.volcano-runner/vnc", Some(&id)).await.0,
        403,
        "kind vnc"
    );
    assert_eq!(
        ask(&check, a0, "/.volcano-runner/terminal", Some(&id))
            .await
            .0,
        403,
        "kind terminal"
    );
    let (status, headers) = ask(&check, a1, "/.volcano-runner/logs", Some(&id)).await;
    assert_eq!(status, 200, "any session of the job follows its output");
    assert_eq!(header(&headers, "x-volcano-runner-rank"), Some("1"));
    // Without X-Forwarded-*: the Host header and the path after /authz.
    let plain = |host: &str, id: &str| {
        format!(
            "GET /authz/lab HTTP/1.1\r\nHost: {host}\r\nCookie: ucloud-compute-session={id}\r\nConnection: close\r\n\r\n"
        )
    };
    assert_eq!(raw_request(check.addr, &plain(a0, &id)).await.0, 200);
    assert_eq!(
        raw_request(check.addr, &plain("app-sb-0.cloud.sdu.dk", &id))
            .await
            .0,
        403,
        "a Host header for another job"
    );

    // A terminal on rank 1 for one minute.
    let reply = orchestrator
        .open(&w, "sa", 1, SessionKind::Terminal, Some(60))
        .await;
    let terminal = token_of(&reply, a1);
    until_known(&check, a1, &terminal).await;
    let (status, headers) = ask(
        &check,
        a1,
        &format!("/.volcano-runner/session?token={terminal}"),
        None,
    )
    .await;
    assert_eq!(
        (status, header(&headers, "location")),
        (302, Some("/.volcano-runner/terminal"))
    );
    assert_eq!(
        ask(&check, a1, "/.volcano-runner/terminal/ws", Some(&terminal))
            .await
            .0,
        200
    );
    assert_eq!(
        ask(&check, a1, "/", Some(&terminal)).await.0,
        403,
        "kind web"
    );
    w.advance(61);
    assert_eq!(
        ask(&check, a1, "/.volcano-runner/terminal/ws", Some(&terminal))
            .await
            .0,
        403,
        "expired"
    );
    assert_eq!(
        ask(&check, a0, "/", Some(&id)).await.0,
        200,
        "the other still lives"
    );

    // The job ends: its routes go, and with them every session of it.
    let ns = w.namespace_of(&web_job("sa", 2, ""));
    support::cancel(&w, &ns, "sa").await;
    for _ in 0..4 {
        w.advance(5);
    }
    instance.until("sa gone", |t| t.job("sa").is_none()).await;
    assert_eq!(
        ask(&check, a0, "/", Some(&id)).await.0,
        404,
        "after the job ended: its host is routed nowhere"
    );
    let (report, _) = issuer.issuer.sweep(None).await.expect("the sweep runs");
    assert!(report.deleted >= 2, "{report:?}");
    assert_eq!(
        records_of(&w, "sa").await,
        0,
        "the ended job's records are gone"
    );

    orchestrator.close().await;
    shutdown.cancel();
    check.join().await;
    instance.stop().await;
    issuer.kill().await;
    runner.stop().await;
    w.close().await;
}

/// Each refusal carries its reason: unknown job, ended job, not interactive, rank out of range, kind not
/// offered. A refusal is an answer, not a poison message: nothing is dead-lettered.
#[tokio::test]
async fn each_refusal_has_its_reason_and_is_not_dead_lettered() {
    let (mut w, runner) = world("sessions-refuse").await;
    running(&mut w, &[("ra", 2), ("rc", 1)]).await;
    w.submit(&job("rb", "sleep 100000")).await;
    w.advance(2);
    // rc's cancel has begun: its record says it ended.
    let ns = w.namespace_of(&web_job("rc", 1, ""));
    let api: kube::Api<volcano_runner::volcano::VolcanoJob> =
        kube::Api::namespaced(w.client.clone(), &ns);
    api.patch(
        "j-rc",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {
            w.keys.termination_cause.as_str(): "cancelled",
        }}})),
    )
    .await
    .unwrap();
    let issuer = issuer(&w).await;
    let mut orchestrator = requester(&w).await;
    let cases = [
        ("nope", 0, SessionKind::Web, "unknown_job"),
        ("rc", 0, SessionKind::Web, "job_ended"),
        ("rb", 0, SessionKind::Web, "not_interactive"),
        ("ra", 2, SessionKind::Web, "rank_out_of_range"),
        ("ra", 0, SessionKind::Vnc, "kind_not_offered"),
    ];
    for (job_id, rank, kind, reason) in cases {
        let reply = orchestrator.open(&w, job_id, rank, kind, None).await;
        assert_eq!(refusal(&reply), reason, "{job_id} rank {rank} {kind:?}");
    }
    // The same job, rank and a kind it offers: opened.
    let reply = orchestrator
        .open(&w, "ra", 1, SessionKind::Terminal, None)
        .await;
    token_of(&reply, "app-ra-1.cloud.sdu.dk");
    assert_eq!(w.vhost.ready(&w.config.broker.dead_letter_queue).await, 0);
    assert_eq!(records_of(&w, "ra").await, 1);
    assert_eq!(records_of(&w, "rc").await, 0);
    orchestrator.close().await;
    issuer.kill().await;
    runner.stop().await;
    w.close().await;
}

/// A request that does not decode is answered with the refusal (the reason of the decoder) and
/// dead-lettered with that reason; one without a reply_to is dead-lettered `missing_reply_to`.
#[tokio::test]
async fn an_invalid_request_is_refused_and_dead_lettered() {
    let (w, runner) = world("sessions-invalid").await;
    let issuer = issuer(&w).await;
    let mut orchestrator = requester(&w).await;
    let (reply, correlation) = orchestrator
        .send(
            &w,
            br#"{"jobId": 5, "kind": "SESSION_KIND_WEB"}"#,
            "bad-1",
            true,
        )
        .await
        .expect("a refusal");
    assert_eq!(correlation.as_deref(), Some("bad-1"));
    assert_eq!(refusal(&reply), "invalid_json");
    let (reply, _) = orchestrator
        .send(
            &w,
            br#"{"jobId": "x1", "kind": "SESSION_KIND_UNSPECIFIED"}"#,
            "bad-2",
            true,
        )
        .await
        .expect("a refusal");
    assert_eq!(refusal(&reply), "missing_field");
    assert_eq!(reply.job_id, "x1");
    let valid = br#"{"jobId": "x2", "kind": "SESSION_KIND_WEB"}"#;
    assert!(
        orchestrator.send(&w, valid, "none", false).await.is_none(),
        "no reply_to, no reply"
    );
    let dead = &w.config.broker.dead_letter_queue;
    w.vhost.wait_ready(dead, 3).await;
    let reasons: Vec<String> = w
        .vhost
        .drain(dead)
        .await
        .iter()
        .map(|m| {
            let headers = m.properties.headers().clone().unwrap_or_default();
            match headers.inner().get("x-volcano-runner-reason") {
                Some(AMQPValue::LongString(s)) => s.to_string(),
                other => panic!("no reason header: {other:?}"),
            }
        })
        .collect();
    assert_eq!(
        reasons,
        ["invalid_json", "missing_field", "missing_reply_to"]
    );
    orchestrator.close().await;
    issuer.kill().await;
    runner.stop().await;
    w.close().await;
}

/// The runner that issued a session dies, and a proxy-sync instance starts afterwards: the session
/// still opens, from the instance's first answer (it is ready only once it has listed the records).
#[tokio::test]
async fn a_session_survives_its_issuer_and_a_later_proxy_sync_accepts_it() {
    let (mut w, runner) = world("sessions-later").await;
    running(&mut w, &[("la", 1)]).await;
    let first = issuer(&w).await;
    let mut orchestrator = requester(&w).await;
    let reply = orchestrator.open(&w, "la", 0, SessionKind::Web, None).await;
    let id = token_of(&reply, "app-la-0.cloud.sdu.dk");
    first.kill().await;

    let (instance, check, shutdown) = proxy(&w, "later").await;
    assert_eq!(
        ask(&check, "app-la-0.cloud.sdu.dk", "/", Some(&id)).await.0,
        200,
        "known at ready"
    );
    // Another issuer answers the next request.
    let second = issuer(&w).await;
    let reply = orchestrator
        .open(&w, "la", 0, SessionKind::Terminal, None)
        .await;
    token_of(&reply, "app-la-0.cloud.sdu.dk");
    orchestrator.close().await;
    shutdown.cancel();
    check.join().await;
    instance.stop().await;
    second.kill().await;
    runner.stop().await;
    w.close().await;
}

/// Everything written by the tracing of this test's tasks.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Hostile input is answered, bounded, and leaks nothing: oversize heads get 431 and the check goes on;
/// a flood of forged and malformed ids is refused one by one; and the log output of the issuer and the
/// check, at the most verbose level, holds no session id.
#[tokio::test]
async fn hostile_input_is_bounded_and_no_session_id_reaches_the_logs() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("trace")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // The test runs on one thread (tokio's test runtime), so every task of it logs here.
    let _logs = tracing::subscriber::set_default(subscriber);

    let (mut w, runner) = world("sessions-hostile").await;
    running(&mut w, &[("ha", 1), ("hb", 1)]).await;
    let issuer = issuer(&w).await;
    let (instance, check, shutdown) = proxy(&w, "hostile").await;
    let mut orchestrator = requester(&w).await;
    let reply = orchestrator.open(&w, "ha", 0, SessionKind::Web, None).await;
    let id = token_of(&reply, "app-ha-0.cloud.sdu.dk");
    let host = "app-ha-0.cloud.sdu.dk";
    until_known(&check, host, &id).await;

    // Oversize: one huge cookie, and very many headers.
    let huge = format!(
        "GET /authz HTTP/1.1\r\nHost: {host}\r\nCookie: ucloud-compute-session={}\r\nConnection: close\r\n\r\n",
        "A".repeat(64 * 1024)
    );
    assert_eq!(raw_request(check.addr, &huge).await.0, 431);
    let many: String = (0..400)
        .map(|i| format!("X-Pad-{i}: {}\r\n", "b".repeat(30)))
        .collect();
    let many = format!("GET /authz HTTP/1.1\r\nHost: {host}\r\n{many}Connection: close\r\n\r\n");
    assert_eq!(raw_request(check.addr, &many).await.0, 431);
    // Another job's host, by either header.
    assert_eq!(
        ask(&check, "app-hb-0.cloud.sdu.dk", "/", Some(&id)).await.0,
        403
    );
    // A flood of forged ids (well-formed and not), then the real one still opens.
    let started = std::time::Instant::now();
    let mut refused = 0;
    for i in 0..1000 {
        let forged = if i % 2 == 0 {
            token::generate().unwrap()
        } else {
            format!("{}{i}", &id[..20])
        };
        let (status, _) = ask(&check, host, "/", Some(&forged)).await;
        assert_eq!(status, 403, "{forged}");
        refused += 1;
    }
    println!(
        "{refused} forged sessions refused in {:?} (one connection each, debug build)",
        started.elapsed()
    );
    assert_eq!(
        ask(&check, host, "/", Some(&id)).await.0,
        200,
        "still serving"
    );

    orchestrator.close().await;
    shutdown.cancel();
    check.join().await;
    instance.stop().await;
    issuer.kill().await;
    runner.stop().await;
    w.close().await;

    let logs = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    assert!(logs.contains("Session opened."), "the capture works");
    assert!(
        logs.contains("Request refused by the session check."),
        "the check logged"
    );
    assert!(!logs.contains(&id), "the session id is in the logs");
    assert!(
        !logs.contains(&id[..16]),
        "part of the session id is in the logs"
    );
}

/// What the issue asks of a real browser: headless Chromium opens a 2-rank web job's session URLs
/// (answered by the runner over RabbitMQ) through a running Caddy, whose every request is checked by
/// proxy-sync's `/authz`, and sees the page the simulator serves for rank 0, then rank 1; without the
/// cookie, with a forged session and with job B's session it is refused and never sees the page; after
/// the job ends its host is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_opens_each_rank_through_caddy_with_its_session_and_nothing_without_one() {
    use crate::live::{Browser, Caddy};
    use crate::ports::free_port;
    // Plain http in the test (Chromium keeps no `Secure` cookie from http), like a dev installation.
    let w = World::start(
        "sessions-browser",
        |c| c.sessions.scheme = "http".into(),
        |_| {},
    )
    .await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let mut w = w;
    running(&mut w, &[("ba", 2), ("bb", 1)]).await;
    let issuer = issuer(&w).await;
    let caddy = Caddy::start().await;
    let authz_port = free_port();
    let instance = support::start_configured(&w, "browser", w.config.broker.clone(), |c| {
        c.caddy_admin = caddy.admin_url.clone();
        c.listen_port = caddy.http_port;
        c.authz_url = format!("http://127.0.0.1:{authz_port}/authz");
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
                prefix: w.config.pipeline.proxy.prefix.clone(),
                domain: w.config.pipeline.proxy.domain.clone(),
            },
            secure: false,
            allowed_origins: Vec::new(),
            clock: sim_clock(&w),
            metrics: None,
        },
        &ProxySyncConfig {
            authz_listen: format!("127.0.0.1:{authz_port}"),
            ..ProxySyncConfig::default()
        },
        None,
        shutdown.clone(),
    )
    .await
    .expect("the check binds");
    let host = |job: &str, rank: u32| {
        format!(
            "{}{job}-{rank}.{}",
            w.config.pipeline.proxy.prefix, w.config.pipeline.proxy.domain
        )
    };
    // Caddy routes by the check's answer: a job is routed behind it once the table has it.
    instance
        .until("both jobs routed", |t| {
            t.job("ba").is_some() && t.job("bb").is_some()
        })
        .await;
    let browser = Browser {
        domain: w.config.pipeline.proxy.domain.clone(),
        proxy_port: caddy.http_port,
    };
    let mut orchestrator = requester(&w).await;
    let session_path = |id: &str| format!("/.volcano-runner/session?token={id}");

    for rank in 0..2 {
        let reply = orchestrator
            .open(&w, "ba", rank, SessionKind::Web, None)
            .await;
        let Some(Outcome::Opened(opened)) = &reply.result else {
            panic!("refused: {reply:?}")
        };
        // The URL the orchestrator hands the user names the rank's host and the session.
        assert!(
            opened
                .url
                .starts_with(&format!("http://{}/", host("ba", rank))),
            "{}",
            opened.url
        );
        let id = token_of(&reply, &host("ba", rank));
        until_known(&check, &host("ba", rank), &id).await;
        let page = browser
            .open(&browser.url(&host("ba", rank), &session_path(&id)))
            .await;
        assert_eq!(page.statuses, [302, 200], "rank {rank}: {page:?}");
        assert!(
            page.dom.contains("ba") && page.dom.contains(&format!("rank {rank}")),
            "rank {rank}'s page: {page:?}"
        );
    }

    // No cookie: 401, and the page is never shown.
    let page = browser.open(&browser.url(&host("ba", 0), "/")).await;
    assert_eq!(page.statuses, [401], "{page:?}");
    assert!(!page.dom.contains("rank 0"), "{page:?}");
    // A forged session: 403.
    let forged = token::generate().unwrap();
    let page = browser
        .open(&browser.url(&host("ba", 0), &session_path(&forged)))
        .await;
    assert_eq!(page.statuses, [403], "{page:?}");
    assert!(!page.dom.contains("rank 0"), "{page:?}");
    // Job B's session on job A's host: 403; on its own host it opens job B.
    let reply = orchestrator.open(&w, "bb", 0, SessionKind::Web, None).await;
    let b = token_of(&reply, &host("bb", 0));
    until_known(&check, &host("bb", 0), &b).await;
    let page = browser
        .open(&browser.url(&host("ba", 0), &session_path(&b)))
        .await;
    assert_eq!(page.statuses, [403], "{page:?}");
    assert!(!page.dom.contains("rank 0"), "{page:?}");
    let page = browser
        .open(&browser.url(&host("bb", 0), &session_path(&b)))
        .await;
    assert_eq!(page.statuses, [302, 200], "{page:?}");
    assert!(page.dom.contains("bb"), "{page:?}");

    // Job A ends: its hosts are gone from Caddy, and a browser gets nothing of it.
    let ns = w.namespace_of(&web_job("ba", 2, ""));
    support::cancel(&w, &ns, "ba").await;
    for _ in 0..4 {
        w.advance(5);
    }
    instance.until("ba gone", |t| t.job("ba").is_none()).await;
    let page = browser.open(&browser.url(&host("ba", 0), "/")).await;
    assert_eq!(page.statuses, [404], "{page:?}");
    assert!(!page.dom.contains("rank 0"), "{page:?}");

    orchestrator.close().await;
    shutdown.cancel();
    check.join().await;
    instance.stop().await;
    issuer.kill().await;
    runner.stop().await;
    w.close().await;
}

/// The last gap of the issue, as a user meets it: a TERMINAL application without a web port. The
/// orchestrator's `OpenSession` for its terminal is answered with a URL (for its web interface or a
/// desktop: `kind_not_offered`); through a running Caddy, whose every request proxy-sync's `/authz`
/// checks and whose `/.volcano-runner/` paths go to proxy-sync's bridges, the URL sets the cookie and
/// with it a WebSocket terminal runs a command in the rank's container and reads its output. The host
/// leads nowhere else: the check names no pod for it, and `/` is refused. The terminal is closed when
/// the job is cancelled, and cannot be opened again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_application_gets_a_shell_through_caddy_behind_its_session_and_nothing_else() {
    use futures::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use volcano_runner::proxy::bridge::{BridgeContext, Bridges};

    use crate::interactive::terminal_job;
    use crate::live::{COOKIE, Caddy, get};
    use crate::ports::free_port;

    let (mut w, runner) = world("sessions-terminal").await;
    let caddy = Caddy::start().await;
    let (authz_port, bridge_port) = (free_port(), free_port());
    let metrics = Metrics::new();
    let instance = support::start_configured(&w, "terminal", w.config.broker.clone(), |c| {
        c.caddy_admin = caddy.admin_url.clone();
        c.listen_port = caddy.http_port;
        c.authz_url = format!("http://127.0.0.1:{authz_port}/authz");
        c.bridge_url = format!("http://127.0.0.1:{bridge_port}");
    })
    .await;
    instance.until_ready().await;
    // The check and the bridges, as `volcano-runner proxy-sync` serves them beside its table.
    let shutdown = CancellationToken::new();
    let naming = HostNaming {
        prefix: w.config.pipeline.proxy.prefix.clone(),
        domain: w.config.pipeline.proxy.domain.clone(),
    };
    let check = SessionCheck::start(
        w.client.clone(),
        instance.routes.clone(),
        CheckSettings {
            namespace: w.config.cluster.namespace.clone(),
            naming: naming.clone(),
            secure: false,
            allowed_origins: Vec::new(),
            clock: sim_clock(&w),
            metrics: Some(metrics.clone()),
        },
        &ProxySyncConfig {
            authz_listen: format!("127.0.0.1:{authz_port}"),
            ..ProxySyncConfig::default()
        },
        None,
        shutdown.clone(),
    )
    .await
    .expect("the check binds");
    let bridges = Bridges::bind(
        &format!("127.0.0.1:{bridge_port}"),
        BridgeContext {
            routes: instance.routes.clone(),
            naming: naming.clone(),
            client: w.client.clone(),
            connect_timeout: Duration::from_secs(5),
            lifecycle_key: w.keys.lifecycle_state.clone(),
            origins: volcano_runner::sessions::origin::OriginPolicy::new(false, &[]),
            // As proxy-sync runs them beside its check: each bridge follows its session.
            sessions: Some(check.authz.clone()),
        },
    )
    .await
    .expect("the bridges bind");
    let bridges = tokio::spawn(bridges.run(shutdown.clone()));

    let job = terminal_job("shell1", 1, "sleep 100000");
    let ns = w.namespace_of(&job);
    w.submit(&job).await;
    for _ in 0..4 {
        w.advance(2);
    }
    w.until("the terminal job's CREATE", |s| {
        s.proxy.iter().any(|p| p.job_id == "shell1")
    })
    .await;
    let host = naming.rank_host("shell1", 0);
    instance
        .until("the terminal job routed", |t| t.job("shell1").is_some())
        .await;

    let issuer = issuer(&w).await;
    let mut orchestrator = requester(&w).await;
    for kind in [SessionKind::Web, SessionKind::Vnc] {
        let reply = orchestrator.open(&w, "shell1", 0, kind, None).await;
        assert_eq!(refusal(&reply), "kind_not_offered", "{kind:?}");
    }
    let reply = orchestrator
        .open(&w, "shell1", 0, SessionKind::Terminal, None)
        .await;
    let id = token_of(&reply, &host);
    until_known(&check, &host, &id).await;

    // The session URL, through Caddy: to the terminal, with the cookie.
    let port = caddy.http_port;
    let session = get(
        port,
        &host,
        &format!("/.volcano-runner/session?token={id}"),
        &[],
    )
    .await;
    assert_eq!(session.status, 302, "{session:?}");
    assert_eq!(
        session.header("location"),
        Some("/.volcano-runner/terminal")
    );
    let cookie = session
        .header("set-cookie")
        .and_then(|c| c.split(';').next())
        .expect("the session cookie")
        .to_owned();
    assert_eq!(cookie, format!("{COOKIE}-terminal={id}"));

    // Nothing but the bridges: `/` is refused with the terminal's session and without one.
    let web = get(port, &host, "/", &[("Cookie", &cookie)]).await;
    assert_eq!(web.status, 403, "{web:?}");
    let web = get(port, &host, "/index.html", &[]).await;
    assert_eq!(web.status, 401, "{web:?}");

    // Every answer of the check is counted, by decision and reason (`/metrics` of proxy-sync).
    let exposition = metrics.encode();
    for sample in [
        r#"volcano_runner_authz_checks_total{decision="allowed",reason="session_url"} "#,
        r#"volcano_runner_authz_checks_total{decision="denied",reason="other_rank_or_kind"} "#,
        r#"volcano_runner_authz_checks_total{decision="denied",reason="no_session"} "#,
    ] {
        assert!(
            exposition.lines().any(|l| l.starts_with(sample)),
            "no {sample}in {exposition}"
        );
    }

    // The shell, over a WebSocket through Caddy.
    let open_terminal = || {
        let mut request = format!("ws://127.0.0.1:{port}/.volcano-runner/terminal")
            .into_client_request()
            .unwrap();
        let headers = request.headers_mut();
        headers.insert(http::header::HOST, host.parse().unwrap());
        headers.insert(http::header::COOKIE, cookie.parse().unwrap());
        // A browser names the page that opens the socket: the terminal's own.
        headers.insert(
            http::header::ORIGIN,
            format!("http://{host}").parse().unwrap(),
        );
        tokio_tungstenite::connect_async(request)
    };
    let (mut socket, answer) = tokio::time::timeout(PATIENCE, open_terminal())
        .await
        .expect("Caddy answers")
        .expect("the terminal opens through Caddy");
    assert_eq!(answer.status(), 101);
    socket
        .send(Message::binary(b"echo \"hello-$HOSTNAME\"\n".to_vec()))
        .await
        .unwrap();
    let mut out = Vec::new();
    while !String::from_utf8_lossy(&out).contains("hello-j-shell1-job-0") {
        let msg = tokio::time::timeout(PATIENCE, socket.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no output within patience: {:?}",
                    String::from_utf8_lossy(&out)
                )
            });
        match msg {
            Some(Ok(Message::Binary(b))) => out.extend_from_slice(&b),
            Some(Ok(Message::Close(c))) => panic!(
                "closed early: {c:?}; output {:?}",
                String::from_utf8_lossy(&out)
            ),
            Some(Ok(_)) => {}
            other => panic!(
                "ended early: {other:?}; output {:?}",
                String::from_utf8_lossy(&out)
            ),
        }
    }

    // The job is cancelled: the terminal is closed by the bridge (the job ended; Caddy's configuration
    // does not change with the jobs, so Caddy closes nothing), and it cannot be opened again.
    support::cancel(&w, &ns, "shell1").await;
    for _ in 0..4 {
        w.advance(5);
    }
    let close = loop {
        let msg = tokio::time::timeout(PATIENCE, socket.next())
            .await
            .expect("the terminal is closed within patience");
        match msg {
            Some(Ok(Message::Close(c))) => break c.expect("a close frame with a reason"),
            Some(Ok(_)) => {}
            other => panic!("the terminal ended without a close frame: {other:?}"),
        }
    };
    assert!(
        close.code == CloseCode::Normal && close.reason.as_str() == "job shell1 ended",
        "{close:?}"
    );
    instance
        .until("the terminal job gone", |t| t.job("shell1").is_none())
        .await;
    let again = open_terminal()
        .await
        .expect_err("no terminal of an ended job");
    assert!(again.to_string().contains("404"), "{again}");

    orchestrator.close().await;
    shutdown.cancel();
    check.join().await;
    let _ = bridges.await;
    instance.stop().await;
    issuer.kill().await;
    runner.stop().await;
    w.close().await;
}
