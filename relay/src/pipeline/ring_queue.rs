//! The ring writer and its queue: complete ledgers on their way to the retention ring.
//!
//! The publisher hands every complete ledger to [`RingQueue::push`], which never waits: a slow
//! or failing disk delays neither the source nor the live stream. The queue is bounded in bytes
//! ([`PipelineConfig::ring_queue_bytes`]); the hub keeps every queued ledger in memory until
//! the writer has dealt with it ([`Hub::persisted`]), so a queued ledger stays reachable to
//! sessions and the queue's bound is also the bound on the hub's unwritten ledgers.
//!
//! The writer takes the oldest queued ledger and appends it. A write that fails because the
//! store failed (disk full or read-only) leaves the ledger at the head of the queue and the
//! writer tries again at most every [`REOPEN_EVERY`] (the ring reopens its store meanwhile), so
//! once the disk is back the ledgers that failed are written in order and the ring's run goes
//! on without a gap: a disk error costs no retention. Only when the queue is full does the
//! publisher give up its oldest ledger for the ring (counted in
//! `ledger_relay_ring_given_up_total`); the next ledger written then does not continue the
//! ring, which starts a new run after the gap and keeps the older ones (see [`crate::ring`]).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use tracing::{error, info, warn};

use crate::health::{self, Reason};
use crate::hub::{stored_chunks, CompleteLedger, Hub};
use crate::metrics::Metrics;
use crate::ring::{Ring, RingError, REOPEN_EVERY};

use super::update_ring_metrics;

/// Default bound on the bytes waiting for the ring: 512 MiB, over a hundred Phase 3 ledgers
/// compressed, or minutes of the public network.
pub const DEFAULT_RING_QUEUE_BYTES: u64 = 512 << 20;

/// Payload bytes of a ledger, as the queue counts them.
fn size(l: &CompleteLedger) -> u64 {
    l.chunks.iter().map(|c| c.payload.len() as u64).sum()
}

/// A queued ledger: the next of the run, or (`repair`) a held ledger whose stored copy failed
/// verification, emitted again by the source, to write over it ([`Ring::repair`]).
#[derive(Clone)]
struct Entry {
    ledger: Arc<CompleteLedger>,
    repair: bool,
}

#[derive(Default)]
struct Queue {
    ledgers: VecDeque<Entry>,
    bytes: u64,
    closed: bool,
}

/// Ledgers waiting for the ring writer. See the module doc.
pub(super) struct RingQueue {
    queue: Mutex<Queue>,
    wake: Condvar,
    cap_bytes: u64,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
}

