//! A flood of QUIC handshakes that never show a client certificate does not keep a subscriber
//! that has one out. From 127.0.0.2 to 127.0.0.6, clients with no certificate start
//! handshakes, answer the relay's Retry (so their addresses are validated, as a real client's
//! are), then drop every packet of the relay while they retransmit their Initials, and open
//! new handshakes every 0.5 s, or as fast as they can. Against the real binary with
//! `--max-connections 32 --max-connections-per-address 8 --retry-threshold 4`, a subscriber
//! started while the flood runs gets its first ledger on its first try within 3 s, every round.
//!
//! The flooding clients are quinn's own protocol state machine (quinn-proto), driven by hand
//! over UDP sockets bound to those addresses, each on a thread of its own so that the flood
//! does not share the test's runtime with the subscriber.
//!
//! `connect_times` measures what the pending pool costs a subscriber (recorded in
//! `bench/RESULTS.md`, "Handshake pool"):
//! `cargo test -p ledger-relay-bin --test tests handshakes::connect_times -- --ignored --nocapture`
//! (with `LEDGER_RELAY_TEST_FLOOD_AT_NORMAL_PRIORITY=1`, the flood competes with the relay for
//! this machine's cores).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures::StreamExt;
use ledger_relay_subscriber::connect;
use ledger_relay_wire::frame::Start;
use quinn_proto::{ConnectionHandle, DatagramEvent, EndpointConfig};

use crate::process::{metric, scrape, RelayProcess};
use crate::support::{free_port, local, sub_config, TestDir};

/// Caps small enough that five flooding addresses, 8 handshakes each, would fill them if
/// unauthenticated handshakes counted.
const CAPS: [&str; 6] = [
    "--max-connections",
    "32",
    "--max-connections-per-address",
    "8",
    "--retry-threshold",
    "4",
];

/// The flooding sources: five loopback addresses besides the subscriber's 127.0.0.1.
const SOURCES: std::ops::RangeInclusive<u8> = 2..=6;

/// Longest a flood runs, whatever happens to the test.
const FLOOD_MAX: Duration = Duration::from_secs(120);

/// How a flooding source opens handshakes.
#[derive(Debug, Clone, Copy)]
struct Pace {
    /// Handshakes opened at each renewal.
    burst: usize,
    /// Time between renewals (zero: at once, again and again).
    every: Duration,
    /// How long each handshake's Initials are retransmitted.
    keep: Duration,
    /// Most handshakes one source keeps at once.
    live: usize,
}

/// New handshakes every 0.5 s, each kept for 10 s (far longer than any handshake takes), more
/// than any per-address cap at each renewal.
const RENEWING: Pace = Pace {
    burst: 48,
    every: Duration::from_millis(500),
    keep: Duration::from_secs(10),
    live: 1024,
};

/// As fast as each source's thread can open handshakes.
const FLAT_OUT: Pace = Pace {
    burst: 4,
    every: Duration::ZERO,
    keep: Duration::from_secs(2),
    live: 4096,
};

