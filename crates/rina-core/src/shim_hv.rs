//! The shim IPC process for hypervisors (shim-hv), as a sans-IO state
//! machine, with the VMPI device it runs over.
//!
//! A shim DIF for hypervisors is a point-to-point DIF between a virtual
//! machine and its hypervisor over shared memory (seeds 001 and 002): no
//! emulated NIC, no MAC address, no MTU. Its two members are the two ends
//! of one VMPI device; the device's VMPI-id (unique only within its OS) is
//! the member's address. Flows are VMPI *channels*: every buffer starts with
//! a 4-byte channel id, channel 0 carries the control messages of [`vmpi`]
//! (allocate request with both names, response ok/refused, deallocate), and
//! channels 1..63 carry the SDUs of one flow each, with no other header.
//!
//! * [`ring`] — the single-producer/single-consumer ring of slots in shared
//!   memory, validated against a peer writing garbage;
//! * [`link`] — the device: region header, two rings, heartbeats;
//! * [`vmpi`] — channel framing and control messages;
//! * [`credit`] — per-channel credit-based flow control;
//! * [`ShimHv`] — the flow allocator of the shim: names, channels, flows.
//!
//! Channel choice: the requester picks a free channel, the host side
//! counting up from the last one it used, the guest side counting down, so
//! a channel just released is not reused at once (SDUs still in flight on
//! it would otherwise reach the next flow). If both sides pick the same
//! channel at once, the host's request wins: the host refuses the guest's,
//! and the guest fails its own allocation and serves the host's.
//!
//! The driver feeds every buffer taken from the receive ring to
//! [`ShimHv::on_buffer`], sends [`Action::Transmit`] buffers on the send
//! ring, and tells the machine when the peer comes and goes
//! ([`ShimHv::peer_up`], [`ShimHv::peer_lost`]).
//!
//! Flow control (when both ends support it, see [`credit`]): the receiving
//! end of an application flow grants its sender a window
//! ([`Config::credit`]); the driver asks [`ShimHv::may_send`] before it
//! reads an application's next SDU and stops reading that flow only (and
//! asks again once control buffers came in), and tells the machine with
//! [`ShimHv::delivered`] when received SDUs reached the application, which
//! sends the sender more credit. The driver may then hold what an
//! application cannot take yet: at most the window per flow
//! ([`ShimHv::rx_flow_controlled`]); data beyond the window is dropped and
//! counted. Flows of stacked normal IPCPs ([`ShimHv::allocate_with`] and
//! [`ShimHv::accept_with`] with `windowed` false) grant no limit: their
//! frames are never held (the EFCP and RMT above handle them). A peer that
//! does not announce credit gets none and is not limited: its flows work
//! as before, and the driver can only hold them back by not reading.

pub mod credit;
pub mod flow_rings;
pub mod link;
pub mod ring;
pub mod vmpi;

use crate::ids::IdMap;
use crate::time::Instant;
use credit::{CreditError, RxCredit, TxCredit, Window};
use rina_wire::ctl::FlowCounters;
use rina_wire::{AppName, QosSpec};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;
use thiserror::Error;
use vmpi::{Control, VmpiError, CHANNEL_HEADER, CONTROL_CHANNEL, MAX_CHANNELS};

pub use link::Side;

/// A port-id: names a flow at its local end. Chosen by the driver.
pub type PortId = u32;

/// Default largest SDU: 64 KiB.
pub const DEFAULT_MAX_SDU: u32 = 65_536;

/// Configuration of one shim-hv IPCP.
#[derive(Debug, Clone)]
pub struct Config {
    /// Name of the shim DIF.
    pub dif: String,
    /// Which end of the device this is.
    pub side: Side,
    /// The VMPI-id of the device in this OS: this member's address.
    pub vmpi_id: u32,
    /// Largest SDU, in bytes (both ends should agree; larger ones are dropped).
    pub max_sdu: u32,
    /// Time after which an unanswered allocation request fails.
    pub alloc_timeout: Duration,
    /// Time an application has to accept or refuse an incoming flow
    /// (default 1.5 s: less than the default `alloc_timeout`, so that the
    /// requester hears "not answered in time" rather than timing out).
    pub accept_timeout: Duration,
    /// The window this end grants the sender of each application flow;
    /// `None` turns credit off (this end then behaves as a peer that never
    /// heard of it).
    pub credit: Option<Window>,
}

impl Config {
    /// Defaults for everything but the DIF name and side.
    pub fn new(dif: impl Into<String>, side: Side) -> Self {
        Config {
            dif: dif.into(),
            side,
            vmpi_id: 0,
            max_sdu: DEFAULT_MAX_SDU,
            alloc_timeout: Duration::from_secs(2),
            accept_timeout: Duration::from_millis(1500),
            credit: Some(credit::DEFAULT_WINDOW),
        }
    }
}

