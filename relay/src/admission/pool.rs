//! The pending pool: QUIC handshakes that have not yet shown a verified client certificate,
//! and who gets a place in it. Pure bookkeeping (no socket, no clock, no task), so every rule
//! is unit-tested here; [`super::Admission`] holds one under its lock and cancels the
//! handshakes it evicts.
//!
//! The rules, for an attempt from source `s` (an IPv4 address, or the /64 of an IPv6 one)
//! holding `n` pending handshakes:
//!
//! - an attempt whose address is not validated (no Retry token: its source may be forged) is
//!   admitted only while fewer than `unvalidated` such handshakes are pending and the pool is
//!   less than half full; otherwise it gets a Retry (so under pressure every client proves its
//!   address first). It counts toward no source's share, so a forged address cannot use up a
//!   real one's; it displaces nothing and is never displaced (it may be a real client's first
//!   attempt, which a flood must not be able to close);
//! - a validated attempt is refused once `s` holds its share (`per_source`);
//! - while the pool has room, a validated attempt is admitted;
//! - when the pool is full, it displaces the oldest handshake of the heaviest source `h` (most
//!   pending; the oldest first among equals) if `n + 1 < count(h)`: after the swap `s` holds no
//!   more than `h`, so shares move toward equal and stop there instead of flapping between two
//!   sources; otherwise it is refused.
//!
//! So however fast a few sources open handshakes, they share the pool about equally, and a
//! source holding fewer (a real subscriber opening its lanes) takes a place from the heaviest.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;

/// Where a handshake comes from, for fairness: an IPv4 address, or the /64 of an IPv6 one (a
/// single host is commonly given a whole /64). An IPv4-mapped IPv6 address is its IPv4 one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// An IPv4 address.
    V4(u32),
    /// The upper 64 bits of an IPv6 address.
    V6(u64),
}

impl Source {
    /// The source `ip` belongs to.
    pub fn of(ip: IpAddr) -> Source {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Source::V4(u32::from(v4)),
            IpAddr::V6(v6) => Source::V6((u128::from(v6) >> 64) as u64),
        }
    }
}

/// The pool's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLimits {
    /// Handshakes pending at once, validated or not.
    pub size: usize,
    /// Validated handshakes one source may have pending at once.
    pub per_source: usize,
    /// Unvalidated handshakes pending at once; beyond (or with the pool half full), attempts
    /// get a Retry.
    pub unvalidated: usize,
}

/// What to do with an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted as pending handshake `id`; `evict` is the one it displaced, if any.
    Admit {
        /// The new handshake's id.
        id: u64,
        /// The pending handshake to end now to make room.
        evict: Option<u64>,
    },
    /// Ask the client to prove its address (QUIC Retry) first.
    Retry,
    /// No place for it.
    Refuse(Crowded),
}

/// Why an attempt found no place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Crowded {
    /// Its source holds its share of the pool.
    #[error("this address holds its share of pending handshakes")]
    SourceShare,
    /// The pool is full and no source holds more than the attempt's would after a swap.
    #[error("the pool of pending handshakes is full")]
    Full,
}

/// The pending handshakes. See the module documentation.
#[derive(Debug)]
pub struct Pool {
    limits: PoolLimits,
    next: u64,
    /// Every pending handshake by id (ids grow, so this is oldest first), with its source
    /// (`None`: not validated).
    entries: BTreeMap<u64, Option<Source>>,
    /// Validated handshakes of each source, oldest first.
    by_source: HashMap<Source, VecDeque<u64>>,
    /// Unvalidated handshakes, oldest first.
    unvalidated: VecDeque<u64>,
}

impl Pool {
    /// An empty pool with `limits`.
    pub fn new(limits: PoolLimits) -> Pool {
        Pool {
            limits,
            next: 0,
            entries: BTreeMap::new(),
            by_source: HashMap::new(),
            unvalidated: VecDeque::new(),
        }
    }

    /// Handshakes pending.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is pending.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Unvalidated handshakes pending.
    pub fn unvalidated(&self) -> usize {
        self.unvalidated.len()
    }

    /// Validated handshakes pending from `ip`'s source.
    #[cfg(test)]
    pub fn held_by(&self, ip: IpAddr) -> usize {
        self.by_source.get(&Source::of(ip)).map_or(0, VecDeque::len)
    }

    /// Decides on an attempt from `ip`, `validated` or not, and records what it decided.
    pub fn attempt(&mut self, ip: IpAddr, validated: bool) -> Verdict {
        if !validated {
            let calm = 2 * self.len() < self.limits.size;
            if self.unvalidated.len() >= self.limits.unvalidated || !calm {
                return Verdict::Retry;
            }
            let id = self.insert(None);
            return Verdict::Admit { id, evict: None };
        }
        let source = Source::of(ip);
        let held = self.by_source.get(&source).map_or(0, VecDeque::len);
        if held >= self.limits.per_source {
            return Verdict::Refuse(Crowded::SourceShare);
        }
        let evict = if self.len() < self.limits.size {
            None
        } else {
            match self.victim(held) {
                Some(v) => Some(v),
                None => return Verdict::Refuse(Crowded::Full),
            }
        };
        if let Some(v) = evict {
            self.remove(v);
        }
        let id = self.insert(Some(source));
        Verdict::Admit { id, evict }
    }

