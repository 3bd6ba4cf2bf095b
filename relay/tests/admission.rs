//! Who gets a connection or a session (issue "hardening", items 3 and 11): QUIC address
//! validation under a flood of Initial packets, caps per address and per identity besides the
//! global ones, the session cap checked and taken in one step, a bounded set of certificates
//! per session, no QUIC datagrams, and a start ahead of the relay that waits a bounded time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger_relay_transport::FrameIo;
use ledger_relay_wire::frame::{ErrorCode, Frame, SessionAccept, Start};
use quinn::ConnectionError;
use tokio_util::sync::CancellationToken;

use crate::support::{
    control, lane_join, load, raw_connect, session_open, take, tls_client, within, Raw, Running,
    TestDir, SYNTHETIC,
};

/// A relay on the endless synthetic source, a ledger every 20 ms, with `tweak` applied.
async fn relay(
    dir: &TestDir,
    tweak: impl FnOnce(&mut ledger_relay::config::RelayConfig),
) -> Running {
    let mut config = dir.relay_config(SYNTHETIC);
    config.source_options.cadence = Duration::from_millis(20);
    tweak(&mut config);
    let relay = Running::start(config).await;
    relay.wait_for(3).await;
    relay
}

/// What the relay answers a `SessionOpen` with: its `SessionAccept`, or the code it refused
/// with (an `Error` frame, or the connection's close code).
async fn open_session(
    raw: &Raw,
    start: Start,
    lanes: u8,
) -> (FrameIo, Result<SessionAccept, ErrorCode>) {
    let mut io = control(&raw.conn).await;
    io.writer.write(&session_open(start, lanes)).await.unwrap();
    let answer = match within(10, "answer to SessionOpen", io.reader.next()).await {
        Ok(Some(Frame::SessionAccept(a))) => Ok(a),
        Ok(Some(Frame::Error(e))) => Err(e.code),
        other => Err(closed_code(&raw.conn, &format!("{other:?}")).await),
    };
    (io, answer)
}

/// The application code the relay closed `conn` with.
async fn closed_code(conn: &quinn::Connection, context: &str) -> ErrorCode {
    match within(10, "close", conn.closed()).await {
        ConnectionError::ApplicationClosed(c) => {
            ErrorCode::from_close_code(c.error_code.into_inner())
                .unwrap_or_else(|| panic!("close code {} ({context})", c.error_code))
        }
        other => panic!("expected an application close ({context}), got {other:?}"),
    }
}

/// A QUIC Initial packet that opens a new handshake (a fresh connection id and ClientHello),
/// made by quinn's own protocol state machine and never followed up.
fn initial_packet(server: SocketAddr, client: &quinn::ClientConfig) -> Vec<u8> {
    let mut endpoint = quinn_proto::Endpoint::new(
        Arc::new(quinn_proto::EndpointConfig::default()),
        None,
        false,
        None,
    );
    let (_, mut conn) = endpoint
        .connect(Instant::now(), client.clone(), server, "127.0.0.1")
        .unwrap();
    let mut buf = Vec::new();
    let t = conn
        .poll_transmit(Instant::now(), 1, &mut buf)
        .expect("an Initial to send");
    buf.truncate(t.size);
    buf
}

