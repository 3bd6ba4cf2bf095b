//! The retention ring: round trips, pruning, contiguity, reset, reopen, corruption, kill -9
//! recovery and disk use.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ledger_relay::ring::{
    ledger_file, Ring, RingConfig, RingError, StoredChunk, LEDGERS_DIR, MAX_SPARES, PART_MAX,
    SEGMENT_SIZE,
};
use ledger_relay_wire::compress::Codec;
use ledger_relay_wire::frame::LedgerEnd;
use rand::Rng;

/// Deterministic bytes: a splitmix64 stream seeded by `seed`.
fn bytes_for(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5851_f42d_4c95_7f2d;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The header hash every test gives ledger `seq`, so any run can continue any other.
fn hash_of(seq: u32) -> [u8; 32] {
    let mut h = [0u8; 32];
    h.copy_from_slice(&bytes_for(0xab00_0000_0000 | u64::from(seq), 32));
    h
}

/// A ledger `seq` with chunks of these payload sizes. Every other chunk is "compressed" (a
/// payload shorter than its raw length); the rest are raw.
fn ledger(seq: u32, payload_sizes: &[usize]) -> (LedgerEnd, Vec<StoredChunk>) {
    let mut chunks = Vec::new();
    let mut offset = 0u64;
    for (i, &len) in payload_sizes.iter().enumerate() {
        let (codec, raw_len) = if i % 2 == 0 {
            (Codec::None, len)
        } else {
            (Codec::Zstd, len * 3 + 1)
        };
        let raw_len = raw_len as u32;
        chunks.push(StoredChunk {
            index: i as u32,
            raw_offset: offset,
            raw_len,
            codec,
            payload: Bytes::from(bytes_for(u64::from(seq) << 20 | i as u64, len)),
        });
        offset += u64::from(raw_len);
    }
    let end = LedgerEnd {
        seq,
        chunk_count: chunks.len() as u32,
        raw_len: offset,
        checksum: u64::from(seq) * 7,
        header_hash: hash_of(seq),
        previous_hash: hash_of(seq - 1),
        first_byte_ns: u64::from(seq) * 1000,
        last_byte_ns: u64::from(seq) * 1000 + 8,
    };
    (end, chunks)
}

/// Sizes used by the crash child and most tests: a few chunks, several spanning parts.
fn sizes_for(seq: u32) -> Vec<usize> {
    let n = 2 + (seq % 3) as usize;
    (0..n)
        .map(|i| 1 + ((seq as usize * 7919 + i * 104_729) % (300 << 10)))
        .collect()
}

fn append_seq(ring: &Ring, seq: u32) {
    let (end, chunks) = ledger(seq, &sizes_for(seq));
    ring.append(&end, &chunks)
        .unwrap_or_else(|e| panic!("append {seq}: {e}"));
}

fn assert_held(ring: &Ring, seq: u32) {
    let expected = ledger(seq, &sizes_for(seq));
    match ring.get(seq) {
        Ok(Some(got)) => assert!(got == expected, "ledger {seq} differs"),
        other => panic!("ledger {seq}: {other:?}"),
    }
}

fn config(dir: &Path) -> RingConfig {
    RingConfig::new(dir)
}

/// The names in a ring's `ledgers/` directory, sorted, without the spares (pruned ledgers'
/// files kept to be written over; [`spare_files`]).
fn ledger_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join(LEDGERS_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.ends_with(".spare"))
        .collect();
    names.sort();
    names
}

/// The spare files in a ring's `ledgers/` directory.
fn spare_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir.join(LEDGERS_DIR))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "spare"))
        .collect()
}

/// The names ledgers `seqs` of run `epoch` have, sorted.
fn names(epoch: u64, seqs: impl IntoIterator<Item = u32>) -> Vec<String> {
    let mut names: Vec<String> = seqs
        .into_iter()
        .map(|s| format!("{epoch}-{s}.parts"))
        .collect();
    names.sort();
    names
}

