//! Typed errors for frames and reassembly.
//!
//! Codec, record-marking and header errors live next to their code in [`crate::compress`],
//! [`crate::record`] and [`crate::header`].

use crate::compress::{Codec, CodecError};

/// A frame could not be decoded. Each is a protocol violation by the peer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The frame type byte names no frame this version knows.
    #[error("unknown frame type {ty:#04x}")]
    UnknownType {
        /// The type byte received.
        ty: u8,
    },
    /// The declared body length exceeds the limit for this frame type.
    #[error("{frame} frame body of {len} bytes exceeds the limit of {max}")]
    TooLong {
        /// Frame name.
        frame: &'static str,
        /// Declared body length.
        len: u32,
        /// Largest accepted.
        max: u32,
    },
    /// A fixed-size frame declared another length.
    #[error("{frame} frame body must be {expected} bytes, got {len}")]
    BadLength {
        /// Frame name.
        frame: &'static str,
        /// Declared body length.
        len: u32,
        /// Required body length.
        expected: u32,
    },
    /// A field holds a value the protocol does not allow.
    #[error("malformed {frame} frame: {what}")]
    Malformed {
        /// Frame name.
        frame: &'static str,
        /// What was wrong.
        what: &'static str,
    },
    /// A chunk names a codec this version does not know.
    #[error("unknown codec {codec}")]
    UnknownCodec {
        /// The codec byte received.
        codec: u8,
    },
    /// A chunk's payload is longer than its raw length allows (a chunk that does not shrink must
    /// be sent raw), or a raw chunk's payload differs from its raw length.
    #[error(
        "chunk payload of {payload_len} bytes does not fit raw length {raw_len} with codec {codec}"
    )]
    PayloadLength {
        /// Codec of the chunk.
        codec: Codec,
        /// Declared raw length.
        raw_len: u32,
        /// Payload bytes present.
        payload_len: u32,
    },
    /// The raw length of a chunk exceeds `Limits::max_chunk_raw`.
    #[error("chunk raw length {raw_len} exceeds the limit of {max}")]
    ChunkTooLong {
        /// Declared raw length.
        raw_len: u32,
        /// Largest accepted.
        max: u32,
    },
    /// Bytes remained after a frame where exactly one frame was expected.
    #[error("{extra} unexpected bytes after a {frame} frame")]
    TrailingBytes {
        /// Frame name.
        frame: &'static str,
        /// Count of extra bytes.
        extra: usize,
    },
    /// The input ended inside a frame.
    #[error("input ended inside a frame: {have} of {need} bytes")]
    Truncated {
        /// Bytes available.
        have: usize,
        /// Bytes the frame needs.
        need: usize,
    },
}

/// The reassembler refused input. After any of these the reassembler delivers nothing more.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AssemblyError {
    /// A chunk's payload failed to decompress.
    #[error("ledger {seq} chunk {index}: {source}")]
    Codec {
        /// Ledger sequence.
        seq: u32,
        /// Chunk index.
        index: u32,
        /// The codec failure.
        source: CodecError,
    },
    /// A chunk index beyond the per-ledger limit or the ledger's announced chunk count.
    #[error("ledger {seq} chunk index {index} out of range (limit {limit})")]
    IndexOutOfRange {
        /// Ledger sequence.
        seq: u32,
        /// Chunk index received.
        index: u32,
        /// Exclusive upper bound.
        limit: u32,
    },
    /// A chunk's raw range or a ledger's raw length exceeds `Limits::max_ledger_raw`, or a chunk
    /// lies beyond the announced length.
    #[error("ledger {seq}: raw range ending at {end} exceeds the limit of {limit} bytes")]
    TooLong {
        /// Ledger sequence.
        seq: u32,
        /// End offset of the offending range.
        end: u64,
        /// The limit that was exceeded.
        limit: u64,
    },
    /// The same chunk arrived twice with different contents or placement.
    #[error("ledger {seq} chunk {index} arrived twice with different contents")]
    ConflictingChunk {
        /// Ledger sequence.
        seq: u32,
        /// Chunk index.
        index: u32,
    },
    /// Two different end records for the same ledger.
    #[error("ledger {seq} has two different end records")]
    ConflictingEnd {
        /// Ledger sequence.
        seq: u32,
    },
    /// A frame for a ledger too far ahead of the next one to deliver: the peer skipped ledgers
    /// or ignores the in-flight window.
    #[error("ledger {got} is beyond the window: next to deliver is {next}, window {window}")]
    Gap {
        /// Next sequence the reassembler will deliver.
        next: u32,
        /// Sequence received.
        got: u32,
        /// Ledgers allowed in flight.
        window: u32,
    },
    /// A frame for a ledger long before the ones recently delivered.
    #[error("ledger {got} regresses: next to deliver is {next}")]
    Regression {
        /// Next sequence the reassembler will deliver.
        next: u32,
        /// Sequence received.
        got: u32,
    },
    /// The chunks of a complete ledger do not tile its raw length.
    #[error("ledger {seq} chunk {index} starts at {got}, expected {expected}")]
    Misplaced {
        /// Ledger sequence.
        seq: u32,
        /// Chunk index.
        index: u32,
        /// Offset the previous chunks imply.
        expected: u64,
        /// Offset the chunk declared.
        got: u64,
    },
    /// The assembled ledger's length differs from its end record.
    #[error("ledger {seq} assembled to {got} bytes, end record says {expected}")]
    LengthMismatch {
        /// Ledger sequence.
        seq: u32,
        /// Length in the end record.
        expected: u64,
        /// Length assembled.
        got: u64,
    },
    /// The assembled ledger's checksum differs from its end record.
    #[error("ledger {seq} checksum {got:#018x} differs from the end record's {expected:#018x}")]
    ChecksumMismatch {
        /// Ledger sequence.
        seq: u32,
        /// Checksum in the end record.
        expected: u64,
        /// Checksum of the assembled bytes.
        got: u64,
    },
    /// Accepting the chunk would exceed `Limits::max_buffered_bytes`.
    #[error("reassembly buffer full: {held} bytes held, {incoming} more would exceed {limit}")]
    BufferFull {
        /// Raw bytes held now.
        held: u64,
        /// Raw bytes of the refused chunk.
        incoming: u64,
        /// The limit.
        limit: u64,
    },
    /// An earlier error stopped the reassembler; it accepts nothing more.
    #[error("reassembler stopped after an earlier error: {0}")]
    Stopped(Box<AssemblyError>),
}
