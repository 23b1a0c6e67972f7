//! A runner pointed by URL at a simulator whose clock runs ten times faster than real time (and starts on
//! another day) charges simulated time: a job of 300 simulated seconds is charged exactly 300 s, and no
//! tick ends after the job did.

use crate::harness;

use std::process::{Command, Stdio};
use std::time::Duration;

use harness::Harness;
use volcano_runner::messages::v1::{
    AccountingTick, InvocationParameter, WordInvocation, invocation_parameter,
};
use volcano_runner::messages::{Format, decode};
use volcano_runner::sim::SimConfig;

fn ms(t: &Option<pbjson_types::Timestamp>) -> i64 {
    let t = t.as_ref().expect("a timestamp");
    t.seconds * 1000 + i64::from(t.nanos) / 1_000_000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_uses_the_clock_of_a_simulator_it_reaches_by_url() {
    let sim = SimConfig {
        clock_speed: 10.0,
        start_time: "2026-01-01T00:00:00Z".into(),
        ..SimConfig::for_tests()
    };
    let h = Harness::with_sim("sim-clock", sim).await;
    let log = std::fs::File::create(std::env::temp_dir().join("sim-clock-runner.log")).unwrap();
    let mut runner = Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
        .args(["run", "--cluster", &h.sim.url(), "--id", "clock-1"])
        .env("VOLCANO_RUNNER_BROKER__URL", h.vhost.amqp_url())
        .env("VOLCANO_RUNNER_OPS__LISTEN", "127.0.0.1:0")
        .env("VOLCANO_RUNNER_LOG", "warn")
        .env("VOLCANO_RUNNER_CLUSTER__LEASE__SHARDS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("the runner starts");
    h.wait_consumers(&h.config.broker.submit_queue, 1).await;

    let mut job = harness::figlet("clock-1");
    let word = |w: &str| InvocationParameter {
        kind: Some(invocation_parameter::Kind::Word(WordInvocation {
            word: w.to_owned(),
        })),
    };
    job.application.as_mut().unwrap().invocation = vec![word("sh"), word("-c"), word("sleep 300")];
    h.submit(&job).await;
    let events = h
        .wait_events_for(
            "SUCCESS and its final tick",
            Duration::from_secs(120),
            |e| {
                e.iter().any(|c| c.message_id == "clock-1/SUCCESS")
                    && e.iter().any(|c| {
                        c.routing_key.contains("accounting")
                            && decode::<AccountingTick>(Format::Json, &c.body)
                                .is_ok_and(|t| t.r#final)
                    })
            },
        )
        .await;
    let _ = runner.kill();
    let _ = runner.wait();
    let success = events
        .iter()
        .find(|c| c.message_id == "clock-1/SUCCESS")
        .and_then(|c| c.event.clone())
        .unwrap();
    let (start, end) = (ms(&success.started_at), ms(&success.ended_at));
    assert_eq!(end - start, 300_000, "300 simulated seconds");
    let mut ticks: Vec<AccountingTick> = events
        .iter()
        .filter(|c| c.routing_key.contains("accounting"))
        .filter_map(|c| decode::<AccountingTick>(Format::Json, &c.body).ok())
        .collect();
    ticks.sort_by_key(|t| t.sequence);
    ticks.dedup_by_key(|t| t.sequence);
    let charged: i64 = ticks.iter().map(|t| t.duration_ms).sum();
    assert_eq!(charged, 300_000, "{ticks:?}");
    assert!(
        ticks.iter().all(|t| ms(&t.interval_end) <= end),
        "no tick ends after the job: {ticks:?}"
    );
}
