//! Booked starts (docs/bookings.md) against the simulator (stopped clock) and a real RabbitMQ, through
//! real runners' consumers and monitors: a booking is answered at once (`booked` with the start and the
//! nodes, or FAILURE `booking_refused` with the earliest window that could be promised); the booked
//! nodes carry the booking's taint, so a waiting job that fits there now is not placed there; at the
//! booked start the job is released and runs, within the start margin. Two runners booking the last
//! capacity at the same instant: one booked, one refused with the next window, which then books. A
//! cancelled booking frees its capacity at once.

use crate::monitor_support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use monitor_support::*;
use volcano_runner::messages::v1::{JobEvent, JobState, StartWindow, SubmitJob};

/// `n` nodes of 4 CPU and 16 GiB, `n1` to `n<n>`.
fn small_nodes(s: &mut volcano_runner::sim::SimConfig, n: usize) {
    s.nodes = (1..=n)
        .map(|i| volcano_runner::sim::NodeSpec {
            name: format!("n{i}"),
            cpu: "4".into(),
            memory: "16Gi".into(),
            gpus: 0,
            max_pods: 110,
            labels: Default::default(),
            taints: Vec::new(),
        })
        .collect();
}

/// Every share bookable: these clusters are tiny.
fn all_bookable(c: &mut volcano_runner::config::Config) {
    c.bookings.max_share = 1.0;
    c.bookings.max_share_per_owner = 1.0;
}

/// The world of a booking test: `nodes` nodes of 4 CPU and 16 GiB, every share bookable, the bookings'
/// periodic pass every `check_interval` (`None`: the default).
async fn booking_world(label: &str, nodes: usize, check_interval: Option<Duration>) -> World {
    booking_world_with(label, nodes, check_interval, |_| {}, |_| {}).await
}

/// [`booking_world`], with the runner config changed further by `config` and the nodes by `shape`.
async fn booking_world_with(
    label: &str,
    nodes: usize,
    check_interval: Option<Duration>,
    config: impl FnOnce(&mut volcano_runner::config::Config),
    shape: impl FnOnce(&mut Vec<volcano_runner::sim::NodeSpec>),
) -> World {
    World::start(
        label,
        |c| {
            all_bookable(c);
            if let Some(interval) = check_interval {
                c.bookings.check_interval = interval;
            }
            config(c);
        },
        |s| {
            small_nodes(s, nodes);
            shape(&mut s.nodes);
        },
    )
    .await
}

/// Stops what [`runner_a`] started, then the world.
async fn close(w: World, runner: TestRunner, consumer: TestConsumer) {
    consumer.stop().await;
    runner.stop().await;
    w.close().await;
}

/// Starts the runner "runner-a": its monitor, once it holds all four shards, and its consumer.
async fn runner_a(w: &World) -> (TestRunner, TestConsumer) {
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    (runner, w.consumer("runner-a").await)
}

/// A job of `cpu` CPUs (4 GiB each) with a time limit of `secs`, running `script`.
fn sized(job_id: &str, cpu: u32, secs: i64, script: &str) -> SubmitJob {
    let mut j = job(job_id, script);
    let p = j.product.as_mut().unwrap();
    p.cpu = cpu;
    p.memory_gib = 4;
    j.time_allocation = Some(pbjson_types::Duration {
        seconds: secs,
        nanos: 0,
    });
    j
}

fn window(from: jiff::Timestamp, to: jiff::Timestamp) -> StartWindow {
    StartWindow {
        earliest: Some(volcano_runner::messages::proto_timestamp(from)),
        latest: Some(volcano_runner::messages::proto_timestamp(to)),
    }
}

fn booked_at(job: SubmitJob, from: jiff::Timestamp, to: jiff::Timestamp) -> SubmitJob {
    SubmitJob {
        start_window: Some(window(from, to)),
        ..job
    }
}

/// The booking answer of `job_id`: its `booked` status or its `booking_refused` FAILURE.
fn answer<'a>(seen: &'a Seen, job_id: &str) -> Option<&'a JobEvent> {
    seen.lifecycle
        .iter()
        .find(|e| e.job_id == job_id && (e.reason == "booked" || e.reason == "booking_refused"))
}

async fn answered(w: &mut World, job_id: &str) -> JobEvent {
    w.until(&format!("{job_id}'s booking answered"), |s| {
        answer(s, job_id).is_some()
    })
    .await;
    answer(&w.seen, job_id).unwrap().clone()
}

async fn steps(w: &mut World, n: usize) {
    for _ in 0..n {
        w.advance(2);
        w.settle(Duration::from_millis(300)).await;
    }
}

/// `(node, booking label)` of every booked node, each of which carries the bookings' taint too.
async fn booking_taints(w: &World) -> Vec<(String, String)> {
    let prefix = format!("{}booked-", w.keys.prefix);
    let taint = format!("{}booked", w.keys.prefix);
    let nodes: kube::Api<Node> = kube::Api::all(w.client.clone());
    let mut out = Vec::new();
    for n in nodes.list(&Default::default()).await.unwrap().items {
        let name = n.metadata.name.clone().unwrap_or_default();
        let labels: Vec<String> = n
            .metadata
            .labels
            .clone()
            .unwrap_or_default()
            .into_keys()
            .filter(|k| k.starts_with(&prefix))
            .collect();
        let tainted = n
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == taint && t.effect == "NoSchedule");
        assert_eq!(tainted, !labels.is_empty(), "{name}: {labels:?}");
        out.extend(labels.into_iter().map(|l| (name.clone(), l)));
    }
    out.sort();
    out
}

