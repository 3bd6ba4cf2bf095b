//! The relay protocol's frames: encoding and bounded decoding.
//!
//! Every frame is a 5-byte header (type `u8`, body length `u32` big-endian) and a body. The
//! header is checked completely (known type, length within [`Limits`] or exactly the fixed size)
//! before any body byte is buffered. All integers are big-endian. The byte layout of each body is
//! specified in `docs/protocol.md`; the constants below are the single source of truth for sizes.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::compress::Codec;
use crate::core_http::{self, CoreRequest, CoreResponse};
use crate::error::FrameError;
use crate::limits::Limits;
pub use crate::text::truncate_utf8;

/// Length of every frame header: type (1) + body length (4).
pub const FRAME_HEADER_LEN: usize = 5;
/// Fixed part of a `Chunk` body: seq 4, index 4, raw offset 8, raw length 4, codec 1.
pub const CHUNK_FIXED_LEN: usize = 21;
/// Length of a `LedgerEnd` body.
pub const LEDGER_END_LEN: usize = 4 + 4 + 8 + 8 + 32 + 32 + 8 + 8;
/// Length of the session token handed out in `SessionAccept` and presented by `LaneJoin`.
pub const TOKEN_LEN: usize = 16;

const SESSION_OPEN_LEN: u32 = 2 + 1 + 4 + 1 + 1 + 2;
const SESSION_ACCEPT_LEN: u32 = 2 + 8 + 16 + 1 + 4 + 4 + 4 + 4 + 2 + 4 + 4 + 8;
const LANE_JOIN_LEN: u32 = 2 + 8 + 16 + 1;
const LANE_ACCEPT_LEN: u32 = 1;
const ACK_LEN: u32 = 4;
const RESEND_FIXED_LEN: u32 = 4 + 1 + 4;
const HEARTBEAT_LEN: u32 = 4 + 4 + 8;
const ERROR_FIXED_LEN: u32 = 2 + 4 + 4 + 2;

/// Frame type bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameType {
    /// Subscriber opens a session on lane 0.
    SessionOpen = 0x01,
    /// Relay accepts a session.
    SessionAccept = 0x02,
    /// Subscriber joins another lane to a session.
    LaneJoin = 0x03,
    /// Relay accepts a lane.
    LaneAccept = 0x04,
    /// A piece of a ledger.
    Chunk = 0x10,
    /// The end record of a ledger.
    LedgerEnd = 0x11,
    /// Subscriber has delivered every ledger up to a sequence.
    Ack = 0x20,
    /// Subscriber asks for chunks again.
    Resend = 0x21,
    /// Relay liveness and newest sequence.
    Heartbeat = 0x22,
    /// A typed error; the sender closes the session after it.
    Error = 0x30,
    /// A request for stellar-core's HTTP ports, on a request stream.
    CoreRequest = 0x40,
    /// The answer to a `CoreRequest`, on the same stream.
    CoreResponse = 0x41,
}

impl FrameType {
    /// The type for a wire byte.
    pub fn from_u8(b: u8) -> Option<FrameType> {
        Some(match b {
            0x01 => FrameType::SessionOpen,
            0x02 => FrameType::SessionAccept,
            0x03 => FrameType::LaneJoin,
            0x04 => FrameType::LaneAccept,
            0x10 => FrameType::Chunk,
            0x11 => FrameType::LedgerEnd,
            0x20 => FrameType::Ack,
            0x21 => FrameType::Resend,
            0x22 => FrameType::Heartbeat,
            0x30 => FrameType::Error,
            0x40 => FrameType::CoreRequest,
            0x41 => FrameType::CoreResponse,
            _ => return None,
        })
    }

    /// The frame's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            FrameType::SessionOpen => "session-open",
            FrameType::SessionAccept => "session-accept",
            FrameType::LaneJoin => "lane-join",
            FrameType::LaneAccept => "lane-accept",
            FrameType::Chunk => "chunk",
            FrameType::LedgerEnd => "ledger-end",
            FrameType::Ack => "ack",
            FrameType::Resend => "resend",
            FrameType::Heartbeat => "heartbeat",
            FrameType::Error => "error",
            FrameType::CoreRequest => "core-request",
            FrameType::CoreResponse => "core-response",
        }
    }

    /// `Some(n)` when the body must be exactly `n` bytes.
    fn fixed_len(self) -> Option<u32> {
        match self {
            FrameType::SessionOpen => Some(SESSION_OPEN_LEN),
            FrameType::SessionAccept => Some(SESSION_ACCEPT_LEN),
            FrameType::LaneJoin => Some(LANE_JOIN_LEN),
            FrameType::LaneAccept => Some(LANE_ACCEPT_LEN),
            FrameType::LedgerEnd => Some(LEDGER_END_LEN as u32),
            FrameType::Ack => Some(ACK_LEN),
            FrameType::Heartbeat => Some(HEARTBEAT_LEN),
            FrameType::Chunk
            | FrameType::Resend
            | FrameType::Error
            | FrameType::CoreRequest
            | FrameType::CoreResponse => None,
        }
    }
}

