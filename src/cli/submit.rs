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
    /// Book a start: `EARLIEST,LATEST`, each RFC 3339, `now` or `+<duration>` from now (`+1h,+1h10m`), set as
    /// every file's startWindow (the runner answers `booked` or `booking_refused`; docs/bookings.md).
    #[arg(long, value_name = "EARLIEST,LATEST")]
    pub start_between: Option<String>,
}

/// The start window of `--start-between`, read against `now`.
pub fn start_between(
    text: &str,
    now: jiff::Timestamp,
) -> Result<crate::messages::v1::StartWindow, String> {
    use crate::cluster::maintenance::parse_time;
    let (earliest, latest) = text.split_once(',').ok_or_else(|| {
        format!("--start-between: {text:?} is not EARLIEST,LATEST (e.g. 2026-12-01T10:00:00Z,2026-12-01T10:05:00Z or +1h,+1h10m)")
    })?;
    let at = |what, t: &str| {
        parse_time(what, t, now)
            .map(crate::messages::proto_timestamp)
            .map_err(|e| format!("--start-between: {e}"))
    };
    let window = crate::messages::v1::StartWindow {
        earliest: Some(at("the earliest start", earliest)?),
        latest: Some(at("the latest start", latest)?),
    };
    Ok(window)
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
    let window = match &args.start_between {
        Some(text) => match start_between(text, jiff::Timestamp::now()) {
            Ok(w) => Some(w),
            Err(why) => {
                eprintln!("{why}");
                return Ok(ExitCode::FAILURE);
            }
        },
        None => None,
    };
    let mut messages = Vec::new();
    let mut failed = false;
    for path in &args.files {
        match read(path, &config, args.no_validate, window.as_ref()) {
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
fn read(
    path: &Path,
    config: &Config,
    no_validate: bool,
    window: Option<&crate::messages::v1::StartWindow>,
) -> Result<SubmitJob, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let format = Format::from_path(path).unwrap_or(Format::Json);
    let mut job: SubmitJob = decode(format, &bytes).map_err(|e| format!("not a SubmitJob: {e}"))?;
    if let Some(w) = window {
        job.start_window = Some(*w);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `--start-between` takes two times, absolute or from now; anything else names the flag.
    #[test]
    fn start_between_reads_two_times() {
        let now: jiff::Timestamp = "2026-12-01T09:00:00Z".parse().unwrap();
        let w = start_between("+1h,+1h10m", now).unwrap();
        assert_eq!(w.earliest.unwrap().seconds, now.as_second() + 3600);
        assert_eq!(w.latest.unwrap().seconds, now.as_second() + 4200);
        let w = start_between("2026-12-01T10:00:00Z,2026-12-01T10:05:00Z", now).unwrap();
        assert_eq!(w.earliest.unwrap().seconds, now.as_second() + 3600);
        for bad in ["+1h", "tomorrow,+2h", "+1h,later"] {
            let e = start_between(bad, now).unwrap_err();
            assert!(e.starts_with("--start-between"), "{e}");
        }
    }
}
