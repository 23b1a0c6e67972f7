//! The HTTP endpoint of the check (`[proxy_sync] authz_listen`), for Caddy's `forward_auth` and Envoy's
//! `ext_authz` (HTTP service). Every request whose path starts with `/authz` is a check: the original host
//! is `X-Forwarded-Host`, else `Host`; the original path `X-Forwarded-Uri`, else the request's path
//! without `/authz`; the original method `X-Forwarded-Method`, else the request's; the sessions the
//! `Cookie` header's session cookies; where it comes from `Origin` and `Sec-Fetch-*`.
//! [`super::authz`] decides. A 200 for a bridge's path names the session in `X-Volcano-Runner-Session`
//! (its record's name: the hash, never the id), which the proxy copies onto the request to the bridges
//! so that they close what the session opened when it ends.
//!
//! A 200 also tells the proxy what to send on (docs/proxy.md, "Every request checked"):
//! - [`HEADER_UPSTREAM`]: the rank's pod (`ip:port`), or [`UPSTREAM_NONE`] for a bridges-only rank. Caddy
//!   dials it per request, so its configuration never changes with the jobs and a job starting or ending
//!   reloads nothing (Caddy 2.6 closes every open WebSocket on a reload).
//! - [`HEADER_COOKIE`]: the request's cookies without the session cookies, for Caddy to send on as the
//!   `Cookie`; and for Envoy the same as `cookie` (which `ext_authz` puts in place of the request's), or,
//!   when nothing is left, `x-envoy-auth-headers-to-remove: cookie`. The session id never reaches a pod.
//!   A request that goes to the bridges (proxy-sync's own) keeps its cookies.
//!
//! A host that is not routed (an ended job's) is answered 404, so a proxy in front says so to the user
//! whether or not it knows the host itself.
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
use super::origin::Fetch;
use super::record::name_for;
use super::{COOKIE, Kind, cookie_name, is_session_cookie};
use crate::ops::Metrics;

/// The path prefix of checks.
pub const AUTHZ_PREFIX: &str = "/authz";
/// Response header: the job a request is allowed to.
pub const HEADER_JOB: &str = "x-volcano-runner-job";
/// Response header: the rank a request is allowed to.
pub const HEADER_RANK: &str = "x-volcano-runner-rank";
/// Response header, on a bridge's path: the record name of the session that lets the request through.
pub const HEADER_SESSION: &str = "x-volcano-runner-session";

