//! Appending a ledger with the pruning it causes, resetting for a new run, and reopening the
//! store after a failed write.

use std::sync::PoisonError;
use std::time::Instant;

use ledger_relay_wire::frame::LedgerEnd;
use ledger_relay_wire::header::ChainVerifier;
use ledger_relay_wire::stored::{
    after_gap, check_chunks, encode_file, record_key, seal_u64, Record, META_EPOCH,
};
use tracing::info;

use super::{Held, Ring, RingConfig, RingError, StoredChunk, REOPEN_EVERY};

/// How an appended ledger must follow the newest one held.
#[derive(Debug, Clone, Copy)]
enum Follow {
    /// Continue it: the next sequence, linked by the previous hash.
    Link,
    /// Start a new run after a gap: a later sequence than the next.
    Gap,
}

impl Ring {
    /// Appends one complete ledger: its file first (durable), then its record in one sled
    /// batch together with the pruning it causes (oldest ledgers beyond `max_ledgers` or
    /// `max_bytes`), then flushes and removes the pruned ledgers' files; the ledger is visible
    /// to [`Ring::range`] and [`Ring::get`] only once flushed.
    ///
    /// It must continue the ring: `end.seq == newest + 1` and `end.previous_hash` equal to the
    /// newest ledger's header hash (an empty ring accepts any ledger but sequence 0). Otherwise
    /// it returns [`RingError::Discontinuity`] and writes nothing; a ledger whose chunks do not
    /// match its end record is [`RingError::BadRecord`], also writing nothing.
    ///
    /// If the disk fails (full or read-only), the error is returned ([`RingError::Io`] for the
    /// ledger's file, [`RingError::Sled`] for its record) and later appends (and resets) are
    /// let through at most every [`REOPEN_EVERY`] (until then they fail with
    /// [`RingError::Unavailable`]), each closing the store and opening it again first: sled
    /// 0.34 refuses every write after a failed one (its error is global to the store and
    /// cleared only by opening it again), nothing stays open on a failed disk, and opening
    /// repairs what the failed write left; the ring then holds what the disk kept. While the store is closed the held range
    /// stays as it was and [`Ring::get`] fails with [`RingError::Unavailable`]. The caller
    /// keeps the ledgers that failed and appends them again once the disk is back (the relay's
    /// ring writer does, within a bound), so that the run goes on without a gap.
    pub fn append(&self, end: &LedgerEnd, chunks: &[StoredChunk]) -> Result<(), RingError> {
        self.append_with(end, chunks, Follow::Link)
    }

    /// Appends one complete ledger that starts a new run after a gap: `end.seq` is beyond
    /// newest + 1 (the ledgers between were never given to the ring: the relay was down while
    /// its source went on, or its queue gave them up). The ledgers held are kept, as the older
    /// runs: [`Ring::get`] reads them, pruning takes the oldest across runs, and
    /// [`Ring::open`] finds every run again. Runs are never spliced: the ledgers of the gap
    /// are not held, and the new run goes on with [`Ring::append`].
    ///
    /// [`RingError::Discontinuity`] (nothing written) for a ledger at or below newest + 1: one
    /// that does not link to the newest cannot stand beside it (the source is on another
    /// chain, or went back), which only [`Ring::reset`] answers. Otherwise as
    /// [`Ring::append`].
    pub fn append_after_gap(
        &self,
        end: &LedgerEnd,
        chunks: &[StoredChunk],
    ) -> Result<(), RingError> {
        self.append_with(end, chunks, Follow::Gap)
    }

    fn append_with(
        &self,
        end: &LedgerEnd,
        chunks: &[StoredChunk],
        follow: Follow,
    ) -> Result<(), RingError> {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        self.reopen_if_failed()?;
        let r = self.append_locked(end, chunks, follow);
        self.note_failure(&r);
        r
    }

