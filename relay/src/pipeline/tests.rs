//! Unit tests of `pipeline`.

use std::time::Duration;

use ledger_relay_wire::compress::decompress;
use ledger_relay_wire::Limits;
use tokio::sync::broadcast::error::TryRecvError;

use super::*;
use crate::hub::Item;
use crate::source::{now_ns, synthetic_ledgers, SyntheticSpec};

/// Three 600 KiB ledgers: ten 64 KiB chunks each.
fn ledgers() -> Vec<Bytes> {
    let spec = SyntheticSpec {
        size: 600 << 10,
        ratio: 2.0,
        count: Some(3),
        start: 2,
        emit: None,
        ..SyntheticSpec::default()
    };
    synthetic_ledgers(&spec).map(Bytes::from).collect()
}

fn start(
    store_and_forward: bool,
) -> (
    tokio::sync::mpsc::UnboundedSender<SourceEvent>,
    Arc<Hub>,
    PipelineHandle,
) {
    start_with(store_and_forward, OnRefusal::Stop(CancellationToken::new()))
}

fn start_with(
    store_and_forward: bool,
    on_refusal: OnRefusal,
) -> (
    tokio::sync::mpsc::UnboundedSender<SourceEvent>,
    Arc<Hub>,
    PipelineHandle,
) {
    let config = PipelineConfig {
        chunk_size: 64 << 10,
        compress_threads: 2,
        store_and_forward,
        ..PipelineConfig::default()
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let hub = Arc::new(Hub::new(512, 4));
    let handle = spawn(
        config,
        rx,
        hub.clone(),
        None,
        StartState::default(),
        Metrics::new(),
        on_refusal,
    )
    .unwrap();
    (tx, hub, handle)
}

/// Sends everything of `ledger` but its end, in 100 KiB pieces.
fn send_body(tx: &tokio::sync::mpsc::UnboundedSender<SourceEvent>, ledger: &Bytes) {
    tx.send(SourceEvent::Begin {
        len: ledger.len() as u32,
        at_ns: now_ns(),
    })
    .unwrap();
    for piece in ledger.chunks(100 << 10) {
        tx.send(SourceEvent::Data(Bytes::copy_from_slice(piece)))
            .unwrap();
    }
}

/// The next broadcast item, waiting up to 5 s.
fn next_item(rx: &mut tokio::sync::broadcast::Receiver<Item>) -> Item {
    for _ in 0..500 {
        match rx.try_recv() {
            Ok(item) => return item,
            Err(TryRecvError::Empty) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("broadcast: {e}"),
        }
    }
    panic!("no item within 5 s")
}

fn raw(ledger: &CompleteLedger) -> Vec<u8> {
    let mut out = Vec::new();
    for c in &ledger.chunks {
        let h = &c.header;
        out.extend(decompress(h.codec, &c.payload, h.raw_len, &Limits::default()).unwrap());
    }
    out
}

#[test]
fn store_and_forward_publishes_nothing_of_a_ledger_before_its_end() {
    let want = ledgers();
    let (tx, hub, handle) = start(true);
    let mut rx = hub.join().rx;
    for ledger in &want {
        send_body(&tx, ledger);
        // Far longer than compressing ten chunks takes: in chunked mode they are out by now
        // (see the test below).
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            matches!(rx.try_recv(), Err(TryRecvError::Empty)),
            "nothing is published before the source's end"
        );
        let before = now_ns();
        tx.send(SourceEvent::End { at_ns: before }).unwrap();
        let Item::End(got) = next_item(&mut rx) else {
            panic!("store-and-forward publishes the ledger whole, in its end record")
        };
        assert_eq!(got.end.last_byte_ns, before);
        assert_eq!(got.chunks.len(), 10);
        assert_eq!(got.end.chunk_count, 10);
        assert!(raw(&got) == ledger[..], "ledger {} intact", got.end.seq);
        assert!(hub.join().current.is_none_or(|c| c.chunks.is_empty()));
    }
    drop(tx);
    handle.join();
}

