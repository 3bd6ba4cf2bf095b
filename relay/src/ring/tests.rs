//! Unit tests of the ring's settings and of what `append` accepts (the stored encodings are tested
//! in `ledger_relay_wire::stored`, the ring itself in `relay/tests/ring.rs`).

use bytes::Bytes;
use ledger_relay_wire::compress::Codec;
use ledger_relay_wire::frame::LedgerEnd;

use super::*;

/// `append` refuses sequence 0 and, as [`RingError::BadRecord`], any ledger whose chunks do not
/// tile it (the tiling rule's own cases are `check_chunks_rejects_inconsistent_ledgers` in
/// `ledger_relay_wire::stored`).
#[test]
fn validate_rejects_inconsistent_ledgers() {
    let chunk = |index, raw_offset, raw_len| StoredChunk {
        index,
        raw_offset,
        raw_len,
        codec: Codec::None,
        payload: Bytes::from(vec![7u8; raw_len as usize]),
    };
    let e = LedgerEnd {
        seq: 5,
        chunk_count: 2,
        raw_len: 30,
        header_hash: [5; 32],
        previous_hash: [4; 32],
        ..LedgerEnd::default()
    };
    let good = [chunk(0, 0, 10), chunk(1, 10, 20)];
    assert!(validate(&e, &good).is_ok());
    let cases: Vec<(&str, LedgerEnd, Vec<StoredChunk>)> = vec![
        ("count", e, vec![good[0].clone()]),
        ("offset", e, vec![good[0].clone(), chunk(1, 11, 19)]),
        ("seq 0", LedgerEnd { seq: 0, ..e }, good.to_vec()),
    ];
    for (name, e, chunks) in cases {
        assert!(
            matches!(validate(&e, &chunks), Err(RingError::BadRecord { .. })),
            "{name}"
        );
    }
}

/// End record of ledger `seq`, hashed so that it continues ledger `seq - 1`.
fn end(seq: u32) -> LedgerEnd {
    LedgerEnd {
        seq,
        chunk_count: 3,
        raw_len: 1 << 20,
        checksum: 0x0123_4567_89ab_cdef,
        header_hash: [seq as u8; 32],
        previous_hash: [seq.wrapping_sub(1) as u8; 32],
        first_byte_ns: 11,
        last_byte_ns: 22,
    }
}

/// A one-chunk ledger `seq` that continues ledger `seq - 1` (the hashes of [`end`]).
fn small(seq: u32) -> (LedgerEnd, Vec<StoredChunk>) {
    let e = LedgerEnd {
        chunk_count: 1,
        raw_len: 100,
        ..end(seq)
    };
    let chunk = StoredChunk {
        index: 0,
        raw_offset: 0,
        raw_len: 100,
        codec: Codec::None,
        payload: Bytes::from(vec![seq as u8; 100]),
    };
    (e, vec![chunk])
}

pub(crate) fn append_small(ring: &Ring, seq: u32) {
    let (e, chunks) = small(seq);
    ring.append(&e, &chunks).unwrap();
}

/// A pause point a test holds shut: the first thread to reach `at` waits there until released.
struct Gate {
    entered: std::sync::mpsc::Receiver<()>,
    release: std::sync::mpsc::Sender<()>,
    hook: Hook,
}

impl Gate {
    fn new(at: &'static str) -> Gate {
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        let once = std::sync::atomic::AtomicBool::new(false);
        let (entered_tx, release_rx) = (Mutex::new(entered_tx), Mutex::new(release_rx));
        let hook: Hook = std::sync::Arc::new(move |point| {
            if point != at || once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            let _ = entered_tx.lock().unwrap().send(());
            let _ = release_rx
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(120));
        });
        Gate {
            entered,
            release,
            hook,
        }
    }

    fn wait_entered(&self) {
        self.entered
            .recv_timeout(Duration::from_secs(60))
            .expect("the pause point is reached");
    }
}

/// Runs `f` on a thread of its own and returns its result, or panics if it has not answered
/// within a minute: it is waiting for IO it should not wait for.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what} waited for another thread's IO"))
}

/// No lock that readers need is held across disk or sled IO. While an append
/// is held inside its IO, `range`, `newest`, `stats` and `get` answer; while a read is held
/// inside its IO, an append completes and the range moves.
#[test]
fn no_lock_is_held_across_io() {
    let tmp = tempfile::tempdir().unwrap();
    let ring = std::sync::Arc::new(Ring::open(&RingConfig::new(tmp.path())).unwrap());
    for seq in 1..=3 {
        append_small(&ring, seq);
    }

    let gate = Gate::new("append:index");
    ring.set_hook(Some(gate.hook.clone()));
    let writer = {
        let ring = ring.clone();
        std::thread::spawn(move || append_small(&ring, 4))
    };
    gate.wait_entered();
    let r = ring.clone();
    let seen = within("reading during an append", move || {
        let got = r.get(2).map(|g| g.map(|l| l.0.seq)).ok().flatten();
        (r.range(), r.newest().map(|n| n.0), r.stats().ledgers, got)
    });
    assert_eq!(seen, (Some((1, 3)), Some(3), 3, Some(2)));
    gate.release.send(()).unwrap();
    writer.join().unwrap();
    assert_eq!(ring.range(), Some((1, 4)));

    let gate = Gate::new("get:file");
    ring.set_hook(Some(gate.hook.clone()));
    let reader = {
        let ring = ring.clone();
        std::thread::spawn(move || ring.get(2).unwrap().map(|l| l.0.seq))
    };
    gate.wait_entered();
    let r = ring.clone();
    let range = within("appending during a read", move || {
        append_small(&r, 5);
        r.range()
    });
    assert_eq!(range, Some((1, 5)));
    gate.release.send(()).unwrap();
    assert_eq!(reader.join().unwrap(), Some(2));
    ring.set_hook(None);
}

