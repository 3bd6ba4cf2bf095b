//! `ledger-bench remote` against a real `ledger-relay run --tcp-baseline` process: on loopback
//! (the bench in this process), and across the bench's two network namespaces as two hosts
//! (the relay in one, `ledger-bench remote` in the other; root only, skipped with the reason
//! otherwise). Rows come out with every ledger after warm-up, positive goodput, and a clock
//! offset that on one machine (one clock) is within the bound the estimate claims.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use ledger_relay_bench::netem::{Netem, Shape, RELAY_ADDR};
use ledger_relay_bench::remote::RemoteReport;
use ledger_relay_bench::{Cli, Helper};

fn binaries() -> Result<(PathBuf, PathBuf), String> {
    let find = |bin| {
        ledger_relay_bench::proc::sibling_binary(bin)
            .map_err(|e| format!("{e:#} (cargo build --workspace builds it)"))
    };
    find("ledger-subscribe")?;
    Ok((
        find("ledger-relay")?,
        PathBuf::from(env!("CARGO_BIN_EXE_ledger-bench")),
    ))
}

/// A relay process, stopped when dropped.
struct RelayProc(Child);

impl Drop for RelayProc {
    fn drop(&mut self) {
        ledger_relay_bench::proc::stop(&mut self.0, Duration::from_secs(5));
    }
}

/// `ledger-relay run` with small incompressible synthetic ledgers, uncompressed, every 100 ms;
/// `cmd` is the program (possibly inside a namespace).
fn relay_args(cmd: &mut Command, certs: &Path, data: &Path, listen: &str, tcp: &str) {
    cmd.args([
        "--log-format",
        "json",
        "run",
        "--listen",
        listen,
        "--tcp-baseline",
        tcp,
    ])
    .arg("--certs")
    .arg(certs)
    .args(["--name", "relay", "--data-dir"])
    .arg(data)
    .args(["--source", "synthetic:size=256KiB,ratio=1"])
    .args(["--cadence", "100ms", "--emit", "2ms", "--codec", "none"])
    .env("RUST_LOG", "info")
    .stdin(Stdio::null())
    .stdout(Stdio::null());
}

/// Starts the relay and reads its JSON log until it listens: the QUIC and TCP addresses.
fn start(mut cmd: Command) -> (RelayProc, String, String) {
    let mut child = cmd
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting ledger-relay");
    let stderr = child.stderr.take().unwrap();
    let relay = RelayProc(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut quic, mut tcp) = (None, None);
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let addr = v["addr"].as_str().map(str::to_owned);
            match v["message"].as_str() {
                Some("relay listening") => quic = addr,
                Some("tcp baseline listening") => tcp = addr,
                _ => {}
            }
            if let (Some(q), Some(t)) = (&quic, &tcp) {
                let _ = tx.send((q.clone(), t.clone()));
                quic = None;
            }
        }
    });
    let (quic, tcp) = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the relay listens within 60 s");
    (relay, quic, tcp)
}

fn check(report: &RemoteReport, lanes: &[u8]) {
    eprintln!("{}", report.clock.describe());
    eprint!("{}", ledger_relay_bench::report::table(&report.rows));
    let mut want = vec!["remote-tcp".to_owned()];
    want.extend(lanes.iter().map(|n| format!("remote-l{n}")));
    let names: Vec<&str> = report
        .rows
        .iter()
        .map(|r| r.scenario.name.as_str())
        .collect();
    assert_eq!(names, want);
    for r in &report.rows {
        assert!(r.error.is_none(), "{}: {:?}", r.scenario.name, r.error);
        let s = &r.summary;
        assert_eq!(
            s.ledgers, 10,
            "{}: 12 ledgers less 2 of warm-up",
            r.scenario.name
        );
        assert_eq!(s.raw_bytes, 262_144.0, "{}", r.scenario.name);
        assert!(s.transfer_mib_s > 0.0, "{}: {s:?}", r.scenario.name);
        assert!(s.goodput_mib_s > 0.0, "{}: {s:?}", r.scenario.name);
        // One clock, corrected by an estimate of zero: a ledger arrives after its last byte.
        assert!(
            s.p50_ms > 0.0 && s.max_ms < 30_000.0,
            "{}: {s:?}",
            r.scenario.name
        );
    }
    // One machine, one clock: the true offset is 0, so each estimate must be within the half
    // round trip it claims as its bound.
    let (b, a) = (report.clock.before.unwrap(), report.clock.after.unwrap());
    for e in [b, a] {
        assert!(
            e.offset_ms.abs() <= e.rtt_ms / 2.0 + 0.001,
            "offset {} ms beyond half the round trip {} ms",
            e.offset_ms,
            e.rtt_ms
        );
        assert_eq!(e.probes, 16);
    }
    assert!(report.clock.offset_ms.is_some());
}