/// Why an operation of the shim failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ShimHvError {
    /// The other end of the device is not there (not started, or dead).
    #[error("the other end of the VMPI device is not attached")]
    PeerDown,
    /// The name is already registered in this IPCP.
    #[error("{0} is already registered in this shim DIF")]
    NameInUse(Box<AppName>),
    /// The peer refused the flow (name not registered there, or the application said no).
    #[error("flow refused by the other end: {0}")]
    Refused(String),
    /// The shim cannot provide what the QoS spec asks for.
    #[error("QoS not satisfiable: {0}")]
    QosNotSatisfiable(String),
    /// An SDU is larger than the flow's maximum.
    #[error("SDU of {size} bytes is larger than the flow's maximum of {max}")]
    SduTooLarge { size: usize, max: u32 },
    /// An SDU of zero bytes.
    #[error("empty SDU: an SDU is at least one byte")]
    EmptySdu,
    /// The peer did not answer the allocation request in time.
    #[error("no answer from the other end within {0:?}")]
    Timeout(Duration),
    /// The peer went away during the allocation.
    #[error("the other end went away")]
    PeerLost,
    /// No flow with this port-id, or it is not allocated yet.
    #[error("no allocated flow with port-id {0}")]
    UnknownFlow(PortId),
    /// No pending flow request with this handle.
    #[error("no pending flow request {0}")]
    UnknownRequest(u64),
    /// The port-id is already used by another flow.
    #[error("port-id {0} is already in use")]
    PortInUse(PortId),
    /// All 63 data channels are in use.
    #[error("all {} data channels are in use", MAX_CHANNELS - 1)]
    NoChannel,
    /// The flow has no credit left: ask [`ShimHv::may_send`] first.
    #[error("flow {0} has no credit left")]
    NoCredit(PortId),
}

/// Something the driver must do.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send this buffer (channel header included) on the send ring.
    Transmit { buf: Vec<u8> },
    /// Ask the application that registered `local` whether it accepts a flow
    /// from `remote`; answer with [`ShimHv::accept`] or [`ShimHv::refuse`].
    FlowRequest {
        handle: u64,
        local: AppName,
        remote: AppName,
        qos: QosSpec,
    },
    /// Request `handle` was withdrawn (timeout, or the peer went away).
    RequestWithdrawn { handle: u64 },
    /// A flow asked for with [`ShimHv::allocate`] now exists on both ends.
    Allocated { port: PortId, max_sdu: u32 },
    /// A flow asked for with [`ShimHv::allocate`] could not be set up.
    AllocateFailed { port: PortId, error: ShimHvError },
    /// The flow is gone: the peer deallocated it or went away.
    Deallocated { port: PortId },
}

/// Why a received buffer was dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DropReason {
    /// It could not be parsed.
    Malformed(VmpiError),
    /// Data on a channel with no flow.
    UnknownChannel(u32),
    /// A data buffer with no SDU.
    EmptySdu(u32),
    /// An SDU larger than this end's maximum.
    TooLarge { channel: u32, len: usize },
    /// A control message that fits no state (late or duplicated).
    Unexpected(u32),
    /// A credit message that was refused.
    BadCredit(CreditError),
    /// Data beyond the window this end granted.
    OverCredit(u32),
}

/// What became of a received buffer.
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
    /// Buffers received.
    pub rx_buffers: u64,
    /// Buffers sent (data and control).
    pub tx_buffers: u64,
    /// Buffers that could not be parsed.
    pub rx_malformed: u64,
    /// Data on channels with no flow.
    pub rx_unknown_channel: u64,
    /// Control messages that fit no state.
    pub rx_unexpected: u64,
    /// Allocation requests received.
    pub alloc_requests_in: u64,
    /// Allocation requests this end refused.
    pub alloc_refused: u64,
    /// Allocations this end asked for that timed out.
    pub alloc_timeouts: u64,
    /// Both ends picked the same channel at once.
    pub channel_collisions: u64,
    /// Times the peer went away.
    pub peer_losses: u64,
    /// Credit messages sent.
    pub credits_sent: u64,
    /// Grants sent again because the peer stayed silent after them (one
    /// may have been lost).
    pub credits_resent: u64,
    /// Credit messages taken.
    pub credits_received: u64,
    /// Credit messages dropped: too much credit, credit taken back, or
    /// for a channel with no flow limited by credit.
    pub rx_bad_credit: u64,
    /// SDUs dropped because their sender had no credit for them.
    pub rx_over_credit: u64,
}