    fn append_locked(
        &self,
        end: &LedgerEnd,
        chunks: &[StoredChunk],
        follow: Follow,
    ) -> Result<(), RingError> {
        validate(end, chunks)?;

        {
            let st = self.read_state();
            if let Some(newest) = st.held.back() {
                let follows = match follow {
                    // The chain rule has one owner.
                    Follow::Link => ChainVerifier::after(newest.seq, st.newest_hash)
                        .check_link(end.into())
                        .is_ok(),
                    Follow::Gap => after_gap(newest.seq, end.seq),
                };
                if !follows {
                    return Err(RingError::Discontinuity {
                        newest: newest.seq,
                        newest_hash: st.newest_hash,
                        seq: end.seq,
                        previous_hash: end.previous_hash,
                    });
                }
            }
        }

        // The new ledger's file, durable before its record is committed: a record always
        // names a whole file (a crash in between leaves a file no record owns, which the next
        // open removes).
        let epoch = self.read_state().epoch;
        let file = encode_file(end.seq, chunks);
        self.pause("append:file");
        self.files.write(epoch, end.seq, &file.bytes)?;
        let (parts, bytes, file_len) = (file.parts, file.stored, file.bytes.len() as u64);
        drop(file);
        let record = Record {
            end: *end,
            parts,
            bytes,
        };
        let mut batch = sled::Batch::default();
        batch.insert(&record_key(end.seq)[..], record.encode());

        // Pruning, oldest first, never the new ledger. The writer lock keeps `held` as it was
        // checked above.
        let dropped: Vec<u32> = {
            let st = self.read_state();
            let mut count = st.held.len() as u64 + 1;
            let mut live = st.live_bytes + bytes;
            let mut dropped = Vec::new();
            for old in &st.held {
                if count <= u64::from(self.max_ledgers) && live <= self.max_bytes {
                    break;
                }
                batch.remove(&record_key(old.seq)[..]);
                live -= old.bytes;
                count -= 1;
                dropped.push(old.seq);
            }
            dropped
        };

        // Pruned ledgers disappear before the batch deletes them (a reader that raced the
        // deletion then reports them absent, see `get`), the new one after the flush; no lock
        // is held across IO. Should the batch fail, the store is reopened before the next
        // write and `held` read back from disk.
        {
            let mut st = self.write_state();
            for _ in 0..dropped.len() {
                if let Some(old) = st.held.pop_front() {
                    st.live_bytes -= old.bytes;
                    st.file_bytes -= old.file;
                }
            }
        }
        self.pause("append:index");
        self.db()?.apply_batch(batch)?;
        // A ledger whose flush failed is not published: whether the disk has it is known only
        // once the store is reopened (which reads back what it holds).
        self.db()?.flush()?;
        // The pruned ledgers' records are gone for good: their files go too.
        for seq in dropped {
            self.files.remove(epoch, seq);
        }
        let mut st = self.write_state();
        st.held.push_back(Held {
            seq: end.seq,
            bytes,
            file: file_len,
        });
        st.newest_hash = end.header_hash;
        st.live_bytes += bytes;
        st.file_bytes += file_len;
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
        // The run is forgotten (and the epoch bumped, for readers) before the batch deletes
        // it; no lock is held across IO. Should the batch fail, the store is reopened before
        // the next write and what it still holds is read back.
        let mut batch = sled::Batch::default();
        let (epoch, gone) = {
            let mut st = self.write_state();
            let gone: Vec<u32> = st.held.iter().map(|h| h.seq).collect();
            for seq in &gone {
                batch.remove(&record_key(*seq)[..]);
            }
            st.held.clear();
            st.live_bytes = 0;
            st.file_bytes = 0;
            st.newest_hash = [0; 32];
            st.epoch += 1;
            (st.epoch, gone)
        };
        batch.insert(META_EPOCH, seal_u64(epoch));
        self.db()?.apply_batch(batch)?;
        info!(epoch, dropped = gone.len(), "ring reset");
        self.db()?.flush()?;
        for seq in gone {
            self.files.remove(epoch - 1, seq);
        }
        Ok(())
    }

    /// Writes held ledger `end.seq` again, whole, over a stored copy that failed
    /// verification: the same ledger (its header hash is the one recorded for it, see
    /// [`Ring::stored_hash`]) from a source that emitted it again or a lake. Its old values go
    /// in the same batch. Nothing else in the ring changes. [`RingError::Discontinuity`] if the
    /// ring does not hold that ledger under that hash.
    pub fn repair(&self, end: &LedgerEnd, chunks: &[StoredChunk]) -> Result<(), RingError> {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        self.reopen_if_failed()?;
        let r = self.repair_locked(end, chunks);
        self.note_failure(&r);
        r
    }

