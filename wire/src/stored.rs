//! The values the relay's retention ring keeps on disk, encoded and decoded without IO.
//!
//! Bytes read back from disk are hostile input as much as bytes from the network: a torn write,
//! a flipped bit, a value moved under another key or written by another version. Everything that
//! turns stored bytes back into a ledger lives here, bounded and typed, so that it can be fuzzed
//! (`wire::fuzzing::stored`); the ring in `ledger-relay` (`relay/src/ring.rs`) does the sled and file IO,
//! the locking, pruning and repair.
//!
//! # Layout
//!
//! Two places, both under the ring's directory: a sled tree holds the metadata and one small
//! record per ledger; each ledger's chunks are in a file of their own (`ledgers/` in
//! `relay/src/ring.rs`), written once and deleted whole when the ledger leaves the ring. sled
//! integers are big-endian so that key order is sequence order.
//!
//! | sled key | value body |
//! |---|---|
//! | `mformat` | format version, `u32` ([`FORMAT_VERSION`]) |
//! | `mepoch` | run counter, `u64`, bumped by every reset of the ring |
//! | `mnetwork` | network name, UTF-8 (absent: never configured) |
//! | `l` seq `u32` | ledger [`Record`]: the [`LedgerEnd`] body as [`crate::frame`] encodes it (104 bytes), the number of parts (`u32`) and the ledger's stored bytes (`u64`) |
//!
//! Every sled value and every part is `xxh3-64(body) u64 || body` ([`seal`]) and is checked on
//! every read ([`unseal`]). A ledger's chunks are cut into parts of at most [`PART_MAX`] payload
//! bytes, numbered 0.. across the whole ledger. A part's body starts with its own sequence and
//! part number (so a part of another ledger, or out of place, is caught) and a kind byte: a
//! chunk's first part carries the chunk's index, codec, raw offset, raw length and payload
//! length before its first payload bytes; continuation parts carry only payload bytes.
//!
//! A ledger file ([`encode_file`], [`read_file`]) is the ledger's parts in order, each behind
//! its length (`u32`, big-endian, [`FILE_PREFIX_LEN`] bytes). Its length follows from the
//! record ([`file_len`]), so a torn or overlong file is refused before it is read.

use bytes::Bytes;

use crate::checksum;
use crate::compress::Codec;
use crate::frame::{LedgerEnd, LEDGER_END_LEN};
use crate::header::ChainVerifier;

/// Stored format version; the ring refuses a store written with another one. Version 1 kept the
/// parts in sled too; version 2 keeps them in one file per ledger.
pub const FORMAT_VERSION: u32 = 2;

/// Largest number of payload bytes in one stored part: a damaged part costs at most this much
/// to find, and a reader never needs more than one part's worth of a chunk it cannot place.
pub const PART_MAX: usize = 64 << 10;

/// Bytes in front of every part in a ledger file: the part's stored length, `u32` big-endian.
pub const FILE_PREFIX_LEN: usize = 4;

/// Key of the format version.
pub const META_FORMAT: &[u8] = b"mformat";
/// Key of the run counter.
pub const META_EPOCH: &[u8] = b"mepoch";
/// Key of the network name.
pub const META_NETWORK: &[u8] = b"mnetwork";
/// First byte of every record key.
pub const RECORD_PREFIX: u8 = b'l';

/// The checksum in front of every value.
pub const SEAL_LEN: usize = 8;
/// `LedgerEnd` body + parts (4) + stored bytes (8).
const RECORD_BODY_LEN: usize = LEDGER_END_LEN + 4 + 8;
/// A stored record, checksum included: every record has this length, so a record can count its
/// own bytes.
pub const RECORD_LEN: usize = SEAL_LEN + RECORD_BODY_LEN;
const PART_START: u8 = 0;
const PART_CONTINUE: u8 = 1;
/// seq + part + kind.
const PART_ID_LEN: usize = 4 + 4 + 1;
/// index + codec + raw offset + raw length + payload length.
const CHUNK_HEADER_LEN: usize = 4 + 1 + 8 + 4 + 4;
/// The most a [`PartReader`] reserves up front for one chunk's payload: a 4 MiB raw chunk, the
/// largest the relay cuts. Beyond it the payload grows with the parts given.
pub const RESERVE_MAX: usize = 4 << 20;

