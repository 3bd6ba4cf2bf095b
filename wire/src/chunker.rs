//! Cuts a ledger into chunks while it is still arriving.
//!
//! stellar-core writes a 14.5 MiB ledger over about 8 ms in 64-256 KiB pieces. The chunker takes
//! those pieces as they come and hands out a chunk the moment it is full, so the relay can
//! compress and send the start of a ledger before core has finished writing its end. It also
//! keeps the running length and checksum the `LedgerEnd` record needs.

use bytes::{Bytes, BytesMut};
use xxhash_rust::xxh3::Xxh3;

use crate::compress::Compressor;
use crate::frame::{Chunk, ChunkHeader, LedgerEnd};

/// Default raw bytes per chunk. 256 KiB matches the largest pieces core writes, keeps a chunk's
/// compression at about 0.5 ms on one core (so several cores can work on one ledger in parallel)
/// and stays well under sled's blob threshold when chunks are stored as single values.
pub const DEFAULT_CHUNK_SIZE: usize = 256 << 10;

/// One chunk of raw ledger bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawChunk {
    /// Index within the ledger, from 0.
    pub index: u32,
    /// Offset of the first byte within the ledger.
    pub offset: u64,
    /// The raw bytes.
    pub data: Bytes,
}

/// What the end record of a chunked ledger needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerSummary {
    /// Chunks cut.
    pub chunk_count: u32,
    /// Total raw length.
    pub raw_len: u64,
    /// [`crate::checksum`] of the raw bytes.
    pub checksum: u64,
}

impl LedgerSummary {
    /// The end record of ledger `seq` with this summary, its header hashes and the source's
    /// first and last byte times.
    pub fn end(
        self,
        seq: u32,
        header_hash: [u8; 32],
        previous_hash: [u8; 32],
        first_byte_ns: u64,
        last_byte_ns: u64,
    ) -> LedgerEnd {
        LedgerEnd {
            seq,
            chunk_count: self.chunk_count,
            raw_len: self.raw_len,
            checksum: self.checksum,
            header_hash,
            previous_hash,
            first_byte_ns,
            last_byte_ns,
        }
    }
}

/// Cuts one ledger at a time into chunks of a fixed raw size (the last may be shorter).
pub struct Chunker {
    chunk_size: usize,
    buf: BytesMut,
    index: u32,
    offset: u64,
    hasher: Xxh3,
}

impl std::fmt::Debug for Chunker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chunker")
            .field("chunk_size", &self.chunk_size)
            .field("index", &self.index)
            .field("offset", &self.offset)
            .field("buffered", &self.buf.len())
            .finish()
    }
}

impl Chunker {
    /// A chunker cutting `chunk_size` raw bytes per chunk (at least 1).
    pub fn new(chunk_size: usize) -> Chunker {
        let chunk_size = chunk_size.max(1);
        Chunker {
            chunk_size,
            buf: BytesMut::with_capacity(chunk_size),
            index: 0,
            offset: 0,
            hasher: Xxh3::new(),
        }
    }

    /// Raw bytes per chunk.
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// Bytes of the current ledger taken so far.
    pub fn ledger_len(&self) -> u64 {
        self.offset + self.buf.len() as u64
    }

    /// Takes the next piece of the current ledger and appends every chunk it completes to `out`.
    pub fn push(&mut self, mut piece: &[u8], out: &mut Vec<RawChunk>) {
        self.hasher.update(piece);
        while !piece.is_empty() {
            let room = self.chunk_size - self.buf.len();
            let take = room.min(piece.len());
            self.buf.extend_from_slice(&piece[..take]);
            piece = &piece[take..];
            if self.buf.len() == self.chunk_size {
                out.push(self.cut());
            }
        }
    }

    fn cut(&mut self) -> RawChunk {
        let data = std::mem::replace(&mut self.buf, BytesMut::with_capacity(self.chunk_size));
        let chunk = RawChunk {
            index: self.index,
            offset: self.offset,
            data: data.freeze(),
        };
        self.index += 1;
        self.offset += chunk.data.len() as u64;
        chunk
    }

    /// Ends the current ledger: returns its last, partial chunk (if any) and its summary, and
    /// makes the chunker ready for the next ledger.
    pub fn finish(&mut self) -> (Option<RawChunk>, LedgerSummary) {
        let last = (!self.buf.is_empty()).then(|| self.cut());
        let summary = LedgerSummary {
            chunk_count: self.index,
            raw_len: self.offset,
            checksum: self.hasher.digest(),
        };
        self.reset();
        (last, summary)
    }

