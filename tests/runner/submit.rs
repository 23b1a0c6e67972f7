//! Submissions end to end: real RabbitMQ (a vhost per test), the cluster simulator in-process, and the
//! runner started as `volcano-runner run` starts it.

use crate::harness;

use harness::{Harness, examples, figlet};
use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams};
use kube::core::ApiResource;
use serde_json::Value;
use volcano_runner::durable::AnnotationKeys;
use volcano_runner::durable::annotations::parse_millis;
use volcano_runner::messages::v1::JobState;
use volcano_runner::pipeline::{self};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// `expected` is contained in `actual`: every key it has is there with a contained value, arrays element
/// by element. What the server or the runner adds (status, uid, defaults, the finalizer) is allowed.
fn assert_contained(expected: &Value, actual: &Value, path: &str) {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (key, value) in e {
                let Some(got) = a.get(key) else {
                    panic!("{path}.{key} is missing; expected {value}");
                };
                assert_contained(value, got, &format!("{path}.{key}"));
            }
        }
        (Value::Array(e), Value::Array(a)) => {
            assert_eq!(e.len(), a.len(), "{path}: {expected} vs {actual}");
            for (i, (e, a)) in e.iter().zip(a).enumerate() {
                assert_contained(e, a, &format!("{path}[{i}]"));
            }
        }
        _ => assert_eq!(expected, actual, "{path}"),
    }
}

fn resource(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

/// A submitted example becomes exactly the objects `render` prints (plus what the server and the
/// runner add: status, uids, the cleanup finalizer, acceptedBy, the trace context, ownerReferences),
/// and QUEUED is published once per job, carrying the submission's trace context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitted_example_becomes_exactly_the_rendered_objects_and_one_queued() {
    let h = Harness::new("submit-example").await;
    let runner = h.start("runner-a");
    let jobs = examples();
    for job in jobs.values() {
        h.submit_traced(job, TRACEPARENT).await;
    }
    h.wait_events("QUEUED for every example", |events| {
        jobs.keys().all(|id| {
            events
                .iter()
                .any(|c| c.message_id == format!("{id}/QUEUED"))
        })
    })
    .await;
    h.wait_queues_settled().await;
    runner.stop().await;

    let keys = AnnotationKeys::new(&h.config.pipeline.annotation_prefix);
    let events = h.events().await;
    for (id, job) in &jobs {
        let queued: Vec<_> = events
            .iter()
            .filter(|c| c.message_id == format!("{id}/QUEUED"))
            .collect();
        assert_eq!(queued.len(), 1, "QUEUED of {id} published once");
        let event = queued[0].event.as_ref().expect("a JobEvent");
        assert_eq!(event.state, JobState::Queued as i32);
        assert_eq!(event.runner_id, "runner-a");
        // The trace continues: same trace id, the runner's own span as the parent (ops::trace).
        let continued = queued[0].traceparent.as_deref().expect("a traceparent");
        assert_eq!(&continued[..36], &TRACEPARENT[..36], "same trace");
        assert_ne!(
            continued, TRACEPARENT,
            "the runner's span, not the sender's"
        );

        let vcjob = h.vcjob(id).await.expect("the VolcanoJob exists");
        let annotations = vcjob.metadata.annotations.clone().unwrap_or_default();
        let created = vcjob.metadata.creation_timestamp.as_ref().unwrap().0;
        let ts = event.timestamp.as_ref().unwrap();
        assert_eq!(
            (ts.seconds, ts.nanos),
            (created.as_second(), created.subsec_nanosecond()),
            "QUEUED is timed by the job's creation"
        );
        assert_eq!(annotations[&keys.traceparent], continued);
        assert_eq!(annotations["ucloud.dk/acceptedBy"], "runner-a");
        assert_eq!(
            vcjob.metadata.finalizers.as_deref(),
            Some(&[keys.cleanup_finalizer()][..])
        );

        // Render at the instant the runner rendered, so even `acceptedAt` must match.
        let now = parse_millis(&annotations[&keys.accepted_at]).unwrap();
        let desired = pipeline::render(job, &h.config, now).expect("the example renders");
        let namespace = desired.job_namespace().to_owned();
        let uid = vcjob.metadata.uid.clone().unwrap();
        let mut companions = Vec::new();
        for object in desired.objects() {
            let expected = serde_json::to_value(object).unwrap();
            let r = resource(object.api_version(), object.kind());
            let actual = h
                .sim
                .object(
                    &r.group,
                    &r.version,
                    &r.plural,
                    object.namespace().unwrap_or(""),
                    object.name(),
                )
                .unwrap_or_else(|| panic!("{} {} exists", object.kind(), object.name()));
            assert_contained(
                &expected,
                &actual,
                &format!("{id}: {} {}", object.kind(), object.name()),
            );
            if object.role == pipeline::desired::Role::Companion {
                assert_eq!(
                    actual["metadata"]["ownerReferences"][0]["uid"],
                    uid,
                    "{} {} is owned by the job",
                    object.kind(),
                    object.name()
                );
                companions.push((object.kind().to_owned(), object.name().to_owned()));
            }
        }
        // Nothing else of ours is owned by the job: exactly the rendered companions. (Volcano's svc plugin
        // adds objects of its own, also owned by the job; they do not carry our managed-by label.)
        let mut owned = Vec::new();
        for (api_version, kind) in [
            ("v1", "ConfigMap"),
            ("v1", "Service"),
            ("networking.k8s.io/v1", "NetworkPolicy"),
        ] {
            let api: Api<DynamicObject> =
                Api::namespaced_with(h.client.clone(), &namespace, &resource(api_version, kind));
            let ours = ListParams::default().labels("app.kubernetes.io/managed-by=volcano-runner");
            for o in api.list(&ours).await.unwrap().items {
                let refs = o.metadata.owner_references.unwrap_or_default();
                if refs.iter().any(|r| r.uid == uid) {
                    owned.push((kind.to_owned(), o.metadata.name.unwrap()));
                }
            }
        }
        owned.sort();
        companions.sort();
        assert_eq!(
            owned, companions,
            "{id}: the job owns exactly its rendered companions"
        );
    }
    assert_eq!(h.vcjobs().await.len(), jobs.len());
}