/// The largest stored part, checksum included: a chunk's first part with [`PART_MAX`] payload
/// bytes.
pub const PART_LEN_MAX: usize = SEAL_LEN + PART_ID_LEN + CHUNK_HEADER_LEN + PART_MAX;

/// One stored chunk of a ledger, as it was sent live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredChunk {
    /// 0-based index in the ledger.
    pub index: u32,
    /// Where the chunk's raw bytes start in the ledger.
    pub raw_offset: u64,
    /// Raw (decoded) length, at least 1.
    pub raw_len: u32,
    /// How `payload` is encoded.
    pub codec: Codec,
    /// The encoded bytes, never longer than `raw_len` (exactly `raw_len` with [`Codec::None`]).
    pub payload: Bytes,
}

/// A ledger record as stored: its end record, how many parts its chunks take and how many bytes
/// its values take (parts and record, checksums included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// The ledger's end record.
    pub end: LedgerEnd,
    /// Parts stored under `c` seq 0.. .
    pub parts: u32,
    /// Bytes of the ledger's stored values.
    pub bytes: u64,
}

/// Stored bytes that do not hold what they must, or a ledger whose chunks do not tile it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoredError {
    /// A ledger's record is not stored.
    #[error("record missing")]
    RecordMissing,
    /// A record's checksum does not hold.
    #[error("record fails its checksum")]
    RecordChecksum,
    /// A record's body has the wrong length.
    #[error("record of {len} bytes, expected {RECORD_BODY_LEN}")]
    RecordLength {
        /// Its length.
        len: usize,
    },
    /// A record is stored under another ledger's key.
    #[error("record for ledger {found} stored under ledger {key}")]
    RecordKey {
        /// The ledger the record is for.
        found: u32,
        /// The ledger of its key.
        key: u32,
    },
    /// A record counts fewer stored bytes than a record takes, or more parts than its bytes
    /// can hold: no file can be its ledger's.
    #[error("record counts {bytes} stored bytes in {parts} parts")]
    RecordCounts {
        /// Stored bytes it counts.
        bytes: u64,
        /// Parts it counts.
        parts: u32,
    },
    /// A ledger's file is missing.
    #[error("ledger file missing")]
    FileMissing,
    /// A ledger file is not as long as its record says.
    #[error("ledger file of {len} bytes, its record says {expected}")]
    FileLength {
        /// The file's length.
        len: u64,
        /// The length its record gives.
        expected: u64,
    },
    /// A part's length in a ledger file is 0, larger than any part, or runs past the file.
    #[error("part {part} of a ledger file claims {len} bytes")]
    PartLength {
        /// Its number.
        part: u32,
        /// The length it claims (or the bytes left, when the length itself is cut short).
        len: u64,
    },
    /// A part the record counts is not stored.
    #[error("part {part} missing")]
    PartMissing {
        /// Its number.
        part: u32,
    },
    /// More parts were given than the record counts.
    #[error("part {part} is beyond the {parts} parts the record counts")]
    ExtraPart {
        /// Its number.
        part: u32,
        /// Parts the record counts.
        parts: u32,
    },
    /// A part's checksum does not hold.
    #[error("part {part} fails its checksum")]
    PartChecksum {
        /// Its number.
        part: u32,
    },
    /// A part names another ledger or another part number than its key.
    #[error("part {part} is stored under another key")]
    PartKey {
        /// Its number.
        part: u32,
    },
    /// A part's kind byte is unknown.
    #[error("part {part} has unknown kind {kind}")]
    PartKind {
        /// Its number.
        part: u32,
        /// The kind byte.
        kind: u8,
    },
    /// A chunk's first part is too short for the chunk's header.
    #[error("part {part} is too short for a chunk header")]
    ChunkHeaderShort {
        /// Its number.
        part: u32,
    },
    /// A chunk names an unknown codec.
    #[error("part {part} names unknown codec {codec}")]
    UnknownCodec {
        /// The part.
        part: u32,
        /// The codec byte.
        codec: u8,
    },
    /// A new chunk starts before the one before it has all its payload.
    #[error("chunk {index} is cut short at part {part}")]
    ChunkCutShort {
        /// The chunk cut short.
        index: u32,
        /// The part that starts another chunk.
        part: u32,
    },
    /// A continuation part with no chunk open, or an empty one.
    #[error("part {part} continues no chunk")]
    Orphan {
        /// Its number.
        part: u32,
    },
    /// A chunk's parts hold more payload than its header says.
    #[error("chunk {index} holds more than its payload length {want}")]
    Overfull {
        /// The chunk.
        index: u32,
        /// Its payload length.
        want: usize,
    },
    /// The parts end inside a chunk.
    #[error("chunk {index} is missing parts")]
    ChunkIncomplete {
        /// The chunk.
        index: u32,
    },
    /// A chunk's index, raw offset or raw length does not continue the chunks before it.
    #[error(
        "chunk {index} at raw offset {raw_offset} (length {raw_len}) does not follow the \
         {count} chunks before it, ending at raw offset {offset}"
    )]
    OutOfPlace {
        /// The chunk's index.
        index: u32,
        /// Its raw offset.
        raw_offset: u64,
        /// Its raw length.
        raw_len: u32,
        /// Chunks before it.
        count: u32,
        /// Where they end.
        offset: u64,
    },
    /// A chunk's payload does not fit its raw length under its codec.
    #[error("chunk {index} payload of {payload_len} bytes does not fit raw length {raw_len} with codec {}", codec.name())]
    PayloadLength {
        /// The chunk.
        index: u32,
        /// Its codec.
        codec: Codec,
        /// Its payload length.
        payload_len: u64,
        /// Its raw length.
        raw_len: u32,
    },
    /// The chunks are not as many as the end record says.
    #[error("{count} chunks, end record says {expected}")]
    ChunkCount {
        /// Chunks there are.
        count: u64,
        /// Chunks the end record says.
        expected: u32,
    },
    /// The chunks do not cover the end record's raw length.
    #[error("chunks cover {covered} raw bytes, end record says {expected}")]
    RawLength {
        /// Raw bytes the chunks cover.
        covered: u64,
        /// The end record's raw length.
        expected: u64,
    },
}

