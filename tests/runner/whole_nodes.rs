//! Whole nodes are bounded: a whole-node job needs a time limit and a product the operator has priced
//! whole nodes for, and one owner holds at most `[pipeline.whole_nodes]` limits of them. Beyond the
//! limit the submission is refused with a FAILURE naming it; the count comes from the jobs in the
//! cluster, so a runner that has just started knows what its predecessor accepted.

use crate::harness;

use harness::{Captured, Harness, figlet};
use volcano_runner::config::Config;
use volcano_runner::messages::v1::{JobState, Owner, SubmitJob};
use volcano_runner::sim::FaultRule;

/// One rank of the figlet example on a whole node, owned by `user`.
fn whole(job_id: &str, user: &str) -> SubmitJob {
    let mut job = figlet(job_id);
    job.exclusive_nodes = true;
    job.owner = Some(Owner {
        user: user.into(),
        project: None,
    });
    job
}

/// Whole nodes of the figlet example's category (`u1-standard`) charged as `u1-standard-node`, at most one
/// per owner.
fn limited(h: &Harness) -> Config {
    let mut config = h.config.clone();
    config.pipeline.whole_nodes.products.insert(
        "u1-standard".into(),
        toml::from_str(
            "product = \"u1-standard-node\"\ncpu = 16\nmemory_gib = 64\nmax_per_owner = 1",
        )
        .unwrap(),
    );
    config
}

fn rejection<'a>(events: &'a [Captured], job_id: &str) -> Option<&'a Captured> {
    let prefix = format!("{job_id}/rejected/");
    events.iter().find(|c| c.message_id.starts_with(&prefix))
}

async fn rejected(h: &Harness, job_id: &str) -> (String, String) {
    let events = h
        .wait_events(&format!("{job_id}'s rejection"), |e| {
            rejection(e, job_id).is_some()
        })
        .await;
    let event = rejection(&events, job_id).unwrap().event.clone().unwrap();
    assert_eq!(event.state, JobState::Failure as i32);
    (event.reason, event.status)
}

async fn queued(h: &Harness, job_id: &str) {
    let id = format!("{job_id}/QUEUED");
    h.wait_events(&id, |e| e.iter().any(|c| c.message_id == id))
        .await;
}

/// The second whole node of one owner beyond `max_per_owner = 1` is refused with `whole_node_limit`,
/// naming the owner, the product and the limit, also when both arrive at once; another owner's is
/// accepted; a whole-node job without a
/// time limit, or of a product without a whole-node charge, is refused naming the field. A new runner
/// counts the jobs its predecessor created; once the owner's job is cancelled, the owner may have
/// another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_nodes_beyond_the_owners_limit_are_refused() {
    let h = Harness::new("whole-nodes").await;
    let config = limited(&h);
    let runner = h.start_with("runner-a", config.clone(), false);
    h.wait_consumers(&h.config.broker.submit_queue, 1).await;

    h.submit(&whole("wn-a1", "alice")).await;
    queued(&h, "wn-a1").await;
    let job = h
        .vcjob("wn-a1")
        .await
        .expect("the first whole node is taken");
    let charge = job.metadata.annotations.as_ref().unwrap()["ucloud.dk/wholeNodeCharge"].clone();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&charge).unwrap(),
        serde_json::json!({"product": "u1-standard-node", "cpu": 16, "memoryGib": 64, "gpu": 0})
    );

    // At once after the first (the runner's watch may not show it yet): refused.
    h.submit(&whole("wn-a2", "alice")).await;
    let (reason, status) = rejected(&h, "wn-a2").await;
    assert_eq!(reason, "whole_node_limit", "{status}");
    assert!(
        status.starts_with(
            "exclusiveNodes: user alice holds 1 whole nodes of u1-standard-node and this job asks for 1 more"
        ),
        "{status}"
    );
    assert!(status.contains("max_per_owner"), "{status}");
    assert!(h.vcjob("wn-a2").await.is_none(), "nothing was created");

    // Another owner has a limit of their own; shared jobs are not counted.
    h.submit(&whole("wn-b1", "bob")).await;
    queued(&h, "wn-b1").await;
    h.submit(&figlet("shared-a")).await;
    queued(&h, "shared-a").await;

    // Two of one owner at the same moment, handled concurrently by one runner: exactly one is taken,
    // even while the first one's create is slow (its job is in no watch while the second is checked).
    h.sim.faults().add_rule(FaultRule {
        resource: "jobs.batch.volcano.sh".into(),
        verb: "create".into(),
        latency_ms: 500,
        ..FaultRule::default()
    });
    let (d1, d2) = (whole("wn-d1", "dave"), whole("wn-d2", "dave"));
    tokio::join!(h.submit(&d1), h.submit(&d2));
    let events = h
        .wait_events("both of dave's answers", |e| {
            ["wn-d1", "wn-d2"].iter().all(|id| {
                rejection(e, id).is_some()
                    || e.iter().any(|c| c.message_id == format!("{id}/QUEUED"))
            })
        })
        .await;
    let taken: Vec<&str> = ["wn-d1", "wn-d2"]
        .into_iter()
        .filter(|id| rejection(&events, id).is_none())
        .collect();
    assert_eq!(taken.len(), 1, "exactly one of dave's two: {taken:?}");
    h.sim.faults().clear();

    // No time limit: refused by validation, naming the field.
    let mut forever = whole("wn-c1", "carol");
    forever.time_allocation = None;
    h.submit(&forever).await;
    let (reason, status) = rejected(&h, "wn-c1").await;
    assert_eq!(reason, "missing_field");
    assert!(status.contains("timeAllocation"), "{status}");
    assert!(status.contains("exclusiveNodes"), "{status}");

    // A product the operator has not priced whole nodes for: refused, naming the field.
    let mut unpriced = whole("wn-c2", "carol");
    unpriced.product.as_mut().unwrap().category = "u1-gpu".into();
    h.submit(&unpriced).await;
    let (_, status) = rejected(&h, "wn-c2").await;
    assert!(
        status.contains("exclusiveNodes") && status.contains("whole nodes are not offered"),
        "{status}"
    );
    runner.stop().await;

    // A new runner knows nothing but the cluster: alice still holds her node.
    let runner = h.start_with("runner-b", config.clone(), false);
    h.wait_consumers(&h.config.broker.submit_queue, 1).await;
    h.submit(&whole("wn-a3", "alice")).await;
    let (reason, _) = rejected(&h, "wn-a3").await;
    assert_eq!(reason, "whole_node_limit");

    // Her job ends (cancelled: terminated, kept as the record of its submission, not deleted): she may
    // have another.
    h.cancel("wn-a1", Some("done")).await;
    let deadline = tokio::time::Instant::now() + crate::rabbit::PATIENCE;
    while h
        .vcjob("wn-a1")
        .await
        .is_some_and(|j| !j.phase().is_ending())
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "wn-a1 is never terminated"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    runner.stop().await;
    let runner = h.start_with("runner-c", config, false);
    h.wait_consumers(&h.config.broker.submit_queue, 1).await;
    h.submit(&whole("wn-a4", "alice")).await;
    queued(&h, "wn-a4").await;
    runner.stop().await;
}