    /// Forgets the current ledger (a record cut short by a dying source is never finished).
    pub fn reset(&mut self) {
        self.buf.clear();
        self.index = 0;
        self.offset = 0;
        self.hasher.reset();
    }
}

/// Cuts a whole ledger at once (for replays and tests).
pub fn chunk_ledger(raw: &Bytes, chunk_size: usize) -> (Vec<RawChunk>, LedgerSummary) {
    let chunk_size = chunk_size.max(1);
    let chunks: Vec<RawChunk> = (0..raw.len())
        .step_by(chunk_size)
        .enumerate()
        .map(|(i, start)| RawChunk {
            index: i as u32,
            offset: start as u64,
            data: raw.slice(start..(start + chunk_size).min(raw.len())),
        })
        .collect();
    let summary = LedgerSummary {
        chunk_count: chunks.len() as u32,
        raw_len: raw.len() as u64,
        checksum: crate::checksum(raw),
    };
    (chunks, summary)
}

/// Cuts a whole ledger and compresses each chunk once: its chunk frames, in index order, and
/// its summary (for replays, tests and benchmarks).
pub fn ledger_chunks(
    seq: u32,
    raw: &Bytes,
    chunk_size: usize,
    comp: &mut Compressor,
) -> (Vec<Chunk>, LedgerSummary) {
    let (chunks, summary) = chunk_ledger(raw, chunk_size);
    let chunks = chunks
        .into_iter()
        .map(|c| {
            let (codec, payload) = comp.compress(&c.data);
            Chunk {
                header: ChunkHeader {
                    seq,
                    index: c.index,
                    raw_offset: c.offset,
                    raw_len: c.data.len() as u32,
                    codec,
                },
                payload,
            }
        })
        .collect();
    (chunks, summary)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn cuts_as_soon_as_full() {
        let mut c = Chunker::new(4);
        let mut out = Vec::new();
        c.push(b"abc", &mut out);
        assert!(out.is_empty());
        c.push(b"d", &mut out);
        assert_eq!(out.len(), 1, "a full chunk is cut before the ledger ends");
        assert_eq!(&out[0].data[..], b"abcd");
        c.push(b"efghijklm", &mut out);
        assert_eq!(out.len(), 3);
        let (last, s) = c.finish();
        let last = last.unwrap();
        assert_eq!(
            (last.index, last.offset, &last.data[..]),
            (3, 12, &b"m"[..])
        );
        assert_eq!(s.chunk_count, 4);
        assert_eq!(s.raw_len, 13);
        assert_eq!(s.checksum, crate::checksum(b"abcdefghijklm"));
        // Ready for the next ledger.
        c.push(b"xy", &mut out);
        let (last, s) = c.finish();
        assert_eq!(last.unwrap().index, 0);
        assert_eq!(s.raw_len, 2);
    }

    #[test]
    fn exact_multiple_has_no_empty_tail() {
        let mut c = Chunker::new(4);
        let mut out = Vec::new();
        c.push(b"abcdefgh", &mut out);
        let (last, s) = c.finish();
        assert!(last.is_none());
        assert_eq!(s.chunk_count, 2);
        let (last, s) = c.finish();
        assert!(last.is_none());
        assert_eq!((s.chunk_count, s.raw_len), (0, 0));
    }

    #[test]
    fn reset_forgets_a_partial_ledger() {
        let mut c = Chunker::new(4);
        let mut out = Vec::new();
        c.push(b"abcdef", &mut out);
        c.reset();
        c.push(b"zz", &mut out);
        let (last, s) = c.finish();
        assert_eq!(&last.unwrap().data[..], b"zz");
        assert_eq!(s.checksum, crate::checksum(b"zz"));
    }

    proptest! {
        #[test]
        fn pieces_of_any_size_give_the_same_chunks(
            data in prop::collection::vec(any::<u8>(), 0..5000),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..20),
            size in 1usize..700,
        ) {
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(data.len() + 1)).collect();
            points.sort_unstable();
            let mut c = Chunker::new(size);
            let mut got = Vec::new();
            let mut prev = 0;
            for p in points.into_iter().chain([data.len()]) {
                c.push(&data[prev..p], &mut got);
                prev = p;
            }
            let (last, summary) = c.finish();
            got.extend(last);
            let (want, want_summary) = chunk_ledger(&Bytes::from(data.clone()), size);
            prop_assert_eq!(got, want);
            prop_assert_eq!(summary, want_summary);
        }
    }
}
