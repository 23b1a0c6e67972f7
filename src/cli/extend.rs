//! `volcano-runner extend JOB DURATION [--request-id ID]`: publishes an ExtendJob, as an orchestrator
//! would. The runner applies each request id once, however often the message is delivered; the job's
//! `<jobId>/extend/<requestId>` event says what changed.

use std::path::Path;
use std::process::ExitCode;

use super::CliError;
use super::submit::{Wire, publish};
use crate::broker::Outbound;
use crate::config::Config;
use crate::messages::v1::ExtendJob;
use crate::validate;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The job id.
    pub job: String,
    /// How much time to add: `30m`, `2h`, `1h 30m`, or ISO 8601 `PT1H`.
    pub duration: String,
    /// The request id (unique per extension request); default: one made from the current time. Send the
    /// same id again to see that it applies once.
    #[arg(long)]
    pub request_id: Option<String>,
    /// The encoding on the wire.
    #[arg(long, value_enum, default_value_t = Wire::Json)]
    pub wire: Wire,
}

pub async fn run(args: Args, config: Option<&Path>) -> Result<ExitCode, CliError> {
    let config = Config::load(config)?;
    let duration = parse_duration(&args.duration)?;
    let request_id = args
        .request_id
        .unwrap_or_else(|| format!("cli-{}", jiff::Timestamp::now().as_nanosecond()));
    let extend = ExtendJob {
        job_id: args.job,
        request_id,
        extension: Some(duration),
    };
    validate::extend(&extend).map_err(|e| CliError::Other(format!("invalid extension: {e}")))?;
    let what = format!(
        "extension of job {} (request id {})",
        extend.job_id, extend.request_id
    );
    let message = Outbound::extend(&extend, args.wire.into(), &config.broker);
    let sent = publish(&config, vec![(what, message)]).await?;
    Ok(if sent {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `30m`, `2h`, `1h 30m`, `PT1H` as a protobuf duration.
fn parse_duration(text: &str) -> Result<pbjson_types::Duration, CliError> {
    let d: jiff::SignedDuration = text.trim().parse().map_err(|e| {
        CliError::Other(format!(
            "DURATION: {text:?} is not a duration like 30m, 2h or 1h 30m: {e}"
        ))
    })?;
    if !d.is_positive() {
        return Err(CliError::Other(format!(
            "DURATION: {text:?} must be positive"
        )));
    }
    Ok(pbjson_types::Duration {
        seconds: d.as_secs(),
        nanos: d.subsec_nanos(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_words() {
        assert_eq!(parse_duration("90m").unwrap().seconds, 5400);
        assert_eq!(parse_duration("1h 30m").unwrap().seconds, 5400);
        assert_eq!(parse_duration("PT2H").unwrap().seconds, 7200);
        assert!(parse_duration("-5m").is_err());
        assert!(
            parse_duration("soon")
                .unwrap_err()
                .to_string()
                .contains("DURATION")
        );
    }
}
