//! Runner processes for a benchmark phase: this very program's `run` command, one process per runner,
//! so that each one's CPU time and peak memory come from the kernel's own accounting when it exits.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::BenchError;
use super::report::RunnerUsage;

/// How a runner process is started.
#[derive(Debug, Clone)]
pub struct RunnerSpec {
    /// The program (`std::env::current_exe()`): the runner measured is the one that was built.
    pub program: PathBuf,
    /// A command the runner's command line is given to (a profiler such as `valgrind`), or none.
    pub wrap: Vec<String>,
    /// The configuration file the benchmark itself was given, if any.
    pub config_file: Option<PathBuf>,
    /// `VOLCANO_RUNNER_*` overrides: the phase's exchanges and queues, the in-flight limit, quiet logs.
    pub env: Vec<(String, String)>,
    /// Worker threads of each runner's runtime, as `TOKIO_WORKER_THREADS` (whatever this process has).
    pub worker_threads: usize,
    /// The simulator's URL.
    pub cluster_url: String,
    pub monitor: bool,
    /// Where each runner's output goes (`<dir>/<id>.log`), to read when a phase goes wrong.
    pub log_dir: PathBuf,
}

/// The runners of one phase.
#[derive(Debug)]
pub struct Fleet {
    runners: Vec<(String, Child)>,
}

/// The command line and environment of runner `id`.
fn runner_command(spec: &RunnerSpec, id: &str) -> Command {
    let mut command = match spec.wrap.split_first() {
        Some((wrapper, args)) => {
            let mut command = Command::new(wrapper);
            command.args(args).arg(&spec.program);
            command
        }
        None => Command::new(&spec.program),
    };
    if let Some(file) = &spec.config_file {
        command.arg("--config").arg(file);
    }
    command
        .args(["run", "--cluster", &spec.cluster_url, "--id", id])
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("TOKIO_WORKER_THREADS", spec.worker_threads.to_string());
    if !spec.monitor {
        command.arg("--no-monitor");
    }
    command
}

impl Fleet {
    /// Starts `count` runners named `<prefix>-1` to `<prefix>-<count>`.
    pub fn start(spec: &RunnerSpec, prefix: &str, count: usize) -> Result<Fleet, BenchError> {
        std::fs::create_dir_all(&spec.log_dir).map_err(|e| BenchError::Runner {
            id: prefix.into(),
            reason: format!(
                "cannot create log directory {}: {e}",
                spec.log_dir.display()
            ),
        })?;
        let mut fleet = Fleet {
            runners: Vec::new(),
        };
        for k in 1..=count {
            let id = format!("{prefix}-{k}");
            let log_path = spec.log_dir.join(format!("{id}.log"));
            let log = std::fs::File::create(&log_path).map_err(|e| BenchError::Runner {
                id: id.clone(),
                reason: format!("cannot create {}: {e}", log_path.display()),
            })?;
            let err_log = log.try_clone().map_err(|e| BenchError::Runner {
                id: id.clone(),
                reason: e.to_string(),
            })?;
            let mut command = runner_command(spec, &id);
            command.stdin(Stdio::null()).stdout(log).stderr(err_log);
            let child = command.spawn().map_err(|e| BenchError::Runner {
                id: id.clone(),
                reason: format!("cannot start {}: {e}", spec.program.display()),
            })?;
            fleet.runners.push((id, child));
        }
        Ok(fleet)
    }

    /// Each runner's id and process id.
    pub fn runners(&self) -> Vec<(String, u32)> {
        self.runners
            .iter()
            .map(|(id, child)| (id.clone(), child.id()))
            .collect()
    }

