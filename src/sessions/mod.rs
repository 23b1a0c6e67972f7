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
//!   the session records kept by one watch and the route table ([`crate::routes::Routes`]).
//! - [`server`]: the HTTP endpoint of that check (`[proxy_sync] authz_listen`).
//!
//! docs/proxy.md ("Sessions") describes the whole for operators, with the threat model.

pub mod authz;
pub mod check;
pub mod issuer;
pub mod origin;
pub mod record;
pub mod server;
pub mod token;

use crate::messages::v1::SessionKind;

/// The base name of every session cookie, as the original named it. Each kind has a cookie of its own
/// ([`cookie_name`]), so that the web, VNC and terminal sessions of one rank live side by side in one
/// browser; [`is_session_cookie`] tells all of them apart from the application's cookies.
pub const COOKIE: &str = "ucloud-compute-session";

/// The prefix that binds a cookie to the exact host that set it, over https only: a page on another
/// host of the same site cannot set, replace or shadow it (RFC 6265bis, "cookie prefixes").
pub const HOST_PREFIX: &str = "__Host-";

/// Whether a cookie named `name` is a session cookie of base name `base`: after an optional `__Host-`
/// prefix (matched without regard to case, as browsers match it), the name is `base` or starts with
/// `base` followed by `-`. The check reads every such cookie, and the proxy removes every such cookie
/// before the pod: one rule for both, so that a cookie the check may read never reaches a job.
pub fn is_session_cookie(base: &str, name: &str) -> bool {
    let name = match name.get(..HOST_PREFIX.len()) {
        Some(prefix) if prefix.eq_ignore_ascii_case(HOST_PREFIX) => &name[HOST_PREFIX.len()..],
        _ => name,
    };
    match name.strip_prefix(base) {
        Some(rest) => rest.is_empty() || rest.starts_with('-'),
        None => false,
    }
}

/// The cookie a session of `kind` is kept in: `ucloud-compute-session-<kind>`, with the `__Host-`
/// prefix when the session URLs are https (`secure`; a browser keeps a `__Host-` cookie only from a
/// secure origin).
pub fn cookie_name(kind: Kind, secure: bool) -> String {
    format!(
        "{}{COOKIE}-{}",
        if secure { HOST_PREFIX } else { "" },
        kind.as_str()
    )
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_cookies_are_the_base_name_or_a_dash_suffix_with_an_optional_host_prefix() {
        for name in [
            "ucloud-compute-session",
            "ucloud-compute-session-web",
            "ucloud-compute-session-terminal",
            "ucloud-compute-session-",
            "__Host-ucloud-compute-session-vnc",
            "__host-ucloud-compute-session",
            "__HOST-ucloud-compute-session-x-y",
        ] {
            assert!(is_session_cookie(COOKIE, name), "{name}");
        }
        for name in [
            "ucloud-compute-sessions",
            "ucloud-compute-session_web",
            "theme",
            "",
            "__Host-",
            "__Secure-ucloud-compute-session",
            "x-ucloud-compute-session",
            "Ucloud-compute-session",
            "__Host-__Host-ucloud-compute-session",
        ] {
            assert!(!is_session_cookie(COOKIE, name), "{name}");
        }
        for kind in Kind::ALL {
            for secure in [false, true] {
                assert!(is_session_cookie(COOKIE, &cookie_name(kind, secure)));
            }
        }
        assert_eq!(
            cookie_name(Kind::Terminal, true),
            "__Host-ucloud-compute-session-terminal"
        );
        assert_eq!(cookie_name(Kind::Web, false), "ucloud-compute-session-web");
    }
}
