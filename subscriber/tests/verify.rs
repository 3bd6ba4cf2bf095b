//! Layer 4 on real testnet ledgers: header against end record, and the hash chain across a
//! "reconnect".

use bytes::Bytes;
use ledger_relay_subscriber::frame::LedgerEnd;
use ledger_relay_subscriber::verify::Verifier;
use ledger_relay_subscriber::VerifyError;
use ledger_relay_wire::header::{peek_header, ChainError, HeaderError};

use crate::support::{from_another_chain, testnet_ledgers, FIRST_SEQ};

fn end_of(data: &Bytes) -> LedgerEnd {
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

#[test]
fn real_ledgers_verify_in_order() {
    let ledgers = testnet_ledgers(20);
    let mut v = Verifier::starting_at(FIRST_SEQ);
    for (i, data) in ledgers.iter().enumerate() {
        let seq = FIRST_SEQ + i as u32;
        let info = v.verify(seq, data, &end_of(data)).unwrap();
        assert_eq!(info.ledger_seq, seq);
    }
    assert_eq!(v.last().unwrap().0, FIRST_SEQ + 19);
}

#[test]
fn a_tampered_header_is_caught() {
    let ledgers = testnet_ledgers(1);
    let end = end_of(&ledgers[0]);
    let mut data = ledgers[0].to_vec();
    // A byte inside the LedgerHeader (its ledgerVersion): the stored hash no longer matches.
    data[38] ^= 1;
    let mut v = Verifier::starting_at(FIRST_SEQ);
    let err = v.verify(FIRST_SEQ, &data, &end).unwrap_err();
    assert!(
        matches!(
            err,
            VerifyError::Header {
                source: HeaderError::HashMismatch { .. },
                ..
            }
        ),
        "{err:?}"
    );
    // The verifier did not move: the real ledger still verifies.
    v.verify(FIRST_SEQ, &ledgers[0], &end).unwrap();
}

#[test]
fn end_records_must_match_the_header() {
    let ledgers = testnet_ledgers(1);
    let data = &ledgers[0];
    let mut v = Verifier::new();

    let mut end = end_of(data);
    end.header_hash[0] ^= 1;
    assert!(matches!(
        v.verify(FIRST_SEQ, data, &end).unwrap_err(),
        VerifyError::HashMismatch { seq: FIRST_SEQ, .. }
    ));

    let mut end = end_of(data);
    end.previous_hash[31] ^= 1;
    assert!(matches!(
        v.verify(FIRST_SEQ, data, &end).unwrap_err(),
        VerifyError::PreviousHashMismatch { .. }
    ));

    // Sent as another sequence than its header says.
    let mut end = end_of(data);
    end.seq = FIRST_SEQ + 1;
    assert!(matches!(
        v.verify(FIRST_SEQ + 1, data, &end).unwrap_err(),
        VerifyError::SequenceMismatch {
            seq,
            header_seq: FIRST_SEQ
        } if seq == FIRST_SEQ + 1
    ));

    // Too short for a header.
    assert!(matches!(
        v.verify(FIRST_SEQ, &data[..100], &end_of(data))
            .unwrap_err(),
        VerifyError::Truncated { len: 100, .. }
    ));
}

#[test]
fn the_chain_is_checked_across_a_reconnect() {
    let ledgers = testnet_ledgers(8);
    let mut first = Verifier::starting_at(FIRST_SEQ);
    for (i, data) in ledgers[..5].iter().enumerate() {
        first
            .verify(FIRST_SEQ + i as u32, data, &end_of(data))
            .unwrap();
    }
    let (last_seq, last_hash) = first.last().unwrap();
    assert_eq!(last_seq, FIRST_SEQ + 4);

    // A new session (maybe another relay) resumes after the last delivered ledger.
    let mut resumed = Verifier::after(last_seq, last_hash);
    let next = &ledgers[5];
    resumed
        .clone()
        .verify(FIRST_SEQ + 5, next, &end_of(next))
        .unwrap();

    // The other relay serves a self-consistent ledger from another chain: caught.
    let foreign = from_another_chain(next);
    let err = resumed
        .verify(FIRST_SEQ + 5, &foreign, &end_of(&foreign))
        .unwrap_err();
    assert!(
        matches!(
            err,
            VerifyError::Chain(ChainError::BrokenChain { seq, .. }) if seq == FIRST_SEQ + 5
        ),
        "{err:?}"
    );

    // Or skips a ledger: caught.
    let skipped = &ledgers[6];
    assert!(matches!(
        resumed
            .verify(FIRST_SEQ + 6, skipped, &end_of(skipped))
            .unwrap_err(),
        VerifyError::Chain(ChainError::UnexpectedSequence { .. })
    ));

    // Or a wrong hash was carried over: the real next ledger does not link.
    let mut wrong = Verifier::after(last_seq, [0u8; 32]);
    assert!(matches!(
        wrong
            .verify(FIRST_SEQ + 5, next, &end_of(next))
            .unwrap_err(),
        VerifyError::Chain(ChainError::BrokenChain { .. })
    ));
}
