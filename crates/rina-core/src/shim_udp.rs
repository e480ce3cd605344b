//! The shim IPC process over UDP, as a sans-IO state machine.
//!
//! A shim DIF over UDP wraps an IP network in the IPC API and nothing more:
//! one SDU per datagram, no reliability, no ordering. Application names are
//! resolved with a static directory (name -> UDP address of the peer shim).
//! Flows are set up with a small handshake ([`Datagram::AllocReq`] /
//! [`Datagram::AllocResp`], retransmitted until answered or timed out) so that
//! both ends agree the flow exists and a request for a name nobody registered
//! is refused rather than silently dropped. A requester that restarts
//! numbers its flows from the start again: a request from the address and
//! port-id of a flow it has sent data on, for the same two applications, is
//! not a retransmission but a new flow, which replaces the old one. A
//! request from them for other applications is refused and changes nothing
//! (a source address proves nothing: it may be anyone's).
//!
//! UDP says nothing when a peer's host or daemon vanishes, so each end
//! checks its flows every [`Config::keepalive`]: those it heard nothing on
//! since the last check are named in a probe ([`Datagram::Keepalive`], one
//! for all the silent flows with a peer), which the peer answers at once
//! for those it still holds, whatever its own interval (and with its own
//! check off); a flow nothing came on for [`KEEPALIVE_MISSES`] checks is
//! deallocated.
//!
//! The driver (the daemon or the simulator) owns the socket. It feeds every
//! received datagram to [`ShimUdp::on_datagram`], calls the API methods for
//! what applications ask, calls [`ShimUdp::handle_timeout`] when
//! [`ShimUdp::poll_timeout`] says so, and carries out what
//! [`ShimUdp::poll_action`] returns. On the data path nothing is allocated:
//! [`ShimUdp::on_datagram`] returns the SDU as a slice of the receive buffer,
//! and [`ShimUdp::send_header`] returns the 5-byte header and destination so
//! the driver can send header and SDU with one vectored write.

use crate::ids::IdMap;
use crate::time::Instant;
use rina_wire::codec::truncate_utf8;
use rina_wire::ctl::FlowCounters;
use rina_wire::shim_udp::{
    data_header, keepalive, AllocResult, Datagram, PortPairs, DATA_HEADER_LEN,
    KEEPALIVE_HEADER_LEN, MAX_KEEPALIVE_PAIRS,
};
use rina_wire::{AppName, QosSpec, WireError};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use thiserror::Error;

/// A port-id: names a flow at its local end. Chosen by the driver.
pub type PortId = u32;

/// Largest UDP payload over IPv4.
pub const MAX_UDP_PAYLOAD: u32 = 65_507;

/// Default largest SDU: the largest UDP payload less the DATA header.
pub const DEFAULT_MAX_SDU: u32 = MAX_UDP_PAYLOAD - DATA_HEADER_LEN as u32;

/// The liveness check's default interval ([`Config::keepalive`]).
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(10);

/// Longest refusal reason sent to a peer, in bytes; longer ones are cut at a
/// character boundary so the response always fits one datagram.
pub const MAX_REASON_LEN: usize = 512;

/// Configuration of one shim-udp IPCP.
#[derive(Debug, Clone)]
pub struct Config {
    /// Name of the shim DIF.
    pub dif: String,
    /// Largest SDU accepted from applications, in bytes.
    pub max_sdu: u32,
    /// Where each application name lives: the UDP address of the peer shim.
    pub directory: HashMap<AppName, SocketAddr>,
    /// Interval between retransmissions of an allocation request.
    pub alloc_retry: Duration,
    /// Time after which an unanswered allocation request fails.
    pub alloc_timeout: Duration,
    /// Time an application has to accept or refuse an incoming flow
    /// (default 1.5 s: less than the default `alloc_timeout`, so that the
    /// requester hears "not answered in time" rather than timing out).
    pub accept_timeout: Duration,
    /// Most flows at once.
    pub max_flows: usize,
    /// Most incoming requests waiting for an application's answer.
    pub max_pending: usize,
    /// Most of them from one host (IP address, whatever the port), so that
    /// one requester asking faster than the applications answer cannot
    /// take the room of all the others (default 64, a quarter of
    /// `max_pending`).
    pub max_pending_per_host: usize,
    /// Take allocation requests only from the addresses in `directory`,
    /// and one naming a source that is in it only from that source's
    /// address (no one else can claim to be a configured neighbour);
    /// others are dropped without an answer and counted in
    /// `rx_wrong_peer`.
    pub peers_only: bool,
    /// How often allocated flows are checked for a live peer (default
    /// 10 s): the peer is probed for the flows nothing came on since the
    /// last check, and a flow on which nothing came for
    /// [`KEEPALIVE_MISSES`] checks in a row (2 to 4 intervals after the
    /// peer went) is deallocated, as if the peer had said so
    /// ([`Action::Deallocated`], counted in `keepalive_expired`). UDP says
    /// nothing when a peer's host or daemon vanishes; without the check
    /// its flows stayed here for ever, each with the application serving
    /// it. `None`: no check and no timer (probes are still answered).
    pub keepalive: Option<Duration>,
}

impl Config {
    /// A configuration with defaults for everything but the DIF name.
    pub fn new(dif: impl Into<String>) -> Self {
        Config {
            dif: dif.into(),
            max_sdu: DEFAULT_MAX_SDU,
            directory: HashMap::new(),
            alloc_retry: Duration::from_millis(200),
            alloc_timeout: Duration::from_secs(2),
            accept_timeout: Duration::from_millis(1500),
            max_flows: crate::DEFAULT_MAX_FLOWS,
            max_pending: 256,
            max_pending_per_host: 64,
            peers_only: false,
            keepalive: Some(DEFAULT_KEEPALIVE),
        }
    }
}

