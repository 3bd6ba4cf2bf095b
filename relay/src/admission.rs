//! Who gets a connection or a session: the relay's caps (in all, per address, per identity),
//! and QUIC address validation when handshakes pile up.
//!
//! Anyone can send a QUIC Initial packet with any source address, and each one starts a
//! handshake the relay keeps for up to the handshake timeout. So:
//!
//! - a connection counts against `--max-connections` and `--max-connections-per-address` only
//!   once its address is validated: it came back with a QUIC Retry token, or it completed its
//!   handshake (which needs the relay's answers, sent to that address);
//! - handshakes from addresses not validated yet are capped apart (`--retry-threshold`): beyond
//!   that many, or when validated and unvalidated together fill `--max-connections`, a new
//!   attempt is answered with a Retry, which costs the relay one stateless packet. A real
//!   client comes back with the token (one round trip more) and is counted; a spoofed address
//!   never does;
//! - every count is taken before the task that serves the connection is spawned, under one
//!   lock with its check, and given back when the connection's [`Slot`] is dropped;
//! - once the client's identity is known, its connections count against
//!   `--max-connections-per-identity`; its sessions count against `--max-sessions` and
//!   `--max-sessions-per-identity` in the same step that puts them in the registry
//!   ([`register_session`]), so concurrent opens cannot all pass one check.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use ledger_relay_wire::sender::CloseReason;

use crate::metrics::Metrics;
use crate::session::SessionHandle;

/// The caps, from the relay's configuration ([`crate::server::ServerConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Most connections from validated addresses at once.
    pub max_connections: usize,
    /// Most connections from one validated IP address at once.
    pub max_connections_per_address: usize,
    /// Most connections of one client identity at once.
    pub max_connections_per_identity: usize,
    /// Most sessions at once.
    pub max_sessions: usize,
    /// Most sessions of one client identity at once.
    pub max_sessions_per_identity: usize,
    /// Handshakes from addresses not validated yet beyond which new attempts get a Retry
    /// (0: every attempt).
    pub retry_threshold: usize,
}

/// What to do with a connection attempt.
#[derive(Debug)]
pub enum Decision {
    /// Serve it; the slot holds its place in the counts.
    Admit(Slot),
    /// Answer with a QUIC Retry: the client must prove its address first.
    Retry,
    /// Refuse it (a cap is reached).
    Refuse(CloseReason),
}

#[derive(Debug, Default)]
struct Counts {
    /// Handshakes in progress from addresses not validated yet.
    unvalidated: usize,
    /// Connections from validated addresses.
    validated: usize,
    per_address: HashMap<IpAddr, usize>,
    per_identity: HashMap<String, usize>,
}

/// The relay's admission state. See the module documentation.
#[derive(Debug)]
pub struct Admission {
    caps: Caps,
    counts: Mutex<Counts>,
    metrics: Arc<Metrics>,
}

/// Where a connection stands in the counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Counted among the unvalidated handshakes.
    Unvalidated,
    /// Counted against the connection caps (and its address's).
    Validated,
    /// Counted nowhere (its validation was refused).
    Released,
}

/// A connection's place in the counts, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    admission: Arc<Admission>,
    addr: IpAddr,
    stage: Stage,
    identity: Option<String>,
}

