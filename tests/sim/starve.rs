//! No starvation of a whole-node or large gang (issue 32): a stream of small jobs keeps arriving on three
//! nodes, never leaving two of them untouched at once (nor two with room for a 12-CPU rank), while a
//! gang of two ranks waits: whole-node ranks, or ranks of 12 of a node's 16 CPUs (no node holds two).
//! With `[monitor] reserve_nodes` the monitor taints the nodes the replay gives the gang once it is past
//! its `sla-waiting-time` (`monitor::reserve`, decided and written here as a monitor pass does, every
//! 10 s of simulated time), the gang is told a bound, and it starts by it. Without, the same stream
//! passes it for as long as the stream lasts: the measured contrast, which shows the test can fail.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use volcano_runner::durable::AnnotationKeys;
use volcano_runner::pipeline::plugins::task::{exclusive_affinity, reservation_toleration};
use volcano_runner::sim::NodeSpec;
use volcano_runner::volcano::PodGroup;

use crate::estimates::{queue_entries_with, reserve_nodes};
use crate::sim_support::{jobs, namespace, start_with};

const NS: &str = "starve";
/// The small jobs: one every `EVERY` seconds from 0 until `STREAM_UNTIL`, each of 3 CPUs, running 60 s
/// of a 120 s limit. About ten run at once, spread over the three nodes by the scheduler.
const EVERY: i64 = 6;
const STREAM_UNTIL: i64 = 1200;
/// The gang arrives once the stream is at its steady state.
const GANG_ARRIVES: i64 = 60;
const GANG: &str = "j-gang";

/// A managed job as the pipeline renders it (the parts the scheduler and the estimates read), with
/// `sla-waiting-time: 1m`, so its ranks tolerate their own job's reservation and the job says so
/// (`reservable`; the Task plugin renders both for every job with a waiting time); whole nodes when
/// `whole`.
fn vcjob(
    name: &str,
    ranks: u32,
    cpu: u32,
    runs_s: i64,
    limit_s: i64,
    whole: bool,
) -> DynamicObject {
    let resources = json!({"cpu": cpu.to_string(), "memory": format!("{}Gi", cpu * 2)});
    let mut annotations = json!({
        "ucloud.dk/maxTime": (limit_s * 1000).to_string(),
        "sla-waiting-time": "1m",
        "ucloud.dk/reservable": "true",
    });
    let mut template = json!({"spec": {
        "restartPolicy": "Never",
        "containers": [{"name": "user-job", "image": "busybox:1.36",
            "command": ["sh", "-c", format!("sleep {runs_s}")],
            "resources": {"requests": resources, "limits": resources}}]
    }});
    let keys = AnnotationKeys::new("ucloud.dk/");
    let id = name.strip_prefix("j-").unwrap();
    template["spec"]["tolerations"] =
        json!([serde_json::to_value(reservation_toleration(&keys, id)).unwrap()]);
    if whole {
        annotations["ucloud.dk/exclusiveNodes"] = json!("true");
        template["metadata"] = json!({"labels": {"ucloud.dk/exclusiveNodes": "true"}});
        template["spec"]["affinity"] = serde_json::to_value(exclusive_affinity()).unwrap();
    }
    serde_json::from_value(json!({
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {
            "name": name, "namespace": NS,
            "labels": {"app.kubernetes.io/managed-by": "volcano-runner"},
            "annotations": annotations
        },
        "spec": {
            "schedulerName": "volcano", "minAvailable": ranks, "queue": "default",
            "tasks": [{"name": "job", "replicas": ranks, "template": template}]
        }
    }))
    .expect("a job object")
}

/// What one run showed.
#[derive(Debug)]
struct Outcome {
    /// Seconds after the start of the run: when the gang started (`None`: not within the run).
    gang_started: Option<i64>,
    /// The bounds the gang was told (in order), and its first estimate of any kind.
    bounds: Vec<i64>,
    first_estimate: Option<(i64, bool)>,
    /// Small jobs created after the gang that started before it (or before the end of the run).
    passed_by: usize,
    /// Reservation taints left on the nodes at the end.
    taints_left: usize,
}

