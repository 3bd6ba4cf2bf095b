//! `ledger-bench fanout`: what each extra subscriber costs one relay (issue 18).
//!
//! One `ledger-relay run` on loopback with a synthetic source, and a series of rows at 1, 4,
//! 16 and 64 subscribers (one `ledger-subscribe` process each, or K sessions per process with
//! `--sessions-per-process K`; 4 lanes), compressed (zstd, ratio 7.6) and raw (`--codec
//! none`, ratio 1). Each row is a fresh relay:
//!
//! 1. **baseline**: `--baseline-ledgers` ledgers with no subscriber; the relay's CPU per ledger
//!    (source, compression, ring) and its resident memory once the hub holds its recent ledgers;
//! 2. **active**: N subscribers `--from F --count W+L`, F a few ledgers ahead so that they are
//!    connected (waiting for F) before it is published; the relay's CPU (`utime + stime` of
//!    `/proc/PID/stat`) is read when every subscriber's stats file holds ledger F+W-1 and again
//!    when every one holds F+W+L-1, so the window is exactly L ledgers delivered to all; its
//!    resident memory is sampled meanwhile;
//! 3. **idle**: the source has stopped; N new subscribers take the last ledger from memory and
//!    wait at the tip; the relay's resident memory with them minus before them, and its CPU per
//!    idle session per second (heartbeats, keep-alives).
//!
//! From the stats files, per measured ledger, the delivery of the first and the last of the N
//! subscribers to have it (min and max), their p50/p99 over the ledgers, and the spread: the
//! last's p99 over the single-subscriber row's p99 of the same payload. `last_share` is the
//! largest fraction of the ledgers that one subscriber was the last to finish (1/N when nobody
//! is always last, 1 when the same one always is).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::cluster::{Cluster, Output, RelayProc, RelaySettings, SubSpec, Transport};
use crate::harness::{all_have, make_certs, read_stats_lenient, status_kib, RssSampler};
use crate::proc::{cpu_seconds, kill_all, stop};

mod report;
pub use report::{csv, plot, table, targets};

/// The two payloads of the series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Payload {
    /// zstd-compressed synthetic ledgers of `--ratio` (7.6: a Phase 3 ledger's).
    Compressed,
    /// Incompressible ledgers sent as they are (`--codec none`).
    Raw,
}

impl Payload {
    pub(crate) fn codec(self) -> &'static str {
        match self {
            Payload::Compressed => "zstd",
            Payload::Raw => "none",
        }
    }

    /// An endless source of `size`-byte ledgers of this payload (of `ratio` when compressed),
    /// one per `cadence` ms emitted over `emit_ms` (at most the cadence), 40 ledgers kept.
    pub(crate) fn relay(self, size: u64, ratio: f64, cadence: f64, emit_ms: f64) -> RelaySettings {
        let ratio = match self {
            Payload::Compressed => ratio,
            Payload::Raw => 1.0,
        };
        RelaySettings {
            emit_ms: emit_ms.min(cadence),
            codec: self.codec().into(),
            retention: 40,
            ..RelaySettings::endless(size, ratio, cadence)
        }
    }
}

