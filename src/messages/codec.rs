//! Bytes to typed messages and back, in either wire format.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::v1;

/// The two encodings of every message. A runner accepts both on every queue; the AMQP `content_type`
/// says which one a delivery uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// The proto3 JSON mapping: lowerCamelCase names, enums as strings, 64-bit integers as strings.
    Json,
    /// The protobuf binary encoding.
    Protobuf,
}

impl Format {
    /// Both formats, JSON first.
    pub const ALL: [Format; 2] = [Format::Json, Format::Protobuf];

    /// The AMQP `content_type` a publisher sets for this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Protobuf => "application/x-protobuf",
        }
    }

    /// The format an AMQP `content_type` names. Parameters (`; charset=utf-8`) and case are ignored;
    /// `application/protobuf` is accepted as well as `application/x-protobuf`.
    pub fn from_content_type(content_type: &str) -> Result<Format, DecodeError> {
        let essence = content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            "application/json" => Ok(Format::Json),
            "application/x-protobuf" | "application/protobuf" => Ok(Format::Protobuf),
            _ => Err(DecodeError::UnsupportedContentType(content_type.to_owned())),
        }
    }

    /// The format a file's extension implies: `.json` for JSON; `.binpb`, `.pb`, `.bin` or `.protobuf`
    /// for protobuf. `None` for anything else.
    pub fn from_path(path: &Path) -> Option<Format> {
        let extension = path.extension()?.to_str()?.to_ascii_lowercase();
        match extension.as_str() {
            "json" => Some(Format::Json),
            "binpb" | "pb" | "bin" | "protobuf" => Some(Format::Protobuf),
            _ => None,
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Json => "json",
            Format::Protobuf => "protobuf",
        })
    }
}

impl FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "json" => Ok(Format::Json),
            "protobuf" | "proto" | "pb" | "binpb" => Ok(Format::Protobuf),
            _ => Err(format!("unknown format {s:?}: expected json or protobuf")),
        }
    }
}

/// The messages of the contract. The AMQP `type` property carries [`MessageType::amqp_type`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MessageType {
    SubmitJob,
    CancelJob,
    ExtendJob,
    JobEvent,
    AccountingTick,
    ProxyEvent,
    OpenSession,
    SessionReply,
}

impl MessageType {
    /// Every message, inbound first, then outbound, then the session request and its reply.
    pub const ALL: [MessageType; 8] = [
        MessageType::SubmitJob,
        MessageType::CancelJob,
        MessageType::ExtendJob,
        MessageType::JobEvent,
        MessageType::AccountingTick,
        MessageType::ProxyEvent,
        MessageType::OpenSession,
        MessageType::SessionReply,
    ];

