//! QUIC and TLS plumbing shared by the subscriber and the relay: transport settings sized for
//! the workload, UDP sockets with raised buffers, endpoints, the client's mutual-TLS
//! configuration, and frame IO on QUIC streams.
//!
//! Both ends build their endpoints here so that their flow-control windows agree and a lane is
//! configured the same way on either side. The relay builds its own server TLS configuration
//! (it owns the client verifier and the CRL) but takes [`crypto_provider`] and
//! [`transport_config`] from this module.
//!
//! Frame IO follows `docs/protocol.md` section 2: a control stream carries a sequence of frames
//! ([`FrameReader`], [`FrameWriter`]); a data stream carries exactly one frame and then FIN
//! ([`read_single_frame`]).

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ledger_relay_wire::frame::{self, Frame, FrameDecoder};
use ledger_relay_wire::{FrameError, Limits};
use quinn::{IdleTimeout, MtuDiscoveryConfig, VarInt};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

/// QUIC transport settings of one lane, the same on both ends.
///
/// The defaults are sized for the Phase 3 stress profile: a 14.5 MiB ledger every 600 ms that
/// must arrive in a few milliseconds, over lanes capped at about 5 Gbit/s each (EC2's per-flow
/// limit outside a placement group) across availability zones with a round trip of about 2 ms.
/// The bandwidth-delay product of one lane is then 5 Gbit/s x 2 ms = 1.25 MB. quinn's defaults
/// (1.25 MB stream window, 100 streams) would cap a lane at exactly one BDP of data in flight
/// and let only a handful of 256 KiB chunk streams run at once; the windows below allow several
/// BDPs so that many chunk streams are in flight in parallel and a lost packet on one of them
/// does not stall the lane.
///
/// Deserialized from TOML by the relay: every field is optional (missing ones take the
/// default), durations are written as `"10s"`, `"500ms"`, `"2m"` or a number of milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TransportSettings {
    /// Bytes one stream may have in flight before the receiver reads them (default 4 MiB). A
    /// stream carries one chunk (256 KiB by default, at most `max_chunk_raw` = 4 MiB), so a
    /// 4 MiB stream window never holds a chunk back; the connection window below is what
    /// bounds the total.
    pub stream_receive_window: u64,
    /// Bytes all streams of one connection may have in flight unread (default 32 MiB): about
    /// 25 BDPs of a 5 Gbit/s, 2 ms lane, or two whole stress ledgers. It is also what a slow
    /// subscriber pushes back with: once its reader stops, the relay can send at most this much
    /// more on the lane.
    pub receive_window: u64,
    /// Bytes a sender keeps buffered for one connection, unacknowledged (default 32 MiB).
    /// Matching the receive window lets the relay keep a full window in flight; it is also the
    /// per-connection memory cap on the sending side.
    pub send_window: u64,
    /// `SO_RCVBUF` requested for the lane's UDP socket (default 16 MiB). With the kernel's
    /// default of a few hundred KiB, a burst of a whole chunk stream (thousands of packets)
    /// overflows the socket and is dropped before quinn reads it; the kernel caps the request
    /// at `net.core.rmem_max` (what it granted is logged at debug level).
    pub udp_recv_buffer: usize,
    /// `SO_SNDBUF` requested for the lane's UDP socket (default 16 MiB; capped by
    /// `net.core.wmem_max`).
    pub udp_send_buffer: usize,
    /// Unidirectional streams the peer may have open at once (default 512). Every chunk travels
    /// on its own stream: a 14.5 MiB ledger is 58 streams of 256 KiB, and the window admits up
    /// to 8 ledgers in flight, so 512 keeps stream credit from ever being the limit.
    pub max_concurrent_uni_streams: u32,
    /// A lane that hears nothing for this long is dead (default 10 s).
    #[serde(with = "humane_duration")]
    pub idle_timeout: Duration,
    /// Keep-alive interval (default 2 s), well inside the idle timeout so an idle but healthy
    /// lane (a subscriber waiting at the tip) is never timed out.
    #[serde(with = "humane_duration")]
    pub keep_alive: Duration,
    /// First packet size (default 1200, the QUIC minimum, safe on any path); path MTU discovery
    /// then raises it (to 1452 on a 1500-byte Ethernet path, or up to the jumbo-frame size
    /// within a VPC).
    pub initial_mtu: u16,
    /// Generic segmentation offload (default on): quinn hands the kernel up to 64 KiB of
    /// packets per send call, which roughly halves the CPU cost of sending.
    pub gso: bool,
}

