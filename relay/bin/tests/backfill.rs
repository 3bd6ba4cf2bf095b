//! `--backfill` through sessions: a relay with a small ring (20 ledgers) fed the 320 testnet
//! ledgers, a SEP-54 lake holding older ones (on a local directory and on the loopback S3
//! server), and a subscriber that starts below the ring. It gets every ledger byte for byte,
//! from the lake, then the ring, then live, with no gap and no duplicate; a start the lake
//! lacks too gets the below-retention error with the lake's oldest ledger; a damaged or
//! missing object ends the session with a retryable error and nothing of that ledger, and the
//! subscription goes on once the lake is mended; sessions beyond `--backfill-sessions` wait for
//! a reader slot, as do an identity's beyond `--backfill-sessions-per-identity`, and what the
//! prefetch holds stays within its stated bound.

use std::time::Duration;

use ledger_relay::lake::backfill::BackfillConfig;
use ledger_relay_lake::testing::S3Server;
use ledger_relay_lake::{
    ClientSettings, ErrorKind, LakeError, PrefetchOptions, TESTNET_PASSPHRASE,
};
use ledger_relay_subscriber::SubscribeError;
use ledger_relay_wire::frame::Start;
use object_store::{ObjectStoreExt, PutPayload};

use crate::lake::{with_a_changed_transaction_set, Place};
use crate::support::{
    assert_identical, assert_two_runs, eventually, file_source, first_of_two_runs, load, take,
    testnet_ledgers, Collector, GatedSource, Running, TestDir, COUNT, FIRST, LAST,
};

