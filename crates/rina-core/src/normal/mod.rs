//! The normal IPC process: the data-transfer half, as a sans-IO machine.
//!
//! It composes the other machines of this crate in the order of seed 000
//! §16.1: an application SDU is cut by [`crate::delimiting`]
//! into fragments that fit a PDU, each fragment is sent by the flow's
//! [`efcp::Connection`] (sequencing, flow control, retransmission), the
//! resulting PDUs get their PCI ([`rina_wire::pci`]), are protected
//! ([`sdup`](crate::sdup): TTL, CRC) and handed to the [`Rmt`], which picks
//! an N-1 port by destination address and QoS-id and queues the frame
//! there. Frames that arrive from N-1 ports go the other way; those for
//! another address are relayed with their TTL decremented.
//!
//! Flows are set up by name with the flow allocator of [`fa`] (names from
//! the directory, QoS cubes from [`cubes`], flow objects created and deleted
//! on the peer with CDAP), which has the API of the shim IPCPs: [`NormalIpcp::register`],
//! [`NormalIpcp::allocate`], [`NormalIpcp::accept`], [`NormalIpcp::refuse`],
//! [`NormalIpcp::deallocate`]. Flows can also be opened with explicit
//! connection endpoints ([`NormalIpcp::open_flow`]). Routes are set in the
//! RMT's forwarding table: set by hand (static routes), or computed by
//! link-state routing ([`crate::routing::LinkState`]) when
//! [`NormalConfig::routing`] is set — see [`routing_glue`]. Names are
//! found in the static directory, or also in a disseminated directory
//! ([`crate::directory::Directory`]) when
//! [`NormalConfig::dynamic_directory`] is set — see [`directory_glue`].
//! Membership (hellos, enrollment, port authentication) is [`membership`];
//! its messages are CDAP objects of the RIB daemon like the others.
//!
//! Management PDUs addressed to this IPCP (or to address 0, a neighbour
//! that does not know it yet) are handled here; others are relayed like
//! data. PDUs this IPCP addresses to itself (flows between two applications
//! registered here) go through an internal loopback.
//!
//! # Management payloads
//!
//! The first byte of a management PDU's payload says what it holds:
//!
//! | byte | meaning | handled by |
//! |------|---------|------------|
//! | `0xC0` ([`CDAP_DISCRIMINATOR`]) | one encoded CDAP message | the RIB daemon ([`mgmt_rib`]): object requests go to the component that registered the object and allows the operation (flow objects under `/fa/flows` to [`fa`], the flow-state objects to [`routing_glue`], the directory forwarding table to [`directory_glue`], the enrollment objects `/difm/enr`, `/difm/ops`, `/dt`, `/difm/nsm/dft` to the enrollment task and the hello `/difm/enr/hello` to neighbour management in [`membership`], port authentication `/difm/auth/port/...` to the security manager, reads of any object under the DIF's access policy); responses to the component that asked, matched in the peer's session by invoke id; `M_CONNECT`/`M_RELEASE` open and close the session with a neighbour (an enrollee's `M_CONNECT` is the enrollment's); before a neighbour is admitted only the enrollment's and port authentication's messages pass, and without an open session only those and hellos; the daemon refuses the rest with a reason |
//! | `0xF6` ([`FRAGMENT_DISCRIMINATOR`]) | a fragment of a CDAP message too large for one PDU | reassembled per port, then handled as above |
//! | anything else | not this machine's (the former channels `0xE0`–`0xE2` of enrollment, hellos and port authentication included) | counted (`rx_mgmt_unknown`) and left to the driver as [`Action::Management`] |
//!
//! `0xF6` is not a channel of its own: it is the transport below CDAP,
//! which cuts a management message larger than a PDU into pieces and puts
//! them back together before anything looks at the message; what a
//! fragment may do (pass before admission, before keys) is decided again
//! on the whole message.
//!
//! The driver feeds frames ([`NormalIpcp::on_frame`]), application
//! requests and writes ([`NormalIpcp::write`]) and timeouts, and carries out
//! the [`Action`]s: write a frame on an N-1 port, deliver an SDU, ask an
//! application about a flow, report an allocation.

pub mod access;
pub mod cubes;
pub mod directory_glue;
pub mod fa;
mod fa_glue;
mod flow_out;
pub mod keepalive;
pub mod membership;
mod membership_glue;
pub mod mgmt_cdap;
pub mod mgmt_rib;
mod protection_glue;
mod rib_remote;
mod rib_view;
pub mod routing_glue;
mod tap;

pub use cubes::QosCube;
pub use membership::{MembershipConfig, MembershipEvent, PortProtection};
pub use mgmt_cdap::CDAP_DISCRIMINATOR;
pub use rib_remote::{
    RibReadError, MAX_READ_BYTES, MAX_READ_OBJECTS, MAX_REMOTE_READS, REMOTE_OWNER,
    RIB_READ_OBJECTS_PER_S,
};
pub use tap::Tapped;

use crate::buf::{self, PduBuf, SduSource};
use crate::delimiting::{self, Reassembler};
use crate::efcp::{self, Connection, EfcpConfig, EfcpError};
use crate::ids::IdMap;
use crate::rmt::{self, Address, QueuedPdu, Rmt, Scheduler};
use crate::routing::{self as ls, LinkState, RoutingError};
use crate::sdu::Sdu;
use crate::sdup::{Sdup, SdupConfig, SdupError};
use crate::time::Instant;
use rina_wire::ctl::FlowCounters;
use rina_wire::pci::{self, Body, ControlBody, DtConstants, Pci, PduType};
use rina_wire::{AppName, QosSpec, WireError};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;
use thiserror::Error;

/// An N-1 port (a flow of the DIF below).
pub type N1Port = rmt::PortId;
/// A flow of this DIF, as the application side knows it (its port-id).
pub type FlowId = u32;
/// A connection-endpoint id.
pub type CepId = u64;

/// Configuration of the data-transfer part of a normal IPCP.
#[derive(Debug, Clone)]
pub struct NormalConfig {
    /// DIF name.
    pub dif: String,
    /// This IPCP's address in the DIF.
    pub address: Address,
    /// The DIF's data-transfer constants (PCI field widths, max PDU size).
    pub dt: DtConstants,
    /// SDU protection of the DIF.
    pub sdup: SdupConfig,
    /// Largest SDU an application may write (SDUs are fragmented to fit PDUs).
    pub max_sdu: usize,
    /// Incomplete SDUs are discarded this long after their first fragment.
    pub reassembly_timeout: Duration,
    /// The QoS cubes of the DIF (ids unique). A flow gets the cube
    /// [`NormalIpcp::choose_cube`] picks for its QoS spec.
    pub cubes: Vec<QosCube>,
    /// Static directory: where each application name is registered (the
    /// address of its IPCP). Names registered at this IPCP need no entry.
    pub directory: BTreeMap<AppName, Address>,
    /// Interval between repetitions of an unanswered flow request.
    pub alloc_retry: Duration,
    /// Time after which an unanswered flow request fails.
    pub alloc_timeout: Duration,
    /// Time an application has to accept or refuse an incoming flow
    /// (default 2 s: less than the default `alloc_timeout`, so that the
    /// requester hears "not answered in time" rather than timing out).
    pub accept_timeout: Duration,
    /// Where the numbering of this IPCP's CEP-ids starts (the first is
    /// the one after it, modulo the CEP-id width). A driver gives a random
    /// one, so that an IPCP started again does not reuse the CEP-ids, and
    /// so the flow objects' names, of flows its peers may still hold from
    /// before; 0 (the default) numbers from 1.
    pub first_cep: u64,
    /// Most flows at once (allocated, opened or being allocated).
    pub max_flows: usize,
    /// Most incoming requests waiting for an application's answer.
    pub max_pending: usize,
    /// Most of them from one source address, so that one member asking
    /// for flows faster than the applications answer cannot take the
    /// room of all the others (default 64, a quarter of `max_pending`).
    pub max_pending_per_source: usize,
    /// Dynamic routing: `None` (the default) leaves the forwarding table to
    /// the driver (static routes through [`NormalIpcp::rmt_mut`]); `Some`
    /// runs a link-state machine that owns the whole forwarding table
    /// (see [`routing_glue`]).
    pub routing: Option<ls::Config>,
    /// Disseminated directory: `None` (the default) resolves names from
    /// local registrations and the static [`NormalConfig::directory`] only;
    /// `Some` also runs a [`crate::directory::Directory`] that floods this
    /// IPCP's registrations to its neighbours and learns theirs (see
    /// [`directory_glue`]).
    pub dynamic_directory: Option<crate::directory::Config>,
    /// Membership: hellos, neighbour liveness and enrollment (see
    /// [`membership`]). `None` (the default) leaves neighbours to the driver
    /// ([`NormalIpcp::neighbor_up`]) and needs a configured address; `Some`
    /// with address 0 enrolls through the first member heard.
    pub membership: Option<MembershipConfig>,
    /// Access policy of the RIB for the DIF's members: the subtrees a
    /// neighbour that is a member may read with CDAP `M_READ` (see
    /// [`NormalIpcp::read_remote_rib`]). Default `["/"]`: all of it; empty:
    /// nothing. Only `/` is the whole RIB: an entry that is not an object
    /// name (`""`, `ra`) covers nothing.
    pub rib_readable: Vec<String>,
    /// ECN marking by this IPCP's RMT (on by default with
    /// [`crate::rmt::DEFAULT_ECN_THRESHOLD`]; `None`: never mark). Flows
    /// with congestion control react to the marks.
    pub ecn: Option<crate::rmt::EcnMarking>,
    /// Which names may register and allocate flows to which (see
    /// [`access`]); default: anything.
    pub access: access::AccessRules,
}

/// Largest SDU a normal IPCP takes by default (delimiting fragments it).
pub const DEFAULT_MAX_SDU: usize = 65_536;

/// Largest PDU of a normal DIF whose configuration does not say (what
/// [`NormalConfig::standard`] sets, and so `rinad`'s `max_pdu` default):
/// room for a 1400-byte SDU and more in one PDU, and small enough to
/// travel in one PDU of a normal DIF below with the same default. A DIF
/// directly over a link whose frames are smaller takes the largest PDU
/// its shim carries ([`NormalConfig::max_pdu_within`]).
pub const DEFAULT_MAX_PDU: u32 = 9000;

