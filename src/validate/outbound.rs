//! Checks for the messages runners publish. Consumers rely on these invariants, so the monitor's tests
//! (and `volcano-runner validate`) hold every outbound message to them.

use std::net::IpAddr;

use super::{ValidationError, job_id_at, names, quoted, timestamp};
use crate::messages::v1::{AccountingTick, JobEvent, JobState, ProxyAction, ProxyEvent};

type Check = Result<(), ValidationError>;

/// A lifecycle event: ids, a known state, a timestamp, and a status text when the state does not change.
pub fn job_event(event: &JobEvent) -> Check {
    non_empty("eventId", &event.event_id)?;
    if event.event_id.contains("/rejected/") {
        // A rejected message's id as the message had it: it need not be a valid job id.
        if !super::readable_job_id(&event.job_id) {
            return Err(ValidationError::invalid(
                "jobId",
                format!(
                    "a rejection names the job id as sent, at most {} bytes without control characters",
                    super::READABLE_JOB_ID_MAX
                ),
            ));
        }
    } else {
        job_id_at("jobId", &event.job_id)?;
    }
    match JobState::try_from(event.state) {
        Ok(JobState::Unspecified) if event.status.is_empty() => {
            return Err(ValidationError::missing("status")
                .with_message("a status-only update (no state) must carry a status text"));
        }
        Ok(_) => {}
        Err(_) => {
            return Err(ValidationError::invalid(
                "state",
                format!("unknown job state {}", event.state),
            ));
        }
    }
    required_timestamp("timestamp", event.timestamp.as_ref())?;
    non_empty("runnerId", &event.runner_id)?;
    if event.refundable_ms < 0 {
        return Err(ValidationError::invalid(
            "refundableMs",
            format!("must not be negative, got {}", event.refundable_ms),
        ));
    }
    for (field, t) in [
        ("expiresAt", &event.expires_at),
        ("startedAt", &event.started_at),
        ("endedAt", &event.ended_at),
    ] {
        if let Some(t) = t {
            timestamp(field, t)?;
        }
    }
    for (i, exit) in event.exit_codes.iter().enumerate() {
        if event.exit_codes[..i].iter().any(|e| e.rank == exit.rank) {
            return Err(ValidationError::invalid(
                format!("exitCodes[{i}].rank"),
                format!("rank {} appears twice", exit.rank),
            ));
        }
    }
    if let Some(pending) = &event.pending {
        non_empty("pending.queue", &pending.queue)?;
        if pending.unschedulable_pods > pending.total_pods {
            return Err(ValidationError::invalid(
                "pending.unschedulablePods",
                format!(
                    "{} unschedulable pods out of {} in total",
                    pending.unschedulable_pods, pending.total_pods
                ),
            ));
        }
    }
    Ok(())
}

/// A charge: who, what, and an interval that does not run backwards.
pub fn accounting_tick(tick: &AccountingTick) -> Check {
    non_empty("tickId", &tick.tick_id)?;
    job_id_at("jobId", &tick.job_id)?;
    non_empty("user", &tick.user)?;
    if tick.project.as_deref() == Some("") {
        return Err(ValidationError::invalid(
            "project",
            "empty: leave it out when the job does not run in a project",
        ));
    }
    non_empty("productId", &tick.product_id)?;
    if tick.replicas == 0 {
        return Err(ValidationError::invalid("replicas", "must be at least 1"));
    }
    required_timestamp("intervalStart", tick.interval_start.as_ref())?;
    required_timestamp("intervalEnd", tick.interval_end.as_ref())?;
    let (start, end) = (
        tick.interval_start.unwrap_or_default(),
        tick.interval_end.unwrap_or_default(),
    );
    if (end.seconds, end.nanos) < (start.seconds, start.nanos) {
        return Err(ValidationError::invalid(
            "intervalEnd",
            "the interval ends before it starts",
        ));
    }
    if tick.duration_ms < 0 {
        return Err(ValidationError::invalid(
            "durationMs",
            format!("must not be negative, got {}", tick.duration_ms),
        ));
    }
    Ok(())
}

/// A proxy event: a known action, and for create and update one reachable target per rank (port 0:
/// bridges only).
pub fn proxy_event(event: &ProxyEvent) -> Check {
    non_empty("eventId", &event.event_id)?;
    job_id_at("jobId", &event.job_id)?;
    let action = match ProxyAction::try_from(event.action) {
        Ok(ProxyAction::Unspecified) => return Err(ValidationError::missing("action")),
        Ok(action) => action,
        Err(_) => {
            return Err(ValidationError::invalid(
                "action",
                format!("unknown proxy action {}", event.action),
            ));
        }
    };
    if action != ProxyAction::Remove && event.targets.is_empty() {
        return Err(ValidationError::missing("targets")
            .with_message("create and update events need at least one target"));
    }
    for (i, target) in event.targets.iter().enumerate() {
        let field = format!("targets[{i}]");
        if target.pod_ip.parse::<IpAddr>().is_err() {
            return Err(ValidationError::invalid(
                format!("{field}.podIp"),
                format!("{} is not an IP address", quoted(&target.pod_ip)),
            ));
        }
        // 0: bridges only (a terminal-only job; the proto's ProxyTarget.port).
        if target.port > 65535 {
            return Err(ValidationError::invalid(
                format!("{field}.port"),
                format!("port {} is outside 0..=65535", target.port),
            ));
        }
        if !names::is_dns_subdomain(&target.hostname) {
            return Err(ValidationError::invalid(
                format!("{field}.hostname"),
                format!("{} is not a DNS-1123 subdomain", quoted(&target.hostname)),
            ));
        }
        if event.targets[..i].iter().any(|t| t.rank == target.rank) {
            return Err(ValidationError::invalid(
                format!("{field}.rank"),
                format!("rank {} appears twice", target.rank),
            ));
        }
    }
    for (i, domain) in event.domains.iter().enumerate() {
        if !names::is_dns_subdomain(domain) {
            return Err(ValidationError::invalid(
                format!("domains[{i}]"),
                format!("{} is not a DNS-1123 subdomain", quoted(domain)),
            ));
        }
    }
    required_timestamp("timestamp", event.timestamp.as_ref())
}

fn required_timestamp(field: &str, t: Option<&pbjson_types::Timestamp>) -> Check {
    match t {
        None => Err(ValidationError::missing(field)),
        Some(t) => timestamp(field, t),
    }
}

fn non_empty(field: &str, value: &str) -> Check {
    if value.is_empty() {
        return Err(ValidationError::missing(field));
    }
    Ok(())
}
