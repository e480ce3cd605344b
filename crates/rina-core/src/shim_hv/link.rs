//! The VMPI device: one shared region holding a header and two rings (host
//! to guest, guest to host), with liveness by heartbeats.
//!
//! Layout (little-endian; the region is typically a file in `/dev/shm`
//! mapped by both `rinad`s, or the BAR 2 of a QEMU `ivshmem-plain` device
//! seen from the guest):
//!
//! ```text
//! 0      magic "RINA-HV1"
//! 8      version u32 (1)
//! 12     slot_size u32
//! 16     slots u32 (per ring)
//! 64     host session u32   (nonzero, new at every start of the host side)
//! 72     host heartbeat u64 (bumped at every tick of the host side)
//! 128    guest session u32
//! 136    guest heartbeat u64
//! 4096   ring host -> guest  (see [`super::ring`])
//! 4096 + ring_bytes  ring guest -> host
//! ```
//!
//! The host side creates (or re-creates) the layout; the guest side attaches
//! to what it finds and validates every field. Liveness is sans-IO: the
//! driver calls [`Link::tick`] with the time; a peer whose heartbeat has not
//! moved for [`LinkConfig::dead_after`] is down, a peer whose session number
//! changed has restarted.

use super::ring::{Consumer, Geometry, Producer, Region, RingError, Segments};
use crate::time::Instant;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// First bytes of a VMPI region.
pub const MAGIC: [u8; 8] = *b"RINA-HV1";
/// Layout version.
pub const VERSION: u32 = 1;
/// Bytes of the region header.
pub const HEADER: usize = 4096;

const OFF_VERSION: usize = 8;
const OFF_SLOT_SIZE: usize = 12;
const OFF_SLOTS: usize = 16;
const OFF_SESSION: [usize; 2] = [64, 128];
const OFF_BEAT: [usize; 2] = [72, 136];

/// Which end of the device this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The hypervisor side: creates the region.
    Host,
    /// The virtual machine side: attaches to it.
    Guest,
}

impl Side {
    fn index(self) -> usize {
        match self {
            Side::Host => 0,
            Side::Guest => 1,
        }
    }

    fn peer(self) -> Side {
        match self {
            Side::Host => Side::Guest,
            Side::Guest => Side::Host,
        }
    }
}

/// Bytes a region with rings of geometry `geo` needs, rounded up to a power
/// of two (as an `ivshmem` device requires).
pub fn region_size(geo: Geometry) -> usize {
    region_used(geo).next_power_of_two()
}

/// Bytes of such a region that are ever read or written: the header and
/// both rings (the rest pads it to [`region_size`]).
pub fn region_used(geo: Geometry) -> usize {
    HEADER + 2 * geo.ring_bytes().next_multiple_of(4096)
}

fn ring_region(region: Region, geo: Geometry, k: usize) -> Result<Region, RingError> {
    let rb = geo.ring_bytes().next_multiple_of(4096);
    region
        .sub(HEADER + k * rb, geo.ring_bytes())
        .ok_or(RingError::Region {
            len: region.len(),
            what: format!("two rings of {} bytes after the header", geo.ring_bytes()),
        })
}

/// Liveness settings.
#[derive(Debug, Clone, Copy)]
pub struct LinkConfig {
    /// A peer whose heartbeat did not move for this long is down.
    pub dead_after: Duration,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            dead_after: Duration::from_secs(1),
        }
    }
}

/// Interval between two ticks of a driver without doorbells: heartbeat,
/// and a poll of the receive ring.
pub const POLL_EVERY: Duration = Duration::from_millis(1);
/// Interval between two heartbeats of a driver that doorbells wake.
pub const BEAT_EVERY: Duration = Duration::from_millis(50);

