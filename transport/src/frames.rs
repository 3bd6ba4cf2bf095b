//! Frame IO on QUIC streams (`docs/protocol.md` section 2): a control stream carries a
//! sequence of frames ([`FrameReader`], [`FrameWriter`]); a data stream carries exactly one
//! frame and then FIN ([`read_data_frame`] within a [`DataBudget`], [`read_single_frame`],
//! [`write_single_frame`]); a session or lane ends with [`close_with_error`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ledger_relay_wire::frame::{self, Frame, FrameDecoder};
use ledger_relay_wire::{FrameError, Limits};
use quinn::VarInt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Why reading or writing a frame on a QUIC stream failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameIoError {
    /// Reading the stream failed (connection lost, stream reset).
    #[error("reading the stream failed")]
    Read(#[from] quinn::ReadError),
    /// Writing the stream failed (connection lost, stream stopped).
    #[error("writing the stream failed")]
    Write(#[from] quinn::WriteError),
    /// The bytes are not a valid frame, or the stream ended inside one: a protocol violation.
    #[error("invalid frame")]
    Frame(#[from] FrameError),
    /// A single-frame stream is longer than the largest frame allowed: a protocol violation.
    #[error("stream longer than the largest frame ({limit} bytes)")]
    TooLong {
        /// The limit, `Limits::max_frame_len()`.
        limit: usize,
    },
}

impl FrameIoError {
    /// Whether the peer broke the protocol (as opposed to the transport failing).
    pub fn is_protocol_violation(&self) -> bool {
        matches!(self, FrameIoError::Frame(_) | FrameIoError::TooLong { .. })
    }

    /// The connection error underneath, if the connection was lost.
    pub fn connection_error(&self) -> Option<&quinn::ConnectionError> {
        match self {
            FrameIoError::Read(quinn::ReadError::ConnectionLost(e))
            | FrameIoError::Write(quinn::WriteError::ConnectionLost(e)) => Some(e),
            _ => None,
        }
    }
}

/// Bytes asked of a control stream per read: bounds what is buffered beyond one frame.
const CONTROL_READ_PIECE: usize = 64 << 10;

/// Reads a sequence of frames from a control stream.
///
/// Each frame header is checked against the limits as soon as its 5 bytes are in, so an
/// oversize or unknown frame is refused before its body is buffered; at most one frame plus one
/// 64 KiB piece is ever held.
pub struct FrameReader {
    recv: quinn::RecvStream,
    decoder: FrameDecoder,
    buf: Box<[u8]>,
    finished: bool,
}

impl fmt::Debug for FrameReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameReader")
            .field("stream", &self.recv.id())
            .field("buffered", &self.decoder.buffered())
            .field("finished", &self.finished)
            .finish()
    }
}

impl FrameReader {
    /// A reader of `recv`, bounded by `limits`.
    pub fn new(recv: quinn::RecvStream, limits: Limits) -> FrameReader {
        FrameReader {
            recv,
            decoder: FrameDecoder::new(limits),
            buf: vec![0; CONTROL_READ_PIECE].into_boxed_slice(),
            finished: false,
        }
    }

    /// The next frame, or `Ok(None)` when the peer finished the stream at a frame boundary.
    /// A stream that ends inside a frame is an error.
    ///
    /// Cancel-safe: bytes read before a cancellation stay buffered for the next call.
    pub async fn next(&mut self) -> Result<Option<Frame>, FrameIoError> {
        loop {
            if let Some(frame) = self.decoder.poll()? {
                return Ok(Some(frame));
            }
            if self.finished {
                self.decoder.finish()?;
                return Ok(None);
            }
            match self.recv.read(&mut self.buf).await? {
                Some(n) => self.decoder.feed(&self.buf[..n])?,
                None => self.finished = true,
            }
        }
    }

    /// The stream underneath.
    pub fn stream_mut(&mut self) -> &mut quinn::RecvStream {
        &mut self.recv
    }
}

/// Writes frames to a control stream.
pub struct FrameWriter {
    send: quinn::SendStream,
    buf: Vec<u8>,
}

impl fmt::Debug for FrameWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameWriter")
            .field("stream", &self.send.id())
            .finish()
    }
}

/// Send priority of control streams: above the data streams (quinn's default, 0), so that a
/// heartbeat, an ack or an error is never queued behind megabytes of chunks on the same lane.
pub const CONTROL_PRIORITY: i32 = 1;

