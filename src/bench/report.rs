//! What a benchmark run found: the JSON written by `--out` and the short table printed at the end.

use std::fmt::Write as _;

use serde::Serialize;

use super::stats::Latency;

/// One whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// When the run started (RFC 3339), and the program that ran it.
    pub started_at: String,
    pub version: String,
    /// The machine, so figures are compared only with figures from a similar one.
    pub machine: Machine,
    /// The workload: how many submissions, of which application, and the runner settings.
    pub workload: Workload,
    /// What the broker and the simulator manage alone, measured in the same run; `None` with
    /// `--skip-limits`.
    pub limits: Option<Limits>,
    /// One entry per trial, rate, kind of phase and runner count, in the order they ran.
    pub phases: Vec<Phase>,
    /// What the monitoring duty costs: one entry per trial, runner count and rate run both with and
    /// without it ([`monitoring_cost`]).
    pub monitoring_cost: Vec<MonitoringRatio>,
    /// With more than one trial (`--trials`): the median of the trials' QUEUED-rate ratios per runner
    /// count and rate ([`monitoring_cost_median`]), the figure to hold to the goal on a noisy machine.
    pub monitoring_cost_median: Vec<MonitoringMedian>,
}

/// The machine the figures were measured on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub os: String,
    /// The 1-minute load average when the run started: other work on the machine skews every figure.
    pub load_average_at_start: Option<f64>,
}

/// The workload and the settings of the runners.
#[derive(Debug, Clone, Serialize)]
pub struct Workload {
    pub submissions: usize,
    pub application: String,
    pub message_bytes: usize,
    pub format: String,
    pub max_in_flight: u32,
    /// Worker threads of each runner's async runtime.
    pub runner_threads: usize,
    pub submit_prefetch: u16,
    /// The kinds of phase run: without (`false`) and with (`true`) the monitoring duty (watching their
    /// jobs, publishing lifecycle events, every job running to its end).
    pub monitor: Vec<bool>,
    /// The simulated cluster of every phase, with or without monitoring: its nodes (64 cpus each) and
    /// how long each job runs once its pod starts. Both kinds of phase run the same cluster and the same
    /// jobs, so that they differ only in the runners' monitoring duty.
    pub cluster_nodes: usize,
    pub job_run_s: f64,
}

/// The two limits the runner sits between.
#[derive(Debug, Clone, Serialize)]
pub struct Limits {
    /// Submissions consumed and acked, each answered by one confirmed event of the same size as QUEUED,
    /// by a minimal lapin loop with the runner's concurrency.
    pub broker_msgs_per_s: f64,
    /// VolcanoJobs created through the kube client with the runner's concurrency (nothing else).
    pub sim_creates_per_s: f64,
}

impl Limits {
    /// The smaller limit: no runner can go faster than this on this machine.
    pub fn smaller(&self) -> f64 {
        self.broker_msgs_per_s.min(self.sim_creates_per_s)
    }
}