/// Where a subscription starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The newest ledger the relay holds, or the next one it reads if it holds none.
    Tip,
    /// This sequence: replayed from the retention ring if held, awaited if in the future.
    Seq(u32),
}

/// Opens a session (first frame on lane 0's control stream).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionOpen {
    /// Protocol version the subscriber speaks.
    pub version: u16,
    /// Requested start.
    pub start: Start,
    /// Lanes the subscriber will open, 1..=64, counting lane 0.
    pub lanes: u8,
    /// Accepted codecs, a bit per [`Codec`] ([`Codec::bit`]); `None` is always accepted.
    pub codecs: u8,
    /// Ledgers the subscriber can reassemble at once (its `Limits::max_ledgers_in_flight`).
    pub window: u16,
}

/// Accepts a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionAccept {
    /// Protocol version the relay speaks.
    pub version: u16,
    /// Session id, quoted by `LaneJoin`.
    pub session_id: u64,
    /// Secret token, quoted by `LaneJoin`.
    pub token: [u8; TOKEN_LEN],
    /// Lanes granted (at most those asked for).
    pub lanes: u8,
    /// First ledger the relay will send (never 0: on a relay that holds nothing yet, the accept
    /// waits until the first ledger's header has been read).
    pub first_seq: u32,
    /// Oldest ledger in the relay's retention ring (0: empty).
    pub oldest: u32,
    /// Newest ledger the relay holds (0: none).
    pub newest: u32,
    /// Raw bytes per chunk the relay cuts.
    pub chunk_size: u32,
    /// Ledgers the relay keeps in flight to this subscriber.
    pub window: u16,
    /// Heartbeat interval in milliseconds.
    pub heartbeat_ms: u32,
    /// Largest raw chunk the relay sends.
    pub max_chunk_raw: u32,
    /// Largest ledger the relay sends.
    pub max_ledger_raw: u64,
}

/// Joins lane `lane` to an open session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneJoin {
    /// Protocol version the subscriber speaks.
    pub version: u16,
    /// Session id from `SessionAccept`.
    pub session_id: u64,
    /// Token from `SessionAccept`.
    pub token: [u8; TOKEN_LEN],
    /// Lane number, 1..lanes.
    pub lane: u8,
}

/// The fixed fields of a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    /// Ledger sequence.
    pub seq: u32,
    /// Chunk index within the ledger, from 0.
    pub index: u32,
    /// Offset of this chunk's raw bytes in the ledger.
    pub raw_offset: u64,
    /// Raw (decompressed) length.
    pub raw_len: u32,
    /// Payload encoding.
    pub codec: Codec,
}

impl ChunkHeader {
    /// The frame header and fixed chunk fields for a payload of `payload_len` bytes, so a sender
    /// can write them followed by the shared payload without copying it.
    pub fn frame_prefix(&self, payload_len: usize) -> [u8; FRAME_HEADER_LEN + CHUNK_FIXED_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN + CHUNK_FIXED_LEN];
        let mut w = &mut b[..];
        w.put_u8(FrameType::Chunk as u8);
        w.put_u32((CHUNK_FIXED_LEN + payload_len) as u32);
        w.put_u32(self.seq);
        w.put_u32(self.index);
        w.put_u64(self.raw_offset);
        w.put_u32(self.raw_len);
        w.put_u8(self.codec as u8);
        b
    }
}

/// A piece of a ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Fixed fields.
    pub header: ChunkHeader,
    /// Encoded bytes (`header.codec`), shared, never longer than `header.raw_len`.
    pub payload: Bytes,
}

