//! The relay's health: what `/healthz` answers and the health series of `/metrics`.
//!
//! Two kinds of input feed it:
//! - clocks: the pipeline stamps every piece of bytes the source produces and every new ledger
//!   it publishes ([`Health::source_bytes`], [`Health::ledger`]); ages are read from them when a
//!   report is asked for, so a stalled source needs nobody to notice it;
//! - conditions: a part of the relay that knows something is wrong raises a typed [`Reason`]
//!   under its own key and clears it when that is over ([`Health::raise`], [`Health::clear`]):
//!   the source is restarting, has finished or failed, the ring cannot write; an export lake
//!   or an upstream relay adds its own kind the same way.
//!
//! [`Health::report`] turns both into a [`HealthReport`], and that report is the one place
//! that decides the status, the HTTP code and how status and reasons are written
//! ([`HealthReport::render_json`], [`HealthReport::render_prometheus`]).
//!
//! A report reads atomics and clones the short list of conditions under a lock held for the
//! clone only: no ring read, no IO, no lock across IO, nothing that waits on the pipeline. It
//! does not act on what it finds (no restart, no shutdown): it reports.

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::defaults::DEFAULTS;
use crate::exposition::family;

/// Condition key of the ledger source.
pub const SOURCE: &str = "source";
/// Condition key of the retention ring.
pub const RING: &str = "ring";
/// Condition key of stored ledgers that failed verification.
pub const RING_CORRUPT: &str = "ring_corrupt";

/// What kind of trouble a [`Reason`] is: a stable code for alerts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum ReasonKind {
    /// No new ledger within the limit, or none yet since the relay started.
    NoLedger,
    /// The source is down and being restarted, or restarted and has not delivered a ledger.
    SourceRestarting,
    /// The source ended: no more ledgers will come.
    SourceFinished,
    /// The source stopped on an error.
    SourceFailed,
    /// The ring cannot write (disk read-only or full); live streaming goes on.
    RingDegraded,
    /// A ledger stored in the ring failed verification on read and is not served.
    RingCorrupt,
    /// The export to a data lake fails (`--export`); live streaming goes on.
    LakeExport,
}

impl ReasonKind {
    /// Every kind, in the order the metrics list them.
    pub const ALL: [ReasonKind; 7] = [
        ReasonKind::NoLedger,
        ReasonKind::SourceRestarting,
        ReasonKind::SourceFinished,
        ReasonKind::SourceFailed,
        ReasonKind::RingDegraded,
        ReasonKind::RingCorrupt,
        ReasonKind::LakeExport,
    ];

    /// The stable code: the `reason` label of `ledger_relay_health_reason` and an entry of
    /// `reason_codes` in `/healthz`.
    pub fn code(self) -> &'static str {
        match self {
            ReasonKind::NoLedger => "no_ledger",
            ReasonKind::SourceRestarting => "source_restarting",
            ReasonKind::SourceFinished => "source_finished",
            ReasonKind::SourceFailed => "source_failed",
            ReasonKind::RingDegraded => "ring_degraded",
            ReasonKind::RingCorrupt => "ring_corrupt",
            ReasonKind::LakeExport => "lake_export",
        }
    }

    /// Whether the relay delivers no new ledgers while this holds. Such a reason makes
    /// `/healthz` answer 503, so that load balancers and probes send subscribers elsewhere;
    /// the others are reported with 200, since the relay still streams live ledgers.
    pub fn stops_delivery(self) -> bool {
        match self {
            ReasonKind::NoLedger
            | ReasonKind::SourceRestarting
            | ReasonKind::SourceFinished
            | ReasonKind::SourceFailed => true,
            ReasonKind::RingDegraded | ReasonKind::RingCorrupt | ReasonKind::LakeExport => false,
        }
    }
}

