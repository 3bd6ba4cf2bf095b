//! The `LedgerCloseMetaBatch` codec: objects written and read back, bounded and checked.

use std::io::Read;

use bytes::Bytes;

use crate::content::{check_content, ContentError};
use crate::header::{peek_header, ChainVerifier, HeaderError, LedgerHeaderInfo};

/// Recursion budget of the XDR decoder, counted per nested `read_xdr` call (an `SCVal` vector
/// inside another costs four). 1000 leaves room for the deepest `SCVal` Soroban accepts (100
/// levels) inside a ledger's meta, and fits a 2 MiB thread stack with room to spare (tested);
/// deeper input is refused, never a stack overflow.
pub const XDR_DEPTH: u32 = 1000;

/// Bounds on what [`read_object`] accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchLimits {
    /// Largest object (compressed) accepted.
    pub max_object: u64,
    /// Largest decompressed batch accepted.
    pub max_raw: u64,
    /// Largest single ledger accepted.
    pub max_ledger: u64,
    /// Most ledgers in one batch.
    pub max_ledgers: u32,
}

impl Default for BatchLimits {
    fn default() -> Self {
        BatchLimits {
            // A 256 MiB ledger (the longest record the relay accepts) that does not compress.
            max_object: 256 << 20,
            max_raw: 256 << 20,
            max_ledger: 256 << 20,
            // Galexie's largest common setting is 64 ledgers per file; a day of pubnet is
            // about 17,000 ledgers.
            max_ledgers: 1 << 16,
        }
    }
}

/// Why an object was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// The object is larger than [`BatchLimits::max_object`].
    #[error("object of {len} bytes exceeds the limit of {max}")]
    ObjectTooLarge {
        /// Its length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// Decompressed, the object exceeds [`BatchLimits::max_raw`].
    #[error("object decompresses to more than {max} bytes")]
    RawTooLarge {
        /// The limit.
        max: u64,
    },
    /// The object ends before its zstd frame or its XDR does.
    #[error("truncated: {reason}")]
    Truncated {
        /// Where it ended.
        reason: String,
    },
    /// The object is not valid zstd.
    #[error("not a valid zstd frame: {reason}")]
    Zstd {
        /// The decoder's message.
        reason: String,
    },
    /// `endSequence` is below `startSequence`.
    #[error("batch range {start}-{end} is reversed")]
    BadRange {
        /// `startSequence`.
        start: u32,
        /// `endSequence`.
        end: u32,
    },
    /// The array does not hold one ledger per sequence of the range (a partial batch).
    #[error("batch {start}-{end} holds {count} ledgers, expected {expected}")]
    CountMismatch {
        /// `startSequence`.
        start: u32,
        /// `endSequence`.
        end: u32,
        /// The array's count.
        count: u32,
        /// `end - start + 1`.
        expected: u64,
    },
    /// More ledgers than [`BatchLimits::max_ledgers`].
    #[error("batch holds {count} ledgers, more than {max}")]
    TooManyLedgers {
        /// The array's count.
        count: u32,
        /// The limit.
        max: u32,
    },
    /// A ledger is not a valid `LedgerCloseMeta`.
    #[error("ledger {index} of the batch is not a valid LedgerCloseMeta: {reason}")]
    Xdr {
        /// Its index in the batch.
        index: u32,
        /// The decoder's message.
        reason: String,
    },
    /// A ledger is longer than [`BatchLimits::max_ledger`].
    #[error("ledger {index} of the batch is longer than {max} bytes")]
    LedgerTooLarge {
        /// Its index in the batch.
        index: u32,
        /// The limit.
        max: u64,
    },
    /// A ledger's header does not check out (its hash is not the sha256 of its header).
    #[error("ledger {index} of the batch: {error}")]
    Header {
        /// Its index in the batch.
        index: u32,
        /// What is wrong.
        error: HeaderError,
    },
    /// A ledger's transaction set or results do not hash to what its header commits to (a
    /// changed, added, removed or reordered transaction or result), or its body cannot be
    /// walked to compute them.
    #[error("ledger {seq} (ledger {index} of the batch): {error}")]
    Content {
        /// Its index in the batch.
        index: u32,
        /// Its sequence.
        seq: u32,
        /// What is wrong.
        error: ContentError,
    },
    /// A ledger is not the one its position says.
    #[error("ledger {index} of the batch is sequence {got}, expected {expected}")]
    Sequence {
        /// Its index in the batch.
        index: u32,
        /// `start + index`.
        expected: u32,
        /// Its header's `ledgerSeq`.
        got: u32,
    },
    /// A ledger's `previousLedgerHash` is not the hash of the ledger before it in the batch.
    #[error("ledger {seq} does not link to ledger {prev} in the same batch")]
    BrokenChain {
        /// The ledger.
        seq: u32,
        /// The one before it.
        prev: u32,
    },
    /// Bytes follow the last ledger.
    #[error("{len} bytes follow the last ledger of the batch")]
    TrailingBytes {
        /// How many.
        len: usize,
    },
    /// The batch is not the one its key names.
    #[error("batch {start}-{end} does not belong at a key for {key_first}-{key_last}")]
    WrongKey {
        /// `startSequence`.
        start: u32,
        /// `endSequence`.
        end: u32,
        /// First sequence the key names.
        key_first: u32,
        /// Last sequence the key names.
        key_last: u32,
    },
}

