//! `fifo:PATH` and `stdin`: read an existing record-marked stream as it comes.
//!
//! Reads of up to [`READ_LEN`] bytes are decoded by `RecordDecoder` and forwarded as they
//! arrive: a `Data` event per piece of body in each read, no pacing, no buffering of whole
//! ledgers. A ledger's `Begin` is stamped with the time of the read that completed its record
//! mark, its `End` with the time of the read that brought its last byte.
//!
//! End of stream at a record boundary: `Finished`. End of stream inside a record: `Abort`
//! (the partial ledger must be discarded), then `Finished`: the stream did end, and what came
//! before the cut was delivered whole. A malformed record mark (no last-fragment bit, too
//! long, empty) fails the source: XDR has no way to find the next record.
//!
//! Reads wait in `poll(2)` with a timeout so that shutdown is noticed within [`POLL_MS`] even
//! when the writer is silent. The FIFO is opened non-blocking, which also means opening it
//! does not wait for a writer; until one connects, `poll` reports nothing (Linux reports
//! `POLLHUP` only after a writer has come and gone). Standard input is not switched to
//! non-blocking (the flag would be shared with whoever else holds it): it is read through a
//! duplicate of fd 0, and only after `poll` says it is readable.
//!
//! [`StreamReader`] is shared with the pipe source.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use bytes::Bytes;
use ledger_relay_wire::record::{RecordDecoder, RecordEvent};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::{now_ns, Out, SourceEvent, SourceOptions, Stop};

/// Largest read: core writes a ledger in 64-256 KiB writes, and a 1 MiB pipe can hold more
/// than one of them when the reader falls behind.
pub(super) const READ_LEN: usize = 256 << 10;

/// Longest wait in `poll` before checking for shutdown, in ms.
pub(super) const POLL_MS: u16 = 50;

pub(super) fn run_fifo(path: &Path, opts: &SourceOptions, out: &Out) -> Result<(), Stop> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(|e| Stop::Failed(format!("cannot open {}: {e}", path.display())))?;
    read_to_end(
        StreamReader::new(file, path.display().to_string(), opts.max_record_len),
        out,
    )
}

pub(super) fn run_stdin(opts: &SourceOptions, out: &Out) -> Result<(), Stop> {
    let fd = io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| Stop::Failed(format!("cannot duplicate stdin: {e}")))?;
    read_to_end(
        StreamReader::new(File::from(fd), "stdin".to_owned(), opts.max_record_len),
        out,
    )
}

fn read_to_end(mut reader: StreamReader, out: &Out) -> Result<(), Stop> {
    loop {
        if let Pumped::Eof = reader.pump(out, POLL_MS)? {
            reader.end(out, None)?;
            return Ok(());
        }
    }
}

/// What one [`StreamReader::pump`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pumped {
    /// Read bytes and forwarded them; `ended` ledgers were completed.
    Read {
        /// Ledgers whose `End` was sent.
        ended: u64,
    },
    /// Nothing to read before the timeout.
    Idle,
    /// The writer closed the stream.
    Eof,
}

/// Reads a record-marked stream from a file descriptor and forwards its events.
pub(super) struct StreamReader {
    file: File,
    /// Names the stream in messages.
    what: String,
    decoder: RecordDecoder,
    buf: Box<[u8]>,
    /// A `Begin` was sent and its `End` (or `Abort`) not yet.
    open: bool,
}

impl StreamReader {
    pub(super) fn new(file: File, what: String, max_record_len: u32) -> Self {
        Self {
            file,
            what,
            decoder: RecordDecoder::new(max_record_len),
            buf: vec![0; READ_LEN].into_boxed_slice(),
            open: false,
        }
    }

    /// Whether a ledger is in progress (begun, not ended).
    pub(super) fn in_ledger(&self) -> bool {
        self.open
    }

    /// Waits up to `timeout_ms` for bytes, reads what is there and forwards its events.
    ///
    /// Stops with `Shutdown`, `ConsumerGone` or `Failed` (after an `Abort` if a ledger was in
    /// progress).
    pub(super) fn pump(&mut self, out: &Out, timeout_ms: u16) -> Result<Pumped, Stop> {
        out.check().map_err(|stop| self.abort(out, stop))?;
        let mut fds = [PollFd::new(self.file.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(timeout_ms)) {
            Ok(0) | Err(Errno::EINTR) => return Ok(Pumped::Idle),
            Ok(_) => {}
            Err(e) => {
                let stop = Stop::Failed(format!("cannot poll {}: {e}", self.what));
                return Err(self.abort(out, stop));
            }
        }
        // Readable, hung up or in error: `read` says which.
        match self.file.read(&mut self.buf) {
            Ok(0) => Ok(Pumped::Eof),
            Ok(n) => self.forward(n, out).map(|ended| Pumped::Read { ended }),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted =>
            {
                Ok(Pumped::Idle)
            }
            Err(e) => {
                let stop = Stop::Failed(format!("cannot read {}: {e}", self.what));
                Err(self.abort(out, stop))
            }
        }
    }

    /// Decodes `self.buf[..n]` and sends its events; returns the number of ledgers ended.
    fn forward(&mut self, n: usize, out: &Out) -> Result<u64, Stop> {
        let at_ns = now_ns();
        let mut ended = 0;
        let mut input = &self.buf[..n];
        loop {
            let (used, event) = match self.decoder.decode(input) {
                Ok(step) => step,
                Err(e) => {
                    let stop = Stop::Failed(format!("{}: {e}", self.what));
                    // Decoder errors come from a record mark, so no ledger is open; the
                    // guard keeps the grammar whatever the decoder does.
                    if self.open {
                        self.open = false;
                        return Err(out.abort(stop));
                    }
                    return Err(stop);
                }
            };
            input = &input[used..];
            match event {
                None => return Ok(ended),
                Some(RecordEvent::Begin { len }) => {
                    self.open = true;
                    out.send(SourceEvent::Begin { len, at_ns })?;
                }
                Some(RecordEvent::Data(data)) => {
                    out.send(SourceEvent::Data(Bytes::copy_from_slice(data)))?;
                }
                Some(RecordEvent::End) => {
                    self.open = false;
                    ended += 1;
                    out.send(SourceEvent::End { at_ns })?;
                }
            }
        }
    }

    /// Handles the end of the stream: returns true at a record boundary; inside a record,
    /// sends `Abort` (with `cause`, if given, before the truncation error), forgets the
    /// partial record and returns false.
    pub(super) fn end(&mut self, out: &Out, cause: Option<&str>) -> Result<bool, Stop> {
        match self.decoder.finish() {
            Ok(()) => Ok(true),
            Err(e) => {
                let was_open = std::mem::take(&mut self.open);
                self.decoder.reset();
                if was_open {
                    let reason = match cause {
                        Some(cause) => format!("{}: {cause}: {e}", self.what),
                        None => format!("{}: {e}", self.what),
                    };
                    out.send(SourceEvent::Abort { reason })?;
                } else {
                    // Only part of a record mark: no ledger was begun, nothing to abort.
                    tracing::warn!(stream = %self.what, error = %e, "stream ended inside a record mark");
                }
                Ok(false)
            }
        }
    }

    /// Sends `Abort` for a ledger in progress cut short by `stop`, and passes `stop` on.
    fn abort(&mut self, out: &Out, stop: Stop) -> Stop {
        if std::mem::take(&mut self.open) {
            out.abort(stop)
        } else {
            stop
        }
    }
}
