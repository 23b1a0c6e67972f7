//! `volcano-runner bench`: the end-to-end load benchmark. On one machine, with the simulator in this
//! process and the real RabbitMQ, it measures the broker's and the simulator's limits for the runner's
//! work, then runs phases of N submissions against 1 and then more runner processes (this program's
//! `run`), unpaced and at fixed rates, and reports sustained jobs/s, publish-to-created and
//! publish-to-QUEUED latencies, and each runner's CPU time and peak RSS. With `--trials` every phase
//! runs that many times, interleaved, and the report gives the median of what monitoring costs.
//!
//! Every phase gets a fresh simulator and exchanges and queues of its own (named after the run and the
//! phase, deleted at the end), so phases cannot see each other's jobs or events and a deployment's
//! queues on the same broker are never touched.

pub mod fleet;
pub mod limits;
pub mod observe;
pub mod report;
pub mod settle;
pub mod soak;
pub mod stats;
pub mod workload;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::broker::{Broker, BrokerConfig};
use crate::cluster::namespaces;
use crate::config::Config;
use crate::messages::{Format, MessageType};
use crate::sim::{SimConfig, SimHandle, Simulator};
use fleet::{Fleet, RunnerSpec};
use report::{Limits, Machine, Phase, Report};
use stats::{Latency, rate, sustained_rate};
use workload::Workload;

/// Why a benchmark run could not produce figures. Each says what to look at.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("benchmark setup failed: {0}")]
    Setup(String),
    #[error("RabbitMQ: {0}")]
    Broker(String),
    #[error("the simulator: {0}")]
    Cluster(String),
    #[error("runner {id}: {reason}")]
    Runner { id: String, reason: String },
    #[error("writing the results to {path}: {error}")]
    Output {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The runners' configuration (the file given with `--config`, plus `VOLCANO_RUNNER_*`); the
    /// benchmark replaces the broker's exchange and queue names and the cluster.
    pub config: Config,
    pub config_file: Option<PathBuf>,
    /// Submissions per phase.
    pub submissions: usize,
    /// Runner counts, one phase each (per rate).
    pub runners: Vec<usize>,
    /// Publishing rates: `None` is unpaced (as fast as confirms allow); `Some(r)` publishes r per second.
    pub rates: Vec<Option<f64>>,
    pub max_in_flight: u32,
    /// Worker threads of each runner's runtime (`TOKIO_WORKER_THREADS`).
    pub runner_threads: usize,
    /// The kinds of phase, in order: `false` without the monitoring duty (submissions only), `true` with
    /// it, every job running to its end. Each (rate, runners) runs once per kind, on the same workload.
    pub monitor: Vec<bool>,
    pub format: Format,
    /// The runner program (this one).
    pub program: PathBuf,
    /// Where runner logs go.
    pub log_dir: PathBuf,
    /// How long a phase may take before it is reported incomplete.
    pub phase_timeout: Duration,
    /// Skip the limit measurements (for a quick look at one phase).
    pub skip_limits: bool,
    /// How many times every phase runs, interleaved (`--trials`); the report gives the median ratio.
    pub trials: usize,
    /// Soak mode: every so often during a phase, print each runner's RSS and CPU per job so far, and
    /// this process's RSS (the simulator's, with the harness), so that a long run shows whether they
    /// grow with the jobs submitted.
    pub soak_every: Option<Duration>,
    /// A command (and its arguments) each runner's command line is given to, such as a profiler.
    pub runner_wrap: Vec<String>,
}

/// Runs the whole benchmark and returns its report.
pub async fn run(options: &Options) -> Result<Report, BenchError> {
    let run_id = run_id(jiff::Timestamp::now().as_second());
    let started_at = jiff::Timestamp::now().to_string();
    let machine = machine();
    let prefetch = prefetch_for(options.max_in_flight.saturating_mul(2));
    let sample = Workload::new(&format!("{run_id}x"), 1, options.format);
    let workload = report::Workload {
        submissions: options.submissions,
        application: workload::APPLICATION.into(),
        message_bytes: sample.message_bytes(),
        format: format!("{:?}", options.format).to_lowercase(),
        max_in_flight: options.max_in_flight,
        runner_threads: options.runner_threads,
        submit_prefetch: prefetch,
        monitor: options.monitor.clone(),
        cluster_nodes: phase_nodes().len(),
        job_run_s: JOB_RUN.as_secs_f64(),
    };

    let limits = if options.skip_limits {
        None
    } else {
        let limits = measure_limits(options, &run_id).await?;
        info!(
            broker = limits.broker_msgs_per_s,
            sim = limits.sim_creates_per_s,
            "Measured the limits."
        );
        Some(limits)
    };

    let mut phases = Vec::new();
    let mut index = 0;
    // Trials outermost: each trial runs every phase, its unmonitored and monitored phases back to back,
    // so that whatever else the machine does drifts over all kinds of phase alike.
    for trial in 1..=options.trials.max(1) {
        for rate in &options.rates {
            for &monitor in &options.monitor {
                for &runners in &options.runners {
                    index += 1;
                    let prefix = format!("{run_id}p{index}");
                    info!(trial, runners, rate = ?rate, monitor, "Starting a phase.");
                    let mut phase =
                        run_phase(options, &prefix, runners, *rate, prefetch, monitor).await?;
                    phase.trial = trial;
                    phase.ratio_to_smaller_limit = phase
                        .sustained_jobs_per_s
                        .zip(limits.as_ref())
                        .map(|(r, l)| r / l.smaller());
                    phase.ratio_to_api_limit = phase
                        .api_requests_per_s
                        .zip(limits.as_ref())
                        .map(|(r, l)| r / l.sim_creates_per_s);
                    phases.push(phase);
                }
            }
        }
    }
    let monitoring_cost = report::monitoring_cost(&phases);
    Ok(Report {
        started_at,
        version: env!("CARGO_PKG_VERSION").into(),
        machine,
        workload,
        limits,
        monitoring_cost_median: report::monitoring_cost_median(&monitoring_cost),
        monitoring_cost,
        phases,
    })
}

