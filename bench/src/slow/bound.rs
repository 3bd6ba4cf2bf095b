//! The relay's memory bound in `slow-subscriber`: each term derived from the relay's settings
//! and the sizing the running relay publishes on `/metrics`, so that the bound follows the relay
//! when it changes.

#[allow(clippy::wildcard_imports)]
use super::*;

/// What the relay's memory depends on, as the relay it measured published it on `/metrics`
/// (its `ledger_relay_sizing_*` gauges): the bound follows the relay when its sizing changes,
/// and the bench reads none of the relay library's constants.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RelaySizing {
    /// Items the live broadcast channel holds: a session further behind reads the ring.
    pub live_capacity: u64,
    /// Complete ledgers the hub keeps in memory.
    pub recent_ledgers: u64,
    /// Ledgers unacknowledged per session (`--window`).
    pub window: u64,
    /// Chunks queued for the compression pool at most.
    pub compress_queue: u64,
    /// sled's page cache in the ring, bytes.
    pub ring_cache: u64,
    /// sled's segment size in the ring, bytes; three IO buffers are counted.
    pub ring_segment: u64,
    /// Ledgers the synthetic generator keeps ready.
    pub synthetic_ahead: u64,
    /// Distinct filler bodies the synthetic source keeps.
    pub synthetic_pool: u64,
    /// A synthetic run that fits in this many bytes is built up front.
    pub synthetic_upfront: u64,
}

impl RelaySizing {
    /// The sizing a relay published, or an error naming the gauge it lacks (a relay built
    /// before it published them, or a scrape of something else).
    pub fn from_scrape(scrape: &harness::Scrape) -> anyhow::Result<RelaySizing> {
        let get = |name: &str| -> anyhow::Result<u64> {
            let key = format!("sizing_{name}");
            match scrape.values.get(&key) {
                Some(v) if *v > 0.0 => Ok(*v as u64),
                _ => anyhow::bail!("the relay's /metrics has no ledger_relay_{key}"),
            }
        };
        Ok(RelaySizing {
            live_capacity: get("live_capacity_items")?,
            recent_ledgers: get("recent_ledgers")?,
            window: get("window_ledgers")?,
            compress_queue: get("compress_queue_chunks")?,
            ring_cache: get("ring_cache_bytes")?,
            ring_segment: get("ring_segment_bytes")?,
            synthetic_ahead: get("source_ahead_ledgers")?,
            synthetic_pool: get("source_pool_ledgers")?,
            synthetic_upfront: get("source_upfront_bytes")?,
        })
    }
}

/// Allowance per compression thread for its zstd context, bytes.
pub const ZSTD_CONTEXT: u64 = 4 << 20;
/// Allowance per QUIC connection (lane) for quinn's state and transmit buffers, bytes (chunk
/// payloads are shared `Bytes`, counted once in the hub or the session).
pub const PER_LANE: u64 = 256 << 10;
/// Allocator slack on every data term (fragmentation of glibc's arenas).
pub const SLACK: f64 = 0.25;

/// A memory bound for the relay, from its settings and the sizing it publishes (see the
/// constants of this module and the module documentation of relay/src/hub.rs and session.rs).
/// Every term in MiB.
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
    /// The bound for a relay with these settings and `sizing`, `sessions` sessions of `lanes`
    /// lanes, and `wire_ledger` bytes per ledger on the wire (measured).
    pub fn new(
        base_kib: u64,
        s: &RelaySettings,
        sizing: &RelaySizing,
        sessions: u64,
        lanes: u64,
        wire_ledger: f64,
    ) -> MemoryBound {
        let m = |b: f64| b / f64::from(1 << 20);
        let size = s.size as f64;
        let count = u64::from(s.count.unwrap_or(u32::MAX));
        let pool = count.min(sizing.synthetic_pool) as f64;
        let source =
            if s.count.is_some() && count.saturating_mul(s.size) <= sizing.synthetic_upfront {
                count as f64 * size + pool * size
            } else {
                (sizing.synthetic_ahead + 1) as f64 * size + pool * size
            };
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as f64;
        let pipeline = 2.0 * size
            + sizing.compress_queue.min(s.size.div_ceil(s.chunk)) as f64 * s.chunk as f64
            + threads * ZSTD_CONTEXT as f64;
        let items_per_ledger = s.size.div_ceil(s.chunk) + 1;
        let channel_ledgers = sizing.live_capacity.div_ceil(items_per_ledger) + 1;
        let hub = (channel_ledgers + sizing.recent_ledgers) as f64 * wire_ledger;
        let per_session = sizing.window as f64 * wire_ledger + (lanes * PER_LANE) as f64;
        let sessions_b = sessions as f64 * per_session;
        let held = u64::from(s.retention).min(count) as f64 * wire_ledger;
        let ring = (2.0 * held).min(sizing.ring_cache as f64) + 3.0 * sizing.ring_segment as f64;
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
