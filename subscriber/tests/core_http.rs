//! `CoreClient` over real QUIC on loopback against the fake relay answering `CoreRequest`s:
//! an answer, failover from a dead relay and from one that closes, a timeout, an oversized
//! answer, and many requests at once on one connection.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ledger_relay_subscriber::core_http::{
    CoreClient, CoreClientConfig, CoreClientError, CorePort, CoreRequest, HttpMethod, Origin,
};
use ledger_relay_subscriber::RelayAddr;

use crate::support::fake_relay::{CoreFake, FakeRelay, Plan};
use crate::support::{init_tracing, within, Pki};

fn relay_with(pki: &Pki, core: CoreFake) -> FakeRelay {
    let mut plan = Plan::new(Vec::new());
    plan.core = Some(core);
    FakeRelay::start(plan, pki.path(), pki.path())
}

fn client(pki: &Pki, relays: &[SocketAddr]) -> CoreClient {
    init_tracing();
    let relays = relays.iter().map(|a| RelayAddr::from(*a)).collect();
    let mut config = CoreClientConfig::new(relays, pki.credentials("rpc-1"));
    config.connect_timeout = Duration::from_millis(300);
    CoreClient::new(config).unwrap()
}

fn query(body: &str, timeout_ms: u32) -> CoreRequest {
    CoreRequest {
        version: 1,
        port: CorePort::Query,
        method: HttpMethod::Post,
        timeout_ms,
        target: "/getledgerentry".into(),
        content_type: "application/x-www-form-urlencoded".into(),
        body: Bytes::from(body.to_owned()),
    }
}

fn echoed(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body).expect("the echo is JSON")
}

/// A UDP address nothing answers on: a relay that is down.
fn dead_relay() -> SocketAddr {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap()
}

#[tokio::test]
async fn a_request_gets_the_relays_answer_verbatim() {
    let pki = Pki::new();
    let relay = relay_with(&pki, CoreFake::echo("a"));
    let client = client(&pki, &[relay.addr]);
    let req = query("key=AAAA%2B&ledgerSeq=7", 2000);
    let resp = within(10, client.request(req.clone())).await.unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.origin, Origin::Core);
    assert_eq!(resp.content_type, "application/json");
    let echo = echoed(&resp.body);
    assert_eq!(echo["target"], "/getledgerentry");
    assert_eq!(echo["body"], "key=AAAA%2B&ledgerSeq=7");
    assert_eq!(echo["port"], "query");
    assert_eq!(echo["method"], "POST");
    let seen = relay.record().core_requests;
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].body, req.body,
        "the body reaches the relay byte for byte"
    );
    // The relay is told how long is left, never more than the request's own timeout.
    assert!(
        seen[0].timeout_ms > 0 && seen[0].timeout_ms <= 2000,
        "{}",
        seen[0].timeout_ms
    );
    assert_eq!(client.connected_relay().await, Some(relay.addr));
}

#[tokio::test]
async fn a_dead_relay_is_passed_over_for_the_next() {
    let pki = Pki::new();
    let live = relay_with(&pki, CoreFake::echo("live"));
    let client = client(&pki, &[dead_relay(), live.addr]);
    let resp = within(10, client.request(query("key=AAAA", 3000)))
        .await
        .unwrap();
    assert_eq!(echoed(&resp.body)["relay"], "live");
    // The connection stays with the live relay: the next request does not try the dead one.
    assert_eq!(client.connected_relay().await, Some(live.addr));
    let started = Instant::now();
    let resp = within(10, client.request(query("key=BBBB", 3000)))
        .await
        .unwrap();
    assert_eq!(echoed(&resp.body)["body"], "key=BBBB");
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "no connect timeout waited out again: {:?}",
        started.elapsed()
    );
    assert_eq!(live.record().core_connections, 1);
}

#[tokio::test]
async fn a_relay_that_closes_the_connection_hands_over_to_the_next() {
    let pki = Pki::new();
    let mut closing = CoreFake::echo("first");
    closing.close_after = Some(1);
    let first = relay_with(&pki, closing);
    let second = relay_with(&pki, CoreFake::echo("second"));
    let client = client(&pki, &[first.addr, second.addr]);
    let resp = within(10, client.request(query("key=A", 3000)))
        .await
        .unwrap();
    assert_eq!(echoed(&resp.body)["relay"], "first");
    // The first relay closes after its answer; the next request goes to the second.
    let resp = within(10, client.request(query("key=B", 3000)))
        .await
        .unwrap();
    assert_eq!(echoed(&resp.body)["relay"], "second");
    assert_eq!(second.record().core_requests.len(), 1);
}

