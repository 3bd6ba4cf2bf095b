//! The TCP baseline's messages: one TLS-over-TCP flow carrying the relay's ledgers as
//! stellar-core writes them, so a benchmark can put a single flow beside the lanes
//! (`ledger-relay run --tcp-baseline ADDR`, read by `ledger-bench remote --tcp`). Specified in
//! `docs/protocol.md`, section 6.
//!
//! The client asks; the relay answers each `Clock` at once and, to a `Stream`, sends `count`
//! ledgers and closes:
//!
//! ```text
//! client -> relay   0x01 Clock  | t0 u64                       (client clock, ns)
//!                   0x02 Stream | from u32 (0: tip) | count u32
//! relay -> client   0x81 Clock  | t0 u64 | t1 u64 | t2 u64     (relay clock at receipt, at send)
//!                   0x82 Ledger | seq u32 | first_byte_ns u64 | last_byte_ns u64 | record
//!                   0x83 Error  | len u16 | UTF-8 message
//! ```
//!
//! `record` is the ledger in core's record marking (a 4-byte mark with the last-fragment bit,
//! then the body). Integers are big-endian; times are ns since the Unix epoch by the sender's
//! clock. A `Clock` exchange gives the four timestamps of an NTP-style offset estimate
//! ([`ClockSample`]).
//!
//! Decoding is bounded like every other reader here: a ledger body is buffered only as its
//! bytes arrive, after its length was checked against the limit, and an error message is at
//! most [`MAX_ERROR_LEN`] bytes.

use crate::frame::Start;
use crate::record::{record_header, RecordError, LAST_FRAGMENT};

/// The ALPN of the TCP baseline; a QUIC lane's ([`crate::ALPN`]) is refused on it and back.
pub const ALPN: &[u8] = b"ledger-relay-tcp/1";

/// The longest error message a relay sends or a client accepts, bytes.
pub const MAX_ERROR_LEN: usize = 1024;

const CLOCK: u8 = 0x01;
const STREAM: u8 = 0x02;
const CLOCK_REPLY: u8 = 0x81;
const LEDGER: u8 = 0x82;
const ERROR: u8 = 0x83;

/// Bytes of a `Ledger` message before its record's body: type, sequence, two times, mark.
pub const LEDGER_HEAD_LEN: usize = 1 + 4 + 8 + 8 + 4;

/// Why a baseline message was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BaselineError {
    /// A message type this side does not expect.
    #[error("unknown message type {0:#04x}")]
    UnknownType(u8),
    /// A ledger's record mark is not core's (no last-fragment bit, empty, or too long).
    #[error("ledger {seq}: {source}")]
    Record {
        /// The ledger's sequence.
        seq: u32,
        /// What is wrong with its record mark.
        #[source]
        source: RecordError,
    },
    /// An error message longer than [`MAX_ERROR_LEN`].
    #[error("error message of {len} bytes exceeds {MAX_ERROR_LEN}")]
    ErrorTooLong {
        /// Its declared length.
        len: usize,
    },
}

/// What a client asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// A clock probe, sent at `t0_ns` by the client's clock.
    Clock {
        /// Client clock when sent.
        t0_ns: u64,
    },
    /// `count` ledgers from `from`.
    Stream {
        /// The first ledger (the tip: the newest the relay holds, as for a subscription).
        from: Start,
        /// How many.
        count: u32,
    },
}

impl Request {
    /// Appends the message to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Request::Clock { t0_ns } => {
                out.push(CLOCK);
                out.extend_from_slice(&t0_ns.to_be_bytes());
            }
            Request::Stream { from, count } => {
                out.push(STREAM);
                let from = match from {
                    Start::Tip => 0,
                    Start::Seq(s) => s,
                };
                out.extend_from_slice(&from.to_be_bytes());
                out.extend_from_slice(&count.to_be_bytes());
            }
        }
    }

    /// Decodes one request from the front of `buf`: the request and the bytes it took, or
    /// `None` until it is whole.
    pub fn decode(buf: &[u8]) -> Result<Option<(Request, usize)>, BaselineError> {
        let Some(&ty) = buf.first() else {
            return Ok(None);
        };
        match ty {
            CLOCK => Ok(buf.get(1..9).map(|b| {
                let t0_ns = u64::from_be_bytes(b.try_into().unwrap_or_default());
                (Request::Clock { t0_ns }, 9)
            })),
            STREAM => Ok(buf.get(1..9).map(|b| {
                let from = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
                let count = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
                let from = if from == 0 {
                    Start::Tip
                } else {
                    Start::Seq(from)
                };
                (Request::Stream { from, count }, 9)
            })),
            other => Err(BaselineError::UnknownType(other)),
        }
    }
}