fn backfill_from(place: &Place) -> BackfillConfig {
    let mut b = BackfillConfig::new(place.url.clone(), Some(TESTNET_PASSPHRASE.into()));
    b.options = place.options();
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_below_the_ring_gets_the_lake_then_the_ring_then_live() {
    let want = testnet_ledgers();
    for place in Place::both("session") {
        // The lake holds the first 200 ledgers, as Galexie (or an earlier run) wrote them, and
        // the relay exports to it and backfills from it, as docs/operations.md suggests. The
        // ring holds only the newest 20 of what the source has read.
        place.fill(&want[..200], 1).await;
        let dir = TestDir::new();
        let source = GatedSource::new(dir.path());
        let mut config = dir.relay_config(&source.spec);
        config.retention = 20;
        config.export = Some(crate::lake::export_to(&place));
        config.backfill = Some(backfill_from(&place));
        let relay = Running::start(config).await;
        let m = relay.relay.metrics.clone();
        // The source reads 121 ledgers and waits: the ring holds the newest 20, so the first
        // 101 are the lake's alone.
        let held = FIRST + 120;
        source.release_to(held);
        relay.wait_for(held).await;
        eventually(60, "the ring moves past ledger 100", || {
            load(&m.ring_oldest) > u64::from(FIRST + 80)
        })
        .await;
        let mut sub_config = dir.sub(&relay, "rpc-1", 4, Start::Seq(FIRST));
        // One session throughout, on a loaded machine too: CI runs this beside the other tests
        // on 2 cores, and a 300 ms gap in the relay's 50 ms heartbeats once cost a reconnect.
        sub_config.heartbeat_timeout = Some(Duration::from_secs(3));
        let sub = Collector::start(sub_config, LAST);
        // Lake, then ring: the subscriber reaches the source's newest ledger while it waits.
        sub.wait_for((held - FIRST + 1) as usize, 60).await;
        // Live: the source goes on one ledger at a time, each released once the subscriber
        // has the one before, and the session reads the hub's live stream while the source
        // still has ledgers to go.
        let mut live_at = None;
        for seq in held + 1..=LAST {
            source.release_to(seq);
            sub.wait_for((seq - FIRST + 1) as usize, 60).await;
            let live = m
                .sessions
                .lock()
                .unwrap()
                .values()
                .any(|s| !s.catching_up && s.acked > held);
            if live && live_at.is_none() {
                live_at = Some(load(&m.source_newest));
            }
        }
        let out = sub.finish(120).await;
        out.assert_complete(&want);
        assert_eq!(out.sub.status().sessions, 1, "one session, no reconnect");
        assert!(
            live_at.is_some_and(|at| at < u64::from(LAST)),
            "the session went live before the source ended ({live_at:?}) on {}",
            place.url
        );
        // The lake served at least what the ring had dropped when the subscriber came, the
        // ring the ledgers after it; the reader slot was given back on leaving the lake.
        let from_lake = load(&m.lake.backfill_ledgers_total);
        assert!(from_lake >= 81, "{from_lake} ledgers from the lake");
        assert!(
            from_lake < COUNT as u64,
            "{from_lake}: the ring and live served the rest"
        );
        assert!(load(&m.ring_reads_total) >= 1, "the ring served some");
        assert_eq!(load(&m.lake.backfill_sessions), 0);
        assert!(load(&m.lake.backfill.objects_read) >= from_lake);
        for kind in ErrorKind::ALL {
            assert_eq!(m.lake.backfill.errors(kind), 0, "{kind:?}");
        }
        // One session read the lake: the prefetch held at most the default depth of objects
        // being fetched and the one being served, and nothing once it reached the ring.
        assert_prefetch_within(&m, 1, PrefetchOptions::default().depth, &want);
        relay.stop().await;
    }
}

/// The bound the relay's backfill memory is stated with (docs/operations.md, "Memory"):
/// `sessions x (depth + 1)` decoded objects, here one testnet ledger each (its bytes and the
/// batch's 12-byte header, as the cursor counts them). Asserts the relay's own count of what
/// the prefetch held reached something, stayed within the bound, and was all given back.
fn assert_prefetch_within(
    m: &ledger_relay::metrics::Metrics,
    sessions: u64,
    depth: usize,
    lake: &[bytes::Bytes],
) {
    let largest = lake.iter().map(|l| 12 + l.len() as u64).max().unwrap();
    let bound = sessions * (depth as u64 + 1) * largest;
    let peak = load(&m.lake.backfill.prefetch_peak_bytes);
    assert!(peak > 0, "the prefetch held nothing");
    assert!(
        peak <= bound,
        "the prefetch held {peak} bytes, over {sessions} x ({depth} + 1) x {largest} = {bound}"
    );
    assert_eq!(load(&m.lake.backfill.prefetch_held_bytes), 0, "given back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_beyond_the_reader_slots_wait_and_the_prefetch_stays_within_its_bound() {
    let want = testnet_ledgers();
    let place = Place::file();
    place.fill(&want[..300], 1).await;
    let dir = TestDir::new();
    dir.certs.issue_client("rpc-2", 30).unwrap();
    let mut config = dir.relay_config(&file_source());
    config.retention = 20;
    let mut backfill = backfill_from(&place);
    backfill.sessions = 1;
    backfill.prefetch.depth = 2;
    config.backfill = Some(backfill);
    let relay = Running::start(config).await;
    relay.wait_for(LAST).await;
    let m = relay.relay.metrics.clone();

    // The first subscriber takes the only reader slot and stalls inside the lake: its window
    // and channel (a few dozen ledgers) fill, and its session keeps its cursor.
    let first = Collector::start(dir.sub(&relay, "rpc-1", 2, Start::Seq(FIRST)), LAST);
    first.wait_for(10, 60).await;
    let stalled = first.halt().await;
    assert!(stalled.error.is_none(), "{:?}", stalled.error);
    assert_eq!(load(&m.lake.backfill_sessions), 1);

    // The second waits for the slot, asking again and again, and gets nothing meanwhile.
    let second = Collector::start(dir.sub(&relay, "rpc-2", 2, Start::Seq(FIRST)), LAST);
    eventually(60, "the second session asks for the slot", || {
        load(&m.lake.backfill_busy_total) >= 3
    })
    .await;
    assert_eq!(second.len(), 0, "nothing before it has a slot");
    assert_eq!(load(&m.lake.backfill_sessions), 1, "one slot, one reader");

    // The stalled subscriber goes away; its session ends and frees the slot, and the second
    // gets every ledger from the lake, then the ring, byte for byte.
    drop(stalled);
    let out = second.finish(120).await;
    out.assert_complete(&want);
    eventually(10, "the slot given back", || {
        load(&m.lake.backfill_sessions) == 0
    })
    .await;
    // Never more than one reader at a time, each within (2 + 1) objects.
    assert_prefetch_within(&m, 1, 2, &want[..300]);
    relay.stop().await;
}

/// One identity's slow sessions hold at most its share of the backfill reader slots: with the
/// default four slots (two per identity), four stalled backfilling sessions of rpc-1 hold two,
/// the other two of rpc-1 wait, and rpc-2 still gets a slot and every ledger while rpc-1's
/// sessions hold theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_identity_cannot_hold_every_backfill_reader_slot() {
    let want = testnet_ledgers();
    let place = Place::file();
    place.fill(&want[..300], 1).await;
    let dir = TestDir::new();
    dir.certs.issue_client("rpc-2", 30).unwrap();
    let mut config = dir.relay_config(&file_source());
    config.retention = 20;
    let mut backfill = backfill_from(&place);
    backfill.prefetch.depth = 2;
    assert_eq!((backfill.sessions, backfill.sessions_per_identity), (4, 2));
    config.backfill = Some(backfill);
    let relay = Running::start(config).await;
    relay.wait_for(LAST).await;
    let m = relay.relay.metrics.clone();
    let sub = |name| Collector::start(dir.sub(&relay, name, 1, Start::Seq(FIRST)), LAST);

    // Two sessions of rpc-1 take their slots and stall inside the lake.
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let s = sub("rpc-1");
        s.wait_for(10, 60).await;
        stalled.push(s.halt().await);
    }
    assert_eq!(load(&m.lake.backfill_sessions), 2);
    // Two more of rpc-1 find its share held: they wait, with two slots free.
    let waiting = [sub("rpc-1"), sub("rpc-1")];
    let busy = load(&m.lake.backfill_busy_total);
    eventually(
        60,
        "rpc-1's third and fourth sessions ask for a slot",
        || load(&m.lake.backfill_busy_total) >= busy + 6,
    )
    .await;
    assert!(
        waiting.iter().all(|w| w.len() == 0),
        "nothing without a slot"
    );
    assert_eq!(load(&m.lake.backfill_sessions), 2, "rpc-1 holds its two");

    // rpc-2 gets a slot and everything, from the lake then the ring, while rpc-1 holds its own.
    let other = sub("rpc-2").finish(120).await;
    other.assert_complete(&want);
    assert!(stalled.iter().all(|s| s.error.is_none()));
    for w in waiting {
        let out = w.halt().await;
        assert!(out.got.is_empty(), "rpc-1 still held to its share");
    }
    drop(stalled);
    eventually(10, "the slots given back", || {
        load(&m.lake.backfill_sessions) == 0
    })
    .await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_neither_the_lake_nor_the_ring_holds_is_below_retention_with_the_lake_s_oldest() {
    let want = testnet_ledgers();
    let place = Place::file();
    // The lake holds FIRST+50 ..= FIRST+199, the ring the last 20: ledgers 200..299 of the
    // file are in neither.
    place.fill(&want[50..200], 1).await;
    let dir = TestDir::new();
    let mut config = dir.relay_config(&file_source());
    config.retention = 20;
    config.backfill = Some(backfill_from(&place));
    let relay = Running::start(config).await;
    relay.wait_for(LAST).await;

    // Below the lake: refused at the start, with the lake's oldest and the relay's newest.
    match take(dir.sub(&relay, "rpc-1", 2, Start::Seq(FIRST + 10)), 1, 30).await {
        Err(SubscribeError::BelowRetention {
            requested,
            oldest,
            newest,
            ..
        }) => assert_eq!((requested, oldest, newest), (FIRST + 10, FIRST + 50, LAST)),
        other => panic!("{:?}", other.map(|l| l.len())),
    }
    // The lake's oldest is where a subscriber can start.
    let got = take(dir.sub(&relay, "rpc-1", 2, Start::Seq(FIRST + 50)), 10, 30)
        .await
        .unwrap();
    assert_identical(&got, &want, FIRST + 50);

    // Inside the lake but running into the gap after it: everything the lake holds, then the
    // below-retention end for the first ledger of the gap.
    let sub = Collector::start(dir.sub(&relay, "rpc-1", 2, Start::Seq(FIRST + 190)), LAST);
    let out = sub.finish(60).await;
    assert_eq!(out.got.len(), 10, "FIRST+190 ..= FIRST+199");
    assert_identical(&out.got, &want, FIRST + 190);
    match out.error {
        Some(SubscribeError::BelowRetention {
            requested,
            oldest,
            newest,
            ..
        }) => assert_eq!((requested, oldest, newest), (FIRST + 200, FIRST + 50, LAST)),
        other => panic!("{other:?}"),
    }
    let m = &relay.relay.metrics;
    assert!(m.lake.backfill.errors(ErrorKind::Lacks) >= 2);
    eventually(10, "reader slots given back", || {
        load(&m.lake.backfill_sessions) == 0
    })
    .await;
    relay.stop().await;
}

/// A ring that holds two runs (the relay was down while its source went
/// on) with a lake that holds the ledgers between them. A subscriber streams across the gap:
/// the old run from the ring, the gap from the lake, the new run from the ring, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_between_the_ring_s_runs_is_served_from_the_lake() {
    let want = testnet_ledgers();
    let place = Place::file();
    place.fill(&want[80..170], 1).await;
    let dir = TestDir::new();
    let second = first_of_two_runs(&dir).await;
    let mut config = dir.relay_config(&second);
    config.backfill = Some(backfill_from(&place));
    let relay = Running::start(config).await;
    assert_two_runs(&relay).await;

    let start = FIRST + 90;
    let got = take(
        dir.sub(&relay, "rpc-1", 2, Start::Seq(start)),
        (LAST - start + 1) as usize,
        60,
    )
    .await
    .unwrap();
    assert_identical(&got, &want, start);
    let m = &relay.relay.metrics;
    assert_eq!(
        load(&m.lake.backfill_ledgers_total),
        50,
        "the gap, from the lake"
    );
    eventually(10, "reader slots given back", || {
        load(&m.lake.backfill_sessions) == 0
    })
    .await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_or_missing_lake_object_is_a_retryable_error_and_nothing_of_it_is_served() {
    let want = testnet_ledgers();
    let place = Place::s3("damaged");
    // Up to the ledger before the ring's oldest (the ring keeps the last 20).
    place.fill(&want[..300], 1).await;
    let lake = place.reader().await;
    let store = place
        .url
        .open(&ClientSettings::default(), &place.options().store_config)
        .unwrap();
    let (bad, gone) = (FIRST + 30, FIRST + 60);
    let (bad_key, gone_key) = (lake.key(bad), lake.key(gone));
    let good = store
        .get(&bad_key.as_str().into())
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let kept = store
        .get(&gone_key.as_str().into())
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    store
        .put(
            &bad_key.as_str().into(),
            PutPayload::from_static(b"\x28\xb5\x2f\xfd garbage"),
        )
        .await
        .unwrap();
    store.delete(&gone_key.as_str().into()).await.unwrap();

    let dir = TestDir::new();
    let mut config = dir.relay_config(&file_source());
    config.retention = 20;
    config.backfill = Some(backfill_from(&place));
    let relay = Running::start(config).await;
    relay.wait_for(LAST).await;
    let m = relay.relay.metrics.clone();
    let sub = Collector::start(dir.sub(&relay, "rpc-1", 2, Start::Seq(FIRST)), LAST);

    // The damaged object: everything before it, nothing of it, and the subscriber retries;
    // mended, the same subscription goes on by itself to the missing object, likewise.
    for (at, key, kind, word, mended) in [
        (bad, &bad_key, ErrorKind::Corrupt, "is corrupt", good),
        (gone, &gone_key, ErrorKind::Missing, "is missing", kept),
    ] {
        let n = (at - FIRST) as usize;
        sub.wait_for(n, 60).await;
        eventually(60, "the session ends with the object's error", || {
            let st = sub.status();
            st.sessions >= 2
                && st
                    .last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("internal") && e.contains(key.as_str()))
        })
        .await;
        assert_eq!(sub.len(), n, "nothing of ledger {at}");
        assert!(m.lake.backfill.errors(kind) >= 1);
        assert!(sub.status().last_error.unwrap().contains(word));
        store
            .put(&key.as_str().into(), PutPayload::from(mended))
            .await
            .unwrap();
    }

    // Restored: every ledger, once, in order, byte for byte.
    let out = sub.finish(120).await;
    assert_eq!(out.got.len(), COUNT);
    out.assert_complete(&want);
    relay.stop().await;
}