/// The end record of a ledger: sent after its last chunk. (`Default` is all zeros, sequence 0
/// being "none": a base for tests and fixtures to set the fields they need.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LedgerEnd {
    /// Ledger sequence.
    pub seq: u32,
    /// Number of chunks.
    pub chunk_count: u32,
    /// Total raw length.
    pub raw_len: u64,
    /// [`crate::checksum`] of the raw bytes.
    pub checksum: u64,
    /// The ledger header hash (`LedgerHeaderHistoryEntry.hash`).
    pub header_hash: [u8; 32],
    /// The header's `previousLedgerHash`.
    pub previous_hash: [u8; 32],
    /// Relay wall clock (ns since the Unix epoch) when it read the ledger's first byte.
    pub first_byte_ns: u64,
    /// Relay wall clock (ns since the Unix epoch) when it read the ledger's last byte.
    pub last_byte_ns: u64,
}

impl LedgerEnd {
    /// Appends the body (the [`LEDGER_END_LEN`] bytes after the frame header). The one layout of
    /// an end record: the frame and the relay's ring records both use it.
    pub fn put_body(&self, out: &mut Vec<u8>) {
        out.put_u32(self.seq);
        out.put_u32(self.chunk_count);
        out.put_u64(self.raw_len);
        out.put_u64(self.checksum);
        out.put_slice(&self.header_hash);
        out.put_slice(&self.previous_hash);
        out.put_u64(self.first_byte_ns);
        out.put_u64(self.last_byte_ns);
    }

    /// Reads a body written by [`LedgerEnd::put_body`]. Every value of every field is valid, so
    /// this cannot fail once the length is right.
    pub fn from_body(body: &[u8; LEDGER_END_LEN]) -> LedgerEnd {
        let mut b = &body[..];
        LedgerEnd {
            seq: b.get_u32(),
            chunk_count: b.get_u32(),
            raw_len: b.get_u64(),
            checksum: b.get_u64(),
            header_hash: array(&mut b),
            previous_hash: array(&mut b),
            first_byte_ns: b.get_u64(),
            last_byte_ns: b.get_u64(),
        }
    }
}

/// Asks the relay to send chunks again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resend {
    /// Ledger sequence.
    pub seq: u32,
    /// Send the whole ledger again, including its end record (used when the chunk count is
    /// not known yet); `indices` is then empty.
    pub whole: bool,
    /// Chunk indices to send again.
    pub indices: Vec<u32>,
}

/// Relay liveness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// Newest ledger the relay holds (0: none).
    pub newest: u32,
    /// Oldest ledger in the ring (0: empty).
    pub oldest: u32,
    /// Relay wall clock, ns since the Unix epoch.
    pub time_ns: u64,
}

/// Why a session ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum ErrorCode {
    /// The requested start is older than the oldest ledger held.
    BelowRetention = 1,
    /// The client certificate is not authorized (unknown, not allowed, wrong identity for the
    /// session).
    Unauthorized = 2,
    /// The client certificate has been revoked.
    Revoked = 3,
    /// The peer broke the protocol.
    ProtocolViolation = 4,
    /// The relay is at a configured limit (sessions, lanes, connections).
    Overloaded = 5,
    /// The relay is shutting down.
    ShuttingDown = 6,
    /// The relay failed internally.
    Internal = 7,
    /// The relay's source was cut off in the middle of a ledger whose first chunks this session
    /// already received (stellar-core died mid-ledger). The subscriber resumes from its last
    /// delivered ledger, so nothing of the cut ledger is ever assembled.
    SourceReset = 8,
}

impl ErrorCode {
    /// The code for a wire value.
    pub fn from_u16(v: u16) -> Option<ErrorCode> {
        Some(match v {
            1 => ErrorCode::BelowRetention,
            2 => ErrorCode::Unauthorized,
            3 => ErrorCode::Revoked,
            4 => ErrorCode::ProtocolViolation,
            5 => ErrorCode::Overloaded,
            6 => ErrorCode::ShuttingDown,
            7 => ErrorCode::Internal,
            8 => ErrorCode::SourceReset,
            _ => return None,
        })
    }

    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::BelowRetention => "below retention",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Revoked => "revoked",
            ErrorCode::ProtocolViolation => "protocol violation",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::ShuttingDown => "shutting down",
            ErrorCode::Internal => "internal error",
            ErrorCode::SourceReset => "source reset mid-ledger",
        }
    }

    /// The QUIC application close code carrying this error (`0x100 + code`), so a peer that
    /// misses the `Error` frame still learns why.
    pub fn close_code(self) -> u32 {
        0x100 + self as u32
    }

    /// The error for a QUIC application close code.
    pub fn from_close_code(code: u64) -> Option<ErrorCode> {
        code.checked_sub(0x100)
            .and_then(|v| u16::try_from(v).ok())
            .and_then(ErrorCode::from_u16)
    }
}

