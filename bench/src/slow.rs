//! `ledger-bench slow-subscriber`: one subscriber consuming at a tenth of the rate next to
//! normal ones (issue 7, item 4).
//!
//! Runs, each with a fresh relay on loopback fed the same synthetic ledgers:
//!
//! - **A**: `--subscribers` normal subscribers;
//! - **B**: the same plus one slow subscriber (`ledger-subscribe --consume-delay` = factor x
//!   cadence), the relay keeping `--retention` ledgers: the slow one falls behind the live
//!   stream, is moved to ring reading (`ledger_relay_lagged_total`), and takes every ledger at
//!   its own pace, back on the live stream once it reaches the tip (after the source stops);
//! - **C** (`--short-retention N`, 0 skips it): as B with a ring of N ledgers, so the slow one
//!   falls out of retention and exits 4 (below retention).
//!
//! A and B alternate `--repeat` times (A1 B1 A2 B2 ...), so that the machine's drift falls on
//! both alike; the p99 target compares the pooled samples of all A runs with those of all B
//! runs, and the spread of the A runs shows the run-to-run noise. Only B1 waits for the slow
//! subscriber to take every ledger; in later B runs it is stopped once the normal ones are
//! done (it has been moved to ring reading by then).
//!
//! Per run: the normal subscribers' delivery p50/p99 (warm-up excluded), the slow one's
//! outcome, the relay's `lagged_total`, `ring_reads_total` and `resent_chunks_total`, and the
//! relay's resident memory (`VmRSS` every `--rss-interval-ms`, `VmHWM` at the end) against a
//! bound derived from the relay's settings ([`MemoryBound`]), and the slow subscriber's
//! marginal peak (B over A) against the bound's per-session term.

use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::harness::{
    self, mib, status_kib, RelayProc, RelaySettings, RssSample, RssSampler, SubSpec,
};
use crate::stats::{quantile, summarize, Record, Summary};

/// Items the relay's live broadcast channel holds (`RelayConfig::live_capacity`,
/// relay/src/config.rs): a session that falls further behind is moved to ring reading.
pub const LIVE_CAPACITY: u64 = 512;
/// Complete ledgers the hub keeps in memory (`Hub::new(live_capacity, 4)`, relay/src/lib.rs).
pub const RECENT_LEDGERS: u64 = 4;
/// The relay's default `--window` (ledgers unacknowledged per session).
pub const WINDOW: u64 = 8;
/// sled's page cache in the ring (relay/src/ring.rs `CACHE_BYTES`).
pub const SLED_CACHE: u64 = 256 << 20;
/// sled's segment size (relay/src/ring.rs `SEGMENT_SIZE`); three IO buffers are counted.
pub const SLED_SEGMENT: u64 = 8 << 20;
/// The synthetic source builds every ledger up front when they fit in this many bytes
/// (relay/src/source/synthetic.rs `UPFRONT_BYTES`), else keeps `AHEAD` ready.
pub const SYNTHETIC_UPFRONT: u64 = 256 << 20;
/// Distinct filler bodies the synthetic source keeps (`POOL`).
pub const SYNTHETIC_POOL: u64 = 4;
/// Ledgers the synthetic generator keeps ready (`AHEAD`).
pub const SYNTHETIC_AHEAD: u64 = 2;
/// Chunks that may wait for a compression worker (`PipelineConfig::compress_queue`).
pub const COMPRESS_QUEUE: u64 = 64;
/// Allowance per compression thread for its zstd context, bytes.
pub const ZSTD_CONTEXT: u64 = 4 << 20;
/// Allowance per QUIC connection (lane) for quinn's state and transmit buffers, bytes (chunk
/// payloads are shared `Bytes`, counted once in the hub or the session).
pub const PER_LANE: u64 = 256 << 10;
/// Allocator slack on every data term (fragmentation of glibc's arenas).
pub const SLACK: f64 = 0.25;