/// `ledger-relay run --backfill` as a process: flags, environment and the log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_backfills_from_an_s3_lake() {
    let want = testnet_ledgers();
    let place = Place::s3("binary");
    // Up to the ledger before the ring's oldest (the ring keeps the last 20).
    place.fill(&want[..300], 1).await;
    let server: &S3Server = place.server.as_deref().unwrap();
    let dir = TestDir::new();
    let url = place.url.to_string();
    let source = file_source();
    let relay = crate::lake::RelayProcess::start(
        &dir,
        server,
        &[
            "--source",
            &source,
            "--cadence",
            "2ms",
            "--retention",
            "20",
            "--network",
            "testnet",
            "--backfill",
            &url,
            "--backfill-sessions",
            "1",
            "--backfill-prefetch",
            "4",
        ],
    )
    .await;
    relay
        .wait_metric("ledger_relay_ring_newest", u64::from(LAST), 60)
        .await;
    let addr = relay.udp_addr().await;
    let config = crate::support::sub_config(
        vec![ledger_relay_subscriber::RelayAddr::new(
            "127.0.0.1",
            addr.port(),
        )],
        dir.certs.path(),
        "rpc-1",
        2,
        Start::Seq(FIRST),
    );
    let got = take(config, COUNT, 60).await.unwrap();
    assert_identical(&got, &want, FIRST);
    assert!(
        relay
            .metric("ledger_relay_lake_backfill_ledgers_total")
            .await
            >= 200
    );
    assert!(
        relay.log().contains("backfill lake opened"),
        "{}",
        relay.log()
    );
    relay.sigterm().await;
}

