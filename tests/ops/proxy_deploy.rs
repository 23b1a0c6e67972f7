//! deploy/proxy, the proxy pods, rendered with `kubectl kustomize`: least-privilege RBAC that is the
//! table in docs/cluster.md, pods carrying the labels the per-job NetworkPolicies let in, Envoy and
//! proxy-sync sharing the directory of Envoy's files, and the prod overlay deploying them.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use serde_json::Value;
use volcano_runner::config::Config;

use crate::ops_common::*;

type Grants = BTreeSet<(String, String, String)>;

fn grants(scope: &str, rules: &[k8s_openapi::api::rbac::v1::PolicyRule]) -> Grants {
    let mut out = Grants::new();
    for rule in rules {
        for resource in rule.resources.iter().flatten() {
            for verb in &rule.verbs {
                out.insert((scope.to_owned(), resource.clone(), verb.clone()));
            }
        }
    }
    out
}

fn deployed(objects: &[Value]) -> Grants {
    let cluster: ClusterRole =
        strict(find(objects, "ClusterRole", "volcano-runner-proxy")).unwrap();
    let role: Role = strict(find(objects, "Role", "volcano-runner-proxy")).unwrap();
    assert_eq!(role.metadata.namespace.as_deref(), Some("volcano-runner"));
    let mut g = grants("cluster", cluster.rules.as_deref().unwrap_or_default());
    g.extend(grants(
        "own namespace",
        role.rules.as_deref().unwrap_or_default(),
    ));
    g
}

/// Exactly what proxy-sync needs: list the jobs and pods it builds the table from (and get them: the
/// bridges find a rank's pod and tell an ended job), the logs for the logs bridge, exec for the terminal
/// bridge, list and watch the session records in its own namespace; nothing that writes but the exec.
#[test]
fn the_proxy_may_do_only_what_proxy_sync_does() {
    let objects = render("proxy");
    let want: Grants = [
        ("cluster", "jobs", "get"),
        ("cluster", "jobs", "list"),
        ("cluster", "pods", "get"),
        ("cluster", "pods", "list"),
        ("cluster", "pods/log", "get"),
        ("cluster", "pods/exec", "create"),
        ("own namespace", "configmaps", "list"),
        ("own namespace", "configmaps", "watch"),
    ]
    .into_iter()
    .map(|(a, b, c)| (a.to_owned(), b.to_owned(), c.to_owned()))
    .collect();
    assert_eq!(deployed(&objects), want);
    // Bound to the proxy's own service account, which the pods use.
    let deployment: Deployment =
        strict(find(&objects, "Deployment", "volcano-runner-proxy")).unwrap();
    let spec = deployment.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        spec.service_account_name.as_deref(),
        Some("volcano-runner-proxy")
    );
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        let binding = find(&objects, kind, "volcano-runner-proxy");
        assert_eq!(
            binding["subjects"][0]["name"], "volcano-runner-proxy",
            "{kind}"
        );
        assert_eq!(
            binding["subjects"][0]["namespace"], "volcano-runner",
            "{kind}"
        );
    }
}

/// docs/cluster.md's table of the proxy's permissions is the deployed RBAC, verb for verb.
#[test]
fn the_proxy_permissions_table_in_the_docs_is_the_deployed_rbac() {
    let documented = permission_table("docs/cluster.md", "### The proxy pods' permissions");
    assert_eq!(documented, deployed(&render("proxy")));
}

/// The pods carry [pipeline.network_policy] proxy_pod_labels (what the per-job policies let in, and
/// what the base's proxy egress policy selects); Envoy starts from the bootstrap proxy-sync writes into
/// the volume both mount; the prod overlay deploys them with the runner's image.
#[test]
fn the_pods_are_the_ones_the_job_policies_let_in_and_share_the_envoy_files() {
    let objects = render("proxy");
    let deployment: Deployment =
        strict(find(&objects, "Deployment", "volcano-runner-proxy")).unwrap();
    let template = deployment.spec.unwrap().template;
    let labels: BTreeMap<String, String> = template.metadata.unwrap().labels.unwrap();
    let config = Config::default();
    for (k, v) in &config.pipeline.network_policy.proxy_pod_labels {
        assert_eq!(labels.get(k), Some(v), "the proxy pods carry {k}={v}");
    }
    let base = render("base");
    let egress = find(&base, "NetworkPolicy", "volcano-runner-proxy");
    for (k, v) in egress["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            labels.get(k).map(String::as_str),
            v.as_str(),
            "base egress selects {k}"
        );
    }
    let spec = template.spec.unwrap();
    let container = |name: &str| spec.containers.iter().find(|c| c.name == name).unwrap();
    let sync = container("proxy-sync");
    let args = sync.args.clone().unwrap();
    assert_eq!(args[0], "proxy-sync");
    let dir = &args[args.iter().position(|a| a == "--envoy-dir").unwrap() + 1];
    let envoy = container("envoy");
    let command = envoy.command.clone().unwrap().join(" ");
    assert!(
        command.contains(&format!("envoy -c {dir}/bootstrap.json")),
        "{command}"
    );
    let mount = |c: &k8s_openapi::api::core::v1::Container| {
        c.volume_mounts
            .iter()
            .flatten()
            .find(|m| &m.mount_path == dir)
            .map(|m| m.name.clone())
    };
    assert!(
        mount(sync).is_some() && mount(sync) == mount(envoy),
        "both mount {dir}"
    );
    let env = |name: &str| {
        sync.env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    let port = env("VOLCANO_RUNNER_PROXY_SYNC__LISTEN_PORT").unwrap();
    let envoy_port = envoy.ports.as_ref().unwrap()[0].container_port;
    assert_eq!(
        port,
        envoy_port.to_string(),
        "Envoy listens where proxy-sync says"
    );
    for url in ["AUTHZ_URL", "BRIDGE_URL"] {
        let value = env(&format!("VOLCANO_RUNNER_PROXY_SYNC__{url}")).unwrap();
        volcano_runner::config::proxy_sync::Upstream::parse(&value).unwrap();
    }
    let prod = render("overlays/prod");
    let deployed = find(&prod, "Deployment", "volcano-runner-proxy");
    assert_eq!(
        deployed["spec"]["template"]["spec"]["containers"][0]["image"],
        find(&prod, "Deployment", "volcano-runner")["spec"]["template"]["spec"]["containers"][0]["image"],
        "the prod overlay deploys the proxy with the runner's image"
    );
}
