//! Cost of the content check (layer 5: transaction set and result hashes) on 14.5 MiB ledgers
//! of real transactions, next to a full `stellar-xdr` decode and a plain sha256 of the same
//! bytes, measured in the same run.
//!
//! The ledgers are real ones scaled up: the transactions (envelopes and their
//! `txProcessing` entries, meta included) of a real ledger repeated until the ledger holds
//! 14.5 MiB, with the header's `txSetHash`, `txSetResultHash` and hash recomputed so that the
//! check passes. `v2-soroban`: standalone ledger 85 (protocol 23, Soroban load test, its real
//! 38 transactions; see `wire/tests/content.rs` on why the sample carries more). `v0-classic`:
//! pubnet ledger 46154623 (protocol 19, classic operations).
//!
//! Beside them, what the check adds where the relay runs it, as a lake's ledgers enter its ring
//! (`lake::decode_batch`): per ledger, the check alone against the whole read of a one-ledger
//! batch, in CPU time, on every real ledger of `testdata/` and on the scaled ones.
//! Run: `cargo bench -p ledger-relay-wire --bench content`.

#![allow(missing_docs)] // criterion_group! generates an undocumented public function

use std::fs::File;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ledger_relay_wire::content::{check_content, content_hashes};
use ledger_relay_wire::header::peek_header;
use ledger_relay_wire::lake::{decode_batch, decompress_object, encode_batch, BatchLimits};
use ledger_relay_wire::record::{open_stream, Records, DEFAULT_MAX_RECORD_LEN};
use sha2::{Digest, Sha256};
use stellar_xdr::{
    GeneralizedTransactionSet, Hash, LedgerCloseMeta, Limits, ReadXdr, TransactionPhase,
    TransactionSetV1, WriteXdr,
};

const LEDGER_SIZE: usize = 14_500 * 1024;

fn testdata(name: &str) -> String {
    format!("{}/../testdata/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn xdr(v: &impl WriteXdr) -> Vec<u8> {
    v.to_xdr(Limits::none()).expect("encodes")
}

/// Rewrites the header's content hashes and hash to match the body.
fn rehash(mut lcm: LedgerCloseMeta) -> Vec<u8> {
    let bytes = xdr(&lcm);
    let info = peek_header(&bytes).unwrap().unwrap();
    let h = content_hashes(&bytes, &info).expect("well-formed");
    let entry = match &mut lcm {
        LedgerCloseMeta::V0(v) => &mut v.ledger_header,
        LedgerCloseMeta::V1(v) => &mut v.ledger_header,
        LedgerCloseMeta::V2(v) => &mut v.ledger_header,
    };
    entry.header.scp_value.tx_set_hash = Hash(h.tx_set_hash);
    entry.header.tx_set_result_hash = Hash(h.tx_set_result_hash);
    entry.hash = Hash(Sha256::digest(xdr(&entry.header)).into());
    xdr(&lcm)
}

/// Standalone ledger 85's real transactions, repeated to 14.5 MiB.
fn v2_soroban() -> Vec<u8> {
    let stream = open_stream(
        File::open(testdata(
            "standalone/load-test-ledgers-v23-standalone.xdr.zstd",
        ))
        .unwrap(),
    )
    .unwrap();
    let record = Records::new(stream, DEFAULT_MAX_RECORD_LEN)
        .nth(1)
        .unwrap()
        .unwrap();
    let LedgerCloseMeta::V2(mut v) = LedgerCloseMeta::from_xdr(&record, Limits::none()).unwrap()
    else {
        panic!("v2")
    };
    let GeneralizedTransactionSet::V1(set) = &v.tx_set;
    // The real ledger: its first two phases (the second holds one cluster of 38 Soroban
    // transactions) and their 38 txProcessing entries.
    let mut phases: Vec<TransactionPhase> = set.phases[..2].to_vec();
    let TransactionPhase::V1(parallel) = &mut phases[1] else {
        panic!("phase 1 is parallel")
    };
    let cluster = parallel.execution_stages[0][0].to_vec();
    let entries = v.tx_processing[..cluster.len()].to_vec();
    let per_copy = xdr(&v.tx_processing[0]).len() * cluster.len() * 2;
    let copies = LEDGER_SIZE / per_copy + 1;
    let mut txs = Vec::new();
    let mut processing = Vec::new();
    let mut len = 0;
    'grow: for _ in 0..copies * 4 {
        for (env, entry) in cluster.iter().zip(&entries) {
            len += xdr(env).len() + xdr(entry).len();
            txs.push(env.clone());
            processing.push(entry.clone());
            if len >= LEDGER_SIZE {
                break 'grow;
            }
        }
    }
    let mut stages = parallel.execution_stages.to_vec();
    stages[0] = vec![txs.try_into().unwrap()].try_into().unwrap();
    parallel.execution_stages = stages.try_into().unwrap();
    v.tx_set = GeneralizedTransactionSet::V1(TransactionSetV1 {
        previous_ledger_hash: set.previous_ledger_hash.clone(),
        phases: phases.try_into().unwrap(),
    });
    v.tx_processing = processing.try_into().unwrap();
    rehash(LedgerCloseMeta::V2(v))
}