/// Why the relay is not fully healthy: one entry of `reasons` in `/healthz`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// No new ledger for longer than the limit.
    NoLedger {
        /// Time since the source last completed a new ledger.
        age: Duration,
        /// The limit (`--stale-after`).
        limit: Duration,
    },
    /// No ledger at all since the relay started.
    NoLedgerYet {
        /// Time since the start.
        since_start: Duration,
    },
    /// The source's process ended; it is started again after a backoff.
    SourceDown {
        /// Restarts before this one.
        restarts: u32,
        /// Why it ended.
        cause: String,
    },
    /// The source was restarted and has not delivered a new ledger since.
    SourceRestarted {
        /// Restarts so far, this one included.
        restarts: u32,
        /// Why the previous run ended.
        cause: String,
    },
    /// The source ended (a file replayed, a FIFO or stdin at EOF, a synthetic count reached).
    SourceFinished,
    /// The source stopped on an error; the relay serves what it holds.
    SourceFailed {
        /// The error.
        cause: String,
    },
    /// The ring cannot write.
    RingDegraded {
        /// The last write error.
        error: String,
    },
    /// A stored ledger failed verification on read (the newest such).
    RingCorrupt {
        /// The ledger.
        seq: u32,
        /// Stored ledgers found damaged since the relay started.
        count: u64,
        /// What failed.
        detail: String,
    },
    /// Writing to the export lake fails (it is retried) or has stopped.
    LakeExport {
        /// The last error.
        error: String,
    },
}

impl Reason {
    /// Its kind.
    pub fn kind(&self) -> ReasonKind {
        match self {
            Reason::NoLedger { .. } | Reason::NoLedgerYet { .. } => ReasonKind::NoLedger,
            Reason::SourceDown { .. } | Reason::SourceRestarted { .. } => {
                ReasonKind::SourceRestarting
            }
            Reason::SourceFinished => ReasonKind::SourceFinished,
            Reason::SourceFailed { .. } => ReasonKind::SourceFailed,
            Reason::RingDegraded { .. } => ReasonKind::RingDegraded,
            Reason::RingCorrupt { .. } => ReasonKind::RingCorrupt,
            Reason::LakeExport { .. } => ReasonKind::LakeExport,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NoLedger { age, limit } => {
                write!(f, "no ledger for {} (limit {})", secs(*age), secs(*limit))
            }
            Reason::NoLedgerYet { since_start } => {
                write!(f, "no ledger yet, {} after the start", secs(*since_start))
            }
            Reason::SourceDown { restarts, cause } => {
                write!(f, "source down, restarting (restarts so far: {restarts}): {cause}")
            }
            Reason::SourceRestarted { restarts, cause } => write!(
                f,
                "source restarted (restart {restarts}), no ledger from it yet; it had ended: {cause}"
            ),
            Reason::SourceFinished => f.write_str("source finished: no more ledgers will come"),
            Reason::SourceFailed { cause } => write!(f, "source stopped: {cause}"),
            Reason::RingDegraded { error } => write!(f, "ring degraded: {error}"),
            Reason::RingCorrupt { seq, count, detail } => write!(
                f,
                "stored ledger {seq} failed verification and is not served ({count} so far): {detail}"
            ),
            Reason::LakeExport { error } => write!(f, "lake export failing: {error}"),
        }
    }
}

/// `42 s`, or `1.2 s` below ten seconds (`1 s` for a whole second).
fn secs(d: Duration) -> String {
    if d >= Duration::from_secs(10) || d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// `ok` or `degraded`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// No reason holds.
    Ok,
    /// At least one reason holds.
    Degraded,
}

impl Status {
    /// As written in `/healthz`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Degraded => "degraded",
        }
    }
}

/// What the source is doing, as far as health can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SourceState {
    /// Running (whether or not it delivers: see the ages).
    Running,
    /// Down or restarted without a ledger since.
    Restarting,
    /// Ended.
    Finished,
    /// Stopped on an error.
    Failed,
}

impl SourceState {
    /// As written in `/healthz`.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceState::Running => "running",
            SourceState::Restarting => "restarting",
            SourceState::Finished => "finished",
            SourceState::Failed => "failed",
        }
    }
}

/// The relay's health state, shared by the parts that feed it and the metrics server.
#[derive(Debug)]
pub struct Health {
    started: Instant,
    stale_after: Duration,
    /// Nanoseconds after `started` plus one; 0 for never.
    last_ledger: AtomicU64,
    /// Likewise, for the last bytes from the source.
    last_byte: AtomicU64,
    /// Raised conditions by key, in the order raised.
    conditions: Mutex<Vec<(String, Reason)>>,
}

