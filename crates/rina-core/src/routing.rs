//! Link-state routing: the PDU forwarding table generator of a normal IPCP.
//!
//! Each IPC process describes its own N-1 flows as *flow-state objects*
//! ([`Fso`]: origin address, neighbour address, cost, sequence number, up or
//! down, age) and floods them through the DIF; every member keeps a database
//! of the newest FSO per (origin, neighbour), builds a graph from the links
//! that **both** ends report up, runs Dijkstra from itself (optionally keeping
//! every equal-cost next hop) and turns the result into the forwarding table
//! of its RMT. This is IRATI's default routing policy (`routing-ps`, seed 000
//! §16.4.1.3), with two changes: FSOs are refreshed by their origin, and
//! ageing is exact (an expiry instant per object instead of a 1-second tick).
//!
//! [`LinkState`] is sans-IO like every machine in this crate. Its FSO
//! database is the flooded database [`crate::flood::FloodDb`] (shared with
//! the directory); what it adds is its own FSOs, refreshes and the route
//! computation. The caller —
//! the layer management of the IPCP — tells it when an N-1 flow to a
//! neighbour comes up or goes down ([`LinkState::neighbor_up`],
//! [`LinkState::neighbor_down`]; noticing the loss of a flow is the job of
//! the resource allocator and its keepalives, as the seed says), hands it the
//! FSOs that arrive from neighbours ([`LinkState::on_fsos`]), calls
//! [`LinkState::handle_timeout`] when [`LinkState::poll_timeout`] says so,
//! and carries out [`LinkState::poll_action`]: sending FSOs on management
//! flows (CDAP `M_WRITE` of a `flowStateObjectGroup_t` on [`FSOS_OBJ_NAME`],
//! see [`encode_fsos`] / [`decode_fsos`]) and, on [`RoutingAction::TableChanged`],
//! refilling the forwarding table with [`LinkState::fill`].
//!
//! # Protocol
//!
//! * **Own FSOs.** One per neighbour address that has (or had) a live N-1
//!   flow: up with the lowest cost over its ports, or down once the last port
//!   is gone. Every change takes the next sequence number; up FSOs are
//!   re-originated every [`Config::refresh_interval`] so they never age out
//!   while true. The last sequence number per neighbour is kept after the FSO
//!   expires, so a link that comes back is always announced as newer. If a
//!   copy of one of our own FSOs arrives with a higher sequence number (we
//!   restarted and the DIF remembers us), or with our sequence number but
//!   saying something else (we restarted and reused it), we jump past it
//!   and re-originate the truth — up if the neighbour is live, down
//!   otherwise.
//! * **Restarted neighbours.** A neighbour that restarts without its
//!   neighbours noticing (its N-1 flows stayed) announces its own FSOs
//!   from sequence number 1 again, which the others would drop as stale
//!   until the old copies aged out, and gets no database sync. A copy of a
//!   neighbour's own FSO, received from that neighbour, that is older than
//!   the stored one (or as old but different) says it restarted: it gets
//!   the whole database, finds its old sequence numbers in it and jumps
//!   past them, and [`RoutingAction::NeighborRestarted`] tells the caller
//!   (which sends it the directory again). A neighbour that restarted
//!   before it changed anything sends exactly what we hold: its own FSO
//!   about its link to us, as we hold it, received from it in a message
//!   without any of our own FSOs (it knows nothing of us) gets it our
//!   database too, once until something new comes from it (so two
//!   neighbours never answer each other's answers).
//! * **Flooding.** A received FSO with a higher sequence number than the
//!   database's copy (or with no copy) is stored and re-flooded to every
//!   neighbour except the one it came from; equal (duplicate) and lower
//!   (stale) ones are dropped and counted, as are ones already at
//!   [`Config::max_age`]. What is to be flooded is collected and sent at most
//!   every [`Config::propagation_delay`], in messages of at most
//!   [`Config::max_fsos_per_message`] objects, one port per neighbour.
//! * **Database sync.** When a new N-1 flow comes up, the whole database is
//!   sent on it ([`RoutingAction::Send`]).
//! * **Ageing.** An FSO carries its age in seconds; the database removes it
//!   when the age reaches [`Config::max_age`]. Ages are truncated to whole
//!   seconds on the wire, so each hop may add up to one second of life.
//! * **Computation.** A change of the graph (or of the local ports) sets a
//!   dirty flag; the table is recomputed at most every
//!   [`Config::pduft_interval`], and [`RoutingAction::TableChanged`] is queued
//!   only when the next hops actually differ.
//!
//! Everything that reaches an output is iterated in address / port order, so
//! two machines fed the same events produce the same actions.

