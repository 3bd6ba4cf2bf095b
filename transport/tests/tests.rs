//! The transport helpers shared with the relay.

use ledger_relay_subscriber::transport::{
    self, client_config, udp_socket, TlsConfigError, TransportSettings,
};

use crate::support::Pki;

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
        creds.cert_chain.clone(),
        creds.key.clone_key(),
        &settings,
    )
    .unwrap();

    assert!(matches!(
        client_config(
            &[],
            creds.cert_chain.clone(),
            creds.key.clone_key(),
            &settings
        ),
        Err(TlsConfigError::NoCa)
    ));
    // A key that is not the certificate's.
    let relay_key = pki.credentials("relay").key;
    assert!(client_config(&creds.ca, creds.cert_chain.clone(), relay_key, &settings).is_err());
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
}

#[tokio::test]
async fn endpoints_bind_their_own_socket() {
    let settings = TransportSettings::default();
    let a = transport::endpoint(
        udp_socket("127.0.0.1:0".parse().unwrap(), &settings).unwrap(),
        None,
    )
    .unwrap();
    let b = transport::endpoint(
        udp_socket("127.0.0.1:0".parse().unwrap(), &settings).unwrap(),
        None,
    )
    .unwrap();
    assert_ne!(a.local_addr().unwrap(), b.local_addr().unwrap());
}
