//! Bounded exponential back-off with jitter, for re-allocating flows and
//! reconnecting to the daemon.

use rand::Rng;
use std::time::Duration;

/// Delays that double from `initial` up to `max`, each shortened by up to a
/// quarter at random so that many tunnels do not retry in step.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// A back-off starting at `initial` (at least 1 ms) and never above
    /// `max` (at least `initial`).
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        let initial = initial.max(Duration::from_millis(1));
        let max = max.max(initial);
        Backoff {
            initial,
            max,
            next: initial,
        }
    }

    /// The delay before the next attempt, without jitter; the one after it
    /// is twice as long, up to the maximum.
    pub fn next_base(&mut self) -> Duration {
        let d = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        d
    }

    /// The delay before the next attempt, with jitter from `rng`.
    pub fn next_delay(&mut self, rng: &mut impl Rng) -> Duration {
        let d = self.next_base();
        d.mul_f64(1.0 - rng.gen_range(0.0..0.25))
    }

    /// Back to the initial delay (after a success).
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn doubles_up_to_the_bound_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(700));
        let got: Vec<u128> = (0..6).map(|_| b.next_base().as_millis()).collect();
        assert_eq!(got, [100, 200, 400, 700, 700, 700]);
        b.reset();
        assert_eq!(b.next_base(), Duration::from_millis(100));
    }

    #[test]
    fn jitter_only_shortens_by_a_quarter_at_most() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut b = Backoff::new(Duration::from_millis(400), Duration::from_millis(400));
        for _ in 0..100 {
            let d = b.next_delay(&mut rng);
            assert!(d <= Duration::from_millis(400) && d > Duration::from_millis(300));
        }
    }

    #[test]
    fn silly_bounds_are_fixed_up() {
        let mut b = Backoff::new(Duration::ZERO, Duration::ZERO);
        assert_eq!(b.next_base(), Duration::from_millis(1));
        assert_eq!(b.next_base(), Duration::from_millis(1));
    }
}
