//! Scenarios: what one row of a run is, and how it is run.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::baseline::Pacing;
use crate::cluster::{Cadence, Cluster, Count, Emit, RelaySettings, Size, SubSpec};
use crate::harness::log_tail;
use crate::netem::{Netem, Shape, RELAY_ADDR, SUB_ADDR};
use crate::proc::{cpu_seconds, kill_all, thread_cpu_seconds, wait_with_cpu};
use crate::stats::{read_csv, summarize, Record, Summary};

/// Ledger payload.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub enum Payload {
    /// Synthetic ledgers at this zstd-1 ratio (1 = incompressible).
    Synthetic(f64),
    /// A record-marked dump file.
    File(PathBuf),
}

impl Payload {
    /// Short label for tables.
    pub fn label(&self) -> String {
        match self {
            Payload::Synthetic(r) if *r <= 1.0 => "raw".into(),
            Payload::Synthetic(r) => format!("x{r}"),
            Payload::File(p) => format!(
                "file:{}",
                p.file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default()
            ),
        }
    }
}

/// How the relay delivers in a row; the default is the product's: chunks streamed while the
/// source writes, live, as many streams per lane as there are chunks in flight.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Mode {
    /// `--streams-per-lane`: chunk streams the relay writes at once on one lane.
    pub streams_per_lane: Option<u16>,
    /// `--store-and-forward`: send a ledger only once the source has written all of it.
    pub store_and_forward: bool,
    /// Bulk catch-up: the subscribers start only after the relay has stored every ledger, so
    /// they read back to back from the ring and the row measures sustained goodput (delivery
    /// times are then queueing, not latency, and the row has no model bound). The relay runs
    /// with `--window 1`, so ledgers complete one after another, evenly spaced.
    pub catch_up: bool,
}

/// Source cadence of catch-up rows: the ring fills quickly, the subscribers start after.
const CATCH_UP_CADENCE_MS: f64 = 20.0;

/// What carries the ledgers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub enum Kind {
    /// `ledger-relay run` and `subscribers` `ledger-subscribe` processes.
    Relay {
        /// Lanes per subscriber.
        lanes: u8,
        /// Relay codec.
        codec: String,
        /// Payload.
        payload: Payload,
        /// Subscribers at once.
        subscribers: u8,
        /// Delivery mode.
        mode: Mode,
    },
    /// One TCP connection carrying ledgers of the same size, uncompressed.
    Tcp,
    /// A local pipe read of ledgers of the same size.
    Pipe,
    /// A relay running elsewhere (`ledger-bench remote`): one `ledger-subscribe` with `lanes`
    /// lanes, or (`None`) the relay's TCP baseline, one TLS-over-TCP flow.
    Remote {
        /// The relay's QUIC address, or its TCP baseline's.
        addr: String,
        /// Lanes; `None` for the TCP baseline.
        lanes: Option<u8>,
    },
}

/// One row.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Scenario {
    /// Row name.
    pub name: String,
    /// What carries the ledgers.
    pub kind: Kind,
    /// Over the emulated network (else loopback / in-process).
    pub emulated: bool,
}

/// Settings shared by every row of a run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Settings {
    /// Ledgers per subscriber (warm-up included).
    pub ledgers: u32,
    /// Ledgers left out at the start of each subscriber.
    pub warmup: u32,
    /// Synthetic ledger size, bytes.
    pub size: u64,
    /// Time between ledgers.
    pub cadence_ms: f64,
    /// Emit window.
    pub emit_ms: f64,
    /// Relay chunk size, bytes.
    pub chunk: u64,
    /// Emulated path.
    pub shape: Shape,
    /// Scale factor (EC2's 5 Gbit/s over the per-flow cap).
    pub scale: f64,
    /// QUIC packet ceiling of the relay rows' both ends (`max_mtu`; default the transport's).
    pub max_mtu: Option<u16>,
    /// QUIC packet floor of the relay rows' both ends (`min_mtu`).
    pub min_mtu: Option<u16>,
}

