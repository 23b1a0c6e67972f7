//! The monitor against the cluster simulator (stopped clock) and a real RabbitMQ: a job's whole life,
//! failures (exit code, image pull, queue timeout), the pending reason, expiry with warnings and an
//! extension, and proxy events.

use crate::monitor_support;

use std::collections::BTreeSet;
use std::time::Duration;

use monitor_support::*;
use volcano_runner::messages::v1::{JobState, ProxyAction};

/// QUEUED → RUNNING → SUCCESS with ticks that add up exactly to the simulated run time, the final tick
/// ending at the real end; the job is then kept (pods gone) as the record of its submission until the
/// retention has passed, and only then gone.
#[tokio::test]
async fn a_job_runs_and_succeeds_with_ticks_summing_to_its_run_time() {
    let mut w = World::start("mon-success", |_| {}, |_| {}).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let job = job("m1", "echo starting; sleep 150; echo done");
    let ns = w.namespace_of(&job);
    w.submit(&job).await;
    w.advance(1);
    w.until("a status event or RUNNING", |s| {
        !s.of("m1").lifecycle.is_empty()
    })
    .await;
    w.advance(2);
    w.until("RUNNING", |s| s.event("m1/RUNNING").is_some())
        .await;
    let requests_at_start = w.sim.request_counts();
    let pod = w.pod(&ns, "j-m1-job-0").expect("the pod exists");
    let started = pod
        .pointer("/status/containerStatuses/0/state/running/startedAt")
        .and_then(|v| v.as_str())
        .expect("the container runs")
        .parse::<jiff::Timestamp>()
        .unwrap();
    let running = w.seen.event("m1/RUNNING").unwrap().clone();
    assert_eq!(
        ms(&running.started_at),
        started.as_millisecond(),
        "the real start"
    );
    assert_eq!(
        ms(&running.expires_at),
        started.as_millisecond() + 3_600_000,
        "the figlet example has one hour"
    );
    for _ in 0..3 {
        w.advance(30);
    }
    w.until("the first tick", |s| !s.unique_ticks().is_empty())
        .await;
    // While it runs the job itself is never read: a tick lists the pods (the proof that they still
    // run) and its write tests the annotations it was decided on.
    let requests = w.sim.request_counts();
    let kind = "get jobs.batch.volcano.sh";
    let reads = requests.get(kind).copied().unwrap_or(0)
        - requests_at_start.get(kind).copied().unwrap_or(0);
    assert_eq!(reads, 0, "{kind} while running: {requests:?}");
    for _ in 0..3 {
        w.advance(30);
    }
    w.until("SUCCESS", |s| s.event("m1/SUCCESS").is_some())
        .await;
    w.until("the final tick", Seen::has_final_tick).await;
    w.settle(Duration::from_millis(500)).await;
    let logs = w.sim.request_counts().get("get pods/log").copied();
    assert_eq!(logs, None, "a success reads no log");
    let seen = w.seen.of("m1");
    let success = seen.event("m1/SUCCESS").unwrap();
    assert_eq!(success.state, JobState::Success as i32);
    assert_eq!(success.exit_codes.len(), 1);
    assert_eq!(success.exit_codes[0].exit_code, 0);
    assert_eq!(ms(&success.started_at), started.as_millisecond());
    assert_eq!(
        ms(&success.ended_at) - started.as_millisecond(),
        150_000,
        "sleep 150 in the simulator"
    );
    assert!(
        success.log_tails.is_empty(),
        "SUCCESS carries no tails unless [monitor] log_tails_on_success: {:?}",
        success.log_tails
    );
    let ticks = seen.unique_ticks();
    check_ticks(
        "m1",
        &ticks,
        started.as_millisecond(),
        ms(&success.ended_at),
    );
    assert_eq!(ticks.len(), 3, "60 s + 60 s + 30 s");
    let states: Vec<&str> = seen
        .transitions()
        .iter()
        .map(|e| e.event_id.as_str())
        .collect();
    assert_eq!(states, ["m1/QUEUED", "m1/RUNNING", "m1/SUCCESS"]);
    w.released_then_gone(&ns, "m1").await;
    runner.stop().await;
    w.close().await;
}

