//! One IPC process of a [`super::System`], whatever its kind, behind one
//! contract: the same calls (register, allocate, accept, refuse,
//! deallocate, write), one event vocabulary ([`IpcpEvent`]) and one flow
//! error type ([`FlowError`]), so that the system's bookkeeping and the
//! resource allocator never ask which kind of IPCP they hold.

use crate::buf::PduBuf;
use crate::normal::{self, NormalError, NormalIpcp};
use crate::rmt::PortRate;
use crate::sdu::Sdu;
use crate::shim_eth::{self, ShimEth, ShimEthError};
use crate::shim_hv::{self, ShimHv, ShimHvError};
use crate::shim_udp::{self, ShimError, ShimUdp};
use crate::time::Instant;
use rina_wire::{AppName, QosSpec};
use std::net::SocketAddr;
use thiserror::Error;

/// A flow's port-id, unique in its system (application flows and N-1 flows
/// alike).
pub type PortId = u32;

/// Why a flow operation failed, for any kind of IPCP: the one error type
/// of the IPCP contract (each machine's own error converts into it).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FlowError {
    /// The flow cannot take this SDU now (flow control, or the medium
    /// below is full); the system says when it is writable again.
    #[error("the flow cannot take an SDU now; wait until it is writable")]
    WouldBlock,
    /// No flow with this port-id.
    #[error("no flow {0}")]
    UnknownFlow(u64),
    /// No pending request with this handle (answered or withdrawn).
    #[error("no pending request {0}")]
    UnknownRequest(u64),
    /// The name cannot be found in the DIF (directory, shim table, ARP).
    #[error("{0}")]
    NameNotFound(String),
    /// The name is registered already (or the shim takes only one).
    #[error("{0}")]
    NameInUse(String),
    /// The destination IPCP has no application registered under the name.
    #[error("{0}")]
    NotRegistered(String),
    /// The peer (its IPCP or its application) refused.
    #[error("{0}")]
    Refused(String),
    /// No answer in time.
    #[error("{0}")]
    Timeout(String),
    /// Too many flows or requests, no channel, or the peer is down.
    #[error("{0}")]
    NoResources(String),
    /// The SDU is larger than the flow's maximum.
    #[error("{0}")]
    SduTooLarge(String),
    /// The request makes no sense (an empty SDU, a flow to oneself).
    #[error("{0}")]
    Invalid(String),
    /// No QoS cube of the DIF serves the QoS spec.
    #[error("{0}")]
    Qos(String),
    /// The IPCP is not a member of its DIF yet.
    #[error("not enrolled in the DIF yet")]
    NotEnrolled,
    /// The flow's connection failed.
    #[error("{0}")]
    Failed(String),
    /// No IPCP of the system is in the named DIF (or can reach the name).
    #[error("no IPCP of this system for {0}")]
    NoIpcp(String),
    /// A fault of the IPCP itself (a port-id used twice, a bad policy).
    #[error("{0}")]
    Internal(String),
}

impl From<NormalError> for FlowError {
    fn from(e: NormalError) -> Self {
        let m = e.to_string();
        match e {
            NormalError::WouldBlock(_) => FlowError::WouldBlock,
            NormalError::UnknownFlow(f) => FlowError::UnknownFlow(f.into()),
            NormalError::UnknownRequest(h) => FlowError::UnknownRequest(h),
            NormalError::NameNotFound(_) => FlowError::NameNotFound(m),
            NormalError::NameInUse(_) => FlowError::NameInUse(m),
            NormalError::NotRegistered(_) => FlowError::NotRegistered(m),
            NormalError::Refused(_) | NormalError::AccessDenied(_) => FlowError::Refused(m),
            NormalError::Timeout { .. } => FlowError::Timeout(m),
            NormalError::NoResources(_) => FlowError::NoResources(m),
            NormalError::BadSduSize { .. } => FlowError::SduTooLarge(m),
            NormalError::UnreadableSdu(_) => FlowError::Invalid(m),
            NormalError::QosNotSatisfiable(_) => FlowError::Qos(m),
            NormalError::NotEnrolled => FlowError::NotEnrolled,
            NormalError::Failed(..) => FlowError::Failed(m),
            _ => FlowError::Internal(m),
        }
    }
}