/// The waiting gang: `ranks` ranks of `cpu` CPUs each, running 300 s of a 600 s limit; whole nodes when
/// `whole`.
#[derive(Debug, Clone, Copy)]
struct Gang {
    ranks: u32,
    cpu: u32,
    whole: bool,
}

/// Two whole-node ranks (8 CPUs each asked, all of the node held).
const WHOLE: Gang = Gang {
    ranks: 2,
    cpu: 8,
    whole: true,
};
/// Two ranks of 12 CPUs on 16-CPU nodes, not whole-node: no node holds two of them, and the 4 CPUs
/// beside a rank stay for small jobs.
const LARGE: Gang = Gang {
    ranks: 2,
    cpu: 12,
    whole: false,
};

async fn run(reserve: bool, gang: Gang) -> Outcome {
    let (sim, client) = start_with(|c| {
        c.nodes = vec![
            NodeSpec::cpu_node("n1"),
            NodeSpec::cpu_node("n2"),
            NodeSpec::cpu_node("n3"),
        ];
        c.pod_start_delay = Duration::ZERO;
        c.events = false;
    })
    .await;
    namespace(&client, NS).await;
    let api = jobs(&client, NS);
    let groups = Api::<PodGroup>::namespaced(client.clone(), NS);
    let t0 = sim.now();
    let mut started: BTreeMap<String, i64> = BTreeMap::new();
    let mut created: BTreeMap<String, i64> = BTreeMap::new();
    let mut limits: BTreeMap<String, i64> = BTreeMap::new();
    let mut bounds: Vec<i64> = Vec::new();
    let mut first_estimate = None;
    for second in 0..STREAM_UNTIL + 300 {
        let now = sim.now();
        if second < STREAM_UNTIL && second % EVERY == 0 {
            let name = format!("j-small{second:05}");
            api.create(&PostParams::default(), &vcjob(&name, 1, 3, 60, 120, false))
                .await
                .unwrap();
            created.insert(name.clone(), second);
            limits.insert(name, 120);
        }
        if second == GANG_ARRIVES {
            api.create(
                &PostParams::default(),
                &vcjob(GANG, gang.ranks, gang.cpu, 300, 600, gang.whole),
            )
            .await
            .unwrap();
            created.insert(GANG.into(), second);
            limits.insert(GANG.into(), 600);
        }
        // As the runner's start hook does: the deadline is persisted at the start.
        for pg in groups
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|pg| !volcano_runner::monitor::observe::is_waiting(pg))
        {
            let Some(job) = volcano_runner::monitor::cache::job_of_group(pg) else {
                continue;
            };
            let name = job.name.to_string();
            if started.contains_key(&name) {
                continue;
            }
            let expiry = now.as_millisecond() + limits[&name] * 1000;
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    "ucloud.dk/expiry": expiry.to_string()}}})),
            )
            .await
            .unwrap();
            started.insert(name, second);
        }
        if second % 10 == 0 {
            // A monitor pass: the reservations as decided from what it sees, then the estimates.
            if reserve {
                reserve_nodes(&client, now).await;
            }
            for e in queue_entries_with(&client, now, reserve).await {
                if e.job.as_deref() != Some(GANG) {
                    continue;
                }
                let Some(at) = e.estimate.start_at.as_deref() else {
                    continue;
                };
                let at_s = at.parse::<Timestamp>().unwrap().as_second() - t0.as_second();
                first_estimate.get_or_insert((at_s, e.estimate.bound));
                if e.estimate.bound {
                    bounds.push(at_s);
                }
            }
        }
        sim.advance(Duration::from_secs(1));
    }
    let gang_started = started.get(GANG).copied();
    let passed_by = started
        .iter()
        .filter(|(name, at)| {
            created[name.as_str()] > GANG_ARRIVES && gang_started.is_none_or(|g| **at < g)
        })
        .count();
    let taints_left = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .flat_map(|n| n.spec.iter().flat_map(|s| s.taints.iter().flatten()))
        .filter(|t| t.key == "ucloud.dk/reserved")
        .count();
    Outcome {
        gang_started,
        bounds,
        first_estimate,
        passed_by,
        taints_left,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_node_gang_told_a_bound_starts_by_it_while_small_jobs_keep_arriving() {
    let with = run(true, WHOLE).await;
    let without = run(false, WHOLE).await;
    println!("stream of small jobs, whole-node gang, with reserve_nodes: {with:?}");
    println!("stream of small jobs, whole-node gang, without reserve_nodes: {without:?}");
    told_a_bound_only_with_the_reservation_and_kept_it(&with, &without);
}

/// Its ranks are not whole-node, but each takes 12 of a node's 16 CPUs: the `sla` plugin locks a node's
/// idle CPUs for the gang only once 12 are free there, and the stream keeps refilling the room a rank
/// waits for on the other nodes. Before reservations covered such gangs it was told a bound (from the
/// `sla` plugin alone) that the stream broke.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_gang_that_is_not_whole_node_told_a_bound_starts_by_it_while_small_jobs_keep_arriving()
 {
    let with = run(true, LARGE).await;
    let without = run(false, LARGE).await;
    println!("stream of small jobs, gang of two 12-CPU ranks, with reserve_nodes: {with:?}");
    println!("stream of small jobs, gang of two 12-CPU ranks, without reserve_nodes: {without:?}");
    told_a_bound_only_with_the_reservation_and_kept_it(&with, &without);
}

/// With the reservation the gang is told an expectation, then a bound that it keeps while the stream
/// goes on, and the taints are gone afterwards; without, it is told no bound and the stream passes it
/// beyond the bound the reservation gave.
fn told_a_bound_only_with_the_reservation_and_kept_it(with: &Outcome, without: &Outcome) {
    let first_bound = *with
        .bounds
        .first()
        .unwrap_or_else(|| panic!("with the reservation the gang is told a bound: {with:?}"));
    let started = with
        .gang_started
        .unwrap_or_else(|| panic!("with the reservation the gang starts: {with:?}"));
    assert!(
        started <= first_bound,
        "the gang started at {started} s, after its first bound {first_bound} s: {with:?}"
    );
    assert!(
        with.bounds.iter().all(|b| started <= *b),
        "every bound told held: {with:?}"
    );
    assert!(
        started < STREAM_UNTIL,
        "it started while the stream went on: {with:?}"
    );
    assert!(
        with.first_estimate.is_some_and(|(_, bound)| !bound),
        "before its nodes are reserved the gang is told an expectation: {with:?}"
    );
    assert_eq!(
        with.taints_left, 0,
        "the reservation is gone once the gang started"
    );
    // Without the reservation: no bound is told, and the stream passes it beyond the bound the
    // reservation gave.
    assert!(without.bounds.is_empty(), "{without:?}");
    assert!(
        without.gang_started.is_none_or(|s| s > first_bound),
        "without the reservation the gang is passed beyond {first_bound} s: {without:?}"
    );
    assert!(
        without.passed_by > with.passed_by,
        "more small jobs pass it without the reservation: {without:?} vs {with:?}"
    );
}

/// Four ranks of 6 CPUs on 16-CPU nodes: no rank takes more than half of a node, but the four must
/// start at once. The `sla` plugin keeps, in a session, only the idle room a rank fits in, and the
/// stream retakes room before 24 CPUs are free at once: before gangs of several ranks were reserved for,
/// it was told a bound of 144 s from the `sla` plugin alone and started at 1,344 s, passed by 189 small
/// jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_of_several_small_ranks_told_a_bound_starts_by_it_while_small_jobs_keep_arriving() {
    let many = Gang {
        ranks: 4,
        cpu: 6,
        whole: false,
    };
    let with = run(true, many).await;
    let without = run(false, many).await;
    println!("stream of small jobs, gang of four 6-CPU ranks, with reserve_nodes: {with:?}");
    println!("stream of small jobs, gang of four 6-CPU ranks, without reserve_nodes: {without:?}");
    told_a_bound_only_with_the_reservation_and_kept_it(&with, &without);
}