/// The prefix of a run's names (its phases' exchanges and queues, its job ids): the second it started,
/// which sorts the runs, and 32 random bits, so that two runs started in the same second against one
/// broker do not share a phase's names (the second then found the first's exclusive observer queue
/// locked, RESOURCE_LOCKED). Short: job ids and the objects named after them carry it.
fn run_id(now_s: i64) -> String {
    format!("b{:x}{:08x}", now_s % 0xff_ffff, fastrand::u32(..))
}

/// A prefetch count (AMQP's is 16 bits).
fn prefetch_for(messages: u32) -> u16 {
    u16::try_from(messages).unwrap_or(u16::MAX)
}

/// The configuration of one phase: its own exchanges and queues, and the phases' cluster
/// ([`phase_cluster`]), the same with the monitoring duty and without it.
fn phase_config(options: &Options, prefix: &str, prefetch: u16) -> Config {
    let mut config = names_config(options, prefix, prefetch);
    phase_cluster(&mut config.sim);
    config
}

/// The runners' configuration with exchanges and queues named after `prefix`, on the configured
/// cluster: what the limits are measured with (the simulator's limit is its VolcanoJob creates, as
/// measured before the phases shared one cluster).
fn names_config(options: &Options, prefix: &str, prefetch: u16) -> Config {
    let mut config = options.config.clone();
    let b = &mut config.broker;
    let name = |what: &str| format!("volcano-runner-bench.{prefix}.{what}");
    b.jobs_exchange = name("jobs");
    b.submit_queue = name("submit");
    b.control_queue = name("control");
    b.session_queue = name("sessions");
    b.dead_letter_exchange = name("dlx");
    b.dead_letter_queue = name("dead");
    b.events_exchange = name("events");
    b.proxy_exchange = name("proxy");
    b.submit_prefetch = prefetch;
    b.connection_name = format!("volcano-runner-bench-{prefix}");
    config.runner.max_in_flight = options.max_in_flight;
    config
}

/// The environment that gives a runner process the phase's configuration.
fn runner_env(config: &Config) -> Vec<(String, String)> {
    let b = &config.broker;
    let mut env = vec![
        ("BROKER__URL", b.url.expose().to_owned()),
        ("BROKER__JOBS_EXCHANGE", b.jobs_exchange.clone()),
        ("BROKER__SUBMIT_QUEUE", b.submit_queue.clone()),
        ("BROKER__CONTROL_QUEUE", b.control_queue.clone()),
        ("BROKER__SESSION_QUEUE", b.session_queue.clone()),
        (
            "BROKER__DEAD_LETTER_EXCHANGE",
            b.dead_letter_exchange.clone(),
        ),
        ("BROKER__DEAD_LETTER_QUEUE", b.dead_letter_queue.clone()),
        ("BROKER__EVENTS_EXCHANGE", b.events_exchange.clone()),
        ("BROKER__PROXY_EXCHANGE", b.proxy_exchange.clone()),
        ("BROKER__SUBMIT_PREFETCH", b.submit_prefetch.to_string()),
        (
            "RUNNER__MAX_IN_FLIGHT",
            config.runner.max_in_flight.to_string(),
        ),
        // Several runners on one machine: each serves its metrics on a port of its own.
        ("OPS__LISTEN", "127.0.0.1:0".into()),
    ];
    // Quiet runners unless the caller asks for their logs (they go to the log directory).
    if std::env::var_os(format!("{}OPS__LOG_FILTER", crate::config::ENV_PREFIX)).is_none() {
        env.push(("OPS__LOG_FILTER", "warn".into()));
    }
    env.into_iter()
        .map(|(k, v)| (format!("{}{k}", crate::config::ENV_PREFIX), v))
        .collect()
}

