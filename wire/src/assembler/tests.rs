use super::*;
use crate::chunker::ledger_chunks;
use crate::compress::Compressor;

const MS: Duration = Duration::from_millis(1);

fn ledger(seq: u32, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i as u32).wrapping_mul(seq) as u8 / 3)
            .collect::<Vec<u8>>(),
    )
}

fn pieces(seq: u32, raw: &Bytes, chunk: usize, codec: Codec) -> (Vec<Chunk>, LedgerEnd) {
    let (chunks, s) = ledger_chunks(seq, raw, chunk, &mut Compressor::new(codec, 1));
    (chunks, s.end(seq, [seq as u8; 32], [0; 32], 1, 2))
}

fn new(first: u32) -> Reassembler {
    Reassembler::new(Limits::default(), first, 100 * MS)
}

#[test]
fn delivers_in_order_whatever_the_arrival_order() {
    let mut r = new(10);
    let raws: Vec<Bytes> = (10..13).map(|s| ledger(s, 5000 + s as usize)).collect();
    let parts: Vec<_> = raws
        .iter()
        .zip(10..)
        .map(|(raw, s)| pieces(s, raw, 1000, Codec::Lz4))
        .collect();
    // Ledger 12 first, then 11, then 10, each reversed, end records first.
    for (chunks, end) in parts.iter().rev() {
        r.handle_end(end, MS).unwrap();
        for c in chunks.iter().rev() {
            r.handle_chunk(c, MS).unwrap();
        }
        if end.seq != 10 {
            assert!(r.poll_ledger().is_none(), "nothing before ledger 10");
        }
    }
    for (i, raw) in raws.iter().enumerate() {
        let l = r.poll_ledger().unwrap();
        assert_eq!(l.seq, 10 + i as u32);
        assert_eq!(&l.data, raw);
        assert_eq!(l.end.header_hash, [l.seq as u8; 32]);
    }
    assert!(r.poll_ledger().is_none());
    assert_eq!(r.held_bytes(), 0);
    assert_eq!(r.open_ledgers(), 0);
    assert_eq!(r.next_seq(), 13);
}

#[test]
fn raw_chunks_are_not_copied_until_assembly() {
    let mut r = new(1);
    let raw = ledger(1, 3000);
    let (chunks, end) = pieces(1, &raw, 1000, Codec::None);
    for c in &chunks {
        r.handle_chunk(c, MS).unwrap();
    }
    assert_eq!(r.held_bytes(), 3000);
    r.handle_end(&end, MS).unwrap();
    let l = r.poll_ledger().unwrap();
    assert_eq!(l.data, raw);
    assert_eq!(l.wire_bytes, 3000);
}

#[test]
fn identical_duplicates_are_harmless() {
    let mut r = new(1);
    let raw = ledger(1, 4000);
    let (chunks, end) = pieces(1, &raw, 1000, Codec::Zstd);
    r.handle_chunk(&chunks[0], MS).unwrap();
    r.handle_chunk(&chunks[0], MS).unwrap();
    r.handle_end(&end, MS).unwrap();
    r.handle_end(&end, MS).unwrap();
    for c in &chunks {
        r.handle_chunk(c, MS).unwrap();
    }
    assert_eq!(r.poll_ledger().unwrap().data, raw);
    // Copies arriving after delivery are stale, not errors.
    r.handle_chunk(&chunks[1], MS).unwrap();
    r.handle_end(&end, MS).unwrap();
    let s = r.stats();
    assert_eq!(s.duplicates, 3, "{s:?}");
    assert_eq!(s.stale, 2, "{s:?}");
}

#[test]
fn the_same_chunk_in_another_encoding_is_a_duplicate() {
    let mut r = new(1);
    let raw = ledger(1, 2000);
    let (lz4, end) = pieces(1, &raw, 1000, Codec::Lz4);
    let (plain, _) = pieces(1, &raw, 1000, Codec::None);
    r.handle_chunk(&lz4[0], MS).unwrap();
    r.handle_chunk(&plain[0], MS).unwrap();
    assert_eq!(r.stats().duplicates, 1);
    r.handle_chunk(&plain[1], MS).unwrap();
    r.handle_end(&end, MS).unwrap();
    assert_eq!(r.poll_ledger().unwrap().data, raw);
}

