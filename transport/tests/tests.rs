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

/// A bulk transfer between two lane endpoints on loopback with jumbo packets on both ends
/// (`max_mtu = min_mtu = 8952`): every packet is 8952 bytes and almost none is declared lost.
/// quinn batches 10 packets into one GSO send, 89,520 bytes, which Linux refuses as larger than
/// one UDP datagram; quinn-udp dropped such batches silently (a third of the packets declared
/// lost). The endpoint now bounds its batches to 64 KiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jumbo_packets_are_not_lost_in_oversized_gso_batches() {
    const BYTES: usize = 32 << 20;
    let pki = Pki::new();
    let settings = TransportSettings {
        max_mtu: 8952,
        min_mtu: 8952,
        ..TransportSettings::default()
    };
    let relay = pki.credentials("relay");
    let mut roots = rustls::RootCertStore::empty();
    for c in &relay.ca {
        roots.add(c.clone()).unwrap();
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        std::sync::Arc::new(roots),
        transport::crypto_provider(),
    )
    .build()
    .unwrap();
    let server =
        transport::server_config(relay.cert_chain, relay.key, verifier, &settings).unwrap();
    let client = pki.credentials("rpc-1");
    let client = client_config(&client.ca, &[], client.cert_chain, client.key, &settings).unwrap();
    let local = "127.0.0.1:0".parse().unwrap();
    let sender = transport::endpoint(
        udp_socket(local, &settings).unwrap(),
        Some(server),
        &settings,
    )
    .unwrap();
    let mut receiver =
        transport::endpoint(udp_socket(local, &settings).unwrap(), None, &settings).unwrap();
    receiver.set_default_client_config(client);
    let addr = sender.local_addr().unwrap();
    let send = tokio::spawn(async move {
        let conn = sender.accept().await.unwrap().await.unwrap();
        let mut s = conn.open_uni().await.unwrap();
        let block = bytes::Bytes::from(vec![7u8; 1 << 20]);
        for _ in 0..BYTES >> 20 {
            s.write_chunk(block.clone()).await.unwrap();
        }
        s.finish().unwrap();
        let _ = s.stopped().await;
        let stats = conn.stats();
        conn.close(0u32.into(), b"done");
        stats
    });
    let recv = async {
        let conn = receiver.connect(addr, "localhost").unwrap().await.unwrap();
        let mut s = conn.accept_uni().await.unwrap();
        let mut got = 0;
        while let Some(c) = s.read_chunk(usize::MAX, true).await.unwrap() {
            got += c.bytes.len();
        }
        got
    };
    let within = std::time::Duration::from_secs(60);
    let got = tokio::time::timeout(within, recv)
        .await
        .expect("received in time");
    assert_eq!(got, BYTES);
    let stats = tokio::time::timeout(within, send).await.unwrap().unwrap();
    assert_eq!(stats.path.current_mtu, 8952);
    let (sent, lost) = (stats.path.sent_packets, stats.path.lost_packets);
    assert!(sent >= (BYTES / 8952) as u64, "{sent} packets");
    assert!(lost * 20 <= sent, "{lost} of {sent} packets declared lost");
}

/// A connection between a relay-side and a client-side endpoint on loopback: (relay's end,
/// client's end, the endpoints to keep alive).
async fn connected(
    pki: &Pki,
    settings: &TransportSettings,
) -> (quinn::Connection, quinn::Connection, [quinn::Endpoint; 2]) {
    let relay = pki.credentials("relay");
    let mut roots = rustls::RootCertStore::empty();
    for c in &relay.ca {
        roots.add(c.clone()).unwrap();
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        std::sync::Arc::new(roots),
        transport::crypto_provider(),
    )
    .build()
    .unwrap();
    let server = transport::server_config(relay.cert_chain, relay.key, verifier, settings).unwrap();
    let client = pki.credentials("rpc-1");
    let client = client_config(&client.ca, &[], client.cert_chain, client.key, settings).unwrap();
    let local = "127.0.0.1:0".parse().unwrap();
    let a =
        transport::endpoint(udp_socket(local, settings).unwrap(), Some(server), settings).unwrap();
    let mut b = transport::endpoint(udp_socket(local, settings).unwrap(), None, settings).unwrap();
    b.set_default_client_config(client);
    let connecting = b.connect(a.local_addr().unwrap(), "localhost").unwrap();
    let (relay_end, client_end) =
        tokio::join!(async { a.accept().await.unwrap().await }, connecting);
    (relay_end.unwrap(), client_end.unwrap(), [a, b])
}

