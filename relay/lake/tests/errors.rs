//! Every failure a lake can show, on real stores: a missing object, a truncated or corrupt
//! one, a ledger the lake does not hold, a wrong network or layout, no manifest, an
//! unreachable store, refused credentials, a broken chain and a conflicting object. Each is
//! its own error naming the key, nothing of a bad batch is handed out, and each is counted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ledger_relay_lake::testing::{unique_bucket, S3Server};
use ledger_relay_lake::{
    BatchAssembler, ClientSettings, ErrorKind, Lake, LakeCursor, LakeError, LakeOptions, LakeStats,
    LakeUrl, Layout, PrefetchOptions, PUBNET_PASSPHRASE, TESTNET_PASSPHRASE,
};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::support::{export, reader, testnet, writer, Place, FIRST, LAST};

fn layout(b: u32, p: u32) -> Layout {
    Layout {
        ledgers_per_batch: Some(b),
        batches_per_partition: Some(p),
    }
}

fn store(place: &Place) -> Arc<dyn ObjectStore> {
    place
        .url()
        .open(&ClientSettings::default(), &place.opts().store_config)
        .unwrap()
}

async fn tamper(place: &Place, key: &str, f: impl FnOnce(Vec<u8>) -> Vec<u8>) {
    let s = store(place);
    let old = s
        .get(&key.into())
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    s.put(&key.into(), PutPayload::from(Bytes::from(f(old))))
        .await
        .unwrap();
}

