//! The retention ring: the last N ledgers, kept as the compressed chunks that were sent live, so
//! a subscriber that starts inside the ring (or falls behind) is replayed the exact bytes with no
//! recompression.
//!
//! What it does: stores one complete ledger at a time (its
//! [`LedgerEnd`](ledger_relay_wire::frame::LedgerEnd) and its chunks): the chunks in a file of
//! their own, then the ledger's record in one atomic sled batch together with the pruning that
//! ledger causes, flushed at every ledger boundary. It serves a ledger only after every stored
//! value passes its checksum and the chunk set is complete, refuses to splice two runs or mix
//! two networks, and repairs a torn last ledger after a crash.
//!
//! It holds runs: ledgers that are consecutive and hash-linked. A ledger that comes after a
//! gap (the relay was down while its source went on, or its writer's queue gave ledgers up)
//! starts a new run beside the old ones ([`Ring::append_after_gap`]); they are read, pruned
//! (oldest first, across runs) and reopened like the rest. Only a ledger that cannot stand
//! beside what is held (the source went back, or is on another chain) empties the ring
//! ([`Ring::reset`]). What it does not do: decompress,
//! check the ledger's own checksum or hash chain against its bytes (the pipeline and the
//! subscriber do that), or run on the source's path: the API is synchronous and the relay calls
//! it from a dedicated writer thread.
//!
//! # Storage layout: payloads in files, an index in sled
//!
//! `DIR/db` and its siblings are a sled store with the metadata (format version, epoch,
//! network) and one record of about 130 bytes per ledger. `DIR/ledgers/<epoch>-<seq>.parts` is
//! one file per held ledger: its chunks cut into sealed parts. What the records, parts and
//! files hold, and how they are read back with every checksum, key and length checked, is
//! [`ledger_relay_wire::stored`]: bytes read back from disk are hostile input, so their decoding
//! lives in the sans-IO crate and is fuzzed there.
//!
//! Why files (format 2): a payload is written once, read a few times and deleted whole when its
//! ledger leaves the ring, a file's life rather than a B-tree value's. In format 1 the parts
//! were sled values: sled writes every value through its log and its segment cleaner rewrites
//! live values until a segment is half empty, so disk use settled near 2x the live bytes (2.9x
//! in a burst) and the ring's writer cost about 110 ms of CPU per raw 14.5 MiB ledger
//! (`bench/RESULTS.md`). A file costs one copy into the page cache and its pruning is an
//! `unlink`; sled's store holds only records, a few MB for 10,000 ledgers.
//!
//! # Crash consistency
//!
//! An append writes the ledger's file under a temporary name, `fdatasync`s it, renames it to its
//! name and syncs the directory; only then does it commit the record (and the pruning) in one
//! sled batch and flush; then it unlinks the pruned ledgers' files (or keeps up to
//! [`MAX_SPARES`] of them under spare names, to write the next ledgers over their blocks: a
//! fresh block allocation cost more CPU than the write itself). So after `kill -9` or a
//! power cut the store holds every ledger whose [`Ring::append`] returned, and every record
//! names a whole file. [`Ring::open`] still repairs defensively: it keeps, from the newest down,
//! the records that are readable and, within each run, consecutive and hash-linked (a gap in
//! the sequences separates two runs; consecutive ledgers that do not link, or an unreadable
//! record, end what is kept), fully verifies the newest ledger
//! (dropping it, and then the one before, while it is torn), and removes every file no kept
//! record owns (temporary files, files of pruned, reset or dropped ledgers).
//!
//! # Modules
//!
//! `open` opens the store and repairs what a crash left, `files` writes, reads and removes the
//! ledger files, `read` reads a held ledger back through
//! [`ledger_relay_wire::stored::read_file`], and `write` appends, prunes, resets and reopens the
//! store after a failed write.

use std::collections::VecDeque;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

pub use ledger_relay_wire::stored::{StoredChunk, FORMAT_VERSION, PART_MAX};

mod files;
mod open;
mod read;
mod write;

pub use files::{ledger_file, LEDGERS_DIR, MAX_SPARES};

#[cfg(test)]
use write::validate;

#[cfg(test)]
pub(crate) mod tests;

/// sled segment size, persisted by sled in the store (format 1 chose it for payloads in sled;
/// the records of format 2 are far below any size that matters to sled).
pub const SEGMENT_SIZE: usize = 8 << 20;

/// Default number of ledgers kept: about 14 hours of the public network.
pub const DEFAULT_MAX_LEDGERS: u32 = 10_000;

/// Default cap on live bytes: 64 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 64 << 30;

/// sled's page cache: it holds only the records (about 130 bytes per ledger), so a little is
/// plenty; ledger files are read through the kernel's page cache.
pub const CACHE_BYTES: u64 = 16 << 20;

/// sled's background flusher period. Appends flush explicitly, so this is not about durability;
/// the thread is also sled's segment cleaner, which has only the records to clean.
const FLUSH_EVERY_MS: u64 = 500;

/// Environment variable that overrides sled's segment size and flusher period, for measuring
/// them with `ledger-bench ring-disk` (`segment_mib=N,flush_ms=N`, either or both). Not for
/// production: the segment size is persisted by sled and a store written with one size does not
/// open with another.
pub const SLED_TUNING_ENV: &str = "LEDGER_RELAY_RING_SLED";

/// sled's segment size and flusher period: the constants, or [`SLED_TUNING_ENV`].
fn sled_tuning() -> Result<(usize, u64), RingError> {
    parse_sled_tuning(std::env::var(SLED_TUNING_ENV).ok().as_deref())
}

