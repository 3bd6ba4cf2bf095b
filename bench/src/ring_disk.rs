//! `ledger-bench ring-disk`: how much disk the relay's data directory takes against the live
//! bytes its ring holds, and how much CPU the ring spends per ledger (issue 21).
//!
//! Runs the real `ledger-relay run` on loopback with a synthetic source (14.5 MiB ledgers,
//! zstd ratio 7.6 by default) and no subscriber, twice:
//!
//! - **paced**: one ledger every `--paced-cadence-ms` (the network's pace is 600 ms);
//! - **burst**: as fast as the relay can take them (`--burst-cadence-ms`, 1 ms), what a
//!   catch-up from core or an upstream relay looks like to the ring.
//!
//! Every `--sample-ms` it reads the whole data directory's size with `du -sb` (everything the
//! relay keeps there, not only the ring's files) and the ring's live bytes from `/metrics`
//! (`ledger_relay_ring_bytes`). Reported per run: the ratio disk / live once the ring is full
//! (`ring_ledgers` reached `--retention`) while the source runs (mean and peak), its peak over
//! the whole run after the ring first filled, and the ratio `--idle-s` seconds after the source
//! stopped. Also the process's bytes written (`/proc/PID/io` `wchar`, what the relay asked the
//! kernel to write) per ledger stored, against the ledger's stored bytes, and CPU per ledger:
//! the whole process, and the ring's share, which is the process's total minus the threads that
//! are not the ring's (sled's IO threads come and go, so they are counted as the remainder; see
//! [`is_ring_thread`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use ledger_relay::ring::SLED_TUNING_ENV;

use crate::cluster::{Cluster, RelaySettings, Transport};
use crate::harness::make_certs;
use crate::report::Col;

/// `ledger-bench ring-disk` arguments.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
#[command(mut_arg("quick", |a| a.help("About a minute: 60 paced ledgers at 200 ms, 40 in the burst, 5 s idle")))]
#[command(mut_arg("retention", |a| a.default_value("20")))]
#[command(mut_arg("idle_s", |a| a.default_value("20").default_value_if("quick", "true", "5").help("Seconds sampled after the source stopped (quick: 5)")))]
#[command(mut_arg("only", |a| a.value_name("RUN").value_parser(["paced", "burst"]).help("Which runs: `paced`, `burst` (repeatable) [default: both]")))]
pub struct RingDiskArgs {
    /// `--quick`.
    #[command(flatten)]
    #[serde(flatten)]
    pub quick: crate::cluster::Quick,
    /// `--only`: runs.
    #[command(flatten)]
    #[serde(flatten)]
    pub only: crate::cluster::Only,
    /// Ledgers of the paced run (quick: 60).
    #[arg(long, default_value_t = 200, default_value_if("quick", "true", "60"))]
    pub paced_ledgers: u32,
    /// Time between ledgers of the paced run, ms (quick: 200).
    #[arg(long, default_value = "600", default_value_if("quick", "true", "200"))]
    pub paced_cadence_ms: f64,
    /// Ledgers of the burst run (quick: 40).
    #[arg(long, default_value_t = 100, default_value_if("quick", "true", "40"))]
    pub burst_ledgers: u32,
    /// Time between ledgers of the burst run, ms.
    #[arg(long, default_value_t = 1.0)]
    pub burst_cadence_ms: f64,
    /// `--retention` [default: 20].
    #[command(flatten)]
    #[serde(flatten)]
    pub retention: crate::cluster::Retention,
    /// `--size`, `--chunk-bytes`, `--ratio`, `--codec`.
    #[command(flatten)]
    #[serde(flatten)]
    pub workload: crate::cluster::Workload,
    /// sled segment size of the ring, MiB (power of two) [default: the relay's].
    #[arg(long)]
    pub segment_mib: Option<u32>,
    /// sled flusher (and segment cleaner) period, ms [default: the relay's].
    #[arg(long)]
    pub flush_ms: Option<u64>,
    /// Time between samples, ms.
    #[arg(long, default_value_t = 1000)]
    pub sample_ms: u64,
    /// `--idle-s` [default: 20, quick 5].
    #[command(flatten)]
    #[serde(flatten)]
    pub idle: crate::cluster::Idle,
    /// `--json`.
    #[command(flatten)]
    #[serde(flatten)]
    pub json: crate::cluster::Json,
}