impl From<ShimError> for FlowError {
    fn from(e: ShimError) -> Self {
        let m = e.to_string();
        match e {
            ShimError::UnknownFlow(p) => FlowError::UnknownFlow(p.into()),
            ShimError::UnknownRequest(h) => FlowError::UnknownRequest(h),
            ShimError::NameNotFound(_) => FlowError::NameNotFound(m),
            ShimError::NameInUse(_) => FlowError::NameInUse(m),
            ShimError::NotRegistered { .. } => FlowError::NotRegistered(m),
            ShimError::Refused(_) => FlowError::Refused(m),
            ShimError::QosNotSatisfiable(_) => FlowError::Qos(m),
            ShimError::SduTooLarge { .. } => FlowError::SduTooLarge(m),
            ShimError::EmptySdu => FlowError::Invalid(m),
            ShimError::Timeout { .. } => FlowError::Timeout(m),
            ShimError::NoResources(_) => FlowError::NoResources(m),
            ShimError::PortInUse(_) => FlowError::Internal(m),
        }
    }
}

impl From<ShimEthError> for FlowError {
    fn from(e: ShimEthError) -> Self {
        let m = e.to_string();
        match e {
            ShimEthError::NameDoesNotResolve { .. } => FlowError::NameNotFound(m),
            ShimEthError::OneApplicationOnly(_) => FlowError::NameInUse(m),
            ShimEthError::FlowExists { .. } | ShimEthError::NoResources(_) => {
                FlowError::NoResources(m)
            }
            ShimEthError::SelfFlow(_) | ShimEthError::EmptySdu => FlowError::Invalid(m),
            ShimEthError::QosNotSatisfiable(_) => FlowError::Qos(m),
            ShimEthError::SduTooLarge { .. } => FlowError::SduTooLarge(m),
            ShimEthError::UnknownFlow(p) => FlowError::UnknownFlow(p.into()),
            ShimEthError::UnknownRequest(h) => FlowError::UnknownRequest(h),
            ShimEthError::PortInUse(_) => FlowError::Internal(m),
        }
    }
}

impl From<ShimHvError> for FlowError {
    fn from(e: ShimHvError) -> Self {
        let m = e.to_string();
        match e {
            ShimHvError::PeerDown | ShimHvError::PeerLost | ShimHvError::NoChannel => {
                FlowError::NoResources(m)
            }
            ShimHvError::NameInUse(_) => FlowError::NameInUse(m),
            ShimHvError::Refused(r) if r.contains("is not registered") => {
                FlowError::NotRegistered(m)
            }
            ShimHvError::Refused(_) => FlowError::Refused(m),
            ShimHvError::QosNotSatisfiable(_) => FlowError::Qos(m),
            ShimHvError::SduTooLarge { .. } => FlowError::SduTooLarge(m),
            ShimHvError::EmptySdu => FlowError::Invalid(m),
            ShimHvError::Timeout(_) => FlowError::Timeout(m),
            ShimHvError::UnknownFlow(p) => FlowError::UnknownFlow(p.into()),
            ShimHvError::UnknownRequest(h) => FlowError::UnknownRequest(h),
            ShimHvError::PortInUse(_) => FlowError::Internal(m),
            ShimHvError::NoCredit(_) => FlowError::NoResources(m),
        }
    }
}

/// What an IPCP tells its system.
// Every PDU is moved in one of these several times (queued, polled,
// turned into the system's event): the rare variants box their names,
// QoS and news so that a move is a few words, not a `memcpy` of 280 bytes.
#[derive(Debug)]
pub enum IpcpEvent {
    /// A peer asks for a flow to `local`, registered here.
    FlowRequest {
        handle: u64,
        local: Box<AppName>,
        remote: Box<AppName>,
        qos: Box<QosSpec>,
    },
    /// Request `handle` was withdrawn (not answered in time).
    RequestWithdrawn { handle: u64 },
    /// An allocation succeeded.
    Allocated { port: PortId, max_sdu: u32 },
    /// An allocation failed.
    AllocateFailed { port: PortId, error: FlowError },
    /// The peer deallocated a flow.
    Deallocated { port: PortId },
    /// An SDU for the user of flow `port`.
    Deliver { port: PortId, sdu: Sdu },
    /// The connection of flow `port` failed.
    FlowFailed { port: PortId },
    /// Normal IPCP: write this frame on N-1 flow `port`.
    Transmit { port: PortId, frame: PduBuf },
    /// Shim: send this frame on the medium (to `peer` over UDP; Ethernet
    /// frames carry their own addresses, shim-hv is point to point).
    ToMedium {
        peer: Option<SocketAddr>,
        frame: PduBuf,
    },
    /// Normal IPCP: news of enrollment and neighbours, for the log.
    Membership(Box<normal::MembershipEvent>),
    /// Normal IPCP: a management PDU no machine of the system handles.
    ManagementUnhandled,
    /// Normal IPCP: the outcome of a read of a neighbour's RIB
    /// ([`NormalIpcp::read_remote_rib`]).
    RibRead {
        handle: u64,
        result: Result<Vec<rina_wire::ctl::RibObjectInfo>, normal::RibReadError>,
    },
}

