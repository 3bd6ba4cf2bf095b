//! What the integration tests share: the testnet sample, certificates, an in-process relay and
//! subscriptions to it, raw QUIC clients, bounded waits and an HTTP GET for `/metrics` and
//! `/healthz`.

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use ledger_relay::config::{RelayConfig, RunArgs};
use ledger_relay::Relay;
use ledger_relay_certs::CertDir;
use ledger_relay_subscriber::{
    connect, Credentials, Ledger, RelayAddr, Status, SubscribeConfig, SubscribeError, Subscription,
};
use ledger_relay_transport::{client_config, endpoint, udp_socket, FrameIo, TransportSettings};
use ledger_relay_wire::compress::Codec;
use ledger_relay_wire::frame::{Frame, LaneJoin, SessionOpen, Start};
use ledger_relay_wire::record::{Records, DEFAULT_MAX_RECORD_LEN};
use ledger_relay_wire::{Limits, PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The 320 consecutive testnet ledgers (`testdata!` is defined by the test crate that includes
/// this module: `relay/` and `relay/bin/` sit at different depths).
pub const TESTNET: &str = testdata!("testnet/testnet-1410048-1410367.lcm-v0.framed.xdr");
pub const FIRST: u32 = 1_410_048;
pub const LAST: u32 = 1_410_367;

/// An endless source of small valid ledgers (from sequence 2), for tests that stream for a while.
pub const SYNTHETIC: &str = "synthetic:size=64KiB,ratio=2";

/// The testnet sample as a `file:` source.
pub fn file_source() -> String {
    format!("file:{TESTNET}")
}

pub fn testnet_ledgers() -> Vec<Bytes> {
    let file = std::fs::File::open(TESTNET).expect("testnet sample in testdata/");
    Records::new(file, DEFAULT_MAX_RECORD_LEN)
        .map(|r| Bytes::from(r.expect("valid record")))
        .collect()
}

/// A relay in `dir` on the first 100 testnet ledgers, stopped, leaves its
/// ring holding them; returns the `file:` source of ledgers 150 and on, for the caller to start
/// the relay again with (the ring then holds two runs, see [`assert_two_runs`]).
pub async fn first_of_two_runs(dir: &TestDir) -> String {
    let records = testnet_records(COUNT);
    let write = |name: &str, range: std::ops::Range<usize>| {
        let path = dir.path().join(name);
        std::fs::write(&path, records[range].concat()).unwrap();
        format!("file:{}", path.display())
    };
    let (first, second) = (write("first", 0..100), write("second", 150..COUNT));
    let relay = dir.start(&first).await;
    relay.wait_for(FIRST + 99).await;
    relay.stop().await;
    second
}

/// Waits until `relay`, started on [`first_of_two_runs`]'s source, has written the last ledger,
/// and checks that its ring holds both runs.
pub async fn assert_two_runs(relay: &Running) {
    relay.wait_for(LAST).await;
    let ring = &relay.relay.ring;
    eventually(10, "the second run written", || {
        ring.range().is_some_and(|r| r.1 == LAST)
    })
    .await;
    assert_eq!(ring.runs(), vec![(FIRST, FIRST + 99), (FIRST + 150, LAST)]);
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

/// The testnet sample through a FIFO (a `fifo:` source) that the test releases ledger by
/// ledger: the relay reads ledger `seq` only once [`GatedSource::release_to`] let it through.
/// A test of a hand-over (lake to ring, ring to live) holds the source where it wants it,
/// instead of pacing it in real time and hoping the subscriber keeps step. Dropping it ends
/// the stream (EOF) after what was released.
pub struct GatedSource {
    /// The `fifo:PATH` source to start the relay with.
    pub spec: String,
    release: std::sync::mpsc::Sender<u32>,
}

impl GatedSource {
    /// A FIFO in `dir`, nothing released yet.
    pub fn new(dir: &Path) -> GatedSource {
        let path = dir.join("source.fifo");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let spec = format!("fifo:{}", path.display());
        let (release, released) = std::sync::mpsc::channel::<u32>();
        std::thread::spawn(move || {
            let records = testnet_records(COUNT);
            // Blocks until the relay's source opens the FIFO.
            let Ok(mut fifo) = std::fs::OpenOptions::new().write(true).open(&path) else {
                return;
            };
            let mut next = FIRST;
            while let Ok(to) = released.recv() {
                while next <= to.min(LAST) {
                    let record = &records[(next - FIRST) as usize];
                    if std::io::Write::write_all(&mut fifo, record).is_err() {
                        return; // the relay stopped reading
                    }
                    next += 1;
                }
            }
        });
        GatedSource { spec, release }
    }

    /// Lets the source read every ledger up to and including `seq`.
    pub fn release_to(&self, seq: u32) {
        self.release.send(seq).expect("the FIFO writer runs");
    }
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
        // Tests of a session's read of a damaged ledger find it themselves; the scrub's own
        // tests turn it on.
        scrub_rate: Some("0".into()),
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
    tls_client_with(dir, name, &TransportSettings::default())
}

/// [`tls_client`] with other transport settings (a hostile peer's flow-control windows).
pub fn tls_client_with(
    dir: &Path,
    name: &str,
    settings: &TransportSettings,
) -> quinn::ClientConfig {
    let c = Credentials::from_cert_dir(dir, name).unwrap();
    client_config(&c.ca, &c.crls, c.cert_chain, c.key, settings).unwrap()
}

pub async fn raw_connect(relay: &Running, config: quinn::ClientConfig) -> Raw {
    raw_connect_to(relay.relay.addr, config).await
}

/// [`raw_connect`] to a relay at `addr` (one running as a process of its own).
pub async fn raw_connect_to(addr: SocketAddr, config: quinn::ClientConfig) -> Raw {
    let settings = TransportSettings::default();
    let socket = udp_socket("127.0.0.1:0".parse().unwrap(), &settings).unwrap();
    let endpoint = endpoint(socket, None, &settings).unwrap();
    let connecting = endpoint.connect_with(config, addr, "127.0.0.1").unwrap();
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

/// The number of testnet ledgers in the sample.
pub const COUNT: usize = (LAST - FIRST + 1) as usize;

/// A UDP port free a moment ago, for a relay that must come back on the same address.
pub fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn local(port: u16) -> RelayAddr {
    RelayAddr::new("127.0.0.1", port)
}

/// A subscription as `rpc-1` on four lanes from the first testnet ledger, to `relays` in turn.
pub fn from_first(dir: &TestDir, relays: Vec<RelayAddr>) -> SubscribeConfig {
    sub_config(relays, dir.certs.path(), "rpc-1", 4, Start::Seq(FIRST))
}

/// The testnet sample at 10 ms per ledger: 3.2 s for the whole file, slow enough to stop a
/// relay in the middle of it.
pub fn testnet_relay(certs: &Path, data: &Path) -> RelayConfig {
    let mut config = relay_config(certs, data, &file_source());
    config.source_options.cadence = Duration::from_millis(10);
    config
}

/// Starts a relay on 127.0.0.1:`port`, retrying while the port is still held (by the relay
/// that stopped just before, whose endpoint may take a moment to let go of it).
pub async fn start_on(mut config: RelayConfig, port: u16) -> Running {
    config.listen = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stop = CancellationToken::new();
        match Relay::start(config.clone(), stop.clone()).await {
            Ok(relay) => return Running { relay, stop },
            Err(e) if Instant::now() < deadline && addr_in_use(&e) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("starting a relay on port {port}: {e:#}"),
        }
    }
}

pub fn addr_in_use(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::AddrInUse)
    })
}