/// When the driver of a device ticks, sans-IO: it asks
/// [`Ticker::poll_timeout`] how long it may sleep, and whenever
/// [`Ticker::due`] it does the IO of a tick (attach if not attached yet,
/// move the doorbell exchange on, [`Link::tick`], whose events say whether
/// the peer came or went, and poll the receive ring) and says
/// [`Ticker::ran`]. A driver that sleeps
/// on doorbells ticks every [`BEAT_EVERY`] (heartbeats only); one without
/// polls every [`POLL_EVERY`]; a busy-polling one at every turn.
#[derive(Debug, Clone)]
pub struct Ticker {
    next: Instant,
    ticks: u64,
}

impl Default for Ticker {
    fn default() -> Self {
        Ticker {
            next: Instant::ZERO,
            ticks: 0,
        }
    }
}

impl Ticker {
    /// When the next tick is due (now for a busy-polling driver).
    pub fn poll_timeout(&self, busy_poll: bool) -> Instant {
        if busy_poll {
            Instant::ZERO
        } else {
            self.next
        }
    }

    /// Whether a tick is due at `now`.
    pub fn due(&self, now: Instant, busy_poll: bool) -> bool {
        busy_poll || self.next <= now
    }

    /// The driver ran the tick due at `now`: it is counted and the next is
    /// scheduled, [`BEAT_EVERY`] later if the driver (now) sleeps on
    /// doorbells, else [`POLL_EVERY`].
    pub fn ran(&mut self, now: Instant, sleeps_on_bell: bool) {
        self.ticks += 1;
        self.next = now
            + if sleeps_on_bell {
                BEAT_EVERY
            } else {
                POLL_EVERY
            };
    }

    /// Ticks run.
    pub fn ticks(&self) -> u64 {
        self.ticks
    }
}

/// What [`Link::tick`] found out about the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkEvent {
    /// The peer is alive (first heartbeat seen).
    Up,
    /// The peer stopped beating, or restarted (a new session follows as `Up`).
    Down,
}

/// One end of a VMPI device.
#[derive(Debug)]
pub struct Link {
    region: Region,
    side: Side,
    cfg: LinkConfig,
    tx: Producer,
    rx: Consumer,
    beat: u64,
    peer_session: u32,
    peer_beat: u64,
    peer_beat_at: Option<Instant>,
    up: bool,
}

impl Link {
    /// Lays out a fresh region (host side): zeroes the header and both ring
    /// headers, writes the geometry, then the magic.
    pub fn create(
        region: Region,
        geo: Geometry,
        session: u32,
        cfg: LinkConfig,
    ) -> Result<Link, RingError> {
        let geo = geo.validate()?;
        if region.len() < HEADER + 2 * geo.ring_bytes().next_multiple_of(4096) {
            return Err(RingError::Region {
                len: region.len(),
                what: format!("rings of {} slots of {} bytes", geo.slots, geo.slot_size),
            });
        }
        region.fill(0, HEADER, 0);
        for k in 0..2 {
            let r = ring_region(region, geo, k)?;
            r.fill(0, super::ring::RING_HEADER, 0);
        }
        region.write(OFF_VERSION, &VERSION.to_le_bytes());
        region.write(OFF_SLOT_SIZE, &geo.slot_size.to_le_bytes());
        region.write(OFF_SLOTS, &geo.slots.to_le_bytes());
        region.write(0, &MAGIC);
        Self::open(region, Side::Host, geo, session.max(1), cfg)
    }

    /// Attaches to a region laid out by the host (guest side), validating
    /// its header.
    pub fn attach(region: Region, session: u32, cfg: LinkConfig) -> Result<Link, RingError> {
        let geo = read_geometry(region)?;
        Self::open(region, Side::Guest, geo, session.max(1), cfg)
    }

