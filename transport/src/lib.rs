//! The QUIC plumbing Ledger Relay's two ends share, so that a lane is configured the same way on
//! either side and neither end builds on the other:
//!
//! - [`settings`]: a lane's transport settings (flow-control windows sized for the workload,
//!   UDP buffers, timeouts, MTU, GSO) and the quinn configuration built from them, with the
//!   relay's stricter limits on what a peer may open;
//! - [`socket`]: one UDP socket (one 5-tuple, one flow through the network) and one quinn
//!   endpoint per lane;
//! - [`tls`]: the mutual-TLS client and server configurations (TLS 1.3, the ring provider, the
//!   protocol's ALPN);
//! - [`frames`]: frame IO on QUIC streams, bounded by the protocol's limits, and the closing
//!   handshake of `docs/protocol.md` section 2;
//! - [`units`]: the one grammar of durations and sizes the CLIs and config files accept;
//! - [`now_ns`]: the wall clock both ends stamp and time ledgers with.
//!
//! What it does not do: decide anything about sessions, lanes or ledgers (that is the sans-IO
//! `ledger-relay-wire`), authorize clients (the relay's CA, allow-list and CRL live in
//! `ledger-relay`), or reassemble ledgers (`ledger-relay-subscriber`).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod frames;
pub mod settings;
pub mod socket;
pub mod tls;
pub mod units;

pub use frames::{
    close_with_error, read_data_frame, read_single_frame, write_single_frame, DataBudget,
    DataPermit, FrameIo, FrameIoError, FrameReader, FrameWriter, CONTROL_PRIORITY,
};
pub use settings::{endpoint_config, server_transport_config, transport_config, TransportSettings};
pub use socket::{endpoint, udp_socket};
pub use tls::{
    client_config, client_tls, crypto_provider, server_config, server_tls, TlsConfigError,
};
pub use units::{default_tag, format_duration, format_size, parse_duration, parse_size, UnitError};

/// Time in ns since the Unix epoch (wall clock), as carried in `LedgerEnd`'s first/last byte
/// stamps and used for every delivery time the relay, the subscriber and the bench report.
///
/// The wall clock, not a monotonic one, so that the relay's stamps and a subscriber's arrival
/// times on the same machine (or on NTP-synced machines) can be subtracted. A clock set before
/// 1970 reads as 0; one past the year 2554 saturates.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    #[test]
    fn now_ns_is_wall_clock() {
        let a = super::now_ns();
        // After 2020-01-01 and before 2200.
        assert!(a > 1_577_836_800_000_000_000 && a < 7_258_118_400_000_000_000);
        assert!(super::now_ns() >= a);
    }
}
