//! `ledger-bench lanes`: whole-transfer goodput against lanes under a per-flow cap, with what
//! each lane carried and how busy it was (issue 12, items 1 and 2).
//!
//! Each row starts a fresh relay in the emulated network's relay namespace (HTB class per lane
//! port, see [`crate::netem`]; the aggregate class is set far above the lanes' sum, so it never
//! binds) with a synthetic incompressible source, and one `ledger-subscribe` in the other
//! namespace that takes every ledger. Two modes:
//!
//! - **live**: the subscriber starts as soon as the relay listens, while the source is still
//!   emitting; the source's cadence is faster than the lanes can carry, so the lanes, not the
//!   source, bound the transfer (the sender serves what it cannot send at once from memory
//!   and the ring, as it would behind a burst from core);
//! - **catch-up**: the subscriber starts once the source has finished, so every ledger comes
//!   from the ring.
//!
//! The headline is the figure a user feels: raw bytes over (the last ledger's arrival at the
//! subscriber minus the subscriber's start), both by this host's clock; it includes the
//! handshakes and the tail of the last ledger. Per lane, the relay's own counters
//! (`ledger_relay_lane_*`, scraped from `/metrics` inside the relay's namespace at the end):
//! stream bytes acknowledged, packets lost, and the time the lane had bytes outstanding over
//! the transfer time (busy fraction). A lane with a lower cap (`--half-cap`) shows whether the
//! sender fills the sum of unequal caps.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};

use crate::cluster::{Cluster, RelaySettings, SubSpec};
use crate::netem::{Netem, Shape, RELAY_ADDR};
use crate::proc::sibling_binary;
use crate::report::{csv_of, table_of, Col, CsvCol};

/// How the subscriber meets the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LaneMode {
    /// Subscribed while the source emits faster than the lanes carry.
    Live,
    /// Subscribed after the source finished: every ledger from the ring.
    CatchUp,
}

impl LaneMode {
    fn name(self) -> &'static str {
        match self {
            LaneMode::Live => "live",
            LaneMode::CatchUp => "catch-up",
        }
    }
}

/// `ledger-bench lanes` settings.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
#[command(mut_arg("cadence_ms", |a| a.default_value("15ms").help("Source cadence in live rows (faster than the lanes carry, so they bind) (`600ms`, `1s`; a bare number is milliseconds, as the old `--cadence-ms` took)")))]
#[command(mut_arg("ledger_bytes", |a| a.default_value("2MiB")))]
#[command(mut_arg("ledgers", |a| a.default_value("96").help("Ledgers per row")))]
#[command(mut_arg("counts", |a| a.value_parser(clap::value_parser!(u8).range(1..=16))))]
pub struct LanesArgs {
    /// `--lane-counts` (one row each, per mode).
    #[command(flatten)]
    #[serde(flatten)]
    pub lanes: crate::cluster::LaneCounts,
    /// Modes to run.
    #[arg(long, value_delimiter = ',', default_value = "live,catch-up")]
    pub modes: Vec<LaneMode>,
    /// `--ledgers` [default: 96].
    #[command(flatten)]
    #[serde(flatten)]
    pub count: crate::cluster::Ledgers,
    /// `--size` [default: 2MiB].
    #[command(flatten)]
    #[serde(flatten)]
    pub size: crate::cluster::Size,
    /// `--chunk-bytes` (`--chunk`, the old spelling, is kept).
    #[command(flatten)]
    #[serde(flatten)]
    pub chunk: crate::cluster::Chunk,
    /// `--flow-mbit`.
    #[command(flatten)]
    #[serde(flatten)]
    pub flow: crate::cluster::FlowCap,
    /// `--cadence` [default: 15ms].
    #[command(flatten)]
    #[serde(flatten)]
    pub cadence: crate::cluster::Cadence,
    /// Also run 4 lanes with lane 0 capped at half the others (per mode).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub half_cap: bool,
    /// `--repeat`.
    #[command(flatten)]
    #[serde(flatten)]
    pub repeat: crate::cluster::Repeat,
    /// `--csv`, `--json`, and `--plots` (goodput against lanes with the ideal line; bytes per
    /// lane).
    #[command(flatten)]
    #[serde(flatten)]
    pub output: crate::cluster::Output,
    /// MTU of the emulated link, both ends of the veth pair (9001: EC2's jumbo frames)
    /// [default: 1500].
    #[arg(long, value_name = "BYTES")]
    pub link_mtu: Option<u32>,
    /// `--max-mtu`/`--min-mtu` of both ends (8952 with `--link-mtu 9001`).
    #[command(flatten)]
    #[serde(flatten)]
    pub transport: crate::cluster::Transport,
}