impl Scenario {
    /// The network column: `lo`, `emu` or `remote`.
    pub fn network(&self) -> &'static str {
        match self.kind {
            Kind::Remote { .. } => "remote",
            _ if self.emulated => "emu",
            _ => "lo",
        }
    }
}

/// One measured row.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    /// The scenario.
    pub scenario: Scenario,
    /// Lanes (1 for the baselines).
    pub lanes: u8,
    /// Subscribers.
    pub subscribers: u8,
    /// Delivery and throughput summary.
    pub summary: Summary,
    /// Relay CPU per ledger emitted, ms (user + system, all threads), measured after the first
    /// ledger arrived so start-up and synthetic generation ahead of time are left out.
    pub relay_cpu_ms: Option<f64>,
    /// Mean subscriber CPU per ledger, ms (whole process life, handshakes included).
    pub sub_cpu_ms: Option<f64>,
    /// Relay CPU per ledger on the delivery path, ms: `relay_cpu_ms` (same window) without the
    /// threads off that path (ring writer, source, lake export, metrics).
    pub relay_path_cpu_ms: Option<f64>,
    /// Mean subscriber CPU per ledger, ms, over the same window as `relay_cpu_ms` (after
    /// warm-up: no start-up or handshakes).
    pub sub_run_cpu_ms: Option<f64>,
    /// Each lane of the first subscriber at the end of the run (its `--lane-stats` file).
    pub per_lane: Vec<crate::perlane::LaneFig>,
    /// CPU at the real ledger size and the projected EC2 delivery ([`crate::projection`]).
    pub projection: Option<crate::projection::Projection>,
    /// Model bound on delivery, ms: wire bytes over usable capacity less the overlap with the
    /// emit window, at least one chunk's wire time. `None` without a capacity (loopback).
    pub bound_ms: Option<f64>,
    /// Delivery p99 over the bound.
    pub p99_over_bound: Option<f64>,
    /// First ledger's last source byte to last ledger delivered (first subscriber, after
    /// warm-up), seconds.
    pub wall_s: f64,
    /// Sorted delivery samples after warm-up (for the CDF).
    pub delivery_ms: Vec<f64>,
    /// Why the row has no numbers.
    pub error: Option<String>,
}

impl Row {
    /// A row of `sc` with nothing measured yet.
    pub fn empty(sc: &Scenario, lanes: u8, subscribers: u8) -> Row {
        Row {
            scenario: sc.clone(),
            lanes,
            subscribers,
            summary: Summary::default(),
            relay_cpu_ms: None,
            sub_cpu_ms: None,
            relay_path_cpu_ms: None,
            sub_run_cpu_ms: None,
            per_lane: Vec::new(),
            projection: None,
            bound_ms: None,
            p99_over_bound: None,
            wall_s: f64::NAN,
            delivery_ms: Vec::new(),
            error: None,
        }
    }
}

/// Paths and binaries for a run.
#[derive(Debug)]
pub struct Env {
    /// How relays and subscribers start (certificates: relay + sub-0..sub-15).
    pub cluster: Cluster,
    /// `ledger-bench` itself (for the TCP baseline subcommands).
    pub bench_bin: PathBuf,
    /// Scratch space.
    pub tmp: PathBuf,
    /// The emulated network, when used.
    pub netem: Option<Netem>,
    /// Rows run so far (ports and directories are per row).
    pub index: u32,
}

/// Most subscribers in one row.
pub const MAX_SUBSCRIBERS: u8 = 16;

/// Model bound in ms for `wire` bytes per ledger (mean) at `capacity_bps` per subscriber; the
/// last chunk travels on one lane, at most `flow_bps`.
pub fn model_bound_ms(
    wire: f64,
    chunk_wire: f64,
    capacity_bps: f64,
    flow_bps: f64,
    emit_ms: f64,
) -> f64 {
    // Usable: about 3% of each ~1400-byte packet is IP, UDP and QUIC headers.
    let usable = capacity_bps * 0.97 / 8.0;
    let whole = wire / usable * 1e3;
    let last_chunk = chunk_wire / (flow_bps.min(capacity_bps) * 0.97 / 8.0) * 1e3;
    (whole - emit_ms).max(last_chunk)
}

