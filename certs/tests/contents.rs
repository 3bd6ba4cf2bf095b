//! What the certificates, the CRL and the index contain, read back with x509-parser.

use std::collections::HashSet;
use std::fs;
use std::net::IpAddr;

use ledger_relay_certs::{
    client_identity, load_certs, load_crls, load_key, CertDir, CertError, Role, CLOCK_SKEW,
};
use time::{Duration, OffsetDateTime};
use x509_parser::extensions::GeneralName;
use x509_parser::num_bigint::BigUint;
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::revocation_list::CertificateRevocationList;

use crate::util::{cert_der, hex, parse};

const P256_OID: &str = "1.2.840.10045.3.1.7";
const EC_PUBLIC_KEY_OID: &str = "1.2.840.10045.2.1";

fn sans(cert: &X509Certificate<'_>) -> Vec<String> {
    cert.subject_alternative_name()
        .unwrap()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .map(|n| match n {
                    GeneralName::DNSName(d) => format!("dns:{d}"),
                    GeneralName::IPAddress(ip) => {
                        let ip: IpAddr = match ip.len() {
                            4 => <[u8; 4]>::try_from(*ip).unwrap().into(),
                            16 => <[u8; 16]>::try_from(*ip).unwrap().into(),
                            n => panic!("IP SAN of {n} bytes"),
                        };
                        format!("ip:{ip}")
                    }
                    GeneralName::URI(u) => format!("uri:{u}"),
                    other => format!("other:{other:?}"),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn assert_p256(cert: &X509Certificate<'_>) {
    let spki = cert.public_key();
    assert_eq!(spki.algorithm.algorithm.to_id_string(), EC_PUBLIC_KEY_OID);
    let curve = spki
        .algorithm
        .parameters
        .as_ref()
        .unwrap()
        .as_oid()
        .unwrap();
    assert_eq!(curve.to_id_string(), P256_OID);
}

fn assert_about(actual: OffsetDateTime, expected: OffsetDateTime) {
    assert!(
        (actual - expected).abs() < Duration::seconds(30),
        "{actual} is not close to {expected}"
    );
}

fn crl(dir: &CertDir) -> (BigUint, Vec<String>, OffsetDateTime, Option<OffsetDateTime>) {
    let crls = load_crls(&dir.crl_path()).unwrap();
    assert_eq!(crls.len(), 1);
    let (_, crl) = CertificateRevocationList::from_der(&crls[0]).unwrap();
    let number = crl.crl_number().expect("CRL number").clone();
    let serials = crl
        .iter_revoked_certificates()
        .map(|r| hex(r.raw_serial()))
        .collect();
    (
        number,
        serials,
        crl.last_update().to_datetime(),
        crl.next_update().map(|t| t.to_datetime()),
    )
}

#[test]
fn ca_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CertDir::init(tmp.path(), 3650).unwrap();
    let der = cert_der(&dir.ca_path());
    let ca = parse(&der);
    let now = OffsetDateTime::now_utc();

    assert_eq!(ca.subject(), ca.issuer(), "self-signed");
    ca.verify_signature(None).unwrap();
    let bc = ca.basic_constraints().unwrap().unwrap();
    assert!(bc.critical);
    assert!(bc.value.ca);
    assert_eq!(bc.value.path_len_constraint, Some(0));
    let ku = ca.key_usage().unwrap().unwrap().value;
    assert!(ku.key_cert_sign() && ku.crl_sign() && ku.digital_signature());
    assert_p256(&ca);

    assert_about(ca.validity().not_before.to_datetime(), now - CLOCK_SKEW);
    assert_about(
        ca.validity().not_after.to_datetime(),
        now + Duration::days(3650),
    );
    assert_eq!(dir.ca_not_after(), ca.validity().not_after.to_datetime());

    let entries = dir.list().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].name, "ca");
    assert_eq!(entries[0].role, Role::Ca);
    assert_eq!(entries[0].serial, ca.raw_serial());
    assert_eq!(entries[0].serial.len(), 16);
    assert!(entries[0].serial[0] & 0x80 == 0 && entries[0].serial[0] != 0);
    assert!(!entries[0].revoked);

    // The CRL written by init: signed by the CA, empty, number 1.
    let (number, serials, this_update, next_update) = crl(&dir);
    assert_eq!(number, BigUint::from(1u32));
    assert!(serials.is_empty());
    assert_about(this_update, now);
    assert_about(next_update.unwrap(), now + Duration::days(30));
    let crl_der = &load_crls(&dir.crl_path()).unwrap()[0];
    let (_, parsed) = CertificateRevocationList::from_der(crl_der).unwrap();
    assert_eq!(parsed.issuer(), ca.subject());
    parsed.verify_signature(ca.public_key()).unwrap();
}

