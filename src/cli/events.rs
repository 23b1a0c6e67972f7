//! `volcano-runner events [--follow] [--job ID]... [-o text|json]`: what the runners publish, one line per
//! message, as it happens. A temporary queue is bound to the events exchange (every routing key) and to
//! the proxy exchange, so this sees what is published while it runs, nothing from before.
//!
//! Without `--follow` it stops after `--idle` seconds without a message; with `--follow` it runs until
//! Ctrl-C, or, with `--until-done`, until every `--job` has had its terminal event.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::CliError;
use super::output::Output;
use super::run::cancel_on_signal;
use crate::broker::{FollowedEvent, OutboundEvent};
use crate::config::Config;
use crate::messages::v1::{JobState, ProxyAction};
use crate::messages::{Format, encode};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Keep printing until Ctrl-C (or, with `--until-done`, until the jobs are done).
    #[arg(short, long)]
    pub follow: bool,
    /// Only messages about this job; repeat for several.
    #[arg(long = "job", value_name = "ID")]
    pub jobs: Vec<String>,
    /// `text`: one aligned line per message; `json`: one JSON object per line.
    #[arg(short, long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// With `--follow` and `--job`: stop once every named job has had its terminal event.
    #[arg(long, requires = "jobs")]
    pub until_done: bool,
    /// Without `--follow`: stop after this many seconds without a message.
    #[arg(long, default_value_t = 5.0, value_parser = idle_seconds)]
    pub idle: f64,
}

/// `--idle`: a finite number of seconds from 0 to a day (a longer wait is `--follow`).
fn idle_seconds(text: &str) -> Result<f64, String> {
    let secs: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !secs.is_finite() || !(0.0..=86_400.0).contains(&secs) {
        return Err(format!(
            "`{text}` must be between 0 and 86400 seconds (use --follow to wait longer)"
        ));
    }
    Ok(secs)
}

pub async fn run(args: Args, config: Option<&Path>) -> Result<ExitCode, CliError> {
    let config = Config::load(config)?;
    let shutdown = CancellationToken::new();
    // Ends on a signal or when this function returns (the guard cancels the token).
    let _stop_on_return = shutdown.clone().drop_guard();
    let signals = tokio::spawn(cancel_on_signal(shutdown.clone()));
    let broker = super::client_broker(&config, false, shutdown.clone()).await?;
    let mut follower = broker
        .follow_events()
        .await
        .map_err(|e| CliError::Other(format!("RabbitMQ: {e}")))?;
    eprintln!(
        "listening on {} and {} (Ctrl-C to stop)",
        config.broker.events_exchange, config.broker.proxy_exchange
    );
    let filter: BTreeSet<String> = args.jobs.iter().cloned().collect();
    let mut pending = filter.clone();
    // NaN, negative and absurdly large values are caught by clap (`idle_seconds`); the floor keeps a
    // zero from ending the command before the broker could deliver anything.
    let idle = Duration::from_secs_f64(args.idle.max(0.1));
    loop {
        let next = if args.follow {
            follower.next().await
        } else {
            match tokio::time::timeout(idle, follower.next()).await {
                Ok(next) => next,
                Err(_) => break,
            }
        };
        let Some(event) = next else { break };
        let job_id = event.event.as_ref().ok().map(|e| e.job_id().to_owned());
        if !filter.is_empty() && !job_id.as_ref().is_some_and(|id| filter.contains(id)) {
            continue;
        }
        println!("{}", render(&event, args.output));
        if let (Ok(OutboundEvent::Job(e)), Some(id)) = (&event.event, &job_id)
            && is_terminal(e.state)
        {
            pending.remove(id);
        }
        if args.until_done && pending.is_empty() {
            break;
        }
    }
    follower.close().await;
    shutdown.cancel();
    broker.close().await;
    shutdown.cancel();
    let _ = signals.await;
    Ok(ExitCode::SUCCESS)
}

fn is_terminal(state: i32) -> bool {
    matches!(
        JobState::try_from(state),
        Ok(JobState::Success | JobState::Failure | JobState::Expired | JobState::Cancelled)
    )
}

/// One message as a line of text or JSON.
pub fn render(event: &FollowedEvent, output: Output) -> String {
    match output {
        Output::Text => text(event),
        Output::Json => json(event).to_string(),
    }
}

