//! A lane's QUIC transport settings, the same on both ends, and the quinn configuration built
//! from them.

use std::time::Duration;

use quinn::{IdleTimeout, MtuDiscoveryConfig, VarInt};
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
/// default), durations are written as `"10s"`, `"500ms"`, `"2m"` ([`crate::units`]) or a
/// number of milliseconds.
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
    #[serde(with = "crate::units::serde_duration")]
    pub idle_timeout: Duration,
    /// Keep-alive interval (default 5 s, at most half the idle timeout), so an idle but healthy
    /// lane (a subscriber waiting at the tip) is never timed out. A packet sent or received
    /// restarts it: lane 0 of a session never needs one (the relay's heartbeats keep it
    /// busy), lanes 1.. of an idle session exchange a ping and its acknowledgement once per
    /// interval. The relay's end waits half as long again (at most three quarters of the idle
    /// timeout), so that the subscriber's ping comes first rather than one from each end. A shorter interval costs an idle relay CPU on every lane of every session
    /// (`bench/RESULTS.md`, "Idle sessions") and detects nothing sooner: a dead peer is found by
    /// the idle timeout.
    #[serde(with = "crate::units::serde_duration")]
    pub keep_alive: Duration,
    /// First packet size (default 1200, the QUIC minimum, safe on any path); path MTU discovery
    /// then raises it (to 1452 on a 1500-byte Ethernet path, or up to the jumbo-frame size
    /// within a VPC).
    pub initial_mtu: u16,
    /// UDP payload the network is known to carry (default 1200, the QUIC minimum): where
    /// quinn's black-hole detection falls back to after a burst of lost large packets, and
    /// the floor of the first packets. On a path known to carry jumbo frames (within an EC2
    /// VPC), 8952 with `max_mtu = 8952` keeps every packet large; a lower value lets a burst
    /// of ordinary losses drop the lane to 1200-byte packets for a minute (`bench/RESULTS.md`,
    /// "Levers"; on loopback, kept at 8952 it cost more CPU, not less, since quinn declared a
    /// third of the large packets lost). Too high for the real path, and packets of that size
    /// are simply lost.
    pub min_mtu: u16,
    /// Generic segmentation offload (default on): quinn hands the kernel up to 64 KiB of
    /// packets per send call, which roughly halves the CPU cost of sending.
    pub gso: bool,
    /// Largest UDP payload path MTU discovery searches for and the endpoint accepts (default
    /// 1452, quinn's: a 1500-byte Ethernet frame less IPv6 and UDP headers). 8952 lets a lane
    /// find the 9001-byte jumbo frames EC2 carries within a VPC, and every packet costs the
    /// same header processing, encryption set-up and acknowledgement work whatever its size;
    /// but measured on loopback here, bare quinn at 8952 cost about 26% more CPU per ledger
    /// than at 1500, not less: quinn's black-hole detection took loss bursts for an MTU black
    /// hole and fell back to 1200-byte packets (bench/RESULTS.md, "Levers"; see `min_mtu`),
    /// so it is not the default.
    pub max_mtu: u16,
    /// Whether a lane interleaves its open streams fairly (default off). Off, a lane sends
    /// its streams in the order they were opened, so each chunk completes as early as its
    /// place in the queue allows and a ledger's chunks complete in order; on, every open
    /// stream advances together and all of them finish late.
    pub fair_streams: bool,
    /// Ack-eliciting packets the receiver may take before it must acknowledge (the QUIC
    /// ACK-frequency extension; default 0: the standard, every other packet). Fewer
    /// acknowledgements save work at both ends on a bulk path, but a stream is done for the
    /// relay only once its last byte is acknowledged: with 8, acknowledgements of small
    /// streams waited for the receiver's ACK delay (25 ms), lanes measured that as their rate
    /// and a subscriber of small-chunk ledgers fell out of a 5-ledger ring (the bench's
    /// `slow-subscriber` test), for no CPU saving measurable in the demo. On the fan-out bench,
    /// 4 cost 10% less relay CPU per extra subscriber with `max_mtu` 8952 alone, and nothing
    /// measurable with `min_mtu` 8952 too or at 1452 (bench/RESULTS.md, "ACK frequency,
    /// measured where it runs"): leave it at 0.
    pub ack_eliciting_threshold: u32,
}

impl TransportSettings {
    /// Sets `max_mtu` and `min_mtu` to those given (an operator's `--max-mtu`/`--min-mtu`),
    /// leaving the others as they are.
    pub fn set_mtu(&mut self, max_mtu: Option<u16>, min_mtu: Option<u16>) {
        if let Some(mtu) = max_mtu {
            self.max_mtu = mtu;
        }
        if let Some(mtu) = min_mtu {
            self.min_mtu = mtu;
        }
    }
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
            keep_alive: Duration::from_secs(5),
            initial_mtu: 1200,
            min_mtu: 1200,
            gso: true,
            max_mtu: 1452,
            fair_streams: false,
            ack_eliciting_threshold: 0,
        }
    }
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
        .keep_alive_interval(keep_alive(s))
        .initial_mtu(first_packet(s))
        .min_mtu(s.min_mtu.max(1200))
        .mtu_discovery_config(Some(mtu_discovery(s)))
        .enable_segmentation_offload(s.gso)
        .send_fairness(s.fair_streams)
        // Neither end sends QUIC datagrams: offering no buffer for them means a peer may not
        // send any (quinn closes a connection that does), rather than filling one nothing reads.
        .datagram_receive_buffer_size(None);
    let mut cubic = quinn::congestion::CubicConfig::default();
    cubic.initial_window(initial_window(first_packet(s)));
    t.congestion_controller_factory(std::sync::Arc::new(cubic));
    if s.ack_eliciting_threshold > 0 {
        let mut ack = quinn::AckFrequencyConfig::default();
        ack.ack_eliciting_threshold(VarInt::from_u32(s.ack_eliciting_threshold));
        t.ack_frequency_config(Some(ack));
    }
    t
}

