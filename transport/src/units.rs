//! The one grammar of durations and sizes on every command line and in every config file of
//! the product: durations as `humantime` reads them (`600ms`, `2s`, `1m 30s`, `1h`), sizes as
//! `parse-size` reads them (`14.5MiB`, `256KiB`, `64GiB`: binary with `i`; `1MB`, `1.5 KB`,
//! `1000`: decimal).

use std::time::Duration;

/// Why a duration or size did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad {what} {input:?}: {reason}")]
pub struct UnitError {
    /// "duration" or "size".
    pub what: &'static str,
    /// What was given.
    pub input: String,
    /// Why it was refused.
    pub reason: String,
}

/// Parses a duration such as `600ms`, `2s`, `1m`, `1h 30m` or `250us`; `0` is zero.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    humantime::parse_duration(s.trim()).map_err(|e| UnitError {
        what: "duration",
        input: s.to_owned(),
        reason: e.to_string(),
    })
}

/// Parses a byte size such as `14.5MiB`, `256KiB`, `64GiB`, `1MB` or `1000`.
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    parse_size::parse_size(s.trim()).map_err(|e| UnitError {
        what: "size",
        input: s.to_owned(),
        reason: e.to_string(),
    })
}

/// A duration as [`parse_duration`] reads it back: in seconds when it is a whole number of
/// them (`2s`, `60s`), else in milliseconds, microseconds or nanoseconds (`600ms`).
pub fn format_duration(d: Duration) -> String {
    let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
    match (secs, nanos) {
        (s, 0) => format!("{s}s"),
        _ if nanos % 1_000_000 == 0 => format!("{}ms", d.as_millis()),
        _ if nanos % 1_000 == 0 => format!("{}us", d.as_micros()),
        _ => format!("{}ns", d.as_nanos()),
    }
}

/// A byte size as [`parse_size`] reads it back: in the largest binary unit it is a whole
/// number of (`256KiB`, `64GiB`), else in bytes.
pub fn format_size(bytes: u64) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes != 0 && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// How a flag's help states its default: `[default: VALUE]`, or `[default: VALUE; NOTE]` when
/// something qualifies it (every binary's `--help` and its docs test read it this way).
pub fn default_tag(value: &str, note: Option<&str>) -> String {
    match note {
        Some(note) => format!("[default: {value}; {note}]"),
        None => format!("[default: {value}]"),
    }
}

/// Serde support for durations written as a string ([`parse_duration`]) or a number of
/// milliseconds.
pub mod serde_duration {
    use std::time::Duration;

    use serde::{de, Deserializer};

    /// Deserializes a duration.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = Duration;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a duration such as \"10s\", \"500ms\" or a number of milliseconds")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
                Ok(Duration::from_millis(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
                u64::try_from(v)
                    .map(Duration::from_millis)
                    .map_err(|_| E::custom("a duration cannot be negative"))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
                super::parse_duration(v).map_err(E::custom)
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration(" 2m "), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["10", "s", "3 parsecs", "soon", ""] {
            let e = parse_duration(bad).unwrap_err();
            assert_eq!(e.what, "duration", "{bad}");
            assert!(e.to_string().starts_with("bad duration"), "{e}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256KiB"), Ok(256 << 10));
        assert_eq!(parse_size("14.5MiB"), Ok(15_204_352));
        assert_eq!(parse_size("64GiB"), Ok(64 << 30));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("1.5 KB"), Ok(1500));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4096B"), Ok(4096));
        for bad in ["12 parsecs", "MiB", "1.2.3MiB", ""] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn formatted_durations_and_sizes_read_back() {
        for d in [
            Duration::ZERO,
            Duration::from_nanos(1500),
            Duration::from_micros(250),
            Duration::from_millis(8),
            Duration::from_millis(600),
            Duration::from_millis(1500),
            Duration::from_secs(2),
            Duration::from_secs(90),
            Duration::from_secs(120),
            Duration::from_secs(7200),
        ] {
            let text = format_duration(d);
            assert_eq!(parse_duration(&text), Ok(d), "{text}");
        }
        assert_eq!(format_duration(Duration::from_millis(600)), "600ms");
        assert_eq!(format_duration(Duration::from_secs(30)), "30s");
        assert_eq!(format_duration(Duration::from_secs(60)), "60s");
        assert_eq!(format_duration(Duration::ZERO), "0s");
        for b in [
            0,
            1000,
            4096,
            256 << 10,
            1 << 20,
            32 << 20,
            64 << 30,
            (14 << 20) + 1,
        ] {
            let text = format_size(b);
            assert_eq!(parse_size(&text), Ok(b), "{text}");
        }
        assert_eq!(format_size(64 << 30), "64GiB");
        assert_eq!(format_size(256 << 10), "256KiB");
        assert_eq!(format_size(1452), "1452");
    }
}