/// The same submission delivered twice (an orchestrator's retry): one job, and the same QUEUED event
/// (same id, same bytes) for both deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_submission_twice_gives_one_job_and_the_same_queued() {
    let h = Harness::new("submit-twice").await;
    let runner = h.start("runner-a");
    let job = figlet("twice-1");
    h.submit(&job).await;
    h.wait_events("the first QUEUED", |e| {
        e.iter().any(|c| c.message_id == "twice-1/QUEUED")
    })
    .await;
    h.submit(&job).await;
    let events = h
        .wait_events("the second QUEUED", |e| {
            e.iter()
                .filter(|c| c.message_id == "twice-1/QUEUED")
                .count()
                == 2
        })
        .await;
    h.wait_queues_settled().await;
    runner.stop().await;
    let queued: Vec<_> = events
        .iter()
        .filter(|c| c.message_id == "twice-1/QUEUED")
        .collect();
    assert_eq!(
        queued[0].body, queued[1].body,
        "a re-published event is the same message"
    );
    let jobs = h.vcjobs().await;
    assert_eq!(jobs.len(), 1);
    assert!(
        events.iter().all(|c| !c.message_id.contains("/rejected/")),
        "no rejection"
    );
}

/// The same job id with other content is refused with `duplicate_job_id`; the first job stays as it
/// was, and the message is acknowledged (not dead-lettered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_id_with_other_content_is_a_duplicate_job_id() {
    let h = Harness::new("submit-dup").await;
    let runner = h.start("runner-a");
    let first = figlet("dup-1");
    h.submit(&first).await;
    h.wait_events("QUEUED", |e| {
        e.iter().any(|c| c.message_id == "dup-1/QUEUED")
    })
    .await;
    let mut second = first.clone();
    second.product.as_mut().unwrap().cpu += 1;
    let fingerprint16 = pipeline::fingerprint(&second)["sha256:".len()..][..16].to_owned();
    let rejected_id = format!("dup-1/rejected/{fingerprint16}");
    h.submit(&second).await;
    let events = h
        .wait_events("the duplicate's FAILURE", |e| {
            e.iter().any(|c| c.message_id == rejected_id)
        })
        .await;
    h.wait_queues_settled().await;
    runner.stop().await;
    let failure = events
        .iter()
        .find(|c| c.message_id == rejected_id)
        .and_then(|c| c.event.clone())
        .unwrap();
    assert_eq!(failure.state, JobState::Failure as i32);
    assert_eq!(failure.reason, "duplicate_job_id");
    let keys = AnnotationKeys::new("ucloud.dk/");
    let jobs = h.vcjobs().await;
    assert_eq!(jobs.len(), 1);
    let hash = &jobs[0].metadata.annotations.as_ref().unwrap()[&keys.submission_hash];
    assert_eq!(
        *hash,
        pipeline::fingerprint(&first),
        "the first job is untouched"
    );
    assert!(
        h.dead_letters().await.is_empty(),
        "a duplicate is not poison"
    );
    assert_eq!(
        events
            .iter()
            .filter(|c| c.message_id == "dup-1/QUEUED")
            .count(),
        1
    );
}

