//! The fan-out series' table, CSV, targets and plot.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use super::{FanoutRow, Payload};
use crate::report::{csv_of, err, opt, table_of, Col, CsvCol};

fn name(p: Payload) -> &'static str {
    match p {
        Payload::Compressed => "compressed",
        Payload::Raw => "raw",
    }
}

/// The table printed on stdout.
pub fn table(rows: &[FanoutRow]) -> String {
    let cols: [Col<FanoutRow>; 19] = [
        Col::l("payload", 10, |r| name(r.payload).into()),
        Col::r("subs", 4, |r| r.subscribers.to_string()),
        Col::r("cadence", 7, |r| format!("{:.0}ms", r.cadence_ms)),
        Col::r("wire_MB", 7, |r| format!("{:.2}", r.wire_mb)),
        Col::r("cpu0_ms", 8, |r| format!("{:.1}", r.zero_cpu_ms)),
        Col::r("cpu_ms", 8, |r| format!("{:.1}", r.relay_cpu_ms)),
        Col::r("/sub_ms", 8, |r| format!("{:.2}", r.cpu_per_sub_ms)),
        Col::r("extra_ms", 8, |r| format!("{:.2}", r.extra_per_sub_ms)),
        Col::r("marg_ms", 8, |r| opt(r.marginal_ms, 2)),
        Col::r("rssA_MiB", 8, |r| {
            format!("{:.3}", r.active_rss_per_session_mib)
        }),
        Col::r("rssI_MiB", 8, |r| opt(r.idle_rss_per_session_mib, 3)),
        Col::r("idle_ms/s", 8, |r| opt(r.idle_cpu_ms_per_session_s, 3)),
        Col::r("first50", 8, |r| format!("{:.1}", r.spread.first_p50_ms)),
        Col::r("first99", 8, |r| format!("{:.1}", r.spread.first_p99_ms)),
        Col::r("last50", 8, |r| format!("{:.1}", r.spread.last_p50_ms)),
        Col::r("last99", 8, |r| format!("{:.1}", r.spread.last_p99_ms)),
        Col::r("spread", 6, |r| opt(r.spread_ratio, 2)),
        Col::r("lastsh", 6, |r| format!("{:.2}", r.spread.last_share)),
        Col::r("delivered", 9, |r| {
            let all = u32::from(r.subscribers) * r.ledgers;
            format!("{:>4}/{all:<4}", r.delivered)
        }),
    ];
    let mut s = table_of(&cols, rows, (3, "FAILED"), |r| r.error.as_deref());
    s.push_str(
        "cpu0_ms: relay CPU per ledger with no subscriber; cpu_ms: with them; /sub_ms: cpu_ms/N; \
         extra_ms: (cpu_ms-cpu0_ms)/N; marg_ms: slope from the previous row (the first row: \
         from its own cpu0_ms); rssA: (peak RSS while delivering - baseline)/N; rssI: RSS per \
         idle session; idle_ms/s: relay CPU per idle session per second; first/last: p50/p99 \
         delivery (ms) of the first and last subscriber to finish each ledger; spread: last99 \
         over the 1-subscriber row's; lastsh: largest share of ledgers one subscriber was last\n",
    );
    s
}

/// The rows as CSV.
pub fn csv(rows: &[FanoutRow]) -> String {
    let cols: [CsvCol<FanoutRow>; 24] = [
        ("payload", |r| name(r.payload).into()),
        ("subscribers", |r| r.subscribers.to_string()),
        ("cadence_ms", |r| r.cadence_ms.to_string()),
        ("ledgers", |r| r.ledgers.to_string()),
        ("wire_mb", |r| format!("{:.3}", r.wire_mb)),
        ("zero_cpu_ms", |r| format!("{:.3}", r.zero_cpu_ms)),
        ("relay_cpu_ms", |r| format!("{:.3}", r.relay_cpu_ms)),
        ("cpu_per_sub_ms", |r| format!("{:.4}", r.cpu_per_sub_ms)),
        ("extra_per_sub_ms", |r| format!("{:.4}", r.extra_per_sub_ms)),
        ("marginal_ms", |r| opt(r.marginal_ms, 4).replace('-', "")),
        ("baseline_rss_mib", |r| format!("{:.2}", r.baseline_rss_mib)),
        ("active_rss_per_session_mib", |r| {
            format!("{:.4}", r.active_rss_per_session_mib)
        }),
        ("idle_rss_per_session_mib", |r| {
            opt(r.idle_rss_per_session_mib, 4).replace('-', "")
        }),
        ("idle_cpu_ms_per_session_s", |r| {
            opt(r.idle_cpu_ms_per_session_s, 4).replace('-', "")
        }),
        ("first_p50_ms", |r| format!("{:.3}", r.spread.first_p50_ms)),
        ("first_p99_ms", |r| format!("{:.3}", r.spread.first_p99_ms)),
        ("last_p50_ms", |r| format!("{:.3}", r.spread.last_p50_ms)),
        ("last_p99_ms", |r| format!("{:.3}", r.spread.last_p99_ms)),
        ("spread_ratio", |r| opt(r.spread_ratio, 3).replace('-', "")),
        ("last_share", |r| format!("{:.3}", r.spread.last_share)),
        ("delivered", |r| r.delivered.to_string()),
        ("lagged", |r| r.lagged.to_string()),
        ("wall_s", |r| format!("{:.1}", r.wall_s)),
        ("error", |r| {
            r.error.as_deref().unwrap_or("").replace([',', '\n'], ";")
        }),
    ];
    csv_of(&cols, rows)
}