impl RingQueue {
    pub(super) fn new(cap_bytes: u64, hub: Arc<Hub>, metrics: Arc<Metrics>) -> RingQueue {
        RingQueue {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            cap_bytes: cap_bytes.max(1),
            hub,
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a complete ledger; never waits. Beyond the bound the oldest queued ledgers are
    /// given up (the newest is always kept).
    pub(super) fn push(&self, ledger: Arc<CompleteLedger>, repair: bool) {
        let mut given_up = Vec::new();
        {
            let mut q = self.lock();
            q.bytes += size(&ledger);
            q.ledgers.push_back(Entry { ledger, repair });
            while q.bytes > self.cap_bytes && q.ledgers.len() > 1 {
                let Some(old) = q.ledgers.pop_front() else {
                    break;
                };
                q.bytes -= size(&old.ledger);
                if !old.repair {
                    given_up.push(old.ledger.end.seq);
                }
            }
            self.gauges(&q);
        }
        self.wake.notify_one();
        for seq in given_up {
            Metrics::add(&self.metrics.ring_given_up_total, 1);
            warn!(
                seq,
                "ring queue full: ledger given up for the ring, which starts a new run after it"
            );
            self.hub.persisted(seq);
        }
    }

    /// No more ledgers will come: the writer finishes what is queued (one attempt each while
    /// the store fails) and returns.
    pub(super) fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_all();
    }

    fn gauges(&self, q: &Queue) {
        Metrics::set(&self.metrics.ring_queue_ledgers, q.ledgers.len() as u64);
        Metrics::set(&self.metrics.ring_queue_bytes, q.bytes);
    }

    /// The oldest queued ledger, waiting for one (`None`: closed and empty). `retry`: the last
    /// attempt failed, so wait [`REOPEN_EVERY`] first (unless closed).
    fn head(&self, retry: bool) -> Option<Entry> {
        let mut q = self.lock();
        if retry && !q.closed {
            q = self
                .wake
                .wait_timeout_while(q, REOPEN_EVERY, |q| !q.closed)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        loop {
            if let Some(l) = q.ledgers.front() {
                return Some(l.clone());
            }
            if q.closed {
                return None;
            }
            q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Removes `ledger` from the head, unless the publisher gave it up meanwhile.
    fn done(&self, ledger: &Arc<CompleteLedger>) {
        let mut q = self.lock();
        if q.ledgers
            .front()
            .is_some_and(|e| Arc::ptr_eq(&e.ledger, ledger))
        {
            q.ledgers.pop_front();
            q.bytes -= size(ledger);
        }
        self.gauges(&q);
    }

    /// Drops every queued ledger (shutdown while the store fails), telling the hub.
    fn abandon(&self) -> usize {
        let mut q = self.lock();
        let n = q.ledgers.len();
        if let Some(last) = q.ledgers.iter().rfind(|e| !e.repair) {
            self.hub.persisted(last.ledger.end.seq);
        }
        q.ledgers.clear();
        q.bytes = 0;
        self.gauges(&q);
        n
    }
}

/// Whether an append failed because of the store (retried) rather than the ledger.
fn store_failed(e: &RingError) -> bool {
    matches!(
        e,
        RingError::Sled(_) | RingError::Io { .. } | RingError::Unavailable
    )
}

/// Appends one ledger: a new run when it does not continue the ring (beside the old runs
/// after a gap, else in an emptied ring). A ledger the ring already
/// holds as its newest (the write reported a failure, yet reached the disk, as the store
/// reopened finds) is done.
fn write(ring: &Ring, ledger: &CompleteLedger, metrics: &Metrics) -> Result<(), RingError> {
    let held = || ring.newest() == Some((ledger.end.seq, ledger.end.header_hash));
    if held() {
        return Ok(());
    }
    let chunks = stored_chunks(ledger);
    let mut r = ring.append(&ledger.end, &chunks);
    if matches!(r, Err(RingError::Discontinuity { .. })) && held() {
        return Ok(());
    }
    if let Err(RingError::Discontinuity { newest, seq, .. }) = r {
        // Ledgers passed that the ring never got (the relay was away while its source went
        // on, or the queue gave them up): a new run beside the old ones, if the ring agrees
        // that this is a gap.
        r = ring.append_after_gap(&ledger.end, &chunks);
        if r.is_ok() {
            Metrics::add(&metrics.ring_gaps_total, 1);
            warn!(
                newest,
                seq, "ring does not hold the ledgers before this one: started a new run, the older runs are kept"
            );
        } else if matches!(r, Err(RingError::Discontinuity { .. })) {
            // The source went back or is on another chain: what the ring holds cannot stand
            // beside it (a ring never splices two runs), so the ring starts over.
            warn!(
                newest,
                seq, "ring does not continue into this ledger: emptying it for a new run"
            );
            r = ring.reset().and_then(|()| {
                Metrics::add(&metrics.ring_resets_total, 1);
                ring.append(&ledger.end, &chunks)
            });
        }
    }
    r
}

/// The writer thread: appends queued ledgers in order until the queue is closed and empty.
pub(super) fn ring_writer(queue: Arc<RingQueue>, ring: Arc<Ring>) {
    let (hub, metrics) = (queue.hub.clone(), queue.metrics.clone());
    let mut retry = false;
    while let Some(Entry { ledger, repair }) = queue.head(retry) {
        let r = if repair {
            let r = ring.repair(&ledger.end, &stored_chunks(&ledger));
            if r.is_ok() {
                Metrics::add(&metrics.ring_repaired_total, 1);
                metrics.health.clear(health::RING_CORRUPT);
            }
            if let Err(e) = &r {
                if !store_failed(e) {
                    warn!(seq = ledger.end.seq, error = %e, "damaged ledger not written again");
                    queue.done(&ledger);
                    continue;
                }
            }
            r
        } else {
            write(&ring, &ledger, &metrics)
        };
        retry = false;
        match r {
            // The health condition changes before the flag, so that whoever sees the flag
            // change finds /healthz already saying the same (this thread is the only writer).
            Ok(()) => {
                if metrics.ring_degraded.load(Ordering::Relaxed) {
                    metrics.health.clear(health::RING);
                    metrics.ring_degraded.store(false, Ordering::Relaxed);
                    info!(
                        seq = ledger.end.seq,
                        "ring writes succeed again: writing the ledgers that waited"
                    );
                }
            }
            Err(e) => {
                Metrics::add(&metrics.ring_write_errors_total, 1);
                metrics.health.raise(
                    health::RING,
                    Reason::RingDegraded {
                        error: e.to_string(),
                    },
                );
                if !metrics.ring_degraded.swap(true, Ordering::Relaxed) {
                    error!(error = %e, seq = ledger.end.seq, "ring write failed: ring degraded, live streaming continues, ledgers wait for the ring in memory");
                }
                if store_failed(&e) {
                    // Kept at the head, tried again once the store may be back. At shutdown,
                    // one more attempt each: then what is left is dropped.
                    if queue.lock().closed {
                        let n = queue.abandon();
                        warn!(
                            dropped = n,
                            "stopping with the ring degraded: ledgers not written"
                        );
                        break;
                    }
                    retry = true;
                    update_ring_metrics(&ring, &metrics);
                    continue;
                }
                // The ledger itself is refused (malformed): it never will be written.
            }
        }
        queue.done(&ledger);
        if !repair {
            hub.persisted(ledger.end.seq);
        }
        update_ring_metrics(&ring, &metrics);
    }
}