impl Counters {
    /// The counters by name, for listings.
    pub fn to_map(&self) -> BTreeMap<String, u64> {
        [
            ("rx_buffers", self.rx_buffers),
            ("tx_buffers", self.tx_buffers),
            ("rx_malformed", self.rx_malformed),
            ("rx_unknown_channel", self.rx_unknown_channel),
            ("rx_unexpected", self.rx_unexpected),
            ("alloc_requests_in", self.alloc_requests_in),
            ("alloc_refused", self.alloc_refused),
            ("alloc_timeouts", self.alloc_timeouts),
            ("channel_collisions", self.channel_collisions),
            ("peer_losses", self.peer_losses),
            ("credits_sent", self.credits_sent),
            ("credits_resent", self.credits_resent),
            ("credits_received", self.credits_received),
            ("rx_bad_credit", self.rx_bad_credit),
            ("rx_over_credit", self.rx_over_credit),
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
    /// Its VMPI channel.
    pub channel: u32,
    /// Whether both ends agreed it exists.
    pub allocated: bool,
    /// Traffic counters.
    pub counters: FlowCounters,
    /// Its flow control.
    credit: FlowCredit,
}

impl Flow {
    fn new(local: AppName, remote: AppName, channel: u32, allocated: bool) -> Flow {
        Flow {
            local,
            remote,
            channel,
            allocated,
            counters: FlowCounters::default(),
            credit: FlowCredit::default(),
        }
    }

    /// SDUs this end may still send before the peer grants more, if the
    /// peer limits them.
    pub fn credit_left(&self) -> Option<u64> {
        self.credit.tx.as_ref().map(TxCredit::sdus_left)
    }

    /// SDUs received and not delivered yet, if this end limits the sender.
    pub fn held(&self) -> Option<u64> {
        self.credit.rx.as_ref().map(RxCredit::held)
    }
}

/// The flow control of one flow.
#[derive(Debug, Clone, Copy, Default)]
struct FlowCredit {
    /// What this end announced (or will): `None` without credit support.
    announced: Option<Window>,
    /// The peer's limit on what this end sends.
    tx: Option<TxCredit>,
    /// This end's limit on what the peer sends.
    rx: Option<RxCredit>,
    /// When to check whether the last grant got through.
    regrant: Option<Regrant>,
}

/// A grant may be lost (the control backlog overflows while the ring is
/// full; the peer was away): if the sender, allowed more, sends nothing
/// for a while, the grant is sent again, then again after twice as long,
/// up to [`REGRANT_MAX`], until data comes or no grant is outstanding.
#[derive(Debug, Clone, Copy)]
struct Regrant {
    at: Instant,
    wait: Duration,
    /// SDUs received when the check was set.
    seen: u64,
}

/// First wait before a grant is sent again for lack of data.
pub const REGRANT_FIRST: Duration = Duration::from_millis(250);
/// Longest wait between two repetitions of a grant.
pub const REGRANT_MAX: Duration = Duration::from_secs(8);

impl FlowCredit {
    /// Both ends announced: each limits the other as it said.
    fn agreed(announced: Window, peer: Window) -> FlowCredit {
        FlowCredit {
            announced: Some(announced),
            tx: peer.limited().map(TxCredit::new),
            rx: announced.limited().map(RxCredit::new),
            regrant: None,
        }
    }
}

/// What a channel is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chan {
    /// Our request is out; the flow is `port`.
    Allocating { port: PortId, deadline: Instant },
    /// The peer's request waits for the application (`handle`).
    Pending { handle: u64 },
    /// A flow.
    Open { port: PortId },
}

/// An incoming request waiting for the application's answer.
#[derive(Debug)]
struct Pending {
    channel: u32,
    local: AppName,
    remote: AppName,
    deadline: Instant,
    /// The requester's credit extension.
    credit: Option<Window>,
}

/// One shim-hv IPC process.
#[derive(Debug)]
pub struct ShimHv {
    cfg: Config,
    names: BTreeSet<AppName>,
    chans: BTreeMap<u32, Chan>,
    flows: IdMap<PortId, Flow>,
    pending: BTreeMap<u64, Pending>,
    last_channel: u32,
    next_handle: u64,
    peer_up: bool,
    actions: VecDeque<Action>,
    counters: Counters,
    relay: link::RelayGate,
    /// The latest time the machine was told (for timers started by calls
    /// that do not take one).
    clock: Instant,
}

impl ShimHv {
    /// A shim IPCP with no names and no flows, its peer down.
    pub fn new(cfg: Config) -> Self {
        let last_channel = match cfg.side {
            Side::Host => 0,
            Side::Guest => MAX_CHANNELS,
        };
        ShimHv {
            cfg,
            names: BTreeSet::new(),
            chans: BTreeMap::new(),
            flows: IdMap::default(),
            pending: BTreeMap::new(),
            last_channel,
            next_handle: 1,
            peer_up: false,
            actions: VecDeque::new(),
            counters: Counters::default(),
            relay: link::RelayGate::default(),
            clock: Instant::ZERO,
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

    /// Whether the other end is attached.
    pub fn is_peer_up(&self) -> bool {
        self.peer_up
    }

    /// Registered names.
    pub fn names(&self) -> impl Iterator<Item = &AppName> {
        self.names.iter()
    }

    /// Flows, allocated or in progress.
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

    /// Registers an application name so that the peer can allocate flows to it.
    pub fn register(&mut self, name: AppName) -> Result<(), ShimHvError> {
        if !self.names.insert(name.clone()) {
            return Err(ShimHvError::NameInUse(Box::new(name)));
        }
        Ok(())
    }

    /// Withdraws a name; pending requests for it are refused.
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

    fn check_qos(&self, qos: &QosSpec) -> Result<(), ShimHvError> {
        let offer = crate::shim_qos::ShimQos {
            what: "for hypervisors",
            max_sdu: self.cfg.max_sdu,
            max_sdu_note: "",
            in_order: true,
            loss_note: " (SDUs are lost if the other end goes away)",
        };
        match offer.refusal(qos) {
            Some(why) => Err(ShimHvError::QosNotSatisfiable(why)),
            None => Ok(()),
        }
    }

    /// A free data channel, in this side's direction.
    fn free_channel(&mut self) -> Option<u32> {
        let n = MAX_CHANNELS - 1;
        for k in 1..=n {
            let last = i64::from(self.last_channel);
            let step = match self.cfg.side {
                Side::Host => i64::from(k),
                Side::Guest => -i64::from(k),
            };
            let c = ((last - 1 + step).rem_euclid(i64::from(n)) + 1) as u32;
            if !self.chans.contains_key(&c) {
                self.last_channel = c;
                return Some(c);
            }
        }
        None
    }

    /// Starts allocating a flow from `local` to `remote` on port `port`; the
    /// outcome comes as [`Action::Allocated`] or [`Action::AllocateFailed`].
    /// An application flow: limited by credit if both ends support it.
    pub fn allocate(
        &mut self,
        now: Instant,
        port: PortId,
        local: AppName,
        remote: AppName,
        qos: QosSpec,
    ) -> Result<(), ShimHvError> {
        self.allocate_with(now, port, (local, remote), qos, true)
    }

    /// What this end announces for a flow: its window if `windowed`, no
    /// limit if not; nothing without credit support.
    fn announcement(&self, windowed: bool) -> Option<Window> {
        let none = Window { sdus: 0, bytes: 0 };
        self.cfg.credit.map(|w| {
            if windowed {
                w.limited().unwrap_or(none)
            } else {
                none
            }
        })
    }

    /// [`ShimHv::allocate`]; `windowed` false for a flow whose SDUs must
    /// never be held at the receiving end (an N-1 flow of a normal IPCP):
    /// this end then grants the peer no limit.
    pub fn allocate_with(
        &mut self,
        now: Instant,
        port: PortId,
        (local, remote): (AppName, AppName),
        qos: QosSpec,
        windowed: bool,
    ) -> Result<(), ShimHvError> {
        if self.flows.contains_key(&port) {
            return Err(ShimHvError::PortInUse(port));
        }
        if !self.peer_up {
            return Err(ShimHvError::PeerDown);
        }
        self.check_qos(&qos)?;
        let channel = self.free_channel().ok_or(ShimHvError::NoChannel)?;
        self.chans.insert(
            channel,
            Chan::Allocating {
                port,
                deadline: now + self.cfg.alloc_timeout,
            },
        );
        let announced = self.announcement(windowed);
        self.transmit(Control::AllocateReq {
            channel,
            src: local.clone(),
            dst: remote.clone(),
            credit: announced,
        });
        let mut flow = Flow::new(local, remote, channel, false);
        flow.credit.announced = announced;
        self.flows.insert(port, flow);
        Ok(())
    }

    /// Accepts incoming request `handle` as flow `port`; returns its max SDU.
    /// An application flow, as with [`ShimHv::allocate`].
    pub fn accept(&mut self, handle: u64, port: PortId) -> Result<u32, ShimHvError> {
        self.accept_with(handle, port, true)
    }

    /// [`ShimHv::accept`]; `windowed` as in [`ShimHv::allocate_with`].
    pub fn accept_with(
        &mut self,
        handle: u64,
        port: PortId,
        windowed: bool,
    ) -> Result<u32, ShimHvError> {
        if self.flows.contains_key(&port) {
            return Err(ShimHvError::PortInUse(port));
        }
        let p = self
            .pending
            .remove(&handle)
            .ok_or(ShimHvError::UnknownRequest(handle))?;
        self.chans.insert(p.channel, Chan::Open { port });
        let mut flow = Flow::new(p.local, p.remote, p.channel, true);
        // Credit only if the requester announced it.
        let announced = p.credit.and(self.announcement(windowed));
        if let (Some(mine), Some(theirs)) = (announced, p.credit) {
            flow.credit = FlowCredit::agreed(mine, theirs);
        }
        self.flows.insert(port, flow);
        self.transmit(Control::AllocateResp {
            channel: p.channel,
            ok: true,
            reason: String::new(),
            credit: announced,
        });
        Ok(self.cfg.max_sdu)
    }

    /// Refuses incoming request `handle`, telling the requester why.
    pub fn refuse(&mut self, handle: u64, reason: &str) -> Result<(), ShimHvError> {
        let p = self
            .pending
            .remove(&handle)
            .ok_or(ShimHvError::UnknownRequest(handle))?;
        self.chans.remove(&p.channel);
        self.counters.alloc_refused += 1;
        self.transmit(Control::AllocateResp {
            channel: p.channel,
            ok: false,
            reason: reason.to_string(),
            credit: None,
        });
        Ok(())
    }

    /// Deallocates a flow and tells the peer.
    pub fn deallocate(&mut self, port: PortId) -> Result<(), ShimHvError> {
        let flow = self
            .flows
            .remove(&port)
            .ok_or(ShimHvError::UnknownFlow(port))?;
        self.chans.remove(&flow.channel);
        if self.peer_up {
            self.transmit(Control::Deallocate {
                channel: flow.channel,
            });
        }
        Ok(())
    }

    /// Accounts an SDU of `len` bytes written on flow `port`; returns the
    /// channel header to put in front of it.
    pub fn send_header(
        &mut self,
        port: PortId,
        len: usize,
    ) -> Result<[u8; CHANNEL_HEADER], ShimHvError> {
        let max = self.cfg.max_sdu;
        let flow = self
            .flows
            .get_mut(&port)
            .filter(|f| f.allocated)
            .ok_or(ShimHvError::UnknownFlow(port))?;
        if len == 0 {
            flow.counters.drops_out += 1;
            return Err(ShimHvError::EmptySdu);
        }
        if len > max as usize {
            flow.counters.drops_out += 1;
            return Err(ShimHvError::SduTooLarge { size: len, max });
        }
        if let Some(tx) = &mut flow.credit.tx {
            if !tx.can_send() {
                flow.counters.drops_out += 1;
                return Err(ShimHvError::NoCredit(port));
            }
            tx.on_sent(len);
        }
        flow.counters.sdus_out += 1;
        flow.counters.bytes_out += len as u64;
        self.counters.tx_buffers += 1;
        Ok(vmpi::header(flow.channel))
    }

    /// Undoes the accounting of [`ShimHv::send_header`] for an SDU the ring
    /// could not take after all, counting it as dropped.
    pub fn unsend(&mut self, port: PortId, len: usize) {
        if let Some(f) = self.flows.get_mut(&port) {
            if let Some(tx) = &mut f.credit.tx {
                tx.unsend(len);
            }
            f.counters.sdus_out = f.counters.sdus_out.saturating_sub(1);
            f.counters.bytes_out = f.counters.bytes_out.saturating_sub(len as u64);
            f.counters.drops_out += 1;
            self.counters.tx_buffers = self.counters.tx_buffers.saturating_sub(1);
        }
    }

    /// Takes back what [`ShimHv::on_data_header`] counted for a data
    /// buffer of `len` bytes on `port` that the driver left in the ring,
    /// to take it again later (the application had no room yet).
    pub fn unreceive(&mut self, port: PortId, len: usize) {
        self.counters.rx_buffers = self.counters.rx_buffers.saturating_sub(1);
        if let Some(f) = self.flows.get_mut(&port) {
            if let Some(rx) = &mut f.credit.rx {
                rx.unreceive(len);
            }
            f.counters.sdus_in = f.counters.sdus_in.saturating_sub(1);
            f.counters.bytes_in = f.counters.bytes_in.saturating_sub(len as u64);
        }
    }

    /// Whether flow `port` may send its next SDU (of any size) now: false
    /// only for a flow the peer limits and whose credit is used up. The
    /// driver then stops reading that flow, and asks again once buffers
    /// came from the peer (a grant is a control buffer).
    pub fn may_send(&self, port: PortId) -> bool {
        self.flows
            .get(&port)
            .and_then(|f| f.credit.tx.as_ref())
            .is_none_or(TxCredit::can_send)
    }

    /// Whether this end limits what the peer sends on flow `port`: the
    /// driver may then hold what the application cannot take yet (at most
    /// the window: the machine drops what goes beyond) instead of leaving
    /// it in the ring, and must tell [`ShimHv::delivered`].
    pub fn rx_flow_controlled(&self, port: PortId) -> bool {
        self.flows.get(&port).is_some_and(|f| f.credit.rx.is_some())
    }

    /// `sdus` SDUs of `bytes` bytes received on flow `port` reached its
    /// application (or were dropped after all) at `now`: when a quarter of
    /// the window was taken, the peer is granted more (an
    /// [`Action::Transmit`]), and the grant is sent again if the peer then
    /// stays silent ([`REGRANT_FIRST`]). Nothing for a flow without credit.
    pub fn delivered(&mut self, now: Instant, port: PortId, sdus: u64, bytes: u64) {
        self.clock = self.clock.max(now);
        let Some(f) = self.flows.get_mut(&port) else {
            return;
        };
        let channel = f.channel;
        let Some(grant) = f
            .credit
            .rx
            .as_mut()
            .and_then(|rx| rx.on_delivered(sdus, bytes))
        else {
            return;
        };
        let seen = f.credit.rx.as_ref().map_or(0, RxCredit::received);
        f.credit.regrant = Some(Regrant {
            at: self.clock + REGRANT_FIRST,
            wait: REGRANT_FIRST,
            seen,
        });
        if self.peer_up {
            self.counters.credits_sent += 1;
            self.transmit(Control::Credit {
                channel,
                sdus: grant.0,
                bytes: grant.1,
            });
        }
    }

    /// Sends grants again whose sender stayed silent though allowed more
    /// (see [`Regrant`]).
    fn regrant(&mut self, now: Instant) {
        let mut again = Vec::new();
        for f in self.flows.values_mut() {
            let (Some(r), Some(rx)) = (f.credit.regrant, f.credit.rx.as_ref()) else {
                continue;
            };
            if now < r.at {
                continue;
            }
            if !rx.has_room() {
                // The sender used all it was granted: the next grant comes
                // when the application takes some.
                f.credit.regrant = None;
                continue;
            }
            let quiet = rx.received() == r.seen;
            if quiet {
                again.push((f.channel, rx.granted()));
            }
            let wait = if quiet {
                (r.wait * 2).min(REGRANT_MAX)
            } else {
                r.wait
            };
            f.credit.regrant = Some(Regrant {
                at: now + wait,
                wait,
                seen: rx.received(),
            });
        }
        if !self.peer_up {
            return;
        }
        for (channel, (sdus, bytes)) in again {
            self.counters.credits_sent += 1;
            self.counters.credits_resent += 1;
            self.transmit(Control::Credit {
                channel,
                sdus,
                bytes,
            });
        }
    }

    /// The relay back-pressure of this device (see [`link::RelayGate`];
    /// [`crate::system::System::hv_may_read`] drives it).
    pub fn relay_gate(&mut self) -> &mut link::RelayGate {
        &mut self.relay
    }

    /// Times the receive ring paused for a congested backlog elsewhere.
    pub fn relay_pauses(&self) -> u64 {
        self.relay.pauses()
    }

    /// Whether actions wait for [`ShimHv::poll_action`].
    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    /// The other end is attached (its heartbeat moves).
    pub fn peer_up(&mut self) {
        self.peer_up = true;
    }

    /// The other end went away: every flow and request is over.
    pub fn peer_lost(&mut self) {
        if self.peer_up {
            self.counters.peer_losses += 1;
        }
        self.peer_up = false;
        for (_, c) in std::mem::take(&mut self.chans) {
            match c {
                Chan::Open { port } => {
                    self.flows.remove(&port);
                    self.actions.push_back(Action::Deallocated { port });
                }
                Chan::Allocating { port, .. } => {
                    self.flows.remove(&port);
                    self.actions.push_back(Action::AllocateFailed {
                        port,
                        error: ShimHvError::PeerLost,
                    });
                }
                Chan::Pending { handle } => {
                    self.pending.remove(&handle);
                    self.actions.push_back(Action::RequestWithdrawn { handle });
                }
            }
        }
    }

    /// Processes one buffer taken from the receive ring.
    pub fn on_buffer<'a>(&mut self, now: Instant, buf: &'a [u8]) -> Received<'a> {
        self.clock = self.clock.max(now);
        self.counters.rx_buffers += 1;
        let (ch, payload) = match vmpi::split(buf) {
            Ok(x) => x,
            Err(e) => {
                self.counters.rx_malformed += 1;
                return Received::Dropped(DropReason::Malformed(e));
            }
        };
        if ch != CONTROL_CHANNEL {
            return self.on_data(ch, payload);
        }
        let msg = match Control::parse(payload) {
            Ok(m) => m,
            Err(e) => {
                self.counters.rx_malformed += 1;
                return Received::Dropped(DropReason::Malformed(e));
            }
        };
        match msg {
            Control::AllocateReq {
                channel,
                src,
                dst,
                credit,
            } => self.on_alloc_req(now, channel, (src, dst), credit),
            Control::AllocateResp {
                channel,
                ok,
                reason,
                credit,
            } => self.on_alloc_resp(channel, ok, reason, credit),
            Control::Credit {
                channel,
                sdus,
                bytes,
            } => self.on_credit(channel, sdus, bytes),
            Control::Deallocate { channel } => match self.chans.get(&channel) {
                Some(Chan::Open { port }) => {
                    let port = *port;
                    self.chans.remove(&channel);
                    self.flows.remove(&port);
                    self.actions.push_back(Action::Deallocated { port });
                    Received::Control
                }
                _ => self.unexpected(channel),
            },
        }
    }