#[test]
fn conflicting_copies_are_errors_and_stop_everything() {
    let mut r = new(1);
    let raw = ledger(1, 2000);
    let (chunks, end) = pieces(1, &raw, 1000, Codec::None);
    r.handle_chunk(&chunks[0], MS).unwrap();
    let mut evil = chunks[0].clone();
    let mut p = evil.payload.to_vec();
    p[5] ^= 0xff;
    evil.payload = Bytes::from(p);
    assert_eq!(
        r.handle_chunk(&evil, MS),
        Err(AssemblyError::ConflictingChunk { seq: 1, index: 0 })
    );
    // Stopped: even valid input is refused, nothing is delivered.
    assert!(matches!(
        r.handle_chunk(&chunks[1], MS),
        Err(AssemblyError::Stopped(_))
    ));
    assert!(matches!(
        r.handle_end(&end, MS),
        Err(AssemblyError::Stopped(_))
    ));
    assert!(r.poll_ledger().is_none());
    assert_eq!(r.held_bytes(), 0);

    let mut r = new(1);
    r.handle_end(&end, MS).unwrap();
    let mut other = end;
    other.checksum ^= 1;
    assert_eq!(
        r.handle_end(&other, MS),
        Err(AssemblyError::ConflictingEnd { seq: 1 })
    );
}

#[test]
fn checksum_and_layout_are_verified() {
    let raw = ledger(1, 3000);
    let (chunks, end) = pieces(1, &raw, 1000, Codec::None);

    let mut r = new(1);
    let mut bad = end;
    bad.checksum ^= 0x10;
    r.handle_end(&bad, MS).unwrap();
    for c in &chunks[..2] {
        r.handle_chunk(c, MS).unwrap();
    }
    assert!(matches!(
        r.handle_chunk(&chunks[2], MS),
        Err(AssemblyError::ChecksumMismatch { seq: 1, .. })
    ));
    assert!(r.poll_ledger().is_none());

    // Chunks that overlap instead of tiling.
    let mut r = new(1);
    let mut moved = chunks[1].clone();
    moved.header.raw_offset = 999;
    r.handle_chunk(&chunks[0], MS).unwrap();
    r.handle_chunk(&moved, MS).unwrap();
    r.handle_chunk(&chunks[2], MS).unwrap();
    assert!(matches!(
        r.handle_end(&end, MS),
        Err(AssemblyError::Misplaced {
            seq: 1,
            index: 1,
            expected: 1000,
            got: 999
        })
    ));

    // Chunk index beyond the announced count.
    let mut r = new(1);
    r.handle_end(&end, MS).unwrap();
    let mut far = chunks[0].clone();
    far.header.index = 3;
    assert!(matches!(
        r.handle_chunk(&far, MS),
        Err(AssemblyError::IndexOutOfRange { limit: 3, .. })
    ));

    // Chunk running past the announced length.
    let mut r = new(1);
    r.handle_end(&end, MS).unwrap();
    let mut long = chunks[2].clone();
    long.header.raw_offset = 2500;
    assert!(matches!(
        r.handle_chunk(&long, MS),
        Err(AssemblyError::TooLong { .. })
    ));

    // An end record inconsistent with itself.
    let mut r = new(1);
    let mut weird = end;
    weird.chunk_count = 5000;
    assert!(matches!(
        r.handle_end(&weird, MS),
        Err(AssemblyError::LengthMismatch { .. })
    ));
}

