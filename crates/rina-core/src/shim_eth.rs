//! The shim IPC process over Ethernet (IEEE 802.1Q), as a sans-IO state machine.
//!
//! Seed 000 §16.4.1.1: the shim DIF puts as thin a veneer as possible over
//! an Ethernet segment so that a normal DIF can use it unchanged. Its name is
//! a VLAN id; every frame of that VLAN with EtherType 0xD1F0 carries exactly
//! one SDU. Because Ethernet can only tell flows apart by their MAC
//! addresses, there is **one flow per peer MAC** and no flow-allocation
//! protocol:
//!
//! * allocating a flow to a name resolves the name with ARP (request
//!   broadcast in the VLAN, reply unicast; retried every
//!   [`Config::arp_retry`] until [`Config::arp_timeout`], then
//!   [`ShimEthError::NameDoesNotResolve`]) and the flow is ready as soon as
//!   the peer's MAC is known;
//! * an ARP request for the application registered here, or the first
//!   data frame, from a MAC with no flow raises a flow request to that one
//!   application; frames that arrive while it decides are held (a bounded
//!   number) and delivered if it accepts;
//! * there is no deallocation message: closing a flow only forgets it here.
//!
//! Resolved names are kept in an ARP cache for [`Config::arp_ttl`]; an
//! entry whose MAC still has a flow is refreshed with a new request instead
//! of being dropped, which also teaches the peer our name again. The cache
//! learns a name from a reply to a request of ours (one for a name being
//! resolved), from a request for the registered application (the peer that
//! sets up a flow) and, for a name it has, from any ARP packet that names
//! it (RFC 826); a reply nobody asked for teaches nothing. When it is full
//! ([`Config::max_arp_entries`]) the entry without a flow that expires
//! first makes room.
//!
//! The driver owns the `AF_PACKET` socket. It feeds every received frame to
//! [`ShimEth::on_frame`] (with the VLAN id the kernel reported out of band,
//! if it stripped the tag: the outer one, so a frame that still carries a
//! tag is double-tagged and dropped, never taken for its inner VLAN), writes what [`ShimEth::poll_action`] returns,
//! calls [`ShimEth::handle_timeout`] when [`ShimEth::poll_timeout`] says so,
//! and for each SDU an application writes asks [`ShimEth::send_header`] for
//! the header to put in front of it. Received SDUs are returned as slices
//! of the receive buffer.

mod arp_cache;

use crate::ids::IdMap;
use crate::time::Instant;
use arp_cache::ArpCache;
use rina_wire::ctl::FlowCounters;
use rina_wire::shim_eth::{
    Arp, ArpOp, Frame, FrameHeader, MacAddr, ETH_P_ARP, ETH_P_RINA, VLAN_TAG_LEN,
};
use rina_wire::{AppName, QosSpec, WireError};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;
use thiserror::Error;

/// A port-id: names a flow at its local end. Chosen by the driver.
pub type PortId = u32;

/// Configuration of one shim-eth IPCP.
#[derive(Debug, Clone)]
pub struct Config {
    /// Name of the shim DIF (by convention the VLAN id as text).
    pub dif: String,
    /// VLAN id of the DIF, `None` for an untagged segment.
    pub vlan: Option<u16>,
    /// MAC address of the interface.
    pub mac: MacAddr,
    /// MTU of the interface, in bytes.
    pub mtu: u32,
    /// Interval between ARP requests for a name not resolved yet.
    pub arp_retry: Duration,
    /// Time after which a name that did not resolve fails its allocations.
    pub arp_timeout: Duration,
    /// Life of an ARP cache entry.
    pub arp_ttl: Duration,
    /// Time the application has to accept or refuse an incoming flow.
    pub accept_timeout: Duration,
    /// Time frames from a MAC whose flow was refused are dropped without a new request.
    pub refuse_hold: Duration,
    /// Most flows at once.
    pub max_flows: usize,
    /// Most incoming flow requests waiting for the application.
    pub max_pending: usize,
    /// Most frames held per incoming flow request.
    pub max_held: usize,
    /// Most ARP cache entries.
    pub max_arp_entries: usize,
}

