//! Log output: `--log-format text` (the default: tracing's human format, coloured only on a
//! terminal) or
//! `--log-format json` (one JSON object per line on stderr, fields flattened beside
//! `timestamp`, `level`, `target` and `message`). `RUST_LOG` filters either.

use std::io::{IsTerminal as _, Write as _};

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
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter))
    };
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr);
    let _ = match format {
        // Colours on a terminal only: a journal or a file gets plain text.
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .with_env_filter(filter())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_env_filter(filter())
            .try_init(),
    };
}

/// Writes the one line a command prints when it fails: `text` as is for [`LogFormat::Text`];
/// for [`LogFormat::Json`], a JSON object like the log's (`level` `ERROR`, `target` the
/// program, `message` the text), so that every line of stderr parses. Written directly, not
/// through the logger: `RUST_LOG` must not hide why a command exited.
pub fn fatal(format: LogFormat, program: &str, text: &str) {
    let line = match format {
        LogFormat::Text => text.to_owned(),
        LogFormat::Json => json_line(program, text),
    };
    let _ = writeln!(std::io::stderr(), "{line}");
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
