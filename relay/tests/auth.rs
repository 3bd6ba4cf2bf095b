//! Authorization against the real relay over loopback QUIC: every refusal
//! arrives as the right typed error, revocations end live sessions within a second while other
//! sessions continue, and an invalid CRL keeps the previous one in force.
//!
//! The subscriber library is used where it can be (its `SubscribeError::Unauthorized` reasons
//! are what the CLI reports with exit 3); raw quinn clients where the subscriber cannot be made
//! to misbehave (no client certificate, a stolen lane token).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use ledger_relay_certs::CertDir;
use ledger_relay_subscriber::{connect, AuthReason, SubscribeConfig, SubscribeError};
use ledger_relay_transport::{crypto_provider, read_single_frame, FrameIo};
use ledger_relay_wire::frame::{ErrorCode, ErrorFrame, Frame, Start};
use ledger_relay_wire::{Limits, ALPN};
use quinn::{ConnectionError, TransportErrorCode};
use tokio::sync::mpsc;

use crate::support::{
    control, eventually, file_source, in_the_ring, lane_join, load, raw_connect, session_open,
    sub_config, take, tls_client, within, Running, TestDir, FIRST, SYNTHETIC,
};

/// Replaces `path` with `bytes` atomically (as the operator guide says to deploy a CRL), so the
/// relay never reads half a file.
fn replace_file(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Subscribes with the library and expects an authorization failure as the first item, quickly,
/// and then the end of the stream (terminal: not retried).
async fn expect_unauthorized(relay: &Running, config: SubscribeConfig) -> AuthReason {
    let started = Instant::now();
    let mut sub = connect(config).unwrap();
    let first = within(10, "first item", sub.next()).await;
    let elapsed = started.elapsed();
    let e = match first {
        Some(Err(e)) if e.is_unauthorized() => e,
        other => panic!("expected an authorization failure, got {other:?}"),
    };
    eprintln!("refused in {elapsed:?}: {e}");
    let SubscribeError::Unauthorized {
        relay: name,
        reason,
        detail,
    } = e
    else {
        unreachable!()
    };
    assert_eq!(name, relay.addr().to_string());
    assert!(!detail.is_empty(), "no detail for {reason:?}");
    assert!(
        elapsed < Duration::from_secs(3),
        "refused only after {elapsed:?}"
    );
    assert!(
        within(5, "end of the stream", sub.next()).await.is_none(),
        "the subscription ends after an authorization failure"
    );
    reason
}

/// What a subscription running in the background reports: each ledger or the error, when.
type Event = (Instant, Result<u32, SubscribeError>);

/// Runs a subscription in the background; its channel closes when the subscription ends.
fn stream(config: SubscribeConfig) -> mpsc::UnboundedReceiver<Event> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut sub = connect(config).unwrap();
        while let Some(item) = sub.next().await {
            if tx.send((Instant::now(), item.map(|l| l.seq))).is_err() {
                break;
            }
        }
        sub.close().await;
    });
    rx
}

/// Waits for `n` ledgers received after `since` from a background subscription (skipping
/// older ones); anything but a ledger fails.
async fn ledgers_after(
    rx: &mut mpsc::UnboundedReceiver<Event>,
    n: usize,
    since: Instant,
    who: &str,
) {
    within(10, who, async {
        let mut got = 0;
        while got < n {
            match rx.recv().await {
                Some((at, Ok(_))) => got += usize::from(at > since),
                other => panic!("{who}: expected a ledger, got {other:?}"),
            }
        }
    })
    .await
}

/// Reads the relay's `Error` frame on a control stream.
async fn error_frame(io: &mut FrameIo) -> ErrorFrame {
    match within(5, "error frame", io.reader.next()).await {
        Ok(Some(Frame::Error(e))) => e,
        other => panic!("expected an Error frame, got {other:?}"),
    }
}

