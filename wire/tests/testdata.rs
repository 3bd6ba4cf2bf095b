//! Real Stellar ledgers (see `testdata/SOURCES.md`) through the record reader, the
//! header peek and the chain verifier, cross-checked against a full decode by `stellar-xdr`.

use std::fs::File;
use std::io::Read;

use ledger_relay_wire::header::{
    peek_header, ChainError, ChainVerifier, HeaderError, LedgerHeaderInfo, MAX_HEADER_PEEK,
};
use ledger_relay_wire::record::{
    open_stream, RecordDecoder, RecordEvent, Records, DEFAULT_MAX_RECORD_LEN,
};
use stellar_xdr::{
    LedgerCloseMeta, LedgerCloseMetaBatch, LedgerCloseMetaExt, Limits, ReadXdr, WriteXdr,
};

const TESTDATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata");

fn path(name: &str) -> String {
    format!("{TESTDATA}/{name}")
}

/// Reads every record of a (possibly zstd-compressed) record-marked file.
fn read_records(name: &str) -> Vec<Vec<u8>> {
    let file = File::open(path(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let stream = open_stream(file).unwrap();
    Records::new(stream, DEFAULT_MAX_RECORD_LEN)
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Decompresses a Galexie object and returns each of its ledgers, re-encoded.
fn read_batch(name: &str) -> Vec<Vec<u8>> {
    let mut xdr = Vec::new();
    open_stream(File::open(path(name)).unwrap())
        .unwrap()
        .read_to_end(&mut xdr)
        .unwrap();
    let batch = LedgerCloseMetaBatch::from_xdr(&xdr, Limits::none()).unwrap();
    assert_eq!(
        batch.end_sequence - batch.start_sequence + 1,
        batch.ledger_close_metas.len() as u32
    );
    batch
        .ledger_close_metas
        .iter()
        .map(|lcm| lcm.to_xdr(Limits::none()).unwrap())
        .collect()
}

/// Decodes standard base64 (with padding), enough for `ledgers-base64.txt`.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c:#04x}"),
        }
    };
    let text = text.trim_end().trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for quad in text.chunks(4) {
        let n = quad
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | value(c) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..quad.len()]);
    }
    out
}

/// Peeks `lcm`'s header and checks every field against a full `stellar-xdr` decode, and that
/// the hashed bytes are exactly the re-encoded `LedgerHeader`.
fn cross_check(lcm: &[u8]) -> LedgerHeaderInfo {
    let info = peek_header(lcm).unwrap().expect("a whole ledger answers");
    assert!(info.header_end <= MAX_HEADER_PEEK);
    assert_eq!(peek_header(&lcm[..info.header_end]), Ok(Some(info)));
    assert_eq!(peek_header(&lcm[..info.header_end - 1]), Ok(None));

    let full = LedgerCloseMeta::from_xdr(lcm, Limits::none()).unwrap();
    let entry = match &full {
        LedgerCloseMeta::V0(v) => &v.ledger_header,
        LedgerCloseMeta::V1(v) => &v.ledger_header,
        LedgerCloseMeta::V2(v) => &v.ledger_header,
    };
    let header = &entry.header;
    assert_eq!(info.lcm_version as i32, full.discriminant());
    assert_eq!(info.ledger_seq, header.ledger_seq);
    assert_eq!(info.hash, entry.hash.0);
    assert_eq!(info.previous_hash, header.previous_ledger_hash.0);
    assert_eq!(info.protocol_version, header.ledger_version);
    assert_eq!(info.close_time, header.scp_value.close_time.0);
    let header_xdr = header.to_xdr(Limits::none()).unwrap();
    let header_start = info.header_end - header_xdr.len();
    assert_eq!(lcm[header_start..info.header_end], header_xdr[..]);
    assert_eq!(lcm[header_start - 32..header_start], entry.hash.0);
    info
}