    /// Fails if a runner has exited already (a bad configuration, say): its log says why.
    pub fn check_alive(&mut self, log_dir: &std::path::Path) -> Result<(), BenchError> {
        for (id, child) in &mut self.runners {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(BenchError::Runner {
                    id: id.clone(),
                    reason: format!(
                        "exited early ({status}); see {}",
                        log_dir.join(format!("{id}.log")).display()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Sends SIGTERM to every runner, waits for each to exit (at most `patience`, then SIGKILL) and
    /// returns what each used over its whole life.
    pub async fn stop(mut self, patience: Duration) -> Vec<RunnerUsage> {
        let runners = std::mem::take(&mut self.runners);
        // The peak RSS of the running program, read before it stops: the kernel's ru_maxrss of a child
        // also counts the pages it shared with this (large) process between fork and exec.
        let peaks: Vec<Option<f64>> = runners
            .iter()
            .map(|(_, child)| peak_rss_mib(child.id()))
            .collect();
        for (_, child) in &runners {
            signal(child.id(), libc::SIGTERM);
        }
        let mut usage = Vec::new();
        for ((id, child), peak) in runners.into_iter().zip(peaks) {
            let pid = child.id();
            let waited = tokio::task::spawn_blocking(move || reap(pid));
            let (exit_ok, cpu_s) = match tokio::time::timeout(patience, waited).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => (false, 0.0),
                Err(_) => {
                    signal(pid, libc::SIGKILL);
                    tokio::task::spawn_blocking(move || reap(pid))
                        .await
                        .map(|(_, cpu)| (false, cpu))
                        .unwrap_or((false, 0.0))
                }
            };
            // Reaped by `wait4` above; dropping a `Child` neither waits nor kills.
            drop(child);
            usage.push(RunnerUsage {
                id,
                cpu_s,
                peak_rss_mib: peak.unwrap_or(f64::NAN),
                exit_ok,
            });
        }
        usage
    }
}

/// A fleet dropped without [`Fleet::stop`] (a phase that failed half-way) kills its runners, so no
/// runner outlives the benchmark.
impl Drop for Fleet {
    fn drop(&mut self) {
        for (_, child) in &mut self.runners {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) with a pid of our own child; it has no memory-safety preconditions.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// The high-water mark of a process's resident memory (`VmHWM`), in MiB, while it runs.
pub fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_hwm(&status)
}

/// A process's resident memory now (`VmRSS`), in MiB.
pub fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_status_kib(&status, "VmRSS:")
}

/// CPU seconds (user + system) a running process has used so far.
pub fn cpu_seconds_of(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat_cpu_ticks(&stat)? as f64 / clock_ticks_per_second())
}

fn parse_vm_hwm(status: &str) -> Option<f64> {
    parse_status_kib(status, "VmHWM:")
}

/// A `/proc/<pid>/status` line in kB, in MiB.
fn parse_status_kib(status: &str, field: &str) -> Option<f64> {
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// Waits for the child and returns (exited with status 0, user+system CPU seconds).
fn reap(pid: u32) -> (bool, f64) {
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4(2) on our own child's pid with valid pointers to locals.
    let reaped = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
    if reaped != pid as libc::pid_t {
        return (false, 0.0);
    }
    let exited_ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    (exited_ok, cpu_seconds(&usage))
}

fn cpu_seconds(usage: &libc::rusage) -> f64 {
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// The CPU this process and the RabbitMQ node on this machine had used at a moment: what a phase
/// costs them is the difference at its end ([`CpuSince::taken`]).
pub struct CpuSince {
    own: f64,
    broker: Option<Vec<(u32, f64)>>,
    at: std::time::Instant,
}

/// What [`CpuSince::taken`] read: CPU seconds of this process and of the broker over a span of time.
#[derive(Debug, Clone, Copy)]
pub struct CpuTaken {
    pub own_s: f64,
    /// `None` when the broker does not run here, or restarted meanwhile (it counts from zero again: no
    /// figure rather than a wrong one).
    pub broker_s: Option<f64>,
    /// The real time the two were measured over.
    pub wall_s: f64,
}

impl CpuSince {
    pub fn now() -> Self {
        Self {
            own: own_cpu_seconds(),
            broker: broker_cpu_seconds(),
            at: std::time::Instant::now(),
        }
    }

    /// This process's CPU seconds since, the broker's, and the real time between.
    pub fn taken(&self) -> CpuTaken {
        let own_s = own_cpu_seconds() - self.own;
        let broker_s = self
            .broker
            .as_ref()
            .zip(broker_cpu_seconds())
            .and_then(|(before, after)| broker_taken(before, &after));
        CpuTaken {
            own_s,
            broker_s,
            wall_s: self.at.elapsed().as_secs_f64(),
        }
    }
}

/// CPU seconds (user + system) this process has used so far.
fn own_cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage(2) with a valid pointer to a local.
    unsafe {
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
    }
    cpu_seconds(&usage)
}

/// The broker's CPU seconds between two readings of [`broker_cpu_seconds`], summed over the processes
/// in both: an Erlang VM that started or ended between them (each `rabbitmqctl` or
/// `rabbitmq-diagnostics` run meanwhile is one, as `scripts/demo` runs) is left out rather than making
/// the sum wrong, or less than before and so no figure at all. `None` when no process is in both (the
/// node restarted: it counts from zero again).
fn broker_taken(before: &[(u32, f64)], after: &[(u32, f64)]) -> Option<f64> {
    let mut total: Option<f64> = None;
    for (pid, now) in after {
        let Some((_, then)) = before.iter().find(|(p, _)| p == pid) else {
            continue;
        };
        // Less than before: another process under a reused pid.
        if now >= then {
            *total.get_or_insert(0.0) += now - then;
        }
    }
    total
}

/// CPU seconds (user + system) that each process of the RabbitMQ node on this machine has used so
/// far, by pid: every process named `beam.smp` (Erlang's VM, RabbitMQ's process). `None` when none runs
/// here (a remote broker) or none can be read. The broker shares the machine's cores with the simulator
/// and the runners, so its share is part of what a phase costs.
fn broker_cpu_seconds() -> Option<Vec<(u32, f64)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let path = entry.path();
        let is_beam =
            std::fs::read_to_string(path.join("comm")).is_ok_and(|c| c.trim() == "beam.smp");
        if !is_beam {
            continue;
        }
        if let Some(ticks) = std::fs::read_to_string(path.join("stat"))
            .ok()
            .and_then(|stat| stat_cpu_ticks(&stat))
        {
            found.push((pid, ticks as f64 / clock_ticks_per_second()));
        }
    }
    (!found.is_empty()).then_some(found)
}

/// `utime + stime` (in clock ticks) from a `/proc/<pid>/stat` line. The command name (second field) is
/// in parentheses and may itself hold spaces and parentheses: fields are counted after the last `)`.
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    // After the name: state (field 3), ..., utime (field 14), stime (field 15).
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf(3) with a valid name has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { hz as f64 } else { 100.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runner_runs_with_the_benchmarks_thread_count_whatever_this_process_has() {
        let spec = RunnerSpec {
            program: PathBuf::from("/bin/volcano-runner"),
            wrap: Vec::new(),
            config_file: None,
            env: vec![("VOLCANO_RUNNER_OPS__LOG_FILTER".into(), "warn".into())],
            worker_threads: 3,
            cluster_url: "http://127.0.0.1:1".into(),
            monitor: false,
            log_dir: PathBuf::from("/tmp"),
        };
        let command = runner_command(&spec, "r-1");
        let envs: Vec<(String, Option<String>)> = command
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.map(|v| v.to_string_lossy().into_owned()),
                )
            })
            .collect();
        assert!(
            envs.contains(&("TOKIO_WORKER_THREADS".into(), Some("3".into()))),
            "{envs:?}"
        );
        assert!(envs.contains(&("VOLCANO_RUNNER_OPS__LOG_FILTER".into(), Some("warn".into()))));
        let args: Vec<String> = command
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            [
                "run",
                "--cluster",
                "http://127.0.0.1:1",
                "--id",
                "r-1",
                "--no-monitor"
            ]
        );
    }

    #[test]
    fn cpu_ticks_are_read_after_the_command_name() {
        let stat =
            "4242 (beam (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 1234 56 0 0 20 0 30 0 100";
        assert_eq!(stat_cpu_ticks(stat), Some(1234 + 56));
        assert_eq!(stat_cpu_ticks("4242 (beam.smp) S 1 2"), None, "too short");
        assert_eq!(stat_cpu_ticks("no parenthesis"), None);
        // This very process's line parses, and its CPU so far is what getrusage says, to a tick or so.
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        let ticks = stat_cpu_ticks(&own).expect("our own stat line parses");
        let from_stat = ticks as f64 / clock_ticks_per_second();
        let from_rusage = own_cpu_seconds();
        assert!(from_stat <= from_rusage + 0.05, "{from_stat} {from_rusage}");
    }

    #[test]
    fn the_brokers_cpu_is_taken_over_the_processes_read_both_times() {
        // The node (pid 10) used 2.5 s; a `rabbitmqctl` VM (pid 20) ended and another (pid 30) started
        // between the readings: neither counts. Summed as before, the figure would be 2.5 - 4.0 < 0.
        let before = [(10, 100.0), (20, 4.0)];
        let after = [(10, 102.5), (30, 0.5)];
        assert_eq!(broker_taken(&before, &after), Some(2.5));
        // A reused pid whose CPU went down is another process.
        assert_eq!(broker_taken(&[(10, 100.0)], &[(10, 1.0), (11, 3.0)]), None);
        // The node restarted: no process in both readings, no figure.
        assert_eq!(broker_taken(&[(10, 100.0)], &[(11, 0.2)]), None);
        assert_eq!(
            broker_taken(&[(10, 1.0), (11, 2.0)], &[(10, 1.5), (11, 2.25)]),
            Some(0.75)
        );
    }

    #[test]
    fn peak_rss_comes_from_vm_hwm() {
        let status = "Name:\tvolcano-runner\nVmPeak:\t  900000 kB\nVmHWM:\t   65536 kB\nVmRSS:\t   60000 kB\n";
        assert_eq!(parse_vm_hwm(status), Some(64.0));
        assert_eq!(parse_vm_hwm("Name:\tx\n"), None);
        // This very process has a peak of its own.
        assert!(peak_rss_mib(std::process::id()).unwrap() > 1.0);
    }
}
