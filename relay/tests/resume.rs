//! Resume, failover and fail-closed delivery against the real relay over loopback QUIC:
//! a relay stopped and restarted on the same data directory and port
//! mid-stream; failover between two relays fed the same file; a relay fed another network's
//! ledgers; a tampered ring. The same with the relay as a process of its own (SIGKILL, a slow
//! consumer, the crash rounds) is in `relay/bin/tests/process.rs`.
//!
//! Every test is bounded by timeouts and asserts outcomes that do not depend on timing: which
//! ledgers were delivered (all of them, or exactly those before a fault), in what order, and
//! which typed error ended the stream.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ledger_relay_subscriber::{SubscribeError, VerifyError};
use ledger_relay_wire::compress::Codec;
use ledger_relay_wire::frame::Start;
use ledger_relay_wire::header::ChainError;
use ledger_relay_wire::AssemblyError;

use crate::support::{
    assert_identical, eventually, file_source, free_port, from_first, load, local, relay_config,
    start_on, testnet_ledgers, testnet_relay, Collector, Running, TestDir, COUNT, FIRST, LAST,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_stopped_and_restarted_mid_stream_loses_and_repeats_nothing() {
    let dir = TestDir::new();
    let want = testnet_ledgers();
    let data = dir.data();
    let port = free_port();
    let a = start_on(testnet_relay(dir.certs.path(), &data), port).await;
    let a_metrics = a.relay.metrics.clone();
    let sub = Collector::start(from_first(&dir, vec![local(port)]), LAST);
    sub.wait_for(100, 30).await;
    // Graceful: sessions end with ShuttingDown, the ring is flushed.
    a.stop().await;
    let a_newest = load(&a_metrics.source_newest) as u32;
    assert!(
        a_newest < LAST,
        "relay A stopped mid-stream (at {a_newest})"
    );
    // Same data directory, same address: the subscriber's reconnect finds the new relay, which
    // replays the file (the ledgers it holds are dropped as duplicates) and serves the resume
    // point from its ring, then live.
    let b = start_on(testnet_relay(dir.certs.path(), &data), port).await;
    assert_eq!(b.relay.ring.range().map(|r| r.0), Some(FIRST));
    let out = sub.finish(60).await;
    out.assert_complete(&want);
    assert!(out.sub.status().sessions >= 2, "{:?}", out.sub.status());
    let b_out = load(&b.relay.metrics.ledgers_out_total);
    assert!(
        b_out >= u64::from(LAST - a_newest),
        "relay B served the ledgers relay A never had ({b_out} sent)"
    );
    out.sub.close().await;
    b.stop().await;
}

/// A subscription from the first ledger to relay `a`, then `b`; returns once 100 ledgers
/// arrived (from `a`, which the caller then stops).
async fn a_then_b(dir: &TestDir, a: &Running, b: &Running) -> Collector {
    let mut config = from_first(dir, vec![a.addr(), b.addr()]);
    // Switches are the test's doing, not a loaded machine's (A's stop is announced at once).
    config.heartbeat_timeout = Some(Duration::from_secs(3));
    let sub = Collector::start(config, LAST);
    sub.wait_for(100, 30).await;
    sub
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_between_two_relays_fed_the_same_file_loses_and_repeats_nothing() {
    let dir = TestDir::new();
    let want = testnet_ledgers();
    let a = Running::start(testnet_relay(dir.certs.path(), &dir.path().join("a"))).await;
    let b = Running::start(testnet_relay(dir.certs.path(), &dir.path().join("b"))).await;
    let (a_addr, b_addr) = (a.relay.addr, b.relay.addr);
    let a_metrics = a.relay.metrics.clone();
    let sub = a_then_b(&dir, &a, &b).await;
    a.stop().await;
    let a_newest = load(&a_metrics.source_newest) as u32;
    assert!(
        a_newest < LAST,
        "relay A stopped mid-stream (at {a_newest})"
    );
    let out = sub.finish(60).await;
    out.assert_complete(&want);
    assert_eq!(out.got[0].relay, a_addr, "the first relay is tried first");
    assert_eq!(out.got[COUNT - 1].relay, b_addr);
    // The status is updated just after a ledger is handed over: it may trail the stream.
    eventually(5, "the status shows the last ledger", || {
        out.sub.status().last_delivered == LAST
    })
    .await;
    let status = out.sub.status();
    assert_eq!(status.relay, Some(b_addr), "{status:?}");
    out.sub.close().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_fed_another_networks_ledgers_breaks_the_chain_and_nothing_follows() {
    let dir = TestDir::new();
    let want = testnet_ledgers();
    let a = Running::start(testnet_relay(dir.certs.path(), &dir.path().join("a"))).await;
    // The same sequences as the testnet sample, but another chain.
    let mut other = relay_config(
        dir.certs.path(),
        &dir.path().join("b"),
        &format!("synthetic:size=16KiB,ratio=2,start={FIRST},count={COUNT}"),
    );
    other.source_options.cadence = Duration::from_millis(10);
    let b = Running::start(other).await;
    let (a_addr, b_addr) = (a.relay.addr, b.relay.addr);
    let sub = a_then_b(&dir, &a, &b).await;
    a.stop().await;
    let out = sub.finish(30).await;
    let last = out.got.last().unwrap().seq;
    match &out.error {
        Some(SubscribeError::Verify {
            relay,
            source: VerifyError::Chain(ChainError::BrokenChain { seq, .. }),
        }) => {
            assert_eq!(*relay, b_addr);
            assert_eq!(*seq, last + 1, "the first ledger after the switch");
        }
        other => panic!("expected a broken chain, got {other:?}"),
    }
    assert!(out.after_error.is_empty(), "{:?}", out.after_error);
    assert!(out.got.len() >= 100 && out.got.len() < COUNT);
    assert_identical(&out.got, &want, FIRST);
    assert!(
        out.got.iter().all(|l| l.relay == a_addr),
        "nothing from the other chain was delivered"
    );
    b.stop().await;
}

/// Flips the last byte of ledger `seq`'s file (a payload byte of its last part). With `reseal`,
/// the part's checksum is recomputed, so the ring's own checks pass and only the subscriber's
/// reassembler (the ledger's checksum in its end record) can catch it.
fn tamper(data: &Path, seq: u32, reseal: bool) {
    let path =
        ledger_relay::ring::ledger_file(&data.join("ring"), seq).expect("the ledger is stored");
    let mut v = std::fs::read(&path).unwrap();
    let at = v.len() - 1;
    v[at] ^= 0x5a;
    if reseal {
        // Each part is `len u32 || xxh3-64(body) || body` (ledger_relay_wire::stored); the
        // last one runs to the end of the file.
        let (mut off, mut last) = (0, 0);
        while off < v.len() {
            let len = u32::from_be_bytes(v[off..off + 4].try_into().unwrap()) as usize;
            last = off + 4;
            off = last + len;
        }
        let sum = ledger_relay_wire::checksum(&v[last + 8..]);
        v[last..last + 8].copy_from_slice(&sum.to_be_bytes());
    }
    std::fs::write(&path, v).unwrap();
}

/// A relay on `source` that compresses (and stores) with `codec`.
async fn relay_with_codec(dir: &TestDir, source: &str, codec: Codec) -> Running {
    let mut config = dir.relay_config(source);
    config.pipeline.codec = codec;
    config.server.codec = codec;
    Running::start(config).await
}

/// The whole testnet sample stored with `codec` by a relay that then stopped, ledger
/// `FIRST + 50` tampered with (see [`tamper`]), then a relay serving only what its ring holds
/// (its source is an empty file) and a subscription from the first ledger. Returns them and
/// the tampered sequence.
async fn serve_tampered(dir: &TestDir, codec: Codec, reseal: bool) -> (Running, Collector, u32) {
    let writer = relay_with_codec(dir, &file_source(), codec).await;
    writer.wait_for(LAST).await;
    writer.stop().await;
    let bad = FIRST + 50;
    tamper(&dir.data(), bad, reseal);
    let empty: PathBuf = dir.path().join("empty.xdr");
    std::fs::write(&empty, b"").unwrap();
    let relay = relay_with_codec(dir, &format!("file:{}", empty.display()), codec).await;
    assert_eq!(relay.relay.ring.range(), Some((FIRST, LAST)));
    let sub = Collector::start(dir.sub(&relay, "rpc-1", 4, Start::Seq(FIRST)), LAST);
    (relay, sub, bad)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_ledger_in_the_ring_is_never_served_and_the_subscriber_stalls_before_it() {
    let dir = TestDir::new();
    let (relay, sub, bad) = serve_tampered(&dir, Codec::Zstd, false).await;
    let metrics = relay.relay.metrics.clone();
    // The ledgers before the damaged one arrive (over one or more sessions: a session the relay
    // ends may cut the streams of ledgers before it, which the next session sends again).
    sub.wait_for(50, 30).await;
    // Then every session is refused the damaged ledger (each at most once: the relay hands over
    // what it sent before, then ends the session): wait until the subscriber was told so and
    // the relay refused a second session too.
    eventually(
        20,
        "the subscriber is refused the damaged ledger again",
        || {
            let status = sub.status();
            status.last_error.is_some_and(|e| e.contains("corrupt"))
                && status.sessions >= 2
                && load(&metrics.ring_corrupt_total) >= 2
        },
    )
    .await;
    let out = sub.halt().await;
    assert!(
        out.error.is_none(),
        "a relay that cannot serve is retried: {:?}",
        out.error
    );
    out.assert_stopped_before(bad);
    assert_eq!(out.sub.status().last_delivered, bad - 1);
    out.sub.close().await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_chunk_the_ring_cannot_see_is_caught_by_the_subscriber_and_nothing_follows() {
    let dir = TestDir::new();
    // Uncompressed chunks: the flipped byte is a byte of the ledger itself.
    let (relay, sub, bad) = serve_tampered(&dir, Codec::None, true).await;
    let out = sub.finish(30).await;
    match &out.error {
        Some(SubscribeError::Integrity {
            source: AssemblyError::ChecksumMismatch { seq, .. },
            ..
        }) => assert_eq!(*seq, bad),
        other => panic!("expected a checksum mismatch on {bad}, got {other:?}"),
    }
    assert!(out.after_error.is_empty(), "{:?}", out.after_error);
    out.assert_stopped_before(bad);
    assert_eq!(
        load(&relay.relay.metrics.ring_corrupt_total),
        0,
        "the resealed part passed the ring's checks"
    );
    relay.stop().await;
}

/// A relay that has read the whole testnet sample and keeps only its newest `retention`
/// ledgers.
async fn short_ring(dir: &TestDir, name: &str, retention: u32) -> Running {
    let mut config = relay_config(dir.certs.path(), &dir.path().join(name), &file_source());
    config.retention = retention;
    let relay = Running::start(config).await;
    relay.wait_for(LAST).await;
    eventually(10, "the short ring is pruned", || {
        relay.relay.ring.range() == Some((LAST - retention + 1, LAST))
    })
    .await;
    relay
}

/// The first relay no longer holds the start, the second does: a
/// below-retention end from one relay is not the end of a subscription that has another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_retention_of_one_relay_the_subscriber_fails_over_to_the_next() {
    let dir = TestDir::new();
    let a = short_ring(&dir, "a", 20).await;
    let b = Running::start(relay_config(
        dir.certs.path(),
        &dir.path().join("b"),
        &file_source(),
    ))
    .await;
    b.wait_for(LAST).await;
    let mut config = from_first(&dir, vec![a.addr(), b.addr()]);
    config.backoff.min = Duration::from_millis(20);
    let out = Collector::start(config, LAST).finish(60).await;
    out.assert_complete(&testnet_ledgers());
    assert!(out.got.iter().all(|l| l.relay == b.relay.addr));
    out.sub.close().await;
    a.stop().await;
    b.stop().await;
}

/// ... and the subscription ends below retention (CLI exit 4) once every relay said so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_retention_of_every_relay_the_subscription_ends() {
    let dir = TestDir::new();
    let a = short_ring(&dir, "a", 20).await;
    let b = short_ring(&dir, "b", 30).await;
    let mut config = from_first(&dir, vec![a.addr(), b.addr()]);
    config.backoff.min = Duration::from_millis(20);
    let out = Collector::start(config, LAST).finish(30).await;
    match &out.error {
        Some(e @ SubscribeError::BelowRetention { requested, .. }) => {
            assert_eq!(*requested, FIRST);
            assert!(e.is_below_retention());
        }
        other => panic!("expected below retention, got {other:?}"),
    }
    assert!(out.got.is_empty());
    assert!(
        out.sub.status().sessions >= 2,
        "both relays were asked: {:?}",
        out.sub.status()
    );
    a.stop().await;
    b.stop().await;
}

/// A ledger damaged in the middle of relay A's ring is detected on read,
/// counted, named in A's `/healthz` and `/metrics` (`ring_corrupt`), and the
/// subscriber, told `Internal` for it, fails over to relay B, which has it: every ledger
/// arrives, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_ledger_is_reported_and_the_subscriber_gets_it_from_the_next_relay() {
    let dir = TestDir::new();
    let writer = relay_with_codec(&dir, &file_source(), Codec::Zstd).await;
    writer.wait_for(LAST).await;
    writer.stop().await;
    let bad = FIRST + 50;
    tamper(&dir.data(), bad, false);
    let empty: PathBuf = dir.path().join("empty.xdr");
    std::fs::write(&empty, b"").unwrap();
    let mut config = dir.relay_config(&format!("file:{}", empty.display()));
    config.metrics = Some("127.0.0.1:0".parse().unwrap());
    let a = Running::start(config).await;
    let b = Running::start(relay_config(
        dir.certs.path(),
        &dir.path().join("b"),
        &file_source(),
    ))
    .await;
    b.wait_for(LAST).await;
    let mut config = from_first(&dir, vec![a.addr(), b.addr()]);
    config.backoff.min = Duration::from_millis(20);
    let out = Collector::start(config, LAST).finish(60).await;
    out.assert_complete(&testnet_ledgers());
    assert_eq!(
        out.got[0].relay, a.relay.addr,
        "A served the ledgers before"
    );
    assert_eq!(out.got[(bad - FIRST) as usize].relay, b.relay.addr);
    let m = &a.relay.metrics;
    assert!(load(&m.ring_corrupt_total) >= 1);
    let health = crate::support::http_get(a.relay.metrics_addr.unwrap(), "/healthz").await;
    assert!(health.contains("\"ring_corrupt\""), "{health}");
    assert!(
        health.contains(&format!("stored ledger {bad} failed verification")),
        "{health}"
    );
    let text = crate::support::http_get(a.relay.metrics_addr.unwrap(), "/metrics").await;
    assert!(
        text.contains("ledger_relay_health_reason{reason=\"ring_corrupt\"} 1"),
        "{text}"
    );
    out.sub.close().await;
    a.stop().await;
    b.stop().await;
}

/// Hedged across two relays fed the same file: every ledger once, in order, as the file; the
/// first look counts each ledger handed on once, for the relay whose copy it was, and times
/// the other relay's copies against it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedged_subscription_counts_which_relay_delivered_each_ledger_first() {
    let dir = TestDir::new();
    let want = testnet_ledgers();
    let a = Running::start(testnet_relay(dir.certs.path(), &dir.path().join("a"))).await;
    let b = Running::start(testnet_relay(dir.certs.path(), &dir.path().join("b"))).await;
    let mut config = from_first(&dir, vec![a.addr(), b.addr()]);
    config.hedge = true;
    let out = Collector::start(config, LAST).finish(60).await;
    out.assert_complete(&want);
    let look = out.sub.first_look();
    assert_eq!(look.len(), 2, "{look:?}");
    let handed_on: u64 = look.iter().map(|f| f.first).sum();
    assert_eq!(
        handed_on, COUNT as u64,
        "each ledger counted once: {look:?}"
    );
    let shares: f64 = look.iter().map(|f| f.first_share).sum();
    assert!((shares - 1.0).abs() < 1e-9, "{look:?}");
    for (f, addr) in look.iter().zip([a.relay.addr, b.relay.addr]) {
        let written = out.got.iter().filter(|l| l.relay == addr).count();
        assert_eq!(f.first, written as u64, "the copies written: {look:?}");
        assert!(f.first + f.later <= COUNT as u64, "{look:?}");
        if f.later > 0 {
            let (mean, p99) = (f.gain_mean_ms.unwrap(), f.gain_p99_ms.unwrap());
            // The p99 may be 0 below the mean: a relay first on more than 99% of the ledgers.
            assert!(mean > 0.0 && (0.0..60e3).contains(&p99), "{look:?}");
        }
    }
    // Both relays stream the whole file: the losing copies are timed too (the last few may
    // still be on their way when the subscription ends).
    let later: u64 = look.iter().map(|f| f.later).sum();
    assert!(later >= COUNT as u64 / 2, "{look:?}");
    out.sub.close().await;
    a.stop().await;
    b.stop().await;
}
