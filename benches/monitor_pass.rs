//! One runner monitoring N running jobs (10,000 by default, `MONITOR_BENCH_JOBS` to change): CPU time per
//! full reconciliation pass (three paginated lists through the watchers, then a decision for every job)
//! and the monitor's peak RSS.
//!
//! The simulator runs in a child process (`volcano-runner sim`), and the jobs are created by a second
//! child process, so this process holds only the monitor: its CPU time (utime + stime from
//! `/proc/self/stat`) between two pass reports is the pass's cost, and its peak RSS (`VmHWM`) is the
//! monitor's. The jobs are running (their pods run `sleep infinity`) and already RUNNING with nothing due:
//! the monitor's clock is held still, so a pass is the steady-state work of watching 10,000 jobs.
//! Needs RabbitMQ on 127.0.0.1:5672 (a vhost of its own is made and deleted).
//!
//! It also prints what the monitor holds per live job: this process's resident memory just before the
//! monitor starts and once every job is in its view, the difference divided by the jobs (issue 46 asks
//! for at most 10 KiB; run it with two `MONITOR_BENCH_JOBS` to take the fixed costs out).
//!
//! `cargo bench --bench monitor_pass`; the figures are printed at the end.

#[path = "../tests/common/rabbit.rs"]
mod rabbit;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use kube::Api;
use kube::api::PostParams;
use tokio_util::sync::CancellationToken;
use volcano_runner::broker::Broker;
use volcano_runner::cluster::ShardLeases;
use volcano_runner::config::Config;
use volcano_runner::durable::AnnotationKeys;
use volcano_runner::messages::v1::{
    InvocationParameter, SubmitJob, WordInvocation, invocation_parameter,
};
use volcano_runner::monitor::{Clock, Monitor, PassReport};
use volcano_runner::pipeline::NamespaceMode;
use volcano_runner::volcano::VolcanoJob;

const NAMESPACE: &str = "bench";
const START: &str = "2026-11-22T08:00:00Z";

/// The monitor's clock, held at one instant: no tick or expiry ever falls due during the bench.
#[derive(Debug)]
struct Still(jiff::Timestamp);

impl Clock for Still {
    fn now(&self) -> jiff::Timestamp {
        self.0
    }
    fn real_until(&self, _: jiff::Timestamp) -> Option<Duration> {
        None
    }
}

