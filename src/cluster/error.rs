//! What went wrong talking to the cluster, classified by what the caller should do about it.
//!
//! The one question every caller asks is: *may this succeed if I try again later?* A transient problem
//! (the API server is down, overloaded, slow, or our write raced another one) is [`ErrorClass::Retryable`]:
//! retry with backoff, and after the budget requeue the message. It never becomes a FAILURE event. A
//! rejection (the object is invalid, a webhook denied it, we are not allowed) is
//! [`ErrorClass::Permanent`]: retrying cannot help, and the cluster's own message goes into the FAILURE
//! event so the user can act on it.

use std::time::Duration;

use kube::core::Status;

/// Whether an error may go away by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Try again later: retry with backoff, then requeue.
    Retryable,
    /// Trying again gives the same answer.
    Permanent,
}

/// An error from the cluster, keeping the cluster's own message.
///
/// `op` names what was attempted (`create jobs.batch.volcano.sh alice/j-42`) so a log line or an event is
/// self-explanatory.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClusterError {
    /// The API server could not be reached or could not serve the request now: 5xx, 429, a timeout, a
    /// refused or reset connection, credentials being rotated.
    #[error("{op}: the cluster is unavailable for now: {message}")]
    Unavailable {
        op: String,
        message: String,
        /// How long the server asked us to wait (`Retry-After`, or `retryAfterSeconds` in the Status).
        retry_after: Option<Duration>,
    },
    /// Retries of a transient error used up their time budget. Still retryable: the message goes back to
    /// the queue and is tried again later, possibly by another runner.
    #[error("gave up for now after {attempts} attempts in {elapsed:?}: {last}")]
    GaveUp {
        attempts: u32,
        elapsed: Duration,
        last: Box<ClusterError>,
    },
    /// The object changed under us (resourceVersion mismatch, 409 Conflict) or our view is too old (410
    /// Gone). Read again and retry.
    #[error("{op}: the object was changed concurrently: {message}")]
    Conflict { op: String, message: String },
    /// The object (or its namespace, or its resource type) does not exist.
    #[error("{op}: not found: {message}")]
    NotFound { op: String, message: String },
    /// An object with this name exists already (409 AlreadyExists).
    #[error("{op}: already exists: {message}")]
    AlreadyExists { op: String, message: String },
    /// The cluster refused the request: invalid object (422), bad request (400), forbidden (403), an
    /// admission webhook's denial (for Volcano, for example a closed queue). `message` is the cluster's.
    #[error("{op}: the cluster rejected it ({code} {reason}): {message}")]
    Rejected {
        op: String,
        code: u16,
        reason: String,
        message: String,
    },
    /// A request could not be built or a response not understood: a bug on one side, not a job's fault.
    #[error("{op}: {message}")]
    Internal { op: String, message: String },
    /// The client could not be configured (no kubeconfig, bad URL, TLS setup).
    #[error("cluster configuration: {0}")]
    Config(String),
}

/// `e`'s message followed by those of its sources, each once (a source whose words its parent already
/// quotes is left out).
pub fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let words = cause.to_string();
        if !words.is_empty() && !text.contains(&words) {
            text.push_str(": ");
            text.push_str(&words);
        }
        source = cause.source();
    }
    text
}

impl ClusterError {
    /// Classifies a kube client error. `op` says what was being done.
    pub fn from_kube(op: impl Into<String>, err: kube::Error) -> Self {
        let op = op.into();
        match err {
            kube::Error::Api(status) => Self::from_status(op, &status),
            kube::Error::HyperError(e) => Self::unavailable(op, &e),
            kube::Error::Service(e) => Self::unavailable(op, &*e),
            kube::Error::ReadEvents(e) => Self::unavailable(op, &e),
            // Tokens are refreshed from files and exec plugins that can fail for a moment; a broken setup
            // is caught at start by the version probe, not by failing jobs.
            kube::Error::Auth(e) => Self::unavailable(op, &e),
            kube::Error::SerdeError(e) => Self::Internal {
                op,
                message: format!("response not understood: {e}"),
            },
            e @ (kube::Error::FromUtf8(_)
            | kube::Error::LinesCodecMaxLineLengthExceeded
            | kube::Error::HttpError(_)
            | kube::Error::BuildRequest(_)) => Self::Internal {
                op,
                message: e.to_string(),
            },
            other => Self::Config(format!("{op}: {other}")),
        }
    }