impl Default for Health {
    fn default() -> Self {
        Health::new(DEFAULTS.stale_after)
    }
}

impl Health {
    /// Health that counts from now, with no ledger yet, degraded after `stale_after` without a
    /// new ledger.
    pub fn new(stale_after: Duration) -> Health {
        Health {
            started: Instant::now(),
            stale_after,
            last_ledger: AtomicU64::new(0),
            last_byte: AtomicU64::new(0),
            conditions: Mutex::new(Vec::new()),
        }
    }

    /// The limit without a new ledger.
    pub fn stale_after(&self) -> Duration {
        self.stale_after
    }

    fn stamp(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    /// The source produced bytes.
    pub fn source_bytes(&self) {
        self.last_byte.store(self.stamp(), Ordering::Relaxed);
    }

    /// The source completed a new ledger: the ledger age restarts, and a restarted source is
    /// no longer restarting.
    pub fn ledger(&self) {
        let now = self.stamp();
        self.last_ledger.store(now, Ordering::Relaxed);
        self.last_byte.store(now, Ordering::Relaxed);
        self.clear_kind(SOURCE, ReasonKind::SourceRestarting);
    }

    /// Raises `reason` under `key`, replacing what that key held.
    pub fn raise(&self, key: &str, reason: Reason) {
        let mut c = self.lock();
        match c.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = reason,
            None => c.push((key.to_owned(), reason)),
        }
    }

    /// Clears what `key` held; whether it held anything.
    pub fn clear(&self, key: &str) -> bool {
        let mut c = self.lock();
        let before = c.len();
        c.retain(|(k, _)| k != key);
        c.len() != before
    }

    /// Clears what `key` held if it is of `kind`.
    pub fn clear_kind(&self, key: &str, kind: ReasonKind) {
        self.lock().retain(|(k, r)| !(k == key && r.kind() == kind));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, Reason)>> {
        // A panic while holding this lock leaves a consistent Vec (every change is one call).
        self.conditions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The health now.
    pub fn report(&self) -> HealthReport {
        let uptime = self.started.elapsed();
        let age = |stamp: &AtomicU64| match stamp.load(Ordering::Relaxed) {
            0 => None,
            t => Some(uptime.saturating_sub(Duration::from_nanos(t - 1))),
        };
        let last_ledger = age(&self.last_ledger);
        let last_byte = age(&self.last_byte);
        let mut reasons = Vec::new();
        match last_ledger {
            None => reasons.push(Reason::NoLedgerYet {
                since_start: uptime,
            }),
            Some(age) if age > self.stale_after => reasons.push(Reason::NoLedger {
                age,
                limit: self.stale_after,
            }),
            Some(_) => {}
        }
        reasons.extend(self.lock().iter().map(|(_, r)| r.clone()));
        HealthReport {
            reasons,
            last_ledger_age: last_ledger,
            last_byte_age: last_byte,
            stale_after: self.stale_after,
            uptime,
        }
    }
}

/// The health at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthReport {
    /// Every reason that holds: the ledger age first, then conditions in the order raised.
    pub reasons: Vec<Reason>,
    /// Time since the source last completed a new ledger; `None` before the first.
    pub last_ledger_age: Option<Duration>,
    /// Time since the source last produced bytes; `None` before the first.
    pub last_byte_age: Option<Duration>,
    /// The limit without a new ledger.
    pub stale_after: Duration,
    /// Time since the relay started.
    pub uptime: Duration,
}

impl HealthReport {
    /// `ok` when no reason holds.
    pub fn status(&self) -> Status {
        if self.reasons.is_empty() {
            Status::Ok
        } else {
            Status::Degraded
        }
    }

    /// Whether new ledgers are reaching subscribers: no reason that stops delivery holds.
    pub fn delivering(&self) -> bool {
        !self.reasons.iter().any(|r| r.kind().stops_delivery())
    }

    /// 200, or 503 when the relay is not delivering new ledgers.
    pub fn http_code(&self) -> u16 {
        if self.delivering() {
            200
        } else {
            503
        }
    }

    /// What the source is doing.
    pub fn source(&self) -> SourceState {
        let has = |k: ReasonKind| self.reasons.iter().any(|r| r.kind() == k);
        if has(ReasonKind::SourceFailed) {
            SourceState::Failed
        } else if has(ReasonKind::SourceFinished) {
            SourceState::Finished
        } else if has(ReasonKind::SourceRestarting) {
            SourceState::Restarting
        } else {
            SourceState::Running
        }
    }

