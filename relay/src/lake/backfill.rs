//! `--backfill URL`: history below the ring, from a SEP-54 lake, in the relay's chunked form.
//!
//! This is the lake side of what a session does when the sender asks for a ledger the ring and
//! memory no longer hold (`session::backfill` is the session side):
//!
//! 1. [`Backfill::range`]: the oldest and newest ledger the lake holds (cached for a few
//!    seconds), to decide whether a start the ring lacks can be served at all; when it cannot,
//!    the "too far behind" error carries the lake's range beside the ring's.
//! 2. [`Backfill::reader`]: one of the relay's `--backfill-sessions` reader slots, held while a
//!    session reads the lake, so that the relay's backfill memory is that many cursors' bound;
//!    one client identity holds at most `--backfill-sessions-per-identity` of them, so that its
//!    slow sessions cannot keep every other identity out of the lake.
//! 3. [`Backfill::cursor`]`(start, stop)`: a [`BackfillCursor`] over `start..=stop`, `stop`
//!    being the ledger before the oldest the ring (or memory) holds
//!    ([`Backfill::cursor_after`] goes on from a previous cursor's last ledger, chain kept, if
//!    the ring pruned further meanwhile).
//! 4. [`BackfillCursor::fetch`]`(seq)`, in order: the ledger `seq` as an
//!    `Arc<`[`CompleteLedger`]`>`, cut and compressed exactly as the live pipeline does
//!    ([`crate::pipeline::complete_ledger`]), ready to queue like a ledger read from the ring.
//!    Every ledger was checked (its batch decoded whole, its header hash, its sequence) and
//!    chains to the one fetched before it; a ledger the lake does not hold is
//!    [`LakeError::Lacks`] with the range it does hold. [`Backfill::fetch_one`] reads one
//!    ledger again (a resend), checked against the hash it had when first served.
//! 5. [`BackfillCursor::verify_join`] with the first ledger taken from the ring after the
//!    lake: the ring's ledger must link to the last one the lake gave, so the subscription
//!    crosses from lake to ring with no gap, no duplicate and no splice of two histories.
//!
//! Prefetch runs ahead by [`PrefetchOptions::depth`] batches, in parallel; see
//! `ledger_relay_lake::cursor` for the memory bound of one cursor.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ledger_relay_lake::{
    BatchLedger, Lake, LakeCursor, LakeError, LakeOptions, LakeStats, LakeUrl, PrefetchOptions,
};
use ledger_relay_wire::compress::Compressor;
use ledger_relay_wire::frame::LedgerEnd;
use ledger_relay_wire::header::ChainVerifier;
use tokio::sync::{OnceCell, OwnedSemaphorePermit, Semaphore};

use crate::defaults::DEFAULTS;
use crate::hub::CompleteLedger;
use crate::pipeline::{complete_ledger, PipelineConfig};
use crate::source::now_ns;

/// What `--backfill` was told.
#[derive(Debug, Clone)]
pub struct BackfillConfig {
    /// The lake.
    pub url: LakeUrl,
    /// The network passphrase the lake's manifest must name (`None`: not checked).
    pub network: Option<String>,
    /// How far each cursor reads ahead.
    pub prefetch: PrefetchOptions,
    /// Store client settings.
    pub options: LakeOptions,
    /// Sessions that may read the lake at once (`--backfill-sessions`, at least 1); each holds
    /// one cursor, so the relay's backfill memory is this many times a cursor's bound.
    pub sessions: usize,
    /// Of those, sessions of one client identity at once
    /// (`--backfill-sessions-per-identity`, at least 1).
    pub sessions_per_identity: usize,
}

/// Sessions of one identity reading the lake at once without
/// `--backfill-sessions-per-identity`, of `sessions` reader slots: half of them, rounded up,
/// so that one identity's slow sessions leave the other half to the rest (all of them when
/// there is one).
pub fn default_per_identity(sessions: usize) -> usize {
    sessions.div_ceil(2).max(1)
}

