//! The simulator's `fifo` queue behaves as Volcano's (`dequeueStrategy: fifo`): nothing behind a gang
//! that waits starts, not even a gang already admitted (the queue is blocked for the session), and the
//! queue moves on as soon as its head ends without ever running (a job failed by its runner, or
//! terminated), not only when it is deleted (src/sim/volcano/scheduler.rs).

use std::time::Duration;

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use volcano_runner::sim::{NodeSpec, SimHandle};

use crate::sim_support::{dynamic, gang_job, jobs, namespace, phase, queue, start_with};

const NS: &str = "fifo";

/// One node of `cpu` CPUs, Volcano's over-commit factor `overcommit`, and the fifo queue `f`.
async fn cluster(cpu: u32, overcommit: f64) -> (SimHandle, kube::Client) {
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
        c.overcommit_factor = overcommit;
    })
    .await;
    namespace(&client, NS).await;
    Api::<DynamicObject>::all_with(client.clone(), &queue())
        .create(
            &PostParams::default(),
            &dynamic(json!({
                "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                "metadata": {"name": "f"},
                "spec": {"weight": 1, "reclaimable": true, "dequeueStrategy": "fifo"}
            })),
        )
        .await
        .unwrap();
    (sim, client)
}

/// A job of `replicas` ranks of `cpu` CPUs in `queue`.
async fn create(client: &kube::Client, name: &str, queue: &str, replicas: i64, cpu: &str) {
    let mut job = gang_job(name, NS, replicas, cpu, &["sleep", "3600"]);
    job["spec"]["queue"] = json!(queue);
    jobs(client, NS)
        .create(&PostParams::default(), &dynamic(job))
        .await
        .unwrap();
}

async fn job_phase(client: &kube::Client, name: &str) -> String {
    phase(&jobs(client, NS).get(name).await.unwrap())
}

/// Ends `name` as the runner does (Volcano's TerminateJob command).
async fn terminate(client: &kube::Client, name: &str) {
    let job = jobs(client, NS).get(name).await.unwrap();
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("bus.volcano.sh", "v1alpha1", "Command"),
        "commands",
    );
    Api::<DynamicObject>::namespaced_with(client.clone(), NS, &ar)
        .create(
            &PostParams::default(),
            &dynamic(json!({
                "apiVersion": "bus.volcano.sh/v1alpha1", "kind": "Command",
                "metadata": {"name": format!("{name}-terminate"), "namespace": NS},
                "action": "TerminateJob",
                "target": {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                           "name": job.name_any(), "uid": job.uid().unwrap()},
            })),
        )
        .await
        .unwrap();
}

/// A gang too large to be admitted heads the fifo queue, a one-CPU job waits behind it on an idle node.
/// Once the gang ends without ever running, the job behind it starts in the next second: not at the next
/// change of capacity (nothing was freed) nor only once the gang is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_queue_moves_on_when_its_head_ends_without_running() {
    let (sim, client) = cluster(4, 1.2).await;
    create(&client, "head", "f", 2, "4").await;
    sim.advance(Duration::from_secs(1));
    create(&client, "small", "f", 1, "1").await;
    for _ in 0..5 {
        sim.advance(Duration::from_secs(1));
    }
    assert_eq!(job_phase(&client, "head").await, "Pending");
    assert_eq!(
        job_phase(&client, "small").await,
        "Pending",
        "nothing overtakes the head of a fifo queue"
    );
    terminate(&client, "head").await;
    for _ in 0..2 {
        sim.advance(Duration::from_secs(1));
    }
    assert_eq!(job_phase(&client, "head").await, "Terminated");
    assert_eq!(
        job_phase(&client, "small").await,
        "Running",
        "the queue moved on once its head ended"
    );
}

/// With a generous over-commit both jobs of the fifo queue are admitted in one session (the queue's
/// capability raised once both wait); the first (four CPUs) does not fit beside what runs, so the second (one CPU, admitted too) does not start either, although it fits.
/// It starts after the first, once the node is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_job_does_not_overtake_a_blocked_one_in_a_fifo_queue() {
    let (sim, client) = cluster(8, 100.0).await;
    create(&client, "hog", "default", 1, "6").await;
    sim.advance(Duration::from_secs(1));
    assert_eq!(job_phase(&client, "hog").await, "Running");
    // Kept out by the queue's capability while both are created, then let in: one session admits both.
    let queues = Api::<DynamicObject>::all_with(client.clone(), &queue());
    let capability =
        |cpu: &str| Patch::Merge(json!({"spec": {"capability": {"cpu": cpu, "memory": "64Gi"}}}));
    queues
        .patch("f", &PatchParams::default(), &capability("1"))
        .await
        .unwrap();
    sim.advance(Duration::from_secs(1));
    create(&client, "big", "f", 1, "4").await;
    create(&client, "small", "f", 1, "1").await;
    sim.advance(Duration::from_secs(1));
    assert_eq!(job_phase(&client, "small").await, "Pending");
    queues
        .patch("f", &PatchParams::default(), &capability("16"))
        .await
        .unwrap();
    for _ in 0..5 {
        sim.advance(Duration::from_secs(1));
    }
    let groups = crate::sim_support::podgroups(&client, NS)
        .list(&Default::default())
        .await
        .unwrap();
    let admitted = groups
        .items
        .iter()
        .filter(|g| g.data["status"]["phase"] == "Inqueue")
        .count();
    assert_eq!(job_phase(&client, "big").await, "Pending");
    assert_eq!(
        job_phase(&client, "small").await,
        "Pending",
        "an admitted job does not start before the blocked one ahead of it"
    );
    assert_eq!(admitted, 2, "both fifo jobs are admitted");
    terminate(&client, "hog").await;
    for _ in 0..3 {
        sim.advance(Duration::from_secs(1));
    }
    assert_eq!(job_phase(&client, "big").await, "Running");
    assert_eq!(job_phase(&client, "small").await, "Running");
}
