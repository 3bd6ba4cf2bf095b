//! The relay's memory bound the soak tests hold it to: each term derived from its settings and
//! the sizing the running relay publishes on `/metrics` (its `ledger_relay_sizing_*` gauges),
//! so that the bound follows the relay when its sizing changes.

use ledger_relay_bench::cluster::{RelaySettings, Scrape};

/// What the relay's memory depends on, as a relay published it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelaySizing {
    /// Items the live broadcast channel holds.
    pub live_capacity: u64,
    /// Complete ledgers the hub keeps in memory.
    pub recent_ledgers: u64,
    /// Ledgers unacknowledged per session.
    pub window: u64,
    /// Chunks queued for the compression pool at most.
    pub compress_queue: u64,
    /// sled's page cache in the ring, bytes.
    pub ring_cache: u64,
    /// sled's segment size, bytes; three IO buffers are counted.
    pub ring_segment: u64,
    /// Ledgers the synthetic generator keeps ready.
    pub synthetic_ahead: u64,
    /// Distinct filler bodies the synthetic source keeps.
    pub synthetic_pool: u64,
    /// A synthetic run that fits in this many bytes is built up front.
    pub synthetic_upfront: u64,
}

impl RelaySizing {
    /// The sizing a relay published, or an error naming the gauge it lacks.
    pub fn from_scrape(m: &Scrape) -> anyhow::Result<RelaySizing> {
        let get = |name: &str| match m.values.get(&format!("sizing_{name}")) {
            Some(v) if *v > 0.0 => Ok(*v as u64),
            _ => anyhow::bail!("the relay's /metrics has no ledger_relay_sizing_{name}"),
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
const ZSTD_CONTEXT: f64 = (4 << 20) as f64;
/// Allowance per lane for quinn's state and transmit buffers, bytes (chunk payloads are shared).
const PER_LANE: f64 = (256 << 10) as f64;
/// Allocator slack on every data term.
const SLACK: f64 = 0.25;

/// The bound, MiB: `base_mib` (an idle relay of the same binary, measured) plus, with
/// [`SLACK`], the source (every ledger built up front when they fit, else a few ahead, and its
/// filler pool), the pipeline (the ledger being cut, the compression queue, a zstd context per
/// thread), the hub (the broadcast channel's ledgers and the recent ones), the sessions (a
/// window of ledgers read from the ring each, quinn's state per lane) and the ring (sled's
/// cache, at most twice what it holds, and three segment buffers).
pub fn bound_mib(
    base_mib: f64,
    s: &RelaySettings,
    z: &RelaySizing,
    sessions: u64,
    lanes: u64,
    wire_ledger: f64,
) -> f64 {
    let (size, chunk) = (s.size as f64, s.chunk as f64);
    let count = u64::from(s.count.unwrap_or(u32::MAX));
    let pool = count.min(z.synthetic_pool) as f64 * size;
    let source = if s.count.is_some() && count.saturating_mul(s.size) <= z.synthetic_upfront {
        count as f64 * size + pool
    } else {
        (z.synthetic_ahead + 1) as f64 * size + pool
    };
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as f64;
    let chunks = s.size.div_ceil(s.chunk);
    let pipeline =
        2.0 * size + z.compress_queue.min(chunks) as f64 * chunk + threads * ZSTD_CONTEXT;
    let hub = (z.live_capacity.div_ceil(chunks + 1) + 1 + z.recent_ledgers) as f64 * wire_ledger;
    let per_session = z.window as f64 * wire_ledger + lanes as f64 * PER_LANE;
    let held = u64::from(s.retention).min(count) as f64 * wire_ledger;
    let ring = (2.0 * held).min(z.ring_cache as f64) + 3.0 * z.ring_segment as f64;
    let data = source + pipeline + hub + sessions as f64 * per_session + ring;
    base_mib + data * (1.0 + SLACK) / f64::from(1 << 20)
}

#[test]
fn the_bound_grows_with_sessions_and_reads_every_gauge() {
    let s = RelaySettings {
        count: Some(10),
        codec: "none".into(),
        retention: 5,
        ..RelaySettings::endless(1 << 20, 1.0, 100.0)
    };
    let gauges = [
        ("live_capacity_items", 512.0),
        ("recent_ledgers", 4.0),
        ("window_ledgers", 8.0),
        ("compress_queue_chunks", 64.0),
        ("ring_cache_bytes", 16.0 * 1048576.0),
        ("ring_segment_bytes", 8.0 * 1048576.0),
        ("source_ahead_ledgers", 2.0),
        ("source_pool_ledgers", 4.0),
    ];
    let mut m = Scrape::default();
    m.values
        .extend(gauges.iter().map(|(k, v)| (format!("sizing_{k}"), *v)));
    let err = RelaySizing::from_scrape(&m).unwrap_err().to_string();
    assert!(err.contains("sizing_source_upfront_bytes"), "{err}");
    m.values
        .insert("sizing_source_upfront_bytes".into(), 256.0 * 1048576.0);
    let z = RelaySizing::from_scrape(&m).unwrap();
    assert_eq!((z.window, z.ring_segment), (8, 8 << 20));
    let mib = f64::from(1 << 20);
    let (one, two) = (
        bound_mib(10.0, &s, &z, 1, 4, mib),
        bound_mib(10.0, &s, &z, 2, 4, mib),
    );
    // One more session: a window of 8 ledgers of 1 MiB and 4 lanes of 256 KiB, with the slack.
    assert!((two - one - 9.0 * 1.25).abs() < 1e-9, "{one} {two}");
    // 10 ledgers up front and 4 fillers; 2 ledgers in the pipeline, 4 chunks queued, a zstd
    // context per thread; 512 / 5 channel ledgers plus one partial plus 4 recent; the ring's
    // cache (5 ledgers twice, under 16 MiB) and three 8 MiB segments.
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as f64;
    let data = 14.0 + (2.0 + 1.0 + 4.0 * threads) + 108.0 + 9.0 + (10.0 + 24.0);
    assert!((one - 10.0 - data * 1.25).abs() < 1e-9, "{one}");
}
