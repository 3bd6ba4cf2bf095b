//! The retention ring: the last N ledgers, kept as the compressed chunks that were sent live, so
//! a subscriber that starts inside the ring (or falls behind) is replayed the exact bytes with no
//! recompression.
//!
//! What it does: stores one complete ledger at a time (its [`LedgerEnd`] and its chunks) in one
//! atomic sled batch together with the pruning that ledger causes, flushes at every ledger
//! boundary, serves a ledger only after every stored value passes its checksum and the chunk set
//! is complete, refuses to splice two runs or mix two networks, and repairs a torn last ledger
//! after a crash. What it does not do: decompress, check the ledger's own checksum or hash chain
//! against its bytes (the pipeline and the subscriber do that), or run on the source's path: the
//! API is synchronous and the relay calls it from a dedicated writer thread.
//!
//! # Storage layout
//!
//! One sled tree (the default one, so that a ledger, its pruning and the epoch can share one
//! atomic batch). Integers are big-endian so that key order is sequence order.
//!
//! | key | value body |
//! |---|---|
//! | `mformat` | format version, `u32` ([`FORMAT_VERSION`]) |
//! | `mepoch` | run counter, `u64`, bumped by [`Ring::reset`] |
//! | `mnetwork` | network name, UTF-8 (absent: never configured) |
//! | `l` seq `u32` | ledger record: the [`LedgerEnd`] fields (104 bytes, wire order), the number of parts (`u32`) and the ledger's stored bytes (`u64`) |
//! | `c` seq `u32` part `u32` | one part of one chunk (below) |
//!
//! Every value is `xxh3-64(body) u64 || body` and is checked on every read. A ledger's chunks are
//! cut into parts of at most [`PART_MAX`] payload bytes, numbered 0.. across the whole ledger so
//! that pruning can delete a ledger's keys from its record alone, without reading its chunks. A
//! part's body starts with its own sequence and part number (so a value moved under another key
//! is caught) and a kind byte: a chunk's first part carries the chunk's index, codec, raw offset,
//! raw length and payload length before its first payload bytes; continuation parts carry only
//! payload bytes.
//!
//! # Sizing: 64 KiB parts, 8 MiB segments, a 10 ms flusher
//!
//! sled 0.34 writes any log item larger than `segment_size / 4` to its own blob file, which is
//! never fsynced, and in a measured ring with 2 MiB values disk use grew to 15x the live bytes
//! (see `shared/NOTES.md`). The item that matters is not the value but the *leaf node* image sled
//! writes when it consolidates or splits a page, and sled splits a leaf only by count (above 16
//! entries), never by size. So the largest leaf image is 17 values plus keys: with parts of at
//! most 64 KiB that is about 1.1 MiB, below the 2 MiB blob threshold of 8 MiB segments, for any
//! chunk size, including 4 MiB raw chunks. [`SEGMENT_SIZE`] is persisted by sled and reopening
//! with another value fails, so it is a constant, never configuration.
//!
//! Disk use is then set by sled's segment cleaner, which only drains a segment once at most half
//! of it is live and runs only in sled's flusher thread, at least one page per flusher period.
//! Measured with 14.5 MiB ledgers of 256 KiB chunks, 20 kept (290 MiB live), one ledger per
//! 200 ms (`ring_disk_use` in `relay/tests/ring.rs`): disk is 1.8-1.9x live on average at steady
//! state, at most 1.99x (2.4x with 16 MiB segments, 128 KiB parts and a 100 ms flusher; 2.95x
//! with a 1 s flusher); with 80 kept (1.16 GiB live) 1.42x, at most 1.45x, as sled's fixed
//! floor of a few segments weighs less. Appending as fast as possible (about 250 MB/s, far above
//! the network's 3 MB/s) outruns the cleaner and holds near 2.9x.
//!
//! # Crash consistency
//!
//! A sled batch is recovered atomically and every append ends with a flush, so after `kill -9`
//! the store holds every ledger whose [`Ring::append`] returned. [`Ring::open`] still repairs
//! defensively: it keeps only the newest run of records that are readable, consecutive and
//! hash-linked, fully verifies the newest ledger (dropping it, and then the one before, while it
//! is torn), and deletes chunk parts that no kept record owns at either end of the range.

use std::collections::VecDeque;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ledger_relay_wire::checksum;
use ledger_relay_wire::compress::Codec;
use ledger_relay_wire::frame::LedgerEnd;
use nix::fcntl::{Flock, FlockArg};
use tracing::{info, warn};

#[cfg(test)]
mod tests;

/// sled segment size, persisted by sled in the store. 8 MiB puts the blob threshold (a quarter of
/// it, 2 MiB) well above the largest leaf image (17 parts, about 1.1 MiB; see the module doc), and
/// measured lower disk use than 16 MiB (1.73x against 2.01x live over 200 ledgers of
/// `ring_disk_use`).
pub const SEGMENT_SIZE: usize = 8 << 20;

/// Largest number of payload bytes in one stored part: 17 parts (sled's largest leaf) stay near
/// 1.1 MiB, below the 2 MiB blob threshold of [`SEGMENT_SIZE`].
pub const PART_MAX: usize = 64 << 10;

/// Stored format version; a store written with another one is refused.
pub const FORMAT_VERSION: u32 = 1;

