//! Real acceptance: rustls' webpki verifiers, configured the way the relay and the subscriber
//! configure them, accept and reject what this crate issues.

use std::sync::Arc;

use ledger_relay_certs::{load_certs, load_crls, CertDir};
use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, Error, RootCertStore};
use time::{Duration, OffsetDateTime};

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(dir: &CertDir) -> Arc<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(&dir.ca_path()).unwrap() {
        roots.add(cert).unwrap();
    }
    Arc::new(roots)
}

/// The relay's client verifier: this CA, with the CRL as it is on disk now.
fn client_verifier(dir: &CertDir) -> Arc<dyn ClientCertVerifier> {
    WebPkiClientVerifier::builder_with_provider(roots(dir), provider())
        .with_crls(load_crls(&dir.crl_path()).unwrap())
        .build()
        .unwrap()
}

fn server_verifier(dir: &CertDir) -> Arc<WebPkiServerVerifier> {
    WebPkiServerVerifier::builder_with_provider(roots(dir), provider())
        .build()
        .unwrap()
}

fn leaf(dir: &CertDir, name: &str) -> CertificateDer<'static> {
    load_certs(&dir.cert_path(name)).unwrap().remove(0)
}

fn verify_client(dir: &CertDir, cert: &CertificateDer<'_>) -> Result<(), Error> {
    client_verifier(dir)
        .verify_client_cert(cert, &[], UnixTime::now())
        .map(|_| ())
}

fn verify_server(dir: &CertDir, cert: &CertificateDer<'_>, name: &str) -> Result<(), Error> {
    let name = ServerName::try_from(name.to_owned()).unwrap();
    server_verifier(dir)
        .verify_server_cert(cert, &[], &name, &[], UnixTime::now())
        .map(|_| ())
}

#[test]
fn issued_client_is_accepted_with_the_initial_empty_crl() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CertDir::init(tmp.path(), 3650).unwrap();
    dir.issue_client("rpc-1", 365).unwrap();
    verify_client(&dir, &leaf(&dir, "rpc-1")).unwrap();
}

#[test]
fn revoked_client_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CertDir::init(tmp.path(), 3650).unwrap();
    dir.issue_client("rpc-1", 365).unwrap();
    dir.issue_client("rpc-2", 365).unwrap();
    let rpc1 = leaf(&dir, "rpc-1");
    verify_client(&dir, &rpc1).unwrap();

    dir.revoke("rpc-1").unwrap();
    let err = verify_client(&dir, &rpc1).unwrap_err();
    assert_eq!(
        err,
        Error::InvalidCertificate(CertificateError::Revoked),
        "{err}"
    );
    // The other client is untouched.
    verify_client(&dir, &leaf(&dir, "rpc-2")).unwrap();

    // Reissued under the same name, the new certificate is accepted and the old one is not.
    dir.issue_client("rpc-1", 365).unwrap();
    let rpc1_new = leaf(&dir, "rpc-1");
    assert_ne!(rpc1, rpc1_new);
    verify_client(&dir, &rpc1_new).unwrap();
    assert!(verify_client(&dir, &rpc1).is_err());
}

#[test]
fn client_of_another_ca_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let ours = CertDir::init(&tmp.path().join("ours"), 3650).unwrap();
    let theirs = CertDir::init(&tmp.path().join("theirs"), 3650).unwrap();
    theirs.issue_client("rpc-1", 365).unwrap();
    let err = verify_client(&ours, &leaf(&theirs, "rpc-1")).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidCertificate(
                CertificateError::UnknownIssuer | CertificateError::BadSignature
            )
        ),
        "{err}"
    );
}

#[test]
fn expired_client_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CertDir::init(tmp.path(), 3650).unwrap();
    let now = OffsetDateTime::now_utc();
    dir.issue_client_with_validity("old", now - Duration::days(30), now - Duration::days(1))
        .unwrap();
    let err = verify_client(&dir, &leaf(&dir, "old")).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidCertificate(
                CertificateError::Expired | CertificateError::ExpiredContext { .. }
            )
        ),
        "{err}"
    );
    dir.issue_client_with_validity("future", now + Duration::days(1), now + Duration::days(30))
        .unwrap();
    let err = verify_client(&dir, &leaf(&dir, "future")).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidCertificate(
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. }
            )
        ),
        "{err}"
    );
}

#[test]
fn server_certificate_is_not_a_client_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CertDir::init(tmp.path(), 3650).unwrap();
    dir.issue_server("relay", &["localhost".into()], 365)
        .unwrap();
    assert!(verify_client(&dir, &leaf(&dir, "relay")).is_err());
}

#[test]
fn server_verifies_for_its_names_only() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CertDir::init(tmp.path(), 3650).unwrap();
    let sans: Vec<String> = ["localhost", "127.0.0.1", "::1", "relay.example.net"]
        .map(String::from)
        .to_vec();
    dir.issue_server("relay", &sans, 365).unwrap();
    let cert = leaf(&dir, "relay");
    for name in [
        "localhost",
        "127.0.0.1",
        "::1",
        "relay.example.net",
        "RELAY.example.net",
    ] {
        verify_server(&dir, &cert, name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    for name in [
        "example.com",
        "127.0.0.2",
        "::2",
        "relay",
        "other.example.net",
    ] {
        let err = verify_server(&dir, &cert, name).unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidCertificate(
                    CertificateError::NotValidForName
                        | CertificateError::NotValidForNameContext { .. }
                )
            ),
            "{name}: {err}"
        );
    }
    // A client certificate is not a server certificate, and another CA's relay is not ours.
    dir.issue_client("rpc-1", 365).unwrap();
    assert!(verify_server(&dir, &leaf(&dir, "rpc-1"), "localhost").is_err());
    let other = CertDir::init(&tmp.path().join("other"), 3650).unwrap();
    other
        .issue_server("relay", &["localhost".into()], 365)
        .unwrap();
    assert!(verify_server(&dir, &leaf(&other, "relay"), "localhost").is_err());
}