    fn open(
        region: Region,
        side: Side,
        geo: Geometry,
        session: u32,
        cfg: LinkConfig,
    ) -> Result<Link, RingError> {
        let (tx_k, rx_k) = match side {
            Side::Host => (0, 1),
            Side::Guest => (1, 0),
        };
        let tx = Producer::new(ring_region(region, geo, tx_k)?, geo)?;
        let rx = Consumer::new(ring_region(region, geo, rx_k)?, geo)?;
        let me = side.index();
        let beat = region
            .u64_at(OFF_BEAT[me])
            .map_or(0, |b| b.load(Ordering::Relaxed));
        if let Some(s) = region.u32_at(OFF_SESSION[me]) {
            s.store(session, Ordering::Release);
        }
        let peer = side.peer().index();
        let peer_session = region
            .u32_at(OFF_SESSION[peer])
            .map_or(0, |s| s.load(Ordering::Acquire));
        // A beat left by a dead peer does not count: only a moving one does.
        let peer_beat = region
            .u64_at(OFF_BEAT[peer])
            .map_or(0, |b| b.load(Ordering::Acquire));
        let mut link = Link {
            region,
            side,
            cfg,
            tx,
            rx,
            beat,
            peer_session,
            peer_beat,
            peer_beat_at: None,
            up: false,
        };
        // Whatever an earlier instance of the peer left unread or unsent is
        // not ours: start from the published positions, checked.
        if link.rx.available().is_err() {
            link.rx.resync();
        }
        Ok(link)
    }

    /// Which end this is.
    pub fn side(&self) -> Side {
        self.side
    }

    /// Ring geometry.
    pub fn geometry(&self) -> Geometry {
        self.tx.geometry()
    }

    /// Whether the peer is alive.
    pub fn is_up(&self) -> bool {
        self.up
    }

    /// Bumps our heartbeat and checks the peer's; reports a change.
    pub fn tick(&mut self, now: Instant) -> Option<LinkEvent> {
        self.beat = self.beat.wrapping_add(1);
        if let Some(b) = self.region.u64_at(OFF_BEAT[self.side.index()]) {
            b.store(self.beat, Ordering::Release);
        }
        let peer = self.side.peer().index();
        let session = self
            .region
            .u32_at(OFF_SESSION[peer])
            .map_or(0, |s| s.load(Ordering::Acquire));
        let beat = self
            .region
            .u64_at(OFF_BEAT[peer])
            .map_or(0, |b| b.load(Ordering::Acquire));
        if session != self.peer_session {
            self.peer_session = session;
            self.peer_beat = beat;
            self.peer_beat_at = Some(now);
            if self.side == Side::Guest {
                // The host laid the region out again: its rings restart.
                self.tx.adopt();
                self.rx.adopt();
            }
            if self.up {
                self.up = false;
                return Some(LinkEvent::Down);
            }
            return None;
        }
        if beat != self.peer_beat {
            self.peer_beat = beat;
            self.peer_beat_at = Some(now);
            if !self.up && session != 0 {
                self.up = true;
                return Some(LinkEvent::Up);
            }
        } else if self.up
            && self
                .peer_beat_at
                .is_none_or(|t| now.saturating_since(t) >= self.cfg.dead_after)
        {
            self.up = false;
            return Some(LinkEvent::Down);
        }
        None
    }

    /// Says we are leaving (session 0), so the peer sees it at its next tick
    /// rather than after [`LinkConfig::dead_after`].
    pub fn detach(&self) {
        if let Some(s) = self.region.u32_at(OFF_SESSION[self.side.index()]) {
            s.store(0, Ordering::Release);
        }
    }

    /// Publishes one VMPI buffer made of `parts`.
    pub fn send(&mut self, parts: &[&[u8]]) -> Result<(), RingError> {
        self.tx.push(parts)
    }

    /// Takes the next VMPI buffer into `buf`. On garbage, the receive ring is
    /// resynchronised (what the peer published is dropped) and the error is
    /// returned for counting.
    pub fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, RingError> {
        match self.rx.pop(buf) {
            Ok(r) => Ok(r),
            Err(e) => {
                self.rx.resync();
                Err(e)
            }
        }
    }

