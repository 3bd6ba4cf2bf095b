//! The relay and SEP-54 data lakes, on a local directory and on a real S3-protocol server on
//! loopback (`moto_server`, started here): `--export` writes every ledger byte for byte and
//! resumes after SIGKILL with no gap and no object written twice; a failing lake degrades the
//! export but never live streaming, and the export catches up from the ring once the lake is
//! back; `datalake:` replays a lake and stops on a damaged one or another network's; the
//! backfill API serves the lake in the relay's chunked form and joins the ring without a gap.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::TryStreamExt;
use ledger_relay::hub::CompleteLedger;
use ledger_relay::lake::backfill::BackfillConfig;
use ledger_relay::lake::export::ExportConfig;
use ledger_relay_lake::testing::{unique_bucket, S3Server};
use ledger_relay_lake::{
    BatchAssembler, BatchLedger, ClientSettings, ErrorKind, Lake, LakeError, LakeOptions,
    LakeStats, LakeUrl, Layout, Offer, TESTNET_PASSPHRASE,
};
use ledger_relay_wire::compress::decompress;
use ledger_relay_wire::frame::Start;
use ledger_relay_wire::header::peek_header;
use ledger_relay_wire::Limits;
use object_store::{ObjectStoreExt, PutPayload};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{
    assert_identical, eventually, file_source, http_get, load, take, testnet_ledgers, Running,
    TestDir, FIRST, LAST,
};

/// Where a test's lake lives, with the settings that reach it.
pub(crate) struct Place {
    _dir: Option<tempfile::TempDir>,
    pub(crate) server: Option<Arc<S3Server>>,
    pub(crate) url: LakeUrl,
}

impl Place {
    pub(crate) fn file() -> Place {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}/lake", dir.path().display())
            .parse()
            .unwrap();
        Place {
            _dir: Some(dir),
            server: None,
            url,
        }
    }

    pub(crate) fn s3(tag: &str) -> Place {
        let server = S3Server::shared().expect("a loopback S3 server (moto_server)");
        let bucket = unique_bucket(tag);
        server.create_bucket(&bucket).unwrap();
        Place {
            _dir: None,
            url: format!("s3://{bucket}/testnet").parse().unwrap(),
            server: Some(server),
        }
    }

    pub(crate) fn both(tag: &str) -> Vec<Place> {
        vec![Place::file(), Place::s3(tag)]
    }

    pub(crate) fn options(&self) -> LakeOptions {
        LakeOptions {
            store_config: self
                .server
                .as_ref()
                .map_or(Vec::new(), |s| s.store_config()),
            ..LakeOptions::default()
        }
    }

    pub(crate) async fn reader(&self) -> Arc<Lake> {
        Arc::new(
            Lake::open(
                &self.url,
                &self.options(),
                Some(TESTNET_PASSPHRASE),
                Arc::new(LakeStats::default()),
            )
            .await
            .unwrap(),
        )
    }

    /// Writes `ledgers` into the lake with the lake crate, as an exporter would.
    pub(crate) async fn fill(&self, ledgers: &[Bytes], per_batch: u32) {
        let lake = Lake::open_for_writing(
            &self.url,
            &self.options(),
            TESTNET_PASSPHRASE,
            Layout {
                ledgers_per_batch: Some(per_batch),
                batches_per_partition: None,
            },
            Arc::new(LakeStats::default()),
        )
        .await
        .unwrap();
        let mut asm = BatchAssembler::new(lake.schema(), lake.newest().await.unwrap());
        for raw in ledgers {
            let info = peek_header(raw).unwrap().unwrap();
            let l = BatchLedger {
                info,
                raw: raw.clone(),
            };
            assert_eq!(asm.offer(l).unwrap(), Offer::Taken);
            if let Some(batch) = asm.take_ready() {
                lake.put_batch(&batch, 3).await.unwrap();
            }
        }
    }

    /// Every ledger of every object in the lake, by sequence, counting how many objects hold
    /// each: the proof of "no gap, no duplicate".
    async fn census(&self) -> BTreeMap<u32, (usize, Bytes)> {
        let lake = self.reader().await;
        let store = self
            .url
            .open(&ClientSettings::default(), &self.options().store_config)
            .unwrap();
        let metas: Vec<object_store::ObjectMeta> = store.list(None).try_collect().await.unwrap();
        let mut out: BTreeMap<u32, (usize, Bytes)> = BTreeMap::new();
        for m in metas {
            let Some(name) = m
                .location
                .filename()
                .and_then(ledger_relay_wire::lake::parse_batch_name)
            else {
                continue;
            };
            let batch = lake.read_batch(name.first.max(FIRST)).await.unwrap();
            for l in batch.ledgers {
                let e = out.entry(l.info.ledger_seq).or_insert((0, l.raw.clone()));
                e.0 += 1;
            }
        }
        out
    }
}

