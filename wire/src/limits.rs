//! Bounds on everything a peer can make this crate hold.
//!
//! Every length read from the wire is checked against a [`Limits`] value before any body is
//! buffered or any memory is reserved, so a hostile peer can cost at most these amounts.

/// Bounds on frame sizes and reassembly state. Both ends use the same defaults; the relay tells
/// the subscriber the values it sends with (`SessionAccept`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Longest record accepted from stellar-core's metadata pipe (default 256 MiB; the largest
    /// pubnet ledgers are tens of MiB).
    pub max_record_len: u32,
    /// Longest body of any frame other than `Chunk` (default 64 KiB: the largest is a `Resend`
    /// naming every chunk of a maximal ledger, 4 bytes per index).
    pub max_control_body: u32,
    /// Largest raw (decompressed) length of one chunk (default 4 MiB; chunks are 256 KiB by
    /// default, see the relay's `chunk_size`).
    pub max_chunk_raw: u32,
    /// Largest raw length of one ledger (default 256 MiB, the same as `max_record_len`).
    pub max_ledger_raw: u64,
    /// Most chunks one ledger may be cut into (default 16,384: 256 MiB in 16 KiB chunks).
    pub max_chunks_per_ledger: u32,
    /// How many ledgers, counted from the next one to deliver, may be in flight at once
    /// (default 8). A frame for a ledger further ahead is a protocol error.
    pub max_ledgers_in_flight: u32,
    /// Most raw bytes the reassembler holds across all incomplete ledgers (default 512 MiB:
    /// eight in-flight ledgers of 64 MiB, four times the Phase 3 stress size).
    pub max_buffered_bytes: u64,
    /// Most bytes of data frames a receiver holds before the reassembler takes them, across
    /// all of a session's lanes: frames being read from their streams, chunks being
    /// decompressed, frames waiting for the reassembler. A frame's share is taken whole, from
    /// its header ([`crate::frame::data_head`]), before its body is read.
    ///
    /// Default 128 MiB: a window of 8 Phase 3 ledgers (14.5 MiB) in flight raw on one lane is
    /// 116 MiB. A budget that an honest window outgrows can hold a lane back for good: the
    /// streams waiting for it fill QUIC's receive window, and the frames holding it never get
    /// their last bytes.
    pub max_unassembled_bytes: u64,
    /// Longest error message carried in an `Error` frame (default 1 KiB).
    pub max_message_len: u16,
    /// Longest `CoreRequest` body: target, content type and form together (default 1 MiB; a
    /// `/tx?blob=` of the largest Soroban transaction is about 200 KiB).
    pub max_core_request: u32,
    /// Longest `CoreResponse` body (default 32 MiB: `/getledgerentry` of 200 keys, the most
    /// stellar-rpc asks at once, each a contract of up to 128 KiB in base64).
    pub max_core_response: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_record_len: 256 << 20,
            max_control_body: 64 << 10,
            max_chunk_raw: 4 << 20,
            max_ledger_raw: 256 << 20,
            max_chunks_per_ledger: 16_384,
            max_ledgers_in_flight: 8,
            max_buffered_bytes: 512 << 20,
            max_unassembled_bytes: 128 << 20,
            max_message_len: 1024,
            max_core_request: 1 << 20,
            max_core_response: 32 << 20,
        }
    }
}
