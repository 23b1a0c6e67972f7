//! `volcano-runner bench`: the end-to-end load benchmark (see [`crate::bench`]). Needs RabbitMQ at
//! `[broker] url` (`scripts/test` and `scripts/bench` start one); the simulator runs in this process and
//! the runners are child processes of this program. Run the release build: a debug build measures the
//! compiler's debug settings, not the runner.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use super::CliError;
use crate::bench::{self, Options};
use crate::config::Config;
use crate::messages::Format;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Submissions per phase.
    #[arg(long, default_value_t = 10_000)]
    pub submissions: usize,
    /// 1,000 submissions per phase instead of the default (a first look in a minute).
    #[arg(long, conflicts_with = "submissions")]
    pub quick: bool,
    /// Runner counts, one phase each, in order (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 3])]
    pub runners: Vec<usize>,
    /// Fixed publishing rates in submissions per second, one more phase per runner count each
    /// (comma-separated), after the unpaced phases. For latency under a known load.
    #[arg(long, value_delimiter = ',')]
    pub rate: Vec<f64>,
    /// Only the fixed-rate phases (requires --rate).
    #[arg(long)]
    pub only_rate: bool,
    /// `runner.max_in_flight` for every runner (the prefetch is twice this).
    #[arg(long, default_value_t = 64)]
    pub max_in_flight: u32,
    /// Worker threads of each runner's async runtime (passed as `TOKIO_WORKER_THREADS`). One, as a
    /// runner pod with a one-CPU limit gets: on a small machine the runners share the cores with the
    /// simulator and RabbitMQ, and a runner that gets less than a core spends more on moving work between
    /// two threads than it gains.
    #[arg(long, default_value_t = 1)]
    pub runner_threads: usize,
    /// Phases without the monitoring duty only (the consuming side alone), instead of both kinds.
    #[arg(long, conflicts_with = "monitor_only")]
    pub no_monitor: bool,
    /// Phases with the monitoring duty only: every job runs to its end (short runs), and the phase
    /// waits for every terminal event.
    #[arg(long)]
    pub monitor_only: bool,
    /// The submissions' encoding.
    #[arg(long, value_enum, default_value_t = WireFormat::Json)]
    pub format: WireFormat,
    /// Skip the broker and simulator limits.
    #[arg(long)]
    pub skip_limits: bool,
    /// Run every phase this many times, interleaved (each trial its unmonitored and monitored phases
    /// back to back), and give the median of the trials' monitored / unmonitored QUEUED-rate ratios:
    /// on a machine shared with the simulator and RabbitMQ one pair of phases spreads wider than the
    /// goals' margin.
    #[arg(long, default_value_t = 1)]
    pub trials: usize,
    /// How long one phase may take before it is reported incomplete (seconds).
    #[arg(long, default_value_t = 600)]
    pub phase_timeout: u64,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Where the runners' logs go (default: a directory under the system's temporary directory).
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
    /// Soak mode: every this many seconds of a phase, print each runner's RSS and CPU per job so far
    /// and this process's RSS (the simulator's), to see whether they grow with the jobs submitted.
    #[arg(long)]
    pub soak_every: Option<u64>,
    /// A command put before each runner's own command line, split at spaces, to profile the runners
    /// where they run: `--runner-wrap "valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p"`
    /// counts each runner's instructions per job (README, Performance).
    #[arg(long)]
    pub runner_wrap: Option<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum WireFormat {
    Json,
    Protobuf,
}