/// Response header: where the allowed request goes, `ip:port` or [`UPSTREAM_NONE`].
pub const HEADER_UPSTREAM: &str = "x-volcano-runner-upstream";
/// [`HEADER_UPSTREAM`] of a bridges-only rank: its other paths are answered 404 by the proxy.
pub const UPSTREAM_NONE: &str = "none";
/// Response header: the request's cookies without the session cookies (possibly empty).
pub const HEADER_COOKIE: &str = "x-volcano-runner-cookie";
/// Response header: the request headers Envoy's `ext_authz` (HTTP service) removes before the upstream.
pub const ENVOY_REMOVE: &str = "x-envoy-auth-headers-to-remove";
/// The body of the 404 for a host that is not routed.
pub const NOT_ROUTED: &str =
    "No interactive job is routed at this address (the job may have ended).\n";

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
    /// The proxy sends the bridge paths to proxy-sync's bridges (`bridge_url` is set): those requests
    /// keep their cookies; every other one loses its session cookies.
    bridges: bool,
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
            bridges: false,
        })
    }

    /// Whether the proxy sends bridge paths to proxy-sync's bridges (`bridge_url` set); without them
    /// those paths go to the pod and lose their session cookies like any other.
    pub fn with_bridges(mut self, bridges: bool) -> Self {
        self.bridges = bridges;
        self
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
            let bridges = self.bridges;
            let mut builder = http1::Builder::new();
            builder
                .max_buf_size(self.max_header_bytes)
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            connections.spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let response = answer(
                        &authz,
                        Answering { secure, bridges },
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

/// How answers are made, besides the check itself.
#[derive(Debug, Clone, Copy)]
pub struct Answering {
    /// Session cookies get the `Secure` attribute.
    pub secure: bool,
    /// Bridge paths go to proxy-sync's bridges (see [`AuthzServer::with_bridges`]).
    pub bridges: bool,
}

/// The original host and path (with query) of a check request; `None`: not a check (404).
pub fn original(uri: &http::Uri, headers: &HeaderMap) -> Option<(String, String)> {
    let rest = uri.path().strip_prefix(AUTHZ_PREFIX)?;
    if !(rest.is_empty() || rest.starts_with('/')) {
        return None;
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
    Some((host.to_owned(), original_path))
}

/// Whether a cookie name is a session cookie's ([`is_session_cookie`] with [`COOKIE`]). Those, and only
/// those, stay in the proxy.
pub fn is_session_cookie_name(name: &str) -> bool {
    is_session_cookie(COOKIE, name)
}

/// The `Cookie` headers of a request without the session cookies, as one `Cookie` value (`a=1; b=2`;
/// empty when nothing is left). Every other cookie passes as it was sent.
pub fn application_cookies(headers: &HeaderMap) -> String {
    let mut kept: Vec<&str> = Vec::new();
    for value in headers.get_all(header::COOKIE) {
        let Ok(value) = value.to_str() else { continue };
        for pair in value.split(';') {
            let pair = pair.trim();
            if pair.is_empty() {
                continue;
            }
            let name = pair.split_once('=').map_or(pair, |(n, _)| n).trim();
            if !is_session_cookie_name(name) {
                kept.push(pair);
            }
        }
    }
    kept.join("; ")
}

/// Answers one request.
pub fn answer(
    authz: &Authz,
    how: Answering,
    metrics: Option<&Metrics>,
    method: &http::Method,
    uri: &http::Uri,
    headers: &HeaderMap,
) -> Response<Full<Bytes>> {
    let Some((host, original_path)) = original(uri, headers) else {
        return status(StatusCode::NOT_FOUND);
    };
    let host = host.as_str();
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
            let request = Checked {
                host,
                original_path: &original_path,
                headers,
            };
            allowed(authz, how, &request, &job_id, rank, &session)
        }
        Decision::SetCookie { id, kind, location } => {
            let mut r = status(StatusCode::FOUND);
            let cookie = set_cookie(kind, &id, how.secure);
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r.headers_mut()
                .insert(header::LOCATION, HeaderValue::from_static(location));
            r
        }
        Decision::NoSession => status(StatusCode::UNAUTHORIZED),
        Decision::Deny("no_route") => {
            debug!(%host, reason = "no_route", "Request refused by the session check.");
            not_routed()
        }
        Decision::Deny(reason) => {
            debug!(%host, reason, "Request refused by the session check.");
            status(StatusCode::FORBIDDEN)
        }
    }
}

/// The request a check is about: its original host and path, and its headers.
struct Checked<'a> {
    host: &'a str,
    original_path: &'a str,
    headers: &'a HeaderMap,
}

