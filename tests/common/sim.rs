//! Helpers for the simulator tests: start a simulator with a stopped clock, resources for the Volcano
//! kinds, and the job of Appendix A of the UCloud reference.
#![allow(dead_code)]

use std::time::Duration;

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use volcano_runner::sim::{SimConfig, SimHandle, Simulator};

/// A JSON merge patch of the object `name` (what `kubectl patch --type merge` and the runner send): the
/// tests' most common write after a create, here once.
pub async fn merge<K>(api: &Api<K>, name: &str, patch: Value) -> kube::Result<K>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

/// The version a list of `api` is at now: a watch from it sees every change made after this.
pub async fn version_now<K>(api: &Api<K>) -> String
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&kube::api::ListParams::default())
        .await
        .expect("the list")
        .metadata
        .resource_version
        .expect("a list's resourceVersion")
}

/// A watch of `api` with `params` from `version`, as one stream of its events.
pub async fn watch_from<K>(
    api: &Api<K>,
    params: &kube::api::WatchParams,
    version: &str,
) -> futures::stream::BoxStream<'static, kube::Result<kube::api::WatchEvent<K>>>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use futures::StreamExt;
    api.watch(params, version)
        .await
        .expect("the watch opens")
        .boxed()
}

/// A simulator on a free port with a stopped clock, and a client for it.
pub async fn start() -> (SimHandle, Client) {
    start_with(|_| {}).await
}

/// Like [`start`], with changes to the configuration.
pub async fn start_with(f: impl FnOnce(&mut SimConfig)) -> (SimHandle, Client) {
    let mut cfg = SimConfig::for_tests();
    f(&mut cfg);
    let sim = Simulator::start(cfg).await.expect("simulator starts");
    let client = sim.client().expect("client builds");
    (sim, client)
}

pub fn vcjob() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("batch.volcano.sh", "v1alpha1", "Job"),
        "jobs",
    )
}

pub fn podgroup() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("scheduling.volcano.sh", "v1beta1", "PodGroup"),
        "podgroups",
    )
}

pub fn queue() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("scheduling.volcano.sh", "v1beta1", "Queue"),
        "queues",
    )
}

pub fn jobs(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &vcjob())
}

pub fn podgroups(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &podgroup())
}

/// Creates a namespace.
pub async fn namespace(client: &Client, name: &str) {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    api.create(&PostParams::default(), &ns)
        .await
        .expect("namespace created");
}

/// The VolcanoJob of Appendix A (job 42 of user alice, one replica, 2 vCPU / 4 GiB) with a real image and
/// the given command.
pub fn appendix_a_job(name: &str, ns: &str, image: &str, command: &[&str]) -> Value {
    let init = json!({"name": "ucloud-compat", "image": "alpine:3.20", "imagePullPolicy": "IfNotPresent",
        "resources": {"requests": {"cpu": "100m"}}, "command": ["/bin/sh", "-c", "mkdir -p /etc/ucloud && echo ready"],
        "volumeMounts": [{"name": "ucloud-multinode", "mountPath": "/etc/ucloud", "readOnly": false}]});
    let mounts = json!([
        {"name": "data", "mountPath": "/work/x.csv", "subPath": "home/alice/data/x.csv", "readOnly": true},
        {"name": "data", "mountPath": "/work", "subPath": "home/alice/Jobs/App/42", "readOnly": false},
        {"name": "ucloud-multinode", "mountPath": "/etc/ucloud", "readOnly": false},
        {"name": "shm", "mountPath": "/dev/shm"}]);
    let container = json!({
        "name": "user-job", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": command, "env": [],
        "resources": {"limits": {"cpu": "2000m", "memory": "4Gi"}, "requests": {"cpu": "2000m", "memory": "4Gi"}},
        "workingDir": "/work",
        "securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false},
        "volumeMounts": mounts});
    let volumes = json!([
        {"name": "data", "persistentVolumeClaim": {"claimName": "cephfs", "readOnly": false}},
        {"name": "ucloud-multinode", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}}]);
    let pod_spec = json!({
        "restartPolicy": "Never", "automountServiceAccountToken": false,
        "tolerations": [{"effect": "NoSchedule", "key": "sducloud", "operator": "Equal", "value": "apps"}],
        "initContainers": [init], "containers": [container], "volumes": volumes});
    json!({
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": name, "namespace": ns,
                     "annotations": {"ucloud.dk/maxTime": "3600000", "ucloud.dk/user": "alice"}},
        "spec": {
            "schedulerName": "volcano", "minAvailable": 1, "queue": "default", "maxRetry": 0,
            "policies": [], "plugins": {"env": [], "svc": []},
            "tasks": [{
                "name": "job", "replicas": 1, "policies": [],
                "template": {"metadata": {"name": format!("job-{name}"), "annotations": {}}, "spec": pod_spec}
            }]
        }
    })
}

/// A small job with `replicas` pods each asking for `cpu`.
pub fn gang_job(name: &str, ns: &str, replicas: i64, cpu: &str, command: &[&str]) -> Value {
    json!({
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "minAvailable": replicas, "queue": "default", "plugins": {"env": [], "svc": []},
            "tasks": [{"name": "job", "replicas": replicas, "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "user-job", "image": "busybox:1.36", "command": command,
                                "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}, "limits": {"cpu": cpu, "memory": "1Gi"}}}]
            }}}]
        }
    })
}

pub fn dynamic(v: Value) -> DynamicObject {
    serde_json::from_value(v).expect("a DynamicObject")
}

/// The `status.state.phase` of a vcjob.
pub fn phase(job: &DynamicObject) -> String {
    job.data
        .pointer("/status/state/phase")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The status code of a kube API error.
pub fn code(err: &kube::Error) -> u16 {
    match err {
        kube::Error::Api(s) => s.code,
        other => panic!("not an API error: {other:?}"),
    }
}

/// The Status of a kube API error.
pub fn status(err: &kube::Error) -> &kube::core::Status {
    match err {
        kube::Error::Api(s) => s,
        other => panic!("not an API error: {other:?}"),
    }
}

/// Waits (real time, bounded) until `f` holds; for things that happen on another task, such as a
/// watch delivering an event. Simulated time never needs this.
pub async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}