/// Where each part's stored value starts in a ledger file, and its length (each part is
/// `len u32 || value`, `ledger_relay_wire::stored`).
fn part_values(file: &[u8]) -> Vec<(usize, usize)> {
    let (mut out, mut off) = (Vec::new(), 0);
    while off < file.len() {
        let len = u32::from_be_bytes(file[off..off + 4].try_into().unwrap()) as usize;
        out.push((off + 4, len));
        off += 4 + len;
    }
    out
}

/// Changes ledger `seq`'s file in the closed ring at `dir` with `edit`.
fn edit_file(dir: &Path, seq: u32, edit: impl FnOnce(&mut Vec<u8>)) {
    let path = ledger_file(dir, seq).expect("the ledger has a file");
    let mut bytes = std::fs::read(&path).unwrap();
    edit(&mut bytes);
    std::fs::write(&path, bytes).unwrap();
}

/// A second handle on a ring's store, for tampering. Retries while the dropped `Ring`'s sled
/// threads still hold the store's lock.
fn sled_handle(dir: &Path) -> sled::Db {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match sled::Config::new()
            .path(dir)
            .segment_size(SEGMENT_SIZE)
            .open()
        {
            Ok(db) => return db,
            Err(e) if Instant::now() < deadline => {
                eprintln!("sled handle: {e}; retrying");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("open sled: {e}"),
        }
    }
}

#[test]
fn append_get_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let ring = Ring::open(&config(tmp.path())).unwrap();
    assert_eq!(ring.range(), None);
    assert_eq!(ring.newest(), None);
    assert!(ring.get(1).unwrap().is_none());

    // Chunks of 0 payload bytes, exactly one part, one byte over, several parts, and an empty
    // ledger.
    let cases: Vec<(u32, Vec<usize>)> = vec![
        (100, vec![5, 0, 7]),
        (101, vec![PART_MAX, PART_MAX]),
        (102, vec![PART_MAX + 1, 1]),
        (103, vec![(1 << 20) + 17, 3, 600 << 10]),
        (104, vec![]),
        (105, vec![1]),
    ];
    for (seq, sizes) in &cases {
        let (end, chunks) = ledger(*seq, sizes);
        ring.append(&end, &chunks).unwrap();
    }
    for (seq, sizes) in &cases {
        let got = ring.get(*seq).unwrap().expect("held");
        assert!(got == ledger(*seq, sizes), "ledger {seq}");
    }
    assert!(ring.get(99).unwrap().is_none());
    assert!(ring.get(106).unwrap().is_none());
    assert!(ring.get(0).unwrap().is_none());
    assert_eq!(ring.range(), Some((100, 105)));
    assert_eq!(ring.newest(), Some((105, hash_of(105))));
    let stats = ring.stats();
    assert_eq!(
        (stats.oldest, stats.newest, stats.ledgers, stats.epoch),
        (Some(100), Some(105), 6, 0)
    );
    let payload: u64 = cases
        .iter()
        .flat_map(|c| c.1.iter())
        .map(|&s| s as u64)
        .sum();
    assert!(
        stats.live_bytes > payload && stats.live_bytes < payload + 6 * 1024,
        "{stats:?}"
    );
    assert!(stats.disk_bytes > 0);
}

#[test]
fn prunes_by_count() {
    let tmp = tempfile::tempdir().unwrap();
    let ring = Ring::open(&RingConfig {
        max_ledgers: 5,
        ..config(tmp.path())
    })
    .unwrap();
    for seq in 1..=12 {
        append_seq(&ring, seq);
        let oldest = seq.saturating_sub(4).max(1);
        assert_eq!(ring.range(), Some((oldest, seq)));
    }
    assert!(ring.get(7).unwrap().is_none());
    for seq in 8..=12 {
        assert_held(&ring, seq);
    }
    let live = ring.stats().live_bytes;
    drop(ring);

    // Nothing of the pruned ledgers is left: neither records nor files under their names
    // (at most MAX_SPARES files kept to be written over).
    assert_eq!(ledger_files(tmp.path()), names(0, 8..=12));
    // A full ring prunes one ledger per append, after writing the new one over the spare the
    // previous append left: one spare in steady state.
    assert_eq!(spare_files(tmp.path()).len(), 1);
    let db = sled_handle(tmp.path());
    assert_eq!(db.scan_prefix(b"l").count(), 5);
    drop(db);

    let ring = Ring::open(&RingConfig {
        max_ledgers: 5,
        ..config(tmp.path())
    })
    .unwrap();
    assert_eq!(
        ring.stats().live_bytes,
        live,
        "live bytes are recomputed on open"
    );
}