impl FrameWriter {
    /// A writer of `send`, which is given [`CONTROL_PRIORITY`].
    pub fn new(send: quinn::SendStream) -> FrameWriter {
        // Fails only on a stream already closed, whose writes will fail anyway.
        let _ = send.set_priority(CONTROL_PRIORITY);
        FrameWriter {
            send,
            buf: Vec::new(),
        }
    }

    /// Writes one frame. Not cancel-safe: a cancelled write may leave part of a frame sent.
    pub async fn write(&mut self, frame: &Frame) -> Result<(), FrameIoError> {
        self.buf.clear();
        frame.encode(&mut self.buf);
        self.send.write_all(&self.buf).await?;
        Ok(())
    }

    /// Finishes the stream (FIN) after what has been written.
    pub fn finish(&mut self) {
        // Finishing an already finished or reset stream is harmless.
        let _ = self.send.finish();
    }

    /// The stream underneath.
    pub fn stream_mut(&mut self) -> &mut quinn::SendStream {
        &mut self.send
    }
}

/// Both halves of a control stream.
#[derive(Debug)]
pub struct FrameIo {
    /// Frames from the peer.
    pub reader: FrameReader,
    /// Frames to the peer.
    pub writer: FrameWriter,
}

impl FrameIo {
    /// Frame IO over a bidirectional stream.
    pub fn new(send: quinn::SendStream, recv: quinn::RecvStream, limits: Limits) -> FrameIo {
        FrameIo {
            reader: FrameReader::new(recv, limits),
            writer: FrameWriter::new(send),
        }
    }
}

/// Writes `frame` to `send` as the whole content of a stream: the frame, then FIN.
pub async fn write_single_frame(
    send: &mut quinn::SendStream,
    frame: &Frame,
) -> Result<(), FrameIoError> {
    send.write_all(&frame.to_vec()).await?;
    // The stream was just written to, so it is open; a peer's STOP_SENDING shows up on the
    // write above or in the peer's own handling.
    let _ = send.finish();
    Ok(())
}

/// Ends a session or lane the way `docs/protocol.md` section 2 (Closing) says: writes `error`
/// on the control stream `send`, finishes it, waits up to `linger` for the peer to acknowledge
/// it and then to close the connection itself (it does once it has read the frame), then
/// closes `conn` with the application code `0x100 + code`.
///
/// The wait matters: closing a QUIC connection discards stream data not yet sent, and data the
/// peer's QUIC stack has acknowledged but its application has not read yet, so without it the
/// peer often sees only the close code and loses the frame's details (the bounds of
/// `BelowRetention`, the message). A peer that is gone or does not close costs at most
/// `linger`.
pub async fn close_with_error(
    conn: &quinn::Connection,
    send: &mut quinn::SendStream,
    error: &frame::ErrorFrame,
    linger: Duration,
) {
    let deadline = tokio::time::Instant::now() + linger;
    let sent = tokio::time::timeout_at(deadline, async {
        send.write_all(&Frame::Error(error.clone()).to_vec())
            .await?;
        // Finishing twice is harmless; the stream is ours.
        let _ = send.finish();
        let _ = send.stopped().await;
        Ok::<(), quinn::WriteError>(())
    })
    .await;
    match sent {
        Ok(Ok(())) => {
            let _ = tokio::time::timeout_at(deadline, conn.closed()).await;
        }
        Ok(Err(e)) => tracing::debug!(error = %e, "error frame not sent"),
        Err(_) => {}
    }
    let reason = frame::truncate_utf8(&error.message, 200);
    conn.close(VarInt::from_u32(error.code.close_code()), reason.as_bytes());
}

/// Reads a data stream to its end and decodes it as exactly one frame
/// (`docs/protocol.md` section 2, Data). A stream longer than `limits.max_frame_len()` is a
/// protocol violation ([`FrameIoError::TooLong`]), refused without buffering past the limit.
pub async fn read_single_frame(
    recv: &mut quinn::RecvStream,
    limits: &Limits,
) -> Result<Frame, FrameIoError> {
    let limit = limits.max_frame_len();
    let bytes = match recv.read_to_end(limit).await {
        Ok(bytes) => bytes,
        Err(quinn::ReadToEndError::TooLong) => return Err(FrameIoError::TooLong { limit }),
        Err(quinn::ReadToEndError::Read(e)) => return Err(e.into()),
    };
    Ok(frame::decode_exact(bytes.into(), limits)?)
}

