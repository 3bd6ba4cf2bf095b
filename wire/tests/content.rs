//! Content hashes (layer 5) on real Stellar ledgers: the in-place walk agrees with a full
//! `stellar-xdr` decode and with the headers, tampered copies fail with the right error, and
//! mutated ledgers are accepted exactly when `stellar-xdr` decodes them.

use ledger_relay_wire::content::{check_content, content_hashes, ContentError, ContentHashes};
use ledger_relay_wire::header::{peek_header, LedgerHeaderInfo, Malformation};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};
use stellar_xdr::{
    GeneralizedTransactionSet, LedgerCloseMeta, Limits, ReadXdr, TransactionPhase,
    TransactionResultPair, TransactionResultSet, TransactionSetV1, TxSetComponent, WriteXdr,
};

use crate::testdata::all_real_ledgers;

fn xdr(v: &impl WriteXdr) -> Vec<u8> {
    v.to_xdr(Limits::none()).unwrap()
}

fn info(lcm: &[u8]) -> LedgerHeaderInfo {
    peek_header(lcm).unwrap().unwrap()
}

/// The content hashes from a full `stellar-xdr` decode, computed as core does: an
/// implementation independent of the walker.
fn reference(lcm: &LedgerCloseMeta) -> ContentHashes {
    let results = |pairs: Vec<TransactionResultPair>| -> [u8; 32] {
        let set = TransactionResultSet {
            results: pairs.try_into().unwrap(),
        };
        Sha256::digest(xdr(&set)).into()
    };
    let (tx_set_hash, tx_set_len, pairs): (_, _, Vec<_>) = match lcm {
        LedgerCloseMeta::V0(v) => {
            let mut h = Sha256::new();
            let mut len = 32;
            h.update(v.tx_set.previous_ledger_hash.0);
            for env in v.tx_set.txs.iter() {
                let env = xdr(env);
                len += env.len();
                h.update(env);
            }
            let pairs = v.tx_processing.iter().map(|m| m.result.clone()).collect();
            (h.finalize().into(), len, pairs)
        }
        LedgerCloseMeta::V1(v) => (
            Sha256::digest(xdr(&v.tx_set)).into(),
            xdr(&v.tx_set).len(),
            v.tx_processing.iter().map(|m| m.result.clone()).collect(),
        ),
        LedgerCloseMeta::V2(v) => (
            Sha256::digest(xdr(&v.tx_set)).into(),
            xdr(&v.tx_set).len(),
            v.tx_processing.iter().map(|m| m.result.clone()).collect(),
        ),
    };
    let results_len: usize = 4 + pairs.iter().map(|p| xdr(p).len()).sum::<usize>();
    ContentHashes {
        tx_set_hash,
        transactions: pairs.len() as u32,
        tx_set_result_hash: results(pairs),
        hashed_bytes: (tx_set_len + results_len) as u64,
    }
}

fn decode(lcm: &[u8]) -> LedgerCloseMeta {
    LedgerCloseMeta::from_xdr(lcm, Limits::none()).unwrap()
}

/// The standalone v23 ledgers 85 and 88 come from a load test that appended the phases and
/// results of generated ledgers to real ones (stellar/go `ingest/loadtest`, `MergeLedgers`)
/// without updating the headers: their content hashes do not match, as a tampered ledger's
/// would not. This returns the real ledger inside: the first two phases and as many
/// `txProcessing` entries as they hold transactions.
fn unmerged(lcm: &[u8]) -> Vec<u8> {
    let LedgerCloseMeta::V2(mut v) = decode(lcm) else {
        panic!("the v23 samples are v2");
    };
    let GeneralizedTransactionSet::V1(set) = &v.tx_set;
    let phases: Vec<TransactionPhase> = set.phases[..2].to_vec();
    let txs: usize = phases
        .iter()
        .map(|p| match p {
            TransactionPhase::V0(components) => components
                .iter()
                .map(|TxSetComponent::TxsetCompTxsMaybeDiscountedFee(c)| c.txs.len())
                .sum::<usize>(),
            TransactionPhase::V1(p) => p
                .execution_stages
                .iter()
                .flat_map(|stage| stage.iter().map(|cluster| cluster.len()))
                .sum(),
        })
        .sum();
    v.tx_set = GeneralizedTransactionSet::V1(TransactionSetV1 {
        previous_ledger_hash: set.previous_ledger_hash.clone(),
        phases: phases.try_into().unwrap(),
    });
    v.tx_processing = v.tx_processing[..txs].to_vec().try_into().unwrap();
    xdr(&LedgerCloseMeta::V2(v))
}

