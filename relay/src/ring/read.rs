//! Reading a held ledger back, verifying every stored value.

use bytes::Bytes;
use ledger_relay_wire::compress::Codec;
use ledger_relay_wire::frame::LedgerEnd;

use super::layout::{
    be_u32, be_u64, decode_record, part_key, record_key, unseal, Record, CHUNK_HEADER_LEN,
    PART_CONTINUE, PART_ID_LEN, PART_START,
};
use super::{Ring, RingError, StoredChunk, PART_MAX};

/// Why reading a ledger failed.
pub(super) enum ReadFail {
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
            match st.range() {
                Some((oldest, newest)) if (oldest..=newest).contains(&seq) => st.epoch,
                _ => return Ok(None),
            }
        };
        let db = self.db()?;
        self.pause("get:file");
        let got = read_ledger(&db, seq, None).map_err(|e| e.into_error(seq));
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

/// Reads a ledger and verifies every value. `record` skips re-reading an already decoded record.
pub(super) fn read_ledger(
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