/// `ledger-bench fanout` arguments.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
#[command(mut_arg("ledgers", |a| a.value_parser(clap::value_parser!(u32).range(2..))))]
#[command(mut_arg("idle_s", |a| a.help("Seconds of the idle phase (CPU of idle sessions)")))]
pub struct FanoutArgs {
    /// Subscriber counts of the series (one `ledger-subscribe` process each, or
    /// `--sessions-per-process` of them per process; also `--subscribers 1,4,8`, the spelling of
    /// the recorded runs).
    #[arg(
        long,
        visible_alias = "subscribers",
        value_delimiter = ',',
        default_value = "1,4,16,64"
    )]
    #[serde(rename = "subscribers")]
    pub subscriber_counts: Vec<u16>,
    /// `--payload`.
    #[command(flatten)]
    #[serde(flatten)]
    pub payload: crate::cluster::Payloads,
    /// `--ledgers` and `--warmup`.
    #[command(flatten)]
    #[serde(flatten)]
    pub series: crate::cluster::Series,
    /// Ledgers published with no subscriber first (baseline CPU and memory; more than the 4 the
    /// hub keeps in memory).
    #[arg(long, default_value_t = 6)]
    pub baseline_ledgers: u32,
    /// `--cadence`.
    #[command(flatten)]
    #[serde(flatten)]
    pub cadence: crate::cluster::Cadence,
    /// The cadence grows to this many ms per subscriber (twice that for raw) when that is
    /// longer, so that the 2-core machine, which also runs every subscriber, keeps up.
    #[arg(long, default_value_t = 40.0)]
    pub cadence_per_sub_ms: f64,
    /// `--emit-ms`.
    #[command(flatten)]
    #[serde(flatten)]
    pub emit: crate::cluster::Emit,
    /// `--lanes`, `--size` and `--ratio`.
    #[command(flatten)]
    #[serde(flatten)]
    pub stream: crate::cluster::Stream,
    /// `--chunk-bytes`.
    #[command(flatten)]
    #[serde(flatten)]
    pub chunk: crate::cluster::Chunk,
    /// `--idle-s`.
    #[command(flatten)]
    #[serde(flatten)]
    pub idle: crate::cluster::Idle,
    /// Subscriptions per `ledger-subscribe` process (`--sessions K`: each verified, written
    /// nowhere), so that many subscribers cost the shared cores less than one process each;
    /// the relay's per-identity caps are raised to match.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub sessions_per_process: u16,
    /// Run every subscriber as `ledger-subscribe --receive-only`, a bench mode that does NOT
    /// verify content (framing, lengths and order only; no decompression or checksum), so that
    /// the subscribers cost the shared cores little and the relay's cost is what is measured.
    #[arg(long)]
    pub receive_only: bool,
    /// More flags for every relay (an A/B of relay settings), e.g. `--relay-arg=--config=a.toml`.
    #[arg(long = "relay-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub relay_args: Vec<String>,
    /// Packet sizes of the relay and every subscriber.
    #[command(flatten)]
    #[serde(flatten)]
    pub transport: Transport,
    /// `--csv`, `--json`, and `--plots` (fanout-relay-cpu.svg: relay CPU per ledger against
    /// subscribers).
    #[command(flatten)]
    #[serde(flatten)]
    pub output: Output,
}

impl FanoutArgs {
    /// The cadence of a row, ms.
    pub fn cadence(&self, payload: Payload, n: u16) -> f64 {
        let per = match payload {
            Payload::Compressed => self.cadence_per_sub_ms,
            Payload::Raw => 2.0 * self.cadence_per_sub_ms,
        };
        self.cadence.cadence_ms.max(f64::from(n) * per)
    }
}

/// Delivery of the first and the last subscriber to finish each measured ledger.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Spread {
    /// p50 over the ledgers of the first subscriber's delivery, ms.
    pub first_p50_ms: f64,
    /// p99 of the same.
    pub first_p99_ms: f64,
    /// p50 over the ledgers of the last subscriber's delivery, ms.
    pub last_p50_ms: f64,
    /// p99 of the same.
    pub last_p99_ms: f64,
    /// Largest fraction of the ledgers that one subscriber was the last to finish.
    pub last_share: f64,
    /// Per measured ledger: (sequence, first, last) delivery, ms.
    pub per_ledger: Vec<(u32, f64, f64)>,
}