/// Every real ledger passes, with the hashes a full decode gives, except the two load-test
/// merges, which fail on their transaction set; their real cores pass.
#[test]
fn real_ledgers_pass_and_agree_with_a_full_decode() {
    let mut by_version = [0usize; 3];
    let mut transactions = 0u64;
    for (name, lcm) in all_real_ledgers() {
        let info = info(&lcm);
        let walked = content_hashes(&lcm, &info).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(walked, reference(&decode(&lcm)), "{name}");
        let merged = name == "standalone v23 85" || name == "standalone v23 88";
        match check_content(&lcm, &info) {
            Ok(h) => {
                assert!(!merged, "{name} is a load-test merge and must fail");
                assert_eq!(h.tx_set_hash, info.tx_set_hash);
                assert_eq!(h.tx_set_result_hash, info.tx_set_result_hash);
                by_version[info.lcm_version as usize] += 1;
                transactions += u64::from(h.transactions);
            }
            Err(ContentError::TxSetHashMismatch {
                seq,
                header,
                computed,
            }) if merged => {
                assert_eq!((seq, header), (info.ledger_seq, info.tx_set_hash));
                assert_eq!(computed, walked.tx_set_hash);
                let real = unmerged(&lcm);
                let h = check_content(&real, &peek_header(&real).unwrap().unwrap())
                    .unwrap_or_else(|e| panic!("{name} unmerged: {e}"));
                assert!(h.transactions >= 38, "{name}: {}", h.transactions);
                by_version[2] += 1;
                transactions += u64::from(h.transactions);
            }
            Err(e) => panic!("{name}: {e}"),
        }
    }
    // 320 testnet and 5 pubnet v0; pubnet 53312000 and standalone 997-999 v1; 84, 85, 88 v2.
    assert_eq!(by_version, [325, 4, 3]);
    assert!(transactions > 1000, "{transactions}");
}

/// Finds `needle` in `haystack` exactly once and returns where.
fn find_once(haystack: &[u8], needle: &[u8]) -> usize {
    let hits: Vec<usize> = haystack
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(hits.len(), 1, "expected one occurrence");
    hits[0]
}

/// Ledgers with transactions, one per LedgerCloseMeta version, and where in each the first
/// transaction envelope and the first result pair are.
fn tamper_targets() -> Vec<(String, Vec<u8>, usize, usize, usize)> {
    let mut out = Vec::new();
    for (name, mut lcm) in all_real_ledgers() {
        let keep = matches!(
            name.as_str(),
            "testnet 1410048" | "pubnet 46154623" | "pubnet 53312000" | "standalone v23 85"
        );
        if !keep {
            continue;
        }
        if name == "standalone v23 85" {
            lcm = unmerged(&lcm);
        }
        let full = decode(&lcm);
        let (envelope, result) = match &full {
            LedgerCloseMeta::V0(v) => (xdr(&v.tx_set.txs[0]), xdr(&v.tx_processing[0].result)),
            LedgerCloseMeta::V1(v) => {
                let GeneralizedTransactionSet::V1(s) = &v.tx_set;
                let env = match &s.phases[0] {
                    TransactionPhase::V0(c) => {
                        let TxSetComponent::TxsetCompTxsMaybeDiscountedFee(c) = &c[0];
                        xdr(&c.txs[0])
                    }
                    TransactionPhase::V1(p) => xdr(&p.execution_stages[0][0][0]),
                };
                (env, xdr(&v.tx_processing[0].result))
            }
            LedgerCloseMeta::V2(v) => {
                let GeneralizedTransactionSet::V1(s) = &v.tx_set;
                let env = s
                    .phases
                    .iter()
                    .find_map(|p| match p {
                        TransactionPhase::V1(p) => Some(xdr(&p.execution_stages[0][0][0])),
                        TransactionPhase::V0(c) if !c.is_empty() => {
                            let TxSetComponent::TxsetCompTxsMaybeDiscountedFee(c) = &c[0];
                            c.txs.first().map(xdr)
                        }
                        TransactionPhase::V0(_) => None,
                    })
                    .unwrap();
                (env, xdr(&v.tx_processing[0].result))
            }
        };
        let env_at = find_once(&lcm, &envelope);
        let result_at = find_once(&lcm, &result);
        out.push((name, lcm, env_at, envelope.len(), result_at));
    }
    assert_eq!(out.len(), 4);
    out
}

/// One byte changed in a transaction (the last byte of its envelope: a signature byte) fails
/// on the transaction set's hash; one byte changed in a result (its transaction hash, or its
/// fee) fails on the results' hash. Each ledger is otherwise still well-formed XDR, so only
/// the content hashes can catch it.
#[test]
fn tampered_transactions_and_results_fail() {
    for (name, lcm, env_at, env_len, result_at) in tamper_targets() {
        let info = info(&lcm);
        check_content(&lcm, &info).unwrap_or_else(|e| panic!("{name}: {e}"));

        let mut bad = lcm.clone();
        bad[env_at + env_len - 1] ^= 0x01;
        decode(&bad);
        match check_content(&bad, &info) {
            Err(ContentError::TxSetHashMismatch { seq, header, .. }) => {
                assert_eq!((seq, header), (info.ledger_seq, info.tx_set_hash), "{name}")
            }
            other => panic!("{name}: transaction byte changed: {other:?}"),
        }

        // The result's transaction hash, then the low byte of its fee.
        for at in [result_at, result_at + 32 + 7] {
            let mut bad = lcm.clone();
            bad[at] ^= 0x80;
            decode(&bad);
            match check_content(&bad, &info) {
                Err(ContentError::ResultSetHashMismatch { seq, header, .. }) => {
                    assert_eq!(
                        (seq, header),
                        (info.ledger_seq, info.tx_set_result_hash),
                        "{name}"
                    )
                }
                other => panic!("{name}: result byte {at} changed: {other:?}"),
            }
        }
    }
}