/// Waits for the relay to close `conn` with the application code of `code` (0x100 + code).
async fn closed_with(conn: &quinn::Connection, code: ErrorCode) {
    match within(5, "connection close", conn.closed()).await {
        ConnectionError::ApplicationClosed(c) => {
            assert_eq!(
                c.error_code.into_inner(),
                u64::from(code.close_code()),
                "close code (reason {:?})",
                String::from_utf8_lossy(&c.reason)
            );
        }
        other => panic!("expected an application close with {code:?}, got {other:?}"),
    }
}

/// Reads every data stream of a lane, reporting the sequence of each `LedgerEnd`.
fn drain_lane(conn: quinn::Connection, tx: mpsc::UnboundedSender<u32>) {
    tokio::spawn(async move {
        while let Ok(mut recv) = conn.accept_uni().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Ok(Frame::LedgerEnd(end)) =
                    read_single_frame(&mut recv, &Limits::default()).await
                {
                    let _ = tx.send(end.seq);
                }
            });
        }
    });
}

/// Acknowledges ledgers as their ends arrive (in order) until `upto` is acknowledged.
struct Acker {
    got: BTreeSet<u32>,
    acked: u32,
}

impl Acker {
    async fn until(
        &mut self,
        upto: u32,
        ends: &mut mpsc::UnboundedReceiver<u32>,
        io: &mut FrameIo,
    ) {
        within(10, "ledgers on the raw session", async {
            while self.acked < upto {
                let seq = ends.recv().await.expect("lanes alive");
                self.got.insert(seq);
                let before = self.acked;
                while self.got.remove(&(self.acked + 1)) {
                    self.acked += 1;
                }
                if self.acked > before {
                    io.writer.write(&Frame::Ack(self.acked)).await.unwrap();
                }
            }
        })
        .await
    }
}

