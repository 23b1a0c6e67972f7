//! Render throughput: the figlet job (target: at least 50,000 renders/s per core) and a large job
//! (64 replicas, 20 parameters, 10 mounts). Inputs are the golden job files; the configuration is the
//! shipped default (per-owner namespaces). Run with `cargo bench --bench render`.
//!
//! Two groups: `render` measures wall-clock time (criterion's default); `render_cpu` measures the
//! benchmark thread's own CPU time (Linux `/proc/thread-self/schedstat`), which is what "per core" means
//! and stays meaningful on a machine shared with other work.

use std::hint::black_box;

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use volcano_runner::config::Config;
use volcano_runner::messages::v1::SubmitJob;
use volcano_runner::pipeline;

fn load(name: &str) -> SubmitJob {
    let path = format!(
        "{}/tests/golden/jobs/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).expect("golden job file");
    serde_json::from_str(&text).expect("a SubmitJob")
}

fn config() -> Config {
    let path = format!(
        "{}/tests/golden/config/default.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    toml::from_str(&std::fs::read_to_string(path).expect("config")).expect("a configuration")
}

fn bench_group<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    let config = config();
    let now: jiff::Timestamp = "2024-05-01T12:00:05Z".parse().expect("timestamp");
    let mut group = c.benchmark_group(group);
    group.throughput(Throughput::Elements(1));
    for name in ["figlet", "large"] {
        let job = load(name);
        pipeline::render(&job, &config, now).expect("renders");
        group.bench_function(name, |b| {
            b.iter(|| pipeline::render(black_box(&job), black_box(&config), now).expect("renders"))
        });
    }
    group.finish();
}

fn wall(c: &mut Criterion) {
    bench_group(c, "render");
}

fn cpu(c: &mut Criterion<ThreadCpuTime>) {
    bench_group(c, "render_cpu");
}

/// CPU time of the calling thread in nanoseconds.
fn thread_cpu_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the kernel knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Criterion measurement of the benchmark thread's CPU time.
struct ThreadCpuTime;

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_nanos()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_nanos().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, value: &u64) -> f64 {
        *value as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

/// Formats CPU nanoseconds as µs of CPU, and throughput as elements per CPU-second.
struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, _typical: f64, values: &mut [f64]) -> &'static str {
        values.iter_mut().for_each(|v| *v /= 1e3);
        "µs (cpu)"
    }
    fn scale_throughputs(
        &self,
        _typical: f64,
        throughput: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        let per = match throughput {
            Throughput::Elements(n)
            | Throughput::Bytes(n)
            | Throughput::BytesDecimal(n)
            | Throughput::Bits(n) => *n as f64,
            _ => 1.0,
        };
        values.iter_mut().for_each(|v| *v = per * 1e9 / *v / 1e3);
        "K/cpu-s"
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

criterion_group!(wall_clock, wall);
criterion_group! {
    name = cpu_time;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = cpu
}
criterion_main!(wall_clock, cpu_time);
