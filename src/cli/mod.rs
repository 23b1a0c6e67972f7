//! The `volcano-runner` command line. One file per subcommand; this file parses and dispatches.

pub mod admin;
pub mod bench;
pub mod cancel;
pub mod dead_letters;
pub mod events;
pub mod extend;
pub mod job;
pub mod logs;
pub mod output;
pub mod pause_wait;
pub mod proxy_sync;
pub mod render;
pub mod run;
pub mod sim;
pub mod submit;
pub mod validate;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Runs science-cloud jobs on Kubernetes with the Volcano batch scheduler, driven by RabbitMQ.
#[derive(Debug, Parser)]
#[command(name = "volcano-runner", version, about)]
pub struct Cli {
    /// The configuration file (TOML). Every key can also be set as `VOLCANO_RUNNER_<SECTION>__<KEY>`.
    #[arg(long, global = true, env = "VOLCANO_RUNNER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log what a client command does on stderr (`[ops] log_filter`, INFO by default). Without it, client
    /// commands (`submit`, `cancel`, `extend`, `events`, `job`, `jobs`, `logs`, `admin`, `validate`, `render`) print only
    /// their output and their errors; `VOLCANO_RUNNER_LOG` asks for logs too.
    #[arg(long, short, global = true)]
    pub verbose: bool,
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Decode and validate message files (JSON or protobuf); print `ok` or the error for each.
    Validate(validate::Args),
    /// Print every Kubernetes object a SubmitJob renders to, in apply order (a dry run to diff).
    Render(render::Args),
    /// Serve the cluster simulator: a Kubernetes API with a Volcano model, for tests and a first run.
    Sim(Box<sim::Args>),
    /// Run a runner: consume submissions, cancels and extensions and apply them to the cluster.
    Run(run::Args),
    /// Publish SubmitJob files to the jobs exchange, as an orchestrator would.
    Submit(submit::Args),
    /// Publish a CancelJob for a job.
    Cancel(cancel::Args),
    /// Publish an ExtendJob: give a job more time.
    Extend(extend::Args),
    /// Print the events runners publish, one line each, as they happen.
    Events(events::Args),
    /// Everything recorded about one job: owner, product, its history with times, waiting, restarts,
    /// extensions, ticks charged, outcome and exit codes, the runner that accepted it.
    Job(job::JobArgs),
    /// List the jobs in the cluster with their state, owner and charge (one list call).
    Jobs(job::JobsArgs),
    /// Print the output of every rank of a job, interleaved in time order with a rank prefix.
    Logs(logs::Args),
    /// Pause or resume submissions on every runner; show queues, active jobs and lease holders.
    Admin(admin::Args),
    /// Keep the routes of every running interactive job (from the proxy events and the cluster) and
    /// write them as Envoy's dynamic configuration: the process beside Envoy in each proxy pod.
    ProxySync(proxy_sync::Args),
    /// The end-to-end load benchmark: the broker's and the simulator's limits, then N submissions through
    /// 1 and 3 runner processes (use the release build).
    Bench(bench::Args),
}

impl Command {
    /// Whether this is a client command, run by a person or a script against a broker or a cluster that
    /// runners serve: its output is its answer, and log lines would only be noise around it. `proxy-sync`
    /// is a service (it runs in every proxy pod), so it logs like `run`: `[ops] log_filter`, INFO by default.
    pub fn is_client(&self) -> bool {
        !matches!(
            self,
            Self::Run(_) | Self::Sim(_) | Self::Bench(_) | Self::ProxySync(_)
        )
    }
}

/// The log filter of a client command that was not asked for logs: its own errors only, and nothing of the
/// AMQP client's internals (a refused login is explained once, by the command, not as protocol frames).
pub const CLIENT_LOG_FILTER: &str = "error,lapin=off";

