//! The check of every request through the proxy, answered from memory: the session records one watch
//! keeps ([`Sessions`]) and the route table of the proxy-sync instance ([`Routes`]). No API call per
//! request.
//!
//! The request's original host (`X-Forwarded-Host`, else `Host`) must be a routed host: a rank host
//! `<prefix><jobId>-<rank>.<domain>` or one of a job's public domains (rank 0). Where the request comes
//! from must be acceptable ([`super::origin`]: a WebSocket or a state-changing method from the rank's
//! own origin or a listed one, nothing but top-level navigations from other pages). The session comes
//! from the session cookies (every cookie [`super::is_session_cookie`] names, all of them looked at: a
//! cookie another page of the site planted beside the user's own cannot hide it) and one of them must
//! be of that job, live (not expired; its job routed, so not ended), and match:
//!
//! | original path | session needed |
//! | --- | --- |
//! | `/.volcano-runner/session?token=<id>` | that id, for this job and rank: answered 302 with the cookie set |
//! | `/.volcano-runner/vnc…` | vnc, this rank |
//! | `/.volcano-runner/terminal…` | terminal, this rank |
//! | `/.volcano-runner/logs…` | any session of this job |
//! | anything else | web, this rank |
//!
//! Answers: 200 (with the job and rank), 401 without a session cookie, 403 for everything else that is
//! not allowed, 302 for a valid session URL. A wrong id and an expired one get the same 403: nothing
//! tells an attacker which ids exist.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use jiff::Timestamp;

use super::origin::{Fetch, OriginPolicy};
use super::record::{SessionRecord, name_for};
use super::token::{self, Hash};
use super::{COOKIE, Kind, RESERVED_PREFIX, SESSION_PATH, is_session_cookie};
use crate::cluster::view::WatchView;
use crate::routes::{Backend, HostNaming, Routes};

/// The session records by ConfigMap name, kept by a watch (`None`: a record that does not read).
pub type Sessions = WatchView<Option<SessionRecord>>;

/// What the request wants, from its original path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wants {
    /// The session URL, with the id of its query.
    Session,
    /// An application page or a bridge of one kind.
    Kind(Kind),
    /// The job's output: any session of the job opens it.
    Logs,
}

impl Wants {
    /// Classifies an original path (with its query).
    pub fn of(path: &str) -> Wants {
        let path_only = path.split(['?', '#']).next().unwrap_or_default();
        let Some(rest) = path_only.strip_prefix(RESERVED_PREFIX) else {
            return Wants::Kind(Kind::Web);
        };
        let first = rest.split('/').next().unwrap_or_default();
        match first {
            "session" if path_only == SESSION_PATH => Wants::Session,
            "vnc" => Wants::Kind(Kind::Vnc),
            "terminal" => Wants::Kind(Kind::Terminal),
            "logs" => Wants::Logs,
            // Anything else under the reserved prefix is no application page: only a web session may
            // ask, and the bridge answers 404.
            _ => Wants::Kind(Kind::Web),
        }
    }
}

/// Routed hosts: the job, rank and backend each leads to.
type HostIndex = Arc<HashMap<String, (String, u32, Backend)>>;

/// The answer to one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// 200: let it through, to this job and rank, under the session of this hash (the bridges
    /// follow it, to close what it opened when it ends).
    Allow {
        job_id: String,
        rank: u32,
        session: Hash,
    },
    /// 302 to `location` with the cookie of the session's kind set to the id.
    SetCookie {
        id: String,
        kind: Kind,
        location: &'static str,
    },
    /// 401: no session cookie.
    NoSession,
    /// 403, with the reason for the metrics and the debug log (never with the id): a fixed word,
    /// `sessions_not_listed`, `no_route`, where the request comes from (`foreign_origin`,
    /// `no_origin`, `framed`, `cross_origin_subresource`), `no_token`, `invalid_session_url`,
    /// `unknown_or_expired`, `other_job` or `other_rank_or_kind`.
    Deny(&'static str),
}

impl Decision {
    /// The labels the decision is counted under (`authz_checks_total`): `allowed` with `session` or
    /// `session_url`, or `denied` with `no_session` or the reason of [`Decision::Deny`]. Fixed words,
    /// so the number of series stays small whatever the traffic.
    pub fn labels(&self) -> (&'static str, &'static str) {
        match self {
            Decision::Allow { .. } => ("allowed", "session"),
            Decision::SetCookie { .. } => ("allowed", "session_url"),
            Decision::NoSession => ("denied", "no_session"),
            Decision::Deny(reason) => ("denied", reason),
        }
    }
}