fn decrement<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, key: &K) {
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

fn overloaded(detail: String) -> CloseReason {
    CloseReason::Overloaded { detail }
}

impl Admission {
    /// Admission with `caps`, keeping `metrics.connections_open` and
    /// `metrics.handshakes_unvalidated`.
    pub fn new(caps: Caps, metrics: Arc<Metrics>) -> Arc<Admission> {
        Arc::new(Admission {
            caps,
            counts: Mutex::new(Counts::default()),
            metrics,
        })
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Decides on a connection attempt from `addr`, whose address is `validated` (it carries a
    /// Retry token) or not.
    pub fn incoming(self: &Arc<Self>, addr: IpAddr, validated: bool) -> Decision {
        let mut c = self.counts();
        if !validated {
            let full = c.validated + c.unvalidated >= self.caps.max_connections;
            if c.unvalidated >= self.caps.retry_threshold || full {
                return Decision::Retry;
            }
            c.unvalidated += 1;
            drop(c);
            Metrics::add(&self.metrics.handshakes_unvalidated, 1);
            Metrics::add(&self.metrics.connections_open, 1);
            return Decision::Admit(self.slot(addr, Stage::Unvalidated));
        }
        if let Err(reason) = self.take_validated(&mut c, addr) {
            return Decision::Refuse(reason);
        }
        drop(c);
        Metrics::add(&self.metrics.connections_open, 1);
        Decision::Admit(self.slot(addr, Stage::Validated))
    }

    fn slot(self: &Arc<Self>, addr: IpAddr, stage: Stage) -> Slot {
        Slot {
            admission: self.clone(),
            addr,
            stage,
            identity: None,
        }
    }

    /// Counts a validated connection from `addr` against the connection caps.
    fn take_validated(&self, c: &mut Counts, addr: IpAddr) -> Result<(), CloseReason> {
        if c.validated >= self.caps.max_connections {
            return Err(overloaded("connection limit reached".into()));
        }
        let from = c.per_address.get(&addr).copied().unwrap_or(0);
        if from >= self.caps.max_connections_per_address {
            return Err(overloaded(format!(
                "connection limit of address {addr} reached"
            )));
        }
        c.validated += 1;
        *c.per_address.entry(addr).or_default() += 1;
        Ok(())
    }

    /// Registers `handle` as an open session, if the session caps allow: checked and inserted
    /// under the registry's lock, so that concurrent opens cannot all pass one check.
    pub fn register_session(
        &self,
        registry: &Mutex<HashMap<u64, SessionHandle>>,
        handle: SessionHandle,
    ) -> Result<(), CloseReason> {
        let mut reg = registry.lock().unwrap_or_else(|e| e.into_inner());
        if reg.len() >= self.caps.max_sessions {
            return Err(overloaded("session limit reached".into()));
        }
        let name = &handle.client.name;
        let of_identity = reg.values().filter(|h| h.client.name == *name).count();
        if of_identity >= self.caps.max_sessions_per_identity {
            return Err(overloaded(format!(
                "session limit of identity {name} reached"
            )));
        }
        reg.insert(handle.id, handle);
        Ok(())
    }
}

impl Slot {
    /// The handshake completed, so the address is proven: a connection admitted unvalidated
    /// now counts against the connection caps, or is refused.
    pub fn handshake_done(&mut self) -> Result<(), CloseReason> {
        if self.stage != Stage::Unvalidated {
            return Ok(());
        }
        let a = self.admission.clone();
        let mut c = a.counts();
        c.unvalidated -= 1;
        a.metrics
            .handshakes_unvalidated
            .fetch_sub(1, Ordering::Relaxed);
        match a.take_validated(&mut c, self.addr) {
            Ok(()) => {
                self.stage = Stage::Validated;
                Ok(())
            }
            Err(reason) => {
                self.stage = Stage::Released;
                Err(reason)
            }
        }
    }

    /// Counts the connection against its client identity's cap, or refuses it.
    pub fn identify(&mut self, identity: &str) -> Result<(), CloseReason> {
        if self.identity.is_some() {
            return Ok(());
        }
        let a = self.admission.clone();
        let mut c = a.counts();
        let n = c.per_identity.entry(identity.to_owned()).or_default();
        if *n >= a.caps.max_connections_per_identity {
            if *n == 0 {
                c.per_identity.remove(identity);
            }
            return Err(overloaded(format!(
                "connection limit of identity {identity} reached"
            )));
        }
        *n += 1;
        self.identity = Some(identity.to_owned());
        Ok(())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let a = &self.admission;
        let mut c = a.counts();
        match self.stage {
            Stage::Unvalidated => {
                c.unvalidated -= 1;
                a.metrics
                    .handshakes_unvalidated
                    .fetch_sub(1, Ordering::Relaxed);
            }
            Stage::Validated => {
                c.validated -= 1;
                decrement(&mut c.per_address, &self.addr);
            }
            Stage::Released => {}
        }
        if let Some(identity) = &self.identity {
            decrement(&mut c.per_identity, identity);
        }
        drop(c);
        a.metrics.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> Caps {
        Caps {
            max_connections: 4,
            max_connections_per_address: 2,
            max_connections_per_identity: 3,
            max_sessions: 8,
            max_sessions_per_identity: 8,
            retry_threshold: 2,
        }
    }

    fn admit(d: Decision) -> Slot {
        match d {
            Decision::Admit(s) => s,
            other => panic!("expected Admit, got {other:?}"),
        }
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 0, 2));
    const C: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 0, 3));

    #[test]
    fn unvalidated_handshakes_beyond_the_threshold_get_a_retry() {
        let m = Metrics::new();
        let adm = Admission::new(caps(), m.clone());
        let u1 = admit(adm.incoming(A, false));
        let _u2 = admit(adm.incoming(A, false));
        assert!(matches!(adm.incoming(A, false), Decision::Retry));
        assert_eq!(m.handshakes_unvalidated.load(Ordering::Relaxed), 2);
        // Validated attempts do not wait behind them.
        let _v = admit(adm.incoming(B, true));
        drop(u1);
        let _u3 = admit(adm.incoming(C, false));
        assert_eq!(m.connections_open.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn only_validated_connections_fill_the_caps() {
        let adm = Admission::new(caps(), Metrics::new());
        let mut held = Vec::new();
        for addr in [A, A, B, B] {
            held.push(admit(adm.incoming(addr, true)));
        }
        // Full: validated attempts are refused, unvalidated ones asked to validate.
        assert!(matches!(adm.incoming(C, true), Decision::Refuse(_)));
        assert!(matches!(adm.incoming(C, false), Decision::Retry));
        held.pop();
        // Per address: A has 2.
        assert!(matches!(adm.incoming(A, true), Decision::Refuse(_)));
        let _c = admit(adm.incoming(C, true));
    }

    #[test]
    fn a_completed_handshake_counts_or_is_refused() {
        let adm = Admission::new(caps(), Metrics::new());
        let _a1 = admit(adm.incoming(A, true));
        let _a2 = admit(adm.incoming(A, true));
        let mut u = admit(adm.incoming(A, false));
        assert!(u.handshake_done().is_err(), "A has its 2");
        drop(u);
        let mut u = admit(adm.incoming(B, false));
        u.handshake_done().unwrap();
        u.handshake_done().unwrap();
        assert_eq!(adm.counts().validated, 3);
        assert_eq!(adm.counts().unvalidated, 0);
        drop(u);
        assert_eq!(adm.counts().validated, 2);
    }

    #[test]
    fn identities_are_capped_and_released() {
        let mut c = caps();
        c.max_connections = 100;
        c.max_connections_per_address = 100;
        let adm = Admission::new(c, Metrics::new());
        let mut held = Vec::new();
        for _ in 0..3 {
            let mut s = admit(adm.incoming(A, true));
            s.identify("rpc-1").unwrap();
            held.push(s);
        }
        let mut s = admit(adm.incoming(A, true));
        assert!(s.identify("rpc-1").is_err());
        s.identify("rpc-2").unwrap();
        held.clear();
        drop(s);
        assert!(adm.counts().per_identity.is_empty());
        assert!(adm.counts().per_address.is_empty());
    }
}