async fn measure_limits(options: &Options, run_id: &str) -> Result<Limits, BenchError> {
    let prefix = format!("{run_id}lim");
    let concurrency = prefetch_for(options.max_in_flight);
    let config = names_config(options, &prefix, concurrency);
    let workload = Workload::new(&prefix, options.submissions, options.format);

    // The simulator: a fresh one, VolcanoJob creates only.
    let sim = start_sim(&config).await?;
    let sim_rate = match sim.client() {
        Ok(client) => limits::simulator(client, &config, &workload, usize::from(concurrency)).await,
        Err(e) => Err(BenchError::Cluster(e.to_string())),
    };
    sim.shutdown().await;

    // The broker: the topology as runners see it, the submissions in the submit queue, then the loop;
    // the events reach a consumer, as in the phases.
    let broker = PhaseBroker::declare(&config).await?;
    let broker_rate = async {
        let _observers = observe::Observers::start(&config, &observer_queue(&prefix), None).await?;
        let connection = broker.raw().await?;
        publish(&connection, &config, &workload, None, &mut HashMap::new()).await?;
        let rate = limits::broker(&connection, &config, &workload, concurrency).await;
        let _ = connection.close(200, "done".into()).await;
        rate
    }
    .await;
    broker.delete().await;
    Ok(Limits {
        broker_msgs_per_s: broker_rate?,
        sim_creates_per_s: sim_rate?,
    })
}

/// The observers' queue of a phase.
fn observer_queue(prefix: &str) -> String {
    format!("volcano-runner-bench.{prefix}.observe")
}

/// One phase on a fresh simulator and exchanges and queues of its own, which are removed whatever
/// happens in the phase.
async fn run_phase(
    options: &Options,
    prefix: &str,
    runners: usize,
    target_rate: Option<f64>,
    prefetch: u16,
    monitor: bool,
) -> Result<Phase, BenchError> {
    let config = phase_config(options, prefix, prefetch);
    let sim = start_sim(&config).await?;
    let phase = match PhaseBroker::declare(&config).await {
        Ok(broker) => {
            let phase = phase_on(
                options,
                &config,
                &sim,
                &broker,
                prefix,
                runners,
                target_rate,
                monitor,
            )
            .await;
            broker.delete().await;
            phase
        }
        Err(e) => Err(e),
    };
    sim.shutdown().await;
    phase
}

#[allow(clippy::too_many_arguments)]
async fn phase_on(
    options: &Options,
    config: &Config,
    sim: &SimHandle,
    broker: &PhaseBroker,
    prefix: &str,
    runners: usize,
    target_rate: Option<f64>,
    monitor: bool,
) -> Result<Phase, BenchError> {
    let workload = Workload::new(prefix, options.submissions, options.format);
    create_namespaces(sim, config).await?;
    let connection = broker.raw().await?;
    let observers = observe::Observers::start(
        config,
        &observer_queue(prefix),
        Some((sim.created_jobs(), prefix.to_owned())),
    )
    .await?;
    let (queued, created, ended) = (
        observers.queued.clone(),
        observers.created.clone(),
        observers.ended.clone(),
    );

    let spec = runner_spec(options, config, sim, monitor);
    // Dropping the fleet on an error below kills the runners.
    let mut fleet = Fleet::start(&spec, &format!("bench-{prefix}"), runners)?;
    wait_for_consumers(&connection, config, runners, &mut fleet, options).await?;
    if monitor {
        settle::wait_for_shards(sim, config, runners).await?;
    }
    // The span the cores' and the lock's shares are of: the phase's work, not the runners' start.
    let cpu = fleet::CpuSince::now();
    let lock_before = sim.lock_held();
    // Stopped with the phase (dropped at any return).
    let _soak = soak_reporter(options, &observers, sim, &fleet);

    // The API requests of the phase: from when every runner consumes until the last job is done.
    let requests_before = sim.request_counts();
    let mut published_at = HashMap::with_capacity(workload.messages.len());
    let publish_started = Instant::now();
    let published = publish(
        &connection,
        config,
        &workload,
        target_rate,
        &mut published_at,
    )
    .await?;
    let publish_rate = rate(published, publish_started.elapsed());
    let mut complete =
        wait_with_progress("QUEUED", &queued, published, options.phase_timeout).await;
    if monitor && complete {
        let left = options
            .phase_timeout
            .saturating_sub(publish_started.elapsed());
        complete = wait_with_progress("terminal", &ended, published, left).await;
    }
    let api_elapsed = publish_started.elapsed();
    let api_requests_by_kind = request_delta(&requests_before, &sim.request_counts());
    // Created is seen before QUEUED; give the watch a moment if it lags behind the events.
    let _ = tokio::time::timeout(Duration::from_secs(5), created.wait_for(queued.len())).await;
    let per_runner = fleet
        .stop(config.runner.shutdown_grace + Duration::from_secs(10))
        .await;
    let cpu = cpu.taken();
    let sim_lock_held_s = (sim.lock_held() - lock_before).as_secs_f64();
    // Late duplicates (a republication) would arrive within moments of the last end.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (events_delivered, duplicate_deliveries) = observers.deliveries.counts();
    if duplicate_deliveries > 0 {
        let by_kind = observers.deliveries.duplicates_by_kind();
        tracing::info!(?by_kind, "Events delivered more than once, by kind.");
    }
    drop(observers);

    let timings = Timings::of(&published_at, publish_started, &created, &queued, &ended);
    let _ = connection.close(200, "done".into()).await;
    Ok(Measured {
        runners,
        monitor,
        target_rate,
        published,
        publish_rate,
        complete,
        ended: ended.len(),
        events_delivered,
        duplicate_deliveries,
        api_requests_by_kind,
        api_elapsed,
        timings,
        per_runner,
        cpu,
        sim_lock_held_s,
        cpus: cpus(),
    }
    .phase())
}