/// `ledger-bench slow-subscriber` settings.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct SlowArgs {
    /// Normal subscribers.
    #[arg(long, default_value_t = 8)]
    pub subscribers: u8,
    /// Ledgers the source emits; every subscriber, the slow one included, takes them all.
    #[arg(long, default_value_t = 100)]
    pub ledgers: u32,
    /// Ledgers left out at the start of each normal subscriber.
    #[arg(long, default_value_t = 3)]
    pub warmup: u32,
    /// Time between ledgers, ms.
    #[arg(long, default_value_t = 250.0)]
    pub cadence_ms: f64,
    /// Emit window of the source, ms.
    #[arg(long, default_value_t = 8.0)]
    pub emit_ms: f64,
    /// The slow subscriber waits this many cadences after each ledger (10: a tenth of the
    /// rate).
    #[arg(long, default_value_t = 10.0)]
    pub slow_factor: f64,
    /// Ledger size in bytes (default: the main bench's 14.5 MiB scaled by 25, 594 KiB).
    #[arg(long, default_value_t = 608_174)]
    pub ledger_bytes: u64,
    /// Relay chunk size in bytes (default: the main bench's 256 KiB scaled by 25).
    #[arg(long, default_value_t = 10_485)]
    pub chunk_bytes: u64,
    /// zstd-1 ratio of the synthetic ledgers (1: incompressible).
    #[arg(long, default_value_t = 7.6)]
    pub ratio: f64,
    /// Relay codec: zstd, lz4 or none.
    #[arg(long, default_value = "zstd")]
    pub codec: String,
    /// Lanes per subscriber.
    #[arg(long, default_value_t = 4)]
    pub lanes: u8,
    /// Ledgers the relay's ring keeps in runs A and B.
    #[arg(long, default_value_t = 10_000)]
    pub retention: u32,
    /// Ledgers the ring keeps in run C, where the slow subscriber falls out of retention;
    /// 0 skips run C.
    #[arg(long, default_value_t = 10)]
    pub short_retention: u32,
    /// Pairs of runs A and B, alternated.
    #[arg(long, default_value_t = 3)]
    pub repeat: u32,
    /// Relay VmRSS sampling interval, ms.
    #[arg(long, default_value_t = 100)]
    pub rss_interval_ms: u64,
    /// Target: the normal subscribers' p99 in B within this fraction of A's.
    #[arg(long, default_value_t = 0.10)]
    pub p99_tolerance: f64,
    /// Write the results as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

impl SlowArgs {
    fn check(&self) -> anyhow::Result<()> {
        if self.subscribers == 0 || usize::from(self.subscribers) > 254 {
            bail!("--subscribers must be 1..=254");
        }
        if self.ledgers <= self.warmup {
            bail!("--ledgers must exceed --warmup ({})", self.warmup);
        }
        if !(self.cadence_ms > 0.0 && self.emit_ms >= 0.0 && self.emit_ms <= self.cadence_ms) {
            bail!("--cadence-ms must be positive and at least --emit-ms");
        }
        if !(self.slow_factor > 0.0 && self.slow_factor <= 1000.0) {
            bail!("--slow-factor must be in (0, 1000]");
        }
        if self.lanes == 0 || self.retention == 0 {
            bail!("--lanes and --retention must be at least 1");
        }
        if self.chunk_bytes < 4096 {
            bail!("--chunk-bytes must be at least 4096 (the relay's minimum)");
        }
        if !(1..=20).contains(&self.repeat) {
            bail!("--repeat must be 1..=20");
        }
        if !(10..=10_000).contains(&self.rss_interval_ms) {
            bail!("--rss-interval-ms must be 10..=10000");
        }
        Ok(())
    }

    /// The slow subscriber's `--consume-delay`, ms.
    pub fn delay_ms(&self) -> f64 {
        self.cadence_ms * self.slow_factor
    }

    fn relay(&self, retention: u32) -> RelaySettings {
        RelaySettings {
            size: self.ledger_bytes,
            ratio: self.ratio,
            count: Some(self.ledgers),
            start: 2,
            cadence_ms: self.cadence_ms,
            emit_ms: self.emit_ms,
            codec: self.codec.clone(),
            chunk: self.chunk_bytes,
            retention,
        }
    }
}

/// A memory bound for the relay, from its settings (see the constants of this module and the
/// module documentation of relay/src/hub.rs and session.rs). Every term in MiB.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MemoryBound {
    /// An idle relay of the same binary on this machine (1 KiB ledgers, no subscriber),
    /// measured: code, runtime, TLS, the QUIC endpoint, sled opened.
    pub base_mib: f64,
    /// The synthetic source: every ledger built up front when they fit in 256 MiB, else a few
    /// ahead, plus its filler pool.
    pub source_mib: f64,
    /// The pipeline: the ledger being cut, the compression queue, a zstd context per thread.
    pub pipeline_mib: f64,
    /// The hub: the broadcast channel's items (chunks and end records) and the recent
    /// ledgers, counted separately though they share chunks.
    pub hub_mib: f64,
    /// Sessions: per session a full window of ledgers read from the ring (its own copies),
    /// and per lane quinn's state.
    pub sessions_mib: f64,
    /// The ring: sled's cache (at most what the ring holds, twice, capped by its cache size)
    /// and three segment-sized IO buffers.
    pub ring_mib: f64,
    /// The bound: base plus every data term with [`SLACK`] for the allocator.
    pub total_mib: f64,
}