/// What a [`Collector`] ends with.
pub struct Outcome {
    /// Every ledger the subscription delivered, in delivery order.
    pub got: Vec<Ledger>,
    /// The subscription, for its status.
    pub sub: Subscription,
    /// The terminal error the stream ended with, if any.
    pub error: Option<SubscribeError>,
    /// Whatever the stream yielded after its terminal error (it must end instead).
    pub after_error: Vec<String>,
}

impl Outcome {
    /// Asserts that the subscription delivered every ledger of `want` (the testnet sample)
    /// once, in order, byte for byte, and ended without an error.
    pub fn assert_complete(&self, want: &[Bytes]) {
        assert!(self.error.is_none(), "{:?}", self.error);
        assert_eq!(self.got.len(), COUNT, "every ledger, once");
        assert_identical(&self.got, want, FIRST);
    }

    /// Asserts that exactly the testnet ledgers before `bad` were delivered, byte for byte.
    pub fn assert_stopped_before(&self, bad: u32) {
        assert_eq!(
            self.got.len(),
            (bad - FIRST) as usize,
            "nothing from {bad} on"
        );
        assert_identical(&self.got, &testnet_ledgers(), FIRST);
    }
}

/// A subscription consumed by a task into a shared Vec, until ledger `last`, a terminal error,
/// or [`Collector::halt`].
pub struct Collector {
    got: Arc<Mutex<Vec<Ledger>>>,
    /// The subscription's status, refreshed every 10 ms while the task runs.
    status: Arc<Mutex<Status>>,
    halt: Option<oneshot::Sender<()>>,
    task: JoinHandle<(Subscription, Option<SubscribeError>, Vec<String>)>,
}

