//! Peers run together: a job whose peer has ended is refused (`peer_ended`, naming the field), while a
//! job whose peer is there is accepted.

use std::time::Duration;

use crate::harness;

use harness::{Harness, figlet};
use volcano_runner::messages::v1::{JobState, PeerValue, ResourceValue, SubmitJob, resource_value};

fn with_peer(job_id: &str, peer: &str) -> SubmitJob {
    let mut job = figlet(job_id);
    job.resources.push(ResourceValue {
        value: Some(resource_value::Value::Peer(PeerValue {
            hostname: "db".into(),
            job_id: peer.into(),
        })),
    });
    job
}

/// The peer `pe-db` is cancelled (its job is being deleted, its end recorded by the monitor later): a job
/// naming it as peer is refused with `peer_ended` and no job is created; a job naming the running peer
/// `pe-db2` is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_peer_has_ended_is_refused() {
    let h = Harness::new("peers-ended").await;
    let runner = h.start("runner-a");
    h.submit(&figlet("pe-db")).await;
    h.submit(&figlet("pe-db2")).await;
    h.wait_events("both peers queued", |e| {
        ["pe-db/QUEUED", "pe-db2/QUEUED"]
            .iter()
            .all(|id| e.iter().any(|c| c.message_id == *id))
    })
    .await;
    h.cancel("pe-db", None).await;
    let mut ended = false;
    for _ in 0..100 {
        if h.vcjob("pe-db")
            .await
            .is_some_and(|j| j.phase().is_ending())
        {
            ended = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ended, "the cancelled peer is being terminated");

    h.submit(&with_peer("pe-late", "pe-db")).await;
    h.submit(&with_peer("pe-ok", "pe-db2")).await;
    let events = h
        .wait_events("the late job refused, the other queued", |e| {
            e.iter()
                .any(|c| c.message_id.starts_with("pe-late/rejected/"))
                && e.iter().any(|c| c.message_id == "pe-ok/QUEUED")
        })
        .await;
    let refusal = events
        .iter()
        .find(|c| c.message_id.starts_with("pe-late/rejected/"))
        .and_then(|c| c.event.clone())
        .unwrap();
    assert_eq!(refusal.state, JobState::Failure as i32);
    assert_eq!(refusal.reason, "peer_ended");
    assert!(
        refusal
            .status
            .starts_with("resources[0].peer.jobId: job pe-db has ended"),
        "{}",
        refusal.status
    );
    assert!(
        h.vcjob("pe-late").await.is_none(),
        "no job without its peer"
    );
    assert!(h.vcjob("pe-ok").await.is_some());
    runner.stop().await;
}

/// Peers that would wait for each other are refused at submit, where the others exist (issue 41,
/// point 2): `pc-a` names `pc-b`, which does not exist yet (accepted: the owner may submit it next);
/// `pc-b` naming `pc-a` back is refused, `peer_cycle`, naming the field and the ring; and so is the
/// submission that closes a ring of three (`r-1 -> r-2 -> r-3 -> r-1`). On main each was created, and
/// the jobs waited for each other for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_that_name_each_other_are_refused() {
    let h = Harness::new("peers-cycle").await;
    let runner = h.start("runner-a");
    h.submit(&with_peer("pc-a", "pc-b")).await;
    h.submit(&with_peer("r-1", "r-2")).await;
    h.wait_events("the first of each queued", |e| {
        ["pc-a/QUEUED", "r-1/QUEUED"]
            .iter()
            .all(|id| e.iter().any(|c| c.message_id == *id))
    })
    .await;
    h.submit(&with_peer("r-2", "r-3")).await;
    h.wait_events("r-2 queued", |e| {
        e.iter().any(|c| c.message_id == "r-2/QUEUED")
    })
    .await;
    h.submit(&with_peer("pc-b", "pc-a")).await;
    h.submit(&with_peer("r-3", "r-1")).await;
    let events = h
        .wait_events("both refused", |e| {
            ["pc-b/rejected/", "r-3/rejected/"]
                .iter()
                .all(|p| e.iter().any(|c| c.message_id.starts_with(p)))
        })
        .await;
    for (id, ring) in [
        ("pc-b", "(job pc-a -> this job)"),
        ("r-3", "(job r-1 -> job r-2 -> this job)"),
    ] {
        let refusal = events
            .iter()
            .find(|c| c.message_id.starts_with(&format!("{id}/rejected/")))
            .and_then(|c| c.event.clone())
            .unwrap();
        assert_eq!(refusal.state, JobState::Failure as i32);
        assert_eq!(refusal.reason, "peer_cycle");
        assert!(
            refusal.status.starts_with("resources[0].peer.jobId: job ")
                && refusal.status.contains(ring),
            "{}",
            refusal.status
        );
        assert!(h.vcjob(id).await.is_none(), "{id} is not created");
    }
    runner.stop().await;
}
