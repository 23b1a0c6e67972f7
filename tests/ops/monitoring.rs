//! The monitoring kit in deploy/monitoring against what a runner really serves: every metric the alerts
//! and the dashboard query is on a running runner's /metrics (with a job run through it, so the label
//! values the rules select on are the ones it writes), the ServiceMonitor finds the metrics Service and
//! its port, and every metric docs/ops.md lists is served or documented as conditional.

use crate::ops_common;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;
use volcano_runner::messages::v1::JobState;
use volcano_runner::ops::Ops;

use ops_common::fleet::{Fleet, sleeping_job};
use ops_common::*;

/// Metric names in a PromQL expression: ours and the standard process ones.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let pattern = regex::Regex::new(r"\b(volcano_runner_[a-z_]+|process_[a-z_]+)\b").unwrap();
    pattern
        .find_iter(expr)
        .map(|m| m.as_str().to_owned())
        .collect()
}

/// The families of an exposition (`# TYPE name kind`) and the sample names each one serves.
fn served_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(family), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            "info" => &["_info"],
            _ => &[""],
        };
        // The family's own name (as docs name a histogram) and its samples' names.
        names.insert(family.to_owned());
        for suffix in suffixes {
            names.insert(format!("{family}{suffix}"));
        }
    }
    names
}

