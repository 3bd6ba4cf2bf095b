//! What `slow-subscriber` reports: each run's figures and verdicts, the pooled comparison of
//! the normal subscribers with and without the slow one, and the readable summary.

#[allow(clippy::wildcard_imports)]
use super::*;
use crate::report::Col;

/// The slow subscriber's outcome in one run.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SlowOutcome {
    /// `--consume-delay`, ms.
    pub delay_ms: f64,
    /// The run waited for it to take every ledger (else it was stopped once the normal
    /// subscribers were done).
    pub waited: bool,
    /// Exit code (`None`: killed by a signal, or still running at the deadline).
    pub exit_code: Option<i32>,
    /// Ledgers it wrote, first and last sequence.
    #[serde(flatten)]
    pub written: Written,
    /// Its sequences have no gap, duplicate or reordering.
    pub contiguous: bool,
    /// Seconds from the run's start to its exit.
    pub done_s: Option<f64>,
    /// Seconds from the run's start to the first scrape showing `lagged_total` >= 1.
    pub lagged_s: Option<f64>,
    /// The source's newest ledger at that scrape.
    pub lagged_at_seq: Option<u32>,
    /// Its session was seen catching up (reading from memory or the ring) after that.
    pub seen_catching_up: bool,
    /// Seconds to the first scrape after lagging that showed it live again.
    pub live_again_s: Option<f64>,
    /// Largest lag `/metrics` showed for it, ledgers.
    pub max_lag_ledgers: u64,
    /// Its largest delivery time (how far behind it was), ms.
    pub max_delivery_ms: f64,
    /// With exit 4: the oldest ledger the relay held, from its message.
    pub oldest_held: Option<u32>,
    /// The last line of its stderr.
    pub message: String,
}

impl SlowOutcome {
    /// One phrase.
    pub fn verdict(&self, expected: u32) -> String {
        match self.exit_code {
            Some(0) if self.written.ledgers == expected as usize && self.contiguous => format!(
                "caught up: {}/{expected} ledgers in {:.0} s",
                self.written.ledgers,
                self.done_s.unwrap_or(f64::NAN)
            ),
            Some(4) => format!(
                "below retention (exit 4) after {} ledgers{}",
                self.written.ledgers,
                self.oldest_held
                    .filter(|o| *o > 0)
                    .map(|o| format!(", oldest held {o}"))
                    .unwrap_or_default()
            ),
            None if !self.waited && self.contiguous => format!(
                "stopped by the harness after the normal ones, at {} ledgers",
                self.written.ledgers
            ),
            Some(c) => format!("FAILED: exit {c} after {} ledgers", self.written.ledgers),
            None => format!("FAILED: no exit ({} ledgers)", self.written.ledgers),
        }
    }
}

/// Resident memory of the relay in one run.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RssFigures {
    /// Samples taken.
    pub samples: usize,
    /// At "relay listening", MiB.
    pub at_listen_mib: f64,
    /// Largest sample, MiB.
    pub max_mib: f64,
    /// Last sample, MiB.
    pub end_mib: f64,
    /// `VmHWM` (peak resident) before the relay was stopped, MiB.
    pub hwm_mib: f64,
}

/// One run's results.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SlowRun {
    /// `A1`, `B1`, `A2`, ... or `C`.
    pub name: String,
    /// What it is.
    pub label: String,
    /// `--retention` of its relay.
    pub retention: u32,
    /// Normal subscribers' summary (warm-up excluded), all pooled.
    pub normal: Summary,
    /// Each normal subscriber's p99, ms.
    pub normal_p99_each_ms: Vec<f64>,
    /// Every normal subscriber's ledgers after warm-up: (sequence, delivery ms).
    pub normal_samples: Vec<(u32, f64)>,
    /// The slow subscriber, in B and C.
    pub slow: Option<SlowOutcome>,
    /// `ledger_relay_lagged_total` at the end.
    pub lagged_total: f64,
    /// `ledger_relay_ring_reads_total` at the end.
    pub ring_reads_total: f64,
    /// `ledger_relay_ledgers_out_total` at the end.
    pub ledgers_out_total: f64,
    /// `ledger_relay_resent_chunks_total` at the end.
    pub resent_chunks_total: f64,
    /// Relay memory.
    pub rss: RssFigures,
    /// The bound for this run.
    pub bound: MemoryBound,
    /// VmHWM within the bound.
    pub within_bound: bool,
    /// Wall time, s.
    pub wall_s: f64,
    /// Every VmRSS sample.
    pub rss_samples: Vec<RssSample>,
}

