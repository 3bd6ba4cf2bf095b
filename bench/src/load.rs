//! `ledger-bench load`: many subscribers with mixed starts, some reconnecting in a loop, for
//! minutes (issue 7, item 5).
//!
//! One relay on loopback with an endless synthetic source. After a pre-roll (so the ring holds
//! something to start from), `--subscribers` `ledger-subscribe` processes start, staggered, a
//! third each from the tip, from (about) the oldest ledger retained and from the middle of the
//! ring. The first `--reconnecting` of them are stopped after a random life between
//! `--min-life` and `--max-life`, alternately with SIGINT (graceful: must exit 0) and SIGKILL,
//! and restarted at once with `--from` the ledger after the last one their stats file shows
//! (what a consumer that persists its position does). At the end every process gets SIGINT and
//! must exit 0.
//!
//! Checked afterwards: every subscriber's sequences, across all its processes, are contiguous
//! with no duplicate; a restarted process starts exactly where it was asked to; every process
//! ended with exit 0 or was killed by the harness. Measured: the relay's VmRSS every
//! `--rss-interval-ms`, its least-squares slope after `--slope-warmup` (MiB per minute) and
//! `VmHWM`; connects, reconnects, ledgers delivered and the relay's counters.

use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::cluster::{RelayProc, SubSpec};
use crate::harness::{self, mib, RssSample, Watched, Written};

mod verdict;

pub use verdict::*;

/// Parses a duration in the grammar of every command (`90s`, `5m`, `500ms`, `1h`), as
/// seconds, at most a day.
pub fn parse_secs(s: &str) -> Result<f64, String> {
    let d = ledger_relay_transport::parse_duration(s).map_err(|e| e.to_string())?;
    if d > Duration::from_secs(86_400) {
        return Err(format!("bad duration {s:?}: at most a day"));
    }
    Ok(d.as_secs_f64())
}

/// `ledger-bench load` settings.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
#[command(mut_arg("cadence_ms", |a| a.default_value("250ms")))]
#[command(mut_arg("ledger_bytes", |a| a.default_value("256KiB")))]
#[command(mut_arg("chunk_bytes", |a| a.default_value("65536")))]
#[command(mut_arg("lanes", |a| a.default_value("2")))]
#[command(mut_arg("subscribers", |a| a.default_value("32").help("Subscriber processes at once").value_parser(clap::value_parser!(u16).range(1..=128))))]
#[command(mut_arg("rss_interval_ms", |a| a.value_parser(clap::value_parser!(u64).range(10..=60_000))))]
#[command(mut_arg("quick", |a| a.help("A one-minute preset: --duration 60s, --slope-warmup 20s, --preroll 5s, --stagger 5s, --retention 80 (each unless given)")))]
#[command(mut_arg("retention", |a| a.default_value("240").default_value_if("quick", "true", "80").help("Ledgers the ring keeps (240: a minute at 250 ms; quick: 80): the ring fills during the warm-up, so memory after it is steady state")))]
pub struct LoadArgs {
    /// `--subscribers`, `--size`, `--chunk-bytes`, `--ratio`, `--codec`, `--cadence`,
    /// `--emit-ms`, `--lanes`, `--retention`, `--rss-interval-ms`, `--json` [defaults: 32
    /// subscribers, size 256KiB, chunk 65536, cadence 250ms, 2 lanes, retention 240 (quick 80)].
    #[command(flatten)]
    #[serde(flatten)]
    pub run: crate::cluster::LoopbackRun,
    /// `--quick`.
    #[command(flatten)]
    #[serde(flatten)]
    pub quick: crate::cluster::Quick,
    /// How long subscribers run, from the first start to the stop [default: 5m; quick 60s].
    #[arg(long, value_parser = parse_secs, value_name = "DURATION")]
    pub duration: Option<f64>,
    /// How many of them are stopped and restarted in a loop.
    #[arg(long, default_value_t = 8)]
    pub reconnecting: usize,
    /// Time from the relay's start left out of the memory slope [default: 90s, the ring full
    /// for 30 s; quick 20s] (`--warmup`, the old spelling, is kept; the other subcommands'
    /// `--warmup` counts ledgers).
    #[arg(long, alias = "warmup", value_parser = parse_secs, value_name = "DURATION")]
    #[serde(rename = "warmup")]
    pub slope_warmup: Option<f64>,
    /// Time the relay runs before the first subscriber [default: 10s; quick 5s].
    #[arg(long, value_parser = parse_secs, value_name = "DURATION")]
    pub preroll: Option<f64>,
    /// The first starts are spread over this long [default: 10s; quick 5s].
    #[arg(long, value_parser = parse_secs, value_name = "DURATION")]
    pub stagger: Option<f64>,
    /// Shortest life of a reconnecting subscriber's process.
    #[arg(long, value_parser = parse_secs, default_value = "2s", value_name = "DURATION")]
    pub min_life: f64,
    /// Longest life of a reconnecting subscriber's process.
    #[arg(long, value_parser = parse_secs, default_value = "10s", value_name = "DURATION")]
    pub max_life: f64,
    /// Seed of the random lives and start order.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Target: the slope of VmRSS after the warm-up at most this, MiB per minute.
    #[arg(long, default_value_t = 0.5)]
    pub flat_mib_per_min: f64,
}

