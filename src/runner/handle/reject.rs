//! Bad input: a message that cannot be decoded, or decodes but is invalid. It goes to the dead-letter queue
//! with the reason in its headers, never back to its queue (it would fail the same way forever).
//!
//! When its job id can be read (valid or not: up to 200 bytes, no control characters), the orchestrator
//! hears about it too:
//! - a bad *submission* gets a FAILURE event (`<jobId>/rejected/<fingerprint16>`), since the job will
//!   never run;
//! - a bad *cancel or extension* gets a status-only event with the same id shape: the job it names is
//!   not affected, so reporting it FAILED would be wrong.
//!
//! Both carry, as their `reason`, the same short code as the dead-letter header (`missing_field`,
//! `invalid_field`, `unknown_parameter`, `invalid_json`, `wrong_queue`, `cluster_rejected`, ...), so an
//! orchestrator can tell its users what kind of problem it was without parsing the text.
//!
//! The event is published (confirmed) before the message is dead-lettered, so a failure in between
//! redelivers the message and publishes the same event again.

use crate::broker::DeadLetterReason;
use crate::cluster::ClusterError;
use crate::messages::{DecodeError, Format, Inbound, MessageType, peek_job_id};
use crate::validate::{self, ValidationError};

use super::super::events;
use super::{Handler, Message, Settle};
use crate::durable::ids;

/// What was wrong, in the three forms the outcome needs.
struct Problem {
    /// The dead-letter reason code.
    code: String,
    /// `<field>: <what is wrong>` or the decoder's sentence.
    text: String,
    field: Option<String>,
}

/// A message that could not be decoded.
pub async fn undecodable(handler: &Handler, message: &Message<'_>, error: &DecodeError) -> Settle {
    let problem = Problem {
        code: error.reason().to_owned(),
        text: error.to_string(),
        field: error.field().map(str::to_owned),
    };
    unreadable(handler, message, problem).await
}

/// A message some of whose AMQP properties were not UTF-8 (`names`, as the connection's sanitizer found
/// them): its `type` or ids may have been altered to be readable, so nothing is done with it. It is
/// dead-lettered with `invalid_property`, and a job id readable in its body gets a FAILURE (or, for a
/// cancel or extension, a status event) like any undecodable message.
pub async fn invalid_properties(
    handler: &Handler,
    message: &Message<'_>,
    names: &[String],
) -> Settle {
    let reason = crate::broker::properties::invalid_properties_reason(names);
    let problem = Problem {
        code: reason.code,
        text: reason.message,
        field: reason.field,
    };
    unreadable(handler, message, problem).await
}

/// A message that could not be read as what it claims to be: its job id is peeked from the body (the
/// content type may be the problem; JSON is then the only format worth a guess), and what it is taken
/// to be decides the event. A cancel or extension is reported without FAILURE; anything that is not
/// one of the two (a submission, an unknown or outbound type) counts as what its queue carries.
async fn unreadable(handler: &Handler, message: &Message<'_>, problem: Problem) -> Settle {
    let format = message
        .content_type
        .and_then(|ct| Format::from_content_type(ct).ok())
        .unwrap_or(Format::Json);
    let job_id = peek_job_id(format, message.body);
    let is_submission = match message.type_name.and_then(MessageType::from_amqp_type) {
        Some(MessageType::SubmitJob) => true,
        Some(MessageType::CancelJob | MessageType::ExtendJob) => false,
        _ => message.from_submit_queue,
    };
    let fingerprint16 = ids::body_fingerprint16(message.body);
    reject(
        handler,
        message,
        job_id.as_deref(),
        is_submission,
        &fingerprint16,
        problem,
    )
    .await
}

/// Dead-letter code of a message whose effect the cluster refuses for good.
pub const CLUSTER_REJECTED: &str = "cluster_rejected";

/// The cluster refused, for good, what a message asked for (`error` is a [`ClusterError::Rejected`]):
/// the orchestrator hears about it (a FAILURE for a submission, a status event for a cancel or an
/// extension, naming `field` when the refusal is about one), and the message is dead-lettered with
/// reason `cluster_rejected` and the cluster's words. A transient error is left to [`Settle::cluster`].
pub async fn cluster_refused(
    handler: &Handler,
    message: &Message<'_>,
    subject: Subject<'_>,
    field: Option<&str>,
    error: &ClusterError,
) -> Settle {
    if !matches!(error, ClusterError::Rejected { .. }) {
        return Settle::cluster(error);
    }
    let words = format!("the cluster refused it: {}", error.cluster_message());
    let problem = Problem {
        code: CLUSTER_REJECTED.to_owned(),
        text: match field {
            Some(f) => format!("{f}: {words}"),
            None => words,
        },
        field: field.map(str::to_owned),
    };
    reject_about(handler, message, subject, problem).await
}