/// Ranks that exit non-zero end the job as FAILURE with every rank's exit code and log tail. (Volcano's
/// policy is switched off here so that both ranks end by themselves; with `TerminateJob` Volcano deletes
/// the other ranks' pods and only the failed rank's code remains to be read.)
#[tokio::test]
async fn a_non_zero_exit_is_a_failure_with_the_exit_codes() {
    let mut w = World::start(
        "mon-exit",
        |c| c.pipeline.scheduling.on_pod_failed = volcano_runner::pipeline::PolicyChoice::Nothing,
        |_| {},
    )
    .await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let mut job = job(
        "m2",
        "echo computing; sleep 40; echo 'out of cheese' ; exit 3",
    );
    job.replicas = 2;
    w.submit(&job).await;
    for _ in 0..10 {
        w.advance(10);
    }
    w.until("FAILURE", |s| s.event("m2/FAILURE").is_some())
        .await;
    let failure = w.seen.event("m2/FAILURE").unwrap().clone();
    assert_eq!(failure.reason, "exit_code");
    assert!(
        failure.status.contains("exited with code 3"),
        "{}",
        failure.status
    );
    let mut codes: Vec<(u32, i32)> = failure
        .exit_codes
        .iter()
        .map(|c| (c.rank, c.exit_code))
        .collect();
    codes.sort();
    assert_eq!(codes.len(), 2, "both ranks: {codes:?}");
    assert!(codes.iter().all(|(_, c)| *c == 3), "{codes:?}");
    assert!(
        failure
            .log_tails
            .iter()
            .all(|t| t.tail.contains("out of cheese")),
        "{:?}",
        failure.log_tails
    );
    assert!(
        w.seen.event("m2/SUCCESS").is_none(),
        "W9: Failed never becomes SUCCESS"
    );
    runner.stop().await;
    w.close().await;
}

/// An image that cannot be pulled keeps the job pending with a status, then FAILURE after the grace,
/// and the job is deleted.
#[tokio::test]
async fn an_image_that_cannot_be_pulled_fails_after_the_grace() {
    let mut w = World::start(
        "mon-pull",
        |c| c.monitor.image_pull_grace = Duration::from_secs(120),
        |_| {},
    )
    .await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let mut job = job("m3", "sleep 10");
    if let Some(app) = job.application.as_mut() {
        app.image = "dreg.cloud.sdu.dk/ucloud/does-not-exist:1.0".into();
    }
    let ns = w.namespace_of(&job);
    w.submit(&job).await;
    w.advance(5);
    w.until("the pull status", |s| {
        s.of("m3")
            .lifecycle
            .iter()
            .any(|e| e.reason == "image_pull_retrying")
    })
    .await;
    w.advance(60);
    w.settle(Duration::from_millis(300)).await;
    assert!(w.seen.event("m3/FAILURE").is_none(), "not before the grace");
    w.advance(70);
    w.until("FAILURE", |s| s.event("m3/FAILURE").is_some())
        .await;
    let failure = w.seen.event("m3/FAILURE").unwrap();
    assert_eq!(failure.reason, "image_pull");
    assert!(
        failure.status.contains("does-not-exist"),
        "{}",
        failure.status
    );
    assert!(
        w.seen.of("m3").ticks.is_empty(),
        "a job that never ran is not charged"
    );
    w.released_then_gone(&ns, "m3").await;
    runner.stop().await;
    w.close().await;
}