#[tokio::test]
async fn a_relay_lost_during_a_request_is_retried_on_the_next() {
    let pki = Pki::new();
    let mut slow = CoreFake::echo("slow");
    slow.delay = Duration::from_secs(30);
    let first = relay_with(&pki, slow);
    let second = relay_with(&pki, CoreFake::echo("second"));
    let client = client(&pki, &[first.addr, second.addr]);
    let pending = tokio::spawn({
        let client = client.clone();
        async move { client.request(query("key=A", 5000)).await }
    });
    // Once the first relay holds the request, it goes away.
    within(10, async {
        while first.record().core_requests.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    drop(first);
    let resp = within(10, pending).await.unwrap().unwrap();
    assert_eq!(echoed(&resp.body)["relay"], "second");
    assert_eq!(echoed(&resp.body)["body"], "key=A");
}

#[tokio::test]
async fn a_request_with_no_answer_times_out_within_its_timeout() {
    let pki = Pki::new();
    let mut slow = CoreFake::echo("slow");
    slow.delay = Duration::from_secs(30);
    let relay = relay_with(&pki, slow);
    let client = client(&pki, &[relay.addr]);
    let started = Instant::now();
    let e = within(10, client.request(query("key=A", 400)))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(e, CoreClientError::Timeout { relay: r, .. } if r == relay.addr),
        "{e}"
    );
    assert_eq!(e.http_status(), 504);
    assert!(took >= Duration::from_millis(400), "{took:?}");
    assert!(
        took < Duration::from_secs(3),
        "bounded by the timeout: {took:?}"
    );
}

#[tokio::test]
async fn no_relay_reachable_is_an_error_within_the_timeout() {
    let pki = Pki::new();
    let client = client(&pki, &[dead_relay(), dead_relay()]);
    let started = Instant::now();
    let e = within(10, client.request(query("key=A", 1000)))
        .await
        .unwrap_err();
    assert!(matches!(e, CoreClientError::Unreachable { .. }), "{e}");
    assert_eq!(e.http_status(), 503);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn an_oversized_answer_is_refused_without_reading_it_whole() {
    let pki = Pki::new();
    let mut big = CoreFake::echo("big");
    big.oversize = Some(256 << 10);
    let relay = relay_with(&pki, big);
    let relays = vec![RelayAddr::from(relay.addr)];
    let mut config = CoreClientConfig::new(relays, pki.credentials("rpc-1"));
    config.limits.max_core_response = 64 << 10;
    let client = CoreClient::new(config).unwrap();
    let e = within(10, client.request(query("key=A", 3000)))
        .await
        .unwrap_err();
    match e {
        CoreClientError::ResponseTooLarge { relay: r, limit } => {
            assert_eq!(r, relay.addr);
            assert_eq!(
                limit,
                5 + (64 << 10),
                "a frame header and max_core_response"
            );
        }
        other => panic!("{other}"),
    }
    // And a request over the limit is not sent at all.
    let e = within(10, client.request(query(&"k".repeat(2 << 20), 3000)))
        .await
        .unwrap_err();
    assert!(matches!(e, CoreClientError::RequestTooLarge { .. }), "{e}");
    // The limit is the frame body's, fixed fields included: a request that fits it is sent
    // (this relay answers it too large, so the answer is refused), one a byte over is not.
    let fixed = ledger_relay_wire::core_http::CORE_REQUEST_FIXED_LEN;
    let room =
        (1 << 20) - fixed - "/getledgerentry".len() - "application/x-www-form-urlencoded".len();
    let e = within(10, client.request(query(&"k".repeat(room), 3000)))
        .await
        .unwrap_err();
    assert!(matches!(e, CoreClientError::ResponseTooLarge { .. }), "{e}");
    let e = within(10, client.request(query(&"k".repeat(room + 1), 3000)))
        .await
        .unwrap_err();
    assert!(matches!(e, CoreClientError::RequestTooLarge { .. }), "{e}");
    assert_eq!(relay.record().core_requests.len(), 2);
}

#[tokio::test]
async fn concurrent_requests_share_one_connection_and_run_at_once() {
    let pki = Pki::new();
    let mut slow = CoreFake::echo("a");
    slow.delay = Duration::from_millis(300);
    let relay = relay_with(&pki, slow);
    let client = client(&pki, &[relay.addr]);
    let requests = (0..16).map(|i| {
        let client = client.clone();
        async move { (i, client.request(query(&format!("key={i}"), 5000)).await) }
    });
    let answers = within(20, futures::future::join_all(requests)).await;
    for (i, answer) in answers {
        let resp = answer.unwrap();
        assert_eq!(
            echoed(&resp.body)["body"],
            format!("key={i}"),
            "each answer is its own"
        );
    }
    let record = relay.record();
    assert_eq!(record.core_connections, 1, "one request connection");
    assert_eq!(record.core_requests.len(), 16);
    assert!(
        record.core_peak > 1,
        "requests overlapped: peak {}",
        record.core_peak
    );
}