impl MemoryBound {
    /// The bound for a relay with these settings, `sessions` sessions of `lanes` lanes, and
    /// `wire_ledger` bytes per ledger on the wire (measured).
    pub fn new(
        base_kib: u64,
        s: &RelaySettings,
        sessions: u64,
        lanes: u64,
        wire_ledger: f64,
    ) -> MemoryBound {
        let m = |b: f64| b / f64::from(1 << 20);
        let size = s.size as f64;
        let count = u64::from(s.count.unwrap_or(u32::MAX));
        let pool = count.min(SYNTHETIC_POOL) as f64;
        let source = if s.count.is_some() && count.saturating_mul(s.size) <= SYNTHETIC_UPFRONT {
            count as f64 * size + pool * size
        } else {
            (SYNTHETIC_AHEAD + 1) as f64 * size + pool * size
        };
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as f64;
        let pipeline = 2.0 * size
            + COMPRESS_QUEUE.min(s.size.div_ceil(s.chunk)) as f64 * s.chunk as f64
            + threads * ZSTD_CONTEXT as f64;
        let items_per_ledger = s.size.div_ceil(s.chunk) + 1;
        let channel_ledgers = LIVE_CAPACITY.div_ceil(items_per_ledger) + 1;
        let hub = (channel_ledgers + RECENT_LEDGERS) as f64 * wire_ledger;
        let per_session = WINDOW as f64 * wire_ledger + (lanes * PER_LANE) as f64;
        let sessions_b = sessions as f64 * per_session;
        let held = u64::from(s.retention).min(count) as f64 * wire_ledger;
        let ring = (2.0 * held).min(SLED_CACHE as f64) + 3.0 * SLED_SEGMENT as f64;
        let data = source + pipeline + hub + sessions_b + ring;
        MemoryBound {
            base_mib: mib(base_kib),
            source_mib: m(source),
            pipeline_mib: m(pipeline),
            hub_mib: m(hub),
            sessions_mib: m(sessions_b),
            ring_mib: m(ring),
            total_mib: mib(base_kib) + m(data) * (1.0 + SLACK),
        }
    }

    /// The terms on one line.
    pub fn line(&self) -> String {
        format!(
            "base {:.1} + (source {:.1} + pipeline {:.1} + hub {:.1} + sessions {:.1} + ring {:.1}) x {:.2} = {:.1} MiB",
            self.base_mib,
            self.source_mib,
            self.pipeline_mib,
            self.hub_mib,
            self.sessions_mib,
            self.ring_mib,
            1.0 + SLACK,
            self.total_mib
        )
    }
}

/// The slow subscriber's outcome in one run.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SlowOutcome {
    /// `--consume-delay`, ms.
    pub delay_ms: f64,
    /// The run waited for it to take every ledger (else it was stopped once the normal
    /// subscribers were done).
    pub waited: bool,
    /// Exit code (`None`: killed by a signal, or still running at the deadline).
    pub exit_code: Option<i32>,
    /// Ledgers it wrote.
    pub ledgers: usize,
    /// First and last sequence it wrote.
    pub first_seq: Option<u32>,
    /// Last sequence it wrote.
    pub last_seq: Option<u32>,
    /// Its sequences have no gap, duplicate or reordering.
    pub contiguous: bool,
    /// Seconds from the run's start to its exit.
    pub done_s: Option<f64>,
    /// Seconds from the run's start to the first scrape showing `lagged_total` >= 1.
    pub lagged_s: Option<f64>,
    /// The source's newest ledger at that scrape.
    pub lagged_at_seq: Option<u32>,
    /// Its session was seen catching up (reading from memory or the ring) after that.
    pub seen_catching_up: bool,
    /// Seconds to the first scrape after lagging that showed it live again.
    pub live_again_s: Option<f64>,
    /// Largest lag `/metrics` showed for it, ledgers.
    pub max_lag_ledgers: u64,
    /// Its largest delivery time (how far behind it was), ms.
    pub max_delivery_ms: f64,
    /// With exit 4: the oldest ledger the relay held, from its message.
    pub oldest_held: Option<u32>,
    /// The last line of its stderr.
    pub message: String,
}

impl SlowOutcome {
    /// One phrase.
    pub fn verdict(&self, expected: u32) -> String {
        match self.exit_code {
            Some(0) if self.ledgers == expected as usize && self.contiguous => format!(
                "caught up: {}/{expected} ledgers in {:.0} s",
                self.ledgers,
                self.done_s.unwrap_or(f64::NAN)
            ),
            Some(4) => format!(
                "below retention (exit 4) after {} ledgers{}",
                self.ledgers,
                self.oldest_held
                    .filter(|o| *o > 0)
                    .map(|o| format!(", oldest held {o}"))
                    .unwrap_or_default()
            ),
            None if !self.waited && self.contiguous => format!(
                "stopped by the harness after the normal ones, at {} ledgers",
                self.ledgers
            ),
            Some(c) => format!("FAILED: exit {c} after {} ledgers", self.ledgers),
            None => format!("FAILED: no exit ({} ledgers)", self.ledgers),
        }
    }
}

/// Resident memory of the relay in one run.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RssFigures {
    /// Samples taken.
    pub samples: usize,
    /// At "relay listening", MiB.
    pub at_listen_mib: f64,
    /// Largest sample, MiB.
    pub max_mib: f64,
    /// Last sample, MiB.
    pub end_mib: f64,
    /// `VmHWM` (peak resident) before the relay was stopped, MiB.
    pub hwm_mib: f64,
}

