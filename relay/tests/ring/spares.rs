//! The ring keeps pruned ledgers' files as spares and writes the next ledgers over them.

use super::*;

/// A pruned ledger's file is kept as a spare and the next ledger is written over it (the same
/// inode, cut or grown to its length), byte-identical when read back; spares survive a reopen
/// and are used after it.
#[test]
fn the_next_ledger_is_written_over_a_pruned_ones_file() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let cfg = RingConfig {
        max_ledgers: 3,
        ..config(tmp.path())
    };
    let inode = |seq: u32| {
        std::fs::metadata(ledger_file(tmp.path(), seq).unwrap())
            .unwrap()
            .ino()
    };
    let ring = Ring::open(&cfg).unwrap();
    // Ledgers of growing then shrinking sizes: spares are both shorter and longer than what
    // is written over them.
    let sizes = |seq: u32| vec![1000 + 7_000 * (seq as usize % 5), 300];
    let mut inodes = std::collections::BTreeSet::new();
    for seq in 1..=12u32 {
        let (end, chunks) = ledger(seq, &sizes(seq));
        ring.append(&end, &chunks).unwrap();
        let ino = inode(seq);
        if seq > 4 {
            assert!(
                inodes.contains(&ino),
                "ledger {seq} was written into a new file, not over a pruned one's"
            );
        }
        inodes.insert(ino);
        assert!(spare_files(tmp.path()).len() <= MAX_SPARES);
    }
    for seq in 10..=12 {
        let got = ring.get(seq).unwrap().expect("held");
        assert!(got == ledger(seq, &sizes(seq)), "ledger {seq} differs");
    }
    assert!(ring.get(9).unwrap().is_none());
    drop(ring);
    assert_eq!(ledger_files(tmp.path()), names(0, 10..=12));
    let spares: std::collections::BTreeSet<u64> = spare_files(tmp.path())
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().ino())
        .collect();
    assert_eq!(spares.len(), 1);

    let ring = Ring::open(&cfg).unwrap();
    let (end, chunks) = ledger(13, &sizes(13));
    ring.append(&end, &chunks).unwrap();
    assert!(
        spares.contains(&inode(13)),
        "a spare kept over the reopen is used"
    );
    let got = ring.get(13).unwrap().expect("held");
    assert!(got == ledger(13, &sizes(13)));
}