/// A QUIC client configuration that presents no certificate: it trusts the relay's CA (so
/// nothing in its Initial differs from a subscriber's) and has nothing to authenticate with.
fn certless_client(certs: &Path) -> quinn::ClientConfig {
    let ca = ledger_relay_certs::load_certs(&certs.join("ca.pem")).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for c in ca {
        roots.add(c).unwrap();
    }
    let mut tls =
        rustls::ClientConfig::builder_with_provider(ledger_relay_transport::crypto_provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    tls.alpn_protocols = vec![ledger_relay_wire::ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    quinn::ClientConfig::new(Arc::new(quic))
}

/// A QUIC v1 Retry packet: long header, type 3.
fn is_retry(datagram: &[u8]) -> bool {
    datagram.first().is_some_and(|b| b & 0xb0 == 0xb0)
}

/// What one flooding source did.
#[derive(Debug, Default, Clone, Copy)]
struct Sent {
    /// Handshakes opened.
    opened: u64,
    /// Retries answered.
    retried: u64,
}

/// One flooding source: quinn-proto's client endpoint over a UDP socket on its address.
struct Source {
    socket: UdpSocket,
    endpoint: quinn_proto::Endpoint,
    config: quinn::ClientConfig,
    server: SocketAddr,
    live: HashMap<ConnectionHandle, (quinn_proto::Connection, Instant)>,
    sent: Sent,
    buf: Vec<u8>,
}

impl Source {
    fn new(ip: Ipv4Addr, server: SocketAddr, config: quinn::ClientConfig) -> Source {
        let socket = UdpSocket::bind((ip, 0)).unwrap();
        socket.set_nonblocking(true).unwrap();
        Source {
            socket,
            endpoint: quinn_proto::Endpoint::new(
                Arc::new(EndpointConfig::default()),
                None,
                false,
                None,
            ),
            config,
            server,
            live: HashMap::new(),
            sent: Sent::default(),
            buf: Vec::new(),
        }
    }

    /// Opens a handshake, kept until `until`.
    fn open(&mut self, now: Instant, until: Instant) {
        let (ch, conn) = self
            .endpoint
            .connect(now, self.config.clone(), self.server, "127.0.0.1")
            .unwrap();
        self.live.insert(ch, (conn, until));
        self.sent.opened += 1;
    }

    /// Reads what the relay sent: a Retry goes to its handshake (which answers it with its
    /// Initial and the token), anything else is dropped unread.
    fn read(&mut self, now: Instant) {
        let mut data = [0u8; 2048];
        while let Ok((n, from)) = self.socket.recv_from(&mut data) {
            if !is_retry(&data[..n]) {
                continue;
            }
            let datagram = BytesMut::from(&data[..n]);
            let event = self
                .endpoint
                .handle(now, from, None, None, datagram, &mut self.buf);
            if let Some(DatagramEvent::ConnectionEvent(ch, event)) = event {
                if let Some((conn, _)) = self.live.get_mut(&ch) {
                    conn.handle_event(event);
                    self.sent.retried += 1;
                }
            }
        }
    }

    /// Runs every handshake's timers and sends what it has to send (first Initials, answers
    /// to Retries, retransmitted Initials); forgets those kept long enough.
    fn drive(&mut self, now: Instant) {
        self.live.retain(|_, (_, until)| now < *until);
        for (ch, (conn, _)) in self.live.iter_mut() {
            if conn.poll_timeout().is_some_and(|t| t <= now) {
                conn.handle_timeout(now);
            }
            loop {
                self.buf.clear();
                let Some(t) = conn.poll_transmit(now, 1, &mut self.buf) else {
                    break;
                };
                // A full socket buffer drops the packet, as a network would.
                let _ = self.socket.send_to(&self.buf[..t.size], t.destination);
            }
            while let Some(e) = conn.poll_endpoint_events() {
                if let Some(e) = self.endpoint.handle_event(*ch, e) {
                    conn.handle_event(e);
                }
            }
            while conn.poll().is_some() {}
        }
    }

    /// Floods at `pace` until `stop` (or [`FLOOD_MAX`]).
    fn run(mut self, pace: Pace, stop: &AtomicBool) -> Sent {
        lowest_priority();
        let deadline = Instant::now() + FLOOD_MAX;
        let mut renew = Instant::now();
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            let now = Instant::now();
            if now >= renew {
                for _ in 0..pace.burst.min(pace.live.saturating_sub(self.live.len())) {
                    self.open(now, now + pace.keep);
                }
                renew = now + pace.every;
            }
            self.read(now);
            self.drive(now);
            if !pace.every.is_zero() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.sent
    }
}

/// With this variable set, the flood's threads keep their normal priority (for
/// `connect_times`: what a flood that takes this machine's cores from the relay does).
const NORMAL_PRIORITY_ENV: &str = "LEDGER_RELAY_TEST_FLOOD_AT_NORMAL_PRIORITY";

/// Puts the calling thread at the lowest CPU priority (nice 19). The flood then goes as fast as
/// the CPU the relay and the subscriber leave allows, as a flood from other machines would,
/// rather than taking this machine's cores from the relay: five threads at full speed and
/// normal priority left the relay a fifth of a core, and what that measures is a host starved
/// of CPU, whatever the relay admits (bench/RESULTS.md, "Handshake pool").
fn lowest_priority() {
    if std::env::var_os(NORMAL_PRIORITY_ENV).is_some() {
        return;
    }
    let Some(tid) = std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name().map(|t| t.to_string_lossy().into_owned()))
    else {
        return;
    };
    let reniced = std::process::Command::new("renice")
        .args(["-n", "19", "-p", &tid])
        .output();
    if !reniced.is_ok_and(|o| o.status.success()) {
        println!("flood thread {tid} left at normal priority: renice failed");
    }
}

/// A running flood: one thread per source.
struct Flood {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Sent>>,
}

impl Flood {
    fn start(server: SocketAddr, certs: &Path, pace: Pace) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let config = certless_client(certs);
        let threads = SOURCES
            .map(|last| {
                let source = Source::new(Ipv4Addr::new(127, 0, 0, last), server, config.clone());
                let stop = stop.clone();
                std::thread::spawn(move || source.run(pace, &stop))
            })
            .collect();
        Flood { stop, threads }
    }

    /// Stops the flood; what every source did.
    fn stop(self) -> Vec<Sent> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect()
    }
}

/// A relay of small synthetic ledgers (one every 100 ms) with [`CAPS`] and
/// `extra` flags, its port and its metrics address.
async fn relay(dir: &TestDir, extra: &[&str]) -> (RelayProcess, u16, SocketAddr) {
    let port = free_port();
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let metrics_flag = metrics.to_string();
    let mut args = vec![
        "--source",
        "synthetic:size=64KiB,ratio=2",
        "--cadence",
        "100ms",
        "--metrics",
        &metrics_flag,
    ];
    args.extend(CAPS);
    args.extend(extra);
    let relay = RelayProcess::start(dir.certs.path(), &dir.data(), port, &args).await;
    (relay, port, metrics)
}