/// Pubnet ledger 46154623's transactions, repeated to 14.5 MiB.
fn v0_classic() -> Vec<u8> {
    let text = std::fs::read_to_string(testdata("pubnet/ledgers-base64.txt")).unwrap();
    let line = text.lines().nth(3).unwrap();
    let bytes = base64_decode(line);
    let LedgerCloseMeta::V0(mut v) = LedgerCloseMeta::from_xdr(&bytes, Limits::none()).unwrap()
    else {
        panic!("v0")
    };
    assert_eq!(v.ledger_header.header.ledger_seq, 46154623);
    let txs = v.tx_set.txs.to_vec();
    let entries = v.tx_processing.to_vec();
    let mut all_txs = Vec::new();
    let mut all_entries = Vec::new();
    let mut len = 0;
    'grow: loop {
        for (env, entry) in txs.iter().zip(&entries) {
            len += xdr(env).len() + xdr(entry).len();
            all_txs.push(env.clone());
            all_entries.push(entry.clone());
            if len >= LEDGER_SIZE {
                break 'grow;
            }
        }
    }
    v.tx_set.txs = all_txs.try_into().unwrap();
    v.tx_processing = all_entries.try_into().unwrap();
    rehash(LedgerCloseMeta::V0(v))
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64"),
        }
    };
    let text = text.trim_end().trim_end_matches('=').as_bytes();
    let mut out = Vec::new();
    for quad in text.chunks(4) {
        let n = quad
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | value(c) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..quad.len()]);
    }
    out
}

/// The real ledgers of `testdata/`, by sample: the 320 testnet ledgers (v0), pubnet's base64
/// ledgers (v0) and Galexie object (v1), and the standalone load-test ledgers (v2, Soroban).
fn testdata_sets() -> Vec<(&'static str, Vec<Bytes>)> {
    let records = |name: &str| -> Vec<Bytes> {
        let stream = open_stream(File::open(testdata(name)).unwrap()).unwrap();
        Records::new(stream, DEFAULT_MAX_RECORD_LEN)
            .map(|r| Bytes::from(r.unwrap()))
            .collect()
    };
    let text = std::fs::read_to_string(testdata("pubnet/ledgers-base64.txt")).unwrap();
    let base64 = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| Bytes::from(base64_decode(l)))
        .collect();
    let galexie = |names: &[&str]| -> Vec<Bytes> {
        let limits = BatchLimits::default();
        names
            .iter()
            .flat_map(|name| {
                let object = std::fs::read(testdata(name)).unwrap();
                let xdr = decompress_object(&object, &limits).unwrap();
                decode_batch(Bytes::from(xdr), &limits).unwrap().ledgers
            })
            .map(|l| l.raw)
            .collect()
    };
    // Ledgers 85 and 88 of the load test carry merged content their headers do not commit to
    // (see `wire/tests/content.rs`): they fail the check, and are left out.
    let load_test: Vec<Bytes> = records("standalone/load-test-ledgers-v23-standalone.xdr.zstd")
        .into_iter()
        .filter(|l| check_content(l, &peek_header(l).unwrap().unwrap()).is_ok())
        .collect();
    let bucket = "standalone/galexie-testbucket";
    vec![
        (
            "testnet",
            records("testnet/testnet-1410048-1410367.lcm-v0.framed.xdr"),
        ),
        ("pubnet-base64", base64),
        (
            "pubnet-galexie",
            galexie(&["pubnet/FCD285FF--53312000.xdr.zstd"]),
        ),
        (
            "standalone-galexie",
            galexie(&[
                &format!("{bucket}/FFFFFC1A--997.xdr.zstd"),
                &format!("{bucket}/FFFFFC19--998.xdr.zstd"),
                &format!("{bucket}/FFFFFC18--999.xdr.zstd"),
            ]),
        ),
        ("standalone-v23", load_test),
    ]
}

/// How much CPU time each figure of [`at_the_lake`] is measured over: the process's clock
/// counts in 10 ms ticks, so this keeps its rounding under 1%.
const CPU_BUDGET_S: f64 = 2.0;

/// CPU per ledger, in ms, of `f` over every ledger of `set`, repeated until the rounds took
/// [`CPU_BUDGET_S`] of CPU.
fn cpu_per_ledger(set: &[Bytes], mut f: impl FnMut(&Bytes)) -> f64 {
    let start = process_cpu();
    let mut rounds = 0u32;
    while rounds == 0 || process_cpu() - start < CPU_BUDGET_S {
        set.iter().for_each(&mut f);
        rounds += 1;
    }
    (process_cpu() - start) * 1e3 / f64::from(rounds) / set.len() as f64
}

