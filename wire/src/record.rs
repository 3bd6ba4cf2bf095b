//! stellar-core's record marking: the framing of `--metadata-output-stream`.
//!
//! Core writes each `LedgerCloseMeta` as one XDR record with an RFC 5531 (ONC RPC, section 11)
//! record mark in front of it:
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-------------------------------------------------------------+
//! |L|                  body length (31 bits, BE)                  |
//! +-+-------------------------------------------------------------+
//! |                 body: one LedgerCloseMeta ...                 |
//! ```
//!
//! `L` (the high bit, [`LAST_FRAGMENT`]) marks the last fragment of a record. Core always
//! writes a ledger as a single fragment, so a mark without it is rejected rather than
//! reassembled: a multi-fragment stream is not core's, and accepting one would let a peer
//! grow a record without bound fragment by fragment.
//!
//! Three readers share one state machine, [`RecordDecoder`]:
//!
//! - [`RecordDecoder`] is zero-copy and streaming: it hands out the body in the pieces it
//!   arrives in, so the relay can chunk a ledger before the whole ledger is in.
//! - [`RecordReader`] collects whole records from pieces of any size (sans-IO).
//! - [`Records`] is a blocking iterator over a [`std::io::Read`], for files and tools.
//!
//! [`open_stream`] undoes the zstd compression that archived streams carry.
//!
//! Nothing here allocates according to a length read from the input: a body buffer grows
//! only as its bytes arrive, and a length is checked against the limit before anything else.

use std::collections::VecDeque;
use std::io::{self, Read, Write};

/// Default limit on a record body: 256 MiB.
///
/// The largest pubnet ledgers' meta is in the tens of MiB; the limit leaves room for growth
/// while bounding what a broken or hostile writer can make a reader buffer.
pub const DEFAULT_MAX_RECORD_LEN: u32 = 256 << 20;

/// The last-fragment bit of a record mark.
pub const LAST_FRAGMENT: u32 = 0x8000_0000;

/// The largest body length a record mark can express (31 bits).
const MARK_LEN_MASK: u32 = !LAST_FRAGMENT;

/// Bytes in a record mark.
const MARK_LEN: usize = 4;

/// The zstd frame magic number, as it appears on the wire (RFC 8878, section 3.1.1).
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// Bytes a [`Records`] iterator asks its reader for at a time. A Linux pipe holds 64 KiB, and
/// core writes a ledger in one go, so larger reads rarely return more.
const READ_BUF_LEN: usize = 64 << 10;

/// Why a record stream was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// A record mark lacks the last-fragment bit; core never splits a record into fragments.
    #[error("record mark {header:#010x} lacks the last-fragment bit")]
    NotLastFragment {
        /// The record mark as read, big-endian.
        header: u32,
    },
    /// A record body is longer than the reader's limit.
    #[error("record of {len} bytes exceeds the limit of {max} bytes")]
    TooLong {
        /// The body length from the record mark.
        len: u32,
        /// The reader's limit.
        max: u32,
    },
    /// A record has an empty body; core never writes one.
    #[error("empty record")]
    Empty,
    /// The stream ended inside a record.
    ///
    /// Both counts include the 4-byte record mark. While the mark itself is incomplete the
    /// body length is unknown, and `expected` is 4.
    #[error("stream ended inside a record: expected {expected} bytes, have {have}")]
    Truncated {
        /// Bytes of the record known to be needed.
        expected: u64,
        /// Bytes of the record received.
        have: u64,
    },
    /// A body is too long for a 31-bit record mark (writing only).
    #[error("body of {len} bytes does not fit a 31-bit record mark")]
    Unencodable {
        /// The body length asked for.
        len: u64,
    },
}

