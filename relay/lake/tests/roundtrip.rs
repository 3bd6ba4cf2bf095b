//! Export then read back: the 320 testnet ledgers through lakes of several layouts on a local
//! directory and on a loopback S3 server, byte for byte; the keys and the manifest as SEP-54
//! and Galexie write them; a writer resumed after a crash writes no gap and no object twice.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use futures::TryStreamExt;
use ledger_relay_lake::{
    ClientSettings, LakeCursor, LakeError, Layout, PrefetchOptions, PutOutcome,
};
use object_store::ObjectStoreExt;

use crate::support::{export, reader, testnet, writer, Place, FIRST, LAST};

fn layout(b: u32, p: u32) -> Layout {
    Layout {
        ledgers_per_batch: Some(b),
        batches_per_partition: Some(p),
    }
}

/// Every key in the lake, manifest included.
async fn keys(place: &Place) -> BTreeSet<String> {
    let store = place
        .url()
        .open(&ClientSettings::default(), &place.opts().store_config)
        .unwrap();
    let metas: Vec<object_store::ObjectMeta> = store.list(None).try_collect().await.unwrap();
    metas.into_iter().map(|m| m.location.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testnet_ledgers_round_trip_byte_identical() {
    let ledgers = testnet();
    for (b, p) in [(1, 64000), (8, 4), (7, 4), (64, 1)] {
        for place in Place::both("roundtrip") {
            let lake = writer(&place, layout(b, p)).await.unwrap();
            let w = export(&lake, &ledgers).await;
            // 7 per batch: a first batch of 4 (1410048-1410051), 45 of 7, and 1410367 waiting
            // for a batch that is never complete. 64 per batch: 1410048 is 22032 * 64.
            let want = match b {
                7 => 46,
                _ => 320 / b as usize,
            };
            assert_eq!(w.objects, want, "{b}/{p} on {}", place.url());
            let newest = if b == 7 { LAST - 1 } else { LAST };
            let lake = reader(&place).await.unwrap();
            assert_eq!(lake.range().await.unwrap(), Some((FIRST, newest)));
            let (seq, hash) = lake.newest().await.unwrap().unwrap();
            assert_eq!(
                (seq, hash),
                (newest, ledgers[(newest - FIRST) as usize].info.hash)
            );

            let mut cursor =
                LakeCursor::new(lake.clone(), FIRST, newest, PrefetchOptions::default());
            let mut n = 0;
            while let Some(l) = cursor.next().await.unwrap() {
                assert!(
                    l.raw == ledgers[n].raw,
                    "{b}/{p}: ledger {} differs",
                    FIRST + n as u32
                );
                n += 1;
            }
            assert_eq!(n, (newest - FIRST + 1) as usize);

            // Exactly the objects the layout names, and the manifest.
            let mut want_keys: BTreeSet<String> = BTreeSet::new();
            want_keys.insert(".config.json".into());
            for s in FIRST..=newest {
                want_keys.insert(lake.schema().object_key(s));
            }
            assert_eq!(keys(&place).await, want_keys, "{b}/{p}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_manifest_are_what_galexie_writes() {
    let ledgers = testnet();
    for (b, p, examples) in [
        (
            1,
            64000,
            &[
                "FFEA83FF--1408000-1471999/FFEA7BFF--1410048.xdr.zst",
                "FFEA83FF--1408000-1471999/FFEA7AC0--1410367.xdr.zst",
            ][..],
        ),
        (
            8,
            4,
            &["FFEA7BFF--1410048-1410079/FFEA7BF7--1410056-1410063.xdr.zst"][..],
        ),
        // The first batch of a writer that starts inside a range begins at its first ledger
        // and is named by its range, as Galexie names the batch that holds ledger 2 `0-63`.
        (
            7,
            4,
            &["FFEA7C17--1410024-1410051/FFEA7C02--1410045-1410051.xdr.zst"][..],
        ),
        (64, 1, &["FFEA7BFF--1410048-1410111.xdr.zst"][..]),
    ] {
        for place in Place::both("names") {
            let lake = writer(&place, layout(b, p)).await.unwrap();
            export(&lake, &ledgers).await;
            let keys = keys(&place).await;
            for e in examples {
                assert!(
                    keys.contains(*e),
                    "{b}/{p} on {}: {e} not in {keys:?}",
                    place.url()
                );
            }
            let store = place
                .url()
                .open(&ClientSettings::default(), &place.opts().store_config)
                .unwrap();
            let manifest = store
                .get(&".config.json".into())
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
            assert_eq!(
                std::str::from_utf8(&manifest).unwrap(),
                format!(
                    r#"{{"networkPassphrase":"Test SDF Network ; September 2015","version":"1.0","compression":"zstd","ledgersPerBatch":{b},"batchesPerPartition":{p}}}"#
                )
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_writer_leaves_no_gap_and_writes_nothing_twice() {
    let ledgers = testnet();
    for place in Place::both("resume") {
        let lake = writer(&place, layout(7, 4)).await.unwrap();
        // The first run stops (a crash) with ledgers 1410143-1410147 taken but not written.
        let first = export(&lake, &ledgers[..100]).await;
        assert_eq!(first.objects, 1 + 13);
        drop(lake);
        let lake = writer(&place, Layout::default()).await.unwrap();
        assert_eq!(lake.newest().await.unwrap().unwrap().0, FIRST + 94);
        // The second run is offered everything again (a source that replays, a ring).
        let second = export(&lake, &ledgers).await;
        assert_eq!(second.skipped, 95, "1410048-1410142 are in the lake");
        assert_eq!(second.present, 0, "no object is written twice");
        assert_eq!(first.objects + second.objects, 46);
        assert_eq!(lake.stats().objects_present.load(Ordering::Relaxed), 0);
        let lake = reader(&place).await.unwrap();
        let mut cursor = LakeCursor::new(lake.clone(), FIRST, LAST - 1, PrefetchOptions::default());
        let mut n = 0;
        while let Some(l) = cursor.next().await.unwrap() {
            assert!(l.raw == ledgers[n].raw);
            n += 1;
        }
        assert_eq!(n, 319);
        // A crash after an upload but before the writer noted it: the same batch again is
        // found present and left alone.
        let lake = writer(&place, Layout::default()).await.unwrap();
        let batch: Vec<_> = ledgers[4..11].to_vec();
        assert_eq!(
            lake.put_batch(&batch, 1).await.unwrap(),
            PutOutcome::AlreadyPresent
        );
        // A different batch at a key that is taken is a conflict, never an overwrite.
        let mut other = batch.clone();
        other.pop();
        assert!(matches!(
            lake.put_batch(&other, 1).await,
            Err(LakeError::Conflict { .. })
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cursor_checks_its_anchor_and_bounds_what_it_prefetches() {
    let ledgers = testnet();
    let place = Place::s3("cursor");
    let lake = writer(&place, layout(8, 4)).await.unwrap();
    export(&lake, &ledgers).await;
    let lake = reader(&place).await.unwrap();
    // Anchored to the right previous hash: fine; to a wrong one: refused at the first ledger.
    let prev = ledgers[16].info.previous_hash;
    let mut c = LakeCursor::new(lake.clone(), FIRST + 16, LAST, PrefetchOptions::default())
        .after(FIRST + 15, prev);
    assert_eq!(c.next().await.unwrap().unwrap().info.ledger_seq, FIRST + 16);
    let mut c = LakeCursor::new(lake.clone(), FIRST + 16, LAST, PrefetchOptions::default())
        .after(FIRST + 15, [7; 32]);
    match c.next().await {
        Err(LakeError::BrokenChain { seq, prev, .. }) => {
            assert_eq!((seq, prev), (FIRST + 16, FIRST + 15))
        }
        other => panic!("{other:?}"),
    }
    // Starting inside a batch hands out from the start, not from the batch's first ledger.
    let mut c = LakeCursor::new(
        lake.clone(),
        FIRST + 3,
        FIRST + 5,
        PrefetchOptions::default(),
    );
    let mut got = Vec::new();
    while let Some(l) = c.next().await.unwrap() {
        got.push(l.info.ledger_seq);
    }
    assert_eq!(got, [FIRST + 3, FIRST + 4, FIRST + 5]);
    // What the cursor holds stays under max_bytes plus one batch per fetch in flight.
    let largest = (0..40)
        .map(|i| {
            12 + ledgers[i * 8..i * 8 + 8]
                .iter()
                .map(|l| l.raw.len() as u64)
                .sum::<u64>()
        })
        .max()
        .unwrap();
    let opts = PrefetchOptions {
        depth: 3,
        max_bytes: 20_000,
    };
    // A lake of its own, so that its counters see this cursor only.
    let lake = reader(&place).await.unwrap();
    let stats = lake.stats().clone();
    let mut c = LakeCursor::new(lake.clone(), FIRST, LAST, opts);
    let mut n = 0;
    while let Some(_l) = c.next().await.unwrap() {
        n += 1;
        // A slow consumer, so that prefetching runs ahead as far as it may.
        if n % 8 == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    assert_eq!(n, 320);
    let peak = stats.prefetch_peak_bytes.load(Ordering::Relaxed);
    assert!(peak > 0);
    assert!(
        peak <= opts.max_bytes + opts.depth as u64 * largest,
        "peak {peak} > {} + {} * {largest}",
        opts.max_bytes,
        opts.depth
    );
    drop(c);
    assert_eq!(
        stats.prefetch_held_bytes.load(Ordering::Relaxed),
        0,
        "all released"
    );
}