impl NormalConfig {
    /// A configuration with defaults for everything but name and address.
    pub fn new(dif: impl Into<String>, address: Address) -> Self {
        NormalConfig {
            dif: dif.into(),
            address,
            dt: DtConstants::default(),
            sdup: SdupConfig::default(),
            max_sdu: DEFAULT_MAX_SDU,
            reassembly_timeout: Duration::from_secs(2),
            cubes: QosCube::defaults(),
            directory: BTreeMap::new(),
            alloc_retry: Duration::from_millis(250),
            alloc_timeout: Duration::from_secs(3),
            accept_timeout: Duration::from_secs(2),
            first_cep: 0,
            max_flows: crate::DEFAULT_MAX_FLOWS,
            max_pending: 256,
            max_pending_per_source: 64,
            routing: None,
            dynamic_directory: None,
            membership: None,
            rib_readable: vec!["/".into()],
            ecn: Some(crate::rmt::EcnMarking::default()),
            access: access::AccessRules::default(),
        }
    }

    /// The configuration a node gives a member of DIF `dif` at `address`
    /// when nothing else is said: [`NormalConfig::new`] with the largest
    /// PDU [`DEFAULT_MAX_PDU`]. `rinad` starts from it for every normal
    /// IPCP of its file, and so does every other composer of systems that
    /// must configure the same stack (the lab's simulator).
    pub fn standard(dif: impl Into<String>, address: Address) -> Self {
        let mut c = NormalConfig::new(dif, address);
        c.dt.max_pdu_size = DEFAULT_MAX_PDU;
        c
    }

    /// The largest PDU size whose frames fit N-1 SDUs of `n1_max_sdu`
    /// bytes with this configuration's SDU protection (TTL, CRC, and the
    /// cipher's overhead if the membership encrypts): what a DIF directly
    /// over a shim with that max SDU can use. The system refuses a larger
    /// one ([`crate::system::SystemError::FrameTooLarge`]).
    pub fn max_pdu_within(&self, n1_max_sdu: usize) -> u32 {
        let aead = if self
            .membership
            .as_ref()
            .is_some_and(|m| m.encryption.is_some())
        {
            crate::sdup::aead::OVERHEAD
        } else {
            0
        };
        let protection = Sdup::without_cipher(self.sdup).overhead() + aead;
        u32::try_from(n1_max_sdu.saturating_sub(protection)).unwrap_or(u32::MAX)
    }

    /// Bytes a PDU carrying one whole SDU costs beyond the SDU in this
    /// DIF's frames: the data-transfer PCI, the delimiter and the SDU
    /// protection (no cipher).
    pub fn sdu_overhead(&self) -> usize {
        pci::header_len(&self.dt, PduType::Dt)
            + crate::delimiting::DELIMITER_LEN
            + Sdup::without_cipher(self.sdup).overhead()
    }

    /// Where the PCI's type byte sits in this DIF's protected frames.
    pub fn frame_layout(&self) -> crate::rmt::FrameLayout {
        let dt = &self.dt;
        let ttl = usize::from(self.sdup.ttl.is_some());
        crate::rmt::FrameLayout {
            type_at: ttl + 1 + 2 * dt.addr.bytes() + dt.qos.bytes() + 2 * dt.cep.bytes(),
            crc: self.sdup.crc,
        }
    }
}

/// Why an operation of the normal IPCP failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NormalError {
    /// The IPCP has no address yet: it is not a member of its DIF (it
    /// enrolls when it hears a member, if membership is configured).
    #[error("not enrolled in the DIF yet (no address)")]
    NotEnrolled,
    /// Encryption is configured without an authentication policy, which
    /// is what agrees its keys.
    #[error("encryption needs an authentication policy (a password or keys)")]
    EncryptionWithoutAuthentication,
    /// No flow with this id.
    #[error("no flow {0}")]
    UnknownFlow(FlowId),
    /// The flow id or connection endpoint is already in use.
    #[error("flow {flow} or CEP-id {cep} already in use")]
    InUse { flow: FlowId, cep: CepId },
    /// The SDU is empty or larger than the DIF's maximum.
    #[error("SDU of {size} bytes: SDUs are 1 to {max} bytes")]
    BadSduSize { size: usize, max: usize },
    /// The SDU's bytes could not be read from where they were (an
    /// application's shared-memory ring, [`SduSource`]).
    #[error("the SDU of {0} bytes could not be read from its source")]
    UnreadableSdu(usize),
    /// Flow control: the flow cannot take this SDU now.
    #[error("flow {0} is blocked by flow control; retry when it is writable")]
    WouldBlock(FlowId),
    /// The flow's EFCP connection failed (retransmissions exhausted).
    #[error("flow {0} has failed: {1}")]
    Failed(FlowId, EfcpError),
    /// The EFCP policy of the flow is unusable.
    #[error("bad EFCP policy: {0}")]
    Policy(EfcpError),
    /// The data-transfer constants are unusable.
    #[error("bad data-transfer constants: {0}")]
    Constants(WireError),
    /// The QoS cubes are unusable (duplicate id, bad EFCP policy).
    #[error("bad QoS cube {id}: {reason}")]
    BadCube { id: u64, reason: String },
    /// No QoS cube of the DIF has this name or id (`have`: those it has).
    #[error("no QoS cube {cube:?} in DIF {dif}; it has {have}")]
    NoCube {
        dif: String,
        cube: String,
        have: String,
    },
    /// The destination application (or its IPCP) refused the flow.
    #[error("flow refused by the peer: {0}")]
    Refused(String),
    /// This member's copy of the DIF's access rules does not let the name
    /// register, or allocate a flow to that destination (nothing was sent).
    #[error("{0}")]
    AccessDenied(String),
    /// The destination IPCP has no application registered under the name.
    #[error("{0} is not registered at its IPCP")]
    NotRegistered(Box<AppName>),
    /// The destination IPCP did not answer the flow request in time.
    #[error("no answer from address {dst} within {after:?}")]
    Timeout { dst: Address, after: Duration },
    /// The name is neither registered here nor in the DIF's directory.
    #[error("{0} is not in the directory of this DIF")]
    NameNotFound(Box<AppName>),
    /// The name is already registered at this IPCP.
    #[error("{0} is already registered at this IPCP")]
    NameInUse(Box<AppName>),
    /// No QoS cube of the DIF serves what the QoS spec asks for.
    #[error("QoS not satisfiable: {0}")]
    QosNotSatisfiable(String),
    /// No pending flow request with this handle (answered or withdrawn).
    #[error("no pending flow request {0}")]
    UnknownRequest(u64),
    /// Too many flows or pending requests, or a request too large.
    #[error("out of resources: {0}")]
    NoResources(String),
    /// No such N-1 port (or it cannot take lanes).
    #[error("no N-1 port {0} that can take lanes")]
    UnknownPort(N1Port),
    /// The routing configuration is unusable.
    #[error("routing: {0}")]
    Routing(RoutingError),
    /// The disseminated directory's configuration is unusable.
    #[error("directory: {0}")]
    Directory(crate::directory::DirectoryError),
    /// No neighbour by this name or address.
    #[error("no neighbour {0}")]
    NoSuchNeighbor(String),
}

/// Something the driver must do.
// Every PDU is moved in one of these several times (queued, polled,
// turned into the system's event): the rare variants box their names,
// QoS and news so that a move is a few words, not a `memcpy` of 280 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Write this frame on N-1 port `port`.
    Transmit { port: N1Port, frame: PduBuf },
    /// Hand this SDU to the application of `flow` (in the buffers it
    /// arrived in: see [`crate::sdu`]).
    Deliver { flow: FlowId, sdu: Sdu },
    /// A management PDU for this IPCP that is neither CDAP (the RIB
    /// daemon's) nor membership's arrived on `port` from `src`.
    Management {
        port: N1Port,
        src: Address,
        payload: Vec<u8>,
    },
    /// Membership news: neighbours, enrollment, admissions.
    Membership(Box<MembershipEvent>),
    /// A flow's connection failed; the flow should be deallocated.
    FlowFailed { flow: FlowId, error: Box<EfcpError> },
    /// Ask the application that registered `local` whether it accepts a flow
    /// from `remote`; answer with [`NormalIpcp::accept`] or
    /// [`NormalIpcp::refuse`].
    FlowRequest {
        handle: u64,
        local: Box<AppName>,
        remote: Box<AppName>,
        qos: Box<QosSpec>,
    },
    /// The application did not answer request `handle` in time (or
    /// unregistered); it was refused on its behalf.
    RequestWithdrawn { handle: u64 },
    /// A flow asked for with [`NormalIpcp::allocate`] now exists on both ends.
    Allocated { flow: FlowId, max_sdu: u32 },
    /// A flow asked for with [`NormalIpcp::allocate`] could not be set up.
    AllocateFailed {
        flow: FlowId,
        error: Box<NormalError>,
    },
    /// The peer deallocated the flow; it is closed here too.
    Deallocated { flow: FlowId },
    /// The outcome of [`NormalIpcp::read_remote_rib`] `handle`: the
    /// neighbour's objects, or why there are none.
    RibRead {
        handle: u64,
        result: Result<Vec<rina_wire::ctl::RibObjectInfo>, RibReadError>,
    },
}