/// What one lane did, from the relay's counters.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct LaneStat {
    /// Lane number.
    pub lane: u8,
    /// Its cap, Mbit/s.
    pub cap_mbit: f64,
    /// Stream bytes the subscriber acknowledged on it.
    pub delivered_bytes: f64,
    /// UDP bytes sent on it (retransmissions and headers included).
    pub sent_bytes: f64,
    /// Packets declared lost.
    pub lost_packets: f64,
    /// Seconds it had bytes outstanding.
    pub busy_s: f64,
    /// Smoothed RTT at the end, ms.
    pub rtt_ms: f64,
    /// Congestion window at the end, bytes.
    pub cwnd_bytes: f64,
    /// Path MTU at the end, bytes.
    pub mtu_bytes: f64,
}

/// One row.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LaneRow {
    /// Live or catch-up.
    pub mode: LaneMode,
    /// Lanes.
    pub lanes: u8,
    /// Run number (from 1).
    pub run: u32,
    /// Ledgers delivered.
    pub ledgers: usize,
    /// Raw bytes delivered.
    pub raw_bytes: u64,
    /// Subscriber start to the last ledger's arrival, s.
    pub transfer_s: f64,
    /// Raw bytes over the transfer time, MiB/s.
    pub goodput_mib_s: f64,
    /// The sum of the lanes' caps, MiB/s.
    pub caps_mib_s: f64,
    /// Per lane.
    pub per_lane: Vec<LaneStat>,
    /// Largest deviation of a lane's bytes from its share of the total, relative to the share
    /// (shares in proportion to the caps).
    pub imbalance: f64,
    /// Subscriber CPU, s.
    pub sub_cpu_s: f64,
    /// Relay CPU, s (whole process life: source, ring and sending).
    pub relay_cpu_s: f64,
    /// Why the row failed.
    pub error: Option<String>,
}

impl LaneRow {
    /// Run `run` of `mode` over lanes capped at `caps` (Mbit/s), nothing measured yet.
    fn new(mode: LaneMode, caps: &[f64], run: u32) -> LaneRow {
        LaneRow {
            mode,
            lanes: caps.len() as u8,
            run,
            ledgers: 0,
            raw_bytes: 0,
            transfer_s: f64::NAN,
            goodput_mib_s: f64::NAN,
            caps_mib_s: caps.iter().sum::<f64>() * 1e6 / 8.0 / MIB,
            per_lane: caps
                .iter()
                .enumerate()
                .map(|(i, &c)| LaneStat {
                    lane: i as u8,
                    cap_mbit: c,
                    ..LaneStat::default()
                })
                .collect(),
            imbalance: f64::NAN,
            sub_cpu_s: f64::NAN,
            relay_cpu_s: f64::NAN,
            error: None,
        }
    }

    fn label(&self) -> String {
        let caps: Vec<f64> = self.per_lane.iter().map(|l| l.cap_mbit).collect();
        let unequal = caps.windows(2).any(|w| w[0] != w[1]);
        format!(
            "{}-l{}{}",
            self.mode.name(),
            self.lanes,
            if unequal { "-halfcap" } else { "" }
        )
    }

    fn half_capped(&self) -> bool {
        self.label().ends_with("-halfcap")
    }
}

const MIB: f64 = 1_048_576.0;

