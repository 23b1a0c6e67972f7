//! Caddy's configuration, pushed through Caddy's admin API (`[proxy_sync] caddy_admin`): the proxy that
//! runs on these machines (Debian's `caddy`), for live end-to-end tests and for small installations.
//! Caddy is never restarted: a configuration is one `POST /load`, which Caddy applies in place (its
//! listeners stay open).
//!
//! **With the session check (`authz_url`), the configuration does not depend on the routes**: Caddy 2.6
//! ends every upgraded connection (WebSocket) when it loads a configuration, so a configuration per route
//! change would disconnect every open terminal, desktop and notebook kernel each time any job starts or
//! ends. Instead one configuration serves every job, and the check, which already knows the route table,
//! says per request where it goes. One HTTP server, [`SERVER`], on `[proxy_sync] listen_port`, whose
//! routes run in order:
//! 1. the headers the check answers with are deleted from the client's request ([`CHECK_HEADERS`]), so a
//!    client cannot choose an upstream or a cookie: only the check's answer sets them;
//! 2. the check, as Caddy's `forward_auth` expands: a `reverse_proxy` to the authz endpoint with the
//!    method rewritten to GET and the URI to the endpoint's path (the original URI in `X-Forwarded-Uri`,
//!    the host in `X-Forwarded-Host`, the method in `X-Forwarded-Method`, the cookie as sent). A 2xx
//!    answer lets the request on with the answer's job, rank, session (on bridge paths), upstream and
//!    application cookies copied onto it; any other answer (401, 403, 404 for a host not routed, the session's 302) goes to the
//!    client as it is;
//! 3. paths under `/.volcano-runner/` to `bridge_url` when it is set;
//! 4. a bridges-only rank's other paths (upstream [`UPSTREAM_NONE`]): 404 from Caddy itself;
//! 5. everything else to the upstream the check named (`reverse_proxy` dialing a placeholder), with the
//!    `Cookie` replaced by the check's copy without the session cookies. WebSocket upgrades pass.
//!
//! A route change is then only a change of the check's table: nothing is pushed, nothing reloads.
//!
//! Without the check, there is nothing to ask per request: one route per host name of the table
//! (`<prefix><jobId>-<rank>.<domain>` and each public domain) to its rank's pod, pushed again on every
//! change (and so reloading Caddy). That is for tests and trusted networks only.
//!
//! The server carries an `@id` made from the content ([`marker`]): `GET /id/<marker>` answers only while
//! Caddy runs exactly what was pushed, so a Caddy that was restarted (it starts empty: the pushed
//! configuration says `persist: false`) or whose configuration was replaced is seen by
//! [`CaddyAdmin::runs`] and gets the whole configuration again.

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use serde_json::{Value, json};

use super::table::Route;
use crate::config::proxy_sync::Upstream;
use crate::sessions::server::UPSTREAM_NONE;

/// The name of the HTTP server in Caddy's configuration.
pub const SERVER: &str = "volcano-runner";
/// The path prefix that goes to the bridges.
pub const BRIDGE_PREFIX: &str = "/.volcano-runner/";
/// What [`live_hosts`] says of a host whose other paths are answered 404 by Caddy (a bridges-only rank).
pub const NO_POD: &str = "404 (bridges only)";
/// The answer to a path of a bridges-only host that is not a bridge's.
const NO_INTERFACE: &str = "This job has no web interface: only its terminal and its logs are served here, under /.volcano-runner/.\n";
/// The check's answer headers ([`crate::sessions::server`]) as Caddy names them: its placeholders for an
/// answer's headers are keyed by the canonical form of the name, so these must be written so.
const HEADER_JOB: &str = "X-Volcano-Runner-Job";
const HEADER_RANK: &str = "X-Volcano-Runner-Rank";
const HEADER_SESSION: &str = "X-Volcano-Runner-Session";
const HEADER_UPSTREAM: &str = "X-Volcano-Runner-Upstream";
const HEADER_COOKIE: &str = "X-Volcano-Runner-Cookie";
/// The headers the check's 200 sets on the request: never taken from the client.
pub const CHECK_HEADERS: [&str; 5] = [
    HEADER_JOB,
    HEADER_RANK,
    // The bridges follow the session the check names (crate::proxy::bridge).
    HEADER_SESSION,
    HEADER_UPSTREAM,
    HEADER_COOKIE,
];
/// How long one admin API call may take (a `/load` of 10,000 routes included).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// What the configuration says besides the routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaddySettings {
    /// Caddy's admin API; the configuration keeps it where it is.
    pub admin: Upstream,
    /// The port of the HTTP server.
    pub listen_port: u16,
    /// The session check (`authz_url`), if any.
    pub authz: Option<Upstream>,
    /// The bridges (`bridge_url`), if any.
    pub bridge: Option<Upstream>,
}

