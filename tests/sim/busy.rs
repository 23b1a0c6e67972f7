//! Start-time estimates on a busy cluster, the workload of issue 32: six nodes of different shapes (GPUs
//! and a high-memory node among them), three Volcano queues that let later jobs start first
//! (`dequeueStrategy: traverse`, as the per-project queues are), jobs arriving in waves while others
//! wait: small CPU jobs, high-memory jobs, GPU jobs, gangs, whole-node gangs, one job without a time
//! limit and two that can never fit. The clock runs second by second (simulated time); every waiting job
//! is estimated every 10 s, and what the monitor's rule would tell it (`tell_again`) is counted.
//!
//! Run three times: as the jobs come without a waiting time; with Volcano's `sla-waiting-time` on every
//! job (the `sla` plugin then reserves for a job that has waited that long); and with it and
//! `[monitor] reserve_nodes` (whole nodes reserved by a taint for a whole-node gang past its waiting
//! time, decided and written every 10 s as a monitor pass does). The figures are printed
//! (docs/estimates.md quotes them).

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use volcano_runner::durable::AnnotationKeys;
use volcano_runner::monitor::telling::{Told, tell_again};
use volcano_runner::pipeline::plugins::task::{exclusive_affinity, reservation_toleration};
use volcano_runner::volcano::PodGroup;

use crate::busy_workload::{QUEUES, Spec, nodes, recipe};
use crate::estimates::{percentile, queue_entries_replaying, reserve_nodes};
use crate::sim_support::{jobs, namespace, queue, start_with};
use volcano_runner::monitor::inputs::Replaying;

const NS: &str = "busy";
/// 93 jobs in three waves (at 0, 10 and 20 minutes), from a recipe varied by `seed`: the recipe, one
/// job without a time limit (it ends after 15 minutes), and one more arriving in the last wave.
fn workload(seed: u64) -> Vec<Spec> {
    let mut out = recipe(seed);
    out[40].limit_s = None;
    out[40].runs_s = 900;
    out.push(Spec {
        name: "j-busy-last".into(),
        arrives_s: 1200,
        ..out[0].clone()
    });
    out
}

fn vcjob(s: &Spec, sla: Option<&str>) -> DynamicObject {
    let mut resources = json!({"cpu": s.cpu.to_string(), "memory": format!("{}Gi", s.memory_gib)});
    if s.gpu > 0 {
        resources["nvidia.com/gpu"] = json!(s.gpu.to_string());
    }
    let mut annotations = serde_json::Map::new();
    if let Some(limit) = s.limit_s {
        annotations.insert(
            "ucloud.dk/maxTime".into(),
            json!((limit * 1000).to_string()),
        );
    }
    if let Some(wait) = sla {
        annotations.insert("sla-waiting-time".into(), json!(wait));
    }
    let mut template = json!({"spec": {
        "restartPolicy": "Never",
        "containers": [{"name": "user-job", "image": "busybox:1.36",
            "command": ["sh", "-c", format!("sleep {}", s.runs_s)],
            "resources": {"requests": resources, "limits": resources}}]
    }});
    if s.whole_nodes {
        annotations.insert("ucloud.dk/exclusiveNodes".into(), json!("true"));
        template["metadata"] = json!({"labels": {"ucloud.dk/exclusiveNodes": "true"}});
        template["spec"]["affinity"] = serde_json::to_value(exclusive_affinity()).unwrap();
        // As the Task plugin renders it: the rank tolerates its own job's node reservation.
        let id = s.name.strip_prefix("j-").unwrap();
        template["spec"]["tolerations"] = json!([serde_json::to_value(reservation_toleration(
            &AnnotationKeys::new("ucloud.dk/"),
            id
        ))
        .unwrap()]);
    }
    serde_json::from_value(json!({
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {
            "name": s.name, "namespace": NS,
            "labels": {"app.kubernetes.io/managed-by": "volcano-runner"},
            "annotations": annotations
        },
        "spec": {
            "schedulerName": "volcano", "minAvailable": s.ranks, "queue": s.queue,
            "tasks": [{"name": "job", "replicas": s.ranks, "template": template}]
        }
    }))
    .expect("a job object")
}

