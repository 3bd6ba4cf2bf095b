//! Layer 5 on real testnet ledgers: a byte changed in a transaction or in a result is refused
//! with the error naming the ledger and the hash, by the verifier and over QUIC; and the
//! anchor, right and wrong, through the library and the command.

use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use ledger_relay_subscriber::frame::{LedgerEnd, Start};
use ledger_relay_subscriber::verify::Verifier;
use ledger_relay_subscriber::{connect, Anchor, SubscribeError, VerifyError};
use ledger_relay_wire::content::ContentError;
use ledger_relay_wire::header::peek_header;
use stellar_xdr::{LedgerCloseMeta, Limits, ReadXdr, WriteXdr};

use crate::support::fake_relay::{FakeRelay, Plan};
use crate::support::{subscriber_config, testnet_ledgers, within, Pki, FIRST_SEQ};

/// An error with its sources, `a: b: c`.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

fn end_of(data: &[u8]) -> LedgerEnd {
    let info = peek_header(data).unwrap().unwrap();
    LedgerEnd {
        seq: info.ledger_seq,
        chunk_count: 1,
        raw_len: data.len() as u64,
        checksum: ledger_relay_wire::checksum(data),
        header_hash: info.hash,
        previous_hash: info.previous_hash,
        first_byte_ns: 0,
        last_byte_ns: 0,
    }
}

/// Where `needle` occurs in `haystack` (once).
fn find(haystack: &[u8], needle: &[u8]) -> usize {
    let mut hits = haystack
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle);
    let (at, _) = hits.next().expect("found");
    assert!(hits.next().is_none(), "found once");
    at
}

/// The ledger with a byte of its first transaction changed (the last byte of the envelope, in
/// its signature), and the ledger with a byte of its first result changed (the transaction
/// hash the result is for). Both are still well-formed, with untouched headers: only the
/// content hashes tell.
fn tampered(ledger: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let LedgerCloseMeta::V0(v0) = LedgerCloseMeta::from_xdr(ledger, Limits::none()).unwrap() else {
        panic!("the testnet sample is v0")
    };
    let envelope = v0.tx_set.txs[0].to_xdr(Limits::none()).unwrap();
    let result = v0.tx_processing[0].result.to_xdr(Limits::none()).unwrap();
    let mut tx = ledger.to_vec();
    tx[find(ledger, &envelope) + envelope.len() - 1] ^= 0x01;
    let mut res = ledger.to_vec();
    res[find(ledger, &result)] ^= 0x01;
    (tx, res)
}

#[test]
fn a_changed_transaction_or_result_is_refused() {
    let ledgers = testnet_ledgers(3);
    let (tx, res) = tampered(&ledgers[1]);
    let seq = FIRST_SEQ + 1;
    let info = peek_header(&ledgers[1]).unwrap().unwrap();
    let mut v = Verifier::starting_at(FIRST_SEQ);
    v.verify(FIRST_SEQ, &ledgers[0], &end_of(&ledgers[0]))
        .unwrap();

    let err = v.verify(seq, &tx, &end_of(&tx)).unwrap_err();
    match &err {
        VerifyError::Content {
            seq: s,
            source:
                ContentError::TxSetHashMismatch {
                    header, computed, ..
                },
        } => {
            assert_eq!((*s, *header), (seq, info.tx_set_hash));
            assert_ne!(computed, header);
        }
        other => panic!("{other:?}"),
    }
    let chain = error_chain(&err);
    assert!(chain.starts_with(&format!("ledger {seq}: ")), "{chain}");
    assert!(chain.contains("txSetHash"), "{chain}");

    let err = v.verify(seq, &res, &end_of(&res)).unwrap_err();
    match &err {
        VerifyError::Content {
            seq: s,
            source: ContentError::ResultSetHashMismatch { header, .. },
        } => assert_eq!((*s, *header), (seq, info.tx_set_result_hash)),
        other => panic!("{other:?}"),
    }
    assert!(error_chain(&err).contains("txSetResultHash"), "{err}");

    // A body that is not well-formed: typed, with the ledger named.
    let mut cut = ledgers[1].to_vec();
    cut.truncate(cut.len() - 3);
    assert!(matches!(
        v.verify(seq, &cut, &end_of(&cut)).unwrap_err(),
        VerifyError::Content { seq: s, .. } if s == seq
    ));

    // With the check switched off (`--no-content-check`), only the chain is checked: the
    // changed result goes through.
    let mut off = Verifier::after(FIRST_SEQ, hash_of(&ledgers[0]));
    off.set_content_check(false);
    off.verify(seq, &res, &end_of(&res)).unwrap();

    // Failures left the verifier where it was: the real ledger still verifies.
    v.verify(seq, &ledgers[1], &end_of(&ledgers[1])).unwrap();
    assert_eq!(v.last(), Some((seq, info.hash)));
}

