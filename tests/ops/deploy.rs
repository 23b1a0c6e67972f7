//! The deploy manifests: every rendered object is a valid object of its type, the pieces reference each
//! other correctly, the Deployment starts the runner with a configuration that loads and matches the
//! probes, ports and grace period, the pod is locked down, KEDA scales on the submit queue over HTTP, and
//! the base applies cleanly to the simulator.

use crate::ops_common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;
use volcano_runner::volcano::Queue;

use ops_common::*;

/// The directories under deploy/ that Kustomize renders.
const DIRS: [&str; 6] = [
    "base",
    "proxy",
    "scheduling",
    "monitoring",
    "overlays/dev",
    "overlays/prod",
];

/// The renderings with a runner Deployment in them.
const RUNNER_DIRS: [&str; 3] = ["base", "overlays/dev", "overlays/prod"];

/// Kustomize folds long base64 values of a Secret over lines; the API server's decoder skips the line
/// breaks (Go's base64 does), the simulator's and k8s-openapi's do not, so they are joined first.
fn unfold_secret_data(object: &Value) -> Value {
    let mut object = object.clone();
    if object["kind"] == "Secret"
        && let Some(data) = object["data"].as_object_mut()
    {
        for value in data.values_mut() {
            let text: String = value
                .as_str()
                .unwrap_or_default()
                .split_whitespace()
                .collect();
            *value = Value::from(text);
        }
    }
    object
}

/// Reads one rendered object into its type (strictly: no key that is not a field of the type). KEDA's
/// objects have no Rust type; their fields are checked where they matter (`keda_*` tests).
fn check_type(object: &Value) -> Result<(), String> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    match (api_version, kind) {
        ("v1", "Namespace") => strict::<Namespace>(object).map(drop),
        ("v1", "ServiceAccount") => strict::<ServiceAccount>(object).map(drop),
        ("v1", "ConfigMap") => strict::<ConfigMap>(object).map(drop),
        ("v1", "Secret") => strict::<Secret>(&unfold_secret_data(object)).map(drop),
        ("v1", "Service") => strict::<Service>(object).map(drop),
        ("apps/v1", "Deployment") => strict::<Deployment>(object).map(drop),
        ("policy/v1", "PodDisruptionBudget") => strict::<PodDisruptionBudget>(object).map(drop),
        ("networking.k8s.io/v1", "NetworkPolicy") => strict::<NetworkPolicy>(object).map(drop),
        ("rbac.authorization.k8s.io/v1", "Role") => strict::<Role>(object).map(drop),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => strict::<RoleBinding>(object).map(drop),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => strict::<ClusterRole>(object).map(drop),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            strict::<ClusterRoleBinding>(object).map(drop)
        }
        ("scheduling.volcano.sh/v1beta1", "Queue") => strict::<Queue>(object).map(drop),
        ("keda.sh/v1alpha1", "ScaledObject" | "TriggerAuthentication")
        | ("monitoring.coreos.com/v1", "ServiceMonitor" | "PodMonitor" | "PrometheusRule") => {
            match object["spec"].is_object() {
                true => Ok(()),
                false => Err("no spec".into()),
            }
        }
        other => Err(format!("unexpected kind {other:?}")),
    }
}

#[test]
fn every_rendered_object_parses_into_its_type() {
    for dir in DIRS {
        let objects = render(dir);
        assert!(!objects.is_empty(), "{dir} renders nothing");
        for object in &objects {
            if let Err(why) = check_type(object) {
                panic!("{dir}: {}: {why}", describe(object));
            }
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            assert!(!name.is_empty(), "{dir}: {} has no name", describe(object));
        }
    }
}

/// The strict reading catches a misplaced key (so the test above can fail).
#[test]
fn the_type_check_catches_a_misplaced_key() {
    let objects = render("base");
    let mut deployment = find(&objects, "Deployment", "volcano-runner").clone();
    check_type(&deployment).unwrap();
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] =
        Value::from("/readyz");
    let err = check_type(&deployment).unwrap_err();
    assert!(err.contains("httpGet.paht"), "{err}");
}

