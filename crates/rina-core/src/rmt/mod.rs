//! The Relaying and Multiplexing Task (RMT).
//!
//! The RMT sits between the EFCP connections of an IPC process and its N-1
//! flows (ports). Outgoing PDUs are looked up in the [`ForwardingTable`] by
//! destination address and QoS-id, which names one or more N-1 ports, and
//! queued on that port; PDUs that arrive for another address are relayed the
//! same way. Each port's output is ordered by a [`Scheduler`], the policy
//! hooks of seed 004 (queue create/destroy, enqueue — which may drop — and
//! next-to-send — which may decline for now). [`Fifo`] is the default; the
//! QoS policies of seeds 003 and 004 are [`QtaMux`], [`RateLimit2d`] and
//! [`DiffServ`], plus a plain [`TokenBucketPolicy`]. A policy and its
//! parameters are written as a [`SchedulerConfig`] and built with the
//! QoS cubes' places in the cherish/urgency matrix ([`CuMap`]).
//!
//! Like every machine in this crate it does no IO: the driver asks
//! [`Rmt::poll_output`] for the next PDU of a port whenever that N-1 flow
//! can take one. Each port has a transmit gate ([`PortGate`]): blocked
//! while the layer below cannot take more, or paced at the capacity of
//! the medium under it, so that PDUs wait *here*, where the scheduling
//! policy decides who goes first and who is dropped.

mod config;
mod diffserv;
mod fifo;
mod forwarding;
mod pacer;
mod qta_mux;
mod rate_limit;
mod tally;
mod token_bucket;

pub use config::{
    BucketParams, CuCell, CuMap, DiffServConfig, DsClass, Excess, FifoConfig, LevelLimit,
    Occupancy, QtaCubeConfig, QtaMuxConfig, RateLimitConfig, SchedConfigError, SchedulerConfig,
    TokenBucketConfig, DEFAULT_QUEUE_LEN, MAX_LEVELS, MAX_QTA_CUBES,
};
pub use diffserv::DiffServ;
pub use fifo::Fifo;
pub use forwarding::ForwardingTable;
pub use pacer::{Pacer, PortGate, PortRate};
pub use qta_mux::QtaMux;
pub use rate_limit::{Credits, RateLimit2d, UNITS_PER_BIT};
pub use token_bucket::{TokenBucket, TokenBucketPolicy};

use crate::time::Instant;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use thiserror::Error;

/// An N-1 port: a flow of the DIF below, as the RMT knows it.
pub type PortId = u32;
/// An address in the DIF.
pub type Address = u64;
/// A QoS-id (names a QoS cube of the DIF).
pub type QosId = u64;

/// A PDU waiting in an output queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedPdu {
    /// QoS-id from its PCI: schedulers may keep one queue per QoS-id.
    pub qos_id: QosId,
    /// Layer-management PDU (schedulers serve these first if they can).
    pub mgmt: bool,
    /// The protected PDU, ready for the N-1 flow.
    pub bytes: crate::buf::PduBuf,
}

/// Counters of one queue of a port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Name of the queue within its port (e.g. `fifo`, `qos-3`).
    pub queue: String,
    /// PDUs in the queue now.
    pub queued: usize,
    /// PDUs handed to the N-1 flow.
    pub sent: u64,
    /// PDUs dropped on enqueue.
    pub dropped: u64,
    /// Largest occupancy seen, in PDUs.
    pub max_occupancy: usize,
}

