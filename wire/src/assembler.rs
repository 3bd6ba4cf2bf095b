//! The reassembler: chunks and end records from any lane, in any order, in; complete,
//! checksum-verified ledgers, strictly in sequence order, out.
//!
//! It is a state machine without IO or clock, driven like `quinn-proto`'s `Connection`:
//! - input: [`Reassembler::handle_chunk`], [`Reassembler::handle_end`] and
//!   [`Reassembler::handle_timeout`], each with the caller's `now` (monotonic time since an epoch
//!   the caller picks);
//! - output: [`Reassembler::poll_ledger`] (the next verified ledger),
//!   [`Reassembler::poll_missing`] (chunks to ask for again after a stall) and
//!   [`Reassembler::poll_timeout`] (when to call `handle_timeout` next).
//!
//! Checks, in the order of the integrity layers (`docs/architecture.md`): every chunk's index, offset and length are
//! bounded, and its payload decompresses to exactly its declared raw length (layer 1); a ledger
//! is complete when its end record and all its chunks are present, and it is delivered only if
//! the chunks tile its raw length and its checksum matches (layer 2); ledgers come out in
//! sequence order from the requested start, each exactly once (layer 3). The Stellar hash chain
//! (layer 4) is [`crate::header::ChainVerifier`]'s job, on the delivered bytes.
//!
//! Memory: at most `Limits::max_ledgers_in_flight` ledgers are open, and the raw bytes held
//! across them never exceed `Limits::max_buffered_bytes`, whatever the peer sends.
//!
//! Receive-only ([`Reassembler::receive_only`], a bench mode): chunks are kept as they came
//! (compressed), so layer 1 checks the bounds and declared lengths but not that a payload
//! decompresses, layer 2 checks the chunk count and that the declared lengths tile the ledger
//! but not the checksum (it is over the raw bytes), layer 3 is unchanged, and a ledger comes
//! out with empty `data`. It does not verify content.
//!
//! Fail-closed: after the first error every `handle_*` call returns
//! [`AssemblyError::Stopped`] and no ledger that was not already complete is delivered.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;

use crate::compress::CodecError;
use crate::compress::{decompress_into, Codec};
use crate::error::AssemblyError;
use crate::frame::{Chunk, LedgerEnd};
use crate::limits::Limits;

/// A complete, verified ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssembledLedger {
    /// Ledger sequence.
    pub seq: u32,
    /// The raw `LedgerCloseMeta` bytes.
    pub data: Bytes,
    /// Its end record (checksum, header hashes, relay timestamps).
    pub end: LedgerEnd,
    /// Payload bytes received for it, counting each chunk once (its wire size less framing).
    pub wire_bytes: u64,
    /// When its first chunk or end record arrived.
    pub first_seen: Duration,
    /// When it became complete.
    pub completed: Duration,
}

/// Raw bytes of the next ledger to deliver that arrived in order, handed out before the ledger
/// is complete (for cut-through forwarding). **Not verified**: the ledger's checksum is
/// checked only once it is complete, and a ledger that then fails is never delivered, so whoever
/// passes prefixes on must be able to take them back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefix {
    /// Ledger sequence (always the next to be delivered).
    pub seq: u32,
    /// Offset of `data` in the ledger's raw bytes: the end of the previous prefix of this
    /// ledger in this reassembler, 0 for its first.
    pub offset: u64,
    /// The raw bytes of one chunk (shared with the reassembler, not copied).
    pub data: Bytes,
}

/// Chunks of a ledger that have not arrived within the stall timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// Ledger sequence.
    pub seq: u32,
    /// The end record has not arrived, so the chunk count is unknown: ask for the whole ledger.
    /// `indices` is then empty.
    pub whole: bool,
    /// Chunk indices not yet received (when the end record is known).
    pub indices: Vec<u32>,
}

/// Counters for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AssemblyStats {
    /// Ledgers delivered.
    pub ledgers: u64,
    /// Chunks accepted (first copies).
    pub chunks: u64,
    /// Identical copies of chunks or end records already held, ignored.
    pub duplicates: u64,
    /// Frames for ledgers already delivered, ignored.
    pub stale: u64,
    /// Times a ledger stalled and its missing chunks were reported.
    pub stalls: u64,
}

