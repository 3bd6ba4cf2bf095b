//! A session's ledgers below the ring (or in a gap between two of its runs), from the relay's
//! backfill lake (`--backfill`).
//!
//! The sender decides what to load and in what order; the shell looks for a ledger in memory,
//! then in the ring, and asks this module only for one that neither holds any more. Here a
//! session keeps at most one [`BackfillCursor`] (reading ahead by the prefetch depth, in
//! parallel), holding one of the relay's reader slots while it does, so the relay's backfill
//! memory is `--backfill-sessions` cursors' bound; the sessions of one client identity hold at
//! most `--backfill-sessions-per-identity` of the slots. A ledger served from the lake is verified
//! (its object decoded whole, its header hash, the chain from the one before); the first
//! ledger served from the ring after the lake must link to the lake's last, which also ends
//! the reading and frees the slot. A resend of a lake ledger is read again alone and must have
//! the hash it was first served with.
//!
//! What the lake says becomes a [`LoadResult`] for the sender: a ledger outside the lake's
//! range is `NotHeld` with the lake's range (the below-retention end), a missing or damaged
//! object or a broken chain is `Corrupt`, a store that fails after its client's retries is
//! `Failed`, and all reader slots taken (or the identity's share of them) is `Unavailable`
//! (asked again shortly). Nothing of a
//! ledger is served before all of it checked out.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use ledger_relay_lake::LakeError;
use ledger_relay_wire::frame::LedgerEnd;
use ledger_relay_wire::sender::{CloseReason, LoadResult};

use super::Shared;
use crate::lake::backfill::{verify_link, Backfill, BackfillCursor, Reader};
use crate::metrics::Metrics;
use crate::ring::Ring;

/// Whether a session may start at `seq`, which memory and the ring do not hold (they hold
/// `oldest..=newest`): only if the backfill lake holds it. The refusal carries the lake's
/// range beside the ring's; a lake that cannot be read is the relay's failure, which the
/// subscriber retries (or fails over), not a below-retention end.
pub(crate) async fn start_below(
    shared: &Shared,
    seq: u32,
    oldest: u32,
    newest: u32,
) -> Result<(), CloseReason> {
    let below = |lake| CloseReason::BelowRetention {
        seq,
        oldest,
        newest,
        lake,
    };
    let Some(backfill) = &shared.backfill else {
        return Err(below(None));
    };
    match backfill.check(seq).await {
        Ok(()) => Ok(()),
        Err(LakeError::Lacks {
            oldest: lo,
            newest: hi,
            ..
        }) => Err(below(lo.zip(hi))),
        Err(e) => Err(CloseReason::Internal {
            detail: format!("ledger {seq} is below the ring and the backfill lake failed: {e}"),
        }),
    }
}

/// Cursor and reader slot of a session reading the lake.
#[derive(Default)]
struct Reading {
    cursor: Option<BackfillCursor>,
    reader: Option<SlotGuard>,
}

/// A reader slot, counted in `lake_backfill_sessions` while held.
struct SlotGuard {
    _reader: Reader,
    metrics: Arc<Metrics>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.metrics
            .lake
            .backfill_sessions
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// One session's reads from the backfill lake.
pub(crate) struct SessionLake {
    backfill: Arc<Backfill>,
    /// The session's client identity, whose share of the reader slots it uses.
    identity: String,
    /// The ring, to find where a gap between two of its runs ends.
    ring: Option<Arc<Ring>>,
    metrics: Arc<Metrics>,
    /// Held across a fetch: the sender asks for one catch-up ledger at a time, and resends do
    /// not take it.
    reading: tokio::sync::Mutex<Reading>,
    /// Ledgers served from the lake and their hashes, newest last, at most `keep`: resends
    /// only ask for ledgers not yet acknowledged, which the window bounds.
    served: Mutex<VecDeque<(u32, [u8; 32])>>,
    keep: usize,
}

impl SessionLake {
    /// The reader of `shared`'s backfill lake, if the relay has one, of a session of client
    /// `identity` with window `window`.
    pub(crate) fn new(shared: &Shared, identity: &str, window: u16) -> Option<Arc<SessionLake>> {
        let backfill = shared.backfill.clone()?;
        Some(Arc::new(SessionLake {
            backfill,
            identity: identity.to_owned(),
            ring: shared.ring.clone(),
            metrics: shared.metrics.clone(),
            reading: tokio::sync::Mutex::new(Reading::default()),
            served: Mutex::new(VecDeque::new()),
            keep: usize::from(window).max(8) * 2,
        }))
    }

    fn served(&self) -> std::sync::MutexGuard<'_, VecDeque<(u32, [u8; 32])>> {
        self.served.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn served_hash(&self, seq: u32) -> Option<[u8; 32]> {
        self.served()
            .iter()
            .rev()
            .find(|(s, _)| *s == seq)
            .map(|(_, h)| *h)
    }

