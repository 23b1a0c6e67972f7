//! Chaos, as an operator meets it: three runner processes (`volcano-runner run`, monitoring on) against
//! one simulator whose VolcanoJob creates are slowed to 1.5 s, 300 short jobs, and `kill -9` of a random
//! runner every 2 s (restarted at once, as a Deployment would), at least ten times while submissions are
//! in flight. Afterwards, for every job: one VolcanoJob uid over its whole life, one QUEUED content,
//! QUEUED before any other event, exactly one terminal state, no event id with two contents, and ticks
//! that are contiguous from the real start to the real end and add up to the run time.
//!
//! It also reports what faults cost: duplicate deliveries (an id delivered more than once) per 1,000 jobs
//! and as a share of all events, which must stay under 5 %, and the takeover times of the shards whose
//! holder was killed (from the dead holder's last renewal to a live runner's take-over, as seen by a
//! watch of the leases). Each duplicate QUEUED is put down to its cause, from who published each copy
//! (every runner publishes with its own `app_id`) and what that runner's log says it did (its submit
//! path accepted the job and told QUEUED, or its monitor published it): the submit path again (a
//! redelivered submission), the monitor telling a job left to it again (`queuedBy: monitor`), or the
//! monitor's copy before its first event (no record of the QUEUED on the job).

use crate::harness;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use harness::{Captured, Harness};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::watcher;
use volcano_runner::messages::v1::{
    AccountingTick, InvocationParameter, JobEvent, WordInvocation, invocation_parameter,
};
use volcano_runner::messages::{Format, decode};
use volcano_runner::sim::{FaultRule, SimConfig};
use volcano_runner::volcano::VolcanoJob;

const JOBS: usize = 300;
const RUNNERS: usize = 3;
const MIN_KILLS: usize = 10;

/// A job that runs `seconds` (the simulator reads the container's command).
pub(crate) fn sleeper(job_id: &str, seconds: u64) -> volcano_runner::messages::v1::SubmitJob {
    let mut job = harness::figlet(job_id);
    let word = |w: &str| InvocationParameter {
        kind: Some(invocation_parameter::Kind::Word(WordInvocation {
            word: w.to_owned(),
        })),
    };
    if let Some(app) = job.application.as_mut() {
        app.invocation = vec![word("sh"), word("-c"), word(&format!("sleep {seconds}"))];
    }
    job
}

/// Runner processes, each restartable under a new name after a kill.
struct Processes {
    env: Vec<(String, String)>,
    cluster: String,
    /// The runner in each slot: its name and process.
    slots: Vec<(String, Child)>,
    started: usize,
    /// The names of the runners killed.
    killed: BTreeSet<String>,
}

