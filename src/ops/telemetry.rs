//! The process's log output: a `tracing` subscriber with an env filter, human-readable or JSON lines,
//! and every line passed through the [`Redactor`] before it is written.
//!
//! JSON lines carry the fields of the current span and of every span around it (`"spans":[...]`), so a
//! line logged while a message is handled names its `job_id` and `trace_id` without repeating them at
//! each call site (see [`trace::message_span`](super::trace::message_span)).

use std::io::{IsTerminal, Write};

use serde::Deserialize;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{EnvFilter, Layer};

use super::Redactor;

/// The variable that overrides `[ops] log_filter` for one run.
pub const LOG_ENV: &str = "VOLCANO_RUNNER_LOG";

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One readable line per event, with the span context in front.
    Human,
    /// One JSON object per line: `timestamp`, `level`, `fields`, `target`, `span`, `spans`.
    Json,
}

/// What the subscriber is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    pub format: LogFormat,
    /// An env-filter directive (`info`, `volcano_runner=debug,lapin=warn`).
    pub filter: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: LogFormat::Human,
            filter: "info".to_owned(),
        }
    }
}

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("log filter {filter:?} is not valid: {reason}")]
    Filter { filter: String, reason: String },
    #[error("logging was already set up in this process")]
    AlreadySet,
}

/// Builds the subscriber without installing it: tests install it for one scope with
/// `tracing::subscriber::with_default` and read what `writer` received.
pub fn subscriber<W>(
    settings: &LogSettings,
    redactor: Redactor,
    writer: W,
    ansi: bool,
) -> Result<Box<dyn tracing::Subscriber + Send + Sync>, TelemetryError>
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let mut filter = EnvFilter::try_new(&settings.filter).map_err(|e| TelemetryError::Filter {
        filter: settings.filter.clone(),
        reason: e.to_string(),
    })?;
    // The kube client logs every failed request at ERROR, without saying where or what for; our own
    // errors name the request and the cluster. An explicit directive for it in the filter still wins.
    if !settings.filter.contains("kube_client") {
        filter = filter.add_directive("kube_client::client::builder=off".parse().map_err(
            |e: tracing_subscriber::filter::ParseError| TelemetryError::Filter {
                filter: settings.filter.clone(),
                reason: e.to_string(),
            },
        )?);
    }
    // The AMQP client logs what the runner reports itself, in protocol terms and without saying what
    // to fix: a refused login or a missing vhost as ERROR `Connection closed` frames before the runner's
    // own message, a lost connection as IO errors before the supervisor's WARN, every returned
    // (unroutable) message at WARN with its whole content before the publisher's error naming the
    // exchange and routing key. The runner's lines say each once; `lapin=warn` in the filter brings
    // the client's back.
    if !settings.filter.contains("lapin") {
        filter = filter.add_directive("lapin=off".parse().map_err(
            |e: tracing_subscriber::filter::ParseError| TelemetryError::Filter {
                filter: settings.filter.clone(),
                reason: e.to_string(),
            },
        )?);
    }
    let writer = RedactingWriter {
        inner: writer,
        redactor,
    };
    Ok(Box::new(
        tracing_subscriber::registry()
            .with(filter)
            .with(format_layer(settings.format, writer, ansi)),
    ))
}

/// The layer that formats events in `format` and writes them to `writer` as they are. [`subscriber`]
/// gives it a [`RedactingWriter`]; a test can put a second one next to it to see what would have been
/// written without redaction.
pub fn format_layer<S, W>(
    format: LogFormat,
    writer: W,
    ansi: bool,
) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    match format {
        LogFormat::Human => tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .with_ansi(ansi)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_writer(writer)
            .boxed(),
    }
}

/// Installs the process's subscriber: to stderr (stdout stays for command output), through the global
/// [`Redactor`].
pub fn init(settings: &LogSettings) -> Result<(), TelemetryError> {
    let ansi = std::io::stderr().is_terminal();
    let subscriber = subscriber(settings, Redactor::global().clone(), std::io::stderr, ansi)?;
    tracing::subscriber::set_global_default(subscriber).map_err(|_| TelemetryError::AlreadySet)?;
    // Libraries that log through the `log` crate are not routed here; the ones in this tree use tracing.
    Ok(())
}

/// A [`MakeWriter`] whose writers hold each log line until it is complete, scrub it, then write it.
#[derive(Debug, Clone)]
pub struct RedactingWriter<M> {
    inner: M,
    redactor: Redactor,
}

impl<M> RedactingWriter<M> {
    pub fn new(inner: M, redactor: Redactor) -> Self {
        Self { inner, redactor }
    }
}

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for RedactingWriter<M> {
    type Writer = ScrubbedLine<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        ScrubbedLine {
            buf: Vec::new(),
            inner: self.inner.make_writer(),
            redactor: self.redactor.clone(),
        }
    }
}

