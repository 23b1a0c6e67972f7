//! Soak mode (`bench --soak-every <secs>`): during a phase, a line every so often with each runner's
//! resident memory and CPU per job so far, and this process's memory (the simulator runs in it, with the
//! harness's observers). A runner whose memory follows the live jobs stays flat over a long phase; one
//! that keeps something per job ever submitted rises in a straight line (issue 46's 13 KiB per job).
//! The simulator's own figures follow: the objects its store holds (how many are ended ones kept as
//! text) and about how many bytes they and its watch history take, so that what the simulator keeps per
//! job can be told from what the harness does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sim::store::Footprint;

use super::fleet;
use super::observe;

/// What the phase has seen so far.
pub struct Seen {
    pub queued: observe::Seen,
    pub ended: observe::Seen,
    pub deliveries: observe::Deliveries,
    /// Reads the simulator's store footprint (a walk over the store, under its lock).
    pub store: Option<Arc<dyn Fn() -> Footprint + Send + Sync>>,
}

/// One runner's figures at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct RunnerSample {
    pub id: String,
    pub rss_mib: Option<f64>,
    pub cpu_s: Option<f64>,
}

/// One line of the soak report.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub elapsed: Duration,
    pub queued: usize,
    pub ended: usize,
    pub duplicates: usize,
    pub runners: Vec<RunnerSample>,
    pub harness_rss_mib: Option<f64>,
    pub store: Option<Footprint>,
}

impl Sample {
    /// The line printed: the jobs so far, then per runner its RSS, its CPU per job (over the jobs done:
    /// ended ones when the monitor runs them to their end, else queued ones), then this process's RSS.
    pub fn line(&self) -> String {
        let jobs = self.ended.max(self.queued);
        let mut line = format!(
            "soak {:>6.0}s queued {:>7} ended {:>7} dup {:>3}",
            self.elapsed.as_secs_f64(),
            self.queued,
            self.ended,
            self.duplicates
        );
        for r in &self.runners {
            let rss = r.rss_mib.map_or("-".into(), |m| format!("{m:.1}"));
            let per_job = match (r.cpu_s, jobs) {
                (Some(cpu), n) if n > 0 => format!("{:.2}", cpu * 1000.0 / n as f64),
                _ => "-".into(),
            };
            line.push_str(&format!(" | {} rss {rss} MiB cpu/job {per_job} ms", r.id));
        }
        let harness = self
            .harness_rss_mib
            .map_or("-".into(), |m| format!("{m:.0}"));
        line.push_str(&format!(" | sim+harness rss {harness} MiB"));
        if let Some(f) = &self.store {
            let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
            line.push_str(&format!(
                " | sim store {} objects ({} kept as text) {:.0} MiB, history {} changes {:.0} MiB",
                f.objects,
                f.kept,
                mib(f.object_bytes),
                f.history,
                mib(f.history_bytes)
            ));
        }
        line
    }
}

/// Prints a [`Sample`] every `every` until dropped.
pub struct Reporter {
    task: tokio::task::JoinHandle<()>,
}

impl Reporter {
    pub fn start(every: Duration, runners: Vec<(String, u32)>, seen: Seen) -> Reporter {
        let started = Instant::now();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                tick.tick().await;
                eprintln!("{}", sample(started, &runners, &seen).line());
            }
        });
        Reporter { task }
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn sample(started: Instant, runners: &[(String, u32)], seen: &Seen) -> Sample {
    Sample {
        elapsed: started.elapsed(),
        queued: seen.queued.len(),
        ended: seen.ended.len(),
        duplicates: seen.deliveries.counts().1,
        runners: runners
            .iter()
            .map(|(id, pid)| RunnerSample {
                id: id.clone(),
                rss_mib: fleet::rss_mib(*pid),
                cpu_s: fleet::cpu_seconds_of(*pid),
            })
            .collect(),
        harness_rss_mib: fleet::rss_mib(std::process::id()),
        store: seen.store.as_ref().map(|read| read()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_has_each_runner_s_memory_and_cpu_per_job() {
        let sample = Sample {
            elapsed: Duration::from_secs(30),
            queued: 3000,
            ended: 2000,
            duplicates: 1,
            runners: vec![
                RunnerSample {
                    id: "r-1".into(),
                    rss_mib: Some(40.3),
                    cpu_s: Some(3.0),
                },
                RunnerSample {
                    id: "r-2".into(),
                    rss_mib: None,
                    cpu_s: None,
                },
            ],
            harness_rss_mib: Some(812.4),
            store: None,
        };
        let line = sample.line();
        assert!(
            line.starts_with("soak     30s queued    3000 ended    2000 dup   1"),
            "{line}"
        );
        // 3 s of CPU over 3,000 jobs done (queued: more than ended).
        assert!(line.contains("r-1 rss 40.3 MiB cpu/job 1.00 ms"), "{line}");
        assert!(line.contains("r-2 rss - MiB cpu/job - ms"), "{line}");
        assert!(line.ends_with("sim+harness rss 812 MiB"), "{line}");
        let with_store = Sample {
            store: Some(Footprint {
                objects: 30_000,
                kept: 25_000,
                object_bytes: 200 << 20,
                history: 90_000,
                history_bytes: 300 << 20,
            }),
            ..sample
        };
        assert!(
            with_store.line().ends_with(
                "sim+harness rss 812 MiB | sim store 30000 objects (25000 kept as text) 200 MiB, \
                 history 90000 changes 300 MiB"
            ),
            "{}",
            with_store.line()
        );
    }

    #[test]
    fn a_running_process_s_memory_and_cpu_are_read() {
        let me = std::process::id();
        assert!(fleet::rss_mib(me).is_some_and(|m| m > 1.0));
        assert!(fleet::cpu_seconds_of(me).is_some_and(|c| c >= 0.0));
    }
}
