//! What can go wrong when the double starts.

use std::path::PathBuf;

/// Why the double cannot load its ledgers or open its ports.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DoubleError {
    /// The ledger file cannot be opened or read, or is not a record-marked stream.
    #[error("reading ledgers from {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// A record of the file is not a `LedgerCloseMeta`.
    #[error("record {index} of {path} is not a LedgerCloseMeta: {source}")]
    Decode {
        /// The file.
        path: PathBuf,
        /// The record's index, from 0.
        index: usize,
        /// What the XDR decoder said.
        #[source]
        source: stellar_xdr::Error,
    },
    /// The file holds no ledger.
    #[error("{path} holds no ledger")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// A ledger's sequence is not above the one before it.
    #[error("{path}: ledger {seq} follows ledger {previous}: sequences must increase")]
    Order {
        /// The file.
        path: PathBuf,
        /// The sequence before.
        previous: u32,
        /// The sequence that does not increase.
        seq: u32,
    },
    /// A port cannot be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}