#[test]
fn prunes_by_bytes_and_keeps_the_newest_even_if_alone_too_large() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let ring = Ring::open(&cfg).unwrap();
    let (end, chunks) = ledger(1, &[100 << 10]);
    ring.append(&end, &chunks).unwrap();
    let one = ring.stats().live_bytes;
    drop(ring);
    std::fs::remove_dir_all(tmp.path()).unwrap();

    // Room for three and a half ledgers of this size.
    let ring = Ring::open(&RingConfig {
        max_bytes: one * 7 / 2,
        ..cfg.clone()
    })
    .unwrap();
    for seq in 1..=10 {
        let (end, chunks) = ledger(seq, &[100 << 10]);
        ring.append(&end, &chunks).unwrap();
        assert_eq!(ring.range(), Some((seq.saturating_sub(2).max(1), seq)));
        assert!(ring.stats().live_bytes <= one * 7 / 2);
    }
    // A ledger larger than the whole budget replaces everything and stays.
    let (end, chunks) = ledger(11, &[1 << 20]);
    ring.append(&end, &chunks).unwrap();
    assert_eq!(ring.range(), Some((11, 11)));
    assert!(ring.get(11).unwrap().is_some());
    let (end, chunks) = ledger(12, &[100 << 10]);
    ring.append(&end, &chunks).unwrap();
    assert_eq!(ring.range(), Some((12, 12)));
}

#[test]
fn refuses_discontinuities_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let ring = Ring::open(&config(tmp.path())).unwrap();
    append_seq(&ring, 10);
    append_seq(&ring, 11);
    let before = ring.stats();

    let (gap, gap_chunks) = ledger(13, &sizes_for(13));
    match ring.append(&gap, &gap_chunks) {
        Err(RingError::Discontinuity {
            newest: 11,
            newest_hash,
            seq: 13,
            previous_hash,
        }) => {
            assert_eq!(newest_hash, hash_of(11));
            assert_eq!(previous_hash, hash_of(12));
        }
        other => panic!("{other:?}"),
    }
    let (mut forked, chunks) = ledger(12, &sizes_for(12));
    forked.previous_hash = hash_of(999);
    assert!(matches!(
        ring.append(&forked, &chunks),
        Err(RingError::Discontinuity {
            newest: 11,
            seq: 12,
            ..
        })
    ));
    let (old, chunks) = ledger(11, &sizes_for(11));
    assert!(matches!(
        ring.append(&old, &chunks),
        Err(RingError::Discontinuity { .. })
    ));
    // Chunks that do not match the end record.
    let (end, chunks) = ledger(12, &sizes_for(12));
    assert!(matches!(
        ring.append(&end, &chunks[1..]),
        Err(RingError::BadRecord { seq: 12, .. })
    ));

    assert_eq!(ring.range(), Some((10, 11)));
    let after = ring.stats();
    assert_eq!(
        (after.live_bytes, after.ledgers),
        (before.live_bytes, before.ledgers)
    );
    drop(ring);
    assert_eq!(ledger_files(tmp.path()), names(0, 10..=11));
    let db = sled_handle(tmp.path());
    for seq in [12u32, 13] {
        let mut key = b"l".to_vec();
        key.extend_from_slice(&seq.to_be_bytes());
        assert!(db.get(&key).unwrap().is_none(), "record of {seq}");
    }
    drop(db);

    // The right ledger is still accepted.
    let ring = Ring::open(&config(tmp.path())).unwrap();
    append_seq(&ring, 12);
    assert_eq!(ring.range(), Some((10, 12)));
}