/// Every prefix of the first `MAX_HEADER_PEEK` bytes answers `Ok(None)` or the full answer.
fn prefix_sweep(lcm: &[u8], info: &LedgerHeaderInfo) {
    for cut in 0..=MAX_HEADER_PEEK.min(lcm.len()) {
        match peek_header(&lcm[..cut]) {
            Ok(None) => assert!(cut < info.header_end, "cut {cut}"),
            Ok(Some(got)) => assert_eq!(got, *info, "cut {cut}"),
            Err(e) => panic!("ledger {} cut {cut}: {e}", info.ledger_seq),
        }
    }
}

/// A flipped byte anywhere in the stored hash or the header gives `HashMismatch`, or, where
/// it breaks the schema (a length or discriminant), `Malformed`; never a wrong answer.
fn tamper(lcm: &[u8], info: &LedgerHeaderInfo) {
    let hash_start = match info.lcm_version {
        0 => 4,
        _ if lcm[4..8] == [0, 0, 0, 0] => 8,
        _ => 20,
    };
    for at in hash_start..info.header_end {
        for bit in [0x01, 0x80] {
            let mut bad = lcm[..info.header_end].to_vec();
            bad[at] ^= bit;
            match peek_header(&bad) {
                Err(HeaderError::HashMismatch { .. }) | Err(HeaderError::Malformed { .. }) => {}
                // A length grown past the end of the prefix asks for more bytes.
                Ok(None) => {}
                other => panic!("ledger {} byte {at}: {other:?}", info.ledger_seq),
            }
        }
    }
    // The ledger version byte is always a plain hashed field.
    let mut bad = lcm.to_vec();
    bad[hash_start + 32 + 3] ^= 1;
    assert_eq!(
        peek_header(&bad),
        Err(HeaderError::HashMismatch {
            seq: info.ledger_seq
        })
    );
}

#[test]
fn testnet_stream_320_ledgers_chain() {
    let name = "testnet/testnet-1410048-1410367.lcm-v0.framed.xdr";
    let records = read_records(name);
    assert_eq!(records.len(), 320);
    let file_len = std::fs::metadata(path(name)).unwrap().len();
    let framed: u64 = records.iter().map(|r| 4 + r.len() as u64).sum();
    assert_eq!(framed, file_len);

    let mut any = ChainVerifier::new();
    let mut from_start = ChainVerifier::starting_at(1410048);
    for (i, lcm) in records.iter().enumerate() {
        let info = cross_check(lcm);
        assert_eq!(info.ledger_seq, 1410048 + i as u32);
        assert_eq!(info.lcm_version, 0);
        assert_eq!(info.protocol_version, 19);
        any.check(&info).unwrap();
        from_start.check(&info).unwrap();
    }
    let (last_seq, last_hash) = any.last().unwrap();
    assert_eq!(last_seq, 1410367);
    assert_eq!(from_start.last(), any.last());

    // Resuming mid-chain works, and a gap or a repeat is caught.
    let second = peek_header(&records[1]).unwrap().unwrap();
    let first = peek_header(&records[0]).unwrap().unwrap();
    let mut resumed = ChainVerifier::after(first.ledger_seq, first.hash);
    resumed.check(&second).unwrap();
    let mut after_last = ChainVerifier::after(last_seq, last_hash);
    assert_eq!(
        after_last.check(&first),
        Err(ChainError::UnexpectedSequence {
            expected: 1410368,
            got: 1410048
        })
    );
    let mut verifier = ChainVerifier::after(first.ledger_seq, [0; 32]);
    assert!(matches!(
        verifier.check(&second),
        Err(ChainError::BrokenChain { seq: 1410049, .. })
    ));
    assert_eq!(verifier.last(), Some((first.ledger_seq, [0; 32])));

    prefix_sweep(&records[0], &first);
    tamper(&records[0], &first);
}