#[test]
fn error_messages_name_the_hash() {
    let e = ContentError::ResultSetHashMismatch {
        seq: 85,
        header: [0xab; 32],
        computed: [0x01; 32],
    };
    assert_eq!(
        e.to_string(),
        format!(
            "ledger 85: the transaction results hash to {}, the header's txSetResultHash is {}",
            "01".repeat(32),
            "ab".repeat(32)
        )
    );
    let e = ContentError::Malformed {
        ty: "SCVal",
        offset: 1234,
        problem: Malformation::UnknownDiscriminant { tag: 99 },
    };
    assert_eq!(
        e.to_string(),
        "malformed SCVal at byte 1234: unknown discriminant 99"
    );
}

/// Every prefix of a ledger and a ledger with a byte after it are refused with a typed error.
#[test]
fn truncated_and_trailing_bytes_are_refused() {
    let ledgers = all_real_ledgers();
    for name in ["testnet 1410050", "standalone 999", "standalone v23 84"] {
        let lcm = &ledgers.iter().find(|(n, _)| n == name).unwrap().1;
        let info = info(lcm);
        for cut in info.header_end..lcm.len() {
            match content_hashes(&lcm[..cut], &info) {
                Err(ContentError::Truncated { offset, .. }) => assert!(offset <= cut),
                // A cut can leave a length or a tag that no longer fits what follows.
                Err(ContentError::Malformed { .. }) => {}
                other => panic!("{name} cut at {cut}: {other:?}"),
            }
        }
        let mut longer = lcm.clone();
        longer.push(0);
        assert_eq!(
            content_hashes(&longer, &info),
            Err(ContentError::TrailingBytes {
                end: lcm.len(),
                extra: 1
            })
        );
    }
}

/// Mutated ledgers (a 4-byte word after the header set to a value that often means something
/// in XDR: a small tag, a length, all ones) are accepted exactly when `stellar-xdr` decodes
/// them, and then with the same hashes: the walker reads the same structure as a decoder. The
/// one difference allowed: the walker refuses a bool other than 0 or 1, which `stellar-xdr`
/// reads as false.
#[test]
fn mutations_agree_with_stellar_xdr() {
    let mut rng = SmallRng::seed_from_u64(0x5EED);
    let ledgers: Vec<Vec<u8>> = all_real_ledgers()
        .into_iter()
        .filter(|(name, lcm)| {
            lcm.len() < 50_000 && (name.ends_with('0') || !name.starts_with("testnet"))
        })
        .map(|(_, lcm)| lcm)
        .collect();
    assert!(ledgers.len() >= 30, "{}", ledgers.len());
    let (mut accepted, mut refused) = (0, 0);
    for round in 0..3000 {
        let lcm = &ledgers[round % ledgers.len()];
        let info = info(lcm);
        let words = (lcm.len() - info.header_end) / 4;
        let at = info.header_end + 4 * rng.gen_range(0..words);
        let value: u32 = match rng.gen_range(0..6) {
            0 => 0,
            1 => 1,
            2 => rng.gen_range(2..24),
            3 => u32::MAX,
            4 => u32::from_be_bytes(lcm[at..at + 4].try_into().unwrap()).wrapping_add(4),
            _ => rng.gen(),
        };
        let mut m = lcm.clone();
        m[at..at + 4].copy_from_slice(&value.to_be_bytes());
        let walked = content_hashes(&m, &info);
        match LedgerCloseMeta::from_xdr(&m, Limits::none()) {
            Ok(full) => match walked {
                Ok(h) => {
                    assert_eq!(h, reference(&full), "round {round} at {at}");
                    accepted += 1;
                }
                Err(ContentError::Malformed {
                    problem: Malformation::InvalidBool { .. },
                    ..
                }) => refused += 1,
                Err(e) => panic!("round {round}: stellar-xdr decodes, walker says {e}"),
            },
            Err(_) => {
                assert!(
                    walked.is_err(),
                    "round {round}: word {at} = {value:#x}: walker accepts what stellar-xdr refuses"
                );
                refused += 1;
            }
        }
    }
    // Both outcomes are exercised.
    assert!(accepted > 300 && refused > 300, "{accepted} {refused}");
}