impl Config {
    /// Defaults for everything but the DIF, VLAN, MAC and MTU.
    pub fn new(dif: impl Into<String>, vlan: Option<u16>, mac: MacAddr, mtu: u32) -> Self {
        Config {
            dif: dif.into(),
            vlan,
            mac,
            mtu,
            arp_retry: Duration::from_millis(250),
            arp_timeout: Duration::from_secs(2),
            arp_ttl: Duration::from_secs(60),
            accept_timeout: Duration::from_secs(5),
            refuse_hold: Duration::from_secs(1),
            max_flows: crate::DEFAULT_MAX_FLOWS,
            max_pending: 64,
            max_held: 64,
            max_arp_entries: 1024,
        }
    }

    /// Largest SDU: the MTU less the 802.1Q tag (written by us, so inside
    /// the MTU); the MTU itself when untagged.
    pub fn max_sdu(&self) -> u32 {
        match self.vlan {
            Some(_) => self.mtu.saturating_sub(VLAN_TAG_LEN as u32),
            None => self.mtu,
        }
    }
}

/// Why an operation of the shim failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ShimEthError {
    /// Nobody in the VLAN answered ARP requests for the name in time.
    #[error("{name} does not resolve in shim DIF {dif}: no ARP reply within {after:?}")]
    NameDoesNotResolve {
        name: Box<AppName>,
        dif: String,
        after: Duration,
    },
    /// An application is already registered (a shim-eth IPCP takes only one).
    #[error("{0} is already registered here; a shim-eth IPCP serves one application")]
    OneApplicationOnly(Box<AppName>),
    /// The peer MAC already has a flow (one flow per pair of MAC addresses).
    #[error("MAC {mac} already has flow {port}; Ethernet carries one flow per pair of MACs")]
    FlowExists { mac: MacAddr, port: PortId },
    /// The name resolves to this IPCP's own MAC.
    #[error("{0} is registered at this very IPCP; a shim-eth flow needs two systems")]
    SelfFlow(Box<AppName>),
    /// The shim cannot provide what the QoS spec asks for.
    #[error("QoS not satisfiable: {0}")]
    QosNotSatisfiable(String),
    /// An SDU is larger than the interface MTU allows.
    #[error(
        "SDU of {size} bytes is larger than the maximum of {max} (interface MTU less headers)"
    )]
    SduTooLarge { size: usize, max: u32 },
    /// An SDU of zero bytes.
    #[error("empty SDU: an SDU is at least one byte")]
    EmptySdu,
    /// No flow with this port-id, or it is not ready yet.
    #[error("no allocated flow with port-id {0}")]
    UnknownFlow(PortId),
    /// No pending flow request with this handle.
    #[error("no pending flow request {0}")]
    UnknownRequest(u64),
    /// The port-id is already used.
    #[error("port-id {0} is already in use")]
    PortInUse(PortId),
    /// Too many flows, requests or cache entries.
    #[error("out of resources: {0}")]
    NoResources(String),
}

/// Something the driver must do.
// Actions are queued only for control traffic and held frames (the data
// path bypasses the queue), so the size of FlowRequest costs nothing that
// matters.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send this whole frame (ARP) on the interface.
    Transmit { frame: Vec<u8> },
    /// A new peer MAC sent data to the registered application `local`;
    /// answer with [`ShimEth::accept`] or [`ShimEth::refuse`].
    FlowRequest {
        handle: u64,
        local: AppName,
        remote: AppName,
        qos: QosSpec,
    },
    /// The application did not answer request `handle` in time.
    RequestWithdrawn { handle: u64 },
    /// A flow asked for with [`ShimEth::allocate`] is ready.
    Allocated { port: PortId, max_sdu: u32 },
    /// A flow asked for with [`ShimEth::allocate`] could not be set up.
    AllocateFailed { port: PortId, error: ShimEthError },
    /// An SDU held while its flow was being accepted.
    Deliver { port: PortId, sdu: Vec<u8> },
}

/// Why a received frame was dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DropReason {
    /// Shorter than its headers.
    Truncated(WireError),
    /// Tagged with another VLAN (or tagged in untagged mode, or the reverse).
    OtherVlan(Option<u16>),
    /// Tagged twice: the kernel reported the outer VLAN id out of band and
    /// the frame still carries an inner tag (counted as another VLAN: an
    /// inner tag is no proof of the VLAN the frame travelled in).
    DoubleTagged { outer: u16, inner: u16 },
    /// Neither 0xD1F0 nor ARP.
    OtherEtherType(u16),
    /// An ARP packet that is not one of ours or does not parse, or a name that is not valid.
    Garbage(String),
    /// Sent by this IPCP itself, or unicast to another MAC.
    NotForUs,
    /// Data with no flow and no application to offer it to (or it refused the MAC).
    NoApplication,
    /// Data with no payload.
    EmptySdu,
    /// Held for a pending request that already holds as many frames as allowed.
    HeldFull,
}