#[test]
fn server_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CertDir::init(tmp.path(), 3650).unwrap();
    let sans_in: Vec<String> = ["localhost", "127.0.0.1", "::1", "relay.example.net"]
        .map(String::from)
        .to_vec();
    let issued = dir.issue_server("relay", &sans_in, 90).unwrap();
    assert_eq!(issued.cert_path, tmp.path().join("relay.pem"));
    assert_eq!(issued.key_path, tmp.path().join("relay.key"));
    assert_eq!(issued.cert_path, dir.cert_path("relay"));
    assert_eq!(issued.key_path, dir.key_path("relay"));
    let der = cert_der(&issued.cert_path);
    assert_eq!(der, issued.cert_der.to_vec());
    let cert = parse(&der);
    let ca_der = cert_der(&dir.ca_path());
    let ca = parse(&ca_der);

    assert_eq!(cert.issuer(), ca.subject());
    cert.verify_signature(Some(ca.public_key())).unwrap();
    assert_eq!(
        sans(&cert),
        [
            "dns:localhost",
            "ip:127.0.0.1",
            "ip:::1",
            "dns:relay.example.net"
        ]
    );
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && !eku.client_auth && !eku.any);
    let bc = cert.basic_constraints().unwrap().map(|b| b.value.ca);
    assert_ne!(bc, Some(true));
    assert!(cert.key_usage().unwrap().unwrap().value.digital_signature());
    assert_p256(&cert);
    let cn: Vec<&str> = cert
        .subject()
        .iter_common_name()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(cn, ["relay"]);

    let validity = cert.validity();
    assert_eq!(validity.not_before.to_datetime(), issued.not_before);
    assert_eq!(validity.not_after.to_datetime(), issued.not_after);
    assert_eq!(
        issued.not_after - issued.not_before,
        Duration::days(90) + CLOCK_SKEW
    );
    assert_about(
        issued.not_after,
        OffsetDateTime::now_utc() + Duration::days(90),
    );

    let entry = dir
        .list()
        .unwrap()
        .into_iter()
        .find(|e| e.name == "relay")
        .unwrap();
    assert_eq!(entry.role, Role::Server);
    assert_eq!(entry.serial, cert.raw_serial());
    assert_eq!(entry.serial, issued.serial);
    assert_eq!(entry.not_after, issued.not_after);
    assert_eq!(entry.serial_hex(), issued.serial_hex());

    // The key on disk is the certificate's.
    let key = load_key(&issued.key_path).unwrap();
    let key = rcgen::KeyPair::try_from(&key).unwrap();
    use rcgen::PublicKeyData;
    assert_eq!(key.subject_public_key_info(), cert.public_key().raw);
}

