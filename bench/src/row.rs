//! What a row measured: one [`Row`] whatever the scenario, with optional column groups, printed
//! as one table per group and written as one CSV line per row.

use std::fmt::Write as _;

use crate::report::{opt, table_of, Col};
use crate::scenario::{Carrier, Mode, Scenario, TopoKind};
use crate::stats::{p50_p99_max, spread, summarize, Record, Spread, Summary};

/// CPU per ledger over the measured window (see [`crate::runner`]).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Cpu {
    /// The relay's (a tier's root, a hedge's A), user + system, every thread, ms.
    pub relay_ms: f64,
    /// The same without its threads off the delivery path (ring writer, source, lake export,
    /// metrics), ms.
    pub path_ms: f64,
    /// The other relays' (a tier's edges, a hedge's B), summed, ms.
    pub others_ms: Option<f64>,
    /// Each subscriber process's, mean, ms.
    pub sub_ms: Option<f64>,
    /// The relay's with no subscriber (over the baseline ledgers), ms.
    pub alone_ms: Option<f64>,
    /// The relay's per idle session per second, ms.
    pub idle_ms_per_s: Option<f64>,
}

/// The relay's resident memory.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Memory {
    /// Before any subscriber, MiB.
    pub alone_mib: Option<f64>,
    /// Largest sample over the measured window, MiB.
    pub peak_mib: f64,
    /// (Peak - alone) per session, MiB.
    pub per_session_mib: Option<f64>,
    /// (With as many idle sessions at the tip - without) per session, MiB.
    pub idle_per_session_mib: Option<f64>,
}

/// One lane number at the end of a row, from the relay's counters (`ledger_relay_lane_*`,
/// over every session).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Lane {
    /// Lane number.
    pub lane: u8,
    /// Its cap on the emulated network, Mbit/s.
    pub cap_mbit: Option<f64>,
    /// UDP bytes sent (retransmissions and headers included).
    pub sent_bytes: f64,
    /// Stream bytes the subscribers acknowledged.
    pub delivered_bytes: f64,
    /// Packets declared lost.
    pub lost_packets: f64,
    /// Seconds it had bytes outstanding.
    pub busy_s: f64,
    /// Smoothed round trip at the end, ms.
    pub rtt_ms: f64,
    /// Congestion window at the end, bytes.
    pub cwnd_bytes: f64,
    /// Path MTU at the end, bytes.
    pub mtu_bytes: f64,
}

/// What the runner took from a row, before it is summarized.
#[derive(Debug, Clone, Default)]
pub struct Taken {
    /// Each measured subscription's ledgers, the warm-up's included, in arrival order.
    pub records: Vec<Vec<Record>>,
    /// A tier's reference subscriber on the root.
    pub reference: Option<Vec<Record>>,
    /// CPU.
    pub cpu: Option<Cpu>,
    /// Memory.
    pub memory: Option<Memory>,
    /// Lanes.
    pub lanes: Vec<Lane>,
    /// The export lake's newest ledger at the end, and whether the export was degraded.
    pub export: Option<(u64, bool)>,
    /// A hedged subscriber's first look (`ledger-subscribe --stats FILE`'s FILE.first-look).
    pub first_look: Option<String>,
}

impl Taken {
    /// One subscriber's records and nothing else.
    pub fn of(records: Vec<Record>) -> Taken {
        Taken {
            records: vec![records],
            ..Taken::default()
        }
    }
}

/// One measured row.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Row {
    /// The scenario.
    pub scenario: Scenario,
    /// Why the row has no figures.
    pub error: Option<String>,
    /// Delivery over every measured subscription, after the warm-up.
    pub delivery: Option<Summary>,
    /// Model bound on delivery on the emulated network, ms: wire bytes over the usable
    /// capacity less the emit window, at least the last chunk's wire time on one flow.
    pub bound_ms: Option<f64>,
    /// First and last subscriber to finish each ledger (several subscriptions).
    pub spread: Option<Spread>,
    /// Per ledger, the last edge subscriber's delivery less the root subscriber's: p50, p99,
    /// largest, ms (a tier with `root_subscriber`).
    pub added_ms: Option<[f64; 3]>,
    /// CPU.
    pub cpu: Option<Cpu>,
    /// Memory.
    pub memory: Option<Memory>,
    /// Lanes.
    pub lanes: Vec<Lane>,
    /// Seconds from the first subscriber's first ledger to its last (the lanes' busy time is
    /// a fraction of it).
    pub span_s: f64,
    /// The export lake's newest ledger and whether the export was degraded.
    pub export: Option<(u64, bool)>,
    /// A hedged subscriber's first look, as `ledger-subscribe` wrote it (CSV).
    pub first_look: Option<String>,
    /// Every delivery sample after the warm-up, sorted, ms.
    pub delivery_ms: Vec<f64>,
}

