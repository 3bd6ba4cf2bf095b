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
    use quinn::Runtime as _;
    let runtime = Arc::new(quinn::TokioRuntime);
    let socket = Arc::new(GsoBounded {
        inner: runtime.wrap_udp_socket(socket)?,
        max_segments: gso_segments(crate::settings::mtu_ceiling(s)),
    });
    quinn::Endpoint::new_with_abstract_socket(
        crate::settings::endpoint_config(s),
        server,
        socket,
        runtime,
    )
}

/// The most UDP payload one `sendmsg` may carry: an IPv4 datagram's 65,535 bytes less its IP
/// and UDP headers. A GSO batch is one datagram to the kernel until it is segmented.
const MAX_GSO_BYTES: usize = 65_507;

/// Packets of `mtu` bytes one GSO batch may hold: at most [`MAX_GSO_BYTES`] in all, and at
/// least one.
pub fn gso_segments(mtu: u16) -> usize {
    (MAX_GSO_BYTES / usize::from(mtu.max(1))).max(1)
}

/// The runtime's UDP socket with its GSO batches bounded to [`MAX_GSO_BYTES`].
///
/// quinn batches up to 10 packets of the path MTU into one `sendmsg`; at 8,952-byte packets
/// that is 89,520 bytes, which Linux refuses with `EMSGSIZE`, and quinn-udp takes `EMSGSIZE`
/// for a failed MTU probe and drops the whole batch without a word. Every batch of more than
/// seven jumbo packets was lost and resent (bench/RESULTS.md, "Levers": a third of the
/// packets declared lost on loopback where the kernel dropped none).
#[derive(Debug)]
struct GsoBounded {
    inner: Arc<dyn quinn::AsyncUdpSocket>,
    max_segments: usize,
}

impl quinn::AsyncUdpSocket for GsoBounded {
    fn create_io_poller(self: Arc<Self>) -> std::pin::Pin<Box<dyn quinn::UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &quinn::udp::Transmit<'_>) -> std::io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut std::task::Context<'_>,
        bufs: &mut [std::io::IoSliceMut<'_>],
        meta: &mut [quinn::udp::RecvMeta],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments().min(self.max_segments)
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gso_batch_fits_one_udp_datagram() {
        // quinn's own cap of 10 still binds at the default 1452.
        assert_eq!(gso_segments(1452), 45);
        assert_eq!(gso_segments(8952), 7);
        assert!(gso_segments(8952) * 8952 <= MAX_GSO_BYTES);
        assert!((gso_segments(8952) + 1) * 8952 > MAX_GSO_BYTES);
        assert_eq!(gso_segments(65_527), 1);
        assert_eq!(gso_segments(0), 65_507);
    }
}