/// The whole result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SlowReport {
    /// Settings.
    pub args: SlowArgs,
    /// Load average at the start and at the end.
    pub load_average: [Option<[f64; 3]>; 2],
    /// Idle relay, KiB (the bound's base).
    pub idle_rss_kib: u64,
    /// The runs in order.
    pub runs: Vec<SlowRun>,
    /// Normal subscribers' delivery over all A runs: samples, p50, p99, ms.
    pub pooled_a: (usize, f64, f64),
    /// The same over all B runs.
    pub pooled_b: (usize, f64, f64),
    /// Pooled B p99 over pooled A p99: the target.
    pub p99_ratio: Option<f64>,
    /// The source's newest ledger when the last B run's slow subscriber was moved to ring
    /// reading.
    pub split_seq: Option<u32>,
    /// Pooled (samples, p50, p99) of A and B for ledgers up to `split_seq` (the slow one still
    /// live), then A and B after it (the slow one reading the ring).
    pub split: Option<[(usize, f64, f64); 4]>,
    /// B_k p99 over A_k p99, per pair.
    pub pair_ratios: Vec<f64>,
    /// Largest over smallest p99 of the A runs: the run-to-run noise of one configuration.
    pub a_spread: Option<f64>,
    /// Mean VmHWM of the B runs less that of the A runs, MiB: what the slow subscriber cost.
    pub marginal_hwm_mib: Option<f64>,
    /// The bound's term for one session, MiB.
    pub per_session_mib: f64,
}

/// Samples, p50 and p99 of the normal subscribers' ledgers whose sequence passes `keep`,
/// over every run whose name starts with `prefix`.
pub(super) fn pooled(
    runs: &[SlowRun],
    prefix: char,
    keep: impl Fn(u32) -> bool,
) -> (usize, f64, f64) {
    let mut d: Vec<f64> = runs
        .iter()
        .filter(|r| r.name.starts_with(prefix))
        .flat_map(|r| r.normal_samples.iter())
        .filter(|(seq, _)| keep(*seq))
        .map(|(_, d)| *d)
        .collect();
    d.sort_by(f64::total_cmp);
    (d.len(), quantile(&d, 0.5), quantile(&d, 0.99))
}

