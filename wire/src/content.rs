//! Layer 5 of the integrity checks (`docs/protocol.md` section 4): a ledger's transaction set
//! and results hash to what its header commits to.
//!
//! The header (checked by [`crate::header`]) commits to the ledger's content in two fields:
//!
//! - `scpValue.txSetHash`: for `LedgerCloseMeta` v0, the legacy `TransactionSet` hashes as
//!   `sha256(previousLedgerHash || XDR(tx_0) || XDR(tx_1) ...)`, the envelopes in stored order
//!   (that is the set's XDR without its 4-byte count); for v1 and v2, the
//!   `GeneralizedTransactionSet` hashes as the sha256 of its whole XDR.
//! - `txSetResultHash`: the sha256 of the XDR of `TransactionResultSet { results<> }` made of
//!   the `result` (a `TransactionResultPair`) of each `txProcessing` entry, in order. In v2 the
//!   entries are `TransactionResultMetaV1 { ext; result; feeProcessing; txApplyProcessing;
//!   postTxApplyFeeProcessing }`, in v0 and v1 `TransactionResultMeta { result;
//!   feeProcessing; txApplyProcessing }`.
//!
//! Checked against every real ledger in the test data (`wire/tests/content.rs`). With both
//! checked, a relay (or anyone with its key) cannot change a transaction or a result without
//! the subscriber noticing; the meta (ledger entry changes, events) is not committed to by the
//! header and so cannot be checked this way.
//!
//! How: a full `stellar-xdr` decode runs at about 200 MB/s (75 ms for a 14.5 MiB ledger),
//! far over the relay's delivery budget. [`check_content`] instead walks the XDR in place with
//! skippers generated from stellar-xdr's own schema (`schema.rs`, made by
//! `wire/gen/skipper.py`): it finds the byte range of the transaction set and of each result
//! pair, hashes exactly those bytes, and skips the meta between them, building nothing. The
//! walk covers the whole `LedgerCloseMeta` and checks every discriminant, enum value, bool,
//! length bound and padding as a decoder would, so the bytes hashed are the bytes a consumer's
//! decoder reads as the transactions and results, and a ledger that passes also decodes.
//!
//! Bounds: every length is checked against the bytes that remain before it is used, nothing is
//! allocated from a length on the wire, and recursive types are refused past
//! [`MAX_DEPTH`] levels.
//!
//! What it does not do: check signatures, transaction hashes against envelopes, or the meta.

mod schema;
mod walk;

use sha2::{Digest, Sha256};

use crate::header::{Hex, LedgerHeaderInfo, Malformation};
pub use walk::MAX_DEPTH;
use walk::{Stop, Walker};

/// The content hashes computed from a ledger's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentHashes {
    /// The transaction set's hash, as `scpValue.txSetHash` should be.
    pub tx_set_hash: [u8; 32],
    /// The results' hash, as `txSetResultHash` should be.
    pub tx_set_result_hash: [u8; 32],
    /// Entries in `txProcessing` (transactions applied).
    pub transactions: u32,
    /// Bytes hashed: the transaction set's XDR and the results' (what the check costs, at
    /// SHA-256's speed; the rest of the ledger is only walked).
    pub hashed_bytes: u64,
}

/// Why [`check_content`] or [`content_hashes`] refused a ledger.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ContentError {
    /// A field breaks the XDR schema.
    #[error("malformed {ty} at byte {offset}: {problem}")]
    Malformed {
        /// The XDR type being read, such as `SCVal`.
        ty: &'static str,
        /// Offset of the offending bytes in the `LedgerCloseMeta`.
        offset: usize,
        /// What is wrong with it.
        problem: Malformation,
    },
    /// The ledger ends inside a field.
    #[error("ledger ends inside {ty} at byte {offset}")]
    Truncated {
        /// The XDR type being read.
        ty: &'static str,
        /// Where the missing bytes start.
        offset: usize,
    },
    /// Bytes follow the end of the `LedgerCloseMeta`.
    #[error("{extra} bytes after the end of the LedgerCloseMeta at byte {end}")]
    TrailingBytes {
        /// Where the `LedgerCloseMeta` ends.
        end: usize,
        /// How many bytes follow.
        extra: usize,
    },
    /// The `LedgerCloseMeta` version is not 0, 1 or 2 (header peeked from another ledger).
    #[error("unknown LedgerCloseMeta version {version}")]
    UnknownVersion {
        /// The version.
        version: u32,
    },
    /// The transaction set does not hash to the header's `scpValue.txSetHash`: a transaction
    /// was changed, added, removed or reordered.
    #[error(
        "ledger {seq}: the transaction set hashes to {}, the header's txSetHash is {}",
        Hex(computed),
        Hex(header)
    )]
    TxSetHashMismatch {
        /// The ledger.
        seq: u32,
        /// `scpValue.txSetHash` from the header.
        header: [u8; 32],
        /// The hash of the transaction set delivered.
        computed: [u8; 32],
    },
    /// The results do not hash to the header's `txSetResultHash`: a result was changed,
    /// added, removed or reordered.
    #[error(
        "ledger {seq}: the transaction results hash to {}, the header's txSetResultHash is {}",
        Hex(computed),
        Hex(header)
    )]
    ResultSetHashMismatch {
        /// The ledger.
        seq: u32,
        /// `txSetResultHash` from the header.
        header: [u8; 32],
        /// The hash of the results delivered.
        computed: [u8; 32],
    },
}