/// The start last estimated for `job_id`, once one is told.
async fn last_estimate(w: &mut World, job_id: &str) -> jiff::Timestamp {
    let told = |s: &Seen| {
        s.of(job_id)
            .lifecycle
            .iter()
            .filter_map(|e| e.pending.as_ref()?.estimated_start_at)
            .next_back()
    };
    w.until(&format!("{job_id}'s estimate"), |s| told(s).is_some())
        .await;
    ts(&told(&w.seen))
}

fn ts(t: &Option<pbjson_types::Timestamp>) -> jiff::Timestamp {
    let t = t.as_ref().expect("a time");
    jiff::Timestamp::new(t.seconds, t.nanos).unwrap()
}

/// A running job holds n1 for an hour. A booking at half an hour gets n2 (the only room then), and n2
/// carries its taint; a job that would fit on n2 now, and one without a time limit, are kept off it,
/// and the first is told an estimate that counts the booking (not before the running job's end).
/// At the booked start the booked job is released and RUNNING within the start margin; the others
/// still wait.
#[tokio::test]
async fn a_booked_job_starts_at_its_time_on_capacity_nothing_else_took() {
    let mut w = booking_world("book-start", 2, None).await;
    let (runner, consumer) = runner_a(&w).await;
    let ns = w.namespace_of(&job("x", "true"));

    w.publish_submit(&sized("bk-run", 4, 3600, "sleep 100000"))
        .await;
    w.until("the first job QUEUED", |s| {
        s.event("bk-run/QUEUED").is_some()
    })
    .await;
    steps(&mut w, 3).await;
    w.until("the first job RUNNING", |s| {
        s.event("bk-run/RUNNING").is_some()
    })
    .await;
    let held = w
        .pod(&ns, "j-bk-run-job-0")
        .and_then(|p| p.pointer("/spec/nodeName")?.as_str().map(str::to_owned))
        .expect("bound");
    let free = if held == "n1" { "n2" } else { "n1" };

    let t = w.sim.now() + jiff::SignedDuration::from_mins(30);
    w.publish_submit(&booked_at(sized("bk-1", 4, 3600, "sleep 600"), t, t))
        .await;
    let booked = answered(&mut w, "bk-1").await;
    assert_eq!(booked.reason, "booked", "{}", booked.status);
    assert_eq!(
        booked.event_id,
        format!("bk-1/booked/{}", t.as_millisecond())
    );
    let details = booked.booking.clone().unwrap();
    assert_eq!(ts(&details.start_at), t);
    assert_eq!(details.nodes, vec![free.to_owned()]);
    assert_eq!(
        booking_taints(&w).await,
        vec![(free.to_owned(), format!("{}booked-bk-1", w.keys.prefix))]
    );

    // Waiting jobs that fit on the free node now: one that would run past the booked start, one without
    // a limit. Neither is placed there.
    w.publish_submit(&sized("bk-batch", 4, 3600, "sleep 100000"))
        .await;
    let mut forever = sized("bk-forever", 4, 3600, "sleep 100000");
    forever.time_allocation = None;
    w.publish_submit(&forever).await;
    w.until("both QUEUED", |s| {
        s.event("bk-batch/QUEUED").is_some() && s.event("bk-forever/QUEUED").is_some()
    })
    .await;
    steps(&mut w, 5).await;
    // Its estimate counts the booking: not the booked node free now, but the running job's node at its
    // time limit.
    let run_expiry = ts(&w.seen.event("bk-run/RUNNING").unwrap().expires_at);
    let told = last_estimate(&mut w, "bk-batch").await;
    assert!(
        told >= run_expiry,
        "told {told}, before the running job's end {run_expiry}: the booked node counted as free"
    );
    for id in ["bk-1", "bk-batch", "bk-forever"] {
        assert!(
            w.seen.event(&format!("{id}/RUNNING")).is_none(),
            "{id} runs before the booked start: {:#?}",
            summary(&w.seen)
        );
    }

    // The booked start: released, placed and RUNNING within the margin.
    w.advance_to_ms(t.as_millisecond());
    w.settle(Duration::from_millis(300)).await;
    steps(&mut w, 3).await;
    w.until("the booked job RUNNING", |s| {
        s.event("bk-1/RUNNING").is_some()
    })
    .await;
    let started = ts(&w.seen.event("bk-1/RUNNING").unwrap().started_at);
    let margin = jiff::SignedDuration::try_from(w.config.monitor.start_margin).unwrap();
    assert!(
        started >= t && started <= t + margin,
        "started {started}, booked {t}, margin {margin:#}"
    );
    assert_eq!(
        w.pod(&ns, "j-bk-1-job-0")
            .and_then(|p| p.pointer("/spec/nodeName")?.as_str().map(str::to_owned)),
        Some(free.to_owned())
    );
    for id in ["bk-batch", "bk-forever"] {
        assert!(w.seen.event(&format!("{id}/RUNNING")).is_none(), "{id}");
    }
    close(w, runner, consumer).await;
}