/// Default number of ledgers kept: about 14 hours of the public network.
pub const DEFAULT_MAX_LEDGERS: u32 = 10_000;

/// Default cap on live bytes: 64 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 64 << 30;

/// sled's page cache. Replays mostly read recent ledgers, which are the recently written pages;
/// sled's 1 GiB default is more memory than the relay should spend on it.
pub const CACHE_BYTES: u64 = 256 << 20;

/// sled's background flusher period. That thread is also sled's only segment cleaner, and it
/// rewrites at least one page per period, so the period bounds how fast the space of pruned
/// ledgers comes back: measured with 14.5 MiB ledgers, 20 kept, 1000 ms gave 2.95x live, 100 ms
/// 2.4x, 10 ms 2.0x (1.73x with 8 MiB segments), 2 ms no better. Appends flush explicitly, so
/// this is not about durability.
const FLUSH_EVERY_MS: u64 = 10;

/// Least time between attempts to open the store again after a failed write.
pub const REOPEN_EVERY: Duration = Duration::from_secs(1);

/// sled's store file in the ring directory, which sled locks (`flock`) while a `Db` is open.
const SLED_FILE: &str = "db";

/// How long `open` waits for the store lock of a `Ring` that is still closing: sled's background
/// threads keep the file open for a moment after its `Db` is dropped.
const RELEASE_WAIT: Duration = Duration::from_secs(2);

const META_FORMAT: &[u8] = b"mformat";
const META_EPOCH: &[u8] = b"mepoch";
const META_NETWORK: &[u8] = b"mnetwork";
const RECORD_PREFIX: u8 = b'l';
const CHUNK_PREFIX: u8 = b'c';

/// `LedgerEnd` fields (104) + parts (4) + stored bytes (8).
const RECORD_BODY_LEN: usize = 104 + 4 + 8;
const SEAL_LEN: usize = 8;
const PART_START: u8 = 0;
const PART_CONTINUE: u8 = 1;
/// seq + part + kind.
const PART_ID_LEN: usize = 4 + 4 + 1;
/// index + codec + raw offset + raw length + payload length.
const CHUNK_HEADER_LEN: usize = 4 + 1 + 8 + 4 + 4;

/// Where the ring lives and how much it keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingConfig {
    /// The sled database directory (created if missing).
    pub dir: PathBuf,
    /// Ledgers kept, at least 1 (default [`DEFAULT_MAX_LEDGERS`]).
    pub max_ledgers: u32,
    /// Live bytes kept (stored payloads plus records), at least 1 (default
    /// [`DEFAULT_MAX_BYTES`]). The newest ledger is kept even if it alone is larger.
    pub max_bytes: u64,
    /// The network the ring belongs to. A ring recorded for another network is refused; a ring
    /// that never recorded one adopts this one; `None` accepts whatever is recorded.
    pub network: Option<String>,
}

impl RingConfig {
    /// A configuration with the default bounds and no network.
    pub fn new(dir: impl Into<PathBuf>) -> RingConfig {
        RingConfig {
            dir: dir.into(),
            max_ledgers: DEFAULT_MAX_LEDGERS,
            max_bytes: DEFAULT_MAX_BYTES,
            network: None,
        }
    }
}

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

/// A snapshot of the ring's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingStats {
    /// Oldest sequence held.
    pub oldest: Option<u32>,
    /// Newest sequence held.
    pub newest: Option<u32>,
    /// Ledgers held.
    pub ledgers: u64,
    /// Bytes of the stored values of the held ledgers (payload parts and records, with their
    /// headers and checksums; keys and sled's own overhead excluded).
    pub live_bytes: u64,
    /// Size of every file under the sled directory (walked; 0 for files that vanish meanwhile).
    pub disk_bytes: u64,
    /// Run counter: bumped by every [`Ring::reset`].
    pub epoch: u64,
}

/// A ring operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    /// sled failed (IO error, corrupted log, or a store written with another segment size).
    #[error("ring store failed")]
    Sled(#[from] sled::Error),
    /// A filesystem operation on the ring directory failed.
    #[error("ring directory {path}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The configuration cannot work.
    #[error("invalid ring configuration: {detail}")]
    Config {
        /// What is wrong.
        detail: &'static str,
    },
    /// The store was recorded for another network.
    #[error("ring holds network {stored:?}, configured for {configured:?}")]
    NetworkMismatch {
        /// Network recorded in the store.
        stored: String,
        /// Network configured.
        configured: String,
    },
    /// The store was written in a format this version does not read.
    #[error("ring format version {found} is not supported (expected {expected})")]
    Format {
        /// Version found in the store.
        found: u32,
        /// Version this build reads and writes.
        expected: u32,
    },
    /// A metadata value is missing or unreadable.
    #[error("ring metadata {key} is unreadable: {detail}")]
    BadMeta {
        /// Which metadata key.
        key: &'static str,
        /// What is wrong.
        detail: &'static str,
    },
    /// An appended ledger does not continue the ring: its sequence is not newest + 1, or its
    /// previous hash is not the newest ledger's header hash. Nothing was written.
    #[error(
        "ledger {seq} does not follow ledger {newest} (previous hash {} vs header hash {})",
        hex8(previous_hash),
        hex8(newest_hash)
    )]
    Discontinuity {
        /// Newest sequence held.
        newest: u32,
        /// Its header hash.
        newest_hash: [u8; 32],
        /// Sequence offered.
        seq: u32,
        /// Previous hash of the ledger offered.
        previous_hash: [u8; 32],
    },
    /// The ledger offered to append is not self-consistent (chunk count, indices, raw offsets
    /// and lengths, payload lengths). Nothing was written.
    #[error("ledger {seq} is malformed: {detail}")]
    BadRecord {
        /// Sequence offered.
        seq: u32,
        /// What is wrong.
        detail: String,
    },
    /// The store is closed after a failed write and not yet opened again (see
    /// [`Ring::append`]).
    #[error("ring store closed after a failed write")]
    Unavailable,
    /// A held ledger failed verification on read: a checksum, a missing or misplaced value, or
    /// chunks that do not tile the ledger. Its bytes are not returned.
    #[error("stored ledger {seq} is corrupt: {detail}")]
    Corrupt {
        /// Sequence read.
        seq: u32,
        /// What failed.
        detail: String,
    },
}

