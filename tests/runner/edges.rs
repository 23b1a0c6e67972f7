//! Contract edges and refusals, one deterministic repro each: a message on a queue not meant for its type
//! (the pause switch must not be bypassed), job ids at the length limit, readable but invalid job ids,
//! extensions out of range, and permanent cluster errors that must not be retried.

use crate::harness;
use crate::rabbit;

use std::collections::BTreeMap;
use std::time::Duration;

use harness::{Harness, figlet};
use lapin::types::AMQPValue;
use volcano_runner::broker::{Outbound, headers};
use volcano_runner::cluster::PauseSwitch;
use volcano_runner::messages::Format;
use volcano_runner::messages::v1::CancelJob;

/// A dead-lettered message's reason headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dead {
    pub reason: String,
    pub error: String,
    pub field: Option<String>,
}

fn text(value: Option<&AMQPValue>) -> Option<String> {
    match value? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// Waits until `n` messages are dead-lettered; returns their headers by message id.
pub async fn dead_letters(h: &Harness, n: usize) -> BTreeMap<String, Dead> {
    let mut dead = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + rabbit::PATIENCE;
    while dead.len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} dead letters expected, got {dead:?}"
        );
        for m in h.dead_letters().await {
            let props = &m.delivery.properties;
            let id = props
                .message_id()
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default();
            let table = props.headers().clone().unwrap_or_default();
            let table = table.inner();
            dead.insert(
                id,
                Dead {
                    reason: text(table.get(headers::REASON)).unwrap_or_default(),
                    error: text(table.get(headers::ERROR)).unwrap_or_default(),
                    field: text(table.get(headers::FIELD)),
                },
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    dead
}

/// While submissions are paused, a SubmitJob published with routing key `cancel` lands on the control
/// queue: it is not handled there (that would bypass the pause) but dead-lettered as `wrong_queue`; a
/// cancel published with routing key `submit` likewise. Nothing is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_on_a_queue_not_meant_for_it_is_dead_lettered_as_wrong_queue() {
    let h = Harness::new("edge-wrong-queue").await;
    let runner = h.start("runner-a");
    let switch = PauseSwitch::new(h.client.clone(), &h.config.cluster);
    switch
        .pause("maintenance", "test", jiff::Timestamp::now())
        .await
        .unwrap();
    h.wait_consumers(&h.config.broker.submit_queue, 0).await;

    let mut sneaky = Outbound::submit(&figlet("wq-1"), Format::Json, &h.config.broker);
    sneaky.routing_key = "cancel".into();
    sneaky.message_id = "sneaky-submit".into();
    h.publish(sneaky).await;
    let cancel = CancelJob {
        job_id: "wq-2".into(),
        reason: Some("wrong key".into()),
    };
    let mut misrouted = Outbound::cancel(&cancel, Format::Json, &h.config.broker);
    misrouted.routing_key = "submit".into();
    misrouted.message_id = "misrouted-cancel".into();
    h.publish(misrouted).await;
    // The cancel waits in the paused submit queue; resume so it is consumed and refused there.
    let dead = dead_letters(&h, 1).await;
    assert_eq!(dead["sneaky-submit"].reason, "wrong_queue");
    assert!(
        dead["sneaky-submit"].error.contains("submit"),
        "{:?}",
        dead["sneaky-submit"]
    );
    assert!(
        h.vcjob("wq-1").await.is_none(),
        "the pause was not bypassed"
    );
    switch.resume("test", jiff::Timestamp::now()).await.unwrap();
    let dead = dead_letters(&h, 1).await;
    assert_eq!(dead["misrouted-cancel"].reason, "wrong_queue");
    h.wait_queues_settled().await;
    assert!(h.vcjobs().await.is_empty());
    let tombstones: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(h.client.clone(), &h.config.cluster.namespace);
    assert!(
        tombstones
            .get_opt("tombstone-wq-2")
            .await
            .unwrap()
            .is_none(),
        "the misrouted cancel had no effect"
    );
    runner.stop().await;
}