/// Dead-letter code of a message that arrived on a queue not meant for its type.
pub const WRONG_QUEUE: &str = "wrong_queue";

/// A message on a queue not meant for its type (a SubmitJob on the control queue, a cancel or extension
/// on the submit queue): nothing is done; it is dead-lettered with `wrong_queue`, and the orchestrator
/// hears about it like any rejected message.
pub async fn wrong_queue(handler: &Handler, message: &Message<'_>, inbound: &Inbound) -> Settle {
    let broker = &handler.config.broker;
    let (what, arrived_on, belongs_on, key) = if inbound.is_submission() {
        (
            "a SubmitJob",
            &broker.control_queue,
            &broker.submit_queue,
            "submit",
        )
    } else {
        (
            "a CancelJob or ExtendJob",
            &broker.submit_queue,
            &broker.control_queue,
            "cancel or extend",
        )
    };
    let problem = Problem {
        code: WRONG_QUEUE.to_owned(),
        text: format!(
            "{what} arrived on queue {arrived_on}; it is only handled on {belongs_on} (routing key {key})"
        ),
        field: None,
    };
    let fingerprint16 = ids::body_fingerprint16(message.body);
    let subject = Subject {
        job_id: inbound.job_id(),
        is_submission: inbound.is_submission(),
        fingerprint16: &fingerprint16,
    };
    reject_about(handler, message, subject, problem).await
}

/// The job a rejected message is about.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub job_id: &'a str,
    /// A submission (FAILURE) rather than a cancel or extension (status-only event).
    pub is_submission: bool,
    /// Identifies the content, for the event id.
    pub fingerprint16: &'a str,
}

/// A decoded message that is invalid (validation or rendering): `field` and `what` is wrong with it,
/// `code` for the dead-letter header.
pub async fn invalid(
    handler: &Handler,
    message: &Message<'_>,
    subject: Subject<'_>,
    field: &str,
    what: &str,
    code: &str,
) -> Settle {
    let problem = Problem {
        code: code.to_owned(),
        text: format!("{field}: {what}"),
        field: Some(field.to_owned()),
    };
    reject_about(handler, message, subject, problem).await
}

/// [`invalid`] for a validation error.
pub async fn invalid_by(
    handler: &Handler,
    message: &Message<'_>,
    subject: Subject<'_>,
    error: &ValidationError,
) -> Settle {
    invalid(
        handler,
        message,
        subject,
        error.field(),
        error.message(),
        error.reason(),
    )
    .await
}

/// [`reject`] for a message whose subject is known.
async fn reject_about(
    handler: &Handler,
    message: &Message<'_>,
    subject: Subject<'_>,
    problem: Problem,
) -> Settle {
    reject(
        handler,
        message,
        Some(subject.job_id),
        subject.is_submission,
        subject.fingerprint16,
        problem,
    )
    .await
}

async fn reject(
    handler: &Handler,
    message: &Message<'_>,
    job_id: Option<&str>,
    is_submission: bool,
    fingerprint16: &str,
    problem: Problem,
) -> Settle {
    // Named as the message had it, valid or not, so the orchestrator hears about every message whose id
    // it can match.
    let job_id = job_id.filter(|id| validate::readable_job_id(id));
    tracing::info!(
        job_id = job_id.unwrap_or(""),
        reason = %problem.code,
        error = %problem.text,
        "Rejected a message; it goes to the dead-letter queue."
    );
    if let Some(job_id) = job_id {
        let at = message.sent_at.unwrap_or_else(|| handler.now());
        let event = if is_submission {
            events::submission_rejected(
                job_id,
                fingerprint16,
                &problem.code,
                problem.text.clone(),
                at,
                &handler.runner_id,
            )
        } else {
            events::control_rejected(
                job_id,
                fingerprint16,
                &problem.code,
                problem.text.clone(),
                at,
                &handler.runner_id,
            )
        };
        if let Err(e) = handler.publish(&event, message.traceparent.as_ref()).await {
            return Settle::publish(&e);
        }
    }
    let mut reason = DeadLetterReason::new(problem.code, problem.text);
    if let Some(field) = problem.field {
        reason = reason.with_field(field);
    }
    Settle::DeadLetter(reason)
}
