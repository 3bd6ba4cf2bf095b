//! Per-ledger records (the `ledger-subscribe --stats` CSV, and what the in-process carriers
//! measure alike) and their summaries.

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
    /// When the ledger was complete at the subscriber, ms since the Unix epoch by its clock.
    pub received_unix_ms: f64,
}

/// Parses a stats CSV (the first ledger's inter-arrival is empty).
pub fn parse_csv(text: &str) -> anyhow::Result<Vec<Record>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if (i == 0 && line.starts_with("seq")) || line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() != 6 {
            bail!("line {}: expected 6 fields, got {line:?}", i + 1);
        }
        let n = |k: usize| -> anyhow::Result<f64> {
            f[k].parse::<f64>()
                .with_context(|| format!("line {}: field {}", i + 1, k + 1))
        };
        out.push(Record {
            seq: n(0)? as u32,
            raw_bytes: n(1)? as u64,
            wire_bytes: n(2)? as u64,
            delivery_ms: n(3)?,
            inter_arrival_ms: if f[4].is_empty() { None } else { Some(n(4)?) },
            received_unix_ms: n(5)?,
        });
    }
    Ok(out)
}

/// Reads a stats CSV written by a process that may have been killed: a last line cut short
/// is left out, and a missing file (killed before it was created) reads as empty.
pub fn read_lenient(path: &Path) -> anyhow::Result<Vec<Record>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let whole = text.rfind('\n').map_or("", |i| &text[..=i]);
    parse_csv(whole).with_context(|| format!("parsing {}", path.display()))
}

/// Quantile `q` (0..=1) of sorted values, nearest rank.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// p50, p99 and the largest of `values`, ms (NaN when empty).
pub fn p50_p99_max(mut values: Vec<f64>) -> [f64; 3] {
    values.sort_by(f64::total_cmp);
    let max = values.last().copied().unwrap_or(f64::NAN);
    [quantile(&values, 0.5), quantile(&values, 0.99), max]
}

/// Delivery and throughput of a row's subscribers after the warm-up.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Ledgers counted, over every subscriber.
    pub ledgers: usize,
    /// Delivery p50, ms.
    pub p50_ms: f64,
    /// Delivery p90, ms.
    pub p90_ms: f64,
    /// Delivery p99, ms.
    pub p99_ms: f64,
    /// Largest delivery, ms.
    pub max_ms: f64,
    /// Median inter-arrival, ms.
    pub inter_p50_ms: f64,
    /// Mean raw bytes per ledger.
    pub raw_bytes: f64,
    /// Mean wire bytes per ledger.
    pub wire_bytes: f64,
    /// Raw over wire.
    pub ratio: f64,
    /// One ledger's goodput: its raw bytes over its delivery plus the emit window (from the
    /// first byte the relay could send), MiB/s, median over ledgers.
    pub goodput_mib_s: f64,
    /// Sustained throughput: mean raw bytes per ledger over the median inter-arrival, MiB/s,
    /// averaged over subscribers (the source's rate on live rows, the path's on catch-up).
    pub throughput_mib_s: f64,
    /// Whole-transfer goodput: raw bytes of the ledgers after the first counted one over the
    /// time from its arrival to the last, MiB/s, averaged over subscribers (one clock).
    pub transfer_mib_s: f64,
}