/// One row of the series.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FanoutRow {
    /// `compressed` or `raw`.
    pub payload: Payload,
    /// Subscribers.
    pub subscribers: u16,
    /// Time between ledgers, ms.
    pub cadence_ms: f64,
    /// Ledgers in the CPU window.
    pub ledgers: u32,
    /// Wire bytes per ledger (one subscriber's), MB.
    pub wire_mb: f64,
    /// Relay CPU per ledger with no subscriber (source, compression, ring), ms.
    pub zero_cpu_ms: f64,
    /// Relay CPU per ledger with the N subscribers, ms.
    pub relay_cpu_ms: f64,
    /// `relay_cpu_ms / N`.
    pub cpu_per_sub_ms: f64,
    /// `(relay_cpu_ms - zero_cpu_ms) / N`: what a subscriber adds.
    pub extra_per_sub_ms: f64,
    /// Slope of relay CPU per ledger from the previous row of the same payload, ms per
    /// subscriber (filled in by [`marginals`]).
    pub marginal_ms: Option<f64>,
    /// Relay resident memory before any subscriber, MiB.
    pub baseline_rss_mib: f64,
    /// (Peak resident memory during the measured ledgers - baseline) / N, MiB.
    pub active_rss_per_session_mib: f64,
    /// (Resident memory with N idle sessions - without) / N, MiB.
    pub idle_rss_per_session_mib: Option<f64>,
    /// Relay CPU per idle session per second, ms.
    pub idle_cpu_ms_per_session_s: Option<f64>,
    /// Deliveries counted (N x L when every subscriber got every ledger).
    pub delivered: usize,
    /// Times a session fell behind the live stream (`ledger_relay_lagged_total`).
    pub lagged: f64,
    /// First and last subscriber's delivery.
    pub spread: Spread,
    /// Last p99 over the single-subscriber p99 of the same payload (filled in by
    /// [`marginals`]).
    pub spread_ratio: Option<f64>,
    /// Seconds the row took.
    pub wall_s: f64,
    /// Why the row failed, if it did.
    pub error: Option<String>,
}

/// Everything `ledger-bench fanout` measured.
pub type FanoutReport = crate::cluster::Measured<FanoutArgs, FanoutRow>;

/// Fills in the marginal cost (slope between consecutive rows of a payload) and the spread
/// against the single-subscriber row.
pub fn marginals(rows: &mut [FanoutRow]) {
    for p in [Payload::Compressed, Payload::Raw] {
        let idx: Vec<usize> = (0..rows.len())
            .filter(|&i| rows[i].payload == p && rows[i].error.is_none())
            .collect();
        let single = idx
            .iter()
            .find(|&&i| rows[i].subscribers == 1)
            .map(|&i| rows[i].spread.last_p99_ms);
        let mut prev: Option<(f64, f64)> = Some((0.0, f64::NAN));
        for &i in &idx {
            let (n, cpu) = (f64::from(rows[i].subscribers), rows[i].relay_cpu_ms);
            rows[i].marginal_ms = match prev {
                // From zero subscribers: this row's own no-subscriber baseline.
                Some((pn, pc)) if pc.is_nan() => Some((cpu - rows[i].zero_cpu_ms) / (n - pn)),
                Some((pn, pc)) if n > pn => Some((cpu - pc) / (n - pn)),
                _ => None,
            };
            prev = Some((n, cpu));
            rows[i].spread_ratio = single
                .filter(|s| *s > 0.0)
                .map(|s| rows[i].spread.last_p99_ms / s);
        }
    }
}

/// Per measured ledger, the first and last delivery among `subs` (each a subscriber's records).
pub fn spread(subs: &[Vec<crate::stats::Record>], seqs: std::ops::RangeInclusive<u32>) -> Spread {
    let mut per_ledger = Vec::new();
    let mut last_count = vec![0usize; subs.len()];
    for seq in seqs {
        let d: Vec<(usize, f64)> = subs
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.iter().find(|r| r.seq == seq).map(|r| (i, r.delivery_ms)))
            .collect();
        if d.len() != subs.len() || d.is_empty() {
            continue;
        }
        let first = d.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
        let (last_i, last) =
            d.iter()
                .copied()
                .fold((0, f64::NEG_INFINITY), |m, x| if x.1 > m.1 { x } else { m });
        last_count[last_i] += 1;
        per_ledger.push((seq, first, last));
    }
    let q = |f: fn(&(u32, f64, f64)) -> f64, p: f64| {
        let mut v: Vec<f64> = per_ledger.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        crate::stats::quantile(&v, p)
    };
    Spread {
        first_p50_ms: q(|x| x.1, 0.5),
        first_p99_ms: q(|x| x.1, 0.99),
        last_p50_ms: q(|x| x.2, 0.5),
        last_p99_ms: q(|x| x.2, 0.99),
        last_share: last_count.iter().copied().max().unwrap_or(0) as f64
            / per_ledger.len().max(1) as f64,
        per_ledger,
    }
}