/// The settings of a run, presets resolved.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoadSettings {
    /// Subscribers' run time, s.
    pub duration_s: f64,
    /// Memory slope warm-up from the relay's start, s.
    pub warmup_s: f64,
    /// Relay alone before the first subscriber, s.
    pub preroll_s: f64,
    /// Spread of the first starts, s.
    pub stagger_s: f64,
    /// Ring retention, ledgers.
    pub retention: u32,
}

impl LoadArgs {
    /// Resolves the presets and checks the arguments.
    pub fn settings(&self) -> anyhow::Result<LoadSettings> {
        let q = self.quick.quick;
        let s = LoadSettings {
            duration_s: self.duration.unwrap_or(if q { 60.0 } else { 300.0 }),
            warmup_s: self.slope_warmup.unwrap_or(if q { 20.0 } else { 90.0 }),
            preroll_s: self.preroll.unwrap_or(if q { 5.0 } else { 10.0 }),
            stagger_s: self.stagger.unwrap_or(if q { 5.0 } else { 10.0 }),
            retention: self.run.retention.retention,
        };
        if self.reconnecting > usize::from(self.run.subscribers.subscribers) {
            bail!("--reconnecting must not exceed --subscribers");
        }
        if s.duration_s < 1.0 {
            bail!("--duration must be at least 1s");
        }
        if !(self.min_life >= 0.2 && self.max_life >= self.min_life) {
            bail!("--min-life must be at least 200ms and --max-life at least --min-life");
        }
        self.run.check()?;
        Ok(s)
    }
}

/// xorshift64*: the run's randomness, reproducible from `--seed`.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [lo, hi].
    fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

struct Slot {
    report: SlotReport,
    child: Option<Child>,
    start_at_s: f64,
    stop_at_s: f64,
    stops: usize,
}

struct Ctx<'a> {
    a: &'a LoadArgs,
    dir: PathBuf,
    cluster: crate::cluster::Cluster,
    t0: Instant,
}

impl Ctx<'_> {
    fn now_s(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }
}

/// The `--from` for a slot's next process: the ledger after the last one it wrote, else a
/// fresh start of its kind.
fn next_from(slot: &Slot, scrape: Option<&harness::Scrape>) -> String {
    if let Some(last) = slot
        .report
        .segments
        .iter()
        .rev()
        .find_map(|s| s.written.last_seq)
    {
        return last.wrapping_add(1).to_string();
    }
    let (oldest, newest) = scrape.map_or((0, 0), |m| {
        (m.get("ring_oldest") as u32, m.get("ring_newest") as u32)
    });
    if oldest == 0 || newest == 0 {
        return "tip".into();
    }
    match slot.report.kind {
        StartKind::Tip => "tip".into(),
        StartKind::Oldest => (oldest + OLDEST_MARGIN).min(newest).to_string(),
        StartKind::Middle => (oldest + (newest - oldest) / 2).to_string(),
    }
}

fn start(
    ctx: &Ctx<'_>,
    relay: &RelayProc,
    slot: &mut Slot,
    scrape: Option<&harness::Scrape>,
) -> anyhow::Result<()> {
    let k = slot.report.segments.len();
    let from = next_from(slot, scrape);
    let spec = SubSpec::new(
        &slot.report.name,
        &from,
        None,
        ctx.a.run.lanes.lanes,
        &ctx.dir,
        &format!("{}-{k}", slot.report.name),
    );
    let child = ctx.cluster.subscriber(relay.addr, &spec)?;
    slot.child = Some(child);
    slot.report.segments.push(Segment {
        from,
        started_s: ctx.now_s(),
        ended_s: f64::NAN,
        end: None,
        written: Written::default(),
        stats: spec.stats,
        log: spec.log,
    });
    Ok(())
}

/// Records how the running process of `slot` ended and reads what it wrote.
fn close_segment(ctx: &Ctx<'_>, slot: &mut Slot, end: End) -> anyhow::Result<()> {
    slot.child = None;
    let seg = slot
        .report
        .segments
        .last_mut()
        .context("a segment to close")?;
    seg.ended_s = ctx.now_s();
    seg.end = Some(end);
    seg.written = Written::of(&harness::read_stats_lenient(&seg.stats)?);
    Ok(())
}

