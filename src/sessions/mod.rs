//! Interactive sessions: who may open a job's web interface, VNC desktop or terminal through the proxy.
//!
//! - [`token`]: session ids (256 bits from the OS CSPRNG, URL-safe) and their SHA-256 hashes; an id is
//!   never stored or logged, only its hash.
//! - [`record`]: a session as stored in the cluster: one ConfigMap per session in the runner's own
//!   namespace (not the job's, so the job's owner cannot list them), named by the hash and labelled with
//!   job, rank, kind and expiry; [`record::SessionStore`] creates, sweeps and deletes them.
//! - [`issuer`]: the runner's side. It consumes `OpenSession` requests from a queue of its own, decides
//!   from the job's durable state (its VolcanoJob and annotations), stores the session and answers on
//!   the request's `reply_to` with its `correlation_id`.
//! - [`authz`]: proxy-sync's side. The check of every request through the proxy, answered from memory:
//!   the session records kept by one watch and the route table ([`crate::proxy::Routes`]).
//! - [`server`]: the HTTP endpoint of that check (`[proxy_sync] authz_listen`).
//!
//! docs/proxy.md ("Sessions") describes the whole for operators, with the threat model.

pub mod authz;
pub mod check;
pub mod issuer;
pub mod record;
pub mod server;
pub mod token;

use crate::messages::v1::SessionKind;

/// The session cookie, as the original named it.
pub const COOKIE: &str = "ucloud-compute-session";

/// The paths under every rank host that belong to volcano-runner, not to the application.
pub const RESERVED_PREFIX: &str = "/.volcano-runner/";

/// The path of the session URL: `?token=<id>` sets the cookie and redirects to the kind's landing path.
pub const SESSION_PATH: &str = "/.volcano-runner/session";

/// What a session opens, as stored and as checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Web,
    Vnc,
    Terminal,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 3] = [Kind::Web, Kind::Vnc, Kind::Terminal];

    /// The name in labels, annotations and logs: `web`, `vnc`, `terminal`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Web => "web",
            Kind::Vnc => "vnc",
            Kind::Terminal => "terminal",
        }
    }

    /// From [`Kind::as_str`].
    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// From the contract's enum; `None` for unspecified or unknown values.
    pub fn from_proto(value: i32) -> Option<Kind> {
        match SessionKind::try_from(value).ok()? {
            SessionKind::Web => Some(Kind::Web),
            SessionKind::Vnc => Some(Kind::Vnc),
            SessionKind::Terminal => Some(Kind::Terminal),
            SessionKind::Unspecified => None,
        }
    }

    /// Where the session URL sends the browser once the cookie is set.
    pub fn landing_path(self) -> &'static str {
        match self {
            Kind::Web => "/",
            Kind::Vnc => "/.volcano-runner/vnc",
            Kind::Terminal => "/.volcano-runner/terminal",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kinds a job offers, as the Proxy plugin records them (`<prefix>sessionKinds`, e.g. `web,terminal`).
/// A job created before that annotation existed offers `web` when it is routed at all.
pub fn offered_kinds(annotation: Option<&str>) -> Vec<Kind> {
    match annotation {
        Some(text) => text
            .split(',')
            .filter_map(|k| Kind::parse(k.trim()))
            .collect(),
        None => vec![Kind::Web],
    }
}