fn ok_rows(rows: &[FanoutRow], p: Payload) -> Vec<&FanoutRow> {
    rows.iter()
        .filter(|r| r.payload == p && r.error.is_none())
        .collect()
}

/// Whether the row's last subscriber kept up: its delivery p99 under the cadence. Otherwise
/// subscribers fell behind the live stream, and the CPU window (every subscriber at the first
/// measured ledger to every one at the last) covers only the stragglers' tail.
pub fn kept_up(r: &FanoutRow) -> bool {
    r.error.is_none() && r.spread.last_p99_ms < r.cadence_ms
}

/// Issue 18's targets from the rows of the run: per payload the least-squares slope of relay
/// CPU per ledger against subscribers (what each extra one costs), and at the largest count
/// the memory per idle session and the spread.
pub fn targets(rows: &[FanoutRow]) -> String {
    let mut s = String::from("\ntargets (issue 18), from this run's rows:\n");
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    for (p, limit) in [(Payload::Compressed, 1.0), (Payload::Raw, 7.0)] {
        let all = ok_rows(rows, p);
        let v: Vec<&FanoutRow> = all.iter().copied().filter(|r| kept_up(r)).collect();
        if v.len() < all.len() {
            let _ = writeln!(
                s,
                "  {} rows left out, their last subscriber did not keep up (p99 over the cadence): {:?}",
                name(p),
                all.iter()
                    .filter(|r| !kept_up(r))
                    .map(|r| r.subscribers)
                    .collect::<Vec<_>>()
            );
        }
        let pts: Vec<(f64, f64)> = v
            .iter()
            .map(|r| (f64::from(r.subscribers), r.relay_cpu_ms))
            .collect();
        if let Some(slope) = crate::harness::slope(&pts) {
            let _ = writeln!(
                s,
                "  {} relay CPU per extra subscriber per ledger: {slope:.2} ms (slope over {} rows) <= {limit} ms: {}",
                name(p),
                pts.len(),
                verdict(slope <= limit)
            );
        }
        let Some(big) = v.iter().max_by_key(|r| r.subscribers) else {
            continue;
        };
        if let Some(m) = big.idle_rss_per_session_mib {
            let _ = writeln!(
                s,
                "  {} RSS per idle session at {}: {m:.3} MiB <= 1 MiB: {}",
                name(p),
                big.subscribers,
                verdict(m <= 1.0)
            );
        }
        if let Some(x) = big.spread_ratio.filter(|_| big.subscribers > 1) {
            let _ = writeln!(
                s,
                "  {} spread at {}: last p99 {:.1} ms = {x:.2}x the single subscriber's <= 2x: {}",
                name(p),
                big.subscribers,
                big.spread.last_p99_ms,
                verdict(x <= 2.0)
            );
        }
    }
    s
}

/// Writes `fanout-relay-cpu.svg` into `dir`: relay CPU per ledger against subscribers, one line
/// per payload, with each payload's target (its no-subscriber CPU plus 1 or 7 ms per
/// subscriber) dashed. Returns the file written.
pub fn plot(rows: &[FanoutRow], dir: &Path) -> anyhow::Result<String> {
    crate::report::register_font()?;
    std::fs::create_dir_all(dir)?;
    let path = dir.join("fanout-relay-cpu.svg");
    let xmax = rows
        .iter()
        .map(|r| f64::from(r.subscribers))
        .fold(1.0, f64::max)
        * 1.05;
    let ymax = rows
        .iter()
        .filter(|r| r.error.is_none())
        .map(|r| r.relay_cpu_ms)
        .fold(1.0, f64::max)
        * 1.15;
    let root = SVGBackend::new(&path, (1000, 640)).into_drawing_area();
    let mut chart = crate::report::frame(
        &root,
        "Fan-out: relay CPU per ledger against subscribers (loopback, 4 lanes)",
        (0f64..xmax, "subscribers"),
        (0f64..ymax, "relay CPU ms per ledger"),
    )?;
    for (p, color, limit) in [(Payload::Compressed, BLUE, 1.0), (Payload::Raw, RED, 7.0)] {
        let v = ok_rows(rows, p);
        if v.is_empty() {
            continue;
        }
        let pts: Vec<(f64, f64)> = v
            .iter()
            .map(|r| (f64::from(r.subscribers), r.relay_cpu_ms))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(format!("{} (measured)", name(p)))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 4, color.filled())))
            .map_err(err)?;
        let zero = v.iter().map(|r| r.zero_cpu_ms).sum::<f64>() / v.len() as f64;
        let target: Vec<(f64, f64)> = [0.0, xmax].iter().map(|&x| (x, zero + limit * x)).collect();
        chart
            .draw_series(DashedLineSeries::new(
                target,
                6,
                4,
                color.mix(0.5).stroke_width(1),
            ))
            .map_err(err)?
            .label(format!(
                "{} target: no-subscriber CPU + {limit} ms each",
                name(p)
            ))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.mix(0.5)));
    }
    crate::report::legend(&mut chart, SeriesLabelPosition::UpperLeft, 12)?;
    root.present().map_err(err)?;
    Ok(path.display().to_string())
}