    /// Classifies an API error from its Status (the body every Kubernetes error carries).
    pub fn from_status(op: impl Into<String>, status: &Status) -> Self {
        let op = op.into();
        let message = if status.message.is_empty() {
            status.reason.clone()
        } else {
            status.message.clone()
        };
        let retry_after = status
            .details
            .as_ref()
            .map(|d| d.retry_after_seconds)
            .filter(|s| *s > 0)
            .map(|s| Duration::from_secs(u64::from(s)));
        match status.code {
            429 | 500..=599 | 408 => Self::Unavailable {
                op,
                message,
                retry_after,
            },
            // Expired or rotating credentials: not the job's fault, and not permanent either.
            401 => Self::Unavailable {
                op,
                message,
                retry_after: None,
            },
            409 if status.is_already_exists() => Self::AlreadyExists { op, message },
            409 | 410 => Self::Conflict { op, message },
            404 => Self::NotFound { op, message },
            403 if namespace_terminating(status) => Self::Unavailable {
                op,
                message,
                retry_after: None,
            },
            code @ 400..=499 => Self::Rejected {
                op,
                code,
                reason: status.reason.clone(),
                message,
            },
            code => Self::Internal {
                op,
                message: format!("unexpected status {code}: {message}"),
            },
        }
    }

    /// The error and its causes: an HTTP client's `client error (Connect)` says nothing until its cause
    /// (`dns error: failed to lookup address information`, `Connection refused`) is added.
    fn unavailable(op: String, e: &(dyn std::error::Error + 'static)) -> Self {
        Self::Unavailable {
            op,
            message: with_causes(e),
            retry_after: None,
        }
    }

    /// Whether trying again later may help. See the module documentation.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Unavailable { .. } | Self::GaveUp { .. } | Self::Conflict { .. } => {
                ErrorClass::Retryable
            }
            Self::NotFound { .. }
            | Self::AlreadyExists { .. }
            | Self::Rejected { .. }
            | Self::Internal { .. }
            | Self::Config(_) => ErrorClass::Permanent,
        }
    }

    /// Shorthand for `class() == Retryable`.
    pub fn is_retryable(&self) -> bool {
        self.class() == ErrorClass::Retryable
    }

    /// How long the server asked us to wait before the next attempt, if it said.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Unavailable { retry_after, .. } => *retry_after,
            Self::GaveUp { last, .. } => last.retry_after(),
            _ => None,
        }
    }

    /// The cluster's own words, for a FAILURE event: without our `op` prefix.
    pub fn cluster_message(&self) -> &str {
        match self {
            Self::Unavailable { message, .. }
            | Self::Conflict { message, .. }
            | Self::NotFound { message, .. }
            | Self::AlreadyExists { message, .. }
            | Self::Rejected { message, .. }
            | Self::Internal { message, .. } => message,
            Self::GaveUp { last, .. } => last.cluster_message(),
            Self::Config(message) => message,
        }
    }

    /// Whether this is a 404.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    /// Whether this is a 409 AlreadyExists.
    pub fn is_already_exists(&self) -> bool {
        matches!(self, Self::AlreadyExists { .. })
    }

    /// Whether the cluster refused the request for want of a permission (403, not a namespace being
    /// deleted, which is classified as unavailable).
    pub fn is_forbidden(&self) -> bool {
        match self {
            Self::Rejected { code, .. } => *code == 403,
            Self::GaveUp { last, .. } => last.is_forbidden(),
            _ => false,
        }
    }

    /// Whether this is an optimistic-concurrency conflict (409 Conflict or 410 Gone).
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Conflict { .. })
    }

    /// A short, fixed label for metrics and logs (never an id).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Unavailable { .. } => "unavailable",
            Self::GaveUp { .. } => "gave_up",
            Self::Conflict { .. } => "conflict",
            Self::NotFound { .. } => "not_found",
            Self::AlreadyExists { .. } => "already_exists",
            Self::Rejected { .. } => "rejected",
            Self::Internal { .. } => "internal",
            Self::Config(_) => "config",
        }
    }
}

/// A namespace being deleted refuses new objects with 403; that passes once it is gone and we recreate it.
fn namespace_terminating(status: &Status) -> bool {
    let by_cause = status
        .details
        .as_ref()
        .is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"));
    by_cause || status.message.contains("because it is being terminated")
}

/// `.classify(op)` on a kube result: turns `kube::Error` into [`ClusterError`] with what was attempted.
pub trait KubeResultExt<T> {
    /// Classifies the error, naming the operation.
    fn classify(self, op: impl FnOnce() -> String) -> Result<T, ClusterError>;
}