/// Over QUIC: the tampered ledger passes the checksum (the relay computes it over what it
/// sends) and the header chain, and is refused on its results hash; the ledger before it is
/// delivered, nothing after.
#[tokio::test]
async fn a_relay_that_changes_a_result_is_caught() {
    let pki = Pki::new();
    let mut ledgers = testnet_ledgers(4);
    let (_, res) = tampered(&ledgers[2]);
    ledgers[2] = Bytes::from(res);
    let relay = FakeRelay::start(Plan::new(ledgers.clone()), pki.path(), pki.path());
    let config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ), 2);
    let mut sub = connect(config).unwrap();
    let mut delivered = Vec::new();
    let err = within(20, async {
        loop {
            match sub.next().await {
                Some(Ok(l)) => delivered.push(l.seq),
                Some(Err(e)) => break e,
                None => panic!("ended without an error"),
            }
        }
    })
    .await;
    assert_eq!(delivered, [FIRST_SEQ, FIRST_SEQ + 1]);
    match err {
        SubscribeError::Verify {
            source:
                VerifyError::Content {
                    seq,
                    source: ContentError::ResultSetHashMismatch { .. },
                },
            ..
        } => assert_eq!(seq, FIRST_SEQ + 2),
        other => panic!("{other:?}"),
    }
    // Terminal: the stream ends.
    assert!(within(5, sub.next()).await.is_none());
}

fn hash_of(ledger: &[u8]) -> [u8; 32] {
    peek_header(ledger).unwrap().unwrap().hash
}

/// Subscribes with `anchor` from `start`; returns the sequences delivered before the first
/// error (at most `n`), and the error.
async fn anchored(
    ledgers: &[Bytes],
    anchor: Anchor,
    start: u32,
    n: usize,
) -> (Vec<u32>, Option<SubscribeError>) {
    let pki = Pki::new();
    let relay = FakeRelay::start(Plan::new(ledgers.to_vec()), pki.path(), pki.path());
    let mut config = subscriber_config(&[relay.addr], &pki, Start::Seq(start), 1);
    config.anchor = Some(anchor);
    let mut sub = connect(config).unwrap();
    let mut seqs = Vec::new();
    let err = within(20, async {
        while seqs.len() < n {
            match sub.next().await {
                Some(Ok(l)) => seqs.push(l.seq),
                Some(Err(e)) => return Some(e),
                None => panic!("ended without an error"),
            }
        }
        None
    })
    .await;
    sub.close().await;
    (seqs, err)
}

