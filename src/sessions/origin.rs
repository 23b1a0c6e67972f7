//! Where a request comes from, and whether that place may use a session.
//!
//! Every job is served under one parent domain (`<prefix><jobId>-<rank>.<domain>`), so every job's
//! page is *same-site* to every other job's: a browser sends a `SameSite=Lax` session cookie on a
//! request that a script on another job's page makes. The cookie alone therefore says nothing about
//! who asks. What does is what the browser adds and a page cannot forge: `Origin` (sent on every
//! WebSocket, on every request but GET and HEAD, and on every cross-origin `fetch`) and the
//! `Sec-Fetch-*` headers (where a request starts, what for, and into what).
//!
//! [`OriginPolicy::judge`] is applied by the session check to every request and by the bridges to
//! every upgrade. A request is let on only if:
//!
//! 1. an `Origin` it names is the rank's own (the configured scheme with the request's host) or one
//!    the operator lists (`[sessions] allowed_origins`); `null` is never permitted;
//! 2. a WebSocket upgrade or a state-changing method (anything but GET, HEAD, OPTIONS) names one;
//! 3. a request that the browser says comes from another origin of the site or another site
//!    (`Sec-Fetch-Site: same-site` or `cross-site`) is either from a permitted `Origin`, or a
//!    top-level navigation (a link, a typed or bookmarked address, the orchestrator's session URL):
//!    `Sec-Fetch-Mode: navigate`, a safe method, `Sec-Fetch-Dest: document`. A frame, an image, a
//!    script or a `no-cors` fetch from another job's page is refused before the pod sees it.
//!
//! docs/proxy.md ("Threat model") says what this closes and what it leaves.

use http::HeaderMap;

/// What a browser says about one request, read from its headers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fetch<'a> {
    /// The original method (`X-Forwarded-Method` through the proxy); empty reads as GET.
    pub method: &'a str,
    /// `Origin`, as sent (`null` included).
    pub origin: Option<&'a str>,
    /// `Sec-Fetch-Site`.
    pub site: Option<&'a str>,
    /// `Sec-Fetch-Mode`.
    pub mode: Option<&'a str>,
    /// `Sec-Fetch-Dest`.
    pub dest: Option<&'a str>,
    /// A WebSocket upgrade: `Sec-WebSocket-Key` or `Upgrade: websocket` (the proxy removes `Upgrade`
    /// from the check's copy of the request, not the key).
    pub upgrade: bool,
}

impl<'a> Fetch<'a> {
    /// From a request's headers; `method` is the original method.
    pub fn from_headers(method: &'a str, headers: &'a HeaderMap) -> Fetch<'a> {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let upgrade = headers.contains_key("sec-websocket-key")
            || text("upgrade").is_some_and(|u| u.to_ascii_lowercase().contains("websocket"));
        Fetch {
            method,
            origin: text("origin"),
            site: text("sec-fetch-site"),
            mode: text("sec-fetch-mode"),
            dest: text("sec-fetch-dest"),
            upgrade,
        }
    }

    /// A method that changes nothing by the rules of HTTP (what `SameSite=Lax` lets through anyway).
    fn safe(&self) -> bool {
        let m = self.method.trim();
        m.is_empty()
            || m.eq_ignore_ascii_case("GET")
            || m.eq_ignore_ascii_case("HEAD")
            || m.eq_ignore_ascii_case("OPTIONS")
    }
}

/// The origins a session may be used from, besides each rank's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginPolicy {
    /// The scheme browsers see the rank hosts under (`[sessions] scheme`).
    scheme: &'static str,
    /// `[sessions] allowed_origins`, normalized.
    allowed: Vec<String>,
}

impl Default for OriginPolicy {
    /// https, and nothing listed.
    fn default() -> Self {
        Self::new(true, &[])
    }
}

impl OriginPolicy {
    /// Rank hosts under https (`secure`) or http, and the listed origins (ones that do not read as an
    /// origin are left out: the configuration's check refuses them first).
    pub fn new(secure: bool, allowed: &[String]) -> Self {
        Self {
            scheme: if secure { "https" } else { "http" },
            allowed: allowed.iter().filter_map(|o| normalize(o)).collect(),
        }
    }

    /// The origin a page of `host` (a `Host` header: name and optional port) has in the browser.
    pub fn own(&self, host: &str) -> Option<String> {
        normalize(&format!("{}://{}", self.scheme, host.trim()))
    }

    /// Whether `origin` may use a session of `host`: it is the host's own origin or a listed one.
    pub fn permits(&self, origin: &str, host: &str) -> bool {
        let Some(origin) = normalize(origin) else {
            return false;
        };
        self.own(host).as_deref() == Some(origin.as_str()) || self.allowed.contains(&origin)
    }

    /// Whether a request to `host` may go on, whatever session it carries; `Err` with the reason
    /// (a fixed word, counted in `authz_checks_total`): `foreign_origin`, `no_origin`, `framed` or
    /// `cross_origin_subresource`.
    pub fn judge(&self, host: &str, fetch: &Fetch<'_>) -> Result<(), &'static str> {
        let permitted = fetch.origin.map(|o| self.permits(o, host));
        if permitted == Some(false) {
            return Err("foreign_origin");
        }
        if (fetch.upgrade || !fetch.safe()) && permitted.is_none() {
            return Err("no_origin");
        }
        let elsewhere = fetch.site.is_some_and(|s| {
            s.eq_ignore_ascii_case("same-site") || s.eq_ignore_ascii_case("cross-site")
        });
        if !elsewhere || permitted == Some(true) {
            return Ok(());
        }
        let navigate = fetch
            .mode
            .is_some_and(|m| m.eq_ignore_ascii_case("navigate"));
        if !navigate {
            return Err("cross_origin_subresource");
        }
        let top_level = fetch
            .dest
            .is_none_or(|d| d.eq_ignore_ascii_case("document"));
        if top_level && fetch.safe() {
            Ok(())
        } else {
            Err("framed")
        }
    }
}

/// An origin as browsers serialize it (see [`crate::validate::names::normalize_origin`], where the
/// configuration's check finds it too).
pub use crate::validate::names::normalize_origin as normalize;

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str = "app-t-0.cloud.sdu.dk";