/// A job the cluster refuses (its Volcano queue is closed: the admission webhook denies it) is a
/// FAILURE that carries the cluster's own message, and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_rejection_is_a_failure_with_the_clusters_message() {
    let h = Harness::new("submit-rejected").await;
    h.sim
        .set_queue_state("default", "Closed")
        .expect("close the default queue");
    let runner = h.start("runner-a");
    let job = figlet("closed-1");
    h.submit(&job).await;
    let events = h
        .wait_events("the FAILURE", |e| {
            e.iter()
                .any(|c| c.message_id.starts_with("closed-1/rejected/"))
        })
        .await;
    h.wait_queues_settled().await;
    runner.stop().await;
    let failure = events
        .iter()
        .find_map(|c| {
            c.message_id
                .starts_with("closed-1/rejected/")
                .then(|| c.event.clone())
        })
        .flatten()
        .unwrap();
    assert_eq!(failure.state, JobState::Failure as i32);
    assert_eq!(failure.reason, "cluster_rejected");
    assert!(
        failure.status.to_lowercase().contains("queue") && failure.status.contains("default"),
        "the cluster's words: {}",
        failure.status
    );
    assert!(h.vcjobs().await.is_empty(), "nothing left behind");
    assert!(h.dead_letters().await.is_empty());
}

/// Once the runner's watches have listed, a submission costs its creates and one read (the tombstone
/// check after the create, the one that decides). The check before the create and the lookup of an
/// existing job come from the watches. This runner has no monitor and no other runner monitors, so no
/// record that its QUEUED was confirmed (`queuedConfirmed`) is written: no monitor needs it (before, it
/// was, a patch per submission; `tests/runner/queued_by.rs` has the cases with a monitor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_in_steady_state_costs_its_creates_and_one_read() {
    let h = Harness::new("submit-requests").await;
    let runner = h.start("runner-a");
    steady(&h).await;

    const N: u64 = 20;
    let before = h.sim.request_counts();
    for n in 0..N {
        h.submit(&figlet(&format!("steady-{n}"))).await;
    }
    h.wait_events("QUEUED of every job", |e| {
        (0..N).all(|n| {
            e.iter()
                .any(|c| c.message_id == format!("steady-{n}/QUEUED"))
        })
    })
    .await;
    let after = h.sim.request_counts();
    runner.stop().await;

    let delta =
        |kind: &str| after.get(kind).copied().unwrap_or(0) - before.get(kind).copied().unwrap_or(0);
    assert_eq!(delta("get configmaps"), N, "{after:?}");
    assert_eq!(delta("create jobs.batch.volcano.sh"), N, "{after:?}");
    assert_eq!(delta("patch jobs.batch.volcano.sh"), 0, "{after:?}");
    let per_job = [
        "create jobs.batch.volcano.sh",
        "create networkpolicies.networking.k8s.io",
        "get configmaps",
    ];
    for kind in after.keys() {
        assert!(
            per_job.contains(&kind.as_str()) || delta(kind) < N,
            "{kind}: {} requests for {N} jobs",
            delta(kind)
        );
    }
}