/// Polls `cond` (given the relay) every 20 ms until it holds; fails after `limit` or when the relay exits.
fn wait_for(
    relay: &mut RelayProc,
    limit: Duration,
    what: &str,
    mut cond: impl FnMut(&RelayProc) -> bool,
) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut n = 0u32;
    while !cond(relay) {
        if start.elapsed() > limit {
            bail!("{what}: not within {limit:?}");
        }
        n += 1;
        if n % 25 == 0 {
            relay.check_alive()?;
        }
        // Not faster: reading 64 stats files takes CPU from the relay and the subscribers.
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Starts `n` sessions from `from` for `count` ledgers, `--sessions-per-process` of them per
/// `ledger-subscribe` process, their watchdogs sized for a ledger every `cadence` ms
/// ([`watchdog_flags`]); returns the processes and every session's stats file.
fn spawn_all(
    a: &FanoutArgs,
    cluster: &Cluster,
    relay: &RelayProc,
    dir: &Path,
    tag: &str,
    n: u16,
    (from, count, cadence): (u32, Option<u32>, f64),
) -> anyhow::Result<(Vec<Child>, Vec<PathBuf>)> {
    let mut children = Vec::new();
    let mut stats = Vec::new();
    let per_process = a.sessions_per_process.max(1);
    for i in 0..n.div_ceil(per_process) {
        let spec = SubSpec {
            sessions: per_process.min(n - i * per_process),
            extra: watchdog_flags(cadence)
                .into_iter()
                .chain(a.receive_only.then(|| "--receive-only".to_owned()))
                .collect(),
            ..SubSpec::new(
                format!("sub-{i}"),
                from,
                count,
                a.stream.lanes.lanes,
                dir,
                &format!("{tag}-{i}"),
            )
        };
        match cluster.subscriber(relay.addr, &spec) {
            Ok(c) => children.push(c),
            Err(e) => {
                kill_all(&mut children);
                return Err(e);
            }
        }
        stats.extend(spec.stats_files());
    }
    Ok((children, stats))
}

/// The subscribers' watchdogs for a ledger every `cadence` ms: give a relay up after half a
/// cadence without a heartbeat or data and two cadences without a ledger, never sooner than
/// the defaults (750 ms and 4 s). With 256 sessions in one process on 2 cores, each ledger's
/// fan-out keeps both processes busy for seconds, and the defaults gave sessions up that were
/// only waiting their turn, whose reconnects and catch-up then made the overload worse
/// (bench/RESULTS.md).
fn watchdog_flags(cadence: f64) -> Vec<String> {
    let ms = |v: f64| format!("{}ms", v.ceil() as u64);
    vec![
        "--heartbeat-timeout".into(),
        ms((cadence / 2.0).max(750.0)),
        "--progress-timeout".into(),
        ms((cadence * 2.0).max(4000.0)),
    ]
}

/// The relay's caps raised for `n` sessions of `lanes` lanes from one address, `per_process`
/// of them under one certificate (the relay's defaults allow 64 sessions per identity, 256
/// connections per address, and 32 pending handshakes per address in a pool of 128); never
/// below the defaults. Every subscriber here shares one address, and on 2 cores a loaded
/// relay may take longer than its default 2 s over a handshake: the pending pool and its
/// timeout are raised too, since the bench measures fan-out, not admission.
fn caps_for(n: u16, per_process: u16, lanes: u8) -> Vec<String> {
    let connections = (usize::from(n) * usize::from(lanes) + 16).max(256);
    let per_identity = usize::from(per_process);
    let pool = connections.min(65536);
    let mut flags: Vec<String> = [
        ("--handshake-pool", pool),
        ("--handshake-pool-per-source", pool),
        ("--max-sessions", usize::from(n).max(256)),
        ("--max-connections-per-address", connections),
        (
            "--max-connections-per-identity",
            (per_identity * usize::from(lanes) + 16).max(256),
        ),
        ("--max-sessions-per-identity", per_identity.max(64)),
    ]
    .into_iter()
    .flat_map(|(flag, v)| [flag.to_owned(), v.to_string()])
    .collect();
    flags.extend(["--handshake-timeout".to_owned(), "10s".to_owned()]);
    flags
}

/// Runs one row; the relay and subscribers are stopped whatever happens.
fn run_row(a: &FanoutArgs, work: &Path, payload: Payload, n: u16) -> anyhow::Result<FanoutRow> {
    let started = Instant::now();
    let certs = work.join("certs");
    let dir = work.join(format!("{payload:?}-{n}").to_lowercase());
    std::fs::create_dir_all(&dir)?;
    let cadence = a.cadence(payload, n);
    let start = 2u32;
    let b = a.baseline_ledgers.max(3);
    // Ledgers between the baseline and the subscribers' first: time to start the processes
    // and complete 4 handshakes each.
    let connect_s = 2.0 + f64::from(n) * 0.08;
    // At most what keeps a session's wait for its first ledger (k + 1 cadences) within 25 s:
    // a subscriber gives up a `SessionOpen` the relay has not answered in 30 s.
    let k = ((connect_s * 1e3 / cadence).ceil() as u32 + 1)
        .min(((25e3 / cadence) as u32).saturating_sub(1))
        .max(1);
    let first = start + b + k;
    let measured_from = first + a.series.warmup;
    let last = measured_from + a.series.count.ledgers - 1;
    let settings = RelaySettings {
        count: Some(last - start + 1),
        start,
        chunk: a.chunk.chunk_bytes,
        ..payload.relay(
            a.stream.size.ledger_bytes,
            a.stream.ratio.ratio,
            cadence,
            a.emit.emit_ms,
        )
    };
    let mut cluster = Cluster::local(&certs, a.transport)?;
    cluster.relay_extra = caps_for(n, a.sessions_per_process, a.stream.lanes.lanes);
    cluster.relay_extra.extend(a.relay_args.iter().cloned());
    let extra = ["--start-wait".to_owned(), "300s".to_owned()];
    let mut relay = cluster.relay(&dir, &settings, &extra)?;
    let mut children = Vec::new();
    let r = measure(
        a,
        &mut relay,
        &mut children,
        &cluster,
        &dir,
        payload,
        n,
        cadence,
        (start, b, first, measured_from, last),
    );
    kill_all(&mut children);
    relay.stop();
    // A raw row's ring is hundreds of MB: gone before the next row (the logs stay).
    let _ = std::fs::remove_dir_all(dir.join("data"));
    let mut row = r?;
    row.wall_s = started.elapsed().as_secs_f64();
    Ok(row)
}

#[allow(clippy::too_many_arguments)]
fn measure(
    a: &FanoutArgs,
    relay: &mut RelayProc,
    children: &mut Vec<Child>,
    cluster: &Cluster,
    dir: &Path,
    payload: Payload,
    n: u16,
    cadence: f64,
    (start, b, first, measured_from, last): (u32, u32, u32, u32, u32),
) -> anyhow::Result<FanoutRow> {
    let ledger_s = Duration::from_secs_f64(cadence / 1e3);
    let slack = Duration::from_secs(60);
    let pid = relay.pid;
    let newest = |relay: &RelayProc| relay.scrape().map_or(0, |s| s.get("ring_newest") as u32);
    // Baseline: CPU from ledger start+1 to start+b-1, memory at start+b-1.
    wait_for(relay, ledger_s * 3 + slack, "baseline start", |r| {
        newest(r) > start
    })?;
    let c0 = cpu_seconds(pid).context("relay CPU")?;
    let n0 = newest(relay);
    wait_for(relay, ledger_s * (b + 1) + slack, "baseline end", |r| {
        newest(r) >= start + b - 1
    })?;
    let c1 = cpu_seconds(pid).context("relay CPU")?;
    let n1 = newest(relay);
    let zero_cpu_ms = (c1 - c0) * 1e3 / f64::from(n1.saturating_sub(n0).max(1));
    let baseline_kib = status_kib(pid, "VmRSS").context("relay RSS")?;
    // Active: N subscribers from `first`.
    let lagged0 = relay.scrape()?.get("lagged_total");
    let (kids, stats) = spawn_all(
        a,
        cluster,
        relay,
        dir,
        "sub",
        n,
        (first, Some(last - first + 1), cadence),
    )?;
    children.extend(kids);
    let rounds = last - start + 2;
    let limit = ledger_s * rounds + slack + Duration::from_secs_f64(f64::from(n) * 0.5);
    wait_for(
        relay,
        limit,
        "every subscriber at the measured ledgers",
        |_| all_have(&stats, measured_from - 1),
    )?;
    let ca = cpu_seconds(pid).context("relay CPU")?;
    let sampler = RssSampler::start(pid, Duration::from_millis(100), Instant::now(), 100_000);
    let r = wait_for(relay, limit, "every subscriber at the last ledger", |_| {
        all_have(&stats, last)
    });
    let cb = cpu_seconds(pid).context("relay CPU")?;
    let rss = sampler.finish();
    if let Err(e) = r {
        let got: Vec<usize> = stats
            .iter()
            .map(|p| read_stats_lenient(p).map_or(0, |r| r.len()))
            .collect();
        let total: usize = got.iter().sum();
        bail!(
            "{e:#}: {total} of {} ledgers delivered (fewest {}); the relay's source published through {}",
            usize::from(n) * (last - first + 1) as usize,
            got.iter().min().copied().unwrap_or(0),
            newest(relay)
        );
    }
    for c in children.iter_mut() {
        let st = crate::cluster::wait_child(c, slack)?;
        if !st.success() {
            bail!("a subscriber exited with {st}");
        }
    }
    children.clear();
    let lagged = relay.scrape()?.get("lagged_total") - lagged0;
    let records = crate::harness::read_exact(&stats, first..=last)?;
    let delivered = records
        .iter()
        .map(|r| r.iter().filter(|r| r.seq >= measured_from).count())
        .sum();
    let wire_mb = records
        .iter()
        .flatten()
        .map(|r| r.wire_bytes as f64)
        .sum::<f64>()
        / records.iter().map(Vec::len).sum::<usize>().max(1) as f64
        / 1e6;
    let peak = rss.iter().map(|s| s.rss_kib).max().unwrap_or(baseline_kib);
    let relay_cpu_ms = (cb - ca) * 1e3 / f64::from(a.series.count.ledgers);
    let per_n = |x: f64| x / f64::from(n);
    // Idle: N sessions at the tip of a stopped source.
    let (idle_rss, idle_cpu) = idle(a, relay, children, cluster, dir, n, (last, cadence))?;
    Ok(FanoutRow {
        payload,
        subscribers: n,
        cadence_ms: cadence,
        ledgers: a.series.count.ledgers,
        wire_mb,
        zero_cpu_ms,
        relay_cpu_ms,
        cpu_per_sub_ms: per_n(relay_cpu_ms),
        extra_per_sub_ms: per_n(relay_cpu_ms - zero_cpu_ms),
        marginal_ms: None,
        baseline_rss_mib: baseline_kib as f64 / 1024.0,
        active_rss_per_session_mib: per_n(peak.saturating_sub(baseline_kib) as f64 / 1024.0),
        idle_rss_per_session_mib: idle_rss,
        idle_cpu_ms_per_session_s: idle_cpu,
        delivered,
        lagged,
        spread: spread(&records, measured_from..=last),
        spread_ratio: None,
        wall_s: 0.0,
        error: None,
    })
}

/// The idle phase: N subscribers take ledger `last` and wait at the tip. Returns the resident
/// memory per session (MiB) and the CPU per session per second (ms).
#[allow(clippy::too_many_arguments)]
fn idle(
    a: &FanoutArgs,
    relay: &mut RelayProc,
    children: &mut Vec<Child>,
    cluster: &Cluster,
    dir: &Path,
    n: u16,
    (last, cadence): (u32, f64),
) -> anyhow::Result<(Option<f64>, Option<f64>)> {
    let pid = relay.pid;
    std::thread::sleep(Duration::from_millis(500));
    let before = status_kib(pid, "VmRSS").context("relay RSS")?;
    let (kids, stats) = spawn_all(a, cluster, relay, dir, "idle", n, (last, None, cadence))?;
    children.extend(kids);
    let limit = Duration::from_secs(60) + Duration::from_secs_f64(f64::from(n) * 0.5);
    wait_for(relay, limit, "idle subscribers", |_| all_have(&stats, last))?;
    // Every session with all its lanes up.
    let lanes = u32::from(a.stream.lanes.lanes);
    wait_for(
        relay,
        Duration::from_secs(30),
        "idle sessions' lanes",
        |r| {
            r.scrape().is_ok_and(|s| {
                s.sessions.len() == usize::from(n) && s.sessions.values().all(|x| x.lanes == lanes)
            })
        },
    )?;
    std::thread::sleep(Duration::from_secs(1));
    let c0 = cpu_seconds(pid);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(a.idle.idle_s.max(0.5)));
    let c1 = cpu_seconds(pid);
    let with = status_kib(pid, "VmRSS").context("relay RSS")?;
    let secs = t0.elapsed().as_secs_f64();
    for c in children.iter_mut() {
        stop(c, Duration::from_secs(5));
    }
    children.clear();
    let per = f64::from(n);
    Ok((
        Some(with.saturating_sub(before) as f64 / 1024.0 / per),
        c0.zip(c1).map(|(c0, c1)| (c1 - c0) * 1e3 / secs / per),
    ))
}

