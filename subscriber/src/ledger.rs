//! What a subscription yields ([`Ledger`], [`Item`]), what it reports ([`Status`]), and the
//! state its sessions share with the supervisor ([`Shared`]): the types both `client` (the
//! supervisor behind the Stream) and `session` (one session with one relay) use, so neither
//! module depends on the other's insides.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use rustls::pki_types::CertificateDer;

use crate::config::SubscribeConfig;
use crate::error::SubscribeError;

/// A complete, verified ledger, as delivered to the consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    /// Ledger sequence.
    pub seq: u32,
    /// The raw `LedgerCloseMeta` XDR, exactly as stellar-core wrote it (without the record
    /// mark).
    pub data: Bytes,
    /// Its raw length: `data.len()`, except in receive-only mode (a bench mode,
    /// `SubscribeConfig::receive_only`), where `data` is empty and this is the end record's.
    pub raw_len: u64,
    /// `LedgerHeaderHistoryEntry.hash`, checked against the header and the end record.
    pub header_hash: [u8; 32],
    /// `LedgerHeader.previousLedgerHash`, checked to equal the previous ledger's hash.
    pub previous_hash: [u8; 32],
    /// Relay clock when it read the ledger's first byte from its source, ns since the Unix
    /// epoch.
    pub relay_first_byte_ns: u64,
    /// Relay clock when it read the ledger's last byte, ns since the Unix epoch.
    pub relay_last_byte_ns: u64,
    /// Our clock when the ledger was complete and verified, ns since the Unix epoch. On one
    /// machine (or with synchronized clocks), `received_ns - relay_last_byte_ns` is the
    /// delivery latency.
    pub received_ns: u64,
    /// Payload bytes received for it (compressed size, each chunk counted once).
    pub wire_bytes: u64,
    /// The relay it came from.
    pub relay: SocketAddr,
}

/// A snapshot of the subscription's state, for status lines and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Status {
    /// The relay of the current session, if one is up.
    pub relay: Option<SocketAddr>,
    /// Lanes connected and joined.
    pub lanes_up: u8,
    /// Lanes the relay granted for the current session.
    pub lanes_granted: u8,
    /// The newest ledger the relay holds, from its last heartbeat (0: unknown).
    pub newest: u32,
    /// The last ledger handed to the consumer (0: none yet).
    pub last_delivered: u32,
    /// Ledgers handed to the consumer.
    pub delivered: u64,
    /// Sessions attempted: the first, plus one per reconnect.
    pub sessions: u64,
    /// Why the last session ended, if one did.
    pub last_error: Option<String>,
    /// Whether a relay was reached at least once (lane 0's QUIC and TLS handshake completed).
    pub reached: bool,
}

/// A relay certificate that expires within this long is warned about in the log.
pub const RELAY_CERT_WARNING: Duration = Duration::from_secs(30 * 86_400);

/// Shared state of one subscription.
pub(crate) struct Shared {
    pub(crate) config: SubscribeConfig,
    pub(crate) client: quinn::ClientConfig,
    /// Per-lane figures, shared with the subscription's [`crate::LaneMonitor`]s (and, in a
    /// hedged subscription, with every relay's own subscription).
    pub(crate) lanes: crate::LaneMonitor,
    status: Mutex<Status>,
    /// Relays whose expiring certificate was already warned about: once per relay, not once
    /// per reconnect.
    warned: Mutex<HashSet<String>>,
    /// Where the next ledger's bytes go as they arrive, for cut-through (see
    /// [`crate::connect_cut_through`]); `None` for a plain subscription.
    pub(crate) prefixes: Option<tokio::sync::mpsc::Sender<ledger_relay_wire::Prefix>>,
    /// A hedged subscription's first-look counts (empty for a plain one).
    pub(crate) first_look: Mutex<crate::first_look::Tally>,
}

impl Shared {
    pub(crate) fn new(
        config: SubscribeConfig,
        client: quinn::ClientConfig,
        lanes: crate::LaneMonitor,
    ) -> Shared {
        Shared {
            config,
            client,
            lanes,
            status: Mutex::new(Status::default()),
            warned: Mutex::new(HashSet::new()),
            prefixes: None,
            first_look: Mutex::default(),
        }
    }

    /// Lane 0 of a session to `relay` completed its handshake: the relay is reachable, and
    /// its certificate (verified by then) is checked for an expiry within
    /// [`RELAY_CERT_WARNING`].
    pub(crate) fn lane0_connected(&self, relay: &str, conn: &quinn::Connection) {
        self.status().reached = true;
        let not_after = conn
            .peer_identity()
            .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok())
            .and_then(|chain| {
                chain
                    .first()
                    .and_then(|leaf| ledger_relay_certs::cert_not_after(leaf).ok())
            });
        let Some(not_after) = not_after else { return };
        let left = not_after
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        if left >= RELAY_CERT_WARNING {
            return;
        }
        let first = self
            .warned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(relay.to_owned());
        if first {
            let days_left = left.as_secs() / 86_400;
            tracing::warn!(
                relay = %relay,
                days_left,
                "the relay's certificate expires within 30 days: renew it (ledger-certs renew) and restart the relay"
            );
        }
    }

    /// The status, for updating. A panic while it was held cannot leave it inconsistent in a
    /// way that matters (it is only counters), so a poisoned lock is used as is.
    pub(crate) fn status(&self) -> MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The first-look counts, for updating (counters only, so a poisoned lock is used as is).
    pub(crate) fn first_look(&self) -> MutexGuard<'_, crate::first_look::Tally> {
        self.first_look.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the Stream yields.
pub type Item = Result<Ledger, SubscribeError>;