/// One sample of a run.
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
    /// `ledger_relay_ring_newest`.
    pub newest: u64,
    /// Whether the source had stopped (the ring holds its last ledger).
    pub idle: bool,
}

impl Sample {
    fn ratio(&self) -> Option<f64> {
        (self.live_bytes > 0).then(|| self.disk_bytes as f64 / self.live_bytes as f64)
    }
}

/// What one run measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunReport {
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
    /// Peak disk/live over every sample after the ring first filled (idle ones included).
    pub peak: Option<f64>,
    /// Disk/live at the last sample, `idle_s` after the source stopped.
    pub after: Option<f64>,
    /// Live bytes at the end.
    pub live_bytes: u64,
    /// Disk bytes at the end.
    pub disk_bytes: u64,
    /// Largest `du -sb` seen.
    pub disk_peak_bytes: u64,
    /// Bytes the process asked the kernel to write (`wchar`), per ledger stored, MB.
    pub written_mb_per_ledger: f64,
    /// Stored bytes per ledger (live bytes / ledgers held at the end), MB.
    pub stored_mb_per_ledger: f64,
    /// Whole-process CPU per ledger, ms.
    pub process_cpu_ms_per_ledger: f64,
    /// The ring's CPU per ledger (process minus the threads that are not the ring's), ms.
    pub ring_cpu_ms_per_ledger: f64,
    /// CPU seconds by thread name at the end (threads still alive), for the record.
    pub threads: BTreeMap<String, f64>,
    /// Every sample.
    pub samples: Vec<Sample>,
}

/// Everything `ledger-bench ring-disk` measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RingDiskReport {
    /// The arguments.
    pub args: RingDiskArgs,
    /// The runs.
    pub runs: Vec<RunReport>,
}

/// Whether a thread of the relay (by its name, `/proc/PID/task/TID/comm`) works for the ring:
/// the ring writer and sled's threads (`sled-io-N`, its `log flusher`). Only used to name
/// threads in the report: the ring's CPU is the process's minus every other thread's.
pub fn is_ring_thread(name: &str) -> bool {
    name.starts_with("ring-")
        || name.starts_with("sled")
        || name.starts_with("log flusher")
        || name.starts_with("flusher")
}

/// CPU seconds of each live thread of `pid`, by thread id, with its name.
fn thread_cpu(pid: u32) -> BTreeMap<u32, (String, f64)> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let path = e.path();
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else {
            continue;
        };
        let name = std::fs::read_to_string(path.join("comm"))
            .unwrap_or_default()
            .trim()
            .to_owned();
        if let Some(cpu) = crate::proc::stat_cpu_seconds(&stat) {
            out.insert(tid, (name, cpu));
        }
    }
    out
}

/// `wchar` of `/proc/PID/io`.
fn written_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
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
    text.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("du -sb {}: {text:?}", path.display()))
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn peak(v: impl Iterator<Item = f64>) -> Option<f64> {
    v.fold(None, |m, x| Some(m.map_or(x, |m: f64| m.max(x))))
}

