//! Validation of decoded messages: a layer of its own after decoding.
//!
//! Decoding ([`crate::messages`]) guarantees the shape of a message; this module decides whether it makes
//! sense, before anything reaches the cluster. Each rejection is a [`ValidationError`] that names the
//! field by its path in the proto3 JSON form (`parameters.threads`, `resources[1].file.path`,
//! `application.invocation[0].var.variableNames[2]`) and says what is wrong, so the person who wrote the
//! message can fix it. Validation is pure and never panics, whatever the input.
//!
//! # Rules for `SubmitJob`
//! - `jobId`: `j-<jobId>` is a DNS-1123 label (lower-case letters, digits and `-`, at most 63
//!   characters), and so is the host name of the job's last pod, `j-<jobId>-job-<replicas-1>`, because
//!   Volcano's svc plugin uses pod names as host names.
//! - `owner.user` is present; `owner.project`, when given, is not empty.
//! - `replicas` is at least 1 and at most `limits.max_replicas`.
//! - `product`: id and category present; `cpu` and `memoryGib` at least 1 (a product without them would
//!   make a pod with zero requests, which is BestEffort and cannot be charged), `gpu` any.
//! - `application`: name, version and a well-formed image reference (see [`image`]); a known application
//!   type; a web port for WEB and a VNC port for VNC applications, ports in 1..=65535; parameter
//!   definitions with unique names, known types, finite bounds with min <= max, enumerations with options;
//!   environment variable names as Kubernetes accepts them ([`names::is_env_var_name`]); every parameter the
//!   invocation or environment templates use is declared, and `boolFlag` uses boolean parameters only.
//! - `parameters`: every value belongs to a declared parameter and has a variant its type takes
//!   (text and textarea → `text` or `textarea`, integer → `integer`, floating point → `floatingPoint`
//!   (finite) or `integer`, boolean → `boolean`, enumeration → `enumeration` (or `text`) naming an
//!   option by its name or, as the original took it, by its value (`-O3`), input file and input
//!   directory → `file`, peer → `peer`, license server → `licenseServer`, ingress → `ingress`, network
//!   IP → `networkIp`); numbers lie within the declared min/max; every non-optional parameter has a value.
//!   Which variant a type takes and how an option is found are the Parameter plugin's rules
//!   ([`parameters::accepts`], [`parameters::option`]),
//!   used here as they are: one place.
//! - Storage paths (file values, `outputFolder`, `openedFile`) are absolute, name something below the
//!   root, and have no `.` or `..` component.
//! - `openedFile` lies inside a folder the job mounts: an input file or folder, or the output folder.
//! - Peers: host names are peer host names ([`names::is_peer_hostname`]: a name the job's pods resolve
//!   by search domain, so a DNS-1035 label, and not `j-...`, which Volcano's own names use) and job ids
//!   valid job ids. License servers: the id is
//!   in `licenses`. Ingresses: the domain is a DNS-1123 subdomain. Network IPs: a valid IP address and
//!   port ranges within 1..=65535 with a protocol. Ingresses and network IPs need `replicas` = 1.
//! - `timeAllocation`, when given, is positive and at most [`TIME_ALLOCATION_MAX_SECONDS`] (100 years);
//!   timestamps are within the proto3 range.
//!
//! # Rules for `CancelJob` and `ExtendJob`
//! A valid job id; for an extension, a `requestId` of 1 to 128 letters, digits, `.`, `_`, `:` or `-`
//! (it is stored on the VolcanoJob to apply each request once) and a positive `extension` of at most
//! [`TIME_ALLOCATION_MAX_SECONDS`] (the runner also refuses an extension that would take the job's
//! allocation past it, which only the job's current allocation can tell).

pub mod image;
pub mod names;
mod outbound;
pub mod parameters;
mod sessions;
mod submit;
pub mod text;

use std::fmt;

use pbjson_types::{Duration, Timestamp};

use crate::messages::AnyMessage;
use crate::messages::v1::{CancelJob, ExtendJob, SubmitJob};

pub use outbound::{accounting_tick, job_event, proxy_event};
pub use sessions::{open_session, session_reply};

/// Why a message was rejected: the field path, what is wrong, and a machine-readable kind.
///
/// Display is `<field>: <message>`, e.g. `parameters.threads: expected integer, got text "four"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationError {
    field: String,
    /// What is wrong with the field, in words for the person who wrote the message.
    pub message: String,
    kind: ErrorKind,
}

