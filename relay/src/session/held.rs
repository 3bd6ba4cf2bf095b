//! What the relay holds for a session and how a session gets it: the range it can serve, the
//! first ledger of a session, and loading a ledger from memory, the ring or the lake.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use ledger_relay_wire::compress::Compressor;
use ledger_relay_wire::frame::Start;
use ledger_relay_wire::sender::{CloseReason, LoadResult};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::backfill::{self, SessionLake};
use crate::health::{self, Reason};
use crate::hub::{stored_chunks, stored_ledger, CompleteLedger, Hub};
use crate::lake::backfill::Backfill;
use crate::metrics::Metrics;
use crate::pipeline::{complete_ledger, PipelineConfig};
use crate::ring::{Ring, RingError};
use crate::source::Refetch;

/// Shared relay state a session reads.
#[derive(Clone)]
pub struct Shared {
    /// Live state.
    pub hub: Arc<Hub>,
    /// The ring, if the relay keeps one.
    pub ring: Option<Arc<Ring>>,
    /// The lake below the ring (`--backfill`), if any.
    pub backfill: Option<Arc<Backfill>>,
    /// Where a damaged ring ledger can be fetched again besides the lake (the upstream relays
    /// of a `relay:` source), if anywhere.
    pub refetch: Option<Refetch>,
    /// How ledgers are chunked (for a ledger fetched again).
    pub pipeline: PipelineConfig,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Ledgers read back from the ring that some session still holds, so that sessions
    /// catching up together share one read, one check and one copy.
    pub ring_reads: Arc<RingReads>,
}

/// Ledgers recently read back from the ring, by sequence, held weakly: an entry lives only as
/// long as a session holds the ledger, so this keeps no ledger in memory by itself, and it
/// never has more than [`RingReads::MAX`] entries.
///
/// Without it, N sessions catching up over the same ledgers (subscribers resuming together
/// after a relay restart, say) made N reads of each ledger file, N copies and N checks.
#[derive(Debug, Default)]
pub struct RingReads(
    std::sync::Mutex<std::collections::BTreeMap<u32, (u64, Weak<CompleteLedger>)>>,
);

impl RingReads {
    /// Most entries kept (dead ones are dropped first, then the oldest sequences).
    pub const MAX: usize = 256;

    /// Ledger `seq` of the ring's `epoch` if a session still holds it from an earlier read.
    pub fn get(&self, epoch: u64, seq: u32) -> Option<Arc<CompleteLedger>> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&seq)
            .filter(|(e, _)| *e == epoch)
            .and_then(|(_, w)| w.upgrade())
    }

    /// Records `ledger`, just read from the ring in `epoch`, for the sessions after this one.
    pub fn insert(&self, epoch: u64, ledger: &Arc<CompleteLedger>) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= Self::MAX {
            map.retain(|_, (_, w)| w.strong_count() > 0);
        }
        while map.len() >= Self::MAX {
            map.pop_first();
        }
        map.insert(ledger.end.seq, (epoch, Arc::downgrade(ledger)));
    }

    /// Entries, dead or alive.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Oldest and newest ledger the relay can serve now.
pub fn held_range(shared: &Shared) -> (u32, u32) {
    let tip = shared.hub.tip();
    let ring = shared.ring.as_ref().and_then(|r| r.range());
    let oldest = match (ring.map(|r| r.0), shared.hub.oldest_recent()) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => 0,
    };
    let newest = tip.newest.max(ring.map_or(0, |r| r.1));
    (oldest, newest)
}

/// Whether the ring's store failed and is not written yet: what it holds then says nothing
/// about what the relay will hold once the disk is back (the ledgers that failed to write wait
/// in memory), so no session is told that its ledger is below retention meanwhile.
pub fn ring_degraded(shared: &Shared) -> bool {
    shared.ring.is_some() && shared.metrics.ring_degraded.load(Ordering::Relaxed)
}

