//! Fuzz bodies. The targets in `fuzz/` are one-line calls to these functions, and `cargo test`
//! runs each once (and proptest runs them on random input), so a broken harness fails the
//! ordinary test suite.
//!
//! Each body asserts the properties that must hold for any input: no panic, bounded memory,
//! and the decoders' own invariants (a decoded frame re-encodes to the same bytes; a delivered
//! ledger is exactly the one that was sent).

use std::time::Duration;

use bytes::Bytes;

use crate::assembler::Reassembler;
use crate::chunker::ledger_chunks;
use crate::compress::{Codec, Compressor};
use crate::frame::{self, Frame, FrameDecoder};
use crate::lake::{self, BatchLimits, Manifest, Schema};
use crate::limits::Limits;
use crate::record::{RecordReader, DEFAULT_MAX_RECORD_LEN};

mod sender;

fn small_limits() -> Limits {
    Limits {
        max_record_len: 1 << 16,
        max_control_body: 4096,
        max_chunk_raw: 1024,
        max_ledger_raw: 1 << 16,
        max_chunks_per_ledger: 64,
        max_ledgers_in_flight: 4,
        max_buffered_bytes: 1 << 14,
        max_unassembled_bytes: 1 << 14,
        max_message_len: 256,
        max_core_request: 2048,
        max_core_response: 8192,
    }
}

/// Frame decoding: arbitrary bytes through the incremental decoder (fed in two pieces split at a
/// point the input chooses) and through the one-frame decoder. Every frame decoded re-encodes to
/// exactly the bytes it came from, and the decoder never holds more than one frame plus a piece.
pub fn frames(data: &[u8]) {
    let limits = small_limits();
    let decoded = frame::decode_exact(Bytes::copy_from_slice(data), &limits);
    data_head_agrees(data, decoded.as_ref().ok(), &limits);
    let split = data.first().map_or(0, |b| *b as usize).min(data.len());
    let mut d = FrameDecoder::new(limits.clone());
    let mut consumed = 0usize;
    'outer: for piece in [&data[..split], &data[split..]] {
        if d.feed(piece).is_err() {
            break;
        }
        loop {
            let before = d.buffered();
            match d.poll() {
                Ok(Some(f)) => {
                    let enc = f.to_vec();
                    let used = before - d.buffered();
                    assert_eq!(enc.len(), used, "re-encoding changes the length of {f:?}");
                    assert_eq!(&data[consumed..consumed + used], &enc[..]);
                    consumed += used;
                }
                Ok(None) => break,
                Err(_) => break 'outer,
            }
        }
        assert!(d.buffered() <= limits.max_frame_len() + piece.len());
    }
}

/// What a data stream's first bytes say its frame costs agrees with the frame itself: a frame
/// that decodes is told whole from its first [`frame::DATA_HEAD_LEN`] bytes, with its length,
/// and never costs more than the limits allow.
fn data_head_agrees(data: &[u8], decoded: Option<&Frame>, limits: &Limits) {
    let head = &data[..data.len().min(frame::DATA_HEAD_LEN)];
    let Ok(Some(h)) = frame::data_head(head, limits) else {
        assert!(
            decoded.is_none(),
            "a frame decodes but its head does not: {decoded:?}"
        );
        return;
    };
    assert!(h.frame_len <= limits.max_frame_len());
    assert!(h.held <= (limits.max_frame_len() + limits.max_chunk_raw as usize) as u64);
    if let Some(f) = decoded {
        assert_eq!(h.frame_len, data.len());
        assert_eq!(h.frame_type, f.frame_type());
    }
}

/// Record marking: arbitrary bytes fed in pieces whose sizes come from the input. Records come
/// out only whole; the reader never buffers more than the input it was given.
pub fn records(data: &[u8]) {
    let mut r = RecordReader::new(1 << 16);
    let mut fed = 0usize;
    let mut taken = 0usize;
    let step = data.first().map_or(1, |b| (*b as usize % 64) + 1);
    for piece in data.chunks(step) {
        if r.feed(piece).is_err() {
            return;
        }
        fed += piece.len();
        while let Some(rec) = r.next_record() {
            assert!(!rec.is_empty() && rec.len() <= 1 << 16);
            taken += rec.len() + 4;
            assert!(taken <= fed);
        }
    }
    let _ = r.finish();
    let mut big = RecordReader::new(DEFAULT_MAX_RECORD_LEN);
    let _ = big.feed(data);
    while big.next_record().is_some() {}
}