    /// The protobuf message name, e.g. `SubmitJob`.
    pub fn name(self) -> &'static str {
        match self {
            MessageType::SubmitJob => "SubmitJob",
            MessageType::CancelJob => "CancelJob",
            MessageType::ExtendJob => "ExtendJob",
            MessageType::JobEvent => "JobEvent",
            MessageType::AccountingTick => "AccountingTick",
            MessageType::ProxyEvent => "ProxyEvent",
            MessageType::OpenSession => "OpenSession",
            MessageType::SessionReply => "SessionReply",
        }
    }

    /// The AMQP `type` property: the fully qualified protobuf name, e.g. `volcano_runner.v1.SubmitJob`.
    pub fn amqp_type(self) -> &'static str {
        match self {
            MessageType::SubmitJob => "volcano_runner.v1.SubmitJob",
            MessageType::CancelJob => "volcano_runner.v1.CancelJob",
            MessageType::ExtendJob => "volcano_runner.v1.ExtendJob",
            MessageType::JobEvent => "volcano_runner.v1.JobEvent",
            MessageType::AccountingTick => "volcano_runner.v1.AccountingTick",
            MessageType::ProxyEvent => "volcano_runner.v1.ProxyEvent",
            MessageType::OpenSession => "volcano_runner.v1.OpenSession",
            MessageType::SessionReply => "volcano_runner.v1.SessionReply",
        }
    }

    /// The message an AMQP `type` property names; only the fully qualified name is accepted there.
    pub fn from_amqp_type(type_name: &str) -> Option<MessageType> {
        MessageType::ALL
            .into_iter()
            .find(|t| t.amqp_type() == type_name)
    }

    /// The kebab-case stem of the message's files: the schema is `schemas/<stem>.schema.json`, and
    /// examples are named `<stem>.<anything>.json`.
    pub fn file_stem(self) -> &'static str {
        match self {
            MessageType::SubmitJob => "submit-job",
            MessageType::CancelJob => "cancel-job",
            MessageType::ExtendJob => "extend-job",
            MessageType::JobEvent => "job-event",
            MessageType::AccountingTick => "accounting-tick",
            MessageType::ProxyEvent => "proxy-event",
            MessageType::OpenSession => "open-session",
            MessageType::SessionReply => "session-reply",
        }
    }

    /// The message a file holds, judged by its name: `submit-job.json`, `submit-job.figlet.json`,
    /// `cancel-job.pb`, ... `None` when the name starts with no known stem.
    pub fn from_file_name(path: &Path) -> Option<MessageType> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        MessageType::ALL.into_iter().find(|t| {
            name.strip_prefix(t.file_stem())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        })
    }

    /// Whether runners consume this message from the jobs queues (as opposed to publishing it).
    /// `OpenSession` is consumed too, from a queue of its own ([`crate::sessions`]), and answered with a
    /// `SessionReply`.
    pub fn is_inbound(self) -> bool {
        matches!(
            self,
            MessageType::SubmitJob | MessageType::CancelJob | MessageType::ExtendJob
        )
    }
}

impl fmt::Display for MessageType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.amqp_type())
    }
}

impl FromStr for MessageType {
    type Err = String;

