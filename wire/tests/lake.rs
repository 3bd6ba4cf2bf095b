//! The SEP-54 batch codec on real ledgers: Galexie's own objects decode at their keys, the
//! 320 testnet ledgers round-trip byte for byte through batches of several sizes, and every
//! kind of damage (truncation, corruption, a wrong range, count, key, sequence or chain, a
//! ledger too long, nesting too deep, a changed transaction or result) is refused with its own
//! error.

use std::fs::File;

use bytes::Bytes;
use ledger_relay_wire::content::ContentError;
use ledger_relay_wire::header::peek_header;
use ledger_relay_wire::lake::{
    compress_object, decode_batch, decompress_object, encode_batch, parse_batch_name, read_object,
    Batch, BatchError, BatchLimits, Schema, XDR_DEPTH,
};
use ledger_relay_wire::record::{open_stream, Records, DEFAULT_MAX_RECORD_LEN};
use sha2::{Digest, Sha256};
use stellar_xdr::{LedgerCloseMeta, Limits, ReadXdr, WriteXdr};

const TESTDATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata");

fn testnet() -> Vec<Vec<u8>> {
    let path = format!("{TESTDATA}/testnet/testnet-1410048-1410367.lcm-v0.framed.xdr");
    let stream = open_stream(File::open(&path).unwrap()).unwrap();
    Records::new(stream, DEFAULT_MAX_RECORD_LEN)
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

const FIRST: u32 = 1_410_048;

fn object(path: &str) -> Vec<u8> {
    std::fs::read(format!("{TESTDATA}/{path}")).unwrap()
}

/// Reads an object of `testdata` at the key its file name gives.
fn read_named(path: &str) -> Batch {
    let name = path.rsplit('/').next().unwrap();
    // The samples were named by an older Galexie: `.xdr.zstd`.
    let parsed = parse_batch_name(name).unwrap();
    read_object(
        &object(path),
        parsed.first,
        parsed.last,
        &BatchLimits::default(),
    )
    .unwrap()
}

#[test]
fn galexie_objects_decode_at_their_keys_and_chain() {
    let mut prev: Option<[u8; 32]> = None;
    for seq in 997..=999u32 {
        let name = Schema::new(1, 1)
            .unwrap()
            .with_extension(ledger_relay_wire::lake::Extension::Zstd)
            .object_key(seq);
        let batch = read_named(&format!("standalone/galexie-testbucket/{name}"));
        assert_eq!((batch.start, batch.end, batch.ledgers.len()), (seq, seq, 1));
        let l = &batch.ledgers[0];
        assert_eq!(l.info.ledger_seq, seq);
        if let Some(p) = prev {
            assert_eq!(l.info.previous_hash, p, "{seq} links to {}", seq - 1);
        }
        prev = Some(l.info.hash);
        // The bytes handed out are the stored bytes, and a full decode agrees.
        let lcm = LedgerCloseMeta::from_xdr(&l.raw, Limits::none()).unwrap();
        assert_eq!(lcm.to_xdr(Limits::none()).unwrap(), l.raw);
    }
    let batch = read_named("pubnet/FCD285FF--53312000.xdr.zstd");
    assert_eq!(batch.ledgers[0].info.ledger_seq, 53_312_000);
    assert_eq!(batch.ledgers[0].info.lcm_version, 1);
}

#[test]
fn testnet_ledgers_round_trip_through_batches_of_every_size() {
    let ledgers = testnet();
    assert_eq!(ledgers.len(), 320);
    for per_batch in [1u32, 2, 7, 64, 320] {
        let schema = Schema::new(per_batch, 4).unwrap();
        let mut back: Vec<Bytes> = Vec::new();
        let mut seq = FIRST;
        while seq < FIRST + 320 {
            let (first, last) = schema.batch_range(seq);
            // The relay's first batch may start inside its range, as Galexie's starts at 2.
            let last = last.min(FIRST + 319);
            let slice: Vec<&[u8]> = (seq..=last)
                .map(|s| &ledgers[(s - FIRST) as usize][..])
                .collect();
            let obj = compress_object(&encode_batch(seq, last, &slice), 3).unwrap();
            if last == schema.batch_range(seq).1 {
                let batch = read_object(&obj, first, last, &BatchLimits::default()).unwrap();
                assert_eq!((batch.start, batch.end), (seq, last));
                back.extend(batch.ledgers.into_iter().map(|l| l.raw));
            } else {
                // A trailing partial batch (the last of the sample) is read at its own range.
                let batch = decode_batch(
                    Bytes::from(decompress_object(&obj, &BatchLimits::default()).unwrap()),
                    &BatchLimits::default(),
                )
                .unwrap();
                back.extend(batch.ledgers.into_iter().map(|l| l.raw));
            }
            seq = last + 1;
        }
        assert_eq!(back.len(), 320, "{per_batch} per batch");
        for (i, (a, b)) in ledgers.iter().zip(&back).enumerate() {
            assert!(a[..] == b[..], "{per_batch} per batch: ledger {i} differs");
        }
    }
}

fn batch_xdr(ledgers: &[Vec<u8>], from: usize, n: usize) -> Vec<u8> {
    let slice: Vec<&[u8]> = ledgers[from..from + n].iter().map(|l| &l[..]).collect();
    let start = FIRST + from as u32;
    encode_batch(start, start + n as u32 - 1, &slice)
}

#[test]
fn every_truncation_is_refused() {
    let ledgers = testnet();
    let xdr = batch_xdr(&ledgers, 0, 3);
    let limits = BatchLimits::default();
    // Every prefix of the XDR: a whole number of ledgers short of the count is truncated too.
    for cut in 0..xdr.len() {
        let e = decode_batch(Bytes::copy_from_slice(&xdr[..cut]), &limits).unwrap_err();
        assert!(e.is_truncated(), "cut at {cut}: {e}");
    }
    // Every prefix of the object: truncated or not zstd, never a batch.
    let obj = compress_object(&xdr, 3).unwrap();
    for cut in 0..obj.len() {
        match read_object(&obj[..cut], FIRST, FIRST + 2, &limits) {
            Err(BatchError::Truncated { .. }) | Err(BatchError::Zstd { .. }) => {}
            other => panic!("cut at {cut} of {}: {other:?}", obj.len()),
        }
    }
}

/// A lake is not trusted to hold what the network closed: a ledger whose first transaction
/// has a byte changed (in its signature) or whose first result has (the transaction hash it is
/// for), well-formed and with its header untouched, is refused with the content error naming
/// it, and nothing of its batch is handed out.
#[test]
fn a_changed_transaction_or_result_is_refused() {
    let ledgers = testnet();
    let limits = BatchLimits::default();
    let lcm = LedgerCloseMeta::from_xdr(&ledgers[1], Limits::none()).unwrap();
    let LedgerCloseMeta::V0(v0) = lcm else {
        panic!("the testnet sample is v0")
    };
    let envelope = v0.tx_set.txs[0].to_xdr(Limits::none()).unwrap();
    let result = v0.tx_processing[0].result.to_xdr(Limits::none()).unwrap();
    let changed = |needle: &[u8], last: bool| {
        let at = ledgers[1]
            .windows(needle.len())
            .position(|w| w == needle)
            .unwrap();
        let mut three = ledgers[..3].to_vec();
        three[1][if last { at + needle.len() - 1 } else { at }] ^= 0x01;
        encode_batch(FIRST, FIRST + 2, &three)
    };
    let tx = changed(&envelope, true);
    match decode_batch(Bytes::from(tx.clone()), &limits) {
        Err(BatchError::Content {
            index: 1,
            seq,
            error: ContentError::TxSetHashMismatch { .. },
        }) => assert_eq!(seq, FIRST + 1),
        other => panic!("{other:?}"),
    }
    let obj = compress_object(&tx, 3).unwrap();
    let e = read_object(&obj, FIRST, FIRST + 2, &limits).unwrap_err();
    assert!(e.to_string().contains("txSetHash"), "{e}");
    let res = changed(&result, false);
    assert!(matches!(
        decode_batch(Bytes::from(res), &limits),
        Err(BatchError::Content {
            index: 1,
            error: ContentError::ResultSetHashMismatch { .. },
            ..
        })
    ));
}

#[test]
fn damage_is_refused_with_its_own_error() {
    let ledgers = testnet();
    let limits = BatchLimits::default();
    let xdr = batch_xdr(&ledgers, 0, 2);
    let decode = |bytes: Vec<u8>| decode_batch(Bytes::from(bytes), &limits);

    // A bit flipped anywhere in a compressed object: the frame checksum catches it.
    let obj = compress_object(&xdr, 3).unwrap();
    for at in (0..obj.len()).step_by(97) {
        let mut bad = obj.clone();
        bad[at] ^= 0x10;
        assert!(
            read_object(&bad, FIRST, FIRST + 1, &limits).is_err(),
            "flip at {at}"
        );
    }
    // A bit flipped in a header: its hash no longer matches.
    let mut bad = xdr.clone();
    bad[12 + 4 + 32 + 40] ^= 1;
    assert!(matches!(
        decode(bad),
        Err(BatchError::Header { index: 0, .. })
    ));
    // Reversed range, a count that does not match the range, too many ledgers.
    let mut bad = xdr.clone();
    bad[4..8].copy_from_slice(&(FIRST - 1).to_be_bytes());
    assert!(matches!(decode(bad), Err(BatchError::BadRange { .. })));
    let mut bad = xdr.clone();
    bad[8..12].copy_from_slice(&3u32.to_be_bytes());
    assert!(matches!(
        decode(bad),
        Err(BatchError::CountMismatch { count: 3, .. })
    ));
    let small = BatchLimits {
        max_ledgers: 1,
        ..BatchLimits::default()
    };
    assert!(matches!(
        decode_batch(Bytes::from(xdr.clone()), &small),
        Err(BatchError::TooManyLedgers { count: 2, max: 1 })
    ));
    // Bytes after the last ledger.
    let mut bad = xdr.clone();
    bad.extend_from_slice(&[0, 0, 0, 0]);
    assert_eq!(decode(bad), Err(BatchError::TrailingBytes { len: 4 }));
    // The ledgers are not the sequences the range claims.
    let mut bad = xdr.clone();
    bad[0..4].copy_from_slice(&(FIRST + 5).to_be_bytes());
    bad[4..8].copy_from_slice(&(FIRST + 6).to_be_bytes());
    assert_eq!(
        decode(bad),
        Err(BatchError::Sequence {
            index: 0,
            expected: FIRST + 5,
            got: FIRST
        })
    );
    // Read at another batch's key.
    let obj = compress_object(&xdr, 1).unwrap();
    assert!(matches!(
        read_object(&obj, FIRST + 2, FIRST + 3, &limits),
        Err(BatchError::WrongKey { .. })
    ));
    // A ledger longer than allowed; an object or a decompressed batch larger than allowed.
    let tight = BatchLimits {
        max_ledger: 1000,
        ..BatchLimits::default()
    };
    assert!(matches!(
        decode_batch(Bytes::from(xdr.clone()), &tight),
        Err(BatchError::LedgerTooLarge {
            index: 0,
            max: 1000
        })
    ));
    let tight = BatchLimits {
        max_object: 100,
        ..BatchLimits::default()
    };
    assert!(matches!(
        decompress_object(&obj, &tight),
        Err(BatchError::ObjectTooLarge { max: 100, .. })
    ));
    let tight = BatchLimits {
        max_raw: 5000,
        ..BatchLimits::default()
    };
    assert_eq!(
        decompress_object(&obj, &tight),
        Err(BatchError::RawTooLarge { max: 5000 })
    );
    // Not zstd at all.
    assert!(matches!(
        decompress_object(b"definitely not zstd", &limits),
        Err(BatchError::Zstd { .. })
    ));
}

#[test]
fn a_ledger_that_does_not_link_to_the_one_before_is_refused() {
    let ledgers = testnet();
    // Ledger 1410049 with another previous hash and a recomputed, valid header hash.
    let mut lcm = LedgerCloseMeta::from_xdr(&ledgers[1], Limits::none()).unwrap();
    let LedgerCloseMeta::V0(v0) = &mut lcm else {
        panic!("the testnet sample is v0")
    };
    v0.ledger_header.header.previous_ledger_hash.0[0] ^= 1;
    let header = v0.ledger_header.header.to_xdr(Limits::none()).unwrap();
    v0.ledger_header.hash.0 = Sha256::digest(&header).into();
    let forged = lcm.to_xdr(Limits::none()).unwrap();
    assert!(
        peek_header(&forged).unwrap().is_some(),
        "the forged header is valid on its own"
    );
    let xdr = encode_batch(FIRST, FIRST + 1, &[&ledgers[0][..], &forged[..]]);
    assert_eq!(
        decode_batch(Bytes::from(xdr), &BatchLimits::default()),
        Err(BatchError::BrokenChain {
            seq: FIRST + 1,
            prev: FIRST
        })
    );
}

/// A `LedgerCloseMeta` v0 whose one transaction's Soroban return value is an `SCVal` vector
/// nested `depth` times. The nesting is spliced in as bytes: encoding it with `stellar-xdr`
/// would recurse as deep as the decoder under test.
fn deeply_nested(template: &[u8], depth: usize) -> Vec<u8> {
    use stellar_xdr::{
        ScVal, SorobanTransactionMeta, SorobanTransactionMetaExt, TransactionMeta,
        TransactionMetaV3, TransactionResultMeta,
    };
    const MARK: u32 = 0xDEAD_BEEF;
    let mut lcm = LedgerCloseMeta::from_xdr(template, Limits::none()).unwrap();
    let LedgerCloseMeta::V0(v0) = &mut lcm else {
        panic!("the testnet sample is v0")
    };
    let meta = TransactionMeta::V3(TransactionMetaV3 {
        ext: stellar_xdr::ExtensionPoint::V0,
        tx_changes_before: Default::default(),
        operations: Default::default(),
        tx_changes_after: Default::default(),
        soroban_meta: Some(SorobanTransactionMeta {
            ext: SorobanTransactionMetaExt::V0,
            events: Default::default(),
            return_value: ScVal::U32(MARK),
            diagnostic_events: Default::default(),
        }),
    });
    let mut processing: Vec<TransactionResultMeta> = v0.tx_processing.to_vec();
    processing.truncate(1);
    processing[0].tx_apply_processing = meta;
    v0.tx_processing = processing.try_into().unwrap();
    let plain = lcm.to_xdr(Limits::none()).unwrap();
    // SCV_U32 (3) and the mark.
    let needle = [0, 0, 0, 3, 0xDE, 0xAD, 0xBE, 0xEF];
    let at = plain.windows(8).position(|w| w == needle).unwrap();
    let mut out = plain[..at].to_vec();
    for _ in 0..depth {
        // SCV_VEC (16), the optional vector present, one element.
        out.extend_from_slice(&[0, 0, 0, 16, 0, 0, 0, 1, 0, 0, 0, 1]);
    }
    out.extend_from_slice(&needle);
    out.extend_from_slice(&plain[at + 8..]);
    out
}

#[test]
fn nesting_is_bounded_by_the_depth_budget_on_a_small_stack() {
    let ledgers = testnet();
    // A ledger with transactions, to borrow a TransactionResultMeta from.
    let template = ledgers
        .iter()
        .find(
            |l| match LedgerCloseMeta::from_xdr(l, Limits::none()).unwrap() {
                LedgerCloseMeta::V0(v0) => !v0.tx_processing.is_empty(),
                _ => false,
            },
        )
        .unwrap()
        .clone();
    let seq = peek_header(&template).unwrap().unwrap().ledger_seq;
    let run = move |depth: usize| {
        let lcm = deeply_nested(&template, depth);
        let xdr = encode_batch(seq, seq, &[&lcm[..]]);
        // The stack of a tokio blocking thread, where the lake reader decodes.
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || decode_batch(Bytes::from(xdr), &BatchLimits::default()).map(|_| ()))
            .unwrap()
            .join()
            .expect("decoding must not overflow the stack")
    };
    // Legal nesting well inside the budget decodes; past the budget it is an error, not a crash.
    // Soroban's own limit on SCVal nesting is 100. (The made-up ledger's results no longer hash
    // to its header's: the content check, which runs once the ledger has decoded, refuses it.)
    match run(100) {
        Err(BatchError::Content { .. }) => {}
        other => panic!("decoded, then refused for its content: {other:?}"),
    }
    match run(XDR_DEPTH as usize * 4) {
        Err(BatchError::Xdr { reason, .. }) => assert!(reason.contains("depth"), "{reason}"),
        other => panic!("{other:?}"),
    }
}