#[test]
fn tampered_compressed_payload_is_caught() {
    let raw = ledger(1, 3000);
    let (mut chunks, end) = pieces(1, &raw, 1000, Codec::Zstd);
    let mut p = chunks[1].payload.to_vec();
    let n = p.len();
    p[n / 2] ^= 0x40;
    chunks[1].payload = Bytes::from(p);
    let mut r = new(1);
    r.handle_end(&end, MS).unwrap();
    let mut failed = false;
    for c in &chunks {
        failed |= r.handle_chunk(c, MS).is_err();
    }
    assert!(
        failed,
        "a flipped bit must fail decompression or the checksum"
    );
    assert!(r.poll_ledger().is_none());
}

#[test]
fn window_gap_and_regression() {
    let mut r = new(100);
    let raw = ledger(1, 10);
    let window = Limits::default().max_ledgers_in_flight;
    let (_, far) = pieces(100 + window, &raw, 10, Codec::None);
    assert_eq!(
        r.handle_end(&far, MS),
        Err(AssemblyError::Gap {
            next: 100,
            got: 100 + window,
            window
        })
    );

    let mut r = new(100);
    let (_, inside) = pieces(100 + window - 1, &raw, 10, Codec::None);
    r.handle_end(&inside, MS).unwrap();
    assert_eq!(
        r.open_ledgers(),
        window as usize,
        "the ledgers before it are expected too"
    );

    let mut r = new(100);
    let (_, old) = pieces(100 - window - 1, &raw, 10, Codec::None);
    assert_eq!(
        r.handle_end(&old, MS),
        Err(AssemblyError::Regression {
            next: 100,
            got: 100 - window - 1
        })
    );
    let mut r = new(100);
    let (_, recent) = pieces(99, &raw, 10, Codec::None);
    r.handle_end(&recent, MS).unwrap();
    assert_eq!(r.stats().stale, 1);
}

#[test]
fn memory_is_bounded() {
    let limits = Limits {
        max_buffered_bytes: 2500,
        ..Limits::default()
    };
    let mut r = Reassembler::new(limits, 1, 100 * MS);
    let raw = ledger(1, 3000);
    let (chunks, _) = pieces(1, &raw, 1000, Codec::None);
    r.handle_chunk(&chunks[0], MS).unwrap();
    r.handle_chunk(&chunks[1], MS).unwrap();
    assert_eq!(
        r.handle_chunk(&chunks[2], MS),
        Err(AssemblyError::BufferFull {
            held: 2000,
            incoming: 1000,
            limit: 2500
        })
    );

    let mut r = new(1);
    let mut huge = chunks[0].clone();
    huge.header.raw_offset = Limits::default().max_ledger_raw;
    assert!(matches!(
        r.handle_chunk(&huge, MS),
        Err(AssemblyError::TooLong { .. })
    ));
    let mut r = new(1);
    let mut many = chunks[0].clone();
    many.header.index = Limits::default().max_chunks_per_ledger;
    assert!(matches!(
        r.handle_chunk(&many, MS),
        Err(AssemblyError::IndexOutOfRange { .. })
    ));
}

#[test]
fn stalls_report_what_is_missing() {
    let mut r = new(1);
    let raw = ledger(1, 5000);
    let (chunks, end) = pieces(1, &raw, 1000, Codec::None);
    assert_eq!(r.poll_timeout(), None, "nothing open, nothing to wait for");
    r.handle_chunk(&chunks[0], MS).unwrap();
    r.handle_chunk(&chunks[3], 2 * MS).unwrap();
    assert_eq!(r.poll_timeout(), Some(102 * MS));
    r.handle_timeout(101 * MS);
    assert_eq!(r.poll_missing(), None, "not yet");
    r.handle_timeout(102 * MS);
    assert_eq!(
        r.poll_missing(),
        Some(Missing {
            seq: 1,
            whole: true,
            indices: vec![]
        }),
        "without the end record the chunk count is unknown"
    );
    r.handle_end(&end, 150 * MS).unwrap();
    r.handle_timeout(250 * MS);
    assert_eq!(
        r.poll_missing(),
        Some(Missing {
            seq: 1,
            whole: false,
            indices: vec![1, 2, 4]
        })
    );
    for i in [1, 2, 4] {
        r.handle_chunk(&chunks[i], 260 * MS).unwrap();
    }
    assert_eq!(r.poll_ledger().unwrap().data, raw);
    assert_eq!(r.stats().stalls, 2);
}