/// The `@id` of the server in the configuration for `routes`: changes with the content.
pub fn marker(config_without_marker: &Value) -> String {
    let text = serde_json::to_string(config_without_marker).unwrap_or_default();
    format!(
        "volcano-runner-{}",
        crate::pipeline::names::short_hash(text.as_bytes(), 16)
    )
}

fn reverse_proxy(dial: &str) -> Value {
    json!({"handler": "reverse_proxy", "upstreams": [{"dial": dial}]})
}

/// Caddy's `forward_auth`, as its Caddyfile directive expands it, to `authz`.
fn forward_auth(authz: &Upstream) -> Value {
    let copy = |name: &str| {
        (
            name.to_owned(),
            json!([format!("{{http.reverse_proxy.header.{name}}}")]),
        )
    };
    let copied: serde_json::Map<String, Value> = CHECK_HEADERS.into_iter().map(copy).collect();
    json!({
        "handler": "reverse_proxy",
        "upstreams": [{"dial": authz.authority()}],
        "rewrite": {"method": "GET", "uri": authz.path},
        "headers": {"request": {
            "set": {
                "X-Forwarded-Method": ["{http.request.method}"],
                "X-Forwarded-Uri": ["{http.request.uri}"],
                "X-Forwarded-Host": ["{http.request.host}"],
            },
            // The check is a plain GET: it is never upgraded, even when the request is.
            "delete": ["Upgrade", "Connection"],
        }},
        "handle_response": [{
            "match": {"status_code": [2]},
            "routes": [{"handle": [{"handler": "headers", "request": {"set": copied}}]}],
        }],
    })
}

/// The routes of the configuration with the check: the same whatever runs (see the module documentation).
fn per_request(authz: &Upstream, s: &CaddySettings) -> Vec<Value> {
    let mut steps = vec![
        json!({"handle": [{"handler": "headers", "request": {"delete": CHECK_HEADERS}}]}),
        json!({"handle": [forward_auth(authz)]}),
    ];
    if let Some(bridge) = &s.bridge {
        steps.push(json!({
            "match": [{"path": [format!("{BRIDGE_PREFIX}*")]}],
            "handle": [reverse_proxy(&bridge.authority())],
            "terminal": true,
        }));
    }
    steps.push(json!({
        "match": [{"header": {HEADER_UPSTREAM: [UPSTREAM_NONE]}}],
        "handle": [{"handler": "static_response", "status_code": 404, "body": NO_INTERFACE}],
        "terminal": true,
    }));
    // The session cookies stay here: the pod gets the application's cookies the check handed back, and
    // no `Cookie` at all when there are none.
    steps.push(json!({"handle": [{"handler": "headers", "request": {"delete": ["Cookie"]}}]}));
    steps.push(json!({
        "match": [{"not": [{"header": {HEADER_COOKIE: [""]}}]}],
        "handle": [{"handler": "headers", "request": {"set": {
            "Cookie": [format!("{{http.request.header.{HEADER_COOKIE}}}")],
        }}}],
    }));
    steps.push(json!({"handle": [{
        "handler": "reverse_proxy",
        // A placeholder: evaluated per request, from the header the check's answer set.
        "upstreams": [{"dial": format!("{{http.request.header.{HEADER_UPSTREAM}}}")}],
        "headers": {"request": {"delete": [HEADER_UPSTREAM, HEADER_COOKIE]}},
    }]}));
    steps
}

/// One host's route, for the configuration without the check.
fn route(r: &Route, s: &CaddySettings) -> Value {
    let mut steps = Vec::new();
    if let Some(bridge) = &s.bridge {
        steps.push(json!({
            "match": [{"path": [format!("{BRIDGE_PREFIX}*")]}],
            "handle": [reverse_proxy(&bridge.authority())],
            "terminal": true,
        }));
    }
    if r.backend.bridges_only() {
        steps.push(json!({"handle": [{
            "handler": "static_response",
            "status_code": 404,
            "body": NO_INTERFACE,
        }]}));
    } else {
        steps.push(json!({"handle": [reverse_proxy(&r.backend.to_string())]}));
    }
    json!({
        "match": [{"host": [r.host]}],
        "handle": [{"handler": "subroute", "routes": steps}],
        "terminal": true,
    })
}