fn capacity_bps(s: &Settings, lanes: u8, subscribers: u8) -> f64 {
    let per_sub = s.shape.aggregate_bps as f64 / f64::from(subscribers.max(1));
    (f64::from(lanes) * s.shape.flow_bps as f64).min(per_sub)
}

/// Runs one row; a failure becomes a row with `error` set.
pub fn run(env: &mut Env, s: &Settings, sc: &Scenario) -> Row {
    env.index += 1;
    let (lanes, subs) = match &sc.kind {
        Kind::Relay {
            lanes, subscribers, ..
        } => (*lanes, *subscribers),
        _ => (1, 1),
    };
    let mut row = Row::empty(sc, lanes, subs);
    let result = match &sc.kind {
        Kind::Relay { .. } => run_relay(env, s, sc, &mut row),
        Kind::Tcp => run_tcp(env, s, sc, &mut row),
        Kind::Pipe => {
            crate::baseline::pipe(pacing(s)).map(|r| finish(s, &mut row, &[r], s.chunk as f64))
        }
        Kind::Remote { .. } => Err(anyhow::anyhow!(
            "a remote row runs with `ledger-bench remote`"
        )),
    };
    if let Err(e) = result {
        row.error = Some(format!("{e:#}"));
    }
    row
}

fn pacing(s: &Settings) -> Pacing {
    Pacing {
        size: Size {
            ledger_bytes: s.size,
        },
        count: Count { count: s.ledgers },
        cadence: Cadence {
            cadence_ms: s.cadence_ms,
        },
        emit: Emit { emit_ms: s.emit_ms },
        piece: s.chunk as usize,
    }
}

/// Fills `row` from each subscriber's records: the summary after warm-up, the sorted delivery
/// samples, the wall time and, on the emulated network, the model bound (`chunk_wire`: the
/// wire bytes of a ledger's last chunk).
pub fn finish(s: &Settings, row: &mut Row, subs: &[Vec<Record>], chunk_wire: f64) {
    let warm = s.warmup as usize;
    row.summary = summarize(subs, warm, s.emit_ms);
    let mut d: Vec<f64> = subs
        .iter()
        .flat_map(|v| v.iter().skip(warm).map(|r| r.delivery_ms))
        .collect();
    d.sort_by(f64::total_cmp);
    row.delivery_ms = d;
    if let Some(first) = subs.first() {
        let kept: Vec<&Record> = first.iter().skip(warm).collect();
        if let Some(f) = kept.first() {
            let ia: f64 = kept.iter().skip(1).filter_map(|r| r.inter_arrival_ms).sum();
            row.wall_s = (ia + f.delivery_ms) / 1e3;
        }
    }
    let catch_up = matches!(row.scenario.kind, Kind::Relay { mode, .. } if mode.catch_up);
    if row.scenario.emulated && row.summary.ledgers > 0 && !catch_up {
        let cap = capacity_bps(s, row.lanes, row.subscribers);
        let chunk_wire = chunk_wire.min(row.summary.wire_bytes);
        let b = model_bound_ms(
            row.summary.wire_bytes,
            chunk_wire,
            cap,
            s.shape.flow_bps as f64,
            s.emit_ms,
        );
        row.bound_ms = Some(b);
        row.p99_over_bound = Some(row.summary.p99_ms / b);
    }
}