/// Sends Initial packets to `server` from 32 UDP sockets that never read, one every 5 ms,
/// until `stop` (at most 60 s): handshakes that are begun and never finished, as a spoofing
/// attacker's would be. Returns how many were sent.
async fn flood_initials(
    server: SocketAddr,
    client: quinn::ClientConfig,
    stop: CancellationToken,
) -> usize {
    let mut sockets = Vec::new();
    for _ in 0..32 {
        sockets.push(tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    let mut sent = 0;
    while !stop.is_cancelled() && Instant::now() < deadline {
        tick.tick().await;
        let packet = initial_packet(server, &client);
        if sockets[sent % sockets.len()]
            .send_to(&packet, server)
            .await
            .is_ok()
        {
            sent += 1;
        }
    }
    sent
}

/// Item 3: handshakes that never finish (200 a second, from 32 source ports) do not keep a real
/// subscriber out: beyond 8 of them in progress, attempts get a QUIC Retry, which the flood
/// never answers and the subscriber does, and only validated addresses fill the 16 slots.
/// Before, each one held a slot for the whole handshake timeout, the flood kept all 16 full and
/// the subscriber was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_initials_does_not_keep_a_real_subscriber_out() {
    let dir = TestDir::new();
    let relay = relay(&dir, |c| {
        c.server.max_connections = 16;
        c.server.retry_threshold = 8;
        c.server.handshake_timeout = Duration::from_secs(10);
    })
    .await;
    let stop = CancellationToken::new();
    let flood = tokio::spawn(flood_initials(
        relay.relay.addr,
        tls_client(dir.certs.path(), "rpc-1"),
        stop.clone(),
    ));
    // The flood fills whatever it can first.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let honest = dir.sub(&relay, "rpc-1", 2, Start::Tip);
    let got = take(honest, 20, 30)
        .await
        .expect("the subscriber gets through");
    for w in got.windows(2) {
        assert_eq!(w[1].seq, w[0].seq + 1);
    }
    stop.cancel();
    let sent = flood.await.unwrap();
    assert!(sent >= 150, "only {sent} Initials sent");
    let m = &relay.relay.metrics;
    assert!(
        load(&m.retries_total) > 0,
        "attempts were asked to validate"
    );
    assert!(load(&m.handshakes_unvalidated) <= 8);
    relay.stop().await;
}

/// Item 11: the relay never reads QUIC datagrams, so it does not offer to buffer them: a peer
/// may not send any. Before, quinn's default let every peer fill a receive buffer that nothing
/// read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_accepts_no_quic_datagrams() {
    let dir = TestDir::new();
    let relay = relay(&dir, |_| {}).await;
    let raw = raw_connect(&relay, tls_client(dir.certs.path(), "rpc-1")).await;
    assert_eq!(
        raw.conn.max_datagram_size(),
        None,
        "the relay advertises no datagram support"
    );
    assert!(raw.conn.send_datagram(vec![0u8; 100].into()).is_err());
    drop(raw);
    relay.stop().await;
}

/// Item 11: a start ahead of the relay waits for the relay to get there, at most the start
/// wait, and is then refused with a retryable `Overloaded`; a start a few ledgers ahead goes
/// through. Before, a start far ahead was accepted at once and held a session slot until the
/// relay reached it (here: never).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_ahead_of_the_relay_waits_a_bounded_time() {
    let dir = TestDir::new();
    let relay = relay(&dir, |c| {
        c.server.session.start_wait = Some(Duration::from_secs(1));
    })
    .await;
    let raw = raw_connect(&relay, tls_client(dir.certs.path(), "rpc-1")).await;
    let newest = relay.relay.hub.tip().newest;
    let asked = Instant::now();
    let (_io, answer) = open_session(&raw, Start::Seq(newest + 1_000_000), 1).await;
    assert_eq!(answer.map(|a| a.first_seq), Err(ErrorCode::Overloaded));
    let took = asked.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(8),
        "refused after {took:?}"
    );
    // Ten ledgers ahead (200 ms at this cadence): served once the relay gets there.
    let raw = raw_connect(&relay, tls_client(dir.certs.path(), "rpc-1")).await;
    let near = relay.relay.hub.tip().newest + 10;
    let (_io, answer) = open_session(&raw, Start::Seq(near), 1).await;
    assert_eq!(answer.map(|a| a.first_seq), Ok(near));
    relay.stop().await;
}