#[test]
fn reset_bumps_epoch_and_empties() {
    let tmp = tempfile::tempdir().unwrap();
    let ring = Ring::open(&config(tmp.path())).unwrap();
    for seq in 1..=4 {
        append_seq(&ring, seq);
    }
    assert_eq!(ring.stats().epoch, 0);
    ring.reset().unwrap();
    let stats = ring.stats();
    assert_eq!(
        (
            stats.oldest,
            stats.newest,
            stats.ledgers,
            stats.live_bytes,
            stats.epoch
        ),
        (None, None, 0, 0, 1)
    );
    assert!(ring.get(2).unwrap().is_none());
    // A new run starts anywhere, with any previous hash.
    let (mut end, chunks) = ledger(500, &sizes_for(500));
    end.previous_hash = [0xee; 32];
    ring.append(&end, &chunks).unwrap();
    append_seq(&ring, 501);
    drop(ring);

    let ring = Ring::open(&config(tmp.path())).unwrap();
    assert_eq!(ring.stats().epoch, 1);
    assert_eq!(ring.range(), Some((500, 501)));
    assert!(ring.get(3).unwrap().is_none());
    drop(ring);
    assert_eq!(
        ledger_files(tmp.path()),
        names(1, [500, 501]),
        "old files left behind"
    );
    let db = sled_handle(tmp.path());
    assert_eq!(db.scan_prefix(b"l").count(), 2);
}

#[test]
fn reopen_keeps_range_epoch_and_network() {
    let tmp = tempfile::tempdir().unwrap();
    let testnet = RingConfig {
        network: Some("testnet".into()),
        ..config(tmp.path())
    };
    let ring = Ring::open(&testnet).unwrap();
    for seq in 20..=25 {
        append_seq(&ring, seq);
    }
    ring.reset().unwrap();
    for seq in 30..=33 {
        append_seq(&ring, seq);
    }
    let stats = ring.stats();
    drop(ring);

    let ring = Ring::open(&testnet).unwrap();
    let again = ring.stats();
    assert_eq!(
        (
            again.oldest,
            again.newest,
            again.ledgers,
            again.live_bytes,
            again.epoch
        ),
        (
            stats.oldest,
            stats.newest,
            stats.ledgers,
            stats.live_bytes,
            1
        )
    );
    assert_eq!(ring.newest(), Some((33, hash_of(33))));
    assert_eq!(ring.network(), Some("testnet"));
    for seq in 30..=33 {
        assert_held(&ring, seq);
    }
    append_seq(&ring, 34);
    drop(ring);

    // No configured network accepts the recorded one.
    let ring = Ring::open(&config(tmp.path())).unwrap();
    assert_eq!(ring.network(), Some("testnet"));
    assert_eq!(ring.range(), Some((30, 34)));
    drop(ring);

    match Ring::open(&RingConfig {
        network: Some("pubnet".into()),
        ..config(tmp.path())
    }) {
        Err(RingError::NetworkMismatch { stored, configured }) => {
            assert_eq!(
                (stored.as_str(), configured.as_str()),
                ("testnet", "pubnet")
            );
        }
        other => panic!("{other:?}"),
    }
    // The refused open changed nothing.
    let ring = Ring::open(&testnet).unwrap();
    assert_eq!(ring.range(), Some((30, 34)));
}

#[test]
fn invalid_config_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    assert!(matches!(
        Ring::open(&RingConfig {
            max_ledgers: 0,
            ..cfg.clone()
        }),
        Err(RingError::Config { .. })
    ));
    assert!(matches!(
        Ring::open(&RingConfig {
            max_bytes: 0,
            ..cfg
        }),
        Err(RingError::Config { .. })
    ));
}

