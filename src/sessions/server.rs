//! The HTTP endpoint of the check (`[proxy_sync] authz_listen`), for Caddy's `forward_auth` and Envoy's
//! `ext_authz` (HTTP service). Every request whose path starts with `/authz` is a check: the original host
//! is `X-Forwarded-Host`, else `Host`; the original path `X-Forwarded-Uri`, else the request's path
//! without `/authz`; the original method `X-Forwarded-Method`, else the request's; the sessions the
//! `Cookie` header's session cookies; where it comes from `Origin` and `Sec-Fetch-*`.
//! [`super::authz`] decides. A 200 for a bridge's path names the session in `X-Volcano-Runner-Session`
//! (its record's name: the hash, never the id), which the proxy copies onto the request to the bridges
//! so that they close what the session opened when it ends.
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

use super::authz::{Authz, Decision, Wants};
use super::cookie_name;
use super::origin::Fetch;
use super::record::name_for;
use crate::ops::Metrics;

/// The path prefix of checks.
pub const AUTHZ_PREFIX: &str = "/authz";
/// Response header: the job a request is allowed to.
pub const HEADER_JOB: &str = "x-volcano-runner-job";
/// Response header: the rank a request is allowed to.
pub const HEADER_RANK: &str = "x-volcano-runner-rank";
/// Response header, on a bridge's path: the record name of the session that lets the request through.
pub const HEADER_SESSION: &str = "x-volcano-runner-session";

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
                    let response = answer(
                        &authz,
                        secure,
                        metrics.as_ref(),
                        req.method(),
                        req.uri(),
                        req.headers(),
                    );
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
    method: &http::Method,
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
    // Caddy forwards the host without its port and keeps the original `Host` (with it) on the check;
    // the port is part of the origin a browser sends, so it is taken from there when the names agree.
    let host = match header_text(headers, header::HOST.as_str()) {
        Some(authority)
            if authority
                .rsplit_once(':')
                .map_or(authority, |(name, _)| name)
                .eq_ignore_ascii_case(host.trim()) =>
        {
            authority
        }
        _ => host,
    };
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
    let original_method =
        header_text(headers, "x-forwarded-method").unwrap_or_else(|| method.as_str());
    let fetch = Fetch::from_headers(original_method, headers);
    let decision = authz.check(host, &original_path, cookies, &fetch);
    if let Some(metrics) = metrics {
        let (decision, reason) = decision.labels();
        metrics.authz_checked(decision, reason);
    }
    match decision {
        Decision::Allow {
            job_id,
            rank,
            session,
        } => {
            let mut r = status(StatusCode::OK);
            if let Ok(v) = HeaderValue::from_str(&job_id) {
                r.headers_mut().insert(HEADER_JOB, v);
            }
            r.headers_mut().insert(HEADER_RANK, HeaderValue::from(rank));
            // Only the bridges follow the session; an application's pages never see its hash.
            if Wants::of(&original_path) != Wants::Kind(super::Kind::Web)
                && let Ok(v) = HeaderValue::from_str(&name_for(&session))
            {
                r.headers_mut().insert(HEADER_SESSION, v);
            }
            r
        }
        Decision::SetCookie { id, kind, location } => {
            let mut r = status(StatusCode::FOUND);
            let cookie = set_cookie(kind, &id, secure);
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

/// The `Set-Cookie` of a session: one cookie per kind, so that the sessions of one rank do not replace
/// each other; host-only, `HttpOnly`, `SameSite=Lax` (the session URL and links from the orchestrator
/// are top-level navigations from another site, which `Strict` would send without it); under https
/// `Secure` with the `__Host-` prefix, which no other host of the site can set or shadow.
pub fn set_cookie(kind: super::Kind, id: &str, secure: bool) -> String {
    format!(
        "{}={id}; Path=/; HttpOnly; SameSite=Lax{}",
        cookie_name(kind, secure),
        if secure { "; Secure" } else { "" }
    )
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = code;
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_cookie_and_https_binds_it_to_the_host() {
        assert_eq!(
            set_cookie(super::super::Kind::Terminal, "ID", true),
            "__Host-ucloud-compute-session-terminal=ID; Path=/; HttpOnly; SameSite=Lax; Secure"
        );
        assert_eq!(
            set_cookie(super::super::Kind::Web, "ID", false),
            "ucloud-compute-session-web=ID; Path=/; HttpOnly; SameSite=Lax"
        );
    }
}
