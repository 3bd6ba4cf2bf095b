//! The relay and the subscriber library against each other over real QUIC on loopback, with
//! certificates from the certs crate and real testnet ledgers.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use ledger_relay::config::{RelayConfig, RunArgs};
use ledger_relay::Relay;
use ledger_relay_certs::CertDir;
use ledger_relay_subscriber::{
    connect, Credentials, Ledger, RelayAddr, SubscribeConfig, SubscribeError,
};
use ledger_relay_wire::frame::Start;
use ledger_relay_wire::record::{Records, DEFAULT_MAX_RECORD_LEN};
use tokio_util::sync::CancellationToken;

pub const TESTNET: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/testdata/testnet/testnet-1410048-1410367.lcm-v0.framed.xdr"
);
pub const FIRST: u32 = 1_410_048;
pub const LAST: u32 = 1_410_367;

pub fn testnet_ledgers() -> Vec<Bytes> {
    let file = std::fs::File::open(TESTNET).expect("testnet sample in ../shared/testdata");
    Records::new(file, DEFAULT_MAX_RECORD_LEN)
        .map(|r| Bytes::from(r.expect("valid record")))
        .collect()
}

/// A CA with a relay certificate for 127.0.0.1 and a client certificate `rpc-1`.
pub fn certs(dir: &Path) -> CertDir {
    // The CA outlives the 30-day leaves by far: a leaf issued a second after a 30-day CA would
    // outlive it and be refused.
    let certs = CertDir::init(&dir.join("certs"), 365).unwrap();
    certs
        .issue_server("relay", &["localhost".into(), "127.0.0.1".into()], 30)
        .unwrap();
    certs.issue_client("rpc-1", 30).unwrap();
    certs
}

/// Logs to the test's captured output (RUST_LOG, default warn), once per process.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

pub fn relay_config(certs: &Path, data: &Path, source: &str) -> RelayConfig {
    init_tracing();
    RelayConfig::from_args(RunArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        certs: Some(certs.to_path_buf()),
        data_dir: Some(data.to_path_buf()),
        source: Some(source.into()),
        cadence: Some("2ms".into()),
        emit: Some("500us".into()),
        heartbeat: Some("50ms".into()),
        ..RunArgs::default()
    })
    .unwrap()
}

pub struct Running {
    pub relay: Relay,
    pub stop: CancellationToken,
}

impl Running {
    pub async fn start(config: RelayConfig) -> Running {
        let stop = CancellationToken::new();
        let relay = Relay::start(config, stop.clone()).await.unwrap();
        Running { relay, stop }
    }

    pub fn addr(&self) -> RelayAddr {
        RelayAddr::new("127.0.0.1", self.relay.addr.port())
    }

    pub async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(15), self.relay.wait())
            .await
            .expect("relay stops within 15 s");
    }

    /// Waits until the source has published `seq`.
    pub async fn wait_for(&self, seq: u32) {
        let m = &self.relay.metrics;
        tokio::time::timeout(Duration::from_secs(30), async {
            while m.source_newest.load(Ordering::Relaxed) < u64::from(seq)
                || m.ring_newest.load(Ordering::Relaxed) < u64::from(seq)
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("source reaches the ledger in time");
    }
}

pub fn sub_config(
    relays: Vec<RelayAddr>,
    certs: &Path,
    name: &str,
    lanes: u8,
    start: Start,
) -> SubscribeConfig {
    let mut c = SubscribeConfig::new(relays, Credentials::from_cert_dir(certs, name).unwrap());
    c.lanes = lanes;
    c.start = start;
    c
}

/// Takes `n` ledgers (or fails after `secs`).
pub async fn take(
    config: SubscribeConfig,
    n: usize,
    secs: u64,
) -> Result<Vec<Ledger>, SubscribeError> {
    let mut sub = connect(config)?;
    let mut out = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(secs), async {
        while out.len() < n {
            match sub.next().await {
                Some(Ok(l)) => out.push(l),
                Some(Err(e)) => return Err(e),
                None => panic!("subscription ended after {} ledgers", out.len()),
            }
        }
        Ok(())
    })
    .await;
    sub.close().await;
    match r {
        Ok(Ok(())) => Ok(out),
        Ok(Err(e)) => Err(e),
        Err(_) => panic!("only {} of {n} ledgers within {secs} s", out.len()),
    }
}