/// The cores this process may use: the phase's share of them is measured against it, and the machine
/// line reports it.
fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The phase's soak reporter, when `--soak-every` asks for one: it stops when dropped.
fn soak_reporter(
    options: &Options,
    observers: &observe::Observers,
    sim: &SimHandle,
    fleet: &Fleet,
) -> Option<soak::Reporter> {
    options.soak_every.map(|every| {
        let seen = soak::Seen {
            queued: observers.queued.clone(),
            ended: observers.ended.clone(),
            deliveries: observers.deliveries.clone(),
            store: Some(std::sync::Arc::new(sim.footprint_reader())),
        };
        soak::Reporter::start(every, fleet.runners(), seen)
    })
}

/// The namespaces the runners create jobs in, created up front as an operator would.
async fn create_namespaces(sim: &SimHandle, config: &Config) -> Result<(), BenchError> {
    let client = sim
        .client()
        .map_err(|e| BenchError::Cluster(e.to_string()))?;
    for name in namespaces::runner_namespaces(&config.cluster, &config.pipeline) {
        namespaces::create_if_missing(&client, &name)
            .await
            .map_err(|e| BenchError::Cluster(format!("create namespace {name}: {e}")))?;
    }
    Ok(())
}

/// How the phase's runner processes are started.
fn runner_spec(options: &Options, config: &Config, sim: &SimHandle, monitor: bool) -> RunnerSpec {
    RunnerSpec {
        program: options.program.clone(),
        wrap: options.runner_wrap.clone(),
        config_file: options.config_file.clone(),
        env: runner_env(config),
        worker_threads: options.runner_threads,
        cluster_url: sim.url(),
        monitor,
        log_dir: options.log_dir.clone(),
    }
}

/// When the jobs of a phase were seen: created and QUEUED after their publication, QUEUED and ended
/// after the phase's first publication.
struct Timings {
    to_created: Vec<Duration>,
    to_queued: Vec<Duration>,
    completions: Vec<Duration>,
    ends: Vec<Duration>,
}

impl Timings {
    fn of(
        published_at: &HashMap<String, Instant>,
        publish_started: Instant,
        created: &observe::Seen,
        queued: &observe::Seen,
        ended: &observe::Seen,
    ) -> Self {
        let mut t = Timings {
            to_created: Vec::new(),
            to_queued: Vec::new(),
            completions: Vec::new(),
            ends: Vec::new(),
        };
        for (id, at) in published_at {
            if let Some(e) = ended.get(id) {
                t.ends.push(e.saturating_duration_since(publish_started));
            }
            if let Some(c) = created.get(id) {
                t.to_created.push(c.saturating_duration_since(*at));
            }
            if let Some(q) = queued.get(id) {
                t.to_queued.push(q.saturating_duration_since(*at));
                t.completions
                    .push(q.saturating_duration_since(publish_started));
            }
        }
        t
    }
}

/// What a phase measured, as it measured it; [`Measured::phase`] works its figures out.
struct Measured {
    runners: usize,
    monitor: bool,
    target_rate: Option<f64>,
    published: usize,
    /// The publisher's own rate (confirmed submissions per second).
    publish_rate: f64,
    /// Whether every submission was QUEUED (and, with the monitoring duty, ended) in time.
    complete: bool,
    /// Jobs whose terminal event arrived.
    ended: usize,
    events_delivered: usize,
    duplicate_deliveries: usize,
    /// The runners' API requests by `<verb> <resource>`.
    api_requests_by_kind: std::collections::BTreeMap<String, u64>,
    /// What those requests were made in: from when every runner consumed until the last job was done.
    api_elapsed: Duration,
    timings: Timings,
    per_runner: Vec<report::RunnerUsage>,
    /// This process's and the broker's CPU over the phase, from before its runners started until they
    /// exited, and that span's length.
    cpu: fleet::CpuTaken,
    /// How long the simulator's one lock was held over the same span.
    sim_lock_held_s: f64,
    /// The machine's cores, all of which the runners, this process and the broker share.
    cpus: usize,
}