/// The state the check reads: every session, the routes, and an index of hosts built from the routes
/// (rebuilt when the route table changes, on the first check after the change).
pub struct Authz {
    sessions: Sessions,
    namespace: String,
    routes: Routes,
    naming: HostNaming,
    /// The host index and the route table version it was built from.
    hosts: RwLock<(Option<u64>, HostIndex)>,
    clock: Arc<dyn Fn() -> Timestamp + Send + Sync>,
    origins: OriginPolicy,
}

impl Authz {
    /// A check over `sessions` (records in `namespace`) and `routes`, at the time `clock` tells.
    pub fn new(
        sessions: Sessions,
        namespace: String,
        routes: Routes,
        naming: HostNaming,
        clock: Arc<dyn Fn() -> Timestamp + Send + Sync>,
    ) -> Self {
        Self {
            sessions,
            namespace,
            routes,
            naming,
            hosts: RwLock::new((None, Arc::default())),
            clock,
            origins: OriginPolicy::default(),
        }
    }

    /// Judges where requests come from by `origins` (by default: https rank hosts, nothing listed).
    pub fn with_origins(mut self, origins: OriginPolicy) -> Self {
        self.origins = origins;
        self
    }

    /// The time by the check's clock.
    pub fn now(&self) -> Timestamp {
        (self.clock)()
    }

    /// The record of the session whose id hashes to `hash`, expired or not, while it is stored.
    pub fn record(&self, hash: &Hash) -> Option<SessionRecord> {
        let key = (name_for(hash), self.namespace.clone());
        self.sessions
            .read(|all| all.get(&key).cloned().flatten())
            .flatten()
            .filter(|r| r.hash.constant_time_eq(hash))
    }

    /// Whether the session records have been listed (before that, every check is refused).
    pub fn synced(&self) -> bool {
        self.sessions.read(|_| ()).is_some()
    }

    /// The job and rank a host leads to, if it is routed.
    fn route(&self, host: &str) -> Option<(String, u32)> {
        self.indexed(host).map(|(job, rank, _)| (job, rank))
    }

    /// Where a host's requests go (its rank's pod, or a bridges-only backend), if it is routed: what the
    /// answer tells a proxy whose configuration has no per-job routes (Caddy, docs/proxy.md).
    pub fn backend(&self, host: &str) -> Option<Backend> {
        self.indexed(&normalize_host(host)).map(|(_, _, b)| b)
    }

    fn indexed(&self, host: &str) -> Option<(String, u32, Backend)> {
        let version = self.routes.version();
        let index = {
            let hosts = self.hosts.read().unwrap_or_else(|e| e.into_inner());
            (hosts.0 == Some(version)).then(|| hosts.1.clone())
        };
        let index = match index {
            Some(index) => index,
            None => {
                let built: HashMap<String, (String, u32, Backend)> = self.routes.read(|t| {
                    t.routes(&self.naming)
                        .into_iter()
                        .map(|r| (r.host, (r.job_id, r.rank, r.backend)))
                        .collect()
                });
                let built = Arc::new(built);
                *self.hosts.write().unwrap_or_else(|e| e.into_inner()) =
                    (Some(version), built.clone());
                built
            }
        };
        index.get(host).cloned()
    }

    /// The live session an id opens, if any.
    fn session(&self, id: &str, now: Timestamp) -> Option<SessionRecord> {
        if !token::well_formed(id) {
            return None;
        }
        self.record(&Hash::of(id)).filter(|r| !r.is_expired(now))
    }