/// Returns the record mark for a body of `len` bytes.
///
/// Fails with [`RecordError::Empty`] for `len == 0` (readers reject empty records, so writers
/// refuse to make them) and with [`RecordError::Unencodable`] for `len >= 2^31`.
pub fn record_header(len: usize) -> Result<[u8; 4], RecordError> {
    if len == 0 {
        return Err(RecordError::Empty);
    }
    match u32::try_from(len) {
        Ok(len) if len <= MARK_LEN_MASK => Ok((LAST_FRAGMENT | len).to_be_bytes()),
        _ => Err(RecordError::Unencodable { len: len as u64 }),
    }
}

/// Appends `body` as one record (mark, then body) to `out`.
///
/// On error `out` is left unchanged.
pub fn write_record(out: &mut Vec<u8>, body: &[u8]) -> Result<(), RecordError> {
    let header = record_header(body.len())?;
    out.reserve(MARK_LEN + body.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(body);
    Ok(())
}

/// Writes `body` as one record (mark, then body) to `w`.
///
/// A body that cannot be framed fails with [`io::ErrorKind::InvalidInput`] wrapping the
/// [`RecordError`], before anything is written.
pub fn write_record_to<W: Write>(w: &mut W, body: &[u8]) -> io::Result<()> {
    let header =
        record_header(body.len()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    w.write_all(&header)?;
    w.write_all(body)
}

/// One step of a decoded record stream, borrowed from the input given to
/// [`RecordDecoder::decode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordEvent<'a> {
    /// A record of `len` body bytes starts; its body follows as [`RecordEvent::Data`].
    Begin {
        /// Body length, checked: `1 ..= max_len`.
        len: u32,
    },
    /// The next bytes of the current body (never empty).
    Data(&'a [u8]),
    /// The current record's body is complete.
    End,
}

/// Where the decoder is in the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Waiting for (the rest of) a record mark; `have` of its bytes are in `buf`.
    ExpectHeader { buf: [u8; MARK_LEN], have: u8 },
    /// Waiting for `remaining` more of a body of `len` bytes.
    ExpectBody { len: u32, remaining: u32 },
    /// The body of `len` bytes is complete; the next call returns [`RecordEvent::End`].
    ExpectEnd { len: u32 },
    /// The stream was rejected; every call returns this error until [`RecordDecoder::reset`].
    Failed(RecordError),
}

impl State {
    const START: State = State::ExpectHeader {
        buf: [0; MARK_LEN],
        have: 0,
    };
}

/// Streaming, zero-copy decoder of a record-marked stream.
///
/// Feed it the stream in pieces of any size and drain each piece until it returns no event:
///
/// ```
/// use ledger_relay_wire::record::{RecordDecoder, RecordEvent, DEFAULT_MAX_RECORD_LEN};
///
/// let stream = [0x80, 0, 0, 3, b'a', b'b', b'c'];
/// let mut decoder = RecordDecoder::new(DEFAULT_MAX_RECORD_LEN);
/// let mut events = Vec::new();
/// for mut piece in stream.chunks(2) {
///     loop {
///         let (used, event) = decoder.decode(piece)?;
///         piece = &piece[used..];
///         match event {
///             Some(event) => events.push(format!("{event:?}")),
///             None => break,
///         }
///     }
/// }
/// decoder.finish()?;
/// assert_eq!(events, ["Begin { len: 3 }", "Data([97, 98])", "Data([99])", "End"]);
/// # Ok::<(), ledger_relay_wire::record::RecordError>(())
/// ```
///
/// Errors are sticky: once the stream is rejected, every call fails the same way until
/// [`reset`](Self::reset), since there is no way to find the next record mark in XDR.
#[derive(Debug, Clone)]
pub struct RecordDecoder {
    max_len: u32,
    state: State,
}

impl RecordDecoder {
    /// Returns a decoder that rejects bodies longer than `max_len` bytes.
    pub fn new(max_len: u32) -> Self {
        Self {
            max_len,
            state: State::START,
        }
    }

    /// Decodes at most one event from `input`; returns bytes consumed and the event (None when
    /// all input was consumed into a partial header).
    ///
    /// `None` always means "all of `input` was consumed, give me more": it comes back for
    /// input taken wholly into a partial record mark, and for empty input when no event is
    /// pending. [`RecordEvent::End`] consumes no input, so keep calling until `None`, even
    /// after the last [`RecordEvent::Data`] used up the input.
    pub fn decode<'a>(
        &mut self,
        input: &'a [u8],
    ) -> Result<(usize, Option<RecordEvent<'a>>), RecordError> {
        match &mut self.state {
            State::Failed(e) => Err(e.clone()),
            State::ExpectEnd { .. } => {
                self.state = State::START;
                Ok((0, Some(RecordEvent::End)))
            }
            State::ExpectBody { len, remaining } => {
                if input.is_empty() {
                    return Ok((0, None));
                }
                // `remaining` is at most 2^31, so the `min` fits a usize on any platform Rust
                // supports with std (16-bit targets have no std).
                let take = input.len().min(*remaining as usize);
                // `take <= *remaining`, a u32, so the cast is lossless.
                *remaining -= take as u32;
                if *remaining == 0 {
                    self.state = State::ExpectEnd { len: *len };
                }
                Ok((take, Some(RecordEvent::Data(&input[..take]))))
            }
            State::ExpectHeader { buf, have } => {
                let have_now = usize::from(*have);
                let take = input.len().min(MARK_LEN - have_now);
                buf[have_now..have_now + take].copy_from_slice(&input[..take]);
                let have_now = have_now + take;
                if have_now < MARK_LEN {
                    // `have_now < 4` fits a u8.
                    *have = have_now as u8;
                    return Ok((take, None));
                }
                let header = u32::from_be_bytes(*buf);
                match self.check_header(header) {
                    Ok(len) => {
                        self.state = State::ExpectBody {
                            len,
                            remaining: len,
                        };
                        Ok((take, Some(RecordEvent::Begin { len })))
                    }
                    Err(e) => {
                        self.state = State::Failed(e.clone());
                        Err(e)
                    }
                }
            }
        }
    }

    /// Checks a complete record mark and returns its body length.
    fn check_header(&self, header: u32) -> Result<u32, RecordError> {
        // The fragment bit first: without it the length field means something else.
        if header & LAST_FRAGMENT == 0 {
            return Err(RecordError::NotLastFragment { header });
        }
        let len = header & MARK_LEN_MASK;
        if len > self.max_len {
            return Err(RecordError::TooLong {
                len,
                max: self.max_len,
            });
        }
        if len == 0 {
            return Err(RecordError::Empty);
        }
        Ok(len)
    }

    /// Checks that the stream may end here: `Ok` only at a record boundary; inside a record
    /// mark or a body it fails with [`RecordError::Truncated`], and after an error it repeats
    /// that error.
    ///
    /// A body whose bytes have all arrived counts as a boundary even if its
    /// [`RecordEvent::End`] has not been returned yet: nothing is missing from the stream.
    pub fn finish(&self) -> Result<(), RecordError> {
        match &self.state {
            State::ExpectHeader { have: 0, .. } | State::ExpectEnd { .. } => Ok(()),
            State::ExpectHeader { have, .. } => Err(RecordError::Truncated {
                expected: MARK_LEN as u64,
                have: u64::from(*have),
            }),
            State::ExpectBody { len, remaining } => Err(RecordError::Truncated {
                expected: MARK_LEN as u64 + u64::from(*len),
                have: MARK_LEN as u64 + u64::from(len - remaining),
            }),
            State::Failed(e) => Err(e.clone()),
        }
    }

    /// Returns whether the decoder is inside a record: at least one byte of its mark has been
    /// consumed and its [`RecordEvent::End`] has not been returned yet. False once the stream
    /// is rejected.
    pub fn in_record(&self) -> bool {
        !matches!(
            self.state,
            State::ExpectHeader { have: 0, .. } | State::Failed(_)
        )
    }

    /// Forgets a partial record and any error, and expects a record mark next.
    ///
    /// The relay calls this when core's pipe closes mid-record (the child died) before
    /// reading the stream of its successor.
    pub fn reset(&mut self) {
        self.state = State::START;
    }
}