#[tokio::test]
async fn the_anchor_verifies_the_first_ledger() {
    let ledgers = testnet_ledgers(4);
    let right = Anchor {
        seq: FIRST_SEQ + 1,
        hash: hash_of(&ledgers[1]),
    };
    let mut wrong = right;
    wrong.hash[7] ^= 0x40;

    // From the anchor itself, then from the ledger after it.
    let (seqs, err) = anchored(&ledgers, right, FIRST_SEQ + 1, 3).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(seqs, [FIRST_SEQ + 1, FIRST_SEQ + 2, FIRST_SEQ + 3]);
    let (seqs, err) = anchored(&ledgers, right, FIRST_SEQ + 2, 2).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(seqs, [FIRST_SEQ + 2, FIRST_SEQ + 3]);

    // A wrong hash: nothing is delivered, and the error says which ledger and what.
    for start in [FIRST_SEQ + 1, FIRST_SEQ + 2] {
        let (seqs, err) = anchored(&ledgers, wrong, start, 1).await;
        assert!(seqs.is_empty(), "{seqs:?}");
        match err {
            Some(SubscribeError::Verify {
                source:
                    VerifyError::AnchorMismatch {
                        seq,
                        anchor_seq,
                        expected,
                        got,
                    },
                ..
            }) => {
                assert_eq!(
                    (seq, anchor_seq, expected),
                    (start, FIRST_SEQ + 1, wrong.hash)
                );
                assert_eq!(got, right.hash);
            }
            other => panic!("start {start}: {other:?}"),
        }
    }

    // A start the anchor cannot vouch for is refused before connecting.
    let pki = Pki::new();
    let mut config = subscriber_config(
        &["127.0.0.1:9".parse().unwrap()],
        &pki,
        Start::Seq(FIRST_SEQ),
        1,
    );
    config.anchor = Some(right);
    assert!(matches!(
        connect(config),
        Err(SubscribeError::InvalidConfig {
            field: "anchor",
            ..
        })
    ));
}

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

fn hex(hash: &[u8; 32]) -> String {
    ledger_relay_wire::Hex(hash).to_string()
}

#[tokio::test]
async fn the_binary_checks_the_anchor() {
    let pki = Pki::new();
    let ledgers = testnet_ledgers(3);
    let relay = FakeRelay::start(Plan::new(ledgers.clone()), pki.path(), pki.path());
    let addr = relay.addr.to_string();
    let certs = pki.path().to_str().unwrap().to_owned();
    let base = ["--relay", &addr, "--certs", &certs, "--name", "rpc-1"];
    let right = format!("{FIRST_SEQ}:{}", hex(&hash_of(&ledgers[0])));

    // Right: without --from the run starts at the anchor, and writes it.
    let mut args = base.to_vec();
    args.extend(["--anchor", &right, "--count", "2"]);
    let (code, stdout, stderr) = run_binary(&args).await;
    assert_eq!(code, 0, "{stderr}");
    let mut want = Vec::new();
    for l in &ledgers[..2] {
        ledger_relay_wire::record::write_record_to(&mut want, l).unwrap();
    }
    assert!(stdout == want);

    // Wrong: exit 2, nothing written, one line naming the ledger and the anchor.
    let mut bad_hash = hash_of(&ledgers[0]);
    bad_hash[0] ^= 1;
    let wrong = format!("{FIRST_SEQ}:{}", hex(&bad_hash));
    let mut args = base.to_vec();
    args.extend(["--anchor", &wrong, "--count", "2"]);
    let (code, stdout, stderr) = run_binary(&args).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty());
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains(&format!(
            "ledger {FIRST_SEQ} does not match the anchor {wrong}"
        )),
        "{stderr}"
    );

    // Bad syntax, and a start the anchor does not cover: exit 2 with a one-line reason.
    let later = (FIRST_SEQ + 5).to_string();
    for (extra, reason) in [
        (vec!["--anchor", "1410048"], "expected SEQ:HASH"),
        (
            vec!["--anchor", "1410048:abc"],
            "HASH must be 64 hex digits",
        ),
        (
            vec!["--anchor", &right, "--from", &later],
            "does not follow the anchor",
        ),
    ] {
        let mut args = base.to_vec();
        args.extend(extra.iter().copied());
        let (code, _, stderr) = run_binary(&args).await;
        assert_eq!(code, 2, "{extra:?}: {stderr}");
        assert!(stderr.contains(reason), "{extra:?}: {stderr}");
        let lines = stderr
            .trim()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count();
        assert!(lines <= 3, "{extra:?}: {stderr}");
    }
}
