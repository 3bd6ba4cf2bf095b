//! `ledger-subscribe`: record-marked output byte-identical to core's, stats, exit codes.

use std::process::Stdio;
use std::time::Duration;

use clap::Parser;
use ledger_relay_subscriber::cli::{self, Args, Output};

use crate::support::fake_relay::{FakeRelay, Plan};
use crate::support::{testnet_ledgers, within, Pki, FIRST_SEQ, TESTNET};

/// The first `n` records of the sample, framing included, exactly as core wrote them.
fn source_prefix(n: usize) -> Vec<u8> {
    let all = std::fs::read(TESTNET).unwrap();
    let mut at = 0;
    for _ in 0..n {
        let len = u32::from_be_bytes(all[at..at + 4].try_into().unwrap()) & 0x7fff_ffff;
        at += 4 + len as usize;
    }
    all[..at].to_vec()
}

#[tokio::test]
async fn writes_core_framing_byte_identical_with_stats() {
    let pki = Pki::new();
    let relay = FakeRelay::start(Plan::new(testnet_ledgers(6)), pki.path(), pki.path());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.xdr");
    let stats = tmp.path().join("stats.csv");
    let args = Args::try_parse_from([
        "ledger-subscribe",
        "--relay",
        &relay.addr.to_string(),
        "--certs",
        pki.path().to_str().unwrap(),
        "--name",
        "rpc-1",
        "--from",
        &FIRST_SEQ.to_string(),
        "--count",
        "5",
        "--lanes",
        "2",
        "--out",
        out.to_str().unwrap(),
        "--stats",
        stats.to_str().unwrap(),
    ])
    .unwrap();
    let config = args.into_config().unwrap();
    assert_eq!(config.out, Output::Path(out.clone()));
    let summary = within(20, cli::run(config, std::future::pending()))
        .await
        .unwrap();
    assert_eq!(summary.ledgers, 5);
    assert_eq!(summary.last_seq, FIRST_SEQ + 4);
    assert!(
        std::fs::read(&out).unwrap() == source_prefix(5),
        "output differs from core's"
    );
    let csv = std::fs::read_to_string(&stats).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "seq,raw_bytes,wire_bytes,delivery_ms,inter_arrival_ms"
    );
    assert_eq!(lines.len(), 6);
    let first: Vec<&str> = lines[1].split(',').collect();
    assert_eq!(first[0], FIRST_SEQ.to_string());
    assert_eq!(first[1], testnet_ledgers(1)[0].len().to_string());
    assert_eq!(first[4], "", "no inter-arrival for the first ledger");
    assert!(lines[2].split(',').nth(4).unwrap().parse::<f64>().is_ok());
}

/// Runs the binary with `args`; returns (exit code, stdout, stderr).
async fn run_binary(args: &[&str]) -> (i32, Vec<u8>, String) {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ledger-subscribe"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("binary timed out")
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_binary_writes_to_stdout_and_exits_0_after_count() {
    let pki = Pki::new();
    let relay = FakeRelay::start(Plan::new(testnet_ledgers(4)), pki.path(), pki.path());
    let addr = relay.addr.to_string();
    let (code, stdout, stderr) = run_binary(&[
        "--relay",
        &addr,
        "--certs",
        pki.path().to_str().unwrap(),
        "--name",
        "rpc-1",
        "--from",
        &FIRST_SEQ.to_string(),
        "--count",
        "3",
    ])
    .await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout == source_prefix(3));
}

#[tokio::test]
async fn the_binary_exits_4_below_retention_with_the_oldest_held() {
    let pki = Pki::new();
    let mut plan = Plan::new(testnet_ledgers(3));
    plan.below_retention = true;
    let relay = FakeRelay::start(plan, pki.path(), pki.path());
    let addr = relay.addr.to_string();
    let (code, stdout, stderr) = run_binary(&[
        "--relay",
        &addr,
        "--certs",
        pki.path().to_str().unwrap(),
        "--name",
        "rpc-1",
        "--from",
        "1",
    ])
    .await;
    assert_eq!(code, 4, "{stderr}");
    assert!(stdout.is_empty());
    assert!(
        stderr.contains(&format!("oldest ledger held is {FIRST_SEQ}")),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
}

#[tokio::test]
async fn the_binary_exits_3_when_not_authorized() {
    let relay_pki = Pki::new();
    let client_pki = Pki::new();
    let relay = FakeRelay::start(
        Plan::new(testnet_ledgers(2)),
        relay_pki.path(),
        relay_pki.path(),
    );
    // The client's directory: its own certificate, but the relay's CA as trust anchor.
    std::fs::copy(
        relay_pki.path().join("ca.pem"),
        client_pki.path().join("ca.pem"),
    )
    .unwrap();
    let addr = relay.addr.to_string();
    let (code, _, stderr) = run_binary(&[
        "--relay",
        &addr,
        "--certs",
        client_pki.path().to_str().unwrap(),
        "--name",
        "rpc-1",
    ])
    .await;
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("not authorized"), "{stderr}");
}

#[tokio::test]
async fn the_binary_exits_2_on_bad_arguments() {
    let pki = Pki::new();
    let certs = pki.path().to_str().unwrap().to_owned();
    for args in [
        vec!["--relay", "nohost", "--certs", &certs, "--name", "rpc-1"],
        vec![
            "--relay",
            "127.0.0.1:1",
            "--certs",
            &certs,
            "--name",
            "rpc-1",
            "--lanes",
            "0",
        ],
        vec![
            "--relay",
            "127.0.0.1:1",
            "--certs",
            &certs,
            "--name",
            "missing",
        ],
        vec!["--relay", "127.0.0.1:1", "--certs", &certs],
    ] {
        let (code, _, stderr) = run_binary(&args).await;
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(!stderr.is_empty());
    }
    let (code, stdout, _) = run_binary(&["--help"]).await;
    assert_eq!(code, 0);
    assert!(String::from_utf8_lossy(&stdout).contains("--lane-ports"));
}
