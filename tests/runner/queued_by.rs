//! Who tells a job's QUEUED (docs/monitor.md, "Order of a job's events"): a runner that does not hold
//! the job's shard creates the job with `<prefix>queuedBy: monitor` and publishes nothing; the shard's
//! holder tells QUEUED at once and carries the record of it to its first write. A runner alone, with no
//! monitor anywhere, tells QUEUED and writes no record. Either way a submission costs three requests:
//! the two creates and the tombstone read.

use crate::events_once::advance_until;
use crate::harness;
use crate::rabbit;
use crate::submit::wait_until;

use std::collections::BTreeMap;
use std::time::Duration;

use harness::{Captured, Harness, figlet};
use kube::api::{Api, ListParams};
use volcano_runner::config::Config;

/// One shard, short leases (a killed holder's shard is taken within seconds), no pending status.
fn one_shard(h: &Harness) -> Config {
    let mut config = h.config.clone();
    config.cluster.lease.shards = 1;
    config.cluster.lease.duration = Duration::from_secs(3);
    config.cluster.lease.renew_interval = Duration::from_millis(500);
    config.cluster.lease.safety_margin = Duration::from_secs(1);
    config.monitor.pending_status_after = Duration::from_secs(3600);
    config
}

/// Waits until `runner` holds the shard (one shard).
async fn holds_the_shard(h: &Harness, runner: &str) {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(h.client.clone(), &h.config.cluster.namespace);
    rabbit::within(&format!("{runner} holds the shard"), async {
        loop {
            let listed = leases.list(&ListParams::default()).await.unwrap();
            if listed.items.iter().any(|l| {
                l.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.ends_with("-shard-0"))
                    && l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(runner)
            }) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

/// Submits warm-up jobs until each of `runners` has accepted one: a runner's first job of an owner
/// creates the owner's namespace and its baseline policy, once, which is not a submission's cost.
async fn warm_up(h: &Harness, runners: &[&str]) {
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..40 {
        let job = format!("warm-up-{i}");
        h.submit(&figlet(&job)).await;
        wait_until(h, std::slice::from_ref(&job), "QUEUED").await;
        if let Some(by) = annotations_of(h, &job).await.get("ucloud.dk/acceptedBy") {
            seen.insert(by.clone());
        }
        if runners.iter().all(|r| seen.contains(*r)) {
            h.wait_queues_settled().await;
            return;
        }
    }
    panic!("not every runner of {runners:?} took a warm-up job: {seen:?}");
}

/// Submits `jobs` and waits for their QUEUED and for the submit queue to settle (every delivery
/// acknowledged, so every request of the submit path made), then returns the requests per kind made
/// meanwhile (leases and watches left out).
async fn submit_all(h: &Harness, jobs: &[String]) -> BTreeMap<String, u64> {
    let before = h.sim.request_counts();
    for job in jobs {
        h.submit(&figlet(job)).await;
    }
    wait_until(h, jobs, "QUEUED").await;
    h.wait_queues_settled().await;
    // The management API's counts lag: let a write after the confirm land if there is one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = h.sim.request_counts();
    crate::submit::per_job_requests(&before, &after)
}

/// Three requests per submission, by verb: the job, its NetworkPolicy, the tombstone read; no write of
/// the record of the confirmed QUEUED.
fn three_per_submission(by_kind: &BTreeMap<String, u64>, n: u64) {
    let total: u64 = by_kind.values().sum();
    assert_eq!(
        by_kind.get("create jobs.batch.volcano.sh"),
        Some(&n),
        "{by_kind:?}"
    );
    assert_eq!(
        by_kind.get("create networkpolicies.networking.k8s.io"),
        Some(&n),
        "{by_kind:?}"
    );
    assert_eq!(by_kind.get("get configmaps"), Some(&n), "{by_kind:?}");
    assert_eq!(
        by_kind.get("patch jobs.batch.volcano.sh"),
        None,
        "no record written: {by_kind:?}"
    );
    assert!(
        total <= 3 * n,
        "{total} requests for {n} submissions: {by_kind:?}"
    );
}

/// The annotations of `job`'s VolcanoJob.
async fn annotations_of(h: &Harness, job: &str) -> BTreeMap<String, String> {
    let vcjob = h.vcjob(job).await.expect("the VolcanoJob exists");
    vcjob.metadata.annotations.unwrap_or_default()
}

/// Requires the record of a confirmed QUEUED (`queuedConfirmed`) on each of `jobs`, `why` in the message.
async fn records_of_confirmed_queued(h: &Harness, jobs: &[String], why: &str) {
    for job in jobs {
        let annotations = annotations_of(h, job).await;
        assert_eq!(
            annotations
                .get("ucloud.dk/queuedConfirmed")
                .map(String::as_str),
            Some("true"),
            "{job}: {why}: {annotations:?}"
        );
    }
}

/// The annotations of `job`'s VolcanoJob once it exists.
async fn created(h: &Harness, job: &str) -> BTreeMap<String, String> {
    rabbit::within(&format!("{job} is created"), async {
        loop {
            if let Some(vcjob) = h.vcjob(job).await {
                return vcjob.metadata.annotations.unwrap_or_default();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

/// Checks that no job of `jobs` was left to its monitor (`why`): its submit path told its QUEUED.
async fn told_by_the_submit_path(h: &Harness, jobs: &[String], why: &str) {
    for job in jobs {
        let annotations = annotations_of(h, job).await;
        assert_eq!(
            annotations.get("ucloud.dk/queuedBy"),
            None,
            "{job}: not left to a monitor ({why})"
        );
    }
}

/// How often `job`'s QUEUED was delivered.
fn queued_count(events: &[Captured], job: &str) -> usize {
    let queued = format!("{job}/QUEUED");
    events.iter().filter(|c| c.message_id == queued).count()
}

/// Runner A, without a monitor, beside the monitoring runner `monitor` (started already), once
/// `monitor` holds the shard and both consume submissions.
async fn start_beside(h: &Harness, monitor: &str) -> harness::RunnerHandle {
    holds_the_shard(h, monitor).await;
    let a = h.start_with("runner-a", one_shard(h), false);
    h.wait_consumers(&h.config.broker.submit_queue, 2).await;
    a
}

/// Submits `jobs` beside a monitoring runner and returns those runner A accepted (left to the monitor),
/// at least one.
async fn submit_left_to_the_monitor(h: &Harness, jobs: &[String]) -> Vec<String> {
    submit_all(h, jobs).await;
    let left = accepted_by(h, jobs, "runner-a").await;
    assert!(!left.is_empty(), "runner-a took some of the submissions");
    left
}

/// The lifecycle message ids of `job` in delivery order.
fn lifecycle(events: &[Captured], job: &str) -> Vec<String> {
    events
        .iter()
        .filter(|c| c.event.as_ref().is_some_and(|e| e.job_id == job))
        .map(|c| c.message_id.clone())
        .collect()
}

/// The jobs of `jobs` that runner `by` accepted, each checked to be left to its monitor (or not).
async fn accepted_by(h: &Harness, jobs: &[String], by: &str) -> Vec<String> {
    let mut accepted = Vec::new();
    for job in jobs {
        let annotations = annotations_of(h, job).await;
        let left = annotations.get("ucloud.dk/queuedBy").map(String::as_str);
        if annotations.get("ucloud.dk/acceptedBy").map(String::as_str) == Some(by) {
            assert_eq!(left, Some("monitor"), "{job}: left to the shard's holder");
            accepted.push(job.clone());
        } else {
            assert_eq!(left, None, "{job}: accepted by the shard's holder");
        }
    }
    accepted
}

/// A `--no-monitor` runner beside a monitoring one: every submission costs three requests, whichever
/// runner takes it, and every job's QUEUED goes out once, before its RUNNING and its end. Before, the
/// runner that did not hold the shard wrote the record of its confirmed QUEUED itself, a fourth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beside_a_monitoring_runner_a_submission_costs_three_requests_and_one_queued() {
    let h = Harness::new("queued-by-beside").await;
    let m = h.start_with("runner-m", one_shard(&h), true);
    let a = start_beside(&h, "runner-m").await;
    warm_up(&h, &["runner-m", "runner-a"]).await;

    let jobs: Vec<String> = (0..16).map(|i| format!("b-{i}")).collect();
    let by_kind = submit_all(&h, &jobs).await;
    three_per_submission(&by_kind, jobs.len() as u64);
    let left = accepted_by(&h, &jobs, "runner-a").await;
    assert!(!left.is_empty(), "runner-a took some of the submissions");

    advance_until(&h, &jobs, "SUCCESS").await;
    h.wait_queues_settled().await;
    // A late copy would have time to arrive.
    tokio::time::sleep(Duration::from_secs(1)).await;
    m.stop().await;
    a.stop().await;

    let events = h.events().await;
    for job in &jobs {
        let ids = lifecycle(&events, job);
        let queued = format!("{job}/QUEUED");
        assert_eq!(
            ids.iter().filter(|id| **id == queued).count(),
            1,
            "{job}: QUEUED once: {ids:?}"
        );
        let at = |id: String| ids.iter().position(|i| *i == id);
        let (q, r, e) = (
            at(queued),
            at(format!("{job}/RUNNING")),
            at(format!("{job}/SUCCESS")),
        );
        assert!(
            q == Some(0) && q < r && r < e,
            "{job}: QUEUED, RUNNING, SUCCESS in order: {ids:?}"
        );
    }
}

/// A `--no-monitor` runner alone: nobody monitors the jobs, so nobody needs the record of their
/// confirmed QUEUED: three requests per submission (four before), QUEUED once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_without_a_monitor_anywhere_costs_three_requests_per_submission() {
    let h = Harness::new("queued-by-alone").await;
    let a = h.start_with("runner-a", one_shard(&h), false);
    h.wait_consumers(&h.config.broker.submit_queue, 1).await;
    warm_up(&h, &["runner-a"]).await;

    let jobs: Vec<String> = (0..12).map(|i| format!("a-{i}")).collect();
    let by_kind = submit_all(&h, &jobs).await;
    three_per_submission(&by_kind, jobs.len() as u64);
    a.stop().await;

    let events = h.events().await;
    for job in &jobs {
        assert_eq!(queued_count(&events, job), 1, "{job}: QUEUED once");
    }
    told_by_the_submit_path(&h, &jobs, "with no monitor there").await;
}

/// A submission delivered again (a duplicate, or a redelivery) of a job whose monitor tells its QUEUED
/// publishes nothing: the monitor told it, once. Before, every delivery published QUEUED again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_submission_of_a_job_left_to_its_monitor_gets_no_second_queued() {
    let h = Harness::new("queued-by-duplicate").await;
    let m = h.start_with("runner-m", one_shard(&h), true);
    let a = start_beside(&h, "runner-m").await;

    let jobs: Vec<String> = (0..10).map(|i| format!("d-{i}")).collect();
    let left = submit_left_to_the_monitor(&h, &jobs).await;
    for job in &left {
        h.submit(&figlet(job)).await;
    }
    h.wait_all_acked().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    m.stop().await;
    a.stop().await;

    let events = h.events().await;
    for job in &left {
        assert_eq!(
            queued_count(&events, job),
            1,
            "{job}: QUEUED once, its duplicate submission told nothing"
        );
    }
}

/// The monitoring runner killed (as `kill -9`: its runtime dropped, nothing released) after it told
/// the QUEUED of the jobs left to it (and its submit path the others') and before its first write of
/// them: its renewals of the shard's lease listed the records it carried
/// (`volcano-runner/queued-carried`), so the runner that takes the shard over takes them on and tells
/// none of them again; the jobs run to their end, every job's QUEUED once and first. Before the list,
/// the next holder told each QUEUED left to the monitor again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitor_killed_before_its_first_write_leaves_its_records_to_the_next_holder() {
    let h = Harness::new("queued-by-kill").await;
    let m1 = h.start_killable_with("runner-m1", one_shard(&h), true);
    let a = start_beside(&h, "runner-m1").await;

    let jobs: Vec<String> = (0..8).map(|i| format!("k-{i}")).collect();
    let left = submit_left_to_the_monitor(&h, &jobs).await;
    for job in &jobs {
        let annotations = annotations_of(&h, job).await;
        assert!(
            !annotations.contains_key("ucloud.dk/queuedConfirmed"),
            "{job}: no write of the monitor's yet"
        );
    }
    listed_on_the_shard_lease(&h, &jobs).await;
    m1.kill();

    let m2 = h.start_with("runner-m2", one_shard(&h), true);
    holds_the_shard(&h, "runner-m2").await;
    advance_until(&h, &jobs, "SUCCESS").await;
    h.wait_queues_settled().await;
    m2.stop().await;
    a.stop().await;

    let events = h.events().await;
    assert!(!left.is_empty());
    for job in &jobs {
        let ids = lifecycle(&events, job);
        assert_eq!(
            ids.first(),
            Some(&format!("{job}/QUEUED")),
            "{job}: QUEUED first: {ids:?}"
        );
        let queued = ids
            .iter()
            .filter(|i| **i == format!("{job}/QUEUED"))
            .count();
        assert_eq!(queued, 1, "{job}: QUEUED once: {ids:?}");
    }
}

/// Waits until the lease of the one shard lists the record of every job of `jobs`
/// (`volcano-runner/queued-carried`).
async fn listed_on_the_shard_lease(h: &Harness, jobs: &[String]) {
    use volcano_runner::cluster::labels::QUEUED_CARRIED;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(h.client.clone(), &h.config.cluster.namespace);
    let name = format!("{}-shard-0", h.config.cluster.lease.name_prefix);
    rabbit::within("the shard's lease lists every record", async {
        loop {
            let lease = leases.get(&name).await.expect("the shard's lease");
            let listed = lease
                .metadata
                .annotations
                .and_then(|a| a.get(QUEUED_CARRIED).cloned())
                .unwrap_or_default();
            if jobs.iter().all(|j| listed.contains(&format!("/j-{j}@"))) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
}

/// Writes the shard lease of one shard by hand, held by `holder` for an hour, as a runner would: with
/// `volcano-runner/tells-queued` naming `tells` (a runner that tells the QUEUED of the jobs left to it),
/// or without it (`None`: a runner older than that, as during a rolling upgrade).
async fn hold_the_shard_by_hand(h: &Harness, holder: &str, tells: Option<&str>) {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::api::{ObjectMeta, PostParams};
    use volcano_runner::cluster::labels::{COMPONENT, LEASE_GROUP, TELLS_QUEUED};
    let leases: Api<Lease> = Api::namespaced(h.client.clone(), &h.config.cluster.namespace);
    let prefix = &h.config.cluster.lease.name_prefix;
    let name = format!("{prefix}-shard-0");
    let existing = leases.get_opt(&name).await.unwrap();
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([
                (COMPONENT.to_owned(), "shard-lease".to_owned()),
                (LEASE_GROUP.to_owned(), prefix.clone()),
            ])),
            annotations: tells
                .map(|who| BTreeMap::from([(TELLS_QUEUED.to_owned(), who.to_owned())])),
            resource_version: existing.and_then(|l| l.metadata.resource_version),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.to_owned()),
            lease_duration_seconds: Some(3600),
            renew_time: Some(MicroTime(jiff::Timestamp::now())),
            ..LeaseSpec::default()
        }),
    };
    if lease.metadata.resource_version.is_some() {
        leases
            .replace(&name, &PostParams::default(), &lease)
            .await
            .unwrap();
    } else {
        leases.create(&PostParams::default(), &lease).await.unwrap();
    }
}

/// A rolling upgrade: the job's shard is held by an older runner, whose lease does not say that it
/// tells the QUEUED of the jobs left to it. A runner that does not hold the shard then tells QUEUED
/// itself and writes the record of its confirm (the four requests of before), and leaves nothing to the
/// older runner, which would never tell it. Once the lease says the holder tells it, new jobs are left
/// to the holder again. Before, every job was left to the older runner: no QUEUED at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_held_by_an_older_runner_leaves_queued_to_the_submit_path() {
    let h = Harness::new("queued-by-older").await;
    hold_the_shard_by_hand(&h, "runner-old", None).await;
    let a = h.start_with("runner-a", one_shard(&h), false);
    h.wait_consumers(&h.config.broker.submit_queue, 1).await;
    warm_up(&h, &["runner-a"]).await;

    let jobs: Vec<String> = (0..6).map(|i| format!("o-{i}")).collect();
    let by_kind = submit_all(&h, &jobs).await;
    let n = jobs.len() as u64;
    assert_eq!(
        by_kind.get("patch jobs.batch.volcano.sh"),
        Some(&n),
        "the record written by the submit path: {by_kind:?}"
    );
    told_by_the_submit_path(&h, &jobs, "an older runner holds the shard").await;
    records_of_confirmed_queued(&h, &jobs, "the record for the older runner's monitor").await;
    let events = h.events().await;
    for job in &jobs {
        assert_eq!(
            queued_count(&events, job),
            1,
            "{job}: QUEUED once, by the submit path"
        );
    }

    // The holder (upgraded) now says it tells QUEUED: a new job is left to it, once the watch has it.
    hold_the_shard_by_hand(&h, "runner-old", Some("runner-old")).await;
    one_left_to_the_monitor(&h, "u", "a job left to the upgraded holder").await;
    a.stop().await;
}

/// Submits jobs `<prefix>-0`, `<prefix>-1`, ... until one is created left to its monitor
/// (`queuedBy: monitor`), within the tests' patience (`what` says whose).
async fn one_left_to_the_monitor(h: &Harness, prefix: &str, what: &str) {
    rabbit::within(what, async {
        for i in 0.. {
            let job = format!("{prefix}-{i}");
            h.submit(&figlet(&job)).await;
            // The queues' counts lag the publish: wait for the job itself (its annotations are
            // those of its create).
            if created(h, &job)
                .await
                .get("ucloud.dk/queuedBy")
                .map(String::as_str)
                == Some("monitor")
            {
                return;
            }
        }
    })
    .await;
}

/// Whether the one shard's lease is held by `runner` and says that it tells the QUEUED of the jobs left
/// to it.
async fn says_it_tells(h: &Harness, runner: &str) -> bool {
    use volcano_runner::cluster::lease::{holder, tells_queued};
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(h.client.clone(), &h.config.cluster.namespace);
    let name = format!("{}-shard-0", h.config.cluster.lease.name_prefix);
    leases
        .get_opt(&name)
        .await
        .unwrap()
        .is_some_and(|l| holder(&l) == Some(runner) && tells_queued(&l))
}

/// A runner that gains a shard says on its lease that it tells the QUEUED of the jobs left to it only
/// once its monitor has listed the shard; meanwhile the other runners' submit paths tell the QUEUED of
/// the shard's jobs themselves (and write its record). Here the monitor's list of pods takes 20 s, as
/// lists of thousands of live jobs do on a busy API server. Before, the lease said so from the moment
/// the shard was taken, and every job runner A accepted was left to a monitor that decided nothing
/// until its lists were in: no QUEUED for 20 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_still_listing_a_shard_it_gained_leaves_no_queued_waiting() {
    use volcano_runner::sim::FaultRule;
    let h = Harness::new("queued-by-listing").await;
    let a = h.start_with("runner-a", one_shard(&h), false);
    h.wait_consumers(&h.config.broker.submit_queue, 1).await;
    warm_up(&h, &["runner-a"]).await;
    h.sim.faults().add_rule(FaultRule {
        resource: "pods".into(),
        verb: "list".into(),
        latency_ms: 20_000,
        ..FaultRule::default()
    });
    let m = h.start_with("runner-m", one_shard(&h), true);
    holds_the_shard(&h, "runner-m").await;
    h.wait_consumers(&h.config.broker.submit_queue, 2).await;

    let jobs: Vec<String> = (0..12).map(|i| format!("l-{i}")).collect();
    for job in &jobs {
        h.submit(&figlet(job)).await;
    }
    tokio::time::timeout(Duration::from_secs(10), wait_until(&h, &jobs, "QUEUED"))
        .await
        .expect("every QUEUED within 10 s, while runner-m's monitor still lists its pods");
    assert!(
        !says_it_tells(&h, "runner-m").await,
        "runner-m's lease says it tells QUEUED while its monitor lists"
    );
    let mut by_a = 0;
    for job in &jobs {
        let annotations = annotations_of(&h, job).await;
        if annotations.get("ucloud.dk/acceptedBy").map(String::as_str) == Some("runner-a") {
            by_a += 1;
            assert_eq!(
                annotations.get("ucloud.dk/queuedBy"),
                None,
                "{job}: not left to a monitor still listing"
            );
            assert_eq!(
                annotations
                    .get("ucloud.dk/queuedConfirmed")
                    .map(String::as_str),
                Some("true"),
                "{job}: the record written by runner A's submit path"
            );
        }
    }
    assert!(by_a > 0, "runner-a took some of the submissions");

    // Once its lists are in, the lease says so, and a job is left to runner-m again.
    h.sim.faults().clear();
    rabbit::within("runner-m's lease says it tells QUEUED", async {
        while !says_it_tells(&h, "runner-m").await {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    one_left_to_the_monitor(&h, "after", "a job left to runner-m").await;
    h.wait_queues_settled().await;
    m.stop().await;
    a.stop().await;
    let events = h.events().await;
    for job in &jobs {
        assert_eq!(queued_count(&events, job), 1, "{job}: QUEUED once");
    }
}

/// A job left to its monitor and rolled back after that monitor told its QUEUED: runner A (no monitor)
/// created the job with `queuedBy: monitor`, runner M's monitor told its QUEUED, then A's create of the
/// NetworkPolicy outlasted A's client (5 s) and A rolled the job back (marked
/// `volcano-runner/rolled-back`, its finalizer taken off, deleted). M's monitor passes the rolled-back
/// job by as it goes: no FAILURE (`lost_track`) for a job whose QUEUED it told; the submission's next
/// delivery creates the job afresh and it runs to its SUCCESS. This is the two-runner form of
/// `monitor::decide::tests::a_rolled_back_job_is_passed_by_deleted_or_vanished`: with that pass-by
/// taken out of `decide_gone`, every job here is closed with a FAILURE. It found a fault of the monitor's
/// loop as well: the job created afresh within the monitor's hold of the gone one (the same name, queued
/// under the same key) was stored but never decided, as the gone job's handling took its turn: no
/// RUNNING, no end, for half the jobs here (`Loop::finished` now queues the key again when the cache
/// holds a job of that name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_rolled_back_after_its_monitor_told_its_queued_is_passed_by_and_runs_afresh() {
    let h = Harness::new("queued-by-rollback").await;
    let m = h.start_with("runner-m", one_shard(&h), true);
    let a = start_beside(&h, "runner-m").await;
    warm_up(&h, &["runner-m", "runner-a"]).await;

    crate::faults::slow_policy_creates(&h);
    let deletes = || h.sim.request_count("delete jobs.batch.volcano.sh");
    let before = deletes();
    let jobs: Vec<String> = (0..8).map(|i| format!("rb-{i}")).collect();
    for job in &jobs {
        h.submit(&figlet(job)).await;
    }
    rabbit::within("every job's first attempt rolled back", async {
        while deletes() < before + jobs.len() as u64 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    // No submit path gets as far as QUEUED while every NetworkPolicy's create fails: a QUEUED now is
    // one runner-m's monitor told of a job runner-a created, and which runner-a rolled back.
    let events = h.events().await;
    let told: Vec<&String> = jobs
        .iter()
        .filter(|j| queued_count(&events, j) > 0)
        .collect();
    assert!(
        !told.is_empty(),
        "runner-m's monitor told the QUEUED of a job runner-a created before its rollback"
    );
    h.sim.faults().clear();

    advance_until(&h, &jobs, "SUCCESS").await;
    h.wait_queues_settled().await;
    // The QUEUED told of a job rolled back is the one its fresh job has (one message per job id): the
    // record of it is on the fresh job, so that a later holder of the shard sends no copy. The gone
    // job's handling must not release a record carried for the fresh one, nor the fresh job's first
    // write leave out one this process had confirmed.
    let why = format!("the record of its confirmed QUEUED (told: {told:?})");
    records_of_confirmed_queued(&h, &jobs, &why).await;
    m.stop().await;
    a.stop().await;
    let failures = crate::faults::failures(&h.events().await);
    assert_eq!(
        failures,
        Vec::<String>::new(),
        "no FAILURE (told: {told:?})"
    );
    assert!(h.dead_letters().await.is_empty(), "nothing dead-lettered");
}
