use super::*;
use stellar_xdr::{
    Hash, LedgerCloseMeta, LedgerCloseMetaExt, LedgerCloseMetaExtV1, LedgerCloseValueSignature,
    LedgerHeader, LedgerHeaderExt, LedgerHeaderExtensionV1, LedgerHeaderExtensionV1Ext, Limits,
    NodeId, PublicKey, ReadXdr, Signature, StellarValue, StellarValueExt,
    StellarValueProposedMsValue, StellarValueProposedValue, StellarValueSignedMsValue, TimePoint,
    TimePointMs, Uint256, UpgradeType, WriteXdr,
};

fn signature(len: usize) -> LedgerCloseValueSignature {
    LedgerCloseValueSignature {
        node_id: NodeId(PublicKey::PublicKeyTypeEd25519(Uint256([0x11; 32]))),
        signature: Signature(vec![0x22; len].try_into().unwrap()),
    }
}

fn header(seq: u32, previous: [u8; 32], ext: StellarValueExt, upgrades: &[usize]) -> LedgerHeader {
    LedgerHeader {
        ledger_version: 23,
        previous_ledger_hash: Hash(previous),
        scp_value: StellarValue {
            tx_set_hash: Hash([3; 32]),
            close_time: TimePoint(1_700_000_000 + u64::from(seq)),
            upgrades: upgrades
                .iter()
                .map(|&n| UpgradeType(vec![0x33; n].try_into().unwrap()))
                .collect::<Vec<_>>()
                .try_into()
                .unwrap(),
            ext,
        },
        tx_set_result_hash: Hash([4; 32]),
        bucket_list_hash: Hash([5; 32]),
        ledger_seq: seq,
        total_coins: 1_000_000_000_000_000_000,
        fee_pool: 7,
        inflation_seq: 8,
        id_pool: 9,
        base_fee: 100,
        base_reserve: 5_000_000,
        max_tx_set_size: 1000,
        skip_list: [Hash([6; 32]), Hash([7; 32]), Hash([8; 32]), Hash([9; 32])],
        ext: LedgerHeaderExt::V0,
    }
}

/// The bytes of a `LedgerCloseMeta` up to and including its `LedgerHeader`, with union
/// tag `lcm_version` and, for v1 and v2, `ext`.
fn lcm_prefix(lcm_version: u32, ext: Option<LedgerCloseMetaExt>, h: &LedgerHeader) -> Vec<u8> {
    let header_xdr = h.to_xdr(Limits::none()).unwrap();
    let mut out = lcm_version.to_be_bytes().to_vec();
    if let Some(ext) = ext {
        out.extend(ext.to_xdr(Limits::none()).unwrap());
    }
    out.extend_from_slice(&Sha256::digest(&header_xdr));
    out.extend(header_xdr);
    out
}

fn worst_case_header() -> LedgerHeader {
    let mut h = header(
        77,
        [1; 32],
        StellarValueExt::EmptyTxSetMs(StellarValueProposedMsValue {
            close_time_ms: TimePointMs(1_700_000_000_123),
            tx_set_hash: Hash([1; 32]),
            previous_ledger_hash: Hash([2; 32]),
            previous_ledger_version: 22,
            lc_value_signature: signature(64),
        }),
        &[128; 6],
    );
    h.ext = LedgerHeaderExt::V1(LedgerHeaderExtensionV1 {
        flags: 7,
        ext: LedgerHeaderExtensionV1Ext::V0,
    });
    h
}

fn ext_v1() -> Option<LedgerCloseMetaExt> {
    Some(LedgerCloseMetaExt::V1(LedgerCloseMetaExtV1 {
        ext: stellar_xdr::ExtensionPoint::V0,
        soroban_fee_write1_kb: 11424,
    }))
}

/// Checks a synthetic prefix: it answers exactly at its end and matches the header.
fn check_prefix(bytes: &[u8], lcm_version: u32, h: &LedgerHeader) {
    let info = peek_header(bytes).unwrap().unwrap();
    assert_eq!(info.header_end, bytes.len());
    assert_eq!(info.lcm_version, lcm_version);
    assert_eq!(info.ledger_seq, h.ledger_seq);
    assert_eq!(info.previous_hash, h.previous_ledger_hash.0);
    assert_eq!(info.protocol_version, h.ledger_version);
    assert_eq!(info.close_time, h.scp_value.close_time.0);
    assert_eq!(info.tx_set_hash, h.scp_value.tx_set_hash.0);
    assert_eq!(info.tx_set_result_hash, h.tx_set_result_hash.0);
    assert_eq!(
        info.hash,
        <[u8; 32]>::from(Sha256::digest(h.to_xdr(Limits::none()).unwrap()))
    );
    for cut in 0..bytes.len() {
        assert_eq!(peek_header(&bytes[..cut]), Ok(None), "cut {cut}");
    }
    let mut longer = bytes.to_vec();
    longer.extend_from_slice(&[0xFF; 64]);
    assert_eq!(peek_header(&longer), Ok(Some(info)));
}

