//! Who gets a connection or a session: the pool of handshakes not yet authenticated, the
//! relay's caps (in all, per address, per identity), and QUIC address validation.
//!
//! Anyone can start a QUIC handshake: from a forged source address (an Initial packet), or
//! from a real one that answers the relay's Retry and then goes silent, with no client
//! certificate. Neither may take a subscriber's place, so:
//!
//! - a connection counts against `--max-connections`, `--max-connections-per-address` and
//!   `--max-connections-per-identity` only once its handshake completed with a client
//!   certificate the relay verified ([`Pending::authenticated`]). With quinn's server-side
//!   TLS 1.3 a handshake completes (the `Incoming` resolves to a connection) only after the
//!   client's Finished, which rustls takes only after its client verifier checked the
//!   certificate chain against the CA and CRL and the CertificateVerify signature; the
//!   certificate is mandatory (the verifier is built without `allow_unauthenticated`);
//! - until then the handshake holds a place in the pending pool ([`pool`]):
//!   `--handshake-pool` places, `--handshake-pool-per-source` of them at most for one source
//!   (an IPv4 address or an IPv6 /64), each for at most `--handshake-timeout`. When the pool
//!   is full, an attempt from a source holding fewer than the heaviest one (by two: see
//!   [`pool`]) displaces that source's oldest pending handshake (its task is cancelled, which
//!   closes it), so a flood from a few addresses cannot keep a real subscriber out, however
//!   fast it goes;
//! - handshakes from addresses not validated yet (no Retry token) are capped apart within
//!   the pool (`--retry-threshold`): beyond that many, or once the pool is half full, a new
//!   attempt is answered with a Retry, which costs the relay one stateless packet. A real
//!   client comes back with the token one round trip later; a forged address never does. An
//!   unvalidated handshake counts toward no address's share and is never displaced;
//! - an attempt that authenticated connections would refuse anyway (they fill
//!   `--max-connections`, or its address's `--max-connections-per-address`) is refused, or
//!   retried when unvalidated, before any handshake; the caps are checked again, and taken,
//!   when it authenticates;
//! - every decision is taken under one lock in the accept loop, before the task that serves
//!   the connection is spawned, and every place is given back when its guard ([`Pending`],
//!   [`Slot`]) is dropped;
//! - sessions count against `--max-sessions` and `--max-sessions-per-identity` in the same
//!   step that puts them in the registry ([`Admission::register_session`]), so concurrent
//!   opens cannot all pass one check.

mod pool;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use ledger_relay_wire::sender::CloseReason;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::metrics::Metrics;
use crate::session::SessionHandle;
pub use pool::Crowded;
use pool::{Pool, PoolLimits, Verdict};

/// The caps, from the relay's configuration ([`crate::server::ServerConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Most authenticated connections at once.
    pub max_connections: usize,
    /// Most authenticated connections from one IP address at once.
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
    /// Handshakes not yet authenticated at once (the pending pool).
    pub handshake_pool: usize,
    /// Of those, most from one source (an IPv4 address or an IPv6 /64).
    pub handshake_pool_per_source: usize,
}

/// What to do with a connection attempt.
#[derive(Debug)]
pub enum Decision {
    /// Go on with the handshake, which holds a place in the pending pool.
    Admit(Pending),
    /// Answer with a QUIC Retry: the client must prove its address first.
    Retry,
    /// Refuse it: authenticated connections fill a connection cap.
    Refuse(CloseReason),
    /// Refuse it: the pending pool has no place for it.
    Crowded(Crowded),
}