/// An RMT scheduling policy: how PDUs wait for an N-1 port.
///
/// The hooks are those IRATI exposes to RMT policies (seed 004): queues are
/// created and destroyed with ports, `enqueue` may drop, `next_to_send` may
/// decline to send although PDUs are queued (a shaper waiting for tokens),
/// in which case `next_wakeup` says when to ask again.
pub trait Scheduler: std::fmt::Debug + Send {
    /// Policy name, as chosen in the DIF configuration.
    fn name(&self) -> &'static str;
    /// Sets up the queues of a new port.
    fn create_queues(&mut self, port: PortId);
    /// Tears down the queues of a port; returns how many PDUs were discarded.
    fn destroy_queues(&mut self, port: PortId) -> usize;
    /// Queues a PDU, or gives it back when the policy drops it.
    fn enqueue(&mut self, now: Instant, port: PortId, pdu: QueuedPdu) -> Result<(), QueuedPdu>;
    /// The next PDU to send on `port`, if the policy wants one sent now.
    fn next_to_send(&mut self, now: Instant, port: PortId) -> Option<QueuedPdu>;
    /// When a port that declined with PDUs queued should be asked again.
    fn next_wakeup(&self, port: PortId) -> Option<Instant>;
    /// Whether anything is queued on `port`.
    fn has_queued(&self, port: PortId) -> bool;
    /// Counters of the queues of `port`.
    fn stats(&self, port: PortId) -> Vec<QueueStats>;
    /// PDUs queued on `port`: the sum of its queues' `queued`, which a
    /// policy may count without building their counters.
    fn queued(&self, port: PortId) -> usize {
        self.stats(port).iter().map(|q| q.queued).sum()
    }
    /// Data PDUs waiting on `port` in the queue a data PDU of `qos_id`
    /// would join (for ECN marking); policies whose queues share a buffer
    /// report the port's data backlog.
    fn data_backlog(&self, port: PortId, qos_id: QosId) -> usize;
    /// Takes `pdu` for `port` straight through, counted as queued and sent
    /// at once, if the policy would hand it out next anyway and at once
    /// (FIFO with nothing queued on the port): true then, and the caller
    /// writes it without queueing it. The default never does, so every
    /// PDU waits in a queue for [`Scheduler::next_to_send`]: a policy that
    /// orders what arrives together (priorities, weights, cubes) sees a
    /// batch whole.
    fn pass(&mut self, _now: Instant, _port: PortId, _pdu: &QueuedPdu) -> bool {
        false
    }
}

/// A flow's route as it last looked it up, kept by the flow for
/// [`Rmt::send_through_memo`]: while the forwarding table is the same, the
/// flow's PDUs (one destination, one QoS-id, one flow hash) take that port
/// without a lookup.
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteMemo {
    /// (the table's version, the port then).
    at: Option<(u64, PortId)>,
}

/// Where [`Rmt::send_through`] put a PDU.
#[derive(Debug)]
pub enum Through {
    /// Queued for `port`, to be taken with [`Rmt::poll_output`].
    Queued(PortId),
    /// To be written on `port` now: the policy passed it through.
    Now(PortId, crate::buf::PduBuf),
}

/// Why the RMT could not take a PDU.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RmtError {
    /// No forwarding entry for the destination and QoS-id.
    #[error("no route to address {dst} (QoS-id {qos_id})")]
    NoRoute { dst: Address, qos_id: QosId },
    /// The port is not known to the RMT.
    #[error("no N-1 port {0}")]
    UnknownPort(PortId),
    /// The scheduling policy dropped the PDU (queue full).
    #[error("output queue of port {0} is full; PDU dropped")]
    QueueFull(PortId),
}

/// RMT-wide counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RmtCounters {
    /// PDUs queued for output (own and relayed).
    pub queued: u64,
    /// PDUs relayed for other addresses.
    pub relayed: u64,
    /// PDUs dropped for lack of a route.
    pub no_route: u64,
    /// PDUs dropped by the scheduling policy.
    pub queue_drops: u64,
    /// Data PDUs whose ECN flag this RMT set (its queue was congested).
    pub ecn_marked: u64,
}

