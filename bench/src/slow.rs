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

use crate::cluster::{RelaySettings, SubSpec};
use crate::harness::{self, mib, status_kib, RssSample, Watched, Written};
use crate::stats::{quantile, summarize, Summary};

mod bound;
mod verdict;

pub use bound::*;
pub use verdict::*;

/// `ledger-bench slow-subscriber` settings.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
#[command(mut_arg("cadence_ms", |a| a.default_value("250ms")))]
#[command(mut_arg("ledger_bytes", |a| a.default_value("608174").help("Raw size of each ledger (default: the main bench's 14.5 MiB scaled by 25, 594 KiB; a bare number is bytes, as the old `--ledger-bytes` took)")))]
#[command(mut_arg("chunk_bytes", |a| a.default_value("10485").help("Relay chunk size in bytes (default: the main bench's 256 KiB scaled by 25)")))]
#[command(mut_arg("ledgers", |a| a.default_value("100").help("Ledgers the source emits; every subscriber, the slow one included, takes them all")))]
#[command(mut_arg("retention", |a| a.default_value("10000").help("Ledgers the relay's ring keeps in runs A and B")))]
#[command(mut_arg("subscribers", |a| a.help("Normal subscribers").value_parser(clap::value_parser!(u16).range(1..=254))))]
#[command(mut_arg("repeat", |a| a.default_value("3").help("Pairs of runs A and B, alternated").value_parser(clap::value_parser!(u32).range(1..=20))))]
#[command(mut_arg("rss_interval_ms", |a| a.default_value("100").value_parser(clap::value_parser!(u64).range(10..=10_000))))]
pub struct SlowArgs {
    /// `--subscribers` (the normal ones), `--size`, `--chunk-bytes`, `--ratio`, `--codec`,
    /// `--cadence`, `--emit-ms`, `--lanes`, `--retention` (of runs A and B),
    /// `--rss-interval-ms`, `--json` [defaults: size 608174, chunk 10485, cadence 250ms,
    /// retention 10000, RSS every 100 ms].
    #[command(flatten)]
    #[serde(flatten)]
    pub run: crate::cluster::LoopbackRun,
    /// `--ledgers` and `--warmup` [ledgers default: 100, all the source emits].
    #[command(flatten)]
    #[serde(flatten)]
    pub series: crate::cluster::Series,
    /// The slow subscriber waits this many cadences after each ledger (10: a tenth of the
    /// rate).
    #[arg(long, default_value_t = 10.0)]
    pub slow_factor: f64,
    /// Ledgers the ring keeps in run C, where the slow subscriber falls out of retention;
    /// 0 skips run C.
    #[arg(long, default_value_t = 10)]
    pub short_retention: u32,
    /// `--repeat` [default: 3].
    #[command(flatten)]
    #[serde(flatten)]
    pub repeat: crate::cluster::Repeat,
    /// Target: the normal subscribers' p99 in B within this fraction of A's.
    #[arg(long, default_value_t = 0.10)]
    pub p99_tolerance: f64,
}

impl SlowArgs {
    fn check(&self) -> anyhow::Result<()> {
        self.series.check()?;
        self.run.check()?;
        if !(self.slow_factor > 0.0 && self.slow_factor <= 1000.0) {
            bail!("--slow-factor must be in (0, 1000]");
        }
        Ok(())
    }

    /// The slow subscriber's `--consume-delay`, ms.
    pub fn delay_ms(&self) -> f64 {
        self.run.cadence.cadence_ms * self.slow_factor
    }

    fn relay(&self, retention: u32) -> RelaySettings {
        RelaySettings {
            count: Some(self.series.count.ledgers),
            ..self.run.relay(retention)
        }
    }
}

struct Env {
    cluster: crate::cluster::Cluster,
    tmp: PathBuf,
}

