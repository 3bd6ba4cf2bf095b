//! Sessions over real QUIC on loopback against the in-test relay: lanes, resume, failover,
//! stalls, watchdogs and fail-closed integrity.

use std::time::Duration;

use futures::StreamExt;
use ledger_relay_subscriber::frame::{ErrorCode, Start};
use ledger_relay_subscriber::{connect, Ledger, SubscribeError, VerifyError};
use ledger_relay_wire::header::ChainError;
use ledger_relay_wire::AssemblyError;

use crate::support::fake_relay::{FakeRelay, Plan};
use crate::support::{
    from_another_chain, subscriber_config, testnet_ledgers, with_filler, within, Pki, FIRST_SEQ,
};

/// Takes `n` ledgers, failing on any error.
async fn take(sub: &mut ledger_relay_subscriber::Subscription, n: usize) -> Vec<Ledger> {
    let mut out = Vec::new();
    while out.len() < n {
        match sub.next().await {
            Some(Ok(l)) => out.push(l),
            Some(Err(e)) => panic!("after {} ledgers: {e:?}", out.len()),
            None => panic!("stream ended after {} ledgers", out.len()),
        }
    }
    out
}

fn assert_identical(got: &[Ledger], want: &[bytes::Bytes]) {
    assert_eq!(got.len(), want.len());
    for (i, (l, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(l.seq, FIRST_SEQ + i as u32, "ledger {i} out of order");
        assert!(l.data == *w, "ledger {} differs from the source", l.seq);
    }
}

#[tokio::test]
async fn two_lanes_deliver_real_ledgers_byte_identical_and_in_order() {
    let pki = Pki::new();
    let ledgers = testnet_ledgers(12);
    let relay = FakeRelay::start(Plan::new(ledgers.clone()), pki.path(), pki.path());
    let config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ), 2);
    let mut sub = connect(config).unwrap();
    let got = within(20, take(&mut sub, 12)).await;
    assert_identical(&got, &ledgers);
    for l in &got {
        assert_eq!(l.relay, relay.addr);
        assert!(
            l.wire_bytes > 0 && l.wire_bytes < l.data.len() as u64,
            "zstd payloads"
        );
        assert!(l.received_ns >= l.relay_last_byte_ns);
        let info = ledger_relay_wire::header::peek_header(&l.data)
            .unwrap()
            .unwrap();
        assert_eq!(
            (l.header_hash, l.previous_hash),
            (info.hash, info.previous_hash)
        );
    }
    let status = sub.status();
    assert_eq!(status.lanes_granted, 2);
    assert_eq!(status.lanes_up, 2);
    assert_eq!(status.last_delivered, FIRST_SEQ + 11);
    let record = relay.record();
    assert_eq!(record.opens.len(), 1);
    assert_eq!(record.opens[0].lanes, 2);
    assert_eq!(record.opens[0].window, 8);
    assert_eq!(record.opens[0].codecs, 0b111);
    // Lane 1 joined from its own socket: another source port, so another flow.
    assert_eq!(record.joins.len(), 1);
    assert_eq!(record.joins[0].0, 1);
    assert_ne!(record.joins[0].1.port(), record.lane0_peers[0].port());
    // Every delivered ledger was acknowledged.
    within(5, async {
        while relay.record().acked != FIRST_SEQ + 11 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    sub.close().await;
}

#[tokio::test]
async fn the_tip_is_the_relays_choice_of_first_ledger() {
    let pki = Pki::new();
    let ledgers = testnet_ledgers(3);
    let relay = FakeRelay::start(Plan::new(ledgers.clone()), pki.path(), pki.path());
    let config = subscriber_config(&[relay.addr], &pki, Start::Tip, 1);
    let mut sub = connect(config).unwrap();
    let got = within(20, take(&mut sub, 3)).await;
    assert_identical(&got, &ledgers);
    assert_eq!(relay.record().opens[0].start, Start::Tip);
}

#[tokio::test]
async fn resumes_from_the_last_delivered_ledger_after_the_relay_closes() {
    let pki = Pki::new();
    let ledgers = testnet_ledgers(10);
    let mut plan = Plan::new(ledgers.clone());
    plan.close_after = Some(4);
    let relay = FakeRelay::start(plan, pki.path(), pki.path());
    let config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ), 2);
    let mut sub = connect(config).unwrap();
    let got = within(20, take(&mut sub, 10)).await;
    assert_identical(&got, &ledgers);
    let opens = relay.record().opens;
    assert_eq!(opens.len(), 2, "{opens:?}");
    assert_eq!(opens[1].start, Start::Seq(FIRST_SEQ + 4));
    assert_eq!(sub.status().sessions, 2);
}

