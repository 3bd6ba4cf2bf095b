use super::*;

fn end(seq: u32) -> LedgerEnd {
    LedgerEnd {
        seq,
        chunk_count: 3,
        raw_len: 1 << 20,
        checksum: 0x0123_4567_89ab_cdef,
        header_hash: [seq as u8; 32],
        previous_hash: [seq.wrapping_sub(1) as u8; 32],
        first_byte_ns: 11,
        last_byte_ns: 22,
    }
}

fn chunk(index: u32, raw_offset: u64, raw_len: u32, codec: Codec, len: usize) -> StoredChunk {
    StoredChunk {
        index,
        raw_offset,
        raw_len,
        codec,
        payload: Bytes::from(
            (0..len)
                .map(|i| (i * 7 + index as usize) as u8)
                .collect::<Vec<_>>(),
        ),
    }
}

/// The values (parts) of ledger `seq`'s file, in order.
fn encode_parts(seq: u32, chunks: &[StoredChunk]) -> Vec<Vec<u8>> {
    let file = encode_file(seq, chunks);
    file_parts(&file.bytes)
        .map(|v| v.map(<[u8]>::to_vec))
        .collect::<Result<_, _>>()
        .unwrap_or_default()
}

/// Reads the parts back one by one, as `read_file` does.
fn read_back(record: Record, parts: &[Vec<u8>]) -> Result<Vec<StoredChunk>, StoredError> {
    let mut r = PartReader::new(record);
    for v in parts {
        r.push(v)?;
    }
    r.finish().map(|(e, chunks)| {
        assert_eq!(e, record.end);
        chunks
    })
}

#[test]
fn seal_round_trip_and_detects_every_flipped_bit_of_a_small_value() {
    let v = seal(|b| b.extend_from_slice(b"hello ring"));
    assert_eq!(unseal(&v), Some(&b"hello ring"[..]));
    for i in 0..v.len() * 8 {
        let mut bad = v.clone();
        bad[i / 8] ^= 1 << (i % 8);
        assert_eq!(unseal(&bad), None, "bit {i}");
    }
    assert_eq!(unseal(&v[..SEAL_LEN - 1]), None);
    assert_eq!(unseal(&seal(|_| {})), Some(&[][..]));
    assert_eq!(unseal_u32(&seal_u32(7)), Some(7));
    assert_eq!(unseal_u64(&seal_u64(u64::MAX)), Some(u64::MAX));
    assert_eq!(unseal_u32(&seal_u64(7)), None, "a u32 is 4 bytes");
    assert_eq!(
        unseal_str(&seal(|b| b.extend_from_slice(b"pubnet"))),
        Some("pubnet")
    );
    assert_eq!(unseal_str(&seal(|b| b.push(0xff))), None, "not UTF-8");
}

#[test]
fn record_round_trip_keeps_the_frame_layout_of_the_end_record() {
    let r = Record {
        end: end(77),
        parts: 9,
        bytes: 123_456,
    };
    let v = r.encode();
    assert_eq!(v.len(), RECORD_LEN);
    assert_eq!(Record::decode(77, &v), Ok(r));
    // The body starts with the LedgerEnd frame's body, byte for byte: rings written before the
    // layout moved here read back unchanged.
    let frame = crate::frame::Frame::LedgerEnd(r.end).to_vec();
    assert_eq!(&v[SEAL_LEN..SEAL_LEN + LEDGER_END_LEN], &frame[5..]);
    assert_eq!(
        &v[SEAL_LEN + LEDGER_END_LEN..SEAL_LEN + LEDGER_END_LEN + 4],
        &9u32.to_be_bytes()
    );
}

#[test]
fn record_under_another_key_or_damaged_is_refused() {
    let v = Record {
        end: end(77),
        parts: 9,
        bytes: 1,
    }
    .encode();
    assert_eq!(
        Record::decode(78, &v),
        Err(StoredError::RecordKey { found: 77, key: 78 })
    );
    let mut bad = v.clone();
    bad[40] ^= 0x80;
    assert_eq!(Record::decode(77, &bad), Err(StoredError::RecordChecksum));
    // Truncated or longer, with a valid checksum over the other body.
    let body = unseal(&v).unwrap_or_default();
    for len in [0, 100, LEDGER_END_LEN, RECORD_LEN - SEAL_LEN - 1] {
        let short = seal(|b| b.extend_from_slice(&body[..len]));
        assert_eq!(
            Record::decode(77, &short),
            Err(StoredError::RecordLength { len })
        );
    }
    let long = seal(|b| {
        b.extend_from_slice(body);
        b.push(0);
    });
    assert!(matches!(
        Record::decode(77, &long),
        Err(StoredError::RecordLength { .. })
    ));
}

