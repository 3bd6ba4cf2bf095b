//! `ledger-bench storage`: what the relay's storage costs and gives. **paced** and **burst**:
//! `ledger-relay run` on a synthetic source with no subscriber, at the network's pace and
//! unpaced, its data directory's `du -sb` against the ring's live bytes, its bytes written per
//! byte stored and its CPU per ledger. **backfill** and **sessions**: a SEP-54 data lake
//! ([`lake`]) written, then read back against catch-up from the ring.

pub mod lake;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ledger_relay::ring::SLED_TUNING_ENV;

use crate::cluster::{make_certs, Cluster, RelaySettings};
use crate::report::{opt, table_of, Col};
use crate::scenario::ms;

/// The parts of `ledger-bench storage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Part {
    /// The ring's disk at the network's pace.
    Paced,
    /// The ring's disk in an unpaced burst.
    Burst,
    /// Writing a lake, and backfill from it against catch-up from the ring, in this process.
    Backfill,
    /// Backfill through a relay and a subscriber against catch-up from the ring.
    Sessions,
}

/// `ledger-bench storage` arguments.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct StorageArgs {
    /// Parts to run.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "paced,burst,backfill,sessions"
    )]
    pub parts: Vec<Part>,
    /// Synthetic ledger size.
    #[arg(long, value_name = "SIZE", default_value = "14.5MiB", value_parser = ledger_relay_transport::parse_size)]
    pub size: u64,
    /// zstd-1 ratio of the synthetic ledgers.
    #[arg(long, default_value_t = 7.6)]
    pub ratio: f64,
    /// Raw bytes per chunk.
    #[arg(long, value_name = "SIZE", default_value = "256KiB", value_parser = ledger_relay_transport::parse_size)]
    pub chunk: u64,
    /// The relay's codec.
    #[arg(long, default_value = "zstd", value_parser = ["zstd", "lz4", "none"])]
    pub codec: String,
    /// Ledgers of the paced run.
    #[arg(long, default_value_t = 200)]
    pub paced_ledgers: u32,
    /// Time between ledgers of the paced run.
    #[arg(long, value_name = "DURATION", default_value = "600ms", value_parser = ms)]
    pub paced_cadence: f64,
    /// Ledgers of the burst run.
    #[arg(long, default_value_t = 100)]
    pub burst_ledgers: u32,
    /// Time between ledgers of the burst run.
    #[arg(long, value_name = "DURATION", default_value = "1ms", value_parser = ms)]
    pub burst_cadence: f64,
    /// Ledgers the ring keeps.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub retention: u32,
    /// sled segment size of the ring, MiB (power of two) [default: the relay's].
    #[arg(long)]
    pub segment_mib: Option<u32>,
    /// sled flusher (and segment cleaner) period, ms [default: the relay's].
    #[arg(long)]
    pub flush_ms: Option<u64>,
    /// Time between disk samples.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = ms)]
    pub sample_interval: f64,
    /// Time sampled after the source stopped.
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = ms)]
    pub idle: f64,
    /// Ledgers written to the lake and read back.
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u32).range(2..))]
    pub backfill_ledgers: u32,
    /// Prefetch depths to compare (objects fetched ahead).
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16")]
    pub depths: Vec<usize>,
    /// Directory holding testnet/testnet-1410048-1410367.lcm-v0.framed.xdr (read back too).
    #[arg(long, value_name = "DIR", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata"))]
    pub testdata: PathBuf,
    /// `--json` (no CSV or plots).
    #[command(flatten)]
    #[serde(skip)]
    pub output: crate::report::Output,
}

/// One disk sample.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Sample {
    /// Seconds since the relay started.
    pub t_s: f64,
    /// `du -sb` of the data directory.
    pub disk_bytes: u64,
    /// `ledger_relay_ring_bytes`.
    pub live_bytes: u64,
    /// `ledger_relay_ring_ledgers`.
    pub ledgers: u64,
    /// Whether the source had stopped (the ring holds its last ledger).
    pub idle: bool,
}

impl Sample {
    fn ratio(&self) -> Option<f64> {
        (self.live_bytes > 0).then(|| self.disk_bytes as f64 / self.live_bytes as f64)
    }
}

/// What one ring run measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RingRun {
    /// `paced` or `burst`.
    pub run: String,
    /// Ledgers the source emitted.
    pub ledgers: u32,
    /// Time between them, ms.
    pub cadence_ms: f64,
    /// Seconds from the relay's start until the ring held the last ledger.
    pub write_s: f64,
    /// Mean disk/live once the ring is full, while the source runs.
    pub steady_mean: Option<f64>,
    /// Peak of the same samples.
    pub steady_peak: Option<f64>,
    /// Peak disk/live over every sample after the ring first filled.
    pub peak: Option<f64>,
    /// Disk/live at the last sample, after the idle time.
    pub after: Option<f64>,
    /// Live and disk bytes at the end.
    pub end_bytes: (u64, u64),
    /// Bytes the process asked the kernel to write per byte stored.
    pub written_per_stored: f64,
    /// Whole-process CPU per ledger, ms.
    pub process_cpu_ms: f64,
    /// The ring's CPU per ledger (the process less the threads that are not the ring's), ms.
    pub ring_cpu_ms: f64,
    /// Every sample.
    pub samples: Vec<Sample>,
}