/// A client without a certificate completes its TLS 1.3 handshake, then finds the connection
/// closed with the TLS alert `certificate_required` on its first stream operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_certificate_is_refused_with_a_tls_alert() {
    let dir = TestDir::new();
    let relay = dir.start(&file_source()).await;
    let mut roots = rustls::RootCertStore::empty();
    for ca in ledger_relay_certs::load_certs(&dir.certs.ca_path()).unwrap() {
        roots.add(ca).unwrap();
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let raw = raw_connect(&relay, quinn::ClientConfig::new(Arc::new(quic))).await;

    // The first stream operation fails: opening the stream (if the relay's alert has already
    // arrived), writing to it, or reading the answer.
    let failure: ConnectionError = within(5, "the relay's refusal", async {
        let (send, recv) = match raw.conn.open_bi().await {
            Ok(s) => s,
            Err(e) => return e,
        };
        let mut io = FrameIo::new(send, recv, Limits::default());
        let io_failure = match io.writer.write(&session_open(Start::Seq(FIRST), 1)).await {
            Err(e) => e,
            Ok(()) => match io.reader.next().await {
                Err(e) => e,
                Ok(frame) => panic!("a client without a certificate got an answer: {frame:?}"),
            },
        };
        io_failure
            .connection_error()
            .unwrap_or_else(|| panic!("not a connection error: {io_failure}"))
            .clone()
    })
    .await;
    match &failure {
        ConnectionError::ConnectionClosed(close) => {
            assert_eq!(
                close.error_code,
                TransportErrorCode::crypto(116),
                "expected the TLS alert certificate_required, got {close}"
            );
        }
        other => panic!("expected a TLS alert from the relay, got {other:?}"),
    }
    let m = &relay.relay.metrics;
    assert_eq!(load(&m.sessions_total), 0);
    assert_eq!(load(&m.sessions_open), 0);
    eventually(3, "the failed handshake counted", || {
        load(&m.handshakes_failed_total) == 1
    })
    .await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_from_another_ca_is_unknown_ca() {
    let dir = TestDir::new();
    let other = CertDir::init(&dir.path().join("other"), 365).unwrap();
    other.issue_client("rpc-1", 30).unwrap();
    let relay = dir.start(&file_source()).await;
    // Our certificate is from the other CA; we trust the relay's.
    let mut config = sub_config(
        vec![relay.addr()],
        other.path(),
        "rpc-1",
        2,
        Start::Seq(FIRST),
    );
    config.credentials.ca = ledger_relay_certs::load_certs(&dir.certs.ca_path()).unwrap();
    assert_eq!(
        expect_unauthorized(&relay, config).await,
        AuthReason::UnknownCa
    );
    assert_eq!(load(&relay.relay.metrics.sessions_total), 0);
    let m = &relay.relay.metrics;
    eventually(3, "the failed handshake counted", || {
        load(&m.handshakes_failed_total) >= 1
    })
    .await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_client_certificate_is_expired() {
    let dir = TestDir::new();
    let now = time::OffsetDateTime::now_utc();
    dir.certs
        .issue_client_with_validity(
            "old",
            now - time::Duration::days(10),
            now - time::Duration::days(1),
        )
        .unwrap();
    let relay = dir.start(&file_source()).await;
    let config = dir.sub(&relay, "old", 2, Start::Seq(FIRST));
    assert_eq!(
        expect_unauthorized(&relay, config).await,
        AuthReason::Expired
    );
    assert_eq!(load(&relay.relay.metrics.sessions_total), 0);
    let m = &relay.relay.metrics;
    eventually(3, "the failed handshake counted", || {
        load(&m.handshakes_failed_total) >= 1
    })
    .await;
    relay.stop().await;
}

/// Revoked before the relay started (the CRL it loads), and revoked while it runs but before
/// connecting (the reloaded CRL is what new connections are checked against).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_client_certificate_is_revoked() {
    let dir = TestDir::new();
    dir.certs.issue_client("rpc-2", 30).unwrap();
    dir.certs.issue_client("rpc-3", 30).unwrap();
    dir.certs.revoke("rpc-2").unwrap();
    let relay = dir.start(&file_source()).await;
    let config = dir.sub(&relay, "rpc-2", 2, Start::Seq(FIRST));
    assert_eq!(
        expect_unauthorized(&relay, config).await,
        AuthReason::Revoked
    );

    dir.certs.revoke("rpc-3").unwrap();
    let m = &relay.relay.metrics;
    eventually(3, "crl reloaded", || load(&m.crl_reloads_total) == 1).await;
    let config = dir.sub(&relay, "rpc-3", 2, Start::Seq(FIRST));
    assert_eq!(
        expect_unauthorized(&relay, config).await,
        AuthReason::Revoked
    );
    // Others are unaffected.
    in_the_ring(&relay).await;
    take(dir.sub(&relay, "rpc-1", 2, Start::Seq(FIRST)), 2, 20)
        .await
        .unwrap();
    assert_eq!(load(&m.sessions_total), 1);
    assert_eq!(load(&m.crl_errors_total), 0);
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_not_on_the_allow_list_is_not_allowed() {
    let dir = TestDir::new();
    dir.certs.issue_client("rpc-2", 30).unwrap();
    let mut config = dir.relay_config(&file_source());
    config.allow = vec!["rpc-2".into()];
    let relay = Running::start(config).await;
    let config = dir.sub(&relay, "rpc-1", 2, Start::Seq(FIRST));
    assert_eq!(
        expect_unauthorized(&relay, config).await,
        AuthReason::NotAllowed
    );
    // Not retried: one refusal only.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let m = &relay.relay.metrics;
    assert_eq!(load(&m.sessions_refused_total), 1);
    assert_eq!(load(&m.sessions_total), 0);
    in_the_ring(&relay).await;
    let got = take(dir.sub(&relay, "rpc-2", 2, Start::Seq(FIRST)), 3, 20)
        .await
        .unwrap();
    assert_eq!(got[0].seq, FIRST);
    assert_eq!(load(&m.sessions_total), 1);
    relay.stop().await;
}

/// A lane that quotes a live session's id and token but presents another identity is refused
/// with `Unauthorized`, as is a wrong token and an unknown session; the session itself goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_with_a_stolen_token_and_another_identity_is_refused() {
    let dir = TestDir::new();
    dir.certs.issue_client("rpc-2", 30).unwrap();
    let relay = dir.start(&file_source()).await;
    let m = &relay.relay.metrics;
    // The whole file in the ring before the session replays it (see `in_the_ring`).
    in_the_ring(&relay).await;

    // rpc-1 opens a session with two lanes, reads lane 0's data and acknowledges it.
    let lane0 = raw_connect(&relay, tls_client(dir.certs.path(), "rpc-1")).await;
    let mut io = control(&lane0.conn).await;
    io.writer
        .write(&session_open(Start::Seq(FIRST), 2))
        .await
        .unwrap();
    let accept = match within(10, "session accept", io.reader.next()).await {
        Ok(Some(Frame::SessionAccept(a))) => a,
        other => panic!("expected SessionAccept, got {other:?}"),
    };
    assert_eq!(accept.lanes, 2);
    let (ends_tx, mut ends) = mpsc::unbounded_channel();
    drain_lane(lane0.conn.clone(), ends_tx.clone());
    let mut acker = Acker {
        got: BTreeSet::new(),
        acked: FIRST - 1,
    };
    acker.until(FIRST + 2, &mut ends, &mut io).await;

    // rpc-2 with the stolen id and token.
    let thief = raw_connect(&relay, tls_client(dir.certs.path(), "rpc-2")).await;
    let mut tio = control(&thief.conn).await;
    tio.writer
        .write(&lane_join(accept.session_id, accept.token, 1))
        .await
        .unwrap();
    let e = error_frame(&mut tio).await;
    assert_eq!(e.code, ErrorCode::Unauthorized, "{e:?}");
    assert!(
        e.message.contains("rpc-2") && e.message.contains("rpc-1"),
        "{}",
        e.message
    );
    closed_with(&thief.conn, ErrorCode::Unauthorized).await;

    // rpc-1 itself with a wrong token, and with an unknown session.
    let mut wrong = accept.token;
    wrong[0] ^= 1;
    for (id, token, what) in [
        (accept.session_id, wrong, "wrong session token"),
        (accept.session_id ^ 1, accept.token, "no such session"),
    ] {
        let lane = raw_connect(&relay, tls_client(dir.certs.path(), "rpc-1")).await;
        let mut lio = control(&lane.conn).await;
        lio.writer.write(&lane_join(id, token, 1)).await.unwrap();
        let e = error_frame(&mut lio).await;
        assert_eq!(e.code, ErrorCode::Unauthorized, "{e:?}");
        assert_eq!(e.message, what);
        closed_with(&lane.conn, ErrorCode::Unauthorized).await;
    }
    assert_eq!(load(&m.sessions_refused_total), 3);

    // The session is unaffected: lane 1 still joins with the right token and identity, and
    // ledgers keep coming.
    let lane1 = raw_connect(&relay, tls_client(dir.certs.path(), "rpc-1")).await;
    let mut lio = control(&lane1.conn).await;
    lio.writer
        .write(&lane_join(accept.session_id, accept.token, 1))
        .await
        .unwrap();
    match within(5, "lane accept", lio.reader.next()).await {
        Ok(Some(Frame::LaneAccept(1))) => {}
        other => panic!("expected LaneAccept(1), got {other:?}"),
    }
    drain_lane(lane1.conn.clone(), ends_tx);
    let before = acker.acked;
    acker.until(before + 20, &mut ends, &mut io).await;
    assert_eq!(load(&m.sessions_open), 1);
    assert_eq!(load(&m.lanes_open), 2);
    assert!(lane0.conn.close_reason().is_none(), "lane 0 still open");
    lane0.conn.close(0u32.into(), b"done");
    lane1.conn.close(0u32.into(), b"done");
    relay.stop().await;
}

/// A lane may join with another certificate of the session's name (an operator's own CA can
/// issue two at once); revoking that certificate, not lane 0's, ends the session with
/// `Revoked`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_the_certificate_of_a_later_lane_ends_the_session() {
    let dir = TestDir::new();
    // rpc-2's first certificate (A), kept aside with the CA; the CRL before and after A is
    // revoked; then a second certificate of the same name (B), as a renewal would give.
    dir.certs.issue_client("rpc-2", 30).unwrap();
    let old = dir.path().join("old");
    std::fs::create_dir_all(&old).unwrap();
    for (from, to) in [
        (dir.certs.ca_path(), old.join("ca.pem")),
        (dir.certs.cert_path("rpc-2"), old.join("rpc-2.pem")),
        (dir.certs.key_path("rpc-2"), old.join("rpc-2.key")),
    ] {
        std::fs::copy(from, to).unwrap();
    }
    let crl_without_a = std::fs::read(dir.certs.crl_path()).unwrap();
    dir.certs.revoke("rpc-2").unwrap();
    let crl_with_a = std::fs::read(dir.certs.crl_path()).unwrap();
    dir.certs.issue_client("rpc-2", 30).unwrap();
    replace_file(&dir.certs.crl_path(), &crl_without_a);
    let relay = dir.start(&file_source()).await;
    let m = &relay.relay.metrics;
    in_the_ring(&relay).await;

    // Lane 0 with B, lane 1 with A.
    let lane0 = raw_connect(&relay, tls_client(dir.certs.path(), "rpc-2")).await;
    let mut io = control(&lane0.conn).await;
    io.writer
        .write(&session_open(Start::Seq(FIRST), 2))
        .await
        .unwrap();
    let accept = match within(10, "session accept", io.reader.next()).await {
        Ok(Some(Frame::SessionAccept(a))) => a,
        other => panic!("expected SessionAccept, got {other:?}"),
    };
    let (ends_tx, mut ends) = mpsc::unbounded_channel();
    drain_lane(lane0.conn.clone(), ends_tx.clone());
    let lane1 = raw_connect(&relay, tls_client(&old, "rpc-2")).await;
    let mut lio = control(&lane1.conn).await;
    lio.writer
        .write(&lane_join(accept.session_id, accept.token, 1))
        .await
        .unwrap();
    match within(5, "lane accept", lio.reader.next()).await {
        Ok(Some(Frame::LaneAccept(1))) => {}
        other => panic!("expected LaneAccept(1) for A, got {other:?}"),
    }
    drain_lane(lane1.conn.clone(), ends_tx);
    let mut acker = Acker {
        got: BTreeSet::new(),
        acked: FIRST - 1,
    };
    acker.until(FIRST + 4, &mut ends, &mut io).await;
    assert_eq!(load(&m.lanes_open), 2);

    // Revoke A only: the session ends with Revoked on lane 0's control stream.
    replace_file(&dir.certs.crl_path(), &crl_with_a);
    eventually(3, "crl reloaded", || load(&m.crl_reloads_total) == 1).await;
    let e = within(5, "the session's Error frame", async {
        loop {
            match io.reader.next().await {
                Ok(Some(Frame::Error(e))) => break e,
                Ok(Some(_)) => continue,
                other => panic!("expected an Error frame, got {other:?}"),
            }
        }
    })
    .await;
    assert_eq!(e.code, ErrorCode::Revoked, "{e:?}");
    assert!(e.message.contains("rpc-2"), "{}", e.message);
    assert_eq!(load(&m.revoked_sessions_total), 1);
    eventually(5, "session closed", || load(&m.sessions_open) == 0).await;
    relay.stop().await;
}

