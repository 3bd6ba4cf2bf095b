//! Per-lane figures of a subscription, from quinn's statistics of each lane's QUIC connection
//! ([`quinn::Connection::stats`]): what a network engineer looks at per flow.
//!
//! Counters are cumulative over the subscription: when a lane's connection ends (the lane
//! rejoins, the session reconnects) its last figures are kept and the next connection's are
//! added to them, so a reader can take differences between two snapshots for rates. The path
//! figures (round trip, congestion window, path MTU) are the current connection's, or the last
//! one's while the lane is down. Lanes are keyed by relay and lane number, so a hedged
//! subscription shows each relay's lanes.
//!
//! What each end can see: the subscriber receives the data, so its `rx_*` counters are the
//! lane's data direction; `lost_packets`, `cwnd` and `mtu` describe what the subscriber sends
//! (acknowledgements and control frames) on the reverse path, as quinn's sender accounting
//! does. The data direction's losses and window are on the relay's side
//! (`ledger_relay_lane_lost_packets_total`, `ledger_relay_lane_cwnd_bytes`). The round trip is
//! the same path seen from either end.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// One lane's figures (see the module documentation for which direction each describes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaneStats {
    /// The relay the lane connects to.
    pub relay: Option<SocketAddr>,
    /// Lane number (0 opens the session).
    pub lane: u8,
    /// Whether the lane is connected and joined now.
    pub up: bool,
    /// QUIC connections the lane has had (1, plus one per rejoin or reconnect).
    pub connections: u64,
    /// UDP payload bytes received (QUIC packets, headers included).
    pub rx_bytes: u64,
    /// UDP datagrams received.
    pub rx_packets: u64,
    /// UDP payload bytes sent (acknowledgements, control frames).
    pub tx_bytes: u64,
    /// UDP datagrams sent.
    pub tx_packets: u64,
    /// Packets this end sent that were declared lost (reverse path).
    pub lost_packets: u64,
    /// Congestion events on this end's sending side.
    pub congestion_events: u64,
    /// Times PMTU discovery detected a black hole and fell back to the minimum packet size.
    pub black_holes: u64,
    /// Smoothed round trip.
    pub rtt: Duration,
    /// Smallest round trip seen.
    pub min_rtt: Duration,
    /// This end's congestion window, bytes.
    pub cwnd: u64,
    /// Current path MTU (largest UDP payload the path carries, as PMTU discovery found).
    pub mtu: u16,
}

impl LaneStats {
    /// The CSV header matching [`LaneStats::csv_row`].
    pub const CSV_HEADER: &'static str = "unix_ms,relay,lane,up,connections,rx_bytes,rx_packets,\
tx_bytes,tx_packets,lost_packets,congestion_events,black_holes,rtt_ms,min_rtt_ms,cwnd_bytes,mtu_bytes";

    /// One CSV row (newline included), stamped `unix_ms` (ms since the Unix epoch).
    pub fn csv_row(&self, unix_ms: f64) -> String {
        format!(
            "{unix_ms:.3},{},{},{},{},{},{},{},{},{},{},{},{:.3},{:.3},{},{}\n",
            self.relay.map(|a| a.to_string()).unwrap_or_default(),
            self.lane,
            u8::from(self.up),
            self.connections,
            self.rx_bytes,
            self.rx_packets,
            self.tx_bytes,
            self.tx_packets,
            self.lost_packets,
            self.congestion_events,
            self.black_holes,
            self.rtt.as_secs_f64() * 1e3,
            self.min_rtt.as_secs_f64() * 1e3,
            self.cwnd,
            self.mtu,
        )
    }

    fn add_counters(&mut self, st: &quinn::ConnectionStats) {
        self.rx_bytes += st.udp_rx.bytes;
        self.rx_packets += st.udp_rx.datagrams;
        self.tx_bytes += st.udp_tx.bytes;
        self.tx_packets += st.udp_tx.datagrams;
        self.lost_packets += st.path.lost_packets;
        self.congestion_events += st.path.congestion_events;
        self.black_holes += st.path.black_holes_detected;
    }

