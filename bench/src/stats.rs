//! Per-ledger records (the `ledger-subscribe --stats` CSV) and their summary.

use std::path::Path;

use anyhow::{bail, Context};

/// One delivered ledger, as `ledger-subscribe --stats` writes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Record {
    /// Ledger sequence.
    pub seq: u32,
    /// Raw ledger bytes.
    pub raw_bytes: u64,
    /// Bytes on the wire (after compression).
    pub wire_bytes: u64,
    /// Complete verified ledger at the subscriber minus the relay's last byte from its source.
    pub delivery_ms: f64,
    /// Time since the previous ledger arrived (`None` for the first).
    pub inter_arrival_ms: Option<f64>,
    /// When the ledger was complete at the subscriber, ms since the Unix epoch by the
    /// subscriber's clock (`None` in files without the column).
    pub received_unix_ms: Option<f64>,
}

/// Parses a stats CSV (`seq,raw_bytes,wire_bytes,delivery_ms,inter_arrival_ms`, optionally
/// `,received_unix_ms`).
pub fn parse_csv(text: &str) -> anyhow::Result<Vec<Record>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if i == 0 && line.starts_with("seq") {
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 5 && f.len() != 6 {
            bail!("line {}: expected 5 or 6 fields, got {:?}", i + 1, line);
        }
        let n = |k: usize| -> anyhow::Result<f64> {
            f[k].trim()
                .parse::<f64>()
                .with_context(|| format!("line {}: field {}", i + 1, k + 1))
        };
        out.push(Record {
            seq: n(0)? as u32,
            raw_bytes: n(1)? as u64,
            wire_bytes: n(2)? as u64,
            delivery_ms: n(3)?,
            inter_arrival_ms: if f[4].trim().is_empty() {
                None
            } else {
                Some(n(4)?)
            },
            received_unix_ms: if f.len() == 6 { Some(n(5)?) } else { None },
        });
    }
    Ok(out)
}

/// Reads and parses a stats CSV file.
pub fn read_csv(path: &Path) -> anyhow::Result<Vec<Record>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_csv(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Writes records in the same CSV format (the TCP and pipe baselines use it too).
pub fn csv_row(r: &Record) -> String {
    format!(
        "{},{},{},{:.3},{}\n",
        r.seq,
        r.raw_bytes,
        r.wire_bytes,
        r.delivery_ms,
        r.inter_arrival_ms
            .map(|v| format!("{v:.3}"))
            .unwrap_or_default()
    )
}

/// The header line of the CSV.
pub const CSV_HEADER: &str = "seq,raw_bytes,wire_bytes,delivery_ms,inter_arrival_ms\n";

/// Quantile `q` (0..=1) of sorted values, nearest rank.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summary of one subscriber's (or all subscribers') ledgers after warm-up.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Ledgers counted (after warm-up).
    pub ledgers: usize,
    /// Delivery quantiles, ms.
    pub p50_ms: f64,
    /// 90th percentile delivery, ms.
    pub p90_ms: f64,
    /// 99th percentile delivery, ms.
    pub p99_ms: f64,
    /// Largest delivery, ms.
    pub max_ms: f64,
    /// Median inter-arrival, ms.
    pub inter_p50_ms: f64,
    /// Largest inter-arrival, ms.
    pub inter_max_ms: f64,
    /// Mean raw bytes per ledger.
    pub raw_bytes: f64,
    /// Mean wire bytes per ledger.
    pub wire_bytes: f64,
    /// Raw over wire.
    pub ratio: f64,
    /// Raw bytes of a ledger over its delivery time measured from the first byte the relay
    /// could send (delivery + emit window), MiB/s, median over ledgers: the goodput one ledger
    /// sees, independent of the cadence.
    pub goodput_mib_s: f64,
    /// Sustained throughput, MiB/s: mean raw bytes per ledger over the median inter-arrival,
    /// per subscriber, averaged over subscribers. Bounded by the source's cadence on live rows;
    /// on catch-up rows (ledgers back to back from the ring) it is the delivery path's goodput.
    pub throughput_mib_s: f64,
    /// Whole-transfer goodput, MiB/s: the raw bytes of the ledgers after the first kept one over
    /// the time from its arrival to the last arrival, per subscriber, averaged. One clock (the
    /// subscriber's) only, so it needs no clock shared with the relay; like throughput it is
    /// bounded by the source's cadence unless the path is slower.
    pub transfer_mib_s: f64,
}