/// One log event on its way out. The formatter writes an event in one or more pieces and then drops the
/// writer; the event is scrubbed as a whole, so a secret split over two writes is still found.
pub struct ScrubbedLine<W: Write> {
    buf: Vec<u8>,
    inner: W,
    redactor: Redactor,
}

impl<W: Write> ScrubbedLine<W> {
    fn emit(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&self.buf);
        let clean = self.redactor.scrub(&text);
        let result = self.inner.write_all(clean.as_bytes());
        self.buf.clear();
        result
    }
}

impl<W: Write> Write for ScrubbedLine<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.emit()?;
        self.inner.flush()
    }
}

impl<W: Write> Drop for ScrubbedLine<W> {
    fn drop(&mut self) {
        // Nowhere to report a failed log write to.
        let _ = self.emit();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Collects what the subscriber writes.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl Write for Capture {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(data);
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Capture {
        type Writer = Capture;
        fn make_writer(&'a self) -> Capture {
            self.clone()
        }
    }

    impl Capture {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn logged(format: LogFormat, filter: &str, redactor: Redactor, f: impl FnOnce()) -> String {
        let capture = Capture::default();
        let settings = LogSettings {
            format,
            filter: filter.into(),
        };
        let subscriber = subscriber(&settings, redactor, capture.clone(), false).unwrap();
        tracing::subscriber::with_default(subscriber, f);
        capture.text()
    }

    #[test]
    fn json_lines_carry_the_span_fields() {
        let out = logged(LogFormat::Json, "info", Redactor::new(), || {
            let ctx = crate::ops::TraceContext::new_root();
            let span = crate::ops::trace::message_span("SubmitJob", "42", &ctx);
            let _entered = span.enter();
            tracing::info!(replicas = 2, "applied");
        });
        let line: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["fields"]["message"], "applied");
        assert_eq!(line["span"]["job_id"], "42");
        assert_eq!(line["span"]["type"], "SubmitJob");
        assert_eq!(line["span"]["trace_id"].as_str().unwrap().len(), 32);
        assert_eq!(line["spans"][0]["name"], "message");
    }

    #[test]
    fn human_lines_and_the_filter() {
        let out = logged(LogFormat::Human, "warn", Redactor::new(), || {
            tracing::info!("hidden");
            tracing::warn!(job_id = "7", "shown");
        });
        assert!(!out.contains("hidden"), "{out}");
        assert!(out.contains("WARN") && out.contains("shown") && out.contains("job_id=\"7\""));
        assert!(!out.trim_start().starts_with('{'), "{out}");
    }

    #[test]
    fn lines_are_scrubbed_before_they_are_written() {
        let redactor = Redactor::new();
        redactor.add("LICENSE-KEY-9");
        for format in [LogFormat::Human, LogFormat::Json] {
            let out = logged(format, "info", redactor.clone(), || {
                tracing::info!(arg = "lic:1/LICENSE-KEY-9", "rendered");
                tracing::info!("url amqp://u:pw0rd@h/v");
            });
            assert!(!out.contains("LICENSE-KEY-9"), "{out}");
            assert!(!out.contains("pw0rd"), "{out}");
            assert_eq!(out.matches("***").count(), 2, "{out}");
        }
    }

    #[test]
    fn lapin_returned_message_dumps_are_kept_out_unless_asked_for() {
        let emit = || {
            tracing::warn!(target: "lapin::returned_messages", "Server returned us a message BODY");
            tracing::error!(target: "lapin::channel", "Connection closed ACCESS_REFUSED");
            tracing::warn!(target: "volcano_runner::broker", "no queue receives messages");
        };
        let text = logged(LogFormat::Human, "info", Redactor::new(), emit);
        assert!(!text.contains("BODY"), "{text}");
        assert!(!text.contains("ACCESS_REFUSED"), "{text}");
        assert!(text.contains("no queue receives messages"), "{text}");
        let text = logged(LogFormat::Human, "info,lapin=warn", Redactor::new(), emit);
        assert!(
            text.contains("BODY"),
            "an explicit lapin directive wins: {text}"
        );
    }

    #[test]
    fn a_bad_filter_is_an_error_naming_it() {
        let settings = LogSettings {
            format: LogFormat::Human,
            filter: "info,[".into(),
        };
        let Err(err) = subscriber(&settings, Redactor::new(), std::io::sink, false) else {
            panic!("accepted a bad filter");
        };
        assert!(err.to_string().contains("info,["), "{err}");
    }
}
