//! Jittered exponential backoff for reconnects.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Bounds of the reconnect backoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffConfig {
    /// First delay, and the delay after progress (default 100 ms).
    pub min: Duration,
    /// Largest delay (default 10 s).
    pub max: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            min: Duration::from_millis(100),
            max: Duration::from_secs(10),
        }
    }
}

/// Exponential backoff with jitter: the n-th delay after a reset is `min * 2^n` scaled by a
/// random factor in `[0.5, 1.5)`, then clamped to `[min, max]`.
///
/// The jitter spreads the reconnects of a fleet of subscribers after a relay restart, so they
/// do not all arrive in the same millisecond; the reset after progress means that a subscriber
/// whose relay blipped once reconnects at once instead of paying for failures long past.
#[derive(Debug)]
pub struct Backoff {
    config: BackoffConfig,
    base: Duration,
    rng: SmallRng,
}

impl Backoff {
    /// A backoff with `config`, seeded from the OS.
    pub fn new(config: BackoffConfig) -> Backoff {
        Backoff::with_rng(config, SmallRng::from_entropy())
    }

    /// A backoff with `config` and a fixed seed (tests).
    pub fn with_seed(config: BackoffConfig, seed: u64) -> Backoff {
        Backoff::with_rng(config, SmallRng::seed_from_u64(seed))
    }

    fn with_rng(config: BackoffConfig, rng: SmallRng) -> Backoff {
        let max = config.max.max(config.min);
        Backoff {
            config: BackoffConfig {
                min: config.min,
                max,
            },
            base: config.min,
            rng,
        }
    }

    /// The next delay; each call doubles the base until it reaches `max`.
    pub fn next_delay(&mut self) -> Duration {
        let factor: f64 = self.rng.gen_range(0.5..1.5);
        let delay = self
            .base
            .mul_f64(factor)
            .clamp(self.config.min, self.config.max);
        self.base = self.base.saturating_mul(2).min(self.config.max);
        delay
    }

    /// Back to the minimum, after progress.
    pub fn reset(&mut self) {
        self.base = self.config.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_within_jitter_bounds_and_reset() {
        let config = BackoffConfig::default();
        for seed in 0..50 {
            let mut b = Backoff::with_seed(config, seed);
            let mut base = config.min;
            for _ in 0..12 {
                let d = b.next_delay();
                let low = base.mul_f64(0.5).max(config.min);
                let high = base.mul_f64(1.5).min(config.max);
                assert!(
                    d >= low && d <= high,
                    "seed {seed}: {d:?} not in {low:?}..={high:?}"
                );
                base = (base * 2).min(config.max);
            }
            // Saturated at the cap: within [max/2, max].
            let d = b.next_delay();
            assert!(d >= config.max / 2 && d <= config.max, "{d:?}");
            b.reset();
            let d = b.next_delay();
            assert!(d >= config.min && d <= config.min.mul_f64(1.5), "{d:?}");
        }
    }

    #[test]
    fn jitter_actually_varies() {
        let mut delays: Vec<Duration> = (0..20)
            .map(|seed| Backoff::with_seed(BackoffConfig::default(), seed))
            .map(|mut b| {
                b.next_delay();
                b.next_delay()
            })
            .collect();
        delays.sort();
        delays.dedup();
        assert!(delays.len() > 10, "{delays:?}");
    }

    #[test]
    fn inverted_bounds_do_not_panic() {
        let mut b = Backoff::with_seed(
            BackoffConfig {
                min: Duration::from_secs(2),
                max: Duration::from_secs(1),
            },
            1,
        );
        assert_eq!(b.next_delay(), Duration::from_secs(2));
    }
}