/// Header peek: never panics; an answer never claims bytes beyond the input, and every longer
/// input with the same prefix gives the same answer.
pub fn header(data: &[u8]) {
    if let Ok(Some(info)) = crate::header::peek_header(data) {
        assert!(info.header_end <= data.len());
        let mut longer = data.to_vec();
        longer.extend_from_slice(&[0xAB; 8]);
        assert_eq!(crate::header::peek_header(&longer), Ok(Some(info)));
    }
}

/// stellar-core requests: arbitrary bytes as a request target and as a query-server form.
/// Classifying never panics; a form's `ledgerSeq` survives pinning another form to it; a
/// `CoreRequest` or `CoreResponse` built from the bytes decodes back to itself or is refused
/// with a typed error.
pub fn core_http(data: &[u8]) {
    use crate::core_http::{
        form_ledger_seq, pin_ledger_seq, CorePort, Endpoint, HttpMethod, LedgerSeqParam,
    };
    let text = String::from_utf8_lossy(data);
    for port in [CorePort::Command, CorePort::Query] {
        for method in [HttpMethod::Get, HttpMethod::Post] {
            let _ = Endpoint::classify(port, method, &text);
        }
    }
    let seq = data.len() as u32;
    if let LedgerSeqParam::Absent = form_ledger_seq(data) {
        let pinned = pin_ledger_seq(data, seq);
        assert_eq!(
            form_ledger_seq(&pinned),
            LedgerSeqParam::Seq(seq),
            "pinning a form without ledgerSeq must name {seq}"
        );
    }
    let limits = small_limits();
    for ty in [0x40u8, 0x41] {
        let mut framed = vec![ty];
        framed.extend_from_slice(&(data.len() as u32).to_be_bytes());
        framed.extend_from_slice(data);
        if let Ok(f) = frame::decode_exact(Bytes::from(framed.clone()), &limits) {
            assert_eq!(f.to_vec(), framed, "re-encoding changes {f:?}");
        }
    }
}

/// Content check: never panics, and is consistent. A whole ledger whose header checks out
/// (mutations of real ledgers below their header keep it valid) is walked from its header; any
/// other input is taken as the bytes after a header, of the `LedgerCloseMeta` version its first
/// byte names (a fuzzer cannot forge a header's sha256). An input that walks to the end is the
/// only one of its prefixes that does (XDR is self-delimiting), hashes no more bytes than it
/// has, and a byte appended to it is refused.
pub fn content(data: &[u8]) {
    use crate::content::{check_content, content_hashes, ContentError};
    use crate::header::peek_header;

    let (body, info) = match peek_header(data) {
        Ok(Some(info)) => (data, info),
        _ => {
            let Some((&version, body)) = data.split_first() else {
                return;
            };
            (body, bare_header(u32::from(version % 3)))
        }
    };
    let walked = content_hashes(body, &info);
    // Comparing with the header is the walk plus two comparisons: same outcome for the walk.
    match (&walked, check_content(body, &info)) {
        (Ok(h), Ok(c)) => assert_eq!(*h, c),
        (Ok(h), Err(ContentError::TxSetHashMismatch { computed, .. })) => {
            assert_eq!(computed, h.tx_set_hash)
        }
        (Ok(h), Err(ContentError::ResultSetHashMismatch { computed, .. })) => {
            assert_eq!(computed, h.tx_set_result_hash)
        }
        (Err(a), Err(b)) => assert_eq!(*a, b),
        (a, b) => panic!("walk {a:?} but check {b:?}"),
    }
    if let Ok(h) = walked {
        assert!(h.hashed_bytes <= body.len() as u64 + 4);
        if body.len() > info.header_end {
            assert!(content_hashes(&body[..body.len() - 1], &info).is_err());
        }
        let mut longer = body.to_vec();
        longer.push(0);
        assert!(matches!(
            content_hashes(&longer, &info),
            Err(ContentError::TrailingBytes { .. })
        ));
    }
}

/// A header of a `LedgerCloseMeta` of `version` that ends where the input starts.
fn bare_header(version: u32) -> crate::header::LedgerHeaderInfo {
    crate::header::LedgerHeaderInfo {
        lcm_version: version,
        ledger_seq: 1,
        hash: [0; 32],
        previous_hash: [0; 32],
        protocol_version: 23,
        close_time: 0,
        tx_set_hash: [0; 32],
        tx_set_result_hash: [0; 32],
        header_end: 0,
    }
}