/// Runs the series (every payload, every count) and returns the report.
pub fn run(a: &FanoutArgs) -> anyhow::Result<FanoutReport> {
    if a.subscriber_counts.is_empty() || a.subscriber_counts.contains(&0) {
        bail!("--subscribers takes counts of at least 1");
    }
    let n_max = a.subscriber_counts.iter().copied().max().unwrap_or(1);
    let mut tmp = crate::cluster::work_dir("ledger-bench-fanout")?;
    make_certs(&tmp.path().join("certs"), usize::from(n_max))?;
    let load_before = crate::harness::load_average();
    let mut rows = Vec::new();
    for &p in &a.payload.payload {
        for &n in &a.subscriber_counts {
            eprintln!(
                "fanout: {p:?}, {n} subscribers, a ledger every {} ms",
                a.cadence(p, n)
            );
            let t = Instant::now();
            let row = run_row(a, tmp.path(), p, n).unwrap_or_else(|e| {
                eprintln!("fanout: {p:?} x{n} failed: {e:#}");
                failed(a, p, n, t, e)
            });
            rows.push(row);
        }
    }
    marginals(&mut rows);
    crate::cluster::keep_if_asked(&mut tmp);
    Ok(FanoutReport {
        args: a.clone(),
        load_before,
        load_after: crate::harness::load_average(),
        extra: (),
        rows,
    })
}

