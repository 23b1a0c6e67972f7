//! The HTTP endpoint of the check (`[proxy_sync] authz_listen`), for Caddy's `forward_auth` and Envoy's
//! `ext_authz` (HTTP service). Every request whose path starts with `/authz` is a check: the original host
//! is `X-Forwarded-Host`, else `Host`; the original path `X-Forwarded-Uri`, else the request's path
//! without `/authz`; the session the `Cookie` header's `ucloud-compute-session`. [`super::authz`] decides.
//!
//! Bounded: a request head larger than `[proxy_sync] authz_max_header_bytes` is answered 431 by the
//! HTTP parser before anything reads it, a head that takes longer than 10 s to arrive is dropped, and
//! the check itself is a few map lookups, so a flood of bad sessions is answered as fast as good ones.
//! Nothing of a session id is logged.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::COOKIE;
use super::authz::{Authz, Decision};
use crate::ops::Metrics;

/// The path prefix of checks.
pub const AUTHZ_PREFIX: &str = "/authz";
/// Response header: the job a request is allowed to.
pub const HEADER_JOB: &str = "x-volcano-runner-job";
/// Response header: the rank a request is allowed to.
pub const HEADER_RANK: &str = "x-volcano-runner-rank";

/// How long a client may take to send a request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The endpoint, bound and ready to serve.
pub struct AuthzServer {
    listener: TcpListener,
    authz: Arc<Authz>,
    secure: bool,
    max_header_bytes: usize,
    /// Where each answer is counted (`authz_checks_total`), if anywhere.
    metrics: Option<Metrics>,
}

impl AuthzServer {
    /// Binds `addr`. `secure`: session cookies get the `Secure` attribute (the session URLs are https).
    /// `max_header_bytes` is raised to 8 KiB if lower (the HTTP parser's least buffer).
    pub async fn bind(
        addr: &str,
        authz: Arc<Authz>,
        secure: bool,
        max_header_bytes: usize,
    ) -> std::io::Result<Self> {
        Ok(Self {
            listener: TcpListener::bind(addr).await?,
            authz,
            secure,
            max_header_bytes: max_header_bytes.max(8192),
            metrics: None,
        })
    }

    /// Counts every answer in `metrics` (`authz_checks_total`, by decision and reason).
    pub fn counting(mut self, metrics: Option<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Where it listens.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown`; open connections are dropped then.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = self.listener.accept() => accepted,
                Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            };
            let (stream, _) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, say: wait a moment rather than spin.
                    warn!(error = %e, "The authz endpoint could not accept a connection.");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let (authz, secure, metrics) = (self.authz.clone(), self.secure, self.metrics.clone());
            let mut builder = http1::Builder::new();
            builder
                .max_buf_size(self.max_header_bytes)
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            connections.spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let response =
                        answer(&authz, secure, metrics.as_ref(), req.uri(), req.headers());
                    async move { Ok::<_, Infallible>(response) }
                });
                if let Err(e) = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    debug!(error = %e, "An authz connection ended with an error.");
                }
            });
        }
    }
}

/// The first value of a header as text.
fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Answers one request.
fn answer(
    authz: &Authz,
    secure: bool,
    metrics: Option<&Metrics>,
    uri: &http::Uri,
    headers: &HeaderMap,
) -> Response<Full<Bytes>> {
    let path = uri.path();
    let Some(rest) = path.strip_prefix(AUTHZ_PREFIX) else {
        return status(StatusCode::NOT_FOUND);
    };
    if !(rest.is_empty() || rest.starts_with('/')) {
        return status(StatusCode::NOT_FOUND);
    }
    let host = header_text(headers, "x-forwarded-host")
        .map(|h| h.split(',').next().unwrap_or_default())
        .or_else(|| header_text(headers, header::HOST.as_str()))
        .or_else(|| uri.host())
        .unwrap_or_default();
    let original_path = match header_text(headers, "x-forwarded-uri") {
        Some(p) => p.to_owned(),
        None => {
            let rest = if rest.is_empty() { "/" } else { rest };
            match uri.query() {
                Some(q) => format!("{rest}?{q}"),
                None => rest.to_owned(),
            }
        }
    };
    let cookies = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok());
    let decision = authz.check(host, &original_path, cookies);
    if let Some(metrics) = metrics {
        let (decision, reason) = decision.labels();
        metrics.authz_checked(decision, reason);
    }
    match decision {
        Decision::Allow { job_id, rank } => {
            let mut r = status(StatusCode::OK);
            if let Ok(v) = HeaderValue::from_str(&job_id) {
                r.headers_mut().insert(HEADER_JOB, v);
            }
            r.headers_mut().insert(HEADER_RANK, HeaderValue::from(rank));
            r
        }
        Decision::SetCookie { id, location } => {
            let mut r = status(StatusCode::FOUND);
            let cookie = format!(
                "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Lax{}",
                if secure { "; Secure" } else { "" }
            );
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r.headers_mut()
                .insert(header::LOCATION, HeaderValue::from_static(location));
            r
        }
        Decision::NoSession => status(StatusCode::UNAUTHORIZED),
        Decision::Deny(reason) => {
            debug!(%host, reason, "Request refused by the session check.");
            status(StatusCode::FORBIDDEN)
        }
    }
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = code;
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}
