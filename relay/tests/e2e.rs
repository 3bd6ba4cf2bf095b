//! The relay and the subscriber library against each other over real QUIC on loopback, with
//! certificates from the certs crate and real testnet ledgers.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use ledger_relay_subscriber::SubscribeError;
use ledger_relay_wire::frame::Start;

use crate::support::{
    assert_identical, assert_two_runs, eventually, file_source, first_of_two_runs, take,
    testnet_ledgers, testnet_records, Collector, GatedSource, Running, TestDir, FIRST, LAST,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testnet_through_one_and_four_lanes_byte_identical() {
    let dir = TestDir::new();
    let want = testnet_ledgers();
    let mut config = dir.relay_config(&file_source());
    // Slow enough that the subscribers join while the source still runs: part replay, part live.
    config.source_options.cadence = Duration::from_millis(5);
    let (config_window, config_live, config_queue) = (
        config.server.session.window,
        config.live_capacity,
        config.pipeline.compress_queue,
    );
    let relay = Running::start(config).await;
    let one = dir.sub(&relay, "rpc-1", 1, Start::Seq(FIRST));
    let four = dir.sub(&relay, "rpc-1", 4, Start::Seq(FIRST));
    let (a, b) = tokio::join!(take(one, 320, 60), take(four, 320, 60));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_identical(&a, &want, FIRST);
    assert_identical(&b, &want, FIRST);
    let m = &relay.relay.metrics;
    assert_eq!(m.ledgers_in_total.load(Ordering::Relaxed), 320);
    // Per-lane metrics: every lane of the four-lane session carried bytes and reported its
    // path (sessions end when their subscription is dropped, which adds their last report).
    eventually(10, "every lane reported", || {
        m.lanes
            .lock()
            .unwrap()
            .values()
            .filter(|l| l.delivered_bytes > 0)
            .count()
            >= 4
    })
    .await;
    let text = m.render();
    // What the relay's memory depends on is published, from this relay's settings.
    let gauge = |name: &str| -> u64 {
        let key = format!("ledger_relay_sizing_{name} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&key))
            .unwrap_or_else(|| panic!("no {key} in the metrics"))
            .parse()
            .unwrap()
    };
    assert_eq!(
        gauge("window_ledgers"),
        u64::from(config_window),
        "the session window"
    );
    assert_eq!(gauge("live_capacity_items"), config_live as u64);
    assert!(gauge("recent_ledgers") >= 1);
    assert!(gauge("ring_segment_bytes") >= 1 << 20);
    assert!(gauge("ring_cache_bytes") >= 1 << 20);
    assert_eq!(gauge("compress_queue_chunks"), config_queue as u64);
    // Not a synthetic source: nothing generated ahead.
    assert_eq!(gauge("source_ahead_ledgers"), 0);
    for lane in 0..4 {
        let value = |name: &str| -> f64 {
            let key = format!("ledger_relay_{name}{{lane=\"{lane}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&key))
                .unwrap_or_else(|| panic!("no {key} in the metrics"))
                .parse()
                .unwrap()
        };
        assert!(value("lane_bytes_sent_total") > 0.0, "lane {lane}");
        assert!(value("lane_packets_sent_total") > 0.0, "lane {lane}");
        assert!(value("lane_delivered_bytes_total") > 0.0, "lane {lane}");
        assert!(value("lane_busy_seconds_total") > 0.0, "lane {lane}");
        assert!(value("lane_rtt_seconds") > 0.0, "lane {lane}");
        assert!(value("lane_cwnd_bytes") > 0.0, "lane {lane}");
        assert!(value("lane_mtu_bytes") >= 1200.0, "lane {lane}");
    }
    assert!(
        !text.contains("lane=\"4\""),
        "no series for lanes no session opened"
    );
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_inside_the_ring_crosses_into_live() {
    let dir = TestDir::new();
    let want = testnet_ledgers();
    let source = GatedSource::new(dir.path());
    let relay = dir.start(&source.spec).await;
    // The source reads 101 ledgers and waits; the subscriber starts inside the ring, catches
    // up, and the rest reaches it as the source reads it.
    source.release_to(FIRST + 100);
    relay.wait_for(FIRST + 100).await;
    let start = FIRST + 50;
    let sub = Collector::start(dir.sub(&relay, "rpc-1", 2, Start::Seq(start)), LAST);
    sub.wait_for(51, 60).await;
    source.release_to(LAST);
    let out = sub.finish(60).await;
    assert!(out.error.is_none(), "{:?}", out.error);
    assert_eq!(out.got.len(), (LAST - start + 1) as usize);
    assert_identical(&out.got, &want, start);
    assert!(
        relay.relay.metrics.ring_reads_total.load(Ordering::Relaxed) + 4 >= 46,
        "the start came from the ring"
    );
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_below_the_ring_is_a_typed_error() {
    let dir = TestDir::new();
    let mut config = dir.relay_config(&file_source());
    config.retention = 20;
    let relay = Running::start(config).await;
    relay.wait_for(LAST).await;
    let err = take(dir.sub(&relay, "rpc-1", 1, Start::Seq(FIRST)), 1, 20)
        .await
        .unwrap_err();
    match err {
        SubscribeError::BelowRetention {
            oldest,
            newest,
            requested,
            ..
        } => {
            assert_eq!(requested, FIRST);
            assert_eq!(oldest, LAST - 19);
            assert_eq!(newest, LAST);
        }
        other => panic!("expected below-retention, got {other:?}"),
    }
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_relay_serves_what_it_held() {
    let dir = TestDir::new();
    let want = testnet_ledgers();
    let relay = dir.start(&file_source()).await;
    relay.wait_for(LAST).await;
    relay.stop().await;
    // Same data directory; the source replays the same ledgers, which are all duplicates now.
    let relay = dir.start(&file_source()).await;
    assert_eq!(relay.relay.ring.range(), Some((FIRST, LAST)));
    let got = take(dir.sub(&relay, "rpc-1", 4, Start::Seq(FIRST)), 320, 60)
        .await
        .unwrap();
    assert_identical(&got, &want, FIRST);
    // Give the replayed source time to finish: every ledger is dropped as a duplicate.
    tokio::time::timeout(Duration::from_secs(20), async {
        while relay
            .relay
            .metrics
            .duplicates_dropped_total
            .load(Ordering::Relaxed)
            < 320
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the replay is recognised as duplicates");
    assert_eq!(
        relay
            .relay
            .metrics
            .ring_resets_total
            .load(Ordering::Relaxed),
        0
    );
    assert_eq!(relay.relay.ring.range(), Some((FIRST, LAST)));
    relay.stop().await;
}

/// End to end: a relay restarted after its source went on without it (core
/// ran while the relay was down) keeps the run it held beside the new one. A subscriber is
/// served from either run and is told, with a typed error it can fail over on, that the
/// ledgers between them are not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_keeps_the_old_run_and_serves_both() {
    let dir = TestDir::new();
    let want = testnet_ledgers();
    let second = first_of_two_runs(&dir).await;
    let relay = dir.start(&second).await;
    assert_two_runs(&relay).await;
    let m = &relay.relay.metrics;
    assert_eq!(m.ring_resets_total.load(Ordering::Relaxed), 0);
    assert_eq!(m.ring_gaps_total.load(Ordering::Relaxed), 1);
    assert!(m.render().contains("ledger_relay_ring_runs 2\n"));

    let got = take(dir.sub(&relay, "rpc-1", 2, Start::Seq(FIRST)), 100, 60)
        .await
        .unwrap();
    assert_identical(&got, &want, FIRST);
    let got = take(
        dir.sub(&relay, "rpc-1", 2, Start::Seq(FIRST + 150)),
        170,
        60,
    )
    .await
    .unwrap();
    assert_identical(&got, &want, FIRST + 150);
    // Streaming across the end of the old run, or starting inside the gap: the relay says
    // which ledger it does not hold.
    for start in [FIRST + 95, FIRST + 120] {
        let err = take(dir.sub(&relay, "rpc-1", 2, Start::Seq(start)), 30, 30)
            .await
            .unwrap_err();
        match err {
            SubscribeError::BelowRetention { requested, .. } => {
                assert_eq!(requested, start.max(FIRST + 100), "from {start}")
            }
            other => panic!("from {start}: expected not held, got {other:?}"),
        }
    }
    relay.stop().await;
}

/// `connect_cut_through`: beside the verified ledgers, the bytes of each next ledger come out
/// as they arrive, in order from offset 0, and are the beginning of the ledger then delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_through_prefixes_are_the_beginning_of_each_ledger() {
    use futures::StreamExt;
    let dir = TestDir::new();
    let want = testnet_ledgers();
    let mut config = dir.relay_config(&file_source());
    // Live, with ledgers sent while they are read: prefixes have something to precede.
    config.source_options.cadence = Duration::from_millis(20);
    let relay = Running::start(config).await;
    let (mut sub, mut prefixes) =
        ledger_relay_subscriber::connect_cut_through(dir.sub(&relay, "rpc-1", 4, Start::Tip))
            .unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while got.len() < 40 {
            got.push(sub.next().await.unwrap().unwrap());
        }
    })
    .await
    .expect("40 ledgers");
    sub.close().await;
    let mut by_seq: std::collections::BTreeMap<u32, Vec<u8>> = Default::default();
    while let Ok(p) = prefixes.try_recv() {
        let bytes = by_seq.entry(p.seq).or_default();
        // One session: each ledger's prefixes from 0, contiguous.
        assert_eq!(p.offset, bytes.len() as u64, "ledger {}", p.seq);
        bytes.extend_from_slice(&p.data);
    }
    let mut early = 0;
    for l in &got {
        assert_eq!(l.data, want[(l.seq - FIRST) as usize]);
        if let Some(bytes) = by_seq.get(&l.seq) {
            assert!(l.data.starts_with(bytes), "ledger {}", l.seq);
            early += 1;
        }
    }
    assert!(early >= 10, "prefixes for {early} of 40 ledgers");
    relay.stop().await;
}

/// Writes the first `n` testnet records, each to its own file, for shell scripts to cat.
fn record_files(dir: &Path, n: usize) -> Vec<PathBuf> {
    testnet_records(n)
        .iter()
        .enumerate()
        .map(|(i, rec)| {
            let path = dir.join(format!("rec{i}"));
            std::fs::write(&path, rec).unwrap();
            path
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_dying_mid_ledger_forwards_nothing_partial_and_is_restarted() {
    let dir = TestDir::new();
    let want = testnet_ledgers();
    let recs = record_files(dir.path(), 3);
    let marker = dir.path().join("died-once");
    let half = std::fs::metadata(&recs[1]).unwrap().len() / 2;
    // First run: ledger 1, half of ledger 2, then death. Second run: all three, then wait.
    let script = format!(
        "if [ -e {m} ]; then cat {a} {b} {c} >&3; sleep 30; \
         else cat {a} >&3; sleep 0.3; head -c {half} {b} >&3; touch {m}; sleep 0.3; exit 1; fi",
        m = marker.display(),
        a = recs[0].display(),
        b = recs[1].display(),
        c = recs[2].display(),
    );
    let relay = dir.start(&format!("pipe:{script}")).await;
    let got = take(dir.sub(&relay, "rpc-1", 2, Start::Seq(FIRST)), 3, 30)
        .await
        .unwrap();
    assert_identical(&got, &want, FIRST);
    let m = &relay.relay.metrics;
    assert!(
        m.source_aborts_total.load(Ordering::Relaxed) >= 1,
        "the cut ledger was discarded"
    );
    assert!(
        m.source_restarts_total.load(Ordering::Relaxed) >= 1,
        "the child was restarted"
    );
    assert!(
        m.duplicates_dropped_total.load(Ordering::Relaxed) >= 1,
        "ledger 1 re-emitted and dropped"
    );
    relay.stop().await;
}