/// `ledger` (a testnet ledger, a `LedgerCloseMeta` v0) with a byte of its transaction set
/// changed (the last byte of the set's `previousLedgerHash`, which the set's hash covers): still
/// well-formed, its header (so its hash and its place in the chain) untouched; only the check of
/// the transaction set against the header's `txSetHash` tells.
pub(crate) fn with_a_changed_transaction_set(ledger: &Bytes) -> Bytes {
    let info = ledger_relay_wire::header::peek_header(ledger)
        .unwrap()
        .unwrap();
    assert_eq!(info.lcm_version, 0, "the testnet sample is v0");
    // After the header: the entry's `ext` (4 bytes), then `TransactionSet {
    // previousLedgerHash; txs<> }`.
    let at = info.header_end + 4 + 31;
    let mut v = ledger.to_vec();
    v[at] ^= 0x01;
    Bytes::from(v)
}

pub(crate) fn export_to(place: &Place) -> ExportConfig {
    let mut e = ExportConfig::new(place.url.clone(), TESTNET_PASSPHRASE.into());
    e.options = place.options();
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_writes_every_ledger_byte_identical() {
    let want = testnet_ledgers();
    for place in Place::both("export") {
        let dir = TestDir::new();
        let mut config = dir.relay_config(&file_source());
        config.export = Some(export_to(&place));
        let relay = Running::start(config).await;
        let m = relay.relay.metrics.clone();
        eventually(60, "the lake holds the last ledger", || {
            load(&m.lake.export_newest) == u64::from(LAST)
        })
        .await;
        assert_eq!(m.lake.export_health(), "ok");
        assert_eq!(load(&m.lake.export.objects_written), 320);
        relay.stop().await;
        let census = place.census().await;
        assert_eq!(census.len(), 320, "on {}", place.url);
        for (seq, (copies, raw)) in &census {
            assert_eq!(*copies, 1, "{seq} in one object");
            assert!(*raw == want[(seq - FIRST) as usize], "{seq} byte-identical");
        }
        let lake = place.reader().await;
        assert_eq!(lake.manifest().ledgers_per_batch, 1);
        assert_eq!(lake.manifest().batches_per_partition, 64000);
        assert_eq!(lake.manifest().network_passphrase, TESTNET_PASSPHRASE);
    }
}

/// `ledger-relay run` as a process, with the loopback S3 server in its environment.
pub(crate) struct RelayProcess {
    child: tokio::process::Child,
    log: Arc<Mutex<Vec<String>>>,
    metrics: std::net::SocketAddr,
}

impl RelayProcess {
    pub(crate) async fn start(dir: &TestDir, server: &S3Server, args: &[&str]) -> RelayProcess {
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ledger-relay"))
            .arg("run")
            .args(["--listen", "127.0.0.1:0"])
            .arg("--certs")
            .arg(dir.certs.path())
            .arg("--data-dir")
            .arg(dir.data())
            .args(["--metrics", &metrics.to_string(), "--emit", "500us"])
            .args(args)
            .envs(server.env())
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("ledger-relay binary");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                sink.lock().unwrap().push(line);
            }
        });
        RelayProcess {
            child,
            log,
            metrics,
        }
    }

    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The UDP address the relay listens on, from its log.
    pub(crate) async fn udp_addr(&self) -> std::net::SocketAddr {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let found = self.log.lock().unwrap().iter().find_map(|l| {
                let at = l.find("relay listening")?;
                let rest = &l[at..];
                let addr = &rest[rest.find("addr=")? + 5..];
                addr.split_whitespace().next()?.parse().ok()
            });
            if let Some(a) = found {
                return a;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no listening line:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A gauge or counter from `/metrics` (0 until the relay answers).
    pub(crate) async fn metric(&self, name: &str) -> u64 {
        let Ok(Ok(mut s)) = tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::TcpStream::connect(self.metrics),
        )
        .await
        else {
            return 0;
        };
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        if s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .is_err()
        {
            return 0;
        }
        let mut text = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_string(&mut text)).await;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    pub(crate) async fn wait_metric(&self, name: &str, at_least: u64, secs: u64) -> u64 {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.metric(name).await;
            if v >= at_least {
                return v;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "{name} stayed at {v} < {at_least} for {secs} s:\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn kill_9(mut self) {
        self.child.start_kill().unwrap();
        let _ = self.child.wait().await;
    }

    pub(crate) async fn sigterm(mut self) {
        let status = crate::process::sigterm_and_wait(&mut self.child).await;
        assert!(status.success(), "{status:?}:\n{}", self.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "process tier (real relays killed, failed over or flooded): .ci/run runs it"]
async fn export_resumes_after_sigkill_with_no_gap_and_no_duplicate() {
    let want = testnet_ledgers();
    let place = Place::s3("sigkill");
    let server = place.server.clone().unwrap();
    let dir = TestDir::new();
    let url = place.url.to_string();
    let source = file_source();
    // Four ledgers per object, so that a kill can fall inside a batch.
    let args = [
        "--source",
        &source,
        "--cadence",
        "15ms",
        "--network",
        "testnet",
        "--export",
        &url,
        "--export-ledgers-per-file",
        "4",
    ];
    let a = RelayProcess::start(&dir, &server, &args).await;
    let at = a
        .wait_metric("ledger_relay_lake_export_newest", FIRST as u64 + 100, 60)
        .await;
    a.kill_9().await;
    assert!(at < u64::from(LAST), "killed mid-stream at {at}");
    // The same data directory and source: the file replays from its start, the ring drops
    // what it holds, and the export resumes after the lake's newest ledger.
    let b = RelayProcess::start(&dir, &server, &args).await;
    b.wait_metric("ledger_relay_lake_export_newest", u64::from(LAST), 60)
        .await;
    assert!(
        b.log()
            .contains("lake export resumes after the lake's newest ledger"),
        "{}",
        b.log()
    );
    b.sigterm().await;
    let census = place.census().await;
    assert_eq!(
        census.keys().copied().collect::<Vec<_>>(),
        (FIRST..=LAST).collect::<Vec<_>>(),
        "no gap"
    );
    for (seq, (copies, raw)) in &census {
        assert_eq!(*copies, 1, "{seq} is in exactly one object");
        assert!(*raw == want[(seq - FIRST) as usize]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_lake_never_stops_live_streaming_and_catches_up_from_the_ring() {
    let want = testnet_ledgers();
    // A port where no store listens yet.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let bucket = unique_bucket("down");
    let url: LakeUrl = format!("s3://{bucket}/testnet").parse().unwrap();
    let dir = TestDir::new();
    let mut config = dir.relay_config(&file_source());
    config.metrics = Some("127.0.0.1:0".parse().unwrap());
    let mut export = ExportConfig::new(url.clone(), TESTNET_PASSPHRASE.into());
    export.backoff = (Duration::from_millis(50), Duration::from_millis(300));
    export.options.client = ClientSettings {
        timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_millis(500),
        retries: 0,
        retry_timeout: Duration::from_secs(1),
    };
    export.options.store_config = vec![
        ("aws_endpoint".into(), format!("http://127.0.0.1:{port}")),
        ("aws_allow_http".into(), "true".into()),
        (
            "aws_access_key_id".into(),
            ledger_relay_lake::testing::ACCESS_KEY.into(),
        ),
        (
            "aws_secret_access_key".into(),
            ledger_relay_lake::testing::SECRET_KEY.into(),
        ),
    ];
    config.export = Some(export);
    let relay = Running::start(config).await;
    let m = relay.relay.metrics.clone();
    // Live streaming is untouched: every ledger, in order, byte for byte.
    let sub = dir.sub(&relay, "rpc-1", 4, Start::Seq(FIRST));
    let got = take(sub, want.len(), 60).await.unwrap();
    assert_identical(&got, &want, FIRST);
    eventually(30, "the export is degraded", || {
        m.lake.export_health() == "degraded"
    })
    .await;
    let addr = relay.relay.metrics_addr.unwrap();
    let health = http_get(addr, "/healthz").await;
    assert!(health.contains("\"lake_export\":\"degraded\""), "{health}");
    assert!(health.contains("lake export failing: "), "{health}");
    // The file source has ended, which alone makes the answer 503; the lake's reason is
    // listed beside it and does not stop delivery.
    assert!(
        health.contains("\"lake_export\"]") || health.contains("\"lake_export\","),
        "{health}"
    );
    let metrics = http_get(addr, "/metrics").await;
    assert!(
        metrics.contains("ledger_relay_lake_export_degraded 1"),
        "{metrics}"
    );
    assert!(m.lake.export.errors(ErrorKind::Unreachable) > 0);
    assert!(load(&m.lake.export_retries_total) > 0);

    // The store comes back, without its bucket at first (as a store restarted empty does):
    // the export meets it so, and goes on trying. Then the bucket is there, and the export
    // catches up from the ring, alone.
    let store_errors = m.lake.export.errors(ErrorKind::Store);
    let server = S3Server::start_on(port).unwrap();
    eventually(30, "the export meets the store without its bucket", || {
        m.lake.export.errors(ErrorKind::Store) > store_errors
    })
    .await;
    assert_eq!(m.lake.export_health(), "degraded");
    server.create_bucket(&bucket).unwrap();
    eventually(60, "the lake holds the last ledger", || {
        load(&m.lake.export_newest) == u64::from(LAST)
    })
    .await;
    assert_eq!(m.lake.export_health(), "ok");
    assert!(
        load(&m.lake.export_ring_reads_total) > 0,
        "read back from the ring"
    );
    assert_eq!(load(&m.lake.export_gaps_total), 0);
    let health = http_get(addr, "/healthz").await;
    assert!(health.contains("\"lake_export\":\"ok\""), "{health}");
    relay.stop().await;
    let place = Place {
        _dir: None,
        url,
        server: Some(Arc::new(server)),
    };
    let census = place.census().await;
    assert_eq!(census.len(), 320);
    assert!(census.values().all(|(copies, _)| *copies == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datalake_source_replays_a_lake_at_the_cadence() {
    let want = testnet_ledgers();
    for place in Place::both("source") {
        place.fill(&want, 8).await;
        let dir = TestDir::new();
        let source = format!(
            "datalake:{},from={},to={}",
            place.url,
            FIRST + 20,
            FIRST + 219
        );
        let mut config = dir.relay_config(&source);
        config.source_options.lake = place.options();
        config.source_options.network_passphrase = Some(TESTNET_PASSPHRASE.into());
        let relay = Running::start(config).await;
        let sub = dir.sub(&relay, "rpc-1", 2, Start::Seq(FIRST + 20));
        let got = take(sub, 200, 60).await.unwrap();
        assert_identical(&got, &want, FIRST + 20);
        let m = relay.relay.metrics.clone();
        assert!(
            load(&m.lake.source.objects_read) >= 25,
            "read from the lake"
        );
        assert_eq!(load(&m.source_errors_total), 0);
        relay.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datalake_source_stops_at_damage_or_another_network() {
    let want = testnet_ledgers();
    let place = Place::s3("source-bad");
    place.fill(&want[..40], 1).await;
    // Ledger FIRST + 30's object is damaged.
    let lake = place.reader().await;
    let key = lake.key(FIRST + 30);
    let store = place
        .url
        .open(&ClientSettings::default(), &place.options().store_config)
        .unwrap();
    store
        .put(
            &key.as_str().into(),
            PutPayload::from_static(b"\x28\xb5\x2f\xfd garbage"),
        )
        .await
        .unwrap();
    let dir = TestDir::new();
    let mut config = dir.relay_config(&format!("datalake:{}", place.url));
    config.source_options.lake = place.options();
    let relay = Running::start(config).await;
    let m = relay.relay.metrics.clone();
    let sub = dir.sub(&relay, "rpc-1", 2, Start::Seq(FIRST));
    let got = take(sub, 30, 60).await.unwrap();
    assert_identical(&got, &want, FIRST);
    eventually(30, "the source fails", || load(&m.source_errors_total) == 1).await;
    assert_eq!(m.lake.source.errors(ErrorKind::Corrupt), 1);
    assert_eq!(
        load(&m.source_newest),
        u64::from(FIRST + 29),
        "nothing of the damaged object"
    );
    relay.stop().await;

    // A relay on pubnet refuses a testnet lake.
    let dir = TestDir::new();
    let mut config = dir.relay_config(&format!("datalake:{}", place.url));
    config.source_options.lake = place.options();
    config.source_options.network_passphrase = Some(ledger_relay_lake::PUBNET_PASSPHRASE.into());
    let relay = Running::start(config).await;
    let m = relay.relay.metrics.clone();
    eventually(30, "the source fails", || load(&m.source_errors_total) == 1).await;
    assert_eq!(m.lake.source.errors(ErrorKind::WrongNetwork), 1);
    assert_eq!(load(&m.ledgers_in_total), 0);
    relay.stop().await;
}

/// A lake whose copy of a ledger has a changed transaction set (its header, hash and chain
/// intact): a `datalake:` source replays up to the ledger before it and stops there with the
/// content error; nothing of that ledger reaches the ring or a subscriber.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datalake_source_stops_at_a_changed_transaction_set() {
    let want = testnet_ledgers();
    let bad = FIRST + 30;
    let mut lake = want[..40].to_vec();
    lake[30] = with_a_changed_transaction_set(&lake[30]);
    let place = Place::file();
    place.fill(&lake, 1).await;
    let dir = TestDir::new();
    let mut config = dir.relay_config(&format!("datalake:{}", place.url));
    config.source_options.lake = place.options();
    let relay = Running::start(config).await;
    let m = relay.relay.metrics.clone();
    let sub = dir.sub(&relay, "rpc-1", 2, Start::Seq(FIRST));
    let got = take(sub, 30, 60).await.unwrap();
    assert_identical(&got, &want, FIRST);
    eventually(30, "the source fails", || load(&m.source_errors_total) == 1).await;
    assert_eq!(m.lake.source.errors(ErrorKind::Content), 1);
    assert_eq!(
        load(&m.source_newest),
        u64::from(bad - 1),
        "nothing of the changed ledger"
    );
    let ring = relay.relay.ring.clone();
    eventually(10, "the ring holds the ledgers before it", || {
        ring.range() == Some((FIRST, bad - 1))
    })
    .await;
    relay.stop().await;
}

/// The raw bytes of a chunked ledger.
fn raw_of(l: &CompleteLedger) -> Bytes {
    let mut out = BytesMut::new();
    for c in &l.chunks {
        let h = &c.header;
        out.extend_from_slice(
            &decompress(h.codec, &c.payload, h.raw_len, &Limits::default()).unwrap(),
        );
    }
    out.freeze()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_serves_the_lake_in_chunked_form_and_joins_the_ring() {
    let want = testnet_ledgers();
    let place = Place::s3("backfill");
    // The lake holds the first 200 ledgers; the ring, after the relay has read them all,
    // only the newest 170: the two overlap on 1410198-1410247.
    place.fill(&want[..200], 1).await;
    let dir = TestDir::new();
    let mut config = dir.relay_config(&file_source());
    config.retention = 170;
    let mut b = BackfillConfig::new(place.url.clone(), Some(TESTNET_PASSPHRASE.into()));
    b.options = place.options();
    config.backfill = Some(b);
    let relay = Running::start(config).await;
    relay.wait_for(LAST).await;
    let ring = relay.relay.ring.clone();
    let (ring_oldest, ring_newest) = ring.range().unwrap();
    assert_eq!((ring_oldest, ring_newest), (LAST - 169, LAST));
    let backfill = relay.relay.backfill.clone().unwrap();

    // A start below the ring: the lake has it; below the lake too: "too far behind", with
    // the oldest ledger the lake holds.
    backfill.check(FIRST).await.unwrap();
    match backfill.check(FIRST - 1).await {
        Err(LakeError::Lacks {
            seq,
            oldest,
            newest,
        }) => {
            assert_eq!(
                (seq, oldest, newest),
                (FIRST - 1, Some(FIRST), Some(FIRST + 199))
            )
        }
        other => panic!("{other:?}"),
    }

    // What a session does: the lake up to the ledger before the ring, then the ring.
    let mut served: Vec<(u32, Bytes)> = Vec::new();
    let mut cursor = backfill.cursor(FIRST, ring_oldest - 1).await.unwrap();
    let mut prev: Option<[u8; 32]> = None;
    while let Some(l) = cursor.fetch(cursor.position()).await.unwrap() {
        let raw = raw_of(&l);
        assert_eq!(l.end.raw_len, raw.len() as u64);
        assert_eq!(
            l.end.checksum,
            ledger_relay_wire::checksum(&raw),
            "a valid end record"
        );
        if let Some(p) = prev {
            assert_eq!(l.end.previous_hash, p);
        }
        prev = Some(l.end.header_hash);
        served.push((l.end.seq, raw));
    }
    // Going on after a cursor that reached its stop (the ring pruned meanwhile) keeps the
    // chain: the next cursor must link to the last ledger given, and refuses another hash.
    let last = cursor.last().unwrap();
    assert_eq!(last.0, ring_oldest - 1);
    let mut more = backfill
        .cursor_after(FIRST + 100, FIRST + 101, (FIRST + 99, [3; 32]))
        .await
        .unwrap();
    assert!(matches!(
        more.fetch(FIRST + 100).await,
        Err(LakeError::BrokenChain { .. })
    ));
    let prev = (FIRST + 99, served[99].1.clone());
    let prev_hash = peek_header(&prev.1).unwrap().unwrap().hash;
    let mut more = backfill
        .cursor_after(FIRST + 100, FIRST + 101, (prev.0, prev_hash))
        .await
        .unwrap();
    assert_eq!(
        more.fetch(FIRST + 100).await.unwrap().unwrap().end.seq,
        FIRST + 100
    );
    let (first_ring_end, _) = ring.get(ring_oldest).unwrap().unwrap();
    cursor.verify_join(&first_ring_end).unwrap();
    // A ring that does not continue the lake is refused.
    let mut wrong = first_ring_end;
    wrong.previous_hash = [9; 32];
    assert!(matches!(
        cursor.verify_join(&wrong),
        Err(LakeError::BrokenChain { .. })
    ));
    for seq in ring_oldest..=ring_newest {
        let (end, chunks) = ring.get(seq).unwrap().unwrap();
        let mut raw = BytesMut::new();
        for c in chunks {
            raw.extend_from_slice(
                &decompress(c.codec, &c.payload, c.raw_len, &Limits::default()).unwrap(),
            );
        }
        served.push((end.seq, raw.freeze()));
    }
    assert_eq!(
        served.iter().map(|s| s.0).collect::<Vec<_>>(),
        (FIRST..=LAST).collect::<Vec<_>>(),
        "no gap, no duplicate"
    );
    for (seq, raw) in &served {
        assert!(*raw == want[(seq - FIRST) as usize], "{seq} byte-identical");
    }
    let stats = &relay.relay.metrics.lake.backfill;
    assert!(load(&stats.objects_read) >= 150);
    assert_eq!(stats.errors(ErrorKind::Lacks), 1);
    relay.stop().await;
}
