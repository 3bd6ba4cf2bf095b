//! `ledger-bench remote` against a real `ledger-relay run` and the bench's own TCP yardstick
//! (`ledger-bench yardstick`) beside it, serving the same ledgers: on loopback, and as root
//! across two network namespaces standing for two hosts (the relay and the yardstick in one,
//! `ledger-bench remote` in the other). Rows come out with every ledger after the warm-up and
//! a clock offset that on one machine (one clock) is within the bound the estimate claims.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use ledger_relay_bench::cluster::{make_certs, Cluster, RelaySettings};
use ledger_relay_bench::netem::{Netem, Shape, RELAY_ADDR};
use ledger_relay_bench::{Cli, Command as Sub};

const SOURCE: &str = "synthetic:size=256KiB,ratio=1";

/// `ledger-bench yardstick` on `listen` with the relay's certificate, killed when dropped.
struct Yardstick(Child);

impl Yardstick {
    fn start(ns: Option<&str>, listen: &str, certs: &Path, log: &Path) -> Yardstick {
        let exe = Path::new(env!("CARGO_BIN_EXE_ledger-bench"));
        let child = Netem::exec_in(ns, exe)
            .args([
                "yardstick",
                "--listen",
                listen,
                "--source",
                SOURCE,
                "--cadence",
                "100ms",
                "--emit",
                "2ms",
                "--certs",
            ])
            .arg(certs)
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while !std::fs::read_to_string(log)
            .unwrap_or_default()
            .contains("listening")
        {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "the yardstick did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Yardstick(child)
    }
}

impl Drop for Yardstick {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn built() -> bool {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_ledger-bench"));
    let missing = ["ledger-relay", "ledger-subscribe"]
        .into_iter()
        .find(|b| !exe.with_file_name(b).is_file());
    if let Some(bin) = missing {
        eprintln!("skipped: {bin} not built next to ledger-bench (cargo build --workspace)");
    }
    missing.is_none()
}

/// The relay's settings as `SOURCE` and the yardstick's flags say: 256 KiB raw ledgers every
/// 100 ms, sent as they are.
fn settings() -> RelaySettings {
    RelaySettings {
        codec: "none".into(),
        emit_ms: 2.0,
        retention: 1000,
        ..RelaySettings::endless(256 << 10, 1.0, 100.0)
    }
}

fn check(rows: &[serde_json::Value], clock: &serde_json::Value, lanes: &[u8]) {
    let mut want = vec!["remote-tcp".to_owned()];
    want.extend(lanes.iter().map(|n| format!("remote-l{n}")));
    assert_eq!(
        rows.iter()
            .map(|r| r["scenario"]["name"].as_str().unwrap())
            .collect::<Vec<_>>(),
        want
    );
    for r in rows {
        assert!(r["error"].is_null(), "{}", r["error"]);
        let d = &r["delivery"];
        assert_eq!(
            (d["ledgers"].as_u64(), d["raw_bytes"].as_f64()),
            (Some(10), Some(262_144.0)),
            "{d}"
        );
        // One clock, corrected by an estimate near zero: a ledger arrives after its last byte.
        assert!(
            d["p50_ms"].as_f64().unwrap() > 0.0 && d["transfer_mib_s"].as_f64().unwrap() > 0.0,
            "{d}"
        );
    }
    // One machine: the true offset is 0, so each estimate is within the half round trip it
    // claims as its bound.
    for e in [&clock["before"], &clock["after"]] {
        let (off, rtt) = (
            e["offset_ms"].as_f64().unwrap(),
            e["rtt_ms"].as_f64().unwrap(),
        );
        assert!(
            off.abs() <= rtt / 2.0 + 0.001,
            "offset {off} ms beyond half the round trip {rtt} ms"
        );
        assert_eq!(e["probes"], 16);
    }
}

#[test]
fn remote_rows_against_a_relay_and_its_yardstick_on_loopback() {
    if !built() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("certs");
    make_certs(&certs, 1).unwrap();
    let c = Cluster {
        certs: certs.clone(),
        ..Cluster::default()
    };
    let relay = c
        .relay_in(None, &tmp.path().join("relay"), &settings(), SOURCE, &[])
        .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tcp = format!("127.0.0.1:{port}");
    let _y = Yardstick::start(None, &tcp, &certs, &tmp.path().join("y.log"));
    let (relay_addr, certs_s) = (relay.addr.to_string(), certs.display().to_string());
    let argv = [
        "ledger-bench",
        "remote",
        "--relay",
        &relay_addr,
        "--tcp",
        &tcp,
        "--certs",
        &certs_s,
        "--name",
        "sub-0",
        "--lanes",
        "1,2",
        "--ledgers",
        "10",
        "--warmup",
        "2",
        "--clock-probes",
        "16",
    ];
    let Sub::Remote(a) = Cli::try_parse_from(argv).unwrap().command else {
        panic!()
    };
    let report = ledger_relay_bench::remote::run(&a).unwrap();
    let v = serde_json::to_value(&report).unwrap();
    check(v["rows"].as_array().unwrap(), &v["clock"], &[1, 2]);
    assert!(report
        .clock
        .describe()
        .starts_with("clock: relay minus this host"));
    relay.stop();
}

#[test]
fn remote_rows_across_two_network_namespaces() {
    if let Some(reason) = ledger_relay_bench::netem::unavailable_reason() {
        return eprintln!("skipped: {reason}");
    }
    if !built() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("certs");
    make_certs(&certs, 1).unwrap();
    // No per-flow cap: the namespaces stand for two hosts on one link.
    let net = Netem::create(
        "rm",
        Shape {
            flow_bps: 10_000_000_000,
            aggregate_bps: 10_000_000_000,
            link_mtu: None,
        },
    )
    .unwrap();
    let c = Cluster {
        certs: certs.clone(),
        ..Cluster::default()
    };
    let relay = c
        .relay_in(
            Some((&net.relay_ns, RELAY_ADDR)),
            &tmp.path().join("relay"),
            &settings(),
            SOURCE,
            &[],
        )
        .unwrap();
    let tcp = format!("{RELAY_ADDR}:7401");
    let _y = Yardstick::start(Some(&net.relay_ns), &tcp, &certs, &tmp.path().join("y.log"));
    let json = tmp.path().join("r.json");
    let out = Netem::exec_in(
        Some(&net.sub_ns),
        Path::new(env!("CARGO_BIN_EXE_ledger-bench")),
    )
    .args([
        "remote",
        "--relay",
        &relay.addr.to_string(),
        "--tcp",
        &tcp,
        "--name",
        "sub-0",
        "--lanes",
        "1,4",
    ])
    .args([
        "--ledgers",
        "10",
        "--warmup",
        "2",
        "--clock-probes",
        "16",
        "--row-timeout",
        "120s",
        "--certs",
    ])
    .arg(&certs)
    .arg("--json")
    .arg(&json)
    .stdin(Stdio::null())
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("clock: relay minus this host") && stdout.contains("remote-l4"),
        "{stdout}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    check(v["rows"].as_array().unwrap(), &v["clock"], &[1, 4]);
    relay.stop();
    drop(net);
}