impl BackfillConfig {
    /// The defaults for `url`.
    pub fn new(url: LakeUrl, network: Option<String>) -> BackfillConfig {
        BackfillConfig {
            url,
            network,
            prefetch: PrefetchOptions {
                depth: DEFAULTS.backfill_prefetch,
                ..PrefetchOptions::default()
            },
            options: LakeOptions::default(),
            sessions: DEFAULTS.backfill_sessions,
            sessions_per_identity: default_per_identity(DEFAULTS.backfill_sessions),
        }
    }
}

/// How long [`Backfill::range`] trusts its last listing.
const RANGE_TTL: Duration = Duration::from_secs(5);

/// When the lake's range was last listed, and what it was.
type Listed = Option<(Instant, Option<(u32, u32)>)>;

/// The relay's backfill lake, shared by every session. The lake is opened on first use (a
/// relay starts even when its lake is unreachable); a failed open is tried again on the next
/// use.
#[derive(Debug)]
pub struct Backfill {
    cfg: BackfillConfig,
    pipeline: PipelineConfig,
    stats: Arc<LakeStats>,
    lake: OnceCell<Arc<Lake>>,
    range: Mutex<Listed>,
    readers: Arc<Semaphore>,
    /// Reader slots held, by client identity.
    held: Arc<Mutex<HashMap<String, usize>>>,
}

/// A reader slot of the backfill lake ([`Backfill::reader`]); dropping it frees the slot.
#[derive(Debug)]
pub struct Reader {
    _permit: OwnedSemaphorePermit,
    held: Arc<Mutex<HashMap<String, usize>>>,
    identity: String,
}

impl Drop for Reader {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.identity) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.identity);
            }
        }
    }
}

/// Why [`Backfill::reader`] gave no slot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoReader {
    /// `--backfill-sessions` sessions hold one.
    #[error("every backfill reader slot is taken")]
    AllTaken,
    /// The identity's sessions hold its share (`--backfill-sessions-per-identity`).
    #[error("identity {identity} holds its {share} backfill reader slots")]
    IdentityShare {
        /// The client identity.
        identity: String,
        /// Its share.
        share: usize,
    },
}

impl Backfill {
    /// A backfill from `cfg`'s lake, chunking as `pipeline` says, counting into `stats`.
    pub fn new(cfg: BackfillConfig, pipeline: &PipelineConfig, stats: Arc<LakeStats>) -> Backfill {
        let mut pipeline = pipeline.clone();
        pipeline.export = None;
        Backfill {
            readers: Arc::new(Semaphore::new(cfg.sessions.max(1))),
            cfg,
            pipeline,
            stats,
            lake: OnceCell::new(),
            range: Mutex::new(None),
            held: Arc::default(),
        }
    }

    /// The lake's counters.
    pub fn stats(&self) -> &Arc<LakeStats> {
        &self.stats
    }

    /// How far each cursor reads ahead.
    pub fn prefetch(&self) -> PrefetchOptions {
        self.cfg.prefetch
    }