/// IPCP-wide counters of the data path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Frames received from N-1 ports.
    pub rx_frames: u64,
    /// Frames that failed SDU protection (CRC, truncation).
    pub rx_bad_protection: u64,
    /// Frames whose PDU could not be parsed.
    pub rx_malformed: u64,
    /// Frames dropped because their TTL ran out.
    pub rx_ttl_expired: u64,
    /// PDUs for this address but no known connection endpoint.
    pub rx_unknown_cep: u64,
    /// PDUs for a known connection endpoint whose source (address,
    /// CEP-id, QoS cube) is not that connection's peer: a late PDU of a
    /// closed connection whose CEP-id was reused, or a forged one.
    pub rx_wrong_connection: u64,
    /// PDUs relayed to another address.
    pub relayed: u64,
    /// PDUs that could not be routed or queued (see the RMT counters).
    pub tx_dropped: u64,
    /// Frames handed to N-1 ports.
    pub tx_frames: u64,
    /// Fragments the reassembler rejected (malformed delimiter, oversize).
    pub rx_bad_fragments: u64,
    /// Flow-allocator messages that could not be parsed or made no sense.
    pub rx_fa_malformed: u64,
    /// Flow-allocator answers and deallocations for nothing known here.
    pub rx_fa_stale: u64,
    /// Flow requests received.
    pub alloc_requests_in: u64,
    /// Flow requests this IPCP refused (unregistered name, QoS, no room,
    /// application said no or did not answer).
    pub alloc_refused: u64,
    /// Flow requests repeated for lack of an answer.
    pub alloc_retries: u64,
    /// Allocations this IPCP asked for that timed out.
    pub alloc_timeouts: u64,
    /// Requests withdrawn (or flows just accepted closed) because their
    /// requester gave up before the answer reached it.
    pub alloc_cancelled: u64,
    /// Peers' connections told they have no end here (a PDU came for a
    /// CEP-id no flow has, nor had lately): their flows are deallocated.
    pub connections_gone: u64,
    /// Keepalive probes sent (flows of a cube with keepalive that heard
    /// nothing for an interval).
    pub keepalives_sent: u64,
    /// Keepalive probes from peers answered.
    pub keepalives_answered: u64,
    /// Flows failed because nothing came from the peer for
    /// [`keepalive::KEEPALIVE_MISSES`] keepalive intervals.
    pub keepalive_expired: u64,
    /// DEALLOCs repeated for lack of an acknowledgement.
    pub dealloc_retries: u64,
    /// DEALLOCs never acknowledged within `alloc_timeout` (given up).
    pub dealloc_unacked: u64,
    /// PDUs this IPCP addressed to itself (local flows).
    pub loopback: u64,
    /// Management PDUs for this IPCP's own machines (CDAP, routing) that
    /// could not be parsed or made no sense; dropped.
    pub rx_mgmt_malformed: u64,
    /// Neighbours' RIB reads answered (with objects or a refusal).
    pub rib_reads_answered: u64,
    /// Of those, refused because the neighbour read more RIB objects than
    /// it may a second ([`RIB_READ_OBJECTS_PER_S`]).
    pub rib_reads_limited: u64,
    /// Management messages for a machine that does not run here (routing
    /// or the directory off, or not started before enrollment); dropped.
    pub rx_mgmt_unhandled: u64,
    /// Management payloads that are neither CDAP nor a fragment (an
    /// unknown first byte, such as the channels 0xE0–0xE2 that enrollment,
    /// hellos and port authentication once had): no machine here takes
    /// them; they go to the driver as [`Action::Management`].
    pub rx_mgmt_unknown: u64,
}