/// The job id limit is what the contract says: a 55-character id runs, a 56-character one is refused with
/// a FAILURE naming `jobId`; ids that are readable but invalid (too long, upper case, not ASCII) get a
/// FAILURE under the id as sent, so the orchestrator can match it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_ids_at_the_limit_and_readable_invalid_ids_get_an_answer() {
    let h = Harness::new("edge-job-ids").await;
    let runner = h.start("runner-a");
    let longest = "5".repeat(55);
    let too_long = "6".repeat(56);
    let way_too_long = "6".repeat(64);
    let unicode = "jöb-42".to_owned();
    for id in [&longest, &too_long, &way_too_long, &unicode] {
        let mut job = figlet("x");
        job.job_id = id.clone();
        h.submit(&job).await;
    }
    let refused = [&too_long, &way_too_long, &unicode];
    h.wait_events("QUEUED for the longest id, a FAILURE for each other", |e| {
        e.iter()
            .any(|c| c.message_id == format!("{longest}/QUEUED"))
            && refused.iter().all(|id| {
                e.iter()
                    .any(|c| c.message_id.starts_with(&format!("{id}/rejected/")))
            })
    })
    .await;
    let events = h.events().await;
    for id in refused {
        let failure = events
            .iter()
            .filter_map(|c| c.event.as_ref())
            .find(|e| e.job_id == *id)
            .unwrap();
        assert_eq!(
            failure.state,
            volcano_runner::messages::v1::JobState::Failure as i32
        );
        assert!(failure.status.starts_with("jobId: "), "{}", failure.status);
    }
    assert!(h.vcjob(&longest).await.is_some(), "55 characters fit");
    let dead = dead_letters(&h, 3).await;
    assert_eq!(dead.len(), 3);
    assert!(dead.values().all(|d| d.field.as_deref() == Some("jobId")));
    runner.stop().await;
}

/// An extension whose sum with the job's time allocation is out of range is refused with the extension
/// event the orchestrator waits for (`<jobId>/extend/<requestId>`, reason `limit_exceeded`) and
/// dead-lettered with that reason; the job keeps its allocation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_out_of_range_gets_its_refusal_event() {
    let h = Harness::new("edge-extend").await;
    let runner = h.start("runner-a");
    h.submit(&figlet("ext-1")).await;
    h.wait_events("QUEUED", |e| {
        e.iter().any(|c| c.message_id == "ext-1/QUEUED")
    })
    .await;
    let before = h.vcjob("ext-1").await.unwrap();
    // About 9,999 years: a valid duration, but not added to an allocation that already exists.
    h.extend("ext-1", "huge", 315_500_000_000).await;
    let events = h
        .wait_events("the extension's answer", |e| {
            e.iter().any(|c| c.message_id == "ext-1/extend/huge")
        })
        .await;
    let answer = events
        .iter()
        .find(|c| c.message_id == "ext-1/extend/huge")
        .and_then(|c| c.event.clone())
        .unwrap();
    assert_eq!(answer.reason, "limit_exceeded", "{}", answer.status);
    let dead = dead_letters(&h, 1).await;
    let d = dead.values().next().unwrap();
    assert_eq!(d.reason, "limit_exceeded");
    assert_eq!(d.field.as_deref(), Some("extension"));
    let after = h.vcjob("ext-1").await.unwrap();
    assert_eq!(
        before
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .get("ucloud.dk/maxTime"),
        after
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .get("ucloud.dk/maxTime"),
        "the allocation is unchanged"
    );
    runner.stop().await;
}