#[test]
fn client_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CertDir::init(tmp.path(), 3650).unwrap();
    let issued = dir.issue_client("rpc-1", 365).unwrap();
    let der = cert_der(&issued.cert_path);
    let cert = parse(&der);

    assert_eq!(sans(&cert), ["uri:urn:ledger-relay:client:rpc-1"]);
    let cn: Vec<&str> = cert
        .subject()
        .iter_common_name()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(cn, ["rpc-1"]);
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.client_auth && !eku.server_auth && !eku.any);
    assert_p256(&cert);
    assert_eq!(client_identity(&der).unwrap(), "rpc-1");
    assert_eq!(
        issued.not_after - issued.not_before,
        Duration::days(365) + CLOCK_SKEW
    );
    let entry = dir
        .list()
        .unwrap()
        .into_iter()
        .find(|e| e.name == "rpc-1")
        .unwrap();
    assert_eq!(entry.role, Role::Client);
    assert_eq!(entry.serial, cert.raw_serial());

    // A server certificate's identity is its CN.
    let server = dir
        .issue_server("relay", &["localhost".into()], 365)
        .unwrap();
    assert_eq!(client_identity(&server.cert_der).unwrap(), "relay");
}

#[test]
fn explicit_validity_is_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CertDir::init(tmp.path(), 3650).unwrap();
    let not_before = OffsetDateTime::now_utc() - Duration::days(10);
    let not_after = OffsetDateTime::now_utc() - Duration::days(1);
    let issued = dir
        .issue_client_with_validity("old", not_before, not_after)
        .unwrap();
    let der = cert_der(&issued.cert_path);
    let cert = parse(&der);
    assert_eq!(
        cert.validity().not_before.timestamp(),
        not_before.unix_timestamp()
    );
    assert_eq!(
        cert.validity().not_after.timestamp(),
        not_after.unix_timestamp()
    );
    let entry = dir
        .list()
        .unwrap()
        .into_iter()
        .find(|e| e.name == "old")
        .unwrap();
    assert_eq!(entry.not_after.unix_timestamp(), not_after.unix_timestamp());

    let err = dir
        .issue_client_with_validity("bad", not_after, not_before)
        .unwrap_err();
    assert!(matches!(err, CertError::InvalidValidity { .. }), "{err}");
    let err = dir
        .issue_client_with_validity(
            "late",
            not_before,
            OffsetDateTime::now_utc() + Duration::days(4000),
        )
        .unwrap_err();
    assert!(matches!(err, CertError::OutlivesCa { .. }), "{err}");
}

#[test]
fn serials_are_unique_and_match_the_index() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CertDir::init(tmp.path(), 3650).unwrap();
    for i in 0..8 {
        dir.issue_client(&format!("c{i}"), 30).unwrap();
    }
    let entries = dir.list().unwrap();
    assert_eq!(entries.len(), 9);
    let serials: HashSet<Vec<u8>> = entries.iter().map(|e| e.serial.clone()).collect();
    assert_eq!(serials.len(), 9);
    for e in entries.iter().filter(|e| e.role == Role::Client) {
        let der = cert_der(&dir.cert_path(&e.name));
        assert_eq!(parse(&der).raw_serial(), e.serial.as_slice(), "{}", e.name);
    }
}

#[test]
fn crl_numbers_increase_and_list_every_revoked_serial() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CertDir::init(tmp.path(), 3650).unwrap();
    let a = dir.issue_client("a", 30).unwrap();
    let b = dir.issue_client("b", 30).unwrap();
    let c = dir.issue_client("c", 30).unwrap();
    assert_eq!(dir.crl_number().unwrap(), 1);

    dir.revoke("a").unwrap();
    let (n1, serials, _, _) = crl(&dir);
    assert_eq!(serials, [a.serial_hex()]);
    dir.revoke("b").unwrap();
    let (n2, serials, _, _) = crl(&dir);
    assert!(n2 > n1, "{n2} after {n1}");
    assert_eq!(serials, [a.serial_hex(), b.serial_hex()]);
    assert_eq!(dir.crl_number().unwrap(), 3);
    assert_eq!(n2, BigUint::from(3u32));

    assert_eq!(dir.refresh_crl().unwrap(), 4);
    let (n3, serials, _, _) = crl(&dir);
    assert!(n3 > n2);
    assert_eq!(serials, [a.serial_hex(), b.serial_hex()]);

    let revoked: Vec<(String, bool)> = dir
        .list()
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.revoked))
        .collect();
    assert_eq!(
        revoked,
        [
            ("ca".into(), false),
            ("a".into(), true),
            ("b".into(), true),
            ("c".into(), false)
        ]
    );
    assert!(!serials.contains(&c.serial_hex()));

    // A CertDir opened later sees the same state.
    let reopened = CertDir::open(tmp.path()).unwrap();
    assert_eq!(reopened.crl_number().unwrap(), 4);
    let err = reopened.revoke("a").unwrap_err();
    assert!(matches!(err, CertError::AlreadyRevoked { .. }), "{err}");
    let err = reopened.revoke("zzz").unwrap_err();
    assert!(matches!(err, CertError::UnknownName { .. }), "{err}");
}