/// Reassembler operation sequences: four small ledgers, chunked and compressed, delivered to a
/// reassembler in the order, with the duplications, drops, tampering and time steps the input
/// chooses, plus arbitrary frames decoded from the input. Whatever happens, held memory stays
/// within the limits, ledgers come out in sequence order, every ledger delivered is
/// byte-identical to the one sent, and prefixes (cut-through) are of the next ledger only,
/// contiguous from its start and within the ledger bound.
pub fn reassembler(data: &[u8]) {
    let limits = small_limits();
    let first_seq = 100;
    let ledgers: Vec<Bytes> = (0..4u8)
        .map(|i| {
            let len = 1 + (i as usize * 797) % 3000;
            Bytes::from(
                (0..len)
                    .map(|j| (j as u8 / 7).wrapping_mul(i + 1))
                    .collect::<Vec<u8>>(),
            )
        })
        .collect();
    let mut pieces: Vec<Frame> = Vec::new();
    let mut comp = Compressor::new(Codec::Lz4, 1);
    for (i, raw) in ledgers.iter().enumerate() {
        let seq = first_seq + i as u32;
        let (chunks, summary) = ledger_chunks(seq, raw, 512, &mut comp);
        pieces.extend(chunks.into_iter().map(Frame::Chunk));
        pieces.push(Frame::LedgerEnd(summary.end(seq, [0; 32], [0; 32], 0, 0)));
    }
    let mut r = Reassembler::new(limits.clone(), first_seq, Duration::from_millis(50));
    let mut now = Duration::ZERO;
    let mut expect = first_seq;
    // Where the next prefix must start: (its ledger, its offset).
    let mut prefix_at = (first_seq, 0u64);
    let mut check = |r: &mut Reassembler| {
        assert!(r.held_bytes() <= limits.max_buffered_bytes);
        assert!(r.open_ledgers() <= limits.max_ledgers_in_flight as usize);
        // Prefixes: only of the next ledger, from 0, contiguous, within the ledger bound.
        while let Some(p) = r.poll_prefix() {
            assert_eq!(p.seq, r.next_seq());
            if p.seq != prefix_at.0 {
                prefix_at = (p.seq, 0);
            }
            assert_eq!(p.offset, prefix_at.1);
            prefix_at.1 += p.data.len() as u64;
            assert!(prefix_at.1 <= limits.max_ledger_raw);
        }
        while let Some(l) = r.poll_ledger() {
            assert_eq!(l.seq, expect);
            assert_eq!(l.data, ledgers[(l.seq - first_seq) as usize]);
            expect += 1;
        }
        while r.poll_missing().is_some() {}
    };
    let mut ops = data.iter().copied();
    while let Some(op) = ops.next() {
        let arg = ops.next().unwrap_or(0) as usize;
        let _ = match op % 5 {
            // Deliver piece `arg` (duplicates happen when the input picks one twice).
            0 | 1 => feed(&mut r, &pieces[arg % pieces.len()], now),
            // Deliver a tampered copy of a piece.
            2 => {
                let mut bytes = pieces[arg % pieces.len()].to_vec();
                let at = (arg * 31 + op as usize) % bytes.len();
                bytes[at] ^= 1 + (op >> 3);
                match frame::decode_exact(Bytes::from(bytes), &limits) {
                    Ok(f) => feed(&mut r, &f, now),
                    Err(_) => Ok(()),
                }
            }
            // Time passes.
            3 => {
                now += Duration::from_millis(arg as u64);
                r.handle_timeout(now);
                Ok(())
            }
            // Arbitrary frame bytes from the rest of the input.
            _ => {
                let rest: Vec<u8> = ops.by_ref().take(arg % 64).collect();
                match frame::decode(&rest, &limits) {
                    Ok(Some((f, _))) => feed(&mut r, &f, now),
                    _ => Ok(()),
                }
            }
        };
        check(&mut r);
    }
}

/// Bounds for the lake bodies: small enough that a hostile length is visibly refused.
fn small_batch_limits() -> BatchLimits {
    BatchLimits {
        max_object: 1 << 16,
        max_raw: 1 << 16,
        max_ledger: 1 << 15,
        max_ledgers: 16,
    }
}