/// Explicit congestion notification: when the RMT sets the ECN flag of a
/// data PDU's PCI (DCTCP's step marking on the instantaneous queue, done
/// as the PDU leaves: a data PDU that leaves `threshold` or more data PDUs
/// behind it in its queue is marked). Marking on departure rather than on
/// arrival tells the sender about the queue as it is now, not as it was a
/// queueing delay ago, which shortens the control loop by that delay (in
/// the simulator's 10-flow case the queue spent 42 % of the time above the
/// threshold instead of 50 %, and fairness rose from 0.971 to 0.974).
///
/// DCTCP needs a threshold of about a seventh of the path's
/// bandwidth-delay product or more, or the window it keeps cannot fill
/// the path: its authors used 20 packets at 1 Gb/s and 65 at 10 Gb/s. So
/// by default (`by_rate`) the threshold is a floor that a port raises
/// with its rate, to what the port sends in [`ECN_THRESHOLD_TIME`]; a
/// port that is not paced has no known rate and is taken as fast
/// ([`FAST_PORT_ECN_THRESHOLD`]): its queue forms only while the medium
/// below refuses frames. On two daemons over loopback a reliable flow of
/// 1400-byte SDUs carried 6.4-7.0 Gb/s with 20 and 11.4-12.1 with 64,
/// as much as without congestion control.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EcnMarking {
    /// Data PDUs left behind in the queue from which departing PDUs are
    /// marked (the floor, with `by_rate`).
    pub threshold: usize,
    /// Thresholds of the queues of some QoS-ids, overriding `threshold`
    /// (fixed, whatever the port's rate).
    pub per_qos: BTreeMap<QosId, usize>,
    /// Whether a port's rate raises `threshold` ([`EcnMarking::threshold_at`]);
    /// off, `threshold` holds on every port as it is.
    pub by_rate: bool,
}

/// Default marking threshold, in PDUs: about a bandwidth-delay product at
/// 10 Mb/s and 20 ms of round trip, and a small fraction of the queues.
pub const DEFAULT_ECN_THRESHOLD: usize = 20;

/// Queueing time a paced port's threshold stands for where that is more
/// than [`EcnMarking::threshold`] PDUs: DCTCP's 65 packets of 1,500 bytes
/// at 10 Gb/s.
pub const ECN_THRESHOLD_TIME: Duration = Duration::from_micros(78);

/// The threshold of a port that is not paced, in PDUs (DCTCP's at 10 Gb/s).
pub const FAST_PORT_ECN_THRESHOLD: usize = 65;

impl Default for EcnMarking {
    fn default() -> Self {
        EcnMarking {
            threshold: DEFAULT_ECN_THRESHOLD,
            per_qos: BTreeMap::new(),
            by_rate: true,
        }
    }
}

impl EcnMarking {
    /// A threshold of `threshold` PDUs on every port, whatever its rate.
    pub fn fixed(threshold: usize) -> Self {
        EcnMarking {
            threshold,
            per_qos: BTreeMap::new(),
            by_rate: false,
        }
    }

    /// The threshold of the queue of `qos_id` on a port of any rate (a
    /// fixed one, or the floor).
    pub fn threshold_for(&self, qos_id: QosId) -> usize {
        self.per_qos.get(&qos_id).copied().unwrap_or(self.threshold)
    }

    /// The threshold of the queue of `qos_id` on a port paced at `rate`
    /// (`None`: not paced): with `by_rate` and no threshold of its own
    /// for `qos_id`, the larger of [`EcnMarking::threshold`] and what the
    /// port sends in [`ECN_THRESHOLD_TIME`] in 1,500-byte PDUs
    /// ([`FAST_PORT_ECN_THRESHOLD`] if not paced).
    pub fn threshold_at(&self, qos_id: QosId, rate: Option<PortRate>) -> usize {
        if let Some(&t) = self.per_qos.get(&qos_id) {
            return t;
        }
        if !self.by_rate || self.threshold == 0 {
            return self.threshold;
        }
        // Bits sent in the time, over the bits of a 1,500-byte PDU (a
        // division by a constant: no u128 arithmetic per PDU).
        const NS: u64 = ECN_THRESHOLD_TIME.as_nanos() as u64;
        let scaled = match rate {
            Some(r) => r.bps.saturating_mul(NS) / (1_000_000_000 * 1_500 * 8),
            None => FAST_PORT_ECN_THRESHOLD as u64,
        };
        let scaled = usize::try_from(scaled).unwrap_or(usize::MAX);
        self.threshold.max(scaled)
    }
}