/// What one run showed.
#[derive(Debug, Default)]
struct Outcome {
    /// Jobs that waited and were given a bound (the scheduler reserves for them), and those that started
    /// after their first one, with why: the jobs created after it that started before it.
    first: usize,
    first_broken: Vec<(String, i64)>,
    /// First bound minus actual start (s), of those that held.
    early: Vec<i64>,
    /// Bounds told by the monitor's rule, and those broken.
    told: usize,
    told_broken: usize,
    /// The same for expectations (estimates the scheduler does not reserve for): first ones and those
    /// that held, all told and those that held.
    first_expected: usize,
    first_expected_held: usize,
    told_expected: usize,
    told_expected_held: usize,
    /// Estimate events per waiting job (the first included).
    tells: Vec<i64>,
    never_told_at_once: usize,
    /// Whole-node gangs told a bound (with `reserve_nodes`, once their nodes are reserved).
    whole_bounds: usize,
    started: usize,
    fitting: usize,
}

async fn run(seed: u64, sla: Option<&str>, reserve: bool, proportion: bool) -> Outcome {
    let (sim, client) = start_with(|c| {
        c.proportion = proportion;
        c.nodes = nodes();
        c.pod_start_delay = Duration::ZERO;
        c.events = false;
    })
    .await;
    namespace(&client, NS).await;
    for q in QUEUES {
        Api::<DynamicObject>::all_with(client.clone(), &queue())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                    "metadata": {"name": q}, "spec": {"weight": 1}
                }))
                .unwrap(),
            )
            .await
            .unwrap();
    }
    let workload = workload(seed);
    let api = jobs(&client, NS);
    let by_name: BTreeMap<&str, &Spec> = workload.iter().map(|s| (s.name.as_str(), s)).collect();
    let mut start_of: BTreeMap<String, i64> = BTreeMap::new();
    // Per job: its first bound, what it was last told, every bound told, and how many events.
    let mut first: BTreeMap<String, (i64, bool)> = BTreeMap::new();
    let mut first_bound: BTreeMap<String, i64> = BTreeMap::new();
    let mut last_told: BTreeMap<String, Told> = BTreeMap::new();
    // As the monitor's default `[monitor] start_margin`.
    let margin =
        SignedDuration::try_from(volcano_runner::config::MonitorConfig::default().start_margin)
            .unwrap();
    let mut told: Vec<(String, i64, bool, i64)> = Vec::new();
    let mut tells: BTreeMap<String, i64> = BTreeMap::new();
    let mut never: BTreeMap<String, bool> = BTreeMap::new();
    let t0 = sim.now();
    let fitting = workload.len() - 2;
    for second in 0..6 * 3600i64 {
        let now = sim.now();
        for s in workload.iter().filter(|s| s.arrives_s == second) {
            api.create(&PostParams::default(), &vcjob(s, sla))
                .await
                .unwrap();
        }
        for pg in Api::<PodGroup>::namespaced(client.clone(), NS)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|pg| !volcano_runner::monitor::observe::is_waiting(pg))
        {
            let Some(job) = volcano_runner::monitor::cache::job_of_group(pg) else {
                continue;
            };
            let name = job.name.to_string();
            if start_of.contains_key(&name) {
                continue;
            }
            // As the runner's start hook does: the deadline is persisted at the start.
            if let Some(limit) = by_name[name.as_str()].limit_s {
                let expiry = now.as_millisecond() + limit * 1000;
                api.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {
                        "ucloud.dk/expiry": expiry.to_string()}}})),
                )
                .await
                .unwrap();
            }
            start_of.insert(name, second);
        }
        if start_of.len() == fitting {
            break;
        }
        if second % 10 == 0 {
            // A monitor pass with `[monitor] reserve_nodes`: the reservations, then the estimates.
            if reserve {
                reserve_nodes(&client, now).await;
            }
            let replaying = Replaying {
                reserve_nodes: reserve,
                proportion,
                start_margin: margin,
                queue_timeout: None,
            };
            for e in queue_entries_replaying(&client, now, replaying).await {
                let name = e.job.clone().unwrap_or(e.pod_group.clone());
                if e.estimate.kind == "never" {
                    never.entry(name).or_insert(
                        second
                            == by_name
                                .get(e.job.as_deref().unwrap_or(""))
                                .map_or(-1, |s| s.arrives_s),
                    );
                    continue;
                }
                let Some(at) = e.estimate.start_at.as_deref() else {
                    continue;
                };
                let at: Timestamp = at.parse().unwrap();
                let at_s = at.as_second() - t0.as_second();
                let bound = e.estimate.bound;
                first.entry(name.clone()).or_insert((at_s, bound));
                if bound {
                    // A whole-node gang is told a bound only once its nodes are reserved: its first
                    // bound is what it must start by.
                    first_bound.entry(name.clone()).or_insert(at_s);
                }
                // As the monitor tells: a move worth telling, or an expectation become a bound (or back).
                let before = last_told.get(&name).copied();
                let tell = before.is_none_or(|before| {
                    tell_again(before, at, bound, now, SignedDuration::from_secs(60))
                });
                if tell {
                    last_told.insert(name.clone(), Told::after(before, at, bound));
                    *tells.entry(name.clone()).or_default() += 1;
                    told.push((name, at_s, bound, second));
                }
            }
        }
        sim.advance(Duration::from_secs(1));
    }
    let mut o = Outcome {
        first: first_bound.len(),
        whole_bounds: first_bound
            .keys()
            .filter(|n| by_name.get(n.as_str()).is_some_and(|s| s.whole_nodes))
            .count(),
        told: told.iter().filter(|(_, _, b, _)| *b).count(),
        first_expected: first.values().filter(|(_, b)| !*b).count(),
        told_expected: told.iter().filter(|(_, _, b, _)| !*b).count(),
        started: start_of.len(),
        fitting,
        never_told_at_once: never.values().filter(|at_once| **at_once).count(),
        ..Outcome::default()
    };
    let order: BTreeMap<&str, usize> = workload
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), i))
        .collect();
    let shape = |s: &Spec| {
        format!(
            "{}×{} CPU {} GPU{}, queue {}, limit {:?} s, arrived {} s",
            s.ranks,
            s.cpu,
            s.gpu,
            if s.whole_nodes { ", whole nodes" } else { "" },
            s.queue,
            s.limit_s,
            s.arrives_s
        )
    };
    for (name, (at, bound)) in &first {
        if !*bound && let Some(start) = start_of.get(name) {
            o.first_expected_held += usize::from(start <= at);
        }
    }
    for (name, at) in &first_bound {
        let Some(start) = start_of.get(name) else {
            continue;
        };
        if start > at {
            // Who passed it: jobs created after it that started before it.
            let passed: Vec<String> = start_of
                .iter()
                .filter(|(other, s)| order[other.as_str()] > order[name.as_str()] && *s < start)
                .map(|(other, s)| format!("{other} at {s} s ({})", shape(by_name[other.as_str()])))
                .collect();
            o.first_broken.push((
                format!(
                    "{name} ({}): bound {at} s, started {start} s; passed by {passed:?}",
                    shape(by_name[name.as_str()])
                ),
                start - at,
            ));
        } else {
            o.early.push(at - start);
        }
    }
    o.told_broken = told
        .iter()
        .filter(|(name, at, b, _)| *b && start_of.get(name).is_some_and(|s| s > at))
        .inspect(|(name, at, _, when)| {
            let start = start_of[name];
            let passed: Vec<String> = start_of
                .iter()
                .filter(|(other, s)| order[other.as_str()] > order[name.as_str()] && **s < start)
                .map(|(other, s)| format!("{other} at {s} s"))
                .collect();
            println!(
                "  bound told broken: {name} ({}): told at {when} s a bound of {at} s, started {start} s; passed by {passed:?}",
                shape(by_name[name.as_str()])
            );
        })
        .count();
    o.told_expected_held = told
        .iter()
        .filter(|(name, at, b, _)| !*b && start_of.get(name).is_some_and(|s| s <= at))
        .count();
    o.tells = tells.into_values().collect();
    o
}