/// A ring holding ledgers 1..=5, closed.
fn closed_ring_of_five(dir: &Path) {
    let ring = Ring::open(&config(dir)).unwrap();
    for seq in 1..=5 {
        append_seq(&ring, seq);
    }
}

#[test]
fn damaged_chunk_is_corrupt_never_returned() {
    for what in ["payload", "identity", "checksum"] {
        let tmp = tempfile::tempdir().unwrap();
        closed_ring_of_five(tmp.path());
        edit_file(tmp.path(), 3, |file| {
            let (start, len) = *part_values(file).last().unwrap();
            let at = match what {
                "checksum" => 3,     // inside the stored checksum
                "identity" => 8 + 6, // inside the part's sequence and number
                _ => len / 2,        // payload
            };
            file[start + at] ^= 0x10;
        });

        let ring = Ring::open(&config(tmp.path())).unwrap();
        assert_eq!(
            ring.range(),
            Some((1, 5)),
            "{what}: a damaged middle ledger is not repaired away"
        );
        match ring.get(3) {
            Err(RingError::Corrupt { seq: 3, detail }) => {
                assert!(detail.contains("checksum"), "{what}: {detail}")
            }
            other => panic!("{what}: {:?}", other.map(|o| o.map(|l| l.0))),
        }
        for seq in [1, 2, 4, 5] {
            assert_held(&ring, seq);
        }
    }
}

#[test]
fn misplaced_short_or_missing_files_are_corrupt() {
    let tmp = tempfile::tempdir().unwrap();
    closed_ring_of_five(tmp.path());
    // Ledger 2's file holds ledger 4's parts, cut or padded to ledger 2's length (valid
    // checksums, wrong ledger).
    let two_len = std::fs::metadata(ledger_file(tmp.path(), 2).unwrap())
        .unwrap()
        .len() as usize;
    let mut four = std::fs::read(ledger_file(tmp.path(), 4).unwrap()).unwrap();
    four.resize(two_len, 0);
    std::fs::write(ledger_file(tmp.path(), 2).unwrap(), four).unwrap();
    // Ledger 3's file without its last part.
    edit_file(tmp.path(), 3, |file| {
        let (start, _) = *part_values(file).last().unwrap();
        file.truncate(start - 4);
    });
    // Ledger 4's file gone.
    std::fs::remove_file(ledger_file(tmp.path(), 4).unwrap()).unwrap();

    let ring = Ring::open(&config(tmp.path())).unwrap();
    match ring.get(2) {
        Err(RingError::Corrupt { seq: 2, detail }) => {
            assert!(detail.contains("another key"), "{detail}")
        }
        other => panic!("{:?}", other.map(|o| o.map(|l| l.0))),
    }
    match ring.get(3) {
        Err(RingError::Corrupt { seq: 3, detail }) => {
            assert!(detail.contains("ledger file of"), "{detail}")
        }
        other => panic!("{:?}", other.map(|o| o.map(|l| l.0))),
    }
    match ring.get(4) {
        Err(RingError::Corrupt { seq: 4, detail }) => {
            assert!(detail.contains("missing"), "{detail}")
        }
        other => panic!("{:?}", other.map(|o| o.map(|l| l.0))),
    }
    assert_held(&ring, 5);
}