    /// A reader slot for a session of client `identity`, unless `--backfill-sessions`
    /// sessions hold one, or `--backfill-sessions-per-identity` sessions of `identity` do.
    pub fn reader(&self, identity: &str) -> Result<Reader, NoReader> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let share = self.cfg.sessions_per_identity.max(1);
        if held.get(identity).is_some_and(|n| *n >= share) {
            return Err(NoReader::IdentityShare {
                identity: identity.to_owned(),
                share,
            });
        }
        let permit = self
            .readers
            .clone()
            .try_acquire_owned()
            .map_err(|_| NoReader::AllTaken)?;
        *held.entry(identity.to_owned()).or_default() += 1;
        Ok(Reader {
            _permit: permit,
            held: self.held.clone(),
            identity: identity.to_owned(),
        })
    }

    /// Ledger `seq` alone, read again (for a resend) and chunked; `hash` is the header hash it
    /// had when a cursor first served it, which it must still have.
    pub async fn fetch_one(
        &self,
        seq: u32,
        hash: Option<[u8; 32]>,
    ) -> Result<Arc<CompleteLedger>, LakeError> {
        let lake = self.lake().await?;
        let key = lake.key(seq);
        let batch = lake.read_batch(seq).await?;
        let Some(ledger) = batch.ledgers.into_iter().find(|l| l.info.ledger_seq == seq) else {
            let e = LakeError::Missing { key };
            self.stats.count(&e);
            return Err(e);
        };
        if hash.is_some_and(|h| h != ledger.info.hash) {
            let e = LakeError::Corrupt {
                key,
                reason: format!("ledger {seq} is not the one served from it before"),
            };
            self.stats.count(&e);
            return Err(e);
        }
        chunk(&self.pipeline, ledger, key).await
    }

    /// The lake, opened on first use.
    pub async fn lake(&self) -> Result<Arc<Lake>, LakeError> {
        self.lake
            .get_or_try_init(|| async {
                Lake::open(
                    &self.cfg.url,
                    &self.cfg.options,
                    self.cfg.network.as_deref(),
                    self.stats.clone(),
                )
                .await
                .map(Arc::new)
            })
            .await
            .cloned()
    }

    /// Oldest and newest ledger the lake holds (`None`: it holds none), listed at most every
    /// few seconds.
    pub async fn range(&self) -> Result<Option<(u32, u32)>, LakeError> {
        if let Some((at, r)) = *self.range.lock().unwrap_or_else(|e| e.into_inner()) {
            if at.elapsed() < RANGE_TTL {
                return Ok(r);
            }
        }
        let r = self.lake().await?.range().await?;
        *self.range.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), r));
        Ok(r)
    }

    /// Whether the lake holds `seq`, and if not, the error to give (with the lake's range).
    pub async fn check(&self, seq: u32) -> Result<(), LakeError> {
        match self.range().await? {
            Some((oldest, newest)) if (oldest..=newest).contains(&seq) => Ok(()),
            r => {
                let e = LakeError::Lacks {
                    seq,
                    oldest: r.map(|r| r.0),
                    newest: r.map(|r| r.1),
                };
                self.stats.count(&e);
                Err(e)
            }
        }
    }

    /// A cursor over `start..=stop`. Fetching begins at once, in the background.
    pub async fn cursor(&self, start: u32, stop: u32) -> Result<BackfillCursor, LakeError> {
        self.cursor_from(start, stop, None).await
    }

    /// A cursor over `start..=stop` whose first ledger must link to `prev` (ledger
    /// `start - 1` and its hash): to go on after a cursor that reached its `stop` while the
    /// ring pruned further (pass [`BackfillCursor::last`]), or from a ledger the subscriber
    /// holds.
    pub async fn cursor_after(
        &self,
        start: u32,
        stop: u32,
        prev: (u32, [u8; 32]),
    ) -> Result<BackfillCursor, LakeError> {
        self.cursor_from(start, stop, Some(prev)).await
    }

    async fn cursor_from(
        &self,
        start: u32,
        stop: u32,
        prev: Option<(u32, [u8; 32])>,
    ) -> Result<BackfillCursor, LakeError> {
        let lake = self.lake().await?;
        let mut inner = LakeCursor::new(lake, start, stop, self.cfg.prefetch);
        if let Some((seq, hash)) = prev {
            inner = inner.after(seq, hash);
        }
        Ok(BackfillCursor {
            inner,
            pipeline: self.pipeline.clone(),
            prefetch: self.cfg.prefetch,
            stop,
        })
    }
}

/// `ledger` cut and compressed as the live pipeline does it.
async fn chunk(
    pipeline: &PipelineConfig,
    ledger: BatchLedger,
    key: String,
) -> Result<Arc<CompleteLedger>, LakeError> {
    let pipeline = pipeline.clone();
    // Compression is CPU work: off the session's task.
    let chunked = tokio::task::spawn_blocking(move || {
        let mut comp = Compressor::new(pipeline.codec, pipeline.zstd_level);
        let now = now_ns();
        complete_ledger(&ledger.raw, &ledger.info, &pipeline, &mut comp, now, now)
    })
    .await
    .map_err(|e| LakeError::Store {
        key,
        reason: format!("chunking task failed: {e}"),
    })?;
    Ok(Arc::new(chunked))
}

