//! A hedged subscription's "first look", as users of stream providers compare them: for each
//! relay, the share of the ledgers handed on that were its copy, and how much sooner the
//! hedge had each ledger than that relay delivered it (what the hedge gained over subscribing
//! to that relay alone). Times are taken where the merge sees each verified copy, so a relay's
//! own reassembly and verification count against it as they would for a plain subscriber.
//! A ledger a relay never delivered (it was down, or behind and restarted) is not counted in
//! its gain: that loss has no bound to average.

use std::collections::VecDeque;
use std::time::Duration;

/// Gains kept per relay for the mean and p99: the last this many ledgers it delivered.
pub const FIRST_LOOK_WINDOW: usize = 65_536;

/// One relay of a hedged subscription, compared with the hedge.
#[derive(Debug, Clone, PartialEq)]
pub struct FirstLook {
    /// The relay, as configured.
    pub relay: String,
    /// Ledgers handed on from this relay's copy: it delivered them first.
    pub first: u64,
    /// Ledgers this relay delivered after another relay had (its copy was dropped).
    pub later: u64,
    /// `first` over every ledger handed on.
    pub first_share: f64,
    /// Mean of how much sooner the hedge had a ledger than this relay delivered it, ms, over
    /// the last [`FIRST_LOOK_WINDOW`] ledgers it delivered (0 for those it delivered first);
    /// `None` before it delivered any.
    pub gain_mean_ms: Option<f64>,
    /// The 99th percentile of the same gains, ms.
    pub gain_p99_ms: Option<f64>,
}

/// The counts and gains behind [`FirstLook`], one entry per relay.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    relays: Vec<RelayTally>,
}

#[derive(Debug, Default)]
struct RelayTally {
    relay: String,
    first: u64,
    later: u64,
    gains_ms: VecDeque<f32>,
}

impl RelayTally {
    fn gain(&mut self, ms: f32) {
        if self.gains_ms.len() == FIRST_LOOK_WINDOW {
            self.gains_ms.pop_front();
        }
        self.gains_ms.push_back(ms);
    }
}

impl Tally {
    /// A tally of `relays`, in order (the merge's source index is the position).
    pub(crate) fn new(relays: impl IntoIterator<Item = String>) -> Tally {
        let relays = relays.into_iter().map(|relay| RelayTally {
            relay,
            ..RelayTally::default()
        });
        Tally {
            relays: relays.collect(),
        }
    }

    /// Relay `i`'s copy was handed on.
    pub(crate) fn first(&mut self, i: usize) {
        if let Some(r) = self.relays.get_mut(i) {
            r.first += 1;
            r.gain(0.0);
        }
    }

    /// Relay `i` delivered a ledger `after` the copy that was handed on.
    pub(crate) fn later(&mut self, i: usize, after: Duration) {
        if let Some(r) = self.relays.get_mut(i) {
            r.later += 1;
            r.gain(after.as_secs_f32() * 1e3);
        }
    }

    /// Each relay's figures now.
    pub(crate) fn summary(&self) -> Vec<FirstLook> {
        let handed_on: u64 = self.relays.iter().map(|r| r.first).sum();
        let summary = |r: &RelayTally| {
            let mut gains: Vec<f32> = r.gains_ms.iter().copied().collect();
            gains.sort_by(f32::total_cmp);
            let n = gains.len();
            let mean = (n > 0).then(|| gains.iter().map(|&g| f64::from(g)).sum::<f64>() / n as f64);
            // Nearest rank.
            let p99 = (n > 0).then(|| f64::from(gains[(n * 99).div_ceil(100).max(1) - 1]));
            FirstLook {
                relay: r.relay.clone(),
                first: r.first,
                later: r.later,
                first_share: r.first as f64 / handed_on.max(1) as f64,
                gain_mean_ms: mean,
                gain_p99_ms: p99,
            }
        };
        self.relays.iter().map(summary).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_and_gains_follow_which_copy_came_first() {
        let mut t = Tally::new(["a".to_owned(), "b".to_owned()]);
        // a first on 3 ledgers (b 1, 2 and 100 ms later), b first on one (a 4 ms later).
        for (later_ms, _) in [(1, 0), (2, 0), (100, 0)] {
            t.first(0);
            t.later(1, Duration::from_millis(later_ms));
        }
        t.first(1);
        t.later(0, Duration::from_millis(4));
        let s = t.summary();
        assert_eq!(
            (s[0].first, s[0].later, s[1].first, s[1].later),
            (3, 1, 1, 3)
        );
        assert_eq!((s[0].first_share, s[1].first_share), (0.75, 0.25));
        // a's gains: 0, 0, 0, 4; b's: 1, 2, 100, 0.
        assert!((s[0].gain_mean_ms.unwrap() - 1.0).abs() < 1e-6);
        assert!((s[1].gain_mean_ms.unwrap() - 103.0 / 4.0).abs() < 1e-4);
        assert!((s[1].gain_p99_ms.unwrap() - 100.0).abs() < 1e-4);
        assert!((s[0].gain_p99_ms.unwrap() - 4.0).abs() < 1e-6);
    }

    #[test]
    fn a_relay_that_delivered_nothing_has_no_gain_and_the_window_is_bounded() {
        let mut t = Tally::new(["a".to_owned(), "b".to_owned()]);
        for _ in 0..FIRST_LOOK_WINDOW + 10 {
            t.first(0);
        }
        let s = t.summary();
        assert_eq!(
            (s[1].gain_mean_ms, s[1].gain_p99_ms, s[1].first_share),
            (None, None, 0.0)
        );
        assert_eq!(s[0].first, FIRST_LOOK_WINDOW as u64 + 10);
        assert_eq!(t.relays[0].gains_ms.len(), FIRST_LOOK_WINDOW);
        // An index past the relays is ignored, not a panic.
        t.later(7, Duration::from_millis(1));
    }
}