impl Counters {
    /// The counters by name, for listings.
    pub fn to_map(&self) -> BTreeMap<String, u64> {
        [
            ("rx_frames", self.rx_frames),
            ("rx_bad_protection", self.rx_bad_protection),
            ("rx_malformed", self.rx_malformed),
            ("rx_ttl_expired", self.rx_ttl_expired),
            ("rx_unknown_cep", self.rx_unknown_cep),
            ("rx_wrong_connection", self.rx_wrong_connection),
            ("relayed", self.relayed),
            ("tx_dropped", self.tx_dropped),
            ("tx_frames", self.tx_frames),
            ("rx_bad_fragments", self.rx_bad_fragments),
            ("rx_fa_malformed", self.rx_fa_malformed),
            ("rx_fa_stale", self.rx_fa_stale),
            ("alloc_requests_in", self.alloc_requests_in),
            ("alloc_refused", self.alloc_refused),
            ("alloc_retries", self.alloc_retries),
            ("alloc_timeouts", self.alloc_timeouts),
            ("alloc_cancelled", self.alloc_cancelled),
            ("connections_gone", self.connections_gone),
            ("keepalives_sent", self.keepalives_sent),
            ("keepalives_answered", self.keepalives_answered),
            ("keepalive_expired", self.keepalive_expired),
            ("dealloc_retries", self.dealloc_retries),
            ("dealloc_unacked", self.dealloc_unacked),
            ("loopback", self.loopback),
            ("rx_mgmt_malformed", self.rx_mgmt_malformed),
            ("rib_reads_answered", self.rib_reads_answered),
            ("rib_reads_limited", self.rib_reads_limited),
            ("rx_mgmt_unhandled", self.rx_mgmt_unhandled),
            ("rx_mgmt_unknown", self.rx_mgmt_unknown),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// Where a flow's connection goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// This end's CEP-id.
    pub local_cep: CepId,
    /// The peer IPCP's address.
    pub remote_addr: Address,
    /// The peer's CEP-id.
    pub remote_cep: CepId,
    /// QoS-id of the connection (names the QoS cube).
    pub qos_id: u64,
}

/// Where a received PDU's body is ([`NormalIpcp::parse_pdu`]).
enum ParsedBody {
    /// A data or management PDU: its payload is these bytes of the PDU.
    Data(std::ops::Range<usize>),
    /// A control PDU, decoded.
    Control(ControlBody),
}

/// One flow: its connection and reassembly state.
#[derive(Debug)]
struct Flow {
    ep: Endpoint,
    efcp: Connection,
    reasm: Reassembler,
    counters: FlowCounters,
    /// PDUs per SDU delivered but not yet consumed (manual consumption only).
    unconsumed: VecDeque<usize>,
    /// Fragments delivered by EFCP since the last complete SDU.
    fragments: usize,
    auto_consume: bool,
    failure_reported: bool,
    hash: u64,
    /// The port its PDUs last took, while the forwarding table stays the same.
    route: rmt::RouteMemo,
    /// A data PDU with the ECN flag arrived since the driver last asked
    /// ([`NormalIpcp::take_congested`]).
    ecn_seen: bool,
    /// When this flow's timers next need to run, as filed in
    /// [`NormalIpcp`]'s `timers` (kept equal by `rearm`).
    armed: Option<Instant>,
    /// A PDU of this flow arrived since its keepalive last looked.
    heard: bool,
    /// Its keepalive, when its cube has one.
    ka: Option<keepalive::Keepalive>,
}

impl Flow {
    /// Whether a PDU addressed to this flow's CEP-id comes from its peer:
    /// a connection is named by both ends and the QoS cube, not by the
    /// destination CEP-id alone.
    fn is_peer(&self, pci: &Pci) -> bool {
        pci.src_addr == self.ep.remote_addr
            && pci.src_cep == self.ep.remote_cep
            && pci.qos_id == self.ep.qos_id
    }
}

/// The fragments of an SDU on their way into EFCP: most SDUs are one, kept
/// out of a `Vec`.
enum Pieces {
    One(PduBuf),
    Many(Vec<PduBuf>),
}

/// QoS-id of management PDUs (forwarding entries for it, or for any QoS-id,
/// must exist for them to be routed).
pub const MGMT_QOS_ID: u64 = 1;

/// First byte of a management payload that is one fragment of a larger
/// management message ([`crate::mgmt_frag`] header and data follow).
pub const FRAGMENT_DISCRIMINATOR: u8 = 0xF6;

/// Largest management message reassembled (a flow-state database or a
/// directory of a large DIF fits).
pub const MAX_MGMT_MESSAGE: usize = 4 << 20;

/// PDUs one port hands down per drain of the RMT.
pub const TX_BURST: usize = 256;

/// Longest a flow closed by its application waits for what was written to
/// it to be sent and acknowledged before it is deallocated anyway
/// ([`NormalIpcp::close_when_sent`]).
pub const LINGER_MAX: Duration = Duration::from_secs(30);

/// The data-transfer machine of a normal IPCP.
#[derive(Debug)]
pub struct NormalIpcp {
    cfg: NormalConfig,
    sdup: Sdup,
    rmt: Rmt,
    /// Some port reached [`TX_BURST`] with more to send: more is due at
    /// once, after the driver had its turn.
    rmt_more: bool,
    /// The N-1 ports, gathered again on each drain of the RMT (kept to
    /// spare an allocation per drain).
    ports_scratch: Vec<N1Port>,
    /// Frames the RMT passed straight through during a flow's flush
    /// ([`rmt::Rmt::send_through`]), transmitted right after it.
    through: Vec<(N1Port, PduBuf)>,
    /// Boxed: the table's spare room costs a pointer per slot, not a flow.
    flows: IdMap<FlowId, Box<Flow>>,
    by_cep: IdMap<CepId, FlowId>,
    /// The entry of `by_cep` the last PDU for a flow was found by: a
    /// flow's PDUs come in runs, and the next one of the run finds its
    /// flow without a lookup. Cleared when a flow closes.
    last_cep: Option<(CepId, FlowId)>,
    /// CEP-ids of flows closed lately (their late PDUs are not answered).
    closed_ceps: fa::ClosedCeps,
    /// Flows whose EFCP may have PDUs to send, in no order and maybe more
    /// than once (a flow written to again at once is not pushed again);
    /// [`NormalIpcp::flush`] takes them in order of id, each once. A `Vec`
    /// rather than an ordered set: it is pushed to and drained for every
    /// PDU, and a set's insert and removal were a tenth of the IPCP's work.
    dirty: Vec<FlowId>,
    /// The dirty flows being flushed (kept to spare an allocation per flush).
    dirty_scratch: Vec<FlowId>,
    /// Flows the peer deallocated before their last data PDU (the
    /// sequence number here) came, closed when it has or at the deadline.
    closing: BTreeMap<FlowId, (u64, Instant)>,
    /// Flows their application closed with data still to send or to be
    /// acknowledged: deallocated when it is, or at the deadline.
    lingering: BTreeMap<FlowId, Instant>,
    /// With [`NormalIpcp::set_batched_flush`]: an SDU written or a frame
    /// received asks for the flush, which the next [`NormalIpcp::poll_action`]
    /// runs, once for all of them.
    batched_flush: bool,
    /// How many flows have `ecn_seen` set: while none has, a driver's
    /// [`NormalIpcp::take_congested`] after every delivery looks up no flow.
    ecn_flows: usize,
    /// A flush was asked for and has not run yet.
    flush_due: bool,
    /// Every flow with a timer running, by when it is due: the next one is
    /// found without walking the flows (idle flows cost nothing per turn).
    timers: BTreeSet<(Instant, FlowId)>,
    actions: VecDeque<Action>,
    counters: Counters,
    /// Largest fragment payload (delimiter included) that fits a DT PDU.
    frag_budget: usize,
    /// Bytes of a DT or MGMT PCI with this DIF's widths.
    data_header: usize,
    /// Reads the PCI of the DT and MGMT PDUs received, its way decided
    /// once from this DIF's widths.
    data_parser: pci::DataParser,
    /// The flow allocator.
    fa: fa::FlowAllocator,
    /// PDUs (PCI and payload, unprotected) this IPCP sent to itself.
    loopback: VecDeque<Vec<u8>>,
    /// Membership (hellos, liveness, enrollment), when configured.
    mship: Option<Box<membership::MembershipMachine>>,
    /// Splits management messages too large for one PDU.
    mgmt_frag: crate::mgmt_frag::Fragmenter,
    /// Puts them back together.
    mgmt_reasm: crate::mgmt_frag::Reassembler,
    /// The latest time any call was given (for calls that take none).
    now: Instant,
    /// Neighbours by N-1 port (address, cost), as the driver announced them.
    neighbors: BTreeMap<N1Port, (Address, u32)>,
    /// The link-state routing machine, when routing is configured.
    routing: Option<LinkState>,
    /// The disseminated directory, when configured.
    dft: Option<crate::directory::Directory>,
    /// Copies of the N-1 frames for a capture, when one is on.
    tap: Option<Box<tap::Tap>>,
    /// Reads of neighbours' RIBs under way.
    rib_reads: rib_remote::RemoteReads,
    /// The RIB daemon: every CDAP message in and out, per-peer sessions.
    mgmt: mgmt_rib::MgmtRib,
}

impl NormalIpcp {
    /// A normal IPCP with no N-1 ports and no flows.
    pub fn new(cfg: NormalConfig, sched: Box<dyn Scheduler>) -> Result<Self, NormalError> {
        cfg.dt.validate().map_err(NormalError::Constants)?;
        let mut ids = BTreeSet::new();
        for c in &cfg.cubes {
            let bad = |reason: String| NormalError::BadCube { id: c.id, reason };
            if !ids.insert(c.id) {
                return Err(bad("the id is used twice".into()));
            }
            if c.id > cfg.dt.qos.max_value() {
                return Err(bad(format!(
                    "the id does not fit the {}-byte QoS-id field",
                    cfg.dt.qos.bytes()
                )));
            }
            c.efcp.validate().map_err(|e| bad(e.to_string()))?;
            c.efcp
                .check_seq_width(seq_bits(&cfg.dt))
                .map_err(|e| bad(e.to_string()))?;
            if let Some(k) = c.keepalive {
                keepalive::check_interval(k).map_err(bad)?;
            }
        }
        let data_header = pci::header_len(&cfg.dt, PduType::Dt);
        let frag_budget = cfg.dt.max_pdu_size as usize - data_header;
        if cfg.address == 0 && cfg.membership.is_none() {
            return Err(NormalError::NotEnrolled);
        }
        if cfg
            .membership
            .as_ref()
            .is_some_and(|m| m.encryption.is_some() && !m.authenticates())
        {
            return Err(NormalError::EncryptionWithoutAuthentication);
        }
        // Without an address yet, routing and the directory start at
        // enrollment.
        let routing = match &cfg.routing {
            Some(_) if cfg.address == 0 => None,
            Some(rc) => {
                Some(LinkState::new(cfg.address, rc.clone()).map_err(NormalError::Routing)?)
            }
            None => None,
        };
        let dft = match &cfg.dynamic_directory {
            Some(_) if cfg.address == 0 => None,
            Some(dc) => Some(
                crate::directory::Directory::new(cfg.address, dc.clone())
                    .map_err(NormalError::Directory)?,
            ),
            None => None,
        };
        let mut ipcp = NormalIpcp {
            mship: cfg
                .membership
                .clone()
                .map(|m| Box::new(membership::MembershipMachine::new(m, cfg.address != 0))),
            mgmt_frag: crate::mgmt_frag::Fragmenter::new(),
            rmt_more: false,
            ports_scratch: Vec::new(),
            through: Vec::new(),
            mgmt_reasm: crate::mgmt_frag::Reassembler::new(
                MAX_MGMT_MESSAGE,
                Duration::from_secs(5),
                64,
            ),
            neighbors: BTreeMap::new(),
            routing,
            dft,
            tap: None,
            rib_reads: rib_remote::RemoteReads::default(),
            mgmt: mgmt_rib::MgmtRib::new(),
            sdup: Sdup::without_cipher(cfg.sdup),
            rmt: {
                let mut rmt = Rmt::new(sched);
                rmt.set_ecn(cfg.ecn.clone().map(|m| (m, cfg.frame_layout())));
                rmt
            },
            flows: IdMap::default(),
            by_cep: IdMap::default(),
            last_cep: None,
            closed_ceps: fa::ClosedCeps::default(),
            dirty: Vec::new(),
            dirty_scratch: Vec::new(),
            closing: BTreeMap::new(),
            lingering: BTreeMap::new(),
            batched_flush: false,
            ecn_flows: 0,
            flush_due: false,
            timers: BTreeSet::new(),
            actions: VecDeque::new(),
            counters: Counters::default(),
            frag_budget,
            data_header,
            data_parser: pci::DataParser::new(&cfg.dt),
            fa: fa::FlowAllocator::new(cfg.first_cep % cfg.dt.cep.max_value()),
            loopback: VecDeque::new(),
            now: Instant::ZERO,
            cfg,
        };
        // Members that say hello open a session with each neighbour.
        ipcp.mgmt.set_require_sessions(ipcp.mship.is_some());
        ipcp.register_mgmt_entity(Instant::ZERO);
        Ok(ipcp)
    }

    /// The RIB daemon: who owns which objects, the sessions with peers.
    pub fn rib_daemon(&self) -> &mgmt_rib::MgmtRib {
        &self.mgmt
    }

    /// The configuration.
    pub fn config(&self) -> &NormalConfig {
        &self.cfg
    }

    /// Changes the EFCP policies of QoS cube `cube` (its name or QoS-id)
    /// by `tuning`, range-checked and validated before anything changes.
    /// Flows allocated from now on use them; flows that exist keep theirs.
    /// Returns the cube as it is now.
    pub fn set_cube_efcp(
        &mut self,
        cube: &str,
        tuning: &crate::efcp::EfcpTuning,
    ) -> Result<&cubes::QosCube, NormalError> {
        let k = self
            .cfg
            .cubes
            .iter()
            .position(|c| c.name == cube || c.id.to_string() == cube)
            .ok_or_else(|| NormalError::NoCube {
                dif: self.cfg.dif.clone(),
                cube: cube.to_string(),
                have: self
                    .cfg
                    .cubes
                    .iter()
                    .map(|c| format!("{} ({})", c.name, c.id))
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let mut efcp = self.cfg.cubes[k].efcp.clone();
        let unused = tuning.inapplicable(&efcp);
        if !unused.is_empty() {
            return Err(NormalError::BadCube {
                id: self.cfg.cubes[k].id,
                reason: format!(
                    "QoS cube {} has no {} for {} to tune",
                    self.cfg.cubes[k].name,
                    if efcp.dtcp.is_none() {
                        "DTCP (retransmission, flow or congestion control)"
                    } else {
                        "retransmission or window flow control"
                    },
                    unused.join(", ")
                ),
            });
        }
        tuning
            .apply(&mut efcp)
            .and_then(|()| efcp.check_seq_width(seq_bits(&self.cfg.dt)))
            .map_err(|e| NormalError::BadCube {
                id: self.cfg.cubes[k].id,
                reason: e.to_string(),
            })?;
        self.cfg.cubes[k].efcp = efcp;
        Ok(&self.cfg.cubes[k])
    }

    /// Replaces the EFCP policies of QoS cube `id` by `efcp`, validated
    /// first (a configuration file read again). Flows allocated from now
    /// on use them.
    pub fn replace_cube_efcp(
        &mut self,
        id: u64,
        efcp: crate::efcp::EfcpConfig,
    ) -> Result<(), NormalError> {
        let bad = |reason: String| NormalError::BadCube { id, reason };
        efcp.validate()
            .and_then(|()| efcp.check_seq_width(seq_bits(&self.cfg.dt)))
            .map_err(|e| bad(e.to_string()))?;
        let c = self
            .cfg
            .cubes
            .iter_mut()
            .find(|c| c.id == id)
            .ok_or_else(|| bad("no such cube".into()))?;
        c.efcp = efcp;
        Ok(())
    }

    /// The configuration, to change it in unit tests.
    #[cfg(test)]
    pub(crate) fn config_mut_for_tests(&mut self) -> &mut NormalConfig {
        &mut self.cfg
    }

    /// Data-path counters.
    pub fn counters(&self) -> Counters {
        let mut c = self.counters;
        self.fa.counters().write_into(&mut c);
        c
    }

    /// The RMT (forwarding table, queues, scheduler).
    pub fn rmt(&self) -> &Rmt {
        &self.rmt
    }

    /// The RMT, to change routes or the scheduling policy.
    pub fn rmt_mut(&mut self) -> &mut Rmt {
        &mut self.rmt
    }

    /// Largest frame this IPCP writes on an N-1 port: the N-1 flows must
    /// carry SDUs at least this large.
    pub fn max_frame(&self) -> usize {
        let aead = if self.encrypting() {
            crate::sdup::aead::OVERHEAD
        } else {
            0
        };
        self.cfg.dt.max_pdu_size as usize + self.sdup.overhead() + aead
    }

    /// Adds an N-1 port.
    pub fn add_port(&mut self, port: N1Port) {
        let new = !self.rmt.ports().any(|p| p == port);
        self.rmt.add_port(port);
        if new {
            let now = self.now;
            self.membership_port_added(now, port);
        }
    }

    /// Removes an N-1 port with its queue and routes. A neighbour still
    /// announced on it is taken down first (as by
    /// [`NormalIpcp::neighbor_down`] at the latest time seen).
    pub fn remove_port(&mut self, port: N1Port) {
        let now = self.now;
        self.release_session(now, port);
        if self.neighbors.contains_key(&port) {
            self.neighbor_down(now, port);
        }
        self.membership_port_removed(port);
        self.mgmt_reasm.drop_port(port);
        self.mgmt.close(mgmt_rib::Peer::Neighbor(port));
        self.rmt.remove_port(port);
    }

    /// Adds N-1 port `lane` as a lane of `primary` (see [`rmt::Lane`]): a
    /// second N-1 flow to the same neighbour, over another QoS cube of the
    /// DIF below, that carries the data PDUs of the QoS-ids `carries` (own
    /// and relayed). Membership, routing and management only use the
    /// primary; frames that arrive on the lane count as arriving on it.
    /// When the lane goes ([`NormalIpcp::remove_port`]) its QoS-ids go on
    /// the primary again; when the primary goes, its lanes become plain
    /// ports the driver should remove too.
    pub fn add_lane(
        &mut self,
        primary: N1Port,
        lane: N1Port,
        carries: BTreeSet<u64>,
    ) -> Result<(), NormalError> {
        self.rmt
            .add_lane(primary, lane, carries)
            .map_err(|_| NormalError::UnknownPort(primary))
    }

    /// Paces N-1 port `port` at the capacity of the medium under it (or
    /// stops pacing it): PDUs then wait in the RMT's queues, where the
    /// scheduling policy orders and drops them, instead of below.
    pub fn set_port_rate(&mut self, port: N1Port, rate: Option<rmt::PortRate>) {
        self.rmt.set_port_rate(port, rate);
    }

    /// Blocks N-1 port `port` while the layer below cannot take more, or
    /// unblocks it and sends what waited.
    pub fn set_port_blocked(&mut self, now: Instant, port: N1Port, blocked: bool) {
        self.tick(now);
        self.rmt.set_port_blocked(port, blocked);
        if !blocked {
            self.drain_rmt(now);
        }
    }

    /// Records the cube of the DIF below that N-1 port `port` was allocated
    /// with (for listings: `/rmt/n1flows`).
    pub fn set_lower_cube(&mut self, port: N1Port, cube: Option<rmt::LowerCube>) {
        self.rmt.set_lower_cube(port, cube);
    }

    /// Opens flow `flow` as EFCP connection `ep` with `policy`.
    pub fn open_flow(
        &mut self,
        now: Instant,
        flow: FlowId,
        ep: Endpoint,
        policy: EfcpConfig,
    ) -> Result<(), NormalError> {
        self.tick(now);
        if self.flows.contains_key(&flow)
            || self.by_cep.contains_key(&ep.local_cep)
            || self.fa.is_reserved(flow, ep.local_cep)
        {
            return Err(NormalError::InUse {
                flow,
                cep: ep.local_cep,
            });
        }
        policy
            .check_seq_width(seq_bits(&self.cfg.dt))
            .map_err(|e| NormalError::Policy(e.into()))?;
        let efcp = Connection::new(policy, now).map_err(NormalError::Policy)?;
        let ka = self
            .cfg
            .cubes
            .iter()
            .find(|c| c.id == ep.qos_id)
            .and_then(|c| c.keepalive)
            .map(|i| keepalive::Keepalive::new(now, i));
        let hash = mix(&[
            self.cfg.address,
            ep.local_cep,
            ep.remote_addr,
            ep.remote_cep,
        ]);
        self.by_cep.insert(ep.local_cep, flow);
        self.closed_ceps.reused(ep.local_cep);
        self.flows.insert(
            flow,
            Box::new(Flow {
                ep,
                efcp,
                reasm: Reassembler::new(self.cfg.max_sdu, self.cfg.reassembly_timeout),
                counters: FlowCounters::default(),
                unconsumed: VecDeque::new(),
                fragments: 0,
                auto_consume: true,
                failure_reported: false,
                route: rmt::RouteMemo::default(),
                ecn_seen: false,
                hash,
                armed: None,
                heard: false,
                ka,
            }),
        );
        self.rearm(flow);
        Ok(())
    }

    /// Files flow `id` in the timer index no later than when its EFCP or
    /// its reassembly next needs time, after anything that may have
    /// changed that.
    fn rearm(&mut self, id: FlowId) {
        let Some(f) = self.flows.get_mut(&id) else {
            return;
        };
        let due = [
            f.efcp.poll_timeout(),
            f.reasm.poll_timeout(),
            f.ka.as_ref().map(|k| k.due()),
        ]
        .into_iter()
        .flatten()
        .min();
        // A timer armed no later than the flow's next deadline stays: when
        // it fires early, `handle_timeout` finds nothing due and the flow is
        // armed again. Busy flows push their inactivity deadline on with
        // every PDU, and the index is not touched for that.
        if f.armed.is_some_and(|a| due.is_none_or(|d| a <= d)) {
            return;
        }
        if let Some(t) = f.armed {
            self.timers.remove(&(t, id));
        }
        if let Some(t) = due {
            self.timers.insert((t, id));
        }
        f.armed = due;
    }

    /// Closes a flow; anything it still had to send is discarded.
    pub fn close_flow(&mut self, flow: FlowId) -> Result<(), NormalError> {
        let f = self
            .flows
            .remove(&flow)
            .ok_or(NormalError::UnknownFlow(flow))?;
        self.ecn_flows -= usize::from(f.ecn_seen);
        self.by_cep.remove(&f.ep.local_cep);
        self.last_cep = None;
        self.closed_ceps.closed(f.ep.local_cep);
        self.closing.remove(&flow);
        self.lingering.remove(&flow);
        // Left in `dirty` if it is there: flushing a flow that is gone does nothing.
        if let Some(t) = f.armed {
            self.timers.remove(&(t, flow));
        }
        self.fa
            .forget_accepted(f.ep.remote_addr, f.ep.remote_cep, flow);
        Ok(())
    }

    /// Chooses whether delivered SDUs count as consumed at once (the
    /// default) or only when [`NormalIpcp::consume`] says so — for a driver
    /// whose application reads at its own pace under window flow control.
    pub fn set_auto_consume(&mut self, flow: FlowId, auto: bool) -> Result<(), NormalError> {
        let f = self
            .flows
            .get_mut(&flow)
            .ok_or(NormalError::UnknownFlow(flow))?;
        f.auto_consume = auto;
        Ok(())
    }

    /// The application consumed `sdus` delivered SDUs of `flow`.
    pub fn consume(&mut self, now: Instant, flow: FlowId, sdus: usize) -> Result<(), NormalError> {
        let f = self
            .flows
            .get_mut(&flow)
            .ok_or(NormalError::UnknownFlow(flow))?;
        let mut pdus = 0;
        for _ in 0..sdus {
            match f.unconsumed.pop_front() {
                Some(n) => pdus += n,
                None => break,
            }
        }
        f.efcp.consumed(now, pdus);
        mark_dirty(&mut self.dirty, flow);
        self.flush(now);
        Ok(())
    }

    /// Gives back the spare room of the flow tables (after many flows
    /// closed).
    pub fn shrink_to_fit(&mut self) {
        self.flows.shrink_to_fit();
        self.by_cep.shrink_to_fit();
    }

    /// The flows, with their endpoints.
    pub fn flows(&self) -> impl Iterator<Item = (FlowId, Endpoint)> + '_ {
        self.flows.iter().map(|(id, f)| (*id, f.ep))
    }

    /// SDU counters of a flow.
    pub fn flow_counters(&self, flow: FlowId) -> Option<&FlowCounters> {
        self.flows.get(&flow).map(|f| &f.counters)
    }

    /// Whether `flow` has window flow control: the SDUs delivered and not
    /// yet consumed ([`NormalIpcp::consume`]) are then bounded by its
    /// receiver buffer, since the sender gets no credit for more and
    /// PDUs beyond the window are dropped on arrival.
    pub fn flow_windowed(&self, flow: FlowId) -> bool {
        self.flows
            .get(&flow)
            .is_some_and(|f| f.efcp.config().window().is_some())
    }

    /// EFCP statistics of a flow.
    pub fn flow_stats(&self, flow: FlowId) -> Option<&efcp::Stats> {
        self.flows.get(&flow).map(|f| f.efcp.stats())
    }

    /// Reassembly counters of a flow.
    pub fn reassembly_counters(&self, flow: FlowId) -> Option<&delimiting::Counters> {
        self.flows.get(&flow).map(|f| f.reasm.counters())
    }

    /// Whether `flow` can take an SDU of `len` bytes now.
    pub fn can_write(&self, flow: FlowId, len: usize) -> bool {
        self.flows.get(&flow).is_some_and(|f| {
            let n = delimiting::fragment_count(len, self.frag_budget);
            f.efcp.can_write() && f.efcp.write_capacity() >= n
        })
    }

    /// Sends an application SDU on `flow`. The SDU is taken whole or not at
    /// all: [`NormalError::WouldBlock`] leaves nothing half-sent. Its bytes
    /// are copied once, into buffers with room for every header below.
    pub fn write(&mut self, now: Instant, flow: FlowId, sdu: &[u8]) -> Result<(), NormalError> {
        self.write_sdu(now, flow, Outgoing::Borrowed(sdu))
    }

    /// [`NormalIpcp::write`] of an SDU already in a buffer of its own (a
    /// frame of a DIF above): an SDU that fits one PDU goes down in that
    /// buffer, its delimiter and PCI written in the room in front.
    pub fn write_buf(
        &mut self,
        now: Instant,
        flow: FlowId,
        sdu: PduBuf,
    ) -> Result<(), NormalError> {
        self.write_sdu(now, flow, Outgoing::Owned(sdu))
    }

    /// [`NormalIpcp::write`] of an SDU read from `src` (an application's
    /// shared-memory ring): each fragment is copied from it straight into
    /// its PDU's buffer.
    pub fn write_from(
        &mut self,
        now: Instant,
        flow: FlowId,
        src: &dyn SduSource,
    ) -> Result<(), NormalError> {
        self.write_sdu(now, flow, Outgoing::Source(src))
    }

    fn write_sdu(
        &mut self,
        now: Instant,
        flow: FlowId,
        sdu: Outgoing<'_>,
    ) -> Result<(), NormalError> {
        self.tick(now);
        let (flows, mut out) = self.split_out();
        // (`let else` rather than `ok_or`: an error built for nothing is
        // dropped for nothing, on every PDU.)
        let Some(f) = flows.get_mut(&flow) else {
            return Err(NormalError::UnknownFlow(flow));
        };
        if out.write_sdu(now, flow, f, sdu)? {
            mark_dirty(&mut self.dirty, flow);
        }
        self.flush_or_defer(now);
        Ok(())
    }

    /// [`NormalIpcp::write_buf`] of each of `frames` in turn, all on
    /// `flow`, which is looked up once: the frames a DIF above sends in a
    /// row on one N-1 flow cross together. Returns how many were refused,
    /// each as [`NormalIpcp::write_buf`] would have refused it with
    /// batched flushes (all of them if there is no such flow; without
    /// batched flushes, the queue is flushed once at the end rather than
    /// after each frame, so a flow with DTCP may refuse frames that one at
    /// a time would have fitted); `frames` is left empty.
    pub fn write_bufs(&mut self, now: Instant, flow: FlowId, frames: &mut Vec<PduBuf>) -> usize {
        self.tick(now);
        let (flows, mut out) = self.split_out();
        let Some(f) = flows.get_mut(&flow) else {
            let refused = frames.len();
            frames.clear();
            return refused;
        };
        let (mut refused, mut queued) = (0, false);
        for b in frames.drain(..) {
            match out.write_sdu(now, flow, f, Outgoing::Owned(b)) {
                Ok(q) => queued |= q,
                Err(_) => refused += 1,
            }
        }
        if queued {
            mark_dirty(&mut self.dirty, flow);
        }
        self.flush_or_defer(now);
        refused
    }

    /// Remembers the latest time seen, for the calls that take none.
    fn tick(&mut self, now: Instant) {
        self.now = self.now.max(now);
    }

    /// Queues a management PDU for the IPCP at address `dst`, routed by the
    /// RMT like data (and relayed by the IPCPs on the way). A PDU for this
    /// IPCP's own address goes through the loopback. A PDU that has no
    /// route, does not fit or finds its queue full is dropped and counted in
    /// `tx_dropped`: management PDUs are unreliable.
    pub fn send_management_to(&mut self, now: Instant, dst: Address, payload: &[u8]) {
        self.tick(now);
        let mut pci = Pci::new(PduType::Mgmt);
        pci.src_addr = self.cfg.address;
        pci.dst_addr = dst;
        pci.qos_id = MGMT_QOS_ID;
        let mut frame = PduBuf::empty(buf::HEADROOM, payload.len() + 64);
        if pci::encode_data(&self.cfg.dt, &pci, payload, frame.parts_mut().0).is_err() {
            self.counters.tx_dropped += 1;
            return;
        }
        if dst == self.cfg.address {
            self.loopback.push_back(frame.into_vec());
            return;
        }
        let ttl = self.sdup.initial_ttl().unwrap_or(0);
        self.sdup.protect_buf(&mut frame, ttl);
        let q = QueuedPdu {
            qos_id: MGMT_QOS_ID,
            mgmt: true,
            bytes: frame,
        };
        let hash = mix(&[self.cfg.address, dst]);
        if self.rmt.send(now, dst, hash, q).is_err() {
            self.counters.tx_dropped += 1;
        }
        self.drain_rmt(now);
    }

    /// Queues a management PDU for the neighbour on `port`. A payload too
    /// large for one PDU is cut into fragments ([`crate::mgmt_frag`]), each
    /// sent as a management PDU whose payload starts with
    /// [`FRAGMENT_DISCRIMINATOR`], and put back together by the neighbour.
    pub fn send_management(&mut self, now: Instant, port: N1Port, dst: Address, payload: &[u8]) {
        self.tick(now);
        if payload.len() > self.frag_budget {
            match self.mgmt_frag.fragment(payload, self.frag_budget - 1) {
                Ok(frags) => {
                    for f in frags {
                        let mut p = Vec::with_capacity(f.len() + 1);
                        p.push(FRAGMENT_DISCRIMINATOR);
                        p.extend_from_slice(&f);
                        self.send_management_pdu(now, port, dst, &p);
                    }
                }
                Err(_) => self.counters.tx_dropped += 1,
            }
            return;
        }
        self.send_management_pdu(now, port, dst, payload);
    }

    fn send_management_pdu(&mut self, now: Instant, port: N1Port, dst: Address, payload: &[u8]) {
        let mut pci = Pci::new(PduType::Mgmt);
        pci.src_addr = self.cfg.address;
        pci.dst_addr = dst;
        pci.qos_id = MGMT_QOS_ID;
        let mut frame = PduBuf::empty(buf::HEADROOM, payload.len() + 64);
        if pci::encode_data(&self.cfg.dt, &pci, payload, frame.parts_mut().0).is_err() {
            self.counters.tx_dropped += 1;
            return;
        }
        let ttl = self.sdup.initial_ttl().unwrap_or(0);
        self.sdup.protect_buf(&mut frame, ttl);
        let q = QueuedPdu {
            qos_id: MGMT_QOS_ID,
            mgmt: true,
            bytes: frame,
        };
        if self.rmt.send_on(now, port, q).is_err() {
            self.counters.tx_dropped += 1;
        }
        self.drain_rmt(now);
    }

    /// Processes a frame that arrived on N-1 port `port` (copied once, out
    /// of the driver's receive buffer; [`NormalIpcp::on_frame_buf`] takes
    /// a buffer of its own).
    pub fn on_frame(&mut self, now: Instant, port: N1Port, frame: &[u8]) {
        self.on_frame_marked(now, port, frame, false);
    }

    /// Whether a data PDU of `flow` arrived with the ECN flag since the
    /// last call: a driver that hands this flow's SDUs to an IPCP stacked
    /// on it passes that on ([`NormalIpcp::on_frame_buf`]), so that
    /// congestion in this DIF reaches the flows of the DIF above.
    pub fn take_congested(&mut self, flow: FlowId) -> bool {
        if self.ecn_flows == 0 {
            return false;
        }
        let seen = self
            .flows
            .get_mut(&flow)
            .is_some_and(|f| std::mem::take(&mut f.ecn_seen));
        self.ecn_flows -= usize::from(seen);
        seen
    }

    /// [`NormalIpcp::on_frame`] for a frame that crossed congestion in the
    /// DIF below (`congested`): a data PDU in it is taken, or relayed, as
    /// if an RMT of this DIF had set its ECN flag.
    pub fn on_frame_marked(&mut self, now: Instant, port: N1Port, frame: &[u8], congested: bool) {
        // Room in front for the headers below, should the PDU be relayed.
        let frame = PduBuf::with_room(buf::HEADROOM, frame, buf::TAILROOM);
        self.on_frame_buf(now, port, frame, congested);
    }

    /// How much of `frame` (opened, still SDU-protected) is the protected
    /// PDU: a link pads a short frame (Ethernet to 60 bytes), and the
    /// padding would stand where SDU protection looks for the CRC, at the
    /// end. Where the PDU is in clear before the CRC, its length field
    /// says where it ends; otherwise (no CRC, or a cipher) the whole frame.
    pub(super) fn unpadded_len(&self, frame: &[u8]) -> usize {
        let whole = frame.len();
        let Some(at) = self.sdup.clear_pdu_before_crc() else {
            return whole;
        };
        let pdu = frame.get(at..).unwrap_or_default();
        match self.cfg.dt.pdu_length(pdu) {
            Some(len) => usize::try_from(len)
                .ok()
                .and_then(|l| l.checked_add(at + crate::sdup::CRC_LEN))
                .map_or(whole, |end| end.min(whole)),
            None => whole,
        }
    }

    /// [`NormalIpcp::on_frame_marked`] for a frame in a buffer of its own
    /// (an SDU the DIF below delivered): it is opened, unprotected and
    /// parsed in place, and a data PDU's payload goes on to EFCP, or the
    /// PDU to the RMT, in the same buffer.
    pub fn on_frame_buf(&mut self, now: Instant, port: N1Port, mut frame: PduBuf, congested: bool) {
        self.tick(now);
        if let Some(t) = &mut self.tap {
            t.record(now, false, port, &frame);
        }
        let port = self.rmt.primary_of(port);
        self.counters.rx_frames += 1;
        if !self.open_in(now, port, &mut frame) {
            self.counters.rx_bad_protection += 1;
            return;
        }
        frame.truncate(self.unpadded_len(&frame));
        let ttl = match self.sdup.unprotect_buf(&mut frame) {
            Ok(t) => t,
            Err(SdupError::TtlExpired) => {
                self.counters.rx_ttl_expired += 1;
                return;
            }
            Err(_) => {
                self.counters.rx_bad_protection += 1;
                return;
            }
        };
        let Some((mut pci, body)) = self.parse_pdu(&frame) else {
            return;
        };
        self.membership_heard(now, port);
        let mgmt = pci.pdu_type == PduType::Mgmt;
        // A management PDU for address 0 is for whoever gets it; so is
        // every one that reaches an IPCP without an address (it relays
        // nothing): a neighbour that knew it under the address it had
        // before it restarted still says hello there, and must be heard
        // at once for the enrollment to start.
        let local = pci.dst_addr == self.cfg.address
            || (mgmt && (pci.dst_addr == 0 || self.cfg.address == 0));
        if !self.admit_frame(port, &pci, local) {
            return;
        }
        let congested = congested && pci.pdu_type == PduType::Dt;
        if congested {
            pci.flags |= pci::flags::ECN;
        }
        if !local {
            self.relay(now, ttl, frame, &pci, congested);
            return;
        }
        self.dispatch(now, Some(port), &pci, body, frame);
        self.flush_or_defer(now);
    }

    /// The PCI of the PDU in `frame` and where its body is; a malformed
    /// one is counted.
    fn parse_pdu(&mut self, frame: &[u8]) -> Option<(Pci, ParsedBody)> {
        // Most PDUs are well-formed DT PDUs, read in one go.
        if let Some((pci, at)) = self.data_parser.parse(frame) {
            return Some((pci, ParsedBody::Data(at)));
        }
        match pci::Pdu::parse(&self.cfg.dt, frame) {
            // The payload is the rest of the PDU, which ends at its length.
            Ok(pci::Pdu {
                pci,
                body: Body::Data(payload),
            }) => {
                let end = pci.length as usize;
                Some((pci, ParsedBody::Data(end - payload.len()..end)))
            }
            Ok(pci::Pdu {
                pci,
                body: Body::Control(body),
            }) => Some((pci, ParsedBody::Control(body))),
            Err(_) => {
                self.counters.rx_malformed += 1;
                None
            }
        }
    }

    /// Hands a PDU for this IPCP (`pdu`, its PCI parsed) to its consumer:
    /// a data PDU's payload goes to its flow in the same buffer.
    fn dispatch(
        &mut self,
        now: Instant,
        port: Option<N1Port>,
        pci: &Pci,
        body: ParsedBody,
        mut pdu: PduBuf,
    ) {
        match body {
            ParsedBody::Data(at) if pci.pdu_type == PduType::Mgmt => {
                let payload = &pdu[at];
                if payload.first() == Some(&FRAGMENT_DISCRIMINATOR) {
                    let Some(port) = port else {
                        return;
                    };
                    match self.mgmt_reasm.push(now, port, &payload[1..]) {
                        Ok(Some(whole)) if whole.first() != Some(&FRAGMENT_DISCRIMINATOR) => {
                            self.on_management(now, Some(port), pci.src_addr, &whole);
                        }
                        Ok(Some(_)) | Err(_) => self.counters.rx_mgmt_malformed += 1,
                        Ok(None) => {}
                    }
                } else {
                    self.on_management(now, port, pci.src_addr, payload);
                }
            }
            ParsedBody::Data(at) => {
                pdu.truncate(at.end);
                pdu.advance(at.start);
                self.on_data(now, pci, pdu);
            }
            ParsedBody::Control(body) => self.on_control(now, pci, body),
        }
    }

    /// Hands a whole management payload to its consumer: the RIB daemon
    /// for CDAP; anything else is counted (`rx_mgmt_unknown`) and left to
    /// the driver.
    fn on_management(&mut self, now: Instant, port: Option<N1Port>, src: Address, payload: &[u8]) {
        if payload.first() == Some(&CDAP_DISCRIMINATOR) {
            self.on_cdap(now, port, src, &payload[1..]);
            return;
        }
        self.counters.rx_mgmt_unknown += 1;
        if let Some(port) = port {
            self.actions.push_back(Action::Management {
                port,
                src,
                payload: payload.to_vec(),
            });
        }
    }

    fn relay(
        &mut self,
        now: Instant,
        ttl: Option<u8>,
        mut frame: PduBuf,
        pci: &Pci,
        congested: bool,
    ) {
        let ttl = match ttl {
            Some(t) => match Sdup::next_ttl(t) {
                Some(t) => t,
                None => {
                    self.counters.rx_ttl_expired += 1;
                    return;
                }
            },
            None => 0,
        };
        // A relayed PDU goes on in the buffer it arrived in.
        self.sdup.protect_buf(&mut frame, ttl);
        if congested && self.rmt.ecn().is_some() {
            self.cfg.frame_layout().mark(&mut frame);
        }
        let hash = mix(&[pci.src_addr, pci.src_cep, pci.dst_addr, pci.dst_cep]);
        let q = QueuedPdu {
            qos_id: pci.qos_id,
            mgmt: pci.pdu_type == PduType::Mgmt,
            bytes: frame,
        };
        match self.rmt.relay(now, pci.dst_addr, hash, q) {
            Ok(_) => self.counters.relayed += 1,
            Err(_) => self.counters.tx_dropped += 1,
        }
        self.drain_rmt(now);
    }

    /// The flow a PDU with this PCI is for, by its destination CEP-id
    /// (the last one found first); an unknown CEP-id is counted.
    fn flow_by_cep(&mut self, pci: &Pci) -> Option<FlowId> {
        let cep = pci.dst_cep;
        if let Some((last, id)) = self.last_cep {
            if last == cep {
                return Some(id);
            }
        }
        let id = self.by_cep.get(&cep).copied();
        match id {
            Some(id) => self.last_cep = Some((cep, id)),
            None => self.counters.rx_unknown_cep += 1,
        }
        id
    }

    fn on_data(&mut self, now: Instant, pci: &Pci, payload: PduBuf) {
        let Some(id) = self.flow_by_cep(pci) else {
            return self.on_unknown_cep(now, pci);
        };
        let bits = (self.cfg.dt.seq.bytes() * 8) as u32;
        let Some(f) = self.flows.get_mut(&id) else {
            return;
        };
        if !f.is_peer(pci) {
            self.counters.rx_wrong_connection += 1;
            return;
        }
        f.heard = true;
        let reference = f.efcp.receive_reference();
        let seq = efcp::widen_seq(reference, pci.seq, bits);
        let meta = efcp::PduMeta {
            ecn: pci.flags & pci::flags::ECN != 0,
            echo: None,
        };
        if meta.ecn && !f.ecn_seen {
            f.ecn_seen = true;
            self.ecn_flows += 1;
        }
        if f.efcp.take_in_order(now, seq, meta.ecn) {
            // A flow without DTCP, the next PDU in order: delivered now
            // rather than queued in EFCP until the flush. EFCP's deadlines
            // only moved later, so a timer armed stays good unless the
            // fragment started an SDU due to be given up before it; then,
            // or with none armed, the flush files one.
            f.deliver(now, id, seq, payload, &mut self.actions, &mut self.counters);
            let reasm_due = f.reasm.poll_timeout();
            if f.armed.is_none_or(|a| reasm_due.is_some_and(|d| d < a)) {
                mark_dirty(&mut self.dirty, id);
            }
            return;
        }
        f.efcp.on_pdu_meta(
            now,
            efcp::Pdu::Data {
                seq,
                drf: pci.flags & pci::flags::DRF != 0,
                payload,
            },
            meta,
        );
        mark_dirty(&mut self.dirty, id);
    }

    fn on_control(&mut self, now: Instant, pci: &Pci, body: ControlBody) {
        let Some(id) = self.flow_by_cep(pci) else {
            return self.on_unknown_cep(now, pci);
        };
        let bits = (self.cfg.dt.seq.bytes() * 8) as u32;
        let ctrl_bits = (self.cfg.dt.ctrl_seq.bytes() * 8) as u32;
        let Some(f) = self.flows.get_mut(&id) else {
            return;
        };
        if !f.is_peer(pci) {
            self.counters.rx_wrong_connection += 1;
            return;
        }
        let ctrl_seq = pci.seq;
        let mut meta = efcp::PduMeta {
            ecn: pci.flags & pci::flags::ECN != 0,
            echo: None,
        };
        // The numbers as the wire carries them, widened below.
        let pdu = match body {
            ControlBody::Ack { ack_sn } => efcp::Pdu::Ack { ctrl_seq, ack_sn },
            ControlBody::Fc {
                new_rwe,
                rate,
                frame,
                ..
            } => efcp::Pdu::Fc {
                ctrl_seq,
                new_rwe,
                rate,
                frame_ms: frame,
            },
            ControlBody::AckFc {
                ack_sn,
                new_rwe,
                rate,
                frame,
                my_lwe,
                ..
            } => {
                meta.echo = (my_lwe != 0).then_some(my_lwe);
                efcp::Pdu::AckFc {
                    ctrl_seq,
                    ack_sn,
                    new_rwe,
                    rate,
                    frame_ms: frame,
                }
            }
            ControlBody::Nack { nack_sn } => efcp::Pdu::Nack { ctrl_seq, nack_sn },
            ControlBody::Rendezvous { my_lwe, .. } => efcp::Pdu::Rendezvous {
                ctrl_seq,
                next_seq: my_lwe,
            },
            // The keepalive's probes and answers.
            ControlBody::Cack { .. } => {
                self.on_keepalive(now, id, ctrl_seq, &body);
                mark_dirty(&mut self.dirty, id);
                return;
            }
            // Not produced by this EFCP; counted as malformed.
            ControlBody::NackFc { .. } => {
                self.counters.rx_malformed += 1;
                return;
            }
        };
        f.heard = true;
        let (pdu, meta) = f.efcp.widen(pdu, meta, bits, ctrl_bits);
        f.efcp.on_pdu_meta(now, pdu, meta);
        mark_dirty(&mut self.dirty, id);
    }

    /// Makes SDUs written and frames received set off their flush at the
    /// next [`NormalIpcp::poll_action`] (or timer), once for all of them,
    /// rather than each its own: a driver that writes or receives a batch
    /// and then polls the actions (as [`crate::system::System`] does) has
    /// the RMT see the batch's PDUs together, and pays the flush and the
    /// RMT's drain once. What comes out is the same, in the same order per
    /// flow.
    pub fn set_batched_flush(&mut self, on: bool) {
        self.batched_flush = on;
        if !on && self.flush_due {
            let now = self.now;
            self.flush(now);
        }
    }

    /// Flushes now, or asks for the flush with batched flushing.
    fn flush_or_defer(&mut self, now: Instant) {
        if self.batched_flush {
            self.flush_due = true;
        } else {
            self.flush(now);
        }
    }

    /// Moves what dirty flows have to send into the RMT, hands out what they
    /// delivered, and drains the RMT onto the N-1 ports.
    fn flush(&mut self, now: Instant) {
        self.flush_due = false;
        // What flows without DTCP sent straight to the RMT since.
        self.transmit_through(now);
        loop {
            while !self.dirty.is_empty() {
                // Flushing a flow marks none dirty, so this takes them all.
                let mut ids =
                    std::mem::replace(&mut self.dirty, std::mem::take(&mut self.dirty_scratch));
                ids.sort_unstable();
                ids.dedup();
                for &id in &ids {
                    self.flush_flow(now, id);
                    self.transmit_through(now);
                    self.rearm(id);
                }
                ids.clear();
                self.dirty_scratch = ids;
            }
            let Some(bytes) = self.loopback.pop_front() else {
                break;
            };
            self.counters.loopback += 1;
            let pdu = PduBuf::from(bytes);
            if let Some((pci, body)) = self.parse_pdu(&pdu) {
                self.dispatch(now, None, &pci, body, pdu);
            }
        }
        if !self.closing.is_empty() {
            self.close_finished(now);
        }
        if !self.lingering.is_empty() {
            self.close_sent(now);
        }
        self.drain_rmt(now);
    }

    /// Deallocates `flow` once what was written to it has been sent and,
    /// where EFCP retransmits, acknowledged (at most [`LINGER_MAX`] later,
    /// or when the flow fails), as closing a TCP socket does: an
    /// application that writes and closes at once loses none of what it
    /// wrote. A flow with nothing left to send (or not yet allocated) is
    /// deallocated at once, as by [`NormalIpcp::deallocate`]; so is one
    /// closed a second time. What arrives meanwhile is delivered as usual
    /// (the driver has no application left to give it to).
    pub fn close_when_sent(&mut self, now: Instant, flow: FlowId) -> Result<(), NormalError> {
        self.close_when_sent_by(now, flow, now + LINGER_MAX)
    }

    /// [`NormalIpcp::close_when_sent`] with the wait over at `deadline`
    /// (or [`LINGER_MAX`] from now, whichever comes first): for a flow whose
    /// application closed it earlier, the time it already waited counts. A
    /// flow whose deadline has passed is deallocated at once.
    pub fn close_when_sent_by(
        &mut self,
        now: Instant,
        flow: FlowId,
        deadline: Instant,
    ) -> Result<(), NormalError> {
        self.tick(now);
        let sending = self.flows.get(&flow).is_some_and(|f| f.still_sending());
        if !sending || now >= deadline || self.lingering.contains_key(&flow) {
            return self.deallocate(now, flow);
        }
        self.lingering.insert(flow, deadline.min(now + LINGER_MAX));
        Ok(())
    }

    /// Deallocates the flows closed by their application whose data has
    /// all gone (or whose wait is over).
    fn close_sent(&mut self, now: Instant) {
        let done: Vec<FlowId> = self
            .lingering
            .iter()
            .filter(|(id, &deadline)| {
                now >= deadline || !self.flows.get(id).is_some_and(|f| f.still_sending())
            })
            .map(|(&id, _)| id)
            .collect();
        for flow in &done {
            self.lingering.remove(flow);
        }
        for flow in done {
            let _ = self.deallocate(now, flow);
        }
    }

    /// Closes the flows the peer deallocated whose last data PDU has come
    /// (delivered just before) or whose wait for it is over, reporting
    /// each deallocated.
    fn close_finished(&mut self, now: Instant) {
        let done: Vec<FlowId> = self
            .closing
            .iter()
            .filter(|(id, &(last, deadline))| {
                now >= deadline
                    || self
                        .flows
                        .get(id)
                        .is_none_or(|f| f.efcp.received_through(last))
            })
            .map(|(&id, _)| id)
            .collect();
        for flow in done {
            self.closing.remove(&flow);
            self.flush_flow(now, flow);
            if self.close_flow(flow).is_ok() {
                self.actions.push_back(Action::Deallocated { flow });
            }
        }
    }

    /// Takes what the ports' gates let through, at most [`TX_BURST`] PDUs
    /// per port between two runs of the timers (the driver's turns): a
    /// driver whose medium fills up says so before the next burst, so PDUs
    /// wait in the RMT (under its policy) rather than in a driver's buffer.
    fn drain_rmt(&mut self, now: Instant) {
        // Frames passed through the RMT earlier (waiting for a capture or
        // the sealing) go before any it releases now: none is overtaken.
        self.transmit_through(now);
        let mut ports = std::mem::take(&mut self.ports_scratch);
        ports.clear();
        ports.extend(self.rmt.ports());
        self.rmt_more = false;
        for &port in &ports {
            // Most ports have nothing queued on most turns: a policy asked
            // for the next PDU of an empty port has nothing to give.
            if !self.rmt.has_output(port) {
                continue;
            }
            let before = self.rmt.burst_used(port);
            let mut used = before;
            while used < TX_BURST {
                let Some(frame) = self.rmt.poll_output(now, port) else {
                    break;
                };
                used += 1;
                self.transmit(now, port, frame);
            }
            if used > before {
                self.rmt.add_burst(port, used - before);
            }
            self.rmt_more |= used >= TX_BURST && self.rmt.has_output(port);
        }
        self.ports_scratch = ports;
    }

    /// Hands a frame the RMT let go to the driver for N-1 port `port`,
    /// protected for its neighbour.
    fn transmit(&mut self, now: Instant, port: N1Port, frame: PduBuf) {
        let primary = self.rmt.primary_of(port);
        let Some(frame) = self.protect_out(now, primary, frame) else {
            self.counters.tx_dropped += 1;
            return;
        };
        self.counters.tx_frames += 1;
        if let Some(t) = &mut self.tap {
            t.record(now, true, port, &frame);
        }
        self.actions.push_back(Action::Transmit { port, frame });
    }

    /// Transmits the frames the RMT passed straight through.
    fn transmit_through(&mut self, now: Instant) {
        if self.through.is_empty() {
            return;
        }
        let mut through = std::mem::take(&mut self.through);
        for (port, frame) in through.drain(..) {
            self.transmit(now, port, frame);
        }
        self.through = through;
    }

    /// Starts keeping a copy of every frame sent and received on the N-1
    /// ports, at most `limit` of them until polled ([`Self::poll_tapped`]);
    /// `None` stops and forgets the copies.
    pub fn set_tap(&mut self, limit: Option<usize>) {
        self.tap = limit.map(|l| Box::new(tap::Tap::new(l)));
    }

    /// The oldest copy kept for a capture, if any.
    pub fn poll_tapped(&mut self) -> Option<Tapped> {
        self.tap.as_mut()?.pop()
    }

    /// Copies lost because the capture's queue was full.
    pub fn tap_dropped(&self) -> u64 {
        self.tap.as_ref().map_or(0, |t| t.dropped())
    }

    /// The frame of the next action, if that action is a
    /// [`Action::Transmit`] on `port` (taken), else `None` (nothing
    /// taken): the frames that follow one on the same port, for
    /// [`NormalIpcp::write_bufs`] below.
    pub fn poll_transmit_on(&mut self, port: N1Port) -> Option<PduBuf> {
        match self.actions.front() {
            Some(Action::Transmit { port: p, .. }) if *p == port => {}
            _ => return None,
        }
        match self.actions.pop_front() {
            Some(Action::Transmit { frame, .. }) => Some(frame),
            _ => None,
        }
    }

    /// The next thing the driver must do, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        if self.flush_due {
            // The time of the last call that asked for it.
            let now = self.now;
            self.flush(now);
        }
        self.actions.pop_front()
    }

    /// When [`NormalIpcp::handle_timeout`] next needs to run, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers
            .first()
            .map(|&(t, _)| t)
            .into_iter()
            .chain(self.rmt.poll_timeout(self.now))
            .chain(self.rmt_more.then_some(self.now))
            .chain(self.flush_due.then_some(self.now))
            .chain(self.fa.poll_timeout())
            .chain(self.routing.as_ref().and_then(|r| r.poll_timeout()))
            .chain(self.dft.as_ref().and_then(|d| d.poll_timeout()))
            .chain(self.membership_poll_timeout())
            .chain(self.mgmt_reasm.poll_timeout())
            .chain(self.rib_reads.poll_timeout())
            .chain(self.closing.values().map(|&(_, deadline)| deadline).min())
            .chain(self.lingering.values().copied().min())
            .min()
    }