/// Collects whole records from a record-marked stream fed in pieces of any size.
///
/// Memory grows with the bytes fed, never with a length read from the stream.
#[derive(Debug)]
pub struct RecordReader {
    decoder: RecordDecoder,
    /// Body of the record in progress, as much of it as has arrived.
    current: Vec<u8>,
    /// Complete records not yet taken by [`next_record`](Self::next_record).
    ready: VecDeque<Vec<u8>>,
}

impl RecordReader {
    /// Returns a reader that rejects bodies longer than `max_len` bytes.
    pub fn new(max_len: u32) -> Self {
        Self {
            decoder: RecordDecoder::new(max_len),
            current: Vec::new(),
            ready: VecDeque::new(),
        }
    }

    /// Feeds the next piece of the stream.
    ///
    /// Records completed before an error in the same piece stay available from
    /// [`next_record`](Self::next_record). Errors are sticky: every later call fails the same
    /// way.
    pub fn feed(&mut self, mut piece: &[u8]) -> Result<(), RecordError> {
        loop {
            let (used, event) = self.decoder.decode(piece)?;
            piece = &piece[used..];
            match event {
                None => return Ok(()),
                // No reservation from `len`: the body buffer grows as bytes arrive.
                Some(RecordEvent::Begin { .. }) => self.current = Vec::new(),
                Some(RecordEvent::Data(data)) => self.current.extend_from_slice(data),
                Some(RecordEvent::End) => self.ready.push_back(std::mem::take(&mut self.current)),
            }
        }
    }