pub async fn run(args: Args, config_file: Option<&Path>) -> Result<ExitCode, CliError> {
    let options = options(&args, config_file)?;
    if cfg!(debug_assertions) {
        eprintln!(
            "warning: this is a debug build; run `cargo run --release -- bench` for figures that mean something"
        );
    }
    eprintln!(
        "volcano-runner bench: {} submissions per phase, runners {:?}, rates {:?}; runner logs in {}",
        options.submissions,
        options.runners,
        options.rates,
        options.log_dir.display()
    );
    let report = bench::run(&options)
        .await
        .map_err(|e| CliError::Other(e.to_string()))?;
    print!("{}", report.table());
    if let Some(path) = &args.out {
        let json = serde_json::to_string_pretty(&report).expect("the report serializes");
        std::fs::write(path, json + "\n").map_err(|error| {
            CliError::Other(
                bench::BenchError::Output {
                    path: path.clone(),
                    error,
                }
                .to_string(),
            )
        })?;
        eprintln!("wrote {}", path.display());
    }
    let complete = report.phases.iter().all(|p| p.complete);
    Ok(if complete {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The benchmark's options from the command line and the configuration.
fn options(args: &Args, config_file: Option<&Path>) -> Result<Options, CliError> {
    if args.only_rate && args.rate.is_empty() {
        return Err(CliError::Other(
            "--only-rate needs at least one --rate".into(),
        ));
    }
    if let Some(bad) = args.rate.iter().find(|r| !(r.is_finite() && **r > 0.0)) {
        return Err(CliError::Other(format!(
            "--rate {bad}: a rate must be a positive number of submissions per second"
        )));
    }
    if args.runners.is_empty() || args.runners.contains(&0) {
        return Err(CliError::Other(
            "--runners: each runner count must be at least 1".into(),
        ));
    }
    if args.soak_every == Some(0) {
        return Err(CliError::Other(
            "--soak-every must be at least 1 (seconds)".into(),
        ));
    }
    if args.trials == 0 {
        return Err(CliError::Other("--trials must be at least 1".into()));
    }
    if args.max_in_flight == 0 {
        return Err(CliError::Other("--max-in-flight must be at least 1".into()));
    }
    if args.runner_threads == 0 {
        return Err(CliError::Other(
            "--runner-threads must be at least 1".into(),
        ));
    }
    let submissions = if args.quick { 1_000 } else { args.submissions };
    if submissions == 0 {
        return Err(CliError::Other("--submissions must be at least 1".into()));
    }
    let config = Config::load(config_file)?;
    let mut rates: Vec<Option<f64>> = Vec::new();
    if !args.only_rate {
        rates.push(None);
    }
    rates.extend(args.rate.iter().map(|r| Some(*r)));
    let program = std::env::current_exe()
        .map_err(|e| CliError::Other(format!("cannot find this program's path: {e}")))?;
    let log_dir = args.log_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("volcano-runner-bench-{}", std::process::id()))
    });
    Ok(Options {
        config,
        config_file: config_file.map(Path::to_owned),
        submissions,
        runners: args.runners.clone(),
        rates,
        max_in_flight: args.max_in_flight,
        runner_threads: args.runner_threads,
        monitor: match (args.no_monitor, args.monitor_only) {
            (true, _) => vec![false],
            (_, true) => vec![true],
            _ => vec![false, true],
        },
        format: match args.format {
            WireFormat::Json => Format::Json,
            WireFormat::Protobuf => Format::Protobuf,
        },
        program,
        log_dir,
        phase_timeout: Duration::from_secs(args.phase_timeout),
        skip_limits: args.skip_limits,
        trials: args.trials,
        soak_every: args.soak_every.map(Duration::from_secs),
        runner_wrap: args
            .runner_wrap
            .as_deref()
            .map(|w| w.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn args(line: &[&str]) -> Args {
        let mut argv = vec!["volcano-runner", "bench"];
        argv.extend_from_slice(line);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Bench(args) => args,
            other => panic!("not bench: {other:?}"),
        }
    }

    #[test]
    fn defaults_are_the_issue_s_benchmark() {
        let o = options(&args(&[]), None).unwrap();
        assert_eq!(o.submissions, 10_000);
        assert_eq!(o.runners, vec![1, 3]);
        assert_eq!(o.rates, vec![None]);
        assert_eq!(o.max_in_flight, 64);
        assert_eq!(o.trials, 1, "one pair of phases per runner count");
        assert_eq!(
            o.monitor,
            vec![false, true],
            "both kinds of phase, same run"
        );
    }

    #[test]
    fn quick_and_rates() {
        let o = options(&args(&["--quick", "--rate", "500", "--runners", "1"]), None).unwrap();
        assert_eq!(o.submissions, 1_000);
        assert_eq!(o.rates, vec![None, Some(500.0)]);
        assert_eq!(o.runners, vec![1]);
        let o = options(&args(&["--rate", "250,500", "--only-rate"]), None).unwrap();
        assert_eq!(o.rates, vec![Some(250.0), Some(500.0)]);
    }

    #[test]
    fn bad_options_say_what_is_wrong() {
        let e = options(&args(&["--only-rate"]), None).unwrap_err();
        assert!(e.to_string().contains("--only-rate needs"), "{e}");
        let e = options(&args(&["--rate=-5"]), None).unwrap_err();
        assert!(e.to_string().contains("--rate -5"), "{e}");
        let e = options(&args(&["--runners", "0"]), None).unwrap_err();
        assert!(e.to_string().contains("--runners"), "{e}");
        let both =
            Cli::try_parse_from(["volcano-runner", "bench", "--quick", "--submissions", "5"]);
        assert!(both.unwrap_err().to_string().contains("--submissions"));
        let e = options(&args(&["--submissions", "0"]), None).unwrap_err();
        assert!(e.to_string().contains("--submissions"), "{e}");
        let e = options(&args(&["--trials", "0"]), None).unwrap_err();
        assert!(e.to_string().contains("--trials"), "{e}");
        assert_eq!(options(&args(&["--trials", "5"]), None).unwrap().trials, 5);
    }
}