/// Where the PCI sits in the protected frames the RMT queues, so that it
/// can set the ECN flag in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLayout {
    /// Offset of the PCI's type byte (the flags byte follows it).
    pub type_at: usize,
    /// The frame ends in a CRC-32 (big-endian, over everything before it)
    /// that must be computed again.
    pub crc: bool,
}

impl FrameLayout {
    /// Sets the ECN flag of a data PDU's frame; returns whether it did.
    pub fn mark(&self, frame: &mut [u8]) -> bool {
        use rina_wire::pci::{flags, PduType};
        if frame.get(self.type_at) != Some(&PduType::Dt.code()) {
            return false;
        }
        let Some(f) = frame.get_mut(self.type_at + 1) else {
            return false;
        };
        if *f & flags::ECN != 0 {
            return false;
        }
        *f |= flags::ECN;
        if self.crc {
            let Some(split) = frame.len().checked_sub(4) else {
                return false;
            };
            if split <= self.type_at + 1 {
                return false;
            }
            let crc = crc32fast::hash(&frame[..split]);
            frame[split..].copy_from_slice(&crc.to_be_bytes());
        }
        true
    }
}

/// The QoS cube of the DIF below that an N-1 flow was allocated with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LowerCube {
    /// Its QoS-id in the DIF below.
    pub id: QosId,
    /// Its name in the DIF below.
    pub name: String,
}

/// An N-1 flow that is a *lane* of another port: it leads to the same
/// neighbour, over another QoS cube of the DIF below, and carries the PDUs
/// of some QoS-ids of this DIF (the cube mapping across DIFs, seed 003).
///
/// Forwarding, routing and membership only know the lane's *primary* port;
/// the RMT moves a data PDU queued on the primary to the lane that carries
/// its QoS-id. Management PDUs stay on the primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lane {
    /// The port forwarding names for the neighbour.
    pub primary: PortId,
    /// The QoS-ids of this DIF the lane carries.
    pub carries: BTreeSet<QosId>,
}

/// The RMT of one IPC process.
#[derive(Debug)]
pub struct Rmt {
    table: ForwardingTable,
    /// Counts the changes of `table` (every mutable borrow of it): a
    /// [`RouteMemo`] of another version is looked up again.
    table_version: u64,
    sched: Box<dyn Scheduler>,
    ports: BTreeMap<PortId, PortGate>,
    counters: RmtCounters,
    /// Lanes by their port.
    lanes: BTreeMap<PortId, Lane>,
    /// (primary, QoS-id) -> the lane that carries it.
    steer: BTreeMap<(PortId, QosId), PortId>,
    /// The cube below of ports that have one, for listings.
    lower: BTreeMap<PortId, LowerCube>,
    /// ECN marking, if on.
    ecn: Option<(EcnMarking, FrameLayout)>,
}

impl Rmt {
    /// An RMT with no ports and no routes, using `sched` for its queues.
    pub fn new(sched: Box<dyn Scheduler>) -> Self {
        Rmt {
            table: ForwardingTable::default(),
            table_version: 0,
            sched,
            ports: BTreeMap::new(),
            counters: RmtCounters::default(),
            lanes: BTreeMap::new(),
            steer: BTreeMap::new(),
            lower: BTreeMap::new(),
            ecn: None,
        }
    }

    /// Turns ECN marking on (frames laid out as `layout`) or off.
    pub fn set_ecn(&mut self, ecn: Option<(EcnMarking, FrameLayout)>) {
        self.ecn = ecn;
    }

    /// The ECN marking in force, if any.
    pub fn ecn(&self) -> Option<&EcnMarking> {
        self.ecn.as_ref().map(|(m, _)| m)
    }

    /// The forwarding table.
    pub fn table(&self) -> &ForwardingTable {
        &self.table
    }

    /// The forwarding table, to change routes.
    pub fn table_mut(&mut self) -> &mut ForwardingTable {
        self.table_version += 1;
        &mut self.table
    }

    /// Counters.
    pub fn counters(&self) -> &RmtCounters {
        &self.counters
    }