    /// Largest buffer the rings carry.
    pub fn max_buffer(&self) -> usize {
        self.geometry().max_record()
    }

    /// Reserves room in the send ring for a buffer of at most `max` bytes,
    /// to be filled in place and published with [`Link::commit`].
    pub fn reserve(&mut self, max: usize) -> Result<Segments, RingError> {
        self.tx.reserve(max)
    }

    /// Publishes the first `len` bytes of the buffer reserved for `max`.
    pub fn commit(&mut self, max: usize, len: usize) -> Result<(), RingError> {
        self.tx.commit(max, len)
    }

    /// The next received buffer, left in the ring (see [`Consumer::peek`]);
    /// on garbage the ring is resynchronised as by [`Link::recv`].
    pub fn peek(&mut self) -> Result<Option<Segments>, RingError> {
        match self.rx.peek() {
            Ok(r) => Ok(r),
            Err(e) => {
                self.rx.resync();
                Err(e)
            }
        }
    }

    /// Copies the start of the peeked buffer of `len` bytes into `dst`.
    pub fn read_peeked(&self, len: usize, dst: &mut [u8]) -> bool {
        self.rx.read(len, dst)
    }

    /// Releases the peeked buffer of `len` bytes.
    pub fn consume(&mut self, len: usize) {
        self.rx.consume(len)
    }

    /// After sending: whether the peer sleeps on an empty ring and must be
    /// rung (see [`super::ring`] about notification).
    pub fn peer_wants_data(&self) -> bool {
        self.tx.take_wakeup()
    }

    /// After receiving: whether the peer sleeps on a full ring and must be
    /// rung.
    pub fn peer_wants_room(&self) -> bool {
        self.rx.take_wakeup()
    }

    /// Asks to be rung when the receive ring gets data; true if it is
    /// still empty (sleep), false if data came meanwhile.
    pub fn arm_rx(&self) -> bool {
        self.rx.arm()
    }

    /// Asks to be rung when the send ring has room for `len` bytes; true if
    /// it still has none (sleep), false if room appeared meanwhile.
    pub fn arm_tx(&mut self, len: usize) -> bool {
        self.tx.arm(len)
    }
}

/// What became of a buffer given to [`Backlog::send`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BacklogOutcome {
    /// It is in the send ring.
    Sent,
    /// The ring was full (or others wait before it): it waits in the backlog.
    Queued,
    /// The backlog is full as well: it is lost (and counted).
    Overflow,
    /// The ring cannot carry it (empty, too large, or a bad peer index).
    Failed(RingError),
}

/// A bounded queue of buffers waiting for room in a send ring, so that a
/// full ring delays buffers instead of losing them; sent in order before
/// any newer buffer. Drain it with [`Backlog::flush`] whenever the peer
/// frees slots (its doorbell, or the next tick).
#[derive(Debug)]
pub struct Backlog {
    queue: VecDeque<Vec<u8>>,
    bytes: usize,
    max_bytes: usize,
    max_buffers: usize,
    overflow: u64,
    queued: u64,
}

impl Backlog {
    /// An empty backlog holding at most `max_buffers` buffers and
    /// `max_bytes` bytes.
    pub fn new(max_buffers: usize, max_bytes: usize) -> Backlog {
        Backlog {
            queue: VecDeque::new(),
            bytes: 0,
            max_bytes,
            max_buffers,
            overflow: 0,
            queued: 0,
        }
    }

    /// Sends the buffer made of `parts` now if nothing waits and the ring
    /// has room, else queues it, else counts it lost.
    pub fn send(&mut self, link: &mut Link, parts: &[&[u8]]) -> BacklogOutcome {
        if self.queue.is_empty() {
            match link.send(parts) {
                Ok(()) => return BacklogOutcome::Sent,
                Err(RingError::Full) => {}
                Err(e) => return BacklogOutcome::Failed(e),
            }
        }
        self.queue_only(parts)
    }

