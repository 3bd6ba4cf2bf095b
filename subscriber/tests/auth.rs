//! Authorization failures: typed, quick, and not retried. In TLS 1.3 a relay that refuses our
//! certificate does so after our handshake completed; the failure shows on the first stream.

use std::time::Duration;

use futures::StreamExt;
use ledger_relay_certs::CertDir;
use ledger_relay_subscriber::frame::Start;
use ledger_relay_subscriber::{connect, AuthReason, SubscribeError};

use crate::support::fake_relay::{FakeRelay, Plan};
use crate::support::{subscriber_config, testnet_ledgers, within, Pki, FIRST_SEQ};

/// Connects and expects an authorization failure as the first item, then the end.
async fn expect_unauthorized(
    config: ledger_relay_subscriber::SubscribeConfig,
    relay: &FakeRelay,
) -> AuthReason {
    let started = std::time::Instant::now();
    let mut sub = connect(config).unwrap();
    let reason = match within(10, sub.next()).await {
        Some(Err(SubscribeError::Unauthorized {
            reason,
            relay: name,
            detail,
        })) => {
            assert_eq!(name, relay.addr.to_string());
            assert!(!detail.is_empty());
            reason
        }
        other => panic!("expected an authorization failure, got {other:?}"),
    };
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    assert!(within(5, sub.next()).await.is_none(), "the stream ends");
    // Not retried: no further connection reaches the relay.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(relay.record().incoming, 1, "retried: {:?}", relay.record());
    reason
}

#[tokio::test]
async fn a_client_certificate_from_another_ca_is_refused() {
    let relay_pki = Pki::new();
    let client_pki = Pki::new();
    let relay = FakeRelay::start(
        Plan::new(testnet_ledgers(2)),
        relay_pki.path(),
        relay_pki.path(),
    );
    // Our client certificate comes from another CA, but we trust the relay's CA.
    let mut config = subscriber_config(&[relay.addr], &client_pki, Start::Seq(FIRST_SEQ), 2);
    config.credentials.ca = relay_pki.credentials("rpc-1").ca;
    assert_eq!(
        expect_unauthorized(config, &relay).await,
        AuthReason::UnknownCa
    );
    assert_eq!(relay.record().opens.len(), 0);
}

#[tokio::test]
async fn a_revoked_client_certificate_is_refused() {
    let pki = Pki::new();
    let ca = CertDir::open(pki.path()).unwrap();
    ca.issue_client("rpc-2", 30).unwrap();
    ca.revoke("rpc-2").unwrap();
    let relay = FakeRelay::start(Plan::new(testnet_ledgers(2)), pki.path(), pki.path());
    let mut config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ), 1);
    config.credentials = pki.credentials("rpc-2");
    assert_eq!(
        expect_unauthorized(config, &relay).await,
        AuthReason::Revoked
    );
}

#[tokio::test]
async fn an_expired_client_certificate_is_refused() {
    let pki = Pki::new();
    let ca = CertDir::open(pki.path()).unwrap();
    let now = time::OffsetDateTime::now_utc();
    ca.issue_client_with_validity(
        "old",
        now - time::Duration::days(10),
        now - time::Duration::days(1),
    )
    .unwrap();
    let relay = FakeRelay::start(Plan::new(testnet_ledgers(2)), pki.path(), pki.path());
    let mut config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ), 1);
    config.credentials = pki.credentials("old");
    assert_eq!(
        expect_unauthorized(config, &relay).await,
        AuthReason::Expired
    );
}

#[tokio::test]
async fn a_relay_certificate_for_another_name_is_refused() {
    let pki = Pki::new();
    let relay = FakeRelay::start(Plan::new(testnet_ledgers(2)), pki.path(), pki.path());
    let mut config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ), 2);
    config.server_name = Some("relay.elsewhere.example".into());
    assert_eq!(
        expect_unauthorized(config, &relay).await,
        AuthReason::RelayCertificate
    );
}

#[tokio::test]
async fn a_relay_certificate_from_another_ca_is_refused() {
    let pki = Pki::new();
    let other = Pki::new();
    // The relay presents a certificate from another CA, but would accept our client.
    let relay = FakeRelay::start(Plan::new(testnet_ledgers(2)), other.path(), pki.path());
    let config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ), 2);
    assert_eq!(
        expect_unauthorized(config, &relay).await,
        AuthReason::RelayCertificate
    );
}

#[tokio::test]
async fn the_server_name_defaults_to_the_relay_host() {
    // "localhost" resolves to the relay and is a SAN of its certificate.
    let pki = Pki::new();
    let ledgers = testnet_ledgers(2);
    let relay = FakeRelay::start(Plan::new(ledgers.clone()), pki.path(), pki.path());
    let mut config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ), 1);
    config.relays = vec![format!("localhost:{}", relay.addr.port()).parse().unwrap()];
    let mut sub = connect(config).unwrap();
    // localhost may resolve to ::1 first, where nothing listens; the subscriber then keeps
    // retrying. Accept either a ledger or, on such hosts, skip.
    match tokio::time::timeout(Duration::from_secs(5), sub.next()).await {
        Ok(Some(Ok(l))) => assert!(l.data == ledgers[0]),
        Ok(other) => panic!("{other:?}"),
        Err(_) => eprintln!("skipped: localhost does not resolve to 127.0.0.1 first here"),
    }
}

/// The subscriber checks the relay's certificate against `crl.pem`
/// of its certificate directory: a revoked relay certificate (a stolen relay key) is refused
/// at once, with its own reason, and not retried. Before, the subscriber read no CRL and
/// streamed from the revoked relay.
#[tokio::test]
async fn a_revoked_relay_certificate_is_refused() {
    let pki = Pki::new();
    CertDir::open(pki.path()).unwrap().revoke("relay").unwrap();
    let relay = FakeRelay::start(Plan::new(testnet_ledgers(2)), pki.path(), pki.path());
    let config = subscriber_config(&[relay.addr], &pki, Start::Seq(FIRST_SEQ), 1);
    assert_eq!(
        expect_unauthorized(config, &relay).await,
        AuthReason::RelayRevoked
    );
}