/// The class of a validation error, for machines: dead-letter headers, FAILURE event reasons, metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A required field is absent or empty.
    Missing,
    /// A field's value breaks a rule.
    Invalid,
    /// A value or a template names a parameter the application does not declare.
    UnknownParameter,
    /// A parameter value's variant does not match the parameter's declared type.
    WrongParameterType,
    /// A license server id that the runner's `licenses` table does not know.
    UnknownLicense,
    /// A configured limit is exceeded (replicas).
    LimitExceeded,
    /// Well-formed, but not supported (ingress or public IPs with several replicas).
    Unsupported,
}

impl ErrorKind {
    /// The short code, e.g. `invalid_field`.
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::Missing => "missing_field",
            ErrorKind::Invalid => "invalid_field",
            ErrorKind::UnknownParameter => "unknown_parameter",
            ErrorKind::WrongParameterType => "wrong_parameter_type",
            ErrorKind::UnknownLicense => "unknown_license",
            ErrorKind::LimitExceeded => "limit_exceeded",
            ErrorKind::Unsupported => "unsupported",
        }
    }
}

impl ValidationError {
    /// An error of `kind` about `field`.
    pub fn new(kind: ErrorKind, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
            kind,
        }
    }

    pub(crate) fn missing(field: impl Into<String>) -> Self {
        Self::new(ErrorKind::Missing, field, "required, but absent or empty")
    }

    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, field, message)
    }

    pub(crate) fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }

    /// The path of the offending field in the proto3 JSON form, e.g. `parameters.threads`.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong, without the field path.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The class of the error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The machine-readable reason code (`invalid_field`, `unknown_license`, ...), which the runner puts
    /// into FAILURE events and dead-letter headers.
    pub fn reason(&self) -> &'static str {
        self.kind.code()
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for ValidationError {}

/// Checks a submission against the rules in the module documentation and the runner's configuration
/// (`limits.max_replicas`, `licenses`). Returns the first problem found.
///
/// ```
/// use volcano_runner::config::Config;
/// use volcano_runner::messages::{Format, decode, v1::SubmitJob};
///
/// let example = include_bytes!("../../schemas/examples/submit-job.figlet.json");
/// let mut job: SubmitJob = decode(Format::Json, example).unwrap();
/// assert!(volcano_runner::validate::submit(&job, &Config::default()).is_ok());
///
/// job.replicas = 0;
/// let err = volcano_runner::validate::submit(&job, &Config::default()).unwrap_err();
/// assert_eq!(err.to_string(), "replicas: must be at least 1");
/// assert_eq!((err.field(), err.reason()), ("replicas", "invalid_field"));
/// ```
pub fn submit<'a>(job: &SubmitJob, rules: impl Into<Rules<'a>>) -> Result<(), ValidationError> {
    submit::check(job, &rules.into())
}

/// What validation takes from the runner's configuration: the replica limit and the license server ids
/// (`[limits]`, `[licenses]`). The whole configuration converts into it, so callers pass `&config`.
#[derive(Debug, Clone, Default)]
pub struct Rules<'a> {
    /// `limits.max_replicas`.
    pub max_replicas: u32,
    /// The ids of `[licenses]`, in order.
    pub license_ids: Vec<&'a str>,
}

/// Checks a cancellation: the job id must be one a job can have. An unknown job is not an error here.
pub fn cancel(cancel: &CancelJob) -> Result<(), ValidationError> {
    job_id(&cancel.job_id)
}

/// Checks an extension: job id, request id, and a positive extension of at most
/// [`TIME_ALLOCATION_MAX_SECONDS`]. An extension over the bound is [`ErrorKind::LimitExceeded`], as is one
/// that would take a job's allocation past it (which the runner finds when it applies it).
pub fn extend(extend: &ExtendJob) -> Result<(), ValidationError> {
    job_id(&extend.job_id)?;
    request_id("requestId", &extend.request_id)?;
    match &extend.extension {
        None => Err(ValidationError::missing("extension")),
        Some(d) => time_allocation("extension", d),
    }
}

/// Checks any message of the contract with the check for its type: [`submit`], [`cancel`], [`extend`],
/// [`job_event`], [`accounting_tick`] or [`proxy_event`].
pub fn message<'a>(
    message: &AnyMessage,
    rules: impl Into<Rules<'a>>,
) -> Result<(), ValidationError> {
    match message {
        AnyMessage::SubmitJob(m) => submit(m, rules),
        AnyMessage::CancelJob(m) => cancel(m),
        AnyMessage::ExtendJob(m) => extend(m),
        AnyMessage::JobEvent(m) => job_event(m),
        AnyMessage::AccountingTick(m) => accounting_tick(m),
        AnyMessage::ProxyEvent(m) => proxy_event(m),
        AnyMessage::OpenSession(m) => open_session(m),
        AnyMessage::SessionReply(m) => session_reply(m),
    }
}