#[test]
fn a_ledger_of_which_nothing_arrived_is_asked_for() {
    let mut r = new(1);
    let raw = ledger(2, 100);
    let (chunks, end) = pieces(2, &raw, 1000, Codec::None);
    r.handle_chunk(&chunks[0], MS).unwrap();
    r.handle_end(&end, MS).unwrap();
    r.handle_timeout(200 * MS);
    let mut seen = Vec::new();
    while let Some(m) = r.poll_missing() {
        seen.push(m);
    }
    assert_eq!(
        seen,
        vec![Missing {
            seq: 1,
            whole: true,
            indices: vec![]
        }]
    );
}

#[test]
fn a_complete_ledger_behind_a_missing_one_sets_no_deadline() {
    let mut r = new(1);
    let raw = ledger(2, 100);
    let (chunks, end) = pieces(2, &raw, 1000, Codec::None);
    r.handle_chunk(&chunks[0], MS).unwrap();
    r.handle_end(&end, MS).unwrap();
    // Ledger 1 (nothing received) has a deadline; ledger 2 (complete) has none of its own.
    assert_eq!(r.poll_timeout(), Some(101 * MS));
    r.handle_timeout(101 * MS);
    assert_eq!(
        r.poll_timeout(),
        Some(201 * MS),
        "the deadline moves on after a report"
    );
}

#[test]
fn a_heartbeat_makes_a_wholly_lost_ledger_stall() {
    let mut r = new(5);
    r.handle_heartbeat(4, MS);
    assert_eq!(r.poll_timeout(), None, "nothing newer than delivered");
    r.handle_heartbeat(6, MS);
    assert_eq!(r.open_ledgers(), 2);
    r.handle_timeout(101 * MS);
    let seqs: Vec<u32> = std::iter::from_fn(|| r.poll_missing())
        .map(|m| m.seq)
        .collect();
    assert_eq!(seqs, vec![5, 6]);
    // Far-future announcements open no more than the window.
    let mut r = new(5);
    r.handle_heartbeat(u32::MAX, MS);
    assert_eq!(
        r.open_ledgers(),
        Limits::default().max_ledgers_in_flight as usize
    );
}

/// All prefixes handed out now, as (seq, offset, len).
fn prefixes(r: &mut Reassembler) -> Vec<(u32, u64, usize)> {
    std::iter::from_fn(|| r.poll_prefix())
        .map(|p| (p.seq, p.offset, p.data.len()))
        .collect()
}

/// Cut-through: the next ledger's bytes go out as soon as everything before them arrived, in
/// order, each once, and only for the next ledger; the rest comes with the complete ledger.
#[test]
fn prefixes_hand_out_the_next_ledger_in_order_before_it_completes() {
    let mut r = new(10);
    let raw10 = ledger(10, 5000);
    let raw11 = ledger(11, 3000);
    let (c10, e10) = pieces(10, &raw10, 1000, Codec::Lz4);
    let (c11, e11) = pieces(11, &raw11, 1000, Codec::None);
    assert_eq!(c10.len(), 5);
    // Ledger 11's first chunk: not the next ledger, nothing out.
    r.handle_chunk(&c11[0], MS).unwrap();
    assert!(prefixes(&mut r).is_empty());
    // Chunk 1 before chunk 0: nothing until 0 arrives, then both.
    r.handle_chunk(&c10[1], MS).unwrap();
    assert!(prefixes(&mut r).is_empty());
    r.handle_chunk(&c10[0], MS).unwrap();
    assert_eq!(prefixes(&mut r), vec![(10, 0, 1000), (10, 1000, 1000)]);
    r.handle_chunk(&c10[3], MS).unwrap();
    assert!(prefixes(&mut r).is_empty(), "chunk 2 is missing");
    r.handle_chunk(&c10[2], MS).unwrap();
    let got: Vec<Bytes> = std::iter::from_fn(|| r.poll_prefix())
        .map(|p| p.data)
        .collect();
    assert_eq!(got.concat(), raw10[2000..4000]);
    // The last chunk and the end complete the ledger: it is delivered whole, and its last
    // chunk is not handed out as a prefix.
    r.handle_chunk(&c10[4], MS).unwrap();
    r.handle_end(&e10, MS).unwrap();
    assert!(prefixes(&mut r).iter().all(|p| p.0 == 11));
    assert_eq!(r.poll_ledger().unwrap().data, raw10);
    // Now ledger 11 is next: its first chunk, already held, goes out, then the rest.
    let mut r2 = r;
    for c in &c11[1..] {
        r2.handle_chunk(c, MS).unwrap();
    }
    // (The first poll above may already have taken 11's first chunk.)
    let rest = prefixes(&mut r2);
    assert!(rest.iter().all(|p| p.0 == 11));
    assert_eq!(rest.last().map(|p| p.1 + p.2 as u64), Some(3000));
    r2.handle_end(&e11, MS).unwrap();
    assert_eq!(r2.poll_ledger().unwrap().data, raw11);
    assert!(r2.poll_prefix().is_none());
}

