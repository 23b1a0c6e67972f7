//! What proxy-sync writes for Envoy is loaded with Envoy's own API definitions: the `xds-protos` Python
//! package parses every file strictly (unknown fields fail) into Listener, RouteConfiguration, Cluster
//! and Bootstrap messages (tests/proxy/check_envoy.py), and what it finds is what the table says.
//!
//! scripts/test installs xds-protos; when it is missing this test installs it with pip, and only if pip
//! cannot reach the package index does it skip, saying so.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use volcano_runner::messages::v1::{ProxyAction, ProxyEvent};
use volcano_runner::pipeline::plugins::proxy::target;
use volcano_runner::proxy::envoy::{self, EnvoySettings};
use volcano_runner::proxy::{HostNaming, JobUpdate, RouteTable};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/proxy/check_envoy.py")
}

/// Runs the checker on `dir`: `Ok(found)` or `Err(message)`; `None` when xds-protos cannot be had.
fn check(dir: &Path) -> Option<Result<Value, String>> {
    let run = || {
        Command::new("python3")
            .arg(script())
            .arg(dir)
            .output()
            .expect("python3 runs (scripts/test needs it)")
    };
    let mut out = run();
    if out.status.code() == Some(3) {
        let pip = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "xds-protos"])
            .output()
            .expect("python3 -m pip runs");
        if !pip.status.success() {
            eprintln!(
                "SKIPPED: xds-protos is not installed and pip could not install it (no network?): {}",
                String::from_utf8_lossy(&pip.stderr)
            );
            return None;
        }
        out = run();
    }
    Some(if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).expect("the checker prints JSON"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    })
}

fn event(job: &str, ips: &[&str], domains: &[&str]) -> ProxyEvent {
    ProxyEvent {
        event_id: format!("{job}/proxy/create/x"),
        job_id: job.into(),
        action: ProxyAction::Create as i32,
        targets: (0..)
            .zip(ips)
            .map(|(rank, ip)| target(job, rank, *ip, 8888))
            .collect(),
        domains: domains.iter().map(|d| (*d).to_owned()).collect(),
        timestamp: Some(pbjson_types::Timestamp {
            seconds: 1_800_000_000,
            nanos: 0,
        }),
        sequence: 1,
    }
}