/// Whether ledger `seq` follows `newest` with at least one ledger missing between them: it
/// starts a new run of the ring rather than continuing the newest one.
pub fn after_gap(newest: u32, seq: u32) -> bool {
    newest.checked_add(1).is_some_and(|next| seq > next)
}

/// Which of the ring's records survive a crash: `records` are the store's records in sequence
/// order, `None` for one that does not decode; the result is the range of them kept.
///
/// From the newest down: unreadable records above the newest readable one are a torn tail and
/// are skipped; then records are kept while each is readable and, with the one above it, either
/// hash-linked (consecutive, the newer's previous hash the older's hash) or separated by a gap
/// (a new run, see [`after_gap`]). The first record that breaks this ends what is kept: it and
/// everything older go, and so does the torn tail. Whether the newest kept ledger's parts read
/// back whole is the ring's next check, not this one's.
pub fn surviving(records: &[Option<Record>]) -> std::ops::Range<usize> {
    let top = records
        .iter()
        .rposition(Option::is_some)
        .map_or(0, |i| i + 1);
    let mut from = top;
    while from > 0 {
        let Some(older) = records[from - 1] else {
            break;
        };
        if let Some(Some(newer)) = records.get(from).filter(|_| from < top) {
            let linked = ChainVerifier::after(older.end.seq, older.end.header_hash)
                .check_link((&newer.end).into())
                .is_ok();
            if !linked && !after_gap(older.end.seq, newer.end.seq) {
                break;
            }
        }
        from -= 1;
    }
    from..top
}