/// Four nodes of 16 CPU, busy: six batch jobs of 8 CPU run for their hour, three jobs without a time
/// limit hold 4 CPU each for good, and a backlog of eight more batch jobs (two without a limit) waits.
/// Thirty single-rank interactive sessions are booked for T, two hours ahead: all are booked, all start
/// within the start margin of T, and no batch job started on a booked node while its booking stood.
#[tokio::test]
async fn thirty_sessions_booked_on_a_busy_cluster_all_start_at_their_time() {
    let mut w = booking_world_with(
        "book-thirty",
        4,
        None,
        |c| {
            // Half the cluster bookable (the default), all of that by one owner.
            c.bookings.max_share = 0.5;
            c.bookings.max_share_per_owner = 0.5;
            c.runner.max_in_flight = 8;
        },
        |nodes| {
            for n in nodes {
                n.cpu = "16".into();
                n.memory = "128Gi".into();
            }
        },
    )
    .await;
    let (runner, consumer) = runner_a(&w).await;
    let (batch, backlog) = busy_cluster(&mut w).await;

    let t = w.sim.now() + jiff::SignedDuration::from_hours(2);
    let sessions: Vec<String> = (0..30).map(|i| format!("class-{i:02}")).collect();
    for id in &sessions {
        let mut s = web_job(id, 1, "sleep 100000");
        s.time_allocation = Some(pbjson_types::Duration {
            seconds: 3600,
            nanos: 0,
        });
        w.publish_submit(&booked_at(s, t, t)).await;
    }
    let mut booked_nodes = std::collections::BTreeSet::new();
    for id in &sessions {
        let a = answered(&mut w, id).await;
        assert_eq!(a.reason, "booked", "{id}: {}", a.status);
        assert_eq!(ts(&a.booking.as_ref().unwrap().start_at), t);
        booked_nodes.extend(a.booking.unwrap().nodes);
    }
    let booked_at_ms = w.sim.now().as_millisecond();

    // The first batch expires at its hour; the backlog starts where it may.
    let first_hour = w.sim.now() + jiff::SignedDuration::from_mins(61);
    w.advance_to_ms(first_hour.as_millisecond());
    steps(&mut w, 5).await;
    w.advance_to_ms(t.as_millisecond());
    w.settle(Duration::from_millis(300)).await;
    steps(&mut w, 3).await;
    w.until("every session RUNNING", |s| {
        sessions
            .iter()
            .all(|id| s.event(&format!("{id}/RUNNING")).is_some())
    })
    .await;
    let margin = jiff::SignedDuration::try_from(w.config.monitor.start_margin).unwrap();
    for id in &sessions {
        let started = ts(&w.seen.event(&format!("{id}/RUNNING")).unwrap().started_at);
        assert!(
            started >= t && started <= t + margin,
            "{id} started {started}, booked {t}"
        );
    }
    // A batch job that started on a booked node after the bookings were made had a limit that ended
    // it by T (the just-in-time rule); none without a limit did.
    let ns = w.namespace_of(&job("x", "true"));
    for j in batch.iter().chain(&backlog) {
        let Some(running) = w.seen.event(&format!("{}/RUNNING", j.job_id)) else {
            continue;
        };
        if ms(&running.started_at) < booked_at_ms {
            continue;
        }
        let node = w
            .pod(&ns, &format!("j-{}-job-0", j.job_id))
            .and_then(|p| p.pointer("/spec/nodeName")?.as_str().map(str::to_owned));
        if node.as_ref().is_none_or(|n| !booked_nodes.contains(n)) {
            continue;
        }
        let limit = j.time_allocation.as_ref().map(|d| d.seconds);
        assert!(
            limit.is_some_and(|l| ms(&running.started_at) + l * 1000 <= t.as_millisecond()),
            "{} started on booked node {node:?} at {} with limit {limit:?}, past {t}",
            j.job_id,
            ms(&running.started_at)
        );
    }
    close(w, runner, consumer).await;
}

/// The busy cluster of the thirty sessions: six batch jobs of 8 CPU for an hour and three of 4 CPU
/// without a limit, running; eight more batch jobs of 8 CPU (two without a limit) waiting behind them.
async fn busy_cluster(w: &mut World) -> (Vec<SubmitJob>, Vec<SubmitJob>) {
    let mut batch = Vec::new();
    for i in 0..6 {
        batch.push(sized(&format!("busy-{i}"), 8, 3600, "sleep 100000"));
    }
    for i in 0..3 {
        let mut j = sized(&format!("forever-{i}"), 4, 3600, "sleep 100000");
        j.time_allocation = None;
        batch.push(j);
    }
    for j in &batch {
        w.publish_submit(j).await;
    }
    steps(w, 4).await;
    w.until("the first batch running", |s| {
        (0..6).all(|i| s.event(&format!("busy-{i}/RUNNING")).is_some())
            && (0..3).all(|i| s.event(&format!("forever-{i}/RUNNING")).is_some())
    })
    .await;
    let mut backlog = Vec::new();
    for i in 0..8 {
        let mut j = sized(&format!("later-{i}"), 8, 3600, "sleep 100000");
        if i % 4 == 0 {
            j.time_allocation = None;
        }
        backlog.push(j);
    }
    for j in &backlog {
        w.publish_submit(j).await;
    }
    (batch, backlog)
}