/// A cancel with a 300 KB reason cancels: the reason is kept cut to 1024 characters (on the job and in
/// the tombstone), the job is deleted, and nothing is retried or dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_with_a_huge_reason_still_cancels() {
    let h = Harness::new("edge-huge-reason").await;
    let runner = h.start("runner-a");
    h.submit(&figlet("huge-1")).await;
    h.wait_events("QUEUED", |e| {
        e.iter().any(|c| c.message_id == "huge-1/QUEUED")
    })
    .await;
    let reason = "why ".repeat(75_000);
    h.cancel("huge-1", Some(&reason)).await;
    let cancelled = async {
        loop {
            match h.vcjob("huge-1").await {
                // Ended by its TerminateJob command, not deleted.
                Some(job) if job.phase().is_ending() => return job,
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    };
    let job = rabbit::within("the job is cancelled", cancelled).await;
    h.wait_queues_settled().await;
    let annotations = job.metadata.annotations.unwrap();
    assert_eq!(annotations["ucloud.dk/terminationCause"], "cancelled");
    let kept = &annotations["ucloud.dk/terminationReason"];
    assert_eq!(kept.chars().count(), 1024);
    assert!(kept.ends_with('…'));
    assert!(h.dead_letters().await.is_empty(), "nothing dead-lettered");
    runner.stop().await;
}

/// The cluster refuses the cancel's annotation patch for good (422): no retries; the job is cancelled
/// all the same (terminated), the orchestrator gets an event saying the cluster refused, and the message is
/// dead-lettered as `cluster_rejected` (not by the delivery limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_refusal_is_not_retried_and_the_cancel_still_cancels() {
    let h = Harness::new("edge-refused").await;
    let runner = h.start("runner-a");
    h.submit(&figlet("ref-1")).await;
    h.wait_events("QUEUED", |e| {
        e.iter().any(|c| c.message_id == "ref-1/QUEUED")
    })
    .await;
    h.sim.faults().add_rule(volcano_runner::sim::FaultRule {
        resource: "jobs.batch.volcano.sh".into(),
        verb: "patch".into(),
        error_422: 1.0,
        ..volcano_runner::sim::FaultRule::default()
    });
    h.cancel("ref-1", Some("user asked")).await;
    let dead = dead_letters(&h, 1).await;
    let d = dead.values().next().unwrap();
    assert_eq!(d.reason, "cluster_rejected", "{d:?}");
    assert!(d.error.contains("simulated fault"), "{d:?}");
    let job = h.vcjob("ref-1").await.expect("kept");
    assert!(job.phase().is_ending(), "cancelled all the same");
    assert!(job.metadata.deletion_timestamp.is_none(), "not deleted");
    let events = h
        .wait_events("the refusal's event", |e| {
            e.iter()
                .any(|c| c.message_id.starts_with("ref-1/rejected/"))
        })
        .await;
    let event = events
        .iter()
        .find(|c| c.message_id.starts_with("ref-1/rejected/"))
        .and_then(|c| c.event.clone())
        .unwrap();
    assert!(
        event.status.contains("the cluster refused it"),
        "{}",
        event.status
    );
    runner.stop().await;
}

/// A runner whose own namespace does not exist (a standalone simulator, a wrong deploy) creates it and
/// monitors: the job gets RUNNING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_runner_namespace_is_created_and_jobs_are_monitored() {
    let h = Harness::new("edge-own-ns").await;
    let mut config = h.config.clone();
    config.cluster.namespace = "vr-own-created".into();
    config.cluster.lease.shards = 1;
    config.cluster.lease.duration = Duration::from_secs(4);
    config.cluster.lease.renew_interval = Duration::from_millis(500);
    config.cluster.lease.safety_margin = Duration::from_secs(1);
    let runner = h.start_with("runner-ns", config, true);
    h.submit(&figlet("ns-1")).await;
    let deadline = tokio::time::Instant::now() + rabbit::PATIENCE;
    loop {
        h.sim.advance(Duration::from_secs(5));
        if h.events()
            .await
            .iter()
            .any(|c| c.message_id == "ns-1/RUNNING")
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "RUNNING");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(h.client.clone());
    assert!(
        namespaces
            .get_opt("vr-own-created")
            .await
            .unwrap()
            .is_some()
    );
    runner.stop().await;
}

