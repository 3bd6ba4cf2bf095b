//! Hostile peers with valid certificates (issue 7, item 6): malformed frames, oversize lengths,
//! unknown frame types, out-of-range requests, streams that never end, data streams the relay
//! never asked for, and many idle connections. Each connection is closed with a typed protocol
//! error, configured limits are enforced, and an honest subscriber streaming meanwhile is
//! unaffected.

use std::sync::atomic::Ordering;
use std::time::Duration;

use ledger_relay_transport::FrameIo;
use ledger_relay_wire::frame::{ErrorCode, Frame, Resend, Start};
use quinn::ConnectionError;

use crate::support::{
    certs, control, eventually, lane_join, raw_connect, relay_config, session_open, sub_config,
    take, tls_client, tls_client_with, within, Raw, Running,
};

/// An endless source of small valid ledgers.
const SYNTHETIC: &str = "synthetic:size=64KiB,ratio=2";

async fn relay(
    dir: &std::path::Path,
    tweak: impl FnOnce(&mut ledger_relay::config::RelayConfig),
) -> Running {
    let certs = certs(dir);
    let mut config = relay_config(certs.path(), &dir.join("data"), SYNTHETIC);
    config.source_options.cadence = Duration::from_millis(20);
    config.server.first_frame_timeout = Duration::from_secs(1);
    tweak(&mut config);
    Running::start(config).await
}

/// Reads the relay's Error frame (if it arrives) and the close code.
async fn refused(raw: &Raw, io: &mut FrameIo) -> ErrorCode {
    if let Ok(Ok(Some(Frame::Error(e)))) =
        tokio::time::timeout(Duration::from_secs(5), io.reader.next()).await
    {
        return e.code;
    }
    match within(5, "close", raw.conn.closed()).await {
        ConnectionError::ApplicationClosed(c) => {
            ErrorCode::from_close_code(c.error_code.into_inner()).expect("a typed close code")
        }
        other => panic!("expected a typed close, got {other:?}"),
    }
}