/// A job larger than any node gets a plain-language pending reason, and FAILURE when the queue timeout
/// passes.
#[tokio::test]
async fn an_oversized_job_gets_a_pending_reason_then_fails_at_the_queue_timeout() {
    let mut w = World::start(
        "mon-oversized",
        |c| c.monitor.queue_timeout = Some(Duration::from_secs(600)),
        |_| {},
    )
    .await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let mut job = job("m4", "sleep 10");
    job.replicas = 2;
    if let Some(p) = job.product.as_mut() {
        p.cpu = 64;
    }
    w.submit(&job).await;
    w.advance(5);
    // A watch that lags under load may first show the job without its PodGroup ("waiting in queue").
    let told = |e: &&volcano_runner::messages::v1::JobEvent| {
        e.reason == "unschedulable" && e.pending.as_ref().is_some_and(|p| p.never_fits)
    };
    w.until("the unschedulable reason", |s| {
        s.of("m4").lifecycle.iter().any(|e| told(&e))
    })
    .await;
    let pending = w.seen.lifecycle.iter().find(told).unwrap().clone();
    assert!(
        pending
            .status
            .starts_with("waiting for resources: 2 of 2 pods need 64 vCPU"),
        "{}",
        pending.status
    );
    let details = pending.pending.expect("pending details");
    assert_eq!((details.unschedulable_pods, details.total_pods), (2, 2));
    assert!(details.never_fits, "{details:?}");
    assert!(
        pending
            .status
            .contains("it can never start on this cluster: no node has enough CPU"),
        "{}",
        pending.status
    );
    let before = w.seen.of("m4").lifecycle.len();
    w.advance(300);
    w.settle(Duration::from_millis(300)).await;
    assert_eq!(
        w.seen.of("m4").lifecycle.len(),
        before,
        "the same reason is not published again"
    );
    w.advance(300);
    w.until("FAILURE", |s| s.event("m4/FAILURE").is_some())
        .await;
    let failure = w.seen.event("m4/FAILURE").unwrap();
    assert_eq!(failure.reason, "queue_timeout");
    assert!(
        failure.status.contains("waiting for resources"),
        "{}",
        failure.status
    );
    runner.stop().await;
    w.close().await;
}