/// One node: two runners book it for the same hour at the same instant. Exactly one is booked; the
/// other is refused with the window from the first's end, and booking that window succeeds. Cancelling
/// a booking frees it at once: its taint goes, and the same hour books again.
#[tokio::test]
async fn two_runners_never_promise_the_same_capacity_and_a_cancel_frees_it() {
    let mut w = booking_world("book-race", 1, None).await;
    let a = w.consumer("runner-a").await;
    let b = w.consumer("runner-b").await;
    let t = w.sim.now() + jiff::SignedDuration::from_hours(2);
    let first = booked_at(sized("race-1", 4, 3600, "sleep 60"), t, t);
    let second = booked_at(sized("race-2", 4, 3600, "sleep 60"), t, t);
    tokio::join!(w.publish_submit(&first), w.publish_submit(&second));
    let one = answered(&mut w, "race-1").await;
    let two = answered(&mut w, "race-2").await;
    let (won, lost) = match (one.reason.as_str(), two.reason.as_str()) {
        ("booked", "booking_refused") => (one, two),
        ("booking_refused", "booked") => (two, one),
        other => panic!(
            "not one of each: {other:?}: {} / {}",
            one.status, two.status
        ),
    };
    assert_eq!(lost.state, JobState::Failure as i32);
    assert!(
        lost.status.starts_with("startWindow: cannot be promised"),
        "{}",
        lost.status
    );
    let next = lost
        .booking
        .as_ref()
        .and_then(|b| b.earliest_window)
        .expect("the earliest window that could be booked");
    let won_end = ts(&won.booking.as_ref().unwrap().end_at);
    assert_eq!(ts(&next.earliest), won_end, "from the booked hour's end");
    assert_eq!(ts(&next.latest), won_end);
    let lost_id = lost.job_id.clone();
    assert!(
        w.vcjob(&w.namespace_of(&first), &lost_id).is_none(),
        "a refused booking creates nothing"
    );

    // The window offered books (the same job id: nothing was created under it).
    let again = booked_at(
        sized(&lost_id, 4, 3600, "sleep 60"),
        ts(&next.earliest),
        ts(&next.latest),
    );
    w.publish_submit(&again).await;
    w.until("the offered window booked", |s| {
        s.lifecycle
            .iter()
            .any(|e| e.job_id == lost_id && e.reason == "booked")
    })
    .await;

    // Cancelling the first frees its hour at once: its taint goes and a third books it.
    let won_id = won.job_id.clone();
    let consumer_cancel = volcano_runner::broker::Outbound::cancel(
        &volcano_runner::messages::v1::CancelJob {
            job_id: won_id.clone(),
            reason: Some("class moved".into()),
        },
        volcano_runner::messages::Format::Json,
        &w.config.broker,
    );
    publish(&w, consumer_cancel).await;
    let cancelled = format!("{won_id}/booking/{}/cancelled", t.as_millisecond());
    w.until("the booking's cancellation told", |s| {
        s.lifecycle.iter().any(|e| e.event_id == cancelled)
    })
    .await;
    let taints = booking_taints(&w).await;
    assert!(
        !taints
            .iter()
            .any(|(_, k)| k.ends_with(&format!("booked-{won_id}"))),
        "{taints:?}"
    );
    w.publish_submit(&booked_at(sized("race-3", 4, 3600, "sleep 60"), t, t))
        .await;
    let third = answered(&mut w, "race-3").await;
    assert_eq!(third.reason, "booked", "{}", third.status);
    a.stop().await;
    b.stop().await;
    w.close().await;
}

/// One node: a job running until T is followed there by a booking at T. Extending it by 20 minutes
/// would run into the booking: refused with `booked_capacity`, naming the start, and nothing changes.
#[tokio::test]
async fn an_extension_into_a_booking_is_refused_with_a_reason() {
    let mut w = booking_world("book-extend", 1, None).await;
    let (runner, consumer) = runner_a(&w).await;
    let ns = w.namespace_of(&job("x", "true"));
    w.publish_submit(&sized("ext-run", 4, 1800, "sleep 100000"))
        .await;
    steps(&mut w, 3).await;
    w.until("the running job RUNNING", |s| {
        s.event("ext-run/RUNNING").is_some()
    })
    .await;
    let expiry = ts(&w.seen.event("ext-run/RUNNING").unwrap().expires_at);
    w.publish_submit(&booked_at(
        sized("ext-bk", 4, 3600, "sleep 60"),
        expiry,
        expiry,
    ))
    .await;
    let booked = answered(&mut w, "ext-bk").await;
    assert_eq!(booked.reason, "booked", "{}", booked.status);

    let extend = volcano_runner::broker::Outbound::extend(
        &volcano_runner::messages::v1::ExtendJob {
            job_id: "ext-run".into(),
            request_id: "r1".into(),
            extension: Some(pbjson_types::Duration {
                seconds: 1200,
                nanos: 0,
            }),
        },
        volcano_runner::messages::Format::Json,
        &w.config.broker,
    );
    publish(&w, extend).await;
    w.until("the extension answered", |s| {
        s.event("ext-run/extend/r1").is_some()
    })
    .await;
    let answer = w.seen.event("ext-run/extend/r1").unwrap();
    assert_eq!(answer.reason, "booked_capacity", "{}", answer.status);
    assert!(
        answer.status.contains(&expiry.to_string()) && answer.status.contains("ext-bk"),
        "{}",
        answer.status
    );
    let job = w.vcjob(&ns, "ext-run").unwrap();
    assert_eq!(
        job.pointer(&format!(
            "/metadata/annotations/{}",
            w.keys.expiry.replace('/', "~1")
        ))
        .and_then(|v| v.as_str()),
        Some(expiry.as_millisecond().to_string().as_str()),
        "the expiry is unchanged"
    );
    close(w, runner, consumer).await;
}