/// Flips a byte of the last stored part of ledger `seq` in the ring of a stopped relay whose
/// data directory is `data`, so that the part fails its checksum.
pub(crate) fn damage_ring(data: &std::path::Path, seq: u32) {
    let path =
        ledger_relay::ring::ledger_file(&data.join("ring"), seq).expect("the ledger is stored");
    let mut v = std::fs::read(&path).unwrap();
    let at = v.len() - 1;
    v[at] ^= 0x5a;
    std::fs::write(&path, v).unwrap();
}

/// A ledger damaged in the middle of the ring is read from the backfill lake
/// instead (the ledger the ring recorded, by its header hash), served, and written over the
/// damaged copy: the subscriber gets every ledger from the one relay, and the ring is whole
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_ring_ledger_is_replaced_from_the_backfill_lake() {
    let want = testnet_ledgers();
    let place = Place::file();
    place.fill(&want, 1).await;
    let dir = TestDir::new();
    let writer = Running::start(dir.relay_config(&file_source())).await;
    writer.wait_for(LAST).await;
    writer.stop().await;
    let bad = FIRST + 50;
    damage_ring(&dir.data(), bad);
    let empty = dir.path().join("empty.xdr");
    std::fs::write(&empty, b"").unwrap();
    let mut config = dir.relay_config(&format!("file:{}", empty.display()));
    config.backfill = Some(backfill_from(&place));
    let relay = Running::start(config).await;
    assert_eq!(relay.relay.ring.range(), Some((FIRST, LAST)));
    assert!(relay.relay.ring.get(bad).is_err(), "damaged");
    let got = take(dir.sub(&relay, "rpc-1", 2, Start::Seq(FIRST)), COUNT, 60)
        .await
        .unwrap();
    assert_identical(&got, &want, FIRST);
    let m = &relay.relay.metrics;
    assert_eq!(load(&m.ring_corrupt_total), 1, "found once, then repaired");
    assert_eq!(load(&m.ring_repaired_total), 1);
    let (end, _) = relay.relay.ring.get(bad).unwrap().unwrap();
    assert_eq!(end.seq, bad);
    relay.stop().await;
}