/// The zero-copy decoder over the real file in awkward piece sizes yields the same records.
#[test]
fn testnet_stream_through_decoder() {
    let stream = std::fs::read(path("testnet/testnet-1410048-1410367.lcm-v0.framed.xdr")).unwrap();
    let expected = read_records("testnet/testnet-1410048-1410367.lcm-v0.framed.xdr");
    for piece_len in [1, 3, 4093, 65536] {
        let mut decoder = RecordDecoder::new(DEFAULT_MAX_RECORD_LEN);
        let mut got: Vec<Vec<u8>> = Vec::new();
        for mut piece in stream.chunks(piece_len) {
            loop {
                let (used, event) = decoder.decode(piece).unwrap();
                piece = &piece[used..];
                match event {
                    None => break,
                    Some(RecordEvent::Begin { len }) => {
                        assert!(len < 64 << 10);
                        got.push(Vec::new());
                    }
                    Some(RecordEvent::Data(d)) => got.last_mut().unwrap().extend_from_slice(d),
                    Some(RecordEvent::End) => {}
                }
            }
        }
        decoder.finish().unwrap();
        assert!(got == expected, "piece length {piece_len}");
    }
}

#[test]
fn pubnet_base64_v0() {
    let text = std::fs::read_to_string(path("pubnet/ledgers-base64.txt")).unwrap();
    let mut seen = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let lcm = base64_decode(line);
        let info = cross_check(&lcm);
        assert_eq!(info.lcm_version, 0);
        prefix_sweep(&lcm, &info);
        tamper(&lcm, &info);
        seen.push((info.ledger_seq, info.protocol_version));
    }
    assert_eq!(
        seen,
        [
            (6154623, 2),
            (16154623, 9),
            (26154623, 11),
            (46154623, 19),
            (36154623, 17)
        ]
    );
}

/// This pubnet ledger carries a `LedgerCloseMetaExt` v1 (sorobanFeeWrite1KB), so its header
/// starts at byte 20, not 8.
#[test]
fn pubnet_galexie_batch_v1_with_ext() {
    let ledgers = read_batch("pubnet/FCD285FF--53312000.xdr.zstd");
    assert_eq!(ledgers.len(), 1);
    let lcm = &ledgers[0];
    let info = cross_check(lcm);
    assert_eq!(
        (info.ledger_seq, info.lcm_version, info.protocol_version),
        (53312000, 1, 21)
    );
    let LedgerCloseMeta::V1(v1) = LedgerCloseMeta::from_xdr(lcm, Limits::none()).unwrap() else {
        panic!("not v1");
    };
    assert!(matches!(v1.ext, LedgerCloseMetaExt::V1(_)));
    assert_eq!(
        info.header_end - 32 - 20,
        v1.ledger_header
            .header
            .to_xdr(Limits::none())
            .unwrap()
            .len()
    );
    prefix_sweep(lcm, &info);
    tamper(lcm, &info);
}

#[test]
fn standalone_galexie_997_to_999_chain() {
    let mut chain = ChainVerifier::starting_at(997);
    for name in ["FFFFFC1A--997", "FFFFFC19--998", "FFFFFC18--999"] {
        let ledgers = read_batch(&format!("standalone/galexie-testbucket/{name}.xdr.zstd"));
        assert_eq!(ledgers.len(), 1);
        let info = cross_check(&ledgers[0]);
        assert_eq!((info.lcm_version, info.protocol_version), (1, 20));
        chain.check(&info).unwrap();
        prefix_sweep(&ledgers[0], &info);
        tamper(&ledgers[0], &info);
    }
    assert_eq!(chain.last().map(|(seq, _)| seq), Some(999));
}

