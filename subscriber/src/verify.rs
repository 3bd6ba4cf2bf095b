//! Layer 4 of the integrity checks (`docs/protocol.md` section 4): every reassembled ledger's
//! header is read from its bytes and must match its end record, and the ledgers must form
//! Stellar's hash chain, across reconnects and relay switches.
//!
//! The reassembler has already checked layers 1 to 3 (bounds, codecs, checksum, order); the
//! checksum only proves that the bytes are the ones the relay meant to send. These checks
//! prove that they are the next ledger of the chain this subscriber has been following: a relay
//! (or its ring) serving another network or another run is caught here.

use ledger_relay_wire::frame::LedgerEnd;
use ledger_relay_wire::header::{peek_header, ChainVerifier, LedgerHeaderInfo};

use crate::error::VerifyError;

/// Checks ledgers against their end records and the hash chain. Kept for the life of a
/// subscription, so the chain is checked across sessions and relays.
#[derive(Debug, Clone, Default)]
pub struct Verifier {
    chain: ChainVerifier,
}

impl Verifier {
    /// A verifier that accepts any first ledger.
    pub fn new() -> Verifier {
        Verifier::default()
    }

    /// A verifier whose first ledger must be `seq`.
    pub fn starting_at(seq: u32) -> Verifier {
        Verifier {
            chain: ChainVerifier::starting_at(seq),
        }
    }

    /// A verifier resuming after ledger `seq` whose header hash is `hash`: the next ledger
    /// must be `seq + 1` and link to `hash`.
    pub fn after(seq: u32, hash: [u8; 32]) -> Verifier {
        Verifier {
            chain: ChainVerifier::after(seq, hash),
        }
    }

    /// The last ledger accepted (or given to [`Verifier::after`]): sequence and header hash.
    pub fn last(&self) -> Option<(u32, [u8; 32])> {
        self.chain.last()
    }

    /// Checks the ledger `data` that the relay sent as `seq` with end record `end`: its header
    /// parses, `sha256(header) == hash`, the header's sequence, hash and previous hash equal
    /// the end record's, and it is the next ledger of the chain. On success the chain advances
    /// to it; on failure the verifier is unchanged.
    pub fn verify(
        &mut self,
        seq: u32,
        data: &[u8],
        end: &LedgerEnd,
    ) -> Result<LedgerHeaderInfo, VerifyError> {
        let info = match peek_header(data) {
            Ok(Some(info)) => info,
            Ok(None) => {
                return Err(VerifyError::Truncated {
                    seq,
                    len: data.len(),
                })
            }
            Err(source) => return Err(VerifyError::Header { seq, source }),
        };
        if info.ledger_seq != seq || end.seq != seq {
            return Err(VerifyError::SequenceMismatch {
                seq,
                header_seq: info.ledger_seq,
            });
        }
        if info.hash != end.header_hash {
            return Err(VerifyError::HashMismatch {
                seq,
                header: info.hash,
                end: end.header_hash,
            });
        }
        if info.previous_hash != end.previous_hash {
            return Err(VerifyError::PreviousHashMismatch {
                seq,
                header: info.previous_hash,
                end: end.previous_hash,
            });
        }
        self.chain.check(&info)?;
        Ok(info)
    }
}