/// The relay's answer to a clock probe.
pub fn encode_clock_reply(t0_ns: u64, t1_ns: u64, t2_ns: u64, out: &mut Vec<u8>) {
    out.push(CLOCK_REPLY);
    for t in [t0_ns, t1_ns, t2_ns] {
        out.extend_from_slice(&t.to_be_bytes());
    }
}

/// The head of a `Ledger` message, record mark included, for a body of `len` bytes: the
/// relay writes it, then the body (in as many pieces as it likes).
pub fn ledger_head(
    seq: u32,
    first_byte_ns: u64,
    last_byte_ns: u64,
    len: usize,
) -> Result<[u8; LEDGER_HEAD_LEN], BaselineError> {
    let mark = record_header(len).map_err(|source| BaselineError::Record { seq, source })?;
    let mut h = [0u8; LEDGER_HEAD_LEN];
    h[0] = LEDGER;
    h[1..5].copy_from_slice(&seq.to_be_bytes());
    h[5..13].copy_from_slice(&first_byte_ns.to_be_bytes());
    h[13..21].copy_from_slice(&last_byte_ns.to_be_bytes());
    h[21..25].copy_from_slice(&mark);
    Ok(h)
}

/// An `Error` message carrying `msg` (cut to [`MAX_ERROR_LEN`] bytes at a character boundary).
pub fn encode_error(msg: &str, out: &mut Vec<u8>) {
    let mut end = msg.len().min(MAX_ERROR_LEN);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    out.push(ERROR);
    out.extend_from_slice(&(end as u16).to_be_bytes());
    out.extend_from_slice(&msg.as_bytes()[..end]);
}

/// What the relay sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The answer to a clock probe.
    Clock(ClockSample),
    /// A whole ledger.
    Ledger {
        /// Its sequence.
        seq: u32,
        /// Relay clock when it read the ledger's first byte from its source.
        first_byte_ns: u64,
        /// Relay clock when it read the ledger's last byte.
        last_byte_ns: u64,
        /// The ledger (the record's body).
        body: Vec<u8>,
    },
    /// The relay refused or ended the request.
    Error(String),
}

/// The four timestamps of one clock probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSample {
    /// Client clock when the probe was sent.
    pub t0_ns: u64,
    /// Relay clock when it read the probe.
    pub t1_ns: u64,
    /// Relay clock when it sent the answer.
    pub t2_ns: u64,
    /// Client clock when the answer was read (set by the client, not on the wire).
    pub t3_ns: u64,
}

impl ClockSample {
    /// The round trip less the relay's time between reading and answering, ns.
    pub fn rtt_ns(&self) -> i128 {
        (i128::from(self.t3_ns) - i128::from(self.t0_ns))
            - (i128::from(self.t2_ns) - i128::from(self.t1_ns))
    }

    /// The relay's clock minus the client's, ns, assuming equal one-way delays (NTP's
    /// estimate); wrong by at most half of [`ClockSample::rtt_ns`].
    pub fn offset_ns(&self) -> i128 {
        ((i128::from(self.t1_ns) - i128::from(self.t0_ns))
            + (i128::from(self.t2_ns) - i128::from(self.t3_ns)))
            / 2
    }
}

/// The sample with the shortest round trip: the one whose estimate is bounded tightest (a
/// probe delayed on one way only skews the estimate by half the delay).
pub fn best_sample(samples: &[ClockSample]) -> Option<ClockSample> {
    samples.iter().copied().min_by_key(ClockSample::rtt_ns)
}

/// Where a [`ReplyDecoder`] is.
#[derive(Debug)]
enum State {
    /// Waiting for a message's type and fixed fields.
    Head,
    /// Inside a ledger's body.
    Body {
        seq: u32,
        first_byte_ns: u64,
        last_byte_ns: u64,
        len: usize,
        body: Vec<u8>,
    },
}

/// Decodes the relay's messages from bytes in pieces of any size (sans-IO: the caller reads
/// the socket and feeds it).
#[derive(Debug)]
pub struct ReplyDecoder {
    max_len: u32,
    buf: Vec<u8>,
    state: State,
}

