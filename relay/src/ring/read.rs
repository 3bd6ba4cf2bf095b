//! Reading a held ledger back: the sled reads, with every stored value checked by
//! [`PartReader`] (`ledger_relay_wire::stored`).

use ledger_relay_wire::frame::LedgerEnd;
use ledger_relay_wire::stored::{part_key, record_key, PartReader, Record, StoredError};

use super::{Ring, RingError, StoredChunk};

/// Why reading a ledger failed.
pub(super) enum ReadFail {
    Sled(sled::Error),
    Corrupt(StoredError),
}

impl From<sled::Error> for ReadFail {
    fn from(e: sled::Error) -> Self {
        ReadFail::Sled(e)
    }
}

impl From<StoredError> for ReadFail {
    fn from(e: StoredError) -> Self {
        ReadFail::Corrupt(e)
    }
}

impl ReadFail {
    fn into_error(self, seq: u32) -> RingError {
        match self {
            ReadFail::Sled(e) => RingError::Sled(e),
            ReadFail::Corrupt(e) => RingError::Corrupt {
                seq,
                detail: e.to_string(),
            },
        }
    }
}

impl Ring {
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
}

/// Reads a ledger and verifies every value. `record` skips re-reading an already decoded record.
pub(super) fn read_ledger(
    db: &sled::Tree,
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
    let mut parts = PartReader::new(record);
    while parts.remaining() > 0 {
        let part = parts.next_part();
        let v = db
            .get(part_key(seq, part))?
            .ok_or(StoredError::PartMissing { part })?;
        parts.push(&v)?;
    }
    Ok(parts.finish()?)
}