/// One run: start the relay, sample until the source's last ledger is in the ring and `idle`
/// has passed, stop it.
fn run_one(
    a: &RingDiskArgs,
    work: &Path,
    name: &str,
    ledgers: u32,
    cadence_ms: f64,
    idle: Duration,
) -> anyhow::Result<RunReport> {
    let certs = work.join("certs");
    let dir = work.join(name);
    let start = 2u32;
    let last = u64::from(start + ledgers - 1);
    let settings = RelaySettings {
        count: Some(ledgers),
        start,
        ..a.workload
            .relay(cadence_ms, cadence_ms.min(8.0), a.retention.retention)
    };
    let data = dir.join("data");
    let mut tuning = Vec::new();
    if let Some(m) = a.segment_mib {
        tuning.push(format!("segment_mib={m}"));
    }
    if let Some(f) = a.flush_ms {
        tuning.push(format!("flush_ms={f}"));
    }
    let mut cluster = Cluster::local(&certs, Transport::default())?;
    if !tuning.is_empty() {
        cluster.relay_env.push((SLED_TUNING_ENV, tuning.join(",")));
    }
    let mut relay = cluster.relay(&dir, &settings, &[])?;
    let t0 = Instant::now();
    let every = Duration::from_millis(a.sample_ms.max(50));
    // Generous: the source's own time, plus a minute per 100 ledgers of a slow disk.
    let limit = Duration::from_secs_f64(f64::from(ledgers) * (cadence_ms / 1e3 + 0.6) + 60.0);
    let mut samples = Vec::new();
    let mut done_at: Option<Instant> = None;
    let mut wrote_s = 0.0;
    let cpu_end;
    loop {
        relay.check_alive()?;
        let scrape = relay.scrape()?;
        let newest = scrape.get("ring_newest") as u64;
        let idle_now = newest >= last;
        if idle_now && done_at.is_none() {
            done_at = Some(Instant::now());
            wrote_s = t0.elapsed().as_secs_f64();
        }
        samples.push(Sample {
            t_s: t0.elapsed().as_secs_f64(),
            disk_bytes: du_sb(&data)?,
            live_bytes: scrape.get("ring_bytes") as u64,
            ledgers: scrape.get("ring_ledgers") as u64,
            newest,
            idle: idle_now,
        });
        if done_at.is_some_and(|d| d.elapsed() >= idle) {
            cpu_end = Some((
                crate::proc::cpu_seconds(relay.pid).unwrap_or(f64::NAN),
                thread_cpu(relay.pid),
                written_bytes(relay.pid).unwrap_or(0),
                scrape.get("ring_newest") as u64 + 1 - u64::from(start),
            ));
            break;
        }
        if t0.elapsed() > limit {
            relay.stop();
            bail!("{name}: the ring held ledger {newest} of {last} after {limit:?}");
        }
        std::thread::sleep(every);
    }
    relay.stop();
    let Some((process_cpu, threads, wchar, stored)) = cpu_end else {
        bail!("{name}: no final reading");
    };
    let full = |s: &&Sample| s.ledgers >= u64::from(a.retention.retention);
    let steady: Vec<f64> = samples
        .iter()
        .filter(|s| !s.idle)
        .filter(full)
        .filter_map(Sample::ratio)
        .collect();
    let first_full = samples
        .iter()
        .position(|s| full(&s))
        .unwrap_or(samples.len());
    let end = samples.last().copied();
    let mut by_name: BTreeMap<String, f64> = BTreeMap::new();
    for (name, cpu) in threads.values() {
        // Numbered threads (compress-0, sled-io-3, tokio-runtime-worker) are summed by family.
        let family = name
            .trim_end_matches(|c: char| c.is_ascii_digit())
            .trim_end_matches('-');
        *by_name.entry(family.to_owned()).or_default() += cpu;
    }
    let not_ring: f64 = threads
        .values()
        .filter(|(n, _)| !is_ring_thread(n))
        .map(|(_, c)| c)
        .sum();
    let per = |x: f64| x / stored.max(1) as f64;
    Ok(RunReport {
        run: name.into(),
        ledgers,
        cadence_ms,
        write_s: wrote_s,
        steady_mean: mean(&steady),
        steady_peak: peak(steady.iter().copied()),
        peak: peak(samples[first_full..].iter().filter_map(Sample::ratio)),
        after: end.and_then(|s| s.ratio()),
        live_bytes: end.map_or(0, |s| s.live_bytes),
        disk_bytes: end.map_or(0, |s| s.disk_bytes),
        disk_peak_bytes: samples.iter().map(|s| s.disk_bytes).max().unwrap_or(0),
        written_mb_per_ledger: per(wchar as f64) / 1e6,
        stored_mb_per_ledger: end
            .map_or(0.0, |s| s.live_bytes as f64 / s.ledgers.max(1) as f64 / 1e6),
        process_cpu_ms_per_ledger: per(process_cpu) * 1e3,
        ring_cpu_ms_per_ledger: per(process_cpu - not_ring) * 1e3,
        threads: by_name,
        samples,
    })
}