/// Three nodes of 4 CPU; two sessions booked for T take two of them. The first's node is lost: its
/// booking is moved to the third node at the same start, and its user told so. A maintenance window is
/// then forced over the second's node at T: no room is left at T, so its booking is cancelled, its user
/// told, and its job CANCELLED without a charge. At T the moved session starts on its new node.
#[tokio::test]
async fn a_lost_node_moves_a_booking_and_a_forced_window_cancels_one() {
    let mut w = booking_world("book-broken", 3, Some(Duration::from_millis(200))).await;
    let (runner, consumer) = runner_a(&w).await;
    let ns = w.namespace_of(&job("x", "true"));
    let t = w.sim.now() + jiff::SignedDuration::from_hours(1);
    w.publish_submit(&booked_at(sized("lost-a", 4, 1800, "sleep 600"), t, t))
        .await;
    let a = answered(&mut w, "lost-a").await;
    w.publish_submit(&booked_at(sized("lost-b", 4, 1800, "sleep 600"), t, t))
        .await;
    let b = answered(&mut w, "lost-b").await;
    assert_eq!((a.reason.as_str(), b.reason.as_str()), ("booked", "booked"));
    let a_node = a.booking.unwrap().nodes[0].clone();
    let b_node = b.booking.unwrap().nodes[0].clone();

    let nodes: kube::Api<Node> = kube::Api::all(w.client.clone());
    nodes.delete(&a_node, &Default::default()).await.unwrap();
    let moved = format!("lost-a/booking/{}/moved", t.as_millisecond());
    w.until("the first booking moved", |s| s.event(&moved).is_some())
        .await;
    let event = w.seen.event(&moved).unwrap().clone();
    assert_eq!(event.reason, "booking_moved");
    assert!(
        event.status.contains(&format!("node {a_node} was lost")),
        "{}",
        event.status
    );
    let new_node = event.booking.unwrap().nodes[0].clone();
    assert!(new_node != a_node && new_node != b_node, "{new_node}");
    assert_eq!(
        booking_taints(&w).await,
        vec![
            (b_node.clone(), format!("{}booked-lost-b", w.keys.prefix)),
            (new_node.clone(), format!("{}booked-lost-a", w.keys.prefix)),
        ]
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect::<Vec<_>>()
    );

    // Forced over the second's node at T (the CLI refuses it without --force).
    force_window(&w, &b_node, t, "lost-b").await;
    let cancelled = format!("lost-b/booking/{}/cancelled", t.as_millisecond());
    w.until("the second booking cancelled", |s| {
        s.event(&cancelled).is_some()
    })
    .await;
    let event = w.seen.event(&cancelled).unwrap();
    assert_eq!(event.reason, "booking_cancelled");
    assert!(event.status.contains("firmware"), "{}", event.status);
    steps(&mut w, 2).await;
    w.until("the second job CANCELLED", |s| {
        s.event("lost-b/CANCELLED").is_some()
    })
    .await;
    assert!(
        w.seen
            .event("lost-b/CANCELLED")
            .unwrap()
            .status
            .contains("booking could not be kept"),
        "{}",
        w.seen.event("lost-b/CANCELLED").unwrap().status
    );
    assert!(w.seen.of("lost-b").ticks.is_empty(), "charged nothing");

    w.advance_to_ms(t.as_millisecond());
    w.settle(Duration::from_millis(300)).await;
    steps(&mut w, 3).await;
    w.until("the moved session RUNNING", |s| {
        s.event("lost-a/RUNNING").is_some()
    })
    .await;
    assert_eq!(
        w.pod(&ns, "j-lost-a-job-0")
            .and_then(|p| p.pointer("/spec/nodeName")?.as_str().map(str::to_owned)),
        Some(new_node),
        "{}",
        w.dump().await
    );
    close(w, runner, consumer).await;
}

/// The bookings' record as the runners use it.
fn record(w: &World) -> volcano_runner::cluster::Bookings {
    volcano_runner::cluster::Bookings::new(
        w.client.clone(),
        &w.config.cluster,
        &w.config.bookings,
        &w.keys,
    )
}

/// How often `event_id` was published.
fn times(w: &World, event_id: &str) -> usize {
    w.seen
        .lifecycle
        .iter()
        .filter(|e| e.event_id == event_id)
        .count()
}

/// One node, one session booked on it for T. A maintenance window is forced over the node at T, and
/// a runner's tidy cancels the booking (no other room) and dies before it tells anyone or cancels the
/// job. The news is in the record: another runner leaves it alone while the dead runner's claim
/// lasts, then takes it over, tells the user once, cancels the job (charged nothing, so it is never
/// released at T), and removes the news.
#[tokio::test]
async fn a_runner_killed_before_telling_a_broken_booking_leaves_it_to_the_next() {
    let mut w = booking_world("book-killed", 1, Some(Duration::from_millis(200))).await;
    let (runner, consumer) = runner_a(&w).await;
    let t = w.sim.now() + jiff::SignedDuration::from_hours(1);
    w.publish_submit(&booked_at(sized("killed", 4, 1800, "sleep 600"), t, t))
        .await;
    let a = answered(&mut w, "killed").await;
    assert_eq!(a.reason, "booked", "{}", a.status);
    // The consumer (whose tidy would tell) stops; the "runner" below tidies and dies at once.
    consumer.stop().await;
    force_window(&w, "n1", t, "killed").await;
    let dying = record(&w);
    let news = dying.tidy(w.sim.now(), "runner-dead").await.unwrap();
    assert_eq!(news.len(), 1, "{news:?}");
    drop(news);
    assert!(dying.list().await.unwrap().is_empty(), "the booking went");
    assert_eq!(dying.news().await.unwrap().len(), 1, "its news stays");

    let cancelled = format!("killed/booking/{}/cancelled", t.as_millisecond());
    let other = w.consumer("runner-b").await;
    w.settle(Duration::from_secs(2)).await;
    assert_eq!(
        times(&w, &cancelled),
        0,
        "told while the teller's claim lasts"
    );
    w.advance(60);
    w.until("the broken booking told", |s| s.event(&cancelled).is_some())
        .await;
    let event = w.seen.event(&cancelled).unwrap().clone();
    assert_eq!(event.reason, "booking_cancelled");
    assert_eq!(event.runner_id, "runner-b");
    assert!(event.status.contains("firmware"), "{}", event.status);
    steps(&mut w, 2).await;
    w.until("the job CANCELLED", |s| {
        s.event("killed/CANCELLED").is_some()
    })
    .await;
    assert!(
        w.seen
            .event("killed/CANCELLED")
            .unwrap()
            .status
            .contains("booking could not be kept"),
        "{}",
        w.seen.event("killed/CANCELLED").unwrap().status
    );
    steps(&mut w, 5).await;
    w.settle(Duration::from_secs(1)).await;
    assert_eq!(times(&w, &cancelled), 1, "told once");
    assert!(
        record(&w).news().await.unwrap().is_empty(),
        "the news told is gone"
    );
    assert!(w.seen.of("killed").ticks.is_empty(), "charged nothing");
    assert!(w.seen.event("killed/RUNNING").is_none(), "never released");
    other.stop().await;
    runner.stop().await;
    w.close().await;
}