impl From<Stop> for ContentError {
    fn from(s: Stop) -> Self {
        match s.problem {
            Some(problem) => ContentError::Malformed {
                ty: s.ty,
                offset: s.offset,
                problem,
            },
            None => ContentError::Truncated {
                ty: s.ty,
                offset: s.offset,
            },
        }
    }
}

/// Checks that `lcm`'s transaction set and results hash to what its header says.
///
/// `info` must be what [`crate::header::peek_header`] returned for `lcm` (its header is
/// already checked against its hash); the walk starts where the header ends. Returns the
/// hashes, equal to the header's, or the first problem found.
pub fn check_content(lcm: &[u8], info: &LedgerHeaderInfo) -> Result<ContentHashes, ContentError> {
    let hashes = content_hashes(lcm, info)?;
    if hashes.tx_set_hash != info.tx_set_hash {
        return Err(ContentError::TxSetHashMismatch {
            seq: info.ledger_seq,
            header: info.tx_set_hash,
            computed: hashes.tx_set_hash,
        });
    }
    if hashes.tx_set_result_hash != info.tx_set_result_hash {
        return Err(ContentError::ResultSetHashMismatch {
            seq: info.ledger_seq,
            header: info.tx_set_result_hash,
            computed: hashes.tx_set_result_hash,
        });
    }
    Ok(hashes)
}

