//! Envoy's configuration from the route table, through Envoy's file-based dynamic configuration: Envoy
//! watches the files its bootstrap names and applies each new version without a restart or a dropped
//! connection.
//!
//! Four files in one directory, each a `DiscoveryResponse` in JSON (Envoy reads `.json` as JSON):
//! - `bootstrap.json`: what Envoy is started with (`envoy -c <dir>/bootstrap.json`): the node, and LDS
//!   and CDS from the two files below. Written once at start.
//! - `lds.json`: one HTTP listener whose connection manager takes its routes from `rds.json` (RDS from a
//!   file), upgrades WebSockets, and ignores the port in the Host header. It does not change with the
//!   routes, so a route change never drains a listener.
//! - `rds.json`: the `RouteConfiguration`: one virtual host per host name of the table
//!   (`<prefix><jobId>-<rank>.<domain>` and each public domain), each to its rank's cluster; a
//!   bridges-only rank's (a terminal-only job, port 0) answers 404 itself (`direct_response`) for every
//!   path but the bridges', so nothing of it reaches the pod.
//! - `cds.json`: one STATIC cluster per routed rank, `job-<jobId>-<rank>`, with the pod's IP and port
//!   (none for a bridges-only rank); and [`AUTHZ_CLUSTER`] and [`BRIDGE_CLUSTER`] when `authz_url` and
//!   `bridge_url` are set.
//!
//! With `authz_url`, every request is first checked by Envoy's `ext_authz` filter (an HTTP service: the
//! check is a request to `authz_url`'s path followed by the original path, with the original Host and
//! the Cookie; a 200 lets it on with the answer's `x-volcano-runner-*` headers and its `cookie`, the
//! request's own without the session cookies, or without any cookie when the answer says
//! `x-envoy-auth-headers-to-remove: cookie`; anything else, the session's 302 included, goes to the
//! client as it is). With `bridge_url`, paths under
//! `/.volcano-runner/` go to the bridges, after the check like everything else.
//!
//! Every file is written to a temporary file in the same directory and renamed over the old one, which
//! is atomic (Envoy never reads half a file) and is what Envoy's file watch reacts to. A file whose
//! content is unchanged is not rewritten. Clusters are written before routes, so a new route never
//! points at a cluster Envoy does not have yet.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::table::{HostNaming, Route, RouteTable};
use crate::config::proxy_sync::Upstream;
use crate::sessions::server::{HEADER_COOKIE, HEADER_UPSTREAM};

/// The name of the listener, the route configuration and the HTTP connection manager's stats.
pub const ROUTE_CONFIG: &str = "volcano-runner-routes";
const LISTENER: &str = "volcano-runner-http";
const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const ROUTES_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const HCM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";
const EXT_AUTHZ_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz";
/// The cluster of the session check (`authz_url`).
pub const AUTHZ_CLUSTER: &str = "volcano-runner-authz";
/// The cluster of the bridges (`bridge_url`).
pub const BRIDGE_CLUSTER: &str = "volcano-runner-bridge";
/// The path prefix that goes to the bridges.
pub const BRIDGE_PREFIX: &str = "/.volcano-runner/";

/// The answer to a path of a bridges-only host that is not a bridge's.
const NO_INTERFACE: &str = "This job has no web interface: only its terminal and its logs are served here, under /.volcano-runner/.\n";

/// The file names, in the directory.
pub const BOOTSTRAP_FILE: &str = "bootstrap.json";
pub const LDS_FILE: &str = "lds.json";
pub const RDS_FILE: &str = "rds.json";
pub const CDS_FILE: &str = "cds.json";

/// What the files say besides the routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoySettings {
    /// Where the files go; Envoy must see the same paths.
    pub dir: PathBuf,
    /// The port of the HTTP listener.
    pub listen_port: u16,
    /// How long Envoy waits for a pod to accept a connection.
    pub connect_timeout_ms: u64,
    /// The session check every request goes through (`authz_url`), if any.
    pub authz: Option<Upstream>,
    /// Where `/.volcano-runner/` paths go (`bridge_url`), if any.
    pub bridge: Option<Upstream>,
}