/// The bytes of data frames a receiver may hold at once, shared by every stream of a session
/// (`Limits::max_unassembled_bytes`, `docs/protocol.md` section 5). [`read_data_frame`] takes a
/// frame's share whole, from its header, before it reads its body; the share comes back when
/// the frame's [`DataPermit`] is dropped (once the reassembler has taken the frame).
#[derive(Debug, Clone)]
pub struct DataBudget {
    bytes: Arc<Semaphore>,
    max: u64,
}

/// A frame's share of a [`DataBudget`], given back when dropped.
#[derive(Debug)]
pub struct DataPermit {
    _permit: Option<OwnedSemaphorePermit>,
}

impl DataBudget {
    /// A budget of `max` bytes (at most `u32::MAX`, more than any frame holds).
    pub fn new(max: u64) -> DataBudget {
        let max = max.clamp(1, u64::from(u32::MAX));
        DataBudget {
            bytes: Arc::new(Semaphore::new(max as usize)),
            max,
        }
    }

    /// The bytes held now by frames being read or not yet handed on.
    pub fn held(&self) -> u64 {
        self.max - self.bytes.available_permits() as u64
    }

    /// Waits for `n` bytes (at most the whole budget, so that one frame always fits).
    async fn take(&self, n: u64) -> DataPermit {
        let n = n.clamp(1, self.max) as u32;
        // The semaphore is never closed (this struct owns it and never closes it), so the
        // acquisition fails only if it could not have waited at all.
        DataPermit {
            _permit: self.bytes.clone().acquire_many_owned(n).await.ok(),
        }
    }
}

/// Reads a data stream (`docs/protocol.md` section 2, Data) as exactly one frame within
/// `budget`: the frame's header (and a chunk's fixed fields) is read and checked first, then the
/// bytes it will hold ([`frame::data_head`]) are taken from `budget`, then its body is read and
/// the stream must end there. A stream waiting for the budget reads nothing more, so QUIC's
/// flow control holds its sender back.
pub async fn read_data_frame(
    recv: &mut quinn::RecvStream,
    limits: &Limits,
    budget: &DataBudget,
) -> Result<(Frame, DataPermit), FrameIoError> {
    let mut head = [0u8; frame::DATA_HEAD_LEN];
    let mut have = 0;
    let info = loop {
        if let Some(info) = frame::data_head(&head[..have], limits)? {
            break info;
        }
        match recv.read(&mut head[have..]).await? {
            Some(n) => have += n,
            None => {
                let need = if have < frame::FRAME_HEADER_LEN {
                    frame::FRAME_HEADER_LEN
                } else {
                    frame::DATA_HEAD_LEN
                };
                return Err(FrameError::Truncated { have, need }.into());
            }
        }
    };
    let permit = budget.take(info.held).await;
    // `frame_len` is checked against the limits and its bytes are in the budget.
    let mut buf = Vec::with_capacity(info.frame_len.max(have));
    buf.extend_from_slice(&head[..have]);
    read_to_frame_end(recv, &mut buf, &info).await?;
    Ok((frame::decode_exact(buf.into(), limits)?, permit))
}

/// Reads the rest of the frame `head` describes into `buf` and checks that the stream ends
/// there. A `buf` already longer is left for the decoder to refuse (trailing bytes).
async fn read_to_frame_end(
    recv: &mut quinn::RecvStream,
    buf: &mut Vec<u8>,
    head: &frame::DataHead,
) -> Result<(), FrameIoError> {
    let frame_len = head.frame_len;
    if buf.len() > frame_len {
        return Ok(());
    }
    // Appended as it arrives, not zeroed ahead: a frame cut short costs what was sent of it.
    while buf.len() < frame_len {
        match recv.read_chunk(frame_len - buf.len(), true).await? {
            Some(chunk) => buf.extend_from_slice(&chunk.bytes),
            None => {
                return Err(FrameError::Truncated {
                    have: buf.len(),
                    need: frame_len,
                }
                .into())
            }
        }
    }
    let mut more = [0u8; 1];
    match recv.read(&mut more).await? {
        None => Ok(()),
        Some(extra) => Err(FrameError::TrailingBytes {
            frame: head.frame_type.name(),
            extra,
        }
        .into()),
    }
}