/// A chunk that does not start where the one before ended stops the prefixes there (the
/// ledger then fails as a whole); after an error nothing is handed out.
#[test]
fn prefixes_stop_at_a_misplaced_chunk_and_after_an_error() {
    let mut r = new(1);
    let raw = ledger(1, 3000);
    let (mut chunks, end) = pieces(1, &raw, 1000, Codec::None);
    chunks[1].header.raw_offset = 1500;
    r.handle_chunk(&chunks[0], MS).unwrap();
    r.handle_chunk(&chunks[1], MS).unwrap();
    assert_eq!(prefixes(&mut r), vec![(1, 0, 1000)]);
    r.handle_chunk(&chunks[2], MS).unwrap();
    assert!(
        r.poll_prefix().is_none(),
        "nothing past the misplaced chunk"
    );
    assert!(matches!(
        r.handle_end(&end, MS),
        Err(AssemblyError::Misplaced { .. })
    ));
    assert!(r.poll_prefix().is_none());
    assert!(r.poll_ledger().is_none());
}

#[test]
fn receive_only_checks_lengths_and_order_but_not_content() {
    let mut r = new(5).receive_only();
    let raws: Vec<Bytes> = (5..7).map(|s| ledger(s, 4000 + s as usize)).collect();
    for (raw, seq) in raws.iter().zip(5..) {
        let (chunks, mut end) = pieces(seq, raw, 1000, Codec::Zstd);
        // Content is not checked: a wrong checksum still delivers, without the raw bytes.
        end.checksum ^= 1;
        for c in chunks.iter().rev() {
            r.handle_chunk(c, MS).unwrap();
        }
        r.handle_end(&end, MS).unwrap();
    }
    for (raw, seq) in raws.iter().zip(5..) {
        let l = r.poll_ledger().unwrap();
        assert_eq!(
            (l.seq, l.data.len(), l.end.raw_len),
            (seq, 0, raw.len() as u64)
        );
        assert!(l.wire_bytes > 0 && l.wire_bytes < raw.len() as u64);
    }
    assert!(r.poll_prefix().is_none());
    assert_eq!(r.held_bytes(), 0);

    // Declared lengths still have to tile the ledger.
    let raw = ledger(7, 3000);
    let (mut chunks, end) = pieces(7, &raw, 1000, Codec::Zstd);
    chunks[1].header.raw_offset += 1;
    for c in &chunks {
        r.handle_chunk(c, MS).unwrap();
    }
    let e = r.handle_end(&end, MS).unwrap_err();
    assert!(
        matches!(
            e,
            AssemblyError::Misplaced {
                seq: 7,
                index: 1,
                ..
            }
        ),
        "{e:?}"
    );
}