/// The read of the tombstone that decides whether a cancel came in while the job was being created goes
/// out the moment the job exists, alongside the creates of its companions, not after them: one round
/// trip fewer per submission. Here the NetworkPolicy's create takes 3 s and the job's 1 s: the read is
/// made while the NetworkPolicy is on its way, and not before the job exists (a read made before the
/// job's create has returned could miss a cancel that deleted nothing). Before, it followed the last
/// companion's create.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tombstone_is_read_once_the_job_exists_alongside_its_companions() {
    use volcano_runner::sim::FaultRule;
    let h = Harness::new("submit-read-alongside").await;
    let runner = h.start("runner-a");
    steady(&h).await;
    h.sim.faults().add_rule(FaultRule {
        resource: "networkpolicies".into(),
        verb: "create".into(),
        latency_ms: 3_000,
        ..FaultRule::default()
    });
    h.sim.faults().add_rule(FaultRule {
        resource: "jobs.batch.volcano.sh".into(),
        verb: "create".into(),
        latency_ms: 1_000,
        ..FaultRule::default()
    });
    let reads = || h.sim.request_count("get configmaps");
    let before = reads();
    h.submit(&figlet("alongside")).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while reads() == before {
        assert!(
            std::time::Instant::now() < deadline,
            "no read of the tombstone: {:?}",
            h.sim.request_counts()
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let vcjobs: Api<volcano_runner::volcano::VolcanoJob> = Api::all(h.client.clone());
    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> = Api::all(h.client.clone());
    let job = pipeline::names::vcjob_name("alongside");
    let exists =
        |names: Vec<Option<String>>, name: &str| names.iter().any(|n| n.as_deref() == Some(name));
    let jobs = vcjobs.list(&ListParams::default()).await.unwrap();
    let kept = policies.list(&ListParams::default()).await.unwrap();
    assert!(
        exists(
            jobs.items.into_iter().map(|j| j.metadata.name).collect(),
            &job
        ),
        "the tombstone was read before the job existed"
    );
    assert!(
        !exists(
            kept.items.into_iter().map(|p| p.metadata.name).collect(),
            "policy-alongside"
        ),
        "the tombstone was read only after the NetworkPolicy's create"
    );
    h.wait_events("QUEUED of alongside", |e| {
        e.iter().any(|c| c.message_id == "alongside/QUEUED")
    })
    .await;
    let kept = policies.list(&ListParams::default()).await.unwrap();
    runner.stop().await;
    assert!(
        exists(
            kept.items.into_iter().map(|p| p.metadata.name).collect(),
            "policy-alongside"
        ),
        "QUEUED once every object exists"
    );
    let events = h.events().await;
    let queued = events
        .iter()
        .filter(|c| c.message_id == "alongside/QUEUED")
        .count();
    assert_eq!(queued, 1, "QUEUED once");
}

/// Brings a runner to its steady state: a first job through, and its watches of its namespace (the
/// pause switch and the tombstones) and of the jobs listed and watching, so that the checks before a
/// create and the lookup of an existing job come from them.
async fn steady(h: &Harness) {
    h.submit(&figlet("warm-up")).await;
    h.wait_events("QUEUED of warm-up", |e| {
        e.iter().any(|c| c.message_id == "warm-up/QUEUED")
    })
    .await;
    // Both watches of the runner's namespace (the pause switch and the tombstones) and the jobs' are
    // running: each has listed before it watches.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let watching = |kind: &str| h.sim.request_count(&format!("watch {kind}"));
    while watching("configmaps") < 2 || watching("jobs.batch.volcano.sh") < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the runner's watches of configmaps: {:?}",
            h.sim.request_counts()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The requests of the simulator's counts between `before` and `after` that a job costs: every kind but
/// the runner's periodic ones (its leases, its watches), which do not grow with the jobs.
pub(crate) fn per_job_requests(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> std::collections::BTreeMap<String, u64> {
    after
        .iter()
        .filter(|(kind, _)| !kind.contains(" leases.") && !kind.starts_with("watch "))
        .map(|(kind, n)| (kind.clone(), n - before.get(kind).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// A runner with the monitoring duty on one shard, started and holding it, with a warm-up job QUEUED
/// (so that its watches have listed).
async fn monitoring_runner(
    h: &Harness,
    config: volcano_runner::config::Config,
) -> harness::RunnerHandle {
    let runner = h.start_with("runner-a", config, true);
    h.submit(&figlet("warm-up")).await;
    h.wait_events("QUEUED of warm-up", |e| {
        e.iter().any(|c| c.message_id == "warm-up/QUEUED")
    })
    .await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(h.client.clone(), &h.config.cluster.namespace);
    crate::rabbit::within("runner-a holds the shard", async {
        loop {
            let held = leases.list(&ListParams::default()).await.unwrap();
            if held.items.iter().any(|l| {
                l.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.ends_with("-shard-0"))
                    && l.spec.as_ref().and_then(|s| s.holder_identity.as_deref())
                        == Some("runner-a")
            }) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    runner
}

/// One shard, and no pending status for as long as a test runs: a status is a write of its own.
fn one_shard(h: &Harness) -> volcano_runner::config::Config {
    let mut config = h.config.clone();
    config.cluster.lease.shards = 1;
    config.monitor.pending_status_after = std::time::Duration::from_secs(3600);
    config
}

/// A submission to a runner that monitors its job costs three requests: its two creates and the
/// tombstone read that decides. The record that its QUEUED was confirmed (`queuedConfirmed`) is not a
/// write of its own: it rides on the monitor's first write of the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_to_a_monitoring_runner_costs_three_requests() {
    let h = Harness::new("submit-requests-monitored").await;
    let runner = monitoring_runner(&h, one_shard(&h)).await;

    const N: u64 = 20;
    let before = h.sim.request_counts();
    for n in 0..N {
        h.submit(&figlet(&format!("steady-{n}"))).await;
    }
    h.wait_events("QUEUED of every job", |e| {
        (0..N).all(|n| {
            e.iter()
                .any(|c| c.message_id == format!("steady-{n}/QUEUED"))
        })
    })
    .await;
    let after = h.sim.request_counts();
    runner.stop().await;

    let by_kind = per_job_requests(&before, &after);
    let total: u64 = by_kind.values().sum();
    assert!(
        total <= 3 * N,
        "{total} requests for {N} submissions: {by_kind:?}"
    );
    assert_eq!(
        by_kind.get("create jobs.batch.volcano.sh"),
        Some(&N),
        "{by_kind:?}"
    );
    assert_eq!(by_kind.get("get configmaps"), Some(&N), "{by_kind:?}");
    assert_eq!(
        by_kind.get("patch jobs.batch.volcano.sh"),
        None,
        "{by_kind:?}"
    );
}

/// Waits until every job in `jobs` has its `state` event.
pub(crate) async fn wait_until(h: &Harness, jobs: &[String], state: &str) {
    h.wait_events(&format!("{state} of every job"), |e| {
        jobs.iter()
            .all(|j| e.iter().any(|c| c.message_id == format!("{j}/{state}")))
    })
    .await;
}

/// Submits the jobs `ids` with `ranks` ranks each, waits for their SUCCESS and for the write that
/// records each one's end (no job holds the finalizer any more), and returns the API requests made
/// meanwhile by kind, the test's own reads counted out.
async fn life_requests(
    h: &Harness,
    ids: &[String],
    ranks: u32,
) -> std::collections::BTreeMap<String, u64> {
    let before = h.sim.request_counts();
    for id in ids {
        let mut job = figlet(id);
        job.replicas = ranks;
        h.submit(&job).await;
    }
    wait_until(h, ids, "SUCCESS").await;
    let vcjobs: Api<volcano_runner::volcano::VolcanoJob> = Api::all(h.client.clone());
    let finalizer = AnnotationKeys::new(&h.config.pipeline.annotation_prefix).cleanup_finalizer();
    let mut own_lists = 0;
    let after = crate::rabbit::within("every job's end written", async {
        loop {
            let after = h.sim.request_counts();
            own_lists += 1;
            let listed = vcjobs.list(&ListParams::default()).await.unwrap();
            let held = listed.items.iter().any(|j| {
                ids.iter()
                    .any(|id| j.metadata.name.as_deref() == Some(&format!("j-{id}")))
                    && j.metadata
                        .finalizers
                        .iter()
                        .flatten()
                        .any(|f| *f == finalizer)
            });
            if !held {
                return after;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
    let mut by_kind = per_job_requests(&before, &after);
    // The lists above before the last one are in the counts.
    if let Some(lists) = by_kind.get_mut("list jobs.batch.volcano.sh") {
        *lists -= own_lists - 1;
    }
    by_kind.retain(|_, n| *n > 0);
    by_kind
}

/// A monitored job that succeeds costs at most five requests over its whole life, from its submission
/// to the end of its retention, however many ranks it has: three to submit it, the record of its start
/// (with the record that its QUEUED was confirmed), and its end, published and then recorded in one
/// write (the outcome, the terminal state, the removal of the finalizer and the `volcano-runner/ended`
/// label that takes it out of the monitors' job watch; docs/monitor.md, "A success is closed in one
/// write"; before, the outcome was a write of its own ahead of the publication: six). Its finished pods
/// cost nothing: the monitor's pod lists leave them out by a field selector and its cache drops them
/// with their job (docs/monitor.md, "Ended jobs leave the monitor"); before, each was labelled ended by
/// a patch of its own (seven for one rank, nine for three). Its NetworkPolicy is not deleted by a
/// request: the garbage collector deletes it with the job at the job's TTL, through its ownerReference,
/// as Kubernetes does.
///
/// The simulator's clock runs at real speed here, as the monitor's does (a clock moved by hand, ahead of
/// the monitor's, makes it read every view afresh), and every job runs for 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitored_job_costs_at_most_five_requests_over_its_life_whatever_its_ranks() {
    let sim = volcano_runner::sim::SimConfig {
        clock_speed: 1.0,
        default_run: std::time::Duration::from_secs(2),
        ..volcano_runner::sim::SimConfig::for_tests()
    };
    let h = Harness::with_sim("job-life-requests", sim).await;
    let runner = monitoring_runner(&h, one_shard(&h)).await;
    wait_until(&h, &["warm-up".to_owned()], "SUCCESS").await;

    const N: u64 = 6;
    let mut jobs = Vec::new();
    for ranks in [1, 3] {
        let ids: Vec<String> = (0..N).map(|n| format!("life-{ranks}-{n}")).collect();
        let by_kind = life_requests(&h, &ids, ranks).await;
        eprintln!("{ranks} rank(s), {N} jobs: {by_kind:?}");
        assert!(
            !by_kind.contains_key("patch pods"),
            "{ranks} rank(s): no write per pod: {by_kind:?}"
        );
        // A list is no job's own cost when there are fewer than jobs: a watch that lists again after
        // an error (a loaded machine), or a reconciliation that falls in the window. One per job (a
        // job's pods read at its end) would be as many as the jobs.
        let lists: u64 = by_kind
            .iter()
            .filter(|(kind, _)| kind.starts_with("list "))
            .map(|(_, n)| n)
            .sum();
        assert!(lists < N, "{ranks} rank(s): {lists} lists: {by_kind:?}");
        let total: u64 = by_kind.values().sum::<u64>() - lists;
        assert!(
            total <= 5 * N,
            "{ranks} rank(s): {total} requests for {N} jobs: {by_kind:?}"
        );
        let patches = by_kind
            .get("patch jobs.batch.volcano.sh")
            .copied()
            .unwrap_or(0);
        assert!(
            patches <= 2 * N,
            "{ranks} rank(s): {patches} job patches for {N} jobs: {by_kind:?}"
        );
        assert!(
            !by_kind.contains_key("delete networkpolicies.networking.k8s.io"),
            "{by_kind:?}"
        );
        jobs.extend(ids);
    }
    let vcjobs: Api<volcano_runner::volcano::VolcanoJob> = Api::all(h.client.clone());

    // At the TTL the garbage collector deletes the job and, through its ownerReference, its
    // NetworkPolicy.
    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> = Api::all(h.client.clone());
    let named = |p: &k8s_openapi::api::networking::v1::NetworkPolicy| {
        jobs.iter()
            .any(|id| p.metadata.name.as_deref() == Some(&format!("policy-{id}")))
    };
    let kept = policies.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        kept.items.iter().filter(|p| named(p)).count(),
        jobs.len(),
        "kept with the ended jobs until their TTL"
    );
    h.sim
        .advance(h.config.cluster.ended_job_retention + std::time::Duration::from_secs(60));
    crate::rabbit::within(
        "the jobs and their NetworkPolicies collected at the TTL",
        async {
            loop {
                let left = policies.list(&ListParams::default()).await.unwrap();
                let jobs_left = vcjobs.list(&ListParams::default()).await.unwrap();
                if !left.items.iter().any(named)
                    && !jobs_left.items.iter().any(|j| {
                        jobs.iter()
                            .any(|id| j.metadata.name.as_deref() == Some(&format!("j-{id}")))
                    })
                {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        },
    )
    .await;
    runner.stop().await;
}