    /// Runs the timers that are due.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.tick(now);
        // A new turn of the driver: every port may hand down a burst again.
        self.rmt.new_turn();
        self.fa_timeout(now);
        self.rib_read_timeout(now);
        self.routing_timeout(now);
        self.directory_timeout(now);
        self.membership_timeout(now);
        if self.mgmt_reasm.poll_timeout().is_some_and(|t| t <= now) {
            self.mgmt_reasm.handle_timeout(now);
        }
        if !self.closing.is_empty() {
            self.close_finished(now);
        }
        if !self.lingering.is_empty() {
            self.close_sent(now);
        }
        // Only the flows whose timers are due; flush files them again.
        while let Some(&(t, id)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            let Some(f) = self.flows.get_mut(&id) else {
                continue;
            };
            f.armed = None;
            if f.efcp.poll_timeout().is_some_and(|t| t <= now) {
                f.efcp.handle_timeout(now);
            }
            if f.reasm.poll_timeout().is_some_and(|t| t <= now) {
                f.reasm.handle_timeout(now);
                // The partial SDU is gone: release the credit its fragments held.
                let n = std::mem::take(&mut f.fragments);
                f.efcp.consumed(now, n);
            }
            if f.ka.as_ref().is_some_and(|k| k.due() <= now) {
                self.keepalive_timeout(now, id);
            }
            mark_dirty(&mut self.dirty, id);
        }
        self.flush(now);
    }
}