/// One run's results.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SlowRun {
    /// `A1`, `B1`, `A2`, ... or `C`.
    pub name: String,
    /// What it is.
    pub label: String,
    /// `--retention` of its relay.
    pub retention: u32,
    /// Normal subscribers' summary (warm-up excluded), all pooled.
    pub normal: Summary,
    /// Each normal subscriber's p99, ms.
    pub normal_p99_each_ms: Vec<f64>,
    /// Every normal subscriber's ledgers after warm-up: (sequence, delivery ms).
    pub normal_samples: Vec<(u32, f64)>,
    /// The slow subscriber, in B and C.
    pub slow: Option<SlowOutcome>,
    /// `ledger_relay_lagged_total` at the end.
    pub lagged_total: f64,
    /// `ledger_relay_ring_reads_total` at the end.
    pub ring_reads_total: f64,
    /// `ledger_relay_ledgers_out_total` at the end.
    pub ledgers_out_total: f64,
    /// `ledger_relay_resent_chunks_total` at the end.
    pub resent_chunks_total: f64,
    /// Relay memory.
    pub rss: RssFigures,
    /// The bound for this run.
    pub bound: MemoryBound,
    /// VmHWM within the bound.
    pub within_bound: bool,
    /// Wall time, s.
    pub wall_s: f64,
    /// Every VmRSS sample.
    pub rss_samples: Vec<RssSample>,
}

/// The whole result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SlowReport {
    /// Settings.
    pub args: SlowArgs,
    /// Load average at the start and at the end.
    pub load_average: [Option<[f64; 3]>; 2],
    /// Idle relay, KiB (the bound's base).
    pub idle_rss_kib: u64,
    /// The runs in order.
    pub runs: Vec<SlowRun>,
    /// Normal subscribers' delivery over all A runs: samples, p50, p99, ms.
    pub pooled_a: (usize, f64, f64),
    /// The same over all B runs.
    pub pooled_b: (usize, f64, f64),
    /// Pooled B p99 over pooled A p99: the target.
    pub p99_ratio: Option<f64>,
    /// The source's newest ledger when the last B run's slow subscriber was moved to ring
    /// reading.
    pub split_seq: Option<u32>,
    /// Pooled (samples, p50, p99) of A and B for ledgers up to `split_seq` (the slow one still
    /// live), then A and B after it (the slow one reading the ring).
    pub split: Option<[(usize, f64, f64); 4]>,
    /// B_k p99 over A_k p99, per pair.
    pub pair_ratios: Vec<f64>,
    /// Largest over smallest p99 of the A runs: the run-to-run noise of one configuration.
    pub a_spread: Option<f64>,
    /// Mean VmHWM of the B runs less that of the A runs, MiB: what the slow subscriber cost.
    pub marginal_hwm_mib: Option<f64>,
    /// The bound's term for one session, MiB.
    pub per_session_mib: f64,
}

struct Env {
    relay_bin: PathBuf,
    sub_bin: PathBuf,
    certs: PathBuf,
    tmp: PathBuf,
}

/// Measures an idle relay: 1 KiB ledgers, one per 100 ms, no subscriber, after 2 s.
fn idle_rss(env: &Env) -> anyhow::Result<u64> {
    let s = RelaySettings {
        size: 1024,
        ratio: 1.0,
        count: Some(20),
        start: 2,
        cadence_ms: 100.0,
        emit_ms: 1.0,
        codec: "zstd".into(),
        chunk: 4096,
        retention: 100,
    };
    let relay = RelayProc::start(&env.relay_bin, &env.certs, &env.tmp.join("idle"), &s)?;
    std::thread::sleep(Duration::from_secs(2));
    let rss = status_kib(relay.pid, "VmRSS");
    relay.stop();
    rss.context("reading the idle relay's VmRSS")
}

/// A started subscriber and what became of it.
struct Sub {
    child: Child,
    stats: PathBuf,
    log: PathBuf,
    exit: Option<(Option<i32>, f64)>,
}

/// One run to make.
struct Planned {
    name: String,
    label: String,
    /// With the slow subscriber.
    slow: bool,
    /// Waiting for it to take every ledger.
    wait_slow: bool,
    retention: u32,
}