#[test]
fn a_whole_ledger_is_chunked_exactly_as_the_live_pipeline_does() {
    let want = ledgers();
    let (tx, hub, handle) = start(false);
    let mut rx = hub.join().rx;
    let config = PipelineConfig {
        chunk_size: 64 << 10,
        ..PipelineConfig::default()
    };
    for ledger in &want {
        send_body(&tx, ledger);
        tx.send(SourceEvent::End { at_ns: now_ns() }).unwrap();
        let live = loop {
            if let Item::End(l) = next_item(&mut rx) {
                break l;
            }
        };
        let info = peek_header(ledger).unwrap().unwrap();
        let mut comp = Compressor::new(config.codec, config.zstd_level);
        let whole = complete_ledger(ledger, &info, &config, &mut comp, 1, 2);
        let (mut a, mut b) = (live.end, whole.end);
        (
            a.first_byte_ns,
            a.last_byte_ns,
            b.first_byte_ns,
            b.last_byte_ns,
        ) = (0, 0, 0, 0);
        assert_eq!(a, b, "the same end record");
        assert_eq!(live.chunks.len(), whole.chunks.len());
        for (x, y) in live.chunks.iter().zip(&whole.chunks) {
            assert_eq!(x.header, y.header);
            assert!(
                x.payload == y.payload,
                "chunk {} compressed the same",
                x.header.index
            );
        }
    }
    drop(tx);
    handle.join();
}

#[test]
fn chunked_mode_publishes_chunks_before_the_end() {
    let want = ledgers();
    let (tx, hub, handle) = start(false);
    let mut rx = hub.join().rx;
    send_body(&tx, &want[0]);
    // Nine full chunks are cut before the end (the tenth is the remainder).
    for i in 0..9 {
        match next_item(&mut rx) {
            Item::Chunk(c) => assert_eq!(c.header.seq, 2, "chunk {i}"),
            other => panic!("expected a chunk before the end, got {other:?}"),
        }
    }
    tx.send(SourceEvent::End { at_ns: now_ns() }).unwrap();
    assert!(matches!(next_item(&mut rx), Item::Chunk(_)));
    let Item::End(got) = next_item(&mut rx) else {
        panic!("end record last")
    };
    assert!(raw(&got) == want[0][..]);
    drop(tx);
    handle.join();
}

/// A source that can go elsewhere (a `relay:` source) is told when its output is refused,
/// and is not stopped: nothing of the refused ledger is published, what it sends before it
/// starts again (an `Abort`) is ignored, and after that its ledgers are taken as usual.
#[test]
fn a_refused_ledger_is_discarded_and_its_source_told_not_stopped() {
    let want = ledgers();
    let (tell, mut refused) = tokio::sync::mpsc::unbounded_channel();
    let (tx, hub, handle) = start_with(true, OnRefusal::Tell(tell));
    let mut rx = hub.join().rx;
    let published = |rx: &mut tokio::sync::broadcast::Receiver<Item>| {
        let Item::End(got) = next_item(rx) else {
            panic!("whole ledgers only")
        };
        got.end.seq
    };
    send_ledger(&tx, &want[0]);
    assert_eq!(published(&mut rx), 2);
    // Ledger 3 with a byte of its header changed, then (not yet told) the rest of it and the
    // next ledger, which no longer follows anything published.
    let mut forged = want[1].to_vec();
    forged[100] ^= 0x01;
    send_ledger(&tx, &Bytes::from(forged));
    send_ledger(&tx, &want[2]);
    let told = refused.blocking_recv().unwrap();
    let hash2 = peek_header(&want[0]).unwrap().unwrap().hash;
    assert_eq!(told.seq, None, "its header does not hash to its hash");
    assert_eq!(told.resume_after, Some((2, hash2)));
    assert_eq!(told.epoch, 0);
    assert!(told.reason.contains("header"), "{}", told.reason);
    // The source starts again after ledger 2.
    tx.send(SourceEvent::Abort {
        reason: "going on from another upstream".into(),
    })
    .unwrap();
    send_ledger(&tx, &want[1]);
    send_ledger(&tx, &want[2]);
    assert_eq!(published(&mut rx), 3, "nothing of the refused ledger");
    assert_eq!(published(&mut rx), 4);
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    assert!(refused.try_recv().is_err(), "told once");
    // A later refusal carries the epoch the source is in now.
    send_ledger(&tx, &want[1]);
    send_ledger(&tx, &small_ledgers(6)[5]);
    let told = refused.blocking_recv().unwrap();
    assert_eq!((told.seq, told.epoch), (Some(7), 1), "{}", told.reason);
    drop(tx);
    handle.join();
}