/// One cluster's name: `job-<jobId>-<rank>`.
pub fn cluster_name(job_id: &str, rank: u32) -> String {
    format!("job-{job_id}-{rank}")
}

fn path_source(path: &Path) -> Value {
    json!({
        "path_config_source": {"path": path.to_string_lossy()},
        "resource_api_version": "V3",
    })
}

/// `bootstrap.json`: the node and where LDS and CDS come from.
pub fn bootstrap(settings: &EnvoySettings, node_id: &str) -> Value {
    json!({
        "node": {"id": node_id, "cluster": "volcano-runner-proxy"},
        "dynamic_resources": {
            "lds_config": path_source(&settings.dir.join(LDS_FILE)),
            "cds_config": path_source(&settings.dir.join(CDS_FILE)),
        },
    })
}

/// A discovery response carrying `resources`, versioned by their content.
fn response(resources: Vec<Value>) -> Value {
    let text = serde_json::to_string(&resources).unwrap_or_default();
    let version = crate::pipeline::names::short_hash(text.as_bytes(), 16);
    json!({"version_info": version, "resources": resources})
}

/// `lds.json`: the HTTP listener, routes from `rds.json`.
pub fn listeners(settings: &EnvoySettings) -> Value {
    let manager = json!({
        "@type": HCM_TYPE,
        "stat_prefix": "volcano_runner",
        "codec_type": "AUTO",
        // Users reach `host:port` as well as `host`; the virtual hosts name only the host.
        "strip_any_host_port": true,
        // Jupyter's kernels, noVNC and terminals speak WebSocket.
        "upgrade_configs": [{"upgrade_type": "websocket"}],
        "rds": {
            "route_config_name": ROUTE_CONFIG,
            "config_source": path_source(&settings.dir.join(RDS_FILE)),
        },
        "http_filters": http_filters(settings),
    });
    response(vec![json!({
        "@type": LISTENER_TYPE,
        "name": LISTENER,
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": settings.listen_port}},
        "filter_chains": [{
            "filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": manager,
            }],
        }],
    })])
}

/// The HTTP filters: the session check when `authz_url` is set, then the router.
fn http_filters(settings: &EnvoySettings) -> Vec<Value> {
    let mut filters = Vec::new();
    if let Some(authz) = &settings.authz {
        filters.push(json!({
            "name": "envoy.filters.http.ext_authz",
            "typed_config": {
                "@type": EXT_AUTHZ_TYPE,
                "transport_api_version": "V3",
                "http_service": {
                    "server_uri": {
                        "uri": format!("http://{}{}", authz.authority(), authz.path),
                        "cluster": AUTHZ_CLUSTER,
                        "timeout": "1s",
                    },
                    // The check's path is this followed by the original path and query.
                    "path_prefix": authz.path.trim_end_matches('/'),
                    "authorization_response": {
                        // The job and rank, and the request's cookies without the session cookies in
                        // place of its own (or, with none left, `x-envoy-auth-headers-to-remove:
                        // cookie`): the session id never reaches a pod.
                        "allowed_upstream_headers": {"patterns": [
                            {"prefix": "x-volcano-runner-"},
                            {"exact": "cookie"},
                        ]},
                    },
                },
                // Host, method and path always go to the check; the session is in the cookie, and
                // where the request comes from in the rest (crate::sessions::origin).
                "allowed_headers": {"patterns": [
                    {"exact": "cookie"},
                    {"exact": "origin"},
                    {"prefix": "sec-fetch-"},
                    {"exact": "sec-websocket-key"},
                    {"exact": "upgrade"},
                ]},
                // A check that cannot be made refuses the request.
                "failure_mode_allow": false,
            },
        }));
    }
    filters.push(json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": ROUTER_TYPE},
    }));
    filters
}

