//! Requests for stellar-core through the relay (`docs/protocol.md` section 6): the subscriber
//! library's `CoreClient` (what the stand-in and a tier relay use) or a raw QUIC connection on
//! one side, a stand-in for one of core's HTTP ports on the other ([`CorePortStandIn`]). Core's
//! answers come back byte for byte; the relay answers itself, with the documented status,
//! what it refuses, what times out and what cannot reach core; request connections end on
//! revocation, shutdown and protocol violations.

use std::time::{Duration, Instant};

use bytes::Bytes;
use ledger_relay::core_http::{CoreSettings, Outcome};
use ledger_relay_subscriber::core_http::{
    CoreClient, CoreClientConfig, CorePort, CoreRequest, CoreResponse, HttpMethod, Origin,
};
use ledger_relay_subscriber::Credentials;
use ledger_relay_transport::write_single_frame;
use ledger_relay_wire::frame::{self, ErrorCode, Frame, Start};
use ledger_relay_wire::Limits;

use crate::core_stand_in::{CorePortStandIn, Reply};
use crate::support::*;

fn get(target: &str) -> CoreRequest {
    CoreRequest {
        version: 1,
        port: CorePort::Command,
        method: HttpMethod::Get,
        timeout_ms: 0,
        target: target.into(),
        content_type: String::new(),
        body: Bytes::new(),
    }
}

fn post(target: &str, body: &str) -> CoreRequest {
    CoreRequest {
        port: CorePort::Query,
        method: HttpMethod::Post,
        body: Bytes::copy_from_slice(body.as_bytes()),
        ..get(target)
    }
}

/// A relay on the testnet file whose `--core-*` settings `set` changes.
async fn relay_with(dir: &TestDir, set: impl FnOnce(&mut CoreSettings)) -> Running {
    let mut config = dir.relay_config(&file_source());
    set(&mut config.core);
    Running::start(config).await
}

fn url(stand_in: &CorePortStandIn) -> Option<ledger_relay::core_http::CoreUrl> {
    Some(stand_in.url().parse().unwrap())
}

/// A `CoreClient` of `relay` as client `name`: a request connection of its own.
fn client(dir: &TestDir, relay: &Running, name: &str) -> CoreClient {
    let credentials = Credentials::from_cert_dir(dir.certs.path(), name).unwrap();
    CoreClient::new(CoreClientConfig::new(vec![relay.addr()], credentials)).unwrap()
}

async fn ask(client: &CoreClient, request: CoreRequest) -> CoreResponse {
    within(15, "an answer", client.request(request))
        .await
        .expect("a response")
}

/// The relay's own answer: its status, and the reason in core's error shape.
fn relay_answer(r: &CoreResponse) -> (u16, String) {
    assert_eq!(r.origin, Origin::Relay, "{r:?}");
    assert_eq!(r.content_type, "application/json");
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let reason = body["exception"].as_str().expect("an exception").to_owned();
    assert!(reason.starts_with("ledger-relay: "), "{reason}");
    (r.status, reason)
}

fn requests(relay: &Running, port: CorePort, outcome: Outcome) -> u64 {
    relay.relay.metrics.core.requests(port, outcome)
}

const PENDING: &str = "{\"status\":\"PENDING\"}\n";
const ENTRIES: &str = "{\"entries\":[{\"state\":\"not-found\"}],\"ledgerSeq\":5}\n";