impl BatchError {
    /// Whether the object looks cut short (an interrupted upload or a partial copy) rather
    /// than damaged or foreign.
    pub fn is_truncated(&self) -> bool {
        matches!(self, BatchError::Truncated { .. })
    }
}

/// One ledger of a decoded batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchLedger {
    /// Its header, checked.
    pub info: LedgerHeaderInfo,
    /// Its `LedgerCloseMeta` XDR, exactly as stored (a slice of the decompressed batch).
    pub raw: Bytes,
}

/// A decoded and checked `LedgerCloseMetaBatch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// `startSequence`.
    pub start: u32,
    /// `endSequence`.
    pub end: u32,
    /// The ledgers, `start..=end` in order.
    pub ledgers: Vec<BatchLedger>,
}

/// The XDR of a `LedgerCloseMetaBatch` of `ledgers` (each a `LedgerCloseMeta`'s XDR, as core
/// emits it), claimed to run `start..=end`.
pub fn encode_batch<L: AsRef<[u8]>>(start: u32, end: u32, ledgers: &[L]) -> Vec<u8> {
    let len: usize = ledgers.iter().map(|l| l.as_ref().len()).sum();
    let mut out = Vec::with_capacity(12 + len);
    out.extend_from_slice(&start.to_be_bytes());
    out.extend_from_slice(&end.to_be_bytes());
    // A batch is built from ledgers the relay holds in memory: far fewer than 2^32.
    out.extend_from_slice(&(ledgers.len() as u32).to_be_bytes());
    for l in ledgers {
        out.extend_from_slice(l.as_ref());
    }
    out
}

/// Compresses a batch's XDR into an object: one zstd frame at `level`, with the content size
/// and a checksum in the frame (so a reader detects truncation and corruption).
pub fn compress_object(xdr: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    let mut enc = zstd::stream::write::Encoder::new(Vec::with_capacity(xdr.len() / 4), level)?;
    enc.include_checksum(true)?;
    enc.set_pledged_src_size(Some(xdr.len() as u64))?;
    std::io::Write::write_all(&mut enc, xdr)?;
    enc.finish()
}

/// Decompresses an object, refusing more than `limits.max_raw` bytes of output. Several
/// concatenated frames are accepted (RFC 8878 allows them; some writers split large batches).
pub fn decompress_object(object: &[u8], limits: &BatchLimits) -> Result<Vec<u8>, BatchError> {
    if object.len() as u64 > limits.max_object {
        return Err(BatchError::ObjectTooLarge {
            len: object.len() as u64,
            max: limits.max_object,
        });
    }
    // The frame's declared size, if any, only sizes the first allocation, and only up to the
    // limit: a lie costs nothing.
    let hint = zstd::zstd_safe::get_frame_content_size(object)
        .ok()
        .flatten()
        .unwrap_or(0)
        .min(limits.max_raw) as usize;
    let mut out = Vec::with_capacity(hint);
    let dec = zstd::stream::read::Decoder::with_buffer(object).map_err(|e| BatchError::Zstd {
        reason: e.to_string(),
    })?;
    match dec.take(limits.max_raw + 1).read_to_end(&mut out) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(BatchError::Truncated {
                reason: format!("zstd frame ends early: {e}"),
            })
        }
        Err(e) => {
            let reason = e.to_string();
            // zstd reports a frame cut short as "incomplete frame" / "premature end".
            if reason.contains("ncomplete") || reason.contains("premature") {
                return Err(BatchError::Truncated {
                    reason: format!("zstd frame ends early: {reason}"),
                });
            }
            return Err(BatchError::Zstd { reason });
        }
    }
    if out.len() as u64 > limits.max_raw {
        return Err(BatchError::RawTooLarge {
            max: limits.max_raw,
        });
    }
    if out.is_empty() && !object.is_empty() {
        // A frame header and nothing else: an upload cut short right after it began.
        return Err(BatchError::Truncated {
            reason: "the object decompresses to nothing".into(),
        });
    }
    Ok(out)
}

/// The `startSequence`, `endSequence` and count of an object, from the first 12 bytes of its
/// decompressed batch (decompressing only those): enough to learn where a lake starts without
/// holding the whole batch.
pub fn peek_object_range(object: &[u8]) -> Result<(u32, u32, u32), BatchError> {
    let mut head = [0u8; 12];
    let mut dec =
        zstd::stream::read::Decoder::with_buffer(object).map_err(|e| BatchError::Zstd {
            reason: e.to_string(),
        })?;
    dec.read_exact(&mut head).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            BatchError::Truncated {
                reason: "the object ends before its batch header".into(),
            }
        } else {
            BatchError::Zstd {
                reason: e.to_string(),
            }
        }
    })?;
    let word = |i: usize| u32::from_be_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    Ok((word(0), word(4), word(8)))
}