/// The 200 of an allowed request: the job, rank and (on a bridge's path) session for the proxy, where the
/// request goes, and its cookies without the session cookies; a host no longer routed is 404.
fn allowed(
    authz: &Authz,
    how: Answering,
    request: &Checked<'_>,
    job_id: &str,
    rank: u32,
    session: &super::token::Hash,
) -> Response<Full<Bytes>> {
    let Checked {
        host,
        original_path,
        headers,
    } = *request;
    // The table may have changed since the check read it: a job that ended in between is gone.
    let Some(backend) = authz.backend(host) else {
        return not_routed();
    };
    let mut r = status(StatusCode::OK);
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(job_id) {
        h.insert(HEADER_JOB, v);
    }
    h.insert(HEADER_RANK, HeaderValue::from(rank));
    // Only the bridges follow the session; an application's pages never see its hash.
    if Wants::of(original_path) != Wants::Kind(Kind::Web)
        && let Ok(v) = HeaderValue::from_str(&name_for(session))
    {
        h.insert(HEADER_SESSION, v);
    }
    let upstream = if backend.bridges_only() {
        HeaderValue::from_static(UPSTREAM_NONE)
    } else {
        HeaderValue::from_str(&backend.to_string()).expect("an address is a header value")
    };
    h.insert(HEADER_UPSTREAM, upstream);
    // Cookie values are visible ASCII (the parser gave them as text), so they stay a valid value.
    let kept = application_cookies(headers);
    let kept = HeaderValue::from_str(&kept).unwrap_or(HeaderValue::from_static(""));
    h.insert(HEADER_COOKIE, kept.clone());
    let to_bridge = how.bridges
        && matches!(
            Wants::of(original_path),
            Wants::Logs | Wants::Kind(Kind::Vnc | Kind::Terminal)
        );
    if !to_bridge {
        if kept.is_empty() {
            h.insert(ENVOY_REMOVE, HeaderValue::from_static("cookie"));
        } else {
            h.insert(header::COOKIE, kept);
        }
    }
    r
}

/// The `Set-Cookie` of a session: one cookie per kind, so that the sessions of one rank do not replace
/// each other; host-only, `HttpOnly`, `SameSite=Lax` (the session URL and links from the orchestrator
/// are top-level navigations from another site, which `Strict` would send without it); under https
/// `Secure` with the `__Host-` prefix, which no other host of the site can set or shadow.
pub fn set_cookie(kind: Kind, id: &str, secure: bool) -> String {
    format!(
        "{}={id}; Path=/; HttpOnly; SameSite=Lax{}",
        cookie_name(kind, secure),
        if secure { "; Secure" } else { "" }
    )
}

fn not_routed() -> Response<Full<Bytes>> {
    let mut r = status(StatusCode::NOT_FOUND);
    *r.body_mut() = Full::new(Bytes::from_static(NOT_ROUTED.as_bytes()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
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
            set_cookie(Kind::Terminal, "ID", true),
            "__Host-ucloud-compute-session-terminal=ID; Path=/; HttpOnly; SameSite=Lax; Secure"
        );
        assert_eq!(
            set_cookie(Kind::Web, "ID", false),
            "ucloud-compute-session-web=ID; Path=/; HttpOnly; SameSite=Lax"
        );
    }

    #[test]
    fn session_cookies_are_the_base_name_its_kinds_and_their_host_prefixed_forms() {
        for name in [
            "ucloud-compute-session",
            "ucloud-compute-session-web",
            "ucloud-compute-session-terminal",
            "__Host-ucloud-compute-session",
            "__Host-ucloud-compute-session-vnc",
        ] {
            assert!(is_session_cookie_name(name), "{name}");
        }
        for name in [
            "ucloud-compute-sessions",
            "ucloud-compute-sessionx",
            "my-ucloud-compute-session",
            "__Secure-ucloud-compute-session",
            "_xsrf",
            "",
        ] {
            assert!(!is_session_cookie_name(name), "{name}");
        }
    }

    #[test]
    fn only_the_session_cookies_are_taken_out_of_every_cookie_header() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("_xsrf=2|a|b; ucloud-compute-session=S1;username-app=\"x=y\""),
        );
        h.append(
            header::COOKIE,
            HeaderValue::from_static("__Host-ucloud-compute-session-web=S2; theme=dark; ;flag"),
        );
        assert_eq!(
            application_cookies(&h),
            "_xsrf=2|a|b; username-app=\"x=y\"; theme=dark; flag"
        );
        let mut only = HeaderMap::new();
        only.insert(
            header::COOKIE,
            HeaderValue::from_static("ucloud-compute-session=S1"),
        );
        assert_eq!(application_cookies(&only), "");
        assert_eq!(application_cookies(&HeaderMap::new()), "");
    }
}
