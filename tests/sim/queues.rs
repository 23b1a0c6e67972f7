//! The simulator's model of Volcano's `proportion` plugin: queues are served lowest share first, a queue
//! deserves the cluster by its weight (never more than it requests), and the allocate action skips a
//! queue that holds what it deserves (src/sim/volcano/proportion.rs).

use std::collections::BTreeMap;
use std::time::Duration;

use kube::Api;
use kube::api::{DynamicObject, ListParams, PostParams};
use serde_json::json;
use volcano_runner::sim::{NodeSpec, SimHandle};

use crate::sim_support::{dynamic, jobs, namespace, podgroups, queue, start_with};

const NS: &str = "queues";

fn vcjob(name: &str, queue: &str, runs_s: u32) -> serde_json::Value {
    let resources = json!({"cpu": "1", "memory": "1Gi"});
    json!({
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "schedulerName": "volcano", "minAvailable": 1, "queue": queue,
            "tasks": [{"name": "job", "replicas": 1, "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox:1.36",
                    "command": ["sh", "-c", format!("sleep {runs_s}")],
                    "resources": {"requests": resources, "limits": resources}}]
            }}}]
        }
    })
}

/// Proportion on, one node of `cpu` CPUs, an enqueue over-commit high enough that every waiting gang is enqueued once
/// anything is free (so what decides is the allocate action), and the queues `(name, weight)`.
async fn cluster(cpu: u32, queues: &[(&str, u32)]) -> (SimHandle, kube::Client) {
    let (sim, client) = start_with(|c| {
        c.nodes = vec![NodeSpec {
            name: "n".into(),
            cpu: cpu.to_string(),
            memory: "64Gi".into(),
            gpus: 0,
            max_pods: 110,
            labels: Default::default(),
            taints: Vec::new(),
        }];
        c.pod_start_delay = Duration::ZERO;
        c.events = false;
        c.overcommit_factor = 100.0;
        c.proportion = true;
    })
    .await;
    namespace(&client, NS).await;
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &queue());
    for (name, weight) in queues {
        api.create(
            &PostParams::default(),
            &dynamic(json!({
                "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                "metadata": {"name": name},
                "spec": {"weight": weight, "reclaimable": true}
            })),
        )
        .await
        .unwrap();
    }
    (sim, client)
}

async fn create(client: &kube::Client, job: serde_json::Value) {
    jobs(client, NS)
        .create(&PostParams::default(), &dynamic(job))
        .await
        .unwrap();
}

/// The phase of each job's PodGroup.
async fn phases(client: &kube::Client) -> BTreeMap<String, String> {
    podgroups(client, NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|pg| {
            let job = pg.metadata.owner_references.unwrap_or_default()[0]
                .name
                .clone();
            let phase = pg.data["status"]["phase"]
                .as_str()
                .unwrap_or("Pending")
                .to_string();
            (job, phase)
        })
        .collect()
}

/// How many jobs whose name starts with `prefix` are running.
fn running(phases: &BTreeMap<String, String>, prefix: &str) -> usize {
    phases
        .iter()
        .filter(|(j, p)| j.starts_with(prefix) && p.as_str() == "Running")
        .count()
}

/// Eight CPUs, all held by queue `light` (weight 1) with jobs that end one by one. Eight more jobs wait
/// in `light` and, created after them, eight in `heavy` (weight 3). As the first ones end, `heavy` gets
/// the CPUs until it holds three quarters of the cluster, then `light` gets the rest: 6 and 2, not the 8
/// and 0 the job order alone would give.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heavier_queue_gets_three_times_the_resources_as_jobs_end() {
    let (sim, client) = cluster(8, &[("light", 1), ("heavy", 3)]).await;
    for i in 0..8 {
        create(&client, vcjob(&format!("first-{i}"), "light", 10 * (i + 1))).await;
    }
    sim.advance(Duration::from_secs(2));
    assert_eq!(running(&phases(&client).await, "first-"), 8);
    for i in 0..8 {
        create(&client, vcjob(&format!("light-{i}"), "light", 10_000)).await;
    }
    sim.advance(Duration::from_secs(1));
    for i in 0..8 {
        create(&client, vcjob(&format!("heavy-{i}"), "heavy", 10_000)).await;
    }
    for _ in 0..120 {
        sim.advance(Duration::from_secs(1));
    }
    let now = phases(&client).await;
    assert_eq!(running(&now, "first-"), 0, "{now:?}");
    assert_eq!(
        (running(&now, "heavy-"), running(&now, "light-")),
        (6, 2),
        "heavy (weight 3) holds 6 of 8 CPUs, light (weight 1) 2: {now:?}"
    );
}

/// Four CPUs: queue `a` holds two with long jobs, queue `b` (weight 3) two with jobs that end at 10 s.
/// Two jobs of `a` wait, then two of `b` arrive. When `b`'s first jobs end, `a` deserves only two CPUs
/// and holds them (overused): its jobs, though enqueued first, wait, and `b`'s later ones start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overused_queues_job_waits_while_another_queues_later_job_starts() {
    let (sim, client) = cluster(4, &[("a", 1), ("b", 3)]).await;
    for i in 0..2 {
        create(&client, vcjob(&format!("a-long-{i}"), "a", 10_000)).await;
        create(&client, vcjob(&format!("b-short-{i}"), "b", 10)).await;
    }
    sim.advance(Duration::from_secs(2));
    for i in 0..2 {
        create(&client, vcjob(&format!("a-wait-{i}"), "a", 10_000)).await;
    }
    sim.advance(Duration::from_secs(2));
    for i in 0..2 {
        create(&client, vcjob(&format!("b-late-{i}"), "b", 10_000)).await;
    }
    for _ in 0..30 {
        sim.advance(Duration::from_secs(1));
    }
    let now = phases(&client).await;
    assert_eq!(running(&now, "b-late-"), 2, "{now:?}");
    assert_eq!(running(&now, "a-wait-"), 0, "{now:?}");
    assert_eq!(
        now["a-wait-0"], "Inqueue",
        "enqueued, not allocated: {now:?}"
    );
}