#[derive(Debug)]
struct Counts {
    pool: Pool,
    /// The pending handshakes' tasks, by pool id: cancelled to evict one.
    pending: HashMap<u64, CancellationToken>,
    /// Authenticated connections.
    connections: usize,
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

/// A handshake's place in the pending pool, given back when dropped.
#[derive(Debug)]
pub struct Pending {
    admission: Arc<Admission>,
    id: u64,
    evicted: CancellationToken,
}

/// An authenticated connection's place in the connection counts, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    admission: Arc<Admission>,
    addr: IpAddr,
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
    /// Admission with `caps`, keeping `metrics.connections_open`, `handshakes_pending`,
    /// `handshakes_unvalidated`, `handshakes_refused_total` and `handshakes_evicted_total`.
    pub fn new(caps: Caps, metrics: Arc<Metrics>) -> Arc<Admission> {
        let pool = Pool::new(PoolLimits {
            size: caps.handshake_pool,
            per_source: caps.handshake_pool_per_source,
            unvalidated: caps.retry_threshold,
        });
        Arc::new(Admission {
            caps,
            counts: Mutex::new(Counts {
                pool,
                pending: HashMap::new(),
                connections: 0,
                per_address: HashMap::new(),
                per_identity: HashMap::new(),
            }),
            metrics,
        })
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Decides on a connection attempt from `addr`, whose address is `validated` (it carries a
    /// Retry token) or not; evicts the pending handshake it displaces, if any.
    pub fn incoming(self: &Arc<Self>, addr: IpAddr, validated: bool) -> Decision {
        let mut c = self.counts();
        if let Err(reason) = self.room_for(&c, addr) {
            return if validated {
                Decision::Refuse(reason)
            } else {
                Decision::Retry
            };
        }
        let (id, evict) = match c.pool.attempt(addr, validated) {
            Verdict::Admit { id, evict } => (id, evict),
            Verdict::Retry => return Decision::Retry,
            Verdict::Refuse(why) => {
                Metrics::add(&self.metrics.handshakes_refused_total, 1);
                return Decision::Crowded(why);
            }
        };
        if let Some(task) = evict.and_then(|v| c.pending.remove(&v)) {
            task.cancel();
            Metrics::add(&self.metrics.handshakes_evicted_total, 1);
        }
        let evicted = CancellationToken::new();
        c.pending.insert(id, evicted.clone());
        self.publish(&c);
        Decision::Admit(Pending {
            admission: self.clone(),
            id,
            evicted,
        })
    }

    /// Sets the pool's gauges from `c`.
    fn publish(&self, c: &Counts) {
        let m = &self.metrics;
        Metrics::set(&m.handshakes_pending, c.pool.len() as u64);
        Metrics::set(&m.handshakes_unvalidated, c.pool.unvalidated() as u64);
    }

    /// Whether authenticated connections leave room for one more from `addr`.
    fn room_for(&self, c: &Counts, addr: IpAddr) -> Result<(), CloseReason> {
        if c.connections >= self.caps.max_connections {
            return Err(overloaded("connection limit reached".into()));
        }
        let from = c.per_address.get(&addr).copied().unwrap_or(0);
        if from >= self.caps.max_connections_per_address {
            return Err(overloaded(format!(
                "connection limit of address {addr} reached"
            )));
        }
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

impl Pending {
    /// Completes when the pool evicted this handshake to make room for another: its task
    /// then drops it, which closes the connection.
    pub fn evicted(&self) -> WaitForCancellationFuture<'_> {
        self.evicted.cancelled()
    }

    /// The handshake completed with a verified client certificate from `addr`: it leaves the
    /// pool and counts against the connection caps, or is refused (a cap is reached, or the
    /// pool evicted it just before).
    pub fn authenticated(self, addr: IpAddr) -> Result<Slot, CloseReason> {
        let a = self.admission.clone();
        let mut c = a.counts();
        let held = c.pool.remove(self.id);
        c.pending.remove(&self.id);
        a.publish(&c);
        if !held {
            return Err(overloaded(
                "handshake displaced from the pending pool".into(),
            ));
        }
        a.room_for(&c, addr)?;
        c.connections += 1;
        *c.per_address.entry(addr).or_default() += 1;
        drop(c);
        Metrics::add(&a.metrics.connections_open, 1);
        Ok(Slot {
            admission: a,
            addr,
            identity: None,
        })
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let a = &self.admission;
        let mut c = a.counts();
        if c.pool.remove(self.id) {
            c.pending.remove(&self.id);
            a.publish(&c);
        }
    }
}

impl Slot {
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
        c.connections -= 1;
        decrement(&mut c.per_address, &self.addr);
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
            handshake_pool: 8,
            handshake_pool_per_source: 4,
        }
    }

    fn admit(d: Decision) -> Pending {
        match d {
            Decision::Admit(p) => p,
            other => panic!("expected Admit, got {other:?}"),
        }
    }

    /// An attempt from `addr` that completes its handshake.
    fn connect(adm: &Arc<Admission>, addr: IpAddr) -> Slot {
        admit(adm.incoming(addr, true)).authenticated(addr).unwrap()
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 0, 2));
    const C: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 0, 3));

    fn gauge(m: &std::sync::atomic::AtomicU64) -> u64 {
        m.load(Ordering::Relaxed)
    }

    #[test]
    fn unvalidated_handshakes_beyond_the_threshold_get_a_retry() {
        let m = Metrics::new();
        let adm = Admission::new(caps(), m.clone());
        let u1 = admit(adm.incoming(A, false));
        let _u2 = admit(adm.incoming(A, false));
        assert!(matches!(adm.incoming(A, false), Decision::Retry));
        assert_eq!(gauge(&m.handshakes_unvalidated), 2);
        // Validated attempts do not wait behind them.
        let _v = admit(adm.incoming(B, true));
        assert_eq!(gauge(&m.handshakes_pending), 3);
        drop(u1);
        let _u3 = admit(adm.incoming(C, false));
        assert_eq!(gauge(&m.handshakes_pending), 3);
        assert_eq!(gauge(&m.connections_open), 0, "none authenticated");
    }

    /// Handshakes that never complete take no connection place: twice the connection cap of
    /// them pending, and authenticated connections still fill it.
    #[test]
    fn only_authenticated_connections_fill_the_caps() {
        let m = Metrics::new();
        let adm = Admission::new(caps(), m.clone());
        let silent: Vec<Pending> = [A, A, A, A, B, B, B, B]
            .into_iter()
            .map(|addr| admit(adm.incoming(addr, true)))
            .collect();
        assert_eq!(gauge(&m.handshakes_pending), 8);
        assert_eq!(adm.counts().connections, 0);
        drop(silent);
        let mut held: Vec<Slot> = [A, A, B, B].into_iter().map(|a| connect(&adm, a)).collect();
        assert_eq!(gauge(&m.connections_open), 4);
        // Full: validated attempts are refused before any handshake, unvalidated ones retried.
        assert!(matches!(adm.incoming(C, true), Decision::Refuse(_)));
        assert!(matches!(adm.incoming(C, false), Decision::Retry));
        held.pop();
        // Per address: A has 2.
        assert!(matches!(adm.incoming(A, true), Decision::Refuse(_)));
        let _c = connect(&adm, C);
        assert_eq!(gauge(&m.handshakes_pending), 0);
    }

    /// Handshakes admitted while there was room are checked again when they authenticate.
    #[test]
    fn an_authenticated_handshake_counts_or_is_refused() {
        let adm = Admission::new(caps(), Metrics::new());
        let late = admit(adm.incoming(A, true));
        let _a1 = connect(&adm, A);
        let _a2 = connect(&adm, A);
        assert!(late.authenticated(A).is_err(), "A has its 2");
        assert_eq!(adm.counts().connections, 2);
        assert!(adm.counts().pool.is_empty());
        let b = connect(&adm, B);
        assert_eq!(adm.counts().connections, 3);
        drop(b);
        assert_eq!(adm.counts().connections, 2);
        assert!(!adm.counts().per_address.contains_key(&B));
    }

    /// A full pool: a source holding fewer than the heaviest displaces the heaviest's oldest
    /// handshake, whose task is told, and which can then no longer authenticate.
    #[test]
    fn a_displaced_handshake_is_cancelled_and_cannot_authenticate() {
        let m = Metrics::new();
        let adm = Admission::new(caps(), m.clone());
        let mut flood: Vec<Pending> = Vec::new();
        for addr in [A, A, A, A, B, B, B, B] {
            flood.push(admit(adm.incoming(addr, true)));
        }
        // A holds its share of 4: refused, not displacing.
        assert!(matches!(
            adm.incoming(A, true),
            Decision::Crowded(Crowded::SourceShare)
        ));
        let real = admit(adm.incoming(C, true));
        assert!(flood[0].evicted.is_cancelled(), "A's oldest goes");
        assert!(flood[1..].iter().all(|p| !p.evicted.is_cancelled()));
        assert_eq!(gauge(&m.handshakes_evicted_total), 1);
        assert_eq!(gauge(&m.handshakes_refused_total), 1);
        assert_eq!(gauge(&m.handshakes_pending), 8);
        let displaced = flood.remove(0);
        assert!(displaced.authenticated(A).is_err());
        let _slot = real.authenticated(C).unwrap();
        assert_eq!(gauge(&m.handshakes_pending), 7);
        drop(flood);
        assert_eq!(gauge(&m.handshakes_pending), 0);
        assert!(adm.counts().pending.is_empty());
    }

    #[test]
    fn identities_are_capped_and_released() {
        let mut c = caps();
        c.max_connections = 100;
        c.max_connections_per_address = 100;
        let adm = Admission::new(c, Metrics::new());
        let mut held = Vec::new();
        for _ in 0..3 {
            let mut s = connect(&adm, A);
            s.identify("rpc-1").unwrap();
            held.push(s);
        }
        let mut s = connect(&adm, A);
        assert!(s.identify("rpc-1").is_err());
        s.identify("rpc-2").unwrap();
        held.clear();
        drop(s);
        assert!(adm.counts().per_identity.is_empty());
        assert!(adm.counts().per_address.is_empty());
    }
}
