//! The relay's own certificate, renewed while a session streams: new handshakes get the new
//! certificate, the live session goes on without a reconnect, and a broken pair deployed after
//! it keeps the renewed one in force.

use std::time::Duration;

use ledger_relay_subscriber::Ledger;
use ledger_relay_wire::frame::Start;
use rustls::pki_types::CertificateDer;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::support::*;

/// The serial (big-endian, without leading zeros) of the certificate a new handshake with the
/// relay presents.
async fn served_serial(dir: &TestDir, relay: &Running) -> Vec<u8> {
    let raw = raw_connect(relay, tls_client(dir.certs.path(), "rpc-1")).await;
    let chain = raw
        .conn
        .peer_identity()
        .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok())
        .expect("the relay presented a certificate chain");
    let (_, leaf) = X509Certificate::from_der(chain[0].as_ref()).unwrap();
    raw.conn.close(0u32.into(), b"probe done");
    strip(leaf.raw_serial())
}

fn strip(serial: &[u8]) -> Vec<u8> {
    let first = serial.iter().position(|b| *b != 0).unwrap_or(serial.len());
    serial[first..].to_vec()
}

fn assert_contiguous(got: &[Ledger]) {
    for w in got.windows(2) {
        assert_eq!(w[1].seq, w[0].seq + 1, "ledgers in order, none missing");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_relay_certificate_is_served_to_new_handshakes_while_a_session_streams() {
    let dir = TestDir::new();
    let mut config = dir.relay_config(SYNTHETIC);
    config.source_options.cadence = Duration::from_millis(20);
    let relay = Running::start(config).await;
    relay.wait_for(3).await;
    let m = &relay.relay.metrics;

    let first = Collector::start(dir.sub(&relay, "rpc-1", 2, Start::Tip), u32::MAX);
    first.wait_for(10, 30).await;
    let old = served_serial(&dir, &relay).await;
    let before = ledger_relay_certs::load_certs(&dir.certs.cert_path("relay")).unwrap();
    let (_, leaf) = X509Certificate::from_der(before[0].as_ref()).unwrap();
    assert_eq!(
        old,
        strip(leaf.raw_serial()),
        "the certificate loaded at start"
    );

    // `ledger-certs renew DIR --name relay`, as the operator runs it.
    let renewed = dir.certs.renew("relay", 20).unwrap();
    let not_after = renewed.not_after.unix_timestamp() as u64;
    eventually(10, "the renewed certificate is in force", || {
        load(&m.certificate_reloads_total) == 1
            && load(&m.certificate_not_after_timestamp_seconds) == not_after
    })
    .await;
    let delivered_at_reload = first.len();
    assert_eq!(load(&m.certificate_errors_total), 0);

    // A new handshake sees the new certificate, and a new subscriber (which checks it against
    // the CA and the relay's address) gets ledgers.
    let new = served_serial(&dir, &relay).await;
    assert_eq!(
        new,
        strip(&renewed.serial),
        "new handshakes use the new certificate"
    );
    assert_ne!(new, old);
    let second = take(dir.sub(&relay, "rpc-1", 2, Start::Tip), 3, 30)
        .await
        .expect("a subscriber connecting after the renewal");
    assert_contiguous(&second);

    // The first session went on: more ledgers, no reconnect, none missing.
    first.wait_for(delivered_at_reload + 20, 30).await;
    assert_eq!(
        first.status().sessions,
        1,
        "the live session was not interrupted"
    );

    // A broken pair (a key of another certificate) deployed afterwards: refused, counted, and
    // the renewed certificate stays in force for new handshakes.
    dir.certs
        .issue_server("other", &["127.0.0.1".into()], 30)
        .unwrap();
    std::fs::copy(dir.certs.key_path("other"), dir.certs.key_path("relay")).unwrap();
    eventually(10, "the broken pair is reported", || {
        load(&m.certificate_errors_total) == 1
    })
    .await;
    assert_eq!(served_serial(&dir, &relay).await, new);
    assert_eq!(load(&m.certificate_reloads_total), 1);
    assert_eq!(load(&m.certificate_not_after_timestamp_seconds), not_after);

    let outcome = first.halt().await;
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert_contiguous(&outcome.got);
    assert_eq!(outcome.sub.status().sessions, 1);
    relay.stop().await;
}