    /// Takes the oldest complete record, if any.
    pub fn next_record(&mut self) -> Option<Vec<u8>> {
        self.ready.pop_front()
    }

    /// Checks that the stream may end here; see [`RecordDecoder::finish`].
    pub fn finish(&self) -> Result<(), RecordError> {
        self.decoder.finish()
    }
}

/// Why [`Records`] stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The stream is not a valid record stream.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// Reading the stream failed.
    #[error("reading the record stream failed")]
    Io(#[from] io::Error),
}

/// Blocking iterator over the records of a [`Read`].
///
/// A clean end of input at a record boundary ends the iteration; an end inside a record
/// yields `Err(ReadError::Record(RecordError::Truncated { .. }))`, then `None`. Any error ends
/// the iteration after it is yielded; records completed before it are yielded first.
/// `ErrorKind::Interrupted` reads are retried.
pub struct Records<R: Read> {
    reader: R,
    records: RecordReader,
    buf: Box<[u8]>,
    /// An error to yield once the records completed before it are out.
    pending: Option<ReadError>,
    done: bool,
}

impl<R: Read> Records<R> {
    /// Returns an iterator over the records of `reader`, rejecting bodies longer than
    /// `max_len` bytes.
    pub fn new(reader: R, max_len: u32) -> Self {
        Self {
            reader,
            records: RecordReader::new(max_len),
            buf: vec![0; READ_BUF_LEN].into_boxed_slice(),
            pending: None,
            done: false,
        }
    }
}

impl<R: Read> std::fmt::Debug for Records<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Records")
            .field("records", &self.records)
            .field("pending", &self.pending)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<R: Read> Iterator for Records<R> {
    type Item = Result<Vec<u8>, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(record) = self.records.next_record() {
                return Some(Ok(record));
            }
            if let Some(e) = self.pending.take() {
                return Some(Err(e));
            }
            if self.done {
                return None;
            }
            match self.reader.read(&mut self.buf) {
                Ok(0) => {
                    self.done = true;
                    if let Err(e) = self.records.finish() {
                        self.pending = Some(e.into());
                    }
                }
                Ok(n) => {
                    if let Err(e) = self.records.feed(&self.buf[..n]) {
                        self.done = true;
                        self.pending = Some(e.into());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.done = true;
                    self.pending = Some(e.into());
                }
            }
        }
    }
}

