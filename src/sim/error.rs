//! API errors as a Kubernetes API server reports them: a `Status` object with a code and a reason.
//!
//! Clients (kube, client-go, kubectl) decide what to do from `code` and `reason`, so every error the
//! simulator returns has the shape, code, reason and message text a real API server would use.

use serde_json::{Value, json};

/// One field problem, as `k8s.io/apimachinery/pkg/util/validation/field.Error` prints it.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// The path, e.g. `spec.tasks[0].replicas`.
    pub field: String,
    pub kind: FieldErrorKind,
}

/// What is wrong with a field. Each variant prints like its Go counterpart.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldErrorKind {
    /// `Invalid value: <value>: <detail>`; the value is already formatted (quoted string or number).
    Invalid { value: String, detail: String },
    /// `Required value` (optionally `: <detail>`).
    Required { detail: String },
    /// `Unsupported value: "x": supported values: "a", "b"`.
    NotSupported {
        value: String,
        supported: Vec<String>,
    },
    /// `Forbidden: <detail>`.
    Forbidden { detail: String },
    /// `Too long: may not be more than N bytes`.
    TooLong { max: usize },
    /// `Duplicate value: <value>`.
    Duplicate { value: String },
}

impl FieldError {
    /// `Invalid value: <value>: <detail>`.
    pub fn invalid(field: impl Into<String>, value: &Value, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Invalid {
                value: format_value(value),
                detail: detail.into(),
            },
        }
    }

    /// `Required value`.
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Required {
                detail: detail.into(),
            },
        }
    }

    /// `Forbidden: <detail>`.
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Forbidden {
                detail: detail.into(),
            },
        }
    }

    /// The text after `<field>: `, which is also the `message` of a Status cause.
    pub fn body(&self) -> String {
        match &self.kind {
            FieldErrorKind::Invalid { value, detail } if detail.is_empty() => {
                format!("Invalid value: {value}")
            }
            FieldErrorKind::Invalid { value, detail } => {
                format!("Invalid value: {value}: {detail}")
            }
            FieldErrorKind::Required { detail } if detail.is_empty() => {
                "Required value".to_string()
            }
            FieldErrorKind::Required { detail } => format!("Required value: {detail}"),
            FieldErrorKind::NotSupported { value, supported } => {
                let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
                format!(
                    "Unsupported value: {value}: supported values: {}",
                    list.join(", ")
                )
            }
            FieldErrorKind::Forbidden { detail } => format!("Forbidden: {detail}"),
            FieldErrorKind::TooLong { max } => {
                format!("Too long: may not be more than {max} bytes")
            }
            FieldErrorKind::Duplicate { value } => format!("Duplicate value: {value}"),
        }
    }

    fn reason(&self) -> &'static str {
        match self.kind {
            FieldErrorKind::Invalid { .. } => "FieldValueInvalid",
            FieldErrorKind::Required { .. } => "FieldValueRequired",
            FieldErrorKind::NotSupported { .. } => "FieldValueNotSupported",
            FieldErrorKind::Forbidden { .. } => "FieldValueForbidden",
            FieldErrorKind::TooLong { .. } => "FieldValueTooLong",
            FieldErrorKind::Duplicate { .. } => "FieldValueDuplicate",
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// Formats a value the way field errors print it: strings quoted, numbers and booleans bare.
pub fn format_value(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        Value::Null => "\"null\"".to_string(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Array(_) => "\"array\"".to_string(),
        Value::Object(_) => "\"object\"".to_string(),
    }
}

/// An error answer of the API: HTTP code, `reason`, message and optional details.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub code: u16,
    /// The `reason` of the Status (`NotFound`, `Conflict`, ...); empty for webhook denials.
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
    /// Seconds for the `Retry-After` header (429, 503).
    pub retry_after: Option<u64>,
}