impl<T> KubeResultExt<T> for Result<T, kube::Error> {
    fn classify(self, op: impl FnOnce() -> String) -> Result<T, ClusterError> {
        self.map_err(|e| ClusterError::from_kube(op(), e))
    }
}

#[cfg(test)]
mod tests {
    use kube::core::response::{StatusCause, StatusDetails};

    use super::*;

    fn status(code: u16, reason: &str, message: &str) -> Status {
        Status::failure(message, reason).with_code(code)
    }

    fn details(retry_after_seconds: u32, causes: Vec<StatusCause>) -> StatusDetails {
        StatusDetails {
            name: String::new(),
            group: String::new(),
            kind: String::new(),
            uid: String::new(),
            causes,
            retry_after_seconds,
        }
    }

    #[test]
    fn server_trouble_is_retryable() {
        for code in [500, 502, 503, 504, 408] {
            let e = ClusterError::from_status("get x", &status(code, "InternalError", "boom"));
            assert_eq!(e.class(), ErrorClass::Retryable, "{code}");
            assert!(matches!(e, ClusterError::Unavailable { .. }));
        }
    }

    #[test]
    fn too_many_requests_keeps_retry_after() {
        let s = status(429, "TooManyRequests", "slow down").with_details(details(7, vec![]));
        let e = ClusterError::from_status("create x", &s);
        assert!(e.is_retryable());
        assert_eq!(e.retry_after(), Some(Duration::from_secs(7)));
        let plain = ClusterError::from_status("create x", &status(429, "TooManyRequests", "x"));
        assert_eq!(plain.retry_after(), None);
    }

    #[test]
    fn rejections_are_permanent_and_keep_the_clusters_words() {
        let webhook = "admission webhook \"validatejob.volcano.sh\" denied the request: \
                       can only submit job to queue with state `Open`, queue `q` status is `Closed`";
        for (code, reason, message) in [
            (422, "Invalid", "spec.tasks[0].replicas: Invalid value: -1"),
            (400, "BadRequest", webhook),
            (403, "Forbidden", "jobs is forbidden: User cannot create"),
        ] {
            let e = ClusterError::from_status("create j-1", &status(code, reason, message));
            assert_eq!(e.class(), ErrorClass::Permanent, "{code}");
            assert_eq!(e.cluster_message(), message);
            assert!(matches!(e, ClusterError::Rejected { code: c, .. } if c == code));
        }
    }

    #[test]
    fn conflicts_and_existence() {
        let exists = ClusterError::from_status("c", &status(409, "AlreadyExists", "exists"));
        assert!(exists.is_already_exists());
        assert_eq!(exists.class(), ErrorClass::Permanent);
        let conflict = ClusterError::from_status("u", &status(409, "Conflict", "rv"));
        assert!(conflict.is_conflict());
        assert!(conflict.is_retryable());
        let gone = ClusterError::from_status("w", &status(410, "Gone", "too old"));
        assert!(gone.is_conflict());
        let missing = ClusterError::from_status("g", &status(404, "NotFound", "nope"));
        assert!(missing.is_not_found());
        assert_eq!(missing.class(), ErrorClass::Permanent);
    }

    #[test]
    fn a_terminating_namespace_is_transient() {
        let by_message = status(
            403,
            "Forbidden",
            "unable to create new content in namespace alice because it is being terminated",
        );
        assert!(ClusterError::from_status("c", &by_message).is_retryable());
        let cause = StatusCause {
            reason: "NamespaceTerminating".into(),
            message: String::new(),
            field: String::new(),
        };
        let by_cause = status(403, "Forbidden", "no").with_details(details(0, vec![cause]));
        assert!(ClusterError::from_status("c", &by_cause).is_retryable());
    }

    #[test]
    fn transport_errors_are_retryable_and_serde_is_not() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = ClusterError::from_kube("get", kube::Error::Service(Box::new(io)));
        assert!(e.is_retryable());
        assert!(e.to_string().contains("refused"));
        let bad_json = serde_json::from_str::<u8>("x").unwrap_err();
        let e = ClusterError::from_kube("get", kube::Error::SerdeError(bad_json));
        assert_eq!(e.class(), ErrorClass::Permanent);
    }

    #[test]
    fn gave_up_stays_retryable_and_reports_the_last_cause() {
        let last =
            ClusterError::from_status("create x", &status(503, "ServiceUnavailable", "down"));
        let e = ClusterError::GaveUp {
            attempts: 4,
            elapsed: Duration::from_secs(30),
            last: Box::new(last),
        };
        assert!(e.is_retryable());
        assert_eq!(e.cluster_message(), "down");
        assert!(e.to_string().contains("4 attempts"));
    }
}