impl Processes {
    /// Starts a runner `chaos-<n>`, which publishes with that `app_id`; its log (JSON lines) goes to
    /// [`log_of`]`(n)`, read for the causes of duplicates and kept for a failed run.
    fn spawn(&mut self) -> (String, Child) {
        self.started += 1;
        let log = std::fs::File::create(log_of(self.started)).expect("a log file");
        let id = format!("chaos-{}", self.started);
        let child = Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
            .args(["run", "--cluster", &self.cluster, "--id", &id])
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("VOLCANO_RUNNER_BROKER__APP_ID", &id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("a runner process starts");
        (id, child)
    }

    /// `kill -9` of the runner in `slot`, and a new one in its place.
    fn kill_and_restart(&mut self, slot: usize) {
        let (id, child) = &mut self.slots[slot];
        child.kill().expect("SIGKILL");
        let _ = child.wait();
        self.killed.insert(id.clone());
        self.slots[slot] = self.spawn();
    }
}

/// The log of runner `chaos-<n>`, in the temporary directory.
fn log_of(n: usize) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("chaos-{n}.log"))
}

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, child) in &mut self.slots {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn tick_of(c: &Captured) -> Option<AccountingTick> {
    (c.routing_key.contains("accounting"))
        .then(|| decode::<AccountingTick>(Format::Json, &c.body).ok())
        .flatten()
}

fn ms(t: &Option<pbjson_types::Timestamp>) -> i64 {
    let t = t.as_ref().expect("a timestamp");
    t.seconds * 1000 + i64::from(t.nanos) / 1_000_000
}

const TERMINAL: [&str; 4] = ["SUCCESS", "FAILURE", "EXPIRED", "CANCELLED"];

fn terminal_of(e: &JobEvent) -> bool {
    TERMINAL
        .iter()
        .any(|t| e.event_id == format!("{}/{t}", e.job_id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_of_random_runners_loses_nothing_and_does_nothing_twice() {
    let sim = SimConfig {
        clock_speed: 1.0,
        ..SimConfig::for_tests()
    };
    let h = Harness::with_sim("chaos", sim).await;
    h.sim.faults().add_rule(FaultRule {
        resource: "jobs.batch.volcano.sh".into(),
        verb: "create".into(),
        latency_ms: 1500,
        ..FaultRule::default()
    });

    // Every uid each VolcanoJob name ever had, and the names of the jobs created for their monitor to
    // tell QUEUED (`queuedBy: monitor`), from a watch of our own.
    let uids: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>> = Arc::default();
    let left: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let api: Api<VolcanoJob> = Api::all(h.client.clone());
    let seen = uids.clone();
    let left_seen = left.clone();
    let queued_by =
        volcano_runner::monitor::queued::QueuedKeys::new(&h.config.pipeline.annotation_prefix);
    let watch = tokio::spawn(async move {
        let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            let Ok(event) = event else { continue };
            let jobs: Vec<VolcanoJob> = match event {
                watcher::Event::Apply(j)
                | watcher::Event::InitApply(j)
                | watcher::Event::Delete(j) => {
                    vec![j]
                }
                _ => Vec::new(),
            };
            let mut seen = seen.lock().unwrap();
            for j in jobs {
                if queued_by.left_to_monitor(j.metadata.annotations.as_ref())
                    && let Some(name) = &j.metadata.name
                {
                    left_seen.lock().unwrap().insert(name.clone());
                }
                if let (Some(name), Some(uid)) = (j.metadata.name, j.metadata.uid) {
                    seen.entry(name).or_default().insert(uid);
                }
            }
        }
    });

    // Every change of every shard lease: (when seen, lease, holder).
    let lease_changes: Arc<Mutex<Vec<(tokio::time::Instant, String, String)>>> = Arc::default();
    let leases: Api<Lease> = Api::all(h.client.clone());
    let changes = lease_changes.clone();
    let lease_watch = tokio::spawn(async move {
        let mut stream = watcher::watcher(leases, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            let Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) = event else {
                continue;
            };
            let name = lease.metadata.name.unwrap_or_default();
            if !name.contains("-shard-") {
                continue;
            }
            let holder = lease
                .spec
                .and_then(|s| s.holder_identity)
                .unwrap_or_default();
            changes
                .lock()
                .unwrap()
                .push((tokio::time::Instant::now(), name, holder));
        }
    });

    let env = vec![
        ("VOLCANO_RUNNER_BROKER__URL".into(), h.vhost.amqp_url()),
        ("VOLCANO_RUNNER_OPS__LISTEN".into(), "127.0.0.1:0".into()),
        // What the causes of duplicates are read from: the submit path's acceptances and the
        // monitor's publications, as JSON lines.
        (
            "VOLCANO_RUNNER_LOG".into(),
            "warn,volcano_runner::runner::handle::submit=info,volcano_runner::monitor::execute=info,\
             volcano_runner::monitor::queued=debug"
                .into(),
        ),
        ("VOLCANO_RUNNER_OPS__LOG_FORMAT".into(), "json".into()),
        ("VOLCANO_RUNNER_CLUSTER__LEASE__SHARDS".into(), "4".into()),
        (
            "VOLCANO_RUNNER_CLUSTER__LEASE__DURATION".into(),
            "3s".into(),
        ),
        (
            "VOLCANO_RUNNER_CLUSTER__LEASE__RENEW_INTERVAL".into(),
            "500ms".into(),
        ),
        (
            "VOLCANO_RUNNER_CLUSTER__LEASE__SAFETY_MARGIN".into(),
            "1s".into(),
        ),
        (
            "VOLCANO_RUNNER_RUNNER__REQUEUE_DELAY".into(),
            "200ms".into(),
        ),
        (
            "VOLCANO_RUNNER_MONITOR__RECONCILE_INTERVAL".into(),
            "10s".into(),
        ),
    ];
    let mut fleet = Processes {
        env,
        cluster: h.sim.url(),
        slots: Vec::new(),
        started: 0,
        killed: BTreeSet::new(),
    };
    for _ in 0..RUNNERS {
        let child = fleet.spawn();
        fleet.slots.push(child);
    }
    h.wait_consumers(&h.config.broker.submit_queue, RUNNERS as u32)
        .await;

    // Submissions paced over the chaos (15 a second), kills every 2 s while they are in flight.
    let publisher = h.orchestrator.publisher();
    let pace = Duration::from_millis(66);
    let mut kills = 0;
    let mut next_kill = tokio::time::Instant::now() + Duration::from_secs(2);
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut random = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for i in 0..JOBS {
        let seconds = 3 + random(18);
        let message = volcano_runner::broker::Outbound::submit(
            &sleeper(&format!("c-{i}"), seconds),
            Format::Json,
            &h.config.broker,
        );
        publisher
            .publish(&message)
            .await
            .expect("submission confirmed");
        tokio::time::sleep(pace).await;
        if tokio::time::Instant::now() >= next_kill {
            fleet.kill_and_restart(random(RUNNERS as u64) as usize);
            kills += 1;
            next_kill += Duration::from_secs(2);
        }
    }
    while kills < MIN_KILLS {
        tokio::time::sleep_until(next_kill).await;
        fleet.kill_and_restart(random(RUNNERS as u64) as usize);
        kills += 1;
        next_kill += Duration::from_secs(2);
    }

    // Every job ends.
    h.wait_events_for(
        "a terminal event for every job",
        Duration::from_secs(240),
        |e| {
            let ended: BTreeSet<&str> = e
                .iter()
                .filter_map(|c| c.event.as_ref())
                .filter(|e| terminal_of(e))
                .map(|e| e.job_id.as_str())
                .collect();
            ended.len() == JOBS
        },
    )
    .await;
    h.wait_queues_settled().await;
    // Late duplicates (a runner that was between publishing and persisting) have time to arrive.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let processes = fleet.started;
    let killed = fleet.killed.clone();
    drop(fleet);
    watch.abort();
    lease_watch.abort();
    let takeovers = takeover_times(&lease_changes.lock().unwrap());

    let events = h.events().await;
    let mut by_job: BTreeMap<String, Vec<&Captured>> = BTreeMap::new();
    for c in &events {
        let job = c
            .event
            .as_ref()
            .map(|e| e.job_id.clone())
            .or_else(|| tick_of(c).map(|t| t.job_id));
        if let Some(job) = job {
            by_job.entry(job).or_default().push(c);
        }
    }
    let uids = uids.lock().unwrap().clone();
    let left = left.lock().unwrap().clone();
    let tellers = Tellers::read(processes);
    let queued_causes = queued_copies_by_cause(&events, &tellers, &left, &killed);
    // Every violation, by kind, so one run reports them all.
    let mut twice_run = Vec::new();
    let mut different_content = Vec::new();
    let mut queued_not_first = Vec::new();
    let mut not_one_end = Vec::new();
    let mut wrong_ticks = Vec::new();
    // Deliveries of an id already delivered.
    let mut duplicates = 0usize;
    // The duplicates by what they were (QUEUED, RUNNING, a tick, the end...): where a fault costs most.
    let mut duplicates_by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..JOBS {
        let job = format!("c-{i}");
        let n = uids.get(&format!("j-{job}")).map_or(0, BTreeSet::len);
        if n != 1 {
            twice_run.push(format!("{job}: {n} uids"));
        }
        let mine = by_job.get(&job).cloned().unwrap_or_default();
        let lifecycle: Vec<&JobEvent> = mine.iter().filter_map(|c| c.event.as_ref()).collect();
        if lifecycle.first().map(|e| e.event_id.clone()) != Some(format!("{job}/QUEUED")) {
            queued_not_first.push(format!(
                "{job}: {:?}",
                lifecycle.iter().map(|e| &e.event_id).collect::<Vec<_>>()
            ));
        }
        // One content per id (who published it aside, except QUEUED, which names the accepting runner).
        let mut contents: BTreeMap<&str, BTreeSet<Vec<u8>>> = BTreeMap::new();
        for c in &mine {
            let body = match &c.event {
                Some(e) => {
                    let mut e = e.clone();
                    if !e.event_id.ends_with("/QUEUED") {
                        e.runner_id.clear();
                    }
                    serde_json::to_vec(&e).unwrap()
                }
                None => c.body.clone(),
            };
            contents
                .entry(c.message_id.as_str())
                .or_default()
                .insert(body);
        }
        let distinct: BTreeSet<&str> = mine.iter().map(|c| c.message_id.as_str()).collect();
        duplicates += mine.len() - distinct.len();
        let mut seen = BTreeSet::new();
        for c in &mine {
            if !seen.insert(c.message_id.as_str()) {
                *duplicates_by_kind
                    .entry(kind_of(&job, &c.message_id))
                    .or_default() += 1;
            }
        }
        for (id, bodies) in &contents {
            if bodies.len() != 1 {
                different_content.push((*id).to_owned());
            }
        }
        let terminals: BTreeSet<&str> = lifecycle
            .iter()
            .filter(|e| terminal_of(e))
            .map(|e| e.event_id.as_str())
            .collect();
        let end = lifecycle.iter().find(|e| terminal_of(e));
        match end {
            Some(end) if terminals.len() == 1 && end.event_id.ends_with("/SUCCESS") => {
                if let Err(why) = ticks_exact(&mine, ms(&end.started_at), ms(&end.ended_at)) {
                    wrong_ticks.push(format!("{job}: {why}"));
                }
            }
            _ => not_one_end.push(format!("{job}: {terminals:?}")),
        }
    }
    eprintln!(
        "chaos: {kills} kills, {processes} runner processes, {JOBS} jobs; VolcanoJob uids per job: {}; \
         jobs run more than once: {}; ids with different contents: {}; QUEUED not first: {}; \
         not exactly one SUCCESS: {}; ticks not exact: {}",
        uids_per_job(&uids),
        twice_run.len(),
        different_content.len(),
        queued_not_first.len(),
        not_one_end.len(),
        wrong_ticks.len()
    );
    let delivered: usize = by_job.values().map(Vec::len).sum();
    let share = duplicates as f64 * 100.0 / delivered.max(1) as f64;
    eprintln!(
        "chaos: {duplicates} duplicate deliveries of {delivered} events ({:.1} per 1,000 jobs, {share:.2} % \
         of events), by kind {duplicates_by_kind:?}; duplicate QUEUED by cause {queued_causes:?}; \
         {}; shard takeovers after a kill: {}",
        duplicates as f64 * 1000.0 / JOBS as f64,
        tellers.carried(),
        describe_takeovers(&takeovers)
    );
    assert!(kills >= MIN_KILLS);
    assert!(
        share < 5.0,
        "duplicates under a kill every 2 s: {share:.2} % of events, at most 5 %"
    );
    assert!(
        twice_run.is_empty(),
        "jobs run more than once: {twice_run:?}"
    );
    assert!(
        different_content.is_empty(),
        "ids published with different contents: {different_content:?}"
    );
    assert!(
        queued_not_first.is_empty(),
        "QUEUED not first: {queued_not_first:?}"
    );
    assert!(
        not_one_end.is_empty(),
        "not exactly one SUCCESS: {not_one_end:?}"
    );
    assert!(wrong_ticks.is_empty(), "ticks not exact: {wrong_ticks:?}");
    assert!(h.dead_letters().await.is_empty(), "nothing dead-lettered");
}

/// The ticks of a job (distinct by sequence) are contiguous from `start` to `end`, each with a duration,
/// the last one final.
fn ticks_exact(events: &[&Captured], start: i64, end: i64) -> Result<(), String> {
    let mut ticks: BTreeMap<u64, AccountingTick> = BTreeMap::new();
    for t in events.iter().filter_map(|c| tick_of(c)) {
        ticks.insert(t.sequence, t);
    }
    let mut at = start;
    for (n, t) in &ticks {
        let (from, to) = (ms(&t.interval_start), ms(&t.interval_end));
        if from != at {
            return Err(format!("tick {n} starts at {from}, the last ended at {at}"));
        }
        if t.duration_ms <= 0 || to - from != t.duration_ms {
            return Err(format!(
                "tick {n}: {from}..{to} with durationMs {}",
                t.duration_ms
            ));
        }
        at = to;
    }
    if at != end {
        return Err(format!("the ticks end at {at}, the job at {end}"));
    }
    if !ticks.values().last().is_some_and(|t| t.r#final) {
        return Err("no final tick".into());
    }
    Ok(())
}

/// "n×k" counts of how many uids each job name had.
fn uids_per_job(uids: &BTreeMap<String, BTreeSet<String>>) -> String {
    let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
    for set in uids.values() {
        *counts.entry(set.len()).or_default() += 1;
    }
    counts
        .iter()
        .map(|(n, jobs)| format!("{jobs} jobs with {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// For every shard whose lease went from one holder straight to another (a takeover; a handover goes
/// through an empty holder): the time from the old holder's last renewal seen to the new holder seen.
fn takeover_times(changes: &[(tokio::time::Instant, String, String)]) -> Vec<Duration> {
    let mut last: BTreeMap<&str, (tokio::time::Instant, &str)> = BTreeMap::new();
    let mut times = Vec::new();
    for (at, lease, holder) in changes {
        if let Some((then, before)) = last.get(lease.as_str())
            && !before.is_empty()
            && !holder.is_empty()
            && before != holder
        {
            times.push(at.duration_since(*then));
        }
        last.insert(lease, (*at, holder));
    }
    times
}

/// `n takeovers, min .. median .. max`, in seconds.
fn describe_takeovers(times: &[Duration]) -> String {
    if times.is_empty() {
        return "none".into();
    }
    let mut sorted = times.to_vec();
    sorted.sort();
    format!(
        "{} takeovers, {:.1} s .. median {:.1} s .. {:.1} s",
        sorted.len(),
        sorted[0].as_secs_f64(),
        sorted[sorted.len() / 2].as_secs_f64(),
        sorted[sorted.len() - 1].as_secs_f64()
    )
}

/// What a message of `job` is, from its id (`<job>/RUNNING`, `<job>/<n>` for a tick, ...): the part after
/// the job's id, a tick's number left out.
fn kind_of(job: &str, message_id: &str) -> String {
    let rest = message_id
        .strip_prefix(job)
        .and_then(|r| r.strip_prefix('/'))
        .unwrap_or(message_id);
    let first = rest.split('/').next().unwrap_or(rest);
    if first.parse::<u64>().is_ok() {
        "tick".to_owned()
    } else {
        first.to_owned()
    }
}

/// Who published QUEUED of which jobs, by runner (`chaos-<n>`), as its log says: the jobs its submit path
/// accepted and told QUEUED of, and those whose QUEUED its monitor published; and for how long each
/// record of a confirmed QUEUED was carried (ms), the window in which a kill costs a copy.
#[derive(Default)]
struct Tellers {
    submit: BTreeMap<String, BTreeSet<String>>,
    monitor: BTreeMap<String, BTreeSet<String>>,
    carried_ms: Vec<u64>,
}

impl Tellers {
    /// From the logs of runners `chaos-1` to `chaos-<processes>`.
    fn read(processes: usize) -> Self {
        let mut tellers = Self::default();
        for n in 1..=processes {
            let runner = format!("chaos-{n}");
            let text = std::fs::read_to_string(log_of(n)).unwrap_or_default();
            for line in text.lines() {
                let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else {
                    continue;
                };
                let fields = &entry["fields"];
                let field = |k: &str| fields[k].as_str().unwrap_or_default().to_owned();
                match fields["message"].as_str() {
                    // The submit path tells QUEUED after this (not the variant that leaves it to the
                    // job's monitor).
                    Some("Accepted a job.") => {
                        tellers
                            .submit
                            .entry(runner.clone())
                            .or_default()
                            .insert(field("job_id"));
                    }
                    Some("Published a lifecycle transition.") => {
                        if let Some(job) = field("event_id").strip_suffix("/QUEUED") {
                            tellers
                                .monitor
                                .entry(runner.clone())
                                .or_default()
                                .insert(job.to_owned());
                        }
                    }
                    Some("The record of the job's confirmed QUEUED is carried no more.") => {
                        tellers.carried_ms.extend(fields["carried_ms"].as_u64());
                    }
                    _ => {}
                }
            }
        }
        tellers
    }

    /// `n records carried, p50/p90/max ms`.
    fn carried(&self) -> String {
        let mut ms = self.carried_ms.clone();
        ms.sort_unstable();
        let at = |q: usize| {
            ms.get((ms.len() * q / 100).min(ms.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0)
        };
        format!(
            "{} records carried, {}/{}/{} ms p50/p90/max",
            ms.len(),
            at(50),
            at(90),
            at(100)
        )
    }

    /// What `runner` did that published `job`'s QUEUED: its monitor, its submit path, or its log does not
    /// say (cut short by the kill).
    fn of(&self, runner: &str, job: &str) -> &'static str {
        let did =
            |m: &BTreeMap<String, BTreeSet<String>>| m.get(runner).is_some_and(|j| j.contains(job));
        if did(&self.monitor) {
            "monitor"
        } else if did(&self.submit) {
            "submit path"
        } else {
            "unknown"
        }
    }
}

/// Every delivery of a QUEUED after the job's first, by cause: who told the copy (the submit path again,
/// a monitor again for a job left to it, a monitor's copy before its first event), and whether the
/// runner that told the first one was killed later (one of `killed`).
fn queued_copies_by_cause(
    events: &[Captured],
    tellers: &Tellers,
    left: &BTreeSet<String>,
    killed: &BTreeSet<String>,
) -> BTreeMap<String, usize> {
    let mut first: BTreeMap<&str, &str> = BTreeMap::new();
    let mut causes = BTreeMap::new();
    for c in events {
        let Some(job) = c.message_id.strip_suffix("/QUEUED") else {
            continue;
        };
        let runner = c.app_id.as_deref().unwrap_or_default();
        let Some(earlier) = first.get(job).copied() else {
            first.insert(job, runner);
            continue;
        };
        let cause = match tellers.of(runner, job) {
            "monitor" if left.contains(&format!("j-{job}")) => {
                "a monitor told it again (queuedBy: monitor)"
            }
            "monitor" => "a monitor's copy before its first event",
            "submit path" => "the submit path told it again",
            _ => "unknown",
        };
        let first_teller = if killed.contains(earlier) {
            "killed"
        } else {
            "alive"
        };
        *causes
            .entry(format!("{cause}, first teller {first_teller}"))
            .or_default() += 1;
    }
    causes
}
