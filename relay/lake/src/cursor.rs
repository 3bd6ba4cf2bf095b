//! Reading ledgers in order from a lake, with a bounded number of batches fetched ahead in
//! parallel, and the hash chain checked across them.
//!
//! # Memory
//!
//! A cursor holds at most [`PrefetchOptions::depth`] batches being fetched or waiting to be
//! read, and starts no new fetch while the batches it has decoded but not handed out hold
//! more than [`PrefetchOptions::max_bytes`] (but for one, so that it always progresses). A batch is held decompressed (the ledgers handed
//! out are slices of it), so the bound is
//!
//! ```text
//! held <= max_bytes + depth * (largest decompressed batch)    (hostile lake: depth * limits.max_raw)
//!      ~  depth * ledgers_per_batch * ledger size              (typical)
//! ```
//!
//! plus, per fetch in flight, the compressed object while it downloads and decodes. What a
//! cursor holds is counted in [`LakeStats::prefetch_held_bytes`] (and its peak), which the
//! bench reports.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ledger_relay_wire::header::{ChainError, ChainVerifier};
use ledger_relay_wire::lake::{Batch, BatchLedger};
use tokio::task::JoinHandle;

use crate::error::{LakeError, LakeStats};
use crate::store::Lake;

/// How far a cursor reads ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefetchOptions {
    /// Batches fetched ahead at once (at least 1).
    pub depth: usize,
    /// Decoded bytes held beyond which no new fetch starts.
    pub max_bytes: u64,
}

impl Default for PrefetchOptions {
    fn default() -> Self {
        PrefetchOptions {
            // Eight requests in flight hide a cloud store's ~50 ms first-byte latency at
            // several hundred ledgers per second.
            depth: 8,
            // Eight Phase 3 ledgers (14.5 MiB) and then some.
            max_bytes: 128 << 20,
        }
    }
}

/// A decoded batch, counted in its lake's held bytes until dropped.
struct Held {
    ledgers: VecDeque<BatchLedger>,
    key: String,
    bytes: u64,
    stats: Arc<LakeStats>,
    mine: Arc<AtomicU64>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.stats.release(self.bytes);
        self.mine.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl Held {
    fn new(batch: Batch, key: String, stats: Arc<LakeStats>, mine: Arc<AtomicU64>) -> Held {
        let bytes = 12
            + batch
                .ledgers
                .iter()
                .map(|l| l.raw.len() as u64)
                .sum::<u64>();
        stats.hold(bytes);
        mine.fetch_add(bytes, Ordering::Relaxed);
        Held {
            ledgers: batch.ledgers.into(),
            key,
            bytes,
            stats,
            mine,
        }
    }
}

struct Fetch {
    first: u32,
    task: JoinHandle<Result<Held, LakeError>>,
}

/// Ledgers `start..=stop` read in order from a lake, verified: every batch decodes and checks
/// whole before any of its ledgers is handed out, and each ledger's `previousLedgerHash` is the
/// hash of the one handed out before it (or of the anchor given to [`LakeCursor::after`]).
pub struct LakeCursor {
    lake: Arc<Lake>,
    opts: PrefetchOptions,
    next: u32,
    stop: u32,
    /// `stop` has been handed out.
    done: bool,
    /// First sequence of the next batch to start fetching; `None` past `stop`.
    fetch_at: Option<u32>,
    inflight: VecDeque<Fetch>,
    current: Option<Held>,
    prev: Option<(u32, [u8; 32])>,
    /// Bytes of this cursor's decoded batches not yet handed out.
    held: Arc<AtomicU64>,
}

impl std::fmt::Debug for LakeCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LakeCursor")
            .field("next", &self.next)
            .field("stop", &self.stop)
            .field("inflight", &self.inflight.len())
            .finish()
    }
}

impl Drop for LakeCursor {
    fn drop(&mut self) {
        for f in &self.inflight {
            f.task.abort();
        }
    }
}