/// What one subscriber saw: the time from its start to its first ledger (`None`: none within
/// 10 s), and how many sessions it tried meanwhile.
async fn first_ledger(dir: &TestDir, port: u16) -> (Option<Duration>, u64) {
    let config = sub_config(vec![local(port)], dir.certs.path(), "rpc-1", 4, Start::Tip);
    let started = Instant::now();
    let mut sub = connect(config).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), sub.next()).await;
    let took = started.elapsed();
    let sessions = sub.status().sessions;
    sub.close().await;
    match got {
        Ok(Some(Ok(_))) => (Some(took), sessions),
        _ => (None, sessions),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "process tier (real relays killed, failed over or flooded): .ci/run runs it"]
async fn a_certless_handshake_flood_never_keeps_a_subscriber_out() {
    let dir = TestDir::new();
    let (relay, port, metrics) = relay(&dir, &[]).await;
    let server = SocketAddr::from(([127, 0, 0, 1], port));
    for (pace, rounds) in [(RENEWING, 5), (FLAT_OUT, 5)] {
        let flood = Flood::start(server, dir.certs.path(), pace);
        // The flood takes whatever it can first.
        tokio::time::sleep(Duration::from_secs(1)).await;
        for round in 0..rounds {
            // At different points of the flood's renewals.
            tokio::time::sleep(Duration::from_millis(700)).await;
            let (took, sessions) = first_ledger(&dir, port).await;
            assert!(
                took.is_some_and(|t| t <= Duration::from_secs(3)) && sessions == 1,
                "{pace:?}, round {round}: first ledger after {took:?}, {sessions} sessions\n{}",
                relay.log()
            );
        }
        let m = scrape(metrics).await;
        let sent = flood.stop();
        let pool: Vec<_> = m.iter().filter(|(n, _)| n.contains("handshakes")).collect();
        println!("{pace:?}: {sent:?}; {pool:?}");
        assert!(
            sent.iter().all(|s| s.retried > 0),
            "every source answered Retries: {sent:?}"
        );
        let crowded = metric(&m, "ledger_relay_handshakes_refused_total").unwrap_or(0)
            + metric(&m, "ledger_relay_handshakes_evicted_total").unwrap_or(0);
        assert!(crowded > 0, "the flood filled the pending pool: {m:?}");
        assert!(metric(&m, "ledger_relay_handshakes_pending").is_some_and(|n| n <= 128));
        // Nothing but the subscriber's lanes ever counted as a connection.
        assert!(metric(&m, "ledger_relay_connections_open").is_some_and(|n| n <= 4));
    }
    relay.sigterm().await;
}

/// The median, the 90th percentile and the largest of `times`, in ms.
fn summary(times: &mut [Duration]) -> String {
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        ms(at(0.5)),
        ms(at(0.9)),
        ms(at(1.0))
    )
}

/// Time to first ledger of `rounds` subscribers one after another: their times, and how many
/// got none within 10 s or needed more than one session.
async fn connect_rounds(dir: &TestDir, port: u16, rounds: usize) -> (Vec<Duration>, usize) {
    let mut times = Vec::new();
    let mut failed = 0;
    for _ in 0..rounds {
        match first_ledger(dir, port).await {
            (Some(t), 1) => times.push(t),
            _ => failed += 1,
        }
    }
    (times, failed)
}

/// A measurement for `bench/RESULTS.md`: time to first ledger of a subscriber (4 lanes,
/// starting at the tip) without a flood, then with each flood running. Asserts only that every
/// subscriber got in without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; prints figures for bench/RESULTS.md"]
async fn connect_times() {
    const ROUNDS: usize = 30;
    const FLOOD_ROUNDS: usize = 10;
    let dir = TestDir::new();
    let (relay, port, _) = relay(&dir, &[]).await;
    let server = SocketAddr::from(([127, 0, 0, 1], port));
    let (mut quiet, failed) = connect_rounds(&dir, port, ROUNDS).await;
    assert_eq!(failed, 0, "without a flood every subscriber gets in");
    println!("no flood: {ROUNDS} subscribers, {}", summary(&mut quiet));
    for (name, pace) in [("renewing every 0.5 s", RENEWING), ("flat out", FLAT_OUT)] {
        let began = Instant::now();
        let flood = Flood::start(server, dir.certs.path(), pace);
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Within the flood's own bound even when every subscriber waits its 10 s.
        let (mut times, failed) = connect_rounds(&dir, port, FLOOD_ROUNDS).await;
        let sent = flood.stop();
        let opened: u64 = sent.iter().map(|s| s.opened).sum();
        let rate = opened as f64 / began.elapsed().as_secs_f64();
        let got = if times.is_empty() {
            "none got in".to_owned()
        } else {
            summary(&mut times)
        };
        println!(
            "flood {name} ({opened} handshakes opened, {rate:.0}/s): {FLOOD_ROUNDS} subscribers, \
             {failed} without a first ledger on their first session within 10 s; {got}"
        );
    }
    relay.sigterm().await;
}