/// Item 11: one identity cannot take every session: with a cap per identity (2) below the
/// global one (3), another identity still gets a session. Before, rpc-1 took all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_identity_cannot_take_every_session() {
    let dir = TestDir::new();
    dir.certs.issue_client("rpc-2", 30).unwrap();
    let relay = relay(&dir, |c| {
        c.server.max_sessions = 3;
        c.server.max_sessions_per_identity = 2;
    })
    .await;
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..3 {
        let raw = raw_connect(&relay, tls_client(dir.certs.path(), "rpc-1")).await;
        let (io, answer) = open_session(&raw, Start::Tip, 1).await;
        match answer {
            Ok(_) => held.push((raw, io)),
            Err(code) => {
                refused = Some(code);
                break;
            }
        }
    }
    assert_eq!(
        refused,
        Some(ErrorCode::Overloaded),
        "rpc-1 is held to its share"
    );
    let raw = raw_connect(&relay, tls_client(dir.certs.path(), "rpc-2")).await;
    let (_io, answer) = open_session(&raw, Start::Tip, 1).await;
    assert!(answer.is_ok(), "rpc-2 gets a session: {answer:?}");
    drop(held);
    relay.stop().await;
}

/// A connection to the relay as client `name`, or `None` if the relay refused it before or
/// during the handshake.
async fn try_connect(relay: &Running, dir: &TestDir, name: &str) -> Option<Raw> {
    let settings = ledger_relay_transport::TransportSettings::default();
    let socket =
        ledger_relay_transport::udp_socket("127.0.0.1:0".parse().unwrap(), &settings).unwrap();
    let endpoint = ledger_relay_transport::endpoint(socket, None, &settings).unwrap();
    let connecting = endpoint
        .connect_with(
            tls_client(dir.certs.path(), name),
            relay.relay.addr,
            "127.0.0.1",
        )
        .unwrap();
    let conn = within(10, "handshake", connecting).await.ok()?;
    Some(Raw {
        _endpoint: endpoint,
        conn,
    })
}

/// Whether the relay keeps an idle connection (a control stream, no frame yet): `Err` with
/// the code it refused it with.
async fn kept_idle(raw: &Raw) -> Result<FrameIo, ErrorCode> {
    let mut io = match within(5, "open_bi", raw.conn.open_bi()).await {
        Ok((send, recv)) => FrameIo::new(send, recv, ledger_relay_wire::Limits::default()),
        // Refused already.
        Err(e) => return Err(closed_code(&raw.conn, &format!("{e}")).await),
    };
    match tokio::time::timeout(Duration::from_millis(700), io.reader.next()).await {
        Err(_) => Ok(io),
        Ok(Ok(Some(Frame::Error(e)))) => Err(e.code),
        Ok(other) => Err(closed_code(&raw.conn, &format!("{other:?}")).await),
    }
}

/// Item 11: one identity cannot take every connection: with a cap per identity (3) below the
/// global one (5), another identity still connects. Before, rpc-1's idle connections took all
/// five.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_identity_cannot_take_every_connection() {
    let dir = TestDir::new();
    dir.certs.issue_client("rpc-2", 30).unwrap();
    let relay = relay(&dir, |c| {
        c.server.max_connections = 5;
        c.server.max_connections_per_identity = 3;
        c.server.first_frame_timeout = Duration::from_secs(10);
    })
    .await;
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..5 {
        let raw = try_connect(&relay, &dir, "rpc-1")
            .await
            .expect("a handshake");
        match kept_idle(&raw).await {
            Ok(io) => held.push((raw, io)),
            Err(code) => {
                refused = Some(code);
                break;
            }
        }
    }
    assert_eq!(
        refused,
        Some(ErrorCode::Overloaded),
        "rpc-1 is held to its share"
    );
    let raw = try_connect(&relay, &dir, "rpc-2")
        .await
        .expect("rpc-2 completes its handshake");
    let (_io, answer) = open_session(&raw, Start::Tip, 1).await;
    assert!(answer.is_ok(), "rpc-2 gets a session: {answer:?}");
    drop(held);
    relay.stop().await;
}