fn failed(a: &FanoutArgs, p: Payload, n: u16, t: Instant, e: anyhow::Error) -> FanoutRow {
    FanoutRow {
        payload: p,
        subscribers: n,
        cadence_ms: a.cadence(p, n),
        ledgers: 0,
        wire_mb: 0.0,
        zero_cpu_ms: f64::NAN,
        relay_cpu_ms: f64::NAN,
        cpu_per_sub_ms: f64::NAN,
        extra_per_sub_ms: f64::NAN,
        marginal_ms: None,
        baseline_rss_mib: f64::NAN,
        active_rss_per_session_mib: f64::NAN,
        idle_rss_per_session_mib: None,
        idle_cpu_ms_per_session_s: None,
        delivered: 0,
        lagged: 0.0,
        spread: Spread::default(),
        spread_ratio: None,
        wall_s: t.elapsed().as_secs_f64(),
        error: Some(format!("{e:#}")),
    }
}

/// The whole command: runs, prints the table and the targets, writes `--csv`, `--json` and
/// `--plots`.
pub fn main(a: &FanoutArgs) -> anyhow::Result<()> {
    crate::cluster::emit(&run(a)?, &a.output)
}

impl crate::cluster::Table for FanoutReport {
    fn table(&self) -> String {
        table(&self.rows)
    }
    fn targets(&self) -> String {
        targets(&self.rows)
    }
}