/// A data stream is read within the session's byte budget: a frame's share is held until its
/// permit is dropped, a stream whose frame does not fit waits without reading its body, and a
/// stream cut short or with bytes after its frame is a protocol violation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_streams_are_read_within_the_byte_budget() {
    use ledger_relay_wire::frame::{Chunk, ChunkHeader, Frame};
    use ledger_relay_wire::{Codec, Limits};
    let pki = Pki::new();
    let (relay, client, _endpoints) = connected(&pki, &TransportSettings::default()).await;
    let chunk = |index: u32| {
        Frame::Chunk(Chunk {
            header: ChunkHeader {
                seq: 9,
                index,
                raw_offset: u64::from(index) * 1000,
                raw_len: 1000,
                codec: Codec::None,
            },
            payload: bytes::Bytes::from(vec![index as u8; 1000]),
        })
        .to_vec()
    };
    let frame_len = chunk(0).len() as u64;
    let send = |bytes: Vec<u8>, finish: bool| {
        let relay = relay.clone();
        async move {
            let mut s = relay.open_uni().await.unwrap();
            s.write_all(&bytes).await.unwrap();
            if finish {
                s.finish().unwrap();
            }
            s
        }
    };
    let limits = Limits::default();
    // Room for one frame and a half.
    let budget = transport::DataBudget::new(frame_len * 3 / 2);
    let _a = send(chunk(0), true).await;
    let mut first = client.accept_uni().await.unwrap();
    let (frame, permit) = transport::read_data_frame(&mut first, &limits, &budget)
        .await
        .unwrap();
    assert_eq!(frame.to_vec(), chunk(0));
    assert_eq!(budget.held(), frame_len);
    // The second frame does not fit beside the first: its read waits until the first is
    // handed on.
    let _b = send(chunk(1), true).await;
    let mut second = client.accept_uni().await.unwrap();
    let waiting = transport::read_data_frame(&mut second, &limits, &budget);
    tokio::pin!(waiting);
    let waited = tokio::time::timeout(std::time::Duration::from_millis(300), &mut waiting).await;
    assert!(waited.is_err(), "read beyond the budget");
    drop(permit);
    let (frame, permit) = waiting.await.unwrap();
    assert_eq!(frame.to_vec(), chunk(1));
    drop(permit);
    assert_eq!(budget.held(), 0);
    // Cut short, or followed by more: protocol violations.
    let mut long = chunk(2);
    long.push(0);
    let short = chunk(3)[..100].to_vec();
    for bytes in [long, short] {
        let _s = send(bytes, true).await;
        let mut stream = client.accept_uni().await.unwrap();
        let e = transport::read_data_frame(&mut stream, &limits, &budget)
            .await
            .unwrap_err();
        assert!(e.is_protocol_violation(), "{e}");
    }
}

/// A lane whose first packets are jumbo (min_mtu 8952), asking its peer for ACK frequency,
/// carries data: its first flight alone does not fill the congestion window it starts with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jumbo_lane_with_ack_frequency_carries_data() {
    let pki = Pki::new();
    let settings = TransportSettings {
        min_mtu: 8952,
        max_mtu: 8952,
        ack_eliciting_threshold: 4,
        ..TransportSettings::default()
    };
    let (relay, client, _endpoints) = connected(&pki, &settings).await;
    let data = vec![7u8; 256 << 10];
    let sent = data.clone();
    tokio::spawn(async move {
        let mut s = relay.open_uni().await.unwrap();
        s.write_all(&sent).await.unwrap();
        s.finish().unwrap();
        let _ = s.stopped().await;
    });
    let within = std::time::Duration::from_secs(5);
    let got = tokio::time::timeout(within, async {
        let mut s = client.accept_uni().await.unwrap();
        s.read_to_end(1 << 20).await.unwrap()
    })
    .await
    .expect("the stream arrives within 5 s");
    assert_eq!(got, data);
}