/// One phase: some runners, submissions published unpaced or at a fixed rate.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// The trial the phase belongs to (1 up to `--trials`): each trial runs every phase once, and a
    /// monitored phase is set against the unmonitored phase of its own trial.
    pub trial: usize,
    pub runners: usize,
    /// Whether the runners had the monitoring duty; if so every job ran to its end in the phase.
    pub monitor: bool,
    /// Submissions per second the publisher aimed at; `None` for as fast as it can.
    pub target_rate: Option<f64>,
    /// Submissions published, VolcanoJobs seen created and QUEUED events received.
    pub published: usize,
    pub created: usize,
    pub queued: usize,
    /// Jobs whose terminal event arrived (phases with the monitoring duty).
    pub ended: usize,
    /// Job events delivered to the observer (QUEUED, the monitor's events with the monitoring duty).
    pub events_delivered: usize,
    /// Deliveries of an event id already delivered: events published more than once.
    pub duplicate_deliveries: usize,
    /// `duplicate_deliveries` per 1,000 submissions published (0 without faults).
    pub duplicates_per_1000_jobs: Option<f64>,
    /// API requests the runners made in the phase (counted by the simulator), per job QUEUED (without
    /// the monitoring duty) or ended (with it): the cost of one job to the API server.
    pub api_requests_per_job: Option<f64>,
    /// The same requests by `<verb> <resource>`.
    pub api_requests_by_kind: std::collections::BTreeMap<String, u64>,
    /// API requests per second over the phase.
    pub api_requests_per_s: Option<f64>,
    /// `api_requests_per_s` over the simulator's measured request rate (the limits' creates/s): how close
    /// the runners came to the API's ceiling.
    pub ratio_to_api_limit: Option<f64>,
    /// Whether every submission was QUEUED (and, with the monitoring duty, ended) before the phase's
    /// time limit.
    pub complete: bool,
    /// The publisher's own rate (confirmed submissions per second).
    pub publish_rate: f64,
    /// Jobs per second between the first and the last tenth of the QUEUED events.
    pub sustained_jobs_per_s: Option<f64>,
    /// With the monitoring duty: jobs per second between the first and the last tenth of the terminal
    /// events. Bounded by the simulator's nodes and the jobs' run time as much as by the runners, so it
    /// says how fast jobs are carried to their end here, not what the runner alone could do.
    pub ended_jobs_per_s: Option<f64>,
    /// `sustained_jobs_per_s` over the smaller of the two limits.
    pub ratio_to_smaller_limit: Option<f64>,
    /// With the monitoring duty: the share of the steady QUEUED window (the one `sustained_jobs_per_s`
    /// is measured over) after the phase's first terminal event, when the runners carried every stage
    /// of monitoring at once ([`super::stats::monitoring_overlap`]). `None` without the duty.
    pub monitoring_overlap: Option<f64>,
    /// The runners' CPU time together, in milliseconds per job QUEUED (without the monitoring duty) or
    /// ended (with it: the job's whole life), start-up included: what one job costs a runner whatever
    /// else shares the machine.
    pub runner_cpu_ms_per_job: Option<f64>,
    pub publish_to_created: Option<Latency>,
    pub publish_to_queued: Option<Latency>,
    pub per_runner: Vec<RunnerUsage>,
    /// The share of the machine's cores the runners, the benchmark's process and the broker kept busy
    /// over the phase (`None` when the broker's CPU is unknown). Near 100% the phase was bound by the
    /// cores; with the simulator in this process, a monitored phase usually is, an unmonitored one
    /// usually not (its bound is the simulator's one lock), so their QUEUED rates are bounded by
    /// different things (README, Performance).
    pub cores_busy: Option<f64>,
    /// The share of the phase's real time (the span `cores_busy` is measured over) that the
    /// simulator's one lock was held: every API request, watch read and controller step of the
    /// simulated cluster runs under it. Near 100% the phase was bound by the simulator, whatever the
    /// cores had left (handing the lock from one holder to the next takes time of its own, which is not
    /// counted, so a bound phase reads somewhat under 100%; README, Performance).
    pub sim_lock_busy: Option<f64>,
    /// CPU of the benchmark process in the phase: the simulator, the publisher and the observers.
    pub harness_cpu_s: f64,
    /// CPU of the RabbitMQ node on this machine in the phase (its `beam.smp` processes, read by
    /// `bench::fleet`); `None` when the broker does not run here (or restarted during the phase).
    pub broker_cpu_s: Option<f64>,
}

/// What one runner process used, from the kernel's accounting when it exited.
#[derive(Debug, Clone, Serialize)]
pub struct RunnerUsage {
    pub id: String,
    pub cpu_s: f64,
    pub peak_rss_mib: f64,
    /// Whether it exited cleanly after SIGTERM.
    pub exit_ok: bool,
}

impl Report {
    /// The short table printed at the end of a run (also what the README shows).
    pub fn table(&self) -> String {
        let mut out = String::new();
        self.write_setup(&mut out);
        let _ = writeln!(
            out,
            "{:>7} | {:>7} | {:>9} | {:>8} | {:>6} | {:>6} | {:>8} | {:>6} | {:>21} | {:>21} | {:>15} | {:>13}",
            "runners",
            "monitor",
            "rate",
            "jobs/s",
            "ends/s",
            "ratio",
            "API/job",
            "dup/1k",
            "created p50/p95/p99",
            "QUEUED p50/p95/p99",
            "CPU s/runner",
            "peak RSS MiB"
        );
        // With several trials every line of a phase says which trial it belongs to.
        let trials = self.phases.iter().any(|p| p.trial > 1);
        let trial = |p: &Phase| trials.then_some(p.trial);
        for p in &self.phases {
            write_phase_row(&mut out, p, trial(p));
        }
        write_monitoring_cost(
            &mut out,
            &self.monitoring_cost,
            &self.monitoring_cost_median,
        );
        for p in &self.phases {
            write_cores(&mut out, p, trial(p));
        }
        for p in &self.phases {
            write_requests_by_kind(&mut out, p, trial(p));
        }
        out
    }