    /// Whom an attempt from a source holding `held` displaces in a full pool, if anyone.
    fn victim(&self, held: usize) -> Option<u64> {
        let heaviest = self
            .by_source
            .values()
            .max_by(|a, b| a.len().cmp(&b.len()).then(b.front().cmp(&a.front())))?;
        if held + 1 < heaviest.len() {
            heaviest.front().copied()
        } else {
            None
        }
    }

    fn insert(&mut self, source: Option<Source>) -> u64 {
        let id = self.next;
        self.next += 1;
        self.entries.insert(id, source);
        match source {
            Some(s) => self.by_source.entry(s).or_default().push_back(id),
            None => self.unvalidated.push_back(id),
        }
        id
    }

    /// Takes handshake `id` out of the pool (it completed, failed, timed out or was evicted);
    /// `false` if it was not in it (evicted already).
    pub fn remove(&mut self, id: u64) -> bool {
        let Some(source) = self.entries.remove(&id) else {
            return false;
        };
        match source {
            Some(s) => {
                if let Some(ids) = self.by_source.get_mut(&s) {
                    ids.retain(|i| *i != id);
                    if ids.is_empty() {
                        self.by_source.remove(&s);
                    }
                }
            }
            None => self.unvalidated.retain(|i| *i != id),
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(last: u8) -> IpAddr {
        IpAddr::from([198, 18, 0, last])
    }

    fn limits(size: usize, per_source: usize, unvalidated: usize) -> PoolLimits {
        PoolLimits {
            size,
            per_source,
            unvalidated,
        }
    }

    fn admitted(v: Verdict) -> (u64, Option<u64>) {
        match v {
            Verdict::Admit { id, evict } => (id, evict),
            other => panic!("expected Admit, got {other:?}"),
        }
    }

    /// The counts of the pool's sources, in the order of `ips`.
    fn shares(p: &Pool, ips: &[IpAddr]) -> Vec<usize> {
        ips.iter().map(|ip| p.held_by(*ip)).collect()
    }

    #[test]
    fn ipv6_sources_are_their_64_and_mapped_ipv4_is_ipv4() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(Source::of(a), Source::of(b));
        assert_ne!(Source::of(a), Source::of(c));
        let mapped: IpAddr = "::ffff:198.18.0.1".parse().unwrap();
        assert_eq!(Source::of(mapped), Source::of(v4(1)));
        assert_ne!(Source::of(v4(1)), Source::of(v4(2)));
    }

    #[test]
    fn a_source_is_held_to_its_share() {
        let mut p = Pool::new(limits(10, 3, 0));
        for _ in 0..3 {
            admitted(p.attempt(v4(1), true));
        }
        assert_eq!(
            p.attempt(v4(1), true),
            Verdict::Refuse(Crowded::SourceShare)
        );
        admitted(p.attempt(v4(2), true));
        assert_eq!(p.len(), 4);
    }

    #[test]
    fn unvalidated_attempts_get_a_retry_beyond_their_cap_or_once_the_pool_is_half_full() {
        let mut p = Pool::new(limits(8, 8, 2));
        admitted(p.attempt(v4(1), false));
        admitted(p.attempt(v4(1), false));
        assert_eq!(p.attempt(v4(2), false), Verdict::Retry);
        // Unvalidated handshakes count toward no source's share.
        assert_eq!(p.held_by(v4(1)), 0);
        admitted(p.attempt(v4(3), true));
        admitted(p.attempt(v4(3), true));
        assert_eq!(p.len(), 4);
        // Half full: an unvalidated attempt is retried even below its own cap.
        let mut q = Pool::new(limits(8, 8, 8));
        for _ in 0..4 {
            admitted(q.attempt(v4(3), true));
        }
        assert_eq!(q.attempt(v4(1), false), Verdict::Retry);
        // A threshold of 0: every unvalidated attempt is retried.
        let mut r = Pool::new(limits(8, 8, 0));
        assert_eq!(r.attempt(v4(1), false), Verdict::Retry);
    }

    /// A real client's first attempt, admitted before it was asked to validate, is not closed
    /// by a flood that fills the pool afterwards.
    #[test]
    fn an_unvalidated_handshake_is_never_displaced() {
        let mut p = Pool::new(limits(6, 6, 2));
        let (real, _) = admitted(p.attempt(v4(1), false));
        for _ in 0..5 {
            admitted(p.attempt(v4(2), true));
        }
        for _ in 0..2 {
            let (_, evict) = admitted(p.attempt(v4(3), true));
            assert!(evict.is_some_and(|e| e != real));
        }
        assert_eq!(p.unvalidated(), 1);
        assert_eq!(shares(&p, &[v4(2), v4(3)]), vec![3, 2]);
        assert_eq!(p.attempt(v4(3), true), Verdict::Refuse(Crowded::Full));
        assert!(p.remove(real));
    }

    #[test]
    fn a_lighter_source_evicts_the_heaviest_sources_oldest() {
        let mut p = Pool::new(limits(6, 6, 0));
        let (oldest, _) = admitted(p.attempt(v4(1), true));
        for _ in 0..3 {
            admitted(p.attempt(v4(1), true));
        }
        admitted(p.attempt(v4(2), true));
        admitted(p.attempt(v4(2), true));
        // Full: 4 and 2. A new source (0) takes the oldest of the heaviest.
        assert_eq!(admitted(p.attempt(v4(3), true)).1, Some(oldest));
        assert!(!p.remove(oldest), "evicted already");
        assert_eq!(shares(&p, &[v4(1), v4(2), v4(3)]), vec![3, 2, 1]);
        // 2 + 1 < 3 does not hold: source 2 would end heavier than source 1. Refused.
        assert_eq!(p.attempt(v4(2), true), Verdict::Refuse(Crowded::Full));
        // Source 3 (1 + 1 < 3) still takes one.
        admitted(p.attempt(v4(3), true));
        assert_eq!(shares(&p, &[v4(1), v4(2), v4(3)]), vec![2, 2, 2]);
        // Equal shares: nobody displaces anybody.
        for ip in [v4(1), v4(2), v4(3)] {
            assert_eq!(p.attempt(ip, true), Verdict::Refuse(Crowded::Full));
        }
    }

    #[test]
    fn among_equally_heavy_sources_the_oldest_handshake_goes() {
        let mut p = Pool::new(limits(4, 4, 0));
        let (a1, _) = admitted(p.attempt(v4(1), true));
        let (b1, _) = admitted(p.attempt(v4(2), true));
        admitted(p.attempt(v4(1), true));
        admitted(p.attempt(v4(2), true));
        assert_eq!(admitted(p.attempt(v4(3), true)).1, Some(a1));
        // Now 1 holds one, 2 holds two: 2 is the heaviest.
        assert_eq!(admitted(p.attempt(v4(4), true)).1, Some(b1));
    }

    /// A flood from five sources, each opening handshakes as fast as it likes and never
    /// finishing one: the pool ends shared about equally and then admits nothing more of it
    /// (so the flood costs the relay no further handshakes), and a sixth source opening its
    /// first handshakes (a real subscriber's lanes) always gets in, each displacing a
    /// flooder's.
    #[test]
    fn a_flood_from_several_sources_never_keeps_a_new_source_out() {
        let (size, per_source) = (128, 32);
        let mut p = Pool::new(limits(size, per_source, 4));
        let flood: Vec<IpAddr> = (2..=6).map(v4).collect();
        let mut admitted_late = 0;
        for round in 0..10_000 {
            let ip = flood[round % flood.len()];
            let verdict = p.attempt(ip, round % 7 != 0);
            if round >= 1_000 && matches!(verdict, Verdict::Admit { .. }) {
                admitted_late += 1;
            }
        }
        assert_eq!(admitted_late, 0, "the flood churns the pool");
        assert_eq!(p.len(), size);
        // The unvalidated handshakes of the first rounds, before the pool was half full.
        assert_eq!(p.unvalidated(), 4);
        let held = shares(&p, &flood);
        let (lo, hi) = (held.iter().min().unwrap(), held.iter().max().unwrap());
        assert!(hi - lo <= 1, "shares {held:?}");
        let real = v4(1);
        for lane in 0..8 {
            let (_, evict) = admitted(p.attempt(real, true));
            assert!(evict.is_some(), "lane {lane} displaced a flooder");
            assert_eq!(p.len(), size);
        }
        assert_eq!(p.held_by(real), 8);
        // The flood's next attempts do not take the real source's places back.
        for round in 0..1_000 {
            let _ = p.attempt(flood[round % flood.len()], true);
        }
        assert_eq!(p.held_by(real), 8);
    }

    #[test]
    fn removing_gives_the_place_back() {
        let mut p = Pool::new(limits(4, 1, 1));
        let (u, _) = admitted(p.attempt(v4(2), false));
        let (a, _) = admitted(p.attempt(v4(1), true));
        assert_eq!(
            p.attempt(v4(1), true),
            Verdict::Refuse(Crowded::SourceShare)
        );
        assert!(p.remove(a));
        assert!(p.remove(u));
        assert!(p.is_empty());
        assert_eq!(p.held_by(v4(1)), 0);
        admitted(p.attempt(v4(1), true));
        admitted(p.attempt(v4(2), false));
    }
}