/// A batch of one ledger, as a lake object holds it with Galexie's defaults.
fn one_ledger_batch(lcm: &Bytes) -> Bytes {
    let seq = peek_header(lcm).unwrap().unwrap().ledger_seq;
    Bytes::from(encode_batch(seq, seq, &[lcm]))
}

/// What the content check adds where a ledger enters the ring from a lake: the check alone,
/// against `decode_batch` (the lake read: every ledger decoded whole, headers, chain, and the
/// check) of the same ledger, per ledger, in CPU time.
fn at_the_lake(name: &str, set: &[Bytes]) {
    let infos: Vec<_> = set
        .iter()
        .map(|l| peek_header(l).unwrap().unwrap())
        .collect();
    let mut i = 0;
    let check = cpu_per_ledger(set, |l| {
        std::hint::black_box(check_content(l, &infos[i % infos.len()]).unwrap());
        i += 1;
    });
    let batches: Vec<Bytes> = set.iter().map(one_ledger_batch).collect();
    let limits = BatchLimits::default();
    let read = cpu_per_ledger(&batches, |b| {
        std::hint::black_box(decode_batch(b.clone(), &limits).unwrap());
    });
    let bytes = set.iter().map(|l| l.len()).sum::<usize>() / set.len();
    eprintln!(
        "{name}: {} ledgers, {bytes} bytes each on average; check_content {:.1} us CPU per \
         ledger, decode_batch (check included) {:.1} us: the check is {:.1}% of the read",
        set.len(),
        check * 1e3,
        read * 1e3,
        check * 100.0 / read,
    );
}

fn bench(c: &mut Criterion) {
    for (name, set) in testdata_sets() {
        at_the_lake(name, &set);
    }
    let mut group = c.benchmark_group("content");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(8));
    for (name, lcm) in [("v2-soroban", v2_soroban()), ("v0-classic", v0_classic())] {
        let info = peek_header(&lcm).unwrap().unwrap();
        let h = check_content(&lcm, &info).expect("the scaled ledger passes");
        // CPU time per check, from the process's own counters: on a shared machine this is
        // what a ledger costs, where criterion's wall-clock figures also count waiting.
        let rounds = 100;
        let cpu = process_cpu();
        for _ in 0..rounds {
            std::hint::black_box(check_content(&lcm, &info).unwrap());
        }
        let check_ms = (process_cpu() - cpu) * 1e3 / f64::from(rounds);
        let floor = vec![0x5a; h.hashed_bytes as usize];
        let cpu = process_cpu();
        for _ in 0..rounds {
            std::hint::black_box(Sha256::digest(&floor));
        }
        let floor_ms = (process_cpu() - cpu) * 1e3 / f64::from(rounds);
        eprintln!(
            "{name}: {} bytes, {} transactions, {} bytes hashed ({:.1}%); check_content {check_ms:.2} ms CPU \
             ({:.0} MB/s), of which sha256 of the hashed bytes alone {floor_ms:.2} ms",
            lcm.len(),
            h.transactions,
            h.hashed_bytes,
            h.hashed_bytes as f64 * 100.0 / lcm.len() as f64,
            lcm.len() as f64 / check_ms / 1e3,
        );
        group.throughput(Throughput::Bytes(lcm.len() as u64));
        group.bench_with_input(BenchmarkId::new("check_content", name), &lcm, |b, lcm| {
            b.iter(|| check_content(lcm, &info).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("sha256_whole", name), &lcm, |b, lcm| {
            b.iter(|| Sha256::digest(lcm))
        });
        group.bench_with_input(
            BenchmarkId::new("stellar_xdr_decode", name),
            &lcm,
            |b, lcm| b.iter(|| LedgerCloseMeta::from_xdr(lcm, Limits::none()).unwrap()),
        );
        let lcm = Bytes::from(lcm);
        at_the_lake(name, std::slice::from_ref(&lcm));
        let batch = one_ledger_batch(&lcm);
        group.bench_with_input(BenchmarkId::new("decode_batch", name), &batch, |b, x| {
            b.iter(|| decode_batch(x.clone(), &BatchLimits::default()).unwrap())
        });
    }
    group.finish();
}

/// User plus system CPU time of this process, in seconds (Linux `/proc/self/stat`; 0 where
/// it cannot be read, which makes the printed CPU figures 0, not wrong).
fn process_cpu() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Fields 14 and 15 of stat (utime, stime), counted after the command name, in clock
    // ticks of 1/100 s on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

criterion_group!(benches, bench);
criterion_main!(benches);