    /// The machine, the workload and the measured limits, one line each.
    fn write_setup(&self, out: &mut String) {
        let m = &self.machine;
        let _ = writeln!(
            out,
            "machine: {} CPUs ({}), {:.0} GiB; load at start {}",
            m.cpus,
            m.cpu_model,
            m.memory_gib,
            m.load_average_at_start
                .map_or("unknown".into(), |l| format!("{l:.2}")),
        );
        let w = &self.workload;
        let _ = writeln!(
            out,
            "workload: {} x {} ({} bytes, {}), max_in_flight {}, runner threads {}, prefetch {}, monitor phases {}; every phase {} nodes of 64 cpus, jobs run {} s",
            w.submissions,
            w.application,
            w.message_bytes,
            w.format,
            w.max_in_flight,
            w.runner_threads,
            w.submit_prefetch,
            w.monitor
                .iter()
                .map(|m| if *m { "on" } else { "off" })
                .collect::<Vec<_>>()
                .join(", "),
            w.cluster_nodes,
            w.job_run_s,
        );
        match &self.limits {
            Some(l) => {
                let _ = writeln!(
                    out,
                    "limits: broker {:.0} msgs/s (consume+ack+confirmed publish), simulator {:.0} VolcanoJob creates/s",
                    l.broker_msgs_per_s, l.sim_creates_per_s
                );
            }
            None => out.push_str("limits: not measured (--skip-limits)\n"),
        }
    }
}

/// One phase's row of the table (marked when it did not complete, and with its trial when the run had
/// several).
fn write_phase_row(out: &mut String, p: &Phase, trial: Option<usize>) {
    let rate = p
        .target_rate
        .map_or("unpaced".into(), |r| format!("{r:.0}/s"));
    let jobs = p
        .sustained_jobs_per_s
        .map_or("-".into(), |r| format!("{r:.0}"));
    let ends = p.ended_jobs_per_s.map_or("-".into(), |r| format!("{r:.0}"));
    let ratio = p
        .ratio_to_smaller_limit
        .map_or("-".into(), |r| format!("{:.0}%", r * 100.0));
    let lat = |l: &Option<Latency>| {
        l.map_or("-".into(), |l| {
            format!("{:.0}/{:.0}/{:.0} ms", l.p50_ms, l.p95_ms, l.p99_ms)
        })
    };
    let cpu = p
        .per_runner
        .iter()
        .map(|r| format!("{:.1}", r.cpu_s))
        .collect::<Vec<_>>()
        .join(" ");
    let rss = p
        .per_runner
        .iter()
        .map(|r| format!("{:.0}", r.peak_rss_mib))
        .collect::<Vec<_>>()
        .join(" ");
    let incomplete = if p.complete {
        String::new()
    } else {
        format!("  (incomplete: {} of {} QUEUED)", p.queued, p.published)
    };
    let trial = trial.map_or(String::new(), |t| format!("  (trial {t})"));
    let _ = writeln!(
        out,
        "{:>7} | {:>7} | {:>9} | {:>8} | {:>6} | {:>6} | {:>8} | {:>6} | {:>21} | {:>21} | {:>15} | {:>13}{incomplete}{trial}",
        p.runners,
        if p.monitor { "on" } else { "off" },
        rate,
        jobs,
        ends,
        ratio,
        p.api_requests_per_job
            .map_or("-".into(), |r| format!("{r:.1}")),
        p.duplicates_per_1000_jobs
            .map_or("-".into(), |r| format!("{r:.1}")),
        lat(&p.publish_to_created),
        lat(&p.publish_to_queued),
        cpu,
        rss
    );
}

/// What the monitoring duty cost one runner count at one rate: the phase with it against the phase
/// without it, on the same cluster and jobs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MonitoringRatio {
    /// The trial both phases belong to.
    pub trial: usize,
    pub runners: usize,
    pub target_rate: Option<f64>,
    /// The monitored phase's sustained QUEUED rate over the unmonitored one's (issue 46's figure), or
    /// `None` when the monitored phase was too short for it to mean that ([`MIN_MONITORING_OVERLAP`]).
    pub queued_rate_ratio: Option<f64>,
    /// The monitored phase's [`Phase::monitoring_overlap`], what `queued_rate_ratio` is held to.
    pub monitoring_overlap: Option<f64>,
    /// Why `queued_rate_ratio` is `None`.
    pub queued_rate_ratio_withheld: Option<String>,
    /// The runners' CPU per job without the monitoring duty over that with it: the share of its
    /// unmonitored rate a runner with cores of its own would keep, whatever the simulator and the
    /// broker take on this machine. Every job's whole life is in the monitored phase's figure.
    pub cpu_per_job_ratio: Option<f64>,
    /// The two phases' [`Phase::runner_cpu_ms_per_job`] the CPU ratio is made of.
    pub runner_cpu_ms_per_job_unmonitored: Option<f64>,
    pub runner_cpu_ms_per_job_monitored: Option<f64>,
    /// What the issue asks of `queued_rate_ratio` unpaced: 0.8 for one runner, 0.6 for more.
    pub goal: f64,
}