impl ReplyDecoder {
    /// A decoder that refuses ledgers longer than `max_len` bytes.
    pub fn new(max_len: u32) -> ReplyDecoder {
        ReplyDecoder {
            max_len,
            buf: Vec::new(),
            state: State::Head,
        }
    }

    /// Adds bytes read from the connection.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Whether the decoder holds part of a message (a connection that ends now ended early).
    pub fn in_message(&self) -> bool {
        !self.buf.is_empty() || matches!(self.state, State::Body { .. })
    }

    /// The next whole message, `None` until one is; an error stops the decoder for good (the
    /// caller drops the connection).
    pub fn next_reply(&mut self) -> Result<Option<Reply>, BaselineError> {
        loop {
            match &mut self.state {
                State::Head => {
                    let Some(&ty) = self.buf.first() else {
                        return Ok(None);
                    };
                    match ty {
                        CLOCK_REPLY => {
                            let Some(b) = self.buf.get(1..25) else {
                                return Ok(None);
                            };
                            let u = |i: usize| {
                                u64::from_be_bytes(b[i..i + 8].try_into().unwrap_or_default())
                            };
                            let sample = ClockSample {
                                t0_ns: u(0),
                                t1_ns: u(8),
                                t2_ns: u(16),
                                t3_ns: 0,
                            };
                            self.buf.drain(..25);
                            return Ok(Some(Reply::Clock(sample)));
                        }
                        ERROR => {
                            let Some(b) = self.buf.get(1..3) else {
                                return Ok(None);
                            };
                            let len = usize::from(u16::from_be_bytes([b[0], b[1]]));
                            if len > MAX_ERROR_LEN {
                                return Err(BaselineError::ErrorTooLong { len });
                            }
                            let Some(msg) = self.buf.get(3..3 + len) else {
                                return Ok(None);
                            };
                            let msg = String::from_utf8_lossy(msg).into_owned();
                            self.buf.drain(..3 + len);
                            return Ok(Some(Reply::Error(msg)));
                        }
                        LEDGER => {
                            let Some(h) = self.buf.get(..LEDGER_HEAD_LEN) else {
                                return Ok(None);
                            };
                            let seq = u32::from_be_bytes([h[1], h[2], h[3], h[4]]);
                            let first_byte_ns =
                                u64::from_be_bytes(h[5..13].try_into().unwrap_or_default());
                            let last_byte_ns =
                                u64::from_be_bytes(h[13..21].try_into().unwrap_or_default());
                            let mark = u32::from_be_bytes([h[21], h[22], h[23], h[24]]);
                            let bad = |source| Err(BaselineError::Record { seq, source });
                            if mark & LAST_FRAGMENT == 0 {
                                return bad(RecordError::NotLastFragment { header: mark });
                            }
                            let len = mark & !LAST_FRAGMENT;
                            if len == 0 {
                                return bad(RecordError::Empty);
                            }
                            if len > self.max_len {
                                return bad(RecordError::TooLong {
                                    len,
                                    max: self.max_len,
                                });
                            }
                            self.buf.drain(..LEDGER_HEAD_LEN);
                            self.state = State::Body {
                                seq,
                                first_byte_ns,
                                last_byte_ns,
                                len: len as usize,
                                body: Vec::new(),
                            };
                        }
                        other => return Err(BaselineError::UnknownType(other)),
                    }
                }
                State::Body { len, body, .. } => {
                    // Grows with the bytes that arrived, never by the declared length alone.
                    let take = (*len - body.len()).min(self.buf.len());
                    body.extend(self.buf.drain(..take));
                    if body.len() < *len {
                        return Ok(None);
                    }
                    let State::Body {
                        seq,
                        first_byte_ns,
                        last_byte_ns,
                        body,
                        ..
                    } = std::mem::replace(&mut self.state, State::Head)
                    else {
                        // Matched as Body just above.
                        unreachable!("the state is Body")
                    };
                    return Ok(Some(Reply::Ledger {
                        seq,
                        first_byte_ns,
                        last_byte_ns,
                        body,
                    }));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replies() -> Vec<u8> {
        let mut out = Vec::new();
        encode_clock_reply(1, 2, 3, &mut out);
        out.extend_from_slice(&ledger_head(7, 10, 20, 5).unwrap());
        out.extend_from_slice(b"hello");
        encode_error("bye", &mut out);
        out
    }

    #[test]
    fn replies_decode_from_pieces_of_any_size() {
        let bytes = replies();
        for piece in [1, 2, 3, 7, 64] {
            let mut d = ReplyDecoder::new(1 << 20);
            let mut got = Vec::new();
            for p in bytes.chunks(piece) {
                d.feed(p);
                while let Some(r) = d.next_reply().unwrap() {
                    got.push(r);
                }
            }
            assert!(!d.in_message());
            assert_eq!(
                got,
                vec![
                    Reply::Clock(ClockSample {
                        t0_ns: 1,
                        t1_ns: 2,
                        t2_ns: 3,
                        t3_ns: 0
                    }),
                    Reply::Ledger {
                        seq: 7,
                        first_byte_ns: 10,
                        last_byte_ns: 20,
                        body: b"hello".to_vec()
                    },
                    Reply::Error("bye".into()),
                ],
                "pieces of {piece}"
            );
        }
    }

    #[test]
    fn every_prefix_is_incomplete_not_an_error() {
        let bytes = replies();
        for n in 0..bytes.len() {
            let mut d = ReplyDecoder::new(1 << 20);
            d.feed(&bytes[..n]);
            while d.next_reply().unwrap().is_some() {}
            assert_eq!(d.in_message(), n != 0 && n != 25 && n != 55, "prefix {n}");
        }
    }

    #[test]
    fn bad_replies_are_typed_errors() {
        let mut head = ledger_head(9, 0, 0, 100).unwrap();
        let mut d = ReplyDecoder::new(99);
        d.feed(&head);
        assert!(matches!(
            d.next_reply(),
            Err(BaselineError::Record {
                seq: 9,
                source: RecordError::TooLong { len: 100, max: 99 }
            })
        ));
        head[21] &= 0x7f;
        let mut d = ReplyDecoder::new(1 << 20);
        d.feed(&head);
        assert!(matches!(
            d.next_reply(),
            Err(BaselineError::Record {
                source: RecordError::NotLastFragment { .. },
                ..
            })
        ));
        let mut d = ReplyDecoder::new(1 << 20);
        d.feed(&[0x83, 0xff, 0xff]);
        assert!(matches!(
            d.next_reply(),
            Err(BaselineError::ErrorTooLong { len: 65535 })
        ));
        let mut d = ReplyDecoder::new(1 << 20);
        d.feed(&[0x01]);
        assert_eq!(d.next_reply(), Err(BaselineError::UnknownType(0x01)));
        assert!(ledger_head(1, 0, 0, 0).is_err(), "no empty record");
        let mut long = Vec::new();
        encode_error(&"é".repeat(MAX_ERROR_LEN), &mut long);
        let mut d = ReplyDecoder::new(1);
        d.feed(&long);
        match d.next_reply().unwrap() {
            Some(Reply::Error(m)) => assert_eq!(m.len(), MAX_ERROR_LEN),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn requests_round_trip() {
        for r in [
            Request::Clock { t0_ns: u64::MAX },
            Request::Stream {
                from: Start::Tip,
                count: 3,
            },
            Request::Stream {
                from: Start::Seq(12),
                count: u32::MAX,
            },
        ] {
            let mut b = Vec::new();
            r.encode(&mut b);
            assert_eq!(Request::decode(&b).unwrap(), Some((r, b.len())));
            for n in 0..b.len() {
                assert_eq!(Request::decode(&b[..n]).unwrap(), None);
            }
        }
        assert_eq!(
            Request::decode(&[0x82]),
            Err(BaselineError::UnknownType(0x82))
        );
    }

    #[test]
    fn the_offset_is_the_relays_clock_minus_ours() {
        // The relay's clock is 5 s ahead; 2 ms each way; 1 ms between reading and answering.
        let ms = 1_000_000u64;
        let s = ClockSample {
            t0_ns: 1000 * ms,
            t1_ns: 5000 * ms + 1002 * ms,
            t2_ns: 5000 * ms + 1003 * ms,
            t3_ns: 1005 * ms,
        };
        assert_eq!(s.offset_ns(), 5000 * i128::from(ms));
        assert_eq!(s.rtt_ns(), 4 * i128::from(ms));
        // Asymmetric delays: off by half the difference, within half the round trip.
        let skewed = ClockSample {
            t3_ns: 1011 * ms,
            ..s
        };
        assert_eq!(skewed.rtt_ns(), 10 * i128::from(ms));
        assert_eq!(skewed.offset_ns(), 4997 * i128::from(ms));
        assert_eq!(best_sample(&[skewed, s]), Some(s));
        assert_eq!(best_sample(&[]), None);
    }
}