/// Summarizes each subscriber's records (in arrival order) after the first `warmup` of each.
pub fn summarize(subs: &[Vec<Record>], warmup: usize, emit_ms: f64) -> Summary {
    let kept: Vec<&Record> = subs.iter().flat_map(|v| v.iter().skip(warmup)).collect();
    if kept.is_empty() {
        return Summary::default();
    }
    let mib = f64::from(1 << 20);
    let mut d: Vec<f64> = kept.iter().map(|r| r.delivery_ms).collect();
    d.sort_by(f64::total_cmp);
    let after_first = subs.iter().flat_map(|v| v.iter().skip(warmup + 1));
    let mut ia: Vec<f64> = after_first.filter_map(|r| r.inter_arrival_ms).collect();
    ia.sort_by(f64::total_cmp);
    let raw = kept.iter().map(|r| r.raw_bytes as f64).sum::<f64>() / kept.len() as f64;
    let wire = kept.iter().map(|r| r.wire_bytes as f64).sum::<f64>() / kept.len() as f64;
    let goodput = |r: &&Record| r.raw_bytes as f64 / mib / ((r.delivery_ms + emit_ms) / 1e3);
    let mut gp: Vec<f64> = kept.iter().map(goodput).collect();
    gp.sort_by(f64::total_cmp);
    // Per subscriber, over the ledgers after its first counted one.
    let (mut tput, mut xfer) = (Vec::new(), Vec::new());
    for v in subs {
        let after: Vec<&Record> = v.iter().skip(warmup + 1).collect();
        let mut gaps: Vec<f64> = after.iter().filter_map(|r| r.inter_arrival_ms).collect();
        gaps.sort_by(f64::total_cmp);
        let bytes: f64 = after.iter().map(|r| r.raw_bytes as f64).sum();
        let (median, secs) = (quantile(&gaps, 0.5), gaps.iter().sum::<f64>() / 1e3);
        if median > 0.0 {
            tput.push(bytes / after.len() as f64 / mib / (median / 1e3));
        }
        if secs > 0.0 {
            xfer.push(bytes / mib / secs);
        }
    }
    Summary {
        ledgers: kept.len(),
        p50_ms: quantile(&d, 0.5),
        p90_ms: quantile(&d, 0.9),
        p99_ms: quantile(&d, 0.99),
        max_ms: d[d.len() - 1],
        inter_p50_ms: quantile(&ia, 0.5),
        raw_bytes: raw,
        wire_bytes: wire,
        ratio: raw / wire.max(1.0),
        goodput_mib_s: quantile(&gp, 0.5),
        // NaN without a figure (0 / 0).
        throughput_mib_s: tput.iter().sum::<f64>() / tput.len() as f64,
        transfer_mib_s: xfer.iter().sum::<f64>() / xfer.len() as f64,
    }
}

/// Delivery of the first and the last subscriber to finish each ledger.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Spread {
    /// p50 over the ledgers of the first subscriber's delivery, ms.
    pub first_p50_ms: f64,
    /// p99 of the same.
    pub first_p99_ms: f64,
    /// p50 of the last subscriber's delivery, ms.
    pub last_p50_ms: f64,
    /// p99 of the same.
    pub last_p99_ms: f64,
    /// Largest fraction of the ledgers that one subscriber was the last to finish (1/N when
    /// nobody is always last, 1 when the same one always is).
    pub last_share: f64,
}

/// The first and last delivery of each ledger that every one of `subs` holds.
pub fn spread(subs: &[Vec<Record>]) -> Spread {
    let Some(first_sub) = subs.first() else {
        return Spread::default();
    };
    let (mut firsts, mut lasts) = (Vec::new(), Vec::new());
    let mut last_count = vec![0usize; subs.len()];
    for seq in first_sub.iter().map(|r| r.seq) {
        let of = |v: &Vec<Record>| v.iter().find(|r| r.seq == seq).map(|r| r.delivery_ms);
        let d: Vec<f64> = subs.iter().filter_map(of).collect();
        if d.len() != subs.len() {
            continue;
        }
        // The first to finish last, as `max_by` takes the last of equals.
        let latest = d
            .iter()
            .copied()
            .enumerate()
            .rev()
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let (i, last) = latest.unwrap_or((0, f64::NAN));
        last_count[i] += 1;
        firsts.push(d.iter().copied().fold(f64::INFINITY, f64::min));
        lasts.push(last);
    }
    let n = firsts.len().max(1) as f64;
    let ([f50, f99, _], [l50, l99, _]) = (p50_p99_max(firsts), p50_p99_max(lasts));
    Spread {
        first_p50_ms: f50,
        first_p99_ms: f99,
        last_p50_ms: l50,
        last_p99_ms: l99,
        last_share: last_count.into_iter().max().unwrap_or(0) as f64 / n,
    }
}