/// Names a resource the way error messages do: `jobs.batch.volcano.sh`, `pods`.
pub fn group_resource(plural: &str, group: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// 404 NotFound: `jobs.batch.volcano.sh "j-1" not found`.
    pub fn not_found(plural: &str, group: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} {name:?} not found", group_resource(plural, group)),
        )
        .with_details(json!({"name": name, "group": group, "kind": plural}))
    }

    /// A path that names no resource (`404 page not found` in a real server, as a Status here).
    pub fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 409 AlreadyExists on create.
    pub fn already_exists(plural: &str, group: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} {name:?} already exists", group_resource(plural, group)),
        )
        .with_details(json!({"name": name, "group": group, "kind": plural}))
    }

    /// 409 Conflict with the reason after `Operation cannot be fulfilled on ...: `.
    pub fn conflict(plural: &str, group: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {name:?}: {why}",
                group_resource(plural, group)
            ),
        )
        .with_details(json!({"name": name, "group": group, "kind": plural}))
    }

    /// The optimistic-concurrency conflict of an update against a stale `resourceVersion`.
    pub fn stale(plural: &str, group: &str, name: &str) -> Self {
        Self::conflict(
            plural,
            group,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 Invalid with the field errors, as `<Kind>.<group> "<name>" is invalid: ...`.
    pub fn invalid(kind: &str, group: &str, name: &str, errors: &[FieldError]) -> Self {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let list = if errors.len() == 1 {
            errors[0].to_string()
        } else {
            let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
            format!("[{}]", all.join(", "))
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({"reason": e.reason(), "message": e.body(), "field": e.field}))
            .collect();
        Self::new(
            422,
            "Invalid",
            format!("{qualified} {name:?} is invalid: {list}"),
        )
        .with_details(json!({"name": name, "group": group, "kind": kind, "causes": causes}))
    }

    /// 422 for a request that is well-formed but cannot be applied (a failed JSON patch `test`).
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// 400 BadRequest (malformed bodies, selectors, strict field validation).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 403 Forbidden (writes into a terminating namespace).
    pub fn forbidden(plural: &str, group: &str, name: &str, why: &str) -> Self {
        Self::new(
            403,
            "Forbidden",
            format!(
                "{} {name:?} is forbidden: {why}",
                group_resource(plural, group)
            ),
        )
        .with_details(json!({"name": name, "group": group, "kind": plural}))
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 415 UnsupportedMediaType (strategic merge on a custom resource, unknown patch types).
    pub fn unsupported_media_type(content_type: &str, accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({content_type:?}) - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }

    /// 410 for a watch or continue token older than the retained history.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 429 TooManyRequests with `Retry-After` (fault injection).
    pub fn too_many_requests(retry_after: u64) -> Self {
        let mut e = Self::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.",
        )
        .with_details(json!({"retryAfterSeconds": retry_after}));
        e.retry_after = Some(retry_after);
        e
    }

    /// 500 InternalError (fault injection).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    /// 503 ServiceUnavailable, optionally with `Retry-After` (faults and unavailability windows).
    pub fn unavailable(message: impl Into<String>, retry_after: Option<u64>) -> Self {
        let mut e = Self::new(503, "ServiceUnavailable", message);
        e.retry_after = retry_after;
        if let Some(s) = retry_after {
            e.details = Some(json!({"retryAfterSeconds": s}));
        }
        e
    }

    /// A validating or mutating admission webhook said no: 400 without a reason, as the API server
    /// reports a denial that carries no code.
    pub fn webhook_denied(webhook: &str, message: &str) -> Self {
        Self::new(
            400,
            "",
            format!("admission webhook {webhook:?} denied the request: {message}"),
        )
    }

    /// The `Status` object for the response body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        if !self.reason.is_empty() {
            status["reason"] = json!(self.reason);
        }
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_message_has_the_api_server_shape() {
        let err = ApiError::invalid(
            "Job",
            "batch.volcano.sh",
            "j-1",
            &[FieldError::invalid(
                "spec.tasks[0].replicas",
                &json!("string"),
                "spec.tasks[0].replicas in body must be of type integer: \"string\"",
            )],
        );
        assert_eq!(
            err.message,
            "Job.batch.volcano.sh \"j-1\" is invalid: spec.tasks[0].replicas: Invalid value: \"string\": \
             spec.tasks[0].replicas in body must be of type integer: \"string\""
        );
        assert_eq!(err.code, 422);
        let status = err.to_status();
        assert_eq!(
            status["details"]["causes"][0]["field"],
            "spec.tasks[0].replicas"
        );
        assert_eq!(
            status["details"]["causes"][0]["reason"],
            "FieldValueInvalid"
        );
    }

    #[test]
    fn several_errors_are_bracketed() {
        let err = ApiError::invalid(
            "Pod",
            "",
            "p",
            &[
                FieldError::required("spec.containers", ""),
                FieldError::required("metadata.name", ""),
            ],
        );
        assert_eq!(
            err.message,
            "Pod \"p\" is invalid: [spec.containers: Required value, metadata.name: Required value]"
        );
    }

    #[test]
    fn not_found_names_group_resource() {
        let err = ApiError::not_found("jobs", "batch.volcano.sh", "j-9");
        assert_eq!(err.message, "jobs.batch.volcano.sh \"j-9\" not found");
        assert_eq!(
            ApiError::not_found("pods", "", "x").message,
            "pods \"x\" not found"
        );
    }

    #[test]
    fn webhook_denial_has_no_reason() {
        let status = ApiError::webhook_denied("validatejob.volcano.sh", "boom").to_status();
        assert!(status.get("reason").is_none());
        assert_eq!(status["code"], 400);
        assert_eq!(
            status["message"],
            "admission webhook \"validatejob.volcano.sh\" denied the request: boom"
        );
    }
}