#[tokio::test]
async fn fails_over_to_the_next_relay_without_a_gap_or_a_duplicate() {
    let pki = Pki::new();
    let ledgers = testnet_ledgers(10);
    let mut plan_a = Plan::new(ledgers.clone());
    plan_a.close_after = Some(4);
    let a = FakeRelay::start(plan_a, pki.path(), pki.path());
    let b = FakeRelay::start(Plan::new(ledgers.clone()), pki.path(), pki.path());
    let config = subscriber_config(&[a.addr, b.addr], &pki, Start::Seq(FIRST_SEQ), 2);
    let mut sub = connect(config).unwrap();
    let got = within(20, take(&mut sub, 10)).await;
    assert_identical(&got, &ledgers);
    assert!(got[..4].iter().all(|l| l.relay == a.addr));
    assert!(got[4..].iter().all(|l| l.relay == b.addr));
    assert_eq!(a.record().opens.len(), 1);
    assert_eq!(b.record().opens[0].start, Start::Seq(FIRST_SEQ + 4));
}

#[tokio::test]
async fn a_relay_serving_another_chain_is_caught_at_failover() {
    let pki = Pki::new();
    let ledgers = testnet_ledgers(10);
    let mut plan_a = Plan::new(ledgers.clone());
    plan_a.close_after = Some(4);
    let a = FakeRelay::start(plan_a, pki.path(), pki.path());
    let mut foreign = ledgers.clone();
    foreign[4] = from_another_chain(&ledgers[4]);
    let b = FakeRelay::start(Plan::new(foreign), pki.path(), pki.path());
    let config = subscriber_config(&[a.addr, b.addr], &pki, Start::Seq(FIRST_SEQ), 2);
    let mut sub = connect(config).unwrap();
    let got = within(20, take(&mut sub, 4)).await;
    assert_identical(&got, &ledgers[..4]);
    match within(20, sub.next()).await {
        Some(Err(SubscribeError::Verify {
            relay,
            source: VerifyError::Chain(ChainError::BrokenChain { seq, .. }),
        })) => {
            assert_eq!(relay, b.addr);
            assert_eq!(seq, FIRST_SEQ + 4);
        }
        other => panic!("expected a broken chain, got {other:?}"),
    }
    // Nothing after it: the Stream ends.
    assert!(within(5, sub.next()).await.is_none());
    assert_eq!(
        b.record().opens.len(),
        1,
        "a verification failure is not retried"
    );
}

#[tokio::test]
async fn a_tampered_chunk_is_caught_and_nothing_follows() {
    let pki = Pki::new();
    let ledgers = testnet_ledgers(8);
    let mut plan = Plan::new(ledgers.clone());
    plan.tamper = Some(FIRST_SEQ + 3);
    let relay = FakeRelay::start(plan, pki.path(), pki.path());
    let config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ), 2);
    let mut sub = connect(config).unwrap();
    let mut delivered = Vec::new();
    let error = within(20, async {
        loop {
            match sub.next().await {
                Some(Ok(l)) => delivered.push(l),
                Some(Err(e)) => return e,
                None => panic!("stream ended without an error"),
            }
        }
    })
    .await;
    // Ledgers before the tampered one come out only if they completed before it did (the
    // reassembler stops at the first error and drops what is incomplete): a prefix, in order.
    assert!(delivered.len() <= 3);
    assert_identical(&delivered, &ledgers[..delivered.len()]);
    match error {
        SubscribeError::Integrity {
            source: AssemblyError::ChecksumMismatch { seq, .. },
            ..
        } => assert_eq!(seq, FIRST_SEQ + 3),
        other => panic!("expected a checksum mismatch, got {other:?}"),
    }
    assert!(within(5, sub.next()).await.is_none());
    assert_eq!(relay.record().opens.len(), 1);
}

#[tokio::test]
async fn stalled_chunks_are_asked_for_again() {
    let pki = Pki::new();
    let ledgers = testnet_ledgers(8);
    let mut plan = Plan::new(ledgers.clone());
    plan.drop_chunks = vec![(FIRST_SEQ + 2, 1), (FIRST_SEQ + 5, 0)];
    let relay = FakeRelay::start(plan, pki.path(), pki.path());
    let config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ), 2);
    let mut sub = connect(config).unwrap();
    let got = within(20, take(&mut sub, 8)).await;
    assert_identical(&got, &ledgers);
    let record = relay.record();
    assert_eq!(
        record.opens.len(),
        1,
        "a stall is repaired within the session"
    );
    for (seq, index) in [(FIRST_SEQ + 2, 1), (FIRST_SEQ + 5, 0)] {
        assert!(
            record
                .resends
                .iter()
                .any(|r| r.seq == seq && !r.whole && r.indices == [index]),
            "no resend of {seq}/{index}: {:?}",
            record.resends
        );
    }
}

