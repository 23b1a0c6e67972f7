//! The session bridges of proxy-sync, on `[proxy_sync] bridge_listen`: what the proxy sends paths under
//! `/.volcano-runner/` to, after the session check (docs/proxy.md):
//!
//! - `/.volcano-runner/vnc`: WebSocket (binary frames) ↔ TCP to the rank's pod IP and VNC port, as
//!   noVNC speaks RFB over a WebSocket;
//! - `/.volcano-runner/terminal`: WebSocket ↔ a shell through the Kubernetes exec API in the rank's
//!   container (`user-job`): every frame the client sends is stdin, stdout and stderr come back as
//!   binary frames;
//! - `/.volcano-runner/logs`: every rank's output in time order, live (the engine of
//!   `volcano-runner logs --follow`), one JSON text frame per line, closed when the job's programs end.
//!
//! The job and rank come from the `Host` header through the route table (a rank host
//! `<prefix><jobId>-<rank>.<domain>`, or a public domain of the job: rank 0). A host that is not routed
//! gets 404 and nothing is opened. A terminal-only job's ranks (port 0) have the terminal and the logs,
//! and no VNC server. Every bridge is closed (code 1000, reason `job <id> ended`) when the
//! job's routes go (its `REMOVE`) or its rank moves to another pod.
//!
//! The bridges listen where only the proxy reaches them (loopback in the pod, NetworkPolicy), after
//! the session check; they still judge where an upgrade comes from themselves
//! ([`crate::sessions::origin`]: `Origin` must be the rank's own or a listed one, so that another
//! job's page, same-site to this one, cannot open them with the user's cookie), and, with the check in
//! the same process, they follow the session that opened them: the check names it
//! (`X-Volcano-Runner-Session`, its record's name), a bridge without a live session of its job is
//! refused, and an open bridge is closed (code 1000, reason `the session expired` or `the session was
//! revoked`) when its session expires or its record is deleted.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, ListParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::table::{Backend, HostNaming};
use crate::cluster::logs::{Line, RankReader};
use crate::pipeline::names::USER_CONTAINER;
use crate::routes::Routes;
use crate::sessions::authz::Authz;
use crate::sessions::origin::{Fetch, OriginPolicy};
use crate::sessions::server::HEADER_SESSION;
use crate::sessions::token::Hash;
use crate::ws::{self, ServerSocket};

/// The paths served.
pub const VNC_PATH: &str = "/.volcano-runner/vnc";
pub const TERMINAL_PATH: &str = "/.volcano-runner/terminal";
pub const LOGS_PATH: &str = "/.volcano-runner/logs";

/// What a terminal runs in the rank's container: bash when it has one, else sh.
pub const SHELL: [&str; 3] = [
    "/bin/sh",
    "-c",
    "if command -v bash >/dev/null 2>&1; then exec bash; else exec sh; fi",
];

/// How long a terminal whose shell ended waits for its job's `REMOVE`, to say why it closes.
const SHELL_EXIT_GRACE: Duration = Duration::from_secs(2);

/// How often an open bridge looks at its session (its expiry is read on the check's clock, which tests
/// drive): a session's end closes its bridges within this.
const SESSION_POLL: Duration = Duration::from_millis(250);

/// How long a followed log line is held so that a line of another rank with an earlier time, read a
/// moment later, is sent before it.
const LOG_REORDER_WINDOW: Duration = Duration::from_millis(150);

/// Why the bridges could not start.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error(
        "proxy_sync.bridge_listen: cannot listen on {addr}: {source} (is another process on it? set another address, or empty for no bridges)"
    )]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