impl Collector {
    pub fn start(config: SubscribeConfig, last: u32) -> Collector {
        let mut sub = connect(config).expect("a valid configuration");
        let got = Arc::new(Mutex::new(Vec::new()));
        let out = got.clone();
        let status = Arc::new(Mutex::new(Status::default()));
        let shown = status.clone();
        let (halt, mut halted) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            let error = loop {
                let item = tokio::select! {
                    item = sub.next() => item,
                    _ = tick.tick() => {
                        *shown.lock().unwrap() = sub.status();
                        continue;
                    }
                    _ = &mut halted => break None,
                };
                match item {
                    Some(Ok(ledger)) => {
                        let done = ledger.seq >= last;
                        out.lock().unwrap().push(ledger);
                        if done {
                            break None;
                        }
                    }
                    Some(Err(e)) => break Some(e),
                    None => break None,
                }
            };
            // After a terminal error the stream must end, yielding nothing more.
            let mut after = Vec::new();
            if error.is_some() {
                match tokio::time::timeout(Duration::from_secs(5), sub.next()).await {
                    Ok(None) => {}
                    Ok(Some(item)) => after.push(format!("{:?}", item.map(|l| l.seq))),
                    Err(_) => after.push("the stream did not end".into()),
                }
            }
            (sub, error, after)
        });
        Collector {
            got,
            status,
            halt: Some(halt),
            task,
        }
    }

    pub fn len(&self) -> usize {
        self.got.lock().unwrap().len()
    }

    pub fn status(&self) -> Status {
        self.status.lock().unwrap().clone()
    }

    /// Waits until `n` ledgers were delivered; panics (with the count) after `secs`, or if the
    /// subscription ended before.
    pub async fn wait_for(&self, n: usize, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while self.len() < n {
            assert!(
                !self.task.is_finished(),
                "the subscription ended after {} of {n} ledgers",
                self.len()
            );
            assert!(
                Instant::now() < deadline,
                "only {} of {n} ledgers within {secs} s",
                self.len()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits for the subscription to reach its last ledger or a terminal error.
    pub async fn finish(self, secs: u64) -> Outcome {
        let got = self.got.clone();
        let Ok(joined) = tokio::time::timeout(Duration::from_secs(secs), self.task).await else {
            panic!(
                "the subscription neither finished nor failed within {secs} s ({} ledgers)",
                got.lock().unwrap().len()
            );
        };
        let (sub, error, after_error) = joined.expect("collector task");
        let got = std::mem::take(&mut *got.lock().unwrap());
        Outcome {
            got,
            sub,
            error,
            after_error,
        }
    }

    /// Stops consuming (the subscription is stalled, not ended) and returns what it delivered.
    pub async fn halt(mut self) -> Outcome {
        if let Some(h) = self.halt.take() {
            let _ = h.send(());
        }
        self.finish(10).await
    }
}