mod graph;
mod wire;

pub use graph::{shortest_paths, Graph, Route};
pub use wire::{
    decode_fsos, encode_fsos, fso_from_wire, fso_to_wire, fsos_from_wire, fsos_to_wire,
    FSOS_OBJ_CLASS, FSOS_OBJ_NAME, FSO_OBJ_CLASS,
};

use crate::flood::{FloodDb, Flooded, Limits, Verdict};
use crate::rmt::{Address, ForwardingTable, PortId};
use crate::time::Instant;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;
use thiserror::Error;

/// A flow-state object: what `origin` says about its N-1 flow(s) to
/// `neighbor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fso {
    /// Address of the IPC process that originated the object.
    pub origin: Address,
    /// Address of the neighbour at the other end of the N-1 flow.
    pub neighbor: Address,
    /// Cost of the link from `origin` to `neighbor` (0 is counted as 1; a
    /// down link keeps its last cost, or 0 if it never had one).
    pub cost: u32,
    /// Sequence number: a higher one replaces a lower one.
    pub seq: u32,
    /// Whether the N-1 flow is up.
    pub up: bool,
    /// Age in seconds when the object was sent.
    pub age: u32,
}

impl Fso {
    /// The database key: (origin, neighbour).
    pub fn key(&self) -> (Address, Address) {
        (self.origin, self.neighbor)
    }
}

impl Flooded for Fso {
    type Key = (Address, Address);
    fn key(&self) -> Self::Key {
        Fso::key(self)
    }
    fn seq(&self) -> u64 {
        u64::from(self.seq)
    }
    const SEQ_BITS: u32 = 32;
    fn age(&self) -> u32 {
        self.age
    }
    fn with_age(&self, age: u32) -> Self {
        Fso { age, ..*self }
    }
}

/// Parameters of the link-state policy. IRATI's names are given where a
/// parameter has a counterpart there.
///
/// IRATI parameters without a counterpart: `waitUntilAgeIncrement` (997 ms;
/// ageing here is exact, each object has an expiry instant),
/// `waitUntilRemoveObject` (2300 ms; expired objects go at once — sequence
/// numbers, not a grace period, keep them from coming back), and
/// `waitUntilReadCDAP` / `waitUntilError` (5001 ms; CDAP timeouts belong to the
/// caller's CDAP session, see [`crate::cdap_session`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Age at which an FSO is removed from the database (`objectMaximumAge`;
    /// IRATI's example configuration uses 10000 one-second ticks). Default
    /// 60 s: how long the FSOs of a node that vanished without anyone
    /// reporting its links down linger.
    pub max_age: Duration,
    /// How often a node re-originates its up FSOs (no IRATI counterpart:
    /// IRATI never refreshes). Default 20 s; must be below `max_age`.
    pub refresh_interval: Duration,
    /// Least time between two floods (`waitUntilFSODBPropagation`, 101 ms in
    /// IRATI). Default 100 ms. Changes wait at most this long before they
    /// leave; a flood after a quiet period leaves at once.
    pub propagation_delay: Duration,
    /// Least time between two computations of the table
    /// (`waitUntilPDUFTComputation`, 103 ms in IRATI). Default 100 ms.
    pub pduft_interval: Duration,
    /// Keep every equal-cost next hop (IRATI's `ECMPDijkstra`) instead of
    /// one (`Dijkstra`, the lowest neighbour address). Default off.
    pub ecmp: bool,
    /// Most FSOs in one message (`maxObjectsPerUpdate`, 15 in IRATI), which
    /// keeps each CDAP message well under any N-1 MTU. Default 15.
    pub max_fsos_per_message: usize,
    /// Most FSOs in the database; further new keys are dropped and counted.
    /// (Own FSOs about live neighbours are always kept.) Default 65 536.
    pub max_fsos: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_age: Duration::from_secs(60),
            refresh_interval: Duration::from_secs(20),
            propagation_delay: Duration::from_millis(100),
            pduft_interval: Duration::from_millis(100),
            ecmp: false,
            max_fsos_per_message: 15,
            max_fsos: 65_536,
        }
    }
}