/// The subscriber checks the relay's certificate: for another name, or from another CA, it is
/// refused at once and not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_certificate_for_another_name_is_refused() {
    let dir = TestDir::new();
    let relay = dir.start(&file_source()).await;
    let mut config = dir.sub(&relay, "rpc-1", 2, Start::Seq(FIRST));
    config.server_name = Some("not-the-relay.example".into());
    assert_eq!(
        expect_unauthorized(&relay, config).await,
        AuthReason::RelayCertificate
    );

    let other = CertDir::init(&dir.path().join("other"), 365).unwrap();
    other.issue_client("rpc-1", 30).unwrap();
    let config = sub_config(
        vec![relay.addr()],
        other.path(),
        "rpc-1",
        2,
        Start::Seq(FIRST),
    );
    assert_eq!(
        expect_unauthorized(&relay, config).await,
        AuthReason::RelayCertificate
    );
    assert_eq!(load(&relay.relay.metrics.sessions_total), 0);
    relay.stop().await;
}

/// A revocation written while two sessions stream ends the revoked one with `Revoked` within a
/// second; the other keeps receiving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_while_streaming_ends_that_session_within_a_second() {
    let dir = TestDir::new();
    dir.certs.issue_client("rpc-2", 30).unwrap();
    let mut config = dir.relay_config(SYNTHETIC);
    config.source_options.cadence = Duration::from_millis(20);
    let relay = Running::start(config).await;
    relay.wait_for(3).await;
    let mut one = stream(dir.sub(&relay, "rpc-1", 2, Start::Tip));
    let mut two = stream(dir.sub(&relay, "rpc-2", 2, Start::Tip));
    let t = Instant::now();
    ledgers_after(&mut one, 3, t, "rpc-1").await;
    ledgers_after(&mut two, 3, t, "rpc-2").await;

    dir.certs.revoke("rpc-1").unwrap();
    let revoked = Instant::now();
    let ended = within(5, "rpc-1 ends", async {
        loop {
            match one.recv().await {
                Some((_, Ok(_))) => continue,
                Some((at, Err(e))) => return (at, e),
                None => panic!("rpc-1 ended without an error"),
            }
        }
    })
    .await;
    let took = ended.0 - revoked;
    eprintln!("revocation ended the live session {took:?} after crl.pem was written");
    match ended.1 {
        SubscribeError::Unauthorized {
            reason: AuthReason::Revoked,
            ..
        } => {}
        other => panic!("expected Unauthorized/Revoked, got {other:?}"),
    }
    // Within a second (the CRL is polled every 250 ms); some slack for a loaded machine.
    assert!(took < Duration::from_millis(1500), "took {took:?}");
    assert!(
        within(5, "rpc-1 stream end", one.recv()).await.is_none(),
        "rpc-1 is not retried"
    );

    // rpc-2 goes on: ledgers arrive after rpc-1 ended.
    ledgers_after(&mut two, 5, ended.0, "rpc-2 after the revocation").await;
    let m = &relay.relay.metrics;
    assert_eq!(load(&m.revoked_sessions_total), 1);
    assert!(load(&m.crl_reloads_total) >= 1);
    assert_eq!(load(&m.crl_errors_total), 0);
    assert_eq!(load(&m.sessions_open), 1);
    drop(two);
    relay.stop().await;
}