impl Measured {
    /// The phase's figures (per job QUEUED, or ended with the monitoring duty; rates; latencies): a
    /// function of what was measured alone, apart from the I/O that measured it.
    fn phase(self) -> Phase {
        let Timings {
            mut to_created,
            mut to_queued,
            mut completions,
            mut ends,
        } = self.timings;
        let api_requests: u64 = self.api_requests_by_kind.values().sum();
        let jobs = if self.monitor {
            self.ended
        } else {
            to_queued.len()
        };
        let runner_cpu_s: f64 = self.per_runner.iter().map(|r| r.cpu_s).sum();
        let monitoring_overlap = if self.monitor {
            stats::monitoring_overlap(&mut completions.clone(), &ends)
        } else {
            None
        };
        let published = self.published;
        Phase {
            // Set by the run, which knows the trial.
            trial: 1,
            runners: self.runners,
            monitor: self.monitor,
            target_rate: self.target_rate,
            published,
            ended: self.ended,
            events_delivered: self.events_delivered,
            duplicate_deliveries: self.duplicate_deliveries,
            duplicates_per_1000_jobs: (published > 0)
                .then(|| self.duplicate_deliveries as f64 * 1000.0 / published as f64),
            api_requests_per_job: (jobs > 0).then(|| api_requests as f64 / jobs as f64),
            runner_cpu_ms_per_job: (jobs > 0).then(|| runner_cpu_s * 1000.0 / jobs as f64),
            monitoring_overlap,
            api_requests_per_s: Some(
                api_requests as f64 / self.api_elapsed.as_secs_f64().max(1e-3),
            ),
            ratio_to_api_limit: None,
            api_requests_by_kind: self.api_requests_by_kind,
            created: to_created.len(),
            queued: to_queued.len(),
            complete: self.complete,
            publish_rate: self.publish_rate,
            sustained_jobs_per_s: sustained_rate(&mut completions),
            ended_jobs_per_s: if self.monitor {
                sustained_rate(&mut ends)
            } else {
                None
            },
            ratio_to_smaller_limit: None,
            publish_to_created: Latency::of(&mut to_created),
            publish_to_queued: Latency::of(&mut to_queued),
            cores_busy: busy_share(runner_cpu_s, &self.cpu, self.cpus),
            sim_lock_busy: (self.cpu.wall_s > 0.0).then(|| self.sim_lock_held_s / self.cpu.wall_s),
            per_runner: self.per_runner,
            harness_cpu_s: self.cpu.own_s,
            broker_cpu_s: self.cpu.broker_s,
        }
    }
}

/// The share of the machine's cores that the runners, this process and the broker kept busy over the
/// phase (the runners' CPU is their whole life, which the span covers). Near one, the phase was bound by
/// the cores, whoever used them; well under one, by something else (a serial part, a latency).
fn busy_share(runner_cpu_s: f64, cpu: &fleet::CpuTaken, cpus: usize) -> Option<f64> {
    let used = runner_cpu_s + cpu.own_s + cpu.broker_s?;
    (cpu.wall_s > 0.0 && cpus > 0).then(|| used / (cpu.wall_s * cpus as f64))
}

/// How long each job of a phase runs once its pod starts.
const JOB_RUN: Duration = Duration::from_secs(2);

/// The simulated cluster of every phase, with the monitoring duty or without it: the same nodes and
/// the same jobs, so that the two kinds differ only in the runners' `--no-monitor` and their ratio
/// measures the monitoring duty, not the simulator's work (it runs in this process, on the cores the
/// runners are measured on). Jobs run to their end, briefly: the monitor's whole work per job
/// (RUNNING, the final tick, the terminal event, the cleanup) falls inside a monitored phase, and the
/// simulator schedules, starts and ends every pod in both kinds. An unmonitored phase still ends at
/// its last QUEUED (no terminal event comes without a monitor); what the simulator had left to do
/// goes with it, as every phase starts a fresh one.
fn phase_cluster(sim: &mut SimConfig) {
    sim.default_run = JOB_RUN;
    sim.nodes = phase_nodes();
}

/// The nodes of every phase: 40 of 64 cpus and 250 pods each, room for 2,560 one-cpu jobs at once, so
/// jobs of 2 s can end at over 1,000 a second and none waits for capacity (with the default five nodes
/// a phase would measure the queue, 80 cpus, 40 figlet jobs a second at most, not the runners).
fn phase_nodes() -> Vec<crate::sim::NodeSpec> {
    (1..=40)
        .map(|i| crate::sim::NodeSpec {
            name: format!("bench-node-{i}"),
            cpu: "64".into(),
            memory: "512Gi".into(),
            gpus: 0,
            max_pods: 250,
            labels: Default::default(),
            taints: Vec::new(),
        })
        .collect()
}