/// Stand-ins for core's two ports (the query server says `Ledger not found` for ledger 9) and
/// a relay that forwards to them.
async fn forwarding_relay(dir: &TestDir) -> (Running, CorePortStandIn, CorePortStandIn) {
    let command = CorePortStandIn::answering(Reply::json(PENDING)).await;
    let query = CorePortStandIn::start(move |r| {
        if r.body.ends_with(b"ledgerSeq=9") {
            Reply::not_found("Ledger not found\n")
        } else {
            Reply::json(ENTRIES)
        }
    })
    .await;
    let relay = relay_with(dir, |c| {
        c.http = url(&command);
        c.query = url(&query);
    })
    .await;
    (relay, command, query)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_reaches_cores_command_port_as_sent_and_its_answer_comes_back() {
    let dir = TestDir::new();
    let (relay, command, query) = forwarding_relay(&dir).await;
    let rpc = client(&dir, &relay, "rpc-1");
    let r = ask(&rpc, get("/tx?blob=AAAA%2BBBB%3D%3D")).await;
    let want = CoreResponse {
        status: 200,
        origin: Origin::Core,
        content_type: "application/json".into(),
        body: Bytes::from(PENDING),
    };
    assert_eq!(r, want);
    let sent = command.received();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].request_line(),
        "GET /tx?blob=AAAA%2BBBB%3D%3D HTTP/1.1",
        "the target as received, never decoded and encoded again"
    );
    assert!(query.received().is_empty());
    assert_eq!(requests(&relay, CorePort::Command, Outcome::Answered), 1);
    let text = relay.relay.metrics.render();
    for series in [
        "ledger_relay_core_requests_total{port=\"http\",outcome=\"answered\"} 1\n",
        "ledger_relay_core_request_duration_seconds_bucket{port=\"http\",le=\"+Inf\"} 1\n",
        "ledger_relay_core_connections_open 1\n",
    ] {
        assert!(text.contains(series), "{series} in\n{text}");
    }
    rpc.close().await;
    let m = &relay.relay.metrics;
    eventually(5, "the request connection closed", || {
        load(&m.core.connections_open) == 0
    })
    .await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_reaches_cores_query_port_with_its_length_and_the_answer_comes_back() {
    let dir = TestDir::new();
    let (relay, command, query) = forwarding_relay(&dir).await;
    let rpc = client(&dir, &relay, "rpc-1");
    let form = "key=AAAA%2BAA%3D&ledgerSeq=5";
    let r = ask(&rpc, post("/getledgerentry", form)).await;
    assert_eq!((r.status, r.origin), (200, Origin::Core));
    assert_eq!(
        (r.content_type.as_str(), &r.body[..]),
        ("application/json", ENTRIES.as_bytes())
    );
    let r = ask(&rpc, post("/getledgerentryraw", "key=AAAA&ledgerSeq=9")).await;
    assert_eq!(
        (r.status, r.origin),
        (404, Origin::Core),
        "core's errors too"
    );
    assert_eq!(
        (r.content_type.as_str(), &r.body[..]),
        ("text/html", &b"Ledger not found\n"[..])
    );
    let sent = query.received();
    assert_eq!(sent[0].request_line(), "POST /getledgerentry HTTP/1.1");
    assert_eq!(sent[0].body, form.as_bytes());
    // Core's query server finds the body only by a header spelled exactly so.
    let length = format!("Content-Length: {}", form.len());
    assert!(
        sent[0].header_lines().contains(&length.as_str()),
        "{:?}",
        sent[0].head
    );
    assert!(!sent[0]
        .head
        .to_ascii_lowercase()
        .contains("transfer-encoding"));
    assert!(command.received().is_empty());
    assert_eq!(requests(&relay, CorePort::Query, Outcome::Answered), 2);
    let text = relay.relay.metrics.render();
    let count = "ledger_relay_core_request_duration_seconds_count{port=\"query\"} 2\n";
    assert!(text.contains(count), "{text}");
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_relay_does_not_forward_is_refused_and_never_reaches_core() {
    let dir = TestDir::new();
    dir.certs.issue_client("rpc-2", 30).unwrap();
    let command = CorePortStandIn::answering(Reply::json("{}")).await;
    let relay = relay_with(&dir, |c| {
        c.http = url(&command);
        c.http_allow = Some(vec!["rpc-2".into()]);
        c.max_request = 1024;
    })
    .await;
    let rpc1 = client(&dir, &relay, "rpc-1");
    let rpc2 = client(&dir, &relay, "rpc-2");
    let refused = [
        (
            &rpc2,
            get("/upgrades?mode=set&protocolversion=99"),
            403,
            "not forwarded",
        ),
        (&rpc2, post("/tx", "blob=AAAA"), 403, "not forwarded"),
        (
            &rpc2,
            CoreRequest {
                method: HttpMethod::Post,
                ..get("/tx?blob=A")
            },
            403,
            "only GET",
        ),
        (&rpc1, get("/tx?blob=AAAA"), 403, "client rpc-1 may not"),
        (
            &rpc2,
            post("/getledgerentry", "key=AAAA"),
            403,
            "forwards nothing to stellar-core's query port",
        ),
        (
            &rpc2,
            get(&format!("/tx?blob={}", "A".repeat(1100))),
            413,
            "larger than this relay's limit of 1024",
        ),
    ];
    for (client, request, status, why) in refused {
        let target = request.target.chars().take(40).collect::<String>();
        let (got, reason) = relay_answer(&ask(client, request).await);
        assert_eq!(got, status, "{target}: {reason}");
        assert!(reason.contains(why), "{target}: {reason}");
    }
    assert!(command.received().is_empty(), "nothing reached core");
    assert_eq!(requests(&relay, CorePort::Command, Outcome::Refused), 4);
    assert_eq!(requests(&relay, CorePort::Query, Outcome::Refused), 2);
    // The allowed client, within the limit, is forwarded.
    let r = ask(&rpc2, get(&format!("/tx?blob={}", "A".repeat(900)))).await;
    assert_eq!((r.status, r.origin), (200, Origin::Core));
    assert_eq!(command.received().len(), 1);
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_without_core_or_upstream_refuses_both_ports() {
    let dir = TestDir::new();
    let relay = relay_with(&dir, |_| {}).await;
    let rpc = client(&dir, &relay, "rpc-1");
    for request in [get("/info"), post("/getledgerentry", "key=AAAA")] {
        let (status, reason) = relay_answer(&ask(&rpc, request).await);
        assert_eq!(status, 403);
        assert!(reason.contains("forwards nothing"), "{reason}");
    }
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_concurrency_is_refused_at_once_and_not_queued() {
    let dir = TestDir::new();
    let slow = Duration::from_millis(1500);
    let command = CorePortStandIn::answering(Reply::json("{}").after(slow)).await;
    let relay = relay_with(&dir, |c| {
        c.http = url(&command);
        c.concurrency = 2;
    })
    .await;
    // Two requests in flight on one request connection (which is granted two streams)...
    let first = client(&dir, &relay, "rpc-1");
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let c = first.clone();
            tokio::spawn(async move { c.request(get("/info")).await })
        })
        .collect();
    eventually(10, "two requests at core", || command.received().len() == 2).await;
    // ... and a third from the same identity on another connection: refused, not waiting.
    let other = client(&dir, &relay, "rpc-1");
    let asked = Instant::now();
    let (status, reason) = relay_answer(&ask(&other, get("/info")).await);
    assert_eq!(status, 429, "{reason}");
    assert!(
        reason.contains("already has 2 requests in flight"),
        "{reason}"
    );
    assert!(asked.elapsed() < slow / 2, "at once: {:?}", asked.elapsed());
    for b in busy {
        let r = b.await.unwrap().unwrap();
        assert_eq!((r.status, r.origin), (200, Origin::Core));
    }
    // Answered requests are no longer in flight.
    let r = ask(&other, get("/info")).await;
    assert_eq!((r.status, r.origin), (200, Origin::Core));
    assert_eq!(command.received().len(), 3);
    assert_eq!(requests(&relay, CorePort::Command, Outcome::Refused), 1);
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_unreachable_is_503_and_core_slow_is_504_within_the_timeout() {
    let dir = TestDir::new();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let slow = CorePortStandIn::answering(Reply::json("{}").after(Duration::from_secs(5))).await;
    let timeout = Duration::from_millis(400);
    let relay = relay_with(&dir, |c| {
        c.http = Some(format!("http://{closed}").parse().unwrap());
        c.query = url(&slow);
        c.timeout = timeout;
        c.concurrency = 1;
    })
    .await;
    let rpc = client(&dir, &relay, "rpc-1");
    let asked = Instant::now();
    let (status, reason) = relay_answer(&ask(&rpc, get("/tx?blob=AAAA")).await);
    assert_eq!(status, 503, "{reason}");
    assert!(reason.contains("http port cannot be reached"), "{reason}");
    assert!(asked.elapsed() < timeout, "{:?}", asked.elapsed());
    assert_eq!(requests(&relay, CorePort::Command, Outcome::Unavailable), 1);

    for _ in 0..2 {
        // Twice with a concurrency of 1: a request that timed out is not in flight any more.
        let asked = Instant::now();
        let (status, reason) = relay_answer(&ask(&rpc, post("/getledgerentry", "key=A")).await);
        let took = asked.elapsed();
        assert_eq!(status, 504, "{reason}");
        assert!(took >= timeout - Duration::from_millis(50), "{took:?}");
        assert!(took < timeout + Duration::from_millis(1500), "{took:?}");
    }
    assert_eq!(requests(&relay, CorePort::Query, Outcome::TimedOut), 2);
    let text = relay.relay.metrics.render();
    assert!(text.contains("ledger_relay_core_request_duration_seconds_count{port=\"query\"} 2\n"));
    relay.stop().await;
}

/// A raw request connection of client `name`: one request answered on its first stream.
async fn raw_request_connection(dir: &TestDir, relay: &Running, name: &str) -> Raw {
    let raw = raw_connect(relay, tls_client(dir.certs.path(), name)).await;
    let r = raw_request(&raw.conn, &get("/info")).await;
    assert_eq!(r.status, 403, "no core configured: the relay answers");
    raw
}

async fn raw_request(conn: &quinn::Connection, request: &CoreRequest) -> CoreResponse {
    let (mut send, mut recv) = within(5, "open_bi", conn.open_bi()).await.unwrap();
    write_single_frame(&mut send, &Frame::CoreRequest(request.clone()))
        .await
        .unwrap();
    let bytes = within(5, "the answer", recv.read_to_end(1 << 26))
        .await
        .unwrap();
    match frame::decode_exact(bytes.into(), &Limits::default()).unwrap() {
        Frame::CoreResponse(r) => r,
        other => panic!("{other:?}"),
    }
}

/// Waits for `conn` to be closed by the relay and returns the close code.
async fn closed_with(conn: &quinn::Connection) -> u64 {
    match within(5, "the relay closes the connection", conn.closed()).await {
        quinn::ConnectionError::ApplicationClosed(c) => c.error_code.into_inner(),
        other => panic!("closed otherwise: {other}"),
    }
}

fn code(c: ErrorCode) -> u64 {
    u64::from(c.close_code())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_connection_ends_when_its_certificate_is_revoked() {
    let dir = TestDir::new();
    dir.certs.issue_client("rpc-2", 30).unwrap();
    let relay = relay_with(&dir, |_| {}).await;
    let m = &relay.relay.metrics;
    let revoked = raw_request_connection(&dir, &relay, "rpc-1").await;
    let kept = raw_request_connection(&dir, &relay, "rpc-2").await;
    assert_eq!(load(&m.core.connections_open), 2);
    dir.certs.revoke("rpc-1").unwrap();
    assert_eq!(closed_with(&revoked.conn).await, code(ErrorCode::Revoked));
    assert_eq!(load(&m.revoked_sessions_total), 1);
    eventually(5, "one request connection left", || {
        load(&m.core.connections_open) == 1
    })
    .await;
    // The other client's connection goes on.
    assert_eq!(raw_request(&kept.conn, &get("/info")).await.status, 403);
    assert!(kept.conn.close_reason().is_none());
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_connections_end_with_shutting_down_when_the_relay_stops() {
    let dir = TestDir::new();
    let relay = relay_with(&dir, |_| {}).await;
    let raw = raw_request_connection(&dir, &relay, "rpc-1").await;
    let stopped = tokio::spawn(relay.stop());
    assert_eq!(closed_with(&raw.conn).await, code(ErrorCode::ShuttingDown));
    within(20, "the relay stops", stopped).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_stream_that_is_not_one_request_closes_the_connection() {
    let dir = TestDir::new();
    let relay = relay_with(&dir, |_| {}).await;
    let m = &relay.relay.metrics;
    let bad_streams: [Vec<u8>; 3] = [
        session_open(Start::Tip, 1).to_vec(),
        b"not a frame at all".to_vec(),
        {
            let mut two = Frame::CoreRequest(get("/info")).to_vec();
            two.extend_from_slice(&Frame::CoreRequest(get("/info")).to_vec());
            two
        },
    ];
    for (i, bytes) in bad_streams.into_iter().enumerate() {
        let raw = raw_request_connection(&dir, &relay, "rpc-1").await;
        let (mut send, _recv) = raw.conn.open_bi().await.unwrap();
        send.write_all(&bytes).await.unwrap();
        let _ = send.finish();
        assert_eq!(
            closed_with(&raw.conn).await,
            code(ErrorCode::ProtocolViolation),
            "stream {i}"
        );
        assert_eq!(load(&m.protocol_errors_total), i as u64 + 1);
    }
    relay.stop().await;
}

/// A request connection holds a place in the connection caps as a lane does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_connection_counts_against_its_identitys_connections() {
    let dir = TestDir::new();
    let mut config = dir.relay_config(&file_source());
    config.server.max_connections_per_identity = 1;
    let relay = Running::start(config).await;
    let held = raw_request_connection(&dir, &relay, "rpc-1").await;
    assert_eq!(load(&relay.relay.metrics.connections_open), 1);
    let second = raw_connect(&relay, tls_client(dir.certs.path(), "rpc-1")).await;
    assert_eq!(closed_with(&second.conn).await, code(ErrorCode::Overloaded));
    drop(held);
    relay.stop().await;
}