/// A runner that may not create its missing namespace says so: `/readyz` fails naming the namespace and
/// what to do, and `admin status` reports the problem instead of "no runner has started".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_cannot_create_its_namespace_is_not_ready_and_admin_status_says_why() {
    let h = Harness::new("edge-own-ns-forbidden").await;
    h.sim.faults().add_rule(volcano_runner::sim::FaultRule {
        resource: "namespaces".into(),
        verb: "create".into(),
        error_403: 1.0,
        ..volcano_runner::sim::FaultRule::default()
    });
    let mut config = h.config.clone();
    config.cluster.namespace = "vr-own-forbidden".into();
    let ops = volcano_runner::ops::Ops::new();
    let service = volcano_runner::runner::service::Service {
        config,
        client: h.client.clone(),
        runner_id: "runner-forbidden".into(),
        monitor: true,
        monitor_clock: None,
    };
    let token = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(service.run_with_ops(token.clone(), ops.clone()));
    let deadline = tokio::time::Instant::now() + rabbit::PATIENCE;
    let report = loop {
        let report = ops.readiness.evaluate().await;
        let said = report.checks.iter().any(|(name, r)| {
            name == "own namespace" && r.as_ref().is_err_and(|e| e.contains("may not create"))
        });
        if said {
            break report;
        }
        assert!(tokio::time::Instant::now() < deadline, "{}", report.text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!report.is_ready());
    assert!(
        report
            .text()
            .contains("kubectl create namespace vr-own-forbidden"),
        "{}",
        report.text()
    );

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
        .args(["admin", "--cluster", &h.sim.url(), "status"])
        .env("VOLCANO_RUNNER_BROKER__URL", h.vhost.amqp_url())
        .env("VOLCANO_RUNNER_CLUSTER__NAMESPACE", "vr-own-forbidden")
        .output()
        .expect("admin status runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("PROBLEM: namespace vr-own-forbidden does not exist"),
        "{text}"
    );
    token.cancel();
    let _ = task.await;
}

/// Two owners whose names differ only by case: `alice` naming `Alice`'s job as a peer is refused (a
/// FAILURE naming the field, no job), `alice` naming her own job is fine, and no NetworkPolicy admits pods
/// of another namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_must_be_a_job_of_the_same_owner() {
    use volcano_runner::messages::v1::{PeerValue, ResourceValue, resource_value};
    let h = Harness::new("edge-peers").await;
    let runner = h.start("runner-a");
    let owned = |id: &str, user: &str| {
        let mut job = figlet(id);
        job.owner.as_mut().unwrap().user = user.into();
        job.owner.as_mut().unwrap().project = None;
        job
    };
    let with_peer = |mut job: volcano_runner::messages::v1::SubmitJob, peer: &str| {
        job.resources.push(ResourceValue {
            value: Some(resource_value::Value::Peer(PeerValue {
                hostname: "partner".into(),
                job_id: peer.into(),
            })),
        });
        job
    };
    h.submit(&owned("victim", "Alice")).await;
    h.submit(&owned("own", "alice")).await;
    h.wait_events("both first jobs queued", |e| {
        ["victim/QUEUED", "own/QUEUED"]
            .iter()
            .all(|id| e.iter().any(|c| c.message_id == *id))
    })
    .await;
    h.submit(&with_peer(owned("intruder", "alice"), "victim"))
        .await;
    h.submit(&with_peer(owned("friend", "alice"), "own")).await;
    let events = h
        .wait_events("the intruder refused, the friend queued", |e| {
            e.iter()
                .any(|c| c.message_id.starts_with("intruder/rejected/"))
                && e.iter().any(|c| c.message_id == "friend/QUEUED")
        })
        .await;
    let refusal = events
        .iter()
        .find(|c| c.message_id.starts_with("intruder/rejected/"))
        .and_then(|c| c.event.clone())
        .unwrap();
    assert!(
        refusal
            .status
            .starts_with("resources[0].peer.jobId: job victim belongs to another owner"),
        "{}",
        refusal.status
    );
    assert!(h.vcjob("intruder").await.is_none());
    let victim = h.vcjob("victim").await.unwrap();
    let own = h.vcjob("own").await.unwrap();
    assert_ne!(
        victim.metadata.namespace, own.metadata.namespace,
        "Alice and alice have namespaces of their own"
    );
    let policies: kube::Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        kube::Api::all(h.client.clone());
    let all = policies.list(&Default::default()).await.unwrap();
    assert!(!all.items.is_empty());
    for policy in all.items {
        let spec = serde_json::to_value(policy.spec).unwrap();
        for rule in ["ingress", "egress"] {
            for r in spec[rule].as_array().into_iter().flatten() {
                for peer in r["from"]
                    .as_array()
                    .or(r["to"].as_array())
                    .into_iter()
                    .flatten()
                {
                    assert!(
                        peer.get("namespaceSelector")
                            .is_none_or(|s| s != &serde_json::json!({})),
                        "{:?} admits every namespace: {peer}",
                        policy.metadata.name
                    );
                }
            }
        }
    }
    runner.stop().await;
}