/// What every bridge needs.
pub struct BridgeContext {
    pub routes: Routes,
    pub naming: HostNaming,
    pub client: kube::Client,
    /// How long a VNC server may take to accept.
    pub connect_timeout: Duration,
    /// `<prefix>lifecycleState` under the configured prefix: the logs bridge ends when the monitor has
    /// recorded the job's end.
    pub lifecycle_key: String,
    /// The origins whose pages may open a bridge (each rank's own and `[sessions] allowed_origins`).
    pub origins: OriginPolicy,
    /// The session check of this process, when it runs one: each bridge then needs a live session of
    /// its job (named by the check) and ends with it. `None`: the bridges trust the proxy's check
    /// alone and end with the job.
    pub sessions: Option<Arc<Authz>>,
}

/// The bridges' listener; [`Bridges::run`] serves until shutdown.
pub struct Bridges {
    listener: tokio::net::TcpListener,
    context: Arc<BridgeContext>,
}

impl Bridges {
    /// Binds `addr` (`host:port`).
    pub async fn bind(addr: &str, context: BridgeContext) -> Result<Self, BridgeError> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| BridgeError::Bind {
                addr: addr.to_owned(),
                source,
            })?;
        Ok(Self {
            listener,
            context: Arc::new(context),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown`; open bridges are closed then too (each with its reason), and waited
    /// for.
    pub async fn run(self, shutdown: CancellationToken) {
        let context = self.context.clone();
        let stop = shutdown.clone();
        let sessions = Sessions::default();
        let owner = sessions.clone();
        let app = axum::Router::new()
            .fallback(move |request: Request| {
                let (context, stop, sessions) = (context.clone(), stop.clone(), owner.clone());
                async move { route(context, stop, sessions, request).await }
            })
            .with_state(());
        if let Err(e) = axum::serve(self.listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
        {
            warn!(error = %e, "the session bridges stopped serving");
        }
        let mut open = std::mem::take(&mut *sessions.lock());
        let drained = tokio::time::timeout(SHUTDOWN_DRAIN, async {
            while open.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!(
                left = open.len(),
                "session bridges still open at shutdown are cut"
            );
        }
    }
}

/// How long shutdown waits for the open bridges to send their close frames.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

/// The open bridges: each runs in this set, which [`Bridges::run`] owns and drains at shutdown.
#[derive(Clone, Default)]
struct Sessions(Arc<std::sync::Mutex<tokio::task::JoinSet<()>>>);

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, tokio::task::JoinSet<()>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `session` in the set, after letting go of the sessions that have ended.
    fn spawn(&self, session: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut set = self.lock();
        while set.try_join_next().is_some() {}
        set.spawn(session);
    }
}

/// The job and rank a host leads to, and that rank's backend: a rank host, else a public domain.
fn resolve(routes: &Routes, naming: &HostNaming, host: &str) -> Option<(String, u32, Backend)> {
    let host = host.rsplit_once(':').map_or(host, |(h, p)| {
        if p.chars().all(|c| c.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    routes.read(|t| {
        let middle = host
            .strip_prefix(&naming.prefix.to_ascii_lowercase())
            .and_then(|h| h.strip_suffix(&format!(".{}", naming.domain.to_ascii_lowercase())));
        if let Some((job_id, rank)) = middle.and_then(|m| m.rsplit_once('-'))
            && let Ok(rank) = rank.parse::<u32>()
            && let Some(job) = t.job(job_id)
            && let Some(&backend) = job.ranks.get(&rank)
            && naming.rank_host(job_id, rank) == host
        {
            return Some((job_id.to_owned(), rank, backend));
        }
        t.routes(naming)
            .into_iter()
            .find(|r| r.host == host)
            .map(|r| (r.job_id, r.rank, r.backend))
    })
}

/// A session that opened a bridge: the sessions' store it lives in, its hash and when it expires (the
/// bridge closes with it).
type SessionHold = (Arc<Authz>, Hash, jiff::Timestamp);

/// The live session that opens this bridge, when the proxy checks sessions: the one the request names
/// (`HEADER_SESSION`), not expired, of this job and, but for the logs, of this rank. `Ok(None)` when
/// sessions are not checked.
fn live_session(
    context: &BridgeContext,
    headers: &axum::http::HeaderMap,
    job_id: &str,
    rank: u32,
    kind: Kind,
) -> Result<Option<SessionHold>, NoLiveSession> {
    let Some(authz) = &context.sessions else {
        return Ok(None);
    };
    let named = headers
        .get(HEADER_SESSION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("session-"))
        .and_then(Hash::from_hex);
    let live = named.and_then(|hash| authz.record(&hash)).filter(|r| {
        !r.is_expired(authz.now())
            && r.job_id == job_id
            && (matches!(kind, Kind::Logs) || r.rank == rank)
    });
    live.map(|record| Some((authz.clone(), record.hash, record.expires_at)))
        .ok_or(NoLiveSession)
}

/// No live session of the job (and rank) opens the bridge: refused with 403.
#[derive(Debug)]
struct NoLiveSession;

async fn route(
    context: Arc<BridgeContext>,
    stop: CancellationToken,
    sessions: Sessions,
    mut request: Request,
) -> Response {
    let path = request.uri().path().to_owned();
    let kind = match path.as_str() {
        VNC_PATH => Kind::Vnc,
        TERMINAL_PATH => Kind::Terminal,
        LOGS_PATH => Kind::Logs,
        _ => {
            return (
                StatusCode::NOT_FOUND,
                format!("no bridge at {path}: the bridges are {VNC_PATH}, {TERMINAL_PATH} and {LOGS_PATH}\n"),
            )
                .into_response();
        }
    };
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let Some((job_id, rank, backend)) = resolve(&context.routes, &context.naming, &host) else {
        return (
            StatusCode::NOT_FOUND,
            format!("no running interactive job is routed at host {host:?}\n"),
        )
            .into_response();
    };
    let method = request.method().as_str().to_owned();
    let judged = context
        .origins
        .judge(&host, &Fetch::from_headers(&method, request.headers()));
    if let Err(reason) = judged {
        let origin = request
            .headers()
            .get(header::ORIGIN)
            .and_then(|o| o.to_str().ok())
            .unwrap_or("none");
        warn!(
            job_id = %job_id,
            rank,
            bridge = kind.name(),
            origin = ?origin,
            reason,
            "Session bridge refused: the request comes from another origin."
        );
        return (
            StatusCode::FORBIDDEN,
            format!("refused ({reason}): a bridge opens only from its rank's own pages (Origin {origin:?})\n"),
        )
            .into_response();
    }
    let session = match live_session(&context, request.headers(), &job_id, rank, kind) {
        Ok(session) => session,
        Err(NoLiveSession) => {
            return (
                StatusCode::FORBIDDEN,
                "refused: no live session of this job opens this bridge\n",
            )
                .into_response();
        }
    };
    // noVNC asks for the `binary` subprotocol; others ask for none.
    let accepted = match ws::accept(&mut request, &[], &["binary"]) {
        Ok(a) => a,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    let response = accepted.response();
    info!(job_id = %job_id, rank, bridge = kind.name(), "Session bridge opened.");
    sessions.spawn(async move {
        let Some(socket) = accepted.socket().await else {
            return;
        };
        let ended = tokio::spawn(ended(context.routes.clone(), job_id.clone(), rank, backend, session, stop));
        let outcome = match kind {
            Kind::Vnc => vnc(socket, backend, context.connect_timeout, ended).await,
            Kind::Terminal => terminal(socket, &context.client, backend, ended).await,
            Kind::Logs => logs(socket, &context, &job_id, ended).await,
        };
        info!(job_id = %job_id, rank, bridge = kind.name(), outcome = %outcome, "Session bridge closed.");
    });
    response
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Vnc,
    Terminal,
    Logs,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Vnc => "vnc",
            Kind::Terminal => "terminal",
            Kind::Logs => "logs",
        }
    }
}

/// Resolves when the job's rank is no longer routed to `backend` (its job ended, or the rank moved),
/// when the session that opened the bridge expires or is deleted, or at shutdown, with the close
/// reason to send.
async fn ended(
    routes: Routes,
    job_id: String,
    rank: u32,
    backend: Backend,
    session: Option<SessionHold>,
    stop: CancellationToken,
) -> String {
    let mut changes = routes.subscribe();
    loop {
        let now = routes.read(|t| t.job(&job_id).and_then(|j| j.ranks.get(&rank).copied()));
        match now {
            None => return format!("job {job_id} ended"),
            Some(b) if b != backend => {
                return format!("job {job_id} rank {rank} moved to another pod");
            }
            Some(_) => {}
        }
        if let Some((authz, hash, expires_at_opened)) = &session {
            // A record swept after its expiry is an expired session, not a revoked one.
            let expires_at = authz.record(hash).map(|r| r.expires_at);
            if authz.now() >= expires_at.unwrap_or(*expires_at_opened) {
                return "the session expired".to_owned();
            }
            if expires_at.is_none() {
                return "the session was revoked".to_owned();
            }
        }
        tokio::select! {
            () = stop.cancelled() => return "the proxy instance is shutting down".to_owned(),
            changed = changes.changed() => if changed.is_err() {
                return "the proxy instance is shutting down".to_owned();
            },
            () = tokio::time::sleep(SESSION_POLL), if session.is_some() => {}
        }
    }
}

fn close_frame(code: CloseCode, reason: &str) -> Message {
    // A close reason is at most 123 bytes.
    let mut reason = reason.to_owned();
    while reason.len() > 123 {
        reason.pop();
    }
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

/// Sends the close frame and flushes.
async fn close(socket: &mut ServerSocket, code: CloseCode, reason: &str) {
    let _ = socket.send(close_frame(code, reason)).await;
    let _ = socket.flush().await;
}

async fn vnc(
    mut socket: ServerSocket,
    backend: Backend,
    timeout: Duration,
    mut ended: tokio::task::JoinHandle<String>,
) -> String {
    if backend.bridges_only() {
        // A terminal-only job: its sessions never grant VNC, but the bridge does not rely on that.
        let why = "this job has no VNC server: it offers a terminal only";
        close(&mut socket, CloseCode::Error, why).await;
        ended.abort();
        return why.to_owned();
    }
    let addr = SocketAddr::new(backend.ip, backend.port);
    let tcp = match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            let why = format!("cannot reach the VNC server at {addr}: {e}");
            close(&mut socket, CloseCode::Error, &why).await;
            ended.abort();
            return why;
        }
        Err(_) => {
            let why = format!("the VNC server at {addr} did not accept within {timeout:?}");
            close(&mut socket, CloseCode::Error, &why).await;
            ended.abort();
            return why;
        }
    };
    let (from_vnc, to_vnc) = tcp.into_split();
    let outcome = pump(
        &mut socket,
        from_vnc,
        to_vnc,
        &mut ended,
        "the VNC server closed the connection",
        Duration::ZERO,
    )
    .await;
    ended.abort();
    outcome
}

/// Carries bytes between the socket and the other end (`from`, `to`) until one side goes or `ended`
/// says the job did, closing the socket with the reason. When `from` ends, the job's end is waited for
/// up to `grace`, so that a peer that ended with its pod is reported as the job's end; otherwise the
/// reason is `peer_closed`. Every frame from the client, binary or text, is sent on as its bytes.
async fn pump<R, W>(
    socket: &mut ServerSocket,
    mut from: R,
    mut to: W,
    ended: &mut tokio::task::JoinHandle<String>,
    peer_closed: &str,
    grace: Duration,
) -> String
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            reason = &mut *ended => {
                let reason = reason.unwrap_or_else(|_| "the bridge stopped".to_owned());
                close(socket, CloseCode::Normal, &reason).await;
                return reason;
            }
            n = from.read(&mut buf) => match n {
                Ok(0) | Err(_) => {
                    let reason = tokio::select! {
                        reason = &mut *ended => reason.unwrap_or_else(|_| "the bridge stopped".to_owned()),
                        () = tokio::time::sleep(grace) => peer_closed.to_owned(),
                    };
                    close(socket, CloseCode::Normal, &reason).await;
                    return reason;
                }
                Ok(n) => if socket.send(Message::binary(buf[..n].to_vec())).await.is_err() {
                    return "the client went".to_owned();
                },
            },
            msg = socket.next() => {
                let bytes = match msg {
                    Some(Ok(Message::Binary(data))) => data.to_vec(),
                    Some(Ok(Message::Text(text))) => text.as_bytes().to_vec(),
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return "the client went".to_owned(),
                    Some(Ok(_)) => continue,
                };
                if to.write_all(&bytes).await.is_err() {
                    close(socket, CloseCode::Normal, peer_closed).await;
                    return peer_closed.to_owned();
                }
            }
        }
    }
}

/// The pod behind a backend: the one running pod with that IP.
async fn pod_at(client: &kube::Client, backend: Backend) -> Result<(String, String), String> {
    let pods: Api<Pod> = Api::all(client.clone());
    let found = pods
        .list(&ListParams::default().fields(&format!("status.podIP={}", backend.ip)))
        .await
        .map_err(|e| format!("cannot find the pod at {}: {e}", backend.ip))?;
    found
        .items
        .into_iter()
        .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .and_then(|p| Some((p.metadata.namespace?, p.metadata.name?)))
        .ok_or_else(|| format!("no running pod has the IP {}", backend.ip))
}

async fn terminal(
    mut socket: ServerSocket,
    client: &kube::Client,
    backend: Backend,
    mut ended: tokio::task::JoinHandle<String>,
) -> String {
    let (namespace, name) = match pod_at(client, backend).await {
        Ok(p) => p,
        Err(why) => {
            close(&mut socket, CloseCode::Error, &why).await;
            ended.abort();
            return why;
        }
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let params = AttachParams::interactive_tty().container(USER_CONTAINER);
    let mut process = match pods.exec(&name, SHELL, &params).await {
        Ok(p) => p,
        Err(e) => {
            let why = format!("cannot open a shell in pod {name}: {e}");
            close(&mut socket, CloseCode::Error, &why).await;
            ended.abort();
            return why;
        }
    };
    let (Some(stdin), Some(stdout)) = (process.stdin(), process.stdout()) else {
        ended.abort();
        return "the exec session has no stdin or stdout".to_owned();
    };
    // A shell ends with its pod when the job ends; the REMOVE follows closely, and then the reason
    // says so.
    let outcome = pump(
        &mut socket,
        stdout,
        stdin,
        &mut ended,
        "the shell exited",
        SHELL_EXIT_GRACE,
    )
    .await;
    process.abort();
    ended.abort();
    outcome
}

async fn logs(
    mut socket: ServerSocket,
    context: &BridgeContext,
    job_id: &str,
    mut ended: tokio::task::JoinHandle<String>,
) -> String {
    let Some(ranks) = context
        .routes
        .read(|t| t.job(job_id).map(|j| j.ranks.clone()))
    else {
        close(
            &mut socket,
            CloseCode::Normal,
            &format!("job {job_id} ended"),
        )
        .await;
        ended.abort();
        return format!("job {job_id} ended");
    };
    let (namespace, _) = match pod_at(&context.client, ranks[&0]).await {
        Ok(p) => p,
        Err(why) => {
            close(&mut socket, CloseCode::Error, &why).await;
            ended.abort();
            return why;
        }
    };
    let reader = RankReader::new(
        context.client.clone(),
        &namespace,
        job_id,
        None,
        context.lifecycle_key.clone(),
    );
    let stop = CancellationToken::new();
    let _stop_followers = stop.clone().drop_guard();
    let (tx, mut rx) = mpsc::channel::<Line>(1024);
    let mut followers = tokio::task::JoinSet::new();
    for &rank in ranks.keys() {
        let (reader, tx, stop) = (reader.clone(), tx.clone(), stop.clone());
        followers.spawn(async move { reader.follow(rank, tx, stop).await });
    }
    drop(tx);
    // Held lines by (time, rank, arrival), each with when it arrived.
    let mut held: BTreeMap<(Option<jiff::Timestamp>, u32, u64), (tokio::time::Instant, Line)> =
        BTreeMap::new();
    let mut arrivals = 0u64;
    let mut tick = tokio::time::interval(LOG_REORDER_WINDOW / 3);
    let mut open = true;
    let reason = loop {
        tokio::select! {
            reason = &mut ended => {
                break reason.unwrap_or_else(|_| "the bridge stopped".to_owned());
            }
            line = rx.recv(), if open => match line {
                Some(line) => {
                    arrivals += 1;
                    held.insert((line.at, line.rank, arrivals), (tokio::time::Instant::now(), line));
                }
                None => open = false,
            },
            _ = tick.tick() => {}
            msg = socket.next() => match msg {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
                    ended.abort();
                    return "the client went".to_owned();
                }
                Some(Ok(_)) => {}
            },
        }
        let now = tokio::time::Instant::now();
        while let Some(entry) = held.first_entry() {
            if open && now.duration_since(entry.get().0) < LOG_REORDER_WINDOW {
                break;
            }
            let (_, line) = entry.remove();
            if socket.send(Message::text(line_json(&line))).await.is_err() {
                ended.abort();
                return "the client went".to_owned();
            }
        }
        if !open && held.is_empty() {
            break format!("job {job_id} ended: every rank's program has ended");
        }
    };
    close(&mut socket, CloseCode::Normal, &reason).await;
    ended.abort();
    reason
}

/// A line as sent: `{"rank": 0, "at": "<RFC 3339>", "text": "..."}` (`at` null when the kubelet gave
/// none).
fn line_json(line: &Line) -> String {
    serde_json::json!({
        "rank": line.rank,
        "at": line.at.map(|t| t.to_string()),
        "text": line.text,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::table::{JobRoutes, JobUpdate, Stamp};

    #[test]
    fn a_host_leads_to_its_job_and_rank_or_nowhere() {
        let routes = Routes::default();
        let backend = |last: u8| Backend {
            ip: std::net::IpAddr::from([127, 1, 2, last]),
            port: 8080,
        };
        routes.apply(JobUpdate {
            stamp: Stamp {
                sequence: 1,
                removed: false,
                at_ms: 1,
            },
            routes: Some(JobRoutes {
                ranks: BTreeMap::from([(0, backend(1)), (1, backend(2))]),
                domains: vec!["my-notebook.cloud.sdu.dk".into()],
            }),
            job_id: "4817-a".into(),
        });
        let naming = HostNaming {
            prefix: "app-".into(),
            domain: "cloud.sdu.dk".into(),
        };
        assert_eq!(
            resolve(&routes, &naming, "app-4817-a-1.cloud.sdu.dk:443"),
            Some(("4817-a".into(), 1, backend(2)))
        );
        assert_eq!(
            resolve(&routes, &naming, "APP-4817-a-0.cloud.sdu.dk"),
            Some(("4817-a".into(), 0, backend(1)))
        );
        assert_eq!(
            resolve(&routes, &naming, "my-notebook.cloud.sdu.dk"),
            Some(("4817-a".into(), 0, backend(1)))
        );
        assert_eq!(resolve(&routes, &naming, "app-4817-a-2.cloud.sdu.dk"), None);
        assert_eq!(resolve(&routes, &naming, "app-4818-0.cloud.sdu.dk"), None);
        assert_eq!(resolve(&routes, &naming, ""), None);
    }
}