fn text(event: &FollowedEvent) -> String {
    let id = event.message_id.as_deref().unwrap_or("-");
    match &event.event {
        Err(e) => format!("?  {id}  undecodable ({}): {e}", event.routing_key),
        Ok(OutboundEvent::Job(e)) => {
            let at = time(e.timestamp.as_ref());
            let state = JobState::try_from(e.state)
                .map(|s| s.as_str_name().trim_start_matches("JOB_STATE_").to_owned())
                .unwrap_or_else(|_| e.state.to_string());
            let state = if e.state == JobState::Unspecified as i32 {
                "STATUS".to_owned()
            } else {
                state
            };
            let reason = if e.reason.is_empty() { "-" } else { &e.reason };
            format!(
                "{at}  {:<12} {state:<10} {reason:<18} {}",
                e.job_id, e.status
            )
        }
        Ok(OutboundEvent::Accounting(t)) => format!(
            "{}  {:<12} {:<10} {:<18} {} x{} {}ms{}",
            time(t.interval_end.as_ref()),
            t.job_id,
            "TICK",
            format!("#{}", t.sequence),
            t.product_id,
            t.replicas,
            t.duration_ms,
            if t.r#final { " (final)" } else { "" }
        ),
        Ok(OutboundEvent::Proxy(p)) => {
            let action = ProxyAction::try_from(p.action)
                .map(|a| {
                    a.as_str_name()
                        .trim_start_matches("PROXY_ACTION_")
                        .to_owned()
                })
                .unwrap_or_else(|_| p.action.to_string());
            let targets: Vec<String> = p
                .targets
                .iter()
                .map(|t| format!("{}:{}", t.pod_ip, t.port))
                .collect();
            format!(
                "{}  {:<12} {:<10} {:<18} {}",
                time(p.timestamp.as_ref()),
                p.job_id,
                "PROXY",
                action,
                targets.join(" ")
            )
        }
    }
}

fn json(event: &FollowedEvent) -> serde_json::Value {
    let message = match &event.event {
        Ok(OutboundEvent::Job(e)) => encode(Format::Json, e),
        Ok(OutboundEvent::Accounting(t)) => encode(Format::Json, t),
        Ok(OutboundEvent::Proxy(p)) => encode(Format::Json, p),
        Err(e) => {
            return serde_json::json!({
                "exchange": event.exchange,
                "routingKey": event.routing_key,
                "messageId": event.message_id,
                "error": e.to_string(),
            });
        }
    };
    let message: serde_json::Value = message
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or(serde_json::Value::Null);
    serde_json::json!({
        "exchange": event.exchange,
        "routingKey": event.routing_key,
        "messageId": event.message_id,
        "type": event.event.as_ref().map(|e| e.type_name()).unwrap_or_default(),
        "message": message,
    })
}

fn time(t: Option<&pbjson_types::Timestamp>) -> String {
    t.and_then(|t| jiff::Timestamp::new(t.seconds, t.nanos).ok())
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| "-".repeat(20))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::v1::JobEvent;

    fn followed(event: JobEvent) -> FollowedEvent {
        FollowedEvent {
            exchange: "compute.events".into(),
            routing_key: "job.lifecycle".into(),
            message_id: Some(event.event_id.clone()),
            event: Ok(OutboundEvent::Job(event)),
        }
    }

    #[test]
    fn idle_takes_finite_seconds_up_to_a_day() {
        assert_eq!(idle_seconds("2.5"), Ok(2.5));
        assert_eq!(idle_seconds("0"), Ok(0.0));
        for bad in ["1e30", "-1", "NaN", "inf", "soon"] {
            let err = idle_seconds(bad).unwrap_err();
            assert!(err.contains(bad), "{bad}: {err}");
        }
    }

    #[test]
    fn a_lifecycle_event_is_one_readable_line() {
        let e = JobEvent {
            event_id: "42/QUEUED".into(),
            job_id: "42".into(),
            state: JobState::Queued as i32,
            status: "Queued: waiting".into(),
            reason: "submitted".into(),
            timestamp: Some(pbjson_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 0,
            }),
            ..JobEvent::default()
        };
        let line = render(&followed(e.clone()), Output::Text);
        assert!(line.starts_with("2023-11-14T22:13:20Z  42"), "{line}");
        assert!(
            line.contains("QUEUED")
                && line.contains("submitted")
                && line.contains("Queued: waiting")
        );
        let json: serde_json::Value =
            serde_json::from_str(&render(&followed(e), Output::Json)).unwrap();
        assert_eq!(json["messageId"], "42/QUEUED");
        assert_eq!(json["message"]["state"], "JOB_STATE_QUEUED");
        assert_eq!(json["type"], "volcano_runner.v1.JobEvent");
    }

    #[test]
    fn status_updates_and_terminal_states_are_told_apart() {
        let status = JobEvent {
            job_id: "7".into(),
            status: "Time allocation extended".into(),
            ..JobEvent::default()
        };
        assert!(render(&followed(status), Output::Text).contains("STATUS"));
        assert!(is_terminal(JobState::Cancelled as i32));
        assert!(!is_terminal(JobState::Running as i32));
        assert!(!is_terminal(JobState::Unspecified as i32));
    }
}