/// What became of a received frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Received<'a> {
    /// Hand this SDU to the application of flow `port`.
    Deliver { port: PortId, sdu: &'a [u8] },
    /// Handled here (ARP, a held frame, a new flow request).
    Consumed,
    /// Dropped and counted.
    Dropped(DropReason),
}

/// IPCP-wide counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Frames received (all, before any filtering).
    pub rx_frames: u64,
    /// Frames sent (data and ARP).
    pub tx_frames: u64,
    /// Dropped: another VLAN, or tagged twice (an outer tag out of band
    /// and an inner one in the frame).
    pub rx_other_vlan: u64,
    /// Dropped: another EtherType.
    pub rx_other_ethertype: u64,
    /// Dropped: truncated headers or ARP packet.
    pub rx_truncated: u64,
    /// Dropped: ARP that is not ours or malformed, bad names.
    pub rx_garbage: u64,
    /// Dropped: sent by us or unicast to another MAC.
    pub rx_not_for_us: u64,
    /// Dropped: data with no flow and no application taking it.
    pub rx_no_app: u64,
    /// Dropped: empty data frames.
    pub rx_empty: u64,
    /// Dropped: too many frames held for a pending request.
    pub rx_held_full: u64,
    /// ARP requests sent.
    pub arp_requests_out: u64,
    /// ARP replies sent.
    pub arp_replies_out: u64,
    /// ARP packets received (valid).
    pub arp_in: u64,
    /// Names that did not resolve in time.
    pub arp_timeouts: u64,
    /// Incoming flow requests raised.
    pub flow_requests_in: u64,
    /// Incoming flow requests refused (or withdrawn).
    pub flow_refused: u64,
}

