//! The simulator's model of Volcano's `sla` plugin: a gang whose job carries `sla-waiting-time` and has
//! waited that long is enqueued at once, tried first, and keeps what it could place, so a job that
//! arrives after it cannot take the resources it waits for (src/sim/volcano/sla.rs).

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{ListParams, PostParams};
use serde_json::json;
use volcano_runner::sim::NodeSpec;

use crate::sim_support::{jobs, namespace, podgroups, start_with};

const NS: &str = "sla";

fn vcjob(name: &str, ranks: u32, cpu: u32, runs_s: u32, sla: Option<&str>) -> serde_json::Value {
    let resources = json!({"cpu": cpu.to_string(), "memory": "4Gi"});
    let mut job = json!({
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "annotations": {}},
        "spec": {
            "schedulerName": "volcano", "minAvailable": ranks, "queue": "default",
            "tasks": [{"name": "job", "replicas": ranks, "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox:1.36",
                    "command": ["sh", "-c", format!("sleep {runs_s}")],
                    "resources": {"requests": resources, "limits": resources}}]
            }}}]
        }
    });
    if let Some(wait) = sla {
        job["metadata"]["annotations"]["sla-waiting-time"] = json!(wait);
    }
    job
}

/// Second by second until `until`: when each job's PodGroup left the waiting phases.
async fn starts(
    sim: &volcano_runner::sim::SimHandle,
    client: &kube::Client,
    until: u64,
) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for second in 0..until {
        for pg in podgroups(client, NS)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
        {
            let phase = pg.data["status"]["phase"].as_str().unwrap_or("Pending");
            let job = pg.metadata.owner_references.unwrap_or_default()[0]
                .name
                .clone();
            if !matches!(phase, "Pending" | "Inqueue") {
                out.entry(job).or_insert(second);
            }
        }
        sim.advance(Duration::from_secs(1));
    }
    out
}

/// Two 16-CPU nodes. A one-node job runs for 100 s; a gang of two 16-CPU ranks waits for both nodes; a
/// small job arrives 10 s later and runs for 300 s. Without `sla-waiting-time` the small job takes the
/// idle node and the gang waits for it too (backfill); with it, past its waiting time, the gang is let
/// in and holds the idle node, and starts when the first job ends.
async fn run(sla: Option<&str>) -> BTreeMap<String, u64> {
    let node = |name: &str| NodeSpec {
        name: name.into(),
        cpu: "16".into(),
        memory: "64Gi".into(),
        gpus: 0,
        max_pods: 110,
        labels: Default::default(),
        taints: Vec::new(),
    };
    let (sim, client) = start_with(|c| {
        c.nodes = vec![node("a"), node("b")];
        c.pod_start_delay = Duration::ZERO;
        c.events = false;
    })
    .await;
    namespace(&client, NS).await;
    let api = jobs(&client, NS);
    let create = |v: serde_json::Value| {
        let api = api.clone();
        async move {
            api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
                .await
                .unwrap();
        }
    };
    create(vcjob("j-first", 1, 16, 100, None)).await;
    sim.advance(Duration::from_secs(1));
    create(vcjob("j-gang", 2, 16, 60, sla)).await;
    sim.advance(Duration::from_secs(10));
    create(vcjob("j-small", 1, 4, 300, None)).await;
    starts(&sim, &client, 200).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_past_its_sla_waiting_time_is_not_passed_by_a_job_that_arrives_after_it() {
    let plain = run(None).await;
    assert!(
        plain.contains_key("j-small") && !plain.contains_key("j-gang"),
        "without the annotation the small job backfills the idle node and the gang waits: {plain:?}"
    );
    let sla = run(Some("5s")).await;
    let gang = sla.get("j-gang").copied();
    assert!(
        gang.is_some_and(|s| s <= 95),
        "the gang starts when the first job ends (about 89 s into the run): {sla:?}"
    );
    assert!(
        sla.get("j-small").is_none_or(|s| Some(*s) >= gang),
        "the small job does not start before the gang: {sla:?}"
    );
}
