//! The fan-out series end to end in a tiny configuration against the real binaries: one and
//! three subscribers of small compressed ledgers (two sessions per subscriber process, so the
//! three are one process of two sessions and one of one), every row real (relay CPU measured, every
//! ledger delivered to every subscriber, first no later than last). Skips with the reason when
//! `ledger-relay` and `ledger-subscribe` are not built next to the test binary.

use std::time::{Duration, Instant};

use clap::Parser;
use ledger_relay_bench::fanout::{self, Payload};
use ledger_relay_bench::{Cli, Helper};

/// Whether both binaries are built next to the test binary (else the reason is printed).
fn built() -> bool {
    for bin in ["ledger-relay", "ledger-subscribe"] {
        if let Err(e) = ledger_relay_bench::proc::sibling_binary(bin) {
            eprintln!("skipped: {e:#} (cargo build --workspace builds it)");
            return false;
        }
    }
    true
}

/// The tiny series: small compressed ledgers, two sessions per subscriber process, then `more`.
fn tiny(more: &[&str]) -> fanout::FanoutArgs {
    let mut argv = vec![
        "ledger-bench",
        "fanout",
        "--sessions-per-process",
        "2",
        "--payload",
        "compressed",
        "--ledgers",
        "5",
        "--warmup",
        "1",
        "--baseline-ledgers",
        "3",
        "--cadence-ms",
        "150",
        "--cadence-per-sub-ms",
        "0",
        "--ledger-bytes",
        "1048576",
        "--chunk-bytes",
        "65536",
        "--ratio",
        "2",
        "--lanes",
        "2",
        "--idle-s",
        "0.5",
        // The shared transport group reaches the relay (config file) and every subscriber.
        "--max-mtu",
        "1452",
    ];
    argv.extend_from_slice(more);
    let Some(Helper::Fanout(args)) = Cli::try_parse_from(argv).unwrap().helper else {
        panic!("not the fanout subcommand")
    };
    args
}

#[test]
fn fanout_rows_measure_real_cpu_memory_and_delivery() {
    if !built() {
        return;
    }
    let args = tiny(&["--subscribers", "1,3"]);
    let started = Instant::now();
    let report = fanout::run(&args).unwrap();
    eprint!("{}", fanout::table(&report.rows));
    assert!(started.elapsed() < Duration::from_secs(150));
    assert_eq!(report.rows.len(), 2);
    for (row, n) in report.rows.iter().zip([1u16, 3]) {
        assert_eq!(row.error, None, "{n} subscribers");
        assert_eq!((row.payload, row.subscribers), (Payload::Compressed, n));
        // Every measured ledger reached every subscriber (run() also checks each stats file
        // holds exactly its ledgers, in order).
        assert_eq!(row.delivered, usize::from(n) * 5);
        assert_eq!(row.spread.per_ledger.len(), 5);
        assert!(row
            .spread
            .per_ledger
            .iter()
            .all(|(_, first, last)| first <= last && *first > 0.0));
        // CPU is counted in 10 ms ticks: the short no-subscriber phase may read 0.
        assert!(row.relay_cpu_ms > 0.0 && row.zero_cpu_ms >= 0.0, "{row:?}");
        assert!((row.cpu_per_sub_ms - row.relay_cpu_ms / f64::from(n)).abs() < 1e-9);
        assert!(row.wire_mb > 0.0 && row.wire_mb < 1.048576, "{row:?}");
        assert!(row.baseline_rss_mib > 1.0);
        assert!(row.idle_rss_per_session_mib.is_some());
        assert!(row.idle_cpu_ms_per_session_s.is_some_and(|c| c >= 0.0));
        assert!(row.marginal_ms.is_some());
        assert!(row.spread_ratio.is_some_and(|r| r > 0.0));
        assert!(row.spread.last_share > 0.0 && row.spread.last_share <= 1.0);
    }
    assert_eq!(report.rows[0].spread_ratio, Some(1.0));
    let csv = fanout::csv(&report.rows);
    assert_eq!(csv.lines().count(), 3, "{csv}");
    assert!(fanout::targets(&report.rows).contains("compressed relay CPU per extra subscriber"));
}

/// `--receive-only` reaches every subscriber process: one session alone (which then takes no
/// `--out`) and one process of two sessions; every measured ledger still reaches each, in order
/// (run() checks each stats file holds exactly its ledgers).
#[test]
fn fanout_passes_receive_only_to_every_subscriber() {
    if !built() {
        return;
    }
    let args = tiny(&["--subscribers", "1,2", "--receive-only"]);
    assert!(args.receive_only);
    let report = fanout::run(&args).unwrap();
    eprint!("{}", fanout::table(&report.rows));
    assert_eq!(report.rows.len(), 2);
    for (row, n) in report.rows.iter().zip([1u16, 2]) {
        assert_eq!(row.error, None, "{n} subscribers");
        assert_eq!((row.subscribers, row.delivered), (n, usize::from(n) * 5));
        assert!(row.relay_cpu_ms > 0.0, "{row:?}");
        assert!(row.wire_mb > 0.0 && row.wire_mb < 1.048576, "{row:?}");
    }
}
