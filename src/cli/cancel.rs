//! `volcano-runner cancel JOB [--reason R]`: publishes a CancelJob, as an orchestrator would. The runner
//! stops the job (or, if its submission has not arrived yet, makes sure it never starts) and the job's
//! CANCELLED event carries the reason.

use std::path::Path;
use std::process::ExitCode;

use super::CliError;
use super::submit::{Wire, publish};
use crate::broker::Outbound;
use crate::config::Config;
use crate::messages::v1::CancelJob;
use crate::validate;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The job id.
    pub job: String,
    /// Why, in words for the user; carried into the CANCELLED event.
    #[arg(long)]
    pub reason: Option<String>,
    /// The encoding on the wire.
    #[arg(long, value_enum, default_value_t = Wire::Json)]
    pub wire: Wire,
}

pub async fn run(args: Args, config: Option<&Path>) -> Result<ExitCode, CliError> {
    let config = Config::load(config)?;
    let cancel = CancelJob {
        job_id: args.job,
        reason: args.reason,
    };
    validate::cancel(&cancel).map_err(|e| CliError::Other(format!("invalid cancel: {e}")))?;
    let message = Outbound::cancel(&cancel, args.wire.into(), &config.broker);
    let sent = publish(
        &config,
        vec![(format!("cancel of job {}", cancel.job_id), message)],
    )
    .await?;
    Ok(if sent {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