#[test]
fn open_repairs_a_torn_newest_ledger_and_orphans() {
    // A newest ledger whose file is torn, and files no record owns: a ledger written past the
    // newest (a crash before its record), one below the oldest (a crash before pruning removed
    // it), one of an older run (a crash in a reset), and one half written. A file that is not
    // the ring's is left alone.
    let tmp = tempfile::tempdir().unwrap();
    closed_ring_of_five(tmp.path());
    edit_file(tmp.path(), 5, |file| file.truncate(file.len() - 1));
    let ledgers = tmp.path().join(LEDGERS_DIR);
    for orphan in ["0-6.parts", "0-0.parts", "7-3.parts", "0-9.tmp"] {
        std::fs::write(ledgers.join(orphan), b"orphan").unwrap();
    }
    std::fs::write(ledgers.join("notes.txt"), b"an operator's").unwrap();

    let ring = Ring::open(&config(tmp.path())).unwrap();
    assert_eq!(ring.range(), Some((1, 4)));
    for seq in 1..=4 {
        assert_held(&ring, seq);
    }
    let mut want = names(0, 1..=4);
    want.push("notes.txt".into());
    assert_eq!(ledger_files(tmp.path()), want);
    append_seq(&ring, 5);
    append_seq(&ring, 6);
    assert_held(&ring, 5);
    assert_held(&ring, 6);
    drop(ring);

    // A newest record that does not decode, with its file present.
    let tmp = tempfile::tempdir().unwrap();
    closed_ring_of_five(tmp.path());
    let db = sled_handle(tmp.path());
    let key = [b'l', 0, 0, 0, 5];
    let mut value = db.get(key).unwrap().unwrap().to_vec();
    value[20] ^= 1;
    db.insert(key, value).unwrap();
    db.flush().unwrap();
    drop(db);
    let ring = Ring::open(&config(tmp.path())).unwrap();
    assert_eq!(ring.range(), Some((1, 4)));
    assert_eq!(ledger_files(tmp.path()), names(0, 1..=4));
    append_seq(&ring, 5);
    assert_held(&ring, 5);
    drop(ring);

    // A broken record in the middle: only the newest consecutive run is kept, with its files.
    let tmp = tempfile::tempdir().unwrap();
    closed_ring_of_five(tmp.path());
    let db = sled_handle(tmp.path());
    let key = [b'l', 0, 0, 0, 2];
    let mut value = db.get(key).unwrap().unwrap().to_vec();
    value[30] ^= 1;
    db.insert(key, value).unwrap();
    db.flush().unwrap();
    drop(db);
    let ring = Ring::open(&config(tmp.path())).unwrap();
    assert_eq!(ring.range(), Some((3, 5)));
    for seq in 3..=5 {
        assert_held(&ring, seq);
    }
    drop(ring);
    assert_eq!(ledger_files(tmp.path()), names(0, 3..=5));
}

/// A store of another format (version 1 kept payloads in sled) is refused with a message that
/// says what to do, and nothing in it is changed.
#[test]
fn a_store_of_another_format_is_refused_and_left_as_it_is() {
    let tmp = tempfile::tempdir().unwrap();
    closed_ring_of_five(tmp.path());
    let db = sled_handle(tmp.path());
    db.insert(b"mformat", ledger_relay_wire::stored::seal_u32(1))
        .unwrap();
    db.flush().unwrap();
    drop(db);
    match Ring::open(&config(tmp.path())) {
        Err(
            e @ RingError::Format {
                found: 1,
                expected: 2,
            },
        ) => assert!(
            e.to_string().contains("move the ring directory away"),
            "{e}"
        ),
        other => panic!("{:?}", other.map(|r| r.range())),
    }
    assert_eq!(ledger_files(tmp.path()), names(0, 1..=5));
}

const CRASH_DIR_ENV: &str = "LEDGER_RELAY_RING_CRASH_DIR";
const CRASH_MAX_LEDGERS: u32 = 40;

/// Child of `kill_9_at_any_moment_loses_no_committed_ledger`: appends ledgers until killed,
/// printing each sequence once `append` has returned. Does nothing when run by hand.
#[test]
#[ignore = "child process of kill_9_at_any_moment_loses_no_committed_ledger"]
fn crash_child() {
    let Some(dir) = std::env::var_os(CRASH_DIR_ENV) else {
        return;
    };
    let ring = Ring::open(&RingConfig {
        max_ledgers: CRASH_MAX_LEDGERS,
        ..config(Path::new(&dir))
    })
    .unwrap();
    let mut seq = ring.newest().map_or(1, |(s, _)| s + 1);
    let stdout = std::io::stdout();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        append_seq(&ring, seq);
        let mut out = stdout.lock();
        writeln!(out, "committed {seq}").unwrap();
        out.flush().unwrap();
        seq += 1;
    }
}