/// Decodes and checks a batch's XDR (see the [module docs](super)). The ledgers are slices of
/// `xdr`.
pub fn decode_batch(xdr: Bytes, limits: &BatchLimits) -> Result<Batch, BatchError> {
    use stellar_xdr::{LedgerCloseMeta, Limited, Limits, ReadXdr};

    let word = |at: usize| -> Result<u32, BatchError> {
        xdr.get(at..at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| BatchError::Truncated {
                reason: format!("{} bytes: shorter than the batch header", xdr.len()),
            })
    };
    let (start, end, count) = (word(0)?, word(4)?, word(8)?);
    if end < start {
        return Err(BatchError::BadRange { start, end });
    }
    let expected = u64::from(end) - u64::from(start) + 1;
    if u64::from(count) != expected {
        return Err(BatchError::CountMismatch {
            start,
            end,
            count,
            expected,
        });
    }
    if count > limits.max_ledgers {
        return Err(BatchError::TooManyLedgers {
            count,
            max: limits.max_ledgers,
        });
    }
    // No allocation from `count`: the vector grows with the ledgers actually decoded.
    let mut ledgers: Vec<BatchLedger> = Vec::new();
    let mut pos = 12;
    for index in 0..count {
        let rest = &xdr[pos..];
        if rest.is_empty() {
            return Err(BatchError::Truncated {
                reason: format!("the batch ends after {index} of its {count} ledgers"),
            });
        }
        let budget = rest
            .len()
            .min(usize::try_from(limits.max_ledger).unwrap_or(usize::MAX));
        let mut r = Limited::new(
            std::io::Cursor::new(rest),
            Limits {
                depth: XDR_DEPTH,
                len: budget,
            },
        );
        if let Err(e) = LedgerCloseMeta::read_xdr(&mut r) {
            return Err(match e {
                // Every read is charged to the byte budget, so running out of it (or of the
                // cursor) means the ledger claims bytes that are not there.
                stellar_xdr::Error::LengthLimitExceeded if budget < rest.len() => {
                    BatchError::LedgerTooLarge {
                        index,
                        max: limits.max_ledger,
                    }
                }
                stellar_xdr::Error::LengthLimitExceeded => BatchError::Truncated {
                    reason: format!("ledger {index} of {count} ends early"),
                },
                stellar_xdr::Error::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
                    BatchError::Truncated {
                        reason: format!("ledger {index} of {count} ends early"),
                    }
                }
                e => BatchError::Xdr {
                    index,
                    reason: e.to_string(),
                },
            });
        }
        let used = r.inner.position() as usize;
        let raw = xdr.slice(pos..pos + used);
        let info = match peek_header(&raw) {
            Ok(Some(info)) => info,
            Ok(None) => {
                // A whole LedgerCloseMeta always holds its header; defensive.
                return Err(BatchError::Xdr {
                    index,
                    reason: "no ledger header".into(),
                });
            }
            Err(error) => return Err(BatchError::Header { index, error }),
        };
        // `index < count <= end - start + 1`, so no overflow.
        let want = start + index;
        if info.ledger_seq != want {
            return Err(BatchError::Sequence {
                index,
                expected: want,
                got: info.ledger_seq,
            });
        }
        if let Err(error) = check_content(&raw, &info) {
            return Err(BatchError::Content {
                index,
                seq: want,
                error,
            });
        }
        if let Some(prev) = ledgers.last() {
            // The sequences follow (checked above); the link is the chain rule's.
            if ChainVerifier::after(prev.info.ledger_seq, prev.info.hash)
                .check(&info)
                .is_err()
            {
                return Err(BatchError::BrokenChain {
                    seq: want,
                    prev: prev.info.ledger_seq,
                });
            }
        }
        ledgers.push(BatchLedger { info, raw });
        pos += used;
    }
    if pos != xdr.len() {
        return Err(BatchError::TrailingBytes {
            len: xdr.len() - pos,
        });
    }
    Ok(Batch {
        start,
        end,
        ledgers,
    })
}

/// Decompresses, decodes and checks an object read at the key for `key_first..=key_last`
/// (see [`Schema::batch_range`](super::Schema::batch_range)).
///
/// The batch must end where its key's range ends and start inside it: Galexie's first batch
/// of a network starts at ledger 2 in the range 0-63, and a writer that began mid-range (the
/// relay exporting from the first ledger it received) starts at that ledger.
pub fn read_object(
    object: &[u8],
    key_first: u32,
    key_last: u32,
    limits: &BatchLimits,
) -> Result<Batch, BatchError> {
    let raw = decompress_object(object, limits)?;
    let batch = decode_batch(Bytes::from(raw), limits)?;
    if batch.end != key_last || batch.start < key_first || batch.start > key_last {
        return Err(BatchError::WrongKey {
            start: batch.start,
            end: batch.end,
            key_first,
            key_last,
        });
    }
    Ok(batch)
}