/// The share of the monitored phase's steady QUEUED window that must come after its first terminal
/// event for its QUEUED rate to be set against the unmonitored phase's. Before a phase's first job
/// ends, the runners do only the first stages of the monitoring duty (RUNNING), not the end, its
/// records and the final tick; a phase of 1,000 submissions closes its window before that (its jobs
/// run 2 s), and its ratio flattered the runner by half (59 to 79% where phases of 4,000 gave 28 to
/// 33%, README "Performance"). With three quarters of the window carrying the whole duty, what is
/// left out is part of the duty over at most a quarter of the window.
pub const MIN_MONITORING_OVERLAP: f64 = 0.75;

/// What the monitoring duty costs, per runner count and rate run both with and without it: the QUEUED
/// rate with monitoring over the rate without (when the monitored phase was long enough for its
/// monitoring to overlap the submissions), and the runners' CPU per job without over with.
pub fn monitoring_cost(phases: &[Phase]) -> Vec<MonitoringRatio> {
    phases
        .iter()
        .filter(|on| on.monitor)
        .filter_map(|on| {
            let off = phases.iter().find(|off| {
                !off.monitor
                    && off.trial == on.trial
                    && off.runners == on.runners
                    && off.target_rate == on.target_rate
            })?;
            let raw = on
                .sustained_jobs_per_s
                .zip(off.sustained_jobs_per_s)
                .map(|(on, off)| on / off);
            let (queued_rate_ratio, withheld) = match (raw, on.monitoring_overlap) {
                (None, _) => (None, Some("no sustained QUEUED rate in one of the phases".into())),
                (Some(r), Some(o)) if o >= MIN_MONITORING_OVERLAP => (Some(r), None),
                (Some(_), o) => (
                    None,
                    Some(format!(
                        "the monitored phase's jobs were ending over {:.0}% of its steady QUEUED window, at least {:.0}% needed: run more submissions (e.g. --submissions 10000)",
                        o.unwrap_or(0.0) * 100.0,
                        MIN_MONITORING_OVERLAP * 100.0
                    )),
                ),
            };
            let cpu_per_job_ratio = off
                .runner_cpu_ms_per_job
                .zip(on.runner_cpu_ms_per_job)
                .filter(|(_, on)| *on > 0.0)
                .map(|(off, on)| off / on);
            Some(MonitoringRatio {
                trial: on.trial,
                runners: on.runners,
                target_rate: on.target_rate,
                queued_rate_ratio,
                monitoring_overlap: on.monitoring_overlap,
                queued_rate_ratio_withheld: withheld,
                cpu_per_job_ratio,
                runner_cpu_ms_per_job_unmonitored: off.runner_cpu_ms_per_job,
                runner_cpu_ms_per_job_monitored: on.runner_cpu_ms_per_job,
                goal: if on.runners == 1 { 0.8 } else { 0.6 },
            })
        })
        .collect()
}

/// The median over the trials of one runner count and rate's QUEUED-rate ratio (`--trials`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MonitoringMedian {
    pub runners: usize,
    pub target_rate: Option<f64>,
    /// The trials' ratios, in the trials' order; a trial whose ratio was withheld is left out.
    pub queued_rate_ratios: Vec<f64>,
    /// Their median (the mean of the middle two for an even count); `None` when every trial's was
    /// withheld.
    pub median_queued_rate_ratio: Option<f64>,
    /// As in [`MonitoringRatio::goal`].
    pub goal: f64,
}

/// Per runner count and rate, the median of the trials' QUEUED-rate ratios, when the run had more
/// than one trial: one pair of phases on a shared machine spreads wider than the goals' margin (README,
/// Performance), the median of interleaved trials much less.
pub fn monitoring_cost_median(ratios: &[MonitoringRatio]) -> Vec<MonitoringMedian> {
    if ratios.iter().all(|r| r.trial <= 1) {
        return Vec::new();
    }
    let alike = |a: &MonitoringRatio, b: &MonitoringRatio| {
        a.runners == b.runners && a.target_rate == b.target_rate
    };
    // The first trial's entry of each runner count and rate, in the order they ran.
    let mut firsts: Vec<&MonitoringRatio> = Vec::new();
    for r in ratios {
        if !firsts.iter().any(|f| alike(f, r)) {
            firsts.push(r);
        }
    }
    firsts
        .into_iter()
        .map(|first| {
            let given: Vec<f64> = ratios
                .iter()
                .filter(|r| alike(r, first))
                .filter_map(|r| r.queued_rate_ratio)
                .collect();
            MonitoringMedian {
                runners: first.runners,
                target_rate: first.target_rate,
                median_queued_rate_ratio: super::stats::median(&given),
                queued_rate_ratios: given,
                goal: first.goal,
            }
        })
        .collect()
}

/// A QUEUED-rate ratio against the goal: the goal is for unpaced phases only.
fn against_goal(ratio: f64, goal: f64, target_rate: Option<f64>) -> String {
    let met = match (target_rate, ratio >= goal) {
        (Some(_), _) => "",
        (None, true) => " (goal met)",
        (None, false) => " (goal NOT met)",
    };
    format!(
        "{:.0}% (goal >= {:.0}% unpaced){met}",
        ratio * 100.0,
        goal * 100.0
    )
}

