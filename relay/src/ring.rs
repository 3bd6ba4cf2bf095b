//! The retention ring: the last N ledgers, kept as the compressed chunks that were sent live, so
//! a subscriber that starts inside the ring (or falls behind) is replayed the exact bytes with no
//! recompression.
//!
//! What it does: stores one complete ledger at a time (its
//! [`LedgerEnd`](ledger_relay_wire::frame::LedgerEnd) and its chunks) in one
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
//! atomic batch): metadata (format version, epoch, network), one record per ledger and its
//! chunks cut into parts. What the keys and values hold, and how they are read back with every
//! checksum, key and length checked, is [`ledger_relay_wire::stored`]: bytes read back from disk
//! are hostile input, so their decoding lives in the sans-IO crate and is fuzzed there.
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
//!
//! # Modules
//!
//! `open` opens the store and repairs what a crash left, `read` reads a held ledger back through
//! [`ledger_relay_wire::stored::PartReader`], and `write` appends, prunes, resets and reopens
//! the store after a failed write.

use std::collections::VecDeque;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

pub use ledger_relay_wire::stored::{StoredChunk, FORMAT_VERSION, PART_MAX};

mod open;
mod read;
mod write;

#[cfg(test)]
use write::validate;

#[cfg(test)]
mod tests;

/// sled segment size, persisted by sled in the store. 8 MiB puts the blob threshold (a quarter of
/// it, 2 MiB) well above the largest leaf image (17 parts, about 1.1 MiB; see the module doc), and
/// measured lower disk use than 16 MiB (1.73x against 2.01x live over 200 ledgers of
/// `ring_disk_use`).
pub const SEGMENT_SIZE: usize = 8 << 20;

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

/// Environment variable that overrides sled's segment size and flusher period, for measuring
/// them with `ledger-bench ring-disk` (`segment_mib=N,flush_ms=N`, either or both). Not for
/// production: the segment size is persisted by sled and a store written with one size does not
/// open with another.
pub const SLED_TUNING_ENV: &str = "LEDGER_RELAY_RING_SLED";

/// sled's segment size and flusher period: the constants, or [`SLED_TUNING_ENV`].
fn sled_tuning() -> Result<(usize, u64), RingError> {
    parse_sled_tuning(std::env::var(SLED_TUNING_ENV).ok().as_deref())
}

/// [`sled_tuning`] from the variable's value, if set.
fn parse_sled_tuning(text: Option<&str>) -> Result<(usize, u64), RingError> {
    let bad = || RingError::Config {
        detail: "LEDGER_RELAY_RING_SLED takes segment_mib=N,flush_ms=N",
    };
    let (mut segment, mut flush) = (SEGMENT_SIZE, FLUSH_EVERY_MS);
    let Some(text) = text else {
        return Ok((segment, flush));
    };
    for item in text.split(',').filter(|i| !i.is_empty()) {
        let (key, value) = item.split_once('=').ok_or_else(bad)?;
        let n: u64 = value.trim().parse().map_err(|_| bad())?;
        match key.trim() {
            // sled wants a power of two of at least 256 bytes.
            "segment_mib" if n > 0 && n.is_power_of_two() && n <= 1024 => {
                segment = (n as usize) << 20;
            }
            "flush_ms" if n > 0 => flush = n,
            _ => return Err(bad()),
        }
    }
    Ok((segment, flush))
}

/// Least time between attempts to open the store again after a failed write.
pub const REOPEN_EVERY: Duration = Duration::from_secs(1);

/// sled's store file in the ring directory, which sled locks (`flock`) while a `Db` is open.
const SLED_FILE: &str = "db";

/// How long `open` waits for the store lock of a `Ring` that is still closing: sled's background
/// threads keep the file open for a moment after its `Db` is dropped.
const RELEASE_WAIT: Duration = Duration::from_secs(2);

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
    /// What is held. Taken only for a few field reads or writes, never across sled IO: the
    /// writer forgets pruned ledgers (and bumps the epoch of a reset) before deleting them and
    /// publishes a new ledger after its flush, and `get` checks after reading that what it read
    /// was held throughout.
    state: RwLock<State>,
    #[cfg(test)]
    hook: HookCell,
}

/// Test-only pauses inside IO.
#[cfg(test)]
pub(crate) type Hook = std::sync::Arc<dyn Fn(&'static str) + Send + Sync>;

#[cfg(test)]
#[derive(Default)]
struct HookCell(Mutex<Option<Hook>>);

#[cfg(test)]
impl std::fmt::Debug for HookCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HookCell")
    }
}

impl Ring {
    /// The store, unless it is closed after a failed write.
    fn db(&self) -> Result<sled::Db, RingError> {
        self.db
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(RingError::Unavailable)
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

    fn pause(&self, _at: &'static str) {
        #[cfg(test)]
        {
            let hook = self
                .hook
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            if let Some(h) = hook {
                h(_at);
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn set_hook(&self, hook: Option<Hook>) {
        *self.hook.0.lock().unwrap_or_else(PoisonError::into_inner) = hook;
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