#[tokio::test]
async fn a_lost_lane_rejoins_and_nothing_is_lost() {
    let pki = Pki::new();
    let ledgers = testnet_ledgers(12);
    let mut plan = Plan::new(ledgers.clone());
    plan.kill_lane1_after = Some(3);
    let relay = FakeRelay::start(plan, pki.path(), pki.path());
    let config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ), 2);
    let mut sub = connect(config).unwrap();
    let got = within(20, take(&mut sub, 12)).await;
    assert_identical(&got, &ledgers);
    let record = relay.record();
    assert_eq!(record.opens.len(), 1, "the session survived the lane");
    within(5, async {
        while relay.record().joins.iter().filter(|j| j.0 == 1).count() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_silent_relay_trips_the_heartbeat_watchdog() {
    let pki = Pki::new();
    let mut plan = Plan::new(testnet_ledgers(2));
    plan.silent = true;
    let relay = FakeRelay::start(plan, pki.path(), pki.path());
    let mut config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ), 1);
    config.heartbeat_timeout = Some(Duration::from_millis(200));
    let sub = connect(config).unwrap();
    within(10, async {
        while relay.record().opens.len() < 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let last_error = sub.status().last_error.unwrap_or_default();
    assert!(last_error.contains("no heartbeat"), "{last_error}");
}

/// Data proves the relay alive as well as a heartbeat: a relay whose heartbeats are held up
/// (here: it sends none) while its chunks keep arriving is not given up.
#[tokio::test]
async fn data_keeps_the_heartbeat_watchdog_quiet() {
    let pki = Pki::new();
    let ledgers = testnet_ledgers(16);
    let mut plan = Plan::new(ledgers.clone());
    plan.no_heartbeats = true;
    plan.pace = Some(Duration::from_millis(60));
    let relay = FakeRelay::start(plan, pki.path(), pki.path());
    let mut config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ), 2);
    // Shorter than the 16 x 60 ms the ledgers take, longer than the gap between two.
    config.heartbeat_timeout = Some(Duration::from_millis(600));
    let mut sub = connect(config).unwrap();
    let got = within(20, take(&mut sub, 16)).await;
    assert_identical(&got, &ledgers);
    assert_eq!(relay.record().opens.len(), 1, "no session was given up");
}

#[tokio::test]
async fn a_slow_consumer_is_not_a_stalled_relay() {
    let pki = Pki::new();
    let ledgers = testnet_ledgers(8);
    let relay = FakeRelay::start(Plan::new(ledgers.clone()), pki.path(), pki.path());
    let mut config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ), 2);
    config.channel_capacity = 1;
    config.progress_timeout = Some(Duration::from_millis(100));
    let mut sub = connect(config).unwrap();
    let mut got = Vec::new();
    within(20, async {
        while got.len() < 8 {
            tokio::time::sleep(Duration::from_millis(80)).await;
            got.push(sub.next().await.unwrap().unwrap());
        }
    })
    .await;
    assert_identical(&got, &ledgers);
    assert_eq!(
        relay.record().opens.len(),
        1,
        "the watchdog fired on a slow consumer"
    );
}

#[tokio::test]
async fn below_retention_is_typed_and_not_retried() {
    let pki = Pki::new();
    let mut plan = Plan::new(testnet_ledgers(3));
    plan.below_retention = true;
    let relay = FakeRelay::start(plan, pki.path(), pki.path());
    let config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ - 100), 2);
    let mut sub = connect(config).unwrap();
    match within(10, sub.next()).await {
        Some(Err(e @ SubscribeError::BelowRetention { .. })) => {
            let SubscribeError::BelowRetention {
                requested,
                oldest,
                newest,
                ..
            } = e
            else {
                unreachable!()
            };
            assert_eq!(requested, FIRST_SEQ - 100);
            assert_eq!(oldest, FIRST_SEQ);
            assert_eq!(newest, FIRST_SEQ + 2);
        }
        other => panic!("expected BelowRetention, got {other:?}"),
    }
    assert!(within(5, sub.next()).await.is_none());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(relay.record().opens.len(), 1);
}