#[test]
fn standalone_v23_zstd_stream() {
    let records = read_records("standalone/load-test-ledgers-v23-standalone.xdr.zstd");
    let infos: Vec<_> = records.iter().map(|lcm| cross_check(lcm)).collect();
    let seqs: Vec<_> = infos.iter().map(|i| i.ledger_seq).collect();
    assert_eq!(seqs, [84, 85, 88]);
    for (lcm, info) in records.iter().zip(&infos) {
        assert_eq!((info.lcm_version, info.protocol_version), (2, 23));
        prefix_sweep(lcm, info);
        tamper(lcm, info);
    }
    let mut chain = ChainVerifier::new();
    chain.check(&infos[0]).unwrap();
    chain.check(&infos[1]).unwrap();
    assert_eq!(
        chain.check(&infos[2]),
        Err(ChainError::UnexpectedSequence {
            expected: 86,
            got: 88
        })
    );
    assert_eq!(chain.last(), Some((85, infos[1].hash)));
}

/// Every real ledger of the test data, named by file and sequence: 320 testnet v0, 5 pubnet
/// v0, pubnet v1 53312000, standalone v1 997 to 999, standalone v2 84, 85 and 88.
pub fn all_real_ledgers() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let seq = |lcm: &[u8]| peek_header(lcm).unwrap().unwrap().ledger_seq;
    for lcm in read_records("testnet/testnet-1410048-1410367.lcm-v0.framed.xdr") {
        out.push((format!("testnet {}", seq(&lcm)), lcm));
    }
    let text = std::fs::read_to_string(path("pubnet/ledgers-base64.txt")).unwrap();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let lcm = base64_decode(line);
        out.push((format!("pubnet {}", seq(&lcm)), lcm));
    }
    for lcm in read_batch("pubnet/FCD285FF--53312000.xdr.zstd") {
        out.push((format!("pubnet {}", seq(&lcm)), lcm));
    }
    for name in ["FFFFFC1A--997", "FFFFFC19--998", "FFFFFC18--999"] {
        for lcm in read_batch(&format!("standalone/galexie-testbucket/{name}.xdr.zstd")) {
            out.push((format!("standalone {}", seq(&lcm)), lcm));
        }
    }
    for lcm in read_records("standalone/load-test-ledgers-v23-standalone.xdr.zstd") {
        out.push((format!("standalone v23 {}", seq(&lcm)), lcm));
    }
    out
}

/// Every file of `testdata/` is listed in its SOURCES.md with its size and sha256, and matches
/// them: a sample edited, truncated, replaced or added without its provenance fails here.
#[test]
fn every_file_matches_its_size_and_digest_in_sources() {
    use sha2::{Digest, Sha256};
    use std::collections::BTreeMap;

    let sources = std::fs::read_to_string(path("SOURCES.md")).expect("testdata/SOURCES.md");
    // Rows of the first table: | `FILE` | BYTES | SHA256 | origin |
    let mut listed = BTreeMap::new();
    for line in sources.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 5 || !cells[1].starts_with('`') || cells[3].len() != 64 {
            continue;
        }
        let name = cells[1].trim_matches('`').to_string();
        let bytes: u64 = cells[2].replace(',', "").parse().expect("a byte count");
        listed.insert(name, (bytes, cells[3].to_string()));
    }
    assert!(listed.len() >= 7, "SOURCES.md lists {} files", listed.len());

    let mut found = Vec::new();
    let mut dirs = vec![std::path::PathBuf::from(TESTDATA)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                let rel = p.strip_prefix(TESTDATA).unwrap().to_str().unwrap();
                let rel = rel.trim_start_matches('/').to_string();
                if rel != "SOURCES.md" {
                    found.push(rel);
                }
            }
        }
    }
    found.sort();
    let names: Vec<&String> = listed.keys().collect();
    assert_eq!(
        found.iter().collect::<Vec<_>>(),
        names,
        "files in testdata/ against SOURCES.md"
    );
    for (name, (bytes, sha)) in &listed {
        let data = std::fs::read(path(name)).unwrap();
        assert_eq!(data.len() as u64, *bytes, "{name}: size");
        let got = ledger_relay_wire::Hex(&Sha256::digest(&data).into()).to_string();
        assert_eq!(&got, sha, "{name}: sha256");
    }
}
