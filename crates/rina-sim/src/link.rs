//! Emulated links: a UDP-ish datagram service between fake socket addresses.
//!
//! A [`Link`] joins two addresses (point to point, full duplex: one
//! independent [`Pipe`] per direction) or several addresses sharing one
//! medium (one pipe for all senders, like a hub). A datagram offered to a pipe
//! goes through, in order:
//!
//! 1. **the queue**: the pipe holds at most `queue_packets` datagrams, the one
//!    being serialized included; a datagram that finds it full is offered
//!    back to its sender ([`crate::Node::on_link_full`]: a node that pushes
//!    back keeps it and sends it again when [`Link::full_until`] says), or
//!    else dropped (tail drop, counted in `dropped_queue`);
//! 2. **serialization**: `(len + overhead_bytes) * 8 / rate_bps` seconds,
//!    rounded up to the nanosecond, starting when the previous datagram has
//!    left, so datagrams queue behind each other;
//! 3. **loss**: with probability `loss` the datagram is lost on the wire
//!    (counted in `dropped_loss`; it has used its share of the rate);
//! 4. **propagation**: `delay`, plus a uniform extra delay in `[0, jitter]`
//!    drawn per datagram (jitter can reorder datagrams, as on a real network).
//!
//! Every random draw comes from the link's own ChaCha8 stream, derived from
//! the world's seed and the link's index, so adding a link does not change
//! the draws of the others.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rina_core::Instant;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

/// Index of a link in its world.
pub type LinkId = usize;

/// Characteristics of a link, the same in each direction.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkConfig {
    /// Bits per second; `None` serializes in no time.
    pub rate_bps: Option<u64>,
    /// One-way propagation delay.
    pub delay: Duration,
    /// Largest extra delay drawn uniformly per datagram.
    pub jitter: Duration,
    /// Probability that a datagram is lost, in `[0, 1]`.
    pub loss: f64,
    /// Most datagrams held by a sender side, the one on the wire included
    /// (at least 1).
    pub queue_packets: usize,
    /// Bytes added to every datagram for serialization (e.g. 28 for IPv4 +
    /// UDP headers); 0 by default so figures are easy to check by hand.
    pub overhead_bytes: u32,
}

impl LinkConfig {
    /// A lossless link with `rate_bps`, one-way `delay`, a queue of 1000
    /// datagrams, no jitter and no overhead.
    pub fn new(rate_bps: u64, delay: Duration) -> Self {
        LinkConfig {
            rate_bps: Some(rate_bps),
            delay,
            jitter: Duration::ZERO,
            loss: 0.0,
            queue_packets: 1000,
            overhead_bytes: 0,
        }
    }

    /// A link of infinite rate: only propagation delay.
    pub fn ideal(delay: Duration) -> Self {
        LinkConfig {
            rate_bps: None,
            ..LinkConfig::new(0, delay)
        }
    }

    /// With loss probability `p`.
    pub fn loss(mut self, p: f64) -> Self {
        self.loss = p;
        self
    }

    /// With up to `j` of extra delay per datagram.
    pub fn jitter(mut self, j: Duration) -> Self {
        self.jitter = j;
        self
    }

    /// With a queue of `n` datagrams.
    pub fn queue(mut self, n: usize) -> Self {
        self.queue_packets = n;
        self
    }

    /// With `bytes` of per-datagram overhead.
    pub fn overhead(mut self, bytes: u32) -> Self {
        self.overhead_bytes = bytes;
        self
    }

    /// Time to serialize a datagram of `len` bytes.
    pub fn serialization(&self, len: usize) -> Duration {
        match self.rate_bps {
            None | Some(0) => Duration::ZERO,
            Some(rate) => {
                let bits = (len as u128 + self.overhead_bytes as u128) * 8;
                let ns = (bits * 1_000_000_000).div_ceil(rate as u128);
                Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
            }
        }
    }
}

/// Counters of one pipe (one direction of a point-to-point link, or a
/// shared medium).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkCounters {
    /// Datagrams offered to the pipe.
    pub sent: u64,
    /// Datagrams that reached the far end.
    pub delivered: u64,
    /// Bytes (without overhead) of the delivered datagrams.
    pub bytes_delivered: u64,
    /// Datagrams lost on the wire.
    pub dropped_loss: u64,
    /// Datagrams dropped because the queue was full.
    pub dropped_queue: u64,
}

