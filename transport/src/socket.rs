//! Lane sockets and endpoints: every lane is its own UDP socket, so its own 5-tuple and flow.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::settings::TransportSettings;

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
/// the current tokio runtime, accepting datagrams up to `s.max_mtu`. Must be called inside a
/// tokio runtime.
pub fn endpoint(
    socket: std::net::UdpSocket,
    server: Option<quinn::ServerConfig>,
    s: &TransportSettings,
) -> std::io::Result<quinn::Endpoint> {
    quinn::Endpoint::new(
        crate::settings::endpoint_config(s),
        server,
        socket,
        Arc::new(quinn::TokioRuntime),
    )
}