fn run_one(env: &Env, a: &SlowArgs, idle_kib: u64, p: &Planned) -> anyhow::Result<SlowRun> {
    let Planned {
        name,
        label,
        slow,
        wait_slow,
        retention,
    } = p;
    let (slow, wait_slow, retention) = (*slow, *wait_slow, *retention);
    let dir = env.tmp.join(format!("run-{name}"));
    let settings = a.relay(retention);
    let relay = RelayProc::start(&env.relay_bin, &env.certs, &dir, &settings)?;
    let t0 = Instant::now();
    let at_listen = status_kib(relay.pid, "VmRSS").unwrap_or(0);
    let normal_s = f64::from(a.ledgers) * a.cadence_ms / 1e3 + 60.0;
    let slow_s = normal_s + f64::from(a.ledgers) * a.delay_ms() / 1e3 + 60.0;
    let limit_s = if slow && wait_slow { slow_s } else { normal_s };
    let sampler = RssSampler::start(
        relay.pid,
        Duration::from_millis(a.rss_interval_ms),
        t0,
        (limit_s * 1e3 / a.rss_interval_ms as f64) as usize + 100,
    );
    let mut relay = Some(relay);
    let mut subs: Vec<Sub> = Vec::new();
    let result = (|| -> anyhow::Result<SlowRun> {
        let relay_ref = relay.as_mut().context("relay")?;
        let total = usize::from(a.subscribers) + usize::from(slow);
        for i in 0..total {
            let is_slow = i == usize::from(a.subscribers);
            let spec = SubSpec {
                name: format!("sub-{i}"),
                from: "2".into(),
                count: Some(a.ledgers),
                lanes: a.lanes,
                stats: dir.join(format!("stats-{i}.csv")),
                log: dir.join(format!("sub-{i}.log")),
                consume_delay_ms: is_slow.then(|| a.delay_ms()),
            };
            let child = harness::spawn_subscriber(&env.sub_bin, relay_ref.addr, &env.certs, &spec)?;
            subs.push(Sub {
                child,
                stats: spec.stats,
                log: spec.log,
                exit: None,
            });
        }
        let slow_name = format!("sub-{}", a.subscribers);
        let mut outcome = SlowOutcome {
            delay_ms: a.delay_ms(),
            waited: wait_slow,
            ..SlowOutcome::default()
        };
        let mut last_scrape = Instant::now() - Duration::from_secs(1);
        let mut scrape = harness::Scrape::default();
        loop {
            relay_ref.check_alive()?;
            let now_s = t0.elapsed().as_secs_f64();
            for (i, s) in subs.iter_mut().enumerate() {
                if s.exit.is_some() {
                    continue;
                }
                if let Some((st, _)) = crate::proc::wait_with_cpu(&mut s.child, Instant::now())? {
                    let is_slow = i == usize::from(a.subscribers);
                    if !is_slow && !st.success() {
                        bail!(
                            "normal subscriber {i} failed ({st}): {}",
                            harness::last_line(&s.log)
                        );
                    }
                    s.exit = Some((st.code(), now_s));
                }
            }
            if last_scrape.elapsed() >= Duration::from_millis(250) {
                last_scrape = Instant::now();
                // A scrape can fail while the relay is busy; the next one is 250 ms away.
                if let Ok(m) = relay_ref.scrape() {
                    if m.get("lagged_total") >= 1.0 && outcome.lagged_s.is_none() {
                        outcome.lagged_s = Some(now_s);
                        outcome.lagged_at_seq = Some(m.get("source_newest") as u32);
                    }
                    for sm in m.sessions_of(&slow_name) {
                        outcome.max_lag_ledgers = outcome.max_lag_ledgers.max(sm.lag);
                        if outcome.lagged_s.is_some() {
                            if sm.catching_up {
                                outcome.seen_catching_up = true;
                            } else if outcome.seen_catching_up && outcome.live_again_s.is_none() {
                                outcome.live_again_s = Some(now_s);
                            }
                        }
                    }
                    scrape = m;
                }
            }
            if subs.iter().all(|s| s.exit.is_some()) {
                break;
            }
            let normals_done = subs
                .iter()
                .take(usize::from(a.subscribers))
                .all(|s| s.exit.is_some());
            if normals_done && !wait_slow {
                // The slow one has been measured for as long as the normal ones ran.
                break;
            }
            if (!normals_done && now_s > normal_s) || now_s > limit_s {
                bail!("timed out after {now_s:.0} s; logs in {}", dir.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let wall_s = t0.elapsed().as_secs_f64();
        let hwm = status_kib(relay_ref.pid, "VmHWM").unwrap_or(0);
        for s in subs.iter_mut().filter(|s| s.exit.is_none()) {
            crate::proc::kill_all(std::slice::from_mut(&mut s.child));
        }
        if let Ok(m) = relay_ref.scrape() {
            scrape = m;
        }
        let mut normals: Vec<Vec<Record>> = Vec::new();
        for (i, s) in subs.iter().take(usize::from(a.subscribers)).enumerate() {
            let recs = crate::stats::read_csv(&s.stats)?;
            let seqs: Vec<u32> = recs.iter().map(|r| r.seq).collect();
            harness::check_contiguous(&[seqs])
                .map_err(|e| anyhow::anyhow!("normal subscriber {i}: {e}"))?;
            if recs.len() != a.ledgers as usize || recs.first().map(|r| r.seq) != Some(2) {
                bail!(
                    "normal subscriber {i}: {} ledgers from {:?}, expected {} from 2",
                    recs.len(),
                    recs.first().map(|r| r.seq),
                    a.ledgers
                );
            }
            normals.push(recs);
        }
        let warm = a.warmup as usize;
        let normal = summarize(&normals, warm, a.emit_ms);
        let normal_samples: Vec<(u32, f64)> = normals
            .iter()
            .flat_map(|v| v.iter().skip(warm).map(|r| (r.seq, r.delivery_ms)))
            .collect();
        let normal_p99_each_ms = normals
            .iter()
            .map(|v| {
                let mut d: Vec<f64> = v.iter().skip(warm).map(|r| r.delivery_ms).collect();
                d.sort_by(f64::total_cmp);
                quantile(&d, 0.99)
            })
            .collect();
        let wire_ledger = normals
            .iter()
            .flatten()
            .map(|r| r.wire_bytes as f64)
            .fold(0.0, f64::max);
        let slow_out = if slow {
            let s = &subs[usize::from(a.subscribers)];
            let recs = harness::read_stats_lenient(&s.stats)?;
            let seqs: Vec<u32> = recs.iter().map(|r| r.seq).collect();
            outcome.contiguous = harness::check_contiguous(std::slice::from_ref(&seqs)).is_ok()
                && seqs.first().is_none_or(|f| *f == 2);
            outcome.ledgers = recs.len();
            outcome.first_seq = seqs.first().copied();
            outcome.last_seq = seqs.last().copied();
            outcome.max_delivery_ms = recs.iter().map(|r| r.delivery_ms).fold(0.0, f64::max);
            outcome.exit_code = s.exit.and_then(|e| e.0);
            outcome.done_s = s.exit.map(|e| e.1);
            outcome.message = harness::last_line(&s.log);
            outcome.oldest_held = oldest_held(&outcome.message);
            Some(outcome)
        } else {
            None
        };
        let sessions = subs.len() as u64;
        let bound = MemoryBound::new(
            idle_kib,
            &settings,
            sessions,
            u64::from(a.lanes),
            wire_ledger,
        );
        let hwm_mib = mib(hwm);
        Ok(SlowRun {
            name: name.clone(),
            label: label.clone(),
            retention,
            normal,
            normal_p99_each_ms,
            normal_samples,
            slow: slow_out,
            lagged_total: scrape.get("lagged_total"),
            ring_reads_total: scrape.get("ring_reads_total"),
            ledgers_out_total: scrape.get("ledgers_out_total"),
            resent_chunks_total: scrape.get("resent_chunks_total"),
            rss: RssFigures {
                at_listen_mib: mib(at_listen),
                hwm_mib,
                ..RssFigures::default()
            },
            within_bound: hwm > 0 && hwm_mib <= bound.total_mib,
            bound,
            wall_s,
            rss_samples: Vec::new(),
        })
    })();
    let mut children: Vec<Child> = subs.into_iter().map(|s| s.child).collect();
    crate::proc::kill_all(&mut children);
    if let Some(r) = relay.take() {
        r.stop();
    }
    let samples = sampler.finish();
    let mut run = result?;
    run.rss.samples = samples.len();
    run.rss.max_mib = samples.iter().map(|s| mib(s.rss_kib)).fold(0.0, f64::max);
    run.rss.end_mib = samples.last().map_or(0.0, |s| mib(s.rss_kib));
    run.rss_samples = samples;
    Ok(run)
}

/// The oldest ledger held, from the subscriber's below-retention message
/// ("... oldest ledger held is N ...").
fn oldest_held(message: &str) -> Option<u32> {
    let rest = &message[message.find("oldest ledger held is ")? + 22..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The A-B pairs and C (see the module documentation).
fn plan(a: &SlowArgs) -> Vec<Planned> {
    let mut plan = Vec::new();
    for k in 1..=a.repeat {
        plan.push(Planned {
            name: format!("A{k}"),
            label: format!("{} normal", a.subscribers),
            slow: false,
            wait_slow: false,
            retention: a.retention,
        });
        plan.push(Planned {
            name: format!("B{k}"),
            label: format!(
                "{} normal + 1 slow{}",
                a.subscribers,
                if k == 1 { "" } else { " (not waited)" }
            ),
            slow: true,
            wait_slow: k == 1,
            retention: a.retention,
        });
    }
    if a.short_retention > 0 {
        plan.push(Planned {
            name: "C".into(),
            label: format!(
                "{} normal + 1 slow, ring {}",
                a.subscribers, a.short_retention
            ),
            slow: true,
            wait_slow: true,
            retention: a.short_retention,
        });
    }
    plan
}

/// Samples, p50 and p99 of the normal subscribers' ledgers whose sequence passes `keep`,
/// over every run whose name starts with `prefix`.
fn pooled(runs: &[SlowRun], prefix: char, keep: impl Fn(u32) -> bool) -> (usize, f64, f64) {
    let mut d: Vec<f64> = runs
        .iter()
        .filter(|r| r.name.starts_with(prefix))
        .flat_map(|r| r.normal_samples.iter())
        .filter(|(seq, _)| keep(*seq))
        .map(|(_, d)| *d)
        .collect();
    d.sort_by(f64::total_cmp);
    (d.len(), quantile(&d, 0.5), quantile(&d, 0.99))
}

/// Runs the A-B pairs and C (see the module documentation).
pub fn run(a: &SlowArgs) -> anyhow::Result<SlowReport> {
    a.check()?;
    let load_start = harness::load_average();
    let tmp = tempfile::Builder::new()
        .prefix("ledger-bench-slow")
        .tempdir()
        .context("creating a temporary directory")?;
    let certs = tmp.path().join("certs");
    harness::make_certs(&certs, usize::from(a.subscribers) + 1)?;
    let env = Env {
        relay_bin: crate::proc::sibling_binary("ledger-relay")?,
        sub_bin: crate::proc::sibling_binary("ledger-subscribe")?,
        certs,
        tmp: tmp.path().to_path_buf(),
    };
    let idle = idle_rss(&env)?;
    let mut runs = Vec::new();
    for p in plan(a) {
        eprintln!("ledger-bench slow-subscriber: run {}: {}", p.name, p.label);
        let r = run_one(&env, a, idle, &p).with_context(|| format!("run {}", p.name))?;
        runs.push(r);
    }
    if std::env::var_os("LEDGER_BENCH_KEEP").is_some() {
        let kept = tmp.keep();
        eprintln!("ledger-bench: logs kept in {}", kept.display());
    }
    let (pa, pb) = (pooled(&runs, 'A', |_| true), pooled(&runs, 'B', |_| true));
    // The ledgers after the last B run's slow subscriber was moved to ring reading, and those
    // before (while it still took the live stream like a normal one).
    let split_seq = runs
        .iter()
        .filter(|r| r.name.starts_with('B'))
        .filter_map(|r| r.slow.as_ref()?.lagged_at_seq)
        .max();
    let split = split_seq.map(|l| {
        [
            pooled(&runs, 'A', |s| s <= l),
            pooled(&runs, 'B', |s| s <= l),
            pooled(&runs, 'A', |s| s > l),
            pooled(&runs, 'B', |s| s > l),
        ]
    });
    let by_name = |n: String| runs.iter().find(|r| r.name == n);
    let pair_ratios = (1..=a.repeat)
        .filter_map(|k| {
            let (x, y) = (by_name(format!("A{k}"))?, by_name(format!("B{k}"))?);
            Some(y.normal.p99_ms / x.normal.p99_ms)
        })
        .collect();
    let a_p99: Vec<f64> = runs
        .iter()
        .filter(|r| r.name.starts_with('A'))
        .map(|r| r.normal.p99_ms)
        .collect();
    let a_spread = (a_p99.len() >= 2).then(|| {
        a_p99.iter().copied().fold(0.0, f64::max)
            / a_p99.iter().copied().fold(f64::INFINITY, f64::min)
    });
    let mean_hwm = |prefix: char| {
        let v: Vec<f64> = runs
            .iter()
            .filter(|r| r.name.starts_with(prefix))
            .map(|r| r.rss.hwm_mib)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let marginal_hwm_mib = match (mean_hwm('A'), mean_hwm('B')) {
        (Some(x), Some(y)) => Some(y - x),
        _ => None,
    };
    let per_session_mib = runs
        .iter()
        .find(|r| r.name.starts_with('B'))
        .map_or(0.0, |r| {
            r.bound.sessions_mib / (f64::from(a.subscribers) + 1.0)
        });
    Ok(SlowReport {
        p99_ratio: (pa.2 > 0.0).then(|| pb.2 / pa.2),
        split_seq,
        split,
        pooled_a: pa,
        pooled_b: pb,
        pair_ratios,
        a_spread,
        marginal_hwm_mib,
        per_session_mib,
        args: a.clone(),
        load_average: [load_start, harness::load_average()],
        idle_rss_kib: idle,
        runs,
    })
}

fn fmt_load(l: &Option<[f64; 3]>) -> String {
    l.map(|l| format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2]))
        .unwrap_or_else(|| "?".into())
}

/// The readable summary.
pub fn summary(r: &SlowReport) -> String {
    use std::fmt::Write as _;
    let a = &r.args;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "slow subscriber: {} normal subscribers, 1 slow (--consume-delay {} ms = {}x the cadence); {} ledgers of {:.0} KiB every {} ms, {} ratio {}, chunk {} B, {} lanes; load average {} -> {}",
        a.subscribers,
        a.delay_ms(),
        a.slow_factor,
        a.ledgers,
        a.ledger_bytes as f64 / 1024.0,
        a.cadence_ms,
        a.codec,
        a.ratio,
        a.chunk_bytes,
        a.lanes,
        fmt_load(&r.load_average[0]),
        fmt_load(&r.load_average[1]),
    );
    let _ = writeln!(
        out,
        "{:<3} {:<32} {:>6} {:>8} {:>8} {:>8} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8}",
        "run",
        "subscribers",
        "ring",
        "p50 ms",
        "p99 ms",
        "max ms",
        "lagged",
        "ringrd",
        "RSS max",
        "VmHWM",
        "bound",
        "wall s"
    );
    for run in &r.runs {
        let _ = writeln!(
            out,
            "{:<3} {:<32} {:>6} {:>8.2} {:>8.2} {:>8.2} {:>6} {:>6} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
            run.name,
            run.label,
            run.retention,
            run.normal.p50_ms,
            run.normal.p99_ms,
            run.normal.max_ms,
            run.lagged_total,
            run.ring_reads_total,
            run.rss.max_mib,
            run.rss.hwm_mib,
            run.bound.total_mib,
            run.wall_s
        );
    }
    for run in &r.runs {
        if let Some(s) = &run.slow {
            let _ = writeln!(
                out,
                "run {} slow subscriber: {}; lagged (moved to ring reading) at {}, seen catching up: {}, live again at {}; max lag {} ledgers, max delivery {:.0} ms{}",
                run.name,
                s.verdict(a.ledgers),
                s.lagged_s.map_or("-".into(), |t| format!("{t:.1} s")),
                s.seen_catching_up,
                s.live_again_s.map_or("-".into(), |t| format!("{t:.1} s")),
                s.max_lag_ledgers,
                s.max_delivery_ms,
                if s.exit_code == Some(0) {
                    String::new()
                } else {
                    format!(" | {}", s.message)
                }
            );
        }
    }
    for run in &r.runs {
        let _ = writeln!(
            out,
            "run {} memory: {} samples, {:.1} MiB at listen, max {:.1}, end {:.1}, VmHWM {:.1}; bound {} -> {}",
            run.name,
            run.rss.samples,
            run.rss.at_listen_mib,
            run.rss.max_mib,
            run.rss.end_mib,
            run.rss.hwm_mib,
            run.bound.line(),
            if run.within_bound { "within" } else { "OVER" }
        );
    }
    let _ = writeln!(
        out,
        "normal subscribers pooled: A {} samples p50 {:.2} p99 {:.2} ms; B {} samples p50 {:.2} p99 {:.2} ms; per pair B/A p99: {}; A runs' p99 spread (max/min): {}",
        r.pooled_a.0,
        r.pooled_a.1,
        r.pooled_a.2,
        r.pooled_b.0,
        r.pooled_b.1,
        r.pooled_b.2,
        r.pair_ratios
            .iter()
            .map(|x| format!("{x:.3}"))
            .collect::<Vec<_>>()
            .join(", "),
        r.a_spread.map_or("-".into(), |x| format!("{x:.3}")),
    );
    if let (Some(l), Some([ab, bb, aa, ba])) = (r.split_seq, r.split) {
        let _ = writeln!(
            out,
            "  ledgers <= {l} (slow one still live): A p50 {:.2} p99 {:.2} ({} samples), B p50 {:.2} p99 {:.2} ({}), B/A p99 {:.3}",
            ab.1,
            ab.2,
            ab.0,
            bb.1,
            bb.2,
            bb.0,
            bb.2 / ab.2
        );
        let _ = writeln!(
            out,
            "  ledgers > {l} (slow one reading the ring): A p50 {:.2} p99 {:.2} ({} samples), B p50 {:.2} p99 {:.2} ({}), B/A p99 {:.3}",
            aa.1,
            aa.2,
            aa.0,
            ba.1,
            ba.2,
            ba.0,
            ba.2 / aa.2
        );
    }
    if let Some(ratio) = r.p99_ratio {
        let _ = writeln!(
            out,
            "target: normal p99 with the slow subscriber within {:.0}% of without (pooled): B/A = {:.3} -> {}",
            a.p99_tolerance * 100.0,
            ratio,
            if ratio <= 1.0 + a.p99_tolerance {
                "met"
            } else {
                "MISSED"
            },
        );
    }
    let all_within = r.runs.iter().all(|x| x.within_bound);
    let _ = writeln!(
        out,
        "target: relay VmHWM within the bound in every run -> {}",
        if all_within { "met" } else { "MISSED" }
    );
    if let Some(m) = r.marginal_hwm_mib {
        let _ = writeln!(
            out,
            "the slow subscriber's cost: mean VmHWM of B runs less A runs = {m:+.1} MiB (the bound's per-session term: {:.1} MiB)",
            r.per_session_mib
        );
    }
    out
}

/// The whole command: runs, prints the summary, writes `--json`.
pub fn main(a: &SlowArgs) -> anyhow::Result<()> {
    let report = run(a)?;
    print!("{}", summary(&report));
    if let Some(p) = &a.json {
        crate::report::write(p, &serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_oldest_held() {
        assert_eq!(
            oldest_held("ledger-subscribe: start 3 is below retention: oldest ledger held is 25 (newest 40)"),
            Some(25)
        );
        assert_eq!(oldest_held("ledger-subscribe: other"), None);
    }

    #[test]
    fn the_bound_grows_with_sessions_and_counts_upfront_ledgers() {
        let s = RelaySettings {
            size: 1 << 20,
            ratio: 1.0,
            count: Some(10),
            start: 2,
            cadence_ms: 100.0,
            emit_ms: 1.0,
            codec: "none".into(),
            chunk: 256 << 10,
            retention: 5,
        };
        let one = MemoryBound::new(10 << 10, &s, 1, 4, f64::from(1 << 20));
        let two = MemoryBound::new(10 << 10, &s, 2, 4, f64::from(1 << 20));
        assert!(two.total_mib > one.total_mib);
        assert!((two.sessions_mib - 2.0 * one.sessions_mib).abs() < 1e-9);
        // 10 upfront ledgers + a pool of 4 fillers of 1 MiB.
        assert!((one.source_mib - 14.0).abs() < 1e-9, "{}", one.source_mib);
        assert_eq!(one.base_mib, 10.0);
        // 5 items per ledger: 512 / 5 rounded up, plus one partial, plus 4 recent.
        assert!((one.hub_mib - 108.0).abs() < 1e-9, "{}", one.hub_mib);
    }
}