/// The key of ledger `seq`'s record.
pub fn record_key(seq: u32) -> [u8; 5] {
    let mut k = [0u8; 5];
    k[0] = RECORD_PREFIX;
    k[1..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// The ledger a record key names, if it is one.
pub fn record_seq(key: &[u8]) -> Option<u32> {
    match key {
        [RECORD_PREFIX, rest @ ..] => <[u8; 4]>::try_from(rest).ok().map(u32::from_be_bytes),
        _ => None,
    }
}

/// A value: `xxh3-64(body)` followed by the body `fill` writes.
pub fn seal(fill: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut v = vec![0u8; SEAL_LEN];
    fill(&mut v);
    let sum = checksum(&v[SEAL_LEN..]);
    v[..SEAL_LEN].copy_from_slice(&sum.to_be_bytes());
    v
}

/// The body of a value whose checksum holds.
pub fn unseal(v: &[u8]) -> Option<&[u8]> {
    let (sum, body) = v.split_first_chunk::<SEAL_LEN>()?;
    (u64::from_be_bytes(*sum) == checksum(body)).then_some(body)
}

/// A sealed `u32` (the format version).
pub fn seal_u32(n: u32) -> Vec<u8> {
    seal(|b| b.extend_from_slice(&n.to_be_bytes()))
}

/// A sealed `u64` (the epoch).
pub fn seal_u64(n: u64) -> Vec<u8> {
    seal(|b| b.extend_from_slice(&n.to_be_bytes()))
}

/// The `u32` of a value whose checksum holds and whose body is 4 bytes.
pub fn unseal_u32(v: &[u8]) -> Option<u32> {
    unseal(v)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_be_bytes)
}

/// The `u64` of a value whose checksum holds and whose body is 8 bytes.
pub fn unseal_u64(v: &[u8]) -> Option<u64> {
    unseal(v)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_be_bytes)
}

/// The text of a value whose checksum holds and whose body is UTF-8 (the network name).
pub fn unseal_str(v: &[u8]) -> Option<&str> {
    unseal(v).and_then(|b| std::str::from_utf8(b).ok())
}

impl Record {
    /// The stored value.
    pub fn encode(&self) -> Vec<u8> {
        seal(|b| {
            self.end.put_body(b);
            b.extend_from_slice(&self.parts.to_be_bytes());
            b.extend_from_slice(&self.bytes.to_be_bytes());
        })
    }

    /// The record stored under ledger `seq`'s key: its checksum holds, it has a record's length
    /// and it is the record of that ledger.
    pub fn decode(seq: u32, v: &[u8]) -> Result<Record, StoredError> {
        let b = unseal(v).ok_or(StoredError::RecordChecksum)?;
        let Some((end, rest)) = b.split_first_chunk::<LEDGER_END_LEN>() else {
            return Err(StoredError::RecordLength { len: b.len() });
        };
        let Ok(rest) = <[u8; 12]>::try_from(rest) else {
            return Err(StoredError::RecordLength { len: b.len() });
        };
        let end = LedgerEnd::from_body(end);
        if end.seq != seq {
            return Err(StoredError::RecordKey {
                found: end.seq,
                key: seq,
            });
        }
        let [p0, p1, p2, p3, b @ ..] = rest;
        Ok(Record {
            end,
            parts: u32::from_be_bytes([p0, p1, p2, p3]),
            bytes: u64::from_be_bytes(b),
        })
    }
}

/// The rule a ledger's chunks follow, on the way in and on the way back from disk: indices 0..,
/// each starting where the one before ended, a raw length of at least 1, a payload that fits
/// the raw length under its codec, and together exactly the end record's count and raw length.
#[derive(Debug, Default)]
struct Tiling {
    count: u32,
    offset: u64,
}

impl Tiling {
    /// Takes the next chunk's fields.
    fn next(
        &mut self,
        index: u32,
        raw_offset: u64,
        raw_len: u32,
        codec: Codec,
        payload_len: u64,
    ) -> Result<(), StoredError> {
        if index != self.count || raw_offset != self.offset || raw_len == 0 {
            return Err(StoredError::OutOfPlace {
                index,
                raw_offset,
                raw_len,
                count: self.count,
                offset: self.offset,
            });
        }
        let fits = match codec {
            Codec::None => payload_len == u64::from(raw_len),
            _ => payload_len <= u64::from(raw_len),
        };
        if !fits {
            return Err(StoredError::PayloadLength {
                index,
                codec,
                payload_len,
                raw_len,
            });
        }
        self.count += 1;
        self.offset += u64::from(raw_len);
        Ok(())
    }