/// `n` small ledgers from sequence 2: each one 64 KiB chunk.
fn small_ledgers(n: u64) -> Vec<Bytes> {
    let spec = SyntheticSpec {
        size: 16 << 10,
        ratio: 2.0,
        count: Some(n),
        start: 2,
        emit: None,
        ..SyntheticSpec::default()
    };
    synthetic_ledgers(&spec).map(Bytes::from).collect()
}

/// A ring whose writes wait at the gate until it opens. The gate's state: 0 shut, 1 shut with
/// a write waiting at it, 2 open.
fn gated_ring(dir: &std::path::Path) -> (Arc<Ring>, Arc<(Mutex<u8>, std::sync::Condvar)>) {
    let ring = Arc::new(Ring::open(&crate::ring::RingConfig::new(dir)).unwrap());
    let gate = Arc::new((Mutex::new(0u8), std::sync::Condvar::new()));
    let g = gate.clone();
    ring.set_hook(Some(Arc::new(move |at| {
        if at == "append:index" {
            let (state, cv) = &*g;
            let mut s = state.lock().unwrap();
            if *s == 0 {
                *s = 1;
            }
            while *s != 2 {
                s = cv.wait(s).unwrap();
            }
        }
    })));
    (ring, gate)
}

/// Waits until a write waits at the gate.
fn gate_entered(gate: &(Mutex<u8>, std::sync::Condvar)) {
    wait_until("a write at the gate", || *gate.0.lock().unwrap() == 1);
}

fn open_gate(gate: &(Mutex<u8>, std::sync::Condvar)) {
    *gate.0.lock().unwrap() = 2;
    gate.1.notify_all();
}

fn with_ring(
    ring: Arc<Ring>,
    config: PipelineConfig,
    start: StartState,
) -> (
    tokio::sync::mpsc::UnboundedSender<SourceEvent>,
    Arc<Hub>,
    Arc<Metrics>,
    PipelineHandle,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let hub = Arc::new(Hub::new(512, 4));
    let metrics = Metrics::new();
    let handle = spawn(
        PipelineConfig {
            chunk_size: 64 << 10,
            compress_threads: 1,
            ..config
        },
        rx,
        hub.clone(),
        Some(ring),
        start,
        metrics.clone(),
        OnRefusal::Stop(CancellationToken::new()),
    )
    .unwrap();
    (tx, hub, metrics, handle)
}

fn send_ledger(tx: &tokio::sync::mpsc::UnboundedSender<SourceEvent>, ledger: &Bytes) {
    send_body(tx, ledger);
    tx.send(SourceEvent::End { at_ns: now_ns() }).unwrap();
}

/// Waits up to 10 s for `cond`.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("not within 10 s: {what}");
}

/// Issue 13, item 4: the ring writer is stuck (a slow disk) while the source delivers 100
/// ledgers. Every one of them stays reachable (in memory until the ring has it), none is let
/// go while the ring still has to write it; then the ring writes them all, in one run.
#[test]
fn every_ledger_waiting_for_the_ring_stays_reachable() {
    let dir = tempfile::tempdir().unwrap();
    let (ring, gate) = gated_ring(dir.path());
    let (tx, hub, _metrics, handle) = with_ring(
        ring.clone(),
        PipelineConfig::default(),
        StartState::default(),
    );
    let want = small_ledgers(100);
    for l in &want {
        send_ledger(&tx, l);
    }
    wait_until("all published", || hub.tip().newest == 101);
    for seq in 2..=101 {
        assert!(
            hub.recent(seq).is_some(),
            "ledger {seq} waits for the ring and is not reachable (memory holds from {:?})",
            hub.oldest_recent()
        );
    }
    open_gate(&gate);
    wait_until("all written", || ring.range() == Some((2, 101)));
    drop(tx);
    handle.join();
}