/// The rules' and the dashboard's expressions, with where each comes from.
fn kit_expressions() -> Vec<(String, String)> {
    let objects = render("monitoring");
    let mut exprs = Vec::new();
    let rule = find(&objects, "PrometheusRule", "volcano-runner");
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["alert"].as_str().unwrap_or("record").to_owned();
            exprs.push((name, rule["expr"].as_str().unwrap().to_owned()));
        }
    }
    let dashboard = find(&objects, "ConfigMap", "volcano-runner-dashboard");
    let json: Value =
        serde_json::from_str(dashboard["data"]["volcano-runner.json"].as_str().unwrap())
            .expect("the dashboard is JSON");
    for panel in json["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            exprs.push((
                format!("panel {:?}", panel["title"].as_str().unwrap()),
                target["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    exprs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_kit_and_the_docs_use_is_served() {
    let ops = Ops::new();
    let (addr, stop) = serve(&ops).await;
    // With a cap, so the capacity gauges are there (they are absent without one).
    let mut fleet = Fleet::start("monitoring-kit", ops.clone(), |c| {
        c.cluster.max_active_jobs = Some(50);
    })
    .await;
    fleet
        .submit(&sleeping_job("kit-1", 120, Some(Duration::from_secs(3600))))
        .await;
    fleet
        .wait_state("kit-1", JobState::Running, Some(Duration::from_secs(1)))
        .await;
    fleet
        .wait_state("kit-1", JobState::Success, Some(Duration::from_secs(30)))
        .await;
    // A readiness probe, as the kubelet makes.
    let _ = http_get(addr, "/readyz").await;
    let (status, _, exposition) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    fleet.stop().await;
    stop.cancel();
    let served = served_names(&exposition);

    // The process metrics are there, under their standard names.
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(served.contains(name), "{name} is not served");
    }

    // A few series exist only from their first occurrence (docs/ops.md says which): the kit may use them.
    let ops_md = std::fs::read_to_string(root().join("docs/ops.md")).unwrap();
    let from_first: BTreeSet<String> = ops_md
        .lines()
        .filter(|l| l.starts_with("| `volcano_runner_") && l.contains("from the first"))
        .flat_map(|l| metric_names(l.split('|').nth(1).unwrap()))
        .collect();
    let mut missing = Vec::new();
    for (origin, expr) in kit_expressions() {
        for name in metric_names(&expr) {
            if !served.contains(&name) && !from_first.contains(&name) {
                missing.push(format!("{origin}: {name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "used by deploy/monitoring but not served: {missing:#?}"
    );

    // The label values the alerts select on are ones the runner writes.
    for sample in [
        "volcano_runner_events_published_total{type=\"AccountingTick\"}",
        "volcano_runner_messages_handled_total{outcome=\"ack\"",
    ] {
        let (name, label) = sample.split_once('{').unwrap();
        assert!(
            exposition
                .lines()
                .any(|l| l.starts_with(name) && l.contains(label.trim_end_matches('}'))),
            "no sample {sample} after a job ran"
        );
    }

    // Every metric docs/ops.md lists is served, unless its row says when it is absent.
    let mut undocumented = Vec::new();
    for line in ops_md
        .lines()
        .filter(|l| l.starts_with("| `volcano_runner_"))
    {
        let first_cell = line.split('|').nth(1).unwrap();
        let conditional = line.contains("absent") || line.contains("from the first");
        for name in metric_names(first_cell) {
            if !served.contains(&name) && !conditional {
                undocumented.push(name);
            }
        }
    }
    assert!(
        undocumented.is_empty(),
        "listed in docs/ops.md, not served and not said to be conditional: {undocumented:?}"
    );
}

/// The check above can fail: a misspelt metric in an expression is found.
#[test]
fn a_metric_that_is_not_served_is_found() {
    let served = served_names(
        "# TYPE volcano_runner_ready gauge\n# TYPE volcano_runner_messages_handled counter\n",
    );
    let used = metric_names(
        "sum(rate(volcano_runner_messages_handeld_total[5m])) and volcano_runner_ready",
    );
    let missing: Vec<_> = used.difference(&served).collect();
    assert_eq!(missing, ["volcano_runner_messages_handeld_total"]);
    assert!(served.contains("volcano_runner_messages_handled_total"));
}

/// proxy-sync in every proxy pod (deploy/proxy) is scraped too: the PodMonitor selects the proxy pods by
/// their labels, in their namespace, on the proxy-sync container's metrics port, which the proxy's
/// NetworkPolicy lets in.
#[test]
fn the_pod_monitor_scrapes_proxy_sync_in_every_proxy_pod() {
    let kit = render("monitoring");
    let proxy = render("proxy");
    let monitor = find(&kit, "PodMonitor", "volcano-runner-proxy");
    let deployment = find(&proxy, "Deployment", "volcano-runner-proxy");
    let template = &deployment["spec"]["template"];
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap();
    assert!(!selector.is_empty());
    for (key, value) in selector {
        assert_eq!(
            &template["metadata"]["labels"][key], value,
            "the proxy pods lack label {key}"
        );
    }
    let namespace = deployment["metadata"]["namespace"].as_str().unwrap();
    assert!(
        monitor["spec"]["namespaceSelector"]["matchNames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == namespace)
    );
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["path"], "/metrics");
    let containers = template["spec"]["containers"].as_array().unwrap();
    let sync = containers
        .iter()
        .find(|c| c["name"] == "proxy-sync")
        .expect("a proxy-sync container");
    let port = sync["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == endpoint["port"])
        .unwrap_or_else(|| panic!("proxy-sync has no port {}", endpoint["port"]));
    let number = port["containerPort"].as_u64().unwrap();
    // The port proxy-sync serves /metrics on: `[ops] listen`, which the container sets through its
    // environment (unset in the configuration, it would be loopback outside a pod).
    let listen = sync["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "VOLCANO_RUNNER_OPS__LISTEN")
        .and_then(|e| e["value"].as_str())
        .expect("proxy-sync's container sets VOLCANO_RUNNER_OPS__LISTEN");
    assert!(
        listen.ends_with(&format!(":{number}")),
        "proxy-sync serves /metrics on {listen}, not {number}"
    );
    let policy = find(&proxy, "NetworkPolicy", "volcano-runner-proxy-sync");
    assert!(
        policy["spec"]["ingress"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|rule| rule["ports"].as_array().cloned().unwrap_or_default())
            .any(|p| p["port"].as_u64() == Some(number)),
        "the proxy's NetworkPolicy does not let Prometheus reach {number}"
    );
}

#[test]
fn the_service_monitor_finds_the_metrics_service() {
    let kit = render("monitoring");
    let base = render("base");
    let monitor = find(&kit, "ServiceMonitor", "volcano-runner");
    let service = find(&base, "Service", "volcano-runner-metrics");
    let labels = &service["metadata"]["labels"];
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&labels[key], value, "the Service lacks label {key}");
    }
    let namespace = service["metadata"]["namespace"].as_str().unwrap();
    assert!(
        monitor["spec"]["namespaceSelector"]["matchNames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == namespace)
    );
    let endpoint = &monitor["spec"]["endpoints"][0];
    let ports: Vec<&str> = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert!(
        ports.contains(&endpoint["port"].as_str().unwrap()),
        "{ports:?}"
    );
    assert_eq!(endpoint["path"], "/metrics");
    // Every alert tells a person what to do.
    let rules = find(&kit, "PrometheusRule", "volcano-runner");
    for rule in rules["spec"]["groups"][0]["rules"].as_array().unwrap() {
        assert!(
            rule["annotations"]["summary"].is_string(),
            "{}",
            rule["alert"]
        );
        assert!(rule["labels"]["severity"].is_string(), "{}", rule["alert"]);
    }
}