/// Why an operation of the shim failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ShimError {
    /// The destination name is not in this shim DIF's directory.
    #[error("{0} is not in the directory of this shim DIF")]
    NameNotFound(Box<AppName>),
    /// The name is already registered in this IPCP.
    #[error("{0} is already registered in this shim DIF")]
    NameInUse(Box<AppName>),
    /// The peer shim has no application registered under the name.
    #[error("{name} is not registered at {peer}")]
    NotRegistered {
        name: Box<AppName>,
        peer: SocketAddr,
    },
    /// The destination application (or its daemon) refused the flow.
    #[error("flow refused by the peer: {0}")]
    Refused(String),
    /// The shim cannot provide what the QoS spec asks for.
    #[error("QoS not satisfiable: {0}")]
    QosNotSatisfiable(String),
    /// An SDU is larger than the flow's maximum.
    #[error("SDU of {size} bytes is larger than the flow's maximum of {max}")]
    SduTooLarge { size: usize, max: u32 },
    /// An SDU of zero bytes (SDUs are at least one byte).
    #[error("empty SDU: an SDU is at least one byte")]
    EmptySdu,
    /// The peer shim did not answer the allocation request in time.
    #[error("no answer from {peer} within {after:?}")]
    Timeout { peer: SocketAddr, after: Duration },
    /// No flow with this port-id, or it is not allocated yet.
    #[error("no allocated flow with port-id {0}")]
    UnknownFlow(PortId),
    /// No pending flow request with this handle (answered or withdrawn).
    #[error("no pending flow request {0}")]
    UnknownRequest(u64),
    /// The port-id is already used by another flow.
    #[error("port-id {0} is already in use")]
    PortInUse(PortId),
    /// Too many flows or pending requests.
    #[error("out of resources: {0}")]
    NoResources(String),
}

/// Something the driver must do.
// Actions are queued only for control traffic (data bypasses the queue), so
// the size of the FlowRequest variant costs nothing that matters.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send `payload` as one datagram to `to`.
    Transmit { to: SocketAddr, payload: Vec<u8> },
    /// Ask the application that registered `local` whether it accepts a flow
    /// from `remote`; answer with [`ShimUdp::accept`] or [`ShimUdp::refuse`].
    FlowRequest {
        handle: u64,
        local: AppName,
        remote: AppName,
        qos: QosSpec,
    },
    /// The application did not answer request `handle` in time; it was
    /// refused on its behalf.
    RequestWithdrawn { handle: u64 },
    /// A flow asked for with [`ShimUdp::allocate`] now exists on both ends.
    Allocated { port: PortId, max_sdu: u32 },
    /// A flow asked for with [`ShimUdp::allocate`] could not be set up.
    AllocateFailed { port: PortId, error: ShimError },
    /// The peer deallocated the flow.
    Deallocated { port: PortId },
}

/// Why a received datagram was dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DropReason {
    /// It could not be parsed.
    Malformed(WireError),
    /// It names a flow that does not exist (or is not allocated yet).
    UnknownFlow(PortId),
    /// It names a flow that belongs to another peer address.
    WrongPeer { port: PortId, from: SocketAddr },
    /// A DATA datagram without an SDU (SDUs are at least one byte).
    EmptySdu(PortId),
}

/// What became of a received datagram.
#[derive(Debug, PartialEq, Eq)]
pub enum Received<'a> {
    /// Hand this SDU to the application of flow `port`.
    Deliver { port: PortId, sdu: &'a [u8] },
    /// A control message; any resulting actions are queued.
    Control,
    /// Dropped and counted.
    Dropped(DropReason),
}

/// IPCP-wide counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Datagrams received.
    pub rx_datagrams: u64,
    /// Datagrams sent (data and control).
    pub tx_datagrams: u64,
    /// Datagrams that could not be parsed.
    pub rx_malformed: u64,
    /// Data for a flow that does not exist.
    pub rx_unknown_flow: u64,
    /// Data for a flow from an address that is not its peer.
    pub rx_wrong_peer: u64,
    /// Allocation requests received.
    pub alloc_requests_in: u64,
    /// Allocation requests this IPCP refused (unregistered name, QoS, app
    /// said no, a port-id that names a live flow of other applications).
    pub alloc_refused: u64,
    /// Allocations this IPCP asked for that timed out.
    pub alloc_timeouts: u64,
    /// Flows dropped because their requester asked for them again (the
    /// same applications) after sending on them: it started again (see
    /// [`ShimUdp::on_datagram`]).
    pub flows_restarted: u64,
    /// KEEPALIVEs sent: probes (one per peer and check, for its silent
    /// flows, as many datagrams as they need) and answers to the peers'.
    pub keepalives_sent: u64,
    /// KEEPALIVEs received (a pair in one naming no flow of its sender
    /// here counts in `rx_unknown_flow`).
    pub keepalives_received: u64,
    /// Flows deallocated because nothing came from their peer for
    /// [`KEEPALIVE_MISSES`] checks ([`Config::keepalive`]).
    pub keepalive_expired: u64,
}