/// Whether the configuration for `s` is the same whatever routes there are (the check is set).
pub fn per_request_routing(s: &CaddySettings) -> bool {
    s.authz.is_some()
}

/// The whole configuration for `routes`, with its marker. With the check, `routes` are not in it.
pub fn config(routes: &[Route], s: &CaddySettings) -> (Value, String) {
    let routes = match &s.authz {
        Some(authz) => per_request(authz, s),
        None => routes
            .iter()
            .map(|r| route(r, s))
            // A host without a route (an ended job's) is told so, not answered with Caddy's empty 200.
            .chain([json!({"handle": [{
                "handler": "static_response",
                "status_code": 404,
                "body": crate::sessions::server::NOT_ROUTED,
            }]})])
            .collect(),
    };
    let server = json!({
        "listen": [format!(":{}", s.listen_port)],
        // Plain HTTP: TLS ends in front of the proxy (the ingress), as with Envoy.
        "automatic_https": {"disable": true},
        "routes": routes,
    });
    let mut config = json!({
        // Kept where it is: a /load without it would move the admin API to Caddy's default.
        // Not persisted: a restarted Caddy starts empty, and proxy-sync pushes the current routes.
        "admin": {"listen": s.admin.authority(), "config": {"persist": false}},
        "apps": {"http": {"servers": {SERVER: server}}},
    });
    let id = marker(&config);
    config["apps"]["http"]["servers"][SERVER]["@id"] = json!(id);
    (config, id)
}

/// Why Caddy's admin API did not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum CaddyError {
    /// Nothing answers at `caddy_admin`.
    #[error(
        "Caddy's admin API at {addr} cannot be reached ({source}); is Caddy running with its admin API on [proxy_sync] caddy_admin?"
    )]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange failed.
    #[error("talking to Caddy's admin API at {addr}: {source}")]
    Http {
        addr: String,
        #[source]
        source: hyper::Error,
    },
    /// No answer in time.
    #[error("Caddy's admin API at {addr} did not answer {what} within {CALL_TIMEOUT:?}")]
    Timeout { addr: String, what: String },
    /// Caddy refused: its message says why (for a /load, what in the configuration it cannot use).
    #[error("Caddy's admin API refused {what} with {status}: {body}")]
    Refused {
        what: String,
        status: StatusCode,
        body: String,
    },
}

/// The task driving one admin-API connection, owned by the call that opened it: aborted when the call
/// returns, whichever way.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A client of Caddy's admin API.
#[derive(Debug, Clone)]
pub struct CaddyAdmin {
    addr: Upstream,
}

impl CaddyAdmin {
    pub fn new(addr: Upstream) -> Self {
        Self { addr }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), CaddyError> {
        let addr = self.addr.authority();
        let what = format!("{method} {path}");
        let exchange = async {
            let stream = tokio::net::TcpStream::connect((self.addr.host.as_str(), self.addr.port))
                .await
                .map_err(|source| CaddyError::Connect {
                    addr: addr.clone(),
                    source,
                })?;
            let http = |source| CaddyError::Http {
                addr: addr.clone(),
                source,
            };
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .map_err(http)?;
            // The connection is driven beside the exchange and ends with it (an early error too).
            let _connection = AbortOnDrop(tokio::spawn(connection));
            let mut request = Request::builder()
                .method(method)
                .uri(path)
                // Caddy's admin API checks the Host of every request against its listen address.
                .header(hyper::header::HOST, &addr);
            if body.is_some() {
                request = request.header(hyper::header::CONTENT_TYPE, "application/json");
            }
            let request = request
                .body(Full::new(Bytes::from(body.unwrap_or_default())))
                .expect("a valid request");
            let response = sender.send_request(request).await.map_err(http)?;
            let status = response.status();
            let body = response.into_body().collect().await.map_err(http)?;
            Ok((status, body.to_bytes()))
        };
        tokio::time::timeout(CALL_TIMEOUT, exchange)
            .await
            .map_err(|_| CaddyError::Timeout {
                addr: addr.clone(),
                what,
            })?
    }

    fn refused(what: &str, status: StatusCode, body: &[u8]) -> CaddyError {
        CaddyError::Refused {
            what: what.to_owned(),
            status,
            body: String::from_utf8_lossy(body).trim().to_owned(),
        }
    }