/// Every YAML file under deploy/ (except the broker's definitions and the config sections) is a
/// kustomization, or a resource or patch one of them uses: nothing sits there unchecked.
#[test]
fn every_manifest_file_is_rendered() {
    let mut used = BTreeSet::new();
    for dir in DIRS {
        let base = deploy().join(dir);
        let k = kustomization(&base);
        used.insert(base.join("kustomization.yaml"));
        for r in &k.resources {
            used.insert(base.join(r));
        }
        for p in &k.patches_strategic_merge {
            used.insert(base.join(p));
        }
    }
    let used: BTreeSet<_> = used
        .into_iter()
        .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
        .collect();
    let mut stack = vec![deploy()];
    let mut orphans = Vec::new();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(deploy()).unwrap().to_owned();
            if rel.starts_with("rabbitmq") || rel.starts_with("config.d") {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml")
                && !used.contains(&std::fs::canonicalize(&path).unwrap())
            {
                orphans.push(rel.display().to_string());
            }
        }
    }
    assert!(
        orphans.is_empty(),
        "not used by any kustomization: {orphans:?}"
    );
}

/// The ConfigMap's file is deploy/config.example.toml: Kustomize cannot read outside deploy/base, so the
/// base keeps a copy, and this keeps the copy true.
#[test]
fn the_configmap_is_built_from_the_example_configuration() {
    let example = std::fs::read_to_string(deploy().join("config.example.toml")).unwrap();
    let copy = std::fs::read_to_string(deploy().join("base/config.toml")).unwrap();
    assert!(
        example == copy,
        "deploy/base/config.toml differs from deploy/config.example.toml: run \
         `scripts/assemble-config && cp deploy/config.example.toml deploy/base/config.toml`"
    );
    let objects = render("base");
    let maps: Vec<_> = all(&objects, "ConfigMap");
    assert_eq!(maps.len(), 1);
    assert_eq!(
        maps[0]["data"]["config.toml"].as_str(),
        Some(example.as_str())
    );
}

/// The runner in every rendering starts with a configuration that loads and passes every section's checks.
#[test]
fn the_deployment_configuration_loads() {
    for dir in RUNNER_DIRS {
        let objects = render(dir);
        let config = runner_config(&objects);
        config.ops.check().unwrap_or_else(|e| panic!("{dir}: {e}"));
        config
            .broker
            .check()
            .unwrap_or_else(|e| panic!("{dir}: {e}"));
        config
            .cluster
            .validate()
            .unwrap_or_else(|e| panic!("{dir}: {e}"));
        config
            .pipeline
            .validate()
            .unwrap_or_else(|e| panic!("{dir}: {e}"));
        // The broker URL comes from the Secret, not from the file's default.
        assert_eq!(
            config.broker.url.expose(),
            secret_stand_in("url"),
            "{dir}: the AMQP URL is not taken from the Secret"
        );
        let deployment = find(&objects, "Deployment", "volcano-runner");
        assert_eq!(
            Some(config.cluster.namespace.as_str()),
            deployment["metadata"]["namespace"].as_str(),
            "{dir}: the runner's namespace is not the pod's"
        );
    }
}

fn runner_deployment(objects: &[Value]) -> Deployment {
    strict(find(objects, "Deployment", "volcano-runner")).unwrap()
}

