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
    /// One entry per runner count and rate.
    pub phases: Vec<Phase>,
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
    pub publish_to_created: Option<Latency>,
    pub publish_to_queued: Option<Latency>,
    pub per_runner: Vec<RunnerUsage>,
    /// CPU of the benchmark process in the phase: the simulator, the publisher and the observers.
    pub harness_cpu_s: f64,
    /// CPU of the RabbitMQ node on this machine in the phase (see [`super::fleet::broker_cpu_seconds`]);
    /// `None` when the broker does not run here (or restarted during the phase).
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
        for p in &self.phases {
            write_phase_row(&mut out, p);
        }
        self.write_monitoring_cost(&mut out);
        for p in &self.phases {
            write_requests_by_kind(&mut out, p);
        }
        out
    }

    /// What the monitoring duty costs the consuming side: per runner count and rate run both ways, the
    /// QUEUED rate with monitoring over the rate without it, against the goals (80% for one runner, 60%
    /// for more, unpaced).
    pub fn monitoring_ratios(&self) -> Vec<MonitoringRatio> {
        self.phases
            .iter()
            .filter(|on| on.monitor)
            .filter_map(|on| {
                let off = self.phases.iter().find(|off| {
                    !off.monitor && off.runners == on.runners && off.target_rate == on.target_rate
                })?;
                let ratio = on.sustained_jobs_per_s? / off.sustained_jobs_per_s?;
                Some(MonitoringRatio {
                    runners: on.runners,
                    target_rate: on.target_rate,
                    ratio,
                    goal: if on.runners == 1 { 0.8 } else { 0.6 },
                })
            })
            .collect()
    }

    fn write_monitoring_cost(&self, out: &mut String) {
        let ratios = self.monitoring_ratios();
        if ratios.is_empty() {
            return;
        }
        out.push_str("monitored / unmonitored QUEUED rate:\n");
        for r in ratios {
            let rate = r
                .target_rate
                .map_or("unpaced".into(), |t| format!("{t:.0}/s"));
            let met = match (r.target_rate, r.ratio >= r.goal) {
                (Some(_), _) => "",
                (None, true) => " (goal met)",
                (None, false) => " (goal NOT met)",
            };
            let _ = writeln!(
                out,
                "  {} runner{} {rate}: {:.0}% (goal >= {:.0}% unpaced){met}",
                r.runners,
                if r.runners == 1 { "" } else { "s" },
                r.ratio * 100.0,
                r.goal * 100.0,
            );
        }
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
            "workload: {} x {} ({} bytes, {}), max_in_flight {}, runner threads {}, prefetch {}, monitor phases {}",
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

/// One phase's row of the table (marked when it did not complete).
fn write_phase_row(out: &mut String, p: &Phase) {
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
    let _ = writeln!(
        out,
        "{:>7} | {:>7} | {:>9} | {:>8} | {:>6} | {:>6} | {:>8} | {:>6} | {:>21} | {:>21} | {:>15} | {:>13}{incomplete}",
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

/// The monitored phase's QUEUED rate over the unmonitored one's, for one runner count and rate.
#[derive(Debug, Clone, PartialEq)]
pub struct MonitoringRatio {
    pub runners: usize,
    pub target_rate: Option<f64>,
    pub ratio: f64,
    /// What the issue asks for unpaced: 0.8 for one runner, 0.6 for more.
    pub goal: f64,
}

/// A phase's API requests per job, by `<verb> <resource>`, largest first: where the requests go.
fn write_requests_by_kind(out: &mut String, p: &Phase) {
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
        "API requests per job, {} runner(s), monitor {}, {rate}: {list}",
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
            },
            limits: Some(Limits {
                broker_msgs_per_s: 4000.0,
                sim_creates_per_s: 2500.0,
            }),
            phases: vec![Phase {
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
                harness_cpu_s: 4.0,
                broker_cpu_s: Some(1.5),
            }],
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
        let report = Report {
            phases: vec![off, on, three_off, three_on],
            ..report()
        };
        let ratios = report.monitoring_ratios();
        assert_eq!(ratios.len(), 2);
        assert!((ratios[0].ratio - 1250.0 / 1600.0).abs() < 1e-9);
        assert_eq!(ratios[0].goal, 0.8);
        assert_eq!((ratios[1].runners, ratios[1].goal), (3, 0.6));
        let table = report.table();
        assert!(
            table.contains("1 runner unpaced: 78% (goal >= 80% unpaced) (goal NOT met)"),
            "{table}"
        );
        assert!(
            table.contains("3 runners unpaced: 44% (goal >= 60% unpaced) (goal NOT met)"),
            "{table}"
        );
        assert!(
            table.contains(
                "monitor off, unpaced: create jobs.batch.volcano.sh 1.00, get configmaps 1.00, patch jobs.batch.volcano.sh 0.50"
            ),
            "{table}"
        );
    }
}