    /// An age for the metrics: since the event, or since the start before the first one, so
    /// that an alert on the age also fires for a relay that never got anything.
    fn age_or_uptime(&self, age: Option<Duration>) -> Duration {
        age.unwrap_or(self.uptime)
    }

    /// The `/healthz` answer: the HTTP code and a JSON object of the status, the reasons, the
    /// ages and then `details` (counters the caller adds, such as the ring's range).
    pub fn render_json(
        &self,
        details: serde_json::Map<String, serde_json::Value>,
    ) -> (u16, String) {
        use serde_json::{json, Value};
        let mut body = serde_json::Map::new();
        body.insert("status".into(), json!(self.status().as_str()));
        body.insert("delivering".into(), json!(self.delivering()));
        body.insert(
            "reasons".into(),
            Value::Array(self.reasons.iter().map(|r| json!(r.to_string())).collect()),
        );
        body.insert(
            "reason_codes".into(),
            Value::Array(
                self.reasons
                    .iter()
                    .map(|r| json!(r.kind().code()))
                    .collect(),
            ),
        );
        body.insert("source".into(), json!(self.source().as_str()));
        body.insert(
            "source_last_ledger_age_seconds".into(),
            json!(seconds(self.age_or_uptime(self.last_ledger_age))),
        );
        body.insert(
            "source_last_byte_age_seconds".into(),
            json!(seconds(self.age_or_uptime(self.last_byte_age))),
        );
        body.insert(
            "stale_after_seconds".into(),
            json!(seconds(self.stale_after)),
        );
        body.insert("uptime_seconds".into(), json!(seconds(self.uptime)));
        body.extend(details);
        let mut text = Value::Object(body).to_string();
        text.push('\n');
        (self.http_code(), text)
    }

    /// The health series of `/metrics`.
    pub fn render_prometheus(&self, out: &mut String) {
        let mut gauge = |name: &str, help: &str, value: String| {
            family(out, name, help);
            let _ = writeln!(out, "ledger_relay_{name} {value}");
        };
        gauge(
            "source_last_ledger_age_seconds",
            "Seconds since the source last completed a new ledger (since the start before the first).",
            seconds(self.age_or_uptime(self.last_ledger_age)).to_string(),
        );
        gauge(
            "source_last_byte_age_seconds",
            "Seconds since the source last produced bytes (since the start before the first).",
            seconds(self.age_or_uptime(self.last_byte_age)).to_string(),
        );
        gauge(
            "stale_after_seconds",
            "Seconds without a new ledger after which the relay reports degraded.",
            seconds(self.stale_after).to_string(),
        );
        gauge(
            "healthy",
            "1 when /healthz reports ok, 0 when it reports degraded.",
            u8::from(self.status() == Status::Ok).to_string(),
        );
        gauge(
            "delivering",
            "1 when new ledgers reach subscribers (/healthz answers 200), 0 when not (503).",
            u8::from(self.delivering()).to_string(),
        );
        family(out, "health_reason", "1 while a reason of this kind holds.");
        for kind in ReasonKind::ALL {
            let holds = self.reasons.iter().any(|r| r.kind() == kind);
            let _ = writeln!(
                out,
                "ledger_relay_health_reason{{reason=\"{}\"}} {}",
                kind.code(),
                u8::from(holds)
            );
        }
    }
}