fn opt(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |x| format!("{x:.2}"))
}

/// The runs' table.
pub fn table(runs: &[RunReport]) -> String {
    let cols: [Col<RunReport>; 13] = [
        Col::l("run", 6, |r| r.run.clone()),
        Col::r("ledgers", 7, |r| r.ledgers.to_string()),
        Col::r("cadence", 8, |r| format!("{}ms", r.cadence_ms)),
        Col::r("write_s", 7, |r| format!("{:.1}", r.write_s)),
        Col::r("mean", 7, |r| opt(r.steady_mean)),
        Col::r("steady", 7, |r| opt(r.steady_peak)),
        Col::r("peak", 7, |r| opt(r.peak)),
        Col::r("after", 7, |r| opt(r.after)),
        Col::r("live_MB", 9, |r| {
            format!("{:.1}", r.live_bytes as f64 / 1e6)
        }),
        Col::r("disk_MB", 9, |r| {
            format!("{:.1}", r.disk_bytes as f64 / 1e6)
        }),
        Col::r("wrote/st", 9, |r| {
            format!(
                "{:.2}",
                r.written_mb_per_ledger / r.stored_mb_per_ledger.max(1e-9)
            )
        }),
        Col::r("cpu_ms", 9, |r| {
            format!("{:.1}", r.process_cpu_ms_per_ledger)
        }),
        Col::r("ring_ms", 9, |r| format!("{:.1}", r.ring_cpu_ms_per_ledger)),
    ];
    let mut s = crate::report::table_of(&cols, runs, (0, ""), |_| None);
    s.push_str(
        "mean/steady: disk/live once the ring is full, source running (mean, peak); peak: over \
         the whole run after the ring filled; after: idle, source stopped; wrote/st: bytes \
         written per byte stored; cpu_ms: process CPU per ledger; ring_ms: the ring's share\n",
    );
    s
}

/// The whole command: runs, prints the table, writes `--json`.
pub fn main(a: &RingDiskArgs) -> anyhow::Result<()> {
    let want = |n: &str| a.only.only.is_empty() || a.only.only.iter().any(|o| o == n);
    let tmp = crate::cluster::work_dir("ledger-bench-ring")?;
    make_certs(&tmp.path().join("certs"), 0)?;
    let idle = Duration::from_secs_f64(a.idle.idle_s.max(0.0));
    let mut runs = Vec::new();
    if want("paced") {
        let (n, c) = (a.paced_ledgers, a.paced_cadence_ms);
        eprintln!("ring-disk: paced, {n} ledgers every {c} ms");
        runs.push(run_one(a, tmp.path(), "paced", n, c, idle)?);
    }
    if want("burst") {
        let n = a.burst_ledgers;
        eprintln!(
            "ring-disk: burst, {n} ledgers every {} ms",
            a.burst_cadence_ms
        );
        runs.push(run_one(
            a,
            tmp.path(),
            "burst",
            n,
            a.burst_cadence_ms,
            idle,
        )?);
    }
    let report = RingDiskReport {
        args: a.clone(),
        runs,
    };
    crate::cluster::emit_json(&report, &a.json)
}

impl crate::cluster::Table for RingDiskReport {
    fn table(&self) -> String {
        table(&self.runs)
    }
}