    /// Ledger `seq`, which memory and the ring (holding `oldest..=newest`, 0 for none) do not
    /// hold, from the lake.
    async fn load(&self, seq: u32, oldest: u32, newest: u32) -> LoadResult {
        let last = self.served().back().map(|(s, _)| *s);
        if last.is_some_and(|l| seq <= l) {
            // Served before (a resend): read again alone, leaving the cursor where it is.
            let hash = self.served_hash(seq);
            return match self.backfill.fetch_one(seq, hash).await {
                Ok(l) => {
                    Metrics::add(&self.metrics.lake.backfill_ledgers_total, 1);
                    LoadResult::Complete(l)
                }
                Err(e) => self.failure(seq, e, oldest, newest),
            };
        }
        let mut r = self.reading.lock().await;
        if r.cursor.as_ref().is_none_or(|c| c.position() != seq) {
            // The first ledger below the ring, or the ring pruned past the cursor's end.
            r.cursor = None;
            if let Err(busy) = self.take_reader(&mut r) {
                return busy;
            }
            // Up to the ledger before the ring, or, in a gap between two of the ring's runs,
            // before the next run: what the ring holds is served from it.
            let next_run = self
                .ring
                .as_ref()
                .filter(|_| oldest != 0 && seq > oldest)
                .and_then(|r| r.next_held(seq));
            let stop = match next_run {
                Some(next) => next - 1,
                None if oldest == 0 => newest,
                None => oldest - 1,
            }
            .max(seq);
            let prev = seq
                .checked_sub(1)
                .and_then(|p| self.served_hash(p).map(|h| (p, h)));
            let cursor = match prev {
                Some(prev) => self.backfill.cursor_after(seq, stop, prev).await,
                None => self.backfill.cursor(seq, stop).await,
            };
            match cursor {
                Ok(c) => r.cursor = Some(c),
                Err(e) => {
                    *r = Reading::default();
                    return self.failure(seq, e, oldest, newest);
                }
            }
        }
        let fetched = match r.cursor.as_mut() {
            Some(cursor) => cursor.fetch(seq).await,
            // Set above.
            None => Ok(None),
        };
        match fetched {
            Ok(Some(l)) => {
                Metrics::add(&self.metrics.lake.backfill_ledgers_total, 1);
                let mut served = self.served();
                served.push_back((seq, l.end.header_hash));
                while served.len() > self.keep {
                    served.pop_front();
                }
                LoadResult::Complete(l)
            }
            // `seq` is within the cursor's range (its stop is at least `seq`): not reached.
            Ok(None) => LoadResult::Failed {
                detail: format!("backfill cursor ended before ledger {seq}"),
            },
            Err(e) => {
                // Start again at the same ledger next time (or never: the session ends).
                *r = Reading::default();
                self.failure(seq, e, oldest, newest)
            }
        }
    }

    /// Takes a reader slot for the session if it holds none; `Unavailable` when there is
    /// none for it (all taken, or its identity's share).
    fn take_reader(&self, r: &mut Reading) -> Result<(), LoadResult> {
        if r.reader.is_some() {
            return Ok(());
        }
        let reader = self.backfill.reader(&self.identity).map_err(|e| {
            Metrics::add(&self.metrics.lake.backfill_busy_total, 1);
            LoadResult::Unavailable {
                detail: e.to_string(),
            }
        })?;
        Metrics::add(&self.metrics.lake.backfill_sessions, 1);
        r.reader = Some(SlotGuard {
            _reader: reader,
            metrics: self.metrics.clone(),
        });
        Ok(())
    }

    /// What memory and the ring gave for `seq`, completed by the lake: a ledger they do not
    /// hold is read from it, and one they gave right after the lake's last must link to it.
    pub(crate) async fn after_held(&self, seq: u32, held: LoadResult) -> LoadResult {
        match held {
            LoadResult::NotHeld { oldest, newest, .. } => self.load(seq, oldest, newest).await,
            LoadResult::Complete(l) => match self.left_lake(seq, &l.end).await {
                Ok(()) => LoadResult::Complete(l),
                Err(e) => e,
            },
            other => other,
        }
    }

    /// Ledger `seq` came from memory or the ring: if the lake served the ledger before it,
    /// `end` must link to that one. Either way the session has left the lake: its cursor and
    /// reader slot go.
    async fn left_lake(&self, seq: u32, end: &LedgerEnd) -> Result<(), LoadResult> {
        let Some(last) = self.served().back().copied() else {
            return Ok(());
        };
        if last.0.wrapping_add(1) != seq {
            return Ok(());
        }
        *self.reading.lock().await = Reading::default();
        verify_link(last, end).map_err(|e| {
            self.backfill.stats().count(&e);
            LoadResult::Corrupt {
                detail: format!("the ring does not continue the backfill lake: {e}"),
            }
        })
    }

    /// What the sender is told of a lake error for ledger `seq`.
    fn failure(&self, seq: u32, e: LakeError, oldest: u32, newest: u32) -> LoadResult {
        tracing::warn!(seq, error = %e, "backfill lake");
        match e {
            LakeError::Lacks {
                oldest: lo,
                newest: hi,
                ..
            } => LoadResult::NotHeld {
                oldest,
                newest,
                lake: lo.zip(hi),
            },
            e if e.is_transient() => LoadResult::Failed {
                detail: format!("backfill lake: {e}"),
            },
            e => LoadResult::Corrupt {
                detail: format!("backfill lake: {e}"),
            },
        }
    }
}