/// A typed error sent before closing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorFrame {
    /// What went wrong.
    pub code: ErrorCode,
    /// Oldest ledger held (meaningful for `BelowRetention`; else 0).
    pub oldest: u32,
    /// Newest ledger held (meaningful for `BelowRetention`; else 0).
    pub newest: u32,
    /// Human-readable detail, UTF-8, at most `Limits::max_message_len` bytes.
    pub message: String,
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// See [`SessionOpen`].
    SessionOpen(SessionOpen),
    /// See [`SessionAccept`].
    SessionAccept(SessionAccept),
    /// See [`LaneJoin`].
    LaneJoin(LaneJoin),
    /// Accepts lane `n`.
    LaneAccept(u8),
    /// See [`Chunk`].
    Chunk(Chunk),
    /// See [`LedgerEnd`].
    LedgerEnd(LedgerEnd),
    /// Every ledger up to and including this sequence has been delivered.
    Ack(u32),
    /// See [`Resend`].
    Resend(Resend),
    /// See [`Heartbeat`].
    Heartbeat(Heartbeat),
    /// See [`ErrorFrame`].
    Error(ErrorFrame),
    /// See [`CoreRequest`].
    CoreRequest(CoreRequest),
    /// See [`CoreResponse`].
    CoreResponse(CoreResponse),
}

impl Frame {
    /// The frame's type.
    pub fn frame_type(&self) -> FrameType {
        match self {
            Frame::SessionOpen(_) => FrameType::SessionOpen,
            Frame::SessionAccept(_) => FrameType::SessionAccept,
            Frame::LaneJoin(_) => FrameType::LaneJoin,
            Frame::LaneAccept(_) => FrameType::LaneAccept,
            Frame::Chunk(_) => FrameType::Chunk,
            Frame::LedgerEnd(_) => FrameType::LedgerEnd,
            Frame::Ack(_) => FrameType::Ack,
            Frame::Resend(_) => FrameType::Resend,
            Frame::Heartbeat(_) => FrameType::Heartbeat,
            Frame::Error(_) => FrameType::Error,
            Frame::CoreRequest(_) => FrameType::CoreRequest,
            Frame::CoreResponse(_) => FrameType::CoreResponse,
        }
    }

    /// Appends the encoded frame to `out`.
    ///
    /// Encoding trusts its input only as far as lengths go: an error message longer than
    /// `u16::MAX` is cut at a character boundary, and resend lists are written as given.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.put_u8(self.frame_type() as u8);
        out.put_u32(0); // patched below
        match self {
            Frame::SessionOpen(f) => {
                out.put_u16(f.version);
                match f.start {
                    Start::Tip => {
                        out.put_u8(0);
                        out.put_u32(0);
                    }
                    Start::Seq(s) => {
                        out.put_u8(1);
                        out.put_u32(s);
                    }
                }
                out.put_u8(f.lanes);
                out.put_u8(f.codecs);
                out.put_u16(f.window);
            }
            Frame::SessionAccept(f) => {
                out.put_u16(f.version);
                out.put_u64(f.session_id);
                out.put_slice(&f.token);
                out.put_u8(f.lanes);
                out.put_u32(f.first_seq);
                out.put_u32(f.oldest);
                out.put_u32(f.newest);
                out.put_u32(f.chunk_size);
                out.put_u16(f.window);
                out.put_u32(f.heartbeat_ms);
                out.put_u32(f.max_chunk_raw);
                out.put_u64(f.max_ledger_raw);
            }
            Frame::LaneJoin(f) => {
                out.put_u16(f.version);
                out.put_u64(f.session_id);
                out.put_slice(&f.token);
                out.put_u8(f.lane);
            }
            Frame::LaneAccept(lane) => out.put_u8(*lane),
            Frame::Chunk(c) => {
                out.truncate(start);
                out.extend_from_slice(&c.header.frame_prefix(c.payload.len()));
                out.extend_from_slice(&c.payload);
                return;
            }
            Frame::LedgerEnd(e) => e.put_body(out),
            Frame::Ack(seq) => out.put_u32(*seq),
            Frame::Resend(r) => {
                out.put_u32(r.seq);
                out.put_u8(u8::from(r.whole));
                out.put_u32(r.indices.len() as u32);
                for i in &r.indices {
                    out.put_u32(*i);
                }
            }
            Frame::Heartbeat(h) => {
                out.put_u32(h.newest);
                out.put_u32(h.oldest);
                out.put_u64(h.time_ns);
            }
            Frame::Error(e) => {
                let msg = truncate_utf8(&e.message, u16::MAX as usize);
                out.put_u16(e.code as u16);
                out.put_u32(e.oldest);
                out.put_u32(e.newest);
                out.put_u16(msg.len() as u16);
                out.put_slice(msg.as_bytes());
            }
            Frame::CoreRequest(r) => core_http::put_request(r, out),
            Frame::CoreResponse(r) => core_http::put_response(r, out),
        }
        let body_len = (out.len() - start - FRAME_HEADER_LEN) as u32;
        out[start + 1..start + FRAME_HEADER_LEN].copy_from_slice(&body_len.to_be_bytes());
    }

    /// The encoded frame as a new buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }
}