/// SEP-54 objects: the input as a batch's XDR and as a compressed object. Whatever decodes is
/// within the limits, runs `start..=end` one ledger per sequence, and re-encodes to exactly
/// the input (the decoder hands out the stored bytes, never a re-serialization).
pub fn lake_batch(data: &[u8]) {
    let limits = small_batch_limits();
    if let Ok(batch) = lake::decode_batch(Bytes::copy_from_slice(data), &limits) {
        assert!(batch.ledgers.len() <= limits.max_ledgers as usize);
        assert_eq!(
            batch.ledgers.len() as u64,
            u64::from(batch.end) - u64::from(batch.start) + 1
        );
        for (i, l) in batch.ledgers.iter().enumerate() {
            assert!(l.raw.len() as u64 <= limits.max_ledger);
            assert_eq!(l.info.ledger_seq, batch.start + i as u32);
        }
        let raws: Vec<&[u8]> = batch.ledgers.iter().map(|l| &l.raw[..]).collect();
        assert_eq!(lake::encode_batch(batch.start, batch.end, &raws), data);
    }
    if let Ok(raw) = lake::decompress_object(data, &limits) {
        assert!(raw.len() as u64 <= limits.max_raw);
        if let Ok(batch) = lake::read_object(data, 0, u32::MAX, &limits) {
            assert_eq!(batch.end, u32::MAX, "a batch is read only at its own key");
        }
    }
}

/// SEP-54 names and manifests: a name that parses formats back to itself; a manifest that
/// parses survives its own round trip; a layout taken from the input names every sequence with
/// a key that parses back to the batch and partition holding it.
pub fn lake_names(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Some(n) = lake::parse_batch_name(&text) {
        assert_eq!(lake::batch_name(n.first, n.last, n.extension), text);
    }
    if let Some((first, last)) = lake::parse_partition_name(&text) {
        assert!(first <= last);
    }
    if let Ok(m) = Manifest::parse(data) {
        assert_eq!(Manifest::parse(&m.to_json()).as_ref(), Ok(&m));
    }
    let word = |i: usize| {
        let mut b = [0u8; 4];
        for (j, x) in b.iter_mut().enumerate() {
            *x = data.get(i * 4 + j).copied().unwrap_or(0);
        }
        u32::from_be_bytes(b)
    };
    if let Ok(schema) = Schema::new(word(0), word(1)) {
        let seq = word(2);
        let key = schema.object_key(seq);
        let (dir, name) = match key.rsplit_once('/') {
            Some((dir, name)) => (Some(dir), name),
            None => (None, key.as_str()),
        };
        let n = lake::parse_batch_name(name).expect("a generated name parses");
        let (first, last) = schema.batch_range(seq);
        assert!(first <= seq && seq <= last);
        assert_eq!((n.first, n.last), (first, last));
        match dir {
            Some(dir) => {
                let (pf, pl) = lake::parse_partition_name(dir).expect("a generated dir parses");
                assert!(pf <= first && last <= pl);
            }
            None => assert!(schema.batches_per_partition() <= 1),
        }
    }
}