/// A session that falls behind the relay's retention mid-stream ends with BelowRetention for
/// the ledger it needed next (not its start), with the bounds of the relay's Error frame.
#[tokio::test]
async fn below_retention_mid_session_names_the_ledger_needed() {
    let pki = Pki::new();
    let mut plan = Plan::new(testnet_ledgers(8));
    plan.close_after = Some(3);
    plan.close_with = (ErrorCode::BelowRetention, FIRST_SEQ + 5, FIRST_SEQ + 7);
    let relay = FakeRelay::start(plan, pki.path(), pki.path());
    let config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ), 2);
    let mut sub = connect(config).unwrap();
    for k in 0..3 {
        let l = within(10, sub.next()).await.unwrap().unwrap();
        assert_eq!(l.seq, FIRST_SEQ + k);
    }
    match within(10, sub.next()).await {
        Some(Err(SubscribeError::BelowRetention {
            requested,
            oldest,
            newest,
            ..
        })) => {
            assert_eq!(requested, FIRST_SEQ + 3);
            assert_eq!((oldest, newest), (FIRST_SEQ + 5, FIRST_SEQ + 7));
        }
        other => panic!("expected BelowRetention, got {other:?}"),
    }
    assert!(within(5, sub.next()).await.is_none());
    assert_eq!(relay.record().opens.len(), 1);
}

#[tokio::test]
async fn fixed_lane_ports_are_used() {
    let pki = Pki::new();
    let ledgers = testnet_ledgers(3);
    let relay = FakeRelay::start(Plan::new(ledgers.clone()), pki.path(), pki.path());
    // Find two free consecutive ports.
    let base = loop {
        let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        let port = probe.local_addr().unwrap().port();
        if port < 65000 && std::net::UdpSocket::bind(("0.0.0.0", port + 1)).is_ok() {
            break port;
        }
    };
    let mut config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ), 2);
    config.lane_ports = Some((base, base + 1));
    let mut sub = connect(config).unwrap();
    let got = within(20, take(&mut sub, 3)).await;
    assert_identical(&got, &ledgers);
    let record = relay.record();
    assert_eq!(record.lane0_peers[0].port(), base);
    assert_eq!(record.joins[0].1.port(), base + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_incompressible_ledgers_cross_four_lanes() {
    // Real ledgers (so the chain and the content hashes verify) carrying 6 MiB of random bytes
    // each: 24 chunks of 256 KiB per ledger, striped over 4 lanes, nothing to compress.
    use rand::RngCore;
    let pki = Pki::new();
    let mut rng = rand::thread_rng();
    let ledgers: Vec<bytes::Bytes> = testnet_ledgers(4)
        .into_iter()
        .map(|l| {
            let mut pad = vec![0u8; 6 << 20];
            rng.fill_bytes(&mut pad);
            with_filler(&l, &pad)
        })
        .collect();
    let mut plan = Plan::new(ledgers.clone());
    plan.chunk_size = 256 << 10;
    plan.zstd = false;
    let relay = FakeRelay::start(plan, pki.path(), pki.path());
    let mut config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ), 4);
    // Debug builds move a few hundred MB/s: leave the default stall timeout.
    config.stall_timeout = Duration::from_millis(500);
    let mut sub = connect(config).unwrap();
    let started = std::time::Instant::now();
    let got = within(60, take(&mut sub, 4)).await;
    assert_identical(&got, &ledgers);
    assert!(got.iter().all(|l| l.wire_bytes == l.data.len() as u64));
    let record = relay.record();
    assert_eq!(record.opens.len(), 1, "{:?}", sub.status().last_error);
    assert_eq!(record.joins.len(), 3);
    eprintln!("4 x 6 MiB over 4 lanes in {:?}", started.elapsed());
}

/// A relay that stops reading its control stream (it gives 64 bytes
/// of credit, then our acks pile up in flow control) is given up after the heartbeat timeout,
/// like a silent one, and the subscription goes on from the next relay with no gap. Before,
/// the session loop waited in its write of an `Ack` forever: no watchdog could fire.
#[tokio::test]
async fn a_relay_that_stops_reading_our_acks_is_left_for_the_next_one() {
    let pki = Pki::new();
    let ledgers = testnet_ledgers(40);
    let mut plan = Plan::new(ledgers.clone());
    plan.deaf = true;
    plan.control_credit = Some(64);
    let deaf = FakeRelay::start(plan, pki.path(), pki.path());
    let good = FakeRelay::start(Plan::new(ledgers.clone()), pki.path(), pki.path());
    let config = subscriber_config(&[deaf.addr, good.addr], &pki, Start::Seq(FIRST_SEQ), 1);
    let mut sub = connect(config).unwrap();
    let got = within(30, take(&mut sub, 40)).await;
    assert_identical(&got, &ledgers);
    assert!(got.iter().any(|l| l.relay == good.addr), "failed over");
    assert!(deaf.record().acked == 0, "the deaf relay read nothing");
}
