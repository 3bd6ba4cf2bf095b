//! Chunk + compress and reassembly throughput on 14.5 MiB ledgers of real ledger meta.
//!
//! The ledger is built by concatenating the 320 real testnet ledgers from `testdata/`
//! until it reaches 14.5 MiB (the Phase 3 stress size), so compression sees real XDR.
//! Run: `cargo bench -p ledger-relay-wire --bench wire`.

#![allow(missing_docs)] // criterion_group! generates an undocumented public function

use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ledger_relay_wire::chunker::{ledger_chunks, Chunker, DEFAULT_CHUNK_SIZE};
use ledger_relay_wire::compress::{Codec, Compressor};
use ledger_relay_wire::frame::{Chunk, LedgerEnd};
use ledger_relay_wire::record::{Records, DEFAULT_MAX_RECORD_LEN};
use ledger_relay_wire::{Limits, Reassembler};

const LEDGER_SIZE: usize = 14_500 * 1024;

fn real_like_ledger() -> Bytes {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/testnet/testnet-1410048-1410367.lcm-v0.framed.xdr"
    );
    let file = std::fs::File::open(path).expect("testnet sample in testdata/");
    let records: Vec<Vec<u8>> = Records::new(std::io::BufReader::new(file), DEFAULT_MAX_RECORD_LEN)
        .collect::<Result<_, _>>()
        .expect("testnet sample reads");
    let mut out = Vec::with_capacity(LEDGER_SIZE);
    'fill: loop {
        for r in &records {
            if out.len() >= LEDGER_SIZE {
                break 'fill;
            }
            out.extend_from_slice(r);
        }
    }
    out.truncate(LEDGER_SIZE);
    Bytes::from(out)
}

fn frames(raw: &Bytes, codec: Codec) -> (Vec<Chunk>, LedgerEnd) {
    let (chunks, summary) =
        ledger_chunks(1, raw, DEFAULT_CHUNK_SIZE, &mut Compressor::new(codec, 1));
    (chunks, summary.end(1, [0; 32], [0; 32], 0, 0))
}

fn bench(c: &mut Criterion) {
    let raw = real_like_ledger();
    for codec in Codec::ALL {
        let (chunks, _) = frames(&raw, codec);
        let wire: usize = chunks.iter().map(|c| c.payload.len()).sum();
        let fallbacks = chunks.iter().filter(|c| c.header.codec != codec).count();
        eprintln!(
            "{}: {} raw bytes -> {} wire bytes in {} chunks (ratio {:.2}x, {} sent raw)",
            codec.name(),
            raw.len(),
            wire,
            chunks.len(),
            raw.len() as f64 / wire as f64,
            fallbacks
        );
    }
    let mut g = c.benchmark_group("chunk_compress");
    g.throughput(Throughput::Bytes(raw.len() as u64));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(5));
    for codec in Codec::ALL {
        g.bench_function(BenchmarkId::from_parameter(codec.name()), |b| {
            let mut comp = Compressor::new(codec, 1);
            let mut chunker = Chunker::new(DEFAULT_CHUNK_SIZE);
            let mut out = Vec::new();
            b.iter(|| {
                // Core writes in 64-256 KiB pieces; feed 128 KiB pieces.
                let mut wire = 0usize;
                for piece in raw.chunks(128 << 10) {
                    chunker.push(piece, &mut out);
                    for ch in out.drain(..) {
                        wire += comp.compress(&ch.data).1.len();
                    }
                }
                let (last, _) = chunker.finish();
                if let Some(ch) = last {
                    wire += comp.compress(&ch.data).1.len();
                }
                wire
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("reassemble");
    g.throughput(Throughput::Bytes(raw.len() as u64));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(5));
    for codec in Codec::ALL {
        let (chunks, end) = frames(&raw, codec);
        g.bench_function(BenchmarkId::from_parameter(codec.name()), |b| {
            b.iter(|| {
                let mut r = Reassembler::new(Limits::default(), 1, Duration::from_secs(1));
                // Reverse order: the worst case for the ordering logic.
                for ch in chunks.iter().rev() {
                    r.handle_chunk(ch, Duration::ZERO).expect("valid chunk");
                }
                r.handle_end(&end, Duration::ZERO).expect("valid end");
                r.poll_ledger().expect("complete").data.len()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