impl<R: Read> std::iter::FusedIterator for Records<R> {}

/// Returns `reader`'s bytes, decompressed if they are zstd.
///
/// Sniffs the first four bytes for the zstd magic (`28 B5 2F FD`) and, if found, decodes the
/// stream (all of its frames) as it is read; otherwise passes the bytes through unchanged.
/// The sniffed bytes are not lost either way. Input shorter than four bytes is passed
/// through.
pub fn open_stream<R: Read + 'static>(mut reader: R) -> io::Result<Box<dyn Read>> {
    let mut head = [0u8; 4];
    let mut have = 0;
    while have < head.len() {
        match reader.read(&mut head[have..]) {
            Ok(0) => break,
            Ok(n) => have += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let stream = io::Cursor::new(head[..have].to_vec()).chain(reader);
    if head[..have] == ZSTD_MAGIC {
        Ok(Box::new(zstd::stream::read::Decoder::new(stream)?))
    } else {
        Ok(Box::new(stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Decodes `pieces` with a fresh decoder into whole records, checking the event grammar.
    fn decode_all(pieces: &[&[u8]], max_len: u32) -> (Vec<Vec<u8>>, Result<(), RecordError>) {
        let mut decoder = RecordDecoder::new(max_len);
        let mut records = Vec::new();
        let mut current: Option<(u32, Vec<u8>)> = None;
        for piece in pieces {
            let mut piece = *piece;
            loop {
                let (used, event) = match decoder.decode(piece) {
                    Ok(x) => x,
                    Err(e) => return (records, Err(e)),
                };
                assert!(used <= piece.len());
                piece = &piece[used..];
                match event {
                    None => {
                        assert!(piece.is_empty(), "None with input left");
                        break;
                    }
                    Some(RecordEvent::Begin { len }) => {
                        assert!(current.is_none(), "Begin inside a record");
                        assert!(decoder.in_record());
                        current = Some((len, Vec::new()));
                    }
                    Some(RecordEvent::Data(data)) => {
                        assert!(!data.is_empty());
                        assert_eq!(used, data.len());
                        let (len, body) = current.as_mut().expect("Data outside a record");
                        body.extend_from_slice(data);
                        assert!(body.len() <= *len as usize);
                    }
                    Some(RecordEvent::End) => {
                        assert_eq!(used, 0);
                        let (len, body) = current.take().expect("End outside a record");
                        assert_eq!(body.len(), len as usize);
                        assert!(!decoder.in_record());
                        records.push(body);
                    }
                }
            }
        }
        (records, decoder.finish())
    }

    fn stream_of(bodies: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for body in bodies {
            write_record(&mut out, body).unwrap();
        }
        out
    }

    #[test]
    fn golden_headers() {
        assert_eq!(record_header(1).unwrap(), [0x80, 0, 0, 1]);
        assert_eq!(record_header(0x103c).unwrap(), [0x80, 0, 0x10, 0x3c]);
        assert_eq!(
            record_header(0x7FFF_FFFF).unwrap(),
            [0xFF, 0xFF, 0xFF, 0xFF]
        );
        assert_eq!(
            record_header(0x8000_0000),
            Err(RecordError::Unencodable { len: 0x8000_0000 })
        );
        assert_eq!(record_header(0), Err(RecordError::Empty));

        let mut out = vec![0xAA];
        write_record(&mut out, b"xdr!").unwrap();
        assert_eq!(out, [0xAA, 0x80, 0, 0, 4, b'x', b'd', b'r', b'!']);
        assert_eq!(write_record(&mut out, b""), Err(RecordError::Empty));
        assert_eq!(out.len(), 9, "failed write leaves the buffer unchanged");

        let mut w = Vec::new();
        write_record_to(&mut w, b"xdr!").unwrap();
        assert_eq!(w, out[1..]);
        let e = write_record_to(&mut w, b"").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(w.len(), 8);
    }

    #[test]
    fn golden_stream_decodes() {
        // Two records, "ab" and "c", as core would write them.
        let stream = [0x80, 0, 0, 2, b'a', b'b', 0x80, 0, 0, 1, b'c'];
        let mut d = RecordDecoder::new(16);
        assert_eq!(
            d.decode(&stream).unwrap(),
            (4, Some(RecordEvent::Begin { len: 2 }))
        );
        assert_eq!(
            d.decode(&stream[4..]).unwrap(),
            (2, Some(RecordEvent::Data(b"ab")))
        );
        assert!(d.in_record());
        assert_eq!(d.finish(), Ok(()), "a complete body is a boundary");
        assert_eq!(d.decode(&stream[6..]).unwrap(), (0, Some(RecordEvent::End)));
        assert!(!d.in_record());
        assert_eq!(d.decode(&stream[6..9]).unwrap(), (3, None));
        assert!(d.in_record());
        assert_eq!(
            d.finish(),
            Err(RecordError::Truncated {
                expected: 4,
                have: 3
            })
        );
        assert_eq!(
            d.decode(&stream[9..]).unwrap(),
            (1, Some(RecordEvent::Begin { len: 1 }))
        );
        assert_eq!(
            d.finish(),
            Err(RecordError::Truncated {
                expected: 5,
                have: 4
            })
        );
        assert_eq!(d.decode(&[]).unwrap(), (0, None));
        assert_eq!(
            d.decode(&stream[10..]).unwrap(),
            (1, Some(RecordEvent::Data(b"c")))
        );
        assert_eq!(d.decode(&[]).unwrap(), (0, Some(RecordEvent::End)));
        assert_eq!(d.decode(&[]).unwrap(), (0, None));
        assert_eq!(d.finish(), Ok(()));
    }

    #[test]
    fn rejects_bad_marks() {
        // No last-fragment bit: rejected before the length is looked at, even a huge one.
        for header in [0x0000_0004u32, 0x7FFF_FFFF, 0] {
            let mut d = RecordDecoder::new(DEFAULT_MAX_RECORD_LEN);
            assert_eq!(
                d.decode(&header.to_be_bytes()),
                Err(RecordError::NotLastFragment { header })
            );
        }
        let mut d = RecordDecoder::new(100);
        assert_eq!(
            d.decode(&[0x80, 0, 0, 101, 0]),
            Err(RecordError::TooLong { len: 101, max: 100 })
        );
        // Sticky until reset.
        assert_eq!(
            d.decode(&[0x80, 0, 0, 1]),
            Err(RecordError::TooLong { len: 101, max: 100 })
        );
        assert_eq!(d.finish(), Err(RecordError::TooLong { len: 101, max: 100 }));
        d.reset();
        assert_eq!(
            d.decode(&[0x80, 0, 0, 100]).unwrap(),
            (4, Some(RecordEvent::Begin { len: 100 }))
        );

        let mut d = RecordDecoder::new(100);
        assert_eq!(d.decode(&[0x80, 0, 0, 0]), Err(RecordError::Empty));

        // The largest mark against the default limit: rejected with nothing allocated.
        let mut r = RecordReader::new(DEFAULT_MAX_RECORD_LEN);
        assert_eq!(
            r.feed(&[0xFF, 0xFF, 0xFF, 0xFF]),
            Err(RecordError::TooLong {
                len: 0x7FFF_FFFF,
                max: DEFAULT_MAX_RECORD_LEN
            })
        );
        assert_eq!(r.current.capacity(), 0);
    }

    #[test]
    fn reader_does_not_reserve_from_the_mark() {
        let mut r = RecordReader::new(DEFAULT_MAX_RECORD_LEN);
        r.feed(&record_header(DEFAULT_MAX_RECORD_LEN as usize).unwrap())
            .unwrap();
        r.feed(&[1, 2, 3]).unwrap();
        assert!(r.current.capacity() < 1024, "{}", r.current.capacity());
        assert_eq!(r.next_record(), None);
    }

    #[test]
    fn reset_discards_a_partial_record() {
        let mut r = RecordReader::new(16);
        r.feed(&[0x80, 0, 0, 4, b'x', b'y']).unwrap();
        assert!(r.finish().is_err());
        r.decoder.reset();
        assert!(!r.decoder.in_record());
        r.feed(&[0x80, 0, 0, 1, b'z']).unwrap();
        assert_eq!(r.next_record(), Some(b"z".to_vec()));
        assert_eq!(r.next_record(), None);
        assert_eq!(r.finish(), Ok(()));
    }

    #[test]
    fn reader_keeps_records_before_an_error() {
        let mut stream = stream_of(&[b"one".to_vec(), b"two".to_vec()]);
        stream.extend_from_slice(&[0, 0, 0, 1, b'!']);
        let mut r = RecordReader::new(16);
        assert_eq!(
            r.feed(&stream),
            Err(RecordError::NotLastFragment { header: 1 })
        );
        assert_eq!(r.next_record(), Some(b"one".to_vec()));
        assert_eq!(r.next_record(), Some(b"two".to_vec()));
        assert_eq!(r.next_record(), None);

        let mut it = Records::new(&stream[..], 16);
        assert_eq!(it.next().unwrap().unwrap(), b"one");
        assert_eq!(it.next().unwrap().unwrap(), b"two");
        assert!(matches!(
            it.next(),
            Some(Err(ReadError::Record(RecordError::NotLastFragment {
                header: 1
            })))
        ));
        assert!(it.next().is_none());
        assert!(it.next().is_none());
    }

    /// Every prefix of a valid stream is either a clean boundary holding exactly the records
    /// it contains whole, or fails `finish()` with `Truncated`; never a short record.
    #[test]
    fn truncation_sweep() {
        let bodies: Vec<Vec<u8>> = vec![vec![7; 5], vec![1], (0..=255).collect(), vec![9; 3]];
        let stream = stream_of(&bodies);
        let mut boundaries = vec![0];
        for body in &bodies {
            boundaries.push(boundaries.last().unwrap() + 4 + body.len());
        }
        for cut in 0..=stream.len() {
            let prefix = &stream[..cut];
            let whole = boundaries.iter().filter(|&&b| b <= cut).count() - 1;
            for pieces in [
                vec![prefix],
                prefix.chunks(1).collect(),
                prefix.chunks(3).collect(),
            ] {
                let (records, finished) = decode_all(&pieces, 1024);
                assert_eq!(records, bodies[..whole], "cut {cut}");
                if boundaries.contains(&cut) {
                    assert_eq!(finished, Ok(()), "cut {cut}");
                } else {
                    assert!(
                        matches!(finished, Err(RecordError::Truncated { expected, have })
                            if have < expected),
                        "cut {cut}: {finished:?}"
                    );
                }
            }

            let read: Vec<_> = Records::new(prefix, 1024).collect();
            let (ok, err): (Vec<_>, Vec<_>) = read.into_iter().partition(|r| r.is_ok());
            let ok: Vec<Vec<u8>> = ok.into_iter().map(Result::unwrap).collect();
            assert_eq!(ok, bodies[..whole], "cut {cut}");
            if boundaries.contains(&cut) {
                assert!(err.is_empty(), "cut {cut}");
            } else {
                assert_eq!(err.len(), 1, "cut {cut}");
                assert!(matches!(
                    err[0],
                    Err(ReadError::Record(RecordError::Truncated { .. }))
                ));
            }
        }
    }

    #[test]
    fn records_retries_interrupted_and_reports_io_errors() {
        struct Flaky<'a> {
            data: &'a [u8],
            calls: usize,
        }
        impl Read for Flaky<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                self.calls += 1;
                if self.calls % 2 == 1 {
                    return Err(io::ErrorKind::Interrupted.into());
                }
                if self.data.is_empty() {
                    return Err(io::Error::other("disk on fire"));
                }
                let n = buf.len().min(self.data.len()).min(3);
                buf[..n].copy_from_slice(&self.data[..n]);
                self.data = &self.data[n..];
                Ok(n)
            }
        }
        let stream = stream_of(&[b"hello".to_vec(), b"world".to_vec()]);
        let mut it = Records::new(
            Flaky {
                data: &stream,
                calls: 0,
            },
            16,
        );
        assert_eq!(it.next().unwrap().unwrap(), b"hello");
        assert_eq!(it.next().unwrap().unwrap(), b"world");
        assert!(matches!(it.next(), Some(Err(ReadError::Io(_)))));
        assert!(it.next().is_none());
    }

    #[test]
    fn open_stream_sniffs_zstd() {
        let stream = stream_of(&[b"ledger one".to_vec(), vec![0x28; 1000]]);
        let plain = {
            let mut out = Vec::new();
            open_stream(io::Cursor::new(stream.clone()))
                .unwrap()
                .read_to_end(&mut out)
                .unwrap();
            out
        };
        assert_eq!(plain, stream);

        // Two concatenated zstd frames decode as one stream.
        let half = stream.len() / 2;
        let mut compressed = zstd::encode_all(&stream[..half], 3).unwrap();
        compressed.extend(zstd::encode_all(&stream[half..], 3).unwrap());
        let mut out = Vec::new();
        open_stream(io::Cursor::new(compressed))
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, stream);

        // Short and empty inputs pass through; a partial magic is not zstd.
        for short in [
            &[][..],
            &[0x28],
            &[0x28, 0xB5, 0x2F],
            &[0x28, 0xB5, 0x2F, 0xFE, 1],
        ] {
            let mut out = Vec::new();
            open_stream(io::Cursor::new(short.to_vec()))
                .unwrap()
                .read_to_end(&mut out)
                .unwrap();
            assert_eq!(out, short);
        }
    }

    #[test]
    fn error_messages() {
        assert_eq!(
            RecordError::NotLastFragment { header: 4 }.to_string(),
            "record mark 0x00000004 lacks the last-fragment bit"
        );
        assert_eq!(
            RecordError::Truncated {
                expected: 10,
                have: 7
            }
            .to_string(),
            "stream ended inside a record: expected 10 bytes, have 7"
        );
    }

    proptest! {
        #[test]
        fn round_trip_any_split(
            bodies in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..300), 0..8),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        ) {
            let stream = stream_of(&bodies);
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(stream.len() + 1)).collect();
            points.push(0);
            points.push(stream.len());
            points.sort_unstable();
            let pieces: Vec<&[u8]> = points.windows(2).map(|w| &stream[w[0]..w[1]]).collect();

            let (records, finished) = decode_all(&pieces, 300);
            prop_assert_eq!(&records, &bodies);
            prop_assert_eq!(finished, Ok(()));

            let mut reader = RecordReader::new(300);
            let mut got = Vec::new();
            for piece in &pieces {
                reader.feed(piece).unwrap();
                while let Some(record) = reader.next_record() {
                    got.push(record);
                }
            }
            prop_assert_eq!(reader.finish(), Ok(()));
            prop_assert_eq!(&got, &bodies);

            let read: Result<Vec<_>, _> = Records::new(&stream[..], 300).collect();
            prop_assert_eq!(&read.unwrap(), &bodies);
        }

        /// Arbitrary bytes never panic, and whatever decodes obeys the event grammar.
        #[test]
        fn arbitrary_input_is_safe(
            data in prop::collection::vec(any::<u8>(), 0..200),
            split in 1usize..17,
        ) {
            let pieces: Vec<&[u8]> = data.chunks(split).collect();
            let _ = decode_all(&pieces, 64);
        }
    }
}
