//! `volcano-runner submit FILE...`: publishes SubmitJob messages to the jobs exchange, as an orchestrator
//! would, with publisher confirms. Each file is JSON (`.json`, proto3 JSON mapping) or protobuf (`.pb`,
//! `.binpb`); it is checked with the runner's own validation first, so a typo is reported here with the
//! field, not later as a FAILURE event (`--no-validate` sends it anyway, to try the dead-letter path).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use super::CliError;
use crate::broker::Outbound;
use crate::config::Config;
use crate::messages::v1::SubmitJob;
use crate::messages::{Format, decode};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// SubmitJob files (`.json`, or `.pb`/`.binpb` for protobuf).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// The encoding on the wire.
    #[arg(long, value_enum, default_value_t = Wire::Json)]
    pub wire: Wire,
    /// Send the messages even if they do not pass validation.
    #[arg(long)]
    pub no_validate: bool,
}

/// The encoding of published messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Wire {
    Json,
    Protobuf,
}

impl From<Wire> for Format {
    fn from(value: Wire) -> Self {
        match value {
            Wire::Json => Format::Json,
            Wire::Protobuf => Format::Protobuf,
        }
    }
}

pub async fn run(args: Args, config: Option<&Path>) -> Result<ExitCode, CliError> {
    let config = Config::load(config)?;
    let mut messages = Vec::new();
    let mut failed = false;
    for path in &args.files {
        match read(path, &config, args.no_validate) {
            Ok(job) => {
                let outbound = Outbound::submit(&job, args.wire.into(), &config.broker);
                messages.push((format!("job {}", job.job_id), outbound));
            }
            Err(why) => {
                eprintln!("{}: {why}", path.display());
                failed = true;
            }
        }
    }
    let sent = publish(&config, messages).await?;
    Ok(if failed || !sent {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Reads and (unless told not to) validates one SubmitJob file.
fn read(path: &Path, config: &Config, no_validate: bool) -> Result<SubmitJob, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let format = Format::from_path(path).unwrap_or(Format::Json);
    let job: SubmitJob = decode(format, &bytes).map_err(|e| format!("not a SubmitJob: {e}"))?;
    if !no_validate {
        crate::runner::refusal::submission(&job, config, jiff::Timestamp::now())
            .map_err(|e| format!("invalid: {e}"))?;
    }
    Ok(job)
}

/// Publishes each message with confirms and prints one line per message. `Ok(false)` when any was not
/// confirmed.
pub async fn publish(config: &Config, messages: Vec<(String, Outbound)>) -> Result<bool, CliError> {
    if messages.is_empty() {
        return Ok(true);
    }
    let broker = super::client_broker(config, false, CancellationToken::new()).await?;
    let publisher = broker.publisher();
    let mut all = true;
    for (what, message) in &messages {
        match publisher.publish(message).await {
            Ok(()) => println!("sent {what} (message id {})", message.message_id),
            Err(e) => {
                eprintln!("{what}: not sent: {e}");
                all = false;
            }
        }
    }
    broker.close().await;
    Ok(all)
}