/// One node; a session booked for T that ends a minute after its start, with an hour's allocation. A
/// job that waits for the node (it would run past T) does not start before T; once the session has
/// ended, its booking's marks go with it and the waiting job starts, long before the booking's end.
#[tokio::test]
async fn a_booked_job_that_ends_early_frees_its_capacity_then() {
    let mut w = booking_world("book-early", 1, Some(Duration::from_millis(200))).await;
    let (runner, consumer) = runner_a(&w).await;
    let t = w.sim.now() + jiff::SignedDuration::from_mins(5);
    w.publish_submit(&booked_at(sized("early", 4, 3600, "sleep 60"), t, t))
        .await;
    let a = answered(&mut w, "early").await;
    assert_eq!(a.reason, "booked", "{}", a.status);
    w.publish_submit(&sized("waits", 4, 3600, "sleep 600"))
        .await;
    steps(&mut w, 3).await;
    assert!(
        w.seen.event("waits/RUNNING").is_none(),
        "kept off the booked node"
    );

    w.advance_to_ms(t.as_millisecond());
    w.settle(Duration::from_millis(300)).await;
    steps(&mut w, 3).await;
    w.until("the booked session RUNNING", |s| {
        s.event("early/RUNNING").is_some()
    })
    .await;
    for _ in 0..60 {
        if w.seen.event("waits/RUNNING").is_some() {
            break;
        }
        steps(&mut w, 1).await;
    }
    let ended = w
        .seen
        .of("early")
        .lifecycle
        .iter()
        .find_map(|e| e.ended_at)
        .map(|t| ts(&Some(t)))
        .expect("the booked session ended");
    let started = ts(&w
        .seen
        .event("waits/RUNNING")
        .expect("the waiting job started once the booked one ended")
        .started_at);
    assert!(
        started >= ended,
        "started {started}, the session ended {ended}"
    );
    assert!(
        started < t + jiff::SignedDuration::from_mins(5),
        "started {started}: the booking ended early at {ended}, its end is {}",
        t + jiff::SignedDuration::from_hours(1)
    );
    assert!(
        record(&w).list().await.unwrap().is_empty(),
        "the booking went"
    );
    close(w, runner, consumer).await;
}

/// One node of 8 CPU, 4 of them booked for T two hours ahead. A job whose allocation (30 minutes) ends
/// before T is let onto the booked node just in time and runs there; it never runs past T; the booked
/// session still starts at T within the margin.
#[tokio::test]
async fn a_job_that_ends_before_the_booked_start_runs_on_booked_capacity() {
    let mut w = booking_world_with(
        "book-jit",
        1,
        Some(Duration::from_millis(200)),
        |_| {},
        // 8 CPU: the booked job's gang, admitted to its queue at once, reserves 4 of the cluster's
        // idle capacity (Volcano's enqueue), and the short job must still be admitted.
        |nodes| nodes[0].cpu = "8".into(),
    )
    .await;
    let (runner, consumer) = runner_a(&w).await;
    let t = w.sim.now() + jiff::SignedDuration::from_hours(2);
    w.publish_submit(&booked_at(sized("jit-b", 4, 1800, "sleep 600"), t, t))
        .await;
    let a = answered(&mut w, "jit-b").await;
    assert_eq!(a.reason, "booked", "{}", a.status);
    let booked = w.sim.now();
    w.publish_submit(&sized("short", 4, 1800, "sleep 60")).await;
    for _ in 0..60 {
        if w.seen.event("short/RUNNING").is_some() {
            break;
        }
        steps(&mut w, 1).await;
    }
    let started = ts(&w
        .seen
        .event("short/RUNNING")
        .unwrap_or_else(|| {
            panic!(
                "the short job never started on the booked node: {:?}",
                summary(&w.seen.of("short"))
            )
        })
        .started_at);
    assert!(started >= booked, "started {started}");
    assert!(
        started + jiff::SignedDuration::from_secs(1800) <= t,
        "started {started}: its allocation runs past the booked start {t}"
    );
    let ns = w.namespace_of(&job("x", "true"));
    assert_eq!(
        w.pod(&ns, "j-short-job-0")
            .and_then(|p| p.pointer("/spec/nodeName")?.as_str().map(str::to_owned)),
        Some("n1".to_owned())
    );
    w.advance_to_ms(t.as_millisecond());
    w.settle(Duration::from_millis(300)).await;
    steps(&mut w, 3).await;
    w.until("the booked session RUNNING", |s| {
        s.event("jit-b/RUNNING").is_some()
    })
    .await;
    let margin = jiff::SignedDuration::try_from(w.config.monitor.start_margin).unwrap();
    let session = ts(&w.seen.event("jit-b/RUNNING").unwrap().started_at);
    assert!(
        session >= t && session <= t + margin,
        "started {session}, booked {t}"
    );
    close(w, runner, consumer).await;
}

