//! SEP-54 data lakes, as pure functions: object names, the `LedgerCloseMetaBatch` codec and the
//! `.config.json` manifest.
//!
//! A SEP-54 lake (what Galexie writes and stellar-rpc and the ingest SDK read) is a key-value
//! store of zstd-compressed `LedgerCloseMetaBatch` objects:
//!
//! ```text
//! <root>/.config.json                                        the manifest (written once)
//! <root>/<partition>/<batch>.xdr.zst                         every batch
//!   partition = %08X--%d-%d   (0xFFFFFFFF - first, first, last of the partition)
//!   batch     = %08X--%d      (one ledger per batch)    or  %08X--%d-%d  (several)
//! ```
//!
//! The partition directory is left out when a partition holds one batch. Inverting the first
//! sequence in the hex prefix makes a lexicographic listing return the newest batch first.
//!
//! An object is one zstd frame of XDR
//! `LedgerCloseMetaBatch { uint32 startSequence; uint32 endSequence; LedgerCloseMeta ledgerCloseMetas<>; }`:
//! a 12-byte header (`start`, `end`, the array's count) followed by the ledgers' XDR back to
//! back, with no length between them (an XDR array of a union). So writing a batch is a
//! concatenation of ledgers exactly as stellar-core emits them, and reading one must decode
//! each `LedgerCloseMeta` to find where the next begins.
//!
//! What this module does not do: talk to a store (the `ledger-relay-lake` crate does, through
//! `object_store`), or decide what to write or when.
//!
//! Bytes read from a lake are hostile: [`read_object`] bounds the object, its decompressed size
//! and every ledger by [`BatchLimits`] before allocating, decodes each ledger with
//! `stellar-xdr` under a byte and depth budget (so a claimed length can never allocate more than
//! the bytes that are there), checks each ledger's header hash ([`crate::header`]), its
//! transaction set and results against the hashes its header commits to ([`crate::content`]:
//! a lake is not trusted to hold what the network closed), that the sequences run
//! `start..=end` and that the ledgers chain, and returns the ledgers as slices of the
//! decompressed buffer, byte-identical to what the writer stored.

mod batch;
mod manifest;
mod names;

pub use batch::*;
pub use manifest::*;
pub use names::*;

#[cfg(test)]
mod tests;
