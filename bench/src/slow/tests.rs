//! Unit tests of `slow`.

use super::*;

#[test]
fn parses_the_oldest_held() {
    assert_eq!(
        oldest_held(
            "ledger-subscribe: start 3 is below retention: oldest ledger held is 25 (newest 40)"
        ),
        Some(25)
    );
    assert_eq!(oldest_held("ledger-subscribe: other"), None);
}

#[test]
fn the_bound_grows_with_sessions_and_counts_upfront_ledgers() {
    let s = RelaySettings {
        size: 1 << 20,
        ratio: 1.0,
        count: Some(10),
        start: 2,
        cadence_ms: 100.0,
        emit_ms: 1.0,
        codec: "none".into(),
        chunk: 256 << 10,
        retention: 5,
    };
    // What a relay of this build publishes (see relay/src/lib.rs `record_sizing`).
    let sizing = RelaySizing {
        live_capacity: 512,
        recent_ledgers: 4,
        window: 8,
        compress_queue: 64,
        ring_cache: 16 << 20,
        ring_segment: 8 << 20,
        synthetic_ahead: 2,
        synthetic_pool: 4,
        synthetic_upfront: 256 << 20,
    };
    let one = MemoryBound::new(10 << 10, &s, &sizing, 1, 4, f64::from(1 << 20));
    let two = MemoryBound::new(10 << 10, &s, &sizing, 2, 4, f64::from(1 << 20));
    assert!(two.total_mib > one.total_mib);
    assert!((two.sessions_mib - 2.0 * one.sessions_mib).abs() < 1e-9);
    // 10 upfront ledgers + a pool of 4 fillers of 1 MiB.
    assert!((one.source_mib - 14.0).abs() < 1e-9, "{}", one.source_mib);
    assert_eq!(one.base_mib, 10.0);
    // 5 items per ledger: 512 / 5 rounded up, plus one partial, plus 4 recent.
    assert!((one.hub_mib - 108.0).abs() < 1e-9, "{}", one.hub_mib);
}

#[test]
fn the_sizing_is_read_from_the_relays_metrics_and_must_be_there() {
    let mut scrape = harness::Scrape::default();
    for (name, v) in [
        ("live_capacity_items", 512.0),
        ("recent_ledgers", 4.0),
        ("window_ledgers", 8.0),
        ("compress_queue_chunks", 64.0),
        ("ring_cache_bytes", 16.0 * 1048576.0),
        ("ring_segment_bytes", 8.0 * 1048576.0),
        ("source_ahead_ledgers", 2.0),
        ("source_pool_ledgers", 4.0),
    ] {
        scrape.values.insert(format!("sizing_{name}"), v);
    }
    let err = RelaySizing::from_scrape(&scrape).unwrap_err().to_string();
    assert!(err.contains("sizing_source_upfront_bytes"), "{err}");
    scrape
        .values
        .insert("sizing_source_upfront_bytes".into(), 256.0 * 1048576.0);
    let sizing = RelaySizing::from_scrape(&scrape).unwrap();
    assert_eq!(sizing.window, 8);
    assert_eq!(sizing.ring_segment, 8 << 20);
}
