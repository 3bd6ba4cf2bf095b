//! The relay's memory bound in `slow-subscriber`: each term derived from the relay's own
//! settings and constants, so that the bound follows the relay when it changes.

#[allow(clippy::wildcard_imports)]
use super::*;

// What the memory bound counts, taken from the relay itself so that the bound follows it.
use ledger_relay::config::{DEFAULT_WINDOW, LIVE_CAPACITY as LIVE_ITEMS};
use ledger_relay::hub::RECENT_LEDGERS as RECENT;
use ledger_relay::ring::{CACHE_BYTES as SLED_CACHE, SEGMENT_SIZE};
use ledger_relay::source::{AHEAD, POOL, UPFRONT_BYTES as SYNTHETIC_UPFRONT};

/// Items the relay's live broadcast channel holds: a session further behind reads the ring.
pub const LIVE_CAPACITY: u64 = LIVE_ITEMS as u64;
/// Complete ledgers the hub keeps in memory.
pub const RECENT_LEDGERS: u64 = RECENT as u64;
/// The relay's default `--window` (ledgers unacknowledged per session).
pub const WINDOW: u64 = DEFAULT_WINDOW as u64;
/// sled's segment size in the ring; three IO buffers are counted.
pub const SLED_SEGMENT: u64 = SEGMENT_SIZE as u64;
/// Distinct filler bodies the synthetic source keeps.
pub const SYNTHETIC_POOL: u64 = POOL as u64;
/// Ledgers the synthetic generator keeps ready.
pub const SYNTHETIC_AHEAD: u64 = AHEAD as u64;

/// Allowance per compression thread for its zstd context, bytes.
pub const ZSTD_CONTEXT: u64 = 4 << 20;
/// Allowance per QUIC connection (lane) for quinn's state and transmit buffers, bytes (chunk
/// payloads are shared `Bytes`, counted once in the hub or the session).
pub const PER_LANE: u64 = 256 << 10;
/// Allocator slack on every data term (fragmentation of glibc's arenas).
pub const SLACK: f64 = 0.25;

/// A memory bound for the relay, from its settings (see the constants of this module and the
/// module documentation of relay/src/hub.rs and session.rs). Every term in MiB.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MemoryBound {
    /// An idle relay of the same binary on this machine (1 KiB ledgers, no subscriber),
    /// measured: code, runtime, TLS, the QUIC endpoint, sled opened.
    pub base_mib: f64,
    /// The synthetic source: every ledger built up front when they fit in 256 MiB, else a few
    /// ahead, plus its filler pool.
    pub source_mib: f64,
    /// The pipeline: the ledger being cut, the compression queue, a zstd context per thread.
    pub pipeline_mib: f64,
    /// The hub: the broadcast channel's items (chunks and end records) and the recent
    /// ledgers, counted separately though they share chunks.
    pub hub_mib: f64,
    /// Sessions: per session a full window of ledgers read from the ring (its own copies),
    /// and per lane quinn's state.
    pub sessions_mib: f64,
    /// The ring: sled's cache (at most what the ring holds, twice, capped by its cache size)
    /// and three segment-sized IO buffers.
    pub ring_mib: f64,
    /// The bound: base plus every data term with [`SLACK`] for the allocator.
    pub total_mib: f64,
}

impl MemoryBound {
    /// The bound for a relay with these settings, `sessions` sessions of `lanes` lanes, and
    /// `wire_ledger` bytes per ledger on the wire (measured).
    pub fn new(
        base_kib: u64,
        s: &RelaySettings,
        sessions: u64,
        lanes: u64,
        wire_ledger: f64,
    ) -> MemoryBound {
        let m = |b: f64| b / f64::from(1 << 20);
        let size = s.size as f64;
        let count = u64::from(s.count.unwrap_or(u32::MAX));
        let pool = count.min(SYNTHETIC_POOL) as f64;
        let source = if s.count.is_some() && count.saturating_mul(s.size) <= SYNTHETIC_UPFRONT {
            count as f64 * size + pool * size
        } else {
            (SYNTHETIC_AHEAD + 1) as f64 * size + pool * size
        };
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as f64;
        let pipeline = 2.0 * size
            + (ledger_relay::pipeline::PipelineConfig::default().compress_queue as u64)
                .min(s.size.div_ceil(s.chunk)) as f64
                * s.chunk as f64
            + threads * ZSTD_CONTEXT as f64;
        let items_per_ledger = s.size.div_ceil(s.chunk) + 1;
        let channel_ledgers = LIVE_CAPACITY.div_ceil(items_per_ledger) + 1;
        let hub = (channel_ledgers + RECENT_LEDGERS) as f64 * wire_ledger;
        let per_session = WINDOW as f64 * wire_ledger + (lanes * PER_LANE) as f64;
        let sessions_b = sessions as f64 * per_session;
        let held = u64::from(s.retention).min(count) as f64 * wire_ledger;
        let ring = (2.0 * held).min(SLED_CACHE as f64) + 3.0 * SLED_SEGMENT as f64;
        let data = source + pipeline + hub + sessions_b + ring;
        MemoryBound {
            base_mib: mib(base_kib),
            source_mib: m(source),
            pipeline_mib: m(pipeline),
            hub_mib: m(hub),
            sessions_mib: m(sessions_b),
            ring_mib: m(ring),
            total_mib: mib(base_kib) + m(data) * (1.0 + SLACK),
        }
    }

    /// The terms on one line.
    pub fn line(&self) -> String {
        format!(
            "base {:.1} + (source {:.1} + pipeline {:.1} + hub {:.1} + sessions {:.1} + ring {:.1}) x {:.2} = {:.1} MiB",
            self.base_mib,
            self.source_mib,
            self.pipeline_mib,
            self.hub_mib,
            self.sessions_mib,
            self.ring_mib,
            1.0 + SLACK,
            self.total_mib
        )
    }
}