impl Limits {
    /// Largest body of a `Chunk` frame: its fixed fields plus a payload no longer than
    /// `max_chunk_raw` (a chunk that does not shrink is sent raw, so a payload never exceeds its
    /// raw length).
    pub fn max_chunk_body(&self) -> u32 {
        self.max_chunk_raw.saturating_add(CHUNK_FIXED_LEN as u32)
    }

    /// Largest whole frame (header and body) on a control or data stream. A request stream's
    /// frames are bounded apart: [`Limits::max_core_frame_len`].
    pub fn max_frame_len(&self) -> usize {
        FRAME_HEADER_LEN + self.max_chunk_body().max(self.max_control_body) as usize
    }

    /// Largest whole `CoreRequest` or `CoreResponse` frame, read whole from a request stream.
    pub fn max_core_frame_len(&self) -> usize {
        FRAME_HEADER_LEN + self.max_core_request.max(self.max_core_response) as usize
    }
}

/// Checks a frame header against `limits`: the type is known and the body length is exactly the
/// fixed size or within the limit for its type. Returns the type and body length.
pub fn check_header(
    header: &[u8; FRAME_HEADER_LEN],
    limits: &Limits,
) -> Result<(FrameType, u32), FrameError> {
    let ty = FrameType::from_u8(header[0]).ok_or(FrameError::UnknownType { ty: header[0] })?;
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    if let Some(expected) = ty.fixed_len() {
        if len != expected {
            return Err(FrameError::BadLength {
                frame: ty.name(),
                len,
                expected,
            });
        }
        return Ok((ty, len));
    }
    let (min, max) = match ty {
        FrameType::Chunk => (CHUNK_FIXED_LEN as u32, limits.max_chunk_body()),
        FrameType::Resend => (RESEND_FIXED_LEN, limits.max_control_body),
        FrameType::CoreRequest => (
            core_http::CORE_REQUEST_FIXED_LEN as u32,
            limits.max_core_request,
        ),
        FrameType::CoreResponse => (
            core_http::CORE_RESPONSE_FIXED_LEN as u32,
            limits.max_core_response,
        ),
        _ => (ERROR_FIXED_LEN, limits.max_control_body),
    };
    if len > max {
        return Err(FrameError::TooLong {
            frame: ty.name(),
            len,
            max,
        });
    }
    if len < min {
        return Err(FrameError::Malformed {
            frame: ty.name(),
            what: "body shorter than its fixed fields",
        });
    }
    Ok((ty, len))
}

/// The first bytes of a data stream that [`data_head`] needs to tell what its frame will cost:
/// the frame header and, for a chunk, its fixed fields.
pub const DATA_HEAD_LEN: usize = FRAME_HEADER_LEN + CHUNK_FIXED_LEN;

/// What a receiver will hold for the frame a data stream carries, known from its first bytes
/// (see [`Limits::max_unassembled_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHead {
    /// The frame's type, as its header says (a data stream carries a `Chunk` or a
    /// `LedgerEnd`; the receiver refuses any other once it is decoded).
    pub frame_type: FrameType,
    /// The whole frame's length, header included: the bytes to read.
    pub frame_len: usize,
    /// The most the receiver holds for it at once: the frame, and for a compressed chunk also
    /// the raw length it decompresses to (both are held while it decompresses).
    pub held: u64,
}