/// The model bound, ms, of `wire` bytes per ledger at `capacity_bps`, last chunk at `flow_bps`.
pub fn model_bound_ms(
    wire: f64,
    chunk_wire: f64,
    capacity_bps: f64,
    flow_bps: f64,
    emit_ms: f64,
) -> f64 {
    // Usable: about 3% of each ~1400-byte packet is IP, UDP and QUIC headers.
    let ms = |bytes: f64, bps: f64| bytes / (bps * 0.97 / 8.0) * 1e3;
    (ms(wire, capacity_bps) - emit_ms).max(ms(chunk_wire, flow_bps.min(capacity_bps)))
}

/// The model bound of a live direct row on the emulated network with summary `s`: its
/// subscriber's share of the capacity (its lanes' caps, or one flow's for the yardstick, at
/// most its share of the aggregate), the last chunk on one flow.
fn bound(sc: &Scenario, s: &Summary) -> Option<f64> {
    let shape = sc.shape()?;
    if sc.topology != TopoKind::Direct || sc.mode == Mode::CatchUp {
        return None;
    }
    let lanes = if sc.carrier == Carrier::Tcp {
        1.0
    } else {
        f64::from(sc.lanes)
    };
    let per_sub = shape.aggregate_bps as f64 / f64::from(sc.subscribers);
    let flow = shape.flow_bps as f64;
    let cap = (lanes * flow).min(per_sub);
    let chunk_wire = (sc.chunk as f64 / s.ratio.max(1.0)).min(s.wire_bytes);
    Some(model_bound_ms(s.wire_bytes, chunk_wire, cap, flow, sc.emit))
}

impl Row {
    /// The row of `sc` from what the runner took, delivery moved by `offset_ms` (another clock).
    pub fn finish(sc: &Scenario, taken: anyhow::Result<Taken>, offset_ms: f64) -> Row {
        let mut row = Row {
            scenario: sc.clone(),
            span_s: f64::NAN,
            ..Row::default()
        };
        let mut t = match taken {
            Ok(t) => t,
            Err(e) => {
                row.error = Some(format!("{e:#}"));
                return row;
            }
        };
        t.records
            .iter_mut()
            .flatten()
            .for_each(|r| r.delivery_ms += offset_ms);
        let warm = sc.warmup as usize;
        let kept = t
            .records
            .iter()
            .map(|v| v.iter().skip(warm).copied().collect());
        let kept: Vec<Vec<Record>> = kept.collect();
        let s = summarize(&t.records, warm, sc.emit);
        row.delivery_ms = kept.iter().flatten().map(|r| r.delivery_ms).collect();
        row.delivery_ms.sort_by(f64::total_cmp);
        row.bound_ms = bound(sc, &s);
        if kept.len() > 1 {
            row.spread = Some(spread(&kept));
        }
        if let Some(reference) = &t.reference {
            let added: Vec<f64> = (reference.iter().skip(warm))
                .filter_map(|r| {
                    let edge = kept
                        .iter()
                        .filter_map(|v| v.iter().find(|x| x.seq == r.seq));
                    Some(edge.map(|x| x.delivery_ms).reduce(f64::max)? - r.delivery_ms)
                })
                .collect();
            row.added_ms = Some(p50_p99_max(added));
        }
        if let Some((a, b)) = t.records.first().and_then(|v| v.first().zip(v.last())) {
            row.span_s = (b.received_unix_ms - (a.received_unix_ms - a.delivery_ms)) / 1e3;
        }
        (
            row.delivery,
            row.cpu,
            row.memory,
            row.lanes,
            row.export,
            row.first_look,
        ) = (Some(s), t.cpu, t.memory, t.lanes, t.export, t.first_look);
        row
    }

    /// Largest deviation of a lane's delivered bytes from its share (in proportion to its cap,
    /// equal without caps), relative to the share.
    pub fn imbalance(&self) -> Option<f64> {
        let total: f64 = self.lanes.iter().map(|l| l.delivered_bytes).sum();
        let cap = |l: &Lane| l.cap_mbit.unwrap_or(1.0);
        let caps: f64 = self.lanes.iter().map(cap).sum();
        (self.lanes.len() > 1 && total > 0.0).then(|| {
            let dev = |l: &Lane| {
                (l.delivered_bytes - total * cap(l) / caps).abs() / (total * cap(l) / caps)
            };
            self.lanes.iter().map(dev).fold(0.0, f64::max)
        })
    }
}