#[test]
fn remote_rows_against_a_relay_on_loopback() {
    let (relay_bin, _) = match binaries() {
        Ok(b) => b,
        Err(reason) => return eprintln!("skipped: {reason}"),
    };
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("certs");
    ledger_relay_bench::harness::make_certs(&certs, 0).unwrap();
    let mut cmd = Command::new(&relay_bin);
    relay_args(
        &mut cmd,
        &certs,
        &tmp.path().join("data"),
        "127.0.0.1:0",
        "127.0.0.1:0",
    );
    let (relay, quic, tcp) = start(cmd);
    let (csv, json) = (tmp.path().join("r.csv"), tmp.path().join("r.json"));
    let cli = Cli::try_parse_from([
        "ledger-bench",
        "remote",
        "--relay",
        &quic,
        "--tcp",
        &tcp,
        "--certs",
        certs.to_str().unwrap(),
        "--name",
        "sub-0",
        "--lanes",
        "1,2",
        "--ledgers",
        "12",
        "--warmup",
        "2",
        "--clock-probes",
        "16",
        "--csv",
        csv.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ])
    .unwrap();
    let Some(Helper::Remote(args)) = cli.helper else {
        panic!("not the remote mode")
    };
    let started = Instant::now();
    let report = ledger_relay_bench::remote::run(&args).unwrap();
    eprintln!("took {:?}", started.elapsed());
    check(&report, &[1, 2]);
    // The files main writes, from the same report.
    ledger_relay_bench::report::write(&csv, &ledger_relay_bench::report::csv(&report.rows))
        .unwrap();
    let text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(text.lines().count(), 4, "{text}");
    assert!(text
        .lines()
        .nth(1)
        .unwrap()
        .starts_with("remote-tcp,remote,remote,1,tcp,"));
    let v = serde_json::to_value(&report).unwrap();
    assert!(v["clock"]["offset_ms"].is_number(), "{}", v["clock"]);
    assert_eq!(v["rows"][1]["scenario"]["kind"]["Remote"]["lanes"], 1);
    drop(relay);
}

#[test]
fn remote_rows_across_two_network_namespaces() {
    if let Some(reason) = ledger_relay_bench::netem::unavailable_reason() {
        return eprintln!("skipped: {reason}");
    }
    let (relay_bin, bench_bin) = match binaries() {
        Ok(b) => b,
        Err(reason) => return eprintln!("skipped: {reason}"),
    };
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("certs");
    ledger_relay_bench::harness::make_certs(&certs, 0).unwrap();
    // No per-flow cap: the namespaces stand for two hosts on one link.
    let net = Netem::create(
        "rm",
        Shape {
            flow_bps: 10_000_000_000,
            aggregate_bps: 10_000_000_000,
        },
    )
    .unwrap();
    let (quic, tcp) = (format!("{RELAY_ADDR}:7400"), format!("{RELAY_ADDR}:7401"));
    let mut cmd = Netem::exec_in(Some(&net.relay_ns), &relay_bin);
    relay_args(&mut cmd, &certs, &tmp.path().join("data"), &quic, &tcp);
    let (relay, _, _) = start(cmd);
    let json = tmp.path().join("r.json");
    let out = Netem::exec_in(Some(&net.sub_ns), &bench_bin)
        .args(["remote", "--relay", &quic, "--tcp", &tcp, "--certs"])
        .arg(&certs)
        .args([
            "--name",
            "sub-0",
            "--lanes",
            "1,4",
            "--ledgers",
            "12",
            "--warmup",
            "2",
        ])
        .args(["--clock-probes", "16", "--row-timeout-s", "120", "--json"])
        .arg(&json)
        .stdin(Stdio::null())
        .output()
        .expect("running ledger-bench remote in the subscribers' namespace");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{}", out.status);
    assert!(
        stdout.starts_with("clock: relay minus this host"),
        "{stdout}"
    );
    assert!(stdout.contains("remote-l4"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["scenario"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["remote-tcp", "remote-l1", "remote-l4"]);
    for r in rows {
        assert!(r["error"].is_null(), "{}", r["error"]);
        assert_eq!(r["summary"]["ledgers"], 10);
        assert!(r["summary"]["transfer_mib_s"].as_f64().unwrap() > 0.0);
    }
    let before = &report["clock"]["before"];
    assert!(
        before["offset_ms"].as_f64().unwrap().abs()
            <= before["rtt_ms"].as_f64().unwrap() / 2.0 + 0.001,
        "{before}"
    );
    drop(relay);
    drop(net);
}