    /// Checks the chunks taken against the end record.
    fn finish(&self, end: &LedgerEnd) -> Result<(), StoredError> {
        if self.count != end.chunk_count {
            return Err(StoredError::ChunkCount {
                count: u64::from(self.count),
                expected: end.chunk_count,
            });
        }
        if self.offset != end.raw_len {
            return Err(StoredError::RawLength {
                covered: self.offset,
                expected: end.raw_len,
            });
        }
        Ok(())
    }
}

/// Checks that `chunks` are exactly the ledger `end` describes (the rule [`PartReader`] applies
/// to what it reads back).
pub fn check_chunks(end: &LedgerEnd, chunks: &[StoredChunk]) -> Result<(), StoredError> {
    if chunks.len() as u64 != u64::from(end.chunk_count) {
        return Err(StoredError::ChunkCount {
            count: chunks.len() as u64,
            expected: end.chunk_count,
        });
    }
    let mut tiling = Tiling::default();
    for c in chunks {
        tiling.next(
            c.index,
            c.raw_offset,
            c.raw_len,
            c.codec,
            c.payload.len() as u64,
        )?;
    }
    tiling.finish(end)
}

/// A ledger's file as [`encode_file`] makes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerFile {
    /// The file's bytes.
    pub bytes: Vec<u8>,
    /// Parts in it.
    pub parts: u32,
    /// The ledger's stored bytes, as its [`Record`] counts them: every part (checksum
    /// included, length prefix excluded) and the record itself.
    pub stored: u64,
}

/// Ledger `seq`'s file: its chunks' parts, numbered from 0, each behind its length. The chunks
/// must have passed [`check_chunks`] (each payload fits its `u32` raw length). One buffer, sized
/// up front, and one copy of each payload byte.
pub fn encode_file(seq: u32, chunks: &[StoredChunk]) -> LedgerFile {
    let per_part = FILE_PREFIX_LEN + SEAL_LEN + PART_ID_LEN;
    let size: usize = chunks
        .iter()
        .map(|c| {
            let parts = c.payload.len().div_ceil(PART_MAX).max(1);
            c.payload.len() + parts * per_part + CHUNK_HEADER_LEN
        })
        .sum();
    let mut out = Vec::with_capacity(size);
    let mut part = 0u32;
    for chunk in chunks {
        let payload = &chunk.payload[..];
        let mut pieces = payload.chunks(PART_MAX);
        let first = pieces.next().unwrap_or(&[]);
        framed(&mut out, |b| {
            put_part_id(b, seq, part, PART_START);
            b.extend_from_slice(&chunk.index.to_be_bytes());
            b.push(chunk.codec as u8);
            b.extend_from_slice(&chunk.raw_offset.to_be_bytes());
            b.extend_from_slice(&chunk.raw_len.to_be_bytes());
            // check_chunks bounded the payload by raw_len, a u32.
            b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            b.extend_from_slice(first);
        });
        part += 1;
        for piece in pieces {
            framed(&mut out, |b| {
                put_part_id(b, seq, part, PART_CONTINUE);
                b.extend_from_slice(piece);
            });
            part += 1;
        }
    }
    let prefixes = u64::from(part) * FILE_PREFIX_LEN as u64;
    let stored = out.len() as u64 - prefixes + RECORD_LEN as u64;
    LedgerFile {
        bytes: out,
        parts: part,
        stored,
    }
}

/// Appends `len || xxh3-64(body) || body` to `out`, the body being what `fill` appends.
fn framed(out: &mut Vec<u8>, fill: impl FnOnce(&mut Vec<u8>)) {
    let at = out.len();
    out.extend_from_slice(&[0; FILE_PREFIX_LEN + SEAL_LEN]);
    fill(out);
    let body = at + FILE_PREFIX_LEN + SEAL_LEN;
    let sum = checksum(&out[body..]);
    // A part is at most PART_LEN_MAX bytes.
    let len = (out.len() - at - FILE_PREFIX_LEN) as u32;
    out[at..at + FILE_PREFIX_LEN].copy_from_slice(&len.to_be_bytes());
    out[at + FILE_PREFIX_LEN..body].copy_from_slice(&sum.to_be_bytes());
}

