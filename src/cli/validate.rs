//! `volcano-runner validate FILE... [--format json|protobuf] [--type MESSAGE]`
//!
//! Decodes and validates message files exactly as a runner would, and prints `<file>: ok` or
//! `<file>: <field>: <what is wrong>` for each. The exit code is 0 when every file is valid, 1 when any is
//! not. A submission is checked as a runner with the configuration (`--config`, `VOLCANO_RUNNER_*`)
//! checks it before it asks the cluster anything ([`crate::runner::refusal::submission`]): the message's rules
//! with `limits.max_replicas` and the `licenses` table, then rendering with the pipeline's settings (a
//! public IP under `attach = "refuse"`, whole nodes without a configured charge, ...), so `validate` never
//! says `ok` to what a runner refuses on its own. What only the cluster can tell (a peer's owner, the
//! whole-node limits) is left to the runner.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::CliError;
use crate::config::Config;
use crate::messages::{self, Format, MessageType};
use crate::validate;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Message files to check. The message type comes from the file name: submit-job*.json,
    /// cancel-job*, extend-job*, job-event*, accounting-tick*, proxy-event* (or pass --type).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// The wire format of every file: json or protobuf. Default: from the extension (.json; .binpb,
    /// .pb or .bin for protobuf).
    #[arg(long)]
    pub format: Option<Format>,
    /// The message type of every file: SubmitJob, CancelJob, ExtendJob, JobEvent, AccountingTick or
    /// ProxyEvent (or volcano_runner.v1.SubmitJob, or submit-job).
    #[arg(long = "type", value_name = "MESSAGE")]
    pub message_type: Option<MessageType>,
}

pub async fn run(args: Args, config_path: Option<&Path>) -> Result<ExitCode, CliError> {
    let config = Config::load(config_path)?;
    let mut all_ok = true;
    for file in &args.files {
        let line = match check(file, &args, &config) {
            Ok(()) => format!("{}: ok", file.display()),
            Err(problem) => {
                all_ok = false;
                format!("{}: {problem}", file.display())
            }
        };
        println!("{line}");
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Checks one file; `Err` carries the problem.
fn check(file: &Path, args: &Args, config: &Config) -> Result<(), String> {
    let message_type = args
        .message_type
        .or_else(|| MessageType::from_file_name(file))
        .ok_or_else(|| {
            let stems: Vec<&str> = MessageType::ALL.iter().map(|t| t.file_stem()).collect();
            format!(
                "cannot tell the message type from the file name: start it with one of {} or pass --type",
                stems.join(", ")
            )
        })?;
    let format = args
        .format
        .or_else(|| Format::from_path(file))
        .ok_or_else(|| {
            "cannot tell the format from the extension: use .json or .binpb, or pass --format"
                .to_owned()
        })?;
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read: {e}"))?;
    let message = messages::decode_any(message_type, format, &bytes).map_err(|e| e.to_string())?;
    match &message {
        // What the runner refuses, rendering included.
        messages::AnyMessage::SubmitJob(job) => {
            crate::runner::refusal::submission(job, config, jiff::Timestamp::now())
                .map_err(|e| e.to_string())
        }
        other => validate::message(other, config).map_err(|e| e.to_string()),
    }
}