#[test]
fn record_keys_sort_by_sequence() {
    assert!(record_key(9) < record_key(10));
    assert!(record_key(0x00ff_ffff) < record_key(0x0100_0000));
    assert_eq!(record_seq(&record_key(0xdead_beef)), Some(0xdead_beef));
    assert_eq!(record_seq(b"c\0\0\0\x01"), None);
    assert_eq!(record_seq(b"l123"), None);
}

#[test]
fn parts_round_trip_across_part_boundaries() {
    // A raw chunk of three parts and a bit, a compressed one that fits one part, an empty
    // compressed payload, and a raw chunk of exactly one part.
    let big = PART_MAX as u32 * 3 + 5;
    let chunks = vec![
        chunk(0, 0, big, Codec::None, big as usize),
        chunk(1, u64::from(big), 1000, Codec::Zstd, 10),
        chunk(2, u64::from(big) + 1000, 10, Codec::Lz4, 0),
        chunk(
            3,
            u64::from(big) + 1010,
            PART_MAX as u32,
            Codec::None,
            PART_MAX,
        ),
    ];
    let e = LedgerEnd {
        chunk_count: 4,
        raw_len: u64::from(big) + 1010 + PART_MAX as u64,
        ..end(5)
    };
    assert_eq!(check_chunks(&e, &chunks), Ok(()));
    let parts = encode_parts(5, &chunks);
    assert_eq!(parts.len(), 4 + 1 + 1 + 1);
    for v in &parts {
        assert!(v.len() <= PART_LEN_MAX);
    }
    let stored: u64 = parts.iter().map(|v| v.len() as u64).sum();
    let record = Record {
        end: e,
        parts: parts.len() as u32,
        bytes: stored + RECORD_LEN as u64,
    };
    assert_eq!(read_back(record, &parts), Ok(chunks));
}

#[test]
fn parts_that_are_damaged_missing_or_misplaced_are_refused() {
    let chunks = vec![
        chunk(0, 0, PART_MAX as u32 + 1, Codec::None, PART_MAX + 1),
        chunk(1, PART_MAX as u64 + 1, 9, Codec::None, 9),
    ];
    let e = LedgerEnd {
        chunk_count: 2,
        raw_len: PART_MAX as u64 + 10,
        ..end(5)
    };
    let parts = encode_parts(5, &chunks);
    let record = Record {
        end: e,
        parts: 3,
        bytes: 0,
    };
    assert_eq!(read_back(record, &parts).map(|c| c.len()), Ok(2));

    let mut flipped = parts.clone();
    flipped[1][12] ^= 1;
    assert_eq!(
        read_back(record, &flipped),
        Err(StoredError::PartChecksum { part: 1 })
    );

    let mut swapped = parts.clone();
    swapped.swap(1, 2);
    assert_eq!(
        read_back(record, &swapped),
        Err(StoredError::PartKey { part: 1 })
    );

    let other = encode_parts(6, &chunks);
    assert_eq!(
        read_back(record, &other),
        Err(StoredError::PartKey { part: 0 })
    );

    assert_eq!(
        read_back(record, &parts[..2]),
        Err(StoredError::PartMissing { part: 2 })
    );
    assert_eq!(
        read_back(record, &parts[..1]),
        Err(StoredError::ChunkIncomplete { index: 0 })
    );
    // The chunk after the first one's continuation taken away: the first is cut short.
    let cut = vec![parts[0].clone(), relabel(&parts[2], 1)];
    let two = Record { parts: 2, ..record };
    assert_eq!(
        read_back(two, &cut),
        Err(StoredError::ChunkCutShort { index: 0, part: 1 })
    );
    // More parts than the record counts.
    let mut r = PartReader::new(Record { parts: 1, ..record });
    assert_eq!(r.push(&parts[0]), Ok(()));
    assert_eq!(
        r.push(&parts[1]),
        Err(StoredError::ExtraPart { part: 1, parts: 1 })
    );
    // A record that counts fewer chunks or raw bytes than the parts hold.
    let fewer = Record {
        end: LedgerEnd {
            chunk_count: 1,
            ..e
        },
        ..record
    };
    assert_eq!(
        read_back(fewer, &parts),
        Err(StoredError::ChunkCount {
            count: 2,
            expected: 1
        })
    );
    let longer = Record {
        end: LedgerEnd {
            raw_len: e.raw_len + 1,
            ..e
        },
        ..record
    };
    assert!(matches!(
        read_back(longer, &parts),
        Err(StoredError::RawLength { .. })
    ));
}

