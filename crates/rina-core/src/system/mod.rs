//! A whole system as one sans-IO machine: every IPC process of a host,
//! stacked on each other, with the resource allocator and the applications'
//! flows.
//!
//! A [`System`] owns its members ([`member::Member`]: shim-udp and normal
//! IPCPs behind one contract), wires the N-1 ports of each normal IPCP onto
//! flows of the members below it in memory, decides which N-1 flows exist
//! ([`allocator`]: one per neighbour and lower cube in use, retries, lanes,
//! teardown of silent neighbours), and keeps the applications' flows and
//! registrations as abstract ports. It is fed what happens outside — an
//! application wrote ([`System::write`]), a medium delivered a frame
//! ([`System::handle_frame`]), a medium is full or can take more again
//! ([`System::medium_blocked`], [`System::medium_writable`]), time
//! ([`System::handle_timeout`]) — and answers with [`Output`]s: frames for
//! a medium, SDUs and events for applications. It reads no clock and does
//! no IO; `rina-sim` runs many of them over emulated links, and a test can
//! drive two by hand.
//!
//! # Back-pressure
//!
//! A port hands a PDU down only when the layer under it can take one, so
//! queues build in the RMT where the scheduling policy decides:
//!
//! * over a shim with a `rate` (its link's capacity), the N-1 port is paced
//!   at that rate ([`crate::rmt::PortRate`]);
//! * over a medium the driver reports full, every N-1 port over it is
//!   blocked until it reports it writable;
//! * over a lower normal IPCP, the port is open while the lower flow can
//!   take a frame (its window), so a flow-controlled lower flow pushes back.
//!
//! An application writing on a flow that cannot take its SDU gets
//! [`FlowError::WouldBlock`] and later [`AppEvent::Writable`]: writers of
//! flow-controlled flows wait instead of losing SDUs; unreliable flows
//! lose where the policy says.

pub mod allocator;
pub mod claims;
mod events;
mod held;
pub mod member;
mod removal;
mod rib_view;
mod tap;

pub use crate::buf::{PduBuf, SduSource};
pub use allocator::{Neighbor, NeighborSpec, Plan, NEIGHBOR_RETRY};
pub use held::{ENDED_HOLD_MAX, MAX_HELD_BYTES, MAX_HELD_SDUS};
pub use member::{FlowError, IpcpEvent, LowerPeer, Machine, Member, PortId, ShimSend};
pub use removal::Removal;
pub use tap::{MediumTapped, TAP_MAX_BYTES};

use crate::normal::{MembershipEvent, NormalConfig, NormalIpcp, LINGER_MAX};
use crate::rmt::{PortRate, SchedulerConfig};
use crate::sdu::Sdu;
use crate::shim_udp::{self, ShimUdp};
use crate::time::Instant;
use crate::{shim_eth, shim_hv};
use rina_wire::{AppName, QosSpec};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use thiserror::Error;

/// A medium: the member (a shim) whose datagrams the driver carries.
pub type MediumId = usize;

/// What the system asks of its driver.
// Every PDU is moved in one of these several times (queued, polled,
// turned into the system's event): the rare variants box their names,
// QoS and news so that a move is a few words, not a `memcpy` of 280 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send `frame` on medium `medium` (to `peer` over UDP).
    ToMedium {
        medium: MediumId,
        peer: Option<SocketAddr>,
        frame: PduBuf,
    },
    /// News of enrollment and neighbours from normal IPCP `member`.
    Membership {
        member: usize,
        event: Box<MembershipEvent>,
    },
    /// The outcome of read `handle` of a neighbour's RIB that normal IPCP
    /// `member` was asked for.
    RibRead {
        member: usize,
        handle: u64,
        result: Result<Vec<rina_wire::ctl::RibObjectInfo>, crate::normal::RibReadError>,
    },
    /// A problem of configuration the operator must see: the N-1 flows of
    /// normal IPCP `member` to `neighbor` are not set up, and why.
    Alarm {
        member: usize,
        neighbor: Box<AppName>,
        message: String,
    },
    /// An SDU for the application of flow `port`.
    ToApp { port: PortId, sdu: Sdu },
    /// Something for an application.
    App(AppEvent),
}

/// News for applications.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppEvent {
    /// A peer asks for a flow to `local` (registered by an application in
    /// DIF `dif`); answer with [`System::accept`] or [`System::refuse`].
    FlowRequest {
        handle: u64,
        dif: String,
        local: Box<AppName>,
        remote: Box<AppName>,
        qos: Box<QosSpec>,
    },
    /// Request `handle` was withdrawn (not answered in time).
    RequestWithdrawn { handle: u64 },
    /// Flow `port` asked for with [`System::allocate`] exists.
    Allocated { port: PortId, max_sdu: u32 },
    /// Flow `port` could not be set up.
    AllocateFailed { port: PortId, error: FlowError },
    /// The peer deallocated flow `port`, or its connection failed, or its
    /// application closed it and what the driver held for it did not go in
    /// time ([`System::app_closed`]). A driver that still holds SDUs
    /// delivered on it keeps its end open to the application for them
    /// with [`System::hold_ended`].
    Deallocated { port: PortId },
    /// Flow `port` can take the SDU that was refused with
    /// [`FlowError::WouldBlock`].
    Writable { port: PortId },
    /// Flow `port`, ended by its peer and kept for its application
    /// ([`System::hold_ended`]), was not released in time: what the driver
    /// still holds for it is lost.
    HoldExpired { port: PortId },
}

/// Why a system could not be built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SystemError {
    /// Two members have one name.
    #[error("two IPCPs are named {0}")]
    DuplicateName(String),
    /// A neighbour is over a DIF no other member of the system is in.
    #[error("IPCP {ipcp}: no other IPCP of this system is in DIF {dif}")]
    NoLowerIpcp { ipcp: String, dif: String },
    /// A normal IPCP's frames do not fit the SDUs of the DIF below.
    #[error("IPCP {ipcp}: its frames of up to {frame} bytes do not fit the SDUs of DIF {dif} (at most {max})")]
    FrameTooLarge {
        ipcp: String,
        frame: usize,
        dif: String,
        max: usize,
    },
    /// A machine refused its configuration.
    #[error("IPCP {ipcp}: {reason}")]
    Machine { ipcp: String, reason: String },
    /// No live member at this index (never added, or removed).
    #[error("no IPCP at index {0} (it was removed, or never added)")]
    NoMember(usize),
}