    fn set_path(&mut self, st: &quinn::ConnectionStats) {
        self.rtt = st.path.rtt;
        self.min_rtt = st.path.min_rtt;
        self.cwnd = st.path.cwnd;
        self.mtu = st.path.current_mtu;
    }
}

/// One lane's slot: the totals of its ended connections and its current connection.
#[derive(Default)]
struct Slot {
    done: LaneStats,
    conn: Option<quinn::Connection>,
}

impl Slot {
    fn snapshot(&self) -> LaneStats {
        let mut s = self.done;
        if let Some(conn) = &self.conn {
            let st = conn.stats();
            s.add_counters(&st);
            s.set_path(&st);
            s.up = true;
        }
        s
    }

    /// Folds the current connection's figures into the totals and lets it go.
    fn retire(&mut self) {
        if let Some(conn) = self.conn.take() {
            let st = conn.stats();
            self.done.add_counters(&st);
            self.done.set_path(&st);
        }
        self.done.up = false;
    }
}

/// Every lane of a subscription (the table sessions update and [`LaneMonitor`] reads).
#[derive(Default)]
pub(crate) struct LaneTable {
    slots: Mutex<BTreeMap<(Option<SocketAddr>, u8), Slot>>,
}

impl LaneTable {
    fn slots(&self) -> MutexGuard<'_, BTreeMap<(Option<SocketAddr>, u8), Slot>> {
        // Only counters: a panic while held leaves nothing inconsistent that matters.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lane `lane` to `relay` is up on `conn` (a previous connection of the lane is retired).
    pub(crate) fn up(&self, relay: SocketAddr, lane: u8, conn: &quinn::Connection) {
        let mut slots = self.slots();
        let slot = slots.entry((Some(relay), lane)).or_default();
        slot.retire();
        slot.done.relay = Some(relay);
        slot.done.lane = lane;
        slot.done.connections += 1;
        slot.conn = Some(conn.clone());
    }

    /// Lane `lane` to `relay` is down.
    pub(crate) fn down(&self, relay: SocketAddr, lane: u8) {
        if let Some(slot) = self.slots().get_mut(&(Some(relay), lane)) {
            slot.retire();
        }
    }

    fn snapshot(&self) -> Vec<LaneStats> {
        self.slots().values().map(Slot::snapshot).collect()
    }
}

/// A handle on a subscription's per-lane figures, to read them from any task or thread while
/// the subscription's Stream is consumed elsewhere (`Subscription::lane_monitor`). Cheap to
/// clone; it stays readable after the subscription ends (its lanes then show down).
#[derive(Clone, Default)]
pub struct LaneMonitor(pub(crate) Arc<LaneTable>);

impl std::fmt::Debug for LaneMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneMonitor").finish_non_exhaustive()
    }
}

impl LaneMonitor {
    /// Every lane the subscription has opened, by relay and lane number, with its figures now.
    pub fn snapshot(&self) -> Vec<LaneStats> {
        self.0.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_rows_match_the_header() {
        let s = LaneStats {
            relay: Some("127.0.0.1:7000".parse().unwrap()),
            lane: 3,
            up: true,
            connections: 2,
            rx_bytes: 1000,
            rtt: Duration::from_micros(1500),
            mtu: 1452,
            ..LaneStats::default()
        };
        let row = s.csv_row(12.5);
        assert_eq!(
            row.trim_end().split(',').count(),
            LaneStats::CSV_HEADER.split(',').count()
        );
        assert_eq!(
            row,
            "12.500,127.0.0.1:7000,3,1,2,1000,0,0,0,0,0,0,1.500,0.000,0,1452\n"
        );
        // An empty table snapshots to nothing; a lane down without a slot is ignored.
        let t = LaneTable::default();
        t.down("127.0.0.1:1".parse().unwrap(), 0);
        assert!(t.snapshot().is_empty());
    }
}