/// `value` (a part) with its body's part number changed and its checksum made good.
fn relabel(value: &[u8], part: u32) -> Vec<u8> {
    let mut body = unseal(value).unwrap_or_default().to_vec();
    body[4..8].copy_from_slice(&part.to_be_bytes());
    seal(|b| b.extend_from_slice(&body))
}

#[test]
fn a_record_that_counts_huge_parts_or_chunks_allocates_only_what_it_is_given() {
    let record = Record {
        end: LedgerEnd {
            chunk_count: u32::MAX,
            raw_len: u64::MAX,
            ..end(5)
        },
        parts: u32::MAX,
        bytes: 0,
    };
    let mut r = PartReader::new(record);
    // A chunk header claiming a 4 GiB payload, with 3 bytes of it.
    let v = seal(|b| {
        put_part_id(b, 5, 0, PART_START);
        b.extend_from_slice(&0u32.to_be_bytes());
        b.push(Codec::Zstd as u8);
        b.extend_from_slice(&0u64.to_be_bytes());
        b.extend_from_slice(&u32::MAX.to_be_bytes());
        b.extend_from_slice(&u32::MAX.to_be_bytes());
        b.extend_from_slice(&[1, 2, 3]);
    });
    assert_eq!(r.push(&v), Ok(()));
    // Found by the `stored` fuzz target: a reservation sized from the counts (3 GB).
    let reserved = r.open.as_ref().map_or(0, |o| o.payload.capacity());
    assert!(
        reserved <= RESERVE_MAX,
        "reserved {reserved} bytes for 3 given"
    );
    assert_eq!(r.remaining(), u32::MAX - 1);
    assert_eq!(r.finish(), Err(StoredError::ChunkIncomplete { index: 0 }));
}

#[test]
fn check_chunks_rejects_inconsistent_ledgers() {
    let mut e = end(5);
    e.chunk_count = 2;
    e.raw_len = 30;
    let good = [
        chunk(0, 0, 10, Codec::None, 10),
        chunk(1, 10, 20, Codec::Zstd, 5),
    ];
    assert_eq!(check_chunks(&e, &good), Ok(()));
    let cases: Vec<(&str, LedgerEnd, Vec<StoredChunk>)> = vec![
        ("count", e, vec![good[0].clone()]),
        (
            "index",
            e,
            vec![good[0].clone(), chunk(2, 10, 20, Codec::Zstd, 5)],
        ),
        (
            "offset",
            e,
            vec![good[0].clone(), chunk(1, 11, 19, Codec::Zstd, 5)],
        ),
        ("raw total", LedgerEnd { raw_len: 31, ..e }, good.to_vec()),
        (
            "raw 0",
            LedgerEnd { raw_len: 10, ..e },
            vec![good[0].clone(), chunk(1, 10, 0, Codec::Lz4, 0)],
        ),
        (
            "none len",
            e,
            vec![chunk(0, 0, 10, Codec::None, 9), good[1].clone()],
        ),
        (
            "longer",
            e,
            vec![good[0].clone(), chunk(1, 10, 20, Codec::Lz4, 21)],
        ),
    ];
    for (name, e, chunks) in cases {
        assert!(check_chunks(&e, &chunks).is_err(), "{name}");
    }
}

/// Four chunks across part boundaries (as in `parts_round_trip_across_part_boundaries`).
fn four_chunks() -> (LedgerEnd, Vec<StoredChunk>) {
    let big = PART_MAX as u32 * 2 + 5;
    let chunks = vec![
        chunk(0, 0, big, Codec::None, big as usize),
        chunk(1, u64::from(big), 1000, Codec::Zstd, 10),
        chunk(2, u64::from(big) + 1000, 10, Codec::Lz4, 0),
        chunk(3, u64::from(big) + 1010, 7, Codec::None, 7),
    ];
    let e = LedgerEnd {
        chunk_count: 4,
        raw_len: u64::from(big) + 1017,
        ..end(9)
    };
    (e, chunks)
}

#[test]
fn a_ledger_file_reads_back_and_counts_what_its_record_says() {
    let (e, chunks) = four_chunks();
    let file = encode_file(9, &chunks);
    assert_eq!(file.parts, 3 + 1 + 1 + 1);
    // The capacity was sized exactly: one allocation.
    assert_eq!(file.bytes.capacity(), file.bytes.len());
    let values = encode_parts(9, &chunks);
    let stored: u64 = values.iter().map(|v| v.len() as u64).sum::<u64>() + RECORD_LEN as u64;
    assert_eq!(file.stored, stored);
    let record = Record {
        end: e,
        parts: file.parts,
        bytes: file.stored,
    };
    assert_eq!(file_len(&record), Ok(file.bytes.len() as u64));
    assert_eq!(read_file(record, &file.bytes), Ok((e, chunks)));
}

