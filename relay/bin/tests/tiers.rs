//! Fan-out trees and hedged subscriptions with real `ledger-relay` processes on loopback, fed
//! the real testnet ledgers: a hedged subscriber with two relays, one killed mid-stream; a root
//! relay feeding an edge relay (`--source relay:ADDR`) feeding a subscriber, the edge killed
//! with SIGKILL and restarted; an edge failing over between two roots; requests for
//! stellar-core forwarded from an edge to its root.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use ledger_relay_subscriber::core_http::{
    CoreClient, CoreClientConfig, CorePort, CoreRequest, CoreResponse, HttpMethod, Origin,
};
use ledger_relay_subscriber::{Credentials, Ledger};
use ledger_relay_wire::frame::Start;
use ledger_relay_wire::header::peek_header;
use ledger_relay_wire::Hex;

use crate::core_stand_in::{CorePortStandIn, Reply};
use crate::fake_relay::{FakeRelay, Plan};
use crate::process::{metric_at, metrics_addr, RelayProcess};
use crate::support::{
    file_source, free_port, from_first, http_get, local, sub_config, testnet_ledgers, Collector,
    TestDir, FIRST, LAST,
};

/// Asserts that `got` is consecutive from its first ledger and byte for byte the testnet
/// ledgers of those sequences: no gap, no duplicate, nothing altered.
fn assert_consecutive_identical(got: &[Ledger], want: &[Bytes]) {
    assert!(!got.is_empty());
    let first = got[0].seq;
    for (i, l) in got.iter().enumerate() {
        assert_eq!(l.seq, first + i as u32, "consecutive, once each");
        assert_eq!(
            l.data,
            want[(l.seq - FIRST) as usize],
            "ledger {} byte-identical",
            l.seq
        );
    }
}

/// A root relay replaying the testnet file at `cadence`, with its own data directory.
async fn root(dir: &TestDir, name: &str, cadence: &str) -> (RelayProcess, u16) {
    let port = free_port();
    let source = file_source();
    let args = ["--source", &source, "--cadence", cadence];
    let data = dir.path().join(name);
    (
        RelayProcess::start(dir.certs.path(), &data, port, &args).await,
        port,
    )
}

/// An edge relay subscribed to `upstreams` as client `edge`, on `port`, with its metrics on
/// `metrics`.
async fn edge(dir: &TestDir, upstreams: &[u16], port: u16, metrics: SocketAddr) -> RelayProcess {
    edge_with(dir, upstreams, port, metrics, &[]).await
}