/// Measures an idle relay: 1 KiB ledgers, one per 100 ms, no subscriber, after 2 s.
fn idle_rss(env: &Env) -> anyhow::Result<u64> {
    let s = RelaySettings {
        count: Some(20),
        emit_ms: 1.0,
        chunk: 4096,
        retention: 100,
        ..RelaySettings::endless(1024, 1.0, 100.0)
    };
    let relay = env.cluster.relay(&env.tmp.join("idle"), &s, &[])?;
    std::thread::sleep(Duration::from_secs(2));
    let rss = status_kib(relay.pid, "VmRSS");
    relay.stop();
    rss.context("reading the idle relay's VmRSS")
}

/// A started subscriber and what became of it.
struct Sub {
    child: Child,
    spec: SubSpec,
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
    let (name, slow, wait_slow, retention) = (&p.name, p.slow, p.wait_slow, p.retention);
    let dir = env.tmp.join(format!("run-{name}"));
    let settings = a.relay(retention);
    let relay = env.cluster.relay(&dir, &settings, &[])?;
    let t0 = Instant::now();
    let at_listen = status_kib(relay.pid, "VmRSS").unwrap_or(0);
    // The normal subscribers, and the ledgers every subscriber takes.
    let (n_normal, ledgers) = (
        usize::from(a.run.subscribers.subscribers),
        a.series.count.ledgers,
    );
    let normal_s = f64::from(ledgers) * a.run.cadence.cadence_ms / 1e3 + 60.0;
    let slow_s = normal_s + f64::from(ledgers) * a.delay_ms() / 1e3 + 60.0;
    let limit_s = if slow && wait_slow { slow_s } else { normal_s };
    let mut watched = Watched::new(relay, a.run.rss.rss_interval_ms, limit_s, t0);
    let mut subs: Vec<Sub> = Vec::new();
    let result = (|| -> anyhow::Result<SlowRun> {
        let relay_ref = &mut watched.relay;
        let total = n_normal + usize::from(slow);
        for i in 0..total {
            let is_slow = i == n_normal;
            let spec = SubSpec {
                consume_delay_ms: is_slow.then(|| a.delay_ms()),
                ..SubSpec::new(
                    format!("sub-{i}"),
                    2,
                    Some(ledgers),
                    a.run.lanes.lanes,
                    &dir,
                    &format!("sub-{i}"),
                )
            };
            let child = env.cluster.subscriber(relay_ref.addr, &spec)?;
            subs.push(Sub {
                child,
                spec,
                exit: None,
            });
        }
        let slow_name = format!("sub-{n_normal}");
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
                    let is_slow = i == n_normal;
                    if !is_slow && !st.success() {
                        bail!(
                            "normal subscriber {i} failed ({st}): {}",
                            harness::last_line(&s.spec.log)
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
            let normals_done = subs.iter().take(n_normal).all(|s| s.exit.is_some());
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
        for s in subs.iter_mut().filter(|s| s.exit.is_none()) {
            crate::proc::kill_all(std::slice::from_mut(&mut s.child));
        }
        let (hwm, last) = watched.peak();
        scrape = last.unwrap_or(scrape);
        let normal_stats: Vec<PathBuf> = subs
            .iter()
            .take(n_normal)
            .map(|s| s.spec.stats.clone())
            .collect();
        let normals =
            harness::read_exact(&normal_stats, 2..=ledgers + 1).context("a normal subscriber")?;
        let warm = a.series.warmup as usize;
        let normal = summarize(&normals, warm, a.run.emit.emit_ms);
        let normal_samples: Vec<(u32, f64)> = normals
            .iter()
            .flat_map(|v| v.iter().skip(warm).map(|r| (r.seq, r.delivery_ms)))
            .collect();
        let normal_p99_each_ms = (normals.iter())
            .map(|v| summarize(std::slice::from_ref(v), warm, a.run.emit.emit_ms).p99_ms)
            .collect();
        let wire_ledger = normals
            .iter()
            .flatten()
            .map(|r| r.wire_bytes as f64)
            .fold(0.0, f64::max);
        let slow_out = if slow {
            let s = &subs[n_normal];
            let recs = harness::read_stats_lenient(&s.spec.stats)?;
            let seqs: Vec<u32> = recs.iter().map(|r| r.seq).collect();
            outcome.contiguous = harness::check_contiguous(std::slice::from_ref(&seqs)).is_ok()
                && seqs.first().is_none_or(|f| *f == 2);
            outcome.written = Written::of(&recs);
            outcome.max_delivery_ms = recs.iter().map(|r| r.delivery_ms).fold(0.0, f64::max);
            outcome.exit_code = s.exit.and_then(|e| e.0);
            outcome.done_s = s.exit.map(|e| e.1);
            outcome.message = harness::last_line(&s.spec.log);
            outcome.oldest_held = oldest_held(&outcome.message);
            Some(outcome)
        } else {
            None
        };
        let sessions = subs.len() as u64;
        let sizing = RelaySizing::from_scrape(&scrape)?;
        let bound = MemoryBound::new(
            idle_kib,
            &settings,
            &sizing,
            sessions,
            u64::from(a.run.lanes.lanes),
            wire_ledger,
        );
        let hwm_mib = mib(hwm);
        Ok(SlowRun {
            name: name.clone(),
            label: p.label.clone(),
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
    let samples = watched.finish(subs.into_iter().map(|s| s.child).collect());
    let mut run = result?;
    let [_, max, end] = harness::rss_span(&samples);
    (run.rss.samples, run.rss.max_mib, run.rss.end_mib) = (samples.len(), max, end);
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
    for k in 1..=a.repeat.repeat {
        plan.push(Planned {
            name: format!("A{k}"),
            label: format!("{} normal", a.run.subscribers.subscribers),
            slow: false,
            wait_slow: false,
            retention: a.run.retention.retention,
        });
        plan.push(Planned {
            name: format!("B{k}"),
            label: format!(
                "{} normal + 1 slow{}",
                a.run.subscribers.subscribers,
                if k == 1 { "" } else { " (not waited)" }
            ),
            slow: true,
            wait_slow: k == 1,
            retention: a.run.retention.retention,
        });
    }
    if a.short_retention > 0 {
        plan.push(Planned {
            name: "C".into(),
            label: format!(
                "{} normal + 1 slow, ring {}",
                a.run.subscribers.subscribers, a.short_retention
            ),
            slow: true,
            wait_slow: true,
            retention: a.short_retention,
        });
    }
    plan
}

/// Runs the A-B pairs and C (see the module documentation).
pub fn run(a: &SlowArgs) -> anyhow::Result<SlowReport> {
    a.check()?;
    let load_start = harness::load_average();
    let mut tmp = crate::cluster::work_dir("ledger-bench-slow")?;
    let certs = tmp.path().join("certs");
    harness::make_certs(&certs, usize::from(a.run.subscribers.subscribers) + 1)?;
    let env = Env {
        cluster: crate::cluster::Cluster::local(&certs, Default::default())?,
        tmp: tmp.path().to_path_buf(),
    };
    let idle = idle_rss(&env)?;
    let mut runs = Vec::new();
    for p in plan(a) {
        eprintln!("ledger-bench slow-subscriber: run {}: {}", p.name, p.label);
        let r = run_one(&env, a, idle, &p).with_context(|| format!("run {}", p.name))?;
        runs.push(r);
    }
    crate::cluster::keep_if_asked(&mut tmp);
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
    let pair_ratios = (1..=a.repeat.repeat)
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
            r.bound.sessions_mib / (f64::from(a.run.subscribers.subscribers) + 1.0)
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

/// The whole command: runs, prints the summary, writes `--json`.
pub fn main(a: &SlowArgs) -> anyhow::Result<()> {
    crate::cluster::emit_json(&run(a)?, &a.run.json)
}

impl crate::cluster::Table for SlowReport {
    fn table(&self) -> String {
        summary(self)
    }
}

#[cfg(test)]
mod tests;
