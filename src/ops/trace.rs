//! W3C Trace Context: the `traceparent` an orchestrator puts on a message is continued through the
//! runner's spans, onto every message the runner publishes for that job, and onto the VolcanoJob as an
//! annotation, so that the monitor (possibly on another runner, days later) continues the same trace.
//!
//! The format is `version-traceid-parentid-flags`, e.g. `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`
//! (W3C Trace Context, section 3.2): lower-case hex only; a trace id or parent id of all zeros is
//! invalid; version `ff` is invalid; a version above `00` may carry more fields after the flags, which
//! are ignored. An invalid header is not an error for the message: the runner starts a new trace and
//! says so in a debug log, as the specification asks (a receiver must not fail on a bad header).
//!
//! How the runner uses it:
//! - inbound: [`TraceContext::continue_from`] the delivery's `traceparent` header (or a new root);
//! - spans: [`message_span`] and [`job_span`] carry `job_id`, `trace_id` and `span_id` as fields, so
//!   every log line inside names the trace;
//! - outbound: `Outbound::with_traceparent(ctx.child().traceparent())`;
//! - on the VolcanoJob: [`annotation_key`] with `ctx.traceparent()`; the monitor reads it back with
//!   [`TraceContext::from_annotations`] and publishes its events as children of it.

use std::collections::BTreeMap;
use std::fmt;

/// The suffix of the VolcanoJob annotation that carries the trace (after the configured prefix,
/// `ucloud.dk/` by default).
pub const ANNOTATION: &str = "traceparent";

/// The AMQP header (and HTTP header) name, as W3C Trace Context names it.
pub const HEADER: &str = "traceparent";

/// The flag bit that says the caller recorded its span (W3C `sampled`).
const SAMPLED: u8 = 0x01;

/// A 16-byte trace id, never all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId([u8; 16]);

/// An 8-byte span id, never all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId([u8; 8]);

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceId({self})")
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpanId({self})")
    }
}

fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    for b in bytes {
        write!(f, "{b:02x}")?;
    }
    Ok(())
}

/// Why a `traceparent` value was not usable. The runner then starts a new trace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceParentError {
    #[error("traceparent must be version-traceid-parentid-flags, 55 characters for version 00")]
    Shape,
    #[error("traceparent {field} must be {len} lower-case hex digits")]
    Hex { field: &'static str, len: usize },
    #[error("traceparent version ff is invalid")]
    ForbiddenVersion,
    #[error("traceparent {field} must not be all zeros")]
    Zero { field: &'static str },
}

/// One span's place in a trace: the trace id, this span's id, the id of the span that caused it (when it
/// came from outside), and the trace flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    trace_id: TraceId,
    span_id: SpanId,
    parent_id: Option<SpanId>,
    flags: u8,
}

impl TraceContext {
    /// Parses a `traceparent` value as received: the span it names is the *parent*. The result is that
    /// remote span itself (call [`child`](Self::child) to continue from it).
    pub fn parse(header: &str) -> Result<Self, TraceParentError> {
        let value = header.trim_matches([' ', '\t']);
        let bytes = value.as_bytes();
        // Every valid value is ASCII. Checked first, so the fixed offsets below slice at character
        // boundaries whatever the sender put in: a multi-byte character there is a bad header, never a panic.
        if bytes.len() < 55 || !value.is_ascii() {
            return Err(TraceParentError::Shape);
        }
        let version = hex_field(&value[0..2], "version")?;
        if version[0] == 0xff {
            return Err(TraceParentError::ForbiddenVersion);
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return Err(TraceParentError::Shape);
        }
        // Version 00 is exactly 55 characters; a later version may append `-more`, which we ignore.
        if (version[0] == 0 && bytes.len() != 55) || (bytes.len() > 55 && bytes[55] != b'-') {
            return Err(TraceParentError::Shape);
        }
        let trace: [u8; 16] = hex_field(&value[3..35], "trace-id")?
            .try_into()
            .map_err(|_| TraceParentError::Shape)?;
        let span: [u8; 8] = hex_field(&value[36..52], "parent-id")?
            .try_into()
            .map_err(|_| TraceParentError::Shape)?;
        let flags = hex_field(&value[53..55], "trace-flags")?[0];
        if trace == [0; 16] {
            return Err(TraceParentError::Zero { field: "trace-id" });
        }
        if span == [0; 8] {
            return Err(TraceParentError::Zero { field: "parent-id" });
        }
        Ok(Self {
            trace_id: TraceId(trace),
            span_id: SpanId(span),
            parent_id: None,
            flags,
        })
    }