/// Probes, ports and the termination grace period agree with the configuration the runner reads.
#[test]
fn probes_ports_and_grace_period_match_the_configuration() {
    for dir in RUNNER_DIRS {
        let objects = render(dir);
        let config = runner_config(&objects);
        let deployment = runner_deployment(&objects);
        let pod = deployment.spec.unwrap().template.spec.unwrap();
        let container = &pod.containers[0];
        let port = container.ports.as_ref().unwrap()[0].clone();
        // Set in the manifests, not left to the detection of a pod: every interface, for the
        // kubelet's probes and Prometheus.
        let listen = config
            .ops
            .listen
            .unwrap_or_else(|| panic!("{dir}: [ops] listen is set"));
        assert!(listen.ip().is_unspecified(), "{dir}: {listen}");
        assert_eq!(port.container_port, i32::from(listen.port()), "{dir}");
        let name = port.name.clone().unwrap();
        for (probe, path) in [
            (&container.liveness_probe, "/healthz"),
            (&container.readiness_probe, "/readyz"),
            (&container.startup_probe, "/healthz"),
        ] {
            let probe = probe
                .as_ref()
                .unwrap_or_else(|| panic!("{dir}: a probe for {path} is missing"));
            let get = probe.http_get.as_ref().unwrap();
            assert_eq!(get.path.as_deref(), Some(path), "{dir}");
            assert_eq!(get.port, IntOrString::String(name.clone()), "{dir}");
        }
        // /readyz answers within its own cluster timeout, which must fit in the probe's.
        let readiness = container.readiness_probe.as_ref().unwrap();
        let probe_timeout = Duration::from_secs(readiness.timeout_seconds.unwrap_or(1) as u64);
        assert!(config.ops.cluster_check_timeout < probe_timeout, "{dir}");
        // The runner's shutdown grace plus 5 s to release leases and close the broker connection.
        let grace = pod.termination_grace_period_seconds.unwrap();
        assert_eq!(
            Duration::from_secs(grace as u64),
            config.runner.shutdown_grace + Duration::from_secs(5),
            "{dir}: terminationGracePeriodSeconds is not [runner] shutdown_grace + 5 s"
        );
        // The startup probe waits at least as long as the broker's startup timeout.
        let startup = container.startup_probe.as_ref().unwrap();
        let window = startup.period_seconds.unwrap() * startup.failure_threshold.unwrap();
        assert!(
            Duration::from_secs(window as u64) >= config.broker.startup_timeout,
            "{dir}: the startup probe gives up before [broker] startup_timeout"
        );
        let service = find(&objects, "Service", "volcano-runner-metrics");
        assert_eq!(
            service["spec"]["ports"][0]["targetPort"],
            Value::from(name),
            "{dir}"
        );
    }
}

/// Non-root, read-only root filesystem, no privilege escalation, no capabilities, requests and limits.
#[test]
fn the_pod_is_locked_down() {
    for dir in RUNNER_DIRS {
        let objects = render(dir);
        let pod = runner_deployment(&objects)
            .spec
            .unwrap()
            .template
            .spec
            .unwrap();
        let pod_security = pod.security_context.unwrap();
        assert_eq!(pod_security.run_as_non_root, Some(true), "{dir}");
        assert!(pod_security.run_as_user.is_some_and(|u| u > 0), "{dir}");
        assert_eq!(
            pod_security.seccomp_profile.map(|p| p.type_),
            Some("RuntimeDefault".into()),
            "{dir}"
        );
        for container in &pod.containers {
            let sc = container.security_context.as_ref().unwrap();
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{dir}");
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{dir}");
            assert_eq!(sc.run_as_non_root, Some(true), "{dir}");
            let drop = sc.capabilities.as_ref().and_then(|c| c.drop.clone());
            assert_eq!(drop, Some(vec!["ALL".to_owned()]), "{dir}");
            let resources = container.resources.as_ref().unwrap();
            for key in ["cpu", "memory"] {
                assert!(
                    resources.requests.as_ref().unwrap().contains_key(key),
                    "{dir}"
                );
                assert!(
                    resources.limits.as_ref().unwrap().contains_key(key),
                    "{dir}"
                );
            }
        }
        let namespace = find(&objects, "Namespace", "volcano-runner");
        assert_eq!(
            namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
            "restricted"
        );
    }
}

/// The runner tolerates the maintenance windows' taint, `<annotation_prefix>maintenance`, whatever
/// window's id it carries: a runner evicted while a window of every node is listed can come back and
/// lift the taints at its end.
#[test]
fn the_runner_tolerates_the_maintenance_taint() {
    for dir in RUNNER_DIRS {
        let objects = render(dir);
        let config = runner_config(&objects);
        let key = volcano_runner::durable::AnnotationKeys::new(&config.pipeline.annotation_prefix)
            .maintenance_taint();
        let pod = runner_deployment(&objects)
            .spec
            .unwrap()
            .template
            .spec
            .unwrap();
        let tolerated = pod.tolerations.iter().flatten().any(|t| {
            t.key.as_deref() == Some(key.as_str())
                && t.operator.as_deref() == Some("Exists")
                && t.effect.as_deref().is_none_or(|e| e == "NoSchedule")
        });
        assert!(tolerated, "{dir}: {:?}", pod.tolerations);
    }
}

fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = selector.match_expressions.iter().flatten().all(|e| {
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            "In" => value.is_some_and(|v| e.values.iter().flatten().any(|x| x == v)),
            "NotIn" => value.is_none_or(|v| !e.values.iter().flatten().any(|x| x == v)),
            _ => false,
        }
    });
    by_labels && by_expressions
}

