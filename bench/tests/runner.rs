//! The runner end to end against the real binaries, as a user runs it (`ledger-bench run`,
//! its stdout, CSV and JSON read back): a tiny preset with every kind of row on loopback; and
//! as root, the emulated network's per-flow cap. Skips with the reason when `ledger-relay` and
//! `ledger-subscribe` are not built next to the binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use ledger_relay_bench::{Cli, Command as Sub};

/// `ledger-bench`, or `None` (the reason printed) when the binaries it starts are not there.
fn bench() -> Option<PathBuf> {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_ledger-bench"));
    let missing = ["ledger-relay", "ledger-subscribe"]
        .into_iter()
        .find(|b| !exe.with_file_name(b).is_file());
    if let Some(bin) = missing {
        eprintln!(
            "skipped: {bin} not next to {} (cargo build --workspace builds it)",
            exe.display()
        );
        return None;
    }
    Some(exe)
}

#[test]
fn a_tiny_preset_runs_every_kind_of_row() {
    let Some(exe) = bench() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (csv, json) = (tmp.path().join("r.csv"), tmp.path().join("r.json"));
    let preset = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tiny.toml");
    let out = Command::new(exe)
        .args(["run", "--preset"])
        .arg(preset)
        .arg("--csv")
        .arg(&csv)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("scenario") && stdout.contains("p99 ms") && stdout.contains("first99"),
        "{stdout}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let row = |name: &str| {
        rows.iter()
            .find(|r| r["scenario"]["name"] == name)
            .unwrap_or_else(|| panic!("no {name}"))
    };
    for r in rows {
        assert!(
            r["error"].is_null(),
            "{}: {}",
            r["scenario"]["name"],
            r["error"]
        );
        let d = &r["delivery"];
        let subs = r["scenario"]["subscribers"].as_u64().unwrap();
        // 4 ledgers after 1 of warm-up, for every subscription.
        assert_eq!(d["ledgers"], 4 * subs, "{}", r["scenario"]["name"]);
        assert!(
            d["p50_ms"].as_f64().unwrap() > 0.0 && d["transfer_mib_s"].as_f64().unwrap() > 0.0,
            "{d}"
        );
    }
    // Three subscriptions in two processes: the spread between them, CPU with and without
    // them, and memory per session, delivering and idle.
    let direct = row("direct");
    assert!(
        direct["spread"]["last_p99_ms"].as_f64().unwrap()
            >= direct["spread"]["first_p99_ms"].as_f64().unwrap()
    );
    assert!(
        direct["cpu"]["relay_ms"].as_f64().unwrap() >= 0.0 && direct["cpu"]["alone_ms"].is_number()
    );
    assert!(
        direct["cpu"]["idle_ms_per_s"].is_number()
            && direct["memory"]["idle_per_session_mib"].is_number()
    );
    assert_eq!(direct["lanes"].as_array().unwrap().len(), 2);
    assert!(direct["lanes"][1]["sent_bytes"].as_f64().unwrap() > 0.0);
    // A cut-through edge: what it adds over a subscriber on the root, and the edge's CPU.
    assert!(row("tier")["added_ms"][1].is_number() && row("tier")["cpu"]["others_ms"].is_number());
    // From the ring: back to back, faster than the source's cadence on the live rows.
    let tput = |n: &str| row(n)["delivery"]["throughput_mib_s"].as_f64().unwrap();
    assert!(
        tput("ring") > tput("direct"),
        "{} against {}",
        tput("ring"),
        tput("direct")
    );
    assert_eq!(row("tcp")["delivery"]["ratio"], 1.0);
    let text = std::fs::read_to_string(csv).unwrap();
    assert_eq!(text.lines().count(), 1 + rows.len());
}

#[test]
fn one_lane_stays_under_the_flow_cap_and_two_lanes_exceed_it() {
    if let Some(reason) = ledger_relay_bench::netem::unavailable_reason() {
        return eprintln!("skipped: {reason}");
    }
    if bench().is_none() {
        return;
    }
    // 40 Mbit/s per flow, far below what this machine moves, so the cap is what limits a
    // lane; 250 KB ledgers back to back from the ring, about 51 ms each on one flow. The rate
    // is the sustained one (not one ledger's goodput, which HTB's burst can lift over the cap).
    let argv = [
        "ledger-bench",
        "run",
        "--preset",
        "lanes",
        "--only",
        "catch-up-l1",
        "--only",
        "catch-up-l2",
        "--ledgers",
        "30",
        "--warmup",
        "8",
        "--flow-mbit",
        "40",
        "--size",
        "256000",
        "--chunk",
        "16384",
    ];
    let Sub::Run(a) = Cli::try_parse_from(argv).unwrap().command else {
        panic!()
    };
    let report = ledger_relay_bench::run::run(&a).unwrap();
    let cap_mib_s = 40e6 / 8.0 / f64::from(1 << 20);
    let rate = |i: usize| {
        let r = &report.rows[i];
        assert!(r.error.is_none(), "{}: {:?}", r.scenario.name, r.error);
        r.delivery.as_ref().unwrap().throughput_mib_s
    };
    let (one, two) = (rate(0), rate(1));
    eprintln!("cap {cap_mib_s:.2} MiB/s: 1 lane {one:.2} MiB/s, 2 lanes {two:.2} MiB/s");
    assert!(
        one < cap_mib_s && two > cap_mib_s,
        "1 lane {one:.2}, 2 lanes {two:.2} MiB/s against a cap of {cap_mib_s:.2}"
    );
    // Each lane's cap and what it carried, from the relay's counters in its namespace.
    let lanes = &report.rows[1].lanes;
    assert_eq!(
        lanes.iter().map(|l| l.cap_mbit).collect::<Vec<_>>(),
        [Some(40.0), Some(40.0)]
    );
    assert!(lanes.iter().all(|l| l.delivered_bytes > 1e6), "{lanes:?}");
}