/// [`edge`] with more flags.
async fn edge_with(
    dir: &TestDir,
    upstreams: &[u16],
    port: u16,
    metrics: SocketAddr,
    more: &[&str],
) -> RelayProcess {
    let source = format!(
        "relay:{}",
        upstreams
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let metrics = metrics.to_string();
    let mut args = vec![
        "--source",
        &source,
        "--upstream-name",
        "edge",
        "--upstream-lanes",
        "4",
        "--metrics",
        &metrics,
    ];
    args.extend_from_slice(more);
    RelayProcess::start(dir.certs.path(), &dir.path().join("edge"), port, &args).await
}

fn issue_edge(certs: &Path) {
    let dir = ledger_relay_certs::CertDir::open(certs).unwrap();
    dir.issue_client("edge", 30).unwrap();
}

/// Hedged: two relays on the same source, the one whose copies are winning killed with SIGKILL
/// mid-stream. Every ledger is written once, in order, byte for byte as the file (which is what
/// a single-relay run writes: `process.rs` and the relay tests assert that), and the delivery
/// gap at the kill is under two cadences: under one cadence more than the normal inter-arrival,
/// where failing over would first wait out the heartbeat timeout and reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "process tier (real relays killed, failed over or flooded): .ci/run runs it"]
async fn a_hedged_subscriber_loses_nothing_when_one_of_two_relays_is_killed() {
    const CADENCE_MS: u64 = 200;
    const N: u32 = 60;
    let dir = TestDir::new();
    let want = testnet_ledgers();
    let cadence = format!("{CADENCE_MS}ms");
    let ((a, a_port), (b, b_port)) =
        tokio::join!(root(&dir, "a", &cadence), root(&dir, "b", &cadence));
    let mut config = from_first(&dir, vec![local(a_port), local(b_port)]);
    config.hedge = true;
    let sub = Collector::start(config, FIRST + N - 1);
    sub.wait_for(25, 30).await;
    // Kill the relay whose copy won last: the survivor's copies were losing until now.
    let winner = sub
        .status()
        .relay
        .expect("a relay won the last ledger")
        .port();
    let (killed, survivor) = if winner == a_port { (a, b) } else { (b, a) };
    let killed_ns = ledger_relay::source::now_ns();
    killed.kill_9().await;
    let out = sub.finish(60).await;
    assert!(out.error.is_none(), "{:?}", out.error);
    assert_eq!(out.got.len(), N as usize, "every ledger, once");
    assert_eq!(out.got[0].seq, FIRST);
    assert_consecutive_identical(&out.got, &want);
    let after = out
        .got
        .iter()
        .position(|l| l.received_ns > killed_ns)
        .expect("ledgers after the kill");
    assert!(after > 0 && after < out.got.len() - 5, "killed mid-stream");
    assert!(
        out.got[after + 1..]
            .iter()
            .all(|l| l.relay.port() != winner),
        "after the kill every ledger comes from the survivor"
    );
    // The gaps spanning the kill (a copy of the killed relay may complete just after the
    // clock was read, before the signal lands).
    let gap_ms = (after..after + 3)
        .map(|i| (out.got[i].received_ns - out.got[i - 1].received_ns) as f64 / 1e6)
        .fold(0.0, f64::max);
    eprintln!("hedged: delivery gap at the kill {gap_ms:.1} ms (cadence {CADENCE_MS} ms)");
    assert!(
        gap_ms < 2.0 * CADENCE_MS as f64,
        "gap at the kill {gap_ms:.1} ms: more than a cadence ({CADENCE_MS} ms) over the normal"
    );
    // The first look: both relays won ledgers (the killed one before the kill, the survivor
    // after it), every ledger written counted once.
    let look = out.sub.first_look();
    let firsts: Vec<u64> = look.iter().map(|f| f.first).collect();
    assert_eq!(firsts.iter().sum::<u64>(), u64::from(N), "{look:?}");
    assert!(firsts.iter().all(|&n| n > 0), "{look:?}");
    out.sub.close().await;
    drop(survivor);
}

/// Root (the testnet file) -> edge (`--source relay:ROOT`) -> subscriber: byte-identical;
/// the edge killed with SIGKILL mid-stream and restarted on its data directory: the subscriber
/// (which resumes by itself) gets every ledger once; the edge shows its upstream in metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "process tier (real relays killed, failed over or flooded): .ci/run runs it"]
async fn an_edge_relay_re_serves_its_root_and_survives_sigkill() {
    let dir = TestDir::new();
    issue_edge(dir.certs.path());
    let want = testnet_ledgers();
    let (root, root_port) = root(&dir, "root", "30ms").await;
    let (edge_port, metrics) = (free_port(), metrics_addr());
    let e = edge(&dir, &[root_port], edge_port, metrics).await;
    let config = sub_config(
        vec![local(edge_port)],
        dir.certs.path(),
        "rpc-1",
        4,
        Start::Tip,
    );
    let sub = Collector::start(config, LAST);
    sub.wait_for(60, 60).await;
    let text = http_get(metrics, "/metrics").await;
    assert!(text.contains("ledger_relay_upstream_connected 1"), "{text}");
    assert!(text.contains("ledger_relay_upstream_lag_ledgers"), "{text}");
    e.kill_9().await;
    let at_kill = sub.len();
    let e2 = edge(&dir, &[root_port], edge_port, metrics).await;
    let out = sub.finish(90).await;
    assert!(out.error.is_none(), "{:?}", out.error);
    assert_eq!(out.got.last().unwrap().seq, LAST);
    assert_consecutive_identical(&out.got, &want);
    assert!(at_kill + 10 < out.got.len(), "killed mid-stream");
    assert!(
        out.sub.status().sessions >= 2,
        "the subscriber reconnected: {:?}",
        out.sub.status()
    );
    assert!(
        e2.log().contains("subscribing to the upstream relays"),
        "{}",
        e2.log()
    );
    out.sub.close().await;
    // The root gone: the edge says why in /healthz.
    root.kill_9().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = http_get(metrics, "/healthz").await;
        if text.contains(&format!(
            "upstream relays 127.0.0.1:{root_port} unreachable"
        )) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(e2);
}

/// Two roots on the same file; the edge subscribes to both in order of preference; the one it
/// is subscribed to is killed with SIGKILL mid-stream: the edge fails over to the other, and
/// its subscriber gets every ledger once, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "process tier (real relays killed, failed over or flooded): .ci/run runs it"]
async fn an_edge_relay_fails_over_to_a_second_root() {
    edge_fails_over(&[]).await;
}

/// [`an_edge_relay_fails_over_to_a_second_root`] with an edge that passes ledgers on as their
/// chunks arrive (`--cut-through`): it does pass bytes on before verification, and the kill
/// (which can cut a ledger the edge was passing on) loses and repeats nothing downstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "process tier (real relays killed, failed over or flooded): .ci/run runs it"]
async fn a_cut_through_edge_fails_over_losing_nothing() {
    let metrics = edge_fails_over(&["--cut-through"]).await;
    let early = metrics
        .lines()
        .find_map(|l| l.strip_prefix("ledger_relay_upstream_cut_through_bytes_total "))
        .and_then(|v| v.parse::<u64>().ok())
        .expect("the cut-through counter");
    assert!(early > 0, "bytes passed on before verification: {metrics}");
}

/// The failover scenario with `more` flags for the edge; returns the edge's metrics at the end.
async fn edge_fails_over(more: &[&str]) -> String {
    let dir = TestDir::new();
    issue_edge(dir.certs.path());
    let want = testnet_ledgers();
    let ((a, a_port), (b, b_port)) = tokio::join!(root(&dir, "a", "30ms"), root(&dir, "b", "30ms"));
    let (edge_port, metrics) = (free_port(), metrics_addr());
    let e = edge_with(&dir, &[a_port, b_port], edge_port, metrics, more).await;
    let config = sub_config(
        vec![local(edge_port)],
        dir.certs.path(),
        "rpc-1",
        4,
        Start::Tip,
    );
    let sub = Collector::start(config, LAST);
    sub.wait_for(60, 60).await;
    let opened = |log: &str, port: u16| {
        log.lines()
            .any(|l| l.contains("session open") && l.contains(&format!("127.0.0.1:{port}")))
    };
    assert!(
        opened(&e.log(), a_port),
        "the edge is on its first root: {}",
        e.log()
    );
    assert!(!opened(&e.log(), b_port), "{}", e.log());
    a.kill_9().await;
    let at_kill = sub.len();
    let out = sub.finish(90).await;
    assert!(out.error.is_none(), "{:?}", out.error);
    assert_eq!(out.got.last().unwrap().seq, LAST);
    assert_consecutive_identical(&out.got, &want);
    assert!(at_kill + 10 < out.got.len(), "killed mid-stream");
    assert!(
        opened(&e.log(), b_port),
        "the edge failed over: {}",
        e.log()
    );
    let text = http_get(metrics, "/metrics").await;
    assert!(text.contains("ledger_relay_upstream_connected 1"), "{text}");
    out.sub.close().await;
    drop((b, e));
    text
}

/// An edge whose first upstream lies about every ledger (each one comes as one raw chunk with
/// byte 100, inside its header, changed, then the true ledger's end record) and whose second
/// is healthy: the edge sets the liar aside and goes on from the healthy one, and its
/// subscriber gets all 320 ledgers once, byte for byte, within the bound; the healthy one
/// ending its first session at ledger 100 sends the edge back to it alone, not to the liar
/// while that is set aside. `more`: the edge's delivery mode.
async fn a_lying_upstream_is_set_aside(more: &[&str]) {
    a_liar_is_set_aside(
        Plan {
            forge: Some(100),
            ..Plan::new(testnet_ledgers())
        },
        more,
    )
    .await;
}

/// [`a_lying_upstream_is_set_aside`] with `liar` as the first upstream.
async fn a_liar_is_set_aside(liar: Plan, more: &[&str]) {
    let dir = TestDir::new();
    issue_edge(dir.certs.path());
    let want = testnet_ledgers();
    let certs = dir.certs.path();
    let liar = FakeRelay::start(liar, certs, certs);
    let healthy = FakeRelay::start(
        Plan {
            close_after: Some(100),
            ..Plan::new(want.clone())
        },
        certs,
        certs,
    );
    let (edge_port, metrics) = (free_port(), metrics_addr());
    let upstreams = [liar.addr.port(), healthy.addr.port()];
    let e = edge_with(&dir, &upstreams, edge_port, metrics, more).await;
    let config = sub_config(vec![local(edge_port)], certs, "rpc-1", 2, Start::Seq(FIRST));
    let out = Collector::start(config, LAST)
        .finish(LYING_UPSTREAM_BOUND_S)
        .await;
    assert!(out.error.is_none(), "{:?}\n{}", out.error, e.log());
    assert_eq!(
        out.got.len(),
        want.len(),
        "every ledger, once:\n{}",
        e.log()
    );
    assert_eq!(out.got[0].seq, FIRST);
    assert_consecutive_identical(&out.got, &want);
    assert_eq!(liar.record().opens.len(), 1, "asked once:\n{}", e.log());
    assert!(
        healthy.record().opens.len() >= 2,
        "the healthy one's session ended once"
    );
    assert_eq!(metric(metrics, "upstream_set_aside_total").await, 1);
    assert!(e.log().contains("upstream set aside"), "{}", e.log());
    out.sub.close().await;
}

/// How long the edge's subscriber may take for the 320 ledgers behind a lying upstream (about
/// 2 s on an idle machine; a tier stopped by the liar delivers nothing).
const LYING_UPSTREAM_BOUND_S: u64 = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_through_edge_sets_a_lying_upstream_aside_and_goes_on() {
    a_lying_upstream_is_set_aside(&["--cut-through"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_and_forward_edge_sets_a_lying_upstream_aside_and_goes_on() {
    a_lying_upstream_is_set_aside(&[]).await;
}

/// A cut-through edge reads a ledger's header before the ledger is whole: an upstream whose
/// ledger has a forged header and never ends (only heartbeats follow) is set aside on that
/// header alone, and the edge goes on from the healthy upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_through_edge_sets_aside_an_upstream_whose_forged_ledger_never_ends() {
    let liar = Plan {
        forge: Some(100),
        no_ends: true,
        ..Plan::new(testnet_ledgers()[..1].to_vec())
    };
    a_liar_is_set_aside(liar, &["--cut-through"]).await;
}

/// `--upstream-anchor SEQ:HASH`: an edge with an empty ring starts at ledger SEQ and keeps it
/// only if it has that hash. With a wrong hash it keeps nothing and says why in `/healthz`;
/// with the right one it holds the anchor's ledger and every one after it, byte for byte; and
/// a ring holding the anchor's ledger with another hash is not resumed (exit 2, saying so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_starts_at_its_upstream_anchor_and_refuses_a_wrong_one() {
    let dir = TestDir::new();
    issue_edge(dir.certs.path());
    let want = testnet_ledgers();
    let certs = dir.certs.path();
    let upstream = FakeRelay::start(Plan::new(want.clone()), certs, certs);
    let hash = |seq: u32| {
        let info = peek_header(&want[(seq - FIRST) as usize]).unwrap().unwrap();
        Hex(&info.hash).to_string()
    };
    let at = FIRST + 10;
    let (port, metrics) = (free_port(), metrics_addr());
    let up = [upstream.addr.port()];
    // The next ledger's hash given as ledger `at`'s.
    let wrong = format!("{at}:{}", hash(at + 1));
    let e = edge_with(&dir, &up, port, metrics, &["--upstream-anchor", &wrong]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = http_get(metrics, "/healthz").await;
        if text.contains("does not match the anchor") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{text}\n{}", e.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(metric(metrics, "ledgers_in_total").await, 0, "nothing kept");
    assert_eq!(metric(metrics, "upstream_set_aside_total").await, 1);
    e.sigterm().await;

    let right = format!("{at}:{}", hash(at));
    let e = edge_with(&dir, &up, port, metrics, &["--upstream-anchor", &right]).await;
    let config = sub_config(vec![local(port)], certs, "rpc-1", 2, Start::Seq(at));
    let out = Collector::start(config, LAST).finish(30).await;
    assert!(out.error.is_none(), "{:?}\n{}", out.error, e.log());
    assert_eq!(out.got[0].seq, at, "from the anchor");
    assert_eq!(out.got.len(), (LAST - at + 1) as usize);
    assert_consecutive_identical(&out.got, &want);
    out.sub.close().await;
    e.sigterm().await;

    // The ring holds `at..=LAST` now: an anchor that names another hash for one of them.
    let other = format!("{}:{}", at + 5, hash(at + 6));
    let source = format!("relay:127.0.0.1:{}", up[0]);
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_ledger-relay"))
        .arg("run")
        .args(["--listen", "127.0.0.1:0", "--certs"])
        .arg(certs)
        .arg("--data-dir")
        .arg(dir.path().join("edge"))
        .args(["--source", &source, "--upstream-name", "edge"])
        .args(["--upstream-anchor", &other])
        .env("RUST_LOG", "off")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the relay exits")
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--upstream-anchor") && err.contains(&format!("holds ledger {}", at + 5)),
        "{err}"
    );
}

/// The value of metric `ledger_relay_{name}` in a relay's `/metrics`, which must have it.
async fn metric(addr: SocketAddr, name: &str) -> u64 {
    let full = format!("ledger_relay_{name}");
    metric_at(addr, &full)
        .await
        .unwrap_or_else(|| panic!("no {full} at {addr}"))
}

/// A ledger damaged in the middle of an edge relay's ring, with no lake
/// configured, is fetched again from its root (by the edge's scrub, before anyone asks for it),
/// checked to be the ledger the ring recorded, written over the damaged copy and served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "process tier (real relays killed, failed over or flooded): .ci/run runs it"]
async fn an_edge_repairs_a_damaged_ring_ledger_from_its_root() {
    let dir = TestDir::new();
    issue_edge(dir.certs.path());
    let want = testnet_ledgers();
    let (root, root_port) = root(&dir, "root", "20ms").await;
    let (edge_port, metrics) = (free_port(), metrics_addr());
    let e = edge(&dir, &[root_port], edge_port, metrics).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while metric(metrics, "ring_newest").await < u64::from(LAST) {
        assert!(std::time::Instant::now() < deadline, "{}", e.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let oldest = metric(metrics, "ring_oldest").await as u32;
    assert!(oldest < LAST - 10, "the edge holds a run: {oldest}..{LAST}");
    let bad = (oldest + LAST) / 2;
    e.sigterm().await;
    crate::backfill::damage_ring(&dir.path().join("edge"), bad);
    let e2 = edge(&dir, &[root_port], edge_port, metrics).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while metric(metrics, "ring_repaired_total").await < 1 {
        assert!(std::time::Instant::now() < deadline, "{}", e2.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(metric(metrics, "ring_corrupt_total").await, 1);
    assert!(e2.log().contains("damaged ledger replaced"), "{}", e2.log());
    let config = sub_config(
        vec![local(edge_port)],
        dir.certs.path(),
        "rpc-1",
        2,
        Start::Seq(bad),
    );
    let sub = Collector::start(config, bad + 2);
    let out = sub.finish(60).await;
    assert!(out.error.is_none(), "{:?}", out.error);
    assert_eq!(out.got[0].seq, bad);
    assert_consecutive_identical(&out.got, &want);
    out.sub.close().await;
    drop((root, e2));
}

fn core_get(target: &str) -> CoreRequest {
    CoreRequest {
        version: 1,
        port: CorePort::Command,
        method: HttpMethod::Get,
        timeout_ms: 0,
        target: target.into(),
        content_type: String::new(),
        body: bytes::Bytes::new(),
    }
}

fn core_client(dir: &TestDir, port: u16) -> CoreClient {
    let credentials = Credentials::from_cert_dir(dir.certs.path(), "rpc-1").unwrap();
    CoreClient::new(CoreClientConfig::new(vec![local(port)], credentials)).unwrap()
}

async fn ask(client: &CoreClient, request: CoreRequest) -> CoreResponse {
    tokio::time::timeout(Duration::from_secs(15), client.request(request))
        .await
        .expect("an answer within 15 s")
        .expect("a response")
}

/// A root relay on the testnet file that forwards requests for core to `command` and
/// `query`, the query port for client rpc-1 only; its port.
async fn core_root(
    dir: &TestDir,
    command: &CorePortStandIn,
    query: &CorePortStandIn,
) -> (RelayProcess, u16) {
    let port = free_port();
    let (source, http, query_url) = (file_source(), command.url(), query.url());
    let args = [
        "--source",
        &source,
        "--cadence",
        "50ms",
        "--core-http",
        &http,
        "--core-query",
        &query_url,
        "--core-query-allow",
        "rpc-1",
    ];
    let data = dir.path().join("root");
    (
        RelayProcess::start(dir.certs.path(), &data, port, &args).await,
        port,
    )
}

fn core_post(target: &str, body: &'static [u8]) -> CoreRequest {
    CoreRequest {
        port: CorePort::Query,
        method: HttpMethod::Post,
        body: bytes::Bytes::from_static(body),
        ..core_get(target)
    }
}

/// Root (with `--core-http` and `--core-query` on stand-ins for core's ports) -> edge (no
/// `--core-*` of its own) -> a stand-in's `CoreClient`: the edge forwards requests for core to
/// its root with its `--upstream-name` certificate, and core's answer comes back byte for
/// byte; the root decides by the edge's identity (its allow-list names only rpc-1 for the
/// query port, so the edge is refused there, and says so); the edge refuses what is not
/// forwarded itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_relay_forwards_requests_for_core_to_its_root() {
    let dir = TestDir::new();
    issue_edge(dir.certs.path());
    let pending = "{\"status\":\"PENDING\"}\n";
    let command = CorePortStandIn::answering(Reply::json(pending)).await;
    let query = CorePortStandIn::answering(Reply::json("{}")).await;
    let (_root, root_port) = core_root(&dir, &command, &query).await;
    let edge_port = free_port();
    let e = edge(&dir, &[root_port], edge_port, metrics_addr()).await;
    let rpc = core_client(&dir, edge_port);

    let r = ask(&rpc, core_get("/tx?blob=AAAA%2BBB%3D")).await;
    let want = CoreResponse {
        status: 200,
        origin: Origin::Core,
        content_type: "application/json".into(),
        body: bytes::Bytes::from(pending),
    };
    assert_eq!(r, want, "core's answer through two relays");
    let sent = command.received();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].request_line(), "GET /tx?blob=AAAA%2BBB%3D HTTP/1.1");

    let r = ask(&rpc, core_post("/getledgerentry", b"key=AAAA&ledgerSeq=5")).await;
    assert_eq!((r.status, r.origin), (403, Origin::Relay), "{r:?}");
    let body = String::from_utf8_lossy(&r.body);
    assert!(
        body.contains("client edge may not"),
        "the root's answer: {body}"
    );
    assert!(query.received().is_empty());

    let r = ask(&rpc, core_get("/manualclose")).await;
    assert_eq!((r.status, r.origin), (403, Origin::Relay));
    assert_eq!(command.received().len(), 1, "never reached core");
    assert!(
        e.log()
            .contains("requests for stellar-core go to the upstream relays"),
        "{}",
        e.log()
    );
}

/// An edge with a core port of its own (`--core-http`) sends requests there, and forwards
/// nothing to its root, not even for the port it has not named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_relay_with_a_core_port_of_its_own_uses_it() {
    let dir = TestDir::new();
    issue_edge(dir.certs.path());
    let command = CorePortStandIn::answering(Reply::json("{\"root\":1}")).await;
    let query = CorePortStandIn::answering(Reply::json("{}")).await;
    let (_root, root_port) = core_root(&dir, &command, &query).await;
    let own = CorePortStandIn::answering(Reply::json("{\"own\":1}")).await;
    let (port, own_url) = (free_port(), own.url());
    let upstream = format!("relay:127.0.0.1:{root_port}");
    let args = [
        "--source",
        &upstream,
        "--upstream-name",
        "edge",
        "--core-http",
        &own_url,
    ];
    let _edge = RelayProcess::start(dir.certs.path(), &dir.path().join("own"), port, &args).await;
    let rpc = core_client(&dir, port);
    let r = ask(&rpc, core_get("/info")).await;
    assert_eq!((r.status, &r.body[..]), (200, &b"{\"own\":1}"[..]));
    let r = ask(&rpc, core_post("/getledgerentry", b"key=AAAA")).await;
    assert_eq!(
        (r.status, r.origin),
        (403, Origin::Relay),
        "no query port of its own"
    );
    assert_eq!(own.received().len(), 1);
    assert!(command.received().is_empty() && query.received().is_empty());
}
