//! The `volcano-runner` binary: parses the command line, sets up logging, and runs the library.

use std::process::ExitCode;

use clap::Parser;
use volcano_runner::cli::{self, Cli};

/// The stack reserved for threads the program does not size itself, which means the AMQP client's I/O
/// thread: amq-protocol parses a header table recursively on it, and a message whose headers nest tables
/// thousands deep (RabbitMQ accepts up to its frame size: about 18,000 levels in 128 KiB) overflowed the
/// default 2 MiB stack and aborted the process; the next runner to get the message died the same way. A
/// reservation is address space, not memory: only the pages a parse touches are ever used.
/// `RUST_MIN_STACK` set in the environment wins.
const DEFAULT_THREAD_STACK: &str = "1073741824";

/// The stack of the async runtime's own threads (tokio's default), set explicitly so that the large
/// default above applies only to threads that need it.
const RUNTIME_THREAD_STACK: usize = 2 * 1024 * 1024;

fn main() {
    if std::env::var_os("RUST_MIN_STACK").is_none() {
        // SAFETY: no other thread exists yet: the runtime is built below.
        unsafe { std::env::set_var("RUST_MIN_STACK", DEFAULT_THREAD_STACK) };
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(RUNTIME_THREAD_STACK)
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(async_main()),
        Err(error) => {
            eprintln!("volcano-runner: cannot start the async runtime: {error}");
            std::process::exit(2)
        }
    }
}

async fn async_main() {
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