/// Describes an exit the harness did not cause.
fn unexpected(slot: &Slot, st: std::process::ExitStatus) -> End {
    let log = slot
        .report
        .segments
        .last()
        .map(|s| harness::last_line(&s.log))
        .unwrap_or_default();
    End::Failed(format!("exited by itself ({st}): {log}"))
}

/// Runs the load (see the module documentation).
pub fn run(a: &LoadArgs) -> anyhow::Result<LoadReport> {
    let s = a.settings()?;
    let subscribers = usize::from(a.run.subscribers.subscribers);
    let load_start = harness::load_average();
    let mut tmp = crate::cluster::work_dir("ledger-bench-load")?;
    let certs = tmp.path().join("certs");
    harness::make_certs(&certs, subscribers)?;
    let ctx = Ctx {
        a,
        dir: tmp.path().join("subs"),
        cluster: crate::cluster::Cluster::local(&certs, Default::default())?,
        t0: Instant::now(),
    };
    std::fs::create_dir_all(&ctx.dir)?;
    let settings = a.run.relay(s.retention);
    let relay = ctx
        .cluster
        .relay(&tmp.path().join("relay"), &settings, &[])?;
    let total_s = s.preroll_s + s.duration_s + 30.0;
    let mut watched = Watched::new(relay, a.run.rss.rss_interval_ms, total_s, ctx.t0);
    let mut rng = Rng::new(a.seed);
    let mut order: Vec<usize> = (0..subscribers).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let mut slots: Vec<Slot> = (0..subscribers)
        .map(|i| Slot {
            report: SlotReport {
                name: format!("sub-{i}"),
                kind: [StartKind::Tip, StartKind::Oldest, StartKind::Middle][i % 3],
                reconnecting: i < a.reconnecting,
                segments: Vec::new(),
                ledgers: 0,
                contiguous: false,
            },
            child: None,
            start_at_s: 0.0,
            stop_at_s: f64::INFINITY,
            stops: 0,
        })
        .collect();
    for (k, &i) in order.iter().enumerate() {
        slots[i].start_at_s = s.preroll_s + s.stagger_s * k as f64 / subscribers as f64;
    }
    let end_s = s.preroll_s + s.duration_s;
    let mut failures: Vec<String> = Vec::new();
    let (mut graceful, mut kills) = (0usize, 0usize);
    let mut series = Vec::new();
    let mut scrape: Option<harness::Scrape> = None;
    let mut last_scrape = f64::NEG_INFINITY;
    let mut hwm = 0u64;
    let outcome = (|| -> anyhow::Result<()> {
        let relay = &mut watched.relay;
        loop {
            let now = ctx.now_s();
            if now >= end_s {
                break;
            }
            relay.check_alive()?;
            if now - last_scrape >= 1.0 {
                last_scrape = now;
                if let Ok(m) = relay.scrape() {
                    series.push((now, m.get("sessions_open"), m.get("lanes_open")));
                    scrape = Some(m);
                }
            }
            for slot in slots.iter_mut() {
                if slot.child.is_none() {
                    if now >= slot.start_at_s {
                        start(&ctx, relay, slot, scrape.as_ref())?;
                        if slot.report.reconnecting {
                            slot.stop_at_s = ctx.now_s() + rng.range(a.min_life, a.max_life);
                        }
                    }
                    continue;
                }
                let Some(child) = slot.child.as_mut() else {
                    continue;
                };
                if let Some((st, _)) = crate::proc::wait_with_cpu(child, Instant::now())? {
                    let end = unexpected(slot, st);
                    failures.push(format!("{}: {:?}", slot.report.name, end));
                    close_segment(&ctx, slot, end)?;
                    // Restarted from where it stopped, after a pause, to keep the load up.
                    slot.start_at_s = now + 1.0;
                    continue;
                }
                if now >= slot.stop_at_s {
                    let end = if slot.stops % 2 == 0 {
                        graceful += 1;
                        match crate::proc::stop(child, Duration::from_secs(5)) {
                            Some((st, _)) if st.success() => End::Stopped,
                            Some((st, _)) => End::Failed(format!("SIGINT: exit {st}")),
                            None => End::Failed("SIGINT: not stopped within 5 s".into()),
                        }
                    } else {
                        kills += 1;
                        crate::proc::kill_all(std::slice::from_mut(child));
                        End::Killed
                    };
                    slot.stops += 1;
                    if let End::Failed(e) = &end {
                        failures.push(format!("{}: {e}", slot.report.name));
                    }
                    close_segment(&ctx, slot, end)?;
                    slot.start_at_s = ctx.now_s();
                    slot.stop_at_s = f64::INFINITY;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The end: SIGINT to every process at once, then each must exit 0 within 10 s.
        for slot in slots.iter() {
            if let Some(c) = &slot.child {
                let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGINT);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for slot in slots.iter_mut() {
            let Some(child) = slot.child.as_mut() else {
                continue;
            };
            let end = match crate::proc::wait_with_cpu(child, deadline)? {
                Some((st, _)) if st.success() => End::Stopped,
                Some((st, _)) => End::Failed(format!("final SIGINT: exit {st}")),
                None => {
                    crate::proc::kill_all(std::slice::from_mut(child));
                    End::Failed("final SIGINT: not stopped within 10 s".into())
                }
            };
            if let End::Failed(e) = &end {
                failures.push(format!("{}: {e}", slot.report.name));
            }
            close_segment(&ctx, slot, end)?;
        }
        let last;
        (hwm, last) = watched.peak();
        scrape = last.or(scrape.take());
        Ok(())
    })();
    let samples = watched.finish(slots.iter_mut().filter_map(|s| s.child.take()).collect());
    let wall_s = ctx.now_s();
    outcome?;
    crate::cluster::keep_if_asked(&mut tmp);

    // Checks.
    let mut delivered = 0usize;
    for slot in slots.iter_mut() {
        let mut seqs: Vec<Vec<u32>> = Vec::new();
        for (k, seg) in slot.report.segments.iter().enumerate() {
            let recs = harness::read_stats_lenient(&seg.stats)?;
            if let (Ok(from), Some(first)) = (seg.from.parse::<u32>(), recs.first()) {
                if first.seq != from {
                    failures.push(format!(
                        "{} process {k}: asked for {from}, first ledger {}",
                        slot.report.name, first.seq
                    ));
                }
            }
            seqs.push(recs.iter().map(|r| r.seq).collect());
        }
        slot.report.ledgers = seqs.iter().map(Vec::len).sum();
        delivered += slot.report.ledgers;
        match harness::check_contiguous(&seqs) {
            Ok(()) => slot.report.contiguous = true,
            Err(e) => failures.push(format!("{}: {e}", slot.report.name)),
        }
        if slot.report.ledgers == 0 {
            failures.push(format!("{}: no ledger delivered", slot.report.name));
        }
    }
    let connects: usize = slots.iter().map(|s| s.report.segments.len()).sum();
    let [rss_start_mib, rss_max_mib, rss_end_mib] = harness::rss_span(&samples);
    let rss_of = |t: f64| {
        samples
            .iter()
            .find(|x| x.t_s >= t)
            .or(samples.last())
            .map_or(0.0, |x| mib(x.rss_kib))
    };
    let after: Vec<(f64, f64)> = samples
        .iter()
        .filter(|x| x.t_s >= s.warmup_s)
        .map(|x| (x.t_s / 60.0, mib(x.rss_kib)))
        .collect();
    let slope = harness::slope(&after);
    let after_warmup = AfterWarmup::of(&after.iter().map(|p| p.1).collect::<Vec<_>>());
    let counters = scrape
        .map(|m| {
            [
                "sessions_total",
                "sessions_open",
                "sessions_refused_total",
                "lagged_total",
                "ring_reads_total",
                "ledgers_out_total",
                "ledgers_in_total",
                "resent_chunks_total",
                "protocol_errors_total",
                "ring_oldest",
                "ring_newest",
            ]
            .iter()
            .map(|k| (k.to_string(), m.get(k)))
            .collect()
        })
        .unwrap_or_default();
    Ok(LoadReport {
        args: a.clone(),
        load_average: [load_start, harness::load_average()],
        connects,
        reconnects: connects - slots.len().min(connects),
        graceful_stops: graceful,
        kills,
        ledgers_delivered: delivered,
        failures,
        relay_counters: counters,
        rss_start_mib,
        rss_end_mib,
        rss_max_mib,
        rss_at_warmup_mib: rss_of(s.warmup_s),
        rss_hwm_mib: mib(hwm),
        flat: slope.is_some_and(|v| v <= a.flat_mib_per_min),
        rss_slope_mib_per_min: slope,
        rss_after_warmup: after_warmup,
        wall_s,
        settings: s,
        slots: slots.into_iter().map(|s| s.report).collect(),
        sessions_series: series,
        rss_samples: samples,
    })
}

/// The whole command: runs, prints the summary, writes `--json`; fails when anything failed.
pub fn main(a: &LoadArgs) -> anyhow::Result<()> {
    let report = run(a)?;
    crate::cluster::emit_json(&report, &a.run.json)?;
    if !report.failures.is_empty() {
        bail!("{} failures", report.failures.len());
    }
    Ok(())
}

impl crate::cluster::Table for LoadReport {
    fn table(&self) -> String {
        summary(self)
    }
}

#[cfg(test)]
mod tests;