/// Reads `first..=last`, returning the sequences handed out and the error that stopped it.
async fn read(lake: &Arc<Lake>, first: u32, last: u32) -> (Vec<u32>, Option<LakeError>) {
    let mut c = LakeCursor::new(lake.clone(), first, last, PrefetchOptions::default());
    let mut got = Vec::new();
    loop {
        match c.next().await {
            Ok(Some(l)) => got.push(l.info.ledger_seq),
            Ok(None) => return (got, None),
            Err(e) => {
                assert_eq!(
                    c.position(),
                    first + got.len() as u32,
                    "the cursor stays put"
                );
                return (got, Some(e));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_and_missing_objects_are_typed_errors_and_nothing_partial_is_served() {
    let ledgers = testnet();
    for place in Place::both("damage") {
        let lake = writer(&place, layout(8, 4)).await.unwrap();
        export(&lake, &ledgers).await;
        let lake = reader(&place).await.unwrap();
        let key = |seq: u32| lake.schema().object_key(seq);

        // Corrupt: a byte flipped in the middle of the batch of 1410056-1410063.
        tamper(&place, &key(FIRST + 8), |mut b| {
            let n = b.len() / 2;
            b[n] ^= 0x55;
            b
        })
        .await;
        let (got, e) = read(&lake, FIRST, LAST).await;
        assert_eq!(
            got,
            (FIRST..FIRST + 8).collect::<Vec<_>>(),
            "nothing of the bad batch"
        );
        match e {
            Some(LakeError::Corrupt { key: k, .. }) => assert_eq!(k, key(FIRST + 8)),
            other => panic!("{other:?}"),
        }
        assert_eq!(lake.stats().errors(ErrorKind::Corrupt), 1);

        // Truncated: the batch of 1410064-1410071 cut to half.
        tamper(&place, &key(FIRST + 16), |b| b[..b.len() / 2].to_vec()).await;
        let (got, e) = read(&lake, FIRST + 16, LAST).await;
        assert!(got.is_empty());
        match e {
            Some(LakeError::Truncated { key: k, .. }) => assert_eq!(k, key(FIRST + 16)),
            other => panic!("{other:?}"),
        }
        assert_eq!(lake.stats().errors(ErrorKind::Truncated), 1);

        // Missing: the batch of 1410080-1410087 deleted. Inside the lake's range, a gap.
        store(&place).delete(&key(FIRST + 32).into()).await.unwrap();
        let (got, e) = read(&lake, FIRST + 24, LAST).await;
        assert_eq!(got, (FIRST + 24..FIRST + 32).collect::<Vec<_>>());
        assert_eq!(
            e,
            Some(LakeError::Missing {
                key: key(FIRST + 32)
            })
        );
        assert_eq!(lake.stats().errors(ErrorKind::Missing), 1);

        // Outside the range: the lake lacks it, and says what it holds.
        let (_, e) = read(&lake, FIRST - 10, LAST).await;
        assert_eq!(
            e,
            Some(LakeError::Lacks {
                seq: FIRST - 10,
                oldest: Some(FIRST),
                newest: Some(LAST)
            })
        );
        let (got, e) = read(&lake, LAST - 2, u32::MAX).await;
        assert_eq!(got, [LAST - 2, LAST - 1, LAST]);
        assert_eq!(
            e.map(|e| e.to_string()),
            Some(format!(
                "the lake does not hold ledger {}: it holds {FIRST} to {LAST}",
                LAST + 1
            ))
        );
        assert_eq!(lake.stats().errors(ErrorKind::Lacks), 2);

        // A batch moved to another batch's key.
        let s = store(&place);
        let moved = s
            .get(&key(FIRST + 40).into())
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        s.put(&key(FIRST + 48).into(), moved.into()).await.unwrap();
        let (_, e) = read(&lake, FIRST + 48, LAST).await;
        match e {
            Some(LakeError::Corrupt { key: k, reason }) => {
                assert_eq!(k, key(FIRST + 48));
                assert!(reason.contains("does not belong"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_history_is_refused_by_the_chain_and_by_the_writer() {
    let ledgers = testnet();
    let place = Place::s3("chain");
    let lake = writer(&place, layout(1, 64000)).await.unwrap();
    export(&lake, &ledgers[..10]).await;
    // A cursor anchored to a hash that is not ledger 1410052's (another history's 1410052)
    // refuses 1410053, the first ledger that does not link to it.
    let lake = reader(&place).await.unwrap();
    let mut c = LakeCursor::new(
        lake.clone(),
        FIRST + 5,
        FIRST + 9,
        PrefetchOptions::default(),
    )
    .after(FIRST + 4, ledgers[3].info.hash);
    match c.next().await {
        Err(e @ LakeError::BrokenChain { .. }) => {
            assert!(
                e.to_string().contains(&format!("ledger {} ", FIRST + 5)),
                "{e}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(lake.stats().errors(ErrorKind::BrokenChain), 1);

    // The writer: a ledger at the lake's tail with another hash, or a next ledger that does
    // not link to the tail, stops the export.
    let tail = lake.newest().await.unwrap();
    assert_eq!(tail.map(|t| t.0), Some(FIRST + 9));
    let mut asm = BatchAssembler::new(lake.schema(), tail);
    let mut forged = ledgers[9].clone();
    forged.info.hash = [1; 32];
    assert!(matches!(asm.offer(forged), Err(LakeError::Conflict { .. })));
    let mut unlinked = ledgers[10].clone();
    unlinked.info.previous_hash = [2; 32];
    assert!(matches!(
        asm.offer(unlinked),
        Err(LakeError::BrokenChain { .. })
    ));
    assert_eq!(
        asm.offer(ledgers[10].clone()).unwrap(),
        ledger_relay_lake::Offer::Taken
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_network_a_wrong_layout_or_no_manifest_is_refused_at_open() {
    let ledgers = testnet();
    for place in Place::both("manifest") {
        let stats = Arc::new(LakeStats::default());
        // No manifest yet.
        let e = Lake::open(&place.url(), &place.opts(), None, stats.clone())
            .await
            .unwrap_err();
        assert_eq!(
            e,
            LakeError::NoManifest {
                key: ".config.json".into()
            }
        );
        let lake = writer(&place, layout(1, 64000)).await.unwrap();
        export(&lake, &ledgers[..3]).await;
        // A relay on pubnet must not read or extend a testnet lake.
        let e = Lake::open(
            &place.url(),
            &place.opts(),
            Some(PUBNET_PASSPHRASE),
            stats.clone(),
        )
        .await
        .unwrap_err();
        assert_eq!(
            e,
            LakeError::WrongNetwork {
                key: ".config.json".into(),
                expected: PUBNET_PASSPHRASE.into(),
                got: TESTNET_PASSPHRASE.into()
            }
        );
        let e = Lake::open_for_writing(
            &place.url(),
            &place.opts(),
            PUBNET_PASSPHRASE,
            Layout::default(),
            stats.clone(),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, LakeError::WrongNetwork { .. }));
        // A writer told another layout than the lake's.
        let e = Lake::open_for_writing(
            &place.url(),
            &place.opts(),
            TESTNET_PASSPHRASE,
            layout(8, 64000),
            stats.clone(),
        )
        .await
        .unwrap_err();
        match e {
            LakeError::Manifest { reason, .. } => {
                assert!(
                    reason.contains("ledgers per file: asked 8, the lake has 1"),
                    "{reason}"
                )
            }
            other => panic!("{other:?}"),
        }
        // A damaged manifest.
        store(&place)
            .put(
                &".config.json".into(),
                PutPayload::from_static(b"{\"ledgersPerBatch\":"),
            )
            .await
            .unwrap();
        let e = Lake::open(&place.url(), &place.opts(), None, stats.clone())
            .await
            .unwrap_err();
        assert!(matches!(e, LakeError::Manifest { .. }), "{e}");
        assert_eq!(stats.errors(ErrorKind::WrongNetwork), 2);
        assert_eq!(stats.errors(ErrorKind::Manifest), 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_and_refused_credentials_are_told_apart() {
    // Nothing listens on a port that was just released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url: LakeUrl = "s3://lake/x".parse().unwrap();
    let quick = ClientSettings {
        timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(1),
        retries: 1,
        retry_timeout: Duration::from_secs(2),
    };
    let opts = LakeOptions {
        client: quick.clone(),
        store_config: vec![
            ("aws_endpoint".into(), format!("http://127.0.0.1:{port}")),
            ("aws_allow_http".into(), "true".into()),
            ("aws_access_key_id".into(), "AKIA".into()),
            ("aws_secret_access_key".into(), "s".into()),
        ],
        ..LakeOptions::default()
    };
    let stats = Arc::new(LakeStats::default());
    let t = Instant::now();
    let e = Lake::open(&url, &opts, None, stats.clone())
        .await
        .unwrap_err();
    match &e {
        LakeError::Unreachable { key, .. } => assert_eq!(key, ".config.json"),
        other => panic!("{other:?}"),
    }
    assert!(e.is_transient());
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    assert_eq!(stats.errors(ErrorKind::Unreachable), 1);

    // A server that checks credentials knows none of ours.
    let server = S3Server::start_with_auth().unwrap();
    let opts = LakeOptions {
        client: quick,
        store_config: server.store_config(),
        ..LakeOptions::default()
    };
    let url: LakeUrl = format!("s3://{}/x", unique_bucket("auth")).parse().unwrap();
    let e = Lake::open(&url, &opts, None, stats.clone())
        .await
        .unwrap_err();
    match &e {
        LakeError::Denied { key, reason } => {
            assert_eq!(key, ".config.json");
            assert!(
                reason.contains("403") || reason.contains("InvalidAccessKeyId"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(stats.errors(ErrorKind::Denied), 1);
}
