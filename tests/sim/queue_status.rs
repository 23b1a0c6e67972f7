//! What the simulator writes into a Volcano Queue's status, as Volcano does since v1.11
//! (volcano-sh/volcano#3751): the queue controller writes `state` alone, and only when it changes; the
//! scheduler writes `allocated` when it closes a session, and only when it changed; the PodGroup counts
//! (`pending`, `inqueue`, `running`, `unknown`, `completed`) are never written. Every write is an event
//! on every client's Queue watch (each runner's monitor holds one), so they are counted here.

use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::api::{DynamicObject, PostParams, WatchEvent, WatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::sim_support::*;

const NS: &str = "queue-status";
/// Jobs run to completion, all in the queue `default`.
const JOBS: usize = 10;
/// Pods per job (a gang of that many).
const REPLICAS: usize = 2;
/// What Volcano's queue controller no longer writes into a queue's status.
const COUNTS: [&str; 5] = ["pending", "inqueue", "running", "unknown", "completed"];

/// Every object the events of `watch` carry until the object `until` is added (created after
/// everything the test counts, so that every earlier event has been delivered).
async fn events_until(
    watch: &mut BoxStream<'static, kube::Result<WatchEvent<DynamicObject>>>,
    until: &str,
) -> Vec<DynamicObject> {
    let mut objects = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("an event in time")
            .expect("the watch goes on")
            .expect("a watch event");
        match event {
            WatchEvent::Added(o) if o.name_any() == until => return objects,
            WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => {
                objects.push(o)
            }
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
}

/// Ten gangs of two pods start at one instant, run and end. The queue's status is written only when
/// what Volcano writes into it changes: its allocation, once for each gang bound (a gang is bound in
/// one pass) and once for each pod that ends (each ends in a pass of its own); its state never (it stays
/// `Open`). Not on the way through every PodGroup phase (Pending, Inqueue, Running, Completed, gone),
/// as the simulator did before, with the counts of each phase: then this test saw 70 writes (7 per
/// job, as many as PodGroup events), now 30.
#[tokio::test]
async fn a_queue_status_is_written_when_its_allocation_changes_not_with_every_podgroup() {
    let (sim, client) = start_with(|c| {
        c.events = false;
        c.pod_start_delay = Duration::ZERO;
    })
    .await;
    namespace(&client, NS).await;
    let queues: Api<DynamicObject> = Api::all_with(client.clone(), &queue());
    let groups = podgroups(&client, NS);
    let before = queues.get("default").await.unwrap();
    let mut queue_watch = watch_from(
        &queues,
        &WatchParams::default(),
        &version_now(&queues).await,
    )
    .await;
    let mut group_watch = watch_from(
        &groups,
        &WatchParams::default(),
        &version_now(&groups).await,
    )
    .await;

    let api = jobs(&client, NS);
    for i in 0..JOBS {
        let job = gang_job(
            &format!("j-{i}"),
            NS,
            REPLICAS as i64,
            "1",
            &["sleep", "10"],
        );
        api.create(&PostParams::default(), &dynamic(job))
            .await
            .unwrap();
    }
    for _ in 0..4 {
        sim.advance(Duration::from_secs(5));
    }
    for i in 0..JOBS {
        assert_eq!(
            phase(&api.get(&format!("j-{i}")).await.unwrap()),
            "Completed"
        );
    }

    // The end of what is counted: a queue, and a PodGroup in it, created after everything else.
    queues
        .create(
            &PostParams::default(),
            &dynamic(
                json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                            "metadata": {"name": "end"}, "spec": {"weight": 1}}),
            ),
        )
        .await
        .unwrap();
    groups
        .create(
            &PostParams::default(),
            &dynamic(
                json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                            "metadata": {"name": "end", "namespace": NS},
                            "spec": {"minMember": 1, "queue": "end"}}),
            ),
        )
        .await
        .unwrap();
    let writes: Vec<Value> = events_until(&mut queue_watch, "end")
        .await
        .into_iter()
        .filter(|q| q.name_any() == "default")
        .map(|q| q.data.get("status").cloned().unwrap_or(json!({})))
        .collect();
    let group_changes = events_until(&mut group_watch, "end").await.len();
    eprintln!(
        "queue `default`: {} status writes for {JOBS} jobs of {REPLICAS} pods ({:.1} per job; \
         {:.1} PodGroup events per job)",
        writes.len(),
        writes.len() as f64 / JOBS as f64,
        group_changes as f64 / JOBS as f64,
    );

    let mut last = before.data.get("status").cloned().unwrap_or(json!({}));
    for status in &writes {
        for count in COUNTS {
            assert!(status.get(count).is_none(), "`{count}` written: {status}");
        }
        assert_eq!(status["state"], "Open", "{status}");
        assert!(
            status.get("allocated") != last.get("allocated")
                || status.get("state") != last.get("state"),
            "a write that changed neither the state nor the allocation: {last} then {status}"
        );
        last = status.clone();
    }
    assert!(
        writes.len() <= JOBS * (1 + REPLICAS),
        "{} writes for {JOBS} jobs: more than one per gang bound and one per pod ended",
        writes.len()
    );
    assert!(
        writes.len() >= JOBS,
        "the allocation was written for every gang bound: {} writes",
        writes.len()
    );
    let allocated = &writes.last().expect("writes")["allocated"];
    assert!(
        allocated.as_object().is_some_and(serde_json::Map::is_empty),
        "every pod ended, nothing is allocated: {allocated}"
    );
}