/// The ring's scrub finds a ledger damaged in the middle of the ring that no
/// subscriber asked for, and writes it again from the backfill lake; the pass goes on to the
/// newest ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrub_replaces_a_damaged_ledger_no_one_asked_for() {
    let want = testnet_ledgers();
    let place = Place::file();
    place.fill(&want, 1).await;
    let dir = TestDir::new();
    let writer = Running::start(dir.relay_config(&file_source())).await;
    writer.wait_for(LAST).await;
    writer.stop().await;
    let bad = FIRST + 70;
    damage_ring(&dir.data(), bad);
    let empty = dir.path().join("empty.xdr");
    std::fs::write(&empty, b"").unwrap();
    let mut config = dir.relay_config(&format!("file:{}", empty.display()));
    config.backfill = Some(backfill_from(&place));
    config.scrub_rate = 64 << 20;
    let relay = Running::start(config).await;
    let m = relay.relay.metrics.clone();
    eventually(60, "a scrub pass over the whole ring", || {
        load(&m.ring_scrub_passes_total) >= 1
    })
    .await;
    assert_eq!(load(&m.ring_corrupt_total), 1, "found by the scrub");
    assert_eq!(
        load(&m.ring_repaired_total),
        1,
        "written again from the lake"
    );
    assert!(
        load(&m.ring_scrubbed_total) >= u64::from(LAST - FIRST),
        "every other ledger read back: {}",
        load(&m.ring_scrubbed_total)
    );
    let (end, _) = relay.relay.ring.get(bad).unwrap().unwrap();
    assert_eq!(end.seq, bad);
    let got = take(dir.sub(&relay, "rpc-1", 2, Start::Seq(bad)), 1, 30)
        .await
        .unwrap();
    assert_identical(&got, &want, bad);
    relay.stop().await;
}