    /// A grant of the peer for the sender of `channel`.
    fn on_credit(&mut self, channel: u32, sdus: u64, bytes: u64) -> Received<'static> {
        let tx = match self.chans.get(&channel) {
            Some(Chan::Open { port }) => {
                self.flows.get_mut(port).and_then(|f| f.credit.tx.as_mut())
            }
            _ => None,
        };
        let r = match tx {
            Some(tx) => tx.on_grant(sdus, bytes),
            None => Err(CreditError::NoFlow(channel)),
        };
        match r {
            Ok(()) => {
                self.counters.credits_received += 1;
                Received::Control
            }
            Err(e) => {
                self.counters.rx_bad_credit += 1;
                Received::Dropped(DropReason::BadCredit(e))
            }
        }
    }

    fn unexpected(&mut self, channel: u32) -> Received<'static> {
        self.counters.rx_unexpected += 1;
        Received::Dropped(DropReason::Unexpected(channel))
    }

    fn on_data<'a>(&mut self, ch: u32, sdu: &'a [u8]) -> Received<'a> {
        match self.data_port(ch, sdu.len()) {
            Ok(port) => Received::Deliver { port, sdu },
            Err(r) => Received::Dropped(r),
        }
    }

    /// Processes the header of a data buffer of channel `ch` whose SDU of
    /// `len` bytes the driver hands over itself without copying it (from
    /// the ring straight to the application's socket): the flow it goes
    /// to, or why it is dropped. Counts as [`ShimHv::on_buffer`] does.
    pub fn on_data_header(&mut self, ch: u32, len: usize) -> Result<PortId, DropReason> {
        self.counters.rx_buffers += 1;
        if ch == CONTROL_CHANNEL {
            // Control messages are parsed from a copy, with on_buffer.
            self.counters.rx_unexpected += 1;
            return Err(DropReason::Unexpected(ch));
        }
        self.data_port(ch, len)
    }

    /// The flow data channel `ch` belongs to, if it is open (nothing is
    /// counted: a driver asks this to pick its path before taking a buffer).
    pub fn channel_port(&self, ch: u32) -> Option<PortId> {
        match self.chans.get(&ch) {
            Some(Chan::Open { port }) => Some(*port),
            _ => None,
        }
    }

    fn data_port(&mut self, ch: u32, len: usize) -> Result<PortId, DropReason> {
        let Some(Chan::Open { port }) = self.chans.get(&ch) else {
            self.counters.rx_unknown_channel += 1;
            return Err(DropReason::UnknownChannel(ch));
        };
        let port = *port;
        let max = self.cfg.max_sdu as usize;
        let Some(f) = self.flows.get_mut(&port) else {
            self.counters.rx_unknown_channel += 1;
            return Err(DropReason::UnknownChannel(ch));
        };
        if f.credit.rx.as_mut().is_some_and(|rx| !rx.on_data(len)) {
            f.counters.drops_in += 1;
            self.counters.rx_over_credit += 1;
            return Err(DropReason::OverCredit(ch));
        }
        let bad = if len == 0 {
            Some(DropReason::EmptySdu(ch))
        } else if len > max {
            Some(DropReason::TooLarge { channel: ch, len })
        } else {
            None
        };
        if let Some(why) = bad {
            f.counters.drops_in += 1;
            // Its credit goes back: it is not held.
            self.delivered(self.clock, port, 1, len as u64);
            return Err(why);
        }
        f.counters.sdus_in += 1;
        f.counters.bytes_in += len as u64;
        Ok(port)
    }

    fn on_alloc_req(
        &mut self,
        now: Instant,
        channel: u32,
        (src, dst): (AppName, AppName),
        credit: Option<Window>,
    ) -> Received<'static> {
        self.counters.alloc_requests_in += 1;
        match self.chans.get(&channel).copied() {
            None => {}
            Some(Chan::Allocating { port, .. }) if self.cfg.side == Side::Guest => {
                // Both picked this channel: the host's request wins.
                self.counters.channel_collisions += 1;
                self.chans.remove(&channel);
                self.flows.remove(&port);
                self.actions.push_back(Action::AllocateFailed {
                    port,
                    error: ShimHvError::Refused(
                        "both ends picked the same channel; try again".into(),
                    ),
                });
            }
            Some(Chan::Allocating { .. }) => {
                self.counters.channel_collisions += 1;
                self.counters.alloc_refused += 1;
                self.transmit(Control::AllocateResp {
                    channel,
                    ok: false,
                    reason: "both ends picked the same channel; try again".into(),
                    credit: None,
                });
                return Received::Control;
            }
            Some(_) => {
                // A request for a channel in use: the peer is confused.
                self.counters.alloc_refused += 1;
                self.transmit(Control::AllocateResp {
                    channel,
                    ok: false,
                    reason: format!("channel {channel} is in use"),
                    credit: None,
                });
                return Received::Control;
            }
        }
        if !self.names.contains(&dst) {
            self.counters.alloc_refused += 1;
            self.transmit(Control::AllocateResp {
                channel,
                ok: false,
                reason: format!("{dst} is not registered"),
                credit: None,
            });
            return Received::Control;
        }
        let handle = self.next_handle;
        self.next_handle += 1;
        self.chans.insert(channel, Chan::Pending { handle });
        self.pending.insert(
            handle,
            Pending {
                channel,
                local: dst.clone(),
                remote: src.clone(),
                deadline: now + self.cfg.accept_timeout,
                credit,
            },
        );
        self.actions.push_back(Action::FlowRequest {
            handle,
            local: dst,
            remote: src,
            qos: QosSpec::default(),
        });
        Received::Control
    }

    fn on_alloc_resp(
        &mut self,
        channel: u32,
        ok: bool,
        reason: String,
        credit: Option<Window>,
    ) -> Received<'static> {
        let Some(Chan::Allocating { port, .. }) = self.chans.get(&channel).copied() else {
            if ok && !self.chans.contains_key(&channel) {
                // A late acceptance of a flow we gave up on: release it.
                self.transmit(Control::Deallocate { channel });
            }
            return self.unexpected(channel);
        };
        if ok {
            self.chans.insert(channel, Chan::Open { port });
            if let Some(f) = self.flows.get_mut(&port) {
                f.allocated = true;
                // Credit only if both announced it.
                if let (Some(mine), Some(theirs)) = (f.credit.announced, credit) {
                    f.credit = FlowCredit::agreed(mine, theirs);
                }
            }
            self.actions.push_back(Action::Allocated {
                port,
                max_sdu: self.cfg.max_sdu,
            });
        } else {
            self.chans.remove(&channel);
            self.flows.remove(&port);
            self.actions.push_back(Action::AllocateFailed {
                port,
                error: ShimHvError::Refused(reason),
            });
        }
        Received::Control
    }

    /// When [`ShimHv::handle_timeout`] next needs to run, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let a = self.chans.values().filter_map(|c| match c {
            Chan::Allocating { deadline, .. } => Some(*deadline),
            _ => None,
        });
        let r = self
            .flows
            .values()
            .filter_map(|f| f.credit.regrant.map(|r| r.at));
        a.chain(self.pending.values().map(|p| p.deadline))
            .chain(r)
            .min()
    }

    /// Expires allocations and requests that waited too long, and sends
    /// again grants that may have been lost.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.clock = self.clock.max(now);
        self.regrant(now);
        let late: Vec<(u32, PortId)> = self
            .chans
            .iter()
            .filter_map(|(ch, c)| match c {
                Chan::Allocating { port, deadline } if now >= *deadline => Some((*ch, *port)),
                _ => None,
            })
            .collect();
        for (ch, port) in late {
            self.chans.remove(&ch);
            self.flows.remove(&port);
            self.counters.alloc_timeouts += 1;
            self.actions.push_back(Action::AllocateFailed {
                port,
                error: ShimHvError::Timeout(self.cfg.alloc_timeout),
            });
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

    fn transmit(&mut self, msg: Control) {
        self.counters.tx_buffers += 1;
        self.actions.push_back(Action::Transmit {
            buf: msg.to_buffer(),
        });
    }
}

#[cfg(test)]
mod tests;
