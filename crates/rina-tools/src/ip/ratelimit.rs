//! A token bucket that bounds how many ICMP errors the tunnel writes to its
//! TUN, so that a flood of packets it cannot deliver does not become a
//! flood of errors (the kernel bounds its own the same way:
//! `net.ipv4.icmp_msgs_per_sec` and `icmp_msgs_burst`, 1000 and 50).
//!
//! Sans-IO: the time is passed in.

use std::time::Instant;

/// ICMP errors per second, in the long run.
pub const ICMP_PER_SEC: u32 = 1000;

/// ICMP errors in a burst (after a quiet spell).
pub const ICMP_BURST: u32 = 50;

/// `rate` tokens a second, at most `burst` saved up; one per message.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket refilled at `rate` tokens a second, holding at most
    /// `burst` (at least one).
    pub fn new(rate: u32, burst: u32) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            rate: f64::from(rate),
            burst,
            tokens: burst,
            last: None,
        }
    }

    /// The bucket for ICMP errors ([`ICMP_PER_SEC`], [`ICMP_BURST`]).
    pub fn icmp() -> TokenBucket {
        TokenBucket::new(ICMP_PER_SEC, ICMP_BURST)
    }

    /// Takes a token at `now` if there is one. A `now` earlier than the
    /// last one adds nothing.
    pub fn take(&mut self, now: Instant) -> bool {
        if let Some(last) = self.last {
            let dt = now.saturating_duration_since(last).as_secs_f64();
            self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        }
        match self.last {
            Some(l) if l >= now => {}
            _ => self.last = Some(now),
        }
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_passes_then_the_rate_holds() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1000, 50);
        let burst = (0..200).filter(|_| b.take(t0)).count();
        assert_eq!(burst, 50);
        // A second of a flood (one packet every 10 µs) lets about 1000 through.
        let passed = (1..=100_000)
            .filter(|i| b.take(t0 + Duration::from_micros(10 * i)))
            .count();
        assert!((999..=1001).contains(&passed), "{passed}");
    }

    #[test]
    fn a_long_quiet_spell_saves_up_no_more_than_the_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10, 3);
        assert!(b.take(t0));
        let later = t0 + Duration::from_secs(3600);
        assert_eq!((0..10).filter(|_| b.take(later)).count(), 3);
        // Time going backwards neither panics nor refills.
        assert!(!b.take(t0));
        assert!(!b.take(later));
        assert!(b.take(later + Duration::from_millis(100)));
    }
}
