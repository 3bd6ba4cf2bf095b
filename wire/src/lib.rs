//! The sans-IO protocol core of Ledger Relay.
//!
//! Ledger Relay carries the `LedgerCloseMeta` stream that stellar-core writes on its metadata pipe
//! to Stellar RPC instances on other machines, over several parallel QUIC connections ("lanes").
//! This crate holds every piece of that product that hostile or damaged bytes can reach, written
//! without any IO: no sockets, no async runtime, no clock reads. Callers feed it bytes and the
//! current time and take decisions out of it, the way `quinn-proto` and `rustls` are driven.
//!
//! What it does:
//! - [`record`]: stellar-core's record marking (`--metadata-output-stream`), read incrementally
//!   and written back, with bounded lengths; `.zst` dumps read as a stream.
//! - [`header`]: the ledger sequence, header hash and previous hash peeked from the first bytes of
//!   a `LedgerCloseMeta`, with `sha256(header) == hash` checked, and the hash-chain verifier.
//! - [`content`]: the transaction set and results of a ledger hashed in place and checked
//!   against the header's `txSetHash` and `txSetResultHash`, without decoding the ledger.
//! - [`core_http`]: stellar-core's HTTP requests carried through relays (`CoreRequest`,
//!   `CoreResponse`), which endpoints a relay forwards, and core's form rules for `ledgerSeq`.
//! - [`frame`]: the relay protocol's frames, encoded and decoded with every length checked
//!   against [`Limits`] before a body is buffered.
//! - [`compress`]: the chunk codecs (none, lz4, zstd) with decompression bounded by the declared
//!   raw length.
//! - [`chunker`]: cuts a ledger into chunks while it is still arriving.
//! - [`assembler`]: the reassembler state machine that turns chunks from any lane, in any order,
//!   into complete, checksum-verified ledgers in sequence order.
//! - [`sender`]: its peer on the relay, the session state machine: the window, acks, resends,
//!   lane striping, live and catch-up reading, and the typed reason of every session's end.
//! - [`stored`]: the values the relay's retention ring keeps on disk, encoded, and decoded
//!   with every checksum, key and length checked (bytes read back from disk are hostile too).
//! - [`lake`]: SEP-54 data lakes (what Galexie writes): object names, the bounded
//!   `LedgerCloseMetaBatch` codec and the `.config.json` manifest.
//! - [`text`]: text a peer chose (error messages, close reasons, certificate names) escaped
//!   before it reaches a log line or a terminal.
//!
//! What it does not do: open connections, spawn tasks, read clocks, touch the disk or the
//! network. The shells in `ledger-relay` and `ledger-relay-subscriber` carry its decisions out.
//!
//! The protocol is specified byte by byte in `docs/protocol.md`. In short, every frame is
//!
//! ```text
//! +--------+----------------+--------------------------+
//! | type u8| body length u32| body (length bytes)      |
//! +--------+----------------+--------------------------+
//! ```
//!
//! and a ledger travels as `Chunk` frames (each on its own QUIC stream, on any lane) followed by
//! one `LedgerEnd` frame that carries its chunk count, length, checksum and header hashes.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod assembler;
pub mod chunker;
pub mod compress;
pub mod content;
pub mod core_http;
pub mod error;
pub mod frame;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod header;
pub mod lake;
pub mod limits;
pub mod record;
pub mod sender;
pub mod stored;
pub mod text;

pub use assembler::{AssembledLedger, Missing, Prefix, Reassembler};
pub use chunker::{Chunker, LedgerSummary, RawChunk};
pub use compress::Codec;
pub use compress::CodecError;
pub use error::{AssemblyError, FrameError};
pub use frame::Frame;
pub use header::Hex;
pub use limits::Limits;
pub use sender::{CloseReason, CompleteLedger, Sender, SenderConfig};

/// The protocol version carried in the ALPN string and in `SessionOpen` / `LaneJoin`.
pub const PROTOCOL_VERSION: u16 = 1;

/// The ALPN protocol identifier every lane negotiates; a peer speaking another version fails the
/// TLS handshake instead of misreading frames.
pub const ALPN: &[u8] = b"ledger-relay/1";

/// Checksum of a ledger's raw bytes as carried in `LedgerEnd`: XXH3-64.
///
/// XXH3 runs at over 10 GB/s on one core, so verifying a 14.5 MiB ledger costs about a
/// millisecond or less; it guards against corruption and relay bugs, while tampering by a
/// relay is caught by the SHA-256 header hash chain ([`header::ChainVerifier`]).
pub fn checksum(raw: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(raw)
}
