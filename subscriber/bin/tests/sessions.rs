//! `ledger-subscribe --sessions N`, the bench mode: N independent subscriptions in one process,
//! each verified and counted, none written.

use std::collections::HashSet;

use clap::Parser;
use ledger_relay_subscriber::SubscribeError;
use ledger_relay_subscriber_bin::cli::{self, Args};
use ledger_relay_wire::AssemblyError;

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

/// `--receive-only`: the arguments of a run of `sessions` receive-only sessions.
fn receive_only(
    relay: &FakeRelay,
    pki: &Pki,
    stats: &std::path::Path,
    more: &[&str],
) -> cli::CliConfig {
    let mut extra = vec!["--receive-only", "--stats", stats.to_str().unwrap()];
    extra.extend_from_slice(more);
    Args::try_parse_from(argv(&relay.addr.to_string(), pki, &extra))
        .unwrap()
        .into_config()
        .unwrap()
}

/// The `seq,raw_bytes` of each row of a stats file.
fn rows(path: &std::path::Path) -> Vec<(u32, u64)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| {
            let mut f = l.split(',');
            let seq = f.next().unwrap().parse().unwrap();
            (seq, f.next().unwrap().parse().unwrap())
        })
        .collect()
}

#[tokio::test]
async fn receive_only_counts_every_ledger_and_its_size() {
    let pki = Pki::new();
    let ledgers = testnet_ledgers(8);
    let relay = FakeRelay::start(Plan::new(ledgers.clone()), pki.path(), pki.path());
    let tmp = tempfile::tempdir().unwrap();
    let stats = tmp.path().join("r.csv");
    let config = receive_only(&relay, &pki, &stats, &["--count", "6", "--sessions", "2"]);
    assert!(config.subscribe.receive_only);
    let summary = within(60, cli::run(config, std::future::pending()))
        .await
        .unwrap();
    assert_eq!(summary.ledgers, 12, "6 ledgers for each of 2 sessions");
    assert_eq!(summary.last_seq, FIRST_SEQ + 5);
    let expected: Vec<(u32, u64)> = ledgers[..6]
        .iter()
        .zip(FIRST_SEQ..)
        .map(|(l, seq)| (seq, l.len() as u64))
        .collect();
    for k in 0..2 {
        assert_eq!(
            rows(&tmp.path().join(format!("r.csv.{k}"))),
            expected,
            "session {k}"
        );
    }

    // One session alone keeps the file's name, as the normal run does.
    let config = receive_only(&relay, &pki, &stats, &["--count", "3"]);
    let summary = within(60, cli::run(config, std::future::pending()))
        .await
        .unwrap();
    assert_eq!(summary.ledgers, 3);
    assert_eq!(rows(&stats), expected[..3]);
}

#[tokio::test]
async fn receive_only_still_fails_a_damaged_frame_but_not_damaged_content() {
    let pki = Pki::new();
    let tmp = tempfile::tempdir().unwrap();
    let stats = tmp.path().join("r.csv");
    // Chunk 1 of the third ledger claims the wrong place: its framing is wrong.
    let mut plan = Plan::new(testnet_ledgers(6));
    plan.misplace = Some(FIRST_SEQ + 2);
    let relay = FakeRelay::start(plan, pki.path(), pki.path());
    let config = receive_only(&relay, &pki, &stats, &["--count", "5"]);
    let e = within(60, cli::run(config, std::future::pending()))
        .await
        .expect_err("a misplaced chunk was counted");
    assert_eq!(e.exit_code(), 2);
    assert!(
        matches!(
            &e,
            cli::RunError::Subscribe(SubscribeError::Integrity {
                source: AssemblyError::Misplaced { index: 1, .. },
                ..
            })
        ),
        "{e:?}"
    );
    let seqs: Vec<u32> = rows(&stats).iter().map(|r| r.0).collect();
    assert_eq!(
        seqs,
        [FIRST_SEQ, FIRST_SEQ + 1],
        "what came before is counted"
    );

    // What it does not verify: a flipped byte of content passes (the normal run stops on it,
    // `verify::` and `session::` tests).
    let mut plan = Plan::new(testnet_ledgers(6));
    plan.tamper = Some(FIRST_SEQ + 2);
    let relay = FakeRelay::start(plan, pki.path(), pki.path());
    let config = receive_only(&relay, &pki, &stats, &["--count", "5"]);
    let summary = within(60, cli::run(config, std::future::pending()))
        .await
        .unwrap();
    assert_eq!(summary.ledgers, 5);
}

#[test]
fn receive_only_refuses_to_hand_ledgers_on() {
    let pki = Pki::new();
    let parse = |extra: &[&str]| Args::try_parse_from(argv("127.0.0.1:7400", &pki, extra));
    for extra in [
        &["--receive-only", "--out", "ledgers.xdr"][..],
        &["--receive-only", "--out", "-"],
        &["--receive-only", "--sessions", "4", "--out", "/dev/null"],
        &["--receive-only", "--hedge"],
        &[
            "--receive-only",
            "--anchor",
            "5:0000000000000000000000000000000000000000000000000000000000000000",
        ],
    ] {
        let e = parse(extra).expect_err("conflict accepted");
        assert_eq!(
            e.kind(),
            clap::error::ErrorKind::ArgumentConflict,
            "{extra:?}"
        );
        assert_eq!(e.exit_code(), 2);
    }
    let help = Args::try_parse_from(["ledger-subscribe", "--help"])
        .unwrap_err()
        .to_string();
    assert!(
        help.contains("BENCH MODE, DOES NOT VERIFY CONTENT"),
        "{help}"
    );
}