/// The other end of a flow, as the IPCP below knows it: what binds a lane
/// to the neighbour of its primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LowerPeer {
    /// A shim-udp peer's address and port.
    Udp(SocketAddr),
    /// A shim-eth peer's MAC address.
    Eth(rina_wire::shim_eth::MacAddr),
    /// The other side of a shim-hv (point to point).
    Hv,
    /// The remote address of a flow of a normal IPCP (a stacked DIF).
    Address(crate::rmt::Address),
}

/// The machine of a member, by kind.
#[derive(Debug)]
pub enum Machine {
    /// A shim IPCP over UDP.
    ShimUdp(Box<ShimUdp>),
    /// A shim IPCP over Ethernet (802.1Q).
    ShimEth(Box<ShimEth>),
    /// A shim IPCP for hypervisors (shared-memory rings).
    ShimHv(Box<ShimHv>),
    /// A normal IPCP.
    Normal(Box<NormalIpcp>),
}

impl Machine {
    /// The DIF the machine is a member of.
    pub fn dif(&self) -> &str {
        match self {
            Machine::ShimUdp(s) => &s.config().dif,
            Machine::ShimEth(e) => &e.config().dif,
            Machine::ShimHv(h) => &h.config().dif,
            Machine::Normal(n) => &n.config().dif,
        }
    }
}

/// Where a shim sends an SDU and the header it puts in front of it: the
/// driver writes header and SDU on the medium itself, without a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShimSend {
    /// The UDP peer (shim-udp); `None` where the header holds the address
    /// (Ethernet) or the medium is point to point (shim-hv).
    pub peer: Option<SocketAddr>,
    header: [u8; 24],
    len: u8,
}

impl ShimSend {
    fn new(peer: Option<SocketAddr>, header: &[u8]) -> Self {
        let mut h = [0u8; 24];
        let len = header.len().min(h.len());
        h[..len].copy_from_slice(&header[..len]);
        ShimSend {
            peer,
            header: h,
            len: len as u8,
        }
    }

    /// The header's bytes.
    pub fn header(&self) -> &[u8] {
        &self.header[..self.len as usize]
    }

    /// Header and SDU as one frame.
    pub fn frame(&self, sdu: &[u8]) -> Vec<u8> {
        let mut f = Vec::with_capacity(self.len as usize + sdu.len());
        f.extend_from_slice(self.header());
        f.extend_from_slice(sdu);
        f
    }
}

/// One IPC process of a system.
#[derive(Debug)]
pub struct Member {
    /// Its name in the system.
    pub name: String,
    /// The DIF it is a member of.
    pub dif: String,
    /// Its machine.
    pub machine: Machine,
    /// Shims: the capacity of the link below (normal IPCPs above pace
    /// their N-1 flows at it).
    pub rate: Option<PortRate>,
}