/// The longest job id: the first pod's host name `j-<jobId>-job-0` must be a DNS-1123 label of at most
/// 63 characters. (A job of more than ten ranks needs a shorter id, which the submission's validation
/// checks against its replica count.) The schemas' `JobId` says the same.
pub const JOB_ID_MAX: usize = names::DNS_LABEL_MAX - "j-".len() - "-job-0".len();

/// The longest job id a rejection event still carries as it was sent (valid or not): the event id
/// `<jobId>/rejected/<fingerprint16>` must fit an AMQP message id of 255 bytes.
pub const READABLE_JOB_ID_MAX: usize = 200;

/// Checks that a job id makes valid Kubernetes names: `j-<id>` and the first pod's host name must be
/// DNS-1123 labels. The error names the field `jobId`.
pub fn job_id(id: &str) -> Result<(), ValidationError> {
    job_id_at("jobId", id)
}

/// Whether a message's job id, valid or not, can be named in an event about the message: not empty, at
/// most [`READABLE_JOB_ID_MAX`] bytes, no control characters.
pub fn readable_job_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= READABLE_JOB_ID_MAX && !id.chars().any(char::is_control)
}

pub(crate) fn job_id_at(field: &str, id: &str) -> Result<(), ValidationError> {
    if id.is_empty() {
        return Err(ValidationError::missing(field));
    }
    let name = format!("j-{id}");
    if id.chars().count() > JOB_ID_MAX {
        return Err(ValidationError::invalid(
            field,
            format!(
                "job id is {} characters long; at most {JOB_ID_MAX} fit, because the first pod's host \
                 name j-<jobId>-job-0 must be a DNS-1123 label of at most {} characters",
                id.chars().count(),
                names::DNS_LABEL_MAX
            ),
        ));
    }
    if !names::is_dns_label(&name) {
        return Err(ValidationError::invalid(
            field,
            format!(
                "job id {} must consist of lower-case letters, digits and '-', and end with a letter \
                 or digit, because j-<jobId> must be a DNS-1123 label",
                quoted(id)
            ),
        ));
    }
    Ok(())
}

