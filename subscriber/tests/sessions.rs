//! `ledger-subscribe --sessions N`, the bench mode: N independent subscriptions in one process,
//! each verified and counted, none written.

use std::collections::HashSet;

use clap::Parser;
use ledger_relay_subscriber::cli::{self, Args};

use crate::support::fake_relay::{FakeRelay, Plan};
use crate::support::{subscribe_args, testnet_ledgers, within, Pki, FIRST_SEQ};

fn argv(relay: &str, pki: &Pki, extra: &[&str]) -> Vec<String> {
    let mut argv = vec!["ledger-subscribe".to_owned()];
    argv.extend(subscribe_args(
        relay,
        pki,
        &[&["--lanes", "2"], extra].concat(),
    ));
    argv
}

#[tokio::test]
async fn sessions_are_independent_subscriptions_each_with_its_stats() {
    let pki = Pki::new();
    let relay = FakeRelay::start(Plan::new(testnet_ledgers(8)), pki.path(), pki.path());
    let tmp = tempfile::tempdir().unwrap();
    let stats = tmp.path().join("s.csv");
    let config = Args::try_parse_from(argv(
        &relay.addr.to_string(),
        &pki,
        &[
            "--count",
            "5",
            "--sessions",
            "3",
            "--stats",
            stats.to_str().unwrap(),
        ],
    ))
    .unwrap()
    .into_config()
    .unwrap();
    assert_eq!(config.sessions, 3);
    let summary = within(60, cli::run(config, std::future::pending()))
        .await
        .unwrap();
    assert_eq!(summary.ledgers, 15, "5 ledgers for each of 3 sessions");
    assert_eq!(summary.last_seq, FIRST_SEQ + 4);
    assert!(!summary.interrupted);
    for k in 0..3 {
        let text = std::fs::read_to_string(tmp.path().join(format!("s.csv.{k}"))).unwrap();
        let seqs: Vec<u32> = text
            .lines()
            .skip(1)
            .map(|l| l.split(',').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(
            seqs,
            (FIRST_SEQ..FIRST_SEQ + 5).collect::<Vec<_>>(),
            "session {k}"
        );
    }
    assert!(!stats.exists(), "no stats file without a session suffix");
    // Three sessions of their own at the relay, not one shared.
    let record = relay.record();
    let ids: HashSet<_> = record.lane0_peers.iter().collect();
    assert_eq!(record.opens.len(), 3);
    assert_eq!(ids.len(), 3, "each session from its own lane 0 socket");
}

#[test]
fn sessions_refuse_what_they_cannot_share() {
    let pki = Pki::new();
    let parse = |extra: &[&str]| Args::try_parse_from(argv("127.0.0.1:7400", &pki, extra));
    assert!(parse(&["--sessions", "0"]).is_err());
    assert!(parse(&["--sessions", "1025"]).is_err());
    for extra in [
        &["--sessions", "2", "--out", "ledgers.xdr"][..],
        &["--sessions", "2", "--hedge"],
        &["--sessions", "2", "--lane-stats", "lanes.csv"],
        &["--sessions", "2", "--lane-ports", "9000"],
    ] {
        let e = parse(extra).expect_err("conflict accepted");
        assert_eq!(
            e.kind(),
            clap::error::ErrorKind::ArgumentConflict,
            "{extra:?}"
        );
    }
    let one = parse(&[]).unwrap().into_config().unwrap();
    assert_eq!(one.sessions, 1);
}
