//! What `ledger-subscribe` tells its operator while it runs: the progress line or lines
//! ([`Progress`]), the end summary, and the throughput meter behind both.

use super::*;

/// Writes progress as [`Progress`] says.
pub(super) struct ProgressOut {
    mode: Progress,
    format: LogFormat,
    /// A live line is on screen (so the end moves past it).
    drawn: bool,
}

impl ProgressOut {
    pub(super) fn new(mode: Progress, format: LogFormat) -> ProgressOut {
        ProgressOut {
            mode,
            format,
            drawn: false,
        }
    }

    pub(super) fn tick(&mut self, meter: &mut Meter, status: &Status) {
        match self.mode {
            Progress::Live => {
                // Redrawn in place; the cursor goes back to the start, so that a log line
                // written meanwhile overwrites it instead of running on after it.
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[K{}\r", meter.line(status));
                let _ = err.flush();
                self.drawn = true;
            }
            Progress::Summary => summary(self.format, &meter.summary(status), "progress"),
            Progress::Quiet => {}
        }
    }

    pub(super) fn finish(
        &mut self,
        meter: &mut Meter,
        status: &Status,
        run: &RunSummary,
        failed: bool,
    ) {
        match self.mode {
            Progress::Live if self.drawn => {
                let _ = write!(std::io::stderr().lock(), "\r\x1b[K");
            }
            // A run that failed before its first ledger ends with its error line alone.
            Progress::Summary if failed && run.ledgers == 0 => {}
            Progress::Summary => {
                let mut s = meter.summary(status);
                s.total = run.ledgers;
                let what = if failed {
                    "failed"
                } else if run.interrupted {
                    "stopped"
                } else {
                    "done"
                };
                summary(self.format, &s, what);
            }
            _ => {}
        }
    }
}

/// One summary: the interval's numbers and where the subscription stands.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Summary {
    seconds: f64,
    ledgers: u64,
    mib: f64,
    seq: u32,
    lag: Option<u32>,
    lanes_up: u8,
    lanes_granted: u8,
    relay: String,
    /// Ledgers written over the whole run (set at the end).
    total: u64,
}

impl Summary {
    /// `last 60 s: 100 ledgers (1.7/s), 1445.3 MiB | seq 1410100 | lag 2 | lanes 4/4 |
    /// relay 10.0.0.1:7000`.
    pub(super) fn line(&self, event: &str) -> String {
        let lag = self.lag.map_or_else(|| "?".to_owned(), |l| l.to_string());
        let head = match event {
            "progress" => format!("last {:.0} s", self.seconds),
            other => format!(
                "{other} after {} ledgers; last {:.0} s",
                self.total, self.seconds
            ),
        };
        format!(
            "{head}: {} ledgers ({:.1}/s), {:.1} MiB | seq {} | lag {lag} | lanes {}/{} | {}",
            self.ledgers,
            self.ledgers as f64 / self.seconds.max(1e-3),
            self.mib,
            self.seq,
            self.lanes_up,
            self.lanes_granted,
            self.relay
        )
    }
}

/// Logs a summary at info level under [`SUMMARY_TARGET`]: one readable message in text
/// logs, structured fields in JSON logs.
fn summary(format: LogFormat, s: &Summary, event: &str) {
    match format {
        LogFormat::Json => tracing::info!(
            target: SUMMARY_TARGET,
            event,
            seconds = s.seconds,
            ledgers = s.ledgers,
            mib = s.mib,
            seq = s.seq,
            lag = s.lag,
            lanes_up = s.lanes_up,
            lanes_granted = s.lanes_granted,
            relay = %s.relay,
            total = s.total,
            "summary"
        ),
        _ => tracing::info!(target: SUMMARY_TARGET, "{}", s.line(event)),
    }
}

/// Rates for the status line, over the interval since the last line.
pub(super) struct Meter {
    since: Instant,
    ledgers: u64,
    bytes: u64,
    last_seq: u32,
}

impl Meter {
    pub(super) fn new() -> Meter {
        Meter {
            since: Instant::now(),
            ledgers: 0,
            bytes: 0,
            last_seq: 0,
        }
    }

    pub(super) fn add(&mut self, ledger: &Ledger) {
        self.ledgers += 1;
        self.bytes += ledger.raw_len;
        self.last_seq = ledger.seq;
    }

    /// The numbers since the last call, and resets the counters.
    pub(super) fn summary(&mut self, status: &Status) -> Summary {
        let seq = if self.last_seq == 0 {
            status.last_delivered
        } else {
            self.last_seq
        };
        let s = Summary {
            seconds: self.since.elapsed().as_secs_f64(),
            ledgers: self.ledgers,
            mib: self.bytes as f64 / f64::from(1 << 20),
            seq,
            lag: (status.newest != 0 && seq != 0).then(|| status.newest.saturating_sub(seq)),
            lanes_up: status.lanes_up,
            lanes_granted: status.lanes_granted,
            relay: relay_state(status),
            total: 0,
        };
        self.since = Instant::now();
        self.ledgers = 0;
        self.bytes = 0;
        s
    }

    /// `seq 1410100 | lag 2 | 1.7 ledgers/s | 23.4 MiB/s | lanes 4/4 | relay 10.0.0.1:7000`,
    /// and resets the counters.
    pub(super) fn line(&mut self, status: &Status) -> String {
        let secs = self.since.elapsed().as_secs_f64().max(1e-3);
        let seq = if self.last_seq == 0 {
            status.last_delivered
        } else {
            self.last_seq
        };
        let lag = if status.newest == 0 || seq == 0 {
            "?".to_owned()
        } else {
            status.newest.saturating_sub(seq).to_string()
        };
        let relay = relay_state(status);
        let line = format!(
            "seq {seq} | lag {lag} | {:.1} ledgers/s | {:.1} MiB/s | lanes {}/{} | {relay}",
            self.ledgers as f64 / secs,
            self.bytes as f64 / secs / f64::from(1 << 20),
            status.lanes_up,
            status.lanes_granted,
        );
        self.since = Instant::now();
        self.ledgers = 0;
        self.bytes = 0;
        line
    }
}

/// `relay ADDR`, `reconnecting: WHY` or `connecting`.
fn relay_state(status: &Status) -> String {
    match status.relay {
        Some(addr) => format!("relay {addr}"),
        None => match &status.last_error {
            Some(e) => format!("reconnecting: {e}"),
            None => "connecting".to_owned(),
        },
    }
}