/// Marks flow `id` as having PDUs to send, once for a run of marks of it.
fn mark_dirty(dirty: &mut Vec<FlowId>, id: FlowId) {
    if dirty.last() != Some(&id) {
        dirty.push(id);
    }
}

/// An SDU handed to [`NormalIpcp::write_sdu`]: borrowed from the caller
/// (copied once) or in a buffer of its own (kept when it fits one PDU).
enum Outgoing<'a> {
    Borrowed(&'a [u8]),
    Owned(PduBuf),
    Source(&'a dyn SduSource),
}

impl Outgoing<'_> {
    fn source(&self) -> &dyn SduSource {
        match self {
            Outgoing::Borrowed(b) => b,
            Outgoing::Owned(b) => b,
            Outgoing::Source(s) => *s,
        }
    }

    fn len(&self) -> usize {
        match self {
            Outgoing::Borrowed(b) => b.len(),
            Outgoing::Owned(b) => b.len(),
            Outgoing::Source(s) => s.len(),
        }
    }
}

/// Writes the PCI of a data PDU (`hl` bytes with the widths of `dt`) in
/// the room in front of its payload.
fn encode_data_in_place(
    dt: &DtConstants,
    hl: usize,
    pci: &Pci,
    mut payload: PduBuf,
) -> Result<PduBuf, WireError> {
    payload.prepend(hl);
    pci.write_header(dt, &mut payload)?;
    Ok(payload)
}