/// Warnings 15 and 5 minutes before the expiry, an extension that moves the expiry and the warnings,
/// then deletion at the new expiry and EXPIRED, charged up to the expiry.
#[tokio::test]
async fn expiry_warns_then_terminates_and_an_extension_moves_both() {
    let mut w = World::start("mon-expiry", |_| {}, |_| {}).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let mut job = job("m5", "sleep infinity");
    job.time_allocation = Some(pbjson_types::Duration {
        seconds: 1200,
        nanos: 0,
    });
    let ns = w.namespace_of(&job);
    w.submit(&job).await;
    w.advance(2);
    w.until("RUNNING", |s| s.event("m5/RUNNING").is_some())
        .await;
    let running = w.seen.event("m5/RUNNING").unwrap().clone();
    let start = ms(&running.started_at);
    let expiry = start + 1_200_000;
    assert_eq!(ms(&running.expires_at), expiry);
    // To 15 minutes before the expiry.
    w.advance_to_ms(expiry - 900_000);
    w.until("the 15-minute warning", |s| {
        s.event(&format!("m5/warning/{expiry}/15")).is_some()
    })
    .await;
    let warning = w.seen.event(&format!("m5/warning/{expiry}/15")).unwrap();
    assert_eq!(ms(&warning.timestamp), expiry - 900_000);
    assert_eq!(warning.status, "Job expires in 15 minutes");
    // An extension of 10 minutes, as the runner applies it.
    extend(&w, &ns, "j-m5", "req-1", 10).await;
    let moved = expiry + 600_000;
    // The old 5-minute mark passes without a warning; the new 15-minute one comes.
    w.advance(600);
    w.until("the moved 15-minute warning", |s| {
        s.event(&format!("m5/warning/{moved}/15")).is_some()
    })
    .await;
    assert!(
        w.seen.event(&format!("m5/warning/{expiry}/5")).is_none(),
        "the old expiry's warnings are dead"
    );
    w.advance(600);
    w.until("the moved 5-minute warning", |s| {
        s.event(&format!("m5/warning/{moved}/5")).is_some()
    })
    .await;
    assert!(
        w.vcjob(&ns, "m5").is_some(),
        "not deleted before the expiry"
    );
    w.advance_to_ms(moved);
    // Terminated at the expiry (a TerminateJob command, not a deletion); Volcano then stops the pod (a
    // second later in the simulator).
    let terminating = async {
        while !w.vcjob(&ns, "m5").is_some_and(|j| {
            j.pointer("/metadata/deletionTimestamp").is_none()
                && matches!(
                    j.pointer("/status/state/phase").and_then(|p| p.as_str()),
                    Some("Terminating" | "Terminated")
                )
        }) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(PATIENCE, terminating)
        .await
        .expect("the job is terminated at its expiry");
    w.advance(5);
    w.until("EXPIRED", |s| s.event("m5/EXPIRED").is_some())
        .await;
    w.until("the final tick", Seen::has_final_tick).await;
    let expired = w.seen.event("m5/EXPIRED").unwrap().clone();
    assert_eq!(
        ms(&expired.ended_at),
        moved,
        "charged up to the expiry, not past it"
    );
    let ticks = w.seen.of("m5").unique_ticks();
    check_ticks("m5", &ticks, start, moved);
    w.released_then_gone(&ns, "m5").await;
    runner.stop().await;
    w.close().await;
}

/// A 2-replica web job: CREATE when both ranks have IPs, UPDATE when a rank's pod comes back with a new
/// IP, REMOVE at the end; on the proxy fanout exchange.
#[tokio::test]
async fn proxy_create_update_and_remove_for_a_two_replica_web_job() {
    let mut w = World::start("mon-proxy", |_| {}, |_| {}).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let job = web_job("m6", 2, "sleep 600");
    let ns = w.namespace_of(&job);
    w.submit(&job).await;
    w.advance(2);
    w.until("proxy CREATE", |s| {
        s.of("m6")
            .proxy
            .iter()
            .any(|p| p.action == ProxyAction::Create as i32)
    })
    .await;
    let create = w
        .seen
        .proxy
        .iter()
        .find(|p| p.action == ProxyAction::Create as i32)
        .unwrap()
        .clone();
    assert_eq!(create.targets.len(), 2);
    for (rank, target) in create.targets.iter().enumerate() {
        let pod = w.pod(&ns, &format!("j-m6-job-{rank}")).unwrap();
        assert_eq!(target.rank, rank as u32);
        assert_eq!(
            Some(target.pod_ip.as_str()),
            pod.pointer("/status/podIP").and_then(|v| v.as_str())
        );
        assert_eq!(target.port, 8080);
        assert_eq!(target.hostname, format!("j-m6-job-{rank}.j-m6"));
    }
    let proxy_messages: Vec<_> = w
        .raw
        .iter()
        .filter(|e| e.exchange == w.config.broker.proxy_exchange)
        .collect();
    assert!(
        !proxy_messages.is_empty(),
        "proxy events go to the fanout exchange"
    );
    // A node drain: rank 1's node is cordoned and its pod deleted; Volcano restarts the job elsewhere
    // and the ranks come back with new IPs.
    let rank1 = w.pod(&ns, "j-m6-job-1").unwrap();
    let node = rank1
        .pointer("/spec/nodeName")
        .and_then(|v| v.as_str())
        .expect("rank 1 is bound")
        .to_owned();
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(w.client.clone());
    nodes
        .patch(
            &node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("the node is cordoned");
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(w.client.clone(), &ns);
    pods.delete("j-m6-job-1", &Default::default())
        .await
        .expect("the pod is deleted");
    for _ in 0..4 {
        w.advance(5);
    }
    w.until("proxy UPDATE", |s| {
        s.of("m6")
            .proxy
            .iter()
            .any(|p| p.action == ProxyAction::Update as i32)
    })
    .await;
    let update = w
        .seen
        .proxy
        .iter()
        .find(|p| p.action == ProxyAction::Update as i32)
        .unwrap()
        .clone();
    assert_eq!(update.targets.len(), 2);
    assert_ne!(update.targets, create.targets, "new targets");
    // The UPDATE is recorded (its sequence) before the cancel. A cancel that lands between the UPDATE's
    // publication and its record gets a REMOVE with the UPDATE's number, which a proxy still takes over
    // it (REMOVE wins a tie, see `ProxyEvent.sequence`); this test checks the numbering of the ordinary
    // case, so it waits, as it read 2 instead of 3 once under a fully loaded run.
    let recorded = tokio::time::Instant::now() + Duration::from_secs(60);
    while w
        .vcjob(&ns, "m6")
        .and_then(|j| {
            j["metadata"]["annotations"][w.keys.proxy_sequence.as_str()]
                .as_str()
                .map(str::to_owned)
        })
        .as_deref()
        != Some("2")
    {
        assert!(
            tokio::time::Instant::now() < recorded,
            "the UPDATE's sequence is never recorded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Cancel as the runner does: cause and reason first, then the delete.
    let api: kube::Api<volcano_runner::volcano::VolcanoJob> =
        kube::Api::namespaced(w.client.clone(), &ns);
    api.patch(
        "j-m6",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {
            w.keys.termination_cause.as_str(): "cancelled",
            w.keys.termination_reason.as_str(): "the user closed the session",
        }}})),
    )
    .await
    .unwrap();
    api.delete("j-m6", &Default::default()).await.unwrap();
    for _ in 0..4 {
        w.advance(5);
    }
    w.until("CANCELLED and proxy REMOVE", |s| {
        s.event("m6/CANCELLED").is_some()
            && s.of("m6")
                .proxy
                .iter()
                .any(|p| p.action == ProxyAction::Remove as i32)
    })
    .await;
    let cancelled = w.seen.event("m6/CANCELLED").unwrap();
    assert_eq!(
        cancelled.status,
        "Job was cancelled: the user closed the session"
    );
    // REMOVE before the terminal event.
    let order: Vec<String> = w
        .raw
        .iter()
        .filter_map(|e| e.message_id.clone())
        .filter(|id| id.starts_with("m6/"))
        .collect();
    let remove = order
        .iter()
        .position(|id| id.contains("/proxy/remove/"))
        .unwrap();
    let end = order.iter().position(|id| id == "m6/CANCELLED").unwrap();
    assert!(remove < end, "{order:?}");
    // Each event is numbered after the last, so a proxy can tell a late one from a newer one.
    let sequences: BTreeSet<(i32, u64)> = w
        .seen
        .of("m6")
        .proxy
        .iter()
        .map(|p| (p.action, p.sequence))
        .collect();
    assert_eq!(
        sequences,
        BTreeSet::from([
            (ProxyAction::Create as i32, 1),
            (ProxyAction::Update as i32, 2),
            (ProxyAction::Remove as i32, 3),
        ])
    );
    runner.stop().await;
    w.close().await;
}