impl Counters {
    /// The counters by name, for listings.
    pub fn to_map(&self) -> BTreeMap<String, u64> {
        [
            ("rx_datagrams", self.rx_datagrams),
            ("tx_datagrams", self.tx_datagrams),
            ("rx_malformed", self.rx_malformed),
            ("rx_unknown_flow", self.rx_unknown_flow),
            ("rx_wrong_peer", self.rx_wrong_peer),
            ("alloc_requests_in", self.alloc_requests_in),
            ("alloc_refused", self.alloc_refused),
            ("alloc_timeouts", self.alloc_timeouts),
            ("flows_restarted", self.flows_restarted),
            ("keepalives_sent", self.keepalives_sent),
            ("keepalives_received", self.keepalives_received),
            ("keepalive_expired", self.keepalive_expired),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// A flow of this IPCP.
#[derive(Debug, Clone)]
pub struct Flow {
    /// This end's application name.
    pub local: AppName,
    /// The other end's application name.
    pub remote: AppName,
    /// QoS asked for.
    pub qos: QosSpec,
    /// UDP address of the peer shim.
    pub peer: SocketAddr,
    /// The peer's port-id; `None` while the allocation is in progress.
    pub peer_port: Option<PortId>,
    /// Largest SDU, agreed by both ends.
    pub max_sdu: u32,
    /// Traffic counters.
    pub counters: FlowCounters,
    /// The UDP port of this end's own socket for a direct flow, if it
    /// offered one.
    pub direct_port: Option<u16>,
    /// Where the other end's direct socket is, once both ends agreed on a
    /// direct flow: SDUs then go between the two applications' sockets,
    /// not through the shims (and are not counted here).
    pub direct_peer: Option<SocketAddr>,
    /// What the liveness check knows of the flow.
    live: Liveness,
}

/// What the liveness check ([`Config::keepalive`]) knows of a flow.
#[derive(Debug, Clone, Copy, Default)]
struct Liveness {
    /// SDUs received on it when the last check looked.
    seen_in: u64,
    /// A KEEPALIVE naming the flow (or its request again) came from the
    /// peer since the last check.
    heard: bool,
    /// Checks in a row that found nothing received.
    silent: u8,
}

/// Checks in a row ([`Config::keepalive`] apart) that find nothing received
/// on a flow before it is deallocated: with the default interval, a flow
/// whose peer vanished goes 20 to 40 s later (the first check after may
/// still count what came just before).
pub const KEEPALIVE_MISSES: u8 = 3;

/// Retransmission state of an allocation in progress.
#[derive(Debug)]
struct Allocating {
    request: Vec<u8>,
    next_retry: Instant,
    deadline: Instant,
}

/// A DEALLOC sent for a flow of this end, to be sent again (it is one
/// datagram, and a lost one left the peer's flow open for good).
#[derive(Debug)]
struct Farewell {
    peer: SocketAddr,
    peer_port: PortId,
    due: Instant,
    /// How many more times it goes.
    left: u8,
}

/// How many times a DEALLOC is sent again after the first: at
/// `alloc_retry` and then at three times that after the first.
const FAREWELL_REPEATS: u8 = 2;

/// An incoming request waiting for the application's answer.
#[derive(Debug)]
struct Pending {
    from: SocketAddr,
    src_port: PortId,
    local: AppName,
    remote: AppName,
    qos: QosSpec,
    deadline: Instant,
    /// The requester's direct socket port, if it offered a direct flow.
    direct: Option<u16>,
}

/// A received ALLOC_REQ.
struct Request {
    from: SocketAddr,
    src_port: PortId,
    qos: QosSpec,
    src: AppName,
    dst: AppName,
    direct: Option<u16>,
}

/// A received ALLOC_RESP.
struct Response<'a> {
    dst_port: PortId,
    src_port: PortId,
    result: AllocResult,
    max_sdu: u32,
    reason: &'a str,
    direct: Option<u16>,
}

/// One shim-udp IPC process.
#[derive(Debug)]
pub struct ShimUdp {
    cfg: Config,
    // Ordered maps where iteration order reaches the wire (retransmissions,
    // expiries), so that a seeded simulation replays exactly.
    names: BTreeSet<AppName>,
    /// Boxed: the table's spare room costs a pointer per slot, not a flow.
    flows: IdMap<PortId, Box<Flow>>,
    allocating: BTreeMap<PortId, Allocating>,
    /// Flows deallocated here whose DEALLOC goes again, by their port-id.
    farewells: BTreeMap<PortId, Farewell>,
    pending: BTreeMap<u64, Pending>,
    /// Flows accepted here, by the requester's address and port-id, so that a
    /// retransmitted request is answered again instead of creating a twin.
    accepted: HashMap<(SocketAddr, PortId), PortId>,
    /// When the liveness check next runs; `None` while there is nothing
    /// to check.
    next_check: Option<Instant>,
    next_handle: u64,
    actions: VecDeque<Action>,
    counters: Counters,
}

impl ShimUdp {
    /// A shim IPCP with no names and no flows.
    pub fn new(cfg: Config) -> Self {
        ShimUdp {
            cfg,
            names: BTreeSet::new(),
            flows: IdMap::default(),
            allocating: BTreeMap::new(),
            farewells: BTreeMap::new(),
            pending: BTreeMap::new(),
            accepted: HashMap::new(),
            next_check: None,
            next_handle: 1,
            actions: VecDeque::new(),
            counters: Counters::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Replaces the directory: new allocations resolve with it, and with
    /// [`Config::peers_only`] new requests are judged by it. The flows up
    /// keep the peer address they have.
    pub fn set_directory(&mut self, directory: HashMap<AppName, SocketAddr>) {
        self.cfg.directory = directory;
    }

    /// Takes allocation requests from anyone (`false`) or only from the
    /// directory's addresses (`true`, [`Config::peers_only`]), from now
    /// on; the flows up and the requests waiting for an answer stay.
    pub fn set_peers_only(&mut self, on: bool) {
        self.cfg.peers_only = on;
    }

    /// Sets the liveness check's interval ([`Config::keepalive`]; `None`
    /// turns it off) at time `now`. The check starts afresh: every flow
    /// counts as just heard from, and the next check is one new interval
    /// from now, so that no flow is ended by silences counted under
    /// another interval, or while the check was off.
    pub fn set_keepalive(&mut self, now: Instant, every: Option<Duration>) {
        self.cfg.keepalive = every;
        for (_, f) in self.flows.iter_mut() {
            f.live = Liveness {
                seen_in: f.counters.sdus_in,
                heard: false,
                silent: 0,
            };
        }
        self.next_check = every.filter(|_| !self.nothing_to_check()).map(|e| now + e);
    }

    /// Whether the directory of this shim DIF knows `name`.
    pub fn knows(&self, name: &AppName) -> bool {
        self.cfg.directory.contains_key(name)
    }

    /// IPCP-wide counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Registered names.
    pub fn names(&self) -> impl Iterator<Item = &AppName> {
        self.names.iter()
    }

    /// Flows, allocated or in progress.
    pub fn flows(&self) -> impl Iterator<Item = (PortId, &Flow)> {
        self.flows.iter().map(|(p, f)| (*p, &**f))
    }

    /// One flow.
    pub fn flow(&self, port: PortId) -> Option<&Flow> {
        self.flows.get(&port).map(|f| &**f)
    }

    /// Gives back the spare room of the flow tables (after many flows
    /// closed).
    pub fn shrink_to_fit(&mut self) {
        self.flows.shrink_to_fit();
        self.accepted.shrink_to_fit();
    }

    /// Counters of a flow, for the driver to add what only it sees.
    pub fn flow_counters_mut(&mut self, port: PortId) -> Option<&mut FlowCounters> {
        self.flows.get_mut(&port).map(|f| &mut f.counters)
    }

    /// Registers an application name so that peers can allocate flows to it.
    pub fn register(&mut self, name: AppName) -> Result<(), ShimError> {
        if self.names.contains(&name) {
            return Err(ShimError::NameInUse(Box::new(name)));
        }
        self.names.insert(name);
        Ok(())
    }

    /// Withdraws a name; pending requests for it are refused. Returns whether
    /// it was registered.
    pub fn unregister(&mut self, name: &AppName) -> bool {
        if !self.names.remove(name) {
            return false;
        }
        let gone: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| &p.local == name)
            .map(|(h, _)| *h)
            .collect();
        for handle in gone {
            let _ = self.refuse(handle, "the application unregistered");
            self.actions.push_back(Action::RequestWithdrawn { handle });
        }
        true
    }

    /// Why this shim cannot serve `qos`, if it cannot.
    fn check_qos(&self, qos: &QosSpec) -> Result<(), ShimError> {
        let offer = crate::shim_qos::ShimQos {
            what: "over UDP",
            max_sdu: self.cfg.max_sdu,
            max_sdu_note: "",
            in_order: false,
            loss_note: "",
        };
        match offer.refusal(qos) {
            Some(why) => Err(ShimError::QosNotSatisfiable(why)),
            None => Ok(()),
        }
    }

    /// Starts allocating a flow from `local` to `remote` on port `port`. The
    /// outcome is reported later as [`Action::Allocated`] or
    /// [`Action::AllocateFailed`]; errors found at once are returned.
    pub fn allocate(
        &mut self,
        now: Instant,
        port: PortId,
        local: AppName,
        remote: AppName,
        qos: QosSpec,
    ) -> Result<(), ShimError> {
        self.allocate_direct(now, port, local, remote, qos, None)
    }

    /// [`ShimUdp::allocate`], offering the peer a direct flow between the
    /// driver's UDP socket of port `direct` (made for this flow) and one the
    /// peer makes: if the peer agrees, [`Flow::direct_peer`] says where its
    /// socket is when [`Action::Allocated`] comes.
    pub fn allocate_direct(
        &mut self,
        now: Instant,
        port: PortId,
        local: AppName,
        remote: AppName,
        qos: QosSpec,
        direct: Option<u16>,
    ) -> Result<(), ShimError> {
        if self.flows.contains_key(&port) {
            return Err(ShimError::PortInUse(port));
        }
        let peer = *self
            .cfg
            .directory
            .get(&remote)
            .ok_or_else(|| ShimError::NameNotFound(Box::new(remote.clone())))?;
        self.check_qos(&qos)?;
        if self.flows.len() >= self.cfg.max_flows {
            return Err(ShimError::NoResources(format!(
                "{} flows already",
                self.cfg.max_flows
            )));
        }
        let request = Datagram::AllocReq {
            src_port: port,
            qos,
            src: local.clone(),
            dst: remote.clone(),
            direct,
        }
        .to_vec();
        self.transmit(peer, request.clone());
        self.arm_check(now);
        self.allocating.insert(
            port,
            Allocating {
                request,
                next_retry: now + self.cfg.alloc_retry,
                deadline: now + self.cfg.alloc_timeout,
            },
        );
        self.flows.insert(
            port,
            Box::new(Flow {
                local,
                remote,
                qos,
                peer,
                peer_port: None,
                max_sdu: self.cfg.max_sdu,
                counters: FlowCounters::default(),
                direct_port: direct,
                direct_peer: None,
                live: Liveness::default(),
            }),
        );
        Ok(())
    }

    /// Where the requester's direct socket is, if incoming request
    /// `handle` offers a direct flow (the driver then makes a socket of
    /// its own for it, if the application asked for one too, and passes
    /// its port to [`ShimUdp::accept_direct`]).
    pub fn offered_direct(&self, handle: u64) -> Option<SocketAddr> {
        let p = self.pending.get(&handle)?;
        p.direct.map(|port| SocketAddr::new(p.from.ip(), port))
    }

    /// Accepts incoming request `handle` as flow `port`. Returns the flow's
    /// maximum SDU.
    pub fn accept(&mut self, handle: u64, port: PortId) -> Result<u32, ShimError> {
        self.accept_direct(handle, port, None)
    }

    /// [`ShimUdp::accept`], answering an offer of a direct flow with the
    /// port of the driver's socket for it: the flow is direct if the
    /// request offered one and `direct` is given ([`Flow::direct_peer`]).
    pub fn accept_direct(
        &mut self,
        handle: u64,
        port: PortId,
        direct: Option<u16>,
    ) -> Result<u32, ShimError> {
        if self.flows.contains_key(&port) {
            return Err(ShimError::PortInUse(port));
        }
        let p = self
            .pending
            .remove(&handle)
            .ok_or(ShimError::UnknownRequest(handle))?;
        let max_sdu = self.cfg.max_sdu;
        let (direct_port, direct_peer) = match (direct, p.direct) {
            (Some(ours), Some(theirs)) => (Some(ours), Some(SocketAddr::new(p.from.ip(), theirs))),
            _ => (None, None),
        };
        self.accepted.insert((p.from, p.src_port), port);
        self.flows.insert(
            port,
            Box::new(Flow {
                local: p.local,
                remote: p.remote,
                qos: p.qos,
                peer: p.from,
                peer_port: Some(p.src_port),
                max_sdu,
                counters: FlowCounters::default(),
                direct_port,
                direct_peer,
                live: Liveness::default(),
            }),
        );
        self.respond(
            p.from,
            p.src_port,
            port,
            AllocResult::Accepted,
            "",
            direct_port,
        );
        Ok(max_sdu)
    }

    /// Refuses incoming request `handle`, telling the requester why.
    pub fn refuse(&mut self, handle: u64, reason: &str) -> Result<(), ShimError> {
        let p = self
            .pending
            .remove(&handle)
            .ok_or(ShimError::UnknownRequest(handle))?;
        self.counters.alloc_refused += 1;
        self.respond(p.from, p.src_port, 0, AllocResult::Refused, reason, None);
        Ok(())
    }

    /// Deallocates a flow and tells the peer, at `now` and twice more
    /// (after `alloc_retry` and three times that) unless port-id `port`
    /// names a new flow by then: a peer that heard already ignores the
    /// repeats.
    pub fn deallocate(&mut self, now: Instant, port: PortId) -> Result<(), ShimError> {
        let flow = self
            .flows
            .remove(&port)
            .ok_or(ShimError::UnknownFlow(port))?;
        self.allocating.remove(&port);
        if let Some(peer_port) = flow.peer_port {
            self.accepted.remove(&(flow.peer, peer_port));
            self.send_dealloc(flow.peer, peer_port, port);
            let farewell = Farewell {
                peer: flow.peer,
                peer_port,
                due: now + self.cfg.alloc_retry,
                left: FAREWELL_REPEATS,
            };
            self.farewells.insert(port, farewell);
        }
        Ok(())
    }

    fn send_dealloc(&mut self, to: SocketAddr, peer_port: PortId, port: PortId) {
        let msg = Datagram::Dealloc {
            dst_port: peer_port,
            src_port: port,
        };
        self.transmit(to, msg.to_vec());
    }

    /// Sends the DEALLOCs due again; one whose port-id names a new flow
    /// here is dropped (the new flow's peer could have the old one's
    /// port-id).
    fn send_farewells(&mut self, now: Instant) {
        let due: Vec<PortId> = self
            .farewells
            .iter()
            .filter(|(_, f)| now >= f.due)
            .map(|(p, _)| *p)
            .collect();
        for port in due {
            let Some(f) = self.farewells.get_mut(&port) else {
                continue;
            };
            let (peer, peer_port) = (f.peer, f.peer_port);
            f.left -= 1;
            f.due = now + self.cfg.alloc_retry * 2;
            if f.left == 0 {
                self.farewells.remove(&port);
            }
            if self.flows.contains_key(&port) {
                self.farewells.remove(&port);
                continue;
            }
            self.send_dealloc(peer, peer_port, port);
        }
    }

    /// Accounts an SDU of `len` bytes written on flow `port` and returns where
    /// to send it and the header to put in front of it.
    pub fn send_header(
        &mut self,
        port: PortId,
        len: usize,
    ) -> Result<(SocketAddr, [u8; DATA_HEADER_LEN]), ShimError> {
        // (`let else` rather than `ok_or`: an error built for nothing is
        // dropped for nothing, on every datagram.)
        let Some(flow) = self.flows.get_mut(&port) else {
            return Err(ShimError::UnknownFlow(port));
        };
        let Some(peer_port) = flow.peer_port else {
            return Err(ShimError::UnknownFlow(port));
        };
        if len == 0 {
            flow.counters.drops_out += 1;
            return Err(ShimError::EmptySdu);
        }
        if len > flow.max_sdu as usize {
            flow.counters.drops_out += 1;
            return Err(ShimError::SduTooLarge {
                size: len,
                max: flow.max_sdu,
            });
        }
        flow.counters.sdus_out += 1;
        flow.counters.bytes_out += len as u64;
        self.counters.tx_datagrams += 1;
        Ok((flow.peer, data_header(peer_port)))
    }

    /// Processes one received datagram. An allocation request from the
    /// address and port-id of a flow accepted here is answered again (a
    /// retransmission), unless the requester has sent data on that flow:
    /// then it is a restarted requester asking anew, and the old flow is
    /// dropped ([`Action::Deallocated`]) before the request is taken. Either
    /// only if the request names the flow's two applications: one naming
    /// others is refused and the flow stays.
    pub fn on_datagram<'a>(
        &mut self,
        now: Instant,
        from: SocketAddr,
        buf: &'a [u8],
    ) -> Received<'a> {
        self.counters.rx_datagrams += 1;
        let msg = match Datagram::parse(buf) {
            Ok(m) => m,
            Err(e) => {
                self.counters.rx_malformed += 1;
                return Received::Dropped(DropReason::Malformed(e));
            }
        };
        match msg {
            Datagram::Data { dst_port, sdu } => self.on_data(from, dst_port, sdu),
            Datagram::AllocReq {
                src_port,
                qos,
                src,
                dst,
                direct,
            } => {
                let req = Request {
                    from,
                    src_port,
                    qos,
                    src,
                    dst,
                    direct,
                };
                self.on_alloc_req(now, req);
                Received::Control
            }
            Datagram::AllocResp {
                dst_port,
                src_port,
                result,
                max_sdu,
                reason,
                direct,
            } => {
                let resp = Response {
                    dst_port,
                    src_port,
                    result,
                    max_sdu,
                    reason,
                    direct,
                };
                self.on_alloc_resp(from, resp);
                Received::Control
            }
            Datagram::Keepalive { probe, flows } => {
                self.on_keepalive(from, probe, flows);
                Received::Control
            }
            Datagram::Dealloc { dst_port, src_port } => {
                let ours = self
                    .flows
                    .get(&dst_port)
                    .is_some_and(|f| f.peer == from && f.peer_port == Some(src_port));
                if ours {
                    self.flows.remove(&dst_port);
                    self.accepted.remove(&(from, src_port));
                    self.actions
                        .push_back(Action::Deallocated { port: dst_port });
                }
                Received::Control
            }
        }
    }

    /// A KEEPALIVE from `from`: the flows it names that are its flows here
    /// were heard from; a probe is answered at once, naming those (and no
    /// others: an answer is never larger than its probe).
    fn on_keepalive(&mut self, from: SocketAddr, probe: bool, flows: PortPairs<'_>) {
        self.counters.keepalives_received += 1;
        let mut answer = Vec::new();
        for (dst_port, src_port) in flows.iter() {
            match self.flows.get_mut(&dst_port) {
                Some(f) if f.peer == from && f.peer_port == Some(src_port) => {
                    f.live.heard = true;
                    if probe {
                        answer.push((src_port, dst_port));
                    }
                }
                _ => self.counters.rx_unknown_flow += 1,
            }
        }
        for chunk in answer.chunks(self.keepalive_pairs()) {
            self.counters.keepalives_sent += 1;
            self.transmit(from, keepalive(false, chunk));
        }
    }

    /// Most pairs in a KEEPALIVE of this IPCP: as many as fit a datagram
    /// of its largest DATA (`max_sdu` and the header), so that an
    /// operator who set `max_sdu` to avoid IP fragments gets none.
    fn keepalive_pairs(&self) -> usize {
        let datagram = self.cfg.max_sdu as usize + DATA_HEADER_LEN;
        (datagram.saturating_sub(KEEPALIVE_HEADER_LEN) / 8).clamp(1, MAX_KEEPALIVE_PAIRS)
    }

    fn on_data<'a>(&mut self, from: SocketAddr, port: PortId, sdu: &'a [u8]) -> Received<'a> {
        match self.flows.get_mut(&port) {
            Some(f) if f.peer_port.is_some() && f.peer == from && sdu.is_empty() => {
                self.counters.rx_malformed += 1;
                Received::Dropped(DropReason::EmptySdu(port))
            }
            Some(f) if f.peer_port.is_some() && f.peer == from => {
                f.counters.sdus_in += 1;
                f.counters.bytes_in += sdu.len() as u64;
                Received::Deliver { port, sdu }
            }
            Some(f) if f.peer_port.is_some() => {
                self.counters.rx_wrong_peer += 1;
                Received::Dropped(DropReason::WrongPeer { port, from })
            }
            _ => {
                self.counters.rx_unknown_flow += 1;
                Received::Dropped(DropReason::UnknownFlow(port))
            }
        }
    }

    /// Requests from host `ip` waiting for an application's answer.
    fn pending_from(&self, ip: IpAddr) -> usize {
        self.pending.values().filter(|p| p.from.ip() == ip).count()
    }

    fn on_alloc_req(&mut self, now: Instant, req: Request) {
        let Request {
            from,
            src_port,
            qos,
            src,
            dst,
            direct,
        } = req;
        self.counters.alloc_requests_in += 1;
        self.arm_check(now);
        if self.cfg.peers_only {
            let claimed = self.cfg.directory.get(&src);
            let known = claimed.map_or_else(
                || self.cfg.directory.values().any(|a| *a == from),
                |a| *a == from,
            );
            if !known {
                self.counters.rx_wrong_peer += 1;
                return;
            }
        }
        // A retransmission: answer again if we accepted, ignore if still pending.
        if let Some(&port) = self.accepted.get(&(from, src_port)) {
            if self.answer_again(port, from, src_port, &src, &dst) {
                return;
            }
        }
        if self
            .pending
            .values()
            .any(|p| p.from == from && p.src_port == src_port)
        {
            return;
        }
        let refusal = if !self.names.contains(&dst) {
            Some((
                AllocResult::NotRegistered,
                format!("{dst} is not registered"),
            ))
        } else if self.pending.len() >= self.cfg.max_pending
            || self.flows.len() >= self.cfg.max_flows
        {
            Some((AllocResult::NoResources, "too many flows".to_string()))
        } else if self.pending_from(from.ip()) >= self.cfg.max_pending_per_host.max(1) {
            Some((
                AllocResult::NoResources,
                format!("too many requests from {} waiting for an answer", from.ip()),
            ))
        } else if let Err(e) = self.check_qos(&qos) {
            Some((AllocResult::QosNotSatisfiable, e.to_string()))
        } else {
            None
        };
        if let Some((result, reason)) = refusal {
            self.counters.alloc_refused += 1;
            self.respond(from, src_port, 0, result, &reason, None);
            return;
        }
        let handle = self.next_handle;
        self.next_handle += 1;
        self.pending.insert(
            handle,
            Pending {
                from,
                src_port,
                local: dst.clone(),
                remote: src.clone(),
                qos,
                deadline: now + self.cfg.accept_timeout,
                direct,
            },
        );
        self.actions.push_back(Action::FlowRequest {
            handle,
            local: dst,
            remote: src,
            qos,
        });
    }

    /// Deals with a request from `from` for `src` -> `dst` naming port-id
    /// `src_port`, which names flow `port` accepted here; false if the
    /// request is to be taken as a new one.
    ///
    /// * Another pair of names: not a retransmission, and no proof that the
    ///   requester restarted (anyone can write its address on a datagram):
    ///   the flow stays and the request is refused.
    /// * The same names, no data received on the flow yet: a
    ///   retransmission, answered again.
    /// * The same names and the requester sent data on the flow, so it had
    ///   the answer (and a requester stops asking once answered): it started
    ///   again and numbers its flows from the start again. The old flow is
    ///   dead at its end, so it goes here too ([`Action::Deallocated`]), and
    ///   the request is a new one.
    fn answer_again(
        &mut self,
        port: PortId,
        from: SocketAddr,
        src_port: PortId,
        src: &AppName,
        dst: &AppName,
    ) -> bool {
        let Some(f) = self.flows.get_mut(&port) else {
            self.accepted.remove(&(from, src_port));
            return false;
        };
        if (&f.remote, &f.local) != (src, dst) {
            let reason = format!(
                "port-id {src_port} of {from} names a live flow from {} to {} here",
                f.remote, f.local
            );
            self.counters.alloc_refused += 1;
            self.respond(from, src_port, 0, AllocResult::Refused, &reason, None);
            return true;
        }
        if f.counters.sdus_in == 0 {
            // The requester is there, still asking: the flow is alive.
            f.live.heard = true;
            let direct = f.direct_port;
            self.respond(from, src_port, port, AllocResult::Accepted, "", direct);
            return true;
        }
        self.counters.flows_restarted += 1;
        self.accepted.remove(&(from, src_port));
        self.flows.remove(&port);
        self.actions.push_back(Action::Deallocated { port });
        false
    }

    fn on_alloc_resp(&mut self, from: SocketAddr, resp: Response<'_>) {
        let Response {
            dst_port,
            src_port,
            result,
            max_sdu,
            reason,
            direct,
        } = resp;
        let waiting = self
            .flows
            .get(&dst_port)
            .is_some_and(|f| f.peer == from && f.peer_port.is_none());
        if !waiting {
            // A late acceptance for a flow we gave up on: tell the peer to drop it.
            let known = self
                .flows
                .get(&dst_port)
                .is_some_and(|f| f.peer_port == Some(src_port));
            if result == AllocResult::Accepted && !known {
                let msg = Datagram::Dealloc {
                    dst_port: src_port,
                    src_port: dst_port,
                };
                self.transmit(from, msg.to_vec());
            }
            return;
        }
        self.allocating.remove(&dst_port);
        if result == AllocResult::Accepted && max_sdu == 0 {
            // A flow that can carry nothing: refuse it at both ends.
            self.counters.rx_malformed += 1;
            self.flows.remove(&dst_port);
            let msg = Datagram::Dealloc {
                dst_port: src_port,
                src_port: dst_port,
            };
            self.transmit(from, msg.to_vec());
            self.actions.push_back(Action::AllocateFailed {
                port: dst_port,
                error: ShimError::Refused("the peer offered a maximum SDU of 0 bytes".into()),
            });
            return;
        }
        if result == AllocResult::Accepted {
            if let Some(f) = self.flows.get_mut(&dst_port) {
                f.peer_port = Some(src_port);
                f.max_sdu = f.max_sdu.min(max_sdu);
                // Direct only if this end offered it and the peer answered.
                f.direct_peer = f
                    .direct_port
                    .and(direct)
                    .map(|p| SocketAddr::new(from.ip(), p));
                let max_sdu = f.max_sdu;
                self.actions.push_back(Action::Allocated {
                    port: dst_port,
                    max_sdu,
                });
            }
            return;
        }
        let Some(flow) = self.flows.remove(&dst_port) else {
            return;
        };
        let reason = reason.to_string();
        let error = match result {
            AllocResult::NotRegistered => ShimError::NotRegistered {
                name: Box::new(flow.remote),
                peer: from,
            },
            AllocResult::QosNotSatisfiable => ShimError::QosNotSatisfiable(reason),
            AllocResult::NoResources => ShimError::NoResources(reason),
            AllocResult::Refused | AllocResult::Accepted => ShimError::Refused(reason),
        };
        self.actions.push_back(Action::AllocateFailed {
            port: dst_port,
            error,
        });
    }

    /// When [`ShimUdp::handle_timeout`] next needs to run, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let a = self
            .allocating
            .values()
            .map(|a| a.next_retry.min(a.deadline));
        let p = self.pending.values().map(|p| p.deadline);
        let f = self.farewells.values().map(|f| f.due);
        // The liveness check, while it has something to check.
        let c = self.next_check.filter(|_| !self.nothing_to_check());
        a.chain(p).chain(f).chain(c).min()
    }

    /// No flow and no request: nothing for the liveness check.
    fn nothing_to_check(&self) -> bool {
        self.flows.is_empty() && self.pending.is_empty()
    }

    /// Starts the liveness check, if it is on and not running: a flow is
    /// coming (asked for here, or a request came). A check left from
    /// flows that are all gone starts again from now.
    fn arm_check(&mut self, now: Instant) {
        if let Some(every) = self.cfg.keepalive {
            if self.next_check.is_none() || self.nothing_to_check() {
                self.next_check = Some(now + every);
            }
        }
    }

    /// The liveness check ([`Config::keepalive`]): a probe for every
    /// allocated flow nothing came on since the last check, and
    /// deallocation of those nothing came on for [`KEEPALIVE_MISSES`]
    /// checks. It stops when no flow or request is left.
    fn check_liveness(&mut self, now: Instant) {
        let (Some(every), Some(due)) = (self.cfg.keepalive, self.next_check) else {
            return;
        };
        if now < due {
            return;
        }
        let mut probe = Vec::new();
        let mut dead = Vec::new();
        for (&port, f) in self.flows.iter_mut() {
            let Some(peer_port) = f.peer_port else {
                continue;
            };
            let l = &mut f.live;
            if l.heard || f.counters.sdus_in != l.seen_in {
                l.silent = 0;
            } else {
                l.silent = l.silent.saturating_add(1);
            }
            l.heard = false;
            l.seen_in = f.counters.sdus_in;
            if l.silent >= KEEPALIVE_MISSES {
                dead.push(port);
            } else if l.silent > 0 {
                probe.push((port, f.peer, peer_port));
            }
        }
        // One probe per peer for all its silent flows (as many as fit),
        // in order, so that a seeded simulation replays exactly.
        probe.sort_unstable_by_key(|&(port, to, _)| (to, port));
        dead.sort_unstable();
        let most = self.keepalive_pairs();
        let mut pairs = Vec::new();
        for (i, &(port, to, peer_port)) in probe.iter().enumerate() {
            pairs.push((peer_port, port));
            let last = probe.get(i + 1).is_none_or(|next| next.1 != to);
            if last || pairs.len() == most {
                self.counters.keepalives_sent += 1;
                self.transmit(to, keepalive(true, &pairs));
                pairs.clear();
            }
        }
        for port in dead {
            // The peer may hear still: it is told, as for any deallocation.
            if self.deallocate(now, port).is_ok() {
                self.counters.keepalive_expired += 1;
                self.actions.push_back(Action::Deallocated { port });
            }
        }
        self.next_check = (!self.nothing_to_check()).then(|| now + every);
    }

    /// Retransmits allocation requests and DEALLOCs and expires what
    /// waited too long.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.send_farewells(now);
        self.check_liveness(now);
        let mut expired = Vec::new();
        let mut resend = Vec::new();
        for (port, a) in self.allocating.iter_mut() {
            if now >= a.deadline {
                expired.push(*port);
            } else if now >= a.next_retry {
                a.next_retry = now + self.cfg.alloc_retry;
                resend.push(*port);
            }
        }
        for port in resend {
            if let (Some(a), Some(f)) = (self.allocating.get(&port), self.flows.get(&port)) {
                let (to, payload) = (f.peer, a.request.clone());
                self.transmit(to, payload);
            }
        }
        for port in expired {
            self.allocating.remove(&port);
            if let Some(f) = self.flows.remove(&port) {
                self.counters.alloc_timeouts += 1;
                self.actions.push_back(Action::AllocateFailed {
                    port,
                    error: ShimError::Timeout {
                        peer: f.peer,
                        after: self.cfg.alloc_timeout,
                    },
                });
            }
        }
        let late: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| now >= p.deadline)
            .map(|(h, _)| *h)
            .collect();
        for handle in late {
            let _ = self.refuse(handle, "the application did not answer in time");
            self.actions.push_back(Action::RequestWithdrawn { handle });
        }
    }

    /// The next thing the driver must do, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    fn respond(
        &mut self,
        to: SocketAddr,
        dst_port: PortId,
        src_port: PortId,
        result: AllocResult,
        reason: &str,
        direct: Option<u16>,
    ) {
        let reason = truncate_utf8(reason, MAX_REASON_LEN);
        let msg = Datagram::AllocResp {
            dst_port,
            src_port,
            result,
            max_sdu: self.cfg.max_sdu,
            reason,
            direct,
        };
        self.transmit(to, msg.to_vec());
    }

    fn transmit(&mut self, to: SocketAddr, payload: Vec<u8>) {
        self.counters.tx_datagrams += 1;
        self.actions.push_back(Action::Transmit { to, payload });
    }
}

#[cfg(test)]
mod tests;