/// Ring values read back from disk: arbitrary bytes as one ledger's record and parts, taken as
/// the ring's reader takes them.
///
/// The first byte is a mode: bit 0, the harness seals each value itself (a fuzzer almost never
/// forges an xxh3 checksum, and the decoders behind it must be reached); bit 1, the harness
/// stamps each part body with its ledger and part number; the other bits pick the ledger
/// (1..=64). Then come the values, each a `u16` length and that many bytes: the record, then
/// its parts. Checked: no panic; the bytes held never exceed the bytes given; a record that
/// decodes re-encodes to the very value it came from; a ledger read back tiles its record and
/// re-encodes to parts that read back to the same ledger.
pub fn stored(data: &[u8]) {
    use crate::stored::{
        check_chunks, encode_file, read_file, record_seq, seal, unseal_str, unseal_u32, unseal_u64,
        PartReader, Record,
    };

    // The same bytes as a ledger file.
    stored_file(data);
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let harness_seals = mode & 1 == 1;
    let stamp_ids = mode & 2 == 2;
    let seq = u32::from(mode >> 2) + 1;
    let mut values: Vec<&[u8]> = Vec::new();
    let mut rest = rest;
    while let Some((len, tail)) = rest.split_first_chunk::<2>() {
        let len = usize::from(u16::from_be_bytes(*len)).min(tail.len());
        let (v, tail) = tail.split_at(len);
        values.push(v);
        rest = tail;
    }
    let Some((&record, parts)) = values.split_first() else {
        return;
    };
    // The metadata decoders and the key parser take any value.
    for v in &values {
        let _ = (unseal_u32(v), unseal_u64(v), unseal_str(v), record_seq(v));
    }
    let sealed = |body: &[u8]| seal(|b| b.extend_from_slice(body));
    let record = if harness_seals {
        sealed(record)
    } else {
        record.to_vec()
    };
    let Ok(r) = Record::decode(seq, &record) else {
        return;
    };
    assert_eq!(r.encode(), record, "a record re-encodes to its value");
    let mut reader = PartReader::new(r);
    let mut given = 0usize;
    for (i, part) in parts.iter().enumerate() {
        let mut body = part.to_vec();
        if stamp_ids && body.len() >= 8 {
            body[..4].copy_from_slice(&seq.to_be_bytes());
            body[4..8].copy_from_slice(&(i as u32).to_be_bytes());
        }
        let value = if harness_seals { sealed(&body) } else { body };
        given += value.len();
        if reader.push(&value).is_err() {
            return;
        }
    }
    let Ok((end, chunks)) = reader.finish() else {
        return;
    };
    assert_eq!(end, r.end);
    let held: usize = chunks.iter().map(|c| c.payload.len()).sum();
    assert!(
        held <= given,
        "{held} payload bytes from {given} bytes given"
    );
    assert_eq!(check_chunks(&end, &chunks), Ok(()));
    // The writer's encoding reads back to the same ledger.
    let again = encode_file(seq, &chunks);
    let record = Record {
        parts: again.parts,
        bytes: again.stored,
        ..r
    };
    // An error here is the finding: the writer's own file must read back.
    let (_, back) = read_file(record, &again.bytes).expect("the writer's ledger reads back");
    assert_eq!(back, chunks);
}

/// A ledger file as the ring reads it from disk: any bytes against a record built from the
/// first 16 (parts and stored bytes; the end record of a small ledger). Whatever is refused is
/// refused with an error; what is read holds no more payload than the file, and its chunks tile
/// the ledger.
pub fn stored_file(data: &[u8]) {
    use crate::stored::{check_chunks, file_len, file_parts, read_file};

    let Some((record, file)) = stored_file_record(data) else {
        return;
    };
    let _ = file_len(&record);
    for v in file_parts(file).take(1000).flatten() {
        assert!(v.len() <= crate::stored::PART_LEN_MAX);
    }
    if let Ok((end, chunks)) = read_file(record, file) {
        assert_eq!(end, record.end);
        let held: usize = chunks.iter().map(|c| c.payload.len()).sum();
        assert!(held <= file.len());
        assert_eq!(check_chunks(&end, &chunks), Ok(()));
    }
}

/// The record `stored_file` reads a file against, from the input's first 12 bytes (parts
/// `u32`, stored bytes `u64`): a small ledger of 2 chunks and 300 raw bytes; and the rest.
fn stored_file_record(data: &[u8]) -> Option<(crate::stored::Record, &[u8])> {
    let (counts, file) = data.split_first_chunk::<12>()?;
    let [p0, p1, p2, p3, b @ ..] = *counts;
    let record = crate::stored::Record {
        end: crate::frame::LedgerEnd {
            seq: 1,
            chunk_count: 2,
            raw_len: 300,
            header_hash: [1; 32],
            ..Default::default()
        },
        parts: u32::from_be_bytes([p0, p1, p2, p3]),
        bytes: u64::from_be_bytes(b),
    };
    Some((record, file))
}

