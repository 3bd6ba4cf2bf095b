//! A tiny row of each subcommand that had none (`cpu`, `ring-disk`, `lake` and the scenario
//! table on loopback), run as a user runs them: the `ledger-bench` binary, its stdout read
//! back, each column header and each row asserted. Sizes are the smallest that still exercise
//! every path (a few ledgers of a MiB or less), so the whole file takes seconds, not minutes.
//! `lanes` runs as root only (emulated network; skips with the reason otherwise); the emulated
//! scenario rows are exercised (as root) by `emulation.rs`. Skips with the reason
//! when `ledger-relay` and `ledger-subscribe` are not built next to the binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// `ledger-bench`, or `None` (with the reason printed) when the binaries it starts are not
/// built next to it.
fn bench() -> Option<PathBuf> {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_ledger-bench"));
    let dir = exe.parent().unwrap_or(Path::new("."));
    for bin in ["ledger-relay", "ledger-subscribe"] {
        if !dir.join(bin).is_file() {
            eprintln!(
                "skipped: {bin} not next to {} (cargo build --workspace builds it)",
                exe.display()
            );
            return None;
        }
    }
    Some(exe)
}

/// Runs `ledger-bench ARGS` (split on whitespace; within `limit_s` seconds), asserts it
/// succeeded and returns its stdout.
fn run(exe: &Path, args: &str, limit_s: u64) -> String {
    let args: Vec<&str> = args.split_whitespace().collect();
    let started = Instant::now();
    let out = Command::new(exe).args(&args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ledger-bench {args:?}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let took = started.elapsed();
    assert!(took < Duration::from_secs(limit_s), "took {took:?}");
    stdout
}

/// The line of `text` whose first field is `first`, split on whitespace.
fn row<'a>(text: &'a str, first: &str) -> Vec<&'a str> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.first() == Some(&first))
        .unwrap_or_else(|| panic!("no {first} row in:\n{text}"))
}

/// Asserts `text` has a line holding every one of `columns`, in that order.
fn has_header(text: &str, columns: &[&str]) {
    let found = text.lines().any(|l| {
        let mut rest = l;
        columns.iter().all(|c| match rest.find(c) {
            Some(i) => {
                rest = &rest[i + c.len()..];
                true
            }
            None => false,
        })
    });
    assert!(found, "no header {columns:?} in:\n{text}");
}

#[test]
fn cpu_prints_a_row_per_transport_with_its_cpu() {
    let Some(exe) = bench() else { return };
    let out = run(
        &exe,
        "cpu --ledgers 3 --warmup 1 --size 1MiB --cadence 50ms --lanes 2",
        120,
    );
    has_header(
        &out,
        &[
            "row",
            "ledgers",
            "MiB",
            "CPU ms/ledger",
            "MB/CPU-s",
            "split",
        ],
    );
    for name in ["quinn", "tls-tcp", "relay"] {
        let f = row(&out, name);
        assert_eq!(f[1], "3", "{name}: {f:?}");
        assert_eq!(f[2], "1.0", "{name}: {f:?}");
        let cpu: f64 = f[3].parse().unwrap();
        assert!(cpu.is_finite() && cpu >= 0.0, "{name}: {f:?}");
    }
    // The relay row carries the demo's split of its CPU.
    assert!(row(&out, "relay").len() > 5, "{out}");
}

#[test]
fn ring_disk_prints_the_burst_run() {
    let Some(exe) = bench() else { return };
    let out = run(
        &exe,
        "ring-disk --only burst --burst-ledgers 8 --retention 4 --ledger-bytes 262144 \
         --chunk-bytes 65536 --idle-s 1 --sample-ms 100",
        120,
    );
    has_header(
        &out,
        &[
            "run", "ledgers", "cadence", "write_s", "mean", "steady", "peak", "after", "live_MB",
            "disk_MB", "wrote/st", "cpu_ms",
        ],
    );
    let f = row(&out, "burst");
    assert_eq!(f[1], "8", "{f:?}");
    assert!(!out.lines().any(|l| l.starts_with("paced")), "{out}");
}