impl crate::cluster::Report for FanoutReport {
    fn csv(&self) -> String {
        csv(&self.rows)
    }
    fn plots(&self, dir: &Path) -> anyhow::Result<String> {
        plot(&self.rows, dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Record;

    #[test]
    fn watchdogs_grow_with_the_cadence_never_below_the_defaults() {
        let flags = |c| watchdog_flags(c).join(" ");
        assert_eq!(
            flags(600.0),
            "--heartbeat-timeout 750ms --progress-timeout 4000ms"
        );
        assert_eq!(
            flags(6400.0),
            "--heartbeat-timeout 3200ms --progress-timeout 12800ms"
        );
    }

    fn rec(seq: u32, delivery_ms: f64) -> Record {
        Record {
            seq,
            raw_bytes: 10,
            wire_bytes: 5,
            delivery_ms,
            inter_arrival_ms: None,
            received_unix_ms: None,
        }
    }

    #[test]
    fn first_and_last_of_each_ledger() {
        // Subscriber 1 is last on ledgers 5 and 6, subscriber 0 on 7; ledger 8 is missing at
        // subscriber 1 and is left out.
        let subs = vec![
            vec![rec(5, 10.0), rec(6, 20.0), rec(7, 90.0), rec(8, 1.0)],
            vec![rec(5, 30.0), rec(6, 25.0), rec(7, 40.0)],
        ];
        let s = spread(&subs, 5..=8);
        assert_eq!(
            s.per_ledger,
            vec![(5, 10.0, 30.0), (6, 20.0, 25.0), (7, 40.0, 90.0)]
        );
        assert_eq!(s.first_p50_ms, 20.0);
        assert_eq!(s.first_p99_ms, 40.0);
        assert_eq!(s.last_p50_ms, 30.0);
        assert_eq!(s.last_p99_ms, 90.0);
        assert!((s.last_share - 2.0 / 3.0).abs() < 1e-9);
    }

    fn row(p: Payload, n: u16, zero: f64, cpu: f64, last_p99: f64) -> FanoutRow {
        let mut r = failed(&defaults(), p, n, Instant::now(), anyhow::anyhow!("x"));
        r.error = None;
        r.zero_cpu_ms = zero;
        r.relay_cpu_ms = cpu;
        r.spread.last_p99_ms = last_p99;
        r
    }

    fn defaults() -> FanoutArgs {
        crate::cluster::parse(&[])
    }

    #[test]
    fn marginal_cost_and_spread_between_rows() {
        let mut rows = vec![
            row(Payload::Compressed, 1, 40.0, 43.0, 10.0),
            row(Payload::Compressed, 4, 40.0, 52.0, 15.0),
            row(Payload::Raw, 1, 20.0, 41.0, 30.0),
            row(Payload::Compressed, 16, 40.0, 100.0, 25.0),
        ];
        marginals(&mut rows);
        let m: Vec<Option<f64>> = rows.iter().map(|r| r.marginal_ms).collect();
        assert_eq!(m, vec![Some(3.0), Some(3.0), Some(21.0), Some(4.0)]);
        assert_eq!(rows[3].spread_ratio, Some(2.5));
        assert_eq!(rows[2].spread_ratio, Some(1.0));
        let t = targets(&rows);
        assert!(
            t.contains("compressed relay CPU per extra subscriber"),
            "{t}"
        );
        assert!(t.contains("MISSED"), "{t}");
        let c = csv(&rows);
        assert_eq!(c.lines().count(), 5);
        // A row whose last subscriber fell behind is no evidence either way.
        rows.push(row(Payload::Compressed, 64, 40.0, 41.0, 1e6));
        let t = targets(&rows);
        assert!(
            t.contains("compressed rows left out") && t.contains("[64]"),
            "{t}"
        );
        assert!(t.contains("slope over 3 rows"), "{t}");
    }

    #[test]
    fn the_cadence_grows_with_subscribers() {
        let a = defaults();
        assert_eq!(a.cadence(Payload::Compressed, 1), 600.0);
        assert_eq!(a.cadence(Payload::Compressed, 64), 64.0 * 40.0);
        assert_eq!(a.cadence(Payload::Raw, 64), 64.0 * 80.0);
    }
}