    fn repair_locked(&self, end: &LedgerEnd, chunks: &[StoredChunk]) -> Result<(), RingError> {
        validate(end, chunks)?;
        let not_held = |newest: Option<(u32, [u8; 32])>| RingError::Discontinuity {
            newest: newest.map_or(0, |n| n.0),
            newest_hash: newest.map_or([0; 32], |n| n.1),
            seq: end.seq,
            previous_hash: end.previous_hash,
        };
        if self.stored_hash(end.seq)? != Some(end.header_hash) {
            return Err(not_held(self.newest()));
        }
        let Some(old) = self
            .read_state()
            .held
            .iter()
            .find(|h| h.seq == end.seq)
            .copied()
        else {
            return Err(not_held(self.newest()));
        };
        // The new copy replaces the damaged file whole (a rename), then its record follows. A
        // crash in between leaves the new file under the old record: read as corrupt, and
        // repaired again.
        let epoch = self.read_state().epoch;
        let file = encode_file(end.seq, chunks);
        self.files.write(epoch, end.seq, &file.bytes)?;
        let (parts, bytes, file_len) = (file.parts, file.stored, file.bytes.len() as u64);
        drop(file);
        let record = Record {
            end: *end,
            parts,
            bytes,
        };
        self.db()?
            .insert(&record_key(end.seq)[..], record.encode())?;
        self.db()?.flush()?;
        let mut st = self.write_state();
        // Not pruned meanwhile: the writer lock is held.
        if let Some(h) = st.held.iter_mut().find(|h| h.seq == end.seq) {
            h.bytes = bytes;
            h.file = file_len;
        }
        st.live_bytes = st.live_bytes - old.bytes + bytes;
        st.file_bytes = st.file_bytes - old.file + file_len;
        info!(seq = end.seq, "ring: damaged ledger written again");
        Ok(())
    }

    /// Remembers a failed write (called under the writer lock).
    fn note_failure(&self, r: &Result<(), RingError>) {
        if let Err(RingError::Sled(_) | RingError::Io { .. } | RingError::Unavailable) = r {
            *self.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        }
    }

    /// After a failed write, closes the store and opens it again (called under the writer
    /// lock), at most every [`REOPEN_EVERY`]; see [`Ring::append`]. Also after a failed ledger
    /// file, though sled itself may be fine: a relay that keeps nothing open on a failed disk
    /// lets the operator unmount it, check it and mount it again.
    fn reopen_if_failed(&self) -> Result<(), RingError> {
        let mut failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(at) = *failed else {
            return Ok(());
        };
        if at.elapsed() < REOPEN_EVERY {
            return Err(RingError::Unavailable);
        }
        *failed = Some(Instant::now());
        // Read nothing while the store is closed (`get` says `Unavailable`), but keep what is
        // held: the range sessions see stays, so a failing disk never makes the ring look
        // empty (a session would then be told its ledger is below retention). A read that
        // started before may still hold the old store for the rest of one ledger; `open`
        // waits for sled to let go of it.
        let old = self
            .db
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        // sled releases its lock on the store when the last handle goes.
        close_store(old);
        let fresh = Ring::open(&RingConfig {
            dir: self.dir.clone(),
            max_ledgers: self.max_ledgers,
            max_bytes: self.max_bytes,
            network: self.network.clone(),
        })?;
        let mut st = self.write_state();
        std::mem::swap(&mut *st, &mut *fresh.write_state());
        *self.db.write().unwrap_or_else(PoisonError::into_inner) = fresh
            .db
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        *failed = None;
        info!(range = ?st.range(), "ring store reopened after a failed write");
        Ok(())
    }
}

/// Drops a sled store. sled syncs a store that has not failed when it is dropped and panics if
/// that fails (a disk turned read-only meanwhile); the panic is contained here, so that a relay
/// stopping on a read-only disk stops cleanly (what the disk kept is what `open` reads back).
pub(super) fn close_store(db: Option<sled::Db>) {
    if let Some(db) = db {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(db))).is_err() {
            tracing::warn!("ring store: sled failed to sync while closing");
        }
    }
}

/// Checks that the chunks handed to `append` are exactly the ledger `end` describes (the rule
/// the reader applies to them on the way back, [`check_chunks`]).
pub(super) fn validate(end: &LedgerEnd, chunks: &[StoredChunk]) -> Result<(), RingError> {
    let bad = |detail: String| RingError::BadRecord {
        seq: end.seq,
        detail,
    };
    if end.seq == 0 {
        return Err(bad("sequence 0 is reserved for \"none\"".into()));
    }
    check_chunks(end, chunks).map_err(|e| bad(e.to_string()))
}
