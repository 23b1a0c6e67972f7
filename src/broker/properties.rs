//! Reading what an inbound message carries besides its body: its AMQP properties and headers, as pure
//! functions of the properties lapin parsed from the wire. [`super::Delivery`] answers through them, and the
//! fuzzer (`fuzz/fuzz_targets/amqp_delivery.rs`) drives them with properties parsed from arbitrary bytes,
//! since a header is whatever the publisher put there: any AMQP value type, any bytes in a string.

use lapin::BasicProperties;
use lapin::types::AMQPValue;

use super::headers;

/// A header as it arrived.
pub fn header<'a>(properties: &'a BasicProperties, name: &str) -> Option<&'a AMQPValue> {
    properties.headers().as_ref()?.inner().get(name)
}

/// A header as text, when it is a string (long strings need not be UTF-8: invalid sequences become U+FFFD).
pub fn header_str(properties: &BasicProperties, name: &str) -> Option<String> {
    as_text(header(properties, name)?)
}

/// A value as text, when it is a string (long strings need not be UTF-8: invalid sequences become U+FFFD).
pub fn as_text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// The reason code of a message some of whose AMQP properties were not UTF-8.
pub const INVALID_PROPERTY: &str = "invalid_property";

/// The properties of a delivery that arrived with bytes that are not UTF-8 where AMQP has short strings
/// (`type`, `message_id`, `headers` for a header name, `routing_key`, ...), as the connection's
/// sanitizer named them (see [`super::sanitize`]); `None` for a delivery that arrived as sent.
pub fn invalid_properties(properties: &BasicProperties) -> Option<Vec<String>> {
    let names = header_str(properties, super::sanitize::INVALID_HEADER)?;
    Some(
        names
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect(),
    )
}

/// The dead-letter reason of a delivery whose properties `names` were not UTF-8: the runner cannot trust
/// what it would read from them, so it does not act on the message.
pub fn invalid_properties_reason(names: &[String]) -> super::DeadLetterReason {
    let list = if names.is_empty() {
        "its properties".to_owned()
    } else {
        names.join(", ")
    };
    let field = names
        .first()
        .cloned()
        .unwrap_or_else(|| "properties".into());
    super::DeadLetterReason::new(
        INVALID_PROPERTY,
        format!(
            "{field}: the AMQP property {list} carried bytes that are not UTF-8 (AMQP short strings and \
             header names must be UTF-8); invalid bytes were shown as '?' and the message was not acted on"
        ),
    )
    .with_field(field)
}

/// How often a quorum queue delivered the message before (`x-delivery-count`), from any integer type;
/// absent (or not a count) on the first delivery and on classic queues.
pub fn delivery_count(properties: &BasicProperties) -> Option<u64> {
    header(properties, headers::DELIVERY_COUNT_QUORUM).and_then(as_u64)
}

/// The `traceparent` header as text, not yet checked (see [`crate::ops::trace::TraceParent::parse`]).
pub fn traceparent(properties: &BasicProperties) -> Option<String> {
    header_str(properties, headers::TRACEPARENT)
}

/// A non-negative AMQP integer of any width; `None` for a negative one or another type.
pub fn as_u64(value: &AMQPValue) -> Option<u64> {
    match *value {
        AMQPValue::ShortShortInt(v) => u64::try_from(v).ok(),
        AMQPValue::ShortShortUInt(v) => Some(u64::from(v)),
        AMQPValue::ShortInt(v) => u64::try_from(v).ok(),
        AMQPValue::ShortUInt(v) => Some(u64::from(v)),
        AMQPValue::LongInt(v) => u64::try_from(v).ok(),
        AMQPValue::LongUInt(v) => Some(u64::from(v)),
        AMQPValue::LongLongInt(v) => u64::try_from(v).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::{FieldTable, LongString, ShortString};

    use super::*;

    fn with_header(name: &str, value: AMQPValue) -> BasicProperties {
        let mut table = FieldTable::default();
        table.insert(ShortString::from(name), value);
        BasicProperties::default().with_headers(table)
    }

    #[test]
    fn the_sanitizers_marker_names_the_properties() {
        let marked = with_header(
            crate::broker::sanitize::INVALID_HEADER,
            AMQPValue::LongString("type,headers".into()),
        );
        let names = invalid_properties(&marked).unwrap();
        assert_eq!(names, ["type", "headers"]);
        let reason = invalid_properties_reason(&names);
        assert_eq!(reason.code, INVALID_PROPERTY);
        assert_eq!(reason.field.as_deref(), Some("type"));
        assert!(
            reason.message.contains("type, headers"),
            "{}",
            reason.message
        );
        assert_eq!(invalid_properties(&BasicProperties::default()), None);
    }

    #[test]
    fn delivery_counts_read_from_any_integer_type() {
        assert_eq!(as_u64(&AMQPValue::LongLongInt(3)), Some(3));
        assert_eq!(as_u64(&AMQPValue::LongInt(2)), Some(2));
        assert_eq!(as_u64(&AMQPValue::ShortShortUInt(1)), Some(1));
        assert_eq!(as_u64(&AMQPValue::LongLongInt(-1)), None);
        assert_eq!(as_u64(&AMQPValue::LongString("3".into())), None);
        let quorum = with_header("x-delivery-count", AMQPValue::ShortInt(4));
        assert_eq!(delivery_count(&quorum), Some(4));
        assert_eq!(delivery_count(&BasicProperties::default()), None);
    }

    #[test]
    fn a_traceparent_that_is_not_utf8_is_read_lossily_and_another_type_not_at_all() {
        let bytes = with_header(
            "traceparent",
            AMQPValue::LongString(LongString::from(b"00-\xff".to_vec())),
        );
        assert_eq!(traceparent(&bytes).as_deref(), Some("00-\u{fffd}"));
        let number = with_header("traceparent", AMQPValue::LongInt(7));
        assert_eq!(traceparent(&number), None);
    }
}
