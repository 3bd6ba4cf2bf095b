//! Reading a held ledger back: its record from sled, its chunks from its file, with every
//! stored value checked by [`ledger_relay_wire::stored::read_file`].

use ledger_relay_wire::frame::LedgerEnd;
use ledger_relay_wire::stored::{record_key, Record, StoredError};

use super::files::{Files, ReadFail};
use super::{Ring, RingError, StoredChunk};

impl Ring {
    /// Reads and verifies a held ledger: every value's checksum, the record's sequence, and a
    /// chunk set that is complete (`0..chunk_count`) and tiles the raw length. `Ok(None)` if the
    /// ledger is not held; [`RingError::Corrupt`] if any check fails (no bytes are returned).
    pub fn get(&self, seq: u32) -> Result<Option<(LedgerEnd, Vec<StoredChunk>)>, RingError> {
        // No lock is held across the read (an append or a reset goes on meanwhile). The writer
        // forgets a ledger before its batch deletes it and bumps the epoch before a reset
        // deletes anything, so a read that raced a prune or a reset sees it afterwards: the
        // ledger is then reported absent, whatever the read returned (sled batches are atomic
        // for recovery, not for concurrent readers).
        let epoch = {
            let st = self.read_state();
            if !st.holds(seq) {
                return Ok(None);
            }
            st.epoch
        };
        let db = self.db()?;
        self.pause("get:file");
        let got = read_ledger(&db, &self.files, epoch, seq, None).map_err(|e| e.into_error(seq));
        let still_held = {
            let st = self.read_state();
            st.epoch == epoch && st.range().is_some_and(|(oldest, _)| oldest <= seq)
        };
        if !still_held {
            return Ok(None);
        }
        got.map(Some)
    }
}

/// Reads ledger `seq` of run `epoch` and verifies every value. `record` skips re-reading an
/// already decoded record.
pub(super) fn read_ledger(
    db: &sled::Tree,
    files: &Files,
    epoch: u64,
    seq: u32,
    record: Option<Record>,
) -> Result<(LedgerEnd, Vec<StoredChunk>), ReadFail> {
    let record = match record {
        Some(r) => r,
        None => {
            let v = db.get(record_key(seq))?.ok_or(StoredError::RecordMissing)?;
            Record::decode(seq, &v)?
        }
    };
    files.read(epoch, record)
}

impl Ring {
    /// The header hash the ring recorded for held ledger `seq`, read from its record alone
    /// (so a ledger whose chunks are damaged still says which ledger it was), else from the
    /// previous hash recorded by the ledger after it. `Ok(None)` if `seq` is not held or
    /// neither record is readable.
    pub fn stored_hash(&self, seq: u32) -> Result<Option<[u8; 32]>, RingError> {
        if !self.holds(seq) {
            return Ok(None);
        }
        let db = self.db()?;
        let record = |s: u32| -> Result<Option<Record>, RingError> {
            Ok(db
                .get(record_key(s))?
                .and_then(|v| Record::decode(s, &v).ok()))
        };
        if let Some(r) = record(seq)? {
            return Ok(Some(r.end.header_hash));
        }
        // The next ledger of the same run names this one; the first of a run after a gap
        // names a ledger that is not held.
        if seq.checked_add(1).is_some_and(|next| self.holds(next)) {
            if let Some(r) = record(seq + 1)? {
                return Ok(Some(r.end.previous_hash));
            }
        }
        Ok(None)
    }
}