/// The width of the sequence-number fields of `dt`, in bits.
fn seq_bits(dt: &DtConstants) -> u32 {
    (dt.seq.bytes() * 8) as u32
}

/// The wire body of an EFCP control PDU, with its control sequence number.
fn control_body(p: &efcp::Pdu, echo: Option<u64>, seq_mask: u64) -> (u64, ControlBody) {
    match *p {
        efcp::Pdu::Ack { ctrl_seq, ack_sn } => (
            ctrl_seq,
            ControlBody::Ack {
                ack_sn: ack_sn & seq_mask,
            },
        ),
        efcp::Pdu::Fc {
            ctrl_seq,
            new_rwe,
            rate,
            frame_ms,
        } => (
            ctrl_seq,
            ControlBody::Fc {
                new_rwe: new_rwe & seq_mask,
                my_lwe: 0,
                my_rwe: 0,
                rate,
                frame: frame_ms,
            },
        ),
        efcp::Pdu::AckFc {
            ctrl_seq,
            ack_sn,
            new_rwe,
            rate,
            frame_ms,
        } => (
            ctrl_seq,
            ControlBody::AckFc {
                ack_sn: ack_sn & seq_mask,
                last_ctrl_seq_rcvd: 0,
                new_lwe: ack_sn.wrapping_add(1) & seq_mask,
                new_rwe: new_rwe & seq_mask,
                // The data PDU that caused the ack (0: none); see
                // `efcp::PduMeta::echo`.
                my_lwe: echo.map_or(0, |e| e & seq_mask),
                my_rwe: 0,
                rate,
                frame: frame_ms,
            },
        ),
        efcp::Pdu::Nack { ctrl_seq, nack_sn } => (
            ctrl_seq,
            ControlBody::Nack {
                nack_sn: nack_sn & seq_mask,
            },
        ),
        efcp::Pdu::Rendezvous { ctrl_seq, next_seq } => (
            ctrl_seq,
            ControlBody::Rendezvous {
                last_ctrl_seq_rcvd: 0,
                new_lwe: 0,
                new_rwe: 0,
                my_lwe: next_seq & seq_mask,
                my_rwe: 0,
                rate: 0,
                frame: 0,
            },
        ),
        // Data PDUs never reach here.
        efcp::Pdu::Data { seq, .. } => (seq, ControlBody::Ack { ack_sn: 0 }),
    }
}

/// A cheap, deterministic mix of a few numbers (FNV-1a over their bytes),
/// used to keep a flow on one of several equal-cost ports.
fn mix(vals: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in vals {
        for b in v.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod lane_tests;
#[cfg(test)]
mod layer_mgmt_tests;
#[cfg(test)]
mod tests;