impl std::ops::Add for LinkCounters {
    type Output = LinkCounters;
    fn add(self, o: LinkCounters) -> LinkCounters {
        LinkCounters {
            sent: self.sent + o.sent,
            delivered: self.delivered + o.delivered,
            bytes_delivered: self.bytes_delivered + o.bytes_delivered,
            dropped_loss: self.dropped_loss + o.dropped_loss,
            dropped_queue: self.dropped_queue + o.dropped_queue,
        }
    }
}

/// What becomes of a datagram offered to a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// It will arrive at `at`; report it with [`Link::arrived`] on `pipe`.
    Arrives { at: Instant, pipe: usize },
    /// Lost on the wire.
    Lost,
    /// Dropped at the tail of a full queue.
    QueueFull,
}

/// One direction of transmission.
#[derive(Debug, Clone, Default)]
pub struct Pipe {
    /// Times at which the datagrams held by the sender finish serializing.
    held: VecDeque<Instant>,
    counters: LinkCounters,
}

/// An emulated link.
#[derive(Debug, Clone)]
pub struct Link {
    cfg: LinkConfig,
    ends: Vec<SocketAddr>,
    shared: bool,
    pipes: Vec<Pipe>,
    rng: ChaCha8Rng,
}

impl Link {
    /// A full-duplex link between `a` and `b`.
    pub fn point_to_point(a: SocketAddr, b: SocketAddr, cfg: LinkConfig, rng: ChaCha8Rng) -> Self {
        Link {
            cfg,
            ends: vec![a, b],
            shared: false,
            pipes: vec![Pipe::default(), Pipe::default()],
            rng,
        }
    }

    /// One medium shared by all of `ends`: every datagram, whoever sends it,
    /// queues in the same pipe.
    pub fn shared(ends: Vec<SocketAddr>, cfg: LinkConfig, rng: ChaCha8Rng) -> Self {
        Link {
            cfg,
            ends,
            shared: true,
            pipes: vec![Pipe::default()],
            rng,
        }
    }

    /// The link's characteristics.
    pub fn config(&self) -> &LinkConfig {
        &self.cfg
    }

    /// Changes the loss probability (clamped to `[0, 1]`).
    pub fn set_loss(&mut self, p: f64) {
        self.cfg.loss = p.clamp(0.0, 1.0);
    }

    /// The addresses the link joins.
    pub fn ends(&self) -> &[SocketAddr] {
        &self.ends
    }

    fn pipe_of(&self, from: SocketAddr) -> Option<usize> {
        if self.shared {
            return self.ends.contains(&from).then_some(0);
        }
        self.ends.iter().position(|e| *e == from)
    }

    /// Counters of what `from` sent (of the whole medium if shared).
    pub fn counters(&self, from: SocketAddr) -> LinkCounters {
        self.pipe_of(from)
            .map(|p| self.pipes[p].counters)
            .unwrap_or_default()
    }

    /// Counters of all directions together.
    pub fn total(&self) -> LinkCounters {
        self.pipes
            .iter()
            .fold(LinkCounters::default(), |acc, p| acc + p.counters)
    }

    /// When the queue of `from`'s direction has room again, if it is full
    /// at `now`: the moment the oldest datagram it holds finishes
    /// serializing. `None` when there is room (or `from` is no end).
    pub fn full_until(&self, now: Instant, from: SocketAddr) -> Option<Instant> {
        let pipe = &self.pipes[self.pipe_of(from)?];
        // `held` is in order (each datagram starts when the one before
        // it is done), so those still serializing are a tail of it.
        let done = pipe.held.partition_point(|&d| d <= now);
        (pipe.held.len() - done >= self.cfg.queue_packets.max(1)).then(|| pipe.held[done])
    }