/// The measurement override of sled's settings: either or both keys, defaults otherwise, and
/// anything else refused rather than ignored.
#[test]
fn sled_tuning_takes_segment_size_and_flush_period() {
    let ok = |t: Option<&str>| super::parse_sled_tuning(t).unwrap();
    assert_eq!(ok(None), (SEGMENT_SIZE, super::FLUSH_EVERY_MS));
    assert_eq!(ok(Some("")), (SEGMENT_SIZE, super::FLUSH_EVERY_MS));
    assert_eq!(
        ok(Some("segment_mib=32")),
        (32 << 20, super::FLUSH_EVERY_MS)
    );
    assert_eq!(ok(Some("flush_ms=100,segment_mib=4")), (4 << 20, 100));
    for bad in [
        "segment_mib=3",
        "segment_mib=0",
        "flush_ms=0",
        "flush=1",
        "segment_mib",
    ] {
        assert!(
            matches!(
                super::parse_sled_tuning(Some(bad)),
                Err(RingError::Config { .. })
            ),
            "{bad}"
        );
    }
}

/// A ledger after a gap starts a run beside the ledgers held, which stay
/// readable; pruning takes the oldest across runs (their files too); opening the ring again
/// finds every run.
#[test]
fn a_gap_starts_a_run_beside_the_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = RingConfig {
        max_ledgers: 8,
        ..RingConfig::new(dir.path())
    };
    let ring = Ring::open(&cfg).unwrap();
    for seq in 1..=3 {
        append_small(&ring, seq);
    }
    // Not a gap: a ledger already passed, or the next one (which must link instead).
    for seq in [2, 3, 4] {
        let (e, c) = small(seq);
        assert!(
            matches!(
                ring.append_after_gap(&e, &c),
                Err(RingError::Discontinuity { .. })
            ),
            "{seq}"
        );
    }
    let (e, c) = small(10);
    assert!(matches!(
        ring.append(&e, &c),
        Err(RingError::Discontinuity { .. })
    ));
    ring.append_after_gap(&e, &c).unwrap();
    append_small(&ring, 11);
    let (e, c) = small(20);
    ring.append_after_gap(&e, &c).unwrap();

    assert_eq!(ring.runs(), vec![(1, 3), (10, 11), (20, 20)]);
    assert_eq!(ring.range(), Some((1, 20)));
    assert!(ring.holds(2) && !ring.holds(4) && ring.holds(10) && !ring.holds(21));
    assert_eq!(ring.next_held(4), Some(10));
    assert_eq!(ring.next_held(12), Some(20));
    assert_eq!(ring.next_held(21), None);
    let stats = ring.stats();
    assert_eq!((stats.runs, stats.ledgers, stats.epoch), (3, 6, 0));
    assert_eq!(ring.get(2).unwrap().unwrap().0, small(2).0);
    assert!(ring.get(5).unwrap().is_none());
    assert_eq!(ring.stored_hash(3).unwrap(), Some(end(3).header_hash));
    assert_eq!(ring.stored_hash(5).unwrap(), None);

    // 9 ledgers for 8 places: the oldest goes; 3 more take the rest of the oldest run.
    for seq in 21..=23 {
        append_small(&ring, seq);
    }
    assert_eq!(ring.runs(), vec![(2, 3), (10, 11), (20, 23)]);
    append_small(&ring, 24);
    append_small(&ring, 25);
    assert_eq!(ring.runs(), vec![(10, 11), (20, 25)]);
    for seq in 1..=3 {
        assert!(
            ledger_file(dir.path(), seq).is_none(),
            "file of {seq} removed"
        );
    }
    assert!(ledger_file(dir.path(), 10).is_some());

    drop(ring);
    let ring = Ring::open(&cfg).unwrap();
    assert_eq!(ring.runs(), vec![(10, 11), (20, 25)]);
    assert_eq!(ring.newest(), Some((25, end(25).header_hash)));
    assert_eq!(ring.get(11).unwrap().unwrap().0, small(11).0);
    // The runs go on as before: the newest continues (pruning 10), a gap starts another
    // (pruning 11, the last of its run).
    append_small(&ring, 26);
    assert_eq!(ring.runs(), vec![(11, 11), (20, 26)]);
    let (e, c) = small(40);
    ring.append_after_gap(&e, &c).unwrap();
    assert_eq!(ring.runs(), vec![(20, 26), (40, 40)]);
}

/// A ledger that started a run, torn by a crash, is dropped on opening like any torn newest
/// ledger; the run before the gap is kept whole.
#[test]
fn opening_drops_a_torn_ledger_that_started_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = RingConfig::new(dir.path());
    {
        let ring = Ring::open(&cfg).unwrap();
        for seq in 1..=3 {
            append_small(&ring, seq);
        }
        let (e, c) = small(10);
        ring.append_after_gap(&e, &c).unwrap();
    }
    let path = ledger_file(dir.path(), 10).unwrap();
    let mut v = std::fs::read(&path).unwrap();
    let at = v.len() - 1;
    v[at] ^= 0x55;
    std::fs::write(&path, v).unwrap();
    let ring = Ring::open(&cfg).unwrap();
    assert_eq!(ring.runs(), vec![(1, 3)]);
    assert_eq!(ring.newest(), Some((3, end(3).header_hash)));
    assert!(
        ledger_file(dir.path(), 10).is_none(),
        "the torn file is removed"
    );
}