impl Counters {
    /// The counters by name, for listings.
    pub fn to_map(&self) -> BTreeMap<String, u64> {
        [
            ("rx_frames", self.rx_frames),
            ("tx_frames", self.tx_frames),
            ("rx_other_vlan", self.rx_other_vlan),
            ("rx_other_ethertype", self.rx_other_ethertype),
            ("rx_truncated", self.rx_truncated),
            ("rx_garbage", self.rx_garbage),
            ("rx_not_for_us", self.rx_not_for_us),
            ("rx_no_app", self.rx_no_app),
            ("rx_empty", self.rx_empty),
            ("rx_held_full", self.rx_held_full),
            ("arp_requests_out", self.arp_requests_out),
            ("arp_replies_out", self.arp_replies_out),
            ("arp_in", self.arp_in),
            ("arp_timeouts", self.arp_timeouts),
            ("flow_requests_in", self.flow_requests_in),
            ("flow_refused", self.flow_refused),
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
    /// The other end's application name (as ARP told us).
    pub remote: AppName,
    /// QoS asked for.
    pub qos: QosSpec,
    /// The peer's MAC; `None` while its name is being resolved.
    pub peer: Option<MacAddr>,
    /// Largest SDU.
    pub max_sdu: u32,
    /// Traffic counters.
    pub counters: FlowCounters,
}

/// An ARP cache entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpEntry {
    /// Where the name lives.
    pub mac: MacAddr,
    /// When the entry expires (or is refreshed, if its MAC has a flow).
    pub expires: Instant,
}

/// A name being resolved.
#[derive(Debug)]
struct Resolution {
    next_retry: Instant,
    deadline: Instant,
    /// The name we ask as (the sender protocol address).
    asker: AppName,
    waiters: Vec<PortId>,
}

/// An incoming flow waiting for the application's answer.
#[derive(Debug)]
struct Pending {
    mac: MacAddr,
    local: AppName,
    remote: AppName,
    deadline: Instant,
    held: VecDeque<Vec<u8>>,
}

/// One shim-eth IPC process.
#[derive(Debug)]
pub struct ShimEth {
    cfg: Config,
    registered: Option<AppName>,
    flows: IdMap<PortId, Flow>,
    by_mac: HashMap<MacAddr, PortId>,
    // Ordered maps where iteration order reaches the wire, so that a seeded
    // simulation replays exactly.
    arp: ArpCache,
    resolving: BTreeMap<AppName, Resolution>,
    pending: BTreeMap<u64, Pending>,
    refused: BTreeMap<MacAddr, Instant>,
    next_handle: u64,
    now: Instant,
    actions: VecDeque<Action>,
    counters: Counters,
}

impl ShimEth {
    /// A shim IPCP with no application and no flows.
    pub fn new(cfg: Config) -> Self {
        ShimEth {
            cfg,
            registered: None,
            flows: IdMap::default(),
            by_mac: HashMap::new(),
            arp: ArpCache::default(),
            resolving: BTreeMap::new(),
            pending: BTreeMap::new(),
            refused: BTreeMap::new(),
            next_handle: 1,
            now: Instant::ZERO,
            actions: VecDeque::new(),
            counters: Counters::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// IPCP-wide counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The registered application, if any.
    pub fn registered(&self) -> Option<&AppName> {
        self.registered.as_ref()
    }

    /// The ARP cache.
    pub fn arp_cache(&self) -> impl Iterator<Item = (&AppName, &ArpEntry)> {
        self.arp.iter()
    }

    /// Flows, ready or resolving.
    pub fn flows(&self) -> impl Iterator<Item = (PortId, &Flow)> {
        self.flows.iter().map(|(p, f)| (*p, f))
    }

    /// One flow.
    pub fn flow(&self, port: PortId) -> Option<&Flow> {
        self.flows.get(&port)
    }

    /// Counters of a flow, for the driver to add what only it sees.
    pub fn flow_counters_mut(&mut self, port: PortId) -> Option<&mut FlowCounters> {
        self.flows.get_mut(&port).map(|f| &mut f.counters)
    }

    /// Whether `name` is in the ARP cache.
    pub fn resolved(&self, name: &AppName) -> Option<MacAddr> {
        self.arp.get(name).map(|e| e.mac)
    }

    /// Registers the one application of this IPCP.
    pub fn register(&mut self, name: AppName) -> Result<(), ShimEthError> {
        if let Some(r) = &self.registered {
            return Err(ShimEthError::OneApplicationOnly(Box::new(r.clone())));
        }
        self.registered = Some(name);
        Ok(())
    }

    /// Withdraws the registration; pending requests are withdrawn. Returns
    /// whether `name` was the registered application.
    pub fn unregister(&mut self, name: &AppName) -> bool {
        if self.registered.as_ref() != Some(name) {
            return false;
        }
        self.registered = None;
        for handle in std::mem::take(&mut self.pending).into_keys() {
            self.counters.flow_refused += 1;
            self.actions.push_back(Action::RequestWithdrawn { handle });
        }
        true
    }

    fn check_qos(&self, qos: &QosSpec) -> Result<(), ShimEthError> {
        let offer = crate::shim_qos::ShimQos {
            what: "over Ethernet",
            max_sdu: self.cfg.max_sdu(),
            max_sdu_note: " (interface MTU less headers)",
            in_order: true,
            loss_note: "",
        };
        match offer.refusal(qos) {
            Some(why) => Err(ShimEthError::QosNotSatisfiable(why)),
            None => Ok(()),
        }
    }

    /// Starts allocating flow `port` from `local` to `remote`. The flow is
    /// ready ([`Action::Allocated`]) once `remote`'s MAC is known (at once
    /// if it is in the cache); errors found at once are returned.
    pub fn allocate(
        &mut self,
        now: Instant,
        port: PortId,
        local: AppName,
        remote: AppName,
        qos: QosSpec,
    ) -> Result<(), ShimEthError> {
        self.now = self.now.max(now);
        if self.flows.contains_key(&port) {
            return Err(ShimEthError::PortInUse(port));
        }
        self.check_qos(&qos)?;
        if self.flows.len() >= self.cfg.max_flows {
            return Err(ShimEthError::NoResources(format!(
                "{} flows already",
                self.cfg.max_flows
            )));
        }
        let cached = self.arp.get(&remote).map(|e| e.mac);
        if let Some(mac) = cached {
            self.check_peer(&remote, mac)?;
        }
        self.flows.insert(
            port,
            Flow {
                local: local.clone(),
                remote: remote.clone(),
                qos,
                peer: None,
                max_sdu: self.cfg.max_sdu(),
                counters: FlowCounters::default(),
            },
        );
        match cached {
            Some(mac) => self.ready(port, mac),
            None => {
                if let Some(r) = self.resolving.get_mut(&remote) {
                    r.waiters.push(port);
                } else {
                    let asker = self.registered.clone().unwrap_or(local);
                    self.send_request(&asker, &remote, MacAddr::BROADCAST);
                    self.resolving.insert(
                        remote,
                        Resolution {
                            next_retry: now + self.cfg.arp_retry,
                            deadline: now + self.cfg.arp_timeout,
                            asker,
                            waiters: vec![port],
                        },
                    );
                }
            }
        }
        Ok(())
    }

    /// Whether a flow to `mac` (which `name` resolved to) may be made.
    fn check_peer(&self, name: &AppName, mac: MacAddr) -> Result<(), ShimEthError> {
        if mac == self.cfg.mac {
            return Err(ShimEthError::SelfFlow(Box::new(name.clone())));
        }
        if let Some(&port) = self.by_mac.get(&mac) {
            return Err(ShimEthError::FlowExists { mac, port });
        }
        if self.pending.values().any(|p| p.mac == mac) {
            return Err(ShimEthError::FlowExists { mac, port: 0 });
        }
        Ok(())
    }

    /// Binds resolving flow `port` to `mac` and reports it ready.
    fn ready(&mut self, port: PortId, mac: MacAddr) {
        let Some(f) = self.flows.get_mut(&port) else {
            return;
        };
        f.peer = Some(mac);
        let max_sdu = f.max_sdu;
        self.by_mac.insert(mac, port);
        self.refused.remove(&mac);
        self.actions.push_back(Action::Allocated { port, max_sdu });
    }

    /// Accepts incoming request `handle` as flow `port`; frames held for it
    /// follow as [`Action::Deliver`]. Returns the flow's maximum SDU.
    pub fn accept(&mut self, handle: u64, port: PortId) -> Result<u32, ShimEthError> {
        if self.flows.contains_key(&port) {
            return Err(ShimEthError::PortInUse(port));
        }
        let p = self
            .pending
            .remove(&handle)
            .ok_or(ShimEthError::UnknownRequest(handle))?;
        let max_sdu = self.cfg.max_sdu();
        let mut counters = FlowCounters::default();
        for sdu in p.held {
            counters.sdus_in += 1;
            counters.bytes_in += sdu.len() as u64;
            self.actions.push_back(Action::Deliver { port, sdu });
        }
        self.flows.insert(
            port,
            Flow {
                local: p.local,
                remote: p.remote,
                qos: QosSpec::default(),
                peer: Some(p.mac),
                max_sdu,
                counters,
            },
        );
        self.by_mac.insert(p.mac, port);
        Ok(max_sdu)
    }

    /// Refuses incoming request `handle`: frames from its MAC are dropped
    /// for [`Config::refuse_hold`] without a new request.
    pub fn refuse(&mut self, handle: u64, _reason: &str) -> Result<(), ShimEthError> {
        let p = self
            .pending
            .remove(&handle)
            .ok_or(ShimEthError::UnknownRequest(handle))?;
        self.counters.flow_refused += 1;
        self.hold_refusal(p.mac);
        Ok(())
    }

    fn hold_refusal(&mut self, mac: MacAddr) {
        if self.refused.len() < self.cfg.max_pending * 4 {
            self.refused.insert(mac, self.now + self.cfg.refuse_hold);
        }
    }

    /// Forgets flow `port` (Ethernet has nothing to tell the peer).
    pub fn deallocate(&mut self, port: PortId) -> Result<(), ShimEthError> {
        let f = self
            .flows
            .remove(&port)
            .ok_or(ShimEthError::UnknownFlow(port))?;
        match f.peer {
            Some(mac) => {
                if self.by_mac.get(&mac) == Some(&port) {
                    self.by_mac.remove(&mac);
                }
            }
            None => {
                if let Some(r) = self.resolving.get_mut(&f.remote) {
                    r.waiters.retain(|&p| p != port);
                    if r.waiters.is_empty() {
                        self.resolving.remove(&f.remote);
                    }
                }
            }
        }
        Ok(())
    }

    /// Accounts an SDU of `len` bytes written on flow `port` and returns the
    /// header to put in front of it.
    pub fn send_header(&mut self, port: PortId, len: usize) -> Result<FrameHeader, ShimEthError> {
        let flow = self
            .flows
            .get_mut(&port)
            .ok_or(ShimEthError::UnknownFlow(port))?;
        let Some(peer) = flow.peer else {
            return Err(ShimEthError::UnknownFlow(port));
        };
        if len == 0 {
            flow.counters.drops_out += 1;
            return Err(ShimEthError::EmptySdu);
        }
        if len > flow.max_sdu as usize {
            flow.counters.drops_out += 1;
            return Err(ShimEthError::SduTooLarge {
                size: len,
                max: flow.max_sdu,
            });
        }
        flow.counters.sdus_out += 1;
        flow.counters.bytes_out += len as u64;
        self.counters.tx_frames += 1;
        Ok(FrameHeader {
            dst: peer,
            src: self.cfg.mac,
            vlan: self.cfg.vlan,
            ethertype: ETH_P_RINA,
        })
    }

    /// Processes one received frame. `aux_vlan` is the VLAN id the kernel
    /// reported out of band when it stripped the tag (`PACKET_AUXDATA`); it
    /// is the outer tag, so a frame that has it and a tag of its own too is
    /// double-tagged and dropped ([`DropReason::DoubleTagged`]).
    pub fn on_frame<'a>(
        &mut self,
        now: Instant,
        buf: &'a [u8],
        aux_vlan: Option<u16>,
    ) -> Received<'a> {
        self.now = self.now.max(now);
        self.counters.rx_frames += 1;
        let frame = match Frame::parse(buf) {
            Ok(f) => f,
            Err(e) => {
                self.counters.rx_truncated += 1;
                return Received::Dropped(DropReason::Truncated(e));
            }
        };
        let h = frame.header;
        let vlan = match (aux_vlan, h.vlan) {
            // The kernel moved the outer tag out of band and left another in
            // the frame: the frame travelled in VLAN `outer` (whatever the
            // inner tag says), and one shim DIF writes one tag.
            (Some(outer), Some(inner)) => {
                self.counters.rx_other_vlan += 1;
                return Received::Dropped(DropReason::DoubleTagged { outer, inner });
            }
            // VLAN 0 is a priority tag: no VLAN.
            (Some(v), None) | (None, Some(v)) => Some(v).filter(|&v| v != 0),
            (None, None) => None,
        };
        if vlan != self.cfg.vlan {
            self.counters.rx_other_vlan += 1;
            return Received::Dropped(DropReason::OtherVlan(vlan));
        }
        if h.src == self.cfg.mac || (h.dst != self.cfg.mac && !h.dst.is_group()) {
            self.counters.rx_not_for_us += 1;
            return Received::Dropped(DropReason::NotForUs);
        }
        match h.ethertype {
            ETH_P_RINA if h.dst.is_group() => {
                self.counters.rx_not_for_us += 1;
                Received::Dropped(DropReason::NotForUs)
            }
            ETH_P_RINA => self.on_data(now, h.src, frame.payload),
            ETH_P_ARP => self.on_arp(now, frame.payload),
            t => {
                self.counters.rx_other_ethertype += 1;
                Received::Dropped(DropReason::OtherEtherType(t))
            }
        }
    }

