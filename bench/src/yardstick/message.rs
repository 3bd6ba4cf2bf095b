//! The yardstick's messages, and a bounded reader of the server's (another host's bytes):
//!
//! ```text
//! client -> server  0x01 Clock  | t0 u64                        (client clock, ns)
//!                   0x02 Stream | from u32 (0: the tip) | count u32
//! server -> client  0x81 Clock  | t0 u64 | t1 u64 | t2 u64      (server clock at receipt, at send)
//!                   0x82 Ledger | seq u32 | first_byte_ns u64 | last_byte_ns u64 | record
//!                   0x83 Error  | len u16 | UTF-8 message
//! ```
//!
//! `record` is the ledger in core's record marking. Integers are big-endian; times are ns since
//! the Unix epoch by the sender's clock.

use std::io::Read;

use ledger_relay_wire::record::{record_header, RecordError, LAST_FRAGMENT};

/// The yardstick's ALPN.
pub const ALPN: &[u8] = b"ledger-bench-yardstick/1";

/// The longest error message sent or accepted, bytes.
pub const MAX_ERROR_LEN: usize = 1024;

/// Bytes of a request.
pub const REQUEST_LEN: usize = 9;

const CLOCK: u8 = 0x01;
const STREAM: u8 = 0x02;
const CLOCK_REPLY: u8 = 0x81;
const LEDGER: u8 = 0x82;
const ERROR: u8 = 0x83;

/// Bytes of a `Ledger` message before its record's body: type, sequence, two times, mark.
pub const LEDGER_HEAD_LEN: usize = 25;

/// Why a message was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// A message type this side does not expect.
    #[error("unknown message type {0:#04x}")]
    UnknownType(u8),
    /// A ledger's record mark is not core's (no last-fragment bit, empty, or too long).
    #[error("ledger {seq}: {source}")]
    Record {
        /// The ledger's sequence.
        seq: u32,
        /// What is wrong with its mark.
        #[source]
        source: RecordError,
    },
    /// An error message longer than [`MAX_ERROR_LEN`].
    #[error("error message of {len} bytes exceeds {MAX_ERROR_LEN}")]
    ErrorTooLong {
        /// Its declared length.
        len: usize,
    },
    /// The connection failed or ended inside a message.
    #[error("reading: {0}")]
    Io(std::io::ErrorKind),
}

impl From<std::io::Error> for MessageError {
    fn from(e: std::io::Error) -> MessageError {
        MessageError::Io(e.kind())
    }
}

/// What a client asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// A clock probe, sent at `t0_ns` by the client's clock.
    Clock {
        /// Client clock when sent.
        t0_ns: u64,
    },
    /// `count` ledgers from `from` (0: the newest the server holds).
    Stream {
        /// The first ledger.
        from: u32,
        /// How many.
        count: u32,
    },
}

impl Request {
    /// The message.
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        match *self {
            Request::Clock { t0_ns } => {
                b[0] = CLOCK;
                b[1..].copy_from_slice(&t0_ns.to_be_bytes());
            }
            Request::Stream { from, count } => {
                b[0] = STREAM;
                b[1..5].copy_from_slice(&from.to_be_bytes());
                b[5..].copy_from_slice(&count.to_be_bytes());
            }
        }
        b
    }

    /// Decodes one request (every request is [`REQUEST_LEN`] bytes).
    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<Request, MessageError> {
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        match b[0] {
            CLOCK => Ok(Request::Clock {
                t0_ns: u64::from_be_bytes(b[1..].try_into().unwrap_or_default()),
            }),
            STREAM => Ok(Request::Stream {
                from: u32_at(1),
                count: u32_at(5),
            }),
            other => Err(MessageError::UnknownType(other)),
        }
    }
}

/// The answer to a clock probe.
pub fn clock_reply(t0_ns: u64, t1_ns: u64, t2_ns: u64) -> [u8; 25] {
    let mut b = [0u8; 25];
    b[0] = CLOCK_REPLY;
    for (i, t) in [t0_ns, t1_ns, t2_ns].into_iter().enumerate() {
        b[1 + 8 * i..9 + 8 * i].copy_from_slice(&t.to_be_bytes());
    }
    b
}

/// The head of a `Ledger` message for a body of `len` bytes, record mark included.
pub fn ledger_head(
    seq: u32,
    first_byte_ns: u64,
    last_byte_ns: u64,
    len: usize,
) -> Result<[u8; LEDGER_HEAD_LEN], MessageError> {
    let mark = record_header(len).map_err(|source| MessageError::Record { seq, source })?;
    let mut h = [0u8; LEDGER_HEAD_LEN];
    h[0] = LEDGER;
    h[1..5].copy_from_slice(&seq.to_be_bytes());
    h[5..13].copy_from_slice(&first_byte_ns.to_be_bytes());
    h[13..21].copy_from_slice(&last_byte_ns.to_be_bytes());
    h[21..25].copy_from_slice(&mark);
    Ok(h)
}