impl Member {
    /// The kind, as written in configurations.
    pub fn kind(&self) -> &'static str {
        match &self.machine {
            Machine::ShimUdp(_) => "shim-udp",
            Machine::ShimEth(_) => "shim-eth",
            Machine::ShimHv(_) => "shim-hv",
            Machine::Normal(_) => "normal",
        }
    }

    /// The normal IPCP, if it is one.
    pub fn normal(&self) -> Option<&NormalIpcp> {
        match &self.machine {
            Machine::Normal(n) => Some(n),
            _ => None,
        }
    }

    /// The normal IPCP, if it is one.
    pub fn normal_mut(&mut self) -> Option<&mut NormalIpcp> {
        match &mut self.machine {
            Machine::Normal(n) => Some(n),
            _ => None,
        }
    }

    /// The shim-udp IPCP, if it is one (to change its directory or
    /// liveness check at run time).
    pub fn shim_udp_mut(&mut self) -> Option<&mut ShimUdp> {
        match &mut self.machine {
            Machine::ShimUdp(s) => Some(s),
            _ => None,
        }
    }

    /// Largest SDU its flows carry.
    pub fn max_sdu(&self) -> usize {
        match &self.machine {
            Machine::ShimUdp(s) => s.config().max_sdu as usize,
            Machine::ShimEth(e) => e.config().max_sdu() as usize,
            Machine::ShimHv(h) => h.config().max_sdu as usize,
            Machine::Normal(n) => n.config().max_sdu,
        }
    }

    /// Registers an application name.
    pub fn register(&mut self, name: AppName) -> Result<(), FlowError> {
        match &mut self.machine {
            Machine::ShimUdp(s) => Ok(s.register(name)?),
            Machine::ShimEth(e) => Ok(e.register(name)?),
            Machine::ShimHv(h) => Ok(h.register(name)?),
            Machine::Normal(n) => Ok(n.register(name)?),
        }
    }

    /// Withdraws a registration.
    pub fn unregister(&mut self, name: &AppName) -> bool {
        match &mut self.machine {
            Machine::ShimUdp(s) => s.unregister(name),
            Machine::ShimEth(e) => e.unregister(name),
            Machine::ShimHv(h) => h.unregister(name),
            Machine::Normal(n) => n.unregister(name),
        }
    }

    /// Whether this IPCP can reach `name`.
    pub fn knows(&self, name: &AppName) -> bool {
        match &self.machine {
            Machine::ShimUdp(s) => s.knows(name),
            // Any name may resolve by ARP; it is asked at allocation.
            Machine::ShimEth(_) => true,
            // Point to point: the other end is asked at allocation.
            Machine::ShimHv(_) => true,
            Machine::Normal(n) => n.knows(name),
        }
    }

    /// Gives back the spare room of its flow tables (after many flows
    /// closed).
    pub fn shrink_to_fit(&mut self) {
        match &mut self.machine {
            Machine::ShimUdp(s) => s.shrink_to_fit(),
            Machine::Normal(n) => n.shrink_to_fit(),
            Machine::ShimEth(_) | Machine::ShimHv(_) => {}
        }
    }

    /// Who is at the other end of flow `port`, as the medium or the DIF
    /// below knows it (`None`: no such flow, or not known yet).
    pub fn flow_peer(&self, port: PortId) -> Option<LowerPeer> {
        match &self.machine {
            Machine::ShimUdp(s) => s.flow(port).map(|f| LowerPeer::Udp(f.peer)),
            Machine::ShimEth(e) => e.flow(port)?.peer.map(LowerPeer::Eth),
            Machine::ShimHv(h) => h.flow(port).map(|_| LowerPeer::Hv),
            Machine::Normal(n) => n
                .flows()
                .find(|(f, _)| *f == port)
                .map(|(_, ep)| LowerPeer::Address(ep.remote_addr)),
        }
    }

    /// Whether flow `port` is one of its flows.
    pub fn has_flow(&self, port: PortId) -> bool {
        match &self.machine {
            Machine::ShimUdp(s) => s.flow(port).is_some(),
            Machine::ShimEth(e) => e.flow(port).is_some(),
            Machine::ShimHv(h) => h.flow(port).is_some(),
            Machine::Normal(n) => n.flow_counters(port).is_some() || n.is_allocating(port),
        }
    }

    /// Starts allocating flow `port`; `direct` offers a direct flow where
    /// the machine has them (shim-udp: the driver's socket's port); `app`
    /// says whether an application (not a normal IPCP) is its user (shim-hv
    /// limits only application flows by credit).
    pub fn allocate(
        &mut self,
        now: Instant,
        port: PortId,
        (local, remote): (AppName, AppName),
        qos: QosSpec,
        (direct, app): (Option<u16>, bool),
    ) -> Result<(), FlowError> {
        match &mut self.machine {
            Machine::ShimUdp(s) => Ok(s.allocate_direct(now, port, local, remote, qos, direct)?),
            Machine::ShimEth(e) => Ok(e.allocate(now, port, local, remote, qos)?),
            Machine::ShimHv(h) => Ok(h.allocate_with(now, port, (local, remote), qos, app)?),
            Machine::Normal(n) => Ok(n.allocate(now, port, local, remote, qos)?),
        }
    }

    /// Accepts request `handle` as flow `port`; returns its largest SDU.
    /// `direct` answers an offer of a direct flow (shim-udp); `app` as in
    /// [`Member::allocate`].
    pub fn accept(
        &mut self,
        now: Instant,
        handle: u64,
        port: PortId,
        (direct, app): (Option<u16>, bool),
    ) -> Result<u32, FlowError> {
        match &mut self.machine {
            Machine::ShimUdp(s) => Ok(s.accept_direct(handle, port, direct)?),
            Machine::ShimEth(e) => Ok(e.accept(handle, port)?),
            Machine::ShimHv(h) => Ok(h.accept_with(handle, port, app)?),
            Machine::Normal(n) => Ok(n.accept(now, handle, port)?),
        }
    }

    /// Refuses request `handle`.
    pub fn refuse(&mut self, handle: u64, reason: &str) -> Result<(), FlowError> {
        match &mut self.machine {
            Machine::ShimUdp(s) => Ok(s.refuse(handle, reason)?),
            Machine::ShimEth(e) => Ok(e.refuse(handle, reason)?),
            Machine::ShimHv(h) => Ok(h.refuse(handle, reason)?),
            Machine::Normal(n) => Ok(n.refuse(handle, reason)?),
        }
    }

    /// Deallocates flow `port` and tells the peer.
    pub fn deallocate(&mut self, now: Instant, port: PortId) {
        match &mut self.machine {
            Machine::ShimUdp(s) => {
                let _ = s.deallocate(now, port);
            }
            Machine::ShimEth(e) => {
                let _ = e.deallocate(port);
            }
            Machine::ShimHv(h) => {
                let _ = h.deallocate(port);
            }
            Machine::Normal(n) => {
                let _ = n.deallocate(now, port);
            }
        }
    }

    /// When [`Member::handle_timeout`] next needs to run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.machine {
            Machine::ShimUdp(s) => s.poll_timeout(),
            Machine::ShimEth(e) => e.poll_timeout(),
            Machine::ShimHv(h) => h.poll_timeout(),
            Machine::Normal(n) => n.poll_timeout(),
        }
    }

    /// Runs due timers.
    pub fn handle_timeout(&mut self, now: Instant) {
        match &mut self.machine {
            Machine::ShimUdp(s) => s.handle_timeout(now),
            Machine::ShimEth(e) => e.handle_timeout(now),
            Machine::ShimHv(h) => h.handle_timeout(now),
            Machine::Normal(n) => n.handle_timeout(now),
        }
    }

    /// Accounts an SDU of `len` bytes written on shim flow `port` and says
    /// where it goes with which header; a normal IPCP has no such header.
    pub fn send_header(&mut self, port: PortId, len: usize) -> Result<ShimSend, FlowError> {
        match &mut self.machine {
            Machine::ShimUdp(s) => {
                let (peer, hdr) = s.send_header(port, len)?;
                Ok(ShimSend::new(Some(peer), &hdr))
            }
            Machine::ShimEth(e) => {
                let hdr = e.send_header(port, len)?;
                let mut b = [0u8; 24];
                let n = hdr.write(&mut b).unwrap_or(0);
                Ok(ShimSend::new(None, &b[..n]))
            }
            Machine::ShimHv(h) => Ok(ShimSend::new(None, &h.send_header(port, len)?)),
            Machine::Normal(_) => Err(FlowError::Invalid(format!(
                "IPCP {} is not a shim: its flows take whole SDUs",
                self.name
            ))),
        }
    }

    /// The next event, in the common vocabulary.
    pub fn poll_event(&mut self) -> Option<IpcpEvent> {
        match &mut self.machine {
            Machine::ShimUdp(s) => s.poll_action().map(shim_udp_event),
            Machine::ShimEth(e) => e.poll_action().map(shim_eth_event),
            Machine::ShimHv(h) => h.poll_action().map(shim_hv_event),
            Machine::Normal(n) => n.poll_action().map(normal_event),
        }
    }
}