    fn on_data<'a>(&mut self, now: Instant, src: MacAddr, sdu: &'a [u8]) -> Received<'a> {
        if sdu.is_empty() {
            self.counters.rx_empty += 1;
            return Received::Dropped(DropReason::EmptySdu);
        }
        if let Some(&port) = self.by_mac.get(&src) {
            if let Some(f) = self.flows.get_mut(&port) {
                f.counters.sdus_in += 1;
                f.counters.bytes_in += sdu.len() as u64;
                return Received::Deliver { port, sdu };
            }
        }
        if let Some(p) = self.pending.values_mut().find(|p| p.mac == src) {
            if p.held.len() >= self.cfg.max_held {
                self.counters.rx_held_full += 1;
                return Received::Dropped(DropReason::HeldFull);
            }
            p.held.push_back(sdu.to_vec());
            return Received::Consumed;
        }
        if self.offer(now, src, None, Some(sdu)) {
            Received::Consumed
        } else {
            self.counters.rx_no_app += 1;
            Received::Dropped(DropReason::NoApplication)
        }
    }

    /// Raises a flow request from `src` (whose name is `remote`, if known)
    /// to the registered application, holding `first`; false if there is no
    /// application, it refused `src` lately, or there is no room.
    fn offer(
        &mut self,
        now: Instant,
        src: MacAddr,
        remote: Option<AppName>,
        first: Option<&[u8]>,
    ) -> bool {
        let refused = self.refused.get(&src).is_some_and(|&t| now < t);
        let Some(local) = self.registered.clone().filter(|_| !refused) else {
            return false;
        };
        if self.pending.len() >= self.cfg.max_pending || self.flows.len() >= self.cfg.max_flows {
            return false;
        }
        // The peer's name, as its ARP request taught us; a peer we never
        // heard of (our cache was lost) is named after its MAC.
        let remote = remote.unwrap_or_else(|| {
            self.arp
                .iter()
                .find(|(_, e)| e.mac == src)
                .map(|(n, _)| n.clone())
                .unwrap_or_else(|| mac_name(src))
        });
        let handle = self.next_handle;
        self.next_handle += 1;
        self.counters.flow_requests_in += 1;
        self.pending.insert(
            handle,
            Pending {
                mac: src,
                local: local.clone(),
                remote: remote.clone(),
                deadline: now + self.cfg.accept_timeout,
                held: first.map(<[u8]>::to_vec).into_iter().collect(),
            },
        );
        self.actions.push_back(Action::FlowRequest {
            handle,
            local,
            remote,
            qos: QosSpec::default(),
        });
        true
    }

    fn on_arp<'a>(&mut self, now: Instant, payload: &[u8]) -> Received<'a> {
        let arp = match Arp::parse(payload) {
            Ok(a) => a,
            Err(e @ WireError::Truncated { .. }) => {
                self.counters.rx_truncated += 1;
                return Received::Dropped(DropReason::Truncated(e));
            }
            Err(e) => {
                self.counters.rx_garbage += 1;
                return Received::Dropped(DropReason::Garbage(e.to_string()));
            }
        };
        let parse = |b: &[u8]| -> Option<AppName> { std::str::from_utf8(b).ok()?.parse().ok() };
        let (Some(spa), Some(tpa)) = (parse(arp.spa), parse(arp.tpa)) else {
            self.counters.rx_garbage += 1;
            return Received::Dropped(DropReason::Garbage(
                "ARP protocol address is not an application name".into(),
            ));
        };
        if arp.sha == self.cfg.mac || arp.sha.is_group() {
            self.counters.rx_not_for_us += 1;
            return Received::Dropped(DropReason::NotForUs);
        }
        self.counters.arp_in += 1;
        // RFC 826: update an entry we have; add one if we are the target of
        // a request (a peer setting up its flow to us). A reply is learnt
        // only if it answers a name we are resolving: one nobody asked for
        // would let anyone fill the cache and push out what we learnt.
        let for_us = self.registered.as_ref() == Some(&tpa);
        let answers =
            arp.op == ArpOp::Reply && arp.tha == self.cfg.mac && self.resolving.contains_key(&spa);
        let asks_us = for_us && arp.op == ArpOp::Request;
        if self.arp.contains(&spa) || asks_us || answers {
            self.learn(now, spa.clone(), arp.sha);
        }
        if asks_us {
            self.counters.arp_replies_out += 1;
            let reply = Arp {
                op: ArpOp::Reply,
                sha: self.cfg.mac,
                spa: arp.tpa,
                tha: arp.sha,
                tpa: arp.spa,
            };
            self.transmit_arp(&reply, arp.sha);
            // A request for our application is a peer setting up its flow
            // (ARP stands in for the flow allocator): offer it now, so that
            // this end has the flow before the first data frame.
            let known = self.by_mac.contains_key(&arp.sha)
                || self.pending.values().any(|p| p.mac == arp.sha);
            if !known {
                self.offer(now, arp.sha, Some(spa.clone()), None);
            }
        }
        if answers {
            if let Some(r) = self.resolving.remove(&spa) {
                for port in r.waiters {
                    match self.check_peer(&spa, arp.sha) {
                        Ok(()) => self.ready(port, arp.sha),
                        Err(error) => {
                            self.flows.remove(&port);
                            self.actions
                                .push_back(Action::AllocateFailed { port, error });
                        }
                    }
                }
            }
        }
        Received::Consumed
    }

    /// Puts `name` -> `mac` in the cache, evicting the entry without a flow
    /// that expires first if it is full (or giving up when every entry has
    /// one).
    fn learn(&mut self, now: Instant, name: AppName, mac: MacAddr) {
        // A name moved to another MAC: the old entry is replaced.
        if !self.arp.contains(&name) && self.arp.len() >= self.cfg.max_arp_entries {
            let victim = self
                .arp
                .first_to_evict(|e| self.by_mac.contains_key(&e.mac));
            match victim {
                Some(v) => {
                    self.arp.remove(&v);
                }
                None => return,
            }
        }
        self.arp.insert(
            name,
            ArpEntry {
                mac,
                expires: now + self.cfg.arp_ttl,
            },
        );
        self.refused.remove(&mac);
    }

    /// When [`ShimEth::handle_timeout`] next needs to run, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let r = self
            .resolving
            .values()
            .map(|r| r.next_retry.min(r.deadline));
        let p = self.pending.values().map(|p| p.deadline);
        let a = self.arp.next_expiry();
        let f = self.refused.values().copied();
        r.chain(p).chain(a).chain(f).min()
    }

    /// Retries ARP requests, fails names that did not resolve, expires the
    /// cache (refreshing entries in use) and withdraws late requests.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = self.now.max(now);
        let mut failed = Vec::new();
        let mut retry = Vec::new();
        for (name, r) in self.resolving.iter_mut() {
            if now >= r.deadline {
                failed.push(name.clone());
            } else if now >= r.next_retry {
                r.next_retry = now + self.cfg.arp_retry;
                retry.push((r.asker.clone(), name.clone()));
            }
        }
        for (asker, name) in retry {
            self.send_request(&asker, &name, MacAddr::BROADCAST);
        }
        for name in failed {
            let Some(r) = self.resolving.remove(&name) else {
                continue;
            };
            self.counters.arp_timeouts += 1;
            for port in r.waiters {
                self.flows.remove(&port);
                self.actions.push_back(Action::AllocateFailed {
                    port,
                    error: ShimEthError::NameDoesNotResolve {
                        name: Box::new(name.clone()),
                        dif: self.cfg.dif.clone(),
                        after: self.cfg.arp_timeout,
                    },
                });
            }
        }
        for name in self.arp.expired(now) {
            let Some(mac) = self.arp.get(&name).map(|e| e.mac) else {
                continue;
            };
            if self.by_mac.contains_key(&mac) {
                // In use: keep it, and ask again (unicast) so that both
                // caches stay fresh; a reply moves it if the peer moved.
                self.arp.set_expires(&name, now + self.cfg.arp_ttl);
                let asker = self.registered.clone();
                let asker = asker.or_else(|| {
                    let port = self.by_mac.get(&mac)?;
                    Some(self.flows.get(port)?.local.clone())
                });
                if let Some(asker) = asker {
                    self.send_request(&asker, &name, mac);
                }
            } else {
                self.arp.remove(&name);
            }
        }
        let late: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| now >= p.deadline)
            .map(|(h, _)| *h)
            .collect();
        for handle in late {
            if let Some(p) = self.pending.remove(&handle) {
                self.counters.flow_refused += 1;
                self.hold_refusal(p.mac);
                self.actions.push_back(Action::RequestWithdrawn { handle });
            }
        }
        self.refused.retain(|_, t| now < *t);
    }

    /// The next thing the driver must do, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    fn send_request(&mut self, asker: &AppName, name: &AppName, to: MacAddr) {
        let (spa, tpa) = (asker.to_string(), name.to_string());
        let req = Arp {
            op: ArpOp::Request,
            sha: self.cfg.mac,
            spa: spa.as_bytes(),
            tha: MacAddr::ZERO,
            tpa: tpa.as_bytes(),
        };
        self.counters.arp_requests_out += 1;
        self.transmit_arp(&req, to);
    }

    fn transmit_arp(&mut self, arp: &Arp<'_>, to: MacAddr) {
        let hdr = FrameHeader {
            dst: to,
            src: self.cfg.mac,
            vlan: self.cfg.vlan,
            ethertype: ETH_P_ARP,
        };
        // Names are at most 255 bytes, so encoding cannot fail.
        if let Ok(frame) = arp.to_frame(hdr) {
            self.counters.tx_frames += 1;
            self.actions.push_back(Action::Transmit { frame });
        }
    }
}

/// The name given to a peer whose application name is unknown: its MAC
/// with `-` separators (a valid process name).
pub fn mac_name(mac: MacAddr) -> AppName {
    let s = mac.to_string().replace(':', "-");
    s.parse().unwrap_or_default()
}

#[cfg(test)]
mod tests;