/// Ledgers `start..=stop` from the lake, verified, in the relay's chunked form.
#[derive(Debug)]
pub struct BackfillCursor {
    inner: LakeCursor,
    pipeline: PipelineConfig,
    prefetch: PrefetchOptions,
    stop: u32,
}

impl BackfillCursor {
    /// The next ledger [`BackfillCursor::fetch`] gives.
    pub fn position(&self) -> u32 {
        self.inner.position()
    }

    /// The last ledger fetched and its hash.
    pub fn last(&self) -> Option<(u32, [u8; 32])> {
        self.inner.last()
    }

    /// Ledger `seq` in the relay's chunked form. `seq` is normally
    /// [`BackfillCursor::position`]; another value starts the cursor again there (losing the
    /// chain check against what was fetched before).
    ///
    /// `Ok(None)` once past `stop`: the ring takes over ([`BackfillCursor::verify_join`]).
    pub async fn fetch(&mut self, seq: u32) -> Result<Option<Arc<CompleteLedger>>, LakeError> {
        if seq != self.inner.position() {
            self.inner = LakeCursor::new(self.inner.lake().clone(), seq, self.stop, self.prefetch);
        }
        let Some(ledger) = self.inner.next().await? else {
            return Ok(None);
        };
        let key = self.inner.lake().key(seq);
        chunk(&self.pipeline, ledger, key).await.map(Some)
    }

    /// Checks that `ring_first`, the first ledger served from the ring after the lake, follows
    /// the last ledger the lake gave and links to it.
    pub fn verify_join(&self, ring_first: &LedgerEnd) -> Result<(), LakeError> {
        match self.inner.last() {
            Some(last) => verify_link(last, ring_first),
            None => Ok(()),
        }
    }
}

/// Checks that `next`, served from the ring, follows ledger `last` (its sequence and hash,
/// served from the lake) and links to it.
pub fn verify_link(last: (u32, [u8; 32]), next: &LedgerEnd) -> Result<(), LakeError> {
    let (seq, hash) = last;
    ChainVerifier::after(seq, hash)
        .check_link(next.into())
        .map_err(|_| LakeError::broken_chain("ring".into(), seq, &hash, &next.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backfill(sessions: usize, per_identity: usize) -> Backfill {
        let url = "file:///nonexistent-lake".parse().unwrap();
        let mut cfg = BackfillConfig::new(url, None);
        cfg.sessions = sessions;
        cfg.sessions_per_identity = per_identity;
        Backfill::new(cfg, &PipelineConfig::default(), Arc::default())
    }

    #[test]
    fn one_identity_holds_at_most_its_share_of_the_reader_slots() {
        let b = backfill(4, 2);
        let a1 = b.reader("rpc-1").unwrap();
        let _a2 = b.reader("rpc-1").unwrap();
        assert!(matches!(
            b.reader("rpc-1"),
            Err(NoReader::IdentityShare { share: 2, .. })
        ));
        let _b1 = b.reader("rpc-2").unwrap();
        let _b2 = b.reader("rpc-2").unwrap();
        assert_eq!(b.reader("rpc-3").unwrap_err(), NoReader::AllTaken);
        drop(a1);
        assert!(matches!(
            b.reader("rpc-2"),
            Err(NoReader::IdentityShare { .. })
        ));
        let _c = b.reader("rpc-3").unwrap();
        assert_eq!(b.held.lock().unwrap().get("rpc-1"), Some(&1));
    }

    #[test]
    fn a_slot_given_back_is_no_longer_counted_against_its_identity() {
        let b = backfill(2, 1);
        let a = b.reader("rpc-1").unwrap();
        assert!(b.reader("rpc-1").is_err());
        drop(a);
        assert!(b.held.lock().unwrap().is_empty());
        let _a = b.reader("rpc-1").unwrap();
    }

    #[test]
    fn by_default_one_identity_holds_half_the_slots() {
        assert_eq!(default_per_identity(1), 1);
        assert_eq!(default_per_identity(4), 2);
        assert_eq!(default_per_identity(5), 3);
        assert_eq!(
            BackfillConfig::new("file:///l".parse().unwrap(), None).sessions_per_identity,
            2
        );
    }
}
