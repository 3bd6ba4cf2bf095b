//! Lane loss against the real relay (`docs/architecture.md`, "Lanes": "a lane that dies mid-ledger costs nothing but
//! time"): a raw 4-lane session reassembles the 320 testnet ledgers with the wire crate's
//! reassembler while one lane's connection is closed in the middle of the stream; every ledger
//! still arrives, in order and byte-identical, and the lane then rejoins.

use std::time::{Duration, Instant};

use bytes::Bytes;
use ledger_relay_transport::{read_single_frame, FrameIo};
use ledger_relay_wire::frame::{Frame, Resend, Start};
use ledger_relay_wire::{Limits, Reassembler};
use tokio::sync::mpsc;

use crate::support::{
    certs, control, in_the_ring, lane_join, raw_connect, relay_config, session_open,
    testnet_ledgers, tls_client, within, Raw, Running, FIRST, TESTNET,
};
use ledger_relay::source::{synthetic_ledgers, SyntheticSpec};

/// Reads every data stream of a lane and forwards its frame, tagged with the lane.
fn drain(lane: u8, conn: quinn::Connection, tx: mpsc::UnboundedSender<(u8, Frame)>) {
    tokio::spawn(async move {
        while let Ok(mut recv) = conn.accept_uni().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Ok(f) = read_single_frame(&mut recv, &Limits::default()).await {
                    let _ = tx.send((lane, f));
                }
            });
        }
    });
}

async fn join(
    relay: &Running,
    dir: &std::path::Path,
    id: u64,
    token: [u8; 16],
    lane: u8,
) -> (Raw, FrameIo) {
    let raw = raw_connect(relay, tls_client(dir, "rpc-1")).await;
    let mut io = control(&raw.conn).await;
    io.writer.write(&lane_join(id, token, lane)).await.unwrap();
    match within(5, "lane accept", io.reader.next()).await {
        Ok(Some(Frame::LaneAccept(l))) if l == lane => {}
        other => panic!("expected LaneAccept({lane}), got {other:?}"),
    }
    (raw, io)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_lost_mid_stream_costs_nothing_and_rejoins() {
    let source = format!("file:{TESTNET}");
    lose_a_lane(&source, testnet_ledgers(), FIRST, true).await;
}

/// Multi-chunk ledgers (2 MiB: 8 chunks each), live rather than replayed, so the lane dies
/// with parts of ledgers in flight on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_lost_mid_ledger_costs_nothing() {
    let spec = SyntheticSpec {
        size: 2 << 20,
        ratio: 1.0,
        count: Some(60),
        start: 2,
        emit: None,
        ..SyntheticSpec::default()
    };
    let want: Vec<Bytes> = synthetic_ledgers(&spec).map(Bytes::from).collect();
    let source = "synthetic:size=2MiB,ratio=1,count=60,start=2".to_string();
    lose_a_lane(&source, want, 2, false).await;
}

async fn lose_a_lane(source: &str, want: Vec<Bytes>, first: u32, replay: bool) {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(dir.path());
    let mut config = relay_config(certs.path(), &dir.path().join("data"), source);
    config.source_options.cadence = Duration::from_millis(if replay { 3 } else { 40 });
    let relay = Running::start(config).await;
    if replay {
        in_the_ring(&relay).await;
    }
    let last = first + want.len() as u32 - 1;

    let lane0 = raw_connect(&relay, tls_client(certs.path(), "rpc-1")).await;
    let mut io = control(&lane0.conn).await;
    io.writer
        .write(&session_open(Start::Seq(first), 4))
        .await
        .unwrap();
    let accept = match within(10, "session accept", io.reader.next()).await {
        Ok(Some(Frame::SessionAccept(a))) => a,
        other => panic!("expected SessionAccept, got {other:?}"),
    };
    assert_eq!(accept.lanes, 4);
    let (tx, mut rx) = mpsc::unbounded_channel();
    drain(0, lane0.conn.clone(), tx.clone());
    let mut lanes = Vec::new();
    for l in 1..4u8 {
        let (raw, lio) = join(&relay, certs.path(), accept.session_id, accept.token, l).await;
        drain(l, raw.conn.clone(), tx.clone());
        lanes.push((raw, lio));
    }

    let start = Instant::now();
    let now = || start.elapsed();
    let mut r = Reassembler::new(Limits::default(), first, Duration::from_millis(200));
    let mut got: Vec<(u32, Bytes)> = Vec::new();
    let mut per_lane = [0u64; 4];
    let mut killed = false;
    let mut resends = 0;
    let m = &relay.relay.metrics;
    within(60, "every ledger despite the lost lane", async {
        while got.len() < want.len() {
            let next = tokio::time::timeout(Duration::from_millis(50), rx.recv()).await;
            if let Ok(Some((lane, frame))) = next {
                per_lane[lane as usize] += 1;
                match frame {
                    Frame::Chunk(c) => r.handle_chunk(&c, now()).unwrap(),
                    Frame::LedgerEnd(e) => r.handle_end(&e, now()).unwrap(),
                    other => panic!("unexpected data frame {other:?}"),
                }
            }
            r.handle_timeout(now());
            while let Some(m) = r.poll_missing() {
                resends += 1;
                let f = Frame::Resend(Resend {
                    seq: m.seq,
                    whole: m.whole,
                    indices: m.indices,
                });
                io.writer.write(&f).await.unwrap();
            }
            while let Some(l) = r.poll_ledger() {
                io.writer.write(&Frame::Ack(l.seq)).await.unwrap();
                got.push((l.seq, l.data));
            }
            // Lose lane 2 once a third of the ledgers is in, while chunks are in flight on it.
            if !killed && got.len() >= want.len() / 3 && per_lane[2] > 0 {
                lanes[1].0.conn.close(0u32.into(), b"lane lost");
                killed = true;
            }
        }
    })
    .await;
    assert!(killed);
    for (i, (seq, data)) in got.iter().enumerate() {
        assert_eq!(*seq, first + i as u32, "order");
        assert!(*data == want[i], "ledger {seq} differs");
    }
    assert_eq!(got.last().map(|g| g.0), Some(last));
    assert!(
        per_lane.iter().all(|n| *n > 0),
        "every lane carried data: {per_lane:?}"
    );
    eprintln!(
        "frames per lane {per_lane:?}, resend requests {resends}, relay resent {} chunks, {:?}",
        m.resent_chunks_total
            .load(std::sync::atomic::Ordering::Relaxed),
        r.stats()
    );

    // The lost lane rejoins and the relay counts four lanes again.
    let (raw2, _io2) = join(&relay, certs.path(), accept.session_id, accept.token, 2).await;
    within(5, "four lanes again", async {
        while m.lanes_open.load(std::sync::atomic::Ordering::Relaxed) != 4 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    raw2.conn.close(0u32.into(), b"done");
    lane0.conn.close(0u32.into(), b"done");
    relay.stop().await;
}
