//! Whole nodes (`exclusiveNodes`) in the simulator: the anti-affinity the Task plugin renders keeps every
//! rank alone on its node in both directions, and the start estimate knows that a whole-node rank holds
//! its node and waits for an untouched one.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};
use volcano_runner::pipeline::plugins::task::exclusive_affinity;
use volcano_runner::sim::NodeSpec;
use volcano_runner::volcano::PodGroup;

use crate::estimates::queue_entries;
use crate::sim_support::{dynamic, gang_job, jobs, namespace, start_with};

/// A managed job of `ranks` × 1 CPU in `ns` that runs `secs` and ends by `expiry`; whole nodes when
/// `whole`, rendered as the Task plugin renders it.
fn job(name: &str, ns: &str, ranks: i64, secs: u64, expiry: Timestamp, whole: bool) -> Value {
    sized(name, ns, ranks, "1", secs, expiry, whole)
}

fn sized(
    name: &str,
    ns: &str,
    ranks: i64,
    cpu: &str,
    secs: u64,
    expiry: Timestamp,
    whole: bool,
) -> Value {
    let mut j = gang_job(
        name,
        ns,
        ranks,
        cpu,
        &["sh", "-c", &format!("sleep {secs}")],
    );
    j["metadata"]["labels"] = json!({"app.kubernetes.io/managed-by": "volcano-runner"});
    j["metadata"]["annotations"] = json!({
        "ucloud.dk/maxTime": (secs * 1000).to_string(),
        "ucloud.dk/expiry": expiry.as_millisecond().to_string(),
    });
    if whole {
        j["metadata"]["annotations"]["ucloud.dk/exclusiveNodes"] = json!("true");
        let template = &mut j["spec"]["tasks"][0]["template"];
        template["metadata"] = json!({"labels": {"ucloud.dk/exclusiveNodes": "true"}});
        template["spec"]["affinity"] = serde_json::to_value(exclusive_affinity()).unwrap();
    }
    j
}

/// Every pod's node, by pod name (`None` while it waits).
async fn placement(client: &kube::Client) -> BTreeMap<String, Option<String>> {
    Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| {
            (
                p.metadata.name.unwrap_or_default(),
                p.spec.and_then(|s| s.node_name),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_node_ranks_share_their_nodes_with_no_job_and_the_estimate_knows_it() {
    let (sim, client) = start_with(|c| {
        c.nodes = vec![
            NodeSpec::cpu_node("n1"),
            NodeSpec::cpu_node("n2"),
            NodeSpec::cpu_node("n3"),
        ];
        c.pod_start_delay = Duration::ZERO;
    })
    .await;
    for ns in ["alice", "bob"] {
        namespace(&client, ns).await;
    }
    let t0 = sim.now();
    let at = |s: i64| t0 + jiff::SignedDuration::from_secs(s);
    let create = |ns: &'static str, v: Value| {
        let client = client.clone();
        async move {
            jobs(&client, ns)
                .create(&PostParams::default(), &dynamic(v))
                .await
                .unwrap();
        }
    };
    create("bob", job("j-small", "bob", 1, 100, at(100), false)).await;
    sim.advance(Duration::from_secs(1));
    create("alice", job("j-whole", "alice", 2, 60, at(61), true)).await;
    sim.advance(Duration::from_secs(1));
    let placed = placement(&client).await;
    let small = placed["j-small-job-0"].clone().expect("j-small runs");
    let whole: Vec<String> = (0..2)
        .map(|r| {
            placed[&format!("j-whole-job-{r}")]
                .clone()
                .expect("both whole ranks run")
        })
        .collect();
    assert_ne!(whole[0], whole[1], "each rank alone: {placed:?}");
    assert!(
        !whole.contains(&small),
        "not beside another job: {placed:?}"
    );

    // A plain job goes only where no whole-node rank is, even where CPUs are free; a second whole-node
    // job finds no untouched node.
    create("bob", job("j-late", "bob", 1, 100, at(102), false)).await;
    create("bob", sized("j-big", "bob", 1, "15", 30, at(1000), false)).await;
    // A second later, so that it is behind j-big in the queue.
    sim.advance(Duration::from_secs(1));
    create("alice", job("j-whole2", "alice", 1, 30, at(1000), true)).await;
    sim.advance(Duration::from_secs(1));
    let placed = placement(&client).await;
    assert_eq!(placed["j-late-job-0"].as_ref(), Some(&small), "{placed:?}");
    assert_eq!(
        placed["j-big-job-0"], None,
        "15 CPUs are free only beside a whole-node rank: {placed:?}"
    );
    assert_eq!(placed["j-whole2-job-0"], None, "{placed:?}");
    let groups = Api::<PodGroup>::namespaced(client.clone(), "alice")
        .list(&ListParams::default())
        .await
        .unwrap();
    let waiting = groups
        .items
        .iter()
        .find(|g| {
            g.metadata
                .name
                .as_deref()
                .unwrap_or_default()
                .starts_with("j-whole2")
        })
        .expect("its PodGroup");
    let message = serde_json::to_string(&waiting.status).unwrap();
    assert!(message.contains("anti-affinity"), "{message}");

    // The estimates: the whole-node ranks hold their nodes until they end by 61 s; j-small's node has
    // 14 CPUs free until 100 s. Counting only the 1 CPU each whole-node rank asks for would start j-big
    // now; j-whole2 waits for a node nobody uses.
    let entries = queue_entries(&client, sim.now()).await;
    let promised = |id: &str| -> Timestamp {
        let entry = entries
            .iter()
            .find(|e| e.job_id.as_deref() == Some(id))
            .unwrap_or_else(|| panic!("{id} waits: {entries:?}"));
        serde_json::to_value(&entry.estimate).unwrap()["startAt"]
            .as_str()
            .unwrap_or_else(|| panic!("an estimate for {id}: {entry:?}"))
            .parse()
            .unwrap()
    };
    let whole_nodes = |id: &str| {
        entries
            .iter()
            .find(|e| e.job_id.as_deref() == Some(id))
            .map(|e| e.whole_nodes)
    };
    assert_eq!(
        (whole_nodes("big"), whole_nodes("whole2")),
        (Some(false), Some(true))
    );
    assert_eq!(promised("big"), at(61));
    assert_eq!(promised("whole2"), at(61));

    // And they hold: once j-whole has ended, both run on the nodes it had.
    sim.advance(Duration::from_secs(60));
    for (ns, id) in [("bob", "big"), ("alice", "whole2")] {
        let pod = Api::<Pod>::namespaced(client.clone(), ns)
            .get(&format!("j-{id}-job-0"))
            .await
            .unwrap();
        let started = pod
            .status
            .and_then(|s| s.start_time)
            .unwrap_or_else(|| panic!("j-{id} started"))
            .0;
        assert!(
            started <= promised(id),
            "j-{id} started {started}, promised {}",
            promised(id)
        );
        let on = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
        assert!(
            whole.contains(&on),
            "j-{id} on {on}, whole ranks were on {whole:?}"
        );
    }
}