/// How long a client command waits for RabbitMQ at most (less when `[broker] startup_timeout` is shorter):
/// a person at a terminal wants to hear within seconds that the broker is not there, not after the minute
/// a runner keeps trying for.
pub const CLIENT_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The connection of a client command: it gives up after [`CLIENT_CONNECT_TIMEOUT`], and with `passive`
/// it declares nothing (it only checks that the topology exists), for a command that inspects a broker.
/// The error names the host, the vhost and the setting to fix.
pub async fn client_broker(
    config: &crate::config::Config,
    passive: bool,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<crate::broker::Broker, CliError> {
    let mut broker = config.broker.clone();
    broker.startup_timeout = broker.startup_timeout.min(CLIENT_CONNECT_TIMEOUT);
    broker.passive |= passive;
    crate::broker::Broker::connect(broker, shutdown)
        .await
        .map_err(|e| CliError::Other(format!("RabbitMQ: {e}")))
}

/// The connection of a command that inspects a vhost as it is (`admin status`, `admin dead-letters`,
/// `admin pause --wait`): like [`client_broker`], but it declares and checks nothing, so that on a vhost
/// where no runner has declared the topology yet the command can say what is missing instead of failing.
pub async fn inspect_broker(
    config: &crate::config::Config,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<crate::broker::Broker, CliError> {
    let mut broker = config.broker.clone();
    broker.startup_timeout = broker.startup_timeout.min(CLIENT_CONNECT_TIMEOUT);
    crate::broker::Broker::connect_bare(broker, shutdown)
        .await
        .map_err(|e| CliError::Other(format!("RabbitMQ: {e}")))
}

/// Why a command could not do its job. Each message says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("{0}")]
    Other(String),
}

/// Runs the parsed command line; the exit code says whether it succeeded.
pub async fn run(cli: Cli) -> Result<ExitCode, CliError> {
    match cli.command {
        Command::Validate(args) => validate::run(args, cli.config.as_deref()).await,
        Command::Render(args) => render::run(args, cli.config.as_deref()).await,
        Command::Sim(args) => sim::run(*args, cli.config.as_deref()).await,
        Command::Run(args) => run::run(args, cli.config.as_deref()).await,
        Command::Submit(args) => submit::run(args, cli.config.as_deref()).await,
        Command::Cancel(args) => cancel::run(args, cli.config.as_deref()).await,
        Command::Extend(args) => extend::run(args, cli.config.as_deref()).await,
        Command::Events(args) => events::run(args, cli.config.as_deref()).await,
        Command::Job(args) => job::run_job(args, cli.config.as_deref()).await,
        Command::Jobs(args) => job::run_jobs(args, cli.config.as_deref()).await,
        Command::Logs(args) => logs::run(args, cli.config.as_deref()).await,
        Command::Admin(args) => admin::run(args, cli.config.as_deref()).await,
        Command::ProxySync(args) => proxy_sync::run(args, cli.config.as_deref()).await,
        Command::Bench(args) => bench::run(args, cli.config.as_deref()).await,
    }
}

use crate::ops::redact::Redactor;
use crate::ops::telemetry::{self, LOG_ENV, LogSettings, TelemetryError};

/// Sets up the process's logging from the configuration file (and `VOLCANO_RUNNER_*` variables): the
/// `[ops]` log format and filter, and the configuration's secrets handed to the global [`Redactor`]. Here,
/// where the configuration and the logging meet, so that neither depends on the other.
///
/// Called before a subcommand runs. A configuration that does not load gives the default settings here;
/// the subcommand loads it again and reports the problem. A `VOLCANO_RUNNER_LOG` that is not a valid
/// filter is reported on stderr and replaced by the configured one.
///
/// A client command (`quiet`) logs only with `--verbose` or `VOLCANO_RUNNER_LOG`; otherwise its filter is
/// [`CLIENT_LOG_FILTER`].
pub fn init_logging(file: Option<&std::path::Path>, quiet: bool) -> Result<(), TelemetryError> {
    let ops = match crate::config::Config::load(file) {
        Ok(config) => {
            for secret in config.secrets() {
                Redactor::global().add(secret);
            }
            config.ops
        }
        Err(_) => crate::ops::OpsConfig::default(),
    };
    let mut settings = ops.log_settings();
    if quiet && std::env::var_os(LOG_ENV).is_none() {
        settings.filter = CLIENT_LOG_FILTER.to_owned();
    }
    match telemetry::init(&settings) {
        Err(TelemetryError::Filter { filter, reason }) => {
            eprintln!("volcano-runner: ignoring {LOG_ENV}={filter:?}: {reason}");
            telemetry::init(&LogSettings {
                filter: ops.log_filter,
                ..settings
            })
        }
        other => other,
    }
}