fn shim_udp_event(a: shim_udp::Action) -> IpcpEvent {
    match a {
        shim_udp::Action::Transmit { to, payload } => IpcpEvent::ToMedium {
            peer: Some(to),
            frame: payload.into(),
        },
        shim_udp::Action::FlowRequest {
            handle,
            local,
            remote,
            qos,
        } => IpcpEvent::FlowRequest {
            handle,
            local: Box::new(local),
            remote: Box::new(remote),
            qos: Box::new(qos),
        },
        shim_udp::Action::RequestWithdrawn { handle } => IpcpEvent::RequestWithdrawn { handle },
        shim_udp::Action::Allocated { port, max_sdu } => IpcpEvent::Allocated { port, max_sdu },
        shim_udp::Action::AllocateFailed { port, error } => IpcpEvent::AllocateFailed {
            port,
            error: error.into(),
        },
        shim_udp::Action::Deallocated { port } => IpcpEvent::Deallocated { port },
    }
}

fn shim_eth_event(a: shim_eth::Action) -> IpcpEvent {
    match a {
        shim_eth::Action::Transmit { frame } => IpcpEvent::ToMedium {
            peer: None,
            frame: frame.into(),
        },
        shim_eth::Action::FlowRequest {
            handle,
            local,
            remote,
            qos,
        } => IpcpEvent::FlowRequest {
            handle,
            local: Box::new(local),
            remote: Box::new(remote),
            qos: Box::new(qos),
        },
        shim_eth::Action::RequestWithdrawn { handle } => IpcpEvent::RequestWithdrawn { handle },
        shim_eth::Action::Allocated { port, max_sdu } => IpcpEvent::Allocated { port, max_sdu },
        shim_eth::Action::AllocateFailed { port, error } => IpcpEvent::AllocateFailed {
            port,
            error: error.into(),
        },
        shim_eth::Action::Deliver { port, sdu } => IpcpEvent::Deliver {
            port,
            sdu: sdu.into(),
        },
    }
}

