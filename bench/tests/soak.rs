//! Verdicts over minutes, not measurements: the real `ledger-relay run` and `ledger-subscribe`
//! processes on loopback, ignored by default (`cargo test -p ledger-relay-bench --test tests --
//! --ignored soak::`, which `.ci/run` runs), each bounded in time. Skipped, saying why, when the
//! binaries are not built next to the test binary.
//!
//! - A subscriber consuming at a tenth of the rate beside normal ones: it is moved to ring
//!   reading and takes every ledger in order, the normal ones lose nothing, and the relay's peak
//!   memory stays within a bound derived from its settings ([`bound`]); with a ring shorter than
//!   its lag it gets the below-retention exit (4).
//! - Subscribers with mixed starts, some stopped (SIGINT or SIGKILL) and restarted in a loop
//!   for `SOAK_LOAD_SECS` (90 s): every process ends cleanly, every subscriber's ledgers are
//!   contiguous across its restarts, each restart starts where it asked, and the relay's peak
//!   memory stays within the bound.

mod bound;

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use ledger_relay_bench::cluster::{make_certs, Cluster, RelayProc, RelaySettings, Scrape, SubSpec};
use ledger_relay_bench::procs::{
    kill_all, mib, sibling_binary, status_kib, stop, wait_with_cpu, RssSampler,
};
use ledger_relay_bench::stats::{read_lenient, summarize, Record};

/// The value of label `key` in `a="x",b="y"` (quotes unescaped).
pub(crate) fn label(labels: &str, key: &str) -> Option<String> {
    let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
    let (mut out, mut chars) = (String::new(), labels[start..].chars());
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(match chars.next()? {
                'n' => '\n',
                other => other,
            }),
            '"' => return Some(out),
            c => out.push(c),
        }
    }
    None
}

/// Least-squares slope of (x, y) points; `None` with fewer than 2 distinct x.
pub(crate) fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

fn binaries_missing() -> Option<String> {
    let missing = ["ledger-relay", "ledger-subscribe"]
        .iter()
        .find_map(|b| sibling_binary(b).err());
    missing.map(|e| format!("{e:#} (cargo build --workspace builds it)"))
}

/// An idle relay of this build (1 KiB ledgers, no subscriber) after 2 s: the bound's base, MiB.
fn idle_mib(c: &Cluster, dir: &Path) -> f64 {
    let s = RelaySettings {
        count: Some(20),
        emit_ms: 1.0,
        chunk: 4096,
        retention: 100,
        ..RelaySettings::endless(1024, 1.0, 100.0)
    };
    let relay = c
        .relay_in(None, &dir.join("idle"), &s, &s.synthetic_source(), &[])
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let kib = status_kib(relay.pid, "VmRSS").unwrap();
    relay.stop();
    mib(kib)
}

/// Whether sequences `seqs` run from `first` without a gap, duplicate or reordering.
fn contiguous(seqs: impl IntoIterator<Item = u32>, first: u32) -> bool {
    seqs.into_iter().zip(first..).all(|(a, b)| a == b)
}

/// One relay with `normal` subscribers and, with `slow_ms`, one more consuming a ledger every
/// that long; waits for every subscriber. The normal ones' records, the slow one's exit code and
/// records, the relay's last scrape, whether the slow session was seen catching up, `VmHWM`.
struct SlowRun {
    normal: Vec<Vec<Record>>,
    slow: Option<(Option<i32>, Vec<Record>)>,
    scrape: Scrape,
    seen_catching_up: bool,
    hwm_mib: f64,
}

