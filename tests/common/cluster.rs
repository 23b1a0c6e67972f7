//! Helpers for the cluster tests: a simulator per test, a client built the way the runner builds it
//! (`cluster::connect` with an explicit URL), the runner's namespace, and job objects the simulator's
//! CRD schema and Volcano admission accept.
#![allow(dead_code)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};
use volcano_runner::cluster::capacity::volcano_job_resource;
use volcano_runner::cluster::{self, ClusterConfig, ClusterTarget, Role, Step};
use volcano_runner::sim::{SimConfig, SimHandle, Simulator};

/// The fingerprint annotation the tests' jobs carry (the pipeline uses `<prefix>submissionHash`).
pub const FINGERPRINT: &str = "ucloud.dk/submissionHash";

/// A simulator, a client for it, and a cluster configuration pointing at it.
pub struct Env {
    pub sim: SimHandle,
    pub client: kube::Client,
    pub config: ClusterConfig,
}

/// A simulator with a stopped clock and fast retries (a few seconds of budget at most).
pub async fn start() -> Env {
    start_with(|_| {}).await
}

/// Like [`start`], with changes to the cluster configuration.
pub async fn start_with(f: impl FnOnce(&mut ClusterConfig)) -> Env {
    let sim = Simulator::start(SimConfig::for_tests())
        .await
        .expect("simulator starts");
    let mut config = ClusterConfig {
        target: ClusterTarget::try_from(sim.url()).expect("the simulator's URL is a target"),
        namespace: "volcano-runner".into(),
        request_timeout: Duration::from_secs(2),
        ..ClusterConfig::default()
    };
    config.retry.max_elapsed = Duration::from_secs(3);
    config.retry.min_delay = Duration::from_millis(20);
    config.retry.max_delay = Duration::from_millis(200);
    f(&mut config);
    config.validate().expect("test configuration is valid");
    let client = cluster::connect(&config)
        .await
        .expect("client for the simulator");
    create_namespace(&client, &config.namespace).await;
    Env {
        sim,
        client,
        config,
    }
}

/// Creates a namespace (it must not exist).
pub async fn create_namespace(client: &kube::Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    api.create(&PostParams::default(), &ns)
        .await
        .expect("namespace created");
}

/// A small VolcanoJob labelled as managed by volcano-runner, carrying `fingerprint`.
pub fn vcjob_value(ns: &str, name: &str, fingerprint: &str, command: &[&str]) -> Value {
    json!({
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {
            "name": name, "namespace": ns,
            "labels": {"app.kubernetes.io/managed-by": "volcano-runner"},
            "annotations": {FINGERPRINT: fingerprint}
        },
        "spec": {
            "schedulerName": "volcano", "minAvailable": 1, "queue": "default",
            "plugins": {"env": [], "svc": []},
            "tasks": [{"name": "job", "replicas": 1, "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "user-job", "image": "busybox:1.36", "command": command,
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                                  "limits": {"cpu": "100m", "memory": "128Mi"}}}]
            }}}]
        }
    })
}

/// The VolcanoJob as the primary step.
pub fn vcjob(ns: &str, name: &str, fingerprint: &str) -> Step {
    Step::from_value(
        vcjob_value(ns, name, fingerprint, &["sleep", "3600"]),
        Role::Primary,
    )
    .expect("valid step")
}

pub fn namespace_step(name: &str) -> Step {
    Step::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
        Role::Shared,
    )
    .unwrap()
}

/// A namespace-wide baseline policy (shared by the owner's jobs).
pub fn baseline_policy(ns: &str) -> Step {
    Step::from_value(
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": "baseline", "namespace": ns},
               "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}),
        Role::Shared,
    )
    .unwrap()
}

/// A headless Service for the job (a companion).
pub fn service(ns: &str, name: &str) -> Step {
    Step::from_value(
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": ns},
               "spec": {"clusterIP": "None", "selector": {"volcano.sh/job-name": name},
                        "ports": [{"name": "web", "port": 8080}]}}),
        Role::Companion,
    )
    .unwrap()
}

/// A ConfigMap for the job (a companion).
pub fn configmap(ns: &str, name: &str) -> Step {
    Step::from_value(
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": ns},
               "data": {"hostnames.txt": "j-1-job-0.j-1\n"}}),
        Role::Companion,
    )
    .unwrap()
}

/// The VolcanoJobs API of a namespace.
pub fn jobs(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &volcano_job_resource())
}

/// Waits (real time, bounded by `limit`) until `f` holds, for things another task does (a watch
/// delivering an event, a lease round). Returns how long it took.
pub async fn eventually<F, Fut>(what: &str, limit: Duration, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    loop {
        if f().await {
            return start.elapsed();
        }
        if start.elapsed() > limit {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