/// Summarizes `records` (each subscriber's in arrival order, concatenated), leaving out the
/// first `warmup` ledgers of each subscriber (`per_sub` records per subscriber). `emit_ms` is
/// the source's emit window.
pub fn summarize(subs: &[Vec<Record>], warmup: usize, emit_ms: f64) -> Summary {
    let kept: Vec<&Record> = subs.iter().flat_map(|v| v.iter().skip(warmup)).collect();
    if kept.is_empty() {
        return Summary::default();
    }
    let mut d: Vec<f64> = kept.iter().map(|r| r.delivery_ms).collect();
    d.sort_by(f64::total_cmp);
    let mut ia: Vec<f64> = subs
        .iter()
        .flat_map(|v| v.iter().skip(warmup + 1))
        .filter_map(|r| r.inter_arrival_ms)
        .collect();
    ia.sort_by(f64::total_cmp);
    let raw: f64 = kept.iter().map(|r| r.raw_bytes as f64).sum::<f64>() / kept.len() as f64;
    let wire: f64 = kept.iter().map(|r| r.wire_bytes as f64).sum::<f64>() / kept.len() as f64;
    let mut gp: Vec<f64> = kept
        .iter()
        .map(|r| r.raw_bytes as f64 / f64::from(1 << 20) / ((r.delivery_ms + emit_ms) / 1e3))
        .collect();
    gp.sort_by(f64::total_cmp);
    // Per subscriber: mean raw bytes over the median inter-arrival (robust to the burst of
    // completions at the start of a catch-up, when a whole window of ledgers was in flight).
    let per_sub: Vec<f64> = subs
        .iter()
        .filter_map(|v| {
            let after: Vec<&Record> = v.iter().skip(warmup + 1).collect();
            let mut ia: Vec<f64> = after.iter().filter_map(|r| r.inter_arrival_ms).collect();
            ia.sort_by(f64::total_cmp);
            let median = quantile(&ia, 0.5);
            let bytes = after.iter().map(|r| r.raw_bytes as f64).sum::<f64>() / after.len() as f64;
            (median > 0.0).then(|| bytes / f64::from(1 << 20) / (median / 1e3))
        })
        .collect();
    let throughput = mean(&per_sub);
    let transfer: Vec<f64> = subs
        .iter()
        .filter_map(|v| {
            let after: Vec<&Record> = v.iter().skip(warmup + 1).collect();
            let secs = after.iter().filter_map(|r| r.inter_arrival_ms).sum::<f64>() / 1e3;
            let bytes = after.iter().map(|r| r.raw_bytes as f64).sum::<f64>();
            (secs > 0.0).then(|| bytes / f64::from(1 << 20) / secs)
        })
        .collect();
    Summary {
        ledgers: kept.len(),
        p50_ms: quantile(&d, 0.5),
        p90_ms: quantile(&d, 0.9),
        p99_ms: quantile(&d, 0.99),
        max_ms: d[d.len() - 1],
        inter_p50_ms: quantile(&ia, 0.5),
        inter_max_ms: ia.last().copied().unwrap_or(f64::NAN),
        raw_bytes: raw,
        wire_bytes: wire,
        ratio: raw / wire.max(1.0),
        goodput_mib_s: quantile(&gp, 0.5),
        throughput_mib_s: throughput,
        transfer_mib_s: mean(&transfer),
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// A load average triple as `1.00 0.50 0.25`, or `?` when it could not be read.
pub fn fmt_load(l: &Option<[f64; 3]>) -> String {
    l.map(|l| format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2]))
        .unwrap_or_else(|| "?".into())
}

/// `load average BEFORE -> AFTER` (see [`fmt_load`]).
pub fn fmt_loads(l: &[Option<[f64; 3]>; 2]) -> String {
    format!("load average {} -> {}", fmt_load(&l[0]), fmt_load(&l[1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_summarizes() {
        let text = "seq,raw_bytes,wire_bytes,delivery_ms,inter_arrival_ms\n\
                    2,1000,500,9.000,\n3,1000,500,1.000,600.000\n4,1000,250,3.000,600.000\n";
        let r = parse_csv(text).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].inter_arrival_ms, None);
        let s = summarize(&[r], 1, 0.0);
        assert_eq!(s.ledgers, 2);
        assert_eq!(s.p50_ms, 1.0);
        assert_eq!(s.max_ms, 3.0);
        assert_eq!(s.wire_bytes, 375.0);
        // One ledger after the first kept one: 1000 bytes in 600 ms.
        let want = 1000.0 / f64::from(1 << 20) / 0.6;
        assert!(
            (s.throughput_mib_s - want).abs() < 1e-12,
            "{}",
            s.throughput_mib_s
        );
        assert!(
            (s.transfer_mib_s - want).abs() < 1e-12,
            "{}",
            s.transfer_mib_s
        );
        // Uneven arrivals: throughput takes the median gap, transfer goodput the whole span.
        let uneven = "2,1000,1000,1,\n3,1000,1000,1,100\n4,1000,1000,1,100\n5,1000,1000,1,400\n";
        let s = summarize(&[parse_csv(uneven).unwrap()], 0, 0.0);
        let mib = 1000.0 / f64::from(1 << 20);
        assert!((s.throughput_mib_s - mib / 0.1).abs() < 1e-9);
        assert!((s.transfer_mib_s - 3.0 * mib / 0.6).abs() < 1e-9);
        assert!(parse_csv("seq\n1,2\n").is_err());
    }

    #[test]
    fn quantiles_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert!(quantile(&[], 0.5).is_nan());
    }
}