/// The ring's crash-survival rule ([`crate::stored::surviving`]) over records a fuzzer writes:
/// each input byte is one record, from the oldest up. Bit 0 clear: it does not decode. Bit 1: a
/// gap of `byte >> 4` + 1 ledgers before it. Bit 2: its previous hash is not its predecessor's
/// hash. Checked against the rule's definition: what is kept ends at the newest readable
/// record, is all readable, each kept pair links or is separated by a gap, and the record below
/// what is kept (if any) could not have been kept.
pub fn surviving(data: &[u8]) {
    use crate::frame::LedgerEnd;
    use crate::stored::{after_gap, surviving, Record};

    let mut seq = 1u32;
    let records: Vec<Option<Record>> = data
        .iter()
        .map(|&b| {
            let previous_hash = if b & 4 == 0 {
                hash_of(seq - 1)
            } else {
                [0xEE; 32]
            };
            seq += if b & 2 == 0 { 0 } else { u32::from(b >> 4) + 1 };
            let end = LedgerEnd {
                seq,
                header_hash: hash_of(seq),
                previous_hash,
                ..Default::default()
            };
            seq += 1;
            (b & 1 == 1).then_some(Record {
                end,
                parts: 0,
                bytes: 0,
            })
        })
        .collect();
    let kept = surviving(&records);
    let joined = |older: &Record, newer: &Record| {
        after_gap(older.end.seq, newer.end.seq)
            || (newer.end.seq == older.end.seq + 1
                && newer.end.previous_hash == older.end.header_hash)
    };
    let top = records
        .iter()
        .rposition(Option::is_some)
        .map_or(0, |i| i + 1);
    assert_eq!(
        kept.end, top,
        "what is kept ends at the newest readable record"
    );
    let held: Vec<Record> = records[kept.clone()].iter().flatten().copied().collect();
    assert_eq!(held.len(), kept.len(), "every kept record is readable");
    assert!(held.windows(2).all(|w| joined(&w[0], &w[1])));
    if kept.start > 0 && kept.start < kept.end {
        if let (Some(below), Some(first)) = (records[kept.start - 1], held.first()) {
            assert!(
                !joined(&below, first),
                "a record that joins what is kept was dropped"
            );
        }
    }
}

/// A ledger hash the `surviving` body gives ledger `seq`.
fn hash_of(seq: u32) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[..4].copy_from_slice(&seq.to_be_bytes());
    h
}

pub use sender::sender;