/// A below-retention answer while the ring is degraded becomes a retryable one: the session
/// is refused as overloaded (the subscriber retries or fails over), never told to give up.
fn unless_degraded(shared: &Shared, r: Result<(), CloseReason>) -> Result<(), CloseReason> {
    match r {
        Err(CloseReason::BelowRetention { seq, .. }) if ring_degraded(shared) => {
            Err(CloseReason::Overloaded {
                detail: format!(
                    "ledger {seq} cannot be served while the ring's store is degraded; try again"
                ),
            })
        }
        r => r,
    }
}

/// How often a session waiting for its start looks at the ring as well as the hub's tip (the
/// ring can hold a newer ledger than the hub after a restart).
const START_POLL: Duration = Duration::from_millis(100);

/// Decides the first ledger to send for `start`. A start the relay has not reached (beyond
/// the ledger after the newest it holds, or the tip while it holds nothing) waits for it, at
/// most `wait`: a session must not hold its slot for a ledger that may never come. `Err` says
/// why the session cannot start: a start below the ring only when the backfill lake lacks it
/// too.
pub async fn resolve_start(
    shared: &Shared,
    start: Start,
    cancel: &CancellationToken,
    wait: Option<Duration>,
) -> Result<u32, CloseReason> {
    let mut tip = shared.hub.watch_tip();
    let deadline = wait.map(|w| tokio::time::Instant::now() + w);
    loop {
        let t = *tip.borrow_and_update();
        let (oldest, newest) = held_range(shared);
        match start {
            Start::Seq(seq) => {
                if oldest != 0 && seq < oldest {
                    // Below the ring: served from the backfill lake if it holds the start.
                    let r = backfill::start_below(shared, seq, oldest, newest).await;
                    unless_degraded(shared, r)?;
                    return Ok(seq);
                }
                if oldest == 0 && newest != 0 && seq <= newest {
                    // Nothing retained (no ring) but the relay has moved past the start.
                    let r = backfill::start_below(shared, seq, newest, newest).await;
                    unless_degraded(shared, r)?;
                    return Ok(seq);
                }
                // Held, the next ledger, or the one being published: served without delay.
                if (newest != 0 && seq <= newest.saturating_add(1))
                    || (t.current != 0 && seq <= t.current)
                {
                    return Ok(seq);
                }
            }
            Start::Tip => {
                if t.newest != 0 {
                    return Ok(t.newest);
                }
                if t.current != 0 {
                    return Ok(t.current);
                }
                if newest != 0 {
                    return Ok(newest);
                }
            }
        }
        tokio::select! {
            r = tip.changed() => if r.is_err() {
                return Err(CloseReason::ShuttingDown);
            },
            _ = tokio::time::sleep(START_POLL) => {}
            _ = cancel.cancelled() => return Err(CloseReason::ShuttingDown),
            _ = sleep_until_opt(deadline) => return Err(match start {
                Start::Seq(seq) => CloseReason::StartAhead { seq, newest },
                Start::Tip => CloseReason::Overloaded {
                    detail: "the relay has no ledger yet".into(),
                },
            }),
        }
    }
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Loads ledger `seq` for the sender: from memory, else from the ring on a blocking thread,
/// else (below both) from the backfill lake; the ledger in progress as its chunks so far; or
/// why it cannot be had.
///
/// While the ring is degraded a ledger that is not held is `Unavailable` (asked again
/// shortly), never `NotHeld`: see [`ring_degraded`].
pub(super) async fn load(shared: &Shared, lake: Option<&SessionLake>, seq: u32) -> LoadResult {
    let r = match (lake, load_held(shared, seq).await) {
        (Some(lake), r) => lake.after_held(seq, r).await,
        (None, r) => r,
    };
    match r {
        LoadResult::NotHeld { .. } if ring_degraded(shared) => LoadResult::Unavailable {
            detail: format!("ledger {seq}: the ring's store is degraded"),
        },
        r => r,
    }
}

/// A ledger in the ring failed verification on read (by a session or the scrub): counted
/// (`ledger_relay_ring_corrupt_total`), reported in `/healthz` (`ring_corrupt`), and, when the
/// relay has a backfill lake that holds the ledger the ring recorded (the same header hash), or
/// upstream relays it reads from (a `relay:` source), fetched from there and written over the
/// damaged copy. Otherwise the session is told it is corrupt (`Error Internal`, which the
/// subscriber retries and fails over on).
pub(crate) async fn damaged(
    shared: &Shared,
    ring: Option<Arc<Ring>>,
    seq: u32,
    detail: String,
) -> LoadResult {
    Metrics::add(&shared.metrics.ring_corrupt_total, 1);
    let count = shared.metrics.ring_corrupt_total.load(Ordering::Relaxed);
    warn!(seq, %detail, "stored ledger failed verification: not served from the ring");
    shared.metrics.health.raise(
        health::RING_CORRUPT,
        Reason::RingCorrupt {
            seq,
            count,
            detail: detail.clone(),
        },
    );
    let Some(ring) = ring else {
        return LoadResult::Corrupt { detail };
    };
    if shared.backfill.is_none() && shared.refetch.is_none() {
        return LoadResult::Corrupt { detail };
    }
    let r = ring.clone();
    let hash = match tokio::task::spawn_blocking(move || r.stored_hash(seq)).await {
        Ok(Ok(Some(h))) => h,
        _ => return LoadResult::Corrupt { detail },
    };
    let mut found = None;
    if let Some(backfill) = shared.backfill.as_ref() {
        match backfill.fetch_one(seq, Some(hash)).await {
            Ok(l) => found = Some((l, "the backfill lake")),
            Err(e) => warn!(seq, error = %e, "the backfill lake cannot replace the damaged ledger"),
        }
    }
    if let (None, Some(refetch)) = (&found, shared.refetch.as_ref()) {
        match from_upstream(&shared.pipeline, refetch, seq, hash).await {
            Ok(l) => found = Some((l, "an upstream relay")),
            Err(e) => warn!(seq, error = %e, "no upstream relay can replace the damaged ledger"),
        }
    }
    let Some((ledger, from)) = found else {
        return LoadResult::Corrupt { detail };
    };
    let l = ledger.clone();
    let repaired =
        tokio::task::spawn_blocking(move || ring.repair(&l.end, &stored_chunks(&l))).await;
    match repaired {
        Ok(Ok(())) => {
            Metrics::add(&shared.metrics.ring_repaired_total, 1);
            info!(seq, from, "damaged ledger replaced");
            shared.metrics.health.clear(health::RING_CORRUPT);
        }
        Ok(Err(e)) => warn!(seq, error = %e, "damaged ledger not written again"),
        Err(e) => warn!(seq, error = %e, "damaged ledger not written again"),
    }
    LoadResult::Complete(ledger)
}

/// Ledger `seq` fetched again from the upstream relays, checked to be the one the ring
/// recorded (`hash`), and chunked as the pipeline chunks.
async fn from_upstream(
    pipeline: &PipelineConfig,
    refetch: &Refetch,
    seq: u32,
    hash: [u8; 32],
) -> Result<Arc<CompleteLedger>, String> {
    let raw = (refetch.0)(seq, hash).await?;
    let pipeline = pipeline.clone();
    tokio::task::spawn_blocking(move || {
        let info = ledger_relay_wire::header::peek_header(&raw)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "the upstream's ledger is cut short".to_owned())?;
        if info.ledger_seq != seq || info.hash != hash {
            return Err(format!(
                "the upstream's ledger {} is not the one the ring recorded as {seq}",
                info.ledger_seq
            ));
        }
        let mut comp = Compressor::new(pipeline.codec, pipeline.zstd_level);
        let now = crate::source::now_ns();
        Ok(Arc::new(complete_ledger(
            &raw, &info, &pipeline, &mut comp, now, now,
        )))
    })
    .await
    .map_err(|e| format!("chunking task failed: {e}"))?
}