/// Schedules a maintenance window over `node` from ten minutes before `t` to fifty after, checking
/// first that it breaks exactly the booking of `breaks` (what `admin maintenance schedule` refuses
/// without `--force`).
async fn force_window(w: &World, node: &str, t: jiff::Timestamp, breaks: &str) {
    let now = w.sim.now();
    let window = volcano_runner::cluster::Window::new(
        t - jiff::SignedDuration::from_mins(10),
        t + jiff::SignedDuration::from_mins(50),
        [node.to_owned()].into(),
        Some("firmware".into()),
        "test@host",
        now,
    )
    .unwrap();
    let all = record(w).list().await.unwrap();
    let broken: Vec<&str> = volcano_runner::cluster::bookings::under_window(&all, &window, now)
        .iter()
        .map(|b| b.job_id.as_str())
        .collect();
    assert_eq!(
        broken,
        [breaks],
        "what the CLI refuses to schedule without --force"
    );
    volcano_runner::cluster::MaintenanceWindows::new(w.client.clone(), &w.config.cluster)
        .schedule(&window)
        .await
        .unwrap();
}

async fn publish(w: &World, message: volcano_runner::broker::Outbound) {
    let broker = volcano_runner::broker::Broker::connect(
        w.config.broker.clone(),
        tokio_util::sync::CancellationToken::new(),
    )
    .await
    .unwrap();
    broker.publisher().publish(&message).await.unwrap();
    broker.close().await;
}

/// One run of the busy workload of issue 32 (six nodes of different shapes, three waves of 30 jobs ten
/// minutes apart) for 70 simulated minutes, with 100 single-rank sessions (2 CPU, 10 minutes) booked at
/// its start for four instants 15 minutes apart, or without them. Returns what the figure needs.
async fn busy_run(with_bookings: bool) -> Figures {
    let label = if with_bookings {
        "book-measure"
    } else {
        "book-measure-0"
    };
    let mut w = World::start(
        label,
        |c| {
            c.bookings.max_share_per_owner = 0.5;
            // The simulated clock runs up to 375 times faster than the real one here: the booked
            // taints' cutoff must move on within its step (60 simulated seconds).
            c.bookings.check_interval = Duration::from_millis(100);
            c.pipeline.whole_nodes.products.insert(
                "u1-standard".into(),
                toml::from_str("product = \"u1-standard-node\"\ncpu = 16\nmemory_gib = 64")
                    .unwrap(),
            );
        },
        |s| s.nodes = crate::busy_workload::nodes(),
    )
    .await;
    let (runner, consumer) = runner_a(&w).await;
    let run = drive_busy(&mut w, with_bookings).await;
    for (id, _) in &run.booked {
        match answer(&w.seen, id) {
            Some(e) if e.reason != "booked" => println!("refused {id}: {}", e.status),
            None => {
                let booking = record(&w)
                    .list()
                    .await
                    .unwrap()
                    .into_iter()
                    .find(|b| &b.job_id == id);
                let raw: Vec<&str> = w
                    .raw
                    .iter()
                    .filter_map(|e| match &e.event {
                        Ok(volcano_runner::broker::OutboundEvent::Job(j)) if &j.job_id == id => {
                            Some(j.event_id.as_str())
                        }
                        _ => None,
                    })
                    .collect();
                println!(
                    "unanswered {id}: {:?}; in the record: {booking:?}; raw: {raw:?}",
                    summary(&w.seen.of(id))
                )
            }
            _ => {}
        }
    }
    let figures = figures_of(&w, &run);
    close(w, runner, consumer).await;
    figures
}

/// What [`drive_busy`] did.
struct BusyRun {
    t0: jiff::Timestamp,
    end: jiff::Timestamp,
    workload: Vec<crate::busy_workload::Spec>,
    /// The sessions booked, with the start asked for.
    booked: Vec<(String, jiff::Timestamp)>,
}

/// The busy workload as SubmitJobs.
fn busy_submission(s: &crate::busy_workload::Spec) -> SubmitJob {
    let mut j = sized(
        s.job_id(),
        s.cpu,
        s.limit_s.unwrap(),
        &format!("sleep {}", s.runs_s),
    );
    let p = j.product.as_mut().unwrap();
    p.memory_gib = s.memory_gib;
    p.gpu = s.gpu;
    p.category = if s.gpu > 0 { "u1-gpu" } else { "u1-standard" }.into();
    j.replicas = s.ranks;
    j.exclusive_nodes = s.whole_nodes;
    j
}