#[test]
fn max_header_peek_is_the_worst_case() {
    assert_eq!(MAX_HEADER_PEEK, 1356);
    let h = worst_case_header();
    let bytes = lcm_prefix(2, ext_v1(), &h);
    assert_eq!(bytes.len(), MAX_HEADER_PEEK);
    check_prefix(&bytes, 2, &h);
}

#[test]
fn every_stellar_value_ext_arm() {
    let arms = [
        StellarValueExt::Basic,
        StellarValueExt::Signed(signature(64)),
        StellarValueExt::Signed(signature(0)),
        StellarValueExt::Signed(signature(61)),
        StellarValueExt::EmptyTxSet(StellarValueProposedValue {
            tx_set_hash: Hash([1; 32]),
            previous_ledger_hash: Hash([2; 32]),
            previous_ledger_version: 22,
            lc_value_signature: signature(63),
        }),
        StellarValueExt::SignedMs(StellarValueSignedMsValue {
            close_time_ms: TimePointMs(5),
            lc_value_signature: signature(62),
        }),
    ];
    for (i, arm) in arms.into_iter().enumerate() {
        for upgrades in [&[][..], &[1], &[4, 5, 6, 7, 127, 128]] {
            let h = header(100 + i as u32, [i as u8; 32], arm.clone(), upgrades);
            check_prefix(&lcm_prefix(0, None, &h), 0, &h);
            check_prefix(&lcm_prefix(1, Some(LedgerCloseMetaExt::V0), &h), 1, &h);
            check_prefix(&lcm_prefix(2, ext_v1(), &h), 2, &h);
        }
    }
}

/// Offset of the `upgrades` count in a v0 prefix: tag, hash, version, previous, txSetHash,
/// closeTime.
const V0_UPGRADES: usize = 4 + 32 + 4 + 32 + 32 + 8;

fn malformed(bytes: &[u8]) -> (&'static str, usize, Malformation) {
    match peek_header(bytes) {
        Err(HeaderError::Malformed {
            field,
            offset,
            problem,
        }) => (field, offset, problem),
        other => panic!("expected Malformed, got {other:?}"),
    }
}