/// Runs the workload as the jobs come, and with `sla-waiting-time: 1m` on every job, and prints the
/// figures of both. In both, every job that fits starts and the never-fitting ones are told at once; with
/// the waiting time each waiting job hears at most 10 estimates (median under 4). Without the waiting time the scheduler
/// reserves for nobody, so no estimate is told as a bound (each is an expectation, and how many held is
/// printed); with it, a job is told a bound unless it is a whole-node gang without reserved nodes or
/// starts in a gap before a gang ahead of it that could use its nodes, and no first bound and under 1%
/// of the bounds told break (each broken one is printed with the jobs that passed it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_busy_cluster_every_job_starts_and_with_sla_each_waiting_job_is_told_a_handful_of_times()
 {
    let mut failures = Vec::new();
    let seed = std::env::var("BUSY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // The last: the scheduler runs Volcano's proportion plugin and the monitor knows it
    // (`[monitor] proportion`), so bounds are told only while one queue has jobs.
    for (sla, reserve, proportion) in [
        (None, false, false),
        (Some("1m"), false, false),
        (Some("1m"), true, false),
        (Some("1m"), false, true),
    ] {
        let mut o = run(seed, sla, reserve, proportion).await;
        o.early.sort_unstable();
        o.tells.sort_unstable();
        let mut broken: Vec<i64> = o.first_broken.iter().map(|(_, s)| *s).collect();
        broken.sort_unstable();
        let label = format!(
            "{}{}{}",
            sla.unwrap_or("none"),
            if reserve { " with reserve_nodes" } else { "" },
            if proportion { " under proportion" } else { "" }
        );
        println!(
            "busy cluster (seed {seed}), sla-waiting-time {label}: {} of {} jobs that fit started; {} first bounds, {} broken (late by {:?} s); \
             first bound minus start of those that held: median {} s, p90 {} s; {} bounds told, {} broken ({:.1}%); \
             estimate events per waiting job: median {}, p90 {}, max {}; never-fitting told at once: {}",
            o.started,
            o.fitting,
            o.first,
            broken.len(),
            broken,
            percentile(&o.early, 0.5),
            percentile(&o.early, 0.9),
            o.told,
            o.told_broken,
            100.0 * o.told_broken as f64 / o.told.max(1) as f64,
            percentile(&o.tells, 0.5),
            percentile(&o.tells, 0.9),
            o.tells.last().copied().unwrap_or(0),
            o.never_told_at_once,
        );
        println!(
            "  expectations: {} of {} first ones held, {} of {} told held; whole-node gangs told a bound: {}",
            o.first_expected_held,
            o.first_expected,
            o.told_expected_held,
            o.told_expected,
            o.whole_bounds
        );
        if reserve && o.whole_bounds == 0 {
            failures.push(format!(
                "sla {label}: with reserve_nodes whole-node gangs are told bounds, yet none was"
            ));
        }
        if !reserve && o.whole_bounds > 0 {
            failures.push(format!(
                "sla {label}: without reserve_nodes no whole-node gang is told a bound"
            ));
        }
        for (why, _) in &o.first_broken {
            println!("  first bound broken: {why}");
        }
        if o.started != o.fitting {
            failures.push(format!(
                "sla {label}: {} of {} jobs that fit started",
                o.started, o.fitting
            ));
        }
        if o.never_told_at_once != 2 {
            failures.push(format!(
                "sla {label}: {} never-fitting jobs told at once, not 2",
                o.never_told_at_once
            ));
        }
        if sla.is_some()
            && !(o.tells.last().is_some_and(|m| *m <= 10) && percentile(&o.tells, 0.5) < 4)
        {
            failures.push(format!(
                "sla {label}: each waiting job is told a handful of times at most (at most 10, median under 4): {:?}",
                o.tells
            ));
        }
        match sla {
            // Three queues have jobs nearly all the time: few bounds, none broken.
            Some(_) if proportion && (!o.first_broken.is_empty() || o.told_broken > 0) => {
                failures.push(format!(
                    "sla {label}: bounds are told only while one queue has jobs, and none breaks: {} of {} first, {} of {} told",
                    o.first_broken.len(),
                    o.first,
                    o.told_broken,
                    o.told
                ))
            }
            Some(_) if proportion => {}
            None if o.first + o.told > 0 => failures.push(format!(
                "sla {label}: without a reservation no estimate is a bound, yet {} were told as one",
                o.told
            )),
            Some(_) if o.first == 0 || !o.first_broken.is_empty() || o.told_broken * 100 >= o.told => {
                failures.push(format!(
                    "sla {label}: no first bound and under 1% of the bounds told break: {} of {} first, {} of {} told",
                    o.first_broken.len(),
                    o.first,
                    o.told_broken,
                    o.told
                ))
            }
            _ => {}
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