/// One bound of 100 years (36,600 days) for time allocations: a submission over it is refused with a
/// FAILURE naming `timeAllocation` (a 10,000-year job once ran without an expiry and never expired), and
/// an extension that would take a job near the bound past it gets its refusal (`limit_exceeded`) while
/// the job keeps its allocation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocations_and_extensions_share_the_100_year_bound() {
    let h = Harness::new("edge-allocation").await;
    let runner = h.start("runner-a");
    let max = volcano_runner::validate::TIME_ALLOCATION_MAX_SECONDS;
    let mut over = figlet("alloc-over");
    over.time_allocation = Some(pbjson_types::Duration {
        seconds: 315_576_000_000,
        nanos: 0,
    });
    let mut near = figlet("alloc-near");
    near.time_allocation = Some(pbjson_types::Duration {
        seconds: max - 3600,
        nanos: 0,
    });
    h.submit(&over).await;
    h.submit(&near).await;
    let events = h
        .wait_events(
            "QUEUED for the job near the bound, FAILURE for the one over it",
            |e| {
                e.iter().any(|c| c.message_id == "alloc-near/QUEUED")
                    && e.iter()
                        .any(|c| c.message_id.starts_with("alloc-over/rejected/"))
            },
        )
        .await;
    let failure = events
        .iter()
        .filter_map(|c| c.event.as_ref())
        .find(|e| e.job_id == "alloc-over")
        .unwrap();
    assert_eq!(failure.reason, "limit_exceeded", "{}", failure.status);
    assert!(
        failure.status.starts_with("timeAllocation: ") && failure.status.contains("100 years"),
        "{}",
        failure.status
    );
    assert!(h.vcjob("alloc-over").await.is_none());

    // Two hours more would pass the bound by an hour.
    h.extend("alloc-near", "two-hours", 7200).await;
    let events = h
        .wait_events("the extension's answer", |e| {
            e.iter()
                .any(|c| c.message_id == "alloc-near/extend/two-hours")
        })
        .await;
    let answer = events
        .iter()
        .find(|c| c.message_id == "alloc-near/extend/two-hours")
        .and_then(|c| c.event.clone())
        .unwrap();
    assert_eq!(answer.reason, "limit_exceeded", "{}", answer.status);
    let dead = dead_letters(&h, 2).await;
    let fields: Vec<Option<&str>> = dead.values().map(|d| d.field.as_deref()).collect();
    assert!(fields.contains(&Some("timeAllocation")), "{dead:?}");
    assert!(fields.contains(&Some("extension")), "{dead:?}");
    assert!(
        dead.values().all(|d| d.reason == "limit_exceeded"),
        "{dead:?}"
    );
    let job = h.vcjob("alloc-near").await.unwrap();
    let max_time = job
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("ucloud.dk/maxTime"))
        .cloned();
    assert_eq!(max_time, Some(((max - 3600) * 1000).to_string()));
    runner.stop().await;
}