fn mode(r: &Row) -> &'static str {
    match (r.scenario.carrier, r.scenario.mode) {
        (Carrier::Tcp, _) => "tcp",
        (Carrier::Pipe, _) => "pipe",
        (_, Mode::Live) => "live",
        (_, Mode::CatchUp) => "ring",
        (_, Mode::StoreAndForward) => "saf",
    }
}

/// `cell`, or `-` for a row the relay does not carry.
fn relayed(r: &Row, cell: String) -> String {
    if r.scenario.carrier == Carrier::Relay {
        cell
    } else {
        "-".into()
    }
}

fn net(r: &Row) -> &'static str {
    ["lo", "emu", "remote"][r.scenario.network as usize]
}

fn d(r: &Row, f: fn(&Summary) -> f64, prec: usize) -> String {
    opt(r.delivery.as_ref().map(f), prec)
}

/// Delivery p99 over the model bound.
fn over_bound(r: &Row) -> Option<f64> {
    Some(r.delivery.as_ref()?.p99_ms / r.bound_ms?)
}

fn sp(r: &&Row, f: fn(&Spread) -> f64) -> String {
    opt(r.spread.as_ref().map(f), 1)
}

fn add(r: &&Row, i: usize) -> String {
    opt(r.added_ms.map(|a| a[i]), 1)
}

fn c(r: &&Row, f: fn(&Cpu) -> Option<f64>, prec: usize) -> String {
    opt(r.cpu.as_ref().and_then(f), prec)
}

fn m(r: &&Row, f: fn(&Memory) -> Option<f64>) -> String {
    opt(r.memory.as_ref().and_then(f), 2)
}

/// Prints `head` and the tables, writes the files `out` asks for; fails when every row failed.
pub fn emit(
    out: &crate::report::Output,
    head: &str,
    rows: &[Row],
    json: &impl serde::Serialize,
) -> anyhow::Result<()> {
    let csv = || crate::report::csv(rows, &["delivery_ms"]);
    out.emit(&(head.to_owned() + &table(rows)), csv, json)?;
    crate::plots::draw(out, rows);
    anyhow::ensure!(rows.iter().any(|r| r.error.is_none()), "every row failed");
    Ok(())
}