fn jobs_wanted() -> usize {
    std::env::var("MONITOR_BENCH_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

fn config() -> Config {
    let mut config = Config::default();
    config.pipeline.namespace.mode = NamespaceMode::Single;
    config.pipeline.namespace.name = NAMESPACE.into();
    config.cluster.lease.shards = 1;
    config.monitor.reconcile_interval = Duration::from_secs(4);
    config
}

/// The jobs, as the runner creates them, already started and RUNNING (so no first-pass publishing).
fn vcjob(i: usize, config: &Config, keys: &AnnotationKeys) -> VolcanoJob {
    let mut job: SubmitJob =
        serde_json::from_str(include_str!("../schemas/examples/submit-job.figlet.json"))
            .expect("the example parses");
    job.job_id = format!("b{i}");
    let word = |w: &str| InvocationParameter {
        kind: Some(invocation_parameter::Kind::Word(WordInvocation {
            word: w.into(),
        })),
    };
    if let Some(app) = job.application.as_mut() {
        app.invocation = vec![word("sh"), word("-c"), word("sleep infinity")];
    }
    let start: jiff::Timestamp = START.parse().unwrap();
    let mut vcjob = volcano_runner::pipeline::render(&job, config, start)
        .expect("renders")
        .vcjob;
    // Only the user's container: the MultiNode init script is not a command the simulator knows.
    if let Some(spec) = vcjob.spec.tasks[0].template.spec.as_mut() {
        spec.init_containers = None;
    }
    let a = vcjob
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    a.insert(keys.lifecycle_state.clone(), "RUNNING".into());
    a.insert(keys.job_start.clone(), start.as_millisecond().to_string());
    a.insert(
        keys.expiry.clone(),
        (start.as_millisecond() + 3_600_000).to_string(),
    );
    vcjob.metadata.finalizers = Some(vec![keys.cleanup_finalizer()]);
    vcjob
}

/// Child process: creates the jobs in the simulator at `url`.
async fn populate(url: &str, n: usize) {
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let config = config();
    let keys = AnnotationKeys::new(&config.pipeline.annotation_prefix);
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    for ns in [NAMESPACE, "volcano-runner"] {
        let object = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
        let _ = namespaces.create(&PostParams::default(), &object).await;
    }
    let api: Api<VolcanoJob> = Api::namespaced(client, NAMESPACE);
    let created = std::sync::atomic::AtomicUsize::new(0);
    futures::future::join_all((0..8).map(|worker| {
        let api = api.clone();
        let config = &config;
        let keys = &keys;
        let created = &created;
        async move {
            for i in (worker..n).step_by(8) {
                api.create(&PostParams::default(), &vcjob(i, config, keys))
                    .await
                    .expect("a job is created");
                created.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }))
    .await;
    eprintln!("populated {} jobs", created.into_inner());
}

/// This process's CPU time so far (user + system).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = &stat[stat.rfind(')').expect("a command name") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // The kernel's USER_HZ is 100 on every Linux this runs on.
    Duration::from_millis(ticks * 10)
}

/// Peak resident set size of this process, in MiB.
fn peak_rss_mib() -> f64 {
    status_mib("VmHWM:")
}

/// Resident set size of this process now, in MiB.
fn rss_mib() -> f64 {
    status_mib("VmRSS:")
}

fn status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect(field);
    kib / 1024.0
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Bench {
    rt: tokio::runtime::Runtime,
    /// Resident memory just before the monitor started, MiB.
    rss_before: f64,
    reports: tokio::sync::watch::Receiver<PassReport>,
    passes: Vec<(Duration, Duration)>,
    children: Vec<std::process::Child>,
    shutdown: CancellationToken,
    broker: Broker,
    // Deleted (with everything in it) when the bench ends.
    _vhost: rabbit::TestVhost,
}

fn setup(n: usize) -> Bench {
    let exe = env!("CARGO_BIN_EXE_volcano-runner");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut sim = std::process::Command::new(exe);
    sim.args([
        "sim",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--clock-speed",
        "1",
    ])
    .args(["--start-time", START, "--default-run", "1s", "--no-events"]);
    for i in 0..(n / 100 + 2) {
        sim.args(["--node", &format!("node-{i}:128:1024Gi")]);
    }
    let sim = sim
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the simulator starts");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(async {
        let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        for _ in 0..200 {
            if api.list(&Default::default()).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        client
    });
    let began = Instant::now();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .env("MONITOR_BENCH_POPULATE", &url)
        .env("MONITOR_BENCH_JOBS", n.to_string())
        .status()
        .expect("the populating process runs");
    assert!(status.success(), "populating failed");
    eprintln!("created {n} jobs in {:?}", began.elapsed());
    let vhost = rt.block_on(rabbit::TestVhost::new("monitor-bench"));
    let mut config = config();
    config.broker = vhost.config();
    config.broker.events_mandatory = false;
    let config = Arc::new(config);
    let shutdown = CancellationToken::new();
    let mut rss_before = 0.0;
    let (reports, broker) = rt.block_on(async {
        let broker = Broker::connect(config.broker.clone(), CancellationToken::new())
            .await
            .expect("RabbitMQ is reachable");
        let (leases, handle) = ShardLeases::new(client.clone(), &config.cluster);
        let token = shutdown.clone();
        tokio::spawn(async move { leases.run(token.cancelled_owned()).await });
        let still =
            Still(START.parse::<jiff::Timestamp>().unwrap() + jiff::SignedDuration::from_secs(10));
        let monitor = Monitor::new(
            client,
            broker.publisher(),
            config.clone(),
            "bench".into(),
            handle.subscribe(),
        )
        .with_clock(Arc::new(still), Duration::from_secs(1));
        rss_before = rss_mib();
        let reports = monitor.reports();
        tokio::spawn(monitor.run(shutdown.clone()));
        (reports, broker)
    });
    Bench {
        rt,
        rss_before,
        reports,
        passes: Vec::new(),
        children: vec![sim],
        shutdown,
        broker,
        _vhost: vhost,
    }
}

impl Bench {
    /// Waits for the next complete pass; returns its CPU time and wall time.
    fn next_pass(&mut self) -> (Duration, Duration) {
        let before = cpu_time();
        let reports = &mut self.reports;
        let report = self.rt.block_on(async {
            reports.changed().await.expect("the monitor runs");
            reports.borrow_and_update().clone()
        });
        let cpu = cpu_time() - before;
        self.passes.push((cpu, report.took));
        (cpu, report.took)
    }
}

fn main() {
    if let Ok(url) = std::env::var("MONITOR_BENCH_POPULATE") {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(populate(&url, jobs_wanted()));
        return;
    }
    let n = jobs_wanted();
    let mut bench = setup(n);
    // Warm up until every job is in the monitor's view and a pass has seen them all.
    loop {
        bench.next_pass();
        if bench.reports.borrow().owned >= n {
            break;
        }
    }
    bench.passes.clear();
    let rss_in_view = rss_mib();
    eprintln!(
        "monitor: RSS {:.1} MiB before monitoring, {rss_in_view:.1} MiB with {n} live jobs in view: {:.1} KiB per live job",
        bench.rss_before,
        (rss_in_view - bench.rss_before) * 1024.0 / n as f64
    );
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    c.bench_function(
        &format!("reconciliation pass over {n} running jobs (CPU time)"),
        |b| b.iter_custom(|iters| (0..iters).map(|_| bench.next_pass().0).sum()),
    );
    let passes = bench.passes.len().max(1) as u32;
    let cpu: Duration = bench.passes.iter().map(|p| p.0).sum::<Duration>() / passes;
    let wall: Duration = bench.passes.iter().map(|p| p.1).sum::<Duration>() / passes;
    eprintln!(
        "monitor: {n} running jobs, {passes} passes: CPU {cpu:?} per pass (wall {wall:?}), peak RSS {:.1} MiB (jemalloc, {} arena(s))",
        peak_rss_mib(),
        volcano_runner::alloc::arenas().map_or("?".into(), |n| n.to_string()),
    );
    c.final_summary();
    bench.shutdown.cancel();
    bench.rt.block_on(bench.broker.close());
    for mut child in bench.children {
        let _ = child.kill();
        let _ = child.wait();
    }
}