fn slow_run(
    c: &Cluster,
    dir: &Path,
    s: &RelaySettings,
    normal: u16,
    slow_ms: Option<f64>,
) -> SlowRun {
    let mut relay = c
        .relay_in(None, dir, s, &s.synthetic_source(), &[])
        .unwrap();
    let n = s.count.unwrap();
    let mut specs: Vec<SubSpec> = (0..normal)
        .map(|i| SubSpec::new(&format!("sub-{i}"), 2, Some(n), 4, dir, &format!("sub-{i}")))
        .collect();
    if let Some(ms) = slow_ms {
        let mut spec = SubSpec::new(&format!("sub-{normal}"), 2, Some(n), 4, dir, "slow");
        spec.extra = vec!["--consume-delay".into(), format!("{ms}ms")];
        specs.push(spec);
    }
    let mut kids = Kids(Vec::new());
    kids.0 = specs
        .iter()
        .map(|spec| c.subscriber(None, &relay.addr.to_string(), spec).unwrap())
        .collect();
    let limit = Duration::from_secs_f64(
        f64::from(n) * (s.cadence_ms + slow_ms.unwrap_or(0.0)) / 1e3 + 60.0,
    );
    let (t0, mut codes, mut seen, mut scrape) = (
        Instant::now(),
        vec![None; kids.0.len()],
        false,
        Scrape::default(),
    );
    while codes.iter().any(Option::is_none) {
        relay.check_alive().unwrap();
        for (k, code) in kids
            .0
            .iter_mut()
            .zip(codes.iter_mut())
            .filter(|(_, c)| c.is_none())
        {
            if let Some((st, _)) = wait_with_cpu(k, Instant::now()).unwrap() {
                *code = Some(st.code());
            }
        }
        if let Ok(m) = relay.scrape() {
            let slow = format!("sub-{normal}");
            let catching_up = |l: &str| {
                label(l, "identity").as_deref() == Some(&slow)
                    && label(l, "catching_up").as_deref() == Some("true")
            };
            seen |= m.labelled("subscriber_lanes").any(|(l, _)| catching_up(l));
            scrape = m;
        }
        assert!(
            t0.elapsed() < limit,
            "the subscribers did not finish within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let hwm_mib = mib(status_kib(relay.pid, "VmHWM").unwrap());
    scrape = relay.scrape().unwrap_or(scrape);
    relay.stop();
    let records: Vec<Vec<Record>> = specs
        .iter()
        .map(|s| read_lenient(&s.stats).unwrap())
        .collect();
    for (i, r) in records.iter().enumerate().take(usize::from(normal)) {
        assert_eq!(codes[i], Some(Some(0)), "normal subscriber {i}");
        assert!(
            r.len() == n as usize && contiguous(r.iter().map(|r| r.seq), 2),
            "normal subscriber {i}: {} ledgers",
            r.len()
        );
    }
    let slow = slow_ms.map(|_| {
        (
            codes[usize::from(normal)].flatten(),
            records[usize::from(normal)].clone(),
        )
    });
    SlowRun {
        normal: records[..usize::from(normal)].to_vec(),
        slow,
        scrape,
        seen_catching_up: seen,
        hwm_mib,
    }
}

#[test]
#[ignore = "a soak run of about two minutes; .ci/run runs it"]
fn a_slow_subscriber_reads_the_ring_and_catches_up_within_the_memory_bound() {
    if let Some(why) = binaries_missing() {
        return eprintln!("skipped: {why}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster {
        certs: tmp.path().join("certs"),
        ..Cluster::default()
    };
    make_certs(&c.certs, 8).unwrap();
    let base = idle_mib(&c, tmp.path());
    // 256 KiB ledgers in 16 KiB chunks (the 512-item live channel holds 30 of them) every
    // 50 ms; the slow one takes 500 ms per ledger, a tenth of the rate.
    let s = RelaySettings {
        count: Some(100),
        codec: "none".into(),
        chunk: 16 << 10,
        emit_ms: 1.0,
        retention: 10_000,
        ..RelaySettings::endless(256 << 10, 1.0, 50.0)
    };
    let a = slow_run(&c, &tmp.path().join("a"), &s, 4, None);
    let b = slow_run(&c, &tmp.path().join("b"), &s, 4, Some(500.0));
    let (code, got) = b.slow.clone().unwrap();
    assert_eq!(
        code,
        Some(0),
        "the slow subscriber exits 0 once it has every ledger"
    );
    assert!(
        got.len() == 100 && contiguous(got.iter().map(|r| r.seq), 2),
        "the slow one wrote {} ledgers",
        got.len()
    );
    assert!(
        b.scrape.get("lagged_total") >= 1.0,
        "the slow one was not moved to ring reading"
    );
    assert!(b.seen_catching_up, "its session was never seen catching up");
    // Held back by its consumer: its last ledgers waited for the ones before them.
    assert!(got.iter().map(|r| r.delivery_ms).fold(0.0, f64::max) > 5_000.0);
    let sizing = bound::RelaySizing::from_scrape(&b.scrape).unwrap();
    for (name, run, sessions) in [("A", &a, 4), ("B", &b, 5)] {
        let wire = run
            .normal
            .iter()
            .flatten()
            .map(|r| r.wire_bytes as f64)
            .fold(0.0, f64::max);
        let limit = bound::bound_mib(base, &s, &sizing, sessions, 4, wire);
        eprintln!(
            "run {name}: normal p99 {:.2} ms, VmHWM {:.1} MiB, bound {limit:.1} MiB",
            summarize(&run.normal, 3, 1.0).p99_ms,
            run.hwm_mib
        );
        assert!(
            run.hwm_mib <= limit,
            "run {name}: VmHWM {:.1} MiB over the bound {limit:.1} MiB",
            run.hwm_mib
        );
    }
    // A ring of 10 ledgers: the slow one falls out of it and is told so.
    let short = RelaySettings { retention: 10, ..s };
    let c_run = slow_run(&c, &tmp.path().join("c"), &short, 2, Some(500.0));
    let (code, got) = c_run.slow.unwrap();
    assert_eq!(code, Some(4), "below retention");
    assert!(
        got.len() < 100 && contiguous(got.iter().map(|r| r.seq), 2),
        "{} ledgers",
        got.len()
    );
}

/// Subscriber processes, killed when dropped (a failed assertion leaves none running).
struct Kids(Vec<Child>);

impl Drop for Kids {
    fn drop(&mut self) {
        kill_all(&mut self.0);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        kill_all(
            self.child
                .as_mut()
                .map(std::slice::from_mut)
                .unwrap_or_default(),
        );
    }
}

/// A subscriber of the load: its processes' `--from` and stats files, and how each ended.
struct Slot {
    name: String,
    start: &'static str,
    reconnecting: bool,
    segments: Vec<(String, SubSpec)>,
    child: Option<Child>,
    stop_at: f64,
}

/// The `--from` of a slot's next process: the ledger after the last one it wrote, else its
/// kind of start in the ring as `/metrics` shows it.
fn next_from(slot: &Slot, m: &Scrape) -> String {
    let last = slot
        .segments
        .iter()
        .rev()
        .find_map(|(_, s)| read_lenient(&s.stats).ok()?.last().map(|r| r.seq));
    let (oldest, newest) = (m.get("ring_oldest") as u32, m.get("ring_newest") as u32);
    match (last, slot.start) {
        (Some(l), _) => (l + 1).to_string(),
        (None, _) if oldest == 0 => "tip".into(),
        // The ring prunes a ledger per cadence while the subscriber connects.
        (None, "oldest") => (oldest + 8).min(newest).to_string(),
        (None, "middle") => (oldest + (newest - oldest) / 2).to_string(),
        (None, _) => "tip".into(),
    }
}

#[test]
#[ignore = "a soak run of about two minutes; .ci/run runs it"]
fn reconnecting_subscribers_deliver_contiguously_within_the_memory_bound() {
    if let Some(why) = binaries_missing() {
        return eprintln!("skipped: {why}");
    }
    let secs: f64 = std::env::var("SOAK_LOAD_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(90.0);
    let (subscribers, reconnecting) = (16usize, 4usize);
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster {
        certs: tmp.path().join("certs"),
        ..Cluster::default()
    };
    make_certs(&c.certs, subscribers).unwrap();
    let base = idle_mib(&c, tmp.path());
    // 256 KiB ledgers every 250 ms, compressed, a ring of 80 (20 s).
    let s = RelaySettings {
        chunk: 64 << 10,
        retention: 80,
        ..RelaySettings::endless(256 << 10, 7.6, 250.0)
    };
    let mut relay = c
        .relay_in(
            None,
            &tmp.path().join("relay"),
            &s,
            &s.synthetic_source(),
            &[],
        )
        .unwrap();
    let rss = RssSampler::start(relay.pid, Duration::from_secs(1), 100_000);
    std::thread::sleep(Duration::from_secs(5));
    let kinds = ["tip", "oldest", "middle"];
    let mut slots: Vec<Slot> = (0..subscribers)
        .map(|i| Slot {
            name: format!("sub-{i}"),
            start: kinds[i % 3],
            reconnecting: i < reconnecting,
            segments: vec![],
            child: None,
            stop_at: f64::INFINITY,
        })
        .collect();
    let failures = load(&c, &mut relay, &mut slots, tmp.path(), secs);
    let hwm = mib(status_kib(relay.pid, "VmHWM").unwrap());
    let sizing = bound::RelaySizing::from_scrape(&relay.scrape().unwrap()).unwrap();
    relay.stop();
    let samples = rss.finish();
    assert!(failures.is_empty(), "{failures:#?}");
    let (mut restarts, mut wire) = (0, 0.0f64);
    for slot in &slots {
        let mut seqs = Vec::new();
        for (from, spec) in &slot.segments {
            let r = read_lenient(&spec.stats).unwrap();
            wire = r.iter().map(|r| r.wire_bytes as f64).fold(wire, f64::max);
            if let (Ok(from), Some(first)) = (from.parse::<u32>(), r.first()) {
                assert_eq!(
                    first.seq, from,
                    "{}: a restart did not start where it asked",
                    slot.name
                );
            }
            seqs.extend(r.iter().map(|r| r.seq));
        }
        assert!(
            !seqs.is_empty() && contiguous(seqs.iter().copied(), seqs[0]),
            "{}: not contiguous across its restarts",
            slot.name
        );
        restarts += slot.segments.len() - 1;
    }
    assert!(restarts >= reconnecting * 2, "only {restarts} restarts");
    let limit = bound::bound_mib(base, &s, &sizing, subscribers as u64, 2, wire);
    let points: Vec<(f64, f64)> = samples
        .iter()
        .filter(|x| x.t_s > 30.0)
        .map(|x| (x.t_s / 60.0, mib(x.rss_kib)))
        .collect();
    eprintln!("{restarts} restarts; relay VmHWM {hwm:.1} MiB, bound {limit:.1} MiB, VmRSS slope after 30 s {:?} MiB/min", slope(&points));
    assert!(
        hwm <= limit,
        "VmHWM {hwm:.1} MiB over the bound {limit:.1} MiB"
    );
}

/// Runs the load for `secs`: starts each slot, stops the reconnecting ones after a life of
/// 2 to 10 s (SIGINT, which must exit 0, and SIGKILL in turn) and restarts them where they
/// stopped, then stops every process with SIGINT. What went wrong, if anything.
fn load(
    c: &Cluster,
    relay: &mut RelayProc,
    slots: &mut [Slot],
    dir: &Path,
    secs: f64,
) -> Vec<String> {
    let (t0, mut failures, mut stops, mut rng) =
        (Instant::now(), Vec::new(), 0u64, 0x9e37_79b9_7f4a_7c15u64);
    let mut life = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        2.0 + 8.0 * (rng >> 11) as f64 / (1u64 << 53) as f64
    };
    while t0.elapsed().as_secs_f64() < secs {
        relay.check_alive().unwrap();
        let m = relay.scrape().unwrap_or_default();
        let now = t0.elapsed().as_secs_f64();
        for slot in slots.iter_mut() {
            match slot
                .child
                .as_mut()
                .map(|k| wait_with_cpu(k, Instant::now()).unwrap())
            {
                None => {
                    let from = next_from(slot, &m);
                    let spec = SubSpec::new(
                        &slot.name,
                        &from,
                        None,
                        2,
                        dir,
                        &format!("{}-{}", slot.name, slot.segments.len()),
                    );
                    slot.child = Some(c.subscriber(None, &relay.addr.to_string(), &spec).unwrap());
                    slot.segments.push((from, spec));
                    slot.stop_at = if slot.reconnecting {
                        now + life()
                    } else {
                        f64::INFINITY
                    };
                }
                Some(Some((st, _))) => {
                    failures.push(format!("{}: exited by itself ({st})", slot.name));
                    slot.child = None;
                }
                Some(None) if now >= slot.stop_at => {
                    let mut k = slot.child.take().unwrap();
                    stops += 1;
                    if stops % 2 == 0 {
                        kill_all(std::slice::from_mut(&mut k));
                    } else if !stop(&mut k, Duration::from_secs(5))
                        .is_some_and(|(st, _)| st.success())
                    {
                        failures.push(format!("{}: SIGINT did not end it with exit 0", slot.name));
                    }
                }
                Some(None) => {}
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    for slot in slots.iter_mut() {
        if let Some(mut k) = slot.child.take() {
            if !stop(&mut k, Duration::from_secs(10)).is_some_and(|(st, _)| st.success()) {
                failures.push(format!(
                    "{}: the final SIGINT did not end it with exit 0",
                    slot.name
                ));
            }
        }
    }
    failures
}
