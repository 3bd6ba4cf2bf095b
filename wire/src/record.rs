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
mod tests;