/// The lane series of a `/metrics` exposition, by lane number.
pub fn parse_lanes(text: &str) -> BTreeMap<u8, LaneStat> {
    let mut out: BTreeMap<u8, LaneStat> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("ledger_relay_lane_") else {
            continue;
        };
        let Some((name, rest)) = rest.split_once("{lane=\"") else {
            continue;
        };
        let Some((lane, value)) = rest.split_once("\"} ") else {
            continue;
        };
        let (Ok(lane), Ok(value)) = (lane.parse::<u8>(), value.trim().parse::<f64>()) else {
            continue;
        };
        let s = out.entry(lane).or_default();
        s.lane = lane;
        match name {
            "bytes_sent_total" => s.sent_bytes = value,
            "delivered_bytes_total" => s.delivered_bytes = value,
            "lost_packets_total" => s.lost_packets = value,
            "busy_seconds_total" => s.busy_s = value,
            "rtt_seconds" => s.rtt_ms = value * 1e3,
            "cwnd_bytes" => s.cwnd_bytes = value,
            "mtu_bytes" => s.mtu_bytes = value,
            _ => {}
        }
    }
    out
}

/// Largest |bytes - share| / share over lanes, each lane's share of the total in proportion
/// to its cap. 0 for fewer than two lanes or nothing carried.
pub fn imbalance(lanes: &[LaneStat]) -> f64 {
    let total: f64 = lanes.iter().map(|l| l.delivered_bytes).sum();
    let caps: f64 = lanes.iter().map(|l| l.cap_mbit).sum();
    if lanes.len() < 2 || total <= 0.0 || caps <= 0.0 {
        return 0.0;
    }
    lanes
        .iter()
        .map(|l| {
            let share = total * l.cap_mbit / caps;
            (l.delivered_bytes - share).abs() / share
        })
        .fold(0.0, f64::max)
}

fn unix_ms() -> f64 {
    ledger_relay_transport::now_ns() as f64 / 1e6
}

/// Runs every row; returns them (failed rows carry `error`).
pub fn run(args: &LanesArgs) -> anyhow::Result<Vec<LaneRow>> {
    if let Some(reason) = crate::netem::unavailable_reason() {
        bail!("the lanes bench needs the emulated network: {reason}");
    }
    let size = args.size.ledger_bytes;
    let chunk = args.chunk.chunk_bytes;
    if args.lanes.counts.is_empty() {
        bail!("--lane-counts takes at least one count");
    }
    // Before any row: every row needs them.
    sibling_binary("ledger-relay")?;
    sibling_binary("ledger-subscribe")?;
    let tmp = tempfile::tempdir()?;
    let certs = tmp.path().join("certs");
    crate::harness::make_certs(&certs, 1)?;
    let flow_bps = (args.flow.flow_mbit * 1e6) as u64;
    let max_lanes = u64::from(args.lanes.counts.iter().copied().max().unwrap_or(1).max(4));
    let mut netem = Netem::create(
        "ln",
        Shape {
            flow_bps,
            // Never binding: four times the widest row's sum of caps.
            aggregate_bps: flow_bps * max_lanes * 4,
        },
    )?;
    if let Some(mtu) = args.link_mtu {
        netem.set_mtu(mtu)?;
    }
    let mut plan: Vec<(LaneMode, Vec<f64>)> = Vec::new();
    for &mode in &args.modes {
        for &l in &args.lanes.counts {
            plan.push((mode, vec![args.flow.flow_mbit; usize::from(l)]));
        }
        if args.half_cap {
            let mut caps = vec![args.flow.flow_mbit; 4];
            caps[0] = args.flow.flow_mbit / 2.0;
            plan.push((mode, caps));
        }
    }
    let mut rows = Vec::new();
    let mut index = 0u16;
    let (work, sizes) = (tmp.path(), (size, chunk));
    for run_no in 1..=args.repeat.repeat {
        for (mode, caps) in &plan {
            index += 1;
            let mut row = LaneRow::new(*mode, caps, run_no);
            if let Err(e) = measure(&mut netem, &certs, work, index, args, sizes, &mut row) {
                row.error = Some(format!("{e:#}"));
            }
            eprintln!("ledger-bench lanes: {}", summary_line(&row));
            rows.push(row);
        }
    }
    Ok(rows)
}

fn summary_line(r: &LaneRow) -> String {
    match &r.error {
        Some(e) => format!("{} run {}: failed: {e}", r.label(), r.run),
        None => format!(
            "{} run {}: {:.1} MiB/s over {:.2} s ({:.0}% of the caps), imbalance {:.1}%",
            r.label(),
            r.run,
            r.goodput_mib_s,
            r.transfer_s,
            100.0 * r.goodput_mib_s / r.caps_mib_s,
            100.0 * r.imbalance
        ),
    }
}