/// The size of a lane's first packets: `initial_mtu`, at least `min_mtu` and QUIC's 1200.
fn first_packet(s: &TransportSettings) -> u16 {
    s.initial_mtu.max(s.min_mtu).max(1200)
}

/// The congestion window a lane starts with for first packets of `packet` bytes: RFC 9002's
/// `min(10 * size, max(14720, 2 * size))`. quinn computes it for 1200-byte packets (12000
/// bytes) whatever the first packets are; at 8952 that is less than two packets, and the
/// padded first flight alone then blocked the next packet until an acknowledgement came,
/// which a subscriber asked for ACK frequency delayed past the handshake (every lane timed
/// out). Two packets always fit.
fn initial_window(packet: u16) -> u64 {
    let size = u64::from(packet);
    (2 * size).max(14720).min(10 * size)
}

/// The keep-alive interval of a lane: `keep_alive`, at most half the idle timeout so that one
/// lost ping does not end a healthy lane; `None` when `keep_alive` is zero.
fn keep_alive(s: &TransportSettings) -> Option<Duration> {
    (!s.keep_alive.is_zero()).then(|| within_idle(s.keep_alive, s.idle_timeout, 1, 2))
}

/// The relay's keep-alive interval: [`keep_alive`]'s, half as long again, so that the
/// subscriber's ping (which restarts the relay's interval) always comes first; at most three
/// quarters of the idle timeout.
fn server_keep_alive(s: &TransportSettings) -> Option<Duration> {
    keep_alive(s).map(|k| within_idle(k * 3 / 2, s.idle_timeout, 3, 4))
}

/// `interval`, at most `num / den` of `idle` (no bound when the idle timeout is zero: none).
fn within_idle(interval: Duration, idle: Duration, num: u32, den: u32) -> Duration {
    if idle.is_zero() {
        interval
    } else {
        interval.min(idle * num / den)
    }
}

/// The largest UDP payload a lane searches for and accepts: `max_mtu`, never below `min_mtu`
/// or QUIC's 1200.
pub(crate) fn mtu_ceiling(s: &TransportSettings) -> u16 {
    s.max_mtu.max(s.min_mtu).max(1200)
}

fn mtu_discovery(s: &TransportSettings) -> MtuDiscoveryConfig {
    let mut m = MtuDiscoveryConfig::default();
    m.upper_bound(mtu_ceiling(s));
    m
}

/// The endpoint configuration of a lane: it accepts datagrams up to [`TransportSettings::max_mtu`].
pub fn endpoint_config(s: &TransportSettings) -> quinn::EndpointConfig {
    let mut e = quinn::EndpointConfig::default();
    // Within 1200..=65527, which is all quinn refuses.
    let _ = e.max_udp_payload_size(mtu_ceiling(s).min(65_527));
    e
}

/// The relay's side of a lane: what it sends is sized by `settings`; what it lets a peer send
/// is only ever a control stream of small frames. A subscriber opens no unidirectional stream
/// and one bidirectional stream per lane, so a hostile peer can make the relay hold at most one
/// control stream's window per connection, not hundreds of streams' worth.
pub fn server_transport_config(settings: &TransportSettings) -> quinn::TransportConfig {
    let mut t = transport_config(settings);
    // Room for the largest control frame (a Resend naming every chunk of a maximal ledger).
    let control_window = VarInt::from_u32(256 << 10);
    t.keep_alive_interval(server_keep_alive(settings))
        .max_concurrent_uni_streams(0u32.into())
        .max_concurrent_bidi_streams(1u32.into())
        .stream_receive_window(control_window)
        .receive_window(control_window);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_lane_starts_with_room_for_two_of_its_first_packets() {
        assert_eq!(initial_window(1200), 12000);
        assert_eq!(initial_window(1452), 14520);
        assert_eq!(initial_window(8952), 17904);
        let jumbo = TransportSettings {
            min_mtu: 8952,
            max_mtu: 8952,
            ..TransportSettings::default()
        };
        assert_eq!(first_packet(&jumbo), 8952);
        assert_eq!(first_packet(&TransportSettings::default()), 1200);
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
        // A keep-alive longer than half the idle timeout is cut to it.
        let short: TransportSettings = toml::from_str("idle_timeout = \"4s\"").unwrap();
        assert_eq!(keep_alive(&short), Some(Duration::from_secs(2)));
        assert_eq!(keep_alive(&s), Some(Duration::from_millis(500)));
        let default = TransportSettings::default();
        assert_eq!(keep_alive(&default), Some(Duration::from_secs(5)));
        assert_eq!(
            server_keep_alive(&default),
            Some(Duration::from_millis(7500))
        );
        assert_eq!(server_keep_alive(&short), Some(Duration::from_secs(3)));
        assert!(toml::from_str::<TransportSettings>("idle_timeout = \"3 parsecs\"").is_err());
    }
}