/// The pieces point at each other: selectors pick the runner pods, bindings name the ServiceAccount and
/// roles that exist, the pod mounts the generated ConfigMap and reads Secrets that exist (or that docs/ops.md
/// tells the operator to create).
#[test]
fn selectors_and_references_line_up() {
    for dir in RUNNER_DIRS {
        let objects = render(dir);
        let deployment = runner_deployment(&objects);
        let namespace = deployment.metadata.namespace.clone().unwrap();
        let spec = deployment.spec.clone().unwrap();
        let pod_labels = spec.template.metadata.clone().unwrap().labels.unwrap();
        assert!(
            selects(&spec.selector, &pod_labels),
            "{dir}: the Deployment's selector"
        );

        let pdb: PodDisruptionBudget =
            strict(find(&objects, "PodDisruptionBudget", "volcano-runner")).unwrap();
        assert!(selects(
            pdb.spec.as_ref().unwrap().selector.as_ref().unwrap(),
            &pod_labels
        ));
        let service: Service = strict(find(&objects, "Service", "volcano-runner-metrics")).unwrap();
        let service_selector = service.spec.unwrap().selector.unwrap();
        assert!(
            service_selector
                .iter()
                .all(|(k, v)| pod_labels.get(k) == Some(v)),
            "{dir}"
        );
        let policy: NetworkPolicy =
            strict(find(&objects, "NetworkPolicy", "volcano-runner")).unwrap();
        assert!(
            selects(&policy.spec.unwrap().pod_selector.unwrap(), &pod_labels),
            "{dir}"
        );

        let pod = spec.template.spec.unwrap();
        let account = pod.service_account_name.clone().unwrap();
        strict::<ServiceAccount>(find(&objects, "ServiceAccount", &account)).unwrap();
        for (binding_kind, role_kind) in [
            ("RoleBinding", "Role"),
            ("ClusterRoleBinding", "ClusterRole"),
        ] {
            // The proxy pods' bindings are to their own account (tests/ops/proxy_deploy.rs).
            let runner_bindings = all(&objects, binding_kind)
                .into_iter()
                .filter(|b| b["metadata"]["name"] != "volcano-runner-proxy");
            for binding in runner_bindings {
                assert_eq!(binding["roleRef"]["kind"], role_kind, "{dir}");
                find(
                    &objects,
                    role_kind,
                    binding["roleRef"]["name"].as_str().unwrap(),
                );
                let subjects = binding["subjects"].as_array().unwrap();
                assert_eq!(subjects.len(), 1, "{dir}: one subject, the runner");
                assert_eq!(subjects[0]["kind"], "ServiceAccount");
                assert_eq!(subjects[0]["name"], Value::from(account.clone()));
                assert_eq!(subjects[0]["namespace"], Value::from(namespace.clone()));
            }
        }
        for role in all(&objects, "Role") {
            assert_eq!(
                role["metadata"]["namespace"],
                Value::from(namespace.clone())
            );
        }

        let config_volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "config")
            .and_then(|v| v.config_map.clone())
            .unwrap();
        find(&objects, "ConfigMap", &config_volume.name);

        // Secrets: generated in the dev overlay, created by the operator elsewhere (docs/ops.md says how,
        // with exactly these keys).
        let docs = std::fs::read_to_string(ops_common::root().join("docs/ops.md")).unwrap();
        let container = &pod.containers[0];
        for env in container.env.iter().flatten() {
            let Some(secret) = env
                .value_from
                .as_ref()
                .and_then(|f| f.secret_key_ref.as_ref())
            else {
                continue;
            };
            match objects
                .iter()
                .find(|o| o["kind"] == "Secret" && o["metadata"]["name"] == secret.name.as_str())
            {
                Some(s) => assert!(
                    s["data"].get(&secret.key).is_some(),
                    "{dir}: secret {} has no key {}",
                    secret.name,
                    secret.key
                ),
                None => assert!(
                    docs.contains(&format!("secret generic {}", secret.name))
                        && docs.contains(&format!("--from-literal={}=", secret.key)),
                    "{dir}: docs/ops.md does not say how to create secret {} with key {}",
                    secret.name,
                    secret.key
                ),
            }
        }
    }
}