struct Slot {
    offset: u64,
    /// Its declared raw length (`raw.len()`, except receive-only, where `raw` is the payload
    /// as it came).
    len: u64,
    raw: Bytes,
}

struct Partial {
    chunks: BTreeMap<u32, Slot>,
    /// The chunk index and raw offset [`Reassembler::poll_prefix`] hands out next.
    prefix: (u32, u64),
    end: Option<LedgerEnd>,
    raw_bytes: u64,
    wire_bytes: u64,
    first_seen: Duration,
    deadline: Duration,
}

/// Reassembles the ledgers of one session. See the module documentation.
pub struct Reassembler {
    limits: Limits,
    stall_timeout: Duration,
    next: u32,
    open: BTreeMap<u32, Partial>,
    held: u64,
    ready: VecDeque<AssembledLedger>,
    missing: VecDeque<Missing>,
    error: Option<AssemblyError>,
    stats: AssemblyStats,
    receive_only: bool,
}

impl std::fmt::Debug for Reassembler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reassembler")
            .field("next", &self.next)
            .field("open", &self.open.keys().collect::<Vec<_>>())
            .field("held", &self.held)
            .field("error", &self.error)
            .finish()
    }
}

impl Reassembler {
    /// A reassembler that delivers ledgers from `first_seq` on (from `SessionAccept`, or the
    /// last delivered + 1 on resume), and reports missing chunks after `stall_timeout` without
    /// progress on a ledger.
    pub fn new(limits: Limits, first_seq: u32, stall_timeout: Duration) -> Reassembler {
        Reassembler {
            limits,
            stall_timeout,
            next: first_seq,
            open: BTreeMap::new(),
            held: 0,
            ready: VecDeque::new(),
            missing: VecDeque::new(),
            error: None,
            stats: AssemblyStats::default(),
            receive_only: false,
        }
    }

    /// This reassembler in receive-only mode, a bench mode that does **not** verify content
    /// (see the module documentation): no decompression, no checksum, ledgers with empty
    /// `data`; framing, bounds, declared lengths, chunk count and order are still checked.
    pub fn receive_only(mut self) -> Reassembler {
        self.receive_only = true;
        self
    }

    /// The next sequence to be delivered.
    pub fn next_seq(&self) -> u32 {
        self.next
    }

    /// Raw bytes held in incomplete ledgers.
    pub fn held_bytes(&self) -> u64 {
        self.held
    }

    /// Ledgers open (partly received).
    pub fn open_ledgers(&self) -> usize {
        self.open.len()
    }

    /// Counters.
    pub fn stats(&self) -> AssemblyStats {
        self.stats
    }

    /// The error that stopped the reassembler, if any.
    pub fn error(&self) -> Option<&AssemblyError> {
        self.error.as_ref()
    }

    /// Takes a chunk frame received on any lane.
    pub fn handle_chunk(&mut self, chunk: &Chunk, now: Duration) -> Result<(), AssemblyError> {
        self.guard(|s| s.chunk(chunk, now))
    }

    /// Takes an end record received on any lane.
    pub fn handle_end(&mut self, end: &LedgerEnd, now: Duration) -> Result<(), AssemblyError> {
        self.guard(|s| s.end(end, now))
    }

    /// Takes the relay's newest sequence from a heartbeat: ledgers up to it (within the window)
    /// are expected, so one of which nothing at all arrived still stalls and is asked for again.
    pub fn handle_heartbeat(&mut self, newest: u32, now: Duration) {
        if self.error.is_some() || newest < self.next {
            return;
        }
        let window = self.limits.max_ledgers_in_flight.max(1);
        let last = u64::from(newest).min(u64::from(self.next) + u64::from(window) - 1) as u32;
        self.partial(last, now);
    }