    /// Replaces Caddy's whole configuration with `config` (Caddy applies it in place).
    pub async fn load(&self, config: &Value) -> Result<(), CaddyError> {
        let body = serde_json::to_vec(config).expect("JSON values serialize");
        let (status, answer) = self.call(Method::POST, "/load", Some(body)).await?;
        if status.is_success() {
            Ok(())
        } else {
            Err(Self::refused("POST /load", status, &answer))
        }
    }

    /// Whether Caddy runs the configuration whose marker is `marker` (see the module documentation).
    pub async fn runs(&self, marker: &str) -> Result<bool, CaddyError> {
        let path = format!("/id/{marker}");
        let (status, answer) = self.call(Method::GET, &path, None).await?;
        match status {
            s if s.is_success() => Ok(true),
            // Caddy answers an unknown @id with 404 (older versions with 400 or 500, "unknown object
            // ID"): either way it does not run that configuration.
            StatusCode::NOT_FOUND => Ok(false),
            _ if String::from_utf8_lossy(&answer).contains("unknown object ID") => Ok(false),
            s => Err(Self::refused(&format!("GET {path}"), s, &answer)),
        }
    }

    /// Caddy's live configuration (`GET /config/`); `null` when it has none.
    pub async fn config(&self) -> Result<Value, CaddyError> {
        let (status, answer) = self.call(Method::GET, "/config/", None).await?;
        if !status.is_success() {
            return Err(Self::refused("GET /config/", status, &answer));
        }
        serde_json::from_slice(&answer).map_err(|e| {
            Self::refused(
                "GET /config/",
                status,
                format!("not JSON ({e}): {}", String::from_utf8_lossy(&answer)).as_bytes(),
            )
        })
    }
}