impl LakeCursor {
    /// A cursor over `start..=stop` (`stop` `u32::MAX` for "as far as the lake goes").
    /// Fetching starts on the first [`LakeCursor::next`], on the current tokio runtime.
    pub fn new(lake: Arc<Lake>, start: u32, stop: u32, opts: PrefetchOptions) -> LakeCursor {
        LakeCursor {
            lake,
            opts: PrefetchOptions {
                depth: opts.depth.max(1),
                ..opts
            },
            next: start,
            stop,
            done: start > stop,
            fetch_at: (start <= stop).then_some(start),
            inflight: VecDeque::new(),
            current: None,
            prev: None,
            held: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Requires the first ledger to link to ledger `seq` with hash `hash` (which must be
    /// `start - 1`): the ledger a subscriber already holds, or one the relay trusts.
    pub fn after(mut self, seq: u32, hash: [u8; 32]) -> LakeCursor {
        self.prev = Some((seq, hash));
        self
    }

    /// The next ledger this cursor will hand out.
    pub fn position(&self) -> u32 {
        self.next
    }

    /// The last ledger handed out (or the anchor), and its hash.
    pub fn last(&self) -> Option<(u32, [u8; 32])> {
        self.prev
    }

    /// The lake read.
    pub fn lake(&self) -> &Arc<Lake> {
        &self.lake
    }

    /// Starts fetches up to the depth, while what is held leaves room; always one when none
    /// is in flight, so that a cursor makes progress whatever the bound.
    fn refill(&mut self) {
        while self.inflight.is_empty()
            || (self.inflight.len() < self.opts.depth
                && self.held.load(Ordering::Relaxed) < self.opts.max_bytes)
        {
            let Some(at) = self.fetch_at else { return };
            let (_, last) = self.lake.schema().batch_range(at);
            self.fetch_at = last.checked_add(1).filter(|n| *n <= self.stop);
            let lake = self.lake.clone();
            let mine = self.held.clone();
            let task = tokio::spawn(async move {
                let batch = lake.read_batch(at).await?;
                Ok(Held::new(batch, lake.key(at), lake.stats().clone(), mine))
            });
            self.inflight.push_back(Fetch { first: at, task });
        }
    }

    /// Forgets every fetch: after an error the next call starts again at the position.
    fn reset(&mut self) {
        for f in self.inflight.drain(..) {
            f.task.abort();
        }
        self.current = None;
        self.fetch_at = (!self.done).then_some(self.next);
    }

    /// The next ledger, or `None` once `stop` has been handed out.
    ///
    /// A ledger the lake does not hold is [`LakeError::Lacks`] (with the range it does hold)
    /// when it lies outside that range, [`LakeError::Missing`] when the lake has a gap there.
    /// After any error the cursor stays at the same position and the next call tries again.
    pub async fn next(&mut self) -> Result<Option<BatchLedger>, LakeError> {
        loop {
            if self.done {
                return Ok(None);
            }
            if let Some(held) = &mut self.current {
                if let Some(ledger) = held.ledgers.pop_front() {
                    if ledger.info.ledger_seq < self.next {
                        // The first batch may begin before the start.
                        continue;
                    }
                    let key = held.key.clone();
                    if ledger.info.ledger_seq > self.next {
                        // A batch that starts inside its range, after the ledger wanted.
                        self.reset();
                        return Err(self.explain_missing(key).await);
                    }
                    if held.ledgers.is_empty() {
                        self.current = None;
                    }
                    return self.hand_out(ledger, key).map(Some);
                }
                self.current = None;
            }
            self.refill();
            let Some(fetch) = self.inflight.pop_front() else {
                // Nothing to fetch: only when past `stop`, handled above.
                return Ok(None);
            };
            let got = match fetch.task.await {
                Ok(r) => r,
                Err(e) => Err(LakeError::Store {
                    key: self.lake.key(fetch.first),
                    reason: format!("fetch task failed: {e}"),
                }),
            };
            match got {
                Ok(held) => {
                    self.current = Some(held);
                    self.refill();
                }
                Err(LakeError::Missing { key }) => {
                    self.reset();
                    return Err(self.explain_missing(key).await);
                }
                Err(e) => {
                    self.reset();
                    return Err(e);
                }
            }
        }
    }

    fn hand_out(&mut self, ledger: BatchLedger, key: String) -> Result<BatchLedger, LakeError> {
        let info = &ledger.info;
        if let Some((pseq, phash)) = self.prev {
            // Only a broken link is refused here: a gap is the caller's to judge.
            if let Err(ChainError::BrokenChain { .. }) =
                ChainVerifier::after(pseq, phash).check(info)
            {
                let e = LakeError::broken_chain(key, pseq, &phash, &info.into());
                self.lake.stats().count(&e);
                self.reset();
                return Err(e);
            }
        }
        self.prev = Some((info.ledger_seq, info.hash));
        if info.ledger_seq >= self.stop {
            self.done = true;
        } else {
            self.next = info.ledger_seq + 1;
        }
        Ok(ledger)
    }

    /// A missing object is the lake lacking the ledger when it lies outside what the lake
    /// holds, and a gap in the lake otherwise.
    async fn explain_missing(&self, key: String) -> LakeError {
        match self.lake.range().await {
            Ok(None) => self.lacks(None),
            Ok(Some((oldest, newest))) if self.next < oldest || self.next > newest => {
                self.lacks(Some((oldest, newest)))
            }
            Ok(Some(_)) => LakeError::Missing { key },
            Err(e) => e,
        }
    }

    fn lacks(&self, range: Option<(u32, u32)>) -> LakeError {
        let e = LakeError::Lacks {
            seq: self.next,
            oldest: range.map(|r| r.0),
            newest: range.map(|r| r.1),
        };
        self.lake.stats().count(&e);
        e
    }
}
