//! The `volcano-runner` binary: parses the command line, sets up logging, and runs the library.

use std::process::ExitCode;

use clap::Parser;
use volcano_runner::cli::{self, Cli};

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    init_logging(
        cli.config.as_deref(),
        cli.command.is_client() && !cli.verbose,
    );
    let code = match run(cli).await {
        Ok(code) if code == ExitCode::SUCCESS => 0,
        Ok(_) => 1,
        Err(error) => {
            eprintln!("volcano-runner: {error:#}");
            2
        }
    };
    // Exit here, before the runtime is dropped: the AMQP client keeps a thread of its own that waits on a
    // task of the runtime, and a command that gave up on an unreachable broker would otherwise end with that
    // thread's panic about a cancelled task under its error message. Everything with an effect (confirms,
    // acks, closing the connection, the runner's drain) has completed by now.
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(code)
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    Ok(cli::run(cli).await?)
}

/// Logs go to stderr, so that command output on stdout stays clean; their format, filter and the secrets
/// kept out of them come from the configuration (see `volcano_runner::ops::telemetry`).
fn init_logging(config: Option<&std::path::Path>, quiet: bool) {
    if let Err(error) = cli::init_logging(config, quiet) {
        eprintln!("volcano-runner: logging is not set up: {error}");
    }
}