    /// Reports ledgers whose stall deadline has passed through [`Reassembler::poll_missing`],
    /// and restarts their deadlines.
    pub fn handle_timeout(&mut self, now: Duration) {
        if self.error.is_some() {
            return;
        }
        for (&seq, p) in self.open.iter_mut() {
            // A complete ledger waiting behind an earlier one is not stalled.
            if p.deadline > now || p.is_complete() {
                continue;
            }
            p.deadline = now + self.stall_timeout;
            self.stats.stalls += 1;
            let report = match &p.end {
                None => Missing {
                    seq,
                    whole: true,
                    indices: Vec::new(),
                },
                Some(end) => Missing {
                    seq,
                    whole: false,
                    indices: (0..end.chunk_count)
                        .filter(|i| !p.chunks.contains_key(i))
                        .collect(),
                },
            };
            self.missing.push_back(report);
        }
    }

    /// The earliest stall deadline among open ledgers.
    pub fn poll_timeout(&self) -> Option<Duration> {
        if self.error.is_some() {
            return None;
        }
        self.open
            .values()
            .filter(|p| !p.is_complete())
            .map(|p| p.deadline)
            .min()
    }

    /// The next complete, verified ledger, in sequence order.
    pub fn poll_ledger(&mut self) -> Option<AssembledLedger> {
        self.ready.pop_front()
    }

    /// The next piece of the next ledger to deliver whose bytes up to it have all arrived: its
    /// chunks in index order, each once, as long as each starts where the one before ended. See
    /// [`Prefix`]: these bytes are not verified yet. Once the ledger completes it is no longer
    /// polled here (what was not handed out is in [`Reassembler::poll_ledger`]'s ledger); after
    /// an error, nothing is.
    pub fn poll_prefix(&mut self) -> Option<Prefix> {
        if self.error.is_some() || self.receive_only {
            return None;
        }
        let seq = self.next;
        let p = self.open.get_mut(&seq)?;
        let (index, offset) = p.prefix;
        let slot = p.chunks.get(&index)?;
        // A misplaced chunk fails the ledger when it completes; nothing past it goes out.
        if slot.offset != offset {
            return None;
        }
        let data = slot.raw.clone();
        p.prefix = (index + 1, offset + data.len() as u64);
        Some(Prefix { seq, offset, data })
    }

    /// The next stalled ledger's missing chunks, to be asked for again.
    pub fn poll_missing(&mut self) -> Option<Missing> {
        self.missing.pop_front()
    }

    fn guard(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<(), AssemblyError>,
    ) -> Result<(), AssemblyError> {
        if let Some(e) = &self.error {
            return Err(AssemblyError::Stopped(Box::new(e.clone())));
        }
        let r = f(self);
        if let Err(e) = &r {
            self.error = Some(e.clone());
            self.missing.clear();
            // Nothing after the error is delivered; what is held is dropped now.
            self.open.clear();
            self.held = 0;
        }
        r
    }

    /// Classifies `seq` against the window: `Ok(true)` to process, `Ok(false)` for a stale
    /// frame of a ledger already delivered.
    fn admit(&mut self, seq: u32) -> Result<bool, AssemblyError> {
        let window = self.limits.max_ledgers_in_flight.max(1);
        if seq < self.next {
            // A resend that raced with completion, or a duplicate from a lane that came back:
            // harmless within a window's distance, a regression beyond it.
            if self.next - seq <= window {
                self.stats.stale += 1;
                return Ok(false);
            }
            return Err(AssemblyError::Regression {
                next: self.next,
                got: seq,
            });
        }
        if u64::from(seq) >= u64::from(self.next) + u64::from(window) {
            return Err(AssemblyError::Gap {
                next: self.next,
                got: seq,
                window,
            });
        }
        Ok(true)
    }

    fn partial(&mut self, seq: u32, now: Duration) -> &mut Partial {
        // Every ledger between the next to deliver and this one is expected too: open it, so a
        // ledger of which nothing at all arrives still stalls and is asked for again.
        for s in self.next..seq {
            self.open
                .entry(s)
                .or_insert_with(|| Partial::new(now, self.stall_timeout));
        }
        let timeout = self.stall_timeout;
        self.open
            .entry(seq)
            .or_insert_with(|| Partial::new(now, timeout))
    }