fn shim_hv_event(a: shim_hv::Action) -> IpcpEvent {
    match a {
        shim_hv::Action::Transmit { buf } => IpcpEvent::ToMedium {
            peer: None,
            frame: buf.into(),
        },
        shim_hv::Action::FlowRequest {
            handle,
            local,
            remote,
            qos,
        } => IpcpEvent::FlowRequest {
            handle,
            local: Box::new(local),
            remote: Box::new(remote),
            qos: Box::new(qos),
        },
        shim_hv::Action::RequestWithdrawn { handle } => IpcpEvent::RequestWithdrawn { handle },
        shim_hv::Action::Allocated { port, max_sdu } => IpcpEvent::Allocated { port, max_sdu },
        shim_hv::Action::AllocateFailed { port, error } => IpcpEvent::AllocateFailed {
            port,
            error: error.into(),
        },
        shim_hv::Action::Deallocated { port } => IpcpEvent::Deallocated { port },
    }
}

/// The event of a normal IPCP's action.
pub(super) fn normal_event(a: normal::Action) -> IpcpEvent {
    match a {
        normal::Action::Transmit { port, frame } => IpcpEvent::Transmit { port, frame },
        normal::Action::Deliver { flow, sdu } => IpcpEvent::Deliver { port: flow, sdu },
        normal::Action::FlowFailed { flow, .. } => IpcpEvent::FlowFailed { port: flow },
        normal::Action::FlowRequest {
            handle,
            local,
            remote,
            qos,
        } => IpcpEvent::FlowRequest {
            handle,
            local,
            remote,
            qos,
        },
        normal::Action::RequestWithdrawn { handle } => IpcpEvent::RequestWithdrawn { handle },
        normal::Action::Allocated { flow, max_sdu } => IpcpEvent::Allocated {
            port: flow,
            max_sdu,
        },
        normal::Action::AllocateFailed { flow, error } => IpcpEvent::AllocateFailed {
            port: flow,
            error: (*error).into(),
        },
        normal::Action::Deallocated { flow } => IpcpEvent::Deallocated { port: flow },
        normal::Action::Membership(ev) => IpcpEvent::Membership(ev),
        normal::Action::Management { .. } => IpcpEvent::ManagementUnhandled,
        normal::Action::RibRead { handle, result } => IpcpEvent::RibRead { handle, result },
    }
}
