//! `ledger-subscribe --consume-delay`: a slow consumer is slow, loses nothing, and still stops
//! promptly.

use std::time::{Duration, Instant};

use clap::Parser;
use ledger_relay_subscriber_bin::cli::{self, Args};

use crate::support::fake_relay::{FakeRelay, Plan};
use crate::support::{subscribe_args, testnet_ledgers, within, Pki, FIRST_SEQ};

fn args(relay: &FakeRelay, pki: &Pki, out: &std::path::Path, extra: &[&str]) -> Args {
    let out = out.to_str().unwrap();
    let mut argv = vec!["ledger-subscribe".to_owned()];
    let fixed = ["--lanes", "2", "--out", out];
    argv.extend(subscribe_args(
        &relay.addr.to_string(),
        pki,
        &[&fixed[..], extra].concat(),
    ));
    Args::try_parse_from(argv).unwrap()
}

/// The records of a record-marked file.
fn records(path: &std::path::Path) -> Vec<bytes::Bytes> {
    let file = std::fs::File::open(path).unwrap();
    ledger_relay_wire::record::Records::new(file, 256 << 20)
        .map(|r| bytes::Bytes::from(r.unwrap()))
        .collect()
}

#[tokio::test]
async fn a_consume_delay_paces_the_output_and_loses_nothing() {
    let pki = Pki::new();
    let relay = FakeRelay::start(Plan::new(testnet_ledgers(8)), pki.path(), pki.path());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.xdr");
    let config = args(
        &relay,
        &pki,
        &out,
        &["--count", "6", "--consume-delay", "300ms"],
    )
    .into_config()
    .unwrap();
    assert_eq!(config.consume_delay, Duration::from_millis(300));
    let started = Instant::now();
    let summary = within(20, cli::run(config, std::future::pending()))
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(summary.ledgers, 6);
    assert_eq!(summary.last_seq, FIRST_SEQ + 5);
    // The writer holds one ledger and its channel two more: the sixth is handed over after
    // three pauses, then --count is reached and the last three are written without one.
    assert!(took >= Duration::from_millis(900), "took {took:?}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert_eq!(
        records(&out),
        testnet_ledgers(6),
        "output differs from the source"
    );
}

#[tokio::test]
async fn a_stop_request_cuts_a_long_consume_delay_short() {
    let pki = Pki::new();
    let relay = FakeRelay::start(Plan::new(testnet_ledgers(8)), pki.path(), pki.path());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.xdr");
    let config = args(&relay, &pki, &out, &["--consume-delay", "1h"])
        .into_config()
        .unwrap();
    let started = Instant::now();
    let summary = within(
        20,
        cli::run(config, tokio::time::sleep(Duration::from_millis(1500))),
    )
    .await
    .unwrap();
    let took = started.elapsed();
    assert!(summary.interrupted);
    assert!(took < Duration::from_secs(10), "took {took:?}");
    // The writer held one ledger in its pause and the channel two more: every ledger handed
    // to it is written, in order, before the run returns.
    assert!(
        (1..=3).contains(&summary.ledgers),
        "{} ledgers",
        summary.ledgers
    );
    let written = records(&out);
    assert_eq!(written.len() as u64, summary.ledgers);
    assert_eq!(written, testnet_ledgers(written.len()));
}

#[test]
fn the_help_documents_consume_delay() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ledger-subscribe"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--consume-delay <DURATION>"), "{help}");
}