#[test]
fn rejects_schema_violations() {
    assert_eq!(
        peek_header(&[0, 0, 0, 3]),
        Err(HeaderError::UnknownVersion { tag: 3 })
    );
    assert_eq!(
        peek_header(&[0xFF, 0xFF, 0xFF, 0xFF, 0, 0]),
        Err(HeaderError::UnknownVersion { tag: u32::MAX })
    );
    assert_eq!(
        malformed(&[0, 0, 0, 1, 0, 0, 0, 2]),
        (
            "LedgerCloseMetaExt",
            4,
            Malformation::UnknownDiscriminant { tag: 2 }
        )
    );
    assert_eq!(
        malformed(&[0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 1]),
        (
            "LedgerCloseMetaExtV1.ext",
            8,
            Malformation::UnknownDiscriminant { tag: 1 }
        )
    );

    let h = header(5, [0; 32], StellarValueExt::Signed(signature(63)), &[3]);
    let good = lcm_prefix(0, None, &h);
    let patch = |at: usize, bytes: &[u8]| {
        let mut b = good.clone();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        b
    };
    assert_eq!(
        malformed(&patch(V0_UPGRADES, &7u32.to_be_bytes())),
        (
            "scpValue.upgrades",
            V0_UPGRADES,
            Malformation::TooLong { len: 7, max: 6 }
        )
    );
    assert_eq!(
        malformed(&patch(V0_UPGRADES + 4, &129u32.to_be_bytes())),
        (
            "scpValue.upgrades[]",
            V0_UPGRADES + 4,
            Malformation::TooLong { len: 129, max: 128 }
        )
    );
    // Upgrade of 3 bytes: one byte of padding after it.
    assert_eq!(
        malformed(&patch(V0_UPGRADES + 4 + 4 + 3, &[1])),
        (
            "scpValue.upgrades[]",
            V0_UPGRADES + 11,
            Malformation::NonZeroPadding
        )
    );
    let ext = V0_UPGRADES + 12;
    assert_eq!(
        malformed(&patch(ext, &5u32.to_be_bytes())),
        (
            "scpValue.ext",
            ext,
            Malformation::UnknownDiscriminant { tag: 5 }
        )
    );
    assert_eq!(
        malformed(&patch(ext + 4, &1u32.to_be_bytes())),
        (
            "lcValueSignature.nodeID",
            ext + 4,
            Malformation::UnknownDiscriminant { tag: 1 }
        )
    );
    let sig = ext + 4 + 36;
    assert_eq!(
        malformed(&patch(sig, &65u32.to_be_bytes())),
        (
            "lcValueSignature.signature",
            sig,
            Malformation::TooLong { len: 65, max: 64 }
        )
    );
    assert_eq!(
        malformed(&patch(sig + 4 + 63, &[0x80])),
        (
            "lcValueSignature.signature",
            sig + 67,
            Malformation::NonZeroPadding
        )
    );
    let header_ext = good.len() - 4;
    assert_eq!(
        malformed(&patch(header_ext, &2u32.to_be_bytes())),
        (
            "LedgerHeader.ext",
            header_ext,
            Malformation::UnknownDiscriminant { tag: 2 }
        )
    );
    // A v1 header ext whose inner ext is not 0.
    let mut v1 = header(5, [0; 32], StellarValueExt::Basic, &[]);
    v1.ext = LedgerHeaderExt::V1(LedgerHeaderExtensionV1 {
        flags: 1,
        ext: LedgerHeaderExtensionV1Ext::V0,
    });
    let mut bad = lcm_prefix(0, None, &v1);
    let at = bad.len() - 4;
    bad[at..].copy_from_slice(&1u32.to_be_bytes());
    assert_eq!(
        malformed(&bad),
        (
            "LedgerHeaderExtensionV1.ext",
            at,
            Malformation::UnknownDiscriminant { tag: 1 }
        )
    );

    // An error is reported as soon as its bytes are in, not held back for more input.
    let bad = patch(V0_UPGRADES, &7u32.to_be_bytes());
    assert!(peek_header(&bad[..V0_UPGRADES + 4]).is_err());
    assert_eq!(peek_header(&bad[..V0_UPGRADES + 3]), Ok(None));
}

#[test]
fn hash_mismatch() {
    let h = header(42, [0; 32], StellarValueExt::Basic, &[]);
    let good = lcm_prefix(1, Some(LedgerCloseMetaExt::V0), &h);
    let header_start = 8 + 32;
    // Any fixed-size byte of the header (or of the stored hash) flipped: the hash fails.
    for at in (8..header_start + 4).chain([header_start + 100, good.len() - 5]) {
        let mut bad = good.clone();
        bad[at] ^= 0x01;
        assert_eq!(
            peek_header(&bad),
            Err(HeaderError::HashMismatch { seq: 42 }),
            "at {at}"
        );
    }
}

#[test]
fn error_messages() {
    let e = HeaderError::Malformed {
        field: "scpValue.upgrades",
        offset: 120,
        problem: Malformation::TooLong { len: 7, max: 6 },
    };
    assert_eq!(
        e.to_string(),
        "malformed scpValue.upgrades at byte 120: length 7 exceeds the bound 6"
    );
    let mut got_previous = [0; 32];
    got_previous[0] = 0xab;
    let e = ChainError::BrokenChain {
        seq: 9,
        expected_previous: [0x01; 32],
        got_previous,
    };
    assert_eq!(
        e.to_string(),
        format!(
            "ledger 9 does not link to its predecessor: previous hash ab{}, expected {}",
            "00".repeat(31),
            "01".repeat(32)
        )
    );
}

fn info(seq: u32, hash: u8, previous: u8) -> LedgerHeaderInfo {
    LedgerHeaderInfo {
        lcm_version: 0,
        ledger_seq: seq,
        hash: [hash; 32],
        previous_hash: [previous; 32],
        protocol_version: 19,
        close_time: 0,
        tx_set_hash: [0; 32],
        tx_set_result_hash: [0; 32],
        header_end: 0,
    }
}