impl Default for TransportSettings {
    fn default() -> Self {
        TransportSettings {
            stream_receive_window: 4 << 20,
            receive_window: 32 << 20,
            send_window: 32 << 20,
            udp_recv_buffer: 16 << 20,
            udp_send_buffer: 16 << 20,
            max_concurrent_uni_streams: 512,
            idle_timeout: Duration::from_secs(10),
            keep_alive: Duration::from_secs(2),
            initial_mtu: 1200,
            gso: true,
        }
    }
}

/// Reads durations from TOML as `"10s"`, `"250ms"`, `"1.5s"`, `"2m"` or a number of ms.
mod humane_duration {
    use std::time::Duration;

    use serde::{de, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = Duration;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a duration such as \"10s\", \"500ms\" or a number of milliseconds")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
                Ok(Duration::from_millis(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
                u64::try_from(v)
                    .map(Duration::from_millis)
                    .map_err(|_| E::custom("a duration cannot be negative"))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
                super::parse_duration(v).map_err(E::custom)
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Parses a duration written as a number and a unit: `ms`, `s`, `m` or `h` (`"500ms"`,
/// `"1.5s"`, `"2m"`).
pub fn parse_duration(s: &str) -> Result<Duration, crate::config::ParseError> {
    let input = s;
    let err = |reason| crate::config::ParseError {
        what: "duration",
        input: input.to_owned(),
        reason,
    };
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| err("expected a number and a unit"))?;
    let scale = match unit.trim() {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        "" => return Err(err("missing unit (ms, s, m, h)")),
        _ => return Err(err("unknown unit (ms, s, m, h)")),
    };
    Duration::try_from_secs_f64(value * scale).map_err(|_| err("out of range"))
}

/// The quinn transport configuration for `s`.
///
/// Values beyond what QUIC can encode (2^62) are clamped, which no real setting reaches.
pub fn transport_config(s: &TransportSettings) -> quinn::TransportConfig {
    let varint = |v: u64| VarInt::from_u64(v).unwrap_or(VarInt::MAX);
    let mut t = quinn::TransportConfig::default();
    t.stream_receive_window(varint(s.stream_receive_window))
        .receive_window(varint(s.receive_window))
        .send_window(s.send_window)
        .max_concurrent_uni_streams(VarInt::from_u32(s.max_concurrent_uni_streams))
        // Lanes carry no peer-initiated bidirectional streams beyond the control stream.
        .max_concurrent_bidi_streams(VarInt::from_u32(4))
        .max_idle_timeout(Some(
            IdleTimeout::try_from(s.idle_timeout).unwrap_or(IdleTimeout::from(VarInt::MAX)),
        ))
        .keep_alive_interval((!s.keep_alive.is_zero()).then_some(s.keep_alive))
        .initial_mtu(s.initial_mtu.max(1200))
        .mtu_discovery_config(Some(MtuDiscoveryConfig::default()))
        .enable_segmentation_offload(s.gso);
    t
}

/// A UDP socket bound to `addr` with the buffers of `s` requested (`SO_RCVBUF`,
/// `SO_SNDBUF`), non-blocking, ready for [`endpoint`].
///
/// The kernel may grant less than requested (Linux caps at `net.core.rmem_max` and
/// `wmem_max`); what it granted is logged at debug level, and a smaller buffer is not an error.
pub fn udp_socket(addr: SocketAddr, s: &TransportSettings) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        // Accept IPv4-mapped peers too when bound to the IPv6 wildcard.
        let _ = socket.set_only_v6(false);
    }
    if let Err(e) = socket.set_recv_buffer_size(s.udp_recv_buffer) {
        tracing::debug!(error = %e, "SO_RCVBUF not set");
    }
    if let Err(e) = socket.set_send_buffer_size(s.udp_send_buffer) {
        tracing::debug!(error = %e, "SO_SNDBUF not set");
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    tracing::debug!(
        %addr,
        recv_requested = s.udp_recv_buffer,
        recv_granted = socket.recv_buffer_size().unwrap_or(0),
        send_requested = s.udp_send_buffer,
        send_granted = socket.send_buffer_size().unwrap_or(0),
        "udp socket buffers (Linux reports twice the usable size; raise net.core.rmem_max / wmem_max for more)"
    );
    Ok(socket.into())
}

/// A quinn endpoint on `socket` (from [`udp_socket`]), serving `server` if given, driven by
/// the current tokio runtime. Must be called inside a tokio runtime.
pub fn endpoint(
    socket: std::net::UdpSocket,
    server: Option<quinn::ServerConfig>,
) -> std::io::Result<quinn::Endpoint> {
    quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        server,
        socket,
        Arc::new(quinn::TokioRuntime),
    )
}

/// The rustls crypto provider both ends use: always ring, built explicitly.
///
/// quinn's `rustls-ring` feature and rustls' own defaults can leave two providers compiled in
/// and no unambiguous process default, so nothing here relies on
/// `CryptoProvider::get_default`.
pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Why a TLS client configuration could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsConfigError {
    /// No CA certificate was given, so no relay could be trusted.
    #[error("no CA certificate to trust")]
    NoCa,
    /// A CA certificate could not be used as a trust anchor.
    #[error("unusable CA certificate {index}")]
    BadCa {
        /// Position of the certificate in the CA list.
        index: usize,
        /// What rustls said.
        #[source]
        source: rustls::Error,
    },
    /// rustls refused the configuration (for example a key that does not match the
    /// certificate, or a key type it cannot sign with).
    #[error("invalid TLS client configuration")]
    Rustls(#[from] rustls::Error),
    /// The provider lacks the cipher suite QUIC's initial packets need.
    #[error("TLS configuration unusable for QUIC")]
    Quic(#[from] quinn::crypto::rustls::NoInitialCipherSuite),
}

/// The QUIC client configuration of a lane: TLS 1.3 only, trusting exactly the CA
/// certificates `ca`, presenting `cert_chain` (leaf first) and `key` for mutual TLS, ALPN
/// [`ledger_relay_wire::ALPN`], with the transport settings `transport`.
pub fn client_config(
    ca: &[CertificateDer<'static>],
    cert_chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    transport: &TransportSettings,
) -> Result<quinn::ClientConfig, TlsConfigError> {
    if ca.is_empty() {
        return Err(TlsConfigError::NoCa);
    }
    let mut roots = rustls::RootCertStore::empty();
    for (index, cert) in ca.iter().enumerate() {
        roots
            .add(cert.clone())
            .map_err(|source| TlsConfigError::BadCa { index, source })?;
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_client_auth_cert(cert_chain, key)?;
    tls.alpn_protocols = vec![ledger_relay_wire::ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    config.transport_config(Arc::new(transport_config(transport)));
    Ok(config)
}

/// Why reading or writing a frame on a QUIC stream failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameIoError {
    /// Reading the stream failed (connection lost, stream reset).
    #[error("reading the stream failed")]
    Read(#[from] quinn::ReadError),
    /// Writing the stream failed (connection lost, stream stopped).
    #[error("writing the stream failed")]
    Write(#[from] quinn::WriteError),
    /// The bytes are not a valid frame, or the stream ended inside one: a protocol violation.
    #[error("invalid frame")]
    Frame(#[from] FrameError),
    /// A single-frame stream is longer than the largest frame allowed: a protocol violation.
    #[error("stream longer than the largest frame ({limit} bytes)")]
    TooLong {
        /// The limit, `Limits::max_frame_len()`.
        limit: usize,
    },
}

impl FrameIoError {
    /// Whether the peer broke the protocol (as opposed to the transport failing).
    pub fn is_protocol_violation(&self) -> bool {
        matches!(self, FrameIoError::Frame(_) | FrameIoError::TooLong { .. })
    }

    /// The connection error underneath, if the connection was lost.
    pub fn connection_error(&self) -> Option<&quinn::ConnectionError> {
        match self {
            FrameIoError::Read(quinn::ReadError::ConnectionLost(e))
            | FrameIoError::Write(quinn::WriteError::ConnectionLost(e)) => Some(e),
            _ => None,
        }
    }
}

/// Bytes asked of a control stream per read: bounds what is buffered beyond one frame.
const CONTROL_READ_PIECE: usize = 64 << 10;

/// Reads a sequence of frames from a control stream.
///
/// Each frame header is checked against the limits as soon as its 5 bytes are in, so an
/// oversize or unknown frame is refused before its body is buffered; at most one frame plus one
/// 64 KiB piece is ever held.
pub struct FrameReader {
    recv: quinn::RecvStream,
    decoder: FrameDecoder,
    buf: Box<[u8]>,
    finished: bool,
}

impl fmt::Debug for FrameReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameReader")
            .field("stream", &self.recv.id())
            .field("buffered", &self.decoder.buffered())
            .field("finished", &self.finished)
            .finish()
    }
}

impl FrameReader {
    /// A reader of `recv`, bounded by `limits`.
    pub fn new(recv: quinn::RecvStream, limits: Limits) -> FrameReader {
        FrameReader {
            recv,
            decoder: FrameDecoder::new(limits),
            buf: vec![0; CONTROL_READ_PIECE].into_boxed_slice(),
            finished: false,
        }
    }

    /// The next frame, or `Ok(None)` when the peer finished the stream at a frame boundary.
    /// A stream that ends inside a frame is an error.
    ///
    /// Cancel-safe: bytes read before a cancellation stay buffered for the next call.
    pub async fn next(&mut self) -> Result<Option<Frame>, FrameIoError> {
        loop {
            if let Some(frame) = self.decoder.poll()? {
                return Ok(Some(frame));
            }
            if self.finished {
                self.decoder.finish()?;
                return Ok(None);
            }
            match self.recv.read(&mut self.buf).await? {
                Some(n) => self.decoder.feed(&self.buf[..n])?,
                None => self.finished = true,
            }
        }
    }

    /// The stream underneath.
    pub fn stream_mut(&mut self) -> &mut quinn::RecvStream {
        &mut self.recv
    }
}

/// Writes frames to a control stream.
pub struct FrameWriter {
    send: quinn::SendStream,
    buf: Vec<u8>,
}

impl fmt::Debug for FrameWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameWriter")
            .field("stream", &self.send.id())
            .finish()
    }
}

/// Send priority of control streams: above the data streams (quinn's default, 0), so that a
/// heartbeat, an ack or an error is never queued behind megabytes of chunks on the same lane.
pub const CONTROL_PRIORITY: i32 = 1;

impl FrameWriter {
    /// A writer of `send`, which is given [`CONTROL_PRIORITY`].
    pub fn new(send: quinn::SendStream) -> FrameWriter {
        // Fails only on a stream already closed, whose writes will fail anyway.
        let _ = send.set_priority(CONTROL_PRIORITY);
        FrameWriter {
            send,
            buf: Vec::new(),
        }
    }

    /// Writes one frame. Not cancel-safe: a cancelled write may leave part of a frame sent.
    pub async fn write(&mut self, frame: &Frame) -> Result<(), FrameIoError> {
        self.buf.clear();
        frame.encode(&mut self.buf);
        self.send.write_all(&self.buf).await?;
        Ok(())
    }

    /// Finishes the stream (FIN) after what has been written.
    pub fn finish(&mut self) {
        // Finishing an already finished or reset stream is harmless.
        let _ = self.send.finish();
    }

    /// The stream underneath.
    pub fn stream_mut(&mut self) -> &mut quinn::SendStream {
        &mut self.send
    }
}

/// Both halves of a control stream.
#[derive(Debug)]
pub struct FrameIo {
    /// Frames from the peer.
    pub reader: FrameReader,
    /// Frames to the peer.
    pub writer: FrameWriter,
}

impl FrameIo {
    /// Frame IO over a bidirectional stream.
    pub fn new(send: quinn::SendStream, recv: quinn::RecvStream, limits: Limits) -> FrameIo {
        FrameIo {
            reader: FrameReader::new(recv, limits),
            writer: FrameWriter::new(send),
        }
    }
}

/// Writes `frame` to `send` as the whole content of a stream: the frame, then FIN.
pub async fn write_single_frame(
    send: &mut quinn::SendStream,
    frame: &Frame,
) -> Result<(), FrameIoError> {
    send.write_all(&frame.to_vec()).await?;
    // The stream was just written to, so it is open; a peer's STOP_SENDING shows up on the
    // write above or in the peer's own handling.
    let _ = send.finish();
    Ok(())
}

/// Ends a session or lane the way `docs/protocol.md` section 2 (Closing) says: writes `error`
/// on the control stream `send`, finishes it, waits up to `linger` for the peer to acknowledge
/// it and then to close the connection itself (it does once it has read the frame), then
/// closes `conn` with the application code `0x100 + code`.
///
/// The wait matters: closing a QUIC connection discards stream data not yet sent, and data the
/// peer's QUIC stack has acknowledged but its application has not read yet, so without it the
/// peer often sees only the close code and loses the frame's details (the bounds of
/// `BelowRetention`, the message). A peer that is gone or does not close costs at most
/// `linger`.
pub async fn close_with_error(
    conn: &quinn::Connection,
    send: &mut quinn::SendStream,
    error: &frame::ErrorFrame,
    linger: Duration,
) {
    let deadline = tokio::time::Instant::now() + linger;
    let sent = tokio::time::timeout_at(deadline, async {
        send.write_all(&Frame::Error(error.clone()).to_vec())
            .await?;
        // Finishing twice is harmless; the stream is ours.
        let _ = send.finish();
        let _ = send.stopped().await;
        Ok::<(), quinn::WriteError>(())
    })
    .await;
    match sent {
        Ok(Ok(())) => {
            let _ = tokio::time::timeout_at(deadline, conn.closed()).await;
        }
        Ok(Err(e)) => tracing::debug!(error = %e, "error frame not sent"),
        Err(_) => {}
    }
    let reason = frame::truncate_utf8(&error.message, 200);
    conn.close(VarInt::from_u32(error.code.close_code()), reason.as_bytes());
}

/// Reads a data stream to its end and decodes it as exactly one frame
/// (`docs/protocol.md` section 2, Data). A stream longer than `limits.max_frame_len()` is a
/// protocol violation ([`FrameIoError::TooLong`]), refused without buffering past the limit.
pub async fn read_single_frame(
    recv: &mut quinn::RecvStream,
    limits: &Limits,
) -> Result<Frame, FrameIoError> {
    let limit = limits.max_frame_len();
    let bytes = match recv.read_to_end(limit).await {
        Ok(bytes) => bytes,
        Err(quinn::ReadToEndError::TooLong) => return Err(FrameIoError::TooLong { limit }),
        Err(quinn::ReadToEndError::Read(e)) => return Err(e.into()),
    };
    Ok(frame::decode_exact(bytes.into(), limits)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("3 parsecs").is_err());
    }

    #[test]
    fn default_windows_cover_several_bdp() {
        let s = TransportSettings::default();
        // 5 Gbit/s x 2 ms.
        let bdp = 5_000_000_000u64 / 8 * 2 / 1000;
        assert!(s.receive_window >= 8 * bdp);
        assert!(s.stream_receive_window >= 4 << 20);
        assert!(s.send_window >= s.receive_window);
    }

    #[test]
    fn settings_read_from_toml() {
        let s: TransportSettings =
            toml::from_str("idle_timeout = \"30s\"\nkeep_alive = 500\ngso = false\n").unwrap();
        assert_eq!(s.idle_timeout, Duration::from_secs(30));
        assert_eq!(s.keep_alive, Duration::from_millis(500));
        assert!(!s.gso);
        assert_eq!(
            s.receive_window,
            TransportSettings::default().receive_window
        );
        assert!(toml::from_str::<TransportSettings>("idle = 3").is_err());
        assert!(toml::from_str::<TransportSettings>("idle_timeout = \"3 weeks\"").is_err());
    }
}