/// A session still waiting for its first ledger when its certificate is revoked is refused
/// with `Revoked`, not with the `ShuttingDown` of an interrupted wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_while_waiting_for_the_first_ledger_is_revoked() {
    let dir = TestDir::new();
    // A source that never sends a ledger: a session from the tip waits.
    let relay = dir.start("pipe:sleep 30").await;
    let raw = raw_connect(&relay, tls_client(dir.certs.path(), "rpc-1")).await;
    let mut io = control(&raw.conn).await;
    io.writer.write(&session_open(Start::Tip, 1)).await.unwrap();
    let m = &relay.relay.metrics;
    // The session is registered (and so revocable) once the watcher could see it; give the
    // relay a moment to read SessionOpen.
    tokio::time::sleep(Duration::from_millis(300)).await;
    dir.certs.revoke("rpc-1").unwrap();
    let e = error_frame(&mut io).await;
    assert_eq!(e.code, ErrorCode::Revoked, "{e:?}");
    closed_with(&raw.conn, ErrorCode::Revoked).await;
    // Ended by the CRL watcher, or (had the reload come before the session was registered)
    // refused by the check after registration: either way once, as Revoked.
    assert_eq!(
        load(&m.revoked_sessions_total) + load(&m.sessions_refused_total),
        1
    );
    assert_eq!(load(&m.sessions_total), 0);
    relay.stop().await;
}