/// The [`DataHead`] of the frame that `head`, the first bytes of a data stream, starts:
/// `Ok(None)` while `head` is too short to tell (at most [`DATA_HEAD_LEN`] bytes are needed).
/// The frame header is checked against `limits` as [`check_header`] does, so `frame_len` is at
/// most [`Limits::max_frame_len`] and `held` at most that plus [`Limits::max_chunk_raw`].
pub fn data_head(head: &[u8], limits: &Limits) -> Result<Option<DataHead>, FrameError> {
    let Some(header) = head.first_chunk::<FRAME_HEADER_LEN>() else {
        return Ok(None);
    };
    let (frame_type, len) = check_header(header, limits)?;
    let frame_len = FRAME_HEADER_LEN + len as usize;
    // A request stream's frames may be longer (`max_core_frame_len`); on a data stream no frame
    // is, whatever its type says.
    let max = limits.max_frame_len();
    if frame_len > max {
        return Err(FrameError::TooLong {
            frame: frame_type.name(),
            len,
            max: (max - FRAME_HEADER_LEN) as u32,
        });
    }
    let mut held = frame_len as u64;
    if frame_type == FrameType::Chunk {
        let Some(fixed) = head.get(FRAME_HEADER_LEN..DATA_HEAD_LEN) else {
            return Ok(None);
        };
        // Fixed fields: seq 4, index 4, raw offset 8, raw length 4, codec 1.
        let raw_len = u32::from_be_bytes([fixed[16], fixed[17], fixed[18], fixed[19]]);
        let compressed = Codec::from_u8(fixed[20]).is_some_and(|c| c != Codec::None);
        // A raw length beyond the limit is refused before anything is decompressed.
        if compressed && raw_len <= limits.max_chunk_raw {
            held += u64::from(raw_len);
        }
    }
    Ok(Some(DataHead {
        frame_type,
        frame_len,
        held,
    }))
}

/// Decodes the first frame in `buf`, copying any chunk payload. Returns `Ok(None)` when `buf`
/// holds only part of a frame (after checking the header, if present), and the number of bytes
/// consumed otherwise.
pub fn decode(buf: &[u8], limits: &Limits) -> Result<Option<(Frame, usize)>, FrameError> {
    let Some(header) = buf.first_chunk::<FRAME_HEADER_LEN>() else {
        return Ok(None);
    };
    let (ty, len) = check_header(header, limits)?;
    let total = FRAME_HEADER_LEN + len as usize;
    if buf.len() < total {
        return Ok(None);
    }
    let body = Bytes::copy_from_slice(&buf[FRAME_HEADER_LEN..total]);
    Ok(Some((parse_body(ty, body, limits)?, total)))
}

/// Decodes `bytes` as exactly one frame, sharing a chunk's payload with `bytes` (no copy). This
/// suits a QUIC stream that carries one frame and was read to its end.
pub fn decode_exact(mut bytes: Bytes, limits: &Limits) -> Result<Frame, FrameError> {
    let Some(header) = bytes.first_chunk::<FRAME_HEADER_LEN>() else {
        return Err(FrameError::Truncated {
            have: bytes.len(),
            need: FRAME_HEADER_LEN,
        });
    };
    let (ty, len) = check_header(header, limits)?;
    let total = FRAME_HEADER_LEN + len as usize;
    if bytes.len() < total {
        return Err(FrameError::Truncated {
            have: bytes.len(),
            need: total,
        });
    }
    if bytes.len() > total {
        return Err(FrameError::TrailingBytes {
            frame: ty.name(),
            extra: bytes.len() - total,
        });
    }
    bytes.advance(FRAME_HEADER_LEN);
    parse_body(ty, bytes, limits)
}

/// An incremental decoder for a stream of frames (a control stream). Feed it bytes as they
/// arrive; it checks each header as soon as its 5 bytes are present, so an oversize or unknown
/// frame is refused before its body is buffered.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: BytesMut,
    limits: Limits,
    /// Checked header of the frame being buffered.
    pending: Option<(FrameType, u32)>,
}

impl FrameDecoder {
    /// A decoder bounded by `limits`.
    pub fn new(limits: Limits) -> FrameDecoder {
        FrameDecoder {
            buf: BytesMut::new(),
            limits,
            pending: None,
        }
    }

    /// Appends received bytes, checking the next frame header if it is now complete.
    ///
    /// Callers read from the network in bounded pieces and call [`FrameDecoder::poll`] until it
    /// returns `Ok(None)` after each feed, so at most one frame plus one piece is ever buffered.
    pub fn feed(&mut self, data: &[u8]) -> Result<(), FrameError> {
        self.buf.extend_from_slice(data);
        self.check_pending().map(|_| ())
    }