/// The sled segment size rings of this process open with ([`SEGMENT_SIZE`], or
/// [`SLED_TUNING_ENV`]'s when it is set and valid).
pub(crate) fn segment_size() -> usize {
    sled_tuning().map_or(SEGMENT_SIZE, |(segment, _)| segment)
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
    /// The ring's directory: sled's store and `ledgers/` (created if missing).
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
    /// Size of the ring directory: sled's files (walked; 0 for files that vanish meanwhile)
    /// and the held ledgers' files.
    pub disk_bytes: u64,
    /// Runs held: 1 while what is held is consecutive, more after gaps (see
    /// [`Ring::append_after_gap`]), 0 when empty.
    pub runs: u64,
    /// Reset counter: bumped by every [`Ring::reset`].
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
    #[error(
        "ring format version {found} is not supported (expected {expected}); move the ring \
         directory away to start an empty ring"
    )]
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

/// The first 8 bytes of a hash in hex, for messages.
fn hex8(h: &[u8; 32]) -> String {
    let mut s = ledger_relay_wire::Hex(h).to_string();
    s.truncate(16);
    s
}

/// A held ledger, as the writer needs it for pruning and accounting.
#[derive(Debug, Clone, Copy)]
struct Held {
    seq: u32,
    /// Stored bytes, as its record counts them (the retention bound's unit).
    bytes: u64,
    /// Length of its file.
    file: u64,
}

#[derive(Debug)]
struct State {
    /// Held ledgers, oldest first: consecutive and hash-linked within a run, runs separated by
    /// gaps (see [`Ring::append_after_gap`]).
    held: VecDeque<Held>,
    /// Header hash of the newest held ledger.
    newest_hash: [u8; 32],
    live_bytes: u64,
    /// Length of the held ledgers' files.
    file_bytes: u64,
    epoch: u64,
}

impl State {
    fn range(&self) -> Option<(u32, u32)> {
        Some((self.held.front()?.seq, self.held.back()?.seq))
    }

    fn holds(&self, seq: u32) -> bool {
        self.held.binary_search_by_key(&seq, |h| h.seq).is_ok()
    }

    fn next_held(&self, seq: u32) -> Option<u32> {
        let i = self.held.partition_point(|h| h.seq < seq);
        self.held.get(i).map(|h| h.seq)
    }

    fn runs(&self) -> Vec<(u32, u32)> {
        let mut runs: Vec<(u32, u32)> = Vec::new();
        for h in &self.held {
            match runs.last_mut() {
                Some(run) if run.1.checked_add(1) == Some(h.seq) => run.1 = h.seq,
                _ => runs.push((h.seq, h.seq)),
            }
        }
        runs
    }
}

/// The retention ring. `Send + Sync`; share it through an `Arc`. Appends and resets are
/// serialized internally; reads run concurrently with each other and with an append's flush.
#[derive(Debug)]
pub struct Ring {
    /// The store; `None` while it is closed after a failed write (see [`Ring::append`]).
    db: RwLock<Option<sled::Db>>,
    /// The ledger files.
    files: files::Files,
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

impl Drop for Ring {
    fn drop(&mut self) {
        write::close_store(
            self.db
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
    }
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

    /// `(oldest, newest)` held, from memory. With more than one run (see
    /// [`Ring::append_after_gap`]) the ledgers between two runs are not held: ask
    /// [`Ring::holds`], [`Ring::next_held`] or [`Ring::runs`].
    pub fn range(&self) -> Option<(u32, u32)> {
        self.read_state().range()
    }

    /// The reset counter ([`RingStats::epoch`]), from memory: a ledger read under one epoch is
    /// not the one a later epoch holds under the same sequence.
    pub fn epoch(&self) -> u64 {
        self.read_state().epoch
    }

    /// Whether ledger `seq` is held, from memory.
    pub fn holds(&self, seq: u32) -> bool {
        self.read_state().holds(seq)
    }

    /// The oldest ledger held at or after `seq`, from memory.
    pub fn next_held(&self, seq: u32) -> Option<u32> {
        self.read_state().next_held(seq)
    }

    /// The runs held, oldest first, each `(oldest, newest)`: ledgers that are consecutive and
    /// hash-linked, with a gap before the next run.
    pub fn runs(&self) -> Vec<(u32, u32)> {
        self.read_state().runs()
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

    /// Sizes: held range and bytes from memory; disk use is sled's files, walked, and the held
    /// ledgers' files, counted as they are written (walking 10,000 of them at every append
    /// would cost the writer more than the append).
    pub fn stats(&self) -> RingStats {
        let (oldest, newest, ledgers, live_bytes, file_bytes, runs, epoch) = {
            let st = self.read_state();
            let range = st.range();
            (
                range.map(|r| r.0),
                range.map(|r| r.1),
                st.held.len() as u64,
                st.live_bytes,
                st.file_bytes,
                st.runs().len() as u64,
                st.epoch,
            )
        };
        RingStats {
            oldest,
            newest,
            ledgers,
            live_bytes,
            runs,
            disk_bytes: dir_size(&self.dir, Some(LEDGERS_DIR))
                + file_bytes
                + self.files.spare_bytes(),
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

/// Total length of the files under `dir`, recursively, but for the directory `skip` right under
/// it; unreadable entries count as 0.
fn dir_size(dir: &Path, skip: Option<&str>) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() && skip.is_some_and(|s| e.file_name() == s) => 0,
            Ok(t) if t.is_dir() => dir_size(&e.path(), None),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .sum()
}
