//! Transmit gates of N-1 ports: what lets a queue of the RMT build.
//!
//! The RMT's scheduling policy only matters when PDUs wait: a port that
//! takes every PDU the moment it is queued never holds anything, and the
//! queue forms below it, first come first served (in the kernel, in a link
//! emulator). So a port hands a PDU to the layer under it only when that
//! layer can take one:
//!
//! * **blocked**: the driver (or the [`crate::system::System`]) says the
//!   medium or the lower flow cannot take more ([`PortGate::set_blocked`]),
//!   until it says it can again;
//! * **paced**: the port carries at most the configured [`PortRate`] — the
//!   capacity of the link under a shim — with at most
//!   [`PortRate::burst`] of data ahead of the link ([`Pacer`]).
//!
//! The gate of a port that is neither is open, as before.

use crate::time::Instant;
use std::time::Duration;

/// The capacity of the medium under a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRate {
    /// Bits per second (at least 1).
    pub bps: u64,
    /// Bytes the medium adds to every frame (headers, preamble, gap), so
    /// that what the pacer counts is what the link carries.
    pub overhead: u32,
    /// Data the port may send ahead of the link, as time at `bps`: room for
    /// a driver whose timers are late by that much without the link going
    /// idle.
    pub burst: Duration,
}

impl PortRate {
    /// A rate with no per-frame overhead and a 2 ms burst.
    pub fn new(bps: u64) -> Self {
        PortRate {
            bps: bps.max(1),
            overhead: 0,
            burst: Duration::from_millis(2),
        }
    }

    /// The same rate, counting `bytes` more per frame.
    pub fn overhead(mut self, bytes: u32) -> Self {
        self.overhead = bytes;
        self
    }

    /// The same rate with another burst.
    pub fn burst(mut self, burst: Duration) -> Self {
        self.burst = burst;
        self
    }

    /// Time the medium takes to carry a frame of `len` bytes.
    pub fn serialization(&self, len: usize) -> Duration {
        let bits = (len as u128 + u128::from(self.overhead)) * 8;
        let ns = (bits * 1_000_000_000).div_ceil(u128::from(self.bps.max(1)));
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

/// Lets frames through at a [`PortRate`]: `busy_until` is when the link
/// would have carried everything let through so far; a frame may go while
/// that is at most one burst ahead of now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacer {
    rate: PortRate,
    busy_until: Instant,
}

impl Pacer {
    /// A pacer with an idle link.
    pub fn new(rate: PortRate) -> Self {
        Pacer {
            rate,
            busy_until: Instant::ZERO,
        }
    }

    /// The rate it paces at.
    pub fn rate(&self) -> PortRate {
        self.rate
    }

    /// Whether a frame may go at `now`.
    pub fn ready(&self, now: Instant) -> bool {
        self.busy_until <= now + self.rate.burst
    }

    /// When a frame may go next.
    pub fn ready_at(&self) -> Instant {
        Instant::from_nanos(
            self.busy_until
                .as_nanos()
                .saturating_sub(u64::try_from(self.rate.burst.as_nanos()).unwrap_or(u64::MAX)),
        )
    }

    /// Accounts a frame of `len` bytes let through at `now`.
    pub fn charge(&mut self, now: Instant, len: usize) {
        self.busy_until = self.busy_until.max(now) + self.rate.serialization(len);
    }
}

/// The transmit gate of one port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortGate {
    pacer: Option<Pacer>,
    blocked: bool,
    /// PDUs handed down since the driver's last turn began.
    burst: usize,
}

impl PortGate {
    /// Paces the port at `rate`, or stops pacing it (`None`).
    pub fn set_rate(&mut self, rate: Option<PortRate>) {
        self.pacer = rate.map(Pacer::new);
    }

    /// The rate the port is paced at, if any.
    pub fn rate(&self) -> Option<PortRate> {
        self.pacer.map(|p| p.rate())
    }

    /// Blocks or unblocks the port.
    pub fn set_blocked(&mut self, blocked: bool) {
        self.blocked = blocked;
    }

    /// Whether the layer below said it cannot take more.
    pub fn is_blocked(&self) -> bool {
        self.blocked
    }

    /// PDUs handed down since the driver's last turn began.
    pub fn burst(&self) -> usize {
        self.burst
    }

    /// Counts `n` more PDUs handed down in this turn.
    pub fn add_burst(&mut self, n: usize) {
        self.burst += n;
    }

    /// A new turn of the driver: nothing handed down in it yet.
    pub fn new_burst(&mut self) {
        self.burst = 0;
    }

    /// Whether a frame may go at `now`.
    pub fn open(&self, now: Instant) -> bool {
        !self.blocked && self.pacer.is_none_or(|p| p.ready(now))
    }

    /// When a closed gate opens by itself (a pacer's next slot); `None`
    /// when it is open or only the layer below can open it.
    pub fn opens_at(&self, now: Instant) -> Option<Instant> {
        if self.blocked {
            return None;
        }
        self.pacer.filter(|p| !p.ready(now)).map(|p| p.ready_at())
    }

    /// Accounts a frame of `len` bytes sent at `now`.
    pub fn sent(&mut self, now: Instant, len: usize) {
        if let Some(p) = &mut self.pacer {
            p.charge(now, len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Instant {
        Instant::from_nanos(v * 1_000_000)
    }

    #[test]
    fn a_pacer_lets_one_burst_ahead_then_the_rate() {
        // 8 Mb/s: a 1000-byte frame takes 1 ms; a burst of 2 ms.
        let mut g = PortGate::default();
        g.set_rate(Some(PortRate::new(8_000_000)));
        let mut sent = 0;
        while g.open(ms(0)) {
            g.sent(ms(0), 1000);
            sent += 1;
        }
        // Frames go until the link is 2 ms busy: three of them (0, 1, 2 ms).
        assert_eq!(sent, 3);
        assert_eq!(g.opens_at(ms(0)), Some(ms(1)));
        // Over 100 ms, 100 frames more: the rate, not more.
        let mut t = ms(1);
        let mut later = 0;
        while t <= ms(100) {
            while g.open(t) {
                g.sent(t, 1000);
                later += 1;
            }
            t = g.opens_at(t).unwrap();
        }
        assert_eq!(later, 100);
    }

    #[test]
    fn overhead_counts_and_blocking_wins() {
        let r = PortRate::new(8_000_000).overhead(1000);
        assert_eq!(r.serialization(1000), Duration::from_millis(2));
        let mut g = PortGate::default();
        g.set_rate(Some(r));
        g.set_blocked(true);
        assert!(!g.open(ms(0)));
        assert_eq!(g.opens_at(ms(0)), None, "only the layer below unblocks");
        g.set_blocked(false);
        assert!(g.open(ms(0)));
    }
}