/// The footer of the table: per trial, runner count and rate run both ways, the QUEUED-rate ratio
/// against the goal (or why it is not given) and the CPU-per-job ratio; then, over several trials, the
/// medians.
fn write_monitoring_cost(
    out: &mut String,
    ratios: &[MonitoringRatio],
    medians: &[MonitoringMedian],
) {
    if ratios.is_empty() {
        return;
    }
    out.push_str(
        "monitoring cost: monitored / unmonitored QUEUED rate; runner CPU per job unmonitored / monitored:\n",
    );
    for r in ratios {
        let rate = r
            .target_rate
            .map_or("unpaced".into(), |t| format!("{t:.0}/s"));
        let queued = match (r.queued_rate_ratio, &r.queued_rate_ratio_withheld) {
            (Some(ratio), _) => against_goal(ratio, r.goal, r.target_rate),
            (None, why) => format!("not given: {}", why.as_deref().unwrap_or("unknown")),
        };
        let trial = if medians.is_empty() {
            String::new()
        } else {
            format!("trial {}, ", r.trial)
        };
        let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
        let cpu = format!(
            "{} ({} / {} ms)",
            r.cpu_per_job_ratio
                .map_or("-".into(), |c| format!("{:.0}%", c * 100.0)),
            ms(r.runner_cpu_ms_per_job_unmonitored),
            ms(r.runner_cpu_ms_per_job_monitored),
        );
        let _ = writeln!(
            out,
            "  {trial}{} runner{} {rate}: QUEUED rate {queued}; CPU per job {cpu}",
            r.runners,
            if r.runners == 1 { "" } else { "s" },
        );
    }
    for m in medians {
        let rate = m
            .target_rate
            .map_or("unpaced".into(), |t| format!("{t:.0}/s"));
        let median = m.median_queued_rate_ratio.map_or_else(
            || "not given (withheld in every trial)".to_owned(),
            |ratio| against_goal(ratio, m.goal, m.target_rate),
        );
        let each = m
            .queued_rate_ratios
            .iter()
            .map(|r| format!("{:.0}%", r * 100.0))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "  median of {} trial(s), {} runner{} {rate}: QUEUED rate {median} [{each}]",
            m.queued_rate_ratios.len(),
            m.runners,
            if m.runners == 1 { "" } else { "s" },
        );
    }
}

/// Where a phase's CPU went, per job (QUEUED without the monitoring duty, ended with it): the runners,
/// this process (the simulator, the publisher, the observers) and the broker, and how busy that kept
/// the machine's cores.
fn write_cores(out: &mut String, p: &Phase, trial: Option<usize>) {
    let trial = trial.map_or(String::new(), |t| format!("trial {t}, "));
    let jobs = if p.monitor { p.ended } else { p.queued };
    if jobs == 0 {
        return;
    }
    let per_job = |s: f64| format!("{:.2}", s * 1000.0 / jobs as f64);
    let runners: f64 = p.per_runner.iter().map(|r| r.cpu_s).sum();
    let rate = p
        .target_rate
        .map_or("unpaced".into(), |r| format!("{r:.0}/s"));
    let busy = p.cores_busy.map_or(String::new(), |b| {
        format!("; the cores {:.0}% busy", b * 100.0)
    });
    let lock = p.sim_lock_busy.map_or(String::new(), |b| {
        format!(", the simulator's lock {:.0}% held", b * 100.0)
    });
    let _ = writeln!(
        out,
        "CPU per job, {trial}{} runner(s), monitor {}, {rate}: runners {}, simulator and benchmark {}, RabbitMQ {} ms{busy}{lock}",
        p.runners,
        if p.monitor { "on" } else { "off" },
        per_job(runners),
        per_job(p.harness_cpu_s),
        p.broker_cpu_s.map_or("-".into(), per_job),
    );
}