    /// Queues the buffer made of `parts` behind what waits, without trying
    /// the ring (something else must go first), or counts it lost.
    pub fn queue_only(&mut self, parts: &[&[u8]]) -> BacklogOutcome {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if self.queue.len() >= self.max_buffers || self.bytes + len > self.max_bytes {
            self.overflow += 1;
            return BacklogOutcome::Overflow;
        }
        self.queued += 1;
        self.bytes += len;
        self.queue.push_back(parts.concat());
        BacklogOutcome::Queued
    }

    /// Sends what waits, in order, while the ring has room; true if
    /// nothing waits any more. A buffer the ring can never carry is
    /// dropped; a bad peer index stops the flush (it is returned).
    pub fn flush(&mut self, link: &mut Link) -> Result<bool, RingError> {
        while let Some(b) = self.queue.front() {
            match link.send(&[b]) {
                Ok(()) | Err(RingError::BadSize(_)) => {
                    self.bytes -= b.len();
                    self.queue.pop_front();
                }
                Err(RingError::Full) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Size of the first waiting buffer (what the ring must have room for).
    pub fn front_len(&self) -> Option<usize> {
        self.queue.front().map(Vec::len)
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Buffers waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether it is at least half full (in buffers or bytes): time for
    /// whoever feeds it to slow down.
    pub fn is_congested(&self) -> bool {
        self.queue.len() * 2 >= self.max_buffers || self.bytes * 2 >= self.max_bytes
    }

    /// Whether it is at least a quarter full: time to stop the layer above
    /// from handing more down, with room left for what is on its way.
    pub fn is_filling(&self) -> bool {
        self.queue.len() * 4 >= self.max_buffers || self.bytes * 4 >= self.max_bytes
    }

    /// Drops everything waiting (the peer went away).
    pub fn clear(&mut self) {
        self.queue.clear();
        self.bytes = 0;
    }

    /// Buffers lost because the backlog was full.
    pub fn overflow(&self) -> u64 {
        self.overflow
    }

    /// Buffers that had to wait.
    pub fn queued(&self) -> u64 {
        self.queued
    }
}

/// The geometry written in a region's header, validated.
pub fn read_geometry(region: Region) -> Result<Geometry, RingError> {
    let bad = |what: String| RingError::Region {
        len: region.len(),
        what,
    };
    let mut hdr = [0u8; 20];
    if !region.read(0, &mut hdr) {
        return Err(bad("a VMPI header".into()));
    }
    if hdr[..8] != MAGIC {
        return Err(bad(
            "a VMPI layout: no magic (the host side has not created it yet?)".into(),
        ));
    }
    let word = |o: usize| u32::from_le_bytes([hdr[o], hdr[o + 1], hdr[o + 2], hdr[o + 3]]);
    if word(OFF_VERSION) != VERSION {
        return Err(bad(format!("layout version {}", word(OFF_VERSION))));
    }
    let geo = Geometry {
        slot_size: word(OFF_SLOT_SIZE),
        slots: word(OFF_SLOTS),
    }
    .validate()?;
    if region.len() < HEADER + 2 * geo.ring_bytes().next_multiple_of(4096) {
        return Err(bad(format!(
            "rings of {} slots of {} bytes",
            geo.slots, geo.slot_size
        )));
    }
    Ok(geo)
}

/// Longest a relay leaves a receive ring unread for a congested backlog.
pub const RELAY_PAUSE_MAX: Duration = Duration::from_millis(20);

/// Whether a receive ring may be read, by [`RelayGate::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayRead {
    /// Read it.
    Now,
    /// Leave it unread until this time at the latest (or until
    /// [`RelayGate::release`] says so).
    PausedUntil(Instant),
}

/// Hop-by-hop back-pressure for relays, per device: its receive ring is
/// not read while it carries N-1 flows of a normal IPCP and the backlog of
/// stacked IPCPs' frames of another device is congested
/// ([`Backlog::is_congested`]), so that a relaying host holds frames in the
/// incoming ring (and the previous hop's backlog) instead of losing them in
/// the outgoing one. A pause lasts at most [`RELAY_PAUSE_MAX`] before a
/// batch is read anyway, so that relays waiting on each other in a loop
/// cannot stop for good. The driver only reports the facts and obeys.
#[derive(Debug, Clone, Default)]
pub struct RelayGate {
    paused_since: Option<Instant>,
    pauses: u64,
}

impl RelayGate {
    /// Whether the ring may be read at `now`: `carries_n1` if N-1 flows of
    /// a normal IPCP run over this device, `congested_elsewhere` if the
    /// backlog of another device is congested.
    pub fn check(
        &mut self,
        now: Instant,
        carries_n1: bool,
        congested_elsewhere: bool,
    ) -> RelayRead {
        if !carries_n1 || !congested_elsewhere {
            self.paused_since = None;
            return RelayRead::Now;
        }
        match self.paused_since {
            None => {
                self.paused_since = Some(now);
                self.pauses += 1;
                RelayRead::PausedUntil(now + RELAY_PAUSE_MAX)
            }
            Some(since) if now.saturating_since(since) >= RELAY_PAUSE_MAX => {
                // A batch is read anyway; the pause starts again after it.
                self.paused_since = Some(now);
                RelayRead::Now
            }
            Some(since) => RelayRead::PausedUntil(since + RELAY_PAUSE_MAX),
        }
    }

    /// The congestion ended: true if the ring was paused (read it now).
    pub fn release(&mut self) -> bool {
        self.paused_since.take().is_some()
    }

    /// Times a pause began.
    pub fn pauses(&self) -> u64 {
        self.pauses
    }
}

#[cfg(test)]
mod relay_tests {
    use super::*;

    fn t(ms: u64) -> Instant {
        Instant::from_nanos(ms * 1_000_000)
    }

    #[test]
    fn ticks_are_scheduled_by_the_doorbell_mode() {
        let mut k = Ticker::default();
        assert!(k.due(t(0), false));
        k.ran(t(0), false);
        assert_eq!(k.poll_timeout(false), t(1));
        assert!(!k.due(Instant::from_nanos(500_000), false));
        assert!(k.due(t(1), false));
        k.ran(t(1), true);
        assert_eq!(k.poll_timeout(false), t(51));
        assert!(!k.due(t(50), false));
        assert_eq!(k.poll_timeout(true), Instant::ZERO);
        assert!(k.due(t(2), true), "a busy poller ticks at every turn");
        assert_eq!(k.ticks(), 2);
    }

    #[test]
    fn a_relay_pauses_while_another_backlog_is_congested_at_most_20_ms_at_a_time() {
        let mut g = RelayGate::default();
        // No N-1 flow over it, or nothing congested: read.
        assert_eq!(g.check(t(0), false, true), RelayRead::Now);
        assert_eq!(g.check(t(0), true, false), RelayRead::Now);
        // Congested: paused until 20 ms later.
        assert_eq!(g.check(t(1), true, true), RelayRead::PausedUntil(t(21)));
        assert_eq!(g.check(t(10), true, true), RelayRead::PausedUntil(t(21)));
        // After 20 ms one batch is read, then the pause starts again.
        assert_eq!(g.check(t(21), true, true), RelayRead::Now);
        assert_eq!(g.check(t(22), true, true), RelayRead::PausedUntil(t(41)));
        assert_eq!(g.pauses(), 1);
        // Relieved: read at once, and a new congestion is a new pause.
        assert!(g.release());
        assert!(!g.release());
        assert_eq!(g.check(t(23), true, true), RelayRead::PausedUntil(t(43)));
        assert_eq!(g.check(t(24), true, false), RelayRead::Now);
        assert_eq!(g.pauses(), 2);
    }
}
