//! The `volcano-runner` binary: parses the command line, sets up logging, and runs the library.

use std::process::ExitCode;

use clap::Parser;
use volcano_runner::cli::{self, Cli};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.config.as_deref());
    match run(cli).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("volcano-runner: {error:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    Ok(cli::run(cli).await?)
}

/// Logs go to stderr, so that command output on stdout stays clean; their format, filter and the secrets
/// kept out of them come from the configuration (see `volcano_runner::ops::telemetry`).
fn init_logging(config: Option<&std::path::Path>) {
    if let Err(error) = cli::init_logging(config) {
        eprintln!("volcano-runner: logging is not set up: {error}");
    }
}