/// Every table the rows have figures for.
pub fn table(rows: &[Row]) -> String {
    let cols: [Col<Row>; 17] = [
        Col::l("scenario", 22, |r| r.scenario.name.clone()),
        Col::r("net", 6, |r| net(r).into()),
        Col::r("mode", 4, |r| mode(r).into()),
        Col::r("ln", 3, |r| relayed(r, r.scenario.lanes.to_string())),
        Col::r("codec", 5, |r| relayed(r, r.scenario.codec.clone())),
        Col::r("subs", 4, |r| r.scenario.subscribers.to_string()),
        Col::r("p50 ms", 8, |r| d(r, |s| s.p50_ms, 2)),
        Col::r("p90 ms", 8, |r| d(r, |s| s.p90_ms, 2)),
        Col::r("p99 ms", 8, |r| d(r, |s| s.p99_ms, 2)),
        Col::r("max ms", 8, |r| d(r, |s| s.max_ms, 2)),
        Col::r("ia ms", 7, |r| d(r, |s| s.inter_p50_ms, 1)),
        Col::r("gput", 7, |r| d(r, |s| s.goodput_mib_s, 1)),
        Col::r("tput", 7, |r| d(r, |s| s.throughput_mib_s, 1)),
        Col::r("xfer", 7, |r| d(r, |s| s.transfer_mib_s, 1)),
        Col::r("ratio", 6, |r| d(r, |s| s.ratio, 2)),
        Col::r("bound", 7, |r| opt(r.bound_ms, 2)),
        Col::r("p99/b", 6, |r| opt(over_bound(r), 2)),
    ];
    let mut out = table_of(&cols, rows, 6, |r| r.error.as_deref());
    let with = |f: fn(&Row) -> bool| rows.iter().filter(|r| f(r)).collect::<Vec<&Row>>();
    let mut group = |title: &str, text: String| {
        let _ = write!(out, "\n{title}\n{text}");
    };
    let spreads = with(|r| r.spread.is_some() || r.added_ms.is_some());
    if !spreads.is_empty() {
        let cols: [Col<&Row>; 8] = [
            Col::l("scenario", 22, |r| r.scenario.name.clone()),
            Col::r("first50", 8, |r| sp(r, |s| s.first_p50_ms)),
            Col::r("first99", 8, |r| sp(r, |s| s.first_p99_ms)),
            Col::r("last50", 8, |r| sp(r, |s| s.last_p50_ms)),
            Col::r("last99", 8, |r| sp(r, |s| s.last_p99_ms)),
            Col::r("lastsh", 6, |r| sp(r, |s| s.last_share)),
            Col::r("added50", 8, |r| add(r, 0)),
            Col::r("added99", 8, |r| add(r, 1)),
        ];
        group("delivery of the first and last subscriber to finish each ledger, ms; lastsh: the largest share of ledgers one subscriber was last; added: per ledger, the edge subscriber's less the root subscriber's", table_of(&cols, &spreads, 0, |_| None));
    }
    let cpu = with(|r| r.cpu.is_some());
    if !cpu.is_empty() {
        let cols: [Col<&Row>; 11] = [
            Col::l("scenario", 22, |r| r.scenario.name.clone()),
            Col::r("relay", 7, |r| c(r, |c| Some(c.relay_ms), 2)),
            Col::r("path", 7, |r| c(r, |c| Some(c.path_ms), 2)),
            Col::r("others", 7, |r| c(r, |c| c.others_ms, 2)),
            Col::r("sub", 7, |r| c(r, |c| c.sub_ms, 2)),
            Col::r("alone", 7, |r| c(r, |c| c.alone_ms, 2)),
            Col::r("idle/s", 7, |r| c(r, |c| c.idle_ms_per_s, 3)),
            Col::r("rss0", 7, |r| m(r, |m| m.alone_mib)),
            Col::r("peak", 7, |r| m(r, |m| Some(m.peak_mib))),
            Col::r("/sess", 7, |r| m(r, |m| m.per_session_mib)),
            Col::r("idle/sess", 9, |r| m(r, |m| m.idle_per_session_mib)),
        ];
        group("CPU per ledger over the measured ledgers, ms (relay: the first relay; path: without its threads off the delivery path; others: the other relays; sub: per subscriber process; alone: with no subscriber; idle/s: per idle session per second) and the relay's memory, MiB", table_of(&cols, &cpu, 0, |_| None));
    }
    if rows.iter().any(|r| !r.lanes.is_empty()) {
        group("per lane, from the relay's counters (MB, busy % of the span, lost packets, round trip ms, window KiB, MTU)", lanes_table(rows));
    }
    for r in rows {
        if let Some(look) = &r.first_look {
            let _ = write!(out, "{}: first look\n{look}", r.scenario.name);
        }
        if let Some((newest, degraded)) = r.export {
            let last = r.delivery.as_ref().map_or(0, |_| r.scenario.ledgers);
            let (name, d) = (&r.scenario.name, if degraded { ", degraded" } else { "" });
            out += &format!("{name}: exported to ledger {newest}{d} ({last} measured)\n");
        }
    }
    out
}

fn lanes_table(rows: &[Row]) -> String {
    let mut out = String::new();
    for r in rows.iter().filter(|r| !r.lanes.is_empty()) {
        let total: f64 = r.lanes.iter().map(|l| l.delivered_bytes).sum();
        let caps: Option<f64> = r.lanes.iter().map(|l| l.cap_mbit).sum();
        let xfer = r.delivery.as_ref().map_or(f64::NAN, |s| s.transfer_mib_s);
        let of_caps = caps.map(|c| 100.0 * xfer / (c * 1e6 / 8.0 / f64::from(1 << 20)));
        let (name, imbalance) = (&r.scenario.name, r.imbalance().map(|x| 100.0 * x));
        let (imbalance, of_caps) = (opt(imbalance, 1), opt(of_caps, 1));
        out += &format!("{name}: imbalance {imbalance}%, goodput {of_caps}% of the caps\n");
        for l in &r.lanes {
            let cap = opt(l.cap_mbit, 0);
            let share = 100.0 * l.delivered_bytes / total.max(1.0);
            let (sent, got) = (l.sent_bytes / 1e6, l.delivered_bytes / 1e6);
            let (busy, cwnd) = (100.0 * l.busy_s / r.span_s, l.cwnd_bytes / 1024.0);
            let (lane, lost, rtt, mtu) = (l.lane, l.lost_packets, l.rtt_ms, l.mtu_bytes);
            out += &format!("  lane {lane}: cap {cap} Mbit/s, sent {sent:.2} MB, delivered {got:.2} MB ({share:.1}%), busy {busy:.0}%, lost {lost}, rtt {rtt:.3}, cwnd {cwnd:.1}, mtu {mtu}\n");
        }
    }
    out
}
