//! What the integration tests share: the testnet sample, certificates, an in-process relay and
//! subscriptions to it, raw QUIC clients, bounded waits and an HTTP GET for `/metrics` and
//! `/healthz`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use ledger_relay::config::{RelayConfig, RunArgs};
use ledger_relay::Relay;
use ledger_relay_certs::CertDir;
use ledger_relay_subscriber::transport::{
    client_config, endpoint, udp_socket, FrameIo, TransportSettings,
};
use ledger_relay_subscriber::{
    connect, Credentials, Ledger, RelayAddr, SubscribeConfig, SubscribeError,
};
use ledger_relay_wire::compress::Codec;
use ledger_relay_wire::frame::{Frame, LaneJoin, SessionOpen, Start};
use ledger_relay_wire::record::{Records, DEFAULT_MAX_RECORD_LEN};
use ledger_relay_wire::{Limits, PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

pub const TESTNET: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/testdata/testnet/testnet-1410048-1410367.lcm-v0.framed.xdr"
);
pub const FIRST: u32 = 1_410_048;
pub const LAST: u32 = 1_410_367;

/// An endless source of small valid ledgers (from sequence 2), for tests that stream for a while.
pub const SYNTHETIC: &str = "synthetic:size=64KiB,ratio=2";

/// The testnet sample as a `file:` source.
pub fn file_source() -> String {
    format!("file:{TESTNET}")
}

pub fn testnet_ledgers() -> Vec<Bytes> {
    let file = std::fs::File::open(TESTNET).expect("testnet sample in ../shared/testdata");
    Records::new(file, DEFAULT_MAX_RECORD_LEN)
        .map(|r| Bytes::from(r.expect("valid record")))
        .collect()
}

/// The first `n` testnet records, each with its record mark.
pub fn testnet_records(n: usize) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(TESTNET).unwrap();
    let mut off = 0;
    (0..n)
        .map(|_| {
            let mark = u32::from_be_bytes(bytes[off..off + 4].try_into().unwrap());
            let len = (mark & 0x7fff_ffff) as usize;
            let rec = bytes[off..off + 4 + len].to_vec();
            off += 4 + len;
            rec
        })
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

/// A test's temporary directory with its certificates ([`certs`], in `certs/`); the relays it
/// starts keep their data in `data/`.
pub struct TestDir {
    pub tmp: tempfile::TempDir,
    pub certs: CertDir,
}

impl TestDir {
    pub fn new() -> TestDir {
        let tmp = tempfile::tempdir().unwrap();
        let certs = certs(tmp.path());
        TestDir { tmp, certs }
    }

    pub fn path(&self) -> &Path {
        self.tmp.path()
    }

    /// The relay's data directory.
    pub fn data(&self) -> PathBuf {
        self.path().join("data")
    }

    /// [`relay_config`] with this directory's certificates and data directory.
    pub fn relay_config(&self, source: &str) -> RelayConfig {
        relay_config(self.certs.path(), &self.data(), source)
    }

    /// Starts a relay on `source`, configured as [`TestDir::relay_config`] says.
    pub async fn start(&self, source: &str) -> Running {
        Running::start(self.relay_config(source)).await
    }

    /// A subscription to `relay` alone, as client `name` of this directory's certificates.
    pub fn sub(&self, relay: &Running, name: &str, lanes: u8, start: Start) -> SubscribeConfig {
        sub_config(vec![relay.addr()], self.certs.path(), name, lanes, start)
    }
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

/// Waits until the whole testnet file is in the ring, before a session replays it from
/// `FIRST`. While the source still runs, a replaying session can ask for a ledger that has left
/// the hub's small in-memory window but that the ring writer thread has not appended yet, and
/// the relay then ends it with `BelowRetention` although the ledger is within the range it
/// announces: a pipeline race outside what these tests are about.
pub async fn in_the_ring(relay: &Running) {
    relay.wait_for(LAST).await;
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

pub fn load(m: &AtomicU64) -> u64 {
    m.load(Ordering::Relaxed)
}

pub async fn within<T>(secs: u64, what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {secs} s"))
}

/// Waits until `cond` holds (polling every 10 ms), or fails after `secs`.
pub async fn eventually(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    within(secs, what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

/// `GET path` from the relay's metrics server: the whole answer, headers and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> String {
    within(5, &format!("GET {path}"), async {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        // One write: the request must not reach the server in pieces.
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    })
    .await
}

/// A raw QUIC connection to the relay, with no subscriber logic.
pub struct Raw {
    pub _endpoint: quinn::Endpoint,
    pub conn: quinn::Connection,
}

/// The subscriber's own TLS client configuration for certificate `name` of `dir`.
pub fn tls_client(dir: &Path, name: &str) -> quinn::ClientConfig {
    let c = Credentials::from_cert_dir(dir, name).unwrap();
    client_config(&c.ca, c.cert_chain, c.key, &TransportSettings::default()).unwrap()
}

pub async fn raw_connect(relay: &Running, config: quinn::ClientConfig) -> Raw {
    let settings = TransportSettings::default();
    let socket = udp_socket("127.0.0.1:0".parse().unwrap(), &settings).unwrap();
    let endpoint = endpoint(socket, None).unwrap();
    let connecting = endpoint
        .connect_with(config, relay.relay.addr, "127.0.0.1")
        .unwrap();
    let conn = within(5, "handshake", connecting)
        .await
        .expect("handshake completes");
    Raw {
        _endpoint: endpoint,
        conn,
    }
}

pub async fn control(conn: &quinn::Connection) -> FrameIo {
    let (send, recv) = within(5, "open_bi", conn.open_bi()).await.unwrap();
    FrameIo::new(send, recv, Limits::default())
}

pub fn session_open(start: Start, lanes: u8) -> Frame {
    Frame::SessionOpen(SessionOpen {
        version: PROTOCOL_VERSION,
        start,
        lanes,
        codecs: Codec::ALL.iter().fold(0, |m, c| m | c.bit()),
        window: 8,
    })
}

pub fn lane_join(session_id: u64, token: [u8; 16], lane: u8) -> Frame {
    Frame::LaneJoin(LaneJoin {
        version: PROTOCOL_VERSION,
        session_id,
        token,
        lane,
    })
}