fn temp_dir(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vr-envoy-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn envoy_loads_the_listener_routes_and_clusters_as_written() {
    let dir = temp_dir("ok");
    let mut table = RouteTable::new();
    for e in [
        event("42", &["10.0.0.1", "10.0.0.2"], &["mylink.example.org"]),
        event("43", &["fd00::7"], &[]),
    ] {
        table.apply(JobUpdate::from_event(&e).unwrap());
    }
    let naming = HostNaming {
        prefix: "app-".into(),
        domain: "cloud.sdu.dk".into(),
    };
    let settings = EnvoySettings {
        dir: dir.clone(),
        listen_port: 8443,
        connect_timeout_ms: 5000,
        authz: None,
        bridge: None,
    };
    envoy::write_all(&table, &naming, &settings, "proxy-0").unwrap();
    let Some(found) = check(&dir) else { return };
    let found = found.unwrap_or_else(|e| panic!("Envoy's API definitions refuse the files: {e}"));
    let path = |f: &str| dir.join(f).to_string_lossy().into_owned();
    assert_eq!(
        found,
        json!({
            "bootstrap_lds": path("lds.json"),
            "bootstrap_cds": path("cds.json"),
            "listener_port": 8443,
            "upgrades": ["websocket"],
            "rds_path": path("rds.json"),
            "rds_name": envoy::ROUTE_CONFIG,
            "route_config_name": envoy::ROUTE_CONFIG,
            "filters": ["envoy.filters.http.router"],
            "hosts": {
                "app-42-0.cloud.sdu.dk": "job-42-0",
                "app-42-1.cloud.sdu.dk": "job-42-1",
                "mylink.example.org": "job-42-0",
                "app-43-0.cloud.sdu.dk": "job-43-0",
            },
            "clusters": {
                "job-42-0": ["10.0.0.1:8888"],
                "job-42-1": ["10.0.0.2:8888"],
                "job-43-0": ["fd00::7:8888"],
            },
        })
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The checker is strict: a field Envoy does not know fails it, so the test above can fail.
#[test]
fn a_field_envoy_does_not_know_is_refused() {
    let dir = temp_dir("bad");
    let settings = EnvoySettings {
        dir: dir.clone(),
        listen_port: 8080,
        connect_timeout_ms: 5000,
        authz: None,
        bridge: None,
    };
    let naming = HostNaming {
        prefix: "app-".into(),
        domain: "cloud.sdu.dk".into(),
    };
    let mut table = RouteTable::new();
    table.apply(JobUpdate::from_event(&event("7", &["10.0.0.1"], &[])).unwrap());
    envoy::write_all(&table, &naming, &settings, "proxy-0").unwrap();
    let mut cds: Value =
        serde_json::from_slice(&std::fs::read(dir.join("cds.json")).unwrap()).unwrap();
    cds["resources"][0]["connect_timeout_seconds"] = json!(5);
    std::fs::write(dir.join("cds.json"), cds.to_string()).unwrap();
    let Some(found) = check(&dir) else { return };
    let err = found.expect_err("an unknown field must fail");
    assert!(err.contains("connect_timeout_seconds"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// With `authz_url` and `bridge_url`: the ext_authz filter (an HTTP service at the authz URL, passing
/// the cookie, refusing when the check cannot be made) comes before the router, every host sends
/// `/.volcano-runner/` to the bridge cluster, and both clusters are there; a terminal-only job (port 0)
/// has the bridge route, a 404 of Envoy's own for everything else and no cluster; the check's answer
/// replaces the request's cookie (or removes it) and its routing headers go no further than Envoy;
/// Envoy's definitions load it.
#[test]
fn envoy_loads_the_session_check_and_the_bridge_routes() {
    let dir = temp_dir("authz");
    let mut table = RouteTable::new();
    table.apply(JobUpdate::from_event(&event("42", &["10.0.0.1", "10.0.0.2"], &[])).unwrap());
    let mut terminal = event("43", &["10.0.0.3"], &[]);
    terminal.targets[0].port = 0;
    table.apply(JobUpdate::from_event(&terminal).unwrap());
    let naming = HostNaming {
        prefix: "app-".into(),
        domain: "cloud.sdu.dk".into(),
    };
    let upstream =
        |url: &str| Some(volcano_runner::config::proxy_sync::Upstream::parse(url).unwrap());
    let settings = EnvoySettings {
        dir: dir.clone(),
        listen_port: 8080,
        connect_timeout_ms: 5000,
        authz: upstream("http://127.0.0.1:9901/authz"),
        bridge: upstream("http://127.0.0.1:9902"),
    };
    envoy::write_all(&table, &naming, &settings, "proxy-0").unwrap();
    let Some(found) = check(&dir) else { return };
    let found = found.unwrap_or_else(|e| panic!("Envoy's API definitions refuse the files: {e}"));
    assert_eq!(
        found["filters"],
        json!(["envoy.filters.http.ext_authz", "envoy.filters.http.router"])
    );
    assert_eq!(
        found["authz"],
        json!({
            "uri": "http://127.0.0.1:9901/authz",
            "cluster": envoy::AUTHZ_CLUSTER,
            "path_prefix": "/authz",
            "headers": ["cookie", "origin", "prefix:sec-fetch-", "sec-websocket-key", "upgrade"],
            "upstream_headers": ["prefix x-volcano-runner-", "exact cookie"],
            "failure_mode_allow": false,
        })
    );
    // The check's answer says where the request goes and which cookies pass: those stay in Envoy.
    let removed = json!(["x-volcano-runner-upstream", "x-volcano-runner-cookie"]);
    assert_eq!(
        found["removed_for_pod"],
        json!({
            "app-42-0.cloud.sdu.dk": removed,
            "app-42-1.cloud.sdu.dk": removed,
        })
    );
    assert_eq!(
        found["bridge_routes"],
        json!({
            "app-42-0.cloud.sdu.dk": envoy::BRIDGE_CLUSTER,
            "app-42-1.cloud.sdu.dk": envoy::BRIDGE_CLUSTER,
            "app-43-0.cloud.sdu.dk": envoy::BRIDGE_CLUSTER,
        })
    );
    assert_eq!(
        found["hosts"],
        json!({
            "app-42-0.cloud.sdu.dk": "job-42-0",
            "app-42-1.cloud.sdu.dk": "job-42-1",
            "app-43-0.cloud.sdu.dk": "direct_response 404",
        })
    );
    assert_eq!(
        found["clusters"],
        json!({
            envoy::AUTHZ_CLUSTER: ["127.0.0.1:9901"],
            envoy::BRIDGE_CLUSTER: ["127.0.0.1:9902"],
            "job-42-0": ["10.0.0.1:8888"],
            "job-42-1": ["10.0.0.2:8888"],
        })
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
