//! The ledgers a double replays: a record-marked stream of `LedgerCloseMeta` (the framing of
//! core's `--metadata-output-stream`; zstd-compressed files are read as well), decoded whole
//! when the file is loaded.

use std::path::Path;

use bytes::Bytes;
use stellar_xdr::{LedgerCloseMeta, LedgerHeaderHistoryEntry, Limits, ReadXdr};

use ledger_relay_wire::record::{open_stream, ReadError, Records};

use crate::error::DoubleError;

/// Longest record read: 512 MiB, far above any ledger core has written.
const MAX_RECORD: u32 = 512 << 20;

/// One ledger of the file.
#[derive(Debug, Clone)]
pub struct Ledger {
    /// Its sequence.
    pub seq: u32,
    /// Its record body, as written to the meta pipe.
    pub raw: Bytes,
    /// The decoded meta.
    pub meta: LedgerCloseMeta,
}

impl Ledger {
    /// Decodes one record body.
    pub fn decode(raw: Bytes) -> Result<Ledger, stellar_xdr::Error> {
        let meta = LedgerCloseMeta::from_xdr(&raw, Limits::len(raw.len()))?;
        Ok(Ledger {
            seq: header_of(&meta).header.ledger_seq,
            raw,
            meta,
        })
    }

    /// Its header with its hash.
    pub fn header(&self) -> &LedgerHeaderHistoryEntry {
        header_of(&self.meta)
    }
}

/// The header entry of any version of `LedgerCloseMeta`.
pub fn header_of(meta: &LedgerCloseMeta) -> &LedgerHeaderHistoryEntry {
    match meta {
        LedgerCloseMeta::V0(m) => &m.ledger_header,
        LedgerCloseMeta::V1(m) => &m.ledger_header,
        LedgerCloseMeta::V2(m) => &m.ledger_header,
    }
}

/// Reads and decodes every ledger of `path`; their sequences must increase (gaps are allowed).
pub fn read_file(path: &Path) -> Result<Vec<Ledger>, DoubleError> {
    let io = |source| DoubleError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let stream = open_stream(file).map_err(io)?;
    let mut out: Vec<Ledger> = Vec::new();
    for (index, record) in Records::new(stream, MAX_RECORD).enumerate() {
        let raw = record.map_err(|e| match e {
            ReadError::Io(e) => io(e),
            other => io(std::io::Error::new(std::io::ErrorKind::InvalidData, other)),
        })?;
        let ledger = Ledger::decode(Bytes::from(raw)).map_err(|source| DoubleError::Decode {
            path: path.to_owned(),
            index,
            source,
        })?;
        if let Some(previous) = out.last().map(|l| l.seq) {
            if ledger.seq <= previous {
                return Err(DoubleError::Order {
                    path: path.to_owned(),
                    previous,
                    seq: ledger.seq,
                });
            }
        }
        out.push(ledger);
    }
    if out.is_empty() {
        return Err(DoubleError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(out)
}