#[allow(clippy::too_many_arguments)]
fn measure(
    netem: &mut Netem,
    certs: &Path,
    tmp: &Path,
    index: u16,
    args: &LanesArgs,
    (size, chunk): (u64, u64),
    row: &mut LaneRow,
) -> anyhow::Result<()> {
    let dir = tmp.join(format!("row-{index}"));
    std::fs::create_dir_all(&dir)?;
    let lane_base = 21_000 + (index % 100) * 32;
    for l in &row.per_lane {
        netem.cap_port(lane_base + u16::from(l.lane), (l.cap_mbit * 1e6) as u64)?;
    }
    let (cadence_ms, emit_ms) = match row.mode {
        // Core's 8 ms emit window, as in the main table.
        LaneMode::Live => (args.cadence.cadence_ms, args.cadence.cadence_ms.min(8.0)),
        // As fast as the ring takes them: the subscriber only starts afterwards.
        LaneMode::CatchUp => (1.0, 0.0),
    };
    let settings = RelaySettings {
        count: Some(args.count.ledgers),
        emit_ms,
        codec: "none".into(),
        chunk,
        retention: 5000,
        ..RelaySettings::endless(size, 1.0, cadence_ms)
    };
    let cluster = Cluster::local(certs, args.transport)?;
    let ns = Some((netem.relay_ns.as_str(), RELAY_ADDR));
    let mut relay = cluster.relay_in(ns, &dir, &settings, &settings.synthetic_source(), &[])?;
    // Lanes at their caps, with a floor for the handshakes, and a generous margin: a bound,
    // not a timing.
    let ideal_s = args.count.ledgers as f64 * size as f64 / (row.caps_mib_s * MIB);
    let within = Duration::from_secs_f64(ideal_s * 4.0 + 60.0);
    let outcome = (|| -> anyhow::Result<(f64, f64)> {
        if row.mode == LaneMode::CatchUp {
            relay.wait_log("source finished", within)?;
        }
        let t0 = unix_ms();
        let spec = SubSpec {
            extra: vec!["--lane-ports".into(), lane_base.to_string()],
            ..SubSpec::new("sub-0", 2, Some(args.count.ledgers), row.lanes, &dir, "sub")
        };
        let (ns, addr) = (Some(netem.sub_ns.as_str()), relay.addr.to_string());
        let (recs, sub_cpu) = cluster.run_subscriber(ns, &addr, &spec, within)?;
        let last = recs
            .iter()
            .filter_map(|r| r.received_unix_ms)
            .fold(f64::NAN, f64::max);
        if recs.len() != args.count.ledgers as usize || last.is_nan() {
            bail!(
                "the subscriber's stats hold {} ledgers of {} (or no arrival times)",
                recs.len(),
                args.count.ledgers
            );
        }
        row.ledgers = recs.len();
        row.raw_bytes = recs.iter().map(|r| r.raw_bytes).sum();
        row.transfer_s = (last - t0) / 1e3;
        row.goodput_mib_s = row.raw_bytes as f64 / MIB / row.transfer_s;
        let text = scrape(&netem.relay_ns, relay.metrics)?;
        let lanes = parse_lanes(&text);
        for l in row.per_lane.iter_mut() {
            let cap = l.cap_mbit;
            let got = lanes
                .get(&l.lane)
                .with_context(|| format!("no ledger_relay_lane_* series for lane {}", l.lane))?;
            *l = LaneStat {
                cap_mbit: cap,
                ..got.clone()
            };
        }
        row.imbalance = imbalance(&row.per_lane);
        let relay_cpu = crate::proc::cpu_seconds(relay.pid).unwrap_or(f64::NAN);
        Ok((sub_cpu, relay_cpu))
    })();
    relay.stop();
    let (sub_cpu, relay_cpu) = outcome?;
    row.sub_cpu_s = sub_cpu;
    row.relay_cpu_s = relay_cpu;
    Ok(())
}