/// KEDA scales the runner Deployment on the submit queue's depth through the management API (HTTP mode,
/// which counts unacknowledged messages), never to zero, with credentials from a Secret.
#[test]
fn keda_scales_on_the_submit_queue_over_http() {
    {
        let dir = "overlays/prod";
        let objects = render(dir);
        let config = runner_config(&objects);
        let scaled = find(&objects, "ScaledObject", "volcano-runner");
        let spec = &scaled["spec"];
        assert_eq!(spec["scaleTargetRef"]["kind"], "Deployment");
        find(
            &objects,
            "Deployment",
            spec["scaleTargetRef"]["name"].as_str().unwrap(),
        );
        let min = spec["minReplicaCount"].as_i64().unwrap();
        let max = spec["maxReplicaCount"].as_i64().unwrap();
        assert!(
            min >= 1,
            "{dir}: scaling to zero would stop the monitoring duty"
        );
        assert!(max >= min, "{dir}");
        let triggers = spec["triggers"].as_array().unwrap();
        assert_eq!(triggers.len(), 1);
        let trigger = &triggers[0];
        let metadata = &trigger["metadata"];
        assert_eq!(trigger["type"], "rabbitmq");
        assert_eq!(
            metadata["protocol"], "http",
            "{dir}: AMQP mode does not count unacked messages"
        );
        assert_eq!(metadata["mode"], "QueueLength");
        assert_eq!(
            metadata["queueName"],
            Value::from(config.broker.submit_queue.clone())
        );
        assert_ne!(metadata["excludeUnacknowledged"], "true");
        let value: u32 = metadata["value"].as_str().unwrap().parse().unwrap();
        assert_eq!(
            value, config.runner.max_in_flight,
            "{dir}: target per runner"
        );
        assert!(
            metadata.get("host").is_none(),
            "{dir}: credentials belong in a Secret"
        );
        // Every metadata value is a string, as KEDA's map[string]string wants.
        assert!(
            metadata.as_object().unwrap().values().all(Value::is_string),
            "{dir}"
        );

        let auth_name = trigger["authenticationRef"]["name"].as_str().unwrap();
        let auth = find(&objects, "TriggerAuthentication", auth_name);
        let refs = auth["spec"]["secretTargetRef"].as_array().unwrap();
        let host = refs
            .iter()
            .find(|r| r["parameter"] == "host")
            .expect("host from a Secret");
        let docs = std::fs::read_to_string(ops_common::root().join("docs/ops.md")).unwrap();
        assert!(
            docs.contains(&format!(
                "secret generic {}",
                host["name"].as_str().unwrap()
            )) && docs.contains(&format!(
                "--from-literal={}=",
                host["key"].as_str().unwrap()
            )),
            "docs/ops.md does not say how to create the management URL secret"
        );
    }
}

/// The Volcano Queue the prod overlay deploys is the one the runner's jobs go to, and it admits them
/// (Open, weight > 0).
#[test]
fn the_volcano_queue_is_the_one_jobs_go_to() {
    let objects = render("overlays/prod");
    let config = runner_config(&objects);
    let queue: Queue = strict(find(&objects, "Queue", &config.pipeline.scheduling.queue)).unwrap();
    assert!(
        queue.metadata.namespace.is_none(),
        "a Queue is cluster-scoped"
    );
    assert!(queue.spec.weight.unwrap_or(1) > 0);
    let rendered = find(&objects, "Queue", &config.pipeline.scheduling.queue);
    assert!(rendered["spec"].get("state").is_none_or(|s| s == "Open"));
}