/// Everything `ledger-bench storage` measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StorageReport {
    /// The arguments.
    pub args: StorageArgs,
    /// The ring runs.
    pub ring: Vec<RingRun>,
    /// Lake writes, reads and sessions.
    pub lake: lake::LakeReport,
}

/// Whether a relay thread (by name) works for the ring: the ring writer and sled's threads.
pub fn is_ring_thread(name: &str) -> bool {
    ["ring-", "sled", "log flusher", "flusher"]
        .iter()
        .any(|p| name.starts_with(p))
}

/// `du -sb PATH`: apparent bytes of everything under it.
pub fn du_sb(path: &Path) -> anyhow::Result<u64> {
    let out = Command::new("du")
        .arg("-sb")
        .arg(path)
        .output()
        .context("running du -sb")?;
    // du exits 1 when a file vanishes under it (sled and the ring delete files as they go);
    // its total is still the one to take.
    let text = String::from_utf8_lossy(&out.stdout);
    let total = text.split_whitespace().next().and_then(|v| v.parse().ok());
    total.with_context(|| format!("du -sb {}: {text:?}", path.display()))
}

/// Samples `relay`'s disk until ledger `last` is in its ring and `a.idle` has passed; the samples and the seconds until the ring held `last`.
fn sample(
    a: &StorageArgs,
    relay: &mut crate::cluster::RelayProc,
    data: &Path,
    last: u64,
    limit: Duration,
) -> anyhow::Result<(Vec<Sample>, f64)> {
    let every = Duration::from_secs_f64(a.sample_interval.max(50.0) / 1e3);
    let (t0, mut samples, mut done_at, mut write_s) =
        (Instant::now(), Vec::new(), None::<Instant>, 0.0);
    loop {
        relay.check_alive()?;
        let m = relay.scrape()?;
        let idle = m.get("ring_newest") as u64 >= last;
        if idle && done_at.is_none() {
            (done_at, write_s) = (Some(Instant::now()), t0.elapsed().as_secs_f64());
        }
        let (live_bytes, ledgers) = (m.get("ring_bytes") as u64, m.get("ring_ledgers") as u64);
        let (t_s, disk_bytes) = (t0.elapsed().as_secs_f64(), du_sb(data)?);
        samples.push(Sample {
            t_s,
            disk_bytes,
            live_bytes,
            ledgers,
            idle,
        });
        if done_at.is_some_and(|d| d.elapsed().as_secs_f64() * 1e3 >= a.idle) {
            return Ok((samples, write_s));
        }
        if t0.elapsed() > limit {
            bail!("the ring did not hold ledger {last} within {limit:?}");
        }
        std::thread::sleep(every);
    }
}

/// One ring run: the relay, sampled until its ring holds the last ledger and `a.idle` passed.
fn ring_run(
    a: &StorageArgs,
    c: &Cluster,
    dir: &Path,
    name: &str,
    ledgers: u32,
    cadence_ms: f64,
) -> anyhow::Result<RingRun> {
    let last = u64::from(ledgers + 1);
    let s = RelaySettings {
        count: Some(ledgers),
        emit_ms: cadence_ms.min(8.0),
        codec: a.codec.clone(),
        chunk: a.chunk,
        retention: a.retention,
        ..RelaySettings::endless(a.size, a.ratio, cadence_ms)
    };
    let mut relay = c.relay_in(None, &dir.join(name), &s, &s.synthetic_source(), &[])?;
    // Generous: the source's own time, plus a minute per 100 ledgers of a slow disk.
    let limit = Duration::from_secs_f64(f64::from(ledgers) * (cadence_ms / 1e3 + 0.6) + 60.0);
    let sampled = sample(a, &mut relay, &dir.join(name).join("data"), last, limit);
    let (samples, write_s) = sampled.with_context(|| format!("the {name} run"))?;
    let pid = relay.pid;
    let process_cpu = crate::procs::cpu_seconds(pid).unwrap_or(f64::NAN);
    let threads = crate::procs::thread_cpu_seconds(pid);
    let wchar = crate::procs::proc_value(pid, "io", "wchar").unwrap_or(0);
    relay.stop();
    let full = |s: &&Sample| s.ledgers >= u64::from(a.retention);
    let steady = samples.iter().filter(|s| !s.idle).filter(full);
    let steady: Vec<f64> = steady.filter_map(Sample::ratio).collect();
    let first_full = samples
        .iter()
        .position(|s| full(&s))
        .unwrap_or(samples.len());
    let last_sample = samples.last().copied();
    let not_ring = threads.iter().filter(|(n, _)| !is_ring_thread(n));
    let not_ring: f64 = not_ring.map(|(_, c)| c).sum();
    let (live, disk) = last_sample.map_or((0, 0), |s| (s.live_bytes, s.disk_bytes));
    let stored_per_ledger = live as f64 / last_sample.map_or(1, |s| s.ledgers.max(1)) as f64;
    Ok(RingRun {
        run: name.into(),
        ledgers,
        cadence_ms,
        write_s,
        steady_mean: (!steady.is_empty()).then(|| steady.iter().sum::<f64>() / steady.len() as f64),
        steady_peak: steady.into_iter().reduce(f64::max),
        peak: (samples[first_full..].iter().filter_map(Sample::ratio)).reduce(f64::max),
        after: last_sample.and_then(|s| s.ratio()),
        end_bytes: (live, disk),
        written_per_stored: wchar as f64 / f64::from(ledgers) / stored_per_ledger.max(1.0),
        process_cpu_ms: process_cpu * 1e3 / f64::from(ledgers),
        ring_cpu_ms: (process_cpu - not_ring) * 1e3 / f64::from(ledgers),
        samples,
    })
}