fn feed(r: &mut Reassembler, f: &Frame, now: Duration) -> Result<(), crate::AssemblyError> {
    match f {
        Frame::Chunk(c) => r.handle_chunk(c, now),
        Frame::LedgerEnd(e) => r.handle_end(e, now),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    #[test]
    fn each_body_runs() {
        let seed: Vec<u8> = (0..=255u8).collect();
        super::frames(&seed);
        super::sender(&seed);
        super::sender(&[0, 1, 8, 0, 5, 0, 0, 1, 0, 2]);
        super::records(&seed);
        super::header(&seed);
        super::core_http(&seed);
        super::core_http(b"key=AAAA&ledgerSeq=5");
        super::content(&seed);
        super::reassembler(&seed);
        // A whole ledger (v2, empty transaction set and results) and every prefix of it:
        // version byte 2, then the bytes after a header.
        let mut ledger = vec![2u8];
        ledger.extend_from_slice(&[0, 0, 0, 0]); // LedgerHeaderHistoryEntry.ext
        ledger.extend_from_slice(&1u32.to_be_bytes()); // GeneralizedTransactionSet v1
        ledger.extend_from_slice(&[0x11; 32]); // previousLedgerHash
        ledger.extend_from_slice(&[0; 4]); // phases<>: none
        ledger.extend_from_slice(&[0; 4 * 3]); // txProcessing, upgrades, scpInfo: empty
        ledger.extend_from_slice(&[0; 8]); // totalByteSizeOfLiveSorobanState
        ledger.extend_from_slice(&[0; 4]); // evictedKeys: empty
        let whole = crate::content::content_hashes(&ledger[1..], &super::bare_header(2)).unwrap();
        assert_eq!(whole.transactions, 0);
        for cut in 0..=ledger.len() {
            super::content(&ledger[..cut]);
        }
        super::stored(&seed);
        super::stored(&stored_seed());
        super::stored_file(&stored_file_seed());
        super::surviving(&seed);
        super::surviving(&[1, 1, 0, 1, 3, 5, 1, 0, 0]);
        super::lake_batch(&seed);
        super::lake_names(&seed);
        // Found by fuzzing: a data stream's head naming a core response longer than any frame
        // a data stream may carry.
        super::frames(&[
            0x41, 0, 0, 0x17, 0x10, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        ]);
        super::lake_names(b"FFF0BDBF--1000000.xdr.zst");
        super::lake_names(br#"{"ledgersPerBatch":8,"batchesPerPartition":4}"#);
        // Found by fuzzing: the last partition of the sequence space is clamped to one ledger.
        super::lake_names(&[
            0, 0, 0, 1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 8, b'r', b'.', b'z', b's',
            b't', b'd', 0, 0, 0, 1,
        ]);
        // An in-order delivery of everything completes every ledger.
        let in_order: Vec<u8> = (0..40u8).flat_map(|i| [0, i]).collect();
        super::reassembler(&in_order);
    }

    /// A whole ledger for `stored` (harness seals, stamps ids; ledger 1): a record of two raw
    /// chunks of 10 and 20 bytes, then their two parts. `fuzz/run.sh` seeds the corpus with
    /// the same bytes.
    fn stored_seed() -> Vec<u8> {
        let mut record = Vec::new();
        crate::frame::LedgerEnd {
            seq: 1,
            chunk_count: 2,
            raw_len: 30,
            header_hash: [1; 32],
            ..Default::default()
        }
        .put_body(&mut record);
        record.extend_from_slice(&2u32.to_be_bytes());
        record.extend_from_slice(&0u64.to_be_bytes());
        let part = |index: u32, offset: u64, len: u32| {
            let mut p = vec![0; 8]; // seq and part number: stamped by the harness
            p.push(0); // the first part of a chunk
            p.extend_from_slice(&index.to_be_bytes());
            p.push(0); // raw
            p.extend_from_slice(&offset.to_be_bytes());
            p.extend_from_slice(&len.to_be_bytes());
            p.extend_from_slice(&len.to_be_bytes());
            p.extend(std::iter::repeat_n(0xAB, len as usize));
            p
        };
        let mut data = vec![0b11];
        for v in [record, part(0, 0, 10), part(1, 10, 20)] {
            data.extend_from_slice(&(v.len() as u16).to_be_bytes());
            data.extend_from_slice(&v);
        }
        data
    }

    /// A whole ledger file for `stored_file`: two raw chunks of 100 and 200 bytes.
    fn stored_file_seed() -> Vec<u8> {
        use crate::stored::{encode_file, StoredChunk};
        let chunk = |index: u32, raw_offset: u64, len: u32| StoredChunk {
            index,
            raw_offset,
            raw_len: len,
            codec: crate::compress::Codec::None,
            payload: bytes::Bytes::from(vec![0xAB; len as usize]),
        };
        let file = encode_file(1, &[chunk(0, 0, 100), chunk(1, 100, 200)]);
        let mut data = file.parts.to_be_bytes().to_vec();
        data.extend_from_slice(&file.stored.to_be_bytes());
        data.extend_from_slice(&file.bytes);
        data
    }

    #[test]
    fn the_stored_file_seed_reads_back_whole() {
        let data = stored_file_seed();
        let (record, file) = super::stored_file_record(&data).unwrap();
        let (_, chunks) = crate::stored::read_file(record, file).unwrap();
        assert_eq!(chunks.len(), 2);
    }

    #[test]
    fn the_stored_seed_reads_back_whole() {
        use crate::stored::{seal, PartReader, Record};
        let data = stored_seed();
        // Walk it as the body does, and check that it gets to the end.
        let mut values = Vec::new();
        let mut rest = &data[1..];
        while let Some((len, tail)) = rest.split_first_chunk::<2>() {
            let (v, tail) = tail.split_at(usize::from(u16::from_be_bytes(*len)));
            values.push(v);
            rest = tail;
        }
        let sealed = |b: &[u8]| seal(|v| v.extend_from_slice(b));
        let r = Record::decode(1, &sealed(values[0])).unwrap();
        let mut reader = PartReader::new(r);
        for (i, p) in values[1..].iter().enumerate() {
            let mut p = p.to_vec();
            p[..4].copy_from_slice(&1u32.to_be_bytes());
            p[4..8].copy_from_slice(&(i as u32).to_be_bytes());
            reader.push(&sealed(&p)).unwrap();
        }
        let (_, chunks) = reader.finish().unwrap();
        assert_eq!(chunks.len(), 2);
    }

    proptest! {
        #[test]
        fn stored_values(data in prop::collection::vec(any::<u8>(), 0..600)) {
            super::stored(&data);
        }

        #[test]
        fn sender_ops(data in prop::collection::vec(any::<u8>(), 0..600)) {
            super::sender(&data);
        }

        #[test]
        fn reassembler_ops(data in prop::collection::vec(any::<u8>(), 0..600)) {
            super::reassembler(&data);
        }

        #[test]
        fn lake_bodies(data in prop::collection::vec(any::<u8>(), 0..600)) {
            super::lake_batch(&data);
            super::lake_names(&data);
        }

        #[test]
        fn records_and_headers(data in prop::collection::vec(any::<u8>(), 0..600)) {
            super::records(&data);
            super::header(&data);
            super::content(&data);
        }
    }
}