/// `rds.json`: a virtual host per host name.
pub fn route_configuration(routes: &[Route], settings: &EnvoySettings) -> Value {
    let virtual_hosts: Vec<Value> = routes
        .iter()
        .map(|r| {
            let mut to = Vec::new();
            if settings.bridge.is_some() {
                to.push(json!({
                    "match": {"prefix": BRIDGE_PREFIX},
                    "route": {"cluster": BRIDGE_CLUSTER, "timeout": "0s"},
                }));
            }
            if r.backend.bridges_only() {
                to.push(json!({
                    "match": {"prefix": "/"},
                    "direct_response": {"status": 404, "body": {"inline_string": NO_INTERFACE}},
                }));
            } else {
                let mut pod = json!({
                    "match": {"prefix": "/"},
                    // No timeout: notebooks long-poll, and WebSockets stay open for the session.
                    "route": {"cluster": cluster_name(&r.job_id, r.rank), "timeout": "0s"},
                });
                if settings.authz.is_some() {
                    // What the check tells Caddy (Envoy routes by these files) is nothing for the pod.
                    pod["request_headers_to_remove"] = json!([HEADER_UPSTREAM, HEADER_COOKIE]);
                }
                to.push(pod);
            }
            json!({
                "name": r.host,
                "domains": [r.host],
                "routes": to,
            })
        })
        .collect();
    response(vec![json!({
        "@type": ROUTES_TYPE,
        "name": ROUTE_CONFIG,
        "virtual_hosts": virtual_hosts,
    })])
}

/// A cluster of one endpoint: STATIC for an IP address, LOGICAL_DNS for a name.
fn sidecar_cluster(name: &str, to: &Upstream, settings: &EnvoySettings) -> Value {
    let kind = if to.host.parse::<std::net::IpAddr>().is_ok() {
        "STATIC"
    } else {
        "LOGICAL_DNS"
    };
    json!({
        "@type": CLUSTER_TYPE,
        "name": name,
        "type": kind,
        "connect_timeout": format!("{}s", settings.connect_timeout_ms as f64 / 1000.0),
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                "address": to.host,
                "port_value": to.port,
            }}}}]}],
        },
    })
}

/// `cds.json`: a cluster per routed rank, and the check's and the bridges'.
pub fn clusters(table: &RouteTable, settings: &EnvoySettings) -> Value {
    let mut out = Vec::new();
    if let Some(authz) = &settings.authz {
        out.push(sidecar_cluster(AUTHZ_CLUSTER, authz, settings));
    }
    if let Some(bridge) = &settings.bridge {
        out.push(sidecar_cluster(BRIDGE_CLUSTER, bridge, settings));
    }
    for (job_id, routes) in table.live() {
        for (&rank, backend) in routes.ranks.iter().filter(|(_, b)| !b.bridges_only()) {
            let name = cluster_name(job_id, rank);
            out.push(json!({
                "@type": CLUSTER_TYPE,
                "name": name,
                "type": "STATIC",
                "connect_timeout": format!("{}s", settings.connect_timeout_ms as f64 / 1000.0),
                "load_assignment": {
                    "cluster_name": name,
                    "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                        "address": backend.ip.to_string(),
                        "port_value": backend.port,
                    }}}}]}],
                },
            }));
        }
    }
    response(out)
}

/// The three dynamic files for `table`, in the order they are to be written (clusters first).
pub fn render(
    table: &RouteTable,
    naming: &HostNaming,
    settings: &EnvoySettings,
) -> Vec<(&'static str, Value)> {
    vec![
        (CDS_FILE, clusters(table, settings)),
        (
            RDS_FILE,
            route_configuration(&table.routes(naming), settings),
        ),
        (LDS_FILE, listeners(settings)),
    ]
}

/// Why the files could not be written.
#[derive(Debug, thiserror::Error)]
#[error("writing the Envoy configuration {}: {source}", path.display())]
pub struct WriteError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Writes `value` to `dir/name` atomically (a temporary file in `dir`, then a rename), unless the file
/// already holds exactly that. Returns whether it wrote.
pub fn write_atomically(dir: &Path, name: &str, value: &Value) -> Result<bool, WriteError> {
    let path = dir.join(name);
    let err = |source| WriteError {
        path: path.clone(),
        source,
    };
    let mut text = serde_json::to_vec_pretty(value).map_err(|e| err(e.into()))?;
    text.push(b'\n');
    if std::fs::read(&path).is_ok_and(|old| old == text) {
        return Ok(false);
    }
    std::fs::create_dir_all(dir).map_err(err)?;
    // A dot name: Envoy watches only the names it was given, and a crash leaves no file it would read.
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, &text).map_err(err)?;
    std::fs::rename(&tmp, &path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        err(e)
    })?;
    Ok(true)
}

