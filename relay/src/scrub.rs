//! The ring's scrub: reads every stored ledger back in the background and verifies it, oldest
//! first, once when the relay starts and then every [`EVERY`], at a bounded read rate
//! (`--scrub-rate`).
//!
//! [`crate::ring::Ring::open`] verifies only the newest ledger, so damage in the middle of the
//! ring (a flipped bit on disk, a torn write sled did not catch) would otherwise stay unseen
//! until a subscriber asks for that ledger. A damaged ledger the scrub finds is handled exactly
//! as a session's read of it is: counted (`ledger_relay_ring_corrupt_total`), reported in
//! `/healthz` (`ring_corrupt`), and written again from the backfill lake when the relay has one
//! that holds it (`ledger_relay_ring_repaired_total`); without one, sessions that ask for it
//! get a typed error and subscribers fail over.
//!
//! The scrub holds no lock across IO (each read is one [`crate::ring::Ring::get`] on the
//! blocking pool), gives way at once on shutdown, and stops a pass early while the ring's store
//! is degraded (a read error other than damage) to try again at the next one.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::metrics::Metrics;
use crate::ring::{Ring, RingError};
use crate::session::Shared;

/// Time between the start of one pass and the next.
pub const EVERY: Duration = Duration::from_secs(3600);

/// Delay before the first pass, so the relay's start (ring writer, first sessions) comes
/// first.
const FIRST_AFTER: Duration = Duration::from_millis(500);

/// Runs passes until `shutdown`; `rate` bytes read per second (0: returns at once).
pub async fn run(shared: Shared, ring: Arc<Ring>, rate: u64, shutdown: CancellationToken) {
    if rate == 0 {
        return;
    }
    let mut wait = FIRST_AFTER;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        let started = tokio::time::Instant::now();
        match pass(&shared, &ring, rate, &shutdown).await {
            Pass::Done { ledgers, damaged } => {
                Metrics::add(&shared.metrics.ring_scrub_passes_total, 1);
                info!(ledgers, damaged, took = ?started.elapsed(), "ring scrub pass done");
            }
            Pass::Stopped => return,
            Pass::Degraded(e) => debug!(error = %e, "ring scrub pass stopped: store degraded"),
        }
        wait = EVERY.saturating_sub(started.elapsed());
    }
}

enum Pass {
    Done { ledgers: u64, damaged: u64 },
    Stopped,
    Degraded(String),
}

/// One pass over the ring's range as it is when each ledger is read (ledgers pruned meanwhile
/// are skipped; ledgers written meanwhile are included up to the newest at the pass's start).
async fn pass(shared: &Shared, ring: &Arc<Ring>, rate: u64, shutdown: &CancellationToken) -> Pass {
    let Some((mut seq, newest)) = ring.range() else {
        return Pass::Done {
            ledgers: 0,
            damaged: 0,
        };
    };
    let (mut ledgers, mut damaged) = (0, 0);
    while seq <= newest {
        if shutdown.is_cancelled() {
            return Pass::Stopped;
        }
        // The next ledger held: past a gap between two runs, or from the oldest if the pass
        // fell behind the pruning.
        match ring.next_held(seq) {
            Some(next) if next <= newest => seq = next,
            _ => break,
        }
        let r = ring.clone();
        let got = tokio::task::spawn_blocking(move || r.get(seq)).await;
        let bytes = match got {
            Ok(Ok(Some((_, chunks)))) => {
                ledgers += 1;
                Metrics::add(&shared.metrics.ring_scrubbed_total, 1);
                chunks.iter().map(|c| c.payload.len() as u64).sum()
            }
            Ok(Ok(None)) => 0,
            Ok(Err(RingError::Corrupt { seq, detail })) => {
                damaged += 1;
                let before = shared.metrics.ring_repaired_total.load(Ordering::Relaxed);
                crate::session::damaged(shared, Some(ring.clone()), seq, detail).await;
                if shared.metrics.ring_repaired_total.load(Ordering::Relaxed) == before {
                    info!(
                        seq,
                        "ring scrub: damaged ledger left as it is (no lake holds it)"
                    );
                }
                0
            }
            Ok(Err(e)) => return Pass::Degraded(e.to_string()),
            Err(e) => return Pass::Degraded(format!("scrub read task: {e}")),
        };
        seq = match seq.checked_add(1) {
            Some(s) => s,
            None => break,
        };
        // Pace the reads: this ledger's bytes at `rate`.
        let pause = Duration::from_secs_f64(bytes as f64 / rate as f64);
        if !pause.is_zero() {
            tokio::select! {
                _ = shutdown.cancelled() => return Pass::Stopped,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
    Pass::Done { ledgers, damaged }
}
