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
    let one = MemoryBound::new(10 << 10, &s, 1, 4, f64::from(1 << 20));
    let two = MemoryBound::new(10 << 10, &s, 2, 4, f64::from(1 << 20));
    assert!(two.total_mib > one.total_mib);
    assert!((two.sessions_mib - 2.0 * one.sessions_mib).abs() < 1e-9);
    // 10 upfront ledgers + a pool of 4 fillers of 1 MiB.
    assert!((one.source_mib - 14.0).abs() < 1e-9, "{}", one.source_mib);
    assert_eq!(one.base_mib, 10.0);
    // 5 items per ledger: 512 / 5 rounded up, plus one partial, plus 4 recent.
    assert!((one.hub_mib - 108.0).abs() < 1e-9, "{}", one.hub_mib);
}