/// The readable summary.
pub fn summary(r: &SlowReport) -> String {
    use std::fmt::Write as _;
    let a = &r.args;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "slow subscriber: {} normal subscribers, 1 slow (--consume-delay {} ms = {}x the cadence); {} ledgers of {:.0} KiB {}, {} lanes; {}",
        a.run.subscribers.subscribers,
        a.delay_ms(),
        a.slow_factor,
        a.series.count.ledgers,
        a.run.workload.kib(),
        a.run.pace(),
        a.run.lanes.lanes,
        crate::stats::fmt_loads(&r.load_average),
    );
    let cols: [Col<SlowRun>; 12] = [
        Col::l("run", 3, |r| r.name.clone()),
        Col::l("subscribers", 32, |r| r.label.clone()),
        Col::r("ring", 6, |r| r.retention.to_string()),
        Col::r("p50 ms", 8, |r| format!("{:.2}", r.normal.p50_ms)),
        Col::r("p99 ms", 8, |r| format!("{:.2}", r.normal.p99_ms)),
        Col::r("max ms", 8, |r| format!("{:.2}", r.normal.max_ms)),
        Col::r("lagged", 6, |r| r.lagged_total.to_string()),
        Col::r("ringrd", 6, |r| r.ring_reads_total.to_string()),
        Col::r("RSS max", 8, |r| format!("{:.1}", r.rss.max_mib)),
        Col::r("VmHWM", 8, |r| format!("{:.1}", r.rss.hwm_mib)),
        Col::r("bound", 8, |r| format!("{:.1}", r.bound.total_mib)),
        Col::r("wall s", 8, |r| format!("{:.1}", r.wall_s)),
    ];
    out.push_str(&crate::report::table_of(&cols, &r.runs, (0, ""), |_| None));
    for run in &r.runs {
        if let Some(s) = &run.slow {
            let _ = writeln!(
                out,
                "run {} slow subscriber: {}; lagged (moved to ring reading) at {}, seen catching up: {}, live again at {}; max lag {} ledgers, max delivery {:.0} ms{}",
                run.name,
                s.verdict(a.series.count.ledgers),
                s.lagged_s.map_or("-".into(), |t| format!("{t:.1} s")),
                s.seen_catching_up,
                s.live_again_s.map_or("-".into(), |t| format!("{t:.1} s")),
                s.max_lag_ledgers,
                s.max_delivery_ms,
                if s.exit_code == Some(0) {
                    String::new()
                } else {
                    format!(" | {}", s.message)
                }
            );
        }
    }
    for run in &r.runs {
        let _ = writeln!(
            out,
            "run {} memory: {} samples, {:.1} MiB at listen, max {:.1}, end {:.1}, VmHWM {:.1}; bound {} -> {}",
            run.name,
            run.rss.samples,
            run.rss.at_listen_mib,
            run.rss.max_mib,
            run.rss.end_mib,
            run.rss.hwm_mib,
            run.bound.line(),
            if run.within_bound { "within" } else { "OVER" }
        );
    }
    let _ = writeln!(
        out,
        "normal subscribers pooled: A {} samples p50 {:.2} p99 {:.2} ms; B {} samples p50 {:.2} p99 {:.2} ms; per pair B/A p99: {}; A runs' p99 spread (max/min): {}",
        r.pooled_a.0,
        r.pooled_a.1,
        r.pooled_a.2,
        r.pooled_b.0,
        r.pooled_b.1,
        r.pooled_b.2,
        r.pair_ratios
            .iter()
            .map(|x| format!("{x:.3}"))
            .collect::<Vec<_>>()
            .join(", "),
        r.a_spread.map_or("-".into(), |x| format!("{x:.3}")),
    );
    if let (Some(l), Some([ab, bb, aa, ba])) = (r.split_seq, r.split) {
        let _ = writeln!(
            out,
            "  ledgers <= {l} (slow one still live): A p50 {:.2} p99 {:.2} ({} samples), B p50 {:.2} p99 {:.2} ({}), B/A p99 {:.3}",
            ab.1,
            ab.2,
            ab.0,
            bb.1,
            bb.2,
            bb.0,
            bb.2 / ab.2
        );
        let _ = writeln!(
            out,
            "  ledgers > {l} (slow one reading the ring): A p50 {:.2} p99 {:.2} ({} samples), B p50 {:.2} p99 {:.2} ({}), B/A p99 {:.3}",
            aa.1,
            aa.2,
            aa.0,
            ba.1,
            ba.2,
            ba.0,
            ba.2 / aa.2
        );
    }
    if let Some(ratio) = r.p99_ratio {
        let _ = writeln!(
            out,
            "target: normal p99 with the slow subscriber within {:.0}% of without (pooled): B/A = {:.3} -> {}",
            a.p99_tolerance * 100.0,
            ratio,
            crate::report::met(ratio <= 1.0 + a.p99_tolerance),
        );
    }
    let all_within = r.runs.iter().all(|x| x.within_bound);
    let _ = writeln!(
        out,
        "target: relay VmHWM within the bound in every run -> {}",
        crate::report::met(all_within)
    );
    if let Some(m) = r.marginal_hwm_mib {
        let _ = writeln!(
            out,
            "the slow subscriber's cost: mean VmHWM of B runs less A runs = {m:+.1} MiB (the bound's per-session term: {:.1} MiB)",
            r.per_session_mib
        );
    }
    out
}
