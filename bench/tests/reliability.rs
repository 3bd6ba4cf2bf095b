//! The reliability modes in a tiny configuration against the real binaries: a slow subscriber
//! is moved to ring reading and catches up, or falls out of a short ring and gets the
//! below-retention exit; many subscribers, one reconnecting in a loop, deliver contiguously.
//! Skips with the reason when `ledger-relay` and `ledger-subscribe` are not built next to the
//! test binary (`cargo build --workspace`, or `--release` for `cargo test --release`).

use std::time::{Duration, Instant};

use clap::Parser;
use ledger_relay_bench::{Cli, Helper};

fn binaries_missing() -> Option<String> {
    for bin in ["ledger-relay", "ledger-subscribe"] {
        if let Err(e) = ledger_relay_bench::proc::sibling_binary(bin) {
            return Some(format!("{e:#} (cargo build --workspace builds it)"));
        }
    }
    None
}

fn parse(args: &[&str]) -> Helper {
    let argv = std::iter::once("ledger-bench").chain(args.iter().copied());
    Cli::try_parse_from(argv).unwrap().helper.unwrap()
}

#[test]
fn a_slow_subscriber_catches_up_from_the_ring_or_falls_out_of_retention() {
    if let Some(reason) = binaries_missing() {
        eprintln!("skipped: {reason}");
        return;
    }
    // 256 KiB ledgers in 4 KiB chunks (65 items each: the relay's 512-item live channel holds
    // 8 ledgers) every 20 ms; the slow one takes 200 ms per ledger, so it falls far behind
    // before the source's 40 ledgers are out. Run C keeps 5 ledgers in the ring.
    let Helper::SlowSubscriber(args) = parse(&[
        "slow-subscriber",
        "--subscribers",
        "2",
        "--ledgers",
        "40",
        "--warmup",
        "2",
        "--cadence-ms",
        "20",
        "--emit-ms",
        "1",
        "--slow-factor",
        "10",
        "--ledger-bytes",
        "262144",
        "--chunk-bytes",
        "4096",
        "--codec",
        "none",
        "--ratio",
        "1",
        "--lanes",
        "2",
        "--short-retention",
        "5",
        "--repeat",
        "1",
    ]) else {
        panic!("not the slow-subscriber mode")
    };
    let started = Instant::now();
    let report = ledger_relay_bench::slow::run(&args).unwrap();
    eprint!("{}", ledger_relay_bench::slow::summary(&report));
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "{:?}",
        started.elapsed()
    );
    let names: Vec<&str> = report.runs.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["A1", "B1", "C"]);
    for run in &report.runs {
        // Every normal subscriber got all 40 ledgers in order (run() fails otherwise).
        assert_eq!(run.normal.ledgers, 2 * (40 - 2), "run {}", run.name);
        assert!(
            run.rss.samples > 0 && run.rss.hwm_mib > 0.0,
            "run {}",
            run.name
        );
        assert!(run.rss.max_mib <= run.rss.hwm_mib + 1.0, "run {}", run.name);
        assert!(run.normal_p99_each_ms.iter().all(|p| p.is_finite()));
    }
    let b = &report.runs[1];
    let slow = b.slow.as_ref().unwrap();
    assert!(slow.waited);
    assert_eq!(slow.exit_code, Some(0), "{slow:?}");
    assert_eq!(
        (
            slow.written.ledgers,
            slow.written.first_seq,
            slow.written.last_seq
        ),
        (40, Some(2), Some(41))
    );
    assert!(slow.contiguous);
    assert!(
        b.lagged_total >= 1.0,
        "the slow one was not moved to ring reading"
    );
    assert!(slow.seen_catching_up || slow.lagged_s.is_some(), "{slow:?}");
    // It was held back by its consumer: the last ledger waited for the ones before it.
    assert!(slow.max_delivery_ms > 1000.0, "{slow:?}");
    assert!(report.p99_ratio.is_some_and(f64::is_finite));
    // The source's newest when the slow one lagged: within the run's ledgers.
    assert!(
        report.split_seq.is_some_and(|l| (2..=41).contains(&l)),
        "{:?}",
        report.split_seq
    );
    let c = &report.runs[2];
    let slow = c.slow.as_ref().unwrap();
    assert_eq!(slow.exit_code, Some(4), "{slow:?}");
    assert!(slow.contiguous, "what it got before is still in order");
    assert!(slow.written.ledgers < 40, "{slow:?}");
}

#[test]
fn subscribers_reconnecting_in_a_loop_deliver_contiguously() {
    if let Some(reason) = binaries_missing() {
        eprintln!("skipped: {reason}");
        return;
    }
    let Helper::Load(args) = parse(&[
        "load",
        "--subscribers",
        "3",
        "--reconnecting",
        "1",
        "--duration",
        "8s",
        "--preroll",
        "2s",
        "--stagger",
        "1s",
        "--slope-warmup",
        "3s",
        "--min-life",
        "1s",
        "--max-life",
        "2s",
        "--ledger-bytes",
        "16384",
        "--chunk-bytes",
        "4096",
        "--cadence-ms",
        "100",
        "--codec",
        "none",
        "--ratio",
        "1",
        "--retention",
        "40",
        "--rss-interval-ms",
        "200",
    ]) else {
        panic!("not the load mode")
    };
    let started = Instant::now();
    let report = ledger_relay_bench::load::run(&args).unwrap();
    eprint!("{}", ledger_relay_bench::load::summary(&report));
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.slots.len(), 3);
    for slot in &report.slots {
        assert!(slot.contiguous && slot.ledgers > 0, "{slot:?}");
        assert!(slot.segments.iter().all(|s| s.end.is_some()), "{slot:?}");
    }
    // sub-0 reconnects every 1-2 s for 8 s: at least 3 processes, each resuming where the
    // one before stopped (checked by run()), the others one process each.
    let reconnecting = &report.slots[0];
    assert!(reconnecting.reconnecting);
    assert!(reconnecting.segments.len() >= 3, "{reconnecting:?}");
    assert_eq!(
        report.connects,
        report.slots.iter().map(|s| s.segments.len()).sum::<usize>()
    );
    assert_eq!(report.reconnects, report.connects - 3);
    assert!(
        report.ledgers_delivered >= 3 * 20,
        "{}",
        report.ledgers_delivered
    );
    assert!(
        report.rss_samples.len() >= 20,
        "{}",
        report.rss_samples.len()
    );
    assert!(report.rss_samples.iter().all(|s| s.rss_kib > 0));
    assert!(report.rss_hwm_mib >= report.rss_max_mib - 1.0);
    assert!(report.rss_slope_mib_per_min.is_some_and(f64::is_finite));
    assert!(report.relay_counters["sessions_total"] >= report.connects as f64);
}
