//! Caddy's configuration from the route table, pushed through Caddy's admin API (`[proxy_sync]
//! caddy_admin`): the proxy that runs on these machines (Debian's `caddy`), for live end-to-end tests and
//! for small installations. Caddy is never restarted: each change is one `POST /load` of the whole
//! configuration, which Caddy applies in place (its listeners stay open).
//!
//! One HTTP server, [`SERVER`], listening on `[proxy_sync] listen_port`, with one route per host name of
//! the table (`<prefix><jobId>-<rank>.<domain>` and each public domain). Each route runs, in order:
//! 1. the session check when `authz_url` is set: Caddy's `forward_auth` (a `reverse_proxy` to the authz
//!    endpoint with the method rewritten to GET and the URI to the endpoint's path, the original URI in
//!    `X-Forwarded-Uri` and the host in `X-Forwarded-Host`, the cookie as sent); a 2xx answer lets the
//!    request on with the answer's `X-Volcano-Runner-Job`, `-Rank` and `-Session`, any other answer
//!    (401, 403, the session's 302) goes to the client as it is;
//! 2. paths under `/.volcano-runner/` to `bridge_url` when it is set;
//! 3. everything else to the rank's pod IP and port. WebSocket upgrades pass through `reverse_proxy`.
//!    A bridges-only rank (a terminal-only job, port 0) has no pod port: everything else is answered
//!    404 by Caddy itself, so no path of its hosts but the bridges' reaches anything.
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

/// The name of the HTTP server in Caddy's configuration.
pub const SERVER: &str = "volcano-runner";
/// The path prefix that goes to the bridges.
pub const BRIDGE_PREFIX: &str = "/.volcano-runner/";
/// What [`live_hosts`] says of a host whose other paths are answered 404 by Caddy (a bridges-only rank).
pub const NO_POD: &str = "404 (bridges only)";
/// The answer to a path of a bridges-only host that is not a bridge's.
const NO_INTERFACE: &str = "This job has no web interface: only its terminal and its logs are served here, under /.volcano-runner/.\n";
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
    let copied: serde_json::Map<String, Value> = [
        copy("X-Volcano-Runner-Job"),
        copy("X-Volcano-Runner-Rank"),
        // The bridges follow the session the check names (crate::proxy::bridge).
        copy("X-Volcano-Runner-Session"),
    ]
    .into_iter()
    .collect();
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

fn route(r: &Route, s: &CaddySettings) -> Value {
    let mut steps = Vec::new();
    if let Some(authz) = &s.authz {
        steps.push(json!({"handle": [forward_auth(authz)]}));
    }
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

/// The whole configuration for `routes`, with its marker.
pub fn config(routes: &[Route], s: &CaddySettings) -> (Value, String) {
    let server = json!({
        "listen": [format!(":{}", s.listen_port)],
        // Plain HTTP: TLS ends in front of the proxy (the ingress), as with Envoy.
        "automatic_https": {"disable": true},
        "routes": routes
            .iter()
            .map(|r| route(r, s))
            // A host without a route (an ended job's) is told so, not answered with Caddy's empty 200.
            .chain([json!({"handle": [{
                "handler": "static_response",
                "status_code": 404,
                "body": "No interactive job is routed at this address (the job may have ended).\n",
            }]})])
            .collect::<Vec<_>>(),
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

    #[test]
    fn a_route_per_host_checked_first_then_bridge_then_pod() {
        let (c, id) = config(&routes(), &settings(true, true));
        let server = &c["apps"]["http"]["servers"][SERVER];
        assert_eq!(server["@id"], json!(id));
        assert_eq!(server["listen"], json!([":8080"]));
        assert_eq!(c["admin"]["listen"], "127.0.0.1:2019");
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
        let steps = server["routes"][0]["handle"][0]["routes"]
            .as_array()
            .unwrap();
        assert_eq!(steps.len(), 3);
        let auth = &steps[0]["handle"][0];
        assert_eq!(auth["upstreams"][0]["dial"], "127.0.0.1:9901");
        assert_eq!(auth["rewrite"], json!({"method": "GET", "uri": "/authz"}));
        assert_eq!(steps[1]["match"][0]["path"], json!(["/.volcano-runner/*"]));
        assert_eq!(
            steps[1]["handle"][0]["upstreams"][0]["dial"],
            "127.0.0.1:9902"
        );
        // Without authz and bridge: straight to the pod.
        let (plain, plain_id) = config(&routes(), &settings(false, false));
        let steps = plain["apps"]["http"]["servers"][SERVER]["routes"][0]["handle"][0]["routes"]
            .as_array()
            .unwrap();
        assert_eq!(steps.len(), 1);
        assert_ne!(id, plain_id, "the marker follows the content");
        assert_eq!(config(&routes(), &settings(false, false)).1, plain_id);
    }

    #[test]
    fn a_bridges_only_host_is_checked_then_bridged_and_answers_404_otherwise() {
        let mut routes = routes();
        routes[1].backend.port = 0;
        let (c, _) = config(&routes, &settings(true, true));
        assert_eq!(
            live_hosts(&c)
                .get("app-42-1.cloud.sdu.dk")
                .map(String::as_str),
            Some(NO_POD)
        );
        let steps = c["apps"]["http"]["servers"][SERVER]["routes"][1]["handle"][0]["routes"]
            .as_array()
            .unwrap();
        assert_eq!(steps.len(), 3);
        assert_eq!(steps[0]["handle"][0]["rewrite"]["uri"], "/authz");
        assert_eq!(steps[1]["match"][0]["path"], json!(["/.volcano-runner/*"]));
        assert_eq!(steps[2]["handle"][0]["handler"], "static_response");
        assert_eq!(steps[2]["handle"][0]["status_code"], 404);
        let text = c.to_string();
        assert!(!text.contains("fd00::2"), "the pod is nowhere: {text}");
    }
}