#[test]
fn a_torn_long_or_damaged_ledger_file_is_refused() {
    let (e, chunks) = four_chunks();
    let file = encode_file(9, &chunks);
    let record = Record {
        end: e,
        parts: file.parts,
        bytes: file.stored,
    };
    let len = file.bytes.len() as u64;
    // Torn: any shorter file, and a longer one.
    for cut in [0, 1, 4, 100, file.bytes.len() - 1] {
        assert_eq!(
            read_file(record, &file.bytes[..cut]),
            Err(StoredError::FileLength {
                len: cut as u64,
                expected: len
            })
        );
    }
    let mut long = file.bytes.clone();
    long.push(0);
    assert!(matches!(
        read_file(record, &long),
        Err(StoredError::FileLength { .. })
    ));
    // A payload byte flipped: its part's checksum.
    let mut flipped = file.bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    assert_eq!(
        read_file(record, &flipped),
        Err(StoredError::PartChecksum { part: 5 })
    );
    // A length prefix that runs past the file, is 0, or is larger than any part.
    for bad in [u32::MAX, 0, PART_LEN_MAX as u32 + 1] {
        let mut b = file.bytes.clone();
        b[..4].copy_from_slice(&bad.to_be_bytes());
        assert_eq!(
            read_file(record, &b),
            Err(StoredError::PartLength {
                part: 0,
                len: u64::from(bad)
            })
        );
    }
    // Another ledger's file under this record.
    let other = encode_file(10, &chunks);
    assert_eq!(
        read_file(record, &other.bytes),
        Err(StoredError::PartKey { part: 0 })
    );
}

#[test]
fn a_record_no_file_can_match_is_refused_before_reading() {
    let (e, _) = four_chunks();
    for (bytes, parts) in [(0, 0), (RECORD_LEN as u64 - 1, 0), (RECORD_LEN as u64, 1)] {
        let record = Record {
            end: e,
            parts,
            bytes,
        };
        assert_eq!(
            read_file(record, &[]),
            Err(StoredError::RecordCounts { bytes, parts })
        );
    }
    // Counts whose file length would overflow a u64.
    let (bytes, parts) = (u64::MAX, u32::MAX);
    let record = Record {
        end: e,
        parts,
        bytes,
    };
    assert_eq!(
        read_file(record, &[0; 8]),
        Err(StoredError::RecordCounts { bytes, parts })
    );
}

#[test]
fn file_parts_stop_at_the_first_bad_length() {
    let mut parts = file_parts(&[0, 0, 0, 2, 9, 9, 0, 0]);
    assert_eq!(parts.next(), Some(Ok(&[9u8, 9][..])));
    assert_eq!(
        parts.next(),
        Some(Err(StoredError::PartLength { part: 1, len: 2 }))
    );
    assert_eq!(parts.next(), None);
}

/// A readable record of ledger `seq` whose previous hash is `previous`'s [`end`] hash.
fn rec(seq: u32, previous: u32) -> Option<Record> {
    let mut e = end(seq);
    e.previous_hash = end(previous).header_hash;
    Some(Record {
        end: e,
        parts: 3,
        bytes: 100,
    })
}

#[test]
fn a_crash_keeps_the_linked_runs_below_a_torn_tail() {
    assert_eq!(surviving(&[]), 0..0);
    assert_eq!(surviving(&[None, None]), 0..0);
    // 1-2-3 linked: all kept.
    assert_eq!(surviving(&[rec(1, 0), rec(2, 1), rec(3, 2)]), 0..3);
    // An unreadable newest record is a torn tail: skipped, the rest kept.
    assert_eq!(surviving(&[rec(1, 0), rec(2, 1), None]), 0..2);
    // A gap starts a new run: both runs kept.
    assert_eq!(surviving(&[rec(1, 0), rec(2, 1), rec(9, 8)]), 0..3);
    // 3 does not link to 2 (its previous hash is another's): 2 and older go.
    assert_eq!(
        surviving(&[rec(1, 0), rec(2, 1), rec(3, 7), rec(4, 3)]),
        2..4
    );
    // An unreadable record in the middle ends what is kept.
    assert_eq!(surviving(&[rec(1, 0), None, rec(3, 2), rec(4, 3)]), 2..4);
}

#[test]
fn a_gap_is_a_later_ledger_than_the_next() {
    assert!(!after_gap(5, 6));
    assert!(after_gap(5, 7));
    assert!(!after_gap(5, 5));
    assert!(!after_gap(u32::MAX, 0));
}