/// Sends `bytes` as the start of the control stream and expects a protocol violation.
async fn violation(relay: &Running, dir: &std::path::Path, bytes: &[u8]) {
    let raw = raw_connect(relay, tls_client(&dir.join("certs"), "rpc-1")).await;
    let mut io = control(&raw.conn).await;
    io.writer.stream_mut().write_all(bytes).await.unwrap();
    assert_eq!(
        refused(&raw, &mut io).await,
        ErrorCode::ProtocolViolation,
        "{bytes:02x?}"
    );
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_oversize_unknown_and_unfinished_frames_are_protocol_violations() {
    let dir = tempfile::tempdir().unwrap();
    let relay = relay(dir.path(), |_| {}).await;
    relay.wait_for(3).await;
    // An honest subscriber streams throughout.
    let honest = sub_config(
        vec![relay.addr()],
        &dir.path().join("certs"),
        "rpc-1",
        2,
        Start::Tip,
    );
    let honest = tokio::spawn(take(honest, 40, 30));
    let rss_before = rss_kib();

    // Unknown frame type.
    violation(&relay, dir.path(), &[0x7f, 0, 0, 0, 0]).await;
    // A chunk frame claiming 4 GiB: refused from its header, nothing buffered.
    violation(&relay, dir.path(), &[0x10, 0xff, 0xff, 0xff, 0xff]).await;
    // A control frame longer than the control limit.
    violation(&relay, dir.path(), &[0x21, 0x00, 0x10, 0x00, 0x00]).await;
    // A fixed-size frame with the wrong length.
    violation(&relay, dir.path(), &[0x01, 0, 0, 0, 3, 0, 1, 0]).await;
    // A well-formed frame that cannot open a lane.
    violation(&relay, dir.path(), &Frame::Ack(5).to_vec()).await;
    // SessionOpen with a bad field (zero lanes).
    let mut open = session_open(Start::Tip, 1).to_vec();
    open[12] = 0;
    violation(&relay, dir.path(), &open).await;
    // A stream that never finishes its first frame: closed after the first-frame timeout.
    let raw = raw_connect(&relay, tls_client(&dir.path().join("certs"), "rpc-1")).await;
    let mut io = control(&raw.conn).await;
    io.writer.stream_mut().write_all(&open[..7]).await.unwrap();
    assert_eq!(refused(&raw, &mut io).await, ErrorCode::ProtocolViolation);

    // Inside a session: an Ack for a ledger never sent, garbage mid-stream, and resend requests
    // for chunks that do not exist (ignored, not fatal).
    for bad in [Frame::Ack(u32::MAX - 1).to_vec(), vec![0x99, 1, 2, 3, 4, 5]] {
        let raw = raw_connect(&relay, tls_client(&dir.path().join("certs"), "rpc-1")).await;
        let mut io = control(&raw.conn).await;
        io.writer.write(&session_open(Start::Tip, 1)).await.unwrap();
        let Ok(Some(Frame::SessionAccept(a))) = within(5, "accept", io.reader.next()).await else {
            panic!("no session")
        };
        let resend = Frame::Resend(Resend {
            seq: a.first_seq,
            whole: false,
            indices: vec![9_999, 16_000],
        });
        io.writer.write(&resend).await.unwrap();
        io.writer.stream_mut().write_all(&bad).await.unwrap();
        // Heartbeats may come first; the session must end with a protocol violation.
        let code = within(5, "violation", async {
            loop {
                match io.reader.next().await {
                    Ok(Some(Frame::Error(e))) => return e.code,
                    Ok(Some(_)) => continue,
                    _ => break,
                }
            }
            match raw.conn.closed().await {
                ConnectionError::ApplicationClosed(c) => {
                    ErrorCode::from_close_code(c.error_code.into_inner()).unwrap()
                }
                other => panic!("{other:?}"),
            }
        })
        .await;
        assert_eq!(code, ErrorCode::ProtocolViolation);
    }

    // Data streams the relay never asked for are refused by flow control (no stream credit).
    let raw = raw_connect(&relay, tls_client(&dir.path().join("certs"), "rpc-1")).await;
    let uni = tokio::time::timeout(Duration::from_millis(500), raw.conn.open_uni()).await;
    assert!(uni.is_err(), "the relay grants no unidirectional streams");
    drop(raw);

    let got = honest.await.unwrap().unwrap();
    for w in got.windows(2) {
        assert_eq!(
            w[1].seq,
            w[0].seq + 1,
            "the honest subscriber is unaffected"
        );
    }
    let m = &relay.relay.metrics;
    assert!(m.protocol_errors_total.load(Ordering::Relaxed) >= 9);
    // What a hostile connection can make the relay hold is bounded by construction (one
    // 256 KiB control window, frame headers checked before bodies); the process RSS here also
    // counts every test running beside this one, so it is reported, not asserted.
    let grown = rss_kib().saturating_sub(rss_before);
    eprintln!("rss growth of the test process across the hostile connections: {grown} KiB");
    within(5, "hostile connections closed", async {
        while m.connections_open.load(Ordering::Relaxed) > 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_session_and_lane_limits_are_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let relay = relay(dir.path(), |c| {
        c.server.max_connections = 6;
        c.server.max_sessions = 2;
        c.server.max_lanes = 2;
        // Four idle connections and the one beyond the limit must all be opened before the
        // first idle one times out: 1 s was too short on a loaded 2-core CI machine (the 7th
        // connection was accepted because an idle one had already been closed).
        c.server.first_frame_timeout = Duration::from_secs(4);
    })
    .await;
    relay.wait_for(3).await;
    let certs = dir.path().join("certs");
    // Lanes: 4 asked, 2 granted.
    let a = raw_connect(&relay, tls_client(&certs, "rpc-1")).await;
    let mut aio = control(&a.conn).await;
    aio.writer
        .write(&session_open(Start::Tip, 4))
        .await
        .unwrap();
    let Ok(Some(Frame::SessionAccept(acc))) = within(5, "accept", aio.reader.next()).await else {
        panic!("no session")
    };
    assert_eq!(acc.lanes, 2, "max_lanes");
    // Sessions: a second is accepted, a third is Overloaded.
    let b = raw_connect(&relay, tls_client(&certs, "rpc-1")).await;
    let mut bio = control(&b.conn).await;
    bio.writer
        .write(&session_open(Start::Tip, 1))
        .await
        .unwrap();
    assert!(matches!(
        within(5, "accept", bio.reader.next()).await,
        Ok(Some(Frame::SessionAccept(_)))
    ));
    let c = raw_connect(&relay, tls_client(&certs, "rpc-1")).await;
    let mut cio = control(&c.conn).await;
    cio.writer
        .write(&session_open(Start::Tip, 1))
        .await
        .unwrap();
    assert_eq!(refused(&c, &mut cio).await, ErrorCode::Overloaded);
    drop(c);
    // The refused connection counts until the relay has finished closing it.
    let open = &relay.relay.metrics.connections_open;
    eventually(5, "the refused connection closed", || {
        open.load(Ordering::Relaxed) == 2
    })
    .await;
    // Connections: idle ones (no stream ever) fill the limit; beyond it, connections are refused
    // before the handshake; the idle ones are closed after the first-frame timeout.
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(raw_connect(&relay, tls_client(&certs, "rpc-1")).await);
    }
    // A client sees its handshake complete before the relay has checked its certificate and
    // counted the connection: until it does, a 7th attempt is admitted and the idle connection
    // refused instead (the cap holds either way). Wait for the relay's count.
    let m = &relay.relay.metrics;
    eventually(5, "the idle connections authenticated and counted", || {
        m.handshakes_pending.load(Ordering::Relaxed) == 0
            && m.connections_open.load(Ordering::Relaxed) == 6
    })
    .await;
    let settings = ledger_relay_transport::TransportSettings::default();
    let socket =
        ledger_relay_transport::udp_socket("127.0.0.1:0".parse().unwrap(), &settings).unwrap();
    let ep = ledger_relay_transport::endpoint(socket, None, &settings).unwrap();
    let over = ep
        .connect_with(tls_client(&certs, "rpc-1"), relay.relay.addr, "127.0.0.1")
        .unwrap();
    let r = tokio::time::timeout(Duration::from_secs(5), over).await;
    assert!(
        matches!(r, Ok(Err(_))),
        "the 7th connection is refused: {r:?}"
    );
    for raw in &idle {
        let closed = within(5, "idle closed", raw.conn.closed()).await;
        assert!(
            matches!(closed, ConnectionError::ApplicationClosed(_)),
            "{closed:?}"
        );
    }
    assert!(relay.relay.metrics.connections_open.load(Ordering::Relaxed) <= 6);
    drop((a, b));
    relay.stop().await;
}

/// Opens a one-lane session from `start` on a raw connection; returns it with its control
/// stream, after reading the `SessionAccept`.
async fn raw_session(relay: &Running, dir: &std::path::Path, start: u32) -> (Raw, FrameIo) {
    let raw = raw_connect(relay, tls_client(&dir.join("certs"), "rpc-1")).await;
    let mut io = control(&raw.conn).await;
    io.writer
        .write(&session_open(Start::Seq(start), 1))
        .await
        .unwrap();
    match within(10, "session accept", io.reader.next()).await {
        Ok(Some(Frame::SessionAccept(_))) => {}
        other => panic!("{other:?}"),
    }
    (raw, io)
}

/// Issue "hardening", item 1: a resend of a ledger the subscriber acknowledged is a protocol
/// violation (it already holds that ledger; asking again only makes the relay read its ring).
/// The relay honoured it before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_of_an_acknowledged_ledger_is_a_protocol_violation() {
    let dir = tempfile::tempdir().unwrap();
    let relay = relay(dir.path(), |_| {}).await;
    relay.wait_for(12).await;
    let start = relay.relay.ring.range().expect("the ring holds ledgers").0;
    let (raw, mut io) = raw_session(&relay, dir.path(), start).await;
    // Read the data streams until the end record of `start + 2` has arrived.
    let conn = raw.conn.clone();
    let ends = tokio::spawn(async move {
        let mut ends = Vec::new();
        while !ends.contains(&(start + 2)) {
            let mut s = conn.accept_uni().await.unwrap();
            let f = ledger_relay_transport::read_single_frame(
                &mut s,
                &ledger_relay_wire::Limits::default(),
            )
            .await
            .unwrap();
            if let Frame::LedgerEnd(e) = f {
                ends.push(e.seq);
            }
        }
        ends
    });
    within(20, "three ledgers", ends).await.unwrap();
    io.writer.write(&Frame::Ack(start + 2)).await.unwrap();
    let resend = Frame::Resend(Resend {
        seq: start + 1,
        whole: true,
        indices: vec![],
    });
    io.writer.write(&resend).await.unwrap();
    assert_eq!(refused(&raw, &mut io).await, ErrorCode::ProtocolViolation);
    eventually(5, "counted", || {
        relay
            .relay
            .metrics
            .protocol_errors_total
            .load(Ordering::Relaxed)
            >= 1
    })
    .await;
    relay.stop().await;
}

/// Issue "hardening", item 1: a subscriber that reads nothing and floods resends of the ledgers
/// in its window makes the relay read its ring at most at the rate limit, and queues no second
/// copy of anything already on its way. Before, every resend frame was a ring read of a whole
/// ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_flood_reads_the_ring_at_the_rate_limit_only() {
    let dir = tempfile::tempdir().unwrap();
    let relay = relay(dir.path(), |_| {}).await;
    relay.wait_for(40).await;
    let start = relay.relay.ring.range().expect("the ring holds ledgers").0;
    let (raw, mut io) = raw_session(&relay, dir.path(), start).await;
    // The session loads its window (8 ledgers) from the ring first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let m = &relay.relay.metrics;
    let reads_before = m.ring_reads_total.load(Ordering::Relaxed);
    let started = std::time::Instant::now();
    let frames = 5_000u32;
    for i in 0..frames {
        let r = Frame::Resend(Resend {
            seq: start + i % 8,
            whole: true,
            indices: vec![],
        });
        io.writer.write(&r).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let secs = started.elapsed().as_secs_f64();
    let reads = m.ring_reads_total.load(Ordering::Relaxed) - reads_before;
    // The limit: 32 loads a second, a burst of 32, plus the session's own catch-up reads.
    let allowed = 32.0 + 32.0 * secs + 16.0;
    assert!(
        (reads as f64) <= allowed,
        "{reads} ring reads for {frames} resends in {secs:.2} s (allowed {allowed:.0})"
    );
    assert!(raw.conn.close_reason().is_none(), "the session goes on");
    relay.stop().await;
}

/// Transport settings of a peer that gives the relay `bytes` of credit on its control stream
/// and no more (it never reads).
fn credit(bytes: u64) -> ledger_relay_transport::TransportSettings {
    ledger_relay_transport::TransportSettings {
        stream_receive_window: bytes,
        receive_window: bytes,
        ..Default::default()
    }
}

/// Issue "hardening", item 9: a subscriber that withholds flow-control credit on a control
/// stream, so that the relay cannot finish writing its `SessionAccept` (session A) or a lane's
/// `LaneAccept` (session B), is still ended at once when its certificate is revoked, with the
/// code `Revoked`. Every control write races the session's cancellation as well as its deadline
/// (four heartbeats: 12 s here). Before, both sessions ran on until the deadline, A ending
/// without a code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_peer_that_withholds_control_credit_is_ended_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let relay = relay(dir.path(), |c| {
        c.server.session.heartbeat = Duration::from_secs(3);
    })
    .await;
    relay.wait_for(3).await;
    let certs = dir.path().join("certs");
    // A: 16 bytes of credit, less than a SessionAccept.
    let a = raw_connect(&relay, tls_client_with(&certs, "rpc-1", &credit(16))).await;
    let mut aio = control(&a.conn).await;
    aio.writer
        .write(&session_open(Start::Tip, 1))
        .await
        .unwrap();
    // B: lane 0 reads its control stream; lane 1 gives 4 bytes, less than a LaneAccept.
    let b = raw_connect(&relay, tls_client(&certs, "rpc-1")).await;
    let mut bio = control(&b.conn).await;
    bio.writer
        .write(&session_open(Start::Tip, 2))
        .await
        .unwrap();
    let accept = match within(5, "session accept", bio.reader.next()).await {
        Ok(Some(Frame::SessionAccept(a))) => a,
        other => panic!("expected SessionAccept, got {other:?}"),
    };
    let b1 = raw_connect(&relay, tls_client_with(&certs, "rpc-1", &credit(4))).await;
    let mut b1io = control(&b1.conn).await;
    b1io.writer
        .write(&lane_join(accept.session_id, accept.token, 1))
        .await
        .unwrap();
    // Both writes are blocked now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(a.conn.close_reason().is_none() && b.conn.close_reason().is_none());
    let revoked = std::time::Instant::now();
    ledger_relay_certs::CertDir::open(&certs)
        .unwrap()
        .revoke("rpc-1")
        .unwrap();
    for (what, conn) in [
        ("session A (SessionAccept blocked)", &a.conn),
        ("session B (LaneAccept blocked)", &b.conn),
    ] {
        let closed = within(20, what, conn.closed()).await;
        let took = revoked.elapsed();
        let code = match &closed {
            ConnectionError::ApplicationClosed(c) => {
                ErrorCode::from_close_code(c.error_code.into_inner())
            }
            _ => None,
        };
        assert_eq!(code, Some(ErrorCode::Revoked), "{what}: {closed:?}");
        // The CRL is polled every 250 ms; the Error frame may wait 500 ms for credit.
        assert!(
            took < Duration::from_secs(4),
            "{what} ended {took:?} after the revocation"
        );
    }
    drop(b1);
    relay.stop().await;
}
