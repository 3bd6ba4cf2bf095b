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
        CancellationToken::new(),
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