    fn check_pending(&mut self) -> Result<Option<(FrameType, u32)>, FrameError> {
        if self.pending.is_none() {
            if let Some(h) = self.buf.first_chunk::<FRAME_HEADER_LEN>() {
                let (ty, len) = check_header(h, &self.limits)?;
                // A control stream holds no frame larger than a chunk: a core response's own
                // bound (tens of MiB) applies on a request stream only, read whole there.
                let max = (self.limits.max_frame_len() - FRAME_HEADER_LEN) as u32;
                if len > max {
                    return Err(FrameError::TooLong {
                        frame: ty.name(),
                        len,
                        max,
                    });
                }
                self.pending = Some((ty, len));
            }
        }
        Ok(self.pending)
    }

    /// Takes the next complete frame, if one is buffered.
    pub fn poll(&mut self) -> Result<Option<Frame>, FrameError> {
        let Some((ty, len)) = self.check_pending()? else {
            return Ok(None);
        };
        let total = FRAME_HEADER_LEN + len as usize;
        if self.buf.len() < total {
            return Ok(None);
        }
        let mut frame = self.buf.split_to(total).freeze();
        frame.advance(FRAME_HEADER_LEN);
        self.pending = None;
        parse_body(ty, frame, &self.limits).map(Some)
    }

    /// Bytes buffered and not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Checks that the stream ended at a frame boundary.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let need = match self.pending {
            Some((_, len)) => FRAME_HEADER_LEN + len as usize,
            None => FRAME_HEADER_LEN,
        };
        Err(FrameError::Truncated {
            have: self.buf.len(),
            need,
        })
    }
}

fn array<const N: usize>(b: &mut impl Buf) -> [u8; N] {
    let mut a = [0u8; N];
    b.copy_to_slice(&mut a);
    a
}

/// Parses a body whose length `check_header` has already validated.
///
/// The `get_*` calls of the parsers cannot run past the end of `b`: fixed-size bodies were
/// checked to be exactly their size, variable ones to hold at least their fixed fields, and
/// variable parts are compared with the remaining length before they are read.
fn parse_body(ty: FrameType, mut b: Bytes, limits: &Limits) -> Result<Frame, FrameError> {
    Ok(match ty {
        FrameType::SessionOpen => Frame::SessionOpen(parse_session_open(&mut b)?),
        FrameType::SessionAccept => Frame::SessionAccept(parse_session_accept(&mut b)?),
        FrameType::LaneJoin => Frame::LaneJoin(parse_lane_join(&mut b)?),
        FrameType::LaneAccept => Frame::LaneAccept(b.get_u8()),
        FrameType::Chunk => Frame::Chunk(parse_chunk(b, limits)?),
        FrameType::LedgerEnd => Frame::LedgerEnd(LedgerEnd::from_body(&array(&mut b))),
        FrameType::Ack => Frame::Ack(b.get_u32()),
        FrameType::Resend => Frame::Resend(parse_resend(&mut b, limits)?),
        FrameType::Heartbeat => Frame::Heartbeat(Heartbeat {
            newest: b.get_u32(),
            oldest: b.get_u32(),
            time_ns: b.get_u64(),
        }),
        FrameType::Error => Frame::Error(parse_error(&mut b, limits)?),
        FrameType::CoreRequest => Frame::CoreRequest(core_http::parse_request(b)?),
        FrameType::CoreResponse => Frame::CoreResponse(core_http::parse_response(b)?),
    })
}

/// A frame of type `ty` whose field holds a value the protocol does not allow.
fn malformed(ty: FrameType, what: &'static str) -> FrameError {
    FrameError::Malformed {
        frame: ty.name(),
        what,
    }
}

fn parse_session_open(b: &mut Bytes) -> Result<SessionOpen, FrameError> {
    let bad = |what| malformed(FrameType::SessionOpen, what);
    let version = b.get_u16();
    let kind = b.get_u8();
    let seq = b.get_u32();
    let start = match kind {
        0 if seq == 0 => Start::Tip,
        0 => return Err(bad("tip start with a sequence")),
        1 if seq == 0 => return Err(bad("start sequence 0")),
        1 => Start::Seq(seq),
        _ => return Err(bad("unknown start kind")),
    };
    let lanes = b.get_u8();
    if lanes == 0 || lanes > 64 {
        return Err(bad("lane count outside 1..=64"));
    }
    let codecs = b.get_u8();
    if codecs & !0b111 != 0 {
        return Err(bad("unknown codec bits"));
    }
    let window = b.get_u16();
    if window == 0 {
        return Err(bad("window of 0 ledgers"));
    }
    Ok(SessionOpen {
        version,
        start,
        lanes,
        codecs,
        window,
    })
}