fn mb(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / 1e6)
}

/// The ring runs' table.
pub fn ring_table(runs: &[RingRun]) -> String {
    let cols: [Col<RingRun>; 12] = [
        Col::l("run", 6, |r| r.run.clone()),
        Col::r("ledgers", 7, |r| r.ledgers.to_string()),
        Col::r("cadence", 8, |r| format!("{}ms", r.cadence_ms)),
        Col::r("write_s", 7, |r| format!("{:.1}", r.write_s)),
        Col::r("mean", 7, |r| opt(r.steady_mean, 2)),
        Col::r("steady", 7, |r| opt(r.steady_peak, 2)),
        Col::r("peak", 7, |r| opt(r.peak, 2)),
        Col::r("after", 7, |r| opt(r.after, 2)),
        Col::r("live_MB", 9, |r| mb(r.end_bytes.0)),
        Col::r("disk_MB", 9, |r| mb(r.end_bytes.1)),
        Col::r("wrote/st", 9, |r| format!("{:.2}", r.written_per_stored)),
        Col::r("cpu_ms ring_ms", 15, |r| {
            format!("{:.1} {:>6.1}", r.process_cpu_ms, r.ring_cpu_ms)
        }),
    ];
    "the ring's disk: disk/live once the ring is full with the source running (mean, steady: peak), over the whole run after it filled (peak), idle after the source stopped (after); bytes written per byte stored; CPU per ledger, the process's and the ring's\n".to_owned()
        + &table_of(&cols, runs, 0, |_| None)
}

/// The whole command: runs the parts, prints the tables, writes `--json`.
pub fn main(a: &StorageArgs) -> anyhow::Result<()> {
    let tmp = tempfile::Builder::new()
        .prefix("ledger-bench-storage")
        .tempdir()?;
    let certs = tmp.path().join("certs");
    make_certs(&certs, 1)?;
    let mut c = Cluster {
        certs,
        ..Cluster::default()
    };
    let segment = a.segment_mib.map(u64::from);
    let tuning = [("segment_mib", segment), ("flush_ms", a.flush_ms)];
    let tuning = tuning.map(|(k, v)| v.map(|v| format!("{k}={v}")));
    let tuning: Vec<String> = tuning.into_iter().flatten().collect();
    if !tuning.is_empty() {
        c.relay_env.push((SLED_TUNING_ENV, tuning.join(",")));
    }
    let mut ring = Vec::new();
    for (part, name, n, cadence) in [
        (Part::Paced, "paced", a.paced_ledgers, a.paced_cadence),
        (Part::Burst, "burst", a.burst_ledgers, a.burst_cadence),
    ] {
        if a.parts.contains(&part) {
            eprintln!("ledger-bench storage: {name}, {n} ledgers every {cadence} ms");
            ring.push(ring_run(a, &c, tmp.path(), name, n, cadence)?);
        }
    }
    let lake = if a.parts.contains(&Part::Backfill) || a.parts.contains(&Part::Sessions) {
        lake::run(a, tmp.path())?
    } else {
        lake::LakeReport::default()
    };
    let mut text = String::new();
    if !ring.is_empty() {
        text += &ring_table(&ring);
    }
    text += &lake::table(&lake);
    let report = StorageReport {
        args: a.clone(),
        ring,
        lake,
    };
    a.output.emit(&text, String::new, &report)
}