/// The Volcano scheduler configuration the prod overlay ships is the one the start-time estimates are
/// made for, and the runner's defaults agree with it (issue 45): `sla` in (a waiting time makes a bound,
/// and booked starts need it), `proportion` out as `[monitor] proportion` says, the order and placement
/// plugins the replay models and no others that reorder or place differently; the interactive queue the
/// configuration names is a `fifo` Queue of the rendering, with a waiting time for its jobs.
#[test]
fn the_scheduler_configuration_is_the_one_the_estimates_assume() {
    let objects = render("overlays/prod");
    let config = runner_config(&objects);
    let map: ConfigMap =
        strict(find(&objects, "ConfigMap", "volcano-scheduler-configmap")).unwrap();
    assert_eq!(map.metadata.namespace.as_deref(), Some("volcano-system"));
    let conf = &map.data.unwrap_or_default()["volcano-scheduler.conf"];
    let conf = yaml_docs(conf, std::path::Path::new("volcano-scheduler.conf"));
    let actions: Vec<&str> = conf[0]["actions"]
        .as_str()
        .unwrap()
        .split(',')
        .map(str::trim)
        .collect();
    assert_eq!(actions, ["enqueue", "allocate", "backfill"]);
    let plugins: Vec<&str> = conf[0]["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|tier| tier["plugins"].as_array().unwrap())
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    for wanted in [
        "priority",
        "gang",
        "sla",
        "overcommit",
        "predicates",
        "nodeorder",
    ] {
        assert!(plugins.contains(&wanted), "{wanted} missing: {plugins:?}");
    }
    for unmodelled in ["drf", "binpack", "capacity"] {
        assert!(!plugins.contains(&unmodelled), "{unmodelled}: {plugins:?}");
    }
    assert_eq!(
        config.monitor.proportion,
        plugins.contains(&"proportion"),
        "[monitor] proportion says whether the scheduler runs proportion"
    );
    let scheduling = &config.pipeline.scheduling;
    let interactive = scheduling
        .interactive_queue
        .as_deref()
        .expect("interactive jobs have a queue of their own by default");
    let queue: Queue = strict(find(&objects, "Queue", interactive)).unwrap();
    assert_eq!(queue.spec.dequeue_strategy.as_deref(), Some("fifo"));
    assert_eq!(
        scheduling.interactive_sla_waiting_time,
        Some(jiff::SignedDuration::ZERO),
        "interactive jobs have a waiting time of their own"
    );
    let docs = std::fs::read_to_string(ops_common::root().join("docs/ops.md")).unwrap();
    assert!(
        docs.contains("volcano-scheduler-configmap") && docs.contains("proportion"),
        "docs/ops.md tells the operator about the scheduler configuration"
    );
}

/// The dev overlay: one runner on the embedded simulator, no KEDA and no Volcano objects, a RabbitMQ of
/// its own that the runner's URL points at. The prod overlay: the base with a real image name.
#[test]
fn the_overlays_do_what_they_say() {
    {
        let dev = render("overlays/dev");
        let config = runner_config(&dev);
        assert_eq!(config.cluster.target.to_string(), "sim");
        let deployment = runner_deployment(&dev);
        assert_eq!(deployment.spec.unwrap().replicas, Some(1));
        for kind in ["ScaledObject", "TriggerAuthentication", "Queue"] {
            assert!(all(&dev, kind).is_empty(), "dev has a {kind}");
        }
        let rabbit = find(&dev, "Service", "rabbitmq");
        let secret = all(&dev, "Secret")
            .into_iter()
            .find(|s| {
                s["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .starts_with("volcano-runner-rabbitmq")
            })
            .unwrap();
        let url =
            String::from_utf8(base64_decode(secret["data"]["url"].as_str().unwrap())).unwrap();
        assert!(
            url.contains(&format!(
                "@{}.{}.svc:5672",
                rabbit["metadata"]["name"].as_str().unwrap(),
                rabbit["metadata"]["namespace"].as_str().unwrap()
            )),
            "{url}"
        );
    }
    {
        let prod = render("overlays/prod");
        let deployment = runner_deployment(&prod);
        let image = deployment.spec.unwrap().template.spec.unwrap().containers[0]
            .image
            .clone()
            .unwrap();
        assert!(
            image.contains('/'),
            "prod runs a registry image, not {image}"
        );
        assert!(
            all(&prod, "Secret").is_empty(),
            "prod must not carry credentials"
        );
        // The runners reach the API server and RabbitMQ by address, not any address on their ports
        // (docs/ops.md, "Network policies"); DNS stays open.
        let policy = find(&prod, "NetworkPolicy", "volcano-runner");
        let egress = policy["spec"]["egress"].as_array().unwrap();
        for port in [443, 6443, 5672, 5671] {
            let rule = egress
                .iter()
                .find(|r| {
                    r["ports"]
                        .as_array()
                        .is_some_and(|ps| ps.iter().any(|p| p["port"] == port))
                })
                .unwrap_or_else(|| panic!("no egress rule for port {port}"));
            let to = rule["to"]
                .as_array()
                .unwrap_or_else(|| panic!("port {port} is open to any address: {rule}"));
            assert!(!to.is_empty());
            for peer in to {
                let cidr = peer["ipBlock"]["cidr"].as_str().unwrap_or_default();
                assert!(
                    !cidr.is_empty() && cidr != "0.0.0.0/0",
                    "port {port}: {peer}"
                );
            }
        }
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let mut buffer = 0u32;
    let mut bits = 0;
    for c in text
        .bytes()
        .filter(|c| *c != b'=' && !c.is_ascii_whitespace())
    {
        let v = ALPHABET.iter().position(|a| *a == c).expect("base64") as u32;
        buffer = (buffer << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    out
}

/// The Dockerfile builds in a separate stage and runs the binary as a non-root user on a minimal base,
/// the user the Deployment runs as.
#[test]
fn the_dockerfile_is_multi_stage_and_non_root() {
    let text = std::fs::read_to_string(ops_common::root().join("Dockerfile")).unwrap();
    let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "{froms:?}");
    assert!(froms[0].contains(" AS build"));
    assert!(froms[1].contains("distroless"), "{}", froms[1]);
    assert!(text.contains("--locked"));
    let user = text
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER line");
    let uid: i64 = user.split(':').next().unwrap().parse().unwrap();
    let objects = render("base");
    let pod = runner_deployment(&objects)
        .spec
        .unwrap()
        .template
        .spec
        .unwrap();
    assert_eq!(pod.security_context.unwrap().run_as_user, Some(uid));
    assert!(text.contains(r#"CMD ["run"]"#));
    assert_eq!(
        pod.containers[0].args.as_deref(),
        Some(&["run".to_owned()][..]),
        "the Deployment runs `volcano-runner run`"
    );
}

/// Applies a rendering to a fresh simulator the way `kubectl apply --server-side
/// --field-validation=Strict` does (KEDA's CRDs first, as a cluster with KEDA has them; then the
/// Namespace; then everything else), and reads every object back: each apply must succeed and the stored
/// object must keep every field that was sent (nothing pruned as unknown, nothing dropped).
async fn apply_to_simulator(dir: &str, objects: &[Value]) {
    use kube::api::{Api, DynamicObject, Patch, PatchParams, ValidationDirective};
    use kube::discovery::{Discovery, Scope};
    use volcano_runner::sim::{SimConfig, Simulator};

    let sim = Simulator::start(SimConfig::for_tests()).await.unwrap();
    let client = sim.client().unwrap();
    let params = PatchParams {
        field_manager: Some("kubectl".into()),
        field_validation: Some(ValidationDirective::Strict),
        force: true,
        ..PatchParams::default()
    };
    let crd_path = ops_common::root().join("tests/fixtures/ops/keda-crds.yaml");
    let crds = yaml_docs(&std::fs::read_to_string(&crd_path).unwrap(), &crd_path);
    let crd_api: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    for crd in &crds {
        let name = crd["metadata"]["name"].as_str().unwrap();
        crd_api
            .patch(name, &params, &Patch::Apply(crd))
            .await
            .unwrap_or_else(|e| panic!("CRD {name}: {e}"));
    }
    // Volcano's installation made its namespace (the scheduler's configuration goes there); the
    // simulator, a cluster with Volcano in it, does not list it.
    if objects
        .iter()
        .any(|o| o["metadata"]["namespace"] == "volcano-system")
    {
        volcano_runner::cluster::namespaces::create_if_missing(&client, "volcano-system")
            .await
            .unwrap();
    }
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let mut ordered: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "Namespace")
        .collect();
    ordered.extend(objects.iter().filter(|o| o["kind"] != "Namespace"));
    for object in ordered {
        let object = &unfold_secret_data(object);
        let what = describe(object);
        let (group, version) = match object["apiVersion"].as_str().unwrap().split_once('/') {
            Some((g, v)) => (g.to_owned(), v.to_owned()),
            None => (
                String::new(),
                object["apiVersion"].as_str().unwrap().to_owned(),
            ),
        };
        let gvk =
            kube::api::GroupVersionKind::gvk(&group, &version, object["kind"].as_str().unwrap());
        let (resource, caps) = discovery
            .resolve_gvk(&gvk)
            .unwrap_or_else(|| panic!("{dir}: the simulator does not serve {what}"));
        let name = object["metadata"]["name"].as_str().unwrap();
        let api: Api<DynamicObject> = match (caps.scope, object["metadata"]["namespace"].as_str()) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
            (Scope::Namespaced, None) => {
                panic!("{dir}: {what} is namespaced but names no namespace")
            }
            (Scope::Cluster, None) => Api::all_with(client.clone(), &resource),
            (Scope::Cluster, Some(_)) => {
                panic!("{dir}: {what} is cluster-scoped but names a namespace")
            }
        };
        api.patch(name, &params, &Patch::Apply(object))
            .await
            .unwrap_or_else(|e| panic!("{dir}: applying {what}: {e}"));
        let stored = serde_json::to_value(api.get(name).await.unwrap()).unwrap();
        let mut lost = Vec::new();
        dropped(object, &stored, "", &mut lost);
        assert!(lost.is_empty(), "{dir}: {what} lost {lost:?} when stored");
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn the_renderings_apply_cleanly_to_the_simulator() {
    // deploy/scheduling is applied as part of the prod overlay (alone it has no namespace to go to).
    for dir in RUNNER_DIRS {
        let objects = render(dir);
        apply_to_simulator(dir, &objects).await;
    }
}

/// The apply check can fail: a misspelt field in a KEDA object (a CRD) and in a built-in object are both
/// refused.
#[tokio::test]
async fn the_simulator_apply_catches_unknown_fields() {
    let objects = render("overlays/prod");
    for (kind, pointer) in [
        ("ScaledObject", "/spec"),
        ("Deployment", "/spec/template/spec"),
    ] {
        let mut broken = objects.clone();
        let target = broken.iter_mut().find(|o| o["kind"] == kind).unwrap();
        target.pointer_mut(pointer).unwrap()["replicaCont"] = Value::from(3);
        let outcome =
            tokio::spawn(async move { apply_to_simulator("overlays/prod", &broken).await }).await;
        assert!(
            outcome.is_err(),
            "a misspelt field in a {kind} was accepted"
        );
    }
}

/// The test files that manifests, docs and scripts point readers to exist (a moved test must not leave its
/// manifest comment pointing at nothing).
#[test]
fn every_test_file_a_manifest_or_doc_names_exists() {
    let pattern = regex::Regex::new(r"tests/[A-Za-z0-9_/.-]+\.rs").unwrap();
    let mut missing = Vec::new();
    let mut stack: Vec<PathBuf> = ["deploy", "docs", "scripts", "README.md"]
        .iter()
        .map(|p| root().join(p))
        .collect();
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap().flatten() {
                stack.push(entry.path());
            }
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for found in pattern.find_iter(&text) {
            if !root().join(found.as_str()).exists() {
                missing.push(format!(
                    "{}: {}",
                    path.strip_prefix(root()).unwrap().display(),
                    found.as_str()
                ));
            }
        }
    }
    assert!(missing.is_empty(), "named but missing: {missing:#?}");
}

/// docs/ops.md's table of what the runner may do is the deployed Role and ClusterRole, verb for verb.
#[test]
fn the_permissions_table_in_the_docs_is_the_deployed_rbac() {
    let objects = render("base");
    let mut deployed: BTreeSet<(String, String, String)> = BTreeSet::new();
    for (kind, scope) in [("Role", "own namespace"), ("ClusterRole", "cluster")] {
        for role in all(&objects, kind) {
            for rule in role["rules"].as_array().into_iter().flatten() {
                for resource in rule["resources"].as_array().into_iter().flatten() {
                    for verb in rule["verbs"].as_array().into_iter().flatten() {
                        deployed.insert((
                            scope.to_owned(),
                            resource.as_str().unwrap().to_owned(),
                            verb.as_str().unwrap().to_owned(),
                        ));
                    }
                }
            }
        }
    }
    let documented = permission_table("docs/ops.md", "### What the runner is allowed to do");
    let only_deployed: Vec<_> = deployed.difference(&documented).collect();
    let only_documented: Vec<_> = documented.difference(&deployed).collect();
    assert!(
        only_deployed.is_empty() && only_documented.is_empty(),
        "granted but not in docs/ops.md: {only_deployed:?}\nin docs/ops.md but not granted: {only_documented:?}"
    );
}