/// Extends a job as the runner does: read, one patch guarded by the resourceVersion, again on 409.
async fn extend(w: &World, ns: &str, name: &str, request: &str, minutes: i64) {
    use volcano_runner::pipeline::plugins::expiry::{self, Extension};
    use volcano_runner::volcano::VolcanoJob;
    let api: kube::Api<VolcanoJob> = kube::Api::namespaced(w.client.clone(), ns);
    for _ in 0..20 {
        let job = api.get(name).await.expect("the job");
        let extension = expiry::extend(
            &job,
            &w.config.pipeline,
            request,
            jiff::SignedDuration::from_mins(minutes),
        )
        .unwrap();
        let Extension::Apply { plan, .. } = extension else {
            panic!("the extension applies");
        };
        match api
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(plan.merge_patch().unwrap()),
            )
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => panic!("extending: {e}"),
        }
    }
    panic!("the extension kept conflicting");
}

/// A running job with nothing due is not decided again on every pass: its job, pod and PodGroup are the
/// versions it was last decided on. A deadline still makes it decided again: the next tick goes out
/// although none of its objects changed.
#[tokio::test]
async fn a_quiet_job_keeps_its_decision_until_its_next_deadline() {
    let mut w = World::start(
        "mon-quiet",
        |c| c.monitor.reconcile_interval = Duration::from_secs(1),
        |_| {},
    )
    .await;
    let mut runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let job = job("z1", "sleep 1000");
    w.submit(&job).await;
    w.advance(3);
    w.until("RUNNING", |s| s.event("z1/RUNNING").is_some())
        .await;
    let quiet = tokio::time::timeout(
        PATIENCE,
        runner
            .reports
            .wait_for(|r| r.passes > 0 && r.owned == 1 && r.decided == 0),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    assert!(
        quiet,
        "no pass left the quiet job alone: {:?}",
        *runner.reports.borrow()
    );
    assert!(w.seen.of("z1").unique_ticks().is_empty());
    // The first boundary plus the accounting settle delay (10 s).
    w.advance(71);
    w.until("the first tick", |s| !s.of("z1").unique_ticks().is_empty())
        .await;
    let start = ms(&w.seen.event("z1/RUNNING").unwrap().started_at);
    let tick = &w.seen.of("z1").unique_ticks()[0];
    assert_eq!(tick.tick_id, "z1/0", "{tick:?}");
    assert_eq!(ms(&tick.interval_start), start);
    assert_eq!(tick.duration_ms, 60_000);
    runner.stop().await;
    w.close().await;
}

/// A 59 s job whose end the kubelet reports 2 s late: at the tick boundary (60 s) its pod still looks
/// running. It is charged one final tick of exactly 59 s: never a full 60 s tick plus a zero-length one,
/// and every tick has its duration.
#[tokio::test]
async fn an_end_the_kubelet_reports_late_is_charged_to_the_real_end() {
    let mut w = World::start(
        "mon-lag",
        |_| {},
        |s| s.status_report_delay = Duration::from_secs(2),
    )
    .await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    w.submit(&job("lag1", "sleep 59")).await;
    w.advance(3);
    w.until("RUNNING", |s| s.event("lag1/RUNNING").is_some())
        .await;
    for _ in 0..80 {
        w.advance(1);
        w.settle(Duration::from_millis(20)).await;
    }
    w.until("SUCCESS and the final tick", |s| {
        s.event("lag1/SUCCESS").is_some() && s.of("lag1").has_final_tick()
    })
    .await;
    w.settle(Duration::from_millis(300)).await;
    let seen = w.seen.of("lag1");
    let success = seen.event("lag1/SUCCESS").unwrap();
    let (start, end) = (ms(&success.started_at), ms(&success.ended_at));
    assert_eq!(end - start, 59_000, "the real run time");
    let ticks = seen.unique_ticks();
    assert_eq!(ticks.len(), 1, "{ticks:?}");
    assert_eq!(ticks[0].duration_ms, 59_000);
    assert!(ticks[0].r#final);
    check_ticks("lag1", &ticks, start, end);
    runner.stop().await;
    w.close().await;
}

/// A job behind a running one is told, with its first status, when it will start: the running job's
/// persisted expiry (its time limit from its real start) plus the start margin. The estimate is not told again while it holds,
/// and the job starts at or before it when the job ahead ends early.
#[tokio::test]
async fn a_waiting_job_is_told_when_it_will_start() {
    let mut w = World::start(
        "mon-estimate",
        |_| {},
        |s| {
            s.nodes = vec![volcano_runner::sim::NodeSpec {
                name: "only".into(),
                cpu: "16".into(),
                memory: "128Gi".into(),
                gpus: 0,
                max_pods: 110,
                labels: Default::default(),
                taints: Vec::new(),
            }]
        },
    )
    .await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let sized = |id: &str, cpu: u32, script: &str| {
        let mut j = job(id, script);
        j.product.as_mut().unwrap().cpu = cpu;
        j
    };
    // Ends after 20 minutes of its 60.
    w.submit(&sized("est-a", 16, "sleep 1200")).await;
    w.advance(1);
    w.until("RUNNING of the job ahead", |s| {
        s.event("est-a/RUNNING").is_some()
    })
    .await;
    let expiry = w.seen.event("est-a/RUNNING").unwrap().expires_at.unwrap();
    w.submit(&sized("est-b", 8, "sleep 10")).await;
    w.advance(5);
    w.until("the waiting job's status", |s| {
        s.of("est-b").lifecycle.iter().any(|e| e.pending.is_some())
    })
    .await;
    let status = w
        .seen
        .of("est-b")
        .lifecycle
        .into_iter()
        .find(|e| e.pending.is_some())
        .unwrap();
    let pending = status.pending.unwrap();
    // Plus the default `[monitor] start_margin`: the time the scheduler takes to place it then.
    let mut freed = expiry;
    freed.seconds += i64::try_from(
        volcano_runner::config::MonitorConfig::default()
            .start_margin
            .as_secs(),
    )
    .unwrap();
    assert_eq!(
        pending.estimated_start_at,
        Some(freed),
        "the job ahead's expiry and the start margin: {pending:?}"
    );
    assert!(
        pending
            .estimate_basis
            .contains("1 of 1 running jobs end by then"),
        "{}",
        pending.estimate_basis
    );
    let told = w.seen.of("est-b").lifecycle.len();
    w.advance(120);
    w.settle(Duration::from_millis(500)).await;
    assert_eq!(
        w.seen.of("est-b").lifecycle.len(),
        told,
        "an estimate that holds is not told again"
    );
    w.advance(1100);
    w.until("RUNNING of the waiting job", |s| {
        s.event("est-b/RUNNING").is_some()
    })
    .await;
    let started = w.seen.event("est-b/RUNNING").unwrap().started_at.unwrap();
    assert!(
        started.seconds <= expiry.seconds,
        "started {started:?}, promised by {expiry:?}"
    );
    runner.stop().await;
    w.close().await;
}