    /// Offers a datagram of `len` bytes sent by `from` at `now`. Returns
    /// `None` if `from` is not an end of this link.
    pub fn transmit(&mut self, now: Instant, from: SocketAddr, len: usize) -> Option<Fate> {
        let p = self.pipe_of(from)?;
        let ser = self.cfg.serialization(len);
        let pipe = &mut self.pipes[p];
        pipe.counters.sent += 1;
        while pipe.held.front().is_some_and(|&done| done <= now) {
            pipe.held.pop_front();
        }
        if pipe.held.len() >= self.cfg.queue_packets.max(1) {
            pipe.counters.dropped_queue += 1;
            return Some(Fate::QueueFull);
        }
        let start = pipe.held.back().map_or(now, |&last| last.max(now));
        let done = start + ser;
        pipe.held.push_back(done);
        if self.cfg.loss > 0.0 && self.rng.gen_bool(self.cfg.loss.clamp(0.0, 1.0)) {
            pipe.counters.dropped_loss += 1;
            return Some(Fate::Lost);
        }
        let mut at = done + self.cfg.delay;
        if !self.cfg.jitter.is_zero() {
            let j = self.cfg.jitter.as_nanos() as u64;
            at = at + Duration::from_nanos(self.rng.gen_range(0..=j));
        }
        Some(Fate::Arrives { at, pipe: p })
    }

    /// Accounts the arrival of a datagram of `len` bytes on `pipe`.
    pub fn arrived(&mut self, pipe: usize, len: usize) {
        if let Some(p) = self.pipes.get_mut(pipe) {
            p.counters.delivered += 1;
            p.counters.bytes_delivered += len as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn addr(n: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, n], 7000))
    }

    #[test]
    fn serialization_rounds_up_and_counts_overhead() {
        let c = LinkConfig::new(8_000_000, Duration::ZERO);
        assert_eq!(c.serialization(1000), Duration::from_micros(1000));
        assert_eq!(
            c.clone().overhead(28).serialization(1000),
            Duration::from_micros(1028)
        );
        let odd = LinkConfig::new(3, Duration::ZERO);
        assert_eq!(odd.serialization(1), Duration::from_nanos(2_666_666_667));
        assert_eq!(
            LinkConfig::ideal(Duration::ZERO).serialization(9000),
            Duration::ZERO
        );
    }

    #[test]
    fn datagrams_queue_behind_each_other_and_tail_drop() {
        let cfg = LinkConfig::new(8_000_000, Duration::from_millis(1)).queue(2);
        let mut l = Link::point_to_point(addr(1), addr(2), cfg, ChaCha8Rng::seed_from_u64(0));
        let t0 = Instant::ZERO;
        let ms = |n: u64| Instant::from_nanos(n * 1_000_000);
        assert_eq!(
            l.transmit(t0, addr(1), 1000),
            Some(Fate::Arrives { at: ms(2), pipe: 0 })
        );
        assert_eq!(
            l.transmit(t0, addr(1), 1000),
            Some(Fate::Arrives { at: ms(3), pipe: 0 })
        );
        assert_eq!(l.transmit(t0, addr(1), 1000), Some(Fate::QueueFull));
        // The other direction is independent.
        assert_eq!(
            l.transmit(t0, addr(2), 1000),
            Some(Fate::Arrives { at: ms(2), pipe: 1 })
        );
        // Once the first has left there is room again; it waits for the second.
        assert_eq!(
            l.transmit(ms(1), addr(1), 1000),
            Some(Fate::Arrives { at: ms(4), pipe: 0 })
        );
        assert_eq!(l.transmit(t0, addr(9), 10), None);
        let c = l.counters(addr(1));
        assert_eq!((c.sent, c.dropped_queue), (4, 1));
    }

    #[test]
    fn shared_medium_has_one_queue() {
        let cfg = LinkConfig::new(8_000_000, Duration::ZERO);
        let mut l = Link::shared(
            vec![addr(1), addr(2), addr(3)],
            cfg,
            ChaCha8Rng::seed_from_u64(0),
        );
        let us = |n: u64| Instant::from_nanos(n * 1_000);
        assert_eq!(
            l.transmit(Instant::ZERO, addr(1), 100),
            Some(Fate::Arrives {
                at: us(100),
                pipe: 0
            })
        );
        assert_eq!(
            l.transmit(Instant::ZERO, addr(3), 100),
            Some(Fate::Arrives {
                at: us(200),
                pipe: 0
            })
        );
        assert_eq!(l.total().sent, 2);
    }
}