    fn policy() -> OriginPolicy {
        OriginPolicy::new(true, &["https://cloud.sdu.dk".to_owned()])
    }

    #[test]
    fn origins_are_compared_as_browsers_serialize_them() {
        assert_eq!(
            normalize("HTTPS://Cloud.SDU.dk:443"),
            Some("https://cloud.sdu.dk".into())
        );
        assert_eq!(
            normalize("http://a.b:8080/"),
            Some("http://a.b:8080".into())
        );
        for bad in [
            "null",
            "",
            "cloud.sdu.dk",
            "ftp://a.b",
            "https://",
            "https://a.b/x",
            "https://u@a.b",
            "https://a.b:x",
            "https://a.b, https://c.d",
        ] {
            assert_eq!(normalize(bad), None, "{bad}");
        }
        let p = policy();
        assert!(p.permits("https://app-t-0.cloud.sdu.dk", HOST));
        assert!(p.permits(
            "https://APP-T-0.cloud.sdu.dk:443",
            "app-t-0.cloud.sdu.dk:443"
        ));
        assert!(p.permits("https://cloud.sdu.dk", HOST));
        assert!(!p.permits("http://app-t-0.cloud.sdu.dk", HOST));
        assert!(!p.permits("https://app-b-0.cloud.sdu.dk", HOST));
        assert!(!p.permits("https://evil.example", HOST));
        assert!(!p.permits("null", HOST));
        let dev = OriginPolicy::new(false, &[]);
        assert!(dev.permits(
            "http://app-t-0.cloud.sdu.dk:8080",
            "app-t-0.cloud.sdu.dk:8080"
        ));
        assert!(!dev.permits("http://app-t-0.cloud.sdu.dk", "app-t-0.cloud.sdu.dk:8080"));
    }

    #[test]
    fn upgrades_and_writes_need_a_permitted_origin_and_other_pages_only_navigate() {
        let p = policy();
        let ws = |origin| Fetch {
            method: "GET",
            origin,
            upgrade: true,
            ..Fetch::default()
        };
        assert_eq!(
            p.judge(HOST, &ws(Some("https://app-t-0.cloud.sdu.dk"))),
            Ok(())
        );
        assert_eq!(p.judge(HOST, &ws(Some("https://cloud.sdu.dk"))), Ok(()));
        assert_eq!(
            p.judge(HOST, &ws(Some("https://app-b-0.cloud.sdu.dk"))),
            Err("foreign_origin")
        );
        assert_eq!(p.judge(HOST, &ws(Some("null"))), Err("foreign_origin"));
        assert_eq!(p.judge(HOST, &ws(None)), Err("no_origin"));

        let post = |origin| Fetch {
            method: "POST",
            origin,
            ..Fetch::default()
        };
        assert_eq!(p.judge(HOST, &post(None)), Err("no_origin"));
        assert_eq!(
            p.judge(HOST, &post(Some("https://app-b-0.cloud.sdu.dk"))),
            Err("foreign_origin")
        );
        assert_eq!(
            p.judge(HOST, &post(Some("https://app-t-0.cloud.sdu.dk"))),
            Ok(())
        );

        let from_site = |mode, dest, method, origin| Fetch {
            method,
            origin,
            site: Some("same-site"),
            mode: Some(mode),
            dest: Some(dest),
            upgrade: false,
        };
        // A link or the session URL from another page: a top-level navigation.
        assert_eq!(
            p.judge(HOST, &from_site("navigate", "document", "GET", None)),
            Ok(())
        );
        // Another job's page framing this one, or loading it as an image or script.
        assert_eq!(
            p.judge(HOST, &from_site("navigate", "iframe", "GET", None)),
            Err("framed")
        );
        assert_eq!(
            p.judge(HOST, &from_site("no-cors", "image", "GET", None)),
            Err("cross_origin_subresource")
        );
        assert_eq!(
            p.judge(HOST, &from_site("no-cors", "script", "GET", None)),
            Err("cross_origin_subresource")
        );
        // Its credentialed fetch names its origin, which is not permitted.
        assert_eq!(
            p.judge(
                HOST,
                &from_site("cors", "empty", "GET", Some("https://app-b-0.cloud.sdu.dk"))
            ),
            Err("foreign_origin")
        );
        // The orchestrator's frontend (listed) may fetch.
        assert_eq!(
            p.judge(
                HOST,
                &from_site("cors", "empty", "GET", Some("https://cloud.sdu.dk"))
            ),
            Ok(())
        );
        // A page's own requests.
        let own = Fetch {
            method: "GET",
            site: Some("same-origin"),
            mode: Some("no-cors"),
            dest: Some("image"),
            ..Fetch::default()
        };
        assert_eq!(p.judge(HOST, &own), Ok(()));
        // A client that is no browser and reads a page.
        assert_eq!(p.judge(HOST, &Fetch::default()), Ok(()));
    }
}
