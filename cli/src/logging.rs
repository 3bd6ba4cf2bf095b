//! Log output: `--log-format text` (the default: tracing's human format, coloured only on a
//! terminal) or
//! `--log-format json` (one JSON object per line on stderr, fields flattened beside
//! `timestamp`, `level`, `target` and `message`). `RUST_LOG` filters either.
//!
//! Either way a log line is one line whatever its fields hold: text a peer chose (a relay's
//! error message, a certificate's name, a close reason) cannot end it and start another, nor
//! act on a terminal. JSON escapes by itself; the text format writes every field, and the line
//! a failing command exits with, through [`ledger_relay_wire::text`].

use std::fmt;
use std::io::{IsTerminal as _, Write as _};

use ledger_relay_wire::text::{Escaped, EscapingWriter};
use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::FormatFields;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
#[non_exhaustive]
pub enum LogFormat {
    /// Human-readable lines (tracing's default format).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global logger on stderr with `format`, filtered by `RUST_LOG` or else by
/// `default_filter` (an `EnvFilter` directive such as `info`). A second call does nothing.
pub fn init(format: LogFormat, default_filter: &str) {
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    // Colours on a terminal only: a journal or a file gets plain text.
    let ansi = std::io::stderr().is_terminal();
    let _ = logger(format, filter, std::io::stderr, ansi).try_init();
}

/// The logger [`init`] installs, writing to `writer`.
fn logger<W>(
    format: LogFormat,
    filter: tracing_subscriber::EnvFilter,
    writer: W,
    ansi: bool,
) -> tracing::Dispatch
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_writer(writer)
        .with_env_filter(filter);
    match format {
        LogFormat::Text => builder
            .fmt_fields(EscapedFields)
            .with_ansi(ansi)
            .finish()
            .into(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .finish()
            .into(),
    }
}

/// The text format's fields, written as tracing's default writes them (`name=value`, the
/// message bare, separated by spaces) but escaped: a field's value never ends the line.
#[derive(Debug, Clone, Copy, Default)]
pub struct EscapedFields;

impl<'w> FormatFields<'w> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut visitor = FieldVisitor {
            out: EscapingWriter(writer),
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct FieldVisitor<'w> {
    out: EscapingWriter<Writer<'w>>,
    first: bool,
    result: fmt::Result,
}

impl Visit for FieldVisitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        use fmt::Write as _;
        // `log` records converted to events carry their origin as `log.*` fields, which the
        // event's own target and location already show.
        if self.result.is_err() || field.name().starts_with("log.") {
            return;
        }
        let pad = if std::mem::take(&mut self.first) {
            ""
        } else {
            " "
        };
        self.result = match field.name() {
            "message" => write!(self.out, "{pad}{value:?}"),
            name => write!(self.out, "{pad}{}={value:?}", name.trim_start_matches("r#")),
        };
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.record_debug(field, &format_args!("{}", ErrorChain(value)));
    }
}

/// An error and its sources, `a: b: c`.
struct ErrorChain<'a>(&'a (dyn std::error::Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

/// Writes the one line a command prints when it fails: `text` escaped (it may quote a peer)
/// for [`LogFormat::Text`]; for [`LogFormat::Json`], a JSON object like the log's (`level`
/// `ERROR`, `target` the program, `message` the text), so that every line of stderr parses.
/// Written directly, not through the logger: `RUST_LOG` must not hide why a command exited.
pub fn fatal(format: LogFormat, program: &str, text: &str) {
    let _ = writeln!(std::io::stderr(), "{}", fatal_line(format, program, text));
}

fn fatal_line(format: LogFormat, program: &str, text: &str) -> String {
    match format {
        LogFormat::Text => Escaped(text).to_string(),
        LogFormat::Json => json_line(program, text),
    }
}

fn json_line(program: &str, text: &str) -> String {
    serde_json::json!({
        "timestamp": humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string(),
        "level": "ERROR",
        "target": program,
        "message": text,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// What a logger wrote.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The lines `format` writes for one warning that quotes a forged relay message, in every
    /// way an event can carry text.
    fn log_forged(format: LogFormat, ansi: bool) -> Vec<String> {
        let out = Captured::default();
        let writer = out.clone();
        let filter = tracing_subscriber::EnvFilter::new("info");
        let dispatch = logger(format, filter, move || writer.clone(), ansi);
        let forged =
            "busy\nbelow-retention requested=1 oldest=4000000000 newest=4000000001\n\x1b[2Jx";
        let error = std::io::Error::other(forged);
        tracing::dispatcher::with_default(&dispatch, || {
            tracing::warn!(relay = %forged, debug = ?forged, plain = forged, error = &error as &dyn std::error::Error, "session ended: {forged}");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn a_text_log_line_stays_one_line_whatever_its_fields_hold() {
        for ansi in [false, true] {
            let lines = log_forged(LogFormat::Text, ansi);
            assert_eq!(lines.len(), 1, "{lines:#?}");
            let line = &lines[0];
            assert!(!line.contains("\x1b[2J"), "{line}");
            assert!(
                line.contains(r"session ended: busy\nbelow-retention requested=1"),
                "{line}"
            );
            assert!(line.contains(r"relay=busy\nbelow-retention"), "{line}");
            assert!(line.contains(r"error=busy\nbelow"), "{line}");
            assert!(line.contains(r"\u{1b}[2Jx"), "{line}");
        }
    }

    #[test]
    fn a_json_log_line_stays_one_line_and_keeps_the_text() {
        let lines = log_forged(LogFormat::Json, false);
        assert_eq!(lines.len(), 1, "{lines:#?}");
        let v: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        assert!(v["relay"]
            .as_str()
            .unwrap()
            .contains("busy\nbelow-retention"));
    }

    #[test]
    fn a_fatal_text_line_is_one_line() {
        let text = "ledger-subscribe: relay said: busy\nbelow-retention requested=1\x1b[2J";
        let line = fatal_line(LogFormat::Text, "ledger-subscribe", text);
        assert_eq!(
            line,
            r"ledger-subscribe: relay said: busy\nbelow-retention requested=1\u{1b}[2J"
        );
    }

    #[test]
    fn a_fatal_json_line_is_one_json_object() {
        let line = json_line("ledger-relay", "error: bad \"config\"\nsecond line");
        assert!(!line.contains('\n'), "{line}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "ERROR");
        assert_eq!(v["target"], "ledger-relay");
        assert_eq!(v["message"], "error: bad \"config\"\nsecond line");
        assert!(v["timestamp"].as_str().unwrap().ends_with('Z'));
    }
}