/// The relay's `/metrics`, fetched from inside its namespace by this binary's hidden
/// `http-get` helper (the relay's address is not reachable from the host's namespace).
fn scrape(ns: &str, metrics: SocketAddr) -> anyhow::Result<String> {
    let bench = std::env::current_exe().context("locating ledger-bench")?;
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(bench)
        .args(["http-get", "--addr", &metrics.to_string()])
        .args(["--path", "/metrics"])
        .stdin(Stdio::null())
        .output()
        .context("scraping the relay's /metrics")?;
    if !out.status.success() {
        bail!(
            "scraping the relay's /metrics failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The rows as a fixed-width table (x1: goodput over the 1-lane row of the same mode and
/// run).
pub fn table(rows: &[LaneRow]) -> String {
    let rows: Vec<(&LaneRow, Option<f64>)> = rows
        .iter()
        .map(|r| (r, one_lane(rows, r.mode, r.run)))
        .collect();
    let cols: [Col<(&LaneRow, Option<f64>)>; 10] = [
        Col::l("row", 18, |x| x.0.label()),
        Col::r("run", 3, |x| x.0.run.to_string()),
        Col::r("MiB", 7, |x| format!("{:.1}", x.0.raw_bytes as f64 / MIB)),
        Col::r("xfer s", 9, |x| format!("{:.2}", x.0.transfer_s)),
        Col::r("MiB/s", 9, |x| format!("{:.2}", x.0.goodput_mib_s)),
        Col::r("x1", 6, |x| {
            x.1.map_or("-".into(), |one| format!("{:.2}", x.0.goodput_mib_s / one))
        }),
        Col::r("%caps", 7, |x| {
            format!("{:.1}", 100.0 * x.0.goodput_mib_s / x.0.caps_mib_s)
        }),
        Col::r("imbal%", 8, |x| format!("{:.1}", 100.0 * x.0.imbalance)),
        Col::r("cpu s", 8, |x| {
            format!("{:.2}", x.0.sub_cpu_s + x.0.relay_cpu_s)
        }),
        // Two spaces before the per-lane figures.
        Col::l(" per lane: MB carried / busy% / lost pkts", 0, |(r, _)| {
            let lane = |l: &LaneStat| {
                let busy = 100.0 * l.busy_s / r.transfer_s;
                format!(
                    "{:.1}/{busy:.0}/{:.0}",
                    l.delivered_bytes / 1e6,
                    l.lost_packets
                )
            };
            format!(
                " {}",
                r.per_lane.iter().map(lane).collect::<Vec<_>>().join("  ")
            )
        }),
    ];
    table_of(&cols, &rows, (2, "failed"), |x| x.0.error.as_deref())
}

/// The one-lane goodput of `mode` in run `run`.
fn one_lane(rows: &[LaneRow], mode: LaneMode, run: u32) -> Option<f64> {
    rows.iter()
        .find(|r| r.mode == mode && r.run == run && r.lanes == 1 && r.error.is_none())
        .map(|r| r.goodput_mib_s)
}

/// The targets over the rows, one line each: value, met or MISSED, and the inputs.
pub fn targets(rows: &[LaneRow]) -> String {
    let mut s = String::new();
    let mut line = |name: String, value: f64, ok: bool, why: String| {
        let verdict = crate::report::met(ok);
        s.push_str(&format!("{name:<52} {value:>6.3}  {verdict:<6} ({why})\n"));
    };
    for r in rows.iter().filter(|r| r.error.is_none()) {
        let tag = format!("{} run {}", r.label(), r.run);
        if r.half_capped() {
            let of = r.goodput_mib_s / r.caps_mib_s;
            line(
                format!("{tag}: goodput / sum of caps (>= 0.90)"),
                of,
                of >= 0.90,
                format!("{:.2} / {:.2} MiB/s", r.goodput_mib_s, r.caps_mib_s),
            );
            continue;
        }
        if r.lanes > 1 {
            line(
                format!("{tag}: largest lane deviation (<= 0.05)"),
                r.imbalance,
                r.imbalance <= 0.05,
                r.per_lane
                    .iter()
                    .map(|l| format!("{:.1}", l.delivered_bytes / 1e6))
                    .collect::<Vec<_>>()
                    .join(" / ")
                    + " MB",
            );
        }
        let need = match r.lanes {
            4 => Some(3.6),
            8 => Some(6.5),
            _ => None,
        };
        if let (Some(need), Some(one)) = (need, one_lane(rows, r.mode, r.run)) {
            let x = r.goodput_mib_s / one;
            line(
                format!("{tag}: goodput / 1 lane (>= {need})"),
                x,
                x >= need,
                format!("{:.2} / {:.2} MiB/s", r.goodput_mib_s, one),
            );
        }
    }
    s
}

/// The rows as CSV, one line per lane.
pub fn csv(rows: &[LaneRow]) -> String {
    let lanes: Vec<(&LaneRow, &LaneStat)> = rows
        .iter()
        .flat_map(|r| r.per_lane.iter().map(move |l| (r, l)))
        .collect();
    let cols: [CsvCol<(&LaneRow, &LaneStat)>; 20] = [
        ("row", |x| x.0.label()),
        ("run", |x| x.0.run.to_string()),
        ("mode", |x| x.0.mode.name().into()),
        ("lanes", |x| x.0.lanes.to_string()),
        ("ledgers", |x| x.0.ledgers.to_string()),
        ("raw_bytes", |x| x.0.raw_bytes.to_string()),
        ("transfer_s", |x| format!("{:.4}", x.0.transfer_s)),
        ("goodput_mib_s", |x| format!("{:.3}", x.0.goodput_mib_s)),
        ("caps_mib_s", |x| format!("{:.3}", x.0.caps_mib_s)),
        ("imbalance", |x| format!("{:.4}", x.0.imbalance)),
        ("lane", |x| x.1.lane.to_string()),
        ("cap_mbit", |x| x.1.cap_mbit.to_string()),
        ("delivered_bytes", |x| x.1.delivered_bytes.to_string()),
        ("sent_bytes", |x| x.1.sent_bytes.to_string()),
        ("lost_packets", |x| x.1.lost_packets.to_string()),
        ("busy_s", |x| format!("{:.4}", x.1.busy_s)),
        ("rtt_ms", |x| format!("{:.3}", x.1.rtt_ms)),
        ("cwnd_bytes", |x| x.1.cwnd_bytes.to_string()),
        ("mtu_bytes", |x| x.1.mtu_bytes.to_string()),
        ("error", |x| {
            x.0.error.as_deref().unwrap_or("").replace(',', ";")
        }),
    ];
    csv_of(&cols, &lanes)
}

/// `ledger-bench lanes`: runs, prints the table and the targets, writes CSV/JSON/plots.
pub fn main(args: &LanesArgs) -> anyhow::Result<()> {
    eprintln!(
        "ledger-bench lanes: {} ledgers of {} B per row, chunks of {} B, {} Mbit/s per flow, live cadence {} ms",
        args.count.ledgers, args.size.ledger_bytes, args.chunk.chunk_bytes, args.flow.flow_mbit, args.cadence.cadence_ms
    );
    let report = LanesReport {
        settings: args.clone(),
        rows: run(args)?,
    };
    crate::cluster::emit(&report, &args.output)?;
    if report.rows.iter().all(|r| r.error.is_some()) {
        bail!("every row failed");
    }
    Ok(())
}

/// What `ledger-bench lanes` measured, with the settings it ran with (its `--json`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct LanesReport {
    /// The arguments.
    pub settings: LanesArgs,
    /// The rows.
    pub rows: Vec<LaneRow>,
}

impl crate::cluster::Table for LanesReport {
    fn table(&self) -> String {
        table(&self.rows)
    }
    fn targets(&self) -> String {
        let t = targets(&self.rows);
        if t.is_empty() {
            t
        } else {
            format!("\ntargets (issue 12 item 2), from this run's rows:\n{t}")
        }
    }
}

impl crate::cluster::Report for LanesReport {
    fn csv(&self) -> String {
        csv(&self.rows)
    }
    fn plots(&self, dir: &Path) -> anyhow::Result<String> {
        Ok(plots(&self.rows, dir, self.settings.flow.flow_mbit)?.join(", "))
    }
}

mod plots;
pub use plots::plots;

#[cfg(test)]
mod tests;