#[test]
fn lake_prints_delivery_with_and_without_export() {
    let Some(exe) = bench() else { return };
    let out = run(
        &exe,
        "lake --delivery-only --ledgers 5 --warmup 1 --rounds 1 --cadence 100ms --ledger-bytes \
         262144",
        150,
    );
    has_header(
        &out,
        &[
            "round", "export", "ledgers", "p50 ms", "p90 ms", "p99 ms", "max ms", "p50/off",
            "p99/off", "exported",
        ],
    );
    // One round (numbered from 0): without export, to a directory and to the loopback S3.
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.first() == Some(&"0"))
        .collect();
    let exports: Vec<&str> = rows.iter().map(|f| f[1]).collect();
    assert_eq!(exports, ["off", "file", "s3"], "{out}");
    for f in &rows {
        assert_eq!(f[2], "4", "measured ledgers: {f:?}");
        let p99: f64 = f[5].parse().unwrap();
        assert!(p99 > 0.0, "{f:?}");
    }
    assert_eq!(&rows[0][7..], ["1.00", "1.00", "-"], "{out}");
}

#[test]
fn lake_prints_backfill_reads_and_sessions() {
    let Some(exe) = bench() else { return };
    let out = run(
        &exe,
        "lake --backfill-only --backfill-ledgers 4 --depths 1 --size 256KiB",
        150,
    );
    has_header(
        &out,
        &[
            "set",
            "what",
            "ledgers/s",
            "raw MB/s",
            "object MB/s",
            "peak held MiB",
            "bound MiB",
        ],
    );
    has_header(
        &out,
        &[
            "set",
            "what",
            "ledgers/s",
            "raw MB/s",
            "wire MB/s",
            "from lake",
            "RSS before",
        ],
    );
    let line = |what: &str| {
        out.lines()
            .find(|l| l.starts_with("synthetic") && l.contains(what))
            .unwrap_or_else(|| panic!("no synthetic {what} row in:\n{out}"))
    };
    for what in [
        "ring catch-up (Ring::get, verified)",
        "backfill from S3, prefetch 1, chunked",
        "lake read from S3, prefetch 8, raw",
    ] {
        let rate: f64 = line(what)
            .split(what)
            .nth(1)
            .and_then(|r| r.split_whitespace().find(|f| f.parse::<f64>().is_ok()))
            .and_then(|f| f.parse().ok())
            .unwrap_or_else(|| panic!("no rate in {what}"));
        assert!(rate > 0.0, "{what}");
    }
    // Through a relay and a subscriber: every one of the 4 ledgers came from the lake.
    let f: Vec<&str> = line("lake, prefetch 1").split_whitespace().collect();
    let from_lake = f.iter().position(|&x| x == "1").map(|i| f[i + 4]);
    assert_eq!(from_lake, Some("4"), "{f:?}");
}

#[test]
fn lanes_prints_live_and_catch_up_rows_with_each_lane() {
    if let Some(reason) = ledger_relay_bench::netem::unavailable_reason() {
        eprintln!("skipped: {reason}");
        return;
    }
    let Some(exe) = bench() else { return };
    let out = run(
        &exe,
        "lanes --lanes 1,2 --ledgers 4 --size 512KiB --chunk 64KiB --flow-mbit 100 --half-cap \
         false",
        120,
    );
    has_header(
        &out,
        &[
            "row", "run", "MiB", "xfer s", "MiB/s", "x1", "%caps", "imbal%", "cpu s", "per lane",
        ],
    );
    for (name, lanes) in [
        ("live-l1", 1),
        ("live-l2", 2),
        ("catch-up-l1", 1),
        ("catch-up-l2", 2),
    ] {
        let f = row(&out, name);
        assert_eq!(&f[1..3], ["1", "2.0"], "{f:?}");
        // One MB/busy/lost triple per lane, from the relay's /metrics in its namespace.
        let per_lane: Vec<&&str> = f[9..]
            .iter()
            .filter(|x| x.matches('/').count() == 2)
            .collect();
        assert_eq!(per_lane.len(), lanes, "{f:?}");
    }
    assert!(out.contains("targets (issue 12 item 2)"), "{out}");
}

#[test]
fn the_scenario_table_prints_a_loopback_row() {
    let Some(exe) = bench() else { return };
    let out = run(
        &exe,
        "--quick --network loopback --ledgers 6 --warmup 1 --cadence 100ms --ledger-bytes \
         1048576 --no-progress",
        120,
    );
    has_header(
        &out,
        &[
            "scenario", "net", "ln", "codec", "subs", "p50 ms", "p90 ms", "p99 ms", "max ms",
            "ia ms", "gput", "tput", "xfer", "ratio", "rly cpu", "sub cpu", "bound", "p99/b",
        ],
    );
    let f = row(&out, "lo-x7.6-zstd-l4");
    assert!(!f.contains(&"ERROR:"), "{f:?}");
    assert_eq!(&f[2..5], ["4", "zstd", "1"], "{f:?}");
    let p50: f64 = f[5].parse().unwrap();
    assert!(p50 > 0.0, "{f:?}");
}