/// Counters of the system's own work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Datagrams a shim dropped (malformed, unknown flow, wrong peer).
    pub rx_dropped: u64,
    /// Frames of normal IPCPs an N-1 flow could not take.
    pub n1_tx_dropped: u64,
    /// N-1 allocations that could not be started.
    pub n1_not_started: u64,
    /// N-1 flows torn down because the neighbour went silent.
    pub n1_silent: u64,
    /// Cube mappings that name a lower cube the DIF below lacks.
    pub bad_cube_mapping: u64,
    /// SDUs for application flows that no longer exist.
    pub app_rx_orphan: u64,
    /// Management PDUs no machine of the system handles.
    pub mgmt_unhandled: u64,
    /// New N-1 flows held as claims on a neighbour with a working one
    /// ([`claims`]).
    pub n1_claims: u64,
    /// Claims whose claimant authenticated and took the neighbour over.
    pub n1_claims_admitted: u64,
    /// Claims torn down because the claimant did not authenticate.
    pub n1_claims_refused: u64,
    /// New lanes to an authenticated neighbour refused because they came
    /// from another peer than its primary (`claims`).
    pub n1_lanes_refused: u64,
    /// Flows closed by their application whose SDUs held by the driver had
    /// not all gone [`LINGER_MAX`] later: closed with what was left
    /// ([`System::app_closed`]).
    pub app_close_expired: u64,
    /// Flows ended by their peer whose application had not taken what the
    /// driver held for it [`ENDED_HOLD_MAX`] later ([`System::hold_ended`]).
    pub ended_hold_expired: u64,
}

/// A frame as a medium's driver received it.
#[derive(Debug, Clone, Copy)]
pub enum Rx<'a> {
    /// A UDP datagram from `from` (shim-udp).
    Udp {
        from: SocketAddr,
        datagram: &'a [u8],
    },
    /// An Ethernet frame, with the VLAN tag the kernel stripped, if any
    /// (shim-eth).
    Eth {
        frame: &'a [u8],
        aux_vlan: Option<u16>,
    },
    /// A buffer from the receive ring, channel header included (shim-hv).
    Hv { buf: &'a [u8] },
}

/// The machines of one system.
#[derive(Debug)]
pub struct System {
    name: String,
    members: Vec<Member>,
    /// Per member: the resource allocator's state (normal IPCPs).
    plans: Vec<Plan>,
    out: VecDeque<Output>,
    /// N-1 flows: port -> (upper member, lower member).
    n1: BTreeMap<PortId, (usize, usize)>,
    /// The last two ports found in `n1` on the data path, the most recent
    /// first (port 0, which no flow has, where none): a stacked DIF's
    /// frames alternate between the upper's N-1 port and the lower's, so
    /// two spare a tree search per frame each way. Emptied whenever `n1`
    /// changes.
    n1_recent: [(PortId, usize, usize); 2],
    /// The N-1 flows of `n1` over a normal IPCP (a stacked DIF's), whose
    /// gates follow their lower flow's room: what the system checks on
    /// every turn, empty when no DIF is stacked. (port, upper, lower), in
    /// the order of their ports, held apart from `n1` so that the check
    /// looks nothing up.
    n1_stacked: Vec<(PortId, usize, usize)>,
    /// N-1 flows being allocated: port -> (upper member, neighbour index).
    n1_pending: BTreeMap<PortId, (usize, usize)>,
    /// N-1 ports blocked because their lower flow has no room.
    gated: BTreeSet<PortId>,
    /// New N-1 flows claiming a neighbour that has a working one.
    claims: BTreeMap<PortId, claims::Claim>,
    /// Names registered in lower members for normal IPCPs: -> upper member.
    ipcp_names: BTreeMap<(usize, AppName), usize>,
    /// Names registered by applications, per member.
    app_names: BTreeSet<(usize, AppName)>,
    /// Application flows: port -> member.
    app_flows: BTreeMap<PortId, usize>,
    /// Application allocations waiting for the peer: port -> member.
    app_pending: BTreeMap<PortId, usize>,
    /// Incoming requests for applications: handle -> (member, its handle).
    incoming: BTreeMap<u64, (usize, u64)>,
    /// Flows whose writer waits for room: port -> SDU length.
    want_writable: BTreeMap<PortId, usize>,
    /// Flows whose application closed them while the driver still held
    /// SDUs it wrote ([`System::app_closed`]): port -> when the system
    /// closes them whatever is left.
    app_closing: BTreeMap<PortId, Instant>,
    /// Flows ended by their peer whose driver still holds SDUs for their
    /// application ([`System::hold_ended`]): port -> when the system
    /// reports them.
    ended_held: BTreeMap<PortId, Instant>,
    /// Media the driver reported full.
    blocked_media: BTreeSet<MediumId>,
    /// Media whose link is down.
    down_media: BTreeSet<MediumId>,
    /// Media whose frames are copied for a capture.
    taps: BTreeMap<MediumId, tap::MediumTap>,
    /// Members removed at run time ([`System::remove_ipcp`]): their index
    /// stays taken, so the others keep theirs, but nothing reaches them.
    removed: BTreeSet<usize>,
    /// The frames a normal member sends in a row on one N-1 port, on
    /// their way down together (kept for its allocation).
    tx_frames: Vec<PduBuf>,
    next_handle: u64,
    next_port: PortId,
    now: Instant,
    counters: Counters,
    last_error: Option<String>,
    /// Credit for SDUs of normal flows is returned when the driver says the
    /// application took them ([`System::consumed`]), not on delivery.
    credit_on_read: bool,
}