/// Garbage, a CRL of another CA, and a removed file each leave the CRL in force: each is
/// counted once in `crl_errors_total`, live sessions go on, a revoked certificate stays refused.
/// A valid CRL written afterwards is loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_crl_keeps_the_previous_one_in_force() {
    let dir = TestDir::new();
    dir.certs.issue_client("rpc-3", 30).unwrap();
    dir.certs.issue_client("rpc-4", 30).unwrap();
    dir.certs.revoke("rpc-3").unwrap();
    let mut config = dir.relay_config(SYNTHETIC);
    config.source_options.cadence = Duration::from_millis(20);
    let relay = Running::start(config).await;
    relay.wait_for(3).await;
    let m = &relay.relay.metrics;
    let mut one = stream(dir.sub(&relay, "rpc-1", 2, Start::Tip));
    ledgers_after(&mut one, 2, Instant::now(), "rpc-1").await;

    // A CRL from another CA that revokes nothing of ours: were it accepted, rpc-3 would be let in.
    let other = CertDir::init(&dir.path().join("other"), 365).unwrap();
    other.issue_client("x", 30).unwrap();
    other.revoke("x").unwrap();
    let foreign = std::fs::read(other.crl_path()).unwrap();
    let crl = dir.certs.crl_path();

    for (i, bad) in [
        Some(b"not a crl at all\n".to_vec()),
        Some(foreign),
        None, // the file removed
    ]
    .into_iter()
    .enumerate()
    {
        let errors = i as u64 + 1;
        match &bad {
            Some(bytes) => replace_file(&crl, bytes),
            None => std::fs::remove_file(&crl).unwrap(),
        }
        eventually(3, "crl error counted", || {
            load(&m.crl_errors_total) == errors
        })
        .await;
        let counted = Instant::now();
        // rpc-1 streams on; several polls later the bad file is still counted (and logged) once.
        ledgers_after(&mut one, 3, counted, "rpc-1 with an invalid crl").await;
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(
            load(&m.crl_errors_total),
            errors,
            "counted once per bad file"
        );
        // The subscriber checks the relay against a crl.pem of its own directory when there is
        // one, and refuses a broken one: it is given its files without the relay's CRL.
        let config = sub_config(
            vec![relay.addr()],
            &client_files(&dir, "rpc-3"),
            "rpc-3",
            1,
            Start::Tip,
        );
        assert_eq!(
            expect_unauthorized(&relay, config).await,
            AuthReason::Revoked
        );
    }
    assert_eq!(load(&m.crl_reloads_total), 0);
    assert_eq!(load(&m.revoked_sessions_total), 0);

    // A valid CRL again (revoking rpc-4) is loaded; rpc-3 is still revoked.
    dir.certs.revoke("rpc-4").unwrap();
    eventually(3, "crl reloaded", || load(&m.crl_reloads_total) == 1).await;
    assert_eq!(load(&m.crl_errors_total), 3);
    for name in ["rpc-3", "rpc-4"] {
        let config = dir.sub(&relay, name, 1, Start::Tip);
        assert_eq!(
            expect_unauthorized(&relay, config).await,
            AuthReason::Revoked,
            "{name}"
        );
    }
    ledgers_after(&mut one, 3, Instant::now(), "rpc-1 after the valid crl").await;
    assert_eq!(load(&m.revoked_sessions_total), 0);
    drop(one);
    relay.stop().await;
}

/// A directory with only the CA and `name`'s certificate and key, copied from the test's
/// certificate directory (so without its `crl.pem`).
fn client_files(dir: &TestDir, name: &str) -> std::path::PathBuf {
    let out = dir.path().join(format!("client-{name}"));
    std::fs::create_dir_all(&out).unwrap();
    for file in [
        "ca.pem".to_string(),
        format!("{name}.pem"),
        format!("{name}.key"),
    ] {
        std::fs::copy(dir.certs.path().join(&file), out.join(&file)).unwrap();
    }
    out
}