/// [`load`] from memory and the ring only.
async fn load_held(shared: &Shared, seq: u32) -> LoadResult {
    // A ledger moves from "in progress" to "complete in memory" to "in the ring" while this
    // looks; the hub keeps it in memory until the ring has it, so one of the looks sees it.
    // A second round covers a ledger that completed between them.
    for _ in 0..2 {
        if let Some(l) = shared.hub.recent(seq) {
            return LoadResult::Complete(l);
        }
        if let Some(ring) = shared.ring.clone() {
            if ring.holds(seq) {
                let epoch = ring.epoch();
                if let Some(l) = shared.ring_reads.get(epoch, seq) {
                    return LoadResult::Complete(l);
                }
                Metrics::add(&shared.metrics.ring_reads_total, 1);
                let got = tokio::task::spawn_blocking(move || ring.get(seq)).await;
                match got {
                    Ok(Ok(Some((end, chunks)))) => {
                        let l = Arc::new(stored_ledger(end, chunks));
                        shared.ring_reads.insert(epoch, &l);
                        return LoadResult::Complete(l);
                    }
                    // Pruned meanwhile: look again.
                    Ok(Ok(None)) => {}
                    Ok(Err(RingError::Corrupt { seq, detail })) => {
                        return damaged(shared, shared.ring.clone(), seq, detail).await;
                    }
                    Ok(Err(e)) => {
                        return LoadResult::Unavailable {
                            detail: e.to_string(),
                        }
                    }
                    Err(e) => {
                        return LoadResult::Unavailable {
                            detail: format!("ring read task: {e}"),
                        }
                    }
                }
            }
        }
        if let Some(chunks) = shared.hub.in_progress(seq) {
            return LoadResult::InProgress(chunks);
        }
        if shared.ring.is_some()
            && seq > shared.hub.persisted_through()
            && seq <= shared.hub.tip().newest
        {
            // Complete, but past the hub's bound on ledgers the ring has not written (an
            // unpaced burst from the source) and not yet in the ring: the ring writer has it
            // queued, so the session tries again shortly rather than call it below retention.
            return LoadResult::Unavailable {
                detail: format!("ledger {seq} is still queued for the ring"),
            };
        }
        let (oldest, newest) = held_range(shared);
        if seq > newest {
            return LoadResult::NotYet;
        }
        if oldest == 0 || seq < oldest {
            break;
        }
    }
    let (oldest, newest) = held_range(shared);
    let lake = None; // the caller's to fill in
    LoadResult::NotHeld {
        oldest,
        newest,
        lake,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst from the source outran the ring writer: ledgers the ring has not written yet.
    /// A session catching up gets them from memory (found by `ledger-bench lanes`: every row
    /// that read the ring ended with "ledger 15 is below the retention ...: oldest ledger held
    /// is 2, newest 97"; then, until the hub kept every unwritten ledger, they were
    /// `Unavailable` until written).
    #[tokio::test]
    async fn a_ledger_still_queued_for_the_ring_is_served_from_memory() {
        let dir = tempfile::tempdir().unwrap();
        let ring = Arc::new(Ring::open(&crate::ring::RingConfig::new(dir.path())).unwrap());
        let hub = Arc::new(Hub::new(64, 1));
        for seq in 1..=100 {
            hub.complete(crate::hub::tests::complete(seq, 1));
        }
        assert_eq!(
            hub.oldest_recent(),
            Some(1),
            "every unwritten ledger is kept"
        );
        let shared = Shared {
            hub,
            ring: Some(ring),
            backfill: None,
            refetch: None,
            pipeline: PipelineConfig::default(),
            metrics: Metrics::new(),
            ring_reads: Default::default(),
        };
        for seq in [1, 50, 100] {
            match load_held(&shared, seq).await {
                LoadResult::Complete(l) => assert_eq!(l.end.seq, seq),
                other => panic!("ledger {seq} is on its way to the ring: {other:?}"),
            }
        }
        // Once the writer has dealt with it and it is still missing, it is not held.
        shared.hub.persisted(1);
        assert!(matches!(
            load_held(&shared, 1).await,
            LoadResult::NotHeld { .. }
        ));
    }

    /// Sessions catching up over the same ring ledgers share one read of each while one of them
    /// holds it; a ledger nobody holds any more, or one of an earlier epoch, is read again.
    #[tokio::test]
    async fn sessions_catching_up_together_share_one_ring_read() {
        let dir = tempfile::tempdir().unwrap();
        let ring = Arc::new(Ring::open(&crate::ring::RingConfig::new(dir.path())).unwrap());
        for seq in 2..=4 {
            crate::ring::tests::append_small(&ring, seq);
        }
        let hub = Arc::new(Hub::new(64, 1));
        let shared = Shared {
            hub,
            ring: Some(ring.clone()),
            backfill: None,
            refetch: None,
            pipeline: PipelineConfig::default(),
            metrics: Metrics::new(),
            ring_reads: Default::default(),
        };
        let reads = || shared.metrics.ring_reads_total.load(Ordering::Relaxed);
        let get = |l: LoadResult| match l {
            LoadResult::Complete(l) => l,
            other => panic!("a ledger the ring holds: {other:?}"),
        };
        let a = get(load_held(&shared, 3).await);
        let b = get(load_held(&shared, 3).await);
        assert!(
            Arc::ptr_eq(&a, &b),
            "the second session shares the first's read"
        );
        assert_eq!(reads(), 1);
        assert_eq!(a.end.seq, 3);
        // Each chunk's bytes are the same allocation for both.
        assert_eq!(a.chunks[0].payload.as_ptr(), b.chunks[0].payload.as_ptr());
        drop((a, b));
        let c = get(load_held(&shared, 3).await);
        assert_eq!(reads(), 2, "nobody held it: read again");
        // A reset (a new run of the source) makes earlier reads stale, held or not.
        ring.reset().unwrap();
        crate::ring::tests::append_small(&ring, 3);
        let d = get(load_held(&shared, 3).await);
        assert!(
            !Arc::ptr_eq(&c, &d),
            "a new epoch's ledger 3 is read from the ring"
        );
        assert_eq!(reads(), 3);
        // Bounded, however many ledgers are held.
        let held: Vec<_> = (0..RingReads::MAX as u32 + 10)
            .map(|seq| {
                let l = crate::hub::tests::complete(seq + 10, 1);
                shared.ring_reads.insert(0, &l);
                l
            })
            .collect();
        assert_eq!(shared.ring_reads.len(), RingReads::MAX);
        assert!(
            shared.ring_reads.get(0, 10).is_none(),
            "the oldest went first"
        );
        assert!(shared
            .ring_reads
            .get(0, RingReads::MAX as u32 + 19)
            .is_some());
        drop(held);
    }

    /// While the ring's store is degraded (a disk error), a ledger that is
    /// not held is asked for again later and a start below the ring is refused as retryable:
    /// no session is told it is below retention, which would end a subscriber for good.
    #[tokio::test]
    async fn no_session_is_told_below_retention_while_the_ring_is_degraded() {
        let dir = tempfile::tempdir().unwrap();
        let ring = Arc::new(Ring::open(&crate::ring::RingConfig::new(dir.path())).unwrap());
        let hub = Arc::new(Hub::new(64, 1));
        for seq in 10..=12 {
            hub.complete(crate::hub::tests::complete(seq, 1));
        }
        hub.persisted(12);
        let shared = Shared {
            hub,
            ring: Some(ring),
            backfill: None,
            refetch: None,
            pipeline: PipelineConfig::default(),
            metrics: Metrics::new(),
            ring_reads: Default::default(),
        };
        // Healthy: ledger 5 is below what the relay holds (12, in memory).
        assert!(matches!(
            load(&shared, None, 5).await,
            LoadResult::NotHeld { .. }
        ));
        let cancel = CancellationToken::new();
        let start = resolve_start(&shared, Start::Seq(5), &cancel, None).await;
        assert!(
            matches!(start, Err(CloseReason::BelowRetention { .. })),
            "{start:?}"
        );
        // Degraded: neither.
        shared.metrics.ring_degraded.store(true, Ordering::Relaxed);
        match load(&shared, None, 5).await {
            LoadResult::Unavailable { detail } => assert!(detail.contains("degraded"), "{detail}"),
            other => panic!("ledger 5 while the ring is degraded: {other:?}"),
        }
        let start = resolve_start(&shared, Start::Seq(5), &cancel, None).await;
        match start {
            Err(reason @ CloseReason::Overloaded { .. }) => {
                assert_eq!(
                    reason.code(),
                    Some(ledger_relay_wire::frame::ErrorCode::Overloaded)
                );
            }
            other => panic!("a start below the ring while it is degraded: {other:?}"),
        }
    }
}