    fn chunk(&mut self, chunk: &Chunk, now: Duration) -> Result<(), AssemblyError> {
        let h = chunk.header;
        let (seq, index) = (h.seq, h.index);
        if !self.admit(seq)? {
            return Ok(());
        }
        if index >= self.limits.max_chunks_per_ledger {
            return Err(AssemblyError::IndexOutOfRange {
                seq,
                index,
                limit: self.limits.max_chunks_per_ledger,
            });
        }
        if h.raw_len == 0 || h.raw_len > self.limits.max_chunk_raw {
            return Err(AssemblyError::TooLong {
                seq,
                end: u64::from(h.raw_len),
                limit: u64::from(self.limits.max_chunk_raw),
            });
        }
        let range_end = h.raw_offset.saturating_add(u64::from(h.raw_len));
        if range_end > self.limits.max_ledger_raw {
            return Err(AssemblyError::TooLong {
                seq,
                end: range_end,
                limit: self.limits.max_ledger_raw,
            });
        }
        if let Some(end) = self.open.get(&seq).and_then(|p| p.end) {
            check_against_end(&end, index, range_end)?;
        }
        let decode =
            |out: &mut [u8]| {
                decompress_into(h.codec, &chunk.payload, out)
                    .map_err(|source| AssemblyError::Codec { seq, index, source })
            };
        if let Some(slot) = self.open.get(&seq).and_then(|p| p.chunks.get(&index)) {
            // A resend after a lane loss is harmless if it is the same chunk.
            let same = slot.offset == h.raw_offset
                && slot.len == u64::from(h.raw_len)
                && if h.codec == Codec::None || self.receive_only {
                    slot.raw == chunk.payload
                } else {
                    let mut raw = vec![0u8; h.raw_len as usize];
                    decode(&mut raw)?;
                    slot.raw == raw
                };
            if !same {
                return Err(AssemblyError::ConflictingChunk { seq, index });
            }
            self.stats.duplicates += 1;
            return Ok(());
        }
        let incoming = u64::from(h.raw_len);
        if self.held + incoming > self.limits.max_buffered_bytes {
            return Err(AssemblyError::BufferFull {
                held: self.held,
                incoming,
                limit: self.limits.max_buffered_bytes,
            });
        }
        let raw = if h.codec == Codec::None {
            // Frame decoding guarantees this for raw chunks; frames built by hand may not.
            if chunk.payload.len() != h.raw_len as usize {
                return Err(AssemblyError::Codec {
                    seq,
                    index,
                    source: CodecError::LengthMismatch {
                        codec: Codec::None,
                        declared: h.raw_len,
                        got: chunk.payload.len() as u64,
                        exceeded: chunk.payload.len() > h.raw_len as usize,
                    },
                });
            }
            chunk.payload.clone()
        } else if self.receive_only {
            // Kept as it came: frame decoding bounded it below the declared raw length.
            chunk.payload.clone()
        } else {
            let mut raw = vec![0u8; h.raw_len as usize];
            decode(&mut raw)?;
            Bytes::from(raw)
        };
        self.held += incoming;
        self.stats.chunks += 1;
        let timeout = self.stall_timeout;
        let p = self.partial(seq, now);
        p.chunks.insert(
            index,
            Slot {
                offset: h.raw_offset,
                len: incoming,
                raw,
            },
        );
        p.raw_bytes += incoming;
        p.wire_bytes += chunk.payload.len() as u64;
        p.deadline = now + timeout;
        self.complete(now)
    }