/// Computes `lcm`'s content hashes without comparing them with the header: the walk of
/// [`check_content`], for a caller that builds ledgers and needs the hashes to put in them.
pub fn content_hashes(lcm: &[u8], info: &LedgerHeaderInfo) -> Result<ContentHashes, ContentError> {
    let version = info.lcm_version;
    if version > 2 {
        return Err(ContentError::UnknownVersion { version });
    }
    let mut w = Walker::new(lcm, info.header_end.min(lcm.len()));
    schema::ledger_header_history_entry_ext(&mut w, 0)?;

    let tx_set_start = w.pos();
    let mut hashed_bytes = 0u64;
    let tx_set_hash: [u8; 32] = if version == 0 {
        schema::transaction_set(&mut w, 0)?;
        // `TransactionSet { Hash previousLedgerHash; TransactionEnvelope txs<>; }`: the hash
        // covers the previous hash and the envelopes, not the count between them.
        let set = &lcm[tx_set_start..w.pos()];
        let mut h = Sha256::new();
        h.update(&set[..32]);
        h.update(&set[36..]);
        hashed_bytes += set.len() as u64 - 4;
        h.finalize().into()
    } else {
        schema::generalized_transaction_set(&mut w, 0)?;
        hashed_bytes += (w.pos() - tx_set_start) as u64;
        Sha256::digest(&lcm[tx_set_start..w.pos()]).into()
    };

    // Each entry holds at least a result pair (a hash, a fee, a code, an ext), two empty
    // change lists and a meta tag.
    let transactions = w.count(u32::MAX, 32 + 8 + 4 + 4 + 4 + 4, "txProcessing")?;
    let mut results = Sha256::new();
    results.update(transactions.to_be_bytes());
    for _ in 0..transactions {
        if version == 2 {
            schema::extension_point(&mut w, 0)?;
        }
        let start = w.pos();
        schema::transaction_result_pair(&mut w, 0)?;
        results.update(&lcm[start..w.pos()]);
        hashed_bytes += (w.pos() - start) as u64;
        schema::ledger_entry_changes(&mut w, 0)?; // feeProcessing
        schema::transaction_meta(&mut w, 0)?; // txApplyProcessing
        if version == 2 {
            schema::ledger_entry_changes(&mut w, 0)?; // postTxApplyFeeProcessing
        }
    }
    let tx_set_result_hash: [u8; 32] = results.finalize().into();

    // The rest is not committed to by these hashes, but is walked too, so that a ledger that
    // passes is one well-formed LedgerCloseMeta and nothing else. (Each element takes at least
    // its 4-byte tag, the bound given to `count`.)
    for _ in 0..w.count(u32::MAX, 4, "upgradesProcessing")? {
        schema::upgrade_entry_meta(&mut w, 0)?;
    }
    for _ in 0..w.count(u32::MAX, 4, "scpInfo")? {
        schema::scp_history_entry(&mut w, 0)?;
    }
    if version >= 1 {
        w.skip(8, "totalByteSizeOfLiveSorobanState")?;
        for _ in 0..w.count(u32::MAX, 4, "evictedKeys")? {
            schema::ledger_key(&mut w, 0)?;
        }
        if version == 1 {
            for _ in 0..w.count(u32::MAX, 4, "unused")? {
                schema::ledger_entry(&mut w, 0)?;
            }
        }
    }
    if w.pos() != lcm.len() {
        return Err(ContentError::TrailingBytes {
            end: w.pos(),
            extra: lcm.len() - w.pos(),
        });
    }
    Ok(ContentHashes {
        tx_set_hash,
        tx_set_result_hash,
        transactions,
        hashed_bytes: hashed_bytes + 4,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes after the header of a v0 ledger with no transactions in its set and one
    /// `txProcessing` entry whose Soroban return value is `vecs` nested `SCV_VEC`s around an
    /// `SCV_VOID`: `vecs + 1` levels of SCVal.
    fn nested_return_value(vecs: usize) -> Vec<u8> {
        let mut b = Vec::new();
        let word = |b: &mut Vec<u8>, w: i32| b.extend_from_slice(&w.to_be_bytes());
        word(&mut b, 0); // LedgerHeaderHistoryEntry.ext
        b.extend_from_slice(&[0x22; 32]); // TransactionSet.previousLedgerHash
        word(&mut b, 0); // txs<>
        word(&mut b, 1); // txProcessing<>: one entry
        b.extend_from_slice(&[0x33; 32]); // TransactionResultPair.transactionHash
        b.extend_from_slice(&100i64.to_be_bytes()); // feeCharged
        word(&mut b, -2); // txTOO_EARLY: no operation results
        word(&mut b, 0); // TransactionResult.ext
        word(&mut b, 0); // feeProcessing<>
        word(&mut b, 3); // TransactionMeta v3
        for _ in 0..3 {
            word(&mut b, 0); // ext, txChangesBefore, operations
        }
        word(&mut b, 0); // txChangesAfter
        word(&mut b, 1); // sorobanMeta present
        word(&mut b, 0); // SorobanTransactionMetaExt v0
        word(&mut b, 0); // events<>
        for _ in 0..vecs {
            word(&mut b, 16); // SCV_VEC
            word(&mut b, 1); // present
            word(&mut b, 1); // one element
        }
        word(&mut b, 1); // SCV_VOID
        word(&mut b, 0); // diagnosticEvents<>
        word(&mut b, 0); // upgradesProcessing<>
        word(&mut b, 0); // scpInfo<>
        b
    }

    fn v0_header() -> LedgerHeaderInfo {
        LedgerHeaderInfo {
            lcm_version: 0,
            ledger_seq: 7,
            hash: [0; 32],
            previous_hash: [0; 32],
            protocol_version: 23,
            close_time: 0,
            tx_set_hash: [0; 32],
            tx_set_result_hash: [0; 32],
            header_end: 0,
        }
    }

    #[test]
    fn nesting_is_bounded_without_exhausting_the_stack() {
        let info = v0_header();
        let ok = content_hashes(&nested_return_value(MAX_DEPTH as usize - 1), &info).unwrap();
        assert_eq!(ok.transactions, 1);
        let at_depth = |vecs: usize| match content_hashes(&nested_return_value(vecs), &info) {
            Err(ContentError::Malformed {
                ty: "SCVal",
                problem: Malformation::TooDeep { max: MAX_DEPTH },
                ..
            }) => {}
            other => panic!("{vecs} levels: {other:?}"),
        };
        at_depth(MAX_DEPTH as usize);
        // A million levels stop at the bound, in a test thread's 2 MiB stack.
        at_depth(1_000_000);
    }

    #[test]
    fn v0_tx_set_hash_skips_the_count() {
        // No transactions: the set hashes as its previous hash alone; the results as the
        // XDR of a one-entry TransactionResultSet.
        let bytes = nested_return_value(0);
        let h = content_hashes(&bytes, &v0_header()).unwrap();
        assert_eq!(h.tx_set_hash, <[u8; 32]>::from(Sha256::digest([0x22; 32])));
        let mut results = 1u32.to_be_bytes().to_vec();
        results.extend_from_slice(&bytes[4 + 36 + 4..4 + 36 + 4 + 48]);
        assert_eq!(
            h.tx_set_result_hash,
            <[u8; 32]>::from(Sha256::digest(&results))
        );
        assert_eq!(h.hashed_bytes, 32 + 4 + 48);
        // And check_content names which hash differs.
        let mut info = v0_header();
        info.tx_set_hash = h.tx_set_hash;
        assert_eq!(
            check_content(&bytes, &info),
            Err(ContentError::ResultSetHashMismatch {
                seq: 7,
                header: [0; 32],
                computed: h.tx_set_result_hash
            })
        );
        info.tx_set_result_hash = h.tx_set_result_hash;
        assert_eq!(check_content(&bytes, &info), Ok(h));
    }
}