fn request_id(field: &str, id: &str) -> Result<(), ValidationError> {
    if id.is_empty() {
        return Err(ValidationError::missing(field));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
    if id.len() > 128 || !id.chars().all(allowed) {
        return Err(ValidationError::invalid(
            field,
            format!(
                "request id {} must be 1 to 128 letters, digits, '.', '_', ':' or '-'",
                quoted(id)
            ),
        ));
    }
    Ok(())
}

/// The longest time allocation, in seconds: 100 calendar years, counted generously as 36,600 days. One
/// bound for a submission's `timeAllocation`, for one extension, and for the allocation a job reaches
/// after its extensions (the runner refuses an extension past it). Far above any real job's, it keeps
/// the job's expiry (its start plus its allocation) an instant that can be computed and written: a
/// 10,000-year allocation, which the proto3 range allows, left a job that never expired. The schemas'
/// `TimeAllocation` pattern states the same bound.
pub const TIME_ALLOCATION_MAX_SECONDS: i64 = 36_600 * 24 * 3600;

/// The range of `google.protobuf.Timestamp`: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999999Z.
const TIMESTAMP_SECONDS: std::ops::RangeInclusive<i64> = -62_135_596_800..=253_402_300_799;
/// The range of `google.protobuf.Duration`: about ±10 000 years.
const DURATION_SECONDS_MAX: i64 = 315_576_000_000;

pub(crate) fn timestamp(field: &str, t: &Timestamp) -> Result<(), ValidationError> {
    if !TIMESTAMP_SECONDS.contains(&t.seconds) || !(0..1_000_000_000).contains(&t.nanos) {
        return Err(ValidationError::invalid(
            field,
            format!(
                "timestamp out of range (seconds {}, nanos {}): it must lie in years 0001 to 9999",
                t.seconds, t.nanos
            ),
        ));
    }
    Ok(())
}

fn positive_duration(field: &str, d: &Duration) -> Result<(), ValidationError> {
    let in_range = d.seconds.unsigned_abs() <= DURATION_SECONDS_MAX.unsigned_abs()
        && d.nanos.unsigned_abs() < 1_000_000_000;
    let same_sign = d.seconds == 0 || d.nanos == 0 || (d.seconds < 0) == (d.nanos < 0);
    if !in_range || !same_sign {
        return Err(ValidationError::invalid(
            field,
            format!(
                "malformed duration (seconds {}, nanos {})",
                d.seconds, d.nanos
            ),
        ));
    }
    if d.seconds < 0 || d.nanos < 0 || (d.seconds == 0 && d.nanos == 0) {
        return Err(ValidationError::invalid(
            field,
            format!("must be positive, got {}", duration_text(d)),
        ));
    }
    Ok(())
}

/// A time allocation or extension: positive, and at most [`TIME_ALLOCATION_MAX_SECONDS`].
pub(crate) fn time_allocation(field: &str, d: &Duration) -> Result<(), ValidationError> {
    positive_duration(field, d)?;
    let max = TIME_ALLOCATION_MAX_SECONDS;
    if d.seconds > max || (d.seconds == max && d.nanos > 0) {
        return Err(ValidationError::new(
            ErrorKind::LimitExceeded,
            field,
            format!(
                "{} is longer than the longest time allocation, 100 years ({max}s, 36600 days)",
                duration_text(d)
            ),
        ));
    }
    Ok(())
}

fn duration_text(d: &Duration) -> String {
    if d.nanos == 0 {
        format!("{}s", d.seconds)
    } else {
        let sign = if d.seconds < 0 || d.nanos < 0 {
            "-"
        } else {
            ""
        };
        format!(
            "{sign}{}.{:09}s",
            d.seconds.unsigned_abs(),
            d.nanos.unsigned_abs()
        )
    }
}

/// A user-supplied string in a message: quoted, and cut short when long.
pub(crate) fn quoted(s: &str) -> String {
    const MAX: usize = 64;
    if s.chars().count() <= MAX {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(MAX).collect();
        format!("{head:?}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Job ids: `j-<id>-job-0` must be a DNS-1123 label, so 55 characters at most, lower case, no
    /// trailing dash.
    #[test]
    fn job_ids() {
        assert_eq!(JOB_ID_MAX, 55);
        for ok in ["4817", "a", "abc-123", &"7".repeat(55)] {
            assert_eq!(job_id(ok), Ok(()), "{ok}");
        }
        let e = job_id(&"7".repeat(56)).unwrap_err();
        assert_eq!(e.field(), "jobId");
        assert!(e.message().contains("56 characters"), "{e}");
        assert!(e.message().contains("at most 55"), "{e}");
        for bad in ["Job42", "a_b", "a-", "a.b", "é"] {
            let e = job_id(bad).unwrap_err();
            assert_eq!(
                (e.field(), e.kind()),
                ("jobId", ErrorKind::Invalid),
                "{bad}"
            );
        }
        assert_eq!(job_id("").unwrap_err().kind(), ErrorKind::Missing);
    }

    /// Extensions need a request id and a positive, well-formed duration.
    #[test]
    fn extensions() {
        let ok = ExtendJob {
            job_id: "4817".into(),
            request_id: "ext-8c1f:2".into(),
            extension: Some(Duration {
                seconds: 3600,
                nanos: 0,
            }),
        };
        assert_eq!(extend(&ok), Ok(()));
        let with = |f: fn(&mut ExtendJob)| {
            let mut e = ok.clone();
            f(&mut e);
            extend(&e).unwrap_err()
        };
        let e = with(|e| e.extension = None);
        assert_eq!((e.field(), e.kind()), ("extension", ErrorKind::Missing));
        let e = with(|e| {
            e.extension = Some(Duration {
                seconds: -60,
                nanos: 0,
            })
        });
        assert_eq!(e.to_string(), "extension: must be positive, got -60s");
        let e = with(|e| {
            e.extension = Some(Duration {
                seconds: 0,
                nanos: 0,
            })
        });
        assert_eq!(e.field(), "extension");
        let e = with(|e| {
            e.extension = Some(Duration {
                seconds: 5,
                nanos: -1,
            })
        });
        assert!(e.message().starts_with("malformed duration"), "{e}");
        let e = with(|e| e.request_id = String::new());
        assert_eq!((e.field(), e.kind()), ("requestId", ErrorKind::Missing));
        let e = with(|e| e.request_id = "a b".into());
        assert_eq!(e.field(), "requestId");
        let e = with(|e| e.job_id = "X".into());
        assert_eq!(e.field(), "jobId");
    }

    /// One bound for a submission's allocation and an extension: 100 years (36,600 days) fits, a
    /// nanosecond more does not, and the 10,000 years the proto3 range allows are refused naming the
    /// field (a job with them ran without an expiry and never expired).
    #[test]
    fn time_allocations_and_extensions_share_the_100_year_bound() {
        let d = |seconds, nanos| Duration { seconds, nanos };
        let max = TIME_ALLOCATION_MAX_SECONDS;
        assert_eq!(max, 100 * 366 * 86_400);
        let example = include_bytes!("../../schemas/examples/submit-job.figlet.json");
        let mut job: SubmitJob =
            crate::messages::decode(crate::messages::Format::Json, example).unwrap();
        let rules = Rules {
            max_replicas: 4,
            license_ids: Vec::new(),
        };
        let mut ext = ExtendJob {
            job_id: "4817".into(),
            request_id: "ext-1".into(),
            extension: None,
        };
        for ok in [d(max, 0), d(max - 1, 999_999_999), d(1, 0)] {
            job.time_allocation = Some(ok);
            assert_eq!(submit(&job, rules.clone()), Ok(()), "{ok:?}");
            ext.extension = Some(ok);
            assert_eq!(extend(&ext), Ok(()), "{ok:?}");
        }
        let ten_thousand_years = d(DURATION_SECONDS_MAX, 0);
        for over in [d(max, 1), d(max + 1, 0), ten_thousand_years] {
            job.time_allocation = Some(over);
            let e = submit(&job, rules.clone()).unwrap_err();
            assert_eq!(
                (e.field(), e.kind()),
                ("timeAllocation", ErrorKind::LimitExceeded),
                "{e}"
            );
            assert!(e.message().contains("100 years"), "{e}");
            ext.extension = Some(over);
            let e = extend(&ext).unwrap_err();
            assert_eq!(
                (e.field(), e.reason()),
                ("extension", "limit_exceeded"),
                "{e}"
            );
        }
        let e = extend(&ExtendJob {
            extension: Some(d(max + 1, 0)),
            ..ext
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "extension: 3162240001s is longer than the longest time allocation, 100 years \
             (3162240000s, 36600 days)"
        );
    }

    /// What the runner's pipeline refuses about peers and the opened file, validation refuses too, under
    /// the field the pipeline names: a job as its own peer, one host name for two peer jobs, an opened
    /// file outside every mounted folder (a folder whose name merely starts the same is not its parent).
    #[test]
    fn peers_and_the_opened_file_as_the_pipeline_sees_them() {
        use crate::messages::v1::{PeerValue, ResourceValue, resource_value};
        let example = include_bytes!("../../schemas/examples/submit-job.matlab-web.json");
        let job: SubmitJob =
            crate::messages::decode(crate::messages::Format::Json, example).unwrap();
        let rules = Rules {
            max_replicas: 4,
            license_ids: vec!["matlab-campus"],
        };
        assert_eq!(submit(&job, rules.clone()), Ok(()));
        let peer = |hostname: &str, job_id: &str| ResourceValue {
            value: Some(resource_value::Value::Peer(PeerValue {
                hostname: hostname.into(),
                job_id: job_id.into(),
            })),
        };
        let refused = |edit: &dyn Fn(&mut SubmitJob)| {
            let mut j = job.clone();
            edit(&mut j);
            submit(&j, rules.clone())
        };
        let e = refused(&|j| j.resources.push(peer("self", "4819"))).unwrap_err();
        assert_eq!(e.field(), "resources[1].peer.jobId", "{e}");
        // The parameter's peer `postgres` is job 4790; the same name for 4791 is one name too many.
        let e = refused(&|j| j.resources.push(peer("postgres", "4791"))).unwrap_err();
        assert_eq!(e.field(), "parameters.database.peer.hostname", "{e}");
        assert!(e.message().contains("already names peer job"), "{e}");
        assert_eq!(
            refused(&|j| j.resources.push(peer("postgres", "4790"))),
            Ok(())
        );

        let workspace = "/projects/neuro-imaging/Members' Files/carol/fmri-study";
        for ok in [
            format!("{workspace}/analysis.m"),
            format!("/{workspace}//sub/x.m"),
            workspace.to_owned(),
            "/projects/neuro-imaging/Members' Files/carol/Jobs/MATLAB (web)/4819/out.m".to_owned(),
        ] {
            assert_eq!(
                refused(&|j| j.opened_file = Some(ok.clone())),
                Ok(()),
                "{ok}"
            );
        }
        for bad in [
            format!("{workspace}-old/analysis.m"),
            "/projects/neuro-imaging/Members' Files/carol/notes.m".to_owned(),
        ] {
            let e = refused(&|j| j.opened_file = Some(bad.clone())).unwrap_err();
            assert_eq!(e.field(), "openedFile", "{bad}: {e}");
        }
    }

    /// Long user strings are cut in messages, so an error never carries a megabyte of input.
    #[test]
    fn quoting() {
        assert_eq!(quoted("four"), "\"four\"");
        let long = quoted(&"x".repeat(1000));
        assert!(long.len() < 80 && long.ends_with('…'), "{long}");
    }
}