    /// Checks one request: its original host, original path (with query), `Cookie` header values, and
    /// what the browser says of where it comes from.
    pub fn check<'a>(
        &self,
        host: &str,
        path: &str,
        cookies: impl IntoIterator<Item = &'a str>,
        fetch: &Fetch<'_>,
    ) -> Decision {
        let original_host = host.trim();
        let host = normalize_host(host);
        let wants = Wants::of(path);
        if !self.synced() {
            return Decision::Deny("sessions_not_listed");
        }
        let Some((job_id, rank)) = self.route(&host) else {
            return Decision::Deny("no_route");
        };
        if let Err(reason) = self.origins.judge(original_host, fetch) {
            return Decision::Deny(reason);
        }
        let now = (self.clock)();
        if wants == Wants::Session {
            let Some(id) = query_param(path, "token") else {
                return Decision::Deny("no_token");
            };
            return match self.session(id, now) {
                Some(r) if r.job_id == job_id && r.rank == rank => Decision::SetCookie {
                    id: id.to_owned(),
                    kind: r.kind,
                    location: r.kind.landing_path(),
                },
                _ => Decision::Deny("invalid_session_url"),
            };
        }
        // Every session cookie is looked at: the header's size is bounded by the endpoint, and an id
        // that is not well formed costs a length check.
        let mut ids = cookies
            .into_iter()
            .flat_map(|header| session_cookie_values(header, COOKIE))
            .peekable();
        if ids.peek().is_none() {
            return Decision::NoSession;
        }
        let mut reason = "unknown_or_expired";
        for id in ids {
            let Some(r) = self.session(id, now) else {
                continue;
            };
            if r.job_id != job_id {
                reason = "other_job";
                continue;
            }
            let fits = match wants {
                Wants::Logs => true,
                Wants::Kind(kind) => r.rank == rank && r.kind == kind,
                Wants::Session => false,
            };
            if fits {
                return Decision::Allow {
                    job_id,
                    rank,
                    session: r.hash,
                };
            }
            reason = "other_rank_or_kind";
        }
        Decision::Deny(reason)
    }
}

/// A host without its port, lower-case, without a trailing dot.
fn normalize_host(host: &str) -> String {
    let host = host.trim();
    let without_port = match host.rsplit_once(':') {
        Some((h, port)) if !h.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    without_port.trim_end_matches('.').to_ascii_lowercase()
}

/// The value of `name` in a query string (no percent-decoding: an id has none to decode).
fn query_param<'a>(path: &'a str, name: &str) -> Option<&'a str> {
    let query = path.split_once('?')?.1;
    let query = query.split('#').next().unwrap_or_default();
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The values of the session cookies of base name `base` in one `Cookie` header.
fn session_cookie_values<'a>(header: &'a str, base: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    header.split(';').filter_map(move |pair| {
        let (k, v) = pair.split_once('=')?;
        is_session_cookie(base, k.trim()).then(|| v.trim().trim_matches('"'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_say_what_they_want() {
        assert_eq!(Wants::of("/"), Wants::Kind(Kind::Web));
        assert_eq!(Wants::of("/lab?x=1"), Wants::Kind(Kind::Web));
        assert_eq!(Wants::of("/.volcano-runner/vnc"), Wants::Kind(Kind::Vnc));
        assert_eq!(
            Wants::of("/.volcano-runner/terminal/ws"),
            Wants::Kind(Kind::Terminal)
        );
        assert_eq!(Wants::of("/.volcano-runner/logs?follow=1"), Wants::Logs);
        assert_eq!(
            Wants::of("/.volcano-runner/session?token=a"),
            Wants::Session
        );
        assert_eq!(
            Wants::of("/.volcano-runner/session/x"),
            Wants::Kind(Kind::Web)
        );
        assert_eq!(Wants::of("/.volcano-runner/other"), Wants::Kind(Kind::Web));
    }

    #[test]
    fn hosts_cookies_and_queries_are_read_strictly() {
        assert_eq!(
            normalize_host("App-1-0.Cloud.SDU.dk:443"),
            "app-1-0.cloud.sdu.dk"
        );
        assert_eq!(
            normalize_host("app-1-0.cloud.sdu.dk."),
            "app-1-0.cloud.sdu.dk"
        );
        assert_eq!(query_param("/x?a=1&token=abc#f", "token"), Some("abc"));
        assert_eq!(query_param("/x?tokens=abc", "token"), None);
        let values: Vec<&str> = session_cookie_values(
            "a=1; ucloud-compute-session=xyz; b=2; __Host-ucloud-compute-session-web=\"q\"; \
             ucloud-compute-sessions=no; ucloud-compute-session-terminal=t",
            COOKIE,
        )
        .collect();
        assert_eq!(values, vec!["xyz", "q", "t"]);
    }
}