/// Issue 13, item 4: the ring's queue is bounded in bytes. With the writer stuck, the oldest
/// queued ledgers are given up for the ring (counted), the hub keeps no more than the queue
/// holds, and the ring then starts a new run after the gap, keeping the ledger it wrote first.
#[test]
fn the_ring_queue_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (ring, gate) = gated_ring(dir.path());
    let want = small_ledgers(100);
    // About ten ledgers' payload.
    let one = {
        let info = peek_header(&want[0]).unwrap().unwrap();
        let config = PipelineConfig {
            chunk_size: 64 << 10,
            ..PipelineConfig::default()
        };
        let mut comp = Compressor::new(config.codec, config.zstd_level);
        let l = complete_ledger(&want[0], &info, &config, &mut comp, 0, 0);
        l.chunks.iter().map(|c| c.payload.len() as u64).sum::<u64>()
    };
    let config = PipelineConfig {
        ring_queue_bytes: one * 10,
        ..PipelineConfig::default()
    };
    let (tx, hub, metrics, handle) = with_ring(ring.clone(), config, StartState::default());
    // The writer takes ledger 2 and is held inside it; the rest queue up behind.
    send_ledger(&tx, &want[0]);
    gate_entered(&gate);
    for l in &want[1..] {
        send_ledger(&tx, l);
    }
    wait_until("all published", || hub.tip().newest == 101);
    wait_until("queue trimmed", || {
        metrics.ring_queue_bytes.load(Ordering::Relaxed) <= one * 10
    });
    let given_up = metrics.ring_given_up_total.load(Ordering::Relaxed);
    assert!(given_up >= 80, "{given_up} given up");
    // Memory: the ledger being written, the queue (at most ~10) and the 4 recent ones.
    let oldest = hub.oldest_recent().unwrap();
    let held = (oldest..=101).filter(|s| hub.recent(*s).is_some()).count();
    assert!(held <= 1 + 12 + 4, "{held} ledgers in memory from {oldest}");
    open_gate(&gate);
    // The writer counts the gap once the append returned, after the ring showed the ledger.
    wait_until("the newest written", || {
        ring.range().is_some_and(|r| r.1 == 101)
            && metrics.ring_gaps_total.load(Ordering::Relaxed) > 0
    });
    assert_eq!(metrics.ring_resets_total.load(Ordering::Relaxed), 0);
    assert_eq!(
        metrics.ring_gaps_total.load(Ordering::Relaxed),
        1,
        "a new run after the gap"
    );
    let runs = ring.runs();
    assert_eq!(runs.len(), 2, "ledger 2 is kept: {runs:?}");
    assert_eq!(runs[0], (2, 2), "{runs:?}");
    assert_eq!(runs[1].1, 101, "{runs:?}");
    drop(tx);
    handle.join();
}

/// A first run of the pipeline with a ring in `dir` (closed again on return) writes `ledgers`,
/// consecutive from sequence 2.
fn first_run(dir: &std::path::Path, ledgers: &[Bytes]) {
    let ring = Arc::new(Ring::open(&crate::ring::RingConfig::new(dir)).unwrap());
    let (tx, _hub, _m, handle) = with_ring(
        ring.clone(),
        PipelineConfig::default(),
        StartState::default(),
    );
    for l in ledgers {
        send_ledger(&tx, l);
    }
    let last = 1 + ledgers.len() as u32;
    wait_until("the first run written", || ring.range() == Some((2, last)));
    drop(tx);
    handle.join();
}

