//! The transport crate against real sockets and real certificates from the certs crate.

use std::path::Path;

use ledger_relay_certs::{load_certs, load_crls, load_key, CertDir};
use ledger_relay_transport::{
    self as transport, client_config, udp_socket, TlsConfigError, TransportSettings,
};
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};

/// A CA with a relay and a client certificate in a temporary directory.
struct Pki {
    _tmp: tempfile::TempDir,
    dir: std::path::PathBuf,
}

struct Creds {
    ca: Vec<CertificateDer<'static>>,
    crls: Vec<CertificateRevocationListDer<'static>>,
    cert_chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Pki {
    fn new() -> Pki {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("certs");
        let ca = CertDir::init(&dir, 365).unwrap();
        ca.issue_server("relay", &["localhost".into()], 30).unwrap();
        ca.issue_client("rpc-1", 30).unwrap();
        Pki { _tmp: tmp, dir }
    }

    fn credentials(&self, name: &str) -> Creds {
        let load = |f: &str| load_certs(&self.dir.join(f)).unwrap();
        Creds {
            ca: load("ca.pem"),
            crls: load_crls(&self.dir.join("crl.pem")).unwrap(),
            cert_chain: load(&format!("{name}.pem")),
            key: load_key(&self.dir.join(Path::new(&format!("{name}.key")))).unwrap(),
        }
    }
}

fn sysctl(name: &str) -> Option<usize> {
    std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[test]
fn udp_sockets_get_raised_buffers() {
    let settings = TransportSettings::default();
    let socket = udp_socket("127.0.0.1:0".parse().unwrap(), &settings).unwrap();
    let sock = socket2::SockRef::from(&socket);
    let recv = sock.recv_buffer_size().unwrap();
    let send = sock.send_buffer_size().unwrap();
    // Linux grants min(request, rmem_max) and reports twice that.
    if let (Some(rmax), Some(wmax)) = (sysctl("rmem_max"), sysctl("wmem_max")) {
        assert!(
            recv >= settings.udp_recv_buffer.min(rmax),
            "SO_RCVBUF {recv}"
        );
        assert!(
            send >= settings.udp_send_buffer.min(wmax),
            "SO_SNDBUF {send}"
        );
    }
    assert!(socket.local_addr().unwrap().port() != 0);
    // Two lanes never share a source port.
    let other = udp_socket("127.0.0.1:0".parse().unwrap(), &settings).unwrap();
    assert_ne!(
        socket.local_addr().unwrap().port(),
        other.local_addr().unwrap().port()
    );
}

#[test]
fn client_config_builds_from_a_certificate_directory() {
    let pki = Pki::new();
    let creds = pki.credentials("rpc-1");
    let settings = TransportSettings::default();
    client_config(
        &creds.ca,
        &creds.crls,
        creds.cert_chain.clone(),
        creds.key.clone_key(),
        &settings,
    )
    .unwrap();
    assert!(!creds.crls.is_empty(), "DIR/crl.pem is loaded");

    assert!(matches!(
        client_config(
            &[],
            &[],
            creds.cert_chain.clone(),
            creds.key.clone_key(),
            &settings
        ),
        Err(TlsConfigError::NoCa)
    ));
    // A key that is not the certificate's.
    let relay_key = pki.credentials("relay").key;
    assert!(client_config(
        &creds.ca,
        &[],
        creds.cert_chain.clone(),
        relay_key,
        &settings
    )
    .is_err());
    // Bytes that are no CRL.
    let bogus = CertificateRevocationListDer::from(vec![0x30, 0x03, 1, 2, 3]);
    assert!(matches!(
        client_config(
            &creds.ca,
            &[bogus],
            creds.cert_chain.clone(),
            creds.key.clone_key(),
            &settings
        ),
        Err(TlsConfigError::Crl(_))
    ));
}

#[test]
fn transport_config_takes_the_settings() {
    // Builds without panicking for extreme values too (clamped, not rejected).
    let mut s = TransportSettings::default();
    transport::transport_config(&s);
    s.receive_window = u64::MAX;
    s.idle_timeout = std::time::Duration::from_secs(u64::MAX / 4);
    s.keep_alive = std::time::Duration::ZERO;
    s.initial_mtu = 0;
    transport::transport_config(&s);
    s.min_mtu = u16::MAX;
    transport::transport_config(&s);
    transport::endpoint_config(&s);
}

#[tokio::test]
async fn endpoints_bind_their_own_socket() {
    let settings = TransportSettings::default();
    let a = transport::endpoint(
        udp_socket("127.0.0.1:0".parse().unwrap(), &settings).unwrap(),
        None,
        &settings,
    )
    .unwrap();
    let b = transport::endpoint(
        udp_socket("127.0.0.1:0".parse().unwrap(), &settings).unwrap(),
        None,
        &settings,
    )
    .unwrap();
    assert_ne!(a.local_addr().unwrap(), b.local_addr().unwrap());
}