/// Seconds with millisecond precision.
fn seconds(d: Duration) -> f64 {
    (d.as_millis() as f64) / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(r: &HealthReport) -> (u16, serde_json::Value) {
        let (code, body) = r.render_json(serde_json::Map::new());
        (code, serde_json::from_str(&body).unwrap())
    }

    #[test]
    fn no_ledger_yet_is_degraded_then_ledgers_make_it_ok() {
        let h = Health::new(Duration::from_secs(30));
        let r = h.report();
        assert_eq!(r.status(), Status::Degraded);
        assert_eq!(r.http_code(), 503);
        assert!(matches!(r.reasons[..], [Reason::NoLedgerYet { .. }]));
        let (code, v) = json(&r);
        assert_eq!(code, 503);
        assert_eq!(v["status"], "degraded");
        assert_eq!(v["reason_codes"][0], "no_ledger");
        assert!(v["reasons"][0]
            .as_str()
            .unwrap()
            .starts_with("no ledger yet"));
        h.ledger();
        let r = h.report();
        assert_eq!(r.status(), Status::Ok, "{:?}", r.reasons);
        assert_eq!(r.http_code(), 200);
        assert!(r.last_ledger_age.unwrap() < Duration::from_secs(1));
        assert!(r.last_byte_age.is_some());
        let (_, v) = json(&r);
        assert_eq!(v["reasons"].as_array().unwrap().len(), 0);
        assert_eq!(v["source"], "running");
        assert_eq!(v["stale_after_seconds"], 30.0);
    }

    #[test]
    fn a_stale_ledger_is_degraded_and_a_new_one_recovers() {
        let h = Health::new(Duration::from_millis(50));
        h.ledger();
        std::thread::sleep(Duration::from_millis(80));
        let r = h.report();
        let [Reason::NoLedger { age, limit }] = r.reasons[..] else {
            panic!("{:?}", r.reasons)
        };
        assert!(age >= Duration::from_millis(80));
        assert_eq!(limit, Duration::from_millis(50));
        assert_eq!(r.http_code(), 503);
        h.ledger();
        assert_eq!(h.report().status(), Status::Ok);
    }

    #[test]
    fn conditions_are_listed_and_only_delivery_stoppers_give_503() {
        let h = Health::new(Duration::from_secs(30));
        h.ledger();
        h.raise(
            RING,
            Reason::RingDegraded {
                error: "disk full".into(),
            },
        );
        let r = h.report();
        assert_eq!(r.status(), Status::Degraded);
        assert_eq!(r.http_code(), 200, "the ring does not stop live delivery");
        assert_eq!(r.reasons[0].to_string(), "ring degraded: disk full");
        h.raise(
            SOURCE,
            Reason::SourceDown {
                restarts: 0,
                cause: "child exited (exit status: 1)".into(),
            },
        );
        let r = h.report();
        assert_eq!(r.http_code(), 503);
        assert_eq!(r.source(), SourceState::Restarting);
        let (_, v) = json(&r);
        assert_eq!(v["reason_codes"][0], "ring_degraded");
        assert_eq!(v["reason_codes"][1], "source_restarting");
        assert_eq!(v["delivering"], false);
        // The restarted source stays "restarting" until it delivers.
        h.raise(
            SOURCE,
            Reason::SourceRestarted {
                restarts: 1,
                cause: "child exited (exit status: 1)".into(),
            },
        );
        assert_eq!(h.report().reasons.len(), 2, "one condition per key");
        h.ledger();
        assert!(h.clear(RING));
        assert!(!h.clear(RING));
        assert_eq!(h.report().status(), Status::Ok);
        // A ledger does not clear a finished or failed source.
        h.raise(SOURCE, Reason::SourceFinished);
        h.ledger();
        assert_eq!(h.report().source(), SourceState::Finished);
    }

    /// The exposition of a fixed report, line for line: its text is what scrapers and alert
    /// rules read.
    #[test]
    fn prometheus_exposition_of_a_fixed_report() {
        let report = HealthReport {
            reasons: vec![Reason::RingCorrupt {
                seq: 7,
                count: 2,
                detail: "hash mismatch".into(),
            }],
            last_ledger_age: Some(Duration::from_millis(1_250)),
            last_byte_age: None,
            stale_after: Duration::from_secs(30),
            uptime: Duration::from_secs(42),
        };
        let mut out = String::new();
        report.render_prometheus(&mut out);
        assert_eq!(out, PROMETHEUS_FIXED, "{out}");
    }

    const PROMETHEUS_FIXED: &str = "\
# HELP ledger_relay_source_last_ledger_age_seconds Seconds since the source last completed a new ledger (since the start before the first).
# TYPE ledger_relay_source_last_ledger_age_seconds gauge
ledger_relay_source_last_ledger_age_seconds 1.25
# HELP ledger_relay_source_last_byte_age_seconds Seconds since the source last produced bytes (since the start before the first).
# TYPE ledger_relay_source_last_byte_age_seconds gauge
ledger_relay_source_last_byte_age_seconds 42
# HELP ledger_relay_stale_after_seconds Seconds without a new ledger after which the relay reports degraded.
# TYPE ledger_relay_stale_after_seconds gauge
ledger_relay_stale_after_seconds 30
# HELP ledger_relay_healthy 1 when /healthz reports ok, 0 when it reports degraded.
# TYPE ledger_relay_healthy gauge
ledger_relay_healthy 0
# HELP ledger_relay_delivering 1 when new ledgers reach subscribers (/healthz answers 200), 0 when not (503).
# TYPE ledger_relay_delivering gauge
ledger_relay_delivering 1
# HELP ledger_relay_health_reason 1 while a reason of this kind holds.
# TYPE ledger_relay_health_reason gauge
ledger_relay_health_reason{reason=\"no_ledger\"} 0
ledger_relay_health_reason{reason=\"source_restarting\"} 0
ledger_relay_health_reason{reason=\"source_finished\"} 0
ledger_relay_health_reason{reason=\"source_failed\"} 0
ledger_relay_health_reason{reason=\"ring_degraded\"} 0
ledger_relay_health_reason{reason=\"ring_corrupt\"} 1
ledger_relay_health_reason{reason=\"lake_export\"} 0
";

    #[test]
    fn prometheus_lists_every_kind() {
        let h = Health::new(Duration::from_secs(5));
        let mut out = String::new();
        h.report().render_prometheus(&mut out);
        assert!(out.contains("ledger_relay_healthy 0\n"), "{out}");
        assert!(out.contains("ledger_relay_delivering 0\n"), "{out}");
        assert!(
            out.contains("ledger_relay_stale_after_seconds 5\n"),
            "{out}"
        );
        assert!(out.contains("ledger_relay_health_reason{reason=\"no_ledger\"} 1\n"));
        for kind in ReasonKind::ALL {
            assert!(out.contains(&format!("reason=\"{}\"", kind.code())));
        }
        h.ledger();
        let mut out = String::new();
        h.report().render_prometheus(&mut out);
        assert!(out.contains("ledger_relay_healthy 1\n"), "{out}");
        assert!(out.contains("ledger_relay_health_reason{reason=\"no_ledger\"} 0\n"));
    }

    #[test]
    fn every_reason_has_a_listed_kind() {
        let all = [
            Reason::NoLedger {
                age: Duration::ZERO,
                limit: Duration::ZERO,
            },
            Reason::NoLedgerYet {
                since_start: Duration::ZERO,
            },
            Reason::SourceDown {
                restarts: 0,
                cause: String::new(),
            },
            Reason::SourceRestarted {
                restarts: 1,
                cause: String::new(),
            },
            Reason::SourceFinished,
            Reason::SourceFailed {
                cause: String::new(),
            },
            Reason::RingDegraded {
                error: String::new(),
            },
            Reason::RingCorrupt {
                seq: 1,
                count: 1,
                detail: String::new(),
            },
            Reason::LakeExport {
                error: String::new(),
            },
        ];
        let mut seen: Vec<ReasonKind> = Vec::new();
        for r in &all {
            // An exhaustive match: a new variant fails to compile here until it is listed.
            match r {
                Reason::NoLedger { .. }
                | Reason::NoLedgerYet { .. }
                | Reason::SourceDown { .. }
                | Reason::SourceRestarted { .. }
                | Reason::SourceFinished
                | Reason::SourceFailed { .. }
                | Reason::RingDegraded { .. }
                | Reason::RingCorrupt { .. }
                | Reason::LakeExport { .. } => {}
            }
            assert!(ReasonKind::ALL.contains(&r.kind()), "{r:?}");
            assert!(!r.to_string().contains('\n'), "{r:?}");
            seen.push(r.kind());
        }
        seen.dedup();
        assert_eq!(seen, ReasonKind::ALL, "every kind has a reason");
    }

    #[test]
    fn durations_in_reasons() {
        assert_eq!(secs(Duration::from_millis(42_700)), "42 s");
        assert_eq!(secs(Duration::from_millis(1_250)), "1.2 s");
        assert_eq!(secs(Duration::from_secs(1)), "1 s");
    }
}