    fn end(&mut self, end: &LedgerEnd, now: Duration) -> Result<(), AssemblyError> {
        let seq = end.seq;
        if !self.admit(seq)? {
            return Ok(());
        }
        if end.chunk_count > self.limits.max_chunks_per_ledger {
            return Err(AssemblyError::IndexOutOfRange {
                seq,
                index: end.chunk_count,
                limit: self.limits.max_chunks_per_ledger,
            });
        }
        if end.raw_len > self.limits.max_ledger_raw {
            return Err(AssemblyError::TooLong {
                seq,
                end: end.raw_len,
                limit: self.limits.max_ledger_raw,
            });
        }
        // Each chunk holds at least one byte and at most max_chunk_raw; an empty ledger has no
        // chunks.
        let count = u64::from(end.chunk_count);
        if count > end.raw_len || end.raw_len > count * u64::from(self.limits.max_chunk_raw) {
            return Err(AssemblyError::LengthMismatch {
                seq,
                expected: end.raw_len,
                got: count,
            });
        }
        if let Some(p) = self.open.get(&seq) {
            if let Some(prev) = &p.end {
                if prev == end {
                    self.stats.duplicates += 1;
                    return Ok(());
                }
                return Err(AssemblyError::ConflictingEnd { seq });
            }
            for (&index, slot) in &p.chunks {
                check_against_end(end, index, slot.offset + slot.len)?;
            }
        }
        let timeout = self.stall_timeout;
        let p = self.partial(seq, now);
        p.end = Some(*end);
        p.deadline = now + timeout;
        self.complete(now)
    }

    /// Delivers every complete ledger at the head of the window.
    fn complete(&mut self, now: Duration) -> Result<(), AssemblyError> {
        loop {
            let seq = self.next;
            let Some(p) = self.open.get(&seq) else {
                return Ok(());
            };
            let Some(end) = p.end.filter(|_| p.is_complete()) else {
                return Ok(());
            };
            // Every index below chunk_count is present (indices were checked against the count),
            // so iterate in order and check the chunks tile [0, raw_len).
            let keep = !self.receive_only;
            let mut data = Vec::with_capacity(if keep {
                p.raw_bytes.min(end.raw_len) as usize
            } else {
                0
            });
            let mut offset = 0u64;
            for (&index, slot) in &p.chunks {
                if slot.offset != offset {
                    return Err(AssemblyError::Misplaced {
                        seq,
                        index,
                        expected: offset,
                        got: slot.offset,
                    });
                }
                offset += slot.len;
                if keep {
                    data.extend_from_slice(&slot.raw);
                }
            }
            if offset != end.raw_len {
                return Err(AssemblyError::LengthMismatch {
                    seq,
                    expected: end.raw_len,
                    got: offset,
                });
            }
            if keep {
                let sum = crate::checksum(&data);
                if sum != end.checksum {
                    return Err(AssemblyError::ChecksumMismatch {
                        seq,
                        expected: end.checksum,
                        got: sum,
                    });
                }
            }
            // The entry exists: it was just read above.
            let Some(p) = self.open.remove(&seq) else {
                return Ok(());
            };
            self.held -= p.raw_bytes;
            self.stats.ledgers += 1;
            self.ready.push_back(AssembledLedger {
                seq,
                data: Bytes::from(data),
                end,
                wire_bytes: p.wire_bytes,
                first_seen: p.first_seen,
                completed: now,
            });
            self.missing.retain(|m| m.seq != seq);
            self.next = seq.wrapping_add(1);
        }
    }
}

impl Partial {
    fn is_complete(&self) -> bool {
        self.end
            .is_some_and(|e| self.chunks.len() as u64 == u64::from(e.chunk_count))
    }

    fn new(now: Duration, timeout: Duration) -> Partial {
        Partial {
            chunks: BTreeMap::new(),
            prefix: (0, 0),
            end: None,
            raw_bytes: 0,
            wire_bytes: 0,
            first_seen: now,
            deadline: now + timeout,
        }
    }
}

fn check_against_end(end: &LedgerEnd, index: u32, range_end: u64) -> Result<(), AssemblyError> {
    if index >= end.chunk_count {
        return Err(AssemblyError::IndexOutOfRange {
            seq: end.seq,
            index,
            limit: end.chunk_count,
        });
    }
    if range_end > end.raw_len {
        return Err(AssemblyError::TooLong {
            seq: end.seq,
            end: range_end,
            limit: end.raw_len,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
