//! Unit tests of the ring's sizing and of what `append` accepts (the stored encodings are tested
//! in `ledger_relay_wire::stored`, the ring itself in `relay/tests/ring.rs`).

use bytes::Bytes;
use ledger_relay_wire::compress::Codec;
use ledger_relay_wire::frame::LedgerEnd;
use ledger_relay_wire::stored::PART_LEN_MAX;

use super::*;

#[test]
fn largest_leaf_image_stays_below_the_blob_threshold() {
    // sled splits a leaf above 16 entries; its blob threshold is segment_size / 4 minus the
    // segment and message headers (20 + 32 bytes).
    let largest_leaf = 17 * (PART_LEN_MAX + 9 + 16);
    assert!(largest_leaf < SEGMENT_SIZE / 4 - 52, "{largest_leaf}");
}

/// `append` refuses sequence 0 and, as [`RingError::BadRecord`], any ledger whose chunks do not
/// tile it (the tiling rule's own cases are `check_chunks_rejects_inconsistent_ledgers` in
/// `ledger_relay_wire::stored`).
#[test]
fn validate_rejects_inconsistent_ledgers() {
    let chunk = |index, raw_offset, raw_len| StoredChunk {
        index,
        raw_offset,
        raw_len,
        codec: Codec::None,
        payload: Bytes::from(vec![7u8; raw_len as usize]),
    };
    let e = LedgerEnd {
        seq: 5,
        chunk_count: 2,
        raw_len: 30,
        header_hash: [5; 32],
        previous_hash: [4; 32],
        ..LedgerEnd::default()
    };
    let good = [chunk(0, 0, 10), chunk(1, 10, 20)];
    assert!(validate(&e, &good).is_ok());
    let cases: Vec<(&str, LedgerEnd, Vec<StoredChunk>)> = vec![
        ("count", e, vec![good[0].clone()]),
        ("offset", e, vec![good[0].clone(), chunk(1, 11, 19)]),
        ("seq 0", LedgerEnd { seq: 0, ..e }, good.to_vec()),
    ];
    for (name, e, chunks) in cases {
        assert!(
            matches!(validate(&e, &chunks), Err(RingError::BadRecord { .. })),
            "{name}"
        );
    }
}
