//! The `ledger-relay` binary's contract (CONTRACT.md): `--help` exits 0, bad arguments exit 2
//! with a one-line reason (the delivery-mode flags among them); and the metrics endpoint of a
//! running relay.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use crate::support::{certs, relay_config, Running, FIRST, TESTNET};

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
    let mut config = relay_config(
        certs.path(),
        &dir.path().join("data"),
        &format!("file:{TESTNET}"),
    );
    config.metrics = Some("127.0.0.1:0".parse().unwrap());
    let relay = Running::start(config).await;
    relay.wait_for(FIRST + 10).await;
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
    ] {
        assert!(metrics.contains(series), "missing {series}");
    }
    let health = tokio::task::spawn_blocking(move || http_get(addr, "/healthz"))
        .await
        .unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.contains("\"status\":\"ok\""), "{health}");
    let missing = tokio::task::spawn_blocking(move || http_get(addr, "/nope"))
        .await
        .unwrap();
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    relay.stop().await;
}

#[test]
fn the_binary_documents_the_flags_and_refuses_bad_values() {
    let bin = || std::process::Command::new(env!("CARGO_BIN_EXE_ledger-relay"));
    let help = bin().args(["run", "--help"]).output().unwrap();
    assert_eq!(help.status.code(), Some(0));
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in ["--store-and-forward", "--streams-per-lane <N>"] {
        assert!(help.contains(flag), "run --help lacks {flag}");
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    for (bad, reason) in [
        (
            vec!["--streams-per-lane", "0"],
            "--streams-per-lane 0: expected 1..=1024",
        ),
        (vec!["--streams-per-lane", "5000"], "expected 1..=1024"),
        (vec!["--streams-per-lane", "many"], "invalid value 'many'"),
        (vec!["--streams-per-lane=-3"], "invalid value '-3'"),
        (vec!["--store-and-forward=yes"], "--store-and-forward"),
    ] {
        let out = bin()
            .args([
                "run",
                "--listen",
                "127.0.0.1:0",
                "--certs",
                &d,
                "--data-dir",
                &d,
            ])
            .args(["--source", "synthetic"])
            .args(&bad)
            .env("RUST_LOG", "off")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        assert!(
            first.starts_with("error") && first.contains(reason),
            "{bad:?}: {err}"
        );
    }
}
