//! Layers 4 and 5 of the integrity checks (`docs/protocol.md` section 4): every reassembled
//! ledger's header is read from its bytes and must match its end record, the ledgers must form
//! Stellar's hash chain across reconnects and relay switches (starting from a trusted anchor
//! when one is given), and each ledger's transaction set and results must hash to what its
//! header commits to.
//!
//! The reassembler has already checked layers 1 to 3 (bounds, codecs, checksum, order); the
//! checksum only proves that the bytes are the ones the relay meant to send. The chain proves
//! that they are the next ledger of the chain this subscriber has been following: a relay (or
//! its ring) serving another network or another run is caught here. The content hashes prove
//! that the transactions and results are the ones the header (and so the chain) commits to: a
//! relay that rewrites them, even with a valid chain of headers, is caught too.

use ledger_relay_wire::content::check_content;
use ledger_relay_wire::frame::LedgerEnd;
use ledger_relay_wire::header::{peek_header, ChainError, ChainVerifier, LedgerHeaderInfo};

use crate::config::Anchor;
use crate::error::VerifyError;

/// Checks ledgers against their end records, the hash chain and their content hashes. Kept for
/// the life of a subscription, so the chain is checked across sessions and relays.
#[derive(Debug, Clone, Default)]
pub struct Verifier {
    chain: ChainVerifier,
    /// The trusted ledger the first one must match, until the first ledger is accepted.
    anchor: Option<Anchor>,
    /// Skip layer 5 (`SubscribeConfig::content_check` off).
    skip_content: bool,
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
            ..Verifier::default()
        }
    }

    /// A verifier resuming after ledger `seq` whose header hash is `hash`: the next ledger
    /// must be `seq + 1` and link to `hash`.
    pub fn after(seq: u32, hash: [u8; 32]) -> Verifier {
        Verifier {
            chain: ChainVerifier::after(seq, hash),
            ..Verifier::default()
        }
    }

    /// A verifier anchored to a trusted ledger, for a subscription that starts at `start`
    /// (which [`crate::SubscribeConfig::validate`] requires to be `anchor.seq` or
    /// `anchor.seq + 1`): the first ledger must be the anchor itself, with its hash, or the
    /// ledger after it, linking to it.
    pub fn anchored(anchor: Anchor, start: u32) -> Verifier {
        if start == anchor.seq {
            Verifier {
                chain: ChainVerifier::starting_at(anchor.seq),
                anchor: Some(anchor),
                skip_content: false,
            }
        } else {
            Verifier {
                chain: ChainVerifier::after(anchor.seq, anchor.hash),
                anchor: Some(anchor),
                skip_content: false,
            }
        }
    }

    /// Turns the content-hash check (layer 5) on (the default) or off. Off saves its cost
    /// (about 3 to 5 ms of CPU per 14.5 MiB ledger, see `bench/RESULTS.md`) and leaves a relay
    /// free to alter transactions and results unseen; the header chain is still checked.
    pub fn set_content_check(&mut self, on: bool) {
        self.skip_content = !on;
    }

    /// Called when a session opens with the relay starting at `first_seq`: before anything
    /// has been accepted (and without an anchor, which fixes the first ledger already), the
    /// first ledger must be the one the relay starts at.
    pub fn expect_first(&mut self, first_seq: u32) {
        if self.chain.last().is_none() && self.anchor.is_none() {
            self.chain = ChainVerifier::starting_at(first_seq);
        }
    }

    /// The last ledger accepted (or given to [`Verifier::after`] or as the anchor):
    /// sequence and header hash.
    pub fn last(&self) -> Option<(u32, [u8; 32])> {
        self.chain.last()
    }

    /// Checks the ledger `data` that the relay sent as `seq` with end record `end`: its header
    /// parses, `sha256(header) == hash`, the header's sequence, hash and previous hash equal
    /// the end record's, it is the next ledger of the chain (and matches the anchor, if it is
    /// the first), and its transaction set and results hash to the header's `txSetHash` and
    /// `txSetResultHash`. On success the chain advances to it; on failure the verifier is
    /// unchanged.
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
        // The cheap checks first; the chain advances only once the content checks out too.
        let mut chain = self.chain.clone();
        if let Some(anchor) = self.anchor {
            self.check_anchor(&anchor, &info)?;
        }
        chain.check(&info)?;
        if !self.skip_content {
            self.content(seq, data, &info)?;
        }
        self.chain = chain;
        // The anchor is checked once: from here on the chain carries it.
        self.anchor = None;
        Ok(info)
    }

    /// Layer 5: the transaction set and results against the header's hashes.
    fn content(&self, seq: u32, data: &[u8], info: &LedgerHeaderInfo) -> Result<(), VerifyError> {
        check_content(data, info).map_err(|source| VerifyError::Content { seq, source })?;
        Ok(())
    }

    /// The first ledger against the anchor: the anchor itself must have its hash; the ledger
    /// after it must link to it (the chain rule, [`ChainVerifier`]'s). Any other sequence is
    /// left to the chain check.
    fn check_anchor(&self, anchor: &Anchor, info: &LedgerHeaderInfo) -> Result<(), VerifyError> {
        let got = if info.ledger_seq == anchor.seq {
            if info.hash == anchor.hash {
                return Ok(());
            }
            info.hash
        } else {
            match ChainVerifier::after(anchor.seq, anchor.hash).check(info) {
                Err(ChainError::BrokenChain { got_previous, .. }) => got_previous,
                // Links, or is not the ledger after the anchor.
                _ => return Ok(()),
            }
        };
        Err(VerifyError::AnchorMismatch {
            seq: info.ledger_seq,
            anchor_seq: anchor.seq,
            expected: anchor.hash,
            got,
        })
    }
}
