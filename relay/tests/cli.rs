//! The `ledger-relay` binary's contract (CONTRACT.md): `--help` exits 0, bad arguments exit 2
//! with a one-line reason; and the metrics endpoint of a running relay.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use crate::support::{certs, relay_config, Running, LAST, SYNTHETIC, TESTNET};

fn relay_bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ledger-relay"))
}

#[test]
fn help_exits_0() {
    for args in [&["--help"][..], &["run", "--help"], &["demo", "--help"]] {
        let out = relay_bin().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Usage"), "{args:?}: {text}");
    }
    let out = relay_bin().args(["run", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--listen",
        "--certs",
        "--name",
        "--data-dir",
        "--source",
        "--cadence",
        "--retention",
        "--allow",
        "--metrics",
        "--config",
    ] {
        assert!(text.contains(flag), "run --help lacks {flag}");
    }
}

#[test]
fn bad_arguments_exit_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<Vec<String>> = vec![
        vec!["frobnicate".into()],
        vec!["run".into()],
        vec![
            "run".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--certs".into(),
            dir.path().display().to_string(),
            "--data-dir".into(),
            dir.path().join("d").display().to_string(),
            "--source".into(),
            "tcp:nowhere".into(),
        ],
        vec![
            "run".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--certs".into(),
            dir.path().join("no-certs").display().to_string(),
            "--data-dir".into(),
            dir.path().join("d").display().to_string(),
            "--source".into(),
            "synthetic".into(),
        ],
        vec!["demo".into(), "--ledgers".into(), "0".into()],
    ];
    for args in cases {
        let out = relay_bin()
            .args(&args)
            .env("RUST_LOG", "off")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(
            lines.first().is_some_and(|l| l.starts_with("error")),
            "{args:?}: {err}"
        );
    }
}

fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_healthz_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(dir.path());
    let mut config = relay_config(certs.path(), &dir.path().join("data"), SYNTHETIC);
    config.metrics = Some("127.0.0.1:0".parse().unwrap());
    let relay = Running::start(config).await;
    relay.wait_for(12).await;
    let addr = relay.relay.metrics_addr.unwrap();
    let metrics = tokio::task::spawn_blocking(move || http_get(addr, "/metrics"))
        .await
        .unwrap();
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    for series in [
        "ledger_relay_ledgers_in_total ",
        "ledger_relay_wire_bytes_total ",
        "ledger_relay_ring_newest ",
        "ledger_relay_ring_degraded 0",
        "# TYPE ledger_relay_sessions_open gauge",
        "ledger_relay_source_last_ledger_age_seconds ",
        "ledger_relay_source_last_byte_age_seconds ",
        "ledger_relay_healthy 1",
        "ledger_relay_health_reason{reason=\"ring_degraded\"} 0",
    ] {
        assert!(metrics.contains(series), "missing {series}");
    }
    let health = tokio::task::spawn_blocking(move || http_get(addr, "/healthz"))
        .await
        .unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.contains("\"status\":\"ok\""), "{health}");
    assert!(health.contains("\"reasons\":[]"), "{health}");
    let missing = tokio::task::spawn_blocking(move || http_get(addr, "/nope"))
        .await
        .unwrap();
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    relay.stop().await;
}

/// A file replayed to its end: no more ledgers will come, and `/healthz` says so at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_source_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(dir.path());
    let mut config = relay_config(
        certs.path(),
        &dir.path().join("data"),
        &format!("file:{TESTNET}"),
    );
    config.metrics = Some("127.0.0.1:0".parse().unwrap());
    let relay = Running::start(config).await;
    relay.wait_for(LAST).await;
    let addr = relay.relay.metrics_addr.unwrap();
    let health = eventually_get(addr, "/healthz", |h| h.contains("\"source\":\"finished\"")).await;
    assert!(health.starts_with("HTTP/1.1 503"), "{health}");
    assert!(
        health.contains("\"reasons\":[\"source finished: no more ledgers will come\"]"),
        "{health}"
    );
    assert!(
        health.contains("\"reason_codes\":[\"source_finished\"]"),
        "{health}"
    );
    relay.stop().await;
}

/// `GET path` every 20 ms until the answer satisfies `want` (5 s at most).
async fn eventually_get(
    addr: std::net::SocketAddr,
    path: &'static str,
    want: impl Fn(&str) -> bool,
) -> String {
    for _ in 0..250 {
        let got = tokio::task::spawn_blocking(move || http_get(addr, path))
            .await
            .unwrap();
        if want(&got) {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("GET {path}: no wanted answer within 5 s")
}
