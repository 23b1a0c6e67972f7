//! W3C trace context (`traceparent`) carried from an inbound message to everything it causes: the events
//! the runner publishes and the VolcanoJob (an annotation the monitor reads for its own events).
//!
//! The runner does not start spans of its own, so it passes the context on unchanged; a value that is not
//! a well-formed `traceparent` is dropped rather than spread (a consumer's tracer would reject it anyway).

/// A well-formed `traceparent` header value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent(String);

impl TraceParent {
    /// Parses a header value: `<version>-<trace-id>-<parent-id>-<flags>` in lower-case hex (2, 32, 16 and 2
    /// digits), version not `ff`, ids not all zeros. Version 00 must have exactly four fields; a later
    /// version may append more, which are kept.
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        let mut parts = value.split('-');
        let version = parts.next()?;
        let trace_id = parts.next()?;
        let parent_id = parts.next()?;
        let flags = parts.next()?;
        let more = parts.next().is_some();
        let hex = |s: &str, len: usize| {
            s.len() == len
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let zero = |s: &str| s.bytes().all(|b| b == b'0');
        let ok = hex(version, 2)
            && version != "ff"
            && !(version == "00" && more)
            && hex(trace_id, 32)
            && !zero(trace_id)
            && hex(parent_id, 16)
            && !zero(parent_id)
            && hex(flags, 2);
        ok.then(|| Self(value.to_owned()))
    }

    /// The header value.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TraceParent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
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