/// An `Error` message carrying `msg`, cut to [`MAX_ERROR_LEN`] bytes at a character boundary.
pub fn error_message(msg: &str) -> Vec<u8> {
    let mut end = msg.len().min(MAX_ERROR_LEN);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = vec![ERROR];
    out.extend_from_slice(&(end as u16).to_be_bytes());
    out.extend_from_slice(&msg.as_bytes()[..end]);
    out
}

/// What the server sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The answer to a clock probe.
    Clock(ClockSample),
    /// A whole ledger.
    Ledger {
        /// Its sequence.
        seq: u32,
        /// Server clock when its source began the ledger.
        first_byte_ns: u64,
        /// Server clock when the ledger was whole.
        last_byte_ns: u64,
        /// Its bytes (the record's body).
        body: Vec<u8>,
    },
    /// The server refused or ended the request.
    Error(String),
}

/// The four timestamps of one clock probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSample {
    /// Client clock when the probe was sent.
    pub t0_ns: u64,
    /// Server clock when it read the probe.
    pub t1_ns: u64,
    /// Server clock when it sent the answer.
    pub t2_ns: u64,
    /// Client clock when the answer was read (set by the client, not on the wire).
    pub t3_ns: u64,
}

impl ClockSample {
    /// The round trip less the server's time between reading and answering, ns.
    pub fn rtt_ns(&self) -> i128 {
        let [t0, t1, t2, t3] = [self.t0_ns, self.t1_ns, self.t2_ns, self.t3_ns].map(i128::from);
        (t3 - t0) - (t2 - t1)
    }

    /// The server's clock minus the client's, ns, assuming equal one-way delays (NTP's
    /// estimate); wrong by at most half of [`ClockSample::rtt_ns`].
    pub fn offset_ns(&self) -> i128 {
        let [t0, t1, t2, t3] = [self.t0_ns, self.t1_ns, self.t2_ns, self.t3_ns].map(i128::from);
        ((t1 - t0) + (t2 - t3)) / 2
    }
}

/// The sample with the shortest round trip: the one whose estimate is bounded tightest.
pub fn best_sample(samples: &[ClockSample]) -> Option<ClockSample> {
    samples.iter().copied().min_by_key(ClockSample::rtt_ns)
}

/// Reads the server's next message from `r`; a ledger's length is checked against `max_len`
/// first, and its body grows with the bytes that arrive, never by the declared length alone.
pub fn read_reply(r: &mut impl Read, max_len: u32) -> Result<Reply, MessageError> {
    fn read_n(r: &mut impl Read, n: usize) -> Result<Vec<u8>, MessageError> {
        let mut b = Vec::new();
        r.take(n as u64).read_to_end(&mut b)?;
        if b.len() < n {
            return Err(MessageError::Io(std::io::ErrorKind::UnexpectedEof));
        }
        Ok(b)
    }
    let u64_at = |b: &[u8], i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
    let u32_at = |b: &[u8], i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
    match read_n(r, 1)?[0] {
        CLOCK_REPLY => {
            let b = read_n(r, 24)?;
            Ok(Reply::Clock(ClockSample {
                t0_ns: u64_at(&b, 0),
                t1_ns: u64_at(&b, 8),
                t2_ns: u64_at(&b, 16),
                t3_ns: 0,
            }))
        }
        ERROR => {
            let b = read_n(r, 2)?;
            let len = usize::from(u16::from_be_bytes([b[0], b[1]]));
            if len > MAX_ERROR_LEN {
                return Err(MessageError::ErrorTooLong { len });
            }
            let text = String::from_utf8_lossy(&read_n(r, len)?).into_owned();
            Ok(Reply::Error(text))
        }
        LEDGER => {
            let h = read_n(r, LEDGER_HEAD_LEN - 1)?;
            let (seq, mark) = (u32_at(&h, 0), u32_at(&h, 20));
            let len = mark & !LAST_FRAGMENT;
            let bad = |source| Err(MessageError::Record { seq, source });
            if mark & LAST_FRAGMENT == 0 {
                return bad(RecordError::NotLastFragment { header: mark });
            } else if len == 0 {
                return bad(RecordError::Empty);
            } else if len > max_len {
                return bad(RecordError::TooLong { len, max: max_len });
            }
            Ok(Reply::Ledger {
                seq,
                first_byte_ns: u64_at(&h, 4),
                last_byte_ns: u64_at(&h, 12),
                body: read_n(r, len as usize)?,
            })
        }
        other => Err(MessageError::UnknownType(other)),
    }
}
