//! Proxy-sync instances started in the test process, as `volcano-runner proxy-sync` starts them, with
//! a connection of their own that a test can kill.

use std::path::PathBuf;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use volcano_runner::broker::{Broker, BrokerConfig};
use volcano_runner::ops::health::Condition;
use volcano_runner::ops::{Metrics, Readiness};
use volcano_runner::proxy::{ProxySync, ProxySyncConfig, ProxySyncError, RouteTable, Routes};

use crate::monitor_support::{PATIENCE, World};

/// One running instance.
pub struct Instance {
    pub routes: Routes,
    pub ready: Condition,
    pub envoy_dir: PathBuf,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), ProxySyncError>>,
    broker: Broker,
}

/// Starts an instance named `name` against the world's cluster and vhost, writing Envoy files to a
/// directory of its own.
pub async fn start(w: &World, name: &str) -> Instance {
    start_with(w, name, w.config.broker.clone()).await
}

/// Like [`start`], with a broker configuration of the test's (another user, say).
pub async fn start_with(w: &World, name: &str, broker_config: BrokerConfig) -> Instance {
    start_configured(w, name, broker_config, |_| {}).await
}

/// Like [`start_with`], with `[proxy_sync]` changed by `configure` (Caddy's admin API, say).
pub async fn start_configured(
    w: &World,
    name: &str,
    mut broker_config: BrokerConfig,
    configure: impl FnOnce(&mut ProxySyncConfig),
) -> Instance {
    broker_config.connection_name = format!("proxy-sync-{name}");
    let broker = Broker::connect(broker_config.clone(), CancellationToken::new())
        .await
        .expect("RabbitMQ is reachable");
    let readiness = Readiness::new(Metrics::new());
    let ready = readiness.condition("route table", "not built from the cluster yet");
    // One directory per instance: tests run in parallel in one process, and each removes its directory
    // when it starts and ends (a shared name let one test delete another's files mid-run).
    static INSTANCES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = INSTANCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let envoy_dir =
        std::env::temp_dir().join(format!("vr-proxy-sync-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&envoy_dir);
    let mut config = ProxySyncConfig {
        envoy_dir: envoy_dir.clone(),
        coalesce: Duration::from_millis(20),
        ..ProxySyncConfig::default()
    };
    configure(&mut config);
    let sync = ProxySync::new(
        broker.clone(),
        w.client.clone(),
        w.config.pipeline.clone(),
        w.config.cluster.managed_selector.clone(),
        config,
        name.to_owned(),
        Some(ready.clone()),
    );
    let routes = sync.routes();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(sync.run(shutdown.clone()));
    Instance {
        routes,
        ready,
        envoy_dir,
        shutdown,
        task,
        broker,
    }
}

impl Instance {
    /// Waits until `/readyz` would say the table is ready, then returns the table as it was at that
    /// moment.
    pub async fn until_ready(&self) -> RouteTable {
        let wait = async {
            loop {
                if self.ready.get_err().is_none() {
                    return self.routes.read(RouteTable::clone);
                }
                assert!(!self.task.is_finished(), "the instance stopped");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(PATIENCE, wait)
            .await
            .expect("the instance becomes ready")
    }

    /// Waits until the table satisfies `done`.
    pub async fn until(&self, what: &str, done: impl Fn(&RouteTable) -> bool) {
        let mut changes = self.routes.subscribe();
        let wait = async {
            while !self.routes.read(&done) {
                changes.changed().await.expect("the instance runs");
            }
        };
        tokio::time::timeout(PATIENCE, wait)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
    }

    /// Waits until the Envoy routes written satisfy `done` (the files follow the table within the
    /// coalescing interval).
    pub async fn until_written(
        &self,
        what: &str,
        done: impl Fn(&std::collections::BTreeMap<String, String>) -> bool,
    ) {
        let wait = async {
            while !done(&self.written_hosts()) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(PATIENCE, wait)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
    }

    /// The Envoy route configuration as written: host → where its other paths go (the catch-all route,
    /// the last): a cluster, or `direct_response <status>` for a bridges-only host.
    pub fn written_hosts(&self) -> std::collections::BTreeMap<String, String> {
        let text = std::fs::read(self.envoy_dir.join("rds.json")).expect("rds.json is written");
        let rds: serde_json::Value = serde_json::from_slice(&text).unwrap();
        rds["resources"][0]["virtual_hosts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                let last = v["routes"].as_array().unwrap().last().unwrap();
                let to = match last["route"]["cluster"].as_str() {
                    Some(cluster) => cluster.to_owned(),
                    None => format!("direct_response {}", last["direct_response"]["status"]),
                };
                (v["domains"][0].as_str().unwrap().to_owned(), to)
            })
            .collect()
    }

    /// A crash: the loop stops where it is, nothing is closed politely, the connection just goes (and
    /// with it the instance's queue).
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
        self.broker.close().await;
        let _ = std::fs::remove_dir_all(&self.envoy_dir);
    }

    /// A clean stop.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let result = tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the instance stops");
        result.expect("no panic").expect("no error");
        self.broker.close().await;
        let _ = std::fs::remove_dir_all(&self.envoy_dir);
    }
}

/// Ends a job as the runner's cancel does: the cause first, then the delete.
pub async fn cancel(w: &World, namespace: &str, job_id: &str) {
    let api: kube::Api<volcano_runner::volcano::VolcanoJob> =
        kube::Api::namespaced(w.client.clone(), namespace);
    api.patch(
        &format!("j-{job_id}"),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {
            w.keys.termination_cause.as_str(): "cancelled",
        }}})),
    )
    .await
    .expect("the cause is recorded");
    api.delete(&format!("j-{job_id}"), &Default::default())
        .await
        .expect("the job is deleted");
}

/// The pod IP of each rank of a job, as the simulator holds them.
pub fn pod_ips(w: &World, namespace: &str, job_id: &str, replicas: u32) -> Vec<String> {
    (0..replicas)
        .map(|rank| {
            w.pod(namespace, &format!("j-{job_id}-job-{rank}"))
                .and_then(|p| {
                    p.pointer("/status/podIP")
                        .and_then(|v| v.as_str())
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| panic!("j-{job_id}-job-{rank} has an IP"))
        })
        .collect()
}

/// Every routed job with its ranks' IPs, for comparing with what the cluster runs.
pub fn routed(table: &RouteTable) -> std::collections::BTreeMap<String, Vec<String>> {
    table
        .live()
        .into_iter()
        .map(|(id, r)| {
            (
                id.to_owned(),
                r.ranks.values().map(|b| b.ip.to_string()).collect(),
            )
        })
        .collect()
}