#[test]
fn open_checks_the_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let err = CertDir::open(tmp.path()).unwrap_err();
    assert!(matches!(err, CertError::NotInitialized { .. }), "{err}");

    let one = tmp.path().join("one");
    let two = tmp.path().join("two");
    CertDir::init(&one, 10).unwrap();
    CertDir::init(&two, 10).unwrap();
    let err = CertDir::init(&one, 10).unwrap_err();
    assert!(matches!(err, CertError::AlreadyInitialized { .. }), "{err}");

    // A key from another CA is caught.
    fs::remove_file(one.join("ca.key")).unwrap();
    fs::copy(two.join("ca.key"), one.join("ca.key")).unwrap();
    let err = CertDir::open(&one).unwrap_err();
    assert!(matches!(err, CertError::KeyMismatch { .. }), "{err}");

    // A damaged index is reported, not overwritten.
    fs::write(two.join("index.toml"), "version = 1\n").unwrap();
    let err = CertDir::open(&two).unwrap_err();
    assert!(matches!(err, CertError::Index { .. }), "{err}");
    assert_eq!(
        fs::read_to_string(two.join("index.toml")).unwrap(),
        "version = 1\n"
    );
}

#[test]
fn loaders_read_what_init_and_issue_write() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CertDir::init(tmp.path(), 3650).unwrap();
    dir.issue_server("relay", &["localhost".into()], 30)
        .unwrap();
    assert_eq!(load_certs(&dir.ca_path()).unwrap().len(), 1);
    assert_eq!(load_certs(&dir.cert_path("relay")).unwrap().len(), 1);
    assert!(matches!(
        load_key(&dir.key_path("relay")).unwrap(),
        rustls::pki_types::PrivateKeyDer::Pkcs8(_)
    ));
    assert_eq!(load_crls(&dir.crl_path()).unwrap().len(), 1);
    // A key file is not a certificate file.
    let err = load_certs(&dir.key_path("relay")).unwrap_err();
    assert!(matches!(err, CertError::Pem { .. }), "{err}");
    assert!(err.to_string().contains("relay.key"), "{err}");
}

#[test]
fn failed_revoke_can_be_retried() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CertDir::init(tmp.path(), 3650).unwrap();
    let a = dir.issue_client("a", 30).unwrap();
    // A non-empty directory where crl.pem should be: replacing it fails.
    let crl = dir.crl_path();
    let saved = fs::read(&crl).unwrap();
    fs::remove_file(&crl).unwrap();
    fs::create_dir(&crl).unwrap();
    fs::write(crl.join("x"), "x").unwrap();
    let err = dir.revoke("a").unwrap_err();
    assert!(matches!(err, CertError::Io { .. }), "{err}");
    assert!(err.to_string().contains("crl.pem"), "{err}");
    let entry = dir
        .list()
        .unwrap()
        .into_iter()
        .find(|e| e.name == "a")
        .unwrap();
    assert!(
        !entry.revoked,
        "a failed revoke must not leave the certificate marked revoked"
    );
    // The number the failed attempt used is burnt, never reused.
    assert_eq!(dir.crl_number().unwrap(), 2);

    fs::remove_dir_all(&crl).unwrap();
    fs::write(&crl, saved).unwrap();
    dir.revoke("a").unwrap();
    let (number, serials, _, _) = self::crl(&dir);
    assert_eq!(number, BigUint::from(3u32));
    assert_eq!(serials, [a.serial_hex()]);
}