/// A backfill lake whose copy of a ledger has a changed transaction set (header, hash and
/// chain intact): a session's read of it is refused with the content error, after the ledgers
/// before it, and the ring's scrub does not write it over a damaged copy of that ledger: the
/// damage stays reported rather than turned into a ledger the scrub would then call intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_transaction_set_in_the_lake_is_never_served_nor_written_to_the_ring() {
    let want = testnet_ledgers();
    let bad = FIRST + 70;
    let mut lake = want.clone();
    lake[70] = with_a_changed_transaction_set(&lake[70]);
    let place = Place::file();
    place.fill(&lake, 1).await;
    let dir = TestDir::new();
    let writer = Running::start(dir.relay_config(&file_source())).await;
    writer.wait_for(LAST).await;
    writer.stop().await;
    damage_ring(&dir.data(), bad);
    let empty = dir.path().join("empty.xdr");
    std::fs::write(&empty, b"").unwrap();
    let mut config = dir.relay_config(&format!("file:{}", empty.display()));
    config.backfill = Some(backfill_from(&place));
    config.scrub_rate = 64 << 20;
    let relay = Running::start(config).await;
    let m = relay.relay.metrics.clone();
    eventually(60, "a scrub pass over the whole ring", || {
        load(&m.ring_scrub_passes_total) >= 1
    })
    .await;
    assert_eq!(load(&m.ring_corrupt_total), 1, "found by the scrub");
    assert_eq!(load(&m.ring_repaired_total), 0, "not from a changed copy");
    assert!(m.lake.backfill.errors(ErrorKind::Content) >= 1);
    assert!(relay.relay.ring.get(bad).is_err(), "still reported damaged");

    // Read as a session reads the lake: the ledgers before it, then the content error.
    let backfill = relay.relay.backfill.clone().unwrap();
    let mut cursor = backfill.cursor(FIRST, LAST).await.unwrap();
    for seq in FIRST..bad {
        let l = cursor.fetch(seq).await.unwrap().unwrap();
        assert_eq!(l.end.seq, seq);
    }
    match cursor.fetch(bad).await {
        Err(LakeError::Content { seq, error, .. }) => {
            assert_eq!(seq, bad);
            assert!(error.to_string().contains("txSetHash"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    relay.stop().await;
}

/// Without a lake the scrub reports the damaged ledger (`/healthz` names `ring_corrupt`) before
/// any subscriber asks for it; with `--scrub-rate 0` nothing reads it and nothing is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrub_reports_damage_without_a_lake_and_can_be_turned_off() {
    let dir = TestDir::new();
    let writer = Running::start(dir.relay_config(&file_source())).await;
    writer.wait_for(LAST).await;
    writer.stop().await;
    let bad = FIRST + 20;
    damage_ring(&dir.data(), bad);
    let empty = dir.path().join("empty.xdr");
    std::fs::write(&empty, b"").unwrap();
    let source = format!("file:{}", empty.display());
    let mut config = dir.relay_config(&source);
    config.metrics = Some("127.0.0.1:0".parse().unwrap());
    let off = Running::start(config.clone()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let m = off.relay.metrics.clone();
    assert_eq!(load(&m.ring_scrub_passes_total), 0);
    assert_eq!(load(&m.ring_corrupt_total), 0, "nothing read it");
    off.stop().await;
    config.scrub_rate = 64 << 20;
    let on = Running::start(config).await;
    let m = on.relay.metrics.clone();
    eventually(60, "a scrub pass", || load(&m.ring_scrub_passes_total) >= 1).await;
    assert_eq!(load(&m.ring_corrupt_total), 1);
    assert_eq!(load(&m.ring_repaired_total), 0, "no lake to repair from");
    let health = crate::support::http_get(on.relay.metrics_addr.unwrap(), "/healthz").await;
    assert!(health.contains("\"ring_corrupt\""), "{health}");
    on.stop().await;
}