/// The first bytes of a hash in hex, for messages.
fn hex8(h: &[u8; 32]) -> String {
    h[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// A held ledger, as the writer needs it for pruning and accounting.
#[derive(Debug, Clone, Copy)]
struct Held {
    seq: u32,
    parts: u32,
    bytes: u64,
}

#[derive(Debug)]
struct State {
    /// Held ledgers, oldest first, consecutive.
    held: VecDeque<Held>,
    /// Header hash of the newest held ledger.
    newest_hash: [u8; 32],
    live_bytes: u64,
    epoch: u64,
}

impl State {
    fn range(&self) -> Option<(u32, u32)> {
        Some((self.held.front()?.seq, self.held.back()?.seq))
    }
}

/// The retention ring. `Send + Sync`; share it through an `Arc`. Appends and resets are
/// serialized internally; reads run concurrently with each other and with an append's flush.
#[derive(Debug)]
pub struct Ring {
    /// The store; `None` while it is closed after a failed write (see [`Ring::append`]).
    db: RwLock<Option<sled::Db>>,
    dir: PathBuf,
    max_ledgers: u32,
    max_bytes: u64,
    network: Option<String>,
    /// Serializes appends and resets (the writer side).
    writer: Mutex<()>,
    /// When a write last failed or the store was last reopened after one; `None` while
    /// writes succeed. Used under `writer`.
    failed: Mutex<Option<Instant>>,
    /// What is held. Readers hold it shared for a whole `get`, so a ledger is never pruned or
    /// reset under a reader; the writer takes it exclusively only to apply a batch and to
    /// publish a flushed ledger.
    state: RwLock<State>,
}

/// A ledger record as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Record {
    end: LedgerEnd,
    parts: u32,
    bytes: u64,
}

/// Why reading a ledger failed.
enum ReadFail {
    Sled(sled::Error),
    Corrupt(String),
}

impl From<sled::Error> for ReadFail {
    fn from(e: sled::Error) -> Self {
        ReadFail::Sled(e)
    }
}

impl ReadFail {
    fn into_error(self, seq: u32) -> RingError {
        match self {
            ReadFail::Sled(e) => RingError::Sled(e),
            ReadFail::Corrupt(detail) => RingError::Corrupt { seq, detail },
        }
    }
}

impl Ring {
    /// Opens the ring in `cfg.dir`, creating it if needed.
    ///
    /// Refuses a store recorded for another network or written in another format, and repairs
    /// what a crash could leave (see the module doc): the result holds a consecutive,
    /// hash-linked range whose newest ledger verifies.
    pub fn open(cfg: &RingConfig) -> Result<Ring, RingError> {
        if cfg.max_ledgers == 0 {
            return Err(RingError::Config {
                detail: "max_ledgers must be at least 1",
            });
        }
        if cfg.max_bytes == 0 {
            return Err(RingError::Config {
                detail: "max_bytes must be at least 1",
            });
        }
        fs::create_dir_all(&cfg.dir).map_err(|source| RingError::Io {
            path: cfg.dir.clone(),
            source,
        })?;
        wait_for_release(&cfg.dir.join(SLED_FILE));
        let db = sled::Config::new()
            .path(&cfg.dir)
            .segment_size(SEGMENT_SIZE)
            .cache_capacity(CACHE_BYTES)
            .flush_every_ms(Some(FLUSH_EVERY_MS))
            .open()?;

        let mut batch = sled::Batch::default();
        let mut dirty = false;

        // Metadata.
        let epoch = match db.get(META_FORMAT)? {
            None => {
                if db.first()?.is_some() {
                    return Err(RingError::BadMeta {
                        key: "format",
                        detail: "missing from a non-empty store",
                    });
                }
                batch.insert(
                    META_FORMAT,
                    seal(|b| b.extend_from_slice(&FORMAT_VERSION.to_be_bytes())),
                );
                batch.insert(
                    META_EPOCH,
                    seal(|b| b.extend_from_slice(&0u64.to_be_bytes())),
                );
                dirty = true;
                0
            }
            Some(v) => {
                let found = unseal(&v)
                    .and_then(|b| <[u8; 4]>::try_from(b).ok())
                    .map(u32::from_be_bytes)
                    .ok_or(RingError::BadMeta {
                        key: "format",
                        detail: "bad checksum or length",
                    })?;
                if found != FORMAT_VERSION {
                    return Err(RingError::Format {
                        found,
                        expected: FORMAT_VERSION,
                    });
                }
                let v = db.get(META_EPOCH)?.ok_or(RingError::BadMeta {
                    key: "epoch",
                    detail: "missing",
                })?;
                unseal(&v)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_be_bytes)
                    .ok_or(RingError::BadMeta {
                        key: "epoch",
                        detail: "bad checksum or length",
                    })?
            }
        };
        let stored_network = match db.get(META_NETWORK)? {
            None => None,
            Some(v) => Some(
                unseal(&v)
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .map(str::to_owned)
                    .ok_or(RingError::BadMeta {
                        key: "network",
                        detail: "bad checksum or not UTF-8",
                    })?,
            ),
        };
        let network = match (stored_network, &cfg.network) {
            (Some(stored), Some(configured)) if stored != *configured => {
                return Err(RingError::NetworkMismatch {
                    stored,
                    configured: configured.clone(),
                });
            }
            (None, Some(configured)) => {
                batch.insert(
                    META_NETWORK,
                    seal(|b| b.extend_from_slice(configured.as_bytes())),
                );
                dirty = true;
                Some(configured.clone())
            }
            (stored, _) => stored,
        };

        // Records: keep the newest run that decodes, is consecutive and is hash-linked.
        let mut records: Vec<(Vec<u8>, Option<Record>)> = Vec::new();
        for kv in db.scan_prefix([RECORD_PREFIX]) {
            let (k, v) = kv?;
            let rec = record_seq(&k).and_then(|seq| decode_record(seq, &v).ok());
            records.push((k.to_vec(), rec));
        }
        // Unreadable records above the newest readable one are a torn tail: skip them.
        let mut skip_top = records.len();
        while skip_top > 0 && records[skip_top - 1].1.is_none() {
            skip_top -= 1;
        }
        let mut keep_from = skip_top;
        while keep_from > 0 {
            let Some(rec) = records[keep_from - 1].1 else {
                break;
            };
            if keep_from < skip_top {
                if let Some(next) = records[keep_from].1 {
                    let linked = rec.end.seq.checked_add(1) == Some(next.end.seq)
                        && next.end.previous_hash == rec.end.header_hash;
                    if !linked {
                        break;
                    }
                }
            }
            keep_from -= 1;
        }
        let dropped_records = records[..keep_from].iter().chain(&records[skip_top..]);
        for (key, rec) in dropped_records {
            warn!(key = ?key, readable = rec.is_some(), "ring: dropping a record outside the newest consecutive run");
            batch.remove(key.as_slice());
            if let Some(seq) = record_seq(key) {
                remove_all_parts(&db, &mut batch, seq)?;
            }
            dirty = true;
        }
        let mut kept: Vec<Record> = records[keep_from..skip_top]
            .iter()
            .filter_map(|r| r.1)
            .collect();

        // The newest ledger must verify completely; a torn one is dropped.
        while let Some(last) = kept.last().copied() {
            match read_ledger(&db, last.end.seq, Some(last)) {
                Ok(_) => break,
                Err(ReadFail::Sled(e)) => return Err(e.into()),
                Err(ReadFail::Corrupt(detail)) => {
                    warn!(seq = last.end.seq, %detail, "ring: dropping a torn newest ledger");
                    batch.remove(&record_key(last.end.seq)[..]);
                    remove_all_parts(&db, &mut batch, last.end.seq)?;
                    dirty = true;
                    kept.pop();
                }
            }
        }

        // Parts that no kept record owns, below the oldest or past the newest's last part.
        let (below, above) = match (kept.first(), kept.last()) {
            (Some(first), Some(last)) => (
                part_key(first.end.seq, 0),
                part_key(last.end.seq, last.parts),
            ),
            _ => (part_key(0, 0), part_key(0, 0)),
        };
        for kv in db.range([CHUNK_PREFIX].as_slice()..below.as_slice()) {
            let (k, _) = kv?;
            batch.remove(k);
            dirty = true;
        }
        for kv in db.range(above.as_slice()..[CHUNK_PREFIX + 1].as_slice()) {
            let (k, _) = kv?;
            batch.remove(k);
            dirty = true;
        }

        if dirty {
            db.apply_batch(batch)?;
            db.flush()?;
        }

        let held: VecDeque<Held> = kept
            .iter()
            .map(|r| Held {
                seq: r.end.seq,
                parts: r.parts,
                bytes: r.bytes,
            })
            .collect();
        let state = State {
            newest_hash: kept.last().map(|r| r.end.header_hash).unwrap_or_default(),
            live_bytes: held.iter().map(|h| h.bytes).sum(),
            held,
            epoch,
        };
        info!(
            dir = %cfg.dir.display(),
            range = ?state.range(),
            epoch,
            network = network.as_deref().unwrap_or("-"),
            recovered = db.was_recovered(),
            "ring opened"
        );
        Ok(Ring {
            db: RwLock::new(Some(db)),
            dir: cfg.dir.clone(),
            max_ledgers: cfg.max_ledgers,
            max_bytes: cfg.max_bytes,
            network,
            writer: Mutex::new(()),
            failed: Mutex::new(None),
            state: RwLock::new(state),
        })
    }

    /// Appends one complete ledger, in one sled batch together with the pruning it causes
    /// (oldest ledgers beyond `max_ledgers` or `max_bytes`), then flushes; the ledger is visible
    /// to [`Ring::range`] and [`Ring::get`] only once flushed.
    ///
    /// It must continue the ring: `end.seq == newest + 1` and `end.previous_hash` equal to the
    /// newest ledger's header hash (an empty ring accepts any ledger but sequence 0). Otherwise
    /// it returns [`RingError::Discontinuity`] and writes nothing; a ledger whose chunks do not
    /// match its end record is [`RingError::BadRecord`], also writing nothing.
    ///
    /// If the store fails to write (disk full or read-only), the error is returned and the
    /// store is closed: sled 0.34 refuses every write after a failed one (its error is global
    /// to the store and cleared only by opening it again). Later appends (and resets) open it
    /// again, at most every [`REOPEN_EVERY`] (until then they fail with
    /// [`RingError::Unavailable`]), which also repairs what the failed write left; the ring
    /// then holds what the disk kept, so the next ledger usually is a
    /// [`RingError::Discontinuity`] and the caller starts a new run.
    pub fn append(&self, end: &LedgerEnd, chunks: &[StoredChunk]) -> Result<(), RingError> {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        self.reopen_if_failed()?;
        let r = self.append_locked(end, chunks);
        self.note_failure(&r);
        r
    }

    fn append_locked(&self, end: &LedgerEnd, chunks: &[StoredChunk]) -> Result<(), RingError> {
        validate(end, chunks)?;

        {
            let st = self.read_state();
            if let Some(newest) = st.held.back() {
                if newest.seq.checked_add(1) != Some(end.seq) || end.previous_hash != st.newest_hash
                {
                    return Err(RingError::Discontinuity {
                        newest: newest.seq,
                        newest_hash: st.newest_hash,
                        seq: end.seq,
                        previous_hash: end.previous_hash,
                    });
                }
            }
        }

        // The new ledger's values.
        let mut batch = sled::Batch::default();
        let mut parts = 0u32;
        let mut bytes = 0u64;
        for chunk in chunks {
            let payload = &chunk.payload[..];
            let mut pieces = payload.chunks(PART_MAX);
            let first = pieces.next().unwrap_or(&[]);
            let value = seal(|b| {
                put_part_id(b, end.seq, parts, PART_START);
                b.extend_from_slice(&chunk.index.to_be_bytes());
                b.push(chunk.codec as u8);
                b.extend_from_slice(&chunk.raw_offset.to_be_bytes());
                b.extend_from_slice(&chunk.raw_len.to_be_bytes());
                // validate() bounded the payload by raw_len, a u32.
                b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
                b.extend_from_slice(first);
            });
            bytes += value.len() as u64;
            batch.insert(&part_key(end.seq, parts)[..], value);
            parts += 1;
            for piece in pieces {
                let value = seal(|b| {
                    put_part_id(b, end.seq, parts, PART_CONTINUE);
                    b.extend_from_slice(piece);
                });
                bytes += value.len() as u64;
                batch.insert(&part_key(end.seq, parts)[..], value);
                parts += 1;
            }
        }
        // Every record has the same length, so a record can count its own bytes.
        bytes += (SEAL_LEN + RECORD_BODY_LEN) as u64;
        let record = Record {
            end: *end,
            parts,
            bytes,
        };
        batch.insert(&record_key(end.seq)[..], encode_record(&record));

        // Pruning, oldest first, never the new ledger. The writer lock keeps `held` as it was
        // checked above.
        let dropped = {
            let st = self.read_state();
            let mut count = st.held.len() as u64 + 1;
            let mut live = st.live_bytes + bytes;
            let mut dropped = 0;
            for old in &st.held {
                if count <= u64::from(self.max_ledgers) && live <= self.max_bytes {
                    break;
                }
                batch.remove(&record_key(old.seq)[..]);
                for part in 0..old.parts {
                    batch.remove(&part_key(old.seq, part)[..]);
                }
                live -= old.bytes;
                count -= 1;
                dropped += 1;
            }
            dropped
        };

        {
            let mut st = self.write_state();
            self.db()?.apply_batch(batch)?;
            // Pruned ledgers disappear with the batch; the new one appears after the flush.
            for _ in 0..dropped {
                if let Some(old) = st.held.pop_front() {
                    st.live_bytes -= old.bytes;
                }
            }
        }
        let flushed = self.db()?.flush();
        {
            let mut st = self.write_state();
            st.held.push_back(Held {
                seq: end.seq,
                parts,
                bytes,
            });
            st.newest_hash = end.header_hash;
            st.live_bytes += bytes;
        }
        flushed?;
        Ok(())
    }

    /// Starts a new run: removes every ledger and bumps the epoch, in one batch, then flushes.
    ///
    /// The relay calls it when its source is not contiguous with what the ring holds: a new run
    /// must never be spliced onto an old one.
    pub fn reset(&self) -> Result<(), RingError> {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        self.reopen_if_failed()?;
        let r = self.reset_locked();
        self.note_failure(&r);
        r
    }

    fn reset_locked(&self) -> Result<(), RingError> {
        {
            let mut st = self.write_state();
            let mut batch = sled::Batch::default();
            for old in &st.held {
                batch.remove(&record_key(old.seq)[..]);
                for part in 0..old.parts {
                    batch.remove(&part_key(old.seq, part)[..]);
                }
            }
            let epoch = st.epoch + 1;
            batch.insert(
                META_EPOCH,
                seal(|b| b.extend_from_slice(&epoch.to_be_bytes())),
            );
            self.db()?.apply_batch(batch)?;
            info!(epoch, dropped = st.held.len(), "ring reset");
            st.held.clear();
            st.live_bytes = 0;
            st.newest_hash = [0; 32];
            st.epoch = epoch;
        }
        self.db()?.flush()?;
        Ok(())
    }

    /// The store, unless it is closed after a failed write.
    fn db(&self) -> Result<sled::Db, RingError> {
        self.db
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(RingError::Unavailable)
    }

    /// Remembers a failed write (called under the writer lock).
    fn note_failure(&self, r: &Result<(), RingError>) {
        if let Err(RingError::Sled(_) | RingError::Unavailable) = r {
            *self.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        }
    }

    /// After a failed write, closes the store and opens it again (called under the writer
    /// lock), at most every [`REOPEN_EVERY`]; see [`Ring::append`].
    fn reopen_if_failed(&self) -> Result<(), RingError> {
        let mut failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(at) = *failed else {
            return Ok(());
        };
        if at.elapsed() < REOPEN_EVERY {
            return Err(RingError::Unavailable);
        }
        *failed = Some(Instant::now());
        // Serve nothing while the store is closed; readers hold `state` for a whole read, so
        // none is using the old store once this returns.
        let old = {
            let mut st = self.write_state();
            st.held.clear();
            st.live_bytes = 0;
            st.newest_hash = [0; 32];
            self.db
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
        };
        // sled releases its lock on the store when the last handle goes.
        drop(old);
        let Ring { db, state, .. } = Ring::open(&RingConfig {
            dir: self.dir.clone(),
            max_ledgers: self.max_ledgers,
            max_bytes: self.max_bytes,
            network: self.network.clone(),
        })?;
        let mut st = self.write_state();
        *st = state.into_inner().unwrap_or_else(PoisonError::into_inner);
        *self.db.write().unwrap_or_else(PoisonError::into_inner) =
            db.into_inner().unwrap_or_else(PoisonError::into_inner);
        *failed = None;
        info!(range = ?st.range(), "ring store reopened after a failed write");
        Ok(())
    }

    /// `(oldest, newest)` held, from memory.
    pub fn range(&self) -> Option<(u32, u32)> {
        self.read_state().range()
    }

    /// The newest sequence held and its header hash, from memory.
    pub fn newest(&self) -> Option<(u32, [u8; 32])> {
        let st = self.read_state();
        st.held.back().map(|h| (h.seq, st.newest_hash))
    }

    /// The network recorded for this ring, if any.
    pub fn network(&self) -> Option<&str> {
        self.network.as_deref()
    }

    /// Reads and verifies a held ledger: every value's checksum, the record's sequence, and a
    /// chunk set that is complete (`0..chunk_count`) and tiles the raw length. `Ok(None)` if the
    /// ledger is not held; [`RingError::Corrupt`] if any check fails (no bytes are returned).
    pub fn get(&self, seq: u32) -> Result<Option<(LedgerEnd, Vec<StoredChunk>)>, RingError> {
        // Held shared for the whole read, so the writer cannot prune or reset this ledger under
        // it (sled batches are atomic for recovery, not for concurrent readers).
        let st = self.read_state();
        match st.range() {
            Some((oldest, newest)) if (oldest..=newest).contains(&seq) => {}
            _ => return Ok(None),
        }
        let db = self.db()?;
        let got = read_ledger(&db, seq, None).map_err(|e| e.into_error(seq))?;
        drop(st);
        Ok(Some(got))
    }

    /// Sizes: held range and bytes from memory, disk use by walking the directory.
    pub fn stats(&self) -> RingStats {
        let (oldest, newest, ledgers, live_bytes, epoch) = {
            let st = self.read_state();
            let range = st.range();
            (
                range.map(|r| r.0),
                range.map(|r| r.1),
                st.held.len() as u64,
                st.live_bytes,
                st.epoch,
            )
        };
        RingStats {
            oldest,
            newest,
            ledgers,
            live_bytes,
            disk_bytes: dir_size(&self.dir),
            epoch,
        }
    }

    /// Flushes sled to disk (appends already flush; this is for shutdown paths).
    pub fn flush(&self) -> Result<(), RingError> {
        self.db()?.flush()?;
        Ok(())
    }

    fn read_state(&self) -> RwLockReadGuard<'_, State> {
        // A panic while holding the lock cannot leave State half-updated in a way that matters:
        // each update is a few field writes after the sled batch succeeded.
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_state(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Checks that the chunks handed to `append` are exactly the ledger `end` describes.
fn validate(end: &LedgerEnd, chunks: &[StoredChunk]) -> Result<(), RingError> {
    let bad = |detail: String| RingError::BadRecord {
        seq: end.seq,
        detail,
    };
    if end.seq == 0 {
        return Err(bad("sequence 0 is reserved for \"none\"".into()));
    }
    if chunks.len() as u64 != u64::from(end.chunk_count) {
        return Err(bad(format!(
            "{} chunks given, end record says {}",
            chunks.len(),
            end.chunk_count
        )));
    }
    let mut offset = 0u64;
    for (i, c) in chunks.iter().enumerate() {
        if c.index as usize != i {
            return Err(bad(format!("chunk {i} carries index {}", c.index)));
        }
        if c.raw_offset != offset {
            return Err(bad(format!(
                "chunk {i} starts at raw offset {}, expected {offset}",
                c.raw_offset
            )));
        }
        if c.raw_len == 0 {
            return Err(bad(format!("chunk {i} has raw length 0")));
        }
        let fits = match c.codec {
            Codec::None => c.payload.len() == c.raw_len as usize,
            _ => c.payload.len() <= c.raw_len as usize,
        };
        if !fits {
            return Err(bad(format!(
                "chunk {i} payload of {} bytes does not fit raw length {} with codec {}",
                c.payload.len(),
                c.raw_len,
                c.codec.name()
            )));
        }
        offset += u64::from(c.raw_len);
    }
    if offset != end.raw_len {
        return Err(bad(format!(
            "chunks cover {offset} raw bytes, end record says {}",
            end.raw_len
        )));
    }
    Ok(())
}

/// Reads a ledger and verifies every value. `record` skips re-reading an already decoded record.
fn read_ledger(
    db: &sled::Tree,
    seq: u32,
    record: Option<Record>,
) -> Result<(LedgerEnd, Vec<StoredChunk>), ReadFail> {
    let corrupt = ReadFail::Corrupt;
    let record = match record {
        Some(r) => r,
        None => {
            let v = db
                .get(record_key(seq))?
                .ok_or_else(|| corrupt("record missing".into()))?;
            decode_record(seq, &v).map_err(corrupt)?
        }
    };
    let end = record.end;
    // Never trust a count for an allocation beyond what the parts can hold.
    let mut chunks = Vec::with_capacity((end.chunk_count.min(record.parts)) as usize);
    // The chunk being assembled: fields and payload so far, and its declared payload length.
    let mut open: Option<(StoredChunk, Vec<u8>, usize)> = None;
    let mut offset = 0u64;
    for part in 0..record.parts {
        let v = db
            .get(part_key(seq, part))?
            .ok_or_else(|| corrupt(format!("part {part} missing")))?;
        let body = unseal(&v).ok_or_else(|| corrupt(format!("part {part} fails its checksum")))?;
        if body.len() < PART_ID_LEN || be_u32(&body[0..4]) != seq || be_u32(&body[4..8]) != part {
            return Err(corrupt(format!("part {part} is stored under another key")));
        }
        let kind = body[8];
        let mut data = &body[PART_ID_LEN..];
        match kind {
            PART_START => {
                if let Some((c, ..)) = &open {
                    return Err(corrupt(format!(
                        "chunk {} is cut short at part {part}",
                        c.index
                    )));
                }
                if data.len() < CHUNK_HEADER_LEN {
                    return Err(corrupt(format!(
                        "part {part} is too short for a chunk header"
                    )));
                }
                let index = be_u32(&data[0..4]);
                let codec = Codec::from_u8(data[4]).ok_or_else(|| {
                    corrupt(format!("part {part} names unknown codec {}", data[4]))
                })?;
                let raw_offset = be_u64(&data[5..13]);
                let raw_len = be_u32(&data[13..17]);
                let payload_len = be_u32(&data[17..21]) as usize;
                data = &data[CHUNK_HEADER_LEN..];
                if index as usize != chunks.len() || raw_offset != offset || raw_len == 0 {
                    return Err(corrupt(format!(
                        "chunk {index} at raw offset {raw_offset} (length {raw_len}) does not \
                         follow the {} chunks before it, ending at raw offset {offset}",
                        chunks.len()
                    )));
                }
                let fits = match codec {
                    Codec::None => payload_len == raw_len as usize,
                    _ => payload_len <= raw_len as usize,
                };
                if !fits {
                    return Err(corrupt(format!(
                        "chunk {index} payload length {payload_len} does not fit raw length {raw_len}"
                    )));
                }
                offset += u64::from(raw_len);
                let chunk = StoredChunk {
                    index,
                    raw_offset,
                    raw_len,
                    codec,
                    payload: Bytes::new(),
                };
                // Reserve no more than the remaining parts can hold.
                let room = data.len() + (record.parts - part - 1) as usize * PART_MAX;
                open = Some((
                    chunk,
                    Vec::with_capacity(payload_len.min(room)),
                    payload_len,
                ));
            }
            PART_CONTINUE => {
                if open.is_none() || data.is_empty() {
                    return Err(corrupt(format!("part {part} continues no chunk")));
                }
            }
            other => return Err(corrupt(format!("part {part} has unknown kind {other}"))),
        }
        let Some((chunk, payload, want)) = open.as_mut() else {
            return Err(corrupt(format!("part {part} continues no chunk")));
        };
        if payload.len() + data.len() > *want {
            return Err(corrupt(format!(
                "chunk {} holds more than its payload length {want}",
                chunk.index
            )));
        }
        payload.extend_from_slice(data);
        if payload.len() == *want {
            if let Some((mut chunk, payload, _)) = open.take() {
                chunk.payload = Bytes::from(payload);
                chunks.push(chunk);
            }
        }
    }
    if let Some((c, ..)) = open {
        return Err(corrupt(format!("chunk {} is missing parts", c.index)));
    }
    if chunks.len() as u64 != u64::from(end.chunk_count) {
        return Err(corrupt(format!(
            "{} chunks stored, end record says {}",
            chunks.len(),
            end.chunk_count
        )));
    }
    if offset != end.raw_len {
        return Err(corrupt(format!(
            "chunks cover {offset} raw bytes, end record says {}",
            end.raw_len
        )));
    }
    Ok((end, chunks))
}

/// Adds the removal of every stored part of `seq` to `batch` (repair path: reads the keys).
fn remove_all_parts(db: &sled::Tree, batch: &mut sled::Batch, seq: u32) -> Result<(), RingError> {
    let mut prefix = [0u8; 5];
    prefix[0] = CHUNK_PREFIX;
    prefix[1..].copy_from_slice(&seq.to_be_bytes());
    for kv in db.scan_prefix(prefix) {
        let (k, _) = kv?;
        batch.remove(k);
    }
    Ok(())
}

fn record_key(seq: u32) -> [u8; 5] {
    let mut k = [0u8; 5];
    k[0] = RECORD_PREFIX;
    k[1..].copy_from_slice(&seq.to_be_bytes());
    k
}

fn record_seq(key: &[u8]) -> Option<u32> {
    match key {
        [RECORD_PREFIX, rest @ ..] if rest.len() == 4 => Some(be_u32(rest)),
        _ => None,
    }
}

fn part_key(seq: u32, part: u32) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = CHUNK_PREFIX;
    k[1..5].copy_from_slice(&seq.to_be_bytes());
    k[5..].copy_from_slice(&part.to_be_bytes());
    k
}

fn put_part_id(b: &mut Vec<u8>, seq: u32, part: u32, kind: u8) {
    b.extend_from_slice(&seq.to_be_bytes());
    b.extend_from_slice(&part.to_be_bytes());
    b.push(kind);
}

/// A value: `xxh3-64(body)` followed by the body `fill` writes.
fn seal(fill: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut v = vec![0u8; SEAL_LEN];
    fill(&mut v);
    let sum = checksum(&v[SEAL_LEN..]);
    v[..SEAL_LEN].copy_from_slice(&sum.to_be_bytes());
    v
}

/// The body of a value whose checksum holds.
fn unseal(v: &[u8]) -> Option<&[u8]> {
    if v.len() < SEAL_LEN {
        return None;
    }
    let (sum, body) = v.split_at(SEAL_LEN);
    (be_u64(sum) == checksum(body)).then_some(body)
}

fn encode_record(r: &Record) -> Vec<u8> {
    let e = &r.end;
    seal(|b| {
        b.extend_from_slice(&e.seq.to_be_bytes());
        b.extend_from_slice(&e.chunk_count.to_be_bytes());
        b.extend_from_slice(&e.raw_len.to_be_bytes());
        b.extend_from_slice(&e.checksum.to_be_bytes());
        b.extend_from_slice(&e.header_hash);
        b.extend_from_slice(&e.previous_hash);
        b.extend_from_slice(&e.first_byte_ns.to_be_bytes());
        b.extend_from_slice(&e.last_byte_ns.to_be_bytes());
        b.extend_from_slice(&r.parts.to_be_bytes());
        b.extend_from_slice(&r.bytes.to_be_bytes());
    })
}

fn decode_record(seq: u32, v: &[u8]) -> Result<Record, String> {
    let b = unseal(v).ok_or("record fails its checksum")?;
    if b.len() != RECORD_BODY_LEN {
        return Err(format!(
            "record of {} bytes, expected {RECORD_BODY_LEN}",
            b.len()
        ));
    }
    let hash = |at: usize| -> [u8; 32] {
        let mut h = [0u8; 32];
        h.copy_from_slice(&b[at..at + 32]);
        h
    };
    let end = LedgerEnd {
        seq: be_u32(&b[0..4]),
        chunk_count: be_u32(&b[4..8]),
        raw_len: be_u64(&b[8..16]),
        checksum: be_u64(&b[16..24]),
        header_hash: hash(24),
        previous_hash: hash(56),
        first_byte_ns: be_u64(&b[88..96]),
        last_byte_ns: be_u64(&b[96..104]),
    };
    if end.seq != seq {
        return Err(format!(
            "record for ledger {} stored under ledger {seq}",
            end.seq
        ));
    }
    Ok(Record {
        end,
        parts: be_u32(&b[104..108]),
        bytes: be_u64(&b[108..116]),
    })
}

/// Callers pass exactly 4 bytes.
fn be_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_be_bytes(a)
}

/// Callers pass exactly 8 bytes.
fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

/// Waits, up to [`RELEASE_WAIT`], until nothing holds sled's lock on `path` (a `Ring` of this
/// directory dropped a moment ago). Gives up silently: sled's own open then reports the lock.
fn wait_for_release(path: &Path) {
    let deadline = Instant::now() + RELEASE_WAIT;
    loop {
        let Ok(file) = fs::File::open(path) else {
            return; // no store yet
        };
        // The probe lock is released when it is dropped, before sled takes its own.
        if Flock::lock(file, FlockArg::LockExclusiveNonblock).is_ok() || Instant::now() >= deadline
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Total length of the files under `dir`, recursively; unreadable entries count as 0.
fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .sum()
}
