//! The stand-in's HTTP ports (stellar-core's command and query ports) against the fake relay
//! answering `CoreRequest`s: forwarding byte for byte, the query port's consistency rule, and
//! the stand-in's own answers (503 without a relay, 413 for an oversized request). The ports
//! as the binary opens them from a `--conf` file are in `captive.rs`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ledger_relay_subscriber::core_http::{
    CoreClient, CoreClientConfig, CorePort, CoreResponse, Origin,
};
use ledger_relay_subscriber::RelayAddr;
use ledger_relay_subscriber_bin::captive::{HttpOptions, HttpServers};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use crate::support::fake_relay::{CoreFake, FakeRelay, Plan};
use crate::support::{init_tracing, within, Pki};

/// An HTTP answer as the client saw it.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!("{e}: {:?}", String::from_utf8_lossy(&self.body));
        })
    }
}

/// Sends `head` (request line and headers, without the blank line; `Connection: close` is
/// added) and `body` to `addr`, and reads the whole answer.
pub async fn http(addr: SocketAddr, head: &str, body: &[u8]) -> Reply {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request =
        format!("{head}\r\nHost: localhost\r\nConnection: close\r\n\r\n").into_bytes();
    request.extend_from_slice(body);
    stream.write_all(&request).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer");
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .map(|l| {
            let (n, v) = l.split_once(": ").unwrap();
            (n.to_owned(), v.to_owned())
        })
        .collect();
    Reply {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

/// A form POST to core's query server, as the Go SDK sends it.
pub fn post(path: &str, form: &str) -> (String, Vec<u8>) {
    let head = format!(
        "POST {path} HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}",
        form.len()
    );
    (head, form.as_bytes().to_vec())
}

/// The stand-in's two servers against a fake relay; the test moves L (`written`).
struct Bench {
    relay: FakeRelay,
    servers: HttpServers,
    written: watch::Sender<u32>,
}

impl Bench {
    async fn start(pki: &Pki, core: CoreFake, tune: impl FnOnce(&mut HttpOptions)) -> Bench {
        let mut plan = Plan::new(Vec::new());
        plan.core = Some(core);
        let relay = FakeRelay::start(plan, pki.path(), pki.path());
        let mut options = options(pki, &[relay.addr]);
        tune(&mut options);
        let (written, rx) = watch::channel(0);
        let listen = [
            (CorePort::Command, "127.0.0.1:0".parse().unwrap()),
            (CorePort::Query, "127.0.0.1:0".parse().unwrap()),
        ];
        let servers = HttpServers::start(&listen, options, rx).await.unwrap();
        Bench {
            relay,
            servers,
            written,
        }
    }

    fn command(&self) -> SocketAddr {
        self.servers.local_addr(CorePort::Command).unwrap()
    }

    fn query(&self) -> SocketAddr {
        self.servers.local_addr(CorePort::Query).unwrap()
    }

    async fn query_form(&self, form: &str) -> Reply {
        let (head, body) = post("/getledgerentry", form);
        within(10, http(self.query(), &head, &body)).await
    }

    /// Bodies of the requests the relay received, as text.
    fn forwarded(&self) -> Vec<String> {
        self.relay
            .record()
            .core_requests
            .iter()
            .map(|r| String::from_utf8_lossy(&r.body).into_owned())
            .collect()
    }
}

fn options(pki: &Pki, relays: &[SocketAddr]) -> HttpOptions {
    init_tracing();
    let relays = relays.iter().map(|a| RelayAddr::from(*a)).collect();
    let mut config = CoreClientConfig::new(relays, pki.credentials("rpc-1"));
    config.connect_timeout = Duration::from_millis(300);
    HttpOptions {
        client: CoreClient::new(config).unwrap(),
        query_wait: Duration::from_millis(1000),
        core_timeout: Duration::from_millis(2000),
        max_request: 1 << 20,
    }
}

fn assert_ledger_not_found(r: &Reply) {
    assert_eq!(r.status, 404);
    assert_eq!(r.header("content-type"), Some("text/html"));
    assert_eq!(r.body, b"Ledger not found\n");
}

#[tokio::test]
async fn a_query_for_a_ledger_already_written_is_forwarded_verbatim() {
    let pki = Pki::new();
    let bench = Bench::start(&pki, CoreFake::echo("relay"), |_| {}).await;
    bench.written.send_replace(100);
    for form in [
        "key=AAAA%2Bx%3D&ledgerSeq=100",
        "key=AAAA&key=BBBB&ledgerSeq=95",
    ] {
        let r = bench.query_form(form).await;
        assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.header("content-type"), Some("application/json"));
        let echo = r.json();
        assert_eq!(echo["body"], form, "the body is not re-encoded");
        assert_eq!(echo["target"], "/getledgerentry");
        assert_eq!(echo["content_type"], "application/x-www-form-urlencoded");
    }
    assert_eq!(bench.forwarded().len(), 2);
}

#[tokio::test]
async fn a_query_for_a_newer_ledger_waits_until_it_is_written() {
    let pki = Pki::new();
    let bench = Bench::start(&pki, CoreFake::echo("relay"), |_| {}).await;
    bench.written.send_replace(100);
    let addr = bench.query();
    let started = Instant::now();
    let pending = tokio::spawn(async move {
        let (head, body) = post("/getledgerentry", "key=AAAA&ledgerSeq=101");
        http(addr, &head, &body).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        bench.forwarded().is_empty(),
        "nothing reaches the relay before ledger 101 is written"
    );
    bench.written.send_replace(101);
    let r = within(10, pending).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["body"], "key=AAAA&ledgerSeq=101");
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn a_query_for_a_ledger_not_written_in_time_is_not_found_as_core_says_it() {
    let pki = Pki::new();
    let bench = Bench::start(&pki, CoreFake::echo("relay"), |o| {
        o.query_wait = Duration::from_millis(300);
    })
    .await;
    bench.written.send_replace(100);
    let started = Instant::now();
    let r = bench.query_form("key=AAAA&ledgerSeq=105").await;
    let took = started.elapsed();
    assert_ledger_not_found(&r);
    assert!(
        took >= Duration::from_millis(300),
        "waited query_wait: {took:?}"
    );
    assert!(
        took < Duration::from_millis(1500),
        "and no longer: {took:?}"
    );
    assert!(bench.forwarded().is_empty());
}

#[tokio::test]
async fn a_query_naming_no_ledger_is_pinned_to_the_last_one_written() {
    let pki = Pki::new();
    let bench = Bench::start(&pki, CoreFake::echo("relay"), |_| {}).await;
    // Before the first ledger is written: as a core with no snapshot yet.
    assert_ledger_not_found(&bench.query_form("key=AAAA").await);
    bench.written.send_replace(1_410_100);
    let r = bench.query_form("key=AAAA").await;
    assert_eq!(r.json()["body"], "key=AAAA&ledgerSeq=1410100");
    let r = bench.query_form("key=AAAA&").await;
    assert_eq!(r.json()["body"], "key=AAAA&ledgerSeq=1410100");
    // The raw endpoint takes ledgerSeq too.
    let (head, body) = post("/getledgerentryraw", "key=CCCC");
    let r = within(10, http(bench.query(), &head, &body)).await;
    assert_eq!(r.json()["body"], "key=CCCC&ledgerSeq=1410100");
    assert_eq!(r.json()["target"], "/getledgerentryraw");
}

#[tokio::test]
async fn forms_core_refuses_itself_are_forwarded_untouched() {
    let pki = Pki::new();
    let bench = Bench::start(&pki, CoreFake::echo("relay"), |_| {}).await;
    // Nothing written yet, and still no wait and no pinning: core answers its own errors.
    for form in [
        "key=AAAA&ledgerSeq=abc",
        "key=AAAA&ledgerSeq=1&ledgerSeq=2",
        "key=AAAA&ledgerSeq=99999999999",
        "nokey=1",
    ] {
        let started = Instant::now();
        let r = bench.query_form(form).await;
        assert_eq!(r.json()["body"], form);
        assert!(
            started.elapsed() < Duration::from_millis(900),
            "{form}: not held"
        );
    }
}

#[tokio::test]
async fn tx_and_info_pass_through_byte_identical() {
    // Core's exact answers (FastWriter and StyledWriter output), and a relay's refusal.
    const PENDING: &[u8] = b"{\"status\":\"PENDING\"}\n";
    const INFO: &[u8] = b"{\n   \"info\" : {\n      \"state\" : \"Synced!\"\n   }\n}\n";
    let pki = Pki::new();
    let core = CoreFake::answering(|r| {
        let (status, origin, body) = match r.target.split('?').next().unwrap() {
            "/tx" => (200, Origin::Core, Bytes::from_static(PENDING)),
            "/info" => (200, Origin::Core, Bytes::from_static(INFO)),
            _ => return CoreResponse::from_relay(403, "not forwarded"),
        };
        CoreResponse {
            status,
            origin,
            content_type: "application/json".into(),
            body,
        }
    });
    let bench = Bench::start(&pki, core, |_| {}).await;
    let target = "/tx?blob=AAAAAgAAAAB%2Bn8%2F%3D%3D";
    let r = within(
        10,
        http(bench.command(), &format!("GET {target} HTTP/1.1"), b""),
    )
    .await;
    assert_eq!((r.status, r.body.as_slice()), (200, PENDING));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("content-length"), Some("21"));
    assert_eq!(r.header("date"), None, "core sends no Date header");
    let seen = bench.relay.record().core_requests;
    assert_eq!(seen[0].target, target, "the query string is not re-encoded");
    assert_eq!(seen[0].port, CorePort::Command);
    let r = within(10, http(bench.command(), "GET /info HTTP/1.0", b"")).await;
    assert_eq!((r.status, r.body.as_slice()), (200, INFO));
    let r = within(
        10,
        http(bench.command(), "GET /upgrades?mode=set HTTP/1.1", b""),
    )
    .await;
    assert_eq!(r.status, 403);
    assert_eq!(r.json()["exception"], "ledger-relay: not forwarded");
}

#[tokio::test]
async fn no_relay_reachable_is_503_json_within_the_timeout() {
    let pki = Pki::new();
    let dead = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (written, rx) = watch::channel(7);
    let mut options = options(&pki, &[dead]);
    options.core_timeout = Duration::from_millis(800);
    let listen = [(CorePort::Command, "127.0.0.1:0".parse().unwrap())];
    let servers = HttpServers::start(&listen, options, rx).await.unwrap();
    let addr = servers.local_addr(CorePort::Command).unwrap();
    let started = Instant::now();
    let r = within(10, http(addr, "GET /info HTTP/1.1", b"")).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let reason = r.json()["exception"].as_str().unwrap().to_owned();
    assert!(
        reason.starts_with("ledger-relay: no relay reachable"),
        "{reason}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert!(servers.local_addr(CorePort::Query).is_none());
    drop(written);
    servers.stop().await;
}

#[tokio::test]
async fn an_oversized_request_is_refused_413_here() {
    let pki = Pki::new();
    let bench = Bench::start(&pki, CoreFake::echo("relay"), |o| o.max_request = 1024).await;
    bench.written.send_replace(5);
    let big = format!("key={}&ledgerSeq=5", "A".repeat(1100));
    let r = bench.query_form(&big).await;
    assert_eq!(r.status, 413);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.json()["exception"],
        "ledger-relay: request larger than 1024 bytes"
    );
    // Without a Content-Length (chunked), the body is cut off at the limit all the same.
    let chunked = format!("{:x}\r\n{big}\r\n0\r\n\r\n", big.len()).into_bytes();
    let head = "POST /getledgerentry HTTP/1.1\r\nTransfer-Encoding: chunked";
    let r = within(10, http(bench.query(), head, &chunked)).await;
    assert_eq!(r.status, 413);
    // A long target counts too.
    let target = format!("/tx?blob={}", "A".repeat(1100));
    let r = within(
        10,
        http(bench.command(), &format!("GET {target} HTTP/1.1"), b""),
    )
    .await;
    assert_eq!(r.status, 413);
    assert!(
        bench.forwarded().is_empty(),
        "nothing oversized left the box"
    );
    // Within the limit it goes through.
    let r = bench.query_form("key=AAAA&ledgerSeq=5").await;
    assert_eq!(r.status, 200);
}