/// What was requested between two snapshots of the simulator's counts.
fn request_delta(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> std::collections::BTreeMap<String, u64> {
    after
        .iter()
        .map(|(kind, n)| (kind.clone(), n - before.get(kind).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// A fresh simulator on a free port with the configuration's nodes, on real time.
async fn start_sim(config: &Config) -> Result<crate::sim::SimHandle, BenchError> {
    let sim_config = SimConfig {
        listen: "127.0.0.1:0".into(),
        clock_speed: 1.0,
        ..config.sim.clone()
    };
    Simulator::start(sim_config)
        .await
        .map_err(|e| BenchError::Cluster(format!("the simulator does not start: {e}")))
}

/// Waits until `count` jobs have had the `what` event (QUEUED, terminal) or `timeout` passes (then `false`), logging progress every few
/// seconds: a 10,000-job phase takes a while, and a stalled one should show where it stalls.
async fn wait_with_progress(
    what: &str,
    seen: &observe::Seen,
    count: usize,
    timeout: Duration,
) -> bool {
    const EVERY: Duration = Duration::from_secs(5);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let step = EVERY.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        if tokio::time::timeout(step, seen.wait_for(count))
            .await
            .is_ok()
        {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        info!(
            events = what,
            seen = seen.len(),
            of = count,
            "Waiting for events."
        );
    }
}

/// The phase's exchanges and queues, declared the way runners declare them, and deleted at the end.
struct PhaseBroker {
    broker: BrokerConfig,
    token: CancellationToken,
    declared: Broker,
}

impl PhaseBroker {
    async fn declare(config: &Config) -> Result<PhaseBroker, BenchError> {
        let token = CancellationToken::new();
        let declared = Broker::connect(config.broker.clone(), token.clone())
            .await
            .map_err(|e| BenchError::Broker(e.to_string()))?;
        Ok(PhaseBroker {
            broker: config.broker.clone(),
            token,
            declared,
        })
    }

    /// A plain lapin connection for the publisher, the observers and the limit loop.
    async fn raw(&self) -> Result<Connection, BenchError> {
        Connection::connect(self.broker.url.expose(), ConnectionProperties::default())
            .await
            .map_err(|e| {
                BenchError::Broker(format!(
                    "cannot connect ({e}); is RabbitMQ running at the [broker] url?"
                ))
            })
    }

    async fn delete(self) {
        if let Ok(connection) = self.raw().await
            && let Ok(channel) = connection.create_channel().await
        {
            let b = &self.broker;
            for queue in [
                &b.submit_queue,
                &b.control_queue,
                &b.session_queue,
                &b.dead_letter_queue,
            ] {
                let _ = channel
                    .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                    .await;
            }
            for exchange in [
                &b.jobs_exchange,
                &b.dead_letter_exchange,
                &b.events_exchange,
                &b.proxy_exchange,
            ] {
                let _ = channel
                    .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
                    .await;
            }
            let _ = connection.close(200, "done".into()).await;
        }
        self.declared.close().await;
        self.token.cancel();
    }
}

/// An exclusive queue bound to the events exchange: the orchestrator's view of the events.
pub(crate) async fn declare_observer_queue(
    channel: &lapin::Channel,
    events_exchange: &str,
    queue: &str,
) -> Result<(), BenchError> {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| BenchError::Broker(format!("declare {queue}: {e}")))?;
    channel
        .queue_bind(
            queue.into(),
            events_exchange.into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| BenchError::Broker(format!("bind {queue}: {e}")))
}

/// Waits until `runners` consumers are on the submit queue (every runner is connected and consuming).
async fn wait_for_consumers(
    connection: &Connection,
    config: &Config,
    runners: usize,
    fleet: &mut Fleet,
    options: &Options,
) -> Result<(), BenchError> {
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| BenchError::Broker(format!("channel: {e}")))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        fleet.check_alive(&options.log_dir)?;
        let queue = channel
            .queue_declare(
                config.broker.submit_queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| BenchError::Broker(format!("inspect the submit queue: {e}")))?;
        if queue.consumer_count() as usize >= runners {
            let _ = channel.close(200, "done".into()).await;
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(BenchError::Runner {
                id: "all".into(),
                reason: format!(
                    "{} of {runners} runners consume after 60 s; see the logs in {}",
                    queue.consumer_count(),
                    options.log_dir.display()
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many publishes may await their confirms at once: enough to keep the broker busy, bounded so
/// that an unpaced publisher does not hold the whole run in memory.
const PUBLISH_WINDOW: usize = 512;

/// Publishes the workload to the jobs exchange (persistent, confirmed), unpaced or at `target_rate` per
/// second, recording when each was handed to the client. Returns how many were confirmed.
async fn publish(
    connection: &Connection,
    config: &Config,
    workload: &Workload,
    target_rate: Option<f64>,
    published_at: &mut HashMap<String, Instant>,
) -> Result<usize, BenchError> {
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| BenchError::Broker(format!("channel: {e}")))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| BenchError::Broker(format!("confirm mode: {e}")))?;
    let b = &config.broker;
    let start = tokio::time::Instant::now();
    let mut confirms = FuturesUnordered::new();
    let mut confirmed = 0;
    for (i, (job_id, body)) in workload.messages.iter().enumerate() {
        if let Some(rate) = target_rate {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            tokio::time::sleep_until(due).await;
        }
        while confirms.len() >= PUBLISH_WINDOW {
            confirmed += settle(confirms.next().await)?;
        }
        published_at.insert(job_id.clone(), Instant::now());
        let confirm = channel
            .basic_publish(
                b.jobs_exchange.as_str().into(),
                b.submit_routing_key.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                body,
                BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_content_type(workload.format.content_type().into())
                    .with_message_id(job_id.as_str().into())
                    .with_type(MessageType::SubmitJob.amqp_type().into()),
            )
            .await
            .map_err(|e| BenchError::Broker(format!("publish: {e}")))?;
        confirms.push(confirm);
    }
    while let Some(next) = confirms.next().await {
        confirmed += settle(Some(next))?;
    }
    let _ = channel.close(200, "done".into()).await;
    Ok(confirmed)
}

fn settle(confirm: Option<Result<Confirmation, lapin::Error>>) -> Result<usize, BenchError> {
    match confirm {
        None => Ok(0),
        Some(Ok(Confirmation::Ack(None))) => Ok(1),
        Some(Ok(Confirmation::Ack(Some(_)))) => Err(BenchError::Broker(
            "a submission was returned: no queue is bound to the jobs exchange".into(),
        )),
        Some(Ok(other)) => Err(BenchError::Broker(format!(
            "a submission was not confirmed: {other:?}"
        ))),
        Some(Err(e)) => Err(BenchError::Broker(format!("confirm: {e}"))),
    }
}

/// What the figures were measured on.
fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or("unknown".into(), |m| m.trim().to_owned());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|kib| kib.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let load_average_at_start = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().and_then(|v| v.parse().ok()));
    Machine {
        cpus: cpus(),
        cpu_model,
        memory_gib,
        os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
        load_average_at_start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs started in the same second get names of their own (two `bench` runs at once used to share
    /// their phases' queues), still short and made of what a job id and a queue name may hold.
    #[test]
    fn run_ids_of_the_same_second_differ() {
        let now = 1_800_000_000;
        let ids: std::collections::BTreeSet<String> = (0..1000).map(|_| run_id(now)).collect();
        assert_eq!(ids.len(), 1000, "{ids:?}");
        for id in &ids {
            assert!(id.len() <= 16, "{id}");
            assert!(id.starts_with('b'), "{id}");
            assert!(
                id.chars()
                    .all(|c| c.is_ascii_digit() || c.is_ascii_lowercase()),
                "{id}"
            );
        }
        assert!(
            run_id(now + 1).starts_with(&format!("b{:x}", (now + 1) % 0xff_ffff)),
            "led by the second"
        );
    }

    fn options() -> Options {
        Options {
            config: Config::default(),
            config_file: None,
            submissions: 10,
            runners: vec![1],
            rates: vec![None],
            max_in_flight: 64,
            runner_threads: 1,
            monitor: vec![false, true],
            format: Format::Json,
            program: "volcano-runner".into(),
            log_dir: "/tmp".into(),
            phase_timeout: Duration::from_secs(1),
            skip_limits: false,
            trials: 1,
            soak_every: None,
            runner_wrap: Vec::new(),
        }
    }

    #[test]
    fn a_phase_has_names_of_its_own_and_runners_get_them() {
        let options = options();
        let a = phase_config(&options, "b1p1", 128);
        let b = phase_config(&options, "b1p2", 128);
        assert_ne!(a.broker.submit_queue, b.broker.submit_queue);
        assert_ne!(a.broker.events_exchange, b.broker.events_exchange);
        assert_eq!(a.runner.max_in_flight, 64);
        let env: HashMap<String, String> = runner_env(&a).into_iter().collect();
        assert_eq!(
            env["VOLCANO_RUNNER_BROKER__SUBMIT_QUEUE"],
            a.broker.submit_queue
        );
        assert_eq!(env["VOLCANO_RUNNER_RUNNER__MAX_IN_FLIGHT"], "64");
        assert_eq!(env["VOLCANO_RUNNER_BROKER__SUBMIT_PREFETCH"], "128");
        // The environment is read back by the configuration loader into the same names.
        let loaded = Config::from_sources(None, env.clone()).unwrap();
        assert_eq!(loaded.broker.submit_queue, a.broker.submit_queue);
        assert_eq!(loaded.broker.dead_letter_queue, a.broker.dead_letter_queue);
        assert_eq!(loaded.broker.submit_prefetch, 128);
        assert_eq!(loaded.runner.max_in_flight, 64);
    }
    /// Both kinds of phase get the same cluster and the same jobs: 40 big nodes, jobs that run 2 s.
    /// An unmonitored phase used to keep the configured five nodes and 60 s runs, so most of its jobs
    /// never got a pod and the simulator, on the runners' cores, did far less work than in a monitored
    /// phase: the monitored / unmonitored ratio measured that too. The limits keep the configured
    /// cluster, as measured before.
    #[test]
    fn every_phase_runs_the_same_cluster_and_jobs() {
        let options = options();
        let phase = phase_config(&options, "b1p1", 128);
        assert_eq!(phase.sim.nodes.len(), 40);
        assert!(
            phase.sim.nodes.iter().all(|n| n.cpu == "64"),
            "{:?}",
            phase.sim.nodes
        );
        assert_eq!(phase.sim.default_run, Duration::from_secs(2));
        assert_eq!(
            phase.sim.nodes,
            phase_config(&options, "b1p2", 128).sim.nodes
        );
        let limits = names_config(&options, "b1lim", 64);
        assert_eq!(limits.sim, options.config.sim);
        assert_eq!(
            limits.broker.submit_queue,
            "volcano-runner-bench.b1lim.submit"
        );
    }

    /// A phase's figures are per job QUEUED without the monitoring duty and per job ended with it
    /// (the job's whole life), and absent (not zero) when no job counts.
    #[test]
    fn a_phases_figures_are_per_job_queued_or_per_job_ended() {
        let ms = |n: u64| Duration::from_millis(n);
        let measured = |monitor: bool, queued: u64, ended: u64| Measured {
            runners: 1,
            monitor,
            target_rate: None,
            published: 10,
            publish_rate: 100.0,
            complete: true,
            ended: ended as usize,
            events_delivered: 12,
            duplicate_deliveries: 2,
            api_requests_by_kind: std::collections::BTreeMap::from([
                ("create jobs.batch.volcano.sh".to_owned(), 30),
                ("patch jobs.batch.volcano.sh".to_owned(), 10),
            ]),
            api_elapsed: Duration::from_secs(4),
            timings: Timings {
                to_created: (1..=queued).map(|i| ms(i * 5)).collect(),
                to_queued: (1..=queued).map(|i| ms(i * 10)).collect(),
                completions: (1..=queued).map(|i| ms(i * 100)).collect(),
                ends: (1..=ended).map(|i| ms(1000 + i * 100)).collect(),
            },
            per_runner: vec![report::RunnerUsage {
                id: "r".into(),
                cpu_s: 2.0,
                peak_rss_mib: 40.0,
                exit_ok: true,
            }],
            cpu: fleet::CpuTaken {
                own_s: 1.0,
                broker_s: None,
                wall_s: 5.0,
            },
            sim_lock_held_s: 4.0,
            cpus: 2,
        };
        let off = measured(false, 10, 0).phase();
        assert_eq!(off.api_requests_per_job, Some(40.0 / 10.0));
        assert_eq!(off.runner_cpu_ms_per_job, Some(2000.0 / 10.0));
        assert_eq!(off.duplicates_per_1000_jobs, Some(2000.0 / 10.0));
        assert_eq!(off.api_requests_per_s, Some(40.0 / 4.0));
        assert_eq!(off.cores_busy, None, "the broker's share is unknown here");
        assert_eq!(off.sim_lock_busy, Some(0.8), "4 s held in 5 s");
        let known = fleet::CpuTaken {
            own_s: 1.0,
            broker_s: Some(1.0),
            wall_s: 5.0,
        };
        assert_eq!(
            busy_share(2.0, &known, 2),
            Some(0.4),
            "4 s of CPU in 5 s on 2 cores"
        );
        assert_eq!(
            busy_share(
                2.0,
                &fleet::CpuTaken {
                    wall_s: 0.0,
                    ..known
                },
                2
            ),
            None
        );
        assert_eq!((off.created, off.queued, off.ended), (10, 10, 0));
        assert_eq!((off.monitoring_overlap, off.ended_jobs_per_s), (None, None));
        assert_eq!(off.publish_to_queued.map(|l| l.count), Some(10));
        let on = measured(true, 10, 5).phase();
        assert_eq!(on.api_requests_per_job, Some(40.0 / 5.0));
        assert_eq!(on.runner_cpu_ms_per_job, Some(2000.0 / 5.0));
        assert_eq!(
            on.monitoring_overlap,
            Some(0.0),
            "no job ended in the QUEUED window"
        );
        assert!(on.ended_jobs_per_s.is_some());
        let none_ended = measured(true, 10, 0).phase();
        assert_eq!(
            (
                none_ended.api_requests_per_job,
                none_ended.runner_cpu_ms_per_job
            ),
            (None, None)
        );
    }

    #[test]
    fn the_requests_of_a_phase_are_the_difference_of_two_counts() {
        let before = std::collections::BTreeMap::from([
            ("create jobs.batch.volcano.sh".to_owned(), 5),
            ("watch pods".to_owned(), 2),
        ]);
        let after = std::collections::BTreeMap::from([
            ("create jobs.batch.volcano.sh".to_owned(), 15),
            ("watch pods".to_owned(), 2),
            ("list pods".to_owned(), 3),
        ]);
        assert_eq!(
            request_delta(&before, &after),
            std::collections::BTreeMap::from([
                ("create jobs.batch.volcano.sh".to_owned(), 10),
                ("list pods".to_owned(), 3),
            ])
        );
    }
}