    /// Accepts the AMQP name (`volcano_runner.v1.SubmitJob`), the short name (`SubmitJob`, any case)
    /// or the file stem (`submit-job`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MessageType::ALL
            .into_iter()
            .find(|t| s == t.amqp_type() || s.eq_ignore_ascii_case(t.name()) || s == t.file_stem())
            .ok_or_else(|| {
                let names: Vec<&str> = MessageType::ALL.iter().map(|t| t.name()).collect();
                format!(
                    "unknown message type {s:?}: expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// A message of the contract: a prost type with the proto3 JSON mapping.
pub trait Contract: prost::Message + Default + Serialize + DeserializeOwned {
    /// Which message this is.
    const TYPE: MessageType;
}

impl Contract for v1::SubmitJob {
    const TYPE: MessageType = MessageType::SubmitJob;
}
impl Contract for v1::CancelJob {
    const TYPE: MessageType = MessageType::CancelJob;
}
impl Contract for v1::ExtendJob {
    const TYPE: MessageType = MessageType::ExtendJob;
}
impl Contract for v1::JobEvent {
    const TYPE: MessageType = MessageType::JobEvent;
}
impl Contract for v1::AccountingTick {
    const TYPE: MessageType = MessageType::AccountingTick;
}
impl Contract for v1::ProxyEvent {
    const TYPE: MessageType = MessageType::ProxyEvent;
}
impl Contract for v1::OpenSession {
    const TYPE: MessageType = MessageType::OpenSession;
}
impl Contract for v1::SessionReply {
    const TYPE: MessageType = MessageType::SessionReply;
}

/// Why bytes are not a message. Every variant is permanent: redelivering the same bytes cannot help,
/// so a runner dead-letters the delivery with [`DecodeError::reason`] in a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The delivery has no `content_type`.
    MissingContentType,
    /// The `content_type` is neither JSON nor protobuf.
    UnsupportedContentType(String),
    /// The delivery has no `type` property.
    MissingType,
    /// The `type` property names no message of the contract.
    UnknownType(String),
    /// The message exists but runners do not consume it (for example a `JobEvent` on the jobs queue).
    NotInbound(MessageType),
    /// The JSON is malformed or does not fit the message. `field` is the path of the offending value
    /// (`application.parameters[0].type`), `None` when the document itself is broken.
    /// `line` and `column` are 0 when the position is unknown (an error found after fields holding
    /// `null` were taken out).
    Json {
        field: Option<String>,
        message: String,
        line: usize,
        column: usize,
    },
    /// The protobuf bytes do not decode; prost's message names the field where it can.
    Protobuf { message: String },
}

impl DecodeError {
    /// The path of the offending value, when the error is about one value of a JSON document.
    pub fn field(&self) -> Option<&str> {
        match self {
            DecodeError::Json { field, .. } => field.as_deref(),
            _ => None,
        }
    }

    /// A short machine-readable code, for dead-letter headers and the `reason` of a FAILURE event.
    pub fn reason(&self) -> &'static str {
        match self {
            DecodeError::MissingContentType => "missing_content_type",
            DecodeError::UnsupportedContentType(_) => "unsupported_content_type",
            DecodeError::MissingType => "missing_message_type",
            DecodeError::UnknownType(_) => "unknown_message_type",
            DecodeError::NotInbound(_) => "not_inbound",
            DecodeError::Json { .. } => "invalid_json",
            DecodeError::Protobuf { .. } => "invalid_protobuf",
        }
    }

    fn from_json(
        path: Option<&serde_path_to_error::Path>,
        error: &serde_json::Error,
        document: &[u8],
    ) -> DecodeError {
        // serde_json appends " at line L column C"; keep the message without it and carry the position.
        let text = error.to_string();
        let position = format!(" at line {} column {}", error.line(), error.column());
        let mut message = text.strip_suffix(&position).unwrap_or(&text).to_owned();
        // A syntax or end-of-input error is about the document, whatever value the parser was in.
        let path =
            path.filter(|p| p.iter().next().is_some() && !error.is_syntax() && !error.is_eof());
        if let Some(path) = path {
            // pbjson reads numbers through an untagged enum whose error says nothing useful.
            if message.starts_with("data did not match any variant of untagged enum") {
                message = "expected a number that fits this field (or a string holding one)".into();
            }
            if let Some(value) = json_value_at(document, path) {
                let shown = value.to_string();
                if !value.is_object() && !value.is_array() && !message.contains(&shown) {
                    let shown: String = shown.chars().take(64).collect();
                    message = format!("{message}, got {shown}");
                }
            }
        }
        let field = path.map(|p| p.to_string());
        DecodeError::Json {
            field,
            message,
            line: error.line(),
            column: error.column(),
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let known: Vec<&str> = MessageType::ALL
            .iter()
            .filter(|t| t.is_inbound())
            .map(|t| t.amqp_type())
            .collect();
        match self {
            DecodeError::MissingContentType => f.write_str(
                "no content type: set content_type to application/json or application/x-protobuf",
            ),
            DecodeError::UnsupportedContentType(ct) => write!(
                f,
                "unsupported content type {ct:?}: use application/json or application/x-protobuf"
            ),
            DecodeError::MissingType => {
                write!(
                    f,
                    "no message type: set type to one of {}",
                    known.join(", ")
                )
            }
            DecodeError::UnknownType(t) => write!(
                f,
                "unknown message type {t:?}: expected one of {}",
                known.join(", ")
            ),
            DecodeError::NotInbound(t) => write!(
                f,
                "{} is published by runners, not consumed by them; expected one of {}",
                t.amqp_type(),
                known.join(", ")
            ),
            DecodeError::Json {
                field: Some(field),
                message,
                line: 0,
                ..
            } => write!(f, "{field}: {message}"),
            DecodeError::Json {
                field: Some(field),
                message,
                line,
                column,
            } => write!(f, "{field}: {message} (line {line}, column {column})"),
            DecodeError::Json {
                field: None,
                message,
                line,
                column,
            } => write!(f, "invalid JSON: {message} (line {line}, column {column})"),
            DecodeError::Protobuf { message } => write!(f, "invalid protobuf: {message}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Why a message could not be encoded. Only JSON can fail: an enum number the contract does not name,
/// or a timestamp outside years 0001-9999. [`crate::validate`] rejects both in inbound messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot encode {message_type} as JSON: {message}")]
pub struct EncodeError {
    pub message_type: MessageType,
    pub message: String,
}

/// Decodes one message of a known type.
pub fn decode<M: Contract>(format: Format, bytes: &[u8]) -> Result<M, DecodeError> {
    match format {
        Format::Json => decode_json::<M>(bytes),
        Format::Protobuf => M::decode(bytes).map_err(|e| DecodeError::Protobuf {
            message: e
                .to_string()
                .trim_start_matches("failed to decode Protobuf message: ")
                .to_owned(),
        }),
    }
}

/// Decodes a JSON document; a document the decoder refuses only for a field that holds `null` is decoded
/// again with those fields at their defaults, as the proto3 JSON mapping says (see [`super::nulls`]).
fn decode_json<M: Contract>(bytes: &[u8]) -> Result<M, DecodeError> {
    let error = match decode_json_as_is::<M>(bytes) {
        Ok(message) => return Ok(message),
        Err(error) => error,
    };
    let Ok(mut document) = serde_json::from_slice::<serde_json::Value>(bytes) else {
        return Err(error);
    };
    let full_name = format!(".{}", M::TYPE.amqp_type());
    if !super::nulls::strip(&mut document, &full_name) {
        return Err(error);
    }
    let stripped = serde_json::to_vec(&document).unwrap_or_default();
    let mut deserializer = serde_json::Deserializer::from_slice(&stripped);
    match serde_path_to_error::deserialize::<_, M>(&mut deserializer) {
        Ok(message) => Ok(message),
        // The first error was about a null that is now gone: the next problem is the one to report. Its
        // position is in the document without the nulls, so none is given.
        Err(e) if error_at_null(&error, bytes) => {
            let mut next = DecodeError::from_json(Some(e.path()), e.inner(), &stripped);
            if let DecodeError::Json { line, column, .. } = &mut next {
                (*line, *column) = (0, 0);
            }
            Err(next)
        }
        Err(_) => Err(error),
    }
}

/// Whether a decode error is about a value that is `null` in the document.
fn error_at_null(error: &DecodeError, document: &[u8]) -> bool {
    let Some(field) = error.field() else {
        return false;
    };
    let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(document) else {
        return false;
    };
    // The field path as serde_path_to_error writes it: `a.b[2].c`.
    for part in field.split('.') {
        let (key, indices) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        value = match value.as_object_mut().and_then(|o| o.remove(key)) {
            Some(v) => v,
            None => return false,
        };
        for index in indices.split(['[', ']']).filter(|s| !s.is_empty()) {
            let Some(i) = index.parse::<usize>().ok() else {
                return false;
            };
            value = match value.as_array_mut() {
                Some(items) if i < items.len() => items.swap_remove(i),
                _ => return false,
            };
        }
    }
    value.is_null()
}

fn decode_json_as_is<M: DeserializeOwned>(bytes: &[u8]) -> Result<M, DecodeError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let message: M = serde_path_to_error::deserialize(&mut deserializer)
        .map_err(|e| DecodeError::from_json(Some(e.path()), e.inner(), bytes))?;
    // Trailing characters after the document are an error, as in serde_json::from_slice.
    deserializer
        .end()
        .map_err(|e| DecodeError::from_json(None, &e, bytes))?;
    Ok(message)
}

/// The value at `path` in a JSON document, to show what was sent when it does not fit.
fn json_value_at(document: &[u8], path: &serde_path_to_error::Path) -> Option<serde_json::Value> {
    use serde_path_to_error::Segment;
    let mut value: serde_json::Value = serde_json::from_slice(document).ok()?;
    for segment in path.iter() {
        value = match segment {
            Segment::Map { key } => value.as_object_mut()?.remove(key)?,
            Segment::Seq { index } => {
                let items = value.as_array_mut()?;
                (*index < items.len()).then(|| items.swap_remove(*index))?
            }
            Segment::Enum { .. } | Segment::Unknown => return None,
        };
    }
    Some(value)
}

/// Encodes one message. JSON output is compact and omits fields that hold their default value, as the
/// proto3 JSON mapping says.
pub fn encode<M: Contract>(format: Format, message: &M) -> Result<Vec<u8>, EncodeError> {
    match format {
        Format::Json => serde_json::to_vec(message).map_err(|e| EncodeError {
            message_type: M::TYPE,
            message: e.to_string(),
        }),
        Format::Protobuf => Ok(message.encode_to_vec()),
    }
}

/// A message a runner consumes.
#[derive(Debug, Clone, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "one short-lived value per delivery; boxing would only add an allocation"
)]
pub enum Inbound {
    Submit(v1::SubmitJob),
    Cancel(v1::CancelJob),
    Extend(v1::ExtendJob),
}

impl Inbound {
    /// Whether it belongs on the submit queue (the others go on the control queue).
    pub fn is_submission(&self) -> bool {
        matches!(self, Inbound::Submit(_))
    }

    /// The job the message is about (not yet validated).
    pub fn job_id(&self) -> &str {
        match self {
            Inbound::Submit(m) => &m.job_id,
            Inbound::Cancel(m) => &m.job_id,
            Inbound::Extend(m) => &m.job_id,
        }
    }

    /// Which message this is.
    pub fn message_type(&self) -> MessageType {
        match self {
            Inbound::Submit(_) => MessageType::SubmitJob,
            Inbound::Cancel(_) => MessageType::CancelJob,
            Inbound::Extend(_) => MessageType::ExtendJob,
        }
    }
}

/// Decodes a delivery from the jobs exchange, from its AMQP `type` and `content_type` properties.
///
/// ```
/// use volcano_runner::messages::{Inbound, decode_inbound};
///
/// let body = br#"{"jobId": "4818", "reason": "Cancelled by bob"}"#;
/// let message = decode_inbound(
///     Some("volcano_runner.v1.CancelJob"),
///     Some("application/json"),
///     body,
/// )?;
/// let Inbound::Cancel(cancel) = message else { panic!("a CancelJob") };
/// assert_eq!(cancel.reason.as_deref(), Some("Cancelled by bob"));
///
/// let err = decode_inbound(
///     Some("volcano_runner.v1.CancelJob"),
///     Some("application/json"),
///     br#"{"jobId": 4818}"#,
/// )
/// .unwrap_err();
/// assert_eq!(err.field(), Some("jobId"));
/// assert_eq!(err.reason(), "invalid_json");
/// # Ok::<(), volcano_runner::messages::DecodeError>(())
/// ```
pub fn decode_inbound(
    type_name: Option<&str>,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Inbound, DecodeError> {
    let type_name = type_name.ok_or(DecodeError::MissingType)?;
    let message_type = MessageType::from_amqp_type(type_name)
        .ok_or_else(|| DecodeError::UnknownType(type_name.to_owned()))?;
    let format = Format::from_content_type(content_type.ok_or(DecodeError::MissingContentType)?)?;
    match decode_any(message_type, format, body)? {
        AnyMessage::SubmitJob(m) => Ok(Inbound::Submit(m)),
        AnyMessage::CancelJob(m) => Ok(Inbound::Cancel(m)),
        AnyMessage::ExtendJob(m) => Ok(Inbound::Extend(m)),
        other => Err(DecodeError::NotInbound(other.message_type())),
    }
}

/// Any message of the contract, for tools that handle all of them (`volcano-runner validate`).
#[derive(Debug, Clone, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "one short-lived value per message a tool reads; boxing would only add an allocation"
)]
pub enum AnyMessage {
    SubmitJob(v1::SubmitJob),
    CancelJob(v1::CancelJob),
    ExtendJob(v1::ExtendJob),
    JobEvent(v1::JobEvent),
    AccountingTick(v1::AccountingTick),
    ProxyEvent(v1::ProxyEvent),
    OpenSession(v1::OpenSession),
    SessionReply(v1::SessionReply),
}

impl AnyMessage {
    /// Which message this is.
    pub fn message_type(&self) -> MessageType {
        match self {
            AnyMessage::SubmitJob(_) => MessageType::SubmitJob,
            AnyMessage::CancelJob(_) => MessageType::CancelJob,
            AnyMessage::ExtendJob(_) => MessageType::ExtendJob,
            AnyMessage::JobEvent(_) => MessageType::JobEvent,
            AnyMessage::AccountingTick(_) => MessageType::AccountingTick,
            AnyMessage::ProxyEvent(_) => MessageType::ProxyEvent,
            AnyMessage::OpenSession(_) => MessageType::OpenSession,
            AnyMessage::SessionReply(_) => MessageType::SessionReply,
        }
    }

    /// Encodes the message in `format`.
    pub fn encode(&self, format: Format) -> Result<Vec<u8>, EncodeError> {
        match self {
            AnyMessage::SubmitJob(m) => encode(format, m),
            AnyMessage::CancelJob(m) => encode(format, m),
            AnyMessage::ExtendJob(m) => encode(format, m),
            AnyMessage::JobEvent(m) => encode(format, m),
            AnyMessage::AccountingTick(m) => encode(format, m),
            AnyMessage::ProxyEvent(m) => encode(format, m),
            AnyMessage::OpenSession(m) => encode(format, m),
            AnyMessage::SessionReply(m) => encode(format, m),
        }
    }
}

/// Decodes a message whose type is known from elsewhere (a header, a file name, a flag).
pub fn decode_any(
    message_type: MessageType,
    format: Format,
    bytes: &[u8],
) -> Result<AnyMessage, DecodeError> {
    Ok(match message_type {
        MessageType::SubmitJob => AnyMessage::SubmitJob(decode(format, bytes)?),
        MessageType::CancelJob => AnyMessage::CancelJob(decode(format, bytes)?),
        MessageType::ExtendJob => AnyMessage::ExtendJob(decode(format, bytes)?),
        MessageType::JobEvent => AnyMessage::JobEvent(decode(format, bytes)?),
        MessageType::AccountingTick => AnyMessage::AccountingTick(decode(format, bytes)?),
        MessageType::ProxyEvent => AnyMessage::ProxyEvent(decode(format, bytes)?),
        MessageType::OpenSession => AnyMessage::OpenSession(decode(format, bytes)?),
        MessageType::SessionReply => AnyMessage::SessionReply(decode(format, bytes)?),
    })
}

/// The job id of an inbound message that may not decode, so that a FAILURE event can still name the job.
///
/// JSON: the top-level `jobId` (or `job_id`) string of any object. Protobuf: field 1, which is `job_id` in
/// every inbound message, found by walking the wire format as far as it is intact. The id is *not*
/// validated: check it with [`crate::validate::job_id`] before using it in a name.
pub fn peek_job_id(format: Format, bytes: &[u8]) -> Option<String> {
    let id = match format {
        Format::Json => {
            let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
            let object = value.as_object()?;
            object
                .get("jobId")
                .or_else(|| object.get("job_id"))?
                .as_str()?
                .to_owned()
        }
        Format::Protobuf => peek_protobuf_field_1(bytes)?,
    };
    (!id.is_empty()).then_some(id)
}

fn peek_protobuf_field_1(mut buf: &[u8]) -> Option<String> {
    use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint, skip_field};
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).ok()?;
        if tag == 1 && wire_type == WireType::LengthDelimited {
            let len = usize::try_from(decode_varint(&mut buf).ok()?).ok()?;
            let bytes = buf.get(..len)?;
            return String::from_utf8(bytes.to_vec()).ok();
        }
        skip_field(wire_type, tag, &mut buf, DecodeContext::default()).ok()?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AMQP `content_type` picks the format; parameters and case do not matter, and anything else
    /// is an error that names what was sent.
    #[test]
    fn content_types() {
        assert_eq!(
            Format::from_content_type("application/json; charset=utf-8"),
            Ok(Format::Json)
        );
        assert_eq!(
            Format::from_content_type("Application/X-Protobuf"),
            Ok(Format::Protobuf)
        );
        let err = Format::from_content_type("text/plain").unwrap_err();
        assert_eq!(err.reason(), "unsupported_content_type");
        assert!(err.to_string().contains("\"text/plain\""), "{err}");
        for format in Format::ALL {
            assert_eq!(Format::from_content_type(format.content_type()), Ok(format));
        }
    }

    /// File names map to message types by their stem, and extensions to formats.
    #[test]
    fn file_names() {
        let p = Path::new;
        assert_eq!(
            MessageType::from_file_name(p("schemas/examples/submit-job.figlet.json")),
            Some(MessageType::SubmitJob)
        );
        assert_eq!(
            MessageType::from_file_name(p("job-event.json")),
            Some(MessageType::JobEvent)
        );
        assert_eq!(MessageType::from_file_name(p("submit-jobs.json")), None);
        assert_eq!(MessageType::from_file_name(p("figlet.json")), None);
        assert_eq!(Format::from_path(p("x.binpb")), Some(Format::Protobuf));
        assert_eq!(Format::from_path(p("x.JSON")), Some(Format::Json));
        assert_eq!(Format::from_path(p("x.yaml")), None);
    }

    /// Every spelling of a message type parses back to it, and the AMQP name is the only one accepted
    /// on the wire.
    #[test]
    fn message_type_names() {
        for t in MessageType::ALL {
            assert_eq!(t.amqp_type().parse::<MessageType>(), Ok(t));
            assert_eq!(t.name().parse::<MessageType>(), Ok(t));
            assert_eq!(t.file_stem().parse::<MessageType>(), Ok(t));
            assert_eq!(MessageType::from_amqp_type(t.amqp_type()), Some(t));
            assert_eq!(MessageType::from_amqp_type(t.name()), None);
        }
        assert!("Submit".parse::<MessageType>().is_err());
    }

    /// A JSON error names the path of the value that is wrong, and where it is.
    #[test]
    fn json_error_names_the_field() {
        let body = br#"{"jobId": "42", "product": {"id": "u1", "cpu": -2}}"#;
        let err = decode::<v1::SubmitJob>(Format::Json, body).unwrap_err();
        assert_eq!(err.field(), Some("product.cpu"), "{err}");
        assert_eq!(err.reason(), "invalid_json");
        assert_eq!(
            err.to_string(),
            "product.cpu: expected a number that fits this field (or a string holding one), \
             got -2 (line 1, column 50)"
        );
        let err = decode::<v1::SubmitJob>(Format::Json, br#"{"replicas": "two"}"#).unwrap_err();
        assert_eq!(err.field(), Some("replicas"), "{err}");
        assert!(err.to_string().contains(r#"got "two""#), "{err}");
    }

    /// A broken document is not blamed on a field; trailing garbage is an error too.
    #[test]
    fn json_syntax_errors() {
        let err = decode::<v1::CancelJob>(Format::Json, br#"{"jobId": "42""#).unwrap_err();
        assert_eq!(err.field(), None, "{err}");
        assert!(err.to_string().starts_with("invalid JSON: "), "{err}");
        let err = decode::<v1::CancelJob>(Format::Json, br#"{"jobId": "42"} x"#).unwrap_err();
        assert_eq!(err.field(), None, "{err}");
    }

    /// Well-known types in JSON: timestamps are read in any RFC 3339 form and written as `+00:00`;
    /// durations are seconds with an `s` suffix.
    #[test]
    fn well_known_types_in_json() {
        let body = br#"{"jobId": "1", "timeAllocation": "1.5s", "submittedAt": "2026-11-22T10:15:02.5+01:00"}"#;
        let job: v1::SubmitJob = decode(Format::Json, body).unwrap();
        let d = job.time_allocation.unwrap();
        assert_eq!((d.seconds, d.nanos), (1, 500_000_000));
        let json = String::from_utf8(encode(Format::Json, &job).unwrap()).unwrap();
        assert_eq!(
            json,
            r#"{"jobId":"1","timeAllocation":"1.500s","submittedAt":"2026-11-22T09:15:02.500+00:00"}"#
        );
        let z: v1::SubmitJob = decode(
            Format::Json,
            br#"{"submittedAt": "2026-11-22T09:15:02.500Z"}"#,
        )
        .unwrap();
        assert_eq!(z.submitted_at, job.submitted_at);
        let whole: v1::ExtendJob = decode(Format::Json, br#"{"extension": "3600s"}"#).unwrap();
        assert_eq!(
            String::from_utf8(encode(Format::Json, &whole).unwrap()).unwrap(),
            r#"{"extension":"3600s"}"#
        );
    }

    /// Unknown fields are rejected in JSON, so a typo in a field name is caught.
    #[test]
    fn json_unknown_field() {
        let err = decode::<v1::CancelJob>(Format::Json, br#"{"jobID": "42"}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `jobID`"), "{err}");
    }

    /// Protobuf errors carry prost's message, and a truncated message does not decode.
    #[test]
    fn protobuf_errors() {
        let job = v1::CancelJob {
            job_id: "42".into(),
            reason: Some("no longer needed".into()),
        };
        let bytes = encode(Format::Protobuf, &job).unwrap();
        assert_eq!(decode::<v1::CancelJob>(Format::Protobuf, &bytes), Ok(job));
        let err = decode::<v1::CancelJob>(Format::Protobuf, &bytes[..bytes.len() - 3]).unwrap_err();
        assert_eq!(err.reason(), "invalid_protobuf");
        assert!(err.to_string().starts_with("invalid protobuf: "), "{err}");
    }

    /// decode_inbound reads the AMQP properties: type first, then content type, and refuses outbound
    /// messages.
    #[test]
    fn inbound_properties() {
        let body = br#"{"jobId": "42"}"#;
        let cancel = decode_inbound(
            Some("volcano_runner.v1.CancelJob"),
            Some("application/json"),
            body,
        )
        .unwrap();
        assert_eq!(cancel.message_type(), MessageType::CancelJob);
        assert_eq!(cancel.job_id(), "42");
        assert_eq!(
            decode_inbound(None, Some("application/json"), body),
            Err(DecodeError::MissingType)
        );
        assert_eq!(
            decode_inbound(Some("volcano_runner.v1.CancelJob"), None, body),
            Err(DecodeError::MissingContentType)
        );
        assert_eq!(
            decode_inbound(Some("CancelJob"), Some("application/json"), body),
            Err(DecodeError::UnknownType("CancelJob".into()))
        );
        assert_eq!(
            decode_inbound(
                Some("volcano_runner.v1.JobEvent"),
                Some("application/json"),
                body
            ),
            Err(DecodeError::NotInbound(MessageType::JobEvent))
        );
    }

    /// The job id can be read from messages that fail to decode further on.
    #[test]
    fn peek_job_id_from_broken_messages() {
        let json = br#"{"jobId": "4817", "replicas": "two"}"#;
        assert!(decode::<v1::SubmitJob>(Format::Json, json).is_err());
        assert_eq!(peek_job_id(Format::Json, json).as_deref(), Some("4817"));
        assert_eq!(peek_job_id(Format::Json, b"not json"), None);
        assert_eq!(peek_job_id(Format::Json, br#"{"jobId": 7}"#), None);

        let job = v1::SubmitJob {
            job_id: "4817".into(),
            replicas: 2,
            ..Default::default()
        };
        let mut bytes = encode(Format::Protobuf, &job).unwrap();
        // Field 6 (replicas) first, then garbage after the job id: the walk stops at the id.
        bytes.extend_from_slice(&[0xff, 0xff]);
        assert!(decode::<v1::SubmitJob>(Format::Protobuf, &bytes).is_err());
        assert_eq!(
            peek_job_id(Format::Protobuf, &bytes).as_deref(),
            Some("4817")
        );
        assert_eq!(peek_job_id(Format::Protobuf, &[0x0a, 0x05, b'4']), None);
    }
}