impl System {
    /// An empty system.
    pub fn new(name: impl Into<String>) -> Self {
        System {
            name: name.into(),
            members: Vec::new(),
            plans: Vec::new(),
            out: VecDeque::new(),
            n1: BTreeMap::new(),
            n1_recent: [(0, 0, 0); 2],
            n1_stacked: Vec::new(),
            n1_pending: BTreeMap::new(),
            gated: BTreeSet::new(),
            claims: BTreeMap::new(),
            ipcp_names: BTreeMap::new(),
            app_names: BTreeSet::new(),
            app_flows: BTreeMap::new(),
            app_pending: BTreeMap::new(),
            incoming: BTreeMap::new(),
            want_writable: BTreeMap::new(),
            app_closing: BTreeMap::new(),
            ended_held: BTreeMap::new(),
            blocked_media: BTreeSet::new(),
            down_media: BTreeSet::new(),
            taps: BTreeMap::new(),
            removed: BTreeSet::new(),
            tx_frames: Vec::new(),
            next_handle: 1,
            next_port: 1,
            now: Instant::ZERO,
            counters: Counters::default(),
            last_error: None,
            credit_on_read: false,
        }
    }

    /// From now on, the flow control of application flows of normal IPCPs
    /// returns credit only for SDUs the driver reports taken by the
    /// application ([`System::consumed`]): a reader that does not read
    /// stops its sender instead of losing SDUs. By default credit is
    /// returned on delivery.
    pub fn set_credit_on_read(&mut self, on: bool) {
        self.credit_on_read = on;
    }