pub fn assert_identical(got: &[Ledger], want: &[Bytes], first: u32) {
    for (i, l) in got.iter().enumerate() {
        assert_eq!(l.seq, first + i as u32, "order");
        assert!(
            l.data == want[(l.seq - FIRST) as usize],
            "ledger {} differs from the source",
            l.seq
        );
    }
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn file_source() -> String {
    format!("file:{TESTNET}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testnet_through_one_and_four_lanes_byte_identical() {
    let dir = tmp();
    let certs = certs(dir.path());
    let want = testnet_ledgers();
    let mut config = relay_config(certs.path(), &dir.path().join("data"), &file_source());
    // Slow enough that the subscribers join while the source still runs: part replay, part live.
    config.source_options.cadence = Duration::from_millis(5);
    let relay = Running::start(config).await;
    let one = sub_config(
        vec![relay.addr()],
        certs.path(),
        "rpc-1",
        1,
        Start::Seq(FIRST),
    );
    let four = sub_config(
        vec![relay.addr()],
        certs.path(),
        "rpc-1",
        4,
        Start::Seq(FIRST),
    );
    let (a, b) = tokio::join!(take(one, 320, 60), take(four, 320, 60));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_identical(&a, &want, FIRST);
    assert_identical(&b, &want, FIRST);
    let m = &relay.relay.metrics;
    assert_eq!(m.ledgers_in_total.load(Ordering::Relaxed), 320);
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_inside_the_ring_crosses_into_live() {
    let dir = tmp();
    let certs = certs(dir.path());
    let want = testnet_ledgers();
    let mut config = relay_config(certs.path(), &dir.path().join("data"), &file_source());
    config.source_options.cadence = Duration::from_millis(15);
    let relay = Running::start(config).await;
    relay.wait_for(FIRST + 100).await;
    let start = FIRST + 50;
    let got = take(
        sub_config(
            vec![relay.addr()],
            certs.path(),
            "rpc-1",
            2,
            Start::Seq(start),
        ),
        (LAST - start + 1) as usize,
        60,
    )
    .await
    .unwrap();
    assert_identical(&got, &want, start);
    assert!(
        relay.relay.metrics.ring_reads_total.load(Ordering::Relaxed) + 4 >= 46,
        "the start came from the ring"
    );
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_below_the_ring_is_a_typed_error() {
    let dir = tmp();
    let certs = certs(dir.path());
    let mut config = relay_config(certs.path(), &dir.path().join("data"), &file_source());
    config.retention = 20;
    let relay = Running::start(config).await;
    relay.wait_for(LAST).await;
    let err = take(
        sub_config(
            vec![relay.addr()],
            certs.path(),
            "rpc-1",
            1,
            Start::Seq(FIRST),
        ),
        1,
        20,
    )
    .await
    .unwrap_err();
    match err {
        SubscribeError::BelowRetention {
            oldest,
            newest,
            requested,
            ..
        } => {
            assert_eq!(requested, FIRST);
            assert_eq!(oldest, LAST - 19);
            assert_eq!(newest, LAST);
        }
        other => panic!("expected below-retention, got {other:?}"),
    }
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_relay_serves_what_it_held() {
    let dir = tmp();
    let certs = certs(dir.path());
    let want = testnet_ledgers();
    let data = dir.path().join("data");
    let relay = Running::start(relay_config(certs.path(), &data, &file_source())).await;
    relay.wait_for(LAST).await;
    relay.stop().await;
    // Same data directory; the source replays the same ledgers, which are all duplicates now.
    let relay = Running::start(relay_config(certs.path(), &data, &file_source())).await;
    assert_eq!(relay.relay.ring.range(), Some((FIRST, LAST)));
    let got = take(
        sub_config(
            vec![relay.addr()],
            certs.path(),
            "rpc-1",
            4,
            Start::Seq(FIRST),
        ),
        320,
        60,
    )
    .await
    .unwrap();
    assert_identical(&got, &want, FIRST);
    // Give the replayed source time to finish: every ledger is dropped as a duplicate.
    tokio::time::timeout(Duration::from_secs(20), async {
        while relay
            .relay
            .metrics
            .duplicates_dropped_total
            .load(Ordering::Relaxed)
            < 320
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the replay is recognised as duplicates");
    assert_eq!(
        relay
            .relay
            .metrics
            .ring_resets_total
            .load(Ordering::Relaxed),
        0
    );
    assert_eq!(relay.relay.ring.range(), Some((FIRST, LAST)));
    relay.stop().await;
}

/// Writes the first `n` testnet records, each to its own file, for shell scripts to cat.
fn record_files(dir: &Path, n: usize) -> Vec<PathBuf> {
    let bytes = std::fs::read(TESTNET).unwrap();
    let mut off = 0;
    (0..n)
        .map(|i| {
            let len = (u32::from_be_bytes(bytes[off..off + 4].try_into().unwrap()) & 0x7fff_ffff)
                as usize;
            let path = dir.join(format!("rec{i}"));
            std::fs::write(&path, &bytes[off..off + 4 + len]).unwrap();
            off += 4 + len;
            path
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_dying_mid_ledger_forwards_nothing_partial_and_is_restarted() {
    let dir = tmp();
    let certs = certs(dir.path());
    let want = testnet_ledgers();
    let recs = record_files(dir.path(), 3);
    let marker = dir.path().join("died-once");
    let half = std::fs::metadata(&recs[1]).unwrap().len() / 2;
    // First run: ledger 1, half of ledger 2, then death. Second run: all three, then wait.
    let script = format!(
        "if [ -e {m} ]; then cat {a} {b} {c} >&3; sleep 30; \
         else cat {a} >&3; sleep 0.3; head -c {half} {b} >&3; touch {m}; sleep 0.3; exit 1; fi",
        m = marker.display(),
        a = recs[0].display(),
        b = recs[1].display(),
        c = recs[2].display(),
    );
    let config = relay_config(
        certs.path(),
        &dir.path().join("data"),
        &format!("pipe:{script}"),
    );
    let relay = Running::start(config).await;
    let got = take(
        sub_config(
            vec![relay.addr()],
            certs.path(),
            "rpc-1",
            2,
            Start::Seq(FIRST),
        ),
        3,
        30,
    )
    .await
    .unwrap();
    assert_identical(&got, &want, FIRST);
    let m = &relay.relay.metrics;
    assert!(
        m.source_aborts_total.load(Ordering::Relaxed) >= 1,
        "the cut ledger was discarded"
    );
    assert!(
        m.source_restarts_total.load(Ordering::Relaxed) >= 1,
        "the child was restarted"
    );
    assert!(
        m.duplicates_dropped_total.load(Ordering::Relaxed) >= 1,
        "ledger 1 re-emitted and dropped"
    );
    relay.stop().await;
}
