//! What `load` reports: each subscriber slot's segments and its contiguity verdict, the
//! relay's memory over time and its slope after the warm-up, and the readable summary.

#[allow(clippy::wildcard_imports)]
use super::*;

/// Where a subscriber starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum StartKind {
    /// `--from tip`.
    Tip,
    /// A few ledgers above the oldest the ring holds (pruning goes on while it connects).
    Oldest,
    /// Halfway between the oldest and the newest held.
    Middle,
}

/// Ledgers above the ring's oldest an `Oldest` start asks for: the ring prunes one ledger per
/// cadence while the subscriber connects.
pub const OLDEST_MARGIN: u32 = 8;

/// How one process of a subscriber ended.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub enum End {
    /// Stopped by the harness with SIGINT, exited 0.
    Stopped,
    /// Killed by the harness with SIGKILL.
    Killed,
    /// Anything else (a failure).
    Failed(String),
}

/// One process of a subscriber.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Segment {
    /// `--from` it was given.
    pub from: String,
    /// Seconds from the relay's start.
    pub started_s: f64,
    /// Seconds from the relay's start.
    pub ended_s: f64,
    /// How it ended.
    pub end: Option<End>,
    /// Ledgers it wrote, first and last sequence.
    #[serde(flatten)]
    pub written: Written,
    #[serde(skip)]
    pub(super) stats: PathBuf,
    #[serde(skip)]
    pub(super) log: PathBuf,
}

/// One subscriber over the run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SlotReport {
    /// Certificate name.
    pub name: String,
    /// Its first start.
    pub kind: StartKind,
    /// Restarted in a loop.
    pub reconnecting: bool,
    /// Its processes in order.
    pub segments: Vec<Segment>,
    /// Ledgers over all its processes.
    pub ledgers: usize,
    /// Contiguous, no duplicate, across restarts.
    pub contiguous: bool,
}

/// The whole result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoadReport {
    /// Arguments.
    pub args: LoadArgs,
    /// Resolved settings.
    pub settings: LoadSettings,
    /// Load average at the start and at the end.
    pub load_average: [Option<[f64; 3]>; 2],
    /// Processes started.
    pub connects: usize,
    /// Of which restarts.
    pub reconnects: usize,
    /// Restarts after a graceful stop.
    pub graceful_stops: usize,
    /// Restarts after SIGKILL.
    pub kills: usize,
    /// Ledgers delivered over all processes.
    pub ledgers_delivered: usize,
    /// Everything that went wrong.
    pub failures: Vec<String>,
    /// The relay's counters at the end (`sessions_total`, `lagged_total`, ...).
    pub relay_counters: std::collections::BTreeMap<String, f64>,
    /// VmRSS of the first sample, MiB.
    pub rss_start_mib: f64,
    /// VmRSS of the last sample, MiB.
    pub rss_end_mib: f64,
    /// Largest VmRSS sample, MiB.
    pub rss_max_mib: f64,
    /// VmRSS at the end of the warm-up, MiB.
    pub rss_at_warmup_mib: f64,
    /// VmHWM before the stop, MiB.
    pub rss_hwm_mib: f64,
    /// Least-squares slope of VmRSS after the warm-up, MiB per minute.
    pub rss_slope_mib_per_min: Option<f64>,
    /// VmRSS after the warm-up: samples, min, max, mean of the first half, mean of the second
    /// half (MiB).
    pub rss_after_warmup: AfterWarmup,
    /// Whether the slope is within `--flat-mib-per-min`.
    pub flat: bool,
    /// Wall time, s.
    pub wall_s: f64,
    /// Per subscriber.
    pub slots: Vec<SlotReport>,
    /// (seconds, sessions_open, lanes_open) every second.
    pub sessions_series: Vec<(f64, f64, f64)>,
    /// Every VmRSS sample.
    pub rss_samples: Vec<RssSample>,
}

/// VmRSS after the warm-up.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct AfterWarmup {
    /// Samples.
    pub samples: usize,
    /// Smallest, MiB.
    pub min_mib: f64,
    /// Largest, MiB.
    pub max_mib: f64,
    /// Mean of the first half of the samples, MiB.
    pub first_half_mean_mib: f64,
    /// Mean of the second half, MiB.
    pub second_half_mean_mib: f64,
}