    /// The system's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn check_name(&self, name: &str) -> Result<(), SystemError> {
        if self.live().any(|(_, m)| m.name == name) {
            return Err(SystemError::DuplicateName(name.into()));
        }
        Ok(())
    }

    /// Adds a shim IPCP over UDP; `rate` is the capacity of its link, if
    /// known. Returns its index, which is also its [`MediumId`].
    pub fn add_shim_udp(
        &mut self,
        name: impl Into<String>,
        cfg: shim_udp::Config,
        rate: Option<PortRate>,
    ) -> Result<usize, SystemError> {
        let machine = Machine::ShimUdp(Box::new(ShimUdp::new(cfg)));
        self.add_shim(name.into(), machine, rate)
    }

    /// Adds a shim IPCP over Ethernet; `rate` is the capacity of its link,
    /// if known. Returns its index, which is also its [`MediumId`].
    pub fn add_shim_eth(
        &mut self,
        name: impl Into<String>,
        cfg: shim_eth::Config,
        rate: Option<PortRate>,
    ) -> Result<usize, SystemError> {
        let machine = Machine::ShimEth(Box::new(shim_eth::ShimEth::new(cfg)));
        self.add_shim(name.into(), machine, rate)
    }

    /// Adds a shim IPCP for hypervisors; `rate` as for the others. Its
    /// peer is down until the driver says [`System::hv_peer`].
    pub fn add_shim_hv(
        &mut self,
        name: impl Into<String>,
        cfg: shim_hv::Config,
        rate: Option<PortRate>,
    ) -> Result<usize, SystemError> {
        let machine = Machine::ShimHv(Box::new(shim_hv::ShimHv::new(cfg)));
        self.add_shim(name.into(), machine, rate)
    }

    fn add_shim(
        &mut self,
        name: String,
        machine: Machine,
        rate: Option<PortRate>,
    ) -> Result<usize, SystemError> {
        self.check_name(&name)?;
        self.members.push(Member {
            name,
            dif: machine.dif().to_string(),
            machine,
            rate,
        });
        self.plans.push(Plan::default());
        Ok(self.members.len() - 1)
    }

    /// Adds a normal IPCP named `name` (also its application name in the
    /// N-1 DIFs) with its scheduling policy, neighbours and static routes.
    /// Its neighbours' N-1 DIFs must have members already.
    pub fn add_normal(
        &mut self,
        name: AppName,
        cfg: NormalConfig,
        sched: &SchedulerConfig,
        neighbors: Vec<NeighborSpec>,
        routes: BTreeMap<u64, u64>,
    ) -> Result<usize, SystemError> {
        let key = name.to_string();
        self.check_name(&key)?;
        let bad = |reason: String| SystemError::Machine {
            ipcp: key.clone(),
            reason,
        };
        let built = sched
            .build(&crate::normal::cubes::cu_map(&cfg.cubes))
            .map_err(|e| bad(e.to_string()))?;
        let dif = cfg.dif.clone();
        let mut machine = NormalIpcp::new(cfg, built).map_err(|e| bad(e.to_string()))?;
        // The system polls a member's actions after every call that can
        // set some off, so a batch of writes or frames flushes once.
        machine.set_batched_flush(true);
        let j = self.members.len();
        let mut nbs = Vec::new();
        for spec in neighbors {
            let Some(lower) = self
                .live()
                .find(|(_, m)| m.dif == spec.over && m.dif != dif)
                .map(|(l, _)| l)
            else {
                return Err(SystemError::NoLowerIpcp {
                    ipcp: key,
                    dif: spec.over,
                });
            };
            let (frame, max) = (machine.max_frame(), self.members[lower].max_sdu());
            if frame > max {
                return Err(SystemError::FrameTooLarge {
                    ipcp: key,
                    frame,
                    dif: spec.over,
                    max,
                });
            }
            nbs.push(Neighbor::new(&name, spec, lower));
        }
        let lowers: BTreeSet<usize> = nbs.iter().map(|n| n.lower).collect();
        for lower in lowers {
            self.members[lower]
                .register(name.clone())
                .map_err(|e| bad(format!("cannot register in the DIF below: {e}")))?;
            self.ipcp_names.insert((lower, name.clone()), j);
        }
        self.members.push(Member {
            name: key,
            dif,
            machine: Machine::Normal(Box::new(machine)),
            rate: None,
        });
        self.plans.push(Plan {
            app_name: Some(name),
            neighbors: nbs,
            routes,
        });
        Ok(j)
    }

    /// The members, in the order they were added.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Member `i`.
    pub fn member(&self, i: usize) -> Option<&Member> {
        self.members.get(i).filter(|_| !self.removed.contains(&i))
    }

    /// Member `i`, to change it (routes, scheduling policy).
    pub fn member_mut(&mut self, i: usize) -> Option<&mut Member> {
        self.members
            .get_mut(i)
            .filter(|_| !self.removed.contains(&i))
    }

    /// The member in DIF `dif`.
    pub fn member_in(&self, dif: &str) -> Option<usize> {
        self.live().find(|(_, m)| m.dif == dif).map(|(i, _)| i)
    }

    /// The members that were not removed, with their indices.
    pub fn live(&self) -> impl Iterator<Item = (usize, &Member)> + '_ {
        self.members
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.removed.contains(i))
    }

    /// Whether member `i` was removed ([`System::remove_ipcp`]).
    pub fn is_removed(&self, i: usize) -> bool {
        self.removed.contains(&i)
    }

    /// The resource allocator's view of member `i` (neighbours, N-1 flows).
    pub fn plan(&self, i: usize) -> Option<&Plan> {
        self.plans.get(i)
    }

    /// The N-1 flows: (port, upper member, lower member).
    pub fn n1_flows(&self) -> impl Iterator<Item = (PortId, usize, usize)> + '_ {
        self.n1.iter().map(|(&p, &(u, l))| (p, u, l))
    }

    /// The system's own counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The last configuration error the allocator met (a bad cube mapping).
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    fn free_port(&mut self) -> PortId {
        loop {
            let p = self.next_port;
            self.next_port = self.next_port.checked_add(1).unwrap_or(1);
            if !self.port_in_use(p) && !self.ended_held.contains_key(&p) {
                return p;
            }
        }
    }

    /// Whether port `p` is a flow of the system or of a member.
    fn port_in_use(&self, p: PortId) -> bool {
        self.app_flows.contains_key(&p)
            || self.app_pending.contains_key(&p)
            || self.n1.contains_key(&p)
            || self.n1_pending.contains_key(&p)
            || self.members.iter().any(|m| m.has_flow(p))
    }

    fn tick(&mut self, now: Instant) {
        self.now = self.now.max(now);
    }

    // ---- applications ----------------------------------------------------

    /// Registers application name `name` in DIF `dif`.
    pub fn register(&mut self, dif: &str, name: AppName) -> Result<(), FlowError> {
        let i = self
            .member_in(dif)
            .ok_or_else(|| FlowError::NoIpcp(format!("DIF {dif}")))?;
        self.register_at(i, name)
    }

    /// Registers application name `name` in member `i`.
    pub fn register_at(&mut self, i: usize, name: AppName) -> Result<(), FlowError> {
        let m = self
            .members
            .get_mut(i)
            .filter(|_| !self.removed.contains(&i))
            .ok_or_else(|| FlowError::NoIpcp(format!("member {i}")))?;
        if self.ipcp_names.contains_key(&(i, name.clone())) {
            return Err(FlowError::NameInUse(format!(
                "{name} is the name of an IPCP of this system in DIF {}",
                m.dif
            )));
        }
        m.register(name.clone())?;
        self.app_names.insert((i, name));
        Ok(())
    }

    /// Withdraws a registration; false if it was not there.
    pub fn unregister(&mut self, dif: &str, name: &AppName) -> bool {
        let Some(i) = self.member_in(dif) else {
            return false;
        };
        self.unregister_at(i, name)
    }

    /// Withdraws an application's registration from member `i`; false if
    /// it was not there.
    pub fn unregister_at(&mut self, i: usize, name: &AppName) -> bool {
        self.app_names.remove(&(i, name.clone()))
            && self.members.get_mut(i).is_some_and(|m| m.unregister(name))
    }

    /// The names registered in member `i`: by applications, and by the
    /// normal IPCPs above it.
    pub fn names(&self, i: usize) -> Vec<AppName> {
        let apps = self.app_names.iter().filter(|(m, _)| *m == i);
        let ipcps = self.ipcp_names.keys().filter(|(m, _)| *m == i);
        apps.chain(ipcps).map(|(_, n)| n.clone()).collect()
    }

    /// Asks for a flow from `local` to `remote`, in DIF `dif` or else in the
    /// first member that can reach `remote` (normal DIFs before shims). The
    /// answer comes as [`AppEvent::Allocated`] or
    /// [`AppEvent::AllocateFailed`] for the port returned.
    pub fn allocate(
        &mut self,
        now: Instant,
        dif: Option<&str>,
        local: AppName,
        remote: AppName,
        qos: QosSpec,
    ) -> Result<PortId, FlowError> {
        self.tick(now);
        let i = match dif {
            Some(d) => self.member_in(d),
            None => self.member_for(&remote),
        }
        .ok_or_else(|| FlowError::NoIpcp(dif.map_or_else(|| remote.to_string(), String::from)))?;
        self.allocate_at(now, i, local, remote, qos)
    }

    /// The member a flow to `remote` goes to when no DIF is named: the
    /// first that can reach it, normal DIFs before shims (a shim-eth or
    /// shim-hv IPCP claims to reach every name, and would take flows a
    /// normal DIF knows the way to).
    pub fn member_for(&self, remote: &AppName) -> Option<usize> {
        let by_kind = |normal: bool| {
            self.live()
                .find(|(_, m)| m.normal().is_some() == normal && m.knows(remote))
                .map(|(i, _)| i)
        };
        by_kind(true).or_else(|| by_kind(false))
    }

    /// [`System::allocate`] in member `i`.
    pub fn allocate_at(
        &mut self,
        now: Instant,
        i: usize,
        local: AppName,
        remote: AppName,
        qos: QosSpec,
    ) -> Result<PortId, FlowError> {
        self.allocate_at_direct(now, i, local, remote, qos, None)
    }

    /// [`System::allocate_at`], offering a direct flow from the driver's
    /// UDP socket of port `direct` where member `i` has them (shim-udp;
    /// other members ignore it): [`System::direct_peer`] says, once the
    /// flow is allocated, whether the peer agreed and where its socket is.
    pub fn allocate_at_direct(
        &mut self,
        now: Instant,
        i: usize,
        local: AppName,
        remote: AppName,
        qos: QosSpec,
        direct: Option<u16>,
    ) -> Result<PortId, FlowError> {
        self.tick(now);
        if i >= self.members.len() || self.removed.contains(&i) {
            return Err(FlowError::NoIpcp(format!("member {i}")));
        }
        let port = self.free_port();
        self.members[i].allocate(now, port, (local, remote), qos, (direct, true))?;
        self.app_pending.insert(port, i);
        self.pump(now);
        Ok(port)
    }

    /// Accepts incoming request `handle`; returns the flow's port and
    /// largest SDU.
    pub fn accept(&mut self, now: Instant, handle: u64) -> Result<(PortId, u32), FlowError> {
        self.accept_direct(now, handle, None)
    }

    /// Where the requester's socket for a direct flow is, if incoming
    /// request `handle` offers one (shim-udp).
    pub fn offered_direct(&self, handle: u64) -> Option<SocketAddr> {
        let (i, h) = *self.incoming.get(&handle)?;
        match &self.members.get(i)?.machine {
            Machine::ShimUdp(s) => s.offered_direct(h),
            _ => None,
        }
    }

    /// [`System::accept`], answering an offer of a direct flow with the
    /// port of the driver's socket for it.
    pub fn accept_direct(
        &mut self,
        now: Instant,
        handle: u64,
        direct: Option<u16>,
    ) -> Result<(PortId, u32), FlowError> {
        self.tick(now);
        let (i, h) = self
            .incoming
            .remove(&handle)
            .ok_or(FlowError::UnknownRequest(handle))?;
        let port = self.free_port();
        let max = self.members[i].accept(now, h, port, (direct, true))?;
        self.app_flows.insert(port, i);
        self.app_flow_opened(port, i);
        self.pump(now);
        Ok((port, max))
    }

    /// Where the other end's socket of direct flow `port` is, if both ends
    /// agreed on one (see [`System::allocate_at_direct`]).
    pub fn direct_peer(&self, port: PortId) -> Option<SocketAddr> {
        let i = *self
            .app_flows
            .get(&port)
            .or_else(|| self.app_pending.get(&port))?;
        match &self.members.get(i)?.machine {
            Machine::ShimUdp(s) => s.flow(port)?.direct_peer,
            _ => None,
        }
    }

    /// Refuses incoming request `handle`.
    pub fn refuse(&mut self, now: Instant, handle: u64, reason: &str) -> Result<(), FlowError> {
        let (i, h) = self
            .incoming
            .remove(&handle)
            .ok_or(FlowError::UnknownRequest(handle))?;
        self.members[i].refuse(h, reason)?;
        self.pump(now);
        Ok(())
    }

    /// Writes an SDU on application flow `port`. [`FlowError::WouldBlock`]
    /// takes nothing; [`AppEvent::Writable`] follows when it would.
    pub fn write(&mut self, now: Instant, port: PortId, sdu: &[u8]) -> Result<(), FlowError> {
        let res = self.write_held(now, port, sdu);
        self.pump(now);
        res
    }

    /// [`System::write`] for one SDU of a batch: the flow's IPCP takes the
    /// SDU (or refuses it, as `write` would), but what it sets off (the
    /// IPCPs below, the media's frames) waits for [`System::settle`], which
    /// the driver calls once after the batch, as after frames taken with
    /// [`System::receive_held`].
    pub fn write_held(&mut self, now: Instant, port: PortId, sdu: &[u8]) -> Result<(), FlowError> {
        self.tick(now);
        let &i = self
            .app_flows
            .get(&port)
            .ok_or_else(|| FlowError::UnknownFlow(port.into()))?;
        let res = match &mut self.members[i].machine {
            Machine::Normal(n) => n.write(now, port, sdu).map_err(FlowError::from),
            _ => self.shim_send(now, port, sdu).map(|(medium, send)| {
                self.out.push_back(Output::ToMedium {
                    medium,
                    peer: send.peer,
                    frame: send.frame(sdu).into(),
                });
            }),
        };
        self.wrote(port, sdu.len(), res)
    }

    /// After a write of `len` bytes on `port` whose result is `res`: a
    /// blocked writer is remembered for its writable event.
    fn wrote(
        &mut self,
        port: PortId,
        len: usize,
        res: Result<(), FlowError>,
    ) -> Result<(), FlowError> {
        if res == Err(FlowError::WouldBlock) {
            self.want_writable.insert(port, len);
        }
        res
    }

    /// [`System::write`] of an SDU read from `src` (an application's
    /// shared-memory ring): over a normal IPCP each fragment is copied from
    /// it straight into its PDU's buffer; over a shim, into one buffer.
    pub fn write_from(
        &mut self,
        now: Instant,
        port: PortId,
        src: &dyn SduSource,
    ) -> Result<(), FlowError> {
        let res = self.write_from_held(now, port, src);
        self.pump(now);
        res
    }

    /// [`System::write_from`] for one SDU of a batch, settled with the
    /// others by [`System::settle`] (see [`System::write_held`]).
    pub fn write_from_held(
        &mut self,
        now: Instant,
        port: PortId,
        src: &dyn SduSource,
    ) -> Result<(), FlowError> {
        self.tick(now);
        let &i = self
            .app_flows
            .get(&port)
            .ok_or_else(|| FlowError::UnknownFlow(port.into()))?;
        let Machine::Normal(n) = &mut self.members[i].machine else {
            let mut sdu = Vec::with_capacity(src.len());
            if !src.append_to(0, src.len(), &mut sdu) {
                return Err(FlowError::Invalid("the SDU could not be read".into()));
            }
            return self.write_held(now, port, &sdu);
        };
        let res = n.write_from(now, port, src).map_err(FlowError::from);
        self.wrote(port, src.len(), res)
    }

    /// For an application flow straight on a shim: accounts `sdu` and says
    /// on which medium it goes, with which header, so that the driver
    /// writes header and SDU without a copy (the system copies them only
    /// while the medium is tapped, [`System::set_medium_tap`]).
    /// [`FlowError::WouldBlock`] while the medium is full, as for
    /// [`System::write`]; [`FlowError::Invalid`] for a flow of a normal IPCP.
    pub fn shim_send(
        &mut self,
        now: Instant,
        port: PortId,
        sdu: &[u8],
    ) -> Result<(MediumId, ShimSend), FlowError> {
        self.tick(now);
        let &i = self
            .app_flows
            .get(&port)
            .ok_or_else(|| FlowError::UnknownFlow(port.into()))?;
        if self.blocked_media.contains(&i) {
            self.want_writable.insert(port, sdu.len());
            return Err(FlowError::WouldBlock);
        }
        let send = self.members[i].send_header(port, sdu.len())?;
        self.tap(i, true, send.peer, None, &[send.header(), sdu]);
        Ok((i, send))
    }

    /// Whether the SDUs delivered on application flow `port` and not yet
    /// reported taken ([`System::consumed`]) are bounded by the flow's own
    /// window: credit goes back on read ([`System::set_credit_on_read`])
    /// and the flow has window flow control. A driver that holds SDUs for
    /// a slow reader must then hold every one of them (the bound is the
    /// window), where it may drop beyond its own bound on any other flow:
    /// dropping on such a flow would lose SDUs of a reliable flow.
    pub fn paced_by_reader(&self, port: PortId) -> bool {
        self.credit_on_read
            && self
                .app_flows
                .get(&port)
                .and_then(|&i| self.members[i].normal())
                .is_some_and(|n| n.flow_windowed(port))
    }

    /// The application of flow `port` took `n` SDUs delivered to it (see
    /// [`System::set_credit_on_read`]).
    pub fn consumed(&mut self, now: Instant, port: PortId, n: usize) {
        self.tick(now);
        if n == 0 {
            return;
        }
        if let Some(&i) = self.app_flows.get(&port) {
            if let Some(nm) = self.members[i].normal_mut() {
                let _ = nm.consume(now, port, n);
            }
            self.pump(now);
        }
    }

    /// Closes application flow `port` (and tells the peer). Over a normal
    /// DIF, what the application wrote is sent (and acknowledged, where
    /// EFCP retransmits) first ([`NormalIpcp::close_when_sent`]), for what
    /// is left of [`LINGER_MAX`] after [`System::app_closed`] if that came
    /// first.
    pub fn close(&mut self, now: Instant, port: PortId) {
        self.tick(now);
        self.want_writable.remove(&port);
        let deadline = self.app_closing.remove(&port).unwrap_or(now + LINGER_MAX);
        let i = self
            .app_flows
            .remove(&port)
            .or(self.app_pending.remove(&port));
        if let Some(i) = i {
            match self.members[i].normal_mut() {
                Some(n) => {
                    let _ = n.close_when_sent_by(now, port, deadline);
                }
                None => self.members[i].deallocate(now, port),
            }
        }
        self.pump(now);
    }

    /// The application closed flow `port` while the driver still holds SDUs
    /// it wrote that the flow could not take yet (its window is closed):
    /// the flow stays open so that they may still go, but for
    /// [`LINGER_MAX`] at most, as long as a flow closed with
    /// [`System::close`] waits for what its IPCP holds. If the driver has
    /// not closed it by then, the system does, with what is left (in the
    /// driver and in the IPCP), counts it
    /// ([`Counters::app_close_expired`]) and reports
    /// [`AppEvent::Deallocated`]. Only the first call for a flow counts;
    /// none for a flow that is not open.
    pub fn app_closed(&mut self, now: Instant, port: PortId) {
        self.tick(now);
        if self.app_flows.contains_key(&port) {
            self.app_closing.entry(port).or_insert(now + LINGER_MAX);
        }
    }

    /// Closes the flows of [`System::app_closed`] whose time is over.
    fn expire_app_closing(&mut self, now: Instant) {
        let due: Vec<PortId> = self
            .app_closing
            .iter()
            .filter(|(_, &t)| t <= now)
            .map(|(&p, _)| p)
            .collect();
        for port in due {
            self.app_closing.remove(&port);
            self.want_writable.remove(&port);
            if let Some(i) = self.app_flows.remove(&port) {
                self.members[i].deallocate(now, port);
                self.counters.app_close_expired += 1;
                self.out
                    .push_back(Output::App(AppEvent::Deallocated { port }));
            }
        }
    }

    /// Whether application flow `port` can take an SDU of `len` bytes now.
    pub fn can_write(&self, port: PortId, len: usize) -> bool {
        match self
            .app_flows
            .get(&port)
            .map(|&i| (i, &self.members[i].machine))
        {
            Some((_, Machine::Normal(n))) => n.can_write(port, len),
            Some((i, _)) => !self.blocked_media.contains(&i),
            None => false,
        }
    }

    /// The member that carries application flow `port`.
    pub fn flow_member(&self, port: PortId) -> Option<usize> {
        self.app_flows.get(&port).copied()
    }

    // ---- media -----------------------------------------------------------

    /// A datagram from `from` arrived on UDP medium `medium`; an SDU for an
    /// application comes out as [`Output::ToApp`].
    pub fn handle_frame(&mut self, now: Instant, medium: MediumId, from: SocketAddr, frame: &[u8]) {
        let rx = Rx::Udp {
            from,
            datagram: frame,
        };
        if let Some((port, sdu)) = self.receive(now, medium, rx) {
            self.out.push_back(Output::ToApp {
                port,
                sdu: Sdu::from(sdu),
            });
        }
    }

    /// A frame arrived on medium `medium`. Frames for N-1 flows go up to
    /// their normal IPCP here; an SDU for an application flow is returned
    /// (a slice of `rx`), for the driver to hand over without a copy.
    pub fn receive<'a>(
        &mut self,
        now: Instant,
        medium: MediumId,
        rx: Rx<'a>,
    ) -> Option<(PortId, &'a [u8])> {
        let app = self.receive_held(now, medium, rx);
        self.pump(now);
        app
    }

    /// [`System::receive`] for one frame of a batch: the medium's IPCP
    /// takes the frame, but what it sets off (the IPCPs above, their
    /// deliveries, answers and flows) waits for [`System::settle`], which
    /// the driver calls once after the batch. The work per frame is then
    /// only the frame's own, not a pass over every member.
    pub fn receive_held<'a>(
        &mut self,
        now: Instant,
        medium: MediumId,
        rx: Rx<'a>,
    ) -> Option<(PortId, &'a [u8])> {
        self.tick(now);
        if self.removed.contains(&medium) {
            return None;
        }
        match rx {
            Rx::Udp { from, datagram } => self.tap(medium, false, Some(from), None, &[datagram]),
            Rx::Eth { frame, aux_vlan } => self.tap(medium, false, None, aux_vlan, &[frame]),
            Rx::Hv { buf } => self.tap(medium, false, None, None, &[buf]),
        }
        let machine = &mut self.members.get_mut(medium)?.machine;
        let got = match (machine, rx) {
            (Machine::ShimUdp(s), Rx::Udp { from, datagram }) => {
                match s.on_datagram(now, from, datagram) {
                    shim_udp::Received::Deliver { port, sdu } => Ok(Some((port, sdu))),
                    shim_udp::Received::Control => Ok(None),
                    shim_udp::Received::Dropped(_) => Err(()),
                }
            }
            (Machine::ShimEth(e), Rx::Eth { frame, aux_vlan }) => {
                match e.on_frame(now, frame, aux_vlan) {
                    shim_eth::Received::Deliver { port, sdu } => Ok(Some((port, sdu))),
                    shim_eth::Received::Consumed => Ok(None),
                    shim_eth::Received::Dropped(_) => Err(()),
                }
            }
            (Machine::ShimHv(h), Rx::Hv { buf }) => match h.on_buffer(now, buf) {
                shim_hv::Received::Deliver { port, sdu } => Ok(Some((port, sdu))),
                shim_hv::Received::Control => Ok(None),
                shim_hv::Received::Dropped(_) => Err(()),
            },
            _ => Err(()),
        };
        let mut app = None;
        match got {
            Ok(Some((port, sdu))) if self.app_flows.contains_key(&port) => app = Some((port, sdu)),
            Ok(Some((port, sdu))) => match self.n1_of(port) {
                Some((upper, _)) => {
                    if let Some(n) = self.members[upper].normal_mut() {
                        n.on_frame(now, port, sdu);
                    }
                }
                None => self.counters.app_rx_orphan += 1,
            },
            Ok(None) => {}
            Err(()) => self.counters.rx_dropped += 1,
        }
        app
    }

    /// [`System::receive_held`] of a datagram of shim-udp medium `medium`
    /// read into a buffer of its own (with room in front): a frame for an
    /// N-1 flow goes up in that buffer, past the shim's header, with no
    /// copy; an SDU for an application flow is returned in it.
    pub fn receive_udp_held(
        &mut self,
        now: Instant,
        medium: MediumId,
        from: SocketAddr,
        mut frame: PduBuf,
    ) -> Option<(PortId, PduBuf)> {
        self.tick(now);
        if self.removed.contains(&medium) {
            return None;
        }
        self.tap(medium, false, Some(from), None, &[&frame[..]]);
        let Some(Machine::ShimUdp(s)) = self.members.get_mut(medium).map(|m| &mut m.machine) else {
            self.counters.rx_dropped += 1;
            return None;
        };
        let (port, at, len) = match s.on_datagram(now, from, &frame) {
            shim_udp::Received::Deliver { port, sdu } => {
                // The SDU is a slice of the frame: where it starts in it.
                (
                    port,
                    sdu.as_ptr() as usize - frame.as_ptr() as usize,
                    sdu.len(),
                )
            }
            shim_udp::Received::Control => return None,
            shim_udp::Received::Dropped(_) => {
                self.counters.rx_dropped += 1;
                return None;
            }
        };
        frame.advance(at);
        frame.truncate(len);
        if self.app_flows.contains_key(&port) {
            return Some((port, frame));
        }
        match self.n1_of(port) {
            Some((upper, _)) => {
                if let Some(n) = self.members[upper].normal_mut() {
                    n.on_frame_buf(now, port, frame, false);
                }
            }
            None => self.counters.app_rx_orphan += 1,
        }
        None
    }

    /// Carries out what frames taken with [`System::receive_held`] and SDUs
    /// taken with [`System::write_held`] set off.
    pub fn settle(&mut self, now: Instant) {
        self.tick(now);
        self.pump(now);
    }

    /// Whether `port` is an application flow (not an N-1 flow).
    pub fn is_app_flow(&self, port: PortId) -> bool {
        self.app_flows.contains_key(&port)
    }

    /// Runs `f` on the machine of member `i` (what only its driver knows
    /// how to ask: a shim-hv ring's zero-copy accounting, a counter) and
    /// then carries out what followed.
    pub fn with_machine<R>(
        &mut self,
        now: Instant,
        i: usize,
        f: impl FnOnce(&mut Machine) -> R,
    ) -> Option<R> {
        self.tick(now);
        if self.removed.contains(&i) {
            return None;
        }
        let r = f(&mut self.members.get_mut(i)?.machine);
        self.pump(now);
        Some(r)
    }

    /// The other end of shim-hv medium `medium` attached (`up`) or went
    /// away: flows over it fail and are set up again when it is back.
    pub fn hv_peer(&mut self, now: Instant, medium: MediumId, up: bool) {
        self.with_machine(now, medium, |m| {
            if let Machine::ShimHv(h) = m {
                if up {
                    h.peer_up();
                } else {
                    h.peer_lost();
                }
            }
        });
    }

    /// Whether the receive ring of shim-hv medium `medium` may be read at
    /// `now`, `congested_elsewhere` saying whether the backlog of stacked
    /// IPCPs' frames of another shim-hv medium is congested: hop-by-hop
    /// back-pressure for relays (see [`shim_hv::link::RelayGate`]; N-1
    /// flows over the medium are what makes it a relay's input).
    pub fn hv_may_read(
        &mut self,
        now: Instant,
        medium: MediumId,
        congested_elsewhere: bool,
    ) -> shim_hv::link::RelayRead {
        self.tick(now);
        let carries_n1 = self.n1.values().any(|&(_, lower)| lower == medium);
        match self.members.get_mut(medium).map(|m| &mut m.machine) {
            Some(Machine::ShimHv(h)) => h.relay_gate().check(now, carries_n1, congested_elsewhere),
            _ => shim_hv::link::RelayRead::Now,
        }
    }

    /// The congestion that paused shim-hv media ended: the media whose
    /// receive rings were paused, to be read now.
    pub fn hv_relay_released(&mut self) -> Vec<MediumId> {
        let mut out = Vec::new();
        for (i, m) in self.members.iter_mut().enumerate() {
            if let Machine::ShimHv(h) = &mut m.machine {
                if h.relay_gate().release() {
                    out.push(i);
                }
            }
        }
        out
    }

    /// The driver of medium `medium` cannot take more frames: the N-1
    /// ports over it hold their PDUs in their RMT until it says
    /// [`System::medium_writable`].
    pub fn medium_blocked(&mut self, now: Instant, medium: MediumId) {
        self.tick(now);
        if self.blocked_media.insert(medium) {
            self.set_medium_gates(now, medium, true);
        }
    }

    /// The driver of medium `medium` can take frames again.
    pub fn medium_writable(&mut self, now: Instant, medium: MediumId) {
        self.tick(now);
        if self.blocked_media.remove(&medium) {
            self.set_medium_gates(now, medium, false);
            self.pump(now);
        }
    }

    /// The link under medium `medium` went down (carrier lost): the N-1
    /// flows over it are torn down at once, so routing goes around it, and
    /// none is set up over it until [`System::medium_up`].
    pub fn medium_down(&mut self, now: Instant, medium: MediumId) {
        self.tick(now);
        if !self.down_media.insert(medium) {
            return;
        }
        let over: Vec<PortId> = self
            .n1
            .iter()
            .filter(|(_, &(_, l))| l == medium)
            .map(|(&p, _)| p)
            .collect();
        for port in over {
            self.members[medium].deallocate(now, port);
            self.unbind_n1(now, port);
        }
        self.n1_pending.retain(|&p, &mut (j, k)| {
            let gone = self.plans[j].neighbors[k].lower == medium;
            if gone {
                self.plans[j].neighbors[k].pending = None;
                self.members[medium].deallocate(now, p);
            }
            !gone
        });
        self.pump(now);
    }

    /// The link under medium `medium` is back: N-1 flows over it are set up
    /// again.
    pub fn medium_up(&mut self, now: Instant, medium: MediumId) {
        self.tick(now);
        if self.down_media.remove(&medium) {
            for plan in &mut self.plans {
                for nb in plan.neighbors.iter_mut().filter(|nb| nb.lower == medium) {
                    nb.retry(None);
                }
            }
            self.pump(now);
        }
    }

    fn set_medium_gates(&mut self, now: Instant, medium: MediumId, blocked: bool) {
        let ports: Vec<(PortId, usize)> = self
            .n1
            .iter()
            .filter(|(_, &(_, l))| l == medium)
            .map(|(&p, &(u, _))| (p, u))
            .collect();
        for (port, upper) in ports {
            if let Some(n) = self.members[upper].normal_mut() {
                n.set_port_blocked(now, port, blocked);
            }
        }
    }

    // ---- time ------------------------------------------------------------

    /// Gives back the spare room of the members' flow tables, for a driver
    /// that saw many flows close (ordered maps shrink by themselves).
    pub fn shrink_to_fit(&mut self) {
        for m in &mut self.members {
            m.shrink_to_fit();
        }
    }

    /// When [`System::handle_timeout`] next needs to run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.live()
            .filter_map(|(_, m)| m.poll_timeout())
            .chain(self.neighbor_timeout(self.now))
            .chain(self.claims_timeout())
            .chain(self.app_closing.values().copied().min())
            .chain(self.ended_timeout())
            .min()
    }

    /// Runs the timers that are due.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.tick(now);
        for (i, m) in self.members.iter_mut().enumerate() {
            if self.removed.contains(&i) {
                continue;
            }
            if m.poll_timeout().is_some_and(|t| t <= now) {
                m.handle_timeout(now);
            }
        }
        if !self.app_closing.is_empty() {
            self.expire_app_closing(now);
        }
        if !self.ended_held.is_empty() {
            self.expire_ended(now);
        }
        self.pump(now);
    }

    /// The next thing for the driver to do.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    // ---- the loop between members ----------------------------------------

    /// Carries out what the members asked of each other until they are
    /// quiet, starts the N-1 flows that are due and opens the gates of N-1
    /// ports whose lower flows have room again.
    fn pump(&mut self, now: Instant) {
        loop {
            let mut busy = self.drain_events(now);
            self.keep_neighbors(now);
            busy |= self.update_stacked_gates(now);
            busy |= self.settle_claims(now);
            busy |= self.drain_events(now);
            if !busy {
                break;
            }
        }
        self.report_writable();
    }

    /// Handles every event the members have; true if there was any.
    fn drain_events(&mut self, now: Instant) -> bool {
        let mut any = false;
        for i in 0..self.members.len() {
            if self.removed.contains(&i) {
                continue;
            }
            loop {
                // A normal IPCP's frames and deliveries, what every PDU
                // brings, go straight to their handlers; the rest in the
                // common vocabulary.
                let ev = match &mut self.members[i].machine {
                    Machine::Normal(n) => match n.poll_action() {
                        Some(crate::normal::Action::Transmit { port, frame }) => {
                            any = true;
                            self.n1_transmit_from(now, i, port, frame);
                            continue;
                        }
                        Some(crate::normal::Action::Deliver { flow, sdu }) => {
                            any = true;
                            let congested = n.take_congested(flow);
                            self.deliver_marked(now, flow, sdu, congested);
                            continue;
                        }
                        Some(a) => member::normal_event(a),
                        None => break,
                    },
                    _ => match self.members[i].poll_event() {
                        Some(ev) => ev,
                        None => break,
                    },
                };
                any = true;
                self.on_event(now, i, ev);
            }
        }
        any
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod media_tests;

#[cfg(test)]
mod scale_tests;