#[test]
fn chain_verifier() {
    let mut v = ChainVerifier::new();
    assert_eq!(v.last(), None);
    v.check(&info(10, 0xA, 0x9)).unwrap();
    assert_eq!(v.last(), Some((10, [0xA; 32])));
    v.check(&info(11, 0xB, 0xA)).unwrap();

    // A gap, a repeat, and a wrong link: each rejected, none advances.
    assert_eq!(
        v.check(&info(13, 0xD, 0xC)),
        Err(ChainError::UnexpectedSequence {
            expected: 12,
            got: 13
        })
    );
    assert_eq!(
        v.check(&info(11, 0xB, 0xA)),
        Err(ChainError::UnexpectedSequence {
            expected: 12,
            got: 11
        })
    );
    assert_eq!(
        v.check(&info(12, 0xC, 0xE)),
        Err(ChainError::BrokenChain {
            seq: 12,
            expected_previous: [0xB; 32],
            got_previous: [0xE; 32]
        })
    );
    assert_eq!(v.last(), Some((11, [0xB; 32])));
    v.check(&info(12, 0xC, 0xB)).unwrap();
    assert_eq!(v.last(), Some((12, [0xC; 32])));

    let mut v = ChainVerifier::starting_at(100);
    assert_eq!(
        v.check(&info(99, 1, 0)),
        Err(ChainError::UnexpectedSequence {
            expected: 100,
            got: 99
        })
    );
    assert_eq!(v.last(), None);
    v.check(&info(100, 1, 0)).unwrap();
    v.check(&info(101, 2, 1)).unwrap();

    let mut v = ChainVerifier::after(7, [7; 32]);
    assert_eq!(v.last(), Some((7, [7; 32])));
    assert!(matches!(
        v.check(&info(8, 8, 6)),
        Err(ChainError::BrokenChain { seq: 8, .. })
    ));
    v.check(&info(8, 8, 7)).unwrap();

    let mut v = ChainVerifier::after(u32::MAX, [0; 32]);
    assert_eq!(
        v.check(&info(0, 1, 0)),
        Err(ChainError::SequenceExhausted { seq: u32::MAX })
    );
}

#[test]
fn an_end_record_is_checked_by_the_same_rule_as_a_header() {
    let end = |seq: u32, hash: u8, previous: u8| LedgerEnd {
        seq,
        chunk_count: 1,
        raw_len: 1,
        checksum: 0,
        header_hash: [hash; 32],
        previous_hash: [previous; 32],
        first_byte_ns: 0,
        last_byte_ns: 0,
    };
    assert_eq!(
        ChainLink::from(&end(8, 8, 7)),
        ChainLink::from(&info(8, 8, 7))
    );
    let mut v = ChainVerifier::after(7, [7; 32]);
    assert!(matches!(
        v.check_link((&end(8, 8, 6)).into()),
        Err(ChainError::BrokenChain { seq: 8, .. })
    ));
    assert!(matches!(
        v.check_link((&end(9, 9, 8)).into()),
        Err(ChainError::UnexpectedSequence {
            expected: 8,
            got: 9
        })
    ));
    v.check_link((&end(8, 8, 7)).into()).unwrap();
    assert_eq!(v.last(), Some((8, [8; 32])));
}

#[test]
fn real_testnet_ledger_every_prefix() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/testnet/testnet-1410048-1410367.lcm-v0.framed.xdr"
    );
    let stream = std::fs::read(path).unwrap();
    let mut records = crate::record::RecordReader::new(crate::record::DEFAULT_MAX_RECORD_LEN);
    records.feed(&stream).unwrap();
    let lcm = records.next_record().unwrap();
    let info = peek_header(&lcm).unwrap().unwrap();
    assert_eq!(info.ledger_seq, 1410048);
    let upto = MAX_HEADER_PEEK.min(lcm.len());
    for cut in 0..=upto {
        match peek_header(&lcm[..cut]) {
            Ok(None) => assert!(cut < info.header_end, "cut {cut}"),
            Ok(Some(got)) => assert_eq!(got, info, "cut {cut}"),
            Err(e) => panic!("cut {cut}: {e}"),
        }
    }
    let full = LedgerCloseMeta::from_xdr(&lcm, Limits::none()).unwrap();
    let LedgerCloseMeta::V0(v0) = full else {
        panic!("testnet sample is v0");
    };
    assert_eq!(
        v0.ledger_header.header.to_xdr(Limits::none()).unwrap(),
        lcm[4 + 32..info.header_end]
    );
}