    /// A new trace, for a message that came without a (usable) `traceparent`. Marked sampled: nothing
    /// upstream decided otherwise.
    pub fn new_root() -> Self {
        Self {
            trace_id: TraceId(random_nonzero::<16>()),
            span_id: SpanId(random_nonzero::<8>()),
            parent_id: None,
            flags: SAMPLED,
        }
    }

    /// The context for work caused by this span: same trace and flags, a new span id, this span as parent.
    pub fn child(&self) -> Self {
        Self {
            trace_id: self.trace_id,
            span_id: SpanId(random_nonzero::<8>()),
            parent_id: Some(self.span_id),
            flags: self.flags,
        }
    }

    /// The context for handling an inbound message: a child of the sender's span when `header` is a
    /// valid `traceparent`, else a new trace (the reason is logged at debug level, without the value).
    pub fn continue_from(header: Option<&str>) -> Self {
        match header.map(Self::parse) {
            Some(Ok(parent)) => parent.child(),
            Some(Err(why)) => {
                tracing::debug!(%why, "ignoring the message's traceparent; starting a new trace");
                Self::new_root()
            }
            None => Self::new_root(),
        }
    }

    /// The trace recorded on a VolcanoJob (`<prefix>traceparent`), continued: a child of the span that
    /// created the job. `None` when the job has no (valid) trace annotation.
    pub fn from_annotations(annotations: &BTreeMap<String, String>, prefix: &str) -> Option<Self> {
        annotations
            .get(&annotation_key(prefix))
            .and_then(|v| Self::parse(v).ok())
            .map(|parent| parent.child())
    }

    /// The `traceparent` header value for this span (always version 00).
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-{:02x}", self.trace_id, self.span_id, self.flags)
    }

    pub fn trace_id(&self) -> TraceId {
        self.trace_id
    }

    /// This span's id.
    pub fn span_id(&self) -> SpanId {
        self.span_id
    }

    /// The span this one continues, when it continues one.
    pub fn parent_id(&self) -> Option<SpanId> {
        self.parent_id
    }

    /// Whether the caller asked for this trace to be recorded.
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }
}

/// The annotation key for a prefix (`ucloud.dk/` gives `ucloud.dk/traceparent`).
pub fn annotation_key(prefix: &str) -> String {
    format!("{prefix}{ANNOTATION}")
}

/// The span around the handling of one inbound message. Every log line inside carries the message type,
/// the job id and the trace.
pub fn message_span(message_type: &str, job_id: &str, ctx: &TraceContext) -> tracing::Span {
    tracing::info_span!(
        "message",
        r#type = message_type,
        job_id,
        trace_id = %ctx.trace_id(),
        span_id = %ctx.span_id(),
    )
}

/// The span around the monitor's work on one job (a pass over it, a tick, its cleanup).
pub fn job_span(job_id: &str, ctx: &TraceContext) -> tracing::Span {
    tracing::info_span!(
        "job",
        job_id,
        trace_id = %ctx.trace_id(),
        span_id = %ctx.span_id(),
    )
}

fn hex_field(text: &str, field: &'static str) -> Result<Vec<u8>, TraceParentError> {
    let err = TraceParentError::Hex {
        field,
        len: text.len(),
    };
    if !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(err);
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).map_err(|_| err.clone()))
        .collect()
}

fn random_nonzero<const N: usize>() -> [u8; N] {
    loop {
        let mut bytes = [0u8; N];
        bytes.iter_mut().for_each(|b| *b = fastrand::u8(..));
        if bytes != [0; N] {
            return bytes;
        }
    }
}

/// A well-formed `traceparent` header value, passed on unchanged from an inbound message to everything it
/// causes (the events published about it, the VolcanoJob's annotation and the monitor's events from it).
/// Well-formed means what [`TraceContext::parse`] accepts: the one parser of the header in the program. A
/// value that is not well-formed is dropped rather than spread (a consumer's tracer would reject it anyway).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent(String);