/// The host names Caddy's live configuration routes, each with where its other paths go (the last
/// `reverse_proxy` of its route, or [`NO_POD`]): what tests and operators compare with the table.
pub fn live_hosts(config: &Value) -> std::collections::BTreeMap<String, String> {
    let routes = config
        .pointer(&format!("/apps/http/servers/{SERVER}/routes"))
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    routes
        .iter()
        .filter_map(|r| {
            let host = r.pointer("/match/0/host/0")?.as_str()?.to_owned();
            let last = r.pointer("/handle/0/routes")?.as_array()?.last()?;
            if last.pointer("/handle/0/handler")?.as_str()? == "static_response" {
                return Some((host, NO_POD.to_owned()));
            }
            let dial = last
                .pointer("/handle/0/upstreams/0/dial")?
                .as_str()?
                .to_owned();
            Some((host, dial))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::table::Backend;

    fn settings(authz: bool, bridge: bool) -> CaddySettings {
        CaddySettings {
            admin: Upstream::parse("http://127.0.0.1:2019").unwrap(),
            listen_port: 8080,
            authz: authz.then(|| Upstream::parse("http://127.0.0.1:9901/authz").unwrap()),
            bridge: bridge.then(|| Upstream::parse("http://127.0.0.1:9902").unwrap()),
        }
    }

    fn routes() -> Vec<Route> {
        vec![
            Route {
                host: "app-42-0.cloud.sdu.dk".into(),
                job_id: "42".into(),
                rank: 0,
                backend: Backend {
                    ip: "10.0.0.1".parse().unwrap(),
                    port: 8888,
                },
            },
            Route {
                host: "app-42-1.cloud.sdu.dk".into(),
                job_id: "42".into(),
                rank: 1,
                backend: Backend {
                    ip: "fd00::2".parse().unwrap(),
                    port: 8888,
                },
            },
        ]
    }

    fn steps(c: &Value) -> &Vec<Value> {
        c["apps"]["http"]["servers"][SERVER]["routes"]
            .as_array()
            .unwrap()
    }

    /// With the check, the configuration is one and the same whatever runs: nothing to push (and no
    /// reload) when jobs start or end. The client's copies of the check's headers go first; the check
    /// comes before the bridges and the pod; the pod is dialled from the header the check set.
    #[test]
    fn with_the_check_the_configuration_does_not_change_with_the_routes() {
        let s = settings(true, true);
        let (c, id) = config(&routes(), &s);
        assert!(per_request_routing(&s));
        assert_eq!(config(&[], &s), (c.clone(), id.clone()));
        assert_eq!(config(&routes()[..1], &s).1, id);
        let server = &c["apps"]["http"]["servers"][SERVER];
        assert_eq!(server["@id"], json!(id));
        assert_eq!(server["listen"], json!([":8080"]));
        assert_eq!(c["admin"]["listen"], "127.0.0.1:2019");
        let text = c.to_string();
        assert!(
            !text.contains("10.0.0.1") && !text.contains("app-42"),
            "{text}"
        );
        assert!(live_hosts(&c).is_empty());

        let steps = steps(&c);
        assert_eq!(
            steps[0]["handle"][0]["request"]["delete"],
            json!(CHECK_HEADERS),
            "a client cannot choose the upstream or the cookie"
        );
        let auth = &steps[1]["handle"][0];
        assert_eq!(auth["upstreams"][0]["dial"], "127.0.0.1:9901");
        assert_eq!(auth["rewrite"], json!({"method": "GET", "uri": "/authz"}));
        let copied = &auth["handle_response"][0]["routes"][0]["handle"][0]["request"]["set"];
        for h in CHECK_HEADERS {
            assert_eq!(
                copied[h],
                json!([format!("{{http.reverse_proxy.header.{h}}}")])
            );
        }
        assert_eq!(steps[2]["match"][0]["path"], json!(["/.volcano-runner/*"]));
        assert_eq!(
            steps[2]["handle"][0]["upstreams"][0]["dial"],
            "127.0.0.1:9902"
        );
        assert_eq!(
            steps[3]["match"][0]["header"][HEADER_UPSTREAM],
            json!([UPSTREAM_NONE])
        );
        assert_eq!(steps[3]["handle"][0]["status_code"], 404);
        assert_eq!(
            steps[4]["handle"][0]["request"]["delete"],
            json!(["Cookie"])
        );
        let pod = steps.last().unwrap();
        assert_eq!(
            pod["handle"][0]["upstreams"][0]["dial"],
            "{http.request.header.X-Volcano-Runner-Upstream}"
        );
        // Without the bridges, the same less their step.
        let (plain, plain_id) = config(&routes(), &settings(true, false));
        assert_eq!(steps.len(), self::steps(&plain).len() + 1);
        assert_ne!(id, plain_id, "the marker follows the content");
    }

    #[test]
    fn the_copied_headers_are_the_checks_in_canonical_form() {
        use crate::sessions::server as check;
        let canonical = |h: &str| {
            h.split('-')
                .map(|w| w[..1].to_ascii_uppercase() + &w[1..])
                .collect::<Vec<_>>()
                .join("-")
        };
        assert_eq!(
            CHECK_HEADERS.to_vec(),
            [
                check::HEADER_JOB,
                check::HEADER_RANK,
                check::HEADER_SESSION,
                check::HEADER_UPSTREAM,
                check::HEADER_COOKIE
            ]
            .map(canonical)
        );
    }

    /// Without the check, one route per host, straight to its pod (and a change is a new configuration).
    #[test]
    fn without_the_check_a_route_per_host_then_bridge_then_pod() {
        let s = settings(false, true);
        assert!(!per_request_routing(&s));
        let (c, id) = config(&routes(), &s);
        assert_eq!(
            live_hosts(&c).into_iter().collect::<Vec<_>>(),
            [
                (
                    "app-42-0.cloud.sdu.dk".to_owned(),
                    "10.0.0.1:8888".to_owned()
                ),
                (
                    "app-42-1.cloud.sdu.dk".to_owned(),
                    "[fd00::2]:8888".to_owned()
                ),
            ]
        );
        let host_steps = steps(&c)[0]["handle"][0]["routes"].as_array().unwrap();
        assert_eq!(host_steps.len(), 2);
        assert_eq!(
            host_steps[0]["match"][0]["path"],
            json!(["/.volcano-runner/*"])
        );
        assert_ne!(
            config(&routes()[..1], &s).1,
            id,
            "the marker follows the routes"
        );
        assert_eq!(config(&routes(), &s).1, id);
    }

    #[test]
    fn without_the_check_a_bridges_only_host_is_bridged_and_answers_404_otherwise() {
        let mut routes = routes();
        routes[1].backend.port = 0;
        let (c, _) = config(&routes, &settings(false, true));
        assert_eq!(
            live_hosts(&c)
                .get("app-42-1.cloud.sdu.dk")
                .map(String::as_str),
            Some(NO_POD)
        );
        let host_steps = steps(&c)[1]["handle"][0]["routes"].as_array().unwrap();
        assert_eq!(host_steps.len(), 2);
        assert_eq!(
            host_steps[0]["match"][0]["path"],
            json!(["/.volcano-runner/*"])
        );
        assert_eq!(host_steps[1]["handle"][0]["handler"], "static_response");
        assert_eq!(host_steps[1]["handle"][0]["status_code"], 404);
        let text = c.to_string();
        assert!(!text.contains("fd00::2"), "the pod is nowhere: {text}");
    }
}