impl Config {
    /// Checks that the parameters make sense together.
    pub fn validate(&self) -> Result<(), RoutingError> {
        if self.max_age < Duration::from_secs(2) {
            return Err(RoutingError::InvalidConfig(
                "max_age must be at least 2 s (ages travel in whole seconds)",
            ));
        }
        if self.refresh_interval.is_zero() || self.refresh_interval >= self.max_age {
            return Err(RoutingError::InvalidConfig(
                "refresh_interval must be above zero and below max_age",
            ));
        }
        if self.max_fsos_per_message == 0 {
            return Err(RoutingError::InvalidConfig(
                "max_fsos_per_message must be at least 1",
            ));
        }
        if self.max_fsos == 0 {
            return Err(RoutingError::InvalidConfig("max_fsos must be at least 1"));
        }
        Ok(())
    }
}

/// Why an operation of the routing machine failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RoutingError {
    /// The configuration is inconsistent; the text says which parameter.
    #[error("invalid routing configuration: {0}")]
    InvalidConfig(&'static str),
    /// A neighbour was announced with this IPCP's own address.
    #[error("address {0} is this IPC process's own address")]
    SelfNeighbor(Address),
    /// The port already belongs to a neighbour with another address.
    #[error("port {port} already belongs to neighbour {address}")]
    PortInUse {
        /// The port.
        port: PortId,
        /// The neighbour it belongs to.
        address: Address,
    },
    /// No live neighbour on this port.
    #[error("no neighbour on port {0}")]
    UnknownPort(PortId),
    /// A wire FSO without an origin address.
    #[error("flow state object without an origin address")]
    NoOriginAddress,
    /// A wire FSO without a neighbour address.
    #[error("flow state object without a neighbour address")]
    NoNeighborAddress,
    /// The bytes are not a `flowStateObjectGroup_t`.
    #[error("malformed flow state object group: {0}")]
    Malformed(String),
}

/// Something the caller must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoutingAction {
    /// Send `fsos` (one CDAP message) on each of `to_ports`.
    Flood {
        /// The management flows to send on, in port order.
        to_ports: Vec<PortId>,
        /// The objects, with their current ages.
        fsos: Vec<Fso>,
    },
    /// Send `fsos` (one CDAP message) on `port` only (database sync).
    Send {
        /// The management flow.
        port: PortId,
        /// The objects, with their current ages.
        fsos: Vec<Fso>,
    },
    /// The next hops changed: refill the forwarding table with
    /// [`LinkState::fill`].
    TableChanged,
    /// The neighbour on `port` restarted and lost its state (it sent its
    /// own FSOs older than the database's, or the ones we hold without
    /// any of ours): it was sent the whole database; the caller should
    /// send it its other databases (the directory) too.
    NeighborRestarted {
        /// The neighbour's management flow.
        port: PortId,
    },
}