/// The length of `record`'s ledger file: its stored bytes less the record, plus a length prefix
/// per part. [`StoredError::RecordCounts`] if no file can have them.
pub fn file_len(record: &Record) -> Result<u64, StoredError> {
    let bad = StoredError::RecordCounts {
        bytes: record.bytes,
        parts: record.parts,
    };
    let values = record
        .bytes
        .checked_sub(RECORD_LEN as u64)
        .ok_or(bad.clone())?;
    // Every part is at least a checksum and its id.
    if values < u64::from(record.parts) * (SEAL_LEN + PART_ID_LEN) as u64 {
        return Err(bad);
    }
    values
        .checked_add(u64::from(record.parts) * FILE_PREFIX_LEN as u64)
        .ok_or(bad)
}

/// The stored values of a ledger file, in order, each checked only for its length (0 < len
/// <= [`PART_LEN_MAX`], within the file); after an error it yields nothing more.
#[derive(Debug)]
pub struct FileParts<'a> {
    rest: &'a [u8],
    part: u32,
}

/// The stored values of ledger file `file`.
pub fn file_parts(file: &[u8]) -> FileParts<'_> {
    FileParts {
        rest: file,
        part: 0,
    }
}

impl<'a> Iterator for FileParts<'a> {
    type Item = Result<&'a [u8], StoredError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let part = self.part;
        let bad = |len: u64| Some(Err(StoredError::PartLength { part, len }));
        let Some((len, rest)) = self.rest.split_first_chunk::<FILE_PREFIX_LEN>() else {
            let left = self.rest.len() as u64;
            self.rest = &[];
            return bad(left);
        };
        let len = u32::from_be_bytes(*len) as usize;
        if len == 0 || len > PART_LEN_MAX || len > rest.len() {
            self.rest = &[];
            return bad(len as u64);
        }
        let (value, rest) = rest.split_at(len);
        self.rest = rest;
        self.part += 1;
        Some(Ok(value))
    }
}

/// Reads `record`'s ledger back from its file: the file's length against the record's, then
/// every part as [`PartReader`] checks it. Memory: the chunks' payloads, at most the file's
/// length.
pub fn read_file(
    record: Record,
    file: &[u8],
) -> Result<(LedgerEnd, Vec<StoredChunk>), StoredError> {
    let expected = file_len(&record)?;
    if file.len() as u64 != expected {
        return Err(StoredError::FileLength {
            len: file.len() as u64,
            expected,
        });
    }
    let mut reader = PartReader::new(record);
    for value in file_parts(file) {
        reader.push(value?)?;
    }
    reader.finish()
}

fn put_part_id(b: &mut Vec<u8>, seq: u32, part: u32, kind: u8) {
    b.extend_from_slice(&seq.to_be_bytes());
    b.extend_from_slice(&part.to_be_bytes());
    b.push(kind);
}

/// A chunk whose parts are being read: its fields, its payload so far and its payload length.
#[derive(Debug)]
struct OpenChunk {
    chunk: StoredChunk,
    payload: Vec<u8>,
    want: usize,
}

/// Reads a ledger's chunks back from its parts, given in part order: every value's checksum,
/// every part's key, and the chunk set against its record ([`check_chunks`]'s rule).
///
/// Memory is bounded by the values given: a payload is reserved no larger than the parts the
/// record has left can hold, and counts are never trusted for an allocation.
#[derive(Debug)]
pub struct PartReader {
    record: Record,
    next_part: u32,
    chunks: Vec<StoredChunk>,
    open: Option<OpenChunk>,
    tiling: Tiling,
}

impl PartReader {
    /// A reader of the parts of `record`'s ledger.
    pub fn new(record: Record) -> PartReader {
        PartReader {
            // The counts come from disk: reserve for a usual ledger at most (14.5 MiB in 256 KiB
            // chunks is 58), and let a larger one grow with the parts actually given.
            chunks: Vec::with_capacity(record.end.chunk_count.min(record.parts).min(64) as usize),
            record,
            next_part: 0,
            open: None,
            tiling: Tiling::default(),
        }
    }