#[test]
fn kill_9_at_any_moment_loses_no_committed_ledger() {
    let tmp = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::thread_rng();
    let mut total = 0;
    for round in 0..10 {
        let started = Instant::now();
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "ring::crash_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CRASH_DIR_ENV, tmp.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let kill_after = rng.gen_range(3..15);
        let mut committed = Vec::new();
        for line in lines.by_ref() {
            if let Some(seq) = line.unwrap().strip_prefix("committed ") {
                committed.push(seq.parse::<u32>().unwrap());
                if committed.len() >= kill_after {
                    break;
                }
            }
        }
        assert!(
            committed.len() >= kill_after,
            "round {round}: child stopped early"
        );
        // Land somewhere inside a later append: its batch, its flush or its pruning.
        std::thread::sleep(Duration::from_micros(rng.gen_range(0..20_000)));
        child.kill().unwrap();
        child.wait().unwrap();
        // Lines already in the pipe were committed too.
        for line in lines {
            if let Some(seq) = line.unwrap().strip_prefix("committed ") {
                committed.push(seq.parse::<u32>().unwrap());
            }
        }
        let last = *committed.last().unwrap();

        let ring = Ring::open(&RingConfig {
            max_ledgers: CRASH_MAX_LEDGERS,
            ..config(tmp.path())
        })
        .unwrap();
        let (oldest, newest) = ring.range().expect("ledgers survive");
        assert!(
            newest >= last,
            "round {round}: newest {newest} < committed {last}"
        );
        assert!(
            newest <= last + 1,
            "round {round}: newest {newest} was never appended"
        );
        assert_eq!(
            newest - oldest + 1,
            newest.min(CRASH_MAX_LEDGERS),
            "round {round}: range ({oldest}, {newest})"
        );
        for seq in oldest..=newest {
            assert_held(&ring, seq);
        }
        // Appending goes on from newest + 1.
        append_seq(&ring, newest + 1);
        assert_held(&ring, newest + 1);
        total += committed.len();
        eprintln!(
            "round {round}: {} committed, ring ({oldest}, {newest}), {:?}",
            committed.len(),
            started.elapsed()
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "round {round} took {:?}",
            started.elapsed()
        );
    }
    assert!(total >= 30);
}

/// Appends `count` ledgers of `chunks` raw chunks of `chunk_len` bytes (one payload buffer,
/// shared) and returns the stats after each.
fn fill(
    ring: &Ring,
    first: u32,
    count: u32,
    chunks: usize,
    chunk_len: usize,
    mut each: impl FnMut(u32, &Ring),
) {
    let payloads: Vec<Bytes> = (0..chunks)
        .map(|i| Bytes::from(bytes_for(i as u64, chunk_len)))
        .collect();
    for seq in first..first + count {
        let chunks: Vec<StoredChunk> = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| StoredChunk {
                index: i as u32,
                raw_offset: (i * chunk_len) as u64,
                raw_len: chunk_len as u32,
                codec: Codec::None,
                payload: p.clone(),
            })
            .collect();
        let end = LedgerEnd {
            seq,
            chunk_count: chunks.len() as u32,
            raw_len: (chunks.len() * chunk_len) as u64,
            checksum: 0,
            header_hash: hash_of(seq),
            previous_hash: hash_of(seq - 1),
            first_byte_ns: 0,
            last_byte_ns: 0,
        };
        ring.append(&end, &chunks).unwrap();
        each(seq, ring);
    }
}