/// A phase's API requests per job, by `<verb> <resource>`, largest first: where the requests go.
fn write_requests_by_kind(out: &mut String, p: &Phase, trial: Option<usize>) {
    let trial = trial.map_or(String::new(), |t| format!("trial {t}, "));
    let jobs = if p.monitor { p.ended } else { p.queued };
    if jobs == 0 || p.api_requests_by_kind.is_empty() {
        return;
    }
    let mut kinds: Vec<(&String, &u64)> = p.api_requests_by_kind.iter().collect();
    kinds.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let rate = p
        .target_rate
        .map_or("unpaced".into(), |r| format!("{r:.0}/s"));
    let list = kinds
        .iter()
        .map(|(kind, n)| format!("{kind} {:.2}", **n as f64 / jobs as f64))
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(
        out,
        "API requests per job, {trial}{} runner(s), monitor {}, {rate}: {list}",
        p.runners,
        if p.monitor { "on" } else { "off" },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report {
            started_at: "2026-11-22T07:00:00Z".into(),
            version: "0.1.0".into(),
            machine: Machine {
                cpus: 2,
                cpu_model: "Test CPU".into(),
                memory_gib: 24.0,
                os: "linux".into(),
                load_average_at_start: Some(0.5),
            },
            workload: Workload {
                submissions: 1000,
                application: "figlet".into(),
                message_bytes: 1234,
                format: "json".into(),
                max_in_flight: 64,
                runner_threads: 1,
                submit_prefetch: 128,
                monitor: vec![false, true],
                cluster_nodes: 40,
                job_run_s: 2.0,
            },
            limits: Some(Limits {
                broker_msgs_per_s: 4000.0,
                sim_creates_per_s: 2500.0,
            }),
            phases: vec![Phase {
                trial: 1,
                runners: 1,
                monitor: true,
                target_rate: None,
                published: 1000,
                created: 1000,
                queued: 990,
                ended: 900,
                events_delivered: 4000,
                duplicate_deliveries: 7,
                duplicates_per_1000_jobs: Some(7.0),
                api_requests_per_job: Some(3.5),
                api_requests_by_kind: std::collections::BTreeMap::from([(
                    "create jobs.batch.volcano.sh".to_owned(),
                    1000,
                )]),
                api_requests_per_s: Some(4375.0),
                ratio_to_api_limit: Some(1.75),
                complete: false,
                publish_rate: 5000.0,
                sustained_jobs_per_s: Some(1250.0),
                ended_jobs_per_s: None,
                ratio_to_smaller_limit: Some(0.5),
                monitoring_overlap: Some(0.9),
                runner_cpu_ms_per_job: Some(3.6),
                publish_to_created: Some(Latency {
                    count: 1000,
                    p50_ms: 12.0,
                    p95_ms: 30.4,
                    p99_ms: 80.6,
                    max_ms: 100.0,
                }),
                publish_to_queued: None,
                per_runner: vec![RunnerUsage {
                    id: "bench-1".into(),
                    cpu_s: 3.25,
                    peak_rss_mib: 61.2,
                    exit_ok: true,
                }],
                cores_busy: Some(0.875),
                sim_lock_busy: Some(0.6),
                harness_cpu_s: 4.0,
                broker_cpu_s: Some(1.5),
            }],
            monitoring_cost: Vec::new(),
            monitoring_cost_median: Vec::new(),
        }
    }

    #[test]
    fn the_smaller_limit_bounds_the_runner() {
        assert_eq!(report().limits.unwrap().smaller(), 2500.0);
    }

    #[test]
    fn the_table_shows_each_phase_and_what_is_missing() {
        let table = report().table();
        let row = table.lines().rfind(|l| l.contains(" | ")).unwrap();
        assert!(row.contains("unpaced"), "{row}");
        assert!(row.contains("1250"), "{row}");
        assert!(row.contains("50%"), "{row}");
        assert!(row.contains("12/30/81 ms"), "{row}");
        assert!(row.contains("3.2") || row.contains("3.3"), "{row}");
        assert!(row.contains("61"), "{row}");
        assert!(row.contains("incomplete: 990 of 1000 QUEUED"), "{row}");
        assert!(row.contains(" on "), "the monitor column: {row}");
        assert!(row.contains("3.5"), "API requests per job: {row}");
        assert!(
            row.contains("|    7.0 |"),
            "duplicates per 1,000 jobs: {row}"
        );
        assert!(table.contains("broker 4000 msgs/s"), "{table}");
        assert!(table.contains("load at start 0.50"), "{table}");
        // 900 jobs ended: 3.25 s of runner CPU, 4.0 s of this process, 1.5 s of the broker.
        assert!(
            table.contains(
                "CPU per job, 1 runner(s), monitor on, unpaced: runners 3.61, simulator and benchmark 4.44, RabbitMQ 1.67 ms; the cores 88% busy, the simulator's lock 60% held"
            ),
            "{table}"
        );
        let skipped = Report {
            limits: None,
            ..report()
        };
        assert!(
            skipped
                .table()
                .contains("limits: not measured (--skip-limits)")
        );
        assert!(serde_json::to_value(skipped).unwrap()["limits"].is_null());
    }

    #[test]
    fn the_json_names_every_figure() {
        let json = serde_json::to_value(report()).unwrap();
        let phase = &json["phases"][0];
        assert_eq!(phase["publish_to_created"]["p99_ms"], 80.6);
        assert!(phase["publish_to_queued"].is_null());
        assert_eq!(json["limits"]["sim_creates_per_s"], 2500.0);
        assert_eq!(phase["per_runner"][0]["peak_rss_mib"], 61.2);
        assert_eq!(phase["duplicates_per_1000_jobs"], 7.0);
        assert_eq!(phase["harness_cpu_s"], 4.0);
        assert_eq!(phase["broker_cpu_s"], 1.5);
        assert_eq!(phase["cores_busy"], 0.875);
        assert_eq!(phase["sim_lock_busy"], 0.6);
        assert_eq!(phase["monitoring_overlap"], 0.9);
        assert_eq!(phase["runner_cpu_ms_per_job"], 3.6);
        assert_eq!(json["workload"]["cluster_nodes"], 40);
        assert_eq!(json["workload"]["job_run_s"], 2.0);
        let off = Phase {
            monitor: false,
            monitoring_overlap: None,
            runner_cpu_ms_per_job: Some(0.9),
            sustained_jobs_per_s: Some(2500.0),
            ..report().phases[0].clone()
        };
        let phases = vec![off, report().phases[0].clone()];
        let json = serde_json::to_value(Report {
            monitoring_cost: monitoring_cost(&phases),
            phases,
            ..report()
        })
        .unwrap();
        let cost = &json["monitoring_cost"][0];
        assert_eq!(cost["runners"], 1);
        assert!(cost["target_rate"].is_null());
        assert_eq!(cost["queued_rate_ratio"], 0.5);
        assert_eq!(cost["monitoring_overlap"], 0.9);
        assert!(cost["queued_rate_ratio_withheld"].is_null());
        assert_eq!(cost["cpu_per_job_ratio"], 0.25);
        assert_eq!(cost["runner_cpu_ms_per_job_unmonitored"], 0.9);
        assert_eq!(cost["runner_cpu_ms_per_job_monitored"], 3.6);
        assert_eq!(cost["goal"], 0.8);
    }

    #[test]
    fn the_table_says_what_monitoring_costs_and_where_the_requests_go() {
        let on = report().phases[0].clone();
        let off = Phase {
            monitor: false,
            sustained_jobs_per_s: Some(1600.0),
            queued: 1000,
            api_requests_by_kind: std::collections::BTreeMap::from([
                ("create jobs.batch.volcano.sh".to_owned(), 1000),
                ("get configmaps".to_owned(), 1000),
                ("patch jobs.batch.volcano.sh".to_owned(), 500),
            ]),
            ..on.clone()
        };
        let three_on = Phase {
            runners: 3,
            sustained_jobs_per_s: Some(700.0),
            ..on.clone()
        };
        let three_off = Phase {
            runners: 3,
            ..off.clone()
        };
        let phases = vec![off, on, three_off, three_on];
        let report = Report {
            monitoring_cost: monitoring_cost(&phases),
            phases,
            ..report()
        };
        let ratios = &report.monitoring_cost;
        assert_eq!(ratios.len(), 2);
        assert!((ratios[0].queued_rate_ratio.unwrap() - 1250.0 / 1600.0).abs() < 1e-9);
        assert_eq!(ratios[0].goal, 0.8);
        assert_eq!((ratios[1].runners, ratios[1].goal), (3, 0.6));
        let table = report.table();
        assert!(
            table.contains(
                "1 runner unpaced: QUEUED rate 78% (goal >= 80% unpaced) (goal NOT met); CPU per job 100% (3.60 / 3.60 ms)"
            ),
            "{table}"
        );
        assert!(
            table.contains(
                "3 runners unpaced: QUEUED rate 44% (goal >= 60% unpaced) (goal NOT met)"
            ),
            "{table}"
        );
        assert!(
            table.contains(
                "monitor off, unpaced: create jobs.batch.volcano.sh 1.00, get configmaps 1.00, patch jobs.batch.volcano.sh 0.50"
            ),
            "{table}"
        );
    }

    /// Over several trials each monitored phase is set against the unmonitored phase of its own trial,
    /// and the footer gives the median of the ratios given (a withheld one left out); one trial gives
    /// no median and no trial numbers.
    #[test]
    fn trials_pair_within_themselves_and_give_the_median_ratio() {
        let on = report().phases[0].clone();
        let off = Phase {
            monitor: false,
            monitoring_overlap: None,
            ..on.clone()
        };
        let pair = |trial: usize, off_rate: f64, on_rate: f64, overlap: f64| {
            [
                Phase {
                    trial,
                    sustained_jobs_per_s: Some(off_rate),
                    ..off.clone()
                },
                Phase {
                    trial,
                    sustained_jobs_per_s: Some(on_rate),
                    monitoring_overlap: Some(overlap),
                    ..on.clone()
                },
            ]
        };
        let phases: Vec<Phase> = [
            pair(1, 1000.0, 900.0, 0.9),
            pair(2, 400.0, 200.0, 0.9),
            pair(3, 1000.0, 850.0, 0.9),
            pair(4, 1000.0, 990.0, 0.2),
        ]
        .concat();
        let cost = monitoring_cost(&phases);
        let ratios: Vec<(usize, Option<f64>)> = cost
            .iter()
            .map(|c| (c.trial, c.queued_rate_ratio))
            .collect();
        assert_eq!(
            ratios,
            vec![(1, Some(0.9)), (2, Some(0.5)), (3, Some(0.85)), (4, None)],
            "each against its own trial's unmonitored rate"
        );
        let medians = monitoring_cost_median(&cost);
        assert_eq!(medians.len(), 1);
        assert_eq!(medians[0].queued_rate_ratios, vec![0.9, 0.5, 0.85]);
        assert_eq!(medians[0].median_queued_rate_ratio, Some(0.85));
        let table = Report {
            monitoring_cost: cost,
            monitoring_cost_median: medians.clone(),
            phases,
            ..report()
        }
        .table();
        assert!(
            table.contains(
                "  trial 2, 1 runner unpaced: QUEUED rate 50% (goal >= 80% unpaced) (goal NOT met)"
            ),
            "{table}"
        );
        assert!(
            table.contains("  median of 3 trial(s), 1 runner unpaced: QUEUED rate 85% (goal >= 80% unpaced) (goal met) [90%, 50%, 85%]"),
            "{table}"
        );
        assert!(
            table.contains("CPU per job, trial 4, 1 runner(s), monitor on, unpaced:"),
            "{table}"
        );
        assert!(
            table.contains("API requests per job, trial 3, 1 runner(s), monitor off, unpaced:"),
            "{table}"
        );
        let rows: Vec<&str> = table.lines().filter(|l| l.contains(" | ")).collect();
        assert!(rows[2].ends_with("  (trial 1)"), "{}", rows[2]);
        assert!(rows[8].ends_with("  (trial 4)"), "{}", rows[8]);
        let json = serde_json::to_value(&medians).unwrap();
        assert_eq!(json[0]["median_queued_rate_ratio"], 0.85);

        let one = monitoring_cost(&pair(1, 1000.0, 900.0, 0.9));
        assert!(
            monitoring_cost_median(&one).is_empty(),
            "one trial: no median"
        );
        let table = Report {
            monitoring_cost: one,
            ..report()
        }
        .table();
        assert!(
            table.contains("\n  1 runner unpaced: QUEUED rate 90%"),
            "{table}"
        );
        assert!(!table.contains("trial"), "{table}");
    }

    /// A monitored phase whose steady QUEUED window closed before most of its monitoring (its jobs'
    /// ends) came gives no QUEUED-rate ratio, and says why and what to run instead; the CPU ratio,
    /// which counts every job's whole life, is still given.
    #[test]
    fn a_monitored_phase_too_short_for_its_monitoring_gives_no_queued_rate_ratio() {
        let on = Phase {
            monitoring_overlap: Some(0.2),
            runner_cpu_ms_per_job: Some(2.0),
            ..report().phases[0].clone()
        };
        let off = Phase {
            monitor: false,
            monitoring_overlap: None,
            runner_cpu_ms_per_job: Some(0.5),
            sustained_jobs_per_s: Some(1600.0),
            ..on.clone()
        };
        let cost = monitoring_cost(&[off.clone(), on.clone()]);
        assert_eq!(cost.len(), 1);
        assert_eq!(cost[0].queued_rate_ratio, None);
        assert_eq!(cost[0].monitoring_overlap, Some(0.2));
        assert_eq!(cost[0].cpu_per_job_ratio, Some(0.25));
        let why = cost[0].queued_rate_ratio_withheld.as_deref().unwrap();
        assert!(
            why.contains("over 20% of its steady QUEUED window"),
            "{why}"
        );
        assert!(why.contains("at least 75% needed"), "{why}");
        assert!(why.contains("--submissions"), "{why}");
        let table = Report {
            monitoring_cost: cost,
            phases: vec![off.clone(), on.clone()],
            ..report()
        }
        .table();
        assert!(
            table.contains("1 runner unpaced: QUEUED rate not given: the monitored phase's jobs were ending over 20%"),
            "{table}"
        );
        assert!(
            table.contains("CPU per job 25% (0.50 / 2.00 ms)"),
            "{table}"
        );
        assert!(!table.contains("goal NOT met"), "{table}");

        // At the threshold the ratio is given; a phase with no overlap measured (no steady window) is
        // held to it as none.
        let long = Phase {
            monitoring_overlap: Some(MIN_MONITORING_OVERLAP),
            ..on.clone()
        };
        let cost = monitoring_cost(&[off.clone(), long]);
        assert_eq!(cost[0].queued_rate_ratio, Some(1250.0 / 1600.0));
        let unknown = Phase {
            monitoring_overlap: None,
            ..on
        };
        assert_eq!(monitoring_cost(&[off, unknown])[0].queued_rate_ratio, None);
    }
}