/// Overwrites the last byte of ledger `seq`'s file in the (closed) ring at `dir`, so that its
/// last part's checksum fails.
fn damage(dir: &std::path::Path, seq: u32) {
    let path = crate::ring::ledger_file(dir, seq).expect("the ledger is stored");
    let mut v = std::fs::read(&path).unwrap();
    let at = v.len() - 1;
    v[at] ^= 0x55;
    std::fs::write(&path, v).unwrap();
}

/// Issue 13, item 5: a ledger whose stored copy is damaged, emitted again by the source (core
/// re-emits after a restart), is the same ledger, not a new run: the ring keeps everything,
/// the damaged copy is written over with the re-emitted one, the ledgers after it are
/// duplicates, and the source's next new ledger continues the ring.
#[test]
fn a_damaged_ledger_emitted_again_is_repaired_not_a_new_run() {
    let dir = tempfile::tempdir().unwrap();
    let want = small_ledgers(12);
    first_run(dir.path(), &want[..10]);
    damage(dir.path(), 5);
    let ring = Arc::new(Ring::open(&crate::ring::RingConfig::new(dir.path())).unwrap());
    assert_eq!(ring.range(), Some((2, 11)));
    assert!(matches!(ring.get(5), Err(RingError::Corrupt { .. })));
    let start = StartState {
        newest: ring.newest(),
    };
    let (tx, hub, metrics, handle) = with_ring(ring.clone(), PipelineConfig::default(), start);
    // The source starts again at 5 and goes on to 13.
    for l in &want[3..] {
        send_ledger(&tx, l);
    }
    wait_until("13 written", || ring.range().is_some_and(|r| r.1 == 13));
    assert_eq!(ring.range(), Some((2, 13)), "the run is kept");
    assert_eq!(metrics.ring_resets_total.load(Ordering::Relaxed), 0);
    wait_until("5 repaired", || matches!(ring.get(5), Ok(Some(_))));
    let (end, _) = ring.get(5).unwrap().unwrap();
    assert_eq!(end.seq, 5);
    // 6..=11 were duplicates; 12 and 13 were published.
    assert_eq!(metrics.duplicates_dropped_total.load(Ordering::Relaxed), 6);
    assert_eq!(hub.tip().newest, 13);
    assert!(hub.recent(5).is_none(), "the repair is not published");
    drop(tx);
    handle.join();
}

/// Issue 13, item 2: a gap in what the ring is given (the relay was down while core went on,
/// or the ring's queue gave ledgers up) starts a new run without deleting the old one: both
/// runs are kept, read back and found again when the ring is opened again.
#[test]
fn a_gap_starts_a_new_run_and_keeps_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let want = small_ledgers(24); // 2..=25
    let open = || Arc::new(Ring::open(&crate::ring::RingConfig::new(dir.path())).unwrap());
    first_run(dir.path(), &want[..10]);
    let ring = open();
    let start = StartState {
        newest: ring.newest(),
    };
    let (tx, hub, metrics, handle) = with_ring(ring.clone(), PipelineConfig::default(), start);
    // The source comes back at 20: ledgers 12..=19 passed while the relay was away.
    for l in &want[18..] {
        send_ledger(&tx, l);
    }
    wait_until("25 written", || ring.range().is_some_and(|r| r.1 == 25));
    assert_eq!(hub.tip().newest, 25);
    assert_eq!(metrics.ring_resets_total.load(Ordering::Relaxed), 0);
    let held = |ring: &Ring| -> Vec<u32> {
        (1..=26)
            .filter(|s| matches!(ring.get(*s), Ok(Some((end, _))) if end.seq == *s))
            .collect()
    };
    let both: Vec<u32> = (2..=11).chain(20..=25).collect();
    assert_eq!(held(&ring), both, "the old run is kept beside the new one");
    drop(tx);
    handle.join();
    drop(ring);
    let ring = open();
    assert_eq!(held(&ring), both, "both runs are found again on opening");
    assert_eq!(ring.newest().map(|n| n.0), Some(25));
}