impl TraceParent {
    /// The value, trimmed of surrounding blanks, when [`TraceContext::parse`] accepts it.
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim_matches([' ', '\t']);
        TraceContext::parse(value).ok()?;
        Some(Self(value.to_owned()))
    }

    /// The header value.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_specification_example() {
        let ctx = TraceContext::parse(VALID).unwrap();
        assert_eq!(
            ctx.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(ctx.span_id().to_string(), "00f067aa0ba902b7");
        assert!(ctx.sampled());
        assert_eq!(ctx.traceparent(), VALID);
        let unsampled = TraceContext::parse(&VALID.replace("-01", "-00")).unwrap();
        assert!(!unsampled.sampled());
    }

    #[test]
    fn rejects_what_the_specification_rejects() {
        let cases = [
            ("", TraceParentError::Shape),
            (&VALID[..54], TraceParentError::Shape),
            // Version 00 must be exactly 55 characters.
            (&format!("{VALID}-x"), TraceParentError::Shape),
            (
                &VALID.replace("00-4b", "ff-4b"),
                TraceParentError::ForbiddenVersion,
            ),
            (
                &VALID.replace("4bf9", "4BF9"),
                TraceParentError::Hex {
                    field: "trace-id",
                    len: 32,
                },
            ),
            (
                &VALID.replace("00f0", "00g0"),
                TraceParentError::Hex {
                    field: "parent-id",
                    len: 16,
                },
            ),
            (
                &VALID.replace("-01", "-0x"),
                TraceParentError::Hex {
                    field: "trace-flags",
                    len: 2,
                },
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                TraceParentError::Zero { field: "trace-id" },
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                TraceParentError::Zero { field: "parent-id" },
            ),
            (&VALID.replace('-', "_"), TraceParentError::Shape),
            // A multi-byte character across a field's fixed offsets (55 bytes, as a hostile sender made
            // it): a bad header, not a slice through a character.
            (&format!("0é{}", "x".repeat(52)), TraceParentError::Shape),
            (
                &format!("00-{}é{}", "a".repeat(31), &VALID[35..]),
                TraceParentError::Shape,
            ),
            (&format!("{}é", &VALID[..53]), TraceParentError::Shape),
        ];
        for (value, expected) in cases {
            assert_eq!(TraceContext::parse(value), Err(expected), "{value:?}");
        }
    }

    #[test]
    fn later_versions_may_carry_more_fields() {
        let future = format!("{}-what-comes-next", VALID.replacen("00", "01", 1));
        let ctx = TraceContext::parse(&future).unwrap();
        assert_eq!(
            ctx.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        // What we send is always version 00.
        assert_eq!(ctx.traceparent(), VALID);
        let glued = format!("{}x", VALID.replacen("00", "01", 1));
        assert_eq!(TraceContext::parse(&glued), Err(TraceParentError::Shape));
        assert!(TraceContext::parse(&format!(" {VALID}\t")).is_ok());
    }

    #[test]
    fn a_child_continues_the_trace_with_a_new_span() {
        let parent = TraceContext::parse(VALID).unwrap();
        let child = parent.child();
        assert_eq!(child.trace_id(), parent.trace_id());
        assert_ne!(child.span_id(), parent.span_id());
        assert_eq!(child.parent_id(), Some(parent.span_id()));
        assert_eq!(child.sampled(), parent.sampled());
        // What the child sends parses back to the child.
        let echoed = TraceContext::parse(&child.traceparent()).unwrap();
        assert_eq!(echoed.span_id(), child.span_id());
    }

    #[test]
    fn continue_from_falls_back_to_a_new_trace() {
        let continued = TraceContext::continue_from(Some(VALID));
        assert_eq!(
            continued.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        let a = TraceContext::continue_from(Some("garbage"));
        let b = TraceContext::continue_from(None);
        assert_ne!(a.trace_id(), b.trace_id());
        assert!(a.sampled() && b.parent_id().is_none());
        assert!(TraceContext::parse(&a.traceparent()).is_ok());
    }

    #[test]
    fn annotations_round_trip() {
        let ctx = TraceContext::parse(VALID).unwrap();
        let mut annotations = BTreeMap::new();
        annotations.insert(annotation_key("ucloud.dk/"), ctx.traceparent());
        let read = TraceContext::from_annotations(&annotations, "ucloud.dk/").unwrap();
        assert_eq!(read.trace_id(), ctx.trace_id());
        assert_eq!(read.parent_id(), Some(ctx.span_id()));
        assert!(TraceContext::from_annotations(&annotations, "example.org/").is_none());
        annotations.insert(annotation_key("x/"), "nonsense".into());
        assert!(TraceContext::from_annotations(&annotations, "x/").is_none());
    }
}

#[cfg(test)]
mod traceparent_tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn well_formed_values_pass_unchanged() {
        assert_eq!(TraceParent::parse(GOOD).unwrap().as_str(), GOOD);
        assert_eq!(
            TraceParent::parse(&format!(" {GOOD} ")).unwrap().as_str(),
            GOOD
        );
        let future = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
        assert!(TraceParent::parse(future).is_some());
    }

    #[test]
    fn malformed_values_are_dropped() {
        for bad in [
            "",
            "garbage",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            assert!(TraceParent::parse(bad).is_none(), "{bad:?}");
        }
    }
}
