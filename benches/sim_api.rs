//! Throughput of the cluster simulator through the real kube client over loopback HTTP: create and
//! get of 10,000 VolcanoJobs (the Appendix A job), concurrently as a runner fleet would, and the list
//! of all of them. Each sample starts a fresh simulator, so samples do not pile up jobs.

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures::{StreamExt, TryStreamExt};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use serde_json::{Value, json};
use volcano_runner::sim::api::WriteOptions;
use volcano_runner::sim::cluster::Cluster;
use volcano_runner::sim::{SimConfig, SimHandle, Simulator};

const JOBS: usize = 10_000;
const CONCURRENCY: usize = 64;

fn job(name: &str) -> DynamicObject {
    let container = json!({
        "name": "user-job", "image": "ubuntu:22.04", "command": ["/bin/bash", "-c", "sleep 600"],
        "resources": {"limits": {"cpu": "2000m", "memory": "4Gi"}, "requests": {"cpu": "2000m", "memory": "4Gi"}},
        "workingDir": "/work",
        "volumeMounts": [{"name": "data", "mountPath": "/work", "subPath": "home/alice/Jobs/App/42"}]});
    let spec = json!({
        "restartPolicy": "Never", "automountServiceAccountToken": false,
        "tolerations": [{"effect": "NoSchedule", "key": "sducloud", "operator": "Equal", "value": "apps"}],
        "containers": [container],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "cephfs"}}]});
    let v: Value = json!({
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": name, "namespace": "bench", "annotations": {"ucloud.dk/maxTime": "3600000", "ucloud.dk/user": "alice"}},
        "spec": {"schedulerName": "volcano", "minAvailable": 1, "queue": "default", "maxRetry": 0,
                 "plugins": {"env": [], "svc": []},
                 "tasks": [{"name": "job", "replicas": 1, "template": {"spec": spec}}]}
    });
    serde_json::from_value(v).unwrap()
}

fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("batch.volcano.sh", "v1alpha1", "Job"),
        "jobs",
    )
}

async fn fresh() -> (SimHandle, Api<DynamicObject>) {
    let mut cfg = SimConfig::for_tests();
    cfg.events = true;
    let sim = Simulator::start(cfg).await.unwrap();
    let client = sim.client().unwrap();
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "bench"}})).unwrap(),
    )
    .await
    .unwrap();
    (sim, Api::namespaced_with(client, "bench", &resource()))
}

async fn create_and_get(api: &Api<DynamicObject>, n: usize, concurrency: usize) {
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = format!("j-{i}");
                api.create(&PostParams::default(), &job(&name)).await?;
                api.get(&name).await
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<_>>()
        .await
        .expect("creates and gets succeed");
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("sim");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(60));

    group.throughput(Throughput::Elements(JOBS as u64));
    group.bench_function("create_and_get_10000_vcjobs_concurrent", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (sim, api) = fresh().await;
                    let t = Instant::now();
                    create_and_get(&api, JOBS, CONCURRENCY).await;
                    total += t.elapsed();
                    sim.shutdown().await;
                }
                total
            })
        })
    });

    group.throughput(Throughput::Elements(1_000));
    group.bench_function("create_and_get_1000_vcjobs_one_at_a_time", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (sim, api) = fresh().await;
                    let t = Instant::now();
                    create_and_get(&api, 1_000, 1).await;
                    total += t.elapsed();
                    sim.shutdown().await;
                }
                total
            })
        })
    });

    // The same jobs straight into the API layer and model, without HTTP or the client: what the
    // simulator itself costs per create (about ten writes each: the job, its PodGroup, the svc
    // plugin's three objects, statuses, events).
    group.throughput(Throughput::Elements(JOBS as u64));
    group.bench_function("create_10000_vcjobs_in_process", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let cfg = SimConfig::for_tests();
                let model = volcano_runner::sim::volcano::ModelConfig {
                    nodes: cfg.nodes.clone(),
                    default_run: cfg.default_run,
                    image_pull_failure_marker: cfg.image_pull_failure_marker.clone(),
                    pod_start_delay: cfg.pod_start_delay,
                    pod_termination_delay: cfg.pod_termination_delay,
                    status_report_delay: cfg.status_report_delay,
                    overcommit_factor: cfg.overcommit_factor,
                    proportion: cfg.proportion,
                    events: true,
                    storage_dir: None,
                };
                let mut cluster = Cluster::new(
                    cfg.watch_history,
                    1,
                    "2026-01-01T00:00:00Z".parse().unwrap(),
                    model,
                );
                let opts = WriteOptions::default();
                cluster
                    .core
                    .create(
                        cluster.core.ids.namespaces,
                        "",
                        json!({"metadata": {"name": "bench"}}),
                        &opts,
                    )
                    .unwrap();
                cluster.settle();
                let jobs: Vec<Value> = (0..JOBS)
                    .map(|i| serde_json::to_value(job(&format!("j-{i}"))).unwrap())
                    .collect();
                let t = Instant::now();
                for j in jobs {
                    cluster
                        .core
                        .create(cluster.core.ids.jobs, "bench", j, &opts)
                        .unwrap();
                    cluster.settle();
                }
                total += t.elapsed();
            }
            total
        })
    });

    group.throughput(Throughput::Elements(JOBS as u64));
    group.bench_function("list_10000_vcjobs", |b| {
        let (sim, api) = rt.block_on(async {
            let (sim, api) = fresh().await;
            create_and_get(&api, JOBS, CONCURRENCY).await;
            (sim, api)
        });
        b.iter(|| {
            rt.block_on(async {
                assert_eq!(
                    api.list(&ListParams::default()).await.unwrap().items.len(),
                    JOBS
                )
            })
        });
        rt.block_on(sim.shutdown());
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