impl AfterWarmup {
    pub(super) fn of(mib: &[f64]) -> AfterWarmup {
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let (a, b) = mib.split_at(mib.len() / 2);
        AfterWarmup {
            samples: mib.len(),
            min_mib: mib.iter().copied().fold(f64::INFINITY, f64::min),
            max_mib: mib.iter().copied().fold(0.0, f64::max),
            first_half_mean_mib: mean(a),
            second_half_mean_mib: mean(b),
        }
    }
}

/// The readable summary.
pub fn summary(r: &LoadReport) -> String {
    use std::fmt::Write as _;
    let (a, s) = (&r.args, &r.settings);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "load: {} subscribers ({} reconnecting every {}-{} s), {} lanes; {:.0} KiB ledgers {}, ring {} ledgers; {:.0} s (+{:.0} s pre-roll), wall {:.0} s; {}",
        a.run.subscribers.subscribers,
        a.reconnecting,
        a.min_life,
        a.max_life,
        a.run.lanes.lanes,
        a.run.workload.kib(),
        a.run.pace(),
        s.retention,
        s.duration_s,
        s.preroll_s,
        r.wall_s,
        crate::stats::fmt_loads(&r.load_average),
    );
    let by_kind = |k: StartKind| r.slots.iter().filter(|x| x.kind == k).count();
    let _ = writeln!(
        out,
        "starts: {} from tip, {} from the oldest retained (+{OLDEST_MARGIN}), {} from the middle of the ring",
        by_kind(StartKind::Tip),
        by_kind(StartKind::Oldest),
        by_kind(StartKind::Middle)
    );
    let _ = writeln!(
        out,
        "processes: {} connects, {} reconnects ({} after SIGINT, {} after SIGKILL); ledgers delivered {}; contiguous {}/{}",
        r.connects,
        r.reconnects,
        r.graceful_stops,
        r.kills,
        r.ledgers_delivered,
        r.slots.iter().filter(|x| x.contiguous).count(),
        r.slots.len()
    );
    let c = |k: &str| r.relay_counters.get(k).copied().unwrap_or(f64::NAN);
    let _ = writeln!(
        out,
        "relay: sessions_total {}, sessions_open at the end {}, refused {}, lagged {}, ring reads {}, ledgers out {}, ledgers in {}, resent chunks {}, protocol errors {}",
        c("sessions_total"),
        c("sessions_open"),
        c("sessions_refused_total"),
        c("lagged_total"),
        c("ring_reads_total"),
        c("ledgers_out_total"),
        c("ledgers_in_total"),
        c("resent_chunks_total"),
        c("protocol_errors_total"),
    );
    let _ = writeln!(
        out,
        "relay VmRSS: start {:.1} MiB, at warm-up end ({:.0} s) {:.1}, max {:.1}, end {:.1}, VmHWM {:.1}; after warm-up: {} samples, {:.1}..{:.1}, mean {:.1} then {:.1}, slope {} MiB/min -> {}",
        r.rss_start_mib,
        s.warmup_s,
        r.rss_at_warmup_mib,
        r.rss_max_mib,
        r.rss_end_mib,
        r.rss_hwm_mib,
        r.rss_after_warmup.samples,
        r.rss_after_warmup.min_mib,
        r.rss_after_warmup.max_mib,
        r.rss_after_warmup.first_half_mean_mib,
        r.rss_after_warmup.second_half_mean_mib,
        r.rss_slope_mib_per_min
            .map_or("-".into(), |v| format!("{v:+.3}")),
        if r.flat {
            format!("flat (<= {} MiB/min)", a.flat_mib_per_min)
        } else {
            format!("NOT FLAT (target <= {} MiB/min)", a.flat_mib_per_min)
        }
    );
    let _ = writeln!(out, "failures: {}", r.failures.len());
    for f in r.failures.iter().take(20) {
        let _ = writeln!(out, "  {f}");
    }
    out
}