fn parse_session_accept(b: &mut Bytes) -> Result<SessionAccept, FrameError> {
    let bad = |what| malformed(FrameType::SessionAccept, what);
    let f = SessionAccept {
        version: b.get_u16(),
        session_id: b.get_u64(),
        token: array(b),
        lanes: b.get_u8(),
        first_seq: b.get_u32(),
        oldest: b.get_u32(),
        newest: b.get_u32(),
        chunk_size: b.get_u32(),
        window: b.get_u16(),
        heartbeat_ms: b.get_u32(),
        max_chunk_raw: b.get_u32(),
        max_ledger_raw: b.get_u64(),
    };
    if f.lanes == 0 || f.lanes > 64 {
        return Err(bad("lane count outside 1..=64"));
    }
    if f.chunk_size == 0 || f.chunk_size > f.max_chunk_raw {
        return Err(bad("chunk size outside 1..=max_chunk_raw"));
    }
    if f.window == 0 {
        return Err(bad("window of 0 ledgers"));
    }
    if f.first_seq == 0 {
        return Err(bad("first sequence 0"));
    }
    Ok(f)
}

fn parse_lane_join(b: &mut Bytes) -> Result<LaneJoin, FrameError> {
    let f = LaneJoin {
        version: b.get_u16(),
        session_id: b.get_u64(),
        token: array(b),
        lane: b.get_u8(),
    };
    if f.lane == 0 || f.lane >= 64 {
        return Err(malformed(FrameType::LaneJoin, "lane number outside 1..64"));
    }
    Ok(f)
}

/// A chunk: its header, then the rest of the body as its payload, which must fit its raw
/// length and codec.
fn parse_chunk(mut b: Bytes, limits: &Limits) -> Result<Chunk, FrameError> {
    let seq = b.get_u32();
    let index = b.get_u32();
    let raw_offset = b.get_u64();
    let raw_len = b.get_u32();
    let codec_byte = b.get_u8();
    let codec = Codec::from_u8(codec_byte).ok_or(FrameError::UnknownCodec { codec: codec_byte })?;
    if raw_len > limits.max_chunk_raw {
        return Err(FrameError::ChunkTooLong {
            raw_len,
            max: limits.max_chunk_raw,
        });
    }
    let payload_len = b.len() as u32;
    let fits = match codec {
        Codec::None => payload_len == raw_len,
        _ => payload_len < raw_len,
    };
    if !fits {
        return Err(FrameError::PayloadLength {
            codec,
            raw_len,
            payload_len,
        });
    }
    Ok(Chunk {
        header: ChunkHeader {
            seq,
            index,
            raw_offset,
            raw_len,
            codec,
        },
        payload: b,
    })
}

fn parse_resend(b: &mut Bytes, limits: &Limits) -> Result<Resend, FrameError> {
    let bad = |what| malformed(FrameType::Resend, what);
    let seq = b.get_u32();
    let whole = match b.get_u8() {
        0 => false,
        1 => true,
        _ => return Err(bad("unknown flags")),
    };
    let count = b.get_u32();
    if count > limits.max_chunks_per_ledger {
        return Err(bad("more indices than chunks per ledger"));
    }
    if b.len() as u64 != u64::from(count) * 4 {
        return Err(bad("index count does not match body length"));
    }
    if whole && count != 0 {
        return Err(bad("whole-ledger resend with indices"));
    }
    let indices = (0..count).map(|_| b.get_u32()).collect();
    Ok(Resend {
        seq,
        whole,
        indices,
    })
}

fn parse_error(b: &mut Bytes, limits: &Limits) -> Result<ErrorFrame, FrameError> {
    let bad = |what| malformed(FrameType::Error, what);
    let code_raw = b.get_u16();
    let code = ErrorCode::from_u16(code_raw).ok_or(bad("unknown error code"))?;
    let oldest = b.get_u32();
    let newest = b.get_u32();
    let msg_len = b.get_u16();
    if msg_len > limits.max_message_len {
        return Err(bad("message longer than the limit"));
    }
    if b.len() != msg_len as usize {
        return Err(bad("message length does not match body length"));
    }
    let message = std::str::from_utf8(b)
        .map_err(|_| bad("message is not UTF-8"))?
        .to_owned();
    b.advance(msg_len as usize);
    Ok(ErrorFrame {
        code,
        oldest,
        newest,
        message,
    })
}

#[cfg(test)]
mod tests;