/// Writes every file for `table` (the bootstrap too, so the directory is complete from the first write).
/// Returns how many files changed.
pub fn write_all(
    table: &RouteTable,
    naming: &HostNaming,
    settings: &EnvoySettings,
    node_id: &str,
) -> Result<usize, WriteError> {
    let mut written = 0;
    for (name, value) in render(table, naming, settings) {
        written += usize::from(write_atomically(&settings.dir, name, &value)?);
    }
    written += usize::from(write_atomically(
        &settings.dir,
        BOOTSTRAP_FILE,
        &bootstrap(settings, node_id),
    )?);
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::v1::{ProxyAction, ProxyEvent, ProxyTarget};
    use crate::proxy::table::JobUpdate;

    fn settings(dir: &Path) -> EnvoySettings {
        EnvoySettings {
            dir: dir.to_owned(),
            listen_port: 8080,
            connect_timeout_ms: 2500,
            authz: None,
            bridge: None,
        }
    }

    fn table() -> RouteTable {
        let mut t = RouteTable::new();
        let e = ProxyEvent {
            event_id: "42/proxy/create/x".into(),
            job_id: "42".into(),
            action: ProxyAction::Create as i32,
            targets: vec![
                ProxyTarget {
                    rank: 0,
                    pod_ip: "10.0.0.1".into(),
                    port: 8888,
                    hostname: "j-42-job-0.j-42".into(),
                },
                ProxyTarget {
                    rank: 1,
                    pod_ip: "fd00::2".into(),
                    port: 8888,
                    hostname: "j-42-job-1.j-42".into(),
                },
            ],
            domains: vec!["mylink.example.org".into()],
            timestamp: Some(pbjson_types::Timestamp {
                seconds: 1_800_000_000,
                nanos: 0,
            }),
            sequence: 1,
        };
        t.apply(JobUpdate::from_event(&e).unwrap());
        t
    }

    fn naming() -> HostNaming {
        HostNaming {
            prefix: "app-".into(),
            domain: "cloud.sdu.dk".into(),
        }
    }

    #[test]
    fn routes_and_clusters_follow_the_table() {
        let s = settings(Path::new("/run/envoy"));
        let t = table();
        let rds = route_configuration(&t.routes(&naming()), &s);
        let hosts: Vec<(&str, &str)> = rds["resources"][0]["virtual_hosts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    v["domains"][0].as_str().unwrap(),
                    v["routes"][0]["route"]["cluster"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            hosts,
            [
                ("app-42-0.cloud.sdu.dk", "job-42-0"),
                ("app-42-1.cloud.sdu.dk", "job-42-1"),
                ("mylink.example.org", "job-42-0"),
            ]
        );
        let cds = clusters(&t, &s);
        let c = &cds["resources"][1];
        assert_eq!(c["name"], "job-42-1");
        assert_eq!(
            c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"],
            json!({"address": "fd00::2", "port_value": 8888})
        );
        assert_eq!(c["connect_timeout"], "2.5s");
        let lds = listeners(&s);
        let hcm = &lds["resources"][0]["filter_chains"][0]["filters"][0]["typed_config"];
        assert_eq!(
            hcm["upgrade_configs"],
            json!([{"upgrade_type": "websocket"}])
        );
        assert_eq!(
            hcm["rds"]["config_source"]["path_config_source"]["path"],
            "/run/envoy/rds.json"
        );
        // The version follows the content.
        assert_ne!(
            rds["version_info"],
            route_configuration(&RouteTable::new().routes(&naming()), &s)["version_info"]
        );
    }

    #[test]
    fn with_authz_and_bridge_every_request_is_checked_and_bridge_paths_go_to_the_bridge() {
        let s = EnvoySettings {
            authz: Some(Upstream::parse("http://127.0.0.1:9901/authz").unwrap()),
            bridge: Some(Upstream::parse("http://localhost:9902").unwrap()),
            ..settings(Path::new("/run/envoy"))
        };
        let t = table();
        let lds = listeners(&s);
        let filters =
            &lds["resources"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"];
        assert_eq!(filters[0]["name"], "envoy.filters.http.ext_authz");
        assert_eq!(filters[1]["name"], "envoy.filters.http.router");
        let http = &filters[0]["typed_config"]["http_service"];
        assert_eq!(http["server_uri"]["cluster"], AUTHZ_CLUSTER);
        assert_eq!(http["path_prefix"], "/authz");
        let rds = route_configuration(&t.routes(&naming()), &s);
        let first = &rds["resources"][0]["virtual_hosts"][0]["routes"];
        assert_eq!(first[0]["match"]["prefix"], BRIDGE_PREFIX);
        assert_eq!(first[0]["route"]["cluster"], BRIDGE_CLUSTER);
        assert_eq!(first[1]["route"]["cluster"], "job-42-0");
        let cds = clusters(&t, &s);
        assert_eq!(cds["resources"][0]["name"], AUTHZ_CLUSTER);
        assert_eq!(cds["resources"][0]["type"], "STATIC");
        assert_eq!(cds["resources"][1]["name"], BRIDGE_CLUSTER);
        assert_eq!(cds["resources"][1]["type"], "LOGICAL_DNS");
        assert_eq!(cds["resources"].as_array().unwrap().len(), 4);
    }

    #[test]
    fn a_bridges_only_rank_has_no_cluster_and_answers_404_but_for_the_bridges() {
        let s = EnvoySettings {
            authz: Some(Upstream::parse("http://127.0.0.1:9901/authz").unwrap()),
            bridge: Some(Upstream::parse("http://127.0.0.1:9902").unwrap()),
            ..settings(Path::new("/run/envoy"))
        };
        let mut t = table();
        t.apply(
            JobUpdate::from_event(&ProxyEvent {
                event_id: "43/proxy/create/x".into(),
                job_id: "43".into(),
                action: ProxyAction::Create as i32,
                targets: vec![ProxyTarget {
                    rank: 0,
                    pod_ip: "10.0.0.3".into(),
                    port: 0,
                    hostname: "j-43-job-0.j-43".into(),
                }],
                domains: vec![],
                timestamp: Some(pbjson_types::Timestamp {
                    seconds: 1_800_000_000,
                    nanos: 0,
                }),
                sequence: 1,
            })
            .unwrap(),
        );
        let rds = route_configuration(&t.routes(&naming()), &s);
        let host = rds["resources"][0]["virtual_hosts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "app-43-0.cloud.sdu.dk")
            .expect("the terminal job's host");
        let routes = host["routes"].as_array().unwrap();
        assert_eq!(routes.len(), 2);
        assert_eq!(routes[0]["match"]["prefix"], BRIDGE_PREFIX);
        assert_eq!(routes[0]["route"]["cluster"], BRIDGE_CLUSTER);
        assert_eq!(routes[1]["match"]["prefix"], "/");
        assert_eq!(routes[1]["direct_response"]["status"], 404);
        assert!(routes[1].get("route").is_none(), "{host}");
        let cds = clusters(&t, &s);
        let names: Vec<&str> = cds["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [AUTHZ_CLUSTER, BRIDGE_CLUSTER, "job-42-0", "job-42-1"]
        );
    }

    #[test]
    fn files_are_replaced_whole_and_only_when_they_change() {
        let dir = std::env::temp_dir().join(format!("vr-envoy-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let s = settings(&dir);
        assert_eq!(write_all(&table(), &naming(), &s, "n").unwrap(), 4);
        assert_eq!(write_all(&table(), &naming(), &s, "n").unwrap(), 0);
        assert_eq!(
            write_all(&RouteTable::new(), &naming(), &s, "n").unwrap(),
            2
        );
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 4, "no temporary file is left: {names:?}");
        let cds: Value =
            serde_json::from_slice(&std::fs::read(dir.join(CDS_FILE)).unwrap()).unwrap();
        assert_eq!(cds["resources"], json!([]));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