fn run_tcp(env: &mut Env, s: &Settings, sc: &Scenario, row: &mut Row) -> anyhow::Result<()> {
    let dir = env.tmp.join(format!("row-{}", env.index));
    std::fs::create_dir_all(&dir)?;
    let port = 30_000 + env.index as u16;
    let (send_ns, recv_ns, addr) = match (&mut env.netem, sc.emulated) {
        (Some(n), true) => {
            n.cap_port(port, s.shape.flow_bps)?;
            (Some(n.relay_ns.clone()), Some(n.sub_ns.clone()), SUB_ADDR)
        }
        (None, true) => bail!("emulated network not set up"),
        _ => (None, None, "127.0.0.1"),
    };
    let stats = dir.join("stats-0.csv");
    let p = pacing(s);
    let mut children: Vec<Child> = Vec::new();
    let recv = Netem::exec_in(recv_ns.as_deref(), &env.bench_bin)
        .args(["tcp-recv", "--listen", &format!("{addr}:{port}")])
        .args(["--count", &s.ledgers.to_string(), "--stats"])
        .arg(&stats)
        .stdout(Stdio::null())
        .stderr(File::create(dir.join("recv.log"))?)
        .spawn()
        .context("starting tcp-recv")?;
    crate::proc::track(&recv);
    children.push(recv);
    let send = Netem::exec_in(send_ns.as_deref(), &env.bench_bin)
        .args(["tcp-send", "--connect", &format!("{addr}:{port}")])
        .args([
            "--size",
            &p.size.ledger_bytes.to_string(),
            "--count",
            &p.count.count.to_string(),
        ])
        .args(["--cadence", &format!("{}ms", p.cadence.cadence_ms)])
        .args([
            "--emit-ms",
            &p.emit.emit_ms.to_string(),
            "--piece",
            &p.piece.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(File::create(dir.join("send.log"))?)
        .spawn()
        .context("starting tcp-send")?;
    crate::proc::track(&send);
    children.push(send);
    let deadline =
        Instant::now() + Duration::from_secs_f64(f64::from(s.ledgers) * s.cadence_ms / 1e3 + 30.0);
    let mut cpu = Vec::new();
    for c in children.iter_mut() {
        match wait_with_cpu(c, deadline)? {
            Some((st, t)) if st.success() => cpu.push(t),
            Some((st, _)) => {
                kill_all(&mut children);
                bail!(
                    "TCP baseline process failed ({st}); logs in {}",
                    dir.display()
                );
            }
            None => {
                kill_all(&mut children);
                bail!("TCP baseline timed out; logs in {}", dir.display());
            }
        }
    }
    row.sub_cpu_ms = Some(cpu[0] * 1e3 / f64::from(s.ledgers));
    row.relay_cpu_ms = Some(cpu[1] * 1e3 / f64::from(s.ledgers));
    let recs = read_csv(&stats)?;
    finish(s, row, &[recs], s.chunk as f64);
    Ok(())
}

/// CPU per ledger over the measured window, ms: the relay's total, the relay's delivery path
/// and the subscribers' mean (when every subscriber was read at the window's start).
type WindowCpu = (f64, f64, Option<f64>);

/// Relay threads whose CPU is not on the delivery path (by name prefix): the ring writer, the
/// source's reader or generator, the lake export and the metrics server.
const OFF_PATH_THREADS: &[&str] = &["ring-writer", "source-", "lake-export", "metrics"];

/// CPU of the relay's threads and of each subscriber at the start of the measured window.
#[derive(Default)]
struct Marks {
    threads: std::collections::BTreeMap<String, f64>,
    subs: Vec<Option<f64>>,
}

impl Marks {
    fn take(relay_pid: u32, subs: &[Child]) -> Marks {
        Marks {
            threads: thread_cpu_seconds(relay_pid),
            subs: subs.iter().map(|c| cpu_seconds(c.id())).collect(),
        }
    }
}

/// CPU seconds the off-path threads spent between two per-thread readings.
fn off_path_seconds(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
) -> f64 {
    after
        .iter()
        .filter(|(name, _)| OFF_PATH_THREADS.iter().any(|p| name.starts_with(p)))
        .map(|(name, c)| (c - before.get(name).copied().unwrap_or(0.0)).max(0.0))
        .sum()
}

fn rows_in(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.lines().count().saturating_sub(1))
        .unwrap_or(0)
}

fn run_relay(env: &mut Env, s: &Settings, sc: &Scenario, row: &mut Row) -> anyhow::Result<()> {
    let Kind::Relay {
        lanes,
        codec,
        payload,
        subscribers,
        mode,
    } = &sc.kind
    else {
        bail!("not a relay row");
    };
    let (lanes, subscribers) = (*lanes, (*subscribers).clamp(1, MAX_SUBSCRIBERS));
    let dir = env.tmp.join(format!("row-{}", env.index));
    std::fs::create_dir_all(&dir)?;
    let lane_base = 20_000 + (env.index as u16 % 100) * 256;
    let (relay_ns, sub_ns) = match (&mut env.netem, sc.emulated) {
        (Some(n), true) => {
            for k in 0..u16::from(subscribers) * u16::from(lanes) {
                n.cap_port(lane_base + k, s.shape.flow_bps)?;
            }
            (Some(n.relay_ns.clone()), Some(n.sub_ns.clone()))
        }
        (None, true) => bail!("emulated network not set up"),
        _ => (None, None),
    };
    let (ratio, start, count) = match payload {
        Payload::Synthetic(ratio) => (*ratio, 2u32, s.ledgers),
        Payload::File(path) => {
            let first = first_seq(path)?;
            (1.0, first.0, s.ledgers.min(first.1))
        }
    };
    let cadence_ms = if mode.catch_up {
        s.cadence_ms.min(CATCH_UP_CADENCE_MS)
    } else {
        s.cadence_ms
    };
    let mut extra: Vec<String> = Vec::new();
    if let Some(n) = mode.streams_per_lane {
        extra.extend(["--streams-per-lane".into(), n.to_string()]);
    }
    if mode.store_and_forward {
        extra.push("--store-and-forward".into());
    }
    if mode.catch_up {
        // One ledger in flight at a time: with a window of several, QUIC interleaves their
        // streams and they complete in bursts, which inter-arrival times cannot measure.
        extra.extend(["--window".into(), "1".into()]);
    }
    let settings = RelaySettings {
        count: Some(count),
        start,
        emit_ms: s.emit_ms,
        codec: codec.to_string(),
        chunk: s.chunk,
        retention: 5000,
        ..RelaySettings::endless(s.size, ratio, cadence_ms)
    };
    let source = match payload {
        Payload::Synthetic(_) => settings.synthetic_source(),
        Payload::File(path) => format!("file:{}", path.display()),
    };
    let ns = relay_ns.as_deref().map(|n| (n, RELAY_ADDR));
    let mut relay = env.cluster.relay_in(ns, &dir, &settings, &source, &extra)?;
    let relay_pid = relay.pid;
    let mut subs: Vec<Child> = Vec::new();
    let outcome = (|| -> anyhow::Result<(Option<WindowCpu>, Vec<f64>)> {
        if mode.catch_up {
            let within = Duration::from_secs_f64(f64::from(count) * cadence_ms / 1e3 + 60.0);
            relay.wait_log("source finished", within)?;
        }
        for i in 0..subscribers {
            let lane_ports = lane_base + u16::from(i) * u16::from(lanes);
            let spec = SubSpec {
                extra: vec![
                    "--lane-ports".into(),
                    lane_ports.to_string(),
                    "--lane-stats".into(),
                    dir.join(format!("lanes-{i}.csv")).display().to_string(),
                    "--lane-stats-interval".into(),
                    "250ms".into(),
                ],
                ..SubSpec::new(
                    format!("sub-{i}"),
                    start,
                    Some(count),
                    lanes,
                    &dir,
                    &format!("sub-{i}"),
                )
            };
            subs.push(env.cluster.subscriber_to(
                sub_ns.as_deref(),
                &relay.addr.to_string(),
                &spec,
            )?);
        }
        // Relay CPU is counted from the first delivered ledger after warm-up: calibration,
        // generation ahead of time and handshakes are left out.
        let first_stats = dir.join("sub-0.csv");
        let deadline =
            Instant::now() + Duration::from_secs_f64(f64::from(count) * s.cadence_ms / 1e3 + 60.0);
        let mut mark: Option<(f64, usize)> = None;
        let mut marked = Marks::default();
        let mut done: Vec<Option<f64>> = vec![None; subs.len()];
        loop {
            if mark.is_none() {
                let n = rows_in(&first_stats);
                if n > s.warmup as usize {
                    mark = cpu_seconds(relay_pid).map(|c| (c, n));
                    marked = Marks::take(relay_pid, &subs);
                }
            }
            for (i, c) in subs.iter_mut().enumerate() {
                if done[i].is_some() {
                    continue;
                }
                if let Some((st, cpu)) = wait_with_cpu(c, Instant::now())? {
                    if !st.success() {
                        let tail = log_tail(&dir.join(format!("sub-{i}.log")), 3);
                        bail!("subscriber {i} failed ({st}): {tail}");
                    }
                    done[i] = Some(cpu);
                }
            }
            if done.iter().all(Option::is_some) {
                break;
            }
            if Instant::now() > deadline {
                bail!("timed out; logs in {}", dir.display());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let off_path = off_path_seconds(&marked.threads, &thread_cpu_seconds(relay_pid));
        let relay_cpu = match (mark, cpu_seconds(relay_pid)) {
            (Some((c0, n0)), Some(c1)) => {
                let n1 = rows_in(&first_stats);
                (n1 > n0).then(|| {
                    let per = |secs: f64| secs * 1e3 / (n1 - n0) as f64;
                    let path = per((c1 - c0 - off_path).max(0.0));
                    // Each subscriber's CPU after the mark, over the ledgers after it.
                    let subs_after: Vec<f64> = marked
                        .subs
                        .iter()
                        .zip(&done)
                        .filter_map(|(m, d)| Some(d.as_ref()? - m.as_ref()?))
                        .collect();
                    let sub = (subs_after.len() == done.len())
                        .then(|| per(subs_after.iter().sum::<f64>() / subs_after.len() as f64));
                    (per(c1 - c0), path, sub)
                })
            }
            _ => None,
        };
        Ok((
            relay_cpu,
            done.into_iter().map(|c| c.unwrap_or(f64::NAN)).collect(),
        ))
    })();
    kill_all(&mut subs);
    relay.stop();
    let (relay_cpu, sub_cpu) = outcome?;
    row.relay_cpu_ms = relay_cpu.map(|c| c.0);
    row.relay_path_cpu_ms = relay_cpu.map(|c| c.1);
    row.sub_run_cpu_ms = relay_cpu.and_then(|c| c.2);
    // Per-lane figures: the first subscriber's lane file (absent from older binaries).
    row.per_lane = crate::perlane::read_lane_file(&dir.join("lanes-0.csv")).unwrap_or_default();
    row.sub_cpu_ms =
        Some(sub_cpu.iter().sum::<f64>() * 1e3 / sub_cpu.len() as f64 / f64::from(count));
    let mut all = Vec::new();
    for i in 0..subscribers {
        all.push(read_csv(&dir.join(format!("sub-{i}.csv")))?);
    }
    // The last chunk of a ledger: its raw size over the row's compression ratio.
    let raw_ratio = {
        let raw: f64 = all.iter().flatten().map(|r| r.raw_bytes as f64).sum();
        let wire: f64 = all.iter().flatten().map(|r| r.wire_bytes as f64).sum();
        raw / wire.max(1.0)
    };
    finish(s, row, &all, s.chunk as f64 / raw_ratio.max(1.0));
    Ok(())
}

/// First sequence and ledger count of a record-marked dump (reads only the headers).
pub fn first_seq(path: &Path) -> anyhow::Result<(u32, u32)> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut off = 0usize;
    let mut first = None;
    let mut n = 0u32;
    while off + 4 <= data.len() {
        let mark = u32::from_be_bytes([data[off], data[off + 1], data[off + 2], data[off + 3]]);
        let len = (mark & 0x7fff_ffff) as usize;
        let body = data
            .get(off + 4..off + 4 + len)
            .with_context(|| format!("{}: truncated record", path.display()))?;
        if first.is_none() {
            let h = ledger_relay_wire::header::peek_header(body)
                .ok()
                .flatten()
                .with_context(|| format!("{}: bad first ledger header", path.display()))?;
            first = Some(h.ledger_seq);
        }
        n += 1;
        off += 4 + len;
    }
    Ok((first.context("empty dump")?, n))
}
