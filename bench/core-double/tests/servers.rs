//! The double's HTTP servers: core's status, `Content-Type` and body on the wire, core's 400
//! for bodies its parser refuses, a delay (slow core) and stopped listeners (core down).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use ledger_relay_core_double::{answer, Servers};
use ledger_relay_wire::core_http::CorePort;

use crate::support::{account, form, query, testnet, FIRST};

const A: &str = "644f51e502775e0ec67b4922b8ded549649f50c3df4e38543abe1894f3be834d";

/// Sends `request` and reads the whole response (the server closes after it).
async fn exchange(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("the server closes after its answer")
        .unwrap();
    String::from_utf8(out).unwrap()
}

fn post(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Status line, headers (in order, lowercase names) and body.
fn split(resp: &str) -> (String, Vec<String>, String) {
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines.next().unwrap().to_owned();
    (
        status,
        lines.map(|l| l.to_lowercase()).collect(),
        body.to_owned(),
    )
}

async fn serve() -> (ledger_relay_core_double::CoreDouble, Servers) {
    let d = testnet(4);
    d.close_through(FIRST + 5);
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let s = Servers::start(d.clone(), Some(any), Some(any))
        .await
        .unwrap();
    (d, s)
}

#[tokio::test]
async fn answers_on_the_wire_are_the_doubles_answers() {
    let (d, s) = serve().await;
    let q = s.addr(CorePort::Query).unwrap();
    let body = form(&[&account(A)], Some(FIRST + 3));
    let want = query(&d, "/getledgerentry", &body);
    let (status, headers, got) = split(&exchange(q, &post("/getledgerentry", &body)).await);
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(got, want.text());
    assert!(
        headers.contains(&"content-type: application/json".to_owned()),
        "{headers:?}"
    );
    assert!(
        headers.contains(&format!("content-length: {}", got.len())),
        "{headers:?}"
    );
    assert!(
        !headers.iter().any(|h| h.starts_with("date:")),
        "{headers:?}"
    );
    let (status, _, got) =
        split(&exchange(q, &post("/getledgerentry", "key=AAAA&ledgerSeq=5")).await);
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    assert!(got.starts_with("exception: "), "{got}");
    let c = s.addr(CorePort::Command).unwrap();
    let info = exchange(c, "GET /info HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(split(&info).2.contains("\"num\" : 1410053"), "{info}");
    let get = exchange(q, "GET /getledgerentry HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(split(&get).2, answer::NO_KEY);
}

#[tokio::test]
async fn bodies_cores_parser_refuses_get_its_stock_400() {
    let (_d, s) = serve().await;
    let q = s.addr(CorePort::Query).unwrap();
    let requests = [
        "POST /getledgerentry HTTP/1.1\r\nHost: x\r\n\r\n".to_owned(),
        "POST /getledgerentry HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".to_owned(),
        "POST /getledgerentry HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nkey=A\r\n0\r\n\r\n".to_owned(),
        post("/getledgerentry", "key=AA\u{1}A"),
        post("/getledgerentry", "key=%G1"),
    ];
    for r in requests {
        let (status, _, body) = split(&exchange(q, &r).await);
        assert_eq!(
            (status.as_str(), body.as_str()),
            ("HTTP/1.1 400 Bad Request", answer::BAD_REQUEST),
            "{r:?}"
        );
    }
}

#[tokio::test]
async fn a_slow_double_answers_after_its_delay() {
    let (d, s) = serve().await;
    let c = s.addr(CorePort::Command).unwrap();
    d.set_delay(Duration::from_millis(400));
    let t = Instant::now();
    let info = exchange(c, "GET /info HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    assert!(info.starts_with("HTTP/1.1 200 OK"));
    d.set_delay(Duration::ZERO);
}

#[tokio::test]
async fn a_stopped_double_refuses_connections_until_it_resumes() {
    let (_d, mut s) = serve().await;
    let q = s.addr(CorePort::Query).unwrap();
    let c = s.addr(CorePort::Command).unwrap();
    // Refused as soon as stop returns.
    s.stop().await;
    for addr in [q, c] {
        let e = TcpStream::connect(addr).await.expect_err("nothing listens");
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
    }
    s.resume().await.unwrap();
    assert_eq!(
        (s.addr(CorePort::Query), s.addr(CorePort::Command)),
        (Some(q), Some(c))
    );
    let info = exchange(c, "GET /info HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(info.starts_with("HTTP/1.1 200 OK"), "{info}");
}