/// Counters of the routing machine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// FSOs received.
    pub rx_fsos: u64,
    /// Received FSOs that were newer and were stored.
    pub rx_accepted: u64,
    /// Received FSOs with the same sequence number as the stored copy.
    pub rx_duplicate: u64,
    /// Received FSOs older than the stored copy.
    pub rx_stale: u64,
    /// Received FSOs already at the maximum age.
    pub rx_too_old: u64,
    /// Received FSOs whose origin and neighbour are the same address.
    pub rx_invalid: u64,
    /// New FSOs dropped because the database was full.
    pub rx_db_full: u64,
    /// Copies of our own FSOs newer than ours (we re-originated past them).
    pub rx_own_newer: u64,
    /// Own FSOs originated (changes and refreshes).
    pub originated: u64,
    /// Own FSOs re-originated only to refresh them.
    pub refreshed: u64,
    /// FSOs removed from the database at maximum age.
    pub expired: u64,
    /// FSO copies sent (one per object per port).
    pub tx_fsos: u64,
    /// Messages sent (one per port per batch).
    pub tx_messages: u64,
    /// Database syncs to a new neighbour.
    pub db_syncs: u64,
    /// Neighbours found to have restarted (they sent their own FSOs older
    /// than the database's) and sent the database again.
    pub neighbor_restarts: u64,
    /// Shortest-path computations.
    pub computations: u64,
    /// Computations that changed the next hops.
    pub table_changes: u64,
}