/// Submits the workload's waves and (with bookings) the 100 sessions at the start, and moves the clock
/// for 70 minutes: every 15 s, and every second around each booked start (where the runner's pace
/// matters: the simulated clock does not wait for it).
async fn drive_busy(w: &mut World, with_bookings: bool) -> BusyRun {
    let t0 = w.sim.now();
    let workload: Vec<_> = crate::busy_workload::recipe(0)
        .into_iter()
        .filter(|s| !s.job_id().contains('-'))
        .collect();
    let starts: Vec<jiff::Timestamp> = (0..4)
        .map(|k| t0 + jiff::SignedDuration::from_mins(10 + 15 * k))
        .collect();
    let near = |second: i64| {
        starts
            .iter()
            .any(|at| (-20..=5).contains(&(at.duration_since(t0).as_secs() - second)))
    };
    let mut instants: Vec<i64> = (0..70 * 4).map(|q| q * 15).collect();
    for at in &starts {
        let from = at.duration_since(t0).as_secs();
        instants.extend(from - 5..from + 20);
    }
    instants.sort();
    instants.dedup();
    let mut booked = Vec::new();
    for second in instants {
        for s in workload.iter().filter(|s| s.arrives_s == second) {
            w.publish_submit(&busy_submission(s)).await;
        }
        if second == 0 && with_bookings {
            for i in 0..100 {
                let at = starts[i % 4];
                let id = format!("sess-{i:03}");
                let mut s = sized(&id, 2, 600, "sleep 100000");
                s.owner.as_mut().unwrap().project = Some(format!("class-{}", i % 4));
                w.publish_submit(&booked_at(s, at, at)).await;
                booked.push((id, at));
            }
        }
        w.advance_to_ms((t0 + jiff::SignedDuration::from_secs(second)).as_millisecond());
        w.settle(Duration::from_millis(if near(second) { 250 } else { 40 }))
            .await;
        // Every booking answered before the clock moves on (100 at once conflict on the record: some
        // go back to the queue and come again); waited for at the first instant only, so that an
        // answer that never comes is reported at the end rather than stalling every instant.
        for _ in 0..if second == 0 { 300 } else { 0 } {
            if booked.iter().all(|(id, _)| answer(&w.seen, id).is_some()) {
                break;
            }
            w.settle(Duration::from_millis(500)).await;
        }
    }
    let end = w.sim.now();
    w.settle(Duration::from_secs(3)).await;
    BusyRun {
        t0,
        end,
        workload,
        booked,
    }
}

/// The figures of a run, from the events: bookings answered and started within the margin, and the
/// CPU-seconds each kind of job ran within it.
fn figures_of(w: &World, run: &BusyRun) -> Figures {
    let margin = jiff::SignedDuration::try_from(w.config.monitor.start_margin).unwrap();
    let mut figures = Figures::default();
    for (id, at) in &run.booked {
        if answer(&w.seen, id).is_none_or(|e| e.reason != "booked") {
            continue;
        }
        figures.booked += 1;
        let started = w
            .seen
            .event(&format!("{id}/RUNNING"))
            .map(|e| ts(&e.started_at));
        if started.is_some_and(|s| s >= *at && s <= *at + margin) {
            figures.in_margin += 1;
        }
    }
    let cpu_s = |job_id: &str, cpu: u32, ranks: u32| {
        let Some(start) = w.seen.event(&format!("{job_id}/RUNNING")) else {
            return 0.0;
        };
        let start = ts(&start.started_at);
        let stop = w
            .seen
            .of(job_id)
            .lifecycle
            .iter()
            .find_map(|e| e.ended_at.map(|t| ts(&Some(t))))
            .unwrap_or(run.end)
            .min(run.end);
        stop.duration_since(start).as_secs_f64().max(0.0) * f64::from(cpu * ranks)
    };
    for s in &run.workload {
        figures.busy_cpu_s += cpu_s(s.job_id(), s.cpu, s.ranks);
        if w.seen.event(&format!("{}/RUNNING", s.job_id())).is_some() {
            figures.busy_started += 1;
        }
    }
    for (id, _) in &run.booked {
        figures.booked_cpu_s += cpu_s(id, 2, 1);
    }
    let total_cpu: f64 = crate::busy_workload::nodes()
        .iter()
        .map(|n| n.cpu.parse::<f64>().unwrap())
        .sum();
    figures.capacity_cpu_s = total_cpu * run.end.duration_since(run.t0).as_secs_f64();
    figures
}

#[derive(Debug, Default)]
struct Figures {
    booked: usize,
    in_margin: usize,
    busy_started: usize,
    busy_cpu_s: f64,
    booked_cpu_s: f64,
    capacity_cpu_s: f64,
}

/// The figure of issue 43 (not a check: run by hand, `cargo test --test monitor
/// measure_bookings_on_the_busy_workload -- --ignored --nocapture`): of 100 bookings on the busy
/// workload, how many were booked and started within the start margin, and the cluster's utilisation
/// with and without them (what the set-aside capacity costs the rest).
#[tokio::test]
#[ignore]
async fn measure_bookings_on_the_busy_workload() {
    let with = busy_run(true).await;
    let without = busy_run(false).await;
    let util = |f: &Figures| (f.busy_cpu_s + f.booked_cpu_s) / f.capacity_cpu_s * 100.0;
    println!("with bookings:    {with:?}");
    println!("without bookings: {without:?}");
    println!(
        "bookings: {} of 100 booked, {} of those started within the start margin ({:.0}%)",
        with.booked,
        with.in_margin,
        100.0 * with.in_margin as f64 / with.booked.max(1) as f64
    );
    println!(
        "utilisation over 70 min: {:.1}% with bookings (busy workload {:.1}%, sessions {:.1}%), {:.1}% without; \
         busy workload jobs started: {} with, {} without",
        util(&with),
        with.busy_cpu_s / with.capacity_cpu_s * 100.0,
        with.booked_cpu_s / with.capacity_cpu_s * 100.0,
        util(&without),
        with.busy_started,
        without.busy_started
    );
}