/// Disk use stays at the live bytes while the ring turns over 30 times: each ledger is one file,
/// pruning unlinks it, and sled holds only the records (about 130 bytes each). The bound is
/// live + a tenth + 4 MiB for sled's own files; format 1, with the payloads in sled, measured
/// 40-64 MiB here for 10 MiB live (sled's floor of segments and its cleaner's 2x).
#[test]
fn disk_use_stays_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let ring = Ring::open(&RingConfig {
        max_ledgers: 10,
        ..config(tmp.path())
    })
    .unwrap();
    let mut worst = 0;
    fill(&ring, 1, 300, 4, 256 << 10, |seq, ring| {
        let s = ring.stats();
        if seq > 20 {
            worst = worst.max(s.disk_bytes);
        }
    });
    let s = ring.stats();
    assert_eq!(s.ledgers, 10);
    let bound = s.live_bytes + s.live_bytes / 10 + (4 << 20);
    eprintln!(
        "ring disk use: {} disk / {} live = {:.2}, worst {} (bound {bound})",
        s.disk_bytes,
        s.live_bytes,
        s.disk_bytes as f64 / s.live_bytes as f64,
        worst
    );
    assert!(worst <= bound, "worst {worst} > {bound}: {s:?}");
}

/// The measurement: 14.5 MiB ledgers of 256 KiB chunks, 20 kept, 100 appended, one every 200 ms
/// (25 times the network's rate; the time between ledgers is when sled's cleaner catches up).
/// Prints disk against live bytes every 20 ledgers and at steady state. Run with
/// `cargo test -p ledger-relay --release --test tests -- --ignored --exact ring::ring_disk_use
/// --nocapture`; `RING_BENCH_SLEEP_MS`, `RING_BENCH_LEDGERS` and `RING_BENCH_MAX_LEDGERS`
/// change the pace, the count and the ring size.
#[test]
#[ignore = "benchmark: writes about 1.5 GiB"]
fn ring_disk_use() {
    let tmp = tempfile::tempdir().unwrap();
    let max_ledgers = env_u64("RING_BENCH_MAX_LEDGERS").unwrap_or(20) as u32;
    let ring = Ring::open(&RingConfig {
        max_ledgers,
        ..config(tmp.path())
    })
    .unwrap();
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    let started = Instant::now();
    let mut ratios = Vec::new();
    let ledgers = env_u64("RING_BENCH_LEDGERS").unwrap_or(100) as u32;
    fill(&ring, 1, ledgers, 58, 256 << 10, |seq, ring| {
        let s = ring.stats();
        let ratio = s.disk_bytes as f64 / s.live_bytes as f64;
        if seq > 2 * max_ledgers {
            ratios.push(ratio);
        }
        std::thread::sleep(Duration::from_millis(
            env_u64("RING_BENCH_SLEEP_MS").unwrap_or(200),
        ));
        if seq % 20 == 0 {
            println!(
                "ledger {seq:3}: live {:8.1} MiB, disk {:8.1} MiB, ratio {ratio:.2}",
                mib(s.live_bytes),
                mib(s.disk_bytes)
            );
        }
    });
    let elapsed = started.elapsed();
    let s = ring.stats();
    let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
    let max = ratios.iter().cloned().fold(0.0, f64::max);
    println!(
        "steady state (ledgers {}..={ledgers}): disk/live mean {mean:.2}, max {max:.2}; {:.1} s for {ledgers} ledgers",
        2 * max_ledgers + 1,
        elapsed.as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(3));
    let idle = ring.stats();
    println!(
        "after 3 s idle: live {:.1} MiB, disk {:.1} MiB, ratio {:.2}",
        mib(idle.live_bytes),
        mib(idle.disk_bytes),
        idle.disk_bytes as f64 / idle.live_bytes as f64
    );
    for e in walk(tmp.path()) {
        println!("  {} {}", e.0.display(), e.1);
    }
    drop(ring);
    let started = Instant::now();
    let ring = Ring::open(&RingConfig {
        max_ledgers,
        ..config(tmp.path())
    })
    .unwrap();
    println!(
        "reopen: {:.2} s, range {:?}",
        started.elapsed().as_secs_f64(),
        ring.range()
    );
    assert_eq!(s.ledgers, u64::from(max_ledgers));
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

fn walk(dir: &Path) -> Vec<(std::path::PathBuf, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push((e.path(), e.metadata().unwrap().len()));
        }
    }
    out
}

mod spares;