    /// Parts still to be given.
    pub fn remaining(&self) -> u32 {
        self.record.parts - self.next_part
    }

    /// The next part's number.
    pub fn next_part(&self) -> u32 {
        self.next_part
    }

    /// Takes the stored value of the next part.
    pub fn push(&mut self, value: &[u8]) -> Result<(), StoredError> {
        let part = self.next_part;
        let seq = self.record.end.seq;
        if part >= self.record.parts {
            return Err(StoredError::ExtraPart {
                part,
                parts: self.record.parts,
            });
        }
        let body = unseal(value).ok_or(StoredError::PartChecksum { part })?;
        let Some((id, data)) = body.split_first_chunk::<PART_ID_LEN>() else {
            return Err(StoredError::PartKey { part });
        };
        if id[0..4] != seq.to_be_bytes() || id[4..8] != part.to_be_bytes() {
            return Err(StoredError::PartKey { part });
        }
        let mut data = data;
        match id[8] {
            PART_START => {
                if let Some(o) = &self.open {
                    return Err(StoredError::ChunkCutShort {
                        index: o.chunk.index,
                        part,
                    });
                }
                let Some((h, rest)) = data.split_first_chunk::<CHUNK_HEADER_LEN>() else {
                    return Err(StoredError::ChunkHeaderShort { part });
                };
                let index = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
                let codec =
                    Codec::from_u8(h[4]).ok_or(StoredError::UnknownCodec { part, codec: h[4] })?;
                let raw_offset =
                    u64::from_be_bytes([h[5], h[6], h[7], h[8], h[9], h[10], h[11], h[12]]);
                let raw_len = u32::from_be_bytes([h[13], h[14], h[15], h[16]]);
                let want = u32::from_be_bytes([h[17], h[18], h[19], h[20]]);
                self.tiling
                    .next(index, raw_offset, raw_len, codec, u64::from(want))?;
                data = rest;
                // Reserve no more than the remaining parts can hold, and never more than
                // RESERVE_MAX: the part count comes from disk as well, so a hostile record
                // could otherwise make room for gigabytes; a larger chunk grows with the parts
                // actually given.
                let room = (self.record.parts - part - 1) as usize;
                let room = data
                    .len()
                    .saturating_add(room.saturating_mul(PART_MAX))
                    .min(RESERVE_MAX);
                let want = want as usize;
                self.open = Some(OpenChunk {
                    chunk: StoredChunk {
                        index,
                        raw_offset,
                        raw_len,
                        codec,
                        payload: Bytes::new(),
                    },
                    payload: Vec::with_capacity(want.min(room)),
                    want,
                });
            }
            PART_CONTINUE => {
                if self.open.is_none() || data.is_empty() {
                    return Err(StoredError::Orphan { part });
                }
            }
            kind => return Err(StoredError::PartKind { part, kind }),
        }
        let Some(o) = self.open.as_mut() else {
            return Err(StoredError::Orphan { part });
        };
        if o.payload.len() + data.len() > o.want {
            return Err(StoredError::Overfull {
                index: o.chunk.index,
                want: o.want,
            });
        }
        o.payload.extend_from_slice(data);
        if o.payload.len() == o.want {
            if let Some(OpenChunk {
                mut chunk, payload, ..
            }) = self.open.take()
            {
                chunk.payload = Bytes::from(payload);
                self.chunks.push(chunk);
            }
        }
        self.next_part += 1;
        Ok(())
    }

    /// The ledger, once every part was given: its end record and its chunks, which tile it.
    pub fn finish(self) -> Result<(LedgerEnd, Vec<StoredChunk>), StoredError> {
        if let Some(o) = self.open {
            return Err(StoredError::ChunkIncomplete {
                index: o.chunk.index,
            });
        }
        if self.next_part < self.record.parts {
            return Err(StoredError::PartMissing {
                part: self.next_part,
            });
        }
        self.tiling.finish(&self.record.end)?;
        Ok((self.record.end, self.chunks))
    }
}

#[cfg(test)]
mod tests;