/// Item 11: many sessions opened at once never exceed the session cap (the count is checked
/// and taken in one step).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_session_opens_never_exceed_the_session_cap() {
    let dir = TestDir::new();
    let relay = relay(&dir, |c| {
        c.server.max_sessions = 2;
    })
    .await;
    let mut raws = Vec::new();
    for _ in 0..16 {
        let raw = raw_connect(&relay, tls_client(dir.certs.path(), "rpc-1")).await;
        let io = control(&raw.conn).await;
        raws.push((raw, io));
    }
    let answers = futures::future::join_all(raws.iter_mut().map(|(raw, io)| async move {
        io.writer.write(&session_open(Start::Tip, 1)).await.unwrap();
        match within(10, "answer", io.reader.next()).await {
            Ok(Some(Frame::SessionAccept(_))) => true,
            Ok(Some(Frame::Error(e))) => {
                assert_eq!(e.code, ErrorCode::Overloaded);
                false
            }
            other => {
                let code = closed_code(&raw.conn, &format!("{other:?}")).await;
                assert_eq!(code, ErrorCode::Overloaded);
                false
            }
        }
    }))
    .await;
    let accepted = answers.iter().filter(|a| **a).count();
    assert_eq!(accepted, 2, "{answers:?}");
    drop(raws);
    relay.stop().await;
}

/// Item 11: the certificates a session's lanes joined with (other than lane 0's) are kept to
/// revoke the session when any is revoked; they are kept once each and at most
/// `MAX_LANE_CERTIFICATES` of them, a lane with one more is refused. Before, every join with
/// another certificate added an entry, without bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_holds_a_bounded_number_of_lane_certificates() {
    use ledger_relay::MAX_LANE_CERTIFICATES;
    let dir = TestDir::new();
    let relay = relay(&dir, |_| {}).await;
    let lane0 = raw_connect(&relay, tls_client(dir.certs.path(), "rpc-1")).await;
    let (mut io, answer) = open_session(&lane0, Start::Tip, 2).await;
    let accept = answer.expect("a session");
    let mut refused_at = None;
    for i in 0..=MAX_LANE_CERTIFICATES {
        // A renewal: the same identity, a new certificate and serial.
        dir.certs.renew("rpc-1", 30).unwrap();
        let lane = raw_connect(&relay, tls_client(dir.certs.path(), "rpc-1")).await;
        let mut lio = control(&lane.conn).await;
        lio.writer
            .write(&lane_join(accept.session_id, accept.token, 1))
            .await
            .unwrap();
        match within(10, "answer to LaneJoin", lio.reader.next()).await {
            Ok(Some(Frame::LaneAccept(1))) => {}
            Ok(Some(Frame::Error(e))) => {
                assert_eq!(e.code, ErrorCode::Overloaded, "{e:?}");
                refused_at = Some(i);
                break;
            }
            other => panic!("join {i}: {other:?}"),
        }
    }
    assert_eq!(refused_at, Some(MAX_LANE_CERTIFICATES));
    // The session goes on.
    let alive = within(5, "a heartbeat", async {
        loop {
            match io.reader.next().await {
                Ok(Some(Frame::Heartbeat(_))) => return true,
                Ok(Some(_)) => continue,
                _ => return false,
            }
        }
    })
    .await;
    assert!(alive);
    relay.stop().await;
}

/// Item 3: one address cannot take every connection: once validated (here by completing its
/// handshake), a connection beyond `max_connections_per_address` is closed with `Overloaded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_connection() {
    let dir = TestDir::new();
    let relay = relay(&dir, |c| {
        c.server.max_connections_per_address = 3;
        c.server.first_frame_timeout = Duration::from_secs(10);
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let raw = try_connect(&relay, &dir, "rpc-1")
            .await
            .expect("a handshake");
        let io = kept_idle(&raw).await.expect("kept");
        held.push((raw, io));
    }
    // The fourth from 127.0.0.1: refused once its handshake proved the address, or before it
    // when it came validated.
    match try_connect(&relay, &dir, "rpc-1").await {
        None => {}
        Some(raw) => assert_eq!(
            closed_code(&raw.conn, "fourth").await,
            ErrorCode::Overloaded
        ),
    }
    drop(held);
    relay.stop().await;
}