impl Counters {
    /// The counters by name, for listings.
    pub fn to_map(&self) -> BTreeMap<String, u64> {
        [
            ("rx_fsos", self.rx_fsos),
            ("rx_accepted", self.rx_accepted),
            ("rx_duplicate", self.rx_duplicate),
            ("rx_stale", self.rx_stale),
            ("rx_too_old", self.rx_too_old),
            ("rx_invalid", self.rx_invalid),
            ("rx_db_full", self.rx_db_full),
            ("rx_own_newer", self.rx_own_newer),
            ("originated", self.originated),
            ("refreshed", self.refreshed),
            ("expired", self.expired),
            ("tx_fsos", self.tx_fsos),
            ("tx_messages", self.tx_messages),
            ("db_syncs", self.db_syncs),
            ("neighbor_restarts", self.neighbor_restarts),
            ("computations", self.computations),
            ("table_changes", self.table_changes),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// A stored FSO: the object as received (its age then), when, and when it
/// expires.
type Entry = crate::flood::Stored<Fso>;

/// A live N-1 flow to a neighbour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Neighbor {
    address: Address,
    cost: u32,
}

/// The link-state routing machine of one IPC process.
#[derive(Debug, Clone)]
pub struct LinkState {
    address: Address,
    cfg: Config,
    neighbors: BTreeMap<PortId, Neighbor>,
    /// The flooded FSOs; copies come from neighbour addresses.
    db: FloodDb<Fso, Address>,
    /// Last sequence number used per neighbour, kept after expiry.
    own_seq: BTreeMap<Address, u32>,
    /// Ports whose neighbour was sent the database because it seemed to
    /// have restarted, and nothing new came from since, with when: it is
    /// not sent again before a refresh interval has passed (in case the
    /// answer was lost), so stale copies cost one answer each interval
    /// and two neighbours never answer each other's answers.
    answered: BTreeMap<PortId, Instant>,
    compute_due: Option<Instant>,
    last_compute: Option<Instant>,
    /// When the first of this IPCP's own FSOs that are up is due for a
    /// refresh (kept as the database changes, since `poll_timeout` runs on
    /// every turn of the driver).
    refresh_due: Option<Instant>,
    routes: BTreeMap<Address, Route>,
    next_hops: BTreeMap<Address, Vec<PortId>>,
    actions: VecDeque<RoutingAction>,
    counters: Counters,
}

impl LinkState {
    /// A machine for the IPC process at `address`, with no neighbours yet.
    pub fn new(address: Address, cfg: Config) -> Result<Self, RoutingError> {
        cfg.validate()?;
        let limits = Limits {
            max_age: cfg.max_age,
            propagation_delay: cfg.propagation_delay,
            max_per_message: cfg.max_fsos_per_message,
            max_objects: cfg.max_fsos,
        };
        Ok(LinkState {
            address,
            cfg,
            neighbors: BTreeMap::new(),
            db: FloodDb::new(limits),
            own_seq: BTreeMap::new(),
            answered: BTreeMap::new(),
            compute_due: None,
            last_compute: None,
            refresh_due: None,
            routes: BTreeMap::new(),
            next_hops: BTreeMap::new(),
            actions: VecDeque::new(),
            counters: Counters::default(),
        })
    }

    /// This IPC process's address.
    pub fn address(&self) -> Address {
        self.address
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Live neighbours: (port, address, cost), in port order.
    pub fn neighbors(&self) -> impl Iterator<Item = (PortId, Address, u32)> + '_ {
        self.neighbors.iter().map(|(p, n)| (*p, n.address, n.cost))
    }

    /// The database, in key order, with ages as of `now`.
    pub fn fsos(&self, now: Instant) -> impl Iterator<Item = Fso> + '_ {
        self.db.iter().map(move |(_, e)| e.at(now))
    }

    /// The stored FSO for (origin, neighbour), with its age as of `now`.
    pub fn fso(&self, now: Instant, origin: Address, neighbor: Address) -> Option<Fso> {
        self.db.get(&(origin, neighbor)).map(|e| e.at(now))
    }

    /// Number of FSOs in the database.
    pub fn db_len(&self) -> usize {
        self.db.len()
    }

    /// Routes of the last computation: cost and first-hop neighbours per
    /// reachable destination.
    pub fn routes(&self) -> &BTreeMap<Address, Route> {
        &self.routes
    }

    /// Next-hop ports per reachable destination, as of the last computation.
    pub fn next_hops(&self) -> &BTreeMap<Address, Vec<PortId>> {
        &self.next_hops
    }

    /// Whether a change waits for the next computation.
    pub fn is_dirty(&self) -> bool {
        self.compute_due.is_some()
    }

    /// Replaces the contents of `table` with the next hops (for any QoS-id).
    pub fn fill(&self, table: &mut ForwardingTable) {
        table.clear();
        for (dst, ports) in &self.next_hops {
            table.set(*dst, None, ports.clone());
        }
    }

    /// An N-1 flow to the neighbour at `address` is up on `port` with `cost`
    /// (IRATI uses 1, a hop count). Calling it again for the same port
    /// changes the cost. A new port gets the whole database (DB sync).
    pub fn neighbor_up(
        &mut self,
        now: Instant,
        port: PortId,
        address: Address,
        cost: u32,
    ) -> Result<(), RoutingError> {
        if address == self.address {
            return Err(RoutingError::SelfNeighbor(address));
        }
        let fresh = match self.neighbors.get(&port) {
            Some(n) if n.address != address => {
                return Err(RoutingError::PortInUse {
                    port,
                    address: n.address,
                })
            }
            Some(_) => false,
            None => true,
        };
        self.neighbors.insert(port, Neighbor { address, cost });
        self.originate(now, address, false);
        self.mark_dirty(now);
        if fresh {
            self.answered.remove(&port);
            self.db_sync(now, port, address);
        }
        Ok(())
    }

    /// What was sent on `port` since its neighbour came up may be lost (in
    /// a DIF that encrypts, floods before the port's keys are dropped): the
    /// neighbour gets the whole database again.
    pub fn resync(&mut self, now: Instant, port: PortId) -> Result<(), RoutingError> {
        let address = self
            .neighbors
            .get(&port)
            .ok_or(RoutingError::UnknownPort(port))?
            .address;
        self.db_sync(now, port, address);
        Ok(())
    }

    /// The N-1 flow on `port` is gone. If it was the last one to its
    /// neighbour, the link is announced down.
    pub fn neighbor_down(&mut self, now: Instant, port: PortId) -> Result<(), RoutingError> {
        let n = self
            .neighbors
            .remove(&port)
            .ok_or(RoutingError::UnknownPort(port))?;
        self.answered.remove(&port);
        self.originate(now, n.address, false);
        self.mark_dirty(now);
        // Floods went to one port per address: if another port to the
        // same address stays, it becomes the one, and gets the database
        // it may have missed (two members briefly sharing an address, see
        // `normal::membership::renumber`).
        let next = self.flood_ports().get(&n.address).copied();
        if let Some(next) = next.filter(|p| *p > port) {
            self.db_sync(now, next, n.address);
        }
        Ok(())
    }

    /// FSOs arrived from the neighbour on `from_port`.
    ///
    /// A copy of the neighbour's own FSO that is older than the stored one
    /// (or as old, but saying something else) can only come from a
    /// neighbour that restarted and lost its state: it gets the whole
    /// database, in which it finds its old sequence numbers to jump past,
    /// and [`RoutingAction::NeighborRestarted`] tells the caller. So does
    /// the neighbour's own FSO about its link to us, as we hold it, in a
    /// message without any of our own FSOs: the neighbour knows nothing
    /// of us, it restarted before changing anything and reused its
    /// sequence numbers. Either is answered once until something new comes
    /// from the neighbour (or a refresh interval passed, in case the answer
    /// was lost), so that stale copies sent over and over cost one answer,
    /// and two neighbours never answer each other's answers.
    pub fn on_fsos(
        &mut self,
        now: Instant,
        from_port: PortId,
        fsos: impl IntoIterator<Item = Fso>,
    ) {
        let avoid = self.neighbors.get(&from_port).map(|n| n.address);
        let fsos: Vec<Fso> = fsos.into_iter().collect();
        // A neighbour that knows about us sends our FSOs along with its
        // own: then it is not one that just restarted.
        let knows_us = fsos.iter().any(|f| f.origin == self.address);
        let (mut restarted, mut synced) = (false, false);
        for fso in fsos {
            self.counters.rx_fsos += 1;
            if fso.origin == fso.neighbor {
                self.counters.rx_invalid += 1;
                continue;
            }
            if self.db.too_old(&fso) {
                self.counters.rx_too_old += 1;
                continue;
            }
            if fso.origin == self.address {
                self.on_own_copy(now, fso);
                continue;
            }
            let verdict = self.db.judge(&fso);
            let from_origin = avoid == Some(fso.origin);
            let same = self.db.get(&fso.key()).map(|s| !differs(&s.obj, &fso));
            match verdict {
                Verdict::Stale => restarted |= from_origin,
                Verdict::Duplicate if same == Some(false) => restarted |= from_origin,
                // Its own word on our link, which we hold already, from a
                // neighbour that knows nothing of us: a restart that
                // reused its numbers.
                Verdict::Duplicate => {
                    synced |= from_origin && fso.neighbor == self.address && !knows_us;
                }
                Verdict::Accept | Verdict::Full => {}
            }
            match verdict {
                Verdict::Duplicate => self.counters.rx_duplicate += 1,
                Verdict::Stale => self.counters.rx_stale += 1,
                Verdict::Full => self.counters.rx_db_full += 1,
                Verdict::Accept => {
                    self.counters.rx_accepted += 1;
                    self.answered.remove(&from_port);
                    self.store(now, fso, avoid);
                }
            }
        }
        let quiet = match self.answered.get(&from_port) {
            Some(t) => now >= *t + self.cfg.refresh_interval,
            None => true,
        };
        let answer = (restarted || synced) && quiet;
        if let Some(address) = avoid.filter(|_| answer) {
            self.answered.insert(from_port, now);
            self.counters.neighbor_restarts += 1;
            self.db_sync(now, from_port, address);
            self.actions
                .push_back(RoutingAction::NeighborRestarted { port: from_port });
        }
    }

    /// A copy of one of our own FSOs came back. One with a higher sequence
    /// number than ours (we restarted and the DIF remembers us), or with
    /// ours but saying something else (we restarted and reused it), makes
    /// us jump past it and re-originate the truth.
    fn on_own_copy(&mut self, now: Instant, fso: Fso) {
        let ours = self.own_seq.get(&fso.neighbor).copied().unwrap_or(0);
        let reused = fso.seq == ours
            && self
                .db
                .get(&fso.key())
                .is_some_and(|s| differs(&s.obj, &fso));
        let newer = crate::flood::seq_newer(fso.seq.into(), ours.into(), Fso::SEQ_BITS);
        if newer || reused {
            self.counters.rx_own_newer += 1;
            let known = self.db.contains(&fso.key())
                || self.neighbors.values().any(|n| n.address == fso.neighbor);
            // The address comes from the message: a new one takes
            // room among the kept sequence numbers.
            let new_key = !self.own_seq.contains_key(&fso.neighbor);
            if new_key && !self.own_seq_room() {
                self.counters.rx_db_full += 1;
                return;
            }
            self.own_seq.insert(fso.neighbor, fso.seq);
            if !known && !self.db.has_room() {
                self.counters.rx_db_full += 1;
                return;
            }
            self.originate(now, fso.neighbor, true);
        } else if fso.seq == ours {
            self.counters.rx_duplicate += 1;
        } else {
            self.counters.rx_stale += 1;
        }
    }

    /// When [`LinkState::handle_timeout`] next needs to run, if ever. May be
    /// in the past: then run it at once.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [self.db.poll_timeout(), self.compute_due, self.refresh_due]
            .into_iter()
            .flatten()
            .min()
    }