    /// Name of the scheduling policy.
    pub fn scheduler_name(&self) -> &'static str {
        self.sched.name()
    }

    /// Replaces the scheduling policy; PDUs queued in the old one are
    /// discarded (and counted as queue drops).
    pub fn set_scheduler(&mut self, mut sched: Box<dyn Scheduler>) {
        for &p in self.ports.keys() {
            self.counters.queue_drops += self.sched.destroy_queues(p) as u64;
            sched.create_queues(p);
        }
        self.sched = sched;
    }

    /// Adds an N-1 port.
    pub fn add_port(&mut self, port: PortId) {
        if let std::collections::btree_map::Entry::Vacant(e) = self.ports.entry(port) {
            e.insert(PortGate::default());
            self.sched.create_queues(port);
        }
    }

    /// Removes an N-1 port, its queues and its routes. A lane stops
    /// carrying its QoS-ids (they go on its primary again); the lanes of a
    /// primary become plain ports.
    pub fn remove_port(&mut self, port: PortId) {
        if self.ports.remove(&port).is_some() {
            self.counters.queue_drops += self.sched.destroy_queues(port) as u64;
            self.table_mut().remove_port(port);
        }
        self.lower.remove(&port);
        self.lanes.remove(&port);
        self.lanes.retain(|_, l| l.primary != port);
        self.rebuild_steering();
    }

    /// PDUs `port` handed down since the driver's turn began
    /// ([`Rmt::new_turn`]): passed through or polled and counted with
    /// [`Rmt::add_burst`].
    pub fn burst_used(&self, port: PortId) -> usize {
        self.ports.get(&port).map_or(0, PortGate::burst)
    }

    /// Counts `n` more PDUs polled from `port` in this turn.
    pub fn add_burst(&mut self, port: PortId, n: usize) {
        if let Some(g) = self.ports.get_mut(&port) {
            g.add_burst(n);
        }
    }

    /// A new turn of the driver: every port may hand down a burst again.
    pub fn new_turn(&mut self) {
        for g in self.ports.values_mut() {
            g.new_burst();
        }
    }

    /// The N-1 ports (lanes included).
    pub fn ports(&self) -> impl Iterator<Item = PortId> + '_ {
        self.ports.keys().copied()
    }

    /// The N-1 ports that forwarding, routing and membership use: every
    /// port but the lanes.
    pub fn primary_ports(&self) -> impl Iterator<Item = PortId> + '_ {
        self.ports
            .keys()
            .copied()
            .filter(|p| !self.lanes.contains_key(p))
    }

    /// Makes `lane` (a new port, or a plain port without lanes of its own)
    /// a lane of `primary` that carries the data PDUs of `carries`; calling
    /// it again for the same lane changes what it carries. A QoS-id carried
    /// by two lanes of one primary goes on the lane with the smaller port.
    pub fn add_lane(
        &mut self,
        primary: PortId,
        lane: PortId,
        carries: BTreeSet<QosId>,
    ) -> Result<(), RmtError> {
        if !self.ports.contains_key(&primary)
            || self.lanes.contains_key(&primary)
            || primary == lane
            || self.lanes.values().any(|l| l.primary == lane)
        {
            return Err(RmtError::UnknownPort(primary));
        }
        self.add_port(lane);
        self.table_mut().remove_port(lane);
        self.lanes.insert(lane, Lane { primary, carries });
        self.rebuild_steering();
        Ok(())
    }

    /// The lanes: (port, lane), in port order.
    pub fn lanes(&self) -> impl Iterator<Item = (PortId, &Lane)> + '_ {
        self.lanes.iter().map(|(p, l)| (*p, l))
    }

    /// The primary of `port`: its own number unless it is a lane.
    pub fn primary_of(&self, port: PortId) -> PortId {
        self.lanes.get(&port).map_or(port, |l| l.primary)
    }

    /// Records the cube of the DIF below that `port` was allocated with.
    pub fn set_lower_cube(&mut self, port: PortId, cube: Option<LowerCube>) {
        match cube {
            Some(c) => self.lower.insert(port, c),
            None => self.lower.remove(&port),
        };
    }

    /// The cube of the DIF below of `port`, if recorded.
    pub fn lower_cube(&self, port: PortId) -> Option<&LowerCube> {
        self.lower.get(&port)
    }

    /// PDUs handed to `port` so far (the `sent` counters of its queues).
    pub fn port_sent(&self, port: PortId) -> u64 {
        self.sched.stats(port).iter().map(|s| s.sent).sum()
    }

    fn rebuild_steering(&mut self) {
        self.steer.clear();
        for (&lane, l) in &self.lanes {
            for &q in &l.carries {
                self.steer.entry((l.primary, q)).or_insert(lane);
            }
        }
    }

    /// The port a PDU queued for `port` really goes on: the lane of `port`
    /// that carries its QoS-id, if any (never for management PDUs).
    fn steered(&self, port: PortId, pdu: &QueuedPdu) -> PortId {
        if pdu.mgmt || self.steer.is_empty() {
            return port;
        }
        self.steer.get(&(port, pdu.qos_id)).copied().unwrap_or(port)
    }

    /// Queues a PDU for `dst`; returns the port chosen. `flow_hash` spreads
    /// flows over equal-cost ports (PDUs of one flow always take one port).
    pub fn send(
        &mut self,
        now: Instant,
        dst: Address,
        flow_hash: u64,
        pdu: QueuedPdu,
    ) -> Result<PortId, RmtError> {
        let port = self.route(dst, pdu.qos_id, flow_hash)?;
        self.send_on(now, port, pdu)?;
        Ok(port)
    }

    /// The port the forwarding table gives for `dst` and `qos_id` (a
    /// missing route counted).
    fn route(&mut self, dst: Address, qos_id: QosId, flow_hash: u64) -> Result<PortId, RmtError> {
        self.table.lookup(dst, qos_id, flow_hash).ok_or_else(|| {
            self.counters.no_route += 1;
            RmtError::NoRoute { dst, qos_id }
        })
    }

    /// [`Rmt::send`], or the PDU back to be written at once where a queue
    /// and a poll would have handed it out in the same turn: the port
    /// (after steering) has nothing queued, its gate is open, no ECN mark
    /// could fall on it, it handed down fewer than `burst` PDUs in this
    /// turn ([`Rmt::burst_used`]) and the policy passes it
    /// ([`Scheduler::pass`]). The port's counters, burst and pacer see it
    /// as sent.
    pub fn send_through(
        &mut self,
        now: Instant,
        dst: Address,
        flow_hash: u64,
        pdu: QueuedPdu,
        burst: usize,
    ) -> Result<Through, RmtError> {
        let mut memo = RouteMemo::default();
        self.send_through_memo(now, dst, flow_hash, &mut memo, pdu, burst)
    }

    /// [`Rmt::send_through`] for a flow that keeps its route in `memo`
    /// (the same `dst`, `flow_hash` and QoS-id on every call): looked up
    /// only when the forwarding table changed since.
    pub fn send_through_memo(
        &mut self,
        now: Instant,
        dst: Address,
        flow_hash: u64,
        memo: &mut RouteMemo,
        pdu: QueuedPdu,
        burst: usize,
    ) -> Result<Through, RmtError> {
        let port = match memo.at {
            Some((v, port)) if v == self.table_version => port,
            _ => {
                let port = self.route(dst, pdu.qos_id, flow_hash)?;
                memo.at = Some((self.table_version, port));
                port
            }
        };
        let out = self.steered(port, &pdu);
        // A data PDU leaving an empty queue is marked only at threshold 0.
        let unmarked = match &self.ecn {
            Some((m, _)) => pdu.mgmt || m.threshold_for(pdu.qos_id) > 0,
            None => true,
        };
        if unmarked {
            if let Some(gate) = self.ports.get_mut(&out) {
                if gate.open(now) && gate.burst() < burst && self.sched.pass(now, out, &pdu) {
                    gate.sent(now, pdu.bytes.len());
                    gate.add_burst(1);
                    self.counters.queued += 1;
                    return Ok(Through::Now(out, pdu.bytes));
                }
            }
        }
        self.send_on(now, port, pdu)?;
        Ok(Through::Queued(port))
    }

    /// Relays a PDU that arrived for another address.
    pub fn relay(
        &mut self,
        now: Instant,
        dst: Address,
        flow_hash: u64,
        pdu: QueuedPdu,
    ) -> Result<PortId, RmtError> {
        let port = self.send(now, dst, flow_hash, pdu)?;
        self.counters.relayed += 1;
        Ok(port)
    }

    /// Queues a PDU on a given port (management PDUs to a neighbour), or
    /// on the lane of that port that carries its QoS-id.
    pub fn send_on(&mut self, now: Instant, port: PortId, pdu: QueuedPdu) -> Result<(), RmtError> {
        if !self.ports.contains_key(&port) {
            return Err(RmtError::UnknownPort(port));
        }
        let port = self.steered(port, &pdu);
        match self.sched.enqueue(now, port, pdu) {
            Ok(()) => {
                self.counters.queued += 1;
                Ok(())
            }
            Err(_) => {
                self.counters.queue_drops += 1;
                Err(RmtError::QueueFull(port))
            }
        }
    }

    /// The next PDU to write on `port`, if its gate is open and the policy
    /// wants one sent now.
    pub fn poll_output(&mut self, now: Instant, port: PortId) -> Option<crate::buf::PduBuf> {
        let gate = self.ports.get_mut(&port)?;
        if !gate.open(now) {
            return None;
        }
        let mut pdu = self.sched.next_to_send(now, port)?;
        gate.sent(now, pdu.bytes.len());
        if let Some((m, layout)) = self.ecn.as_ref().filter(|_| !pdu.mgmt) {
            let backlog = self.sched.data_backlog(port, pdu.qos_id);
            // The floor first: the port's own threshold is never below it.
            if backlog >= m.threshold_for(pdu.qos_id)
                && backlog >= m.threshold_at(pdu.qos_id, gate.rate())
                && layout.mark(&mut pdu.bytes)
            {
                self.counters.ecn_marked += 1;
            }
        }
        Some(pdu.bytes)
    }

    /// Paces `port` at the capacity of the medium under it, or stops pacing
    /// it (`None`). Unknown ports are ignored.
    pub fn set_port_rate(&mut self, port: PortId, rate: Option<PortRate>) {
        if let Some(g) = self.ports.get_mut(&port) {
            g.set_rate(rate);
        }
    }

    /// Blocks `port` while the layer below cannot take more PDUs, or
    /// unblocks it. Unknown ports are ignored.
    pub fn set_port_blocked(&mut self, port: PortId, blocked: bool) {
        if let Some(g) = self.ports.get_mut(&port) {
            g.set_blocked(blocked);
        }
    }

    /// The transmit gate of `port`.
    pub fn port_gate(&self, port: PortId) -> Option<&PortGate> {
        self.ports.get(&port)
    }

    /// Whether `port` has PDUs waiting.
    pub fn has_output(&self, port: PortId) -> bool {
        self.sched.has_queued(port)
    }

    /// When a port whose policy declined, or whose pacer held PDUs back,
    /// should be polled again (`now` tells a pacer that is ready from one
    /// that is not).
    pub fn poll_timeout(&self, now: Instant) -> Option<Instant> {
        // Only a port with PDUs queued has anything to wait for (every
        // policy's `next_wakeup` is `None` on an empty port), and most
        // ports are empty on most turns.
        self.ports
            .iter()
            .filter(|(&p, _)| self.sched.has_queued(p))
            .filter_map(|(&p, gate)| {
                let paced = gate.opens_at(now);
                let policy = if gate.open(now) {
                    self.sched.next_wakeup(p)
                } else {
                    None
                };
                paced.into_iter().chain(policy).min()
            })
            .min()
    }

    /// Queue counters of a port.
    pub fn queue_stats(&self, port: PortId) -> Vec<QueueStats> {
        self.sched.stats(port)
    }

    /// PDUs queued on every port.
    pub fn queued(&self) -> usize {
        self.ports.keys().map(|&p| self.sched.queued(p)).sum()
    }
}

#[cfg(test)]
mod qos_tests;
#[cfg(test)]
mod tests;