    /// Refreshes own FSOs, expires old ones, floods what is pending and
    /// recomputes the table, each if it is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        // Refresh before expiring, so a late call never lets a true FSO die.
        let refresh: Vec<Address> = self
            .own_entries()
            .filter(|e| e.obj.up && now >= e.rx_at + self.cfg.refresh_interval)
            .map(|e| e.obj.neighbor)
            .collect();
        for n in refresh {
            self.counters.refreshed += 1;
            self.originate(now, n, true);
        }

        for gone in self.db.expire(now) {
            self.counters.expired += 1;
            if gone.up {
                self.mark_dirty(now);
            }
        }
        self.update_refresh_due();

        if self.db.flush_due(now) {
            self.flush(now);
        }
        if self.compute_due.is_some_and(|t| now >= t) {
            self.compute(now);
        }
    }

    /// The next thing the caller must do, if any.
    pub fn poll_action(&mut self) -> Option<RoutingAction> {
        self.actions.pop_front()
    }

    fn update_refresh_due(&mut self) {
        self.refresh_due = self
            .own_entries()
            .filter(|e| e.obj.up)
            .map(|e| e.rx_at + self.cfg.refresh_interval)
            .min();
    }

    /// Whether `own_seq` has room for one more address. It keeps the
    /// sequence numbers of links gone from the database too, so FSOs
    /// claiming to be ours about ever new addresses would grow it without
    /// end: past twice the database's bound, it forgets the addresses that
    /// are neither in the database nor live neighbours (at most the
    /// database's bound plus the neighbours stay, so this happens at most
    /// once per that many new addresses).
    fn own_seq_room(&mut self) -> bool {
        let cap = self.cfg.max_fsos.saturating_mul(2);
        if self.own_seq.len() < cap {
            return true;
        }
        let live: BTreeSet<Address> = self.neighbors.values().map(|n| n.address).collect();
        let (db, me) = (&self.db, self.address);
        self.own_seq
            .retain(|n, _| live.contains(n) || db.contains(&(me, *n)));
        self.own_seq.len() < cap
    }

    fn own_entries(&self) -> impl Iterator<Item = &Entry> + '_ {
        self.db
            .range((self.address, Address::MIN)..=(self.address, Address::MAX))
    }

    /// Announces the current state of the link to `neighbor` if it changed
    /// (or always, with `force`), with the next sequence number.
    fn originate(&mut self, now: Instant, neighbor: Address, force: bool) {
        let cost = self
            .neighbors
            .values()
            .filter(|n| n.address == neighbor)
            .map(|n| n.cost)
            .min();
        let key = (self.address, neighbor);
        let old = self.db.get(&key).map(|e| (e.obj.up, e.obj.cost));
        // A down link keeps the cost it had.
        let new = (cost.is_some(), cost.or(old.map(|o| o.1)).unwrap_or(0));
        let changed = match old {
            None => new.0, // never announce a link that was never up
            Some((up, c)) => up != new.0 || (up && c != new.1),
        };
        if !changed && !(force && (old.is_some() || new.0 || self.own_seq.contains_key(&neighbor)))
        {
            return;
        }
        let seq = self.own_seq.entry(neighbor).or_insert(0);
        // u32 by SEQ_BITS: the next number fits.
        *seq = crate::flood::seq_next(u64::from(*seq), Fso::SEQ_BITS) as u32;
        let fso = Fso {
            origin: self.address,
            neighbor,
            cost: new.1,
            seq: *seq,
            up: new.0,
            age: 0,
        };
        self.counters.originated += 1;
        self.store(now, fso, None);
    }

    /// Stores a newer FSO, schedules its flooding and, if the graph changed,
    /// a computation.
    fn store(&mut self, now: Instant, fso: Fso, avoid: Option<Address>) {
        let (up, cost) = (fso.up, fso.cost);
        let graph_changed = match self.db.store(now, fso, avoid) {
            None => up,
            Some(old) => old.up != up || (up && old.cost != cost),
        };
        self.update_refresh_due();
        if graph_changed {
            self.mark_dirty(now);
        }
    }

    fn mark_dirty(&mut self, now: Instant) {
        if self.compute_due.is_none() {
            let earliest = self
                .last_compute
                .map_or(now, |t| t + self.cfg.pduft_interval);
            self.compute_due = Some(earliest.max(now));
        }
    }

    /// One port per neighbour address (the lowest), in address order.
    fn flood_ports(&self) -> BTreeMap<Address, PortId> {
        let mut out = BTreeMap::new();
        for (p, n) in &self.neighbors {
            out.entry(n.address).or_insert(*p);
        }
        out
    }

    /// Sends the whole database to a new neighbour, except what the next
    /// flood will bring it anyway.
    fn db_sync(&mut self, now: Instant, port: PortId, address: Address) {
        self.counters.db_syncs += 1;
        for fsos in self.db.sync(now, address) {
            self.counters.tx_messages += 1;
            self.counters.tx_fsos += fsos.len() as u64;
            self.actions.push_back(RoutingAction::Send { port, fsos });
        }
    }

    fn flush(&mut self, now: Instant) {
        let ports = self.flood_ports();
        for m in self.db.flush(now, &ports) {
            self.counters.tx_messages += m.to_ports.len() as u64;
            self.counters.tx_fsos += (m.objects.len() * m.to_ports.len()) as u64;
            self.actions.push_back(RoutingAction::Flood {
                to_ports: m.to_ports,
                fsos: m.objects,
            });
        }
    }

    /// The graph of links reported up by both ends.
    fn graph(&self) -> Graph {
        let mut g = Graph::new();
        for ((a, b), e) in self.db.iter() {
            if !e.obj.up {
                continue;
            }
            if self.db.get(&(*b, *a)).is_some_and(|r| r.obj.up) {
                g.entry(*a).or_default().insert(*b, e.obj.cost);
            }
        }
        g
    }

    fn compute(&mut self, now: Instant) {
        self.compute_due = None;
        self.last_compute = Some(now);
        self.counters.computations += 1;
        let routes = shortest_paths(self.address, &self.graph(), self.cfg.ecmp);
        // Ports to each neighbour with its lowest cost, in port order.
        let mut best: BTreeMap<Address, (u32, Vec<PortId>)> = BTreeMap::new();
        for (p, n) in &self.neighbors {
            let e = best.entry(n.address).or_insert((n.cost, Vec::new()));
            if n.cost < e.0 {
                *e = (n.cost, Vec::new());
            }
            if n.cost == e.0 {
                e.1.push(*p);
            }
        }
        let mut next_hops = BTreeMap::new();
        for (dst, r) in &routes {
            let mut ports: Vec<PortId> = r
                .first_hops
                .iter()
                .filter_map(|h| best.get(h))
                .flat_map(|(_, ps)| ps.iter().copied())
                .collect();
            ports.sort_unstable();
            ports.dedup();
            if !self.cfg.ecmp {
                ports.truncate(1);
            }
            if !ports.is_empty() {
                next_hops.insert(*dst, ports);
            }
        }
        self.routes = routes;
        if next_hops != self.next_hops {
            self.next_hops = next_hops;
            self.counters.table_changes += 1;
            self.actions.push_back(RoutingAction::TableChanged);
        }
    }
}

/// Whether two copies of one FSO say different things (up or down, cost):
/// with the same sequence number, only an origin that restarted and
/// reused it makes them.
fn differs(a: &Fso, b: &Fso) -> bool {
    (a.up, a.cost) != (b.up, b.cost)
}

#[cfg(test)]
mod tests;
