//! The flow allocator of the normal IPCP: flow objects created and deleted
//! on the peer IPCP with CDAP ([`rina_wire::fa`]: `M_CREATE` / `M_CREATE_R`
//! / `M_DELETE` / `M_DELETE_R` of `/fa/flows/key=<address>-<CEP-id>`), with
//! the same API as the shim IPCPs so that the daemon drives every IPCP alike.
//!
//! # A machine of its own
//!
//! `FlowAllocator` owns its state (names registered, allocations asked
//! for, requests waiting for an application, what was accepted and refused,
//! DEALLOCs waiting for their acknowledgement) and its counters. Each call
//! gets a `Ctx`: the IPCP's settings and a read-only view of its open
//! flows (an endpoint by flow, a flow by CEP-id, how many). It never
//! changes the IPCP: what it wants done comes back as `FaOut` (send a
//! message, open or close a flow, report to the driver), which the IPCP's
//! glue (`fa_glue`) carries out in order. Opening a flow is the one step
//! whose outcome the allocator needs back: the glue opens it and answers
//! with `FlowAllocator::opened` (requester) or
//! `FlowAllocator::accepted` (responder).
//!
//! # Handshake
//!
//! [`NormalIpcp::allocate`](super::NormalIpcp::allocate) looks the destination name up (registered here,
//! or in the static directory), picks a QoS cube ([`NormalIpcp::choose_cube`](super::NormalIpcp::choose_cube))
//! and a fresh CEP-id, and creates the flow object on the destination
//! IPCP (REQUEST, a CDAP `M_CREATE`, [`rina_wire::fa`]) in a management PDU to the destination IPCP's address; the RMT routes it, and
//! intermediate IPCPs relay it like data. The destination IPCP refuses at
//! once what it cannot serve (name not registered, unknown cube, no room) or
//! asks the application with [`Action::FlowRequest`]. The application
//! answers with [`NormalIpcp::accept`](super::NormalIpcp::accept) — the responder opens its end of the
//! flow with the cube's EFCP policies and answers ACCEPTED with its CEP-id —
//! or [`NormalIpcp::refuse`](super::NormalIpcp::refuse); if it does not answer within
//! `accept_timeout` the request is refused on its behalf and
//! [`Action::RequestWithdrawn`] reported. On ACCEPTED the requester opens
//! its end and reports [`Action::Allocated`]; on anything else
//! [`Action::AllocateFailed`].
//!
//! # Loss
//!
//! Management PDUs are not retransmitted by EFCP, so the requester repeats
//! its REQUEST every `alloc_retry` until answered and gives up after
//! `alloc_timeout` ([`NormalError::Timeout`]). Giving up (or
//! deallocating before the answer) sends a cancel once: a DEALLOC naming
//! no flow object of the responder's (CEP-id 0), which withdraws the
//! request if the application has not answered yet
//! ([`Action::RequestWithdrawn`]), so that a late acceptance does not open
//! a flow nobody will use. The responder knows a
//! repeated request by the requester's (address, CEP-id): if it accepted it,
//! it sends ACCEPTED again; if the application has not answered yet, it
//! ignores it; if the application refused it (or did not answer in time)
//! within the last `alloc_timeout`, it sends the refusal again. An ACCEPTED for an allocation the requester gave up on (or
//! deallocated before it completed) within the last `alloc_timeout` is
//! answered with DEALLOC, so the responder does not keep a half-open flow;
//! the requester remembers the (responder's address, own CEP-id) of each,
//! at most `max_flows`. Any other ACCEPTED for no flow here is counted
//! (`rx_fa_stale`) and dropped: answering it would have one forged answer
//! send DEALLOCs to any address until `alloc_timeout`.
//!
//! DEALLOC (`M_DELETE` of the peer's flow object) is acknowledged
//! (`M_DELETE_R`) and repeated every `alloc_retry` until it is, for at most
//! `alloc_timeout`; a repeated DEALLOC for a flow already gone is
//! acknowledged again, so losing either message only delays the teardown.
//! A refusal carries its reason (`M_CREATE_R`'s `result` and
//! `result_reason`), reported as the matching [`NormalError`].
//!
//! # Local flows
//!
//! A flow to a name registered at this same IPCP is supported: its
//! management and data PDUs addressed to this IPCP's own address go through
//! an internal loopback instead of the RMT, so both ends are flows of this
//! IPCP (two CEP-ids, one connection each way).

use super::{Action, CepId, Endpoint, Flow, FlowId, NormalConfig, NormalError};
use crate::ids::IdMap;
use crate::rmt::Address;
use crate::time::Instant;
use rina_wire::codec::truncate_utf8;
use rina_wire::fa::{FaMessage, FaResult};
use rina_wire::{AppName, QosSpec};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

mod incoming;
mod retransmit;
#[cfg(test)]
mod tests;
use retransmit::Retransmit;

/// Longest refusal reason sent to a peer, in bytes (also cut to fit a PDU).
pub const MAX_REASON_LEN: usize = 512;

/// How long a flow the peer deallocated waits for the data PDUs the
/// DEALLOC overtook before it closes anyway (they were lost).
pub const DEALLOC_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// The CEP-id no flow ever has (numbering wraps from the largest to 1): in
/// a DEALLOC, "the flow object you have not created yet", which cancels
/// the request sent from the DEALLOC's `src_cep`.
pub(super) const NO_CEP: CepId = 0;

/// What the flow allocator reads of the IPCP for one call: its settings and
/// a read-only view of its open flows.
pub(super) struct Ctx<'a> {
    pub(super) cfg: &'a NormalConfig,
    pub(super) flows: &'a IdMap<FlowId, Box<Flow>>,
    pub(super) by_cep: &'a IdMap<CepId, FlowId>,
}

impl Ctx<'_> {
    /// The endpoint of open flow `flow`.
    fn endpoint(&self, flow: FlowId) -> Option<Endpoint> {
        self.flows.get(&flow).map(|f| f.ep)
    }

    /// The open flow on local CEP-id `cep`.
    fn at_cep(&self, cep: CepId) -> Option<FlowId> {
        self.by_cep.get(&cep).copied()
    }

    /// Open flows.
    fn open_flows(&self) -> usize {
        self.flows.len()
    }

    fn max_sdu(&self) -> u32 {
        u32::try_from(self.cfg.max_sdu).unwrap_or(u32::MAX)
    }
}

/// What the flow allocator asks the IPCP to do, in order.
#[derive(Debug)]
pub(super) enum FaOut {
    /// Send the encoded FA message to the IPCP at `to`. A `request` is one
    /// on the peer's flow object (REQUEST, DEALLOC) whose answer comes back
    /// through the session with that peer.
    Send {
        to: Address,
        message: Vec<u8>,
        request: bool,
    },
    /// No answer to `message` (a request sent to `to`) is awaited any more.
    Settle { to: Address, message: Vec<u8> },
    /// The peer accepted allocation `flow`: open it as `ep`, then tell
    /// [`FlowAllocator::opened`] how it went.
    Open {
        flow: FlowId,
        ep: Endpoint,
        max_sdu: u32,
    },
    /// The peer deleted `flow`: close it.
    Close { flow: FlowId },
    /// The peer deleted `flow` after sending data PDU `last_seq`, which
    /// has not come yet: close it once it has (or after
    /// [`DEALLOC_GRACE`]), reporting [`Action::Deallocated`] then.
    CloseAfter { flow: FlowId, last_seq: u64 },
    /// Report this to the driver.
    Report(Box<Action>),
}

/// The flow allocator's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct FaCounters {
    pub(super) alloc_requests_in: u64,
    pub(super) alloc_refused: u64,
    pub(super) alloc_retries: u64,
    pub(super) alloc_timeouts: u64,
    pub(super) dealloc_retries: u64,
    pub(super) dealloc_unacked: u64,
    pub(super) rx_fa_malformed: u64,
    pub(super) rx_fa_stale: u64,
    pub(super) alloc_cancelled: u64,
    pub(super) connections_gone: u64,
}

impl FaCounters {
    /// Writes these into the IPCP's counters, which list them.
    pub(super) fn write_into(&self, c: &mut super::Counters) {
        c.alloc_requests_in = self.alloc_requests_in;
        c.alloc_refused = self.alloc_refused;
        c.alloc_retries = self.alloc_retries;
        c.alloc_timeouts = self.alloc_timeouts;
        c.dealloc_retries = self.dealloc_retries;
        c.dealloc_unacked = self.dealloc_unacked;
        c.rx_fa_malformed = self.rx_fa_malformed;
        c.rx_fa_stale = self.rx_fa_stale;
        c.alloc_cancelled = self.alloc_cancelled;
        c.connections_gone = self.connections_gone;
    }
}

/// An allocation this IPCP asked for, waiting for the answer.
#[derive(Debug)]
struct Allocating {
    local_cep: CepId,
    dst: Address,
    qos_id: u64,
    remote: AppName,
}

/// An incoming request waiting for the application's answer.
#[derive(Debug)]
struct Pending {
    src_addr: Address,
    src_cep: CepId,
    qos_id: u64,
    local: AppName,
    deadline: Instant,
}

/// An incoming request the application accepted, while the IPCP opens its
/// end: handed back to [`FlowAllocator::accepted`].
#[derive(Debug)]
pub(super) struct Accepting {
    flow: FlowId,
    /// The endpoint to open.
    pub(super) ep: Endpoint,
}

/// A refusal sent, remembered so that a repeated request gets it again
/// rather than a second question to the application.
#[derive(Debug)]
struct Refusal {
    result: FaResult,
    reason: String,
    until: Instant,
}

/// The flow allocator. Ordered maps everywhere: their iteration order
/// reaches the wire (retransmissions, expiries).
#[derive(Debug)]
pub(super) struct FlowAllocator {
    names: BTreeSet<AppName>,
    allocating: BTreeMap<FlowId, Allocating>,
    /// The REQUESTs of `allocating`, repeated until answered.
    requests: Retransmit<FlowId>,
    allocating_by_cep: BTreeMap<CepId, FlowId>,
    pending: BTreeMap<u64, Pending>,
    /// Flows accepted here, by the requester's (address, CEP-id), so that a
    /// repeated request is answered again instead of creating a twin.
    accepted: BTreeMap<(Address, CepId), FlowId>,
    /// Requests refused here lately (by the application, or for it), by the
    /// requester's (address, CEP-id); at most `max_pending`, each kept
    /// `alloc_timeout`.
    refused: BTreeMap<(Address, CepId), Refusal>,
    /// DEALLOCs waiting for their acknowledgement, by the peer's (address,
    /// CEP-id), repeated until acknowledged.
    releasing: Retransmit<(Address, CepId)>,
    /// Peers' connections told they have no end here, by (address,
    /// CEP-id), with when: each is told once per `alloc_retry`.
    told_gone: BTreeMap<(Address, CepId), Instant>,
    /// Allocations given up lately, by (responder's address, our CEP-id),
    /// with until when a late ACCEPTED is answered with a DEALLOC; at
    /// most `max_flows`, each kept `alloc_timeout`.
    given_up: BTreeMap<(Address, CepId), Instant>,
    next_handle: u64,
    next_cep: CepId,
    out: VecDeque<FaOut>,
    counters: FaCounters,
}

impl FlowAllocator {
    /// A flow allocator whose first CEP-id is the one after `first_cep`.
    pub(super) fn new(first_cep: CepId) -> Self {
        FlowAllocator {
            names: BTreeSet::new(),
            allocating: BTreeMap::new(),
            requests: Retransmit::new(),
            allocating_by_cep: BTreeMap::new(),
            pending: BTreeMap::new(),
            accepted: BTreeMap::new(),
            refused: BTreeMap::new(),
            releasing: Retransmit::new(),
            told_gone: BTreeMap::new(),
            given_up: BTreeMap::new(),
            next_handle: 1,
            next_cep: first_cep,
            out: VecDeque::new(),
            counters: FaCounters::default(),
        }
    }

    /// The next thing the IPCP must do for the flow allocator.
    pub(super) fn poll_out(&mut self) -> Option<FaOut> {
        self.out.pop_front()
    }

    pub(super) fn counters(&self) -> &FaCounters {
        &self.counters
    }

    /// Forgets that `flow` was accepted for the requester `(addr, cep)`.
    pub(super) fn forget_accepted(&mut self, addr: Address, cep: CepId, flow: FlowId) {
        if self.accepted.get(&(addr, cep)) == Some(&flow) {
            self.accepted.remove(&(addr, cep));
        }
    }

    /// Whether `flow` or `cep` is taken by an allocation in progress.
    pub(super) fn is_reserved(&self, flow: FlowId, cep: CepId) -> bool {
        self.allocating.contains_key(&flow) || self.allocating_by_cep.contains_key(&cep)
    }

    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        let p = self.pending.values().map(|p| p.deadline).min();
        [
            self.requests.poll_timeout(),
            p,
            self.releasing.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// DEALLOCs not acknowledged yet.
    pub(super) fn releasing(&self) -> usize {
        self.releasing.len()
    }

    /// Whether `name` is registered here.
    pub(super) fn is_registered(&self, name: &AppName) -> bool {
        self.names.contains(name)
    }

    /// Registered names.
    pub(super) fn names(&self) -> impl Iterator<Item = &AppName> {
        self.names.iter()
    }

    /// Whether `flow` is being allocated (asked for, not answered yet).
    pub(super) fn is_allocating(&self, flow: FlowId) -> bool {
        self.allocating.contains_key(&flow)
    }

    /// Incoming requests waiting for an application's answer.
    pub(super) fn pending_requests(&self) -> usize {
        self.pending.len()
    }

    /// Registers `name`, if the DIF's access rules let it.
    pub(super) fn register(&mut self, cx: &Ctx, name: AppName) -> Result<(), NormalError> {
        if self.names.contains(&name) {
            return Err(NormalError::NameInUse(Box::new(name)));
        }
        cx.cfg
            .access
            .check_register(&cx.cfg.dif, &name)
            .map_err(NormalError::AccessDenied)?;
        self.names.insert(name);
        Ok(())
    }

    /// Withdraws `name`; requests waiting for its application are refused
    /// and reported withdrawn. Returns whether it was registered.
    pub(super) fn unregister(&mut self, cx: &Ctx, now: Instant, name: &AppName) -> bool {
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
            let _ = self.refuse(cx, now, handle, "the application unregistered");
            self.out
                .push_back(FaOut::Report(Box::new(Action::RequestWithdrawn { handle })));
        }
        true
    }

    /// A fresh CEP-id: never 0, not used by a flow or an allocation.
    fn fresh_cep(&mut self, cx: &Ctx) -> Result<CepId, NormalError> {
        let max = cx.cfg.dt.cep.max_value();
        let used = cx.by_cep.len() as u64 + self.allocating_by_cep.len() as u64;
        for _ in 0..=used.min(max) {
            self.next_cep = if self.next_cep >= max {
                1
            } else {
                self.next_cep + 1
            };
            let c = self.next_cep;
            if cx.at_cep(c).is_none() && !self.allocating_by_cep.contains_key(&c) {
                return Ok(c);
            }
        }
        Err(NormalError::NoResources(format!(
            "all {max} CEP-ids are in use"
        )))
    }

    fn flow_in_use(&self, cx: &Ctx, flow: FlowId) -> Option<NormalError> {
        if let Some(ep) = cx.endpoint(flow) {
            return Some(NormalError::InUse {
                flow,
                cep: ep.local_cep,
            });
        }
        self.allocating.get(&flow).map(|a| NormalError::InUse {
            flow,
            cep: a.local_cep,
        })
    }

    /// Starts allocating `flow` from `local` to `remote`, registered at
    /// `dst`, with cube `qos_id`: sends the REQUEST and repeats it until
    /// answered.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn allocate(
        &mut self,
        cx: &Ctx,
        now: Instant,
        flow: FlowId,
        local: AppName,
        remote: AppName,
        qos: QosSpec,
        (dst, qos_id): (Address, u64),
    ) -> Result<(), NormalError> {
        if cx.open_flows() + self.allocating.len() >= cx.cfg.max_flows {
            return Err(NormalError::NoResources(format!(
                "{} flows already",
                cx.cfg.max_flows
            )));
        }
        let local_cep = self.fresh_cep(cx)?;
        let request = FaMessage::Request {
            src_addr: cx.cfg.address,
            src_cep: local_cep,
            qos_id,
            qos,
            src: local,
            dst: remote.clone(),
        }
        .to_vec();
        let room = cx.cfg.dt.max_data_payload();
        if request.len() > room {
            return Err(NormalError::NoResources(format!(
                "the flow request ({} bytes) does not fit a management PDU ({room} bytes)",
                request.len()
            )));
        }
        self.send_request(dst, request.clone());
        self.allocating_by_cep.insert(local_cep, flow);
        self.allocating.insert(
            flow,
            Allocating {
                local_cep,
                dst,
                qos_id,
                remote,
            },
        );
        let (retry, timeout) = (cx.cfg.alloc_retry, cx.cfg.alloc_timeout);
        self.requests.start(now, flow, dst, request, retry, timeout);
        Ok(())
    }

    /// Whether allocating `flow` is possible at all: not in use, and the
    /// DIF's access rules let `local` ask for `remote`.
    pub(super) fn check_allocate(
        &self,
        cx: &Ctx,
        flow: FlowId,
        local: &AppName,
        remote: &AppName,
    ) -> Result<(), NormalError> {
        if let Some(e) = self.flow_in_use(cx, flow) {
            return Err(e);
        }
        cx.cfg
            .access
            .check_allocate(&cx.cfg.dif, local, remote)
            .map_err(NormalError::AccessDenied)
    }

    /// The application accepts incoming request `handle` as `flow`: the
    /// endpoint to open, handed back to [`FlowAllocator::accepted`].
    pub(super) fn accept(
        &mut self,
        cx: &Ctx,
        handle: u64,
        flow: FlowId,
    ) -> Result<Accepting, NormalError> {
        if let Some(e) = self.flow_in_use(cx, flow) {
            return Err(e);
        }
        if !self.pending.contains_key(&handle) {
            return Err(NormalError::UnknownRequest(handle));
        }
        let local_cep = self.fresh_cep(cx)?;
        let p = self
            .pending
            .remove(&handle)
            .ok_or(NormalError::UnknownRequest(handle))?;
        let ep = Endpoint {
            local_cep,
            remote_addr: p.src_addr,
            remote_cep: p.src_cep,
            qos_id: p.qos_id,
        };
        Ok(Accepting { flow, ep })
    }

    /// The IPCP opened (or failed to open) the end of an accepted request:
    /// answers the requester ACCEPTED, or refuses with the reason. Returns
    /// the flow's largest SDU.
    pub(super) fn accepted(
        &mut self,
        cx: &Ctx,
        a: Accepting,
        opened: Result<(), NormalError>,
    ) -> Result<u32, NormalError> {
        let Accepting { flow, ep } = a;
        if let Err(e) = opened {
            let (result, reason) = match &e {
                NormalError::QosNotSatisfiable(r) => (FaResult::QosNotSatisfiable, r.clone()),
                other => (FaResult::NoResources, other.to_string()),
            };
            self.respond_refusal(cx, ep.remote_addr, ep.remote_cep, result, &reason);
            return Err(e);
        }
        self.accepted.insert((ep.remote_addr, ep.remote_cep), flow);
        let max_sdu = cx.max_sdu();
        self.send(
            ep.remote_addr,
            &FaMessage::Response {
                dst_addr: ep.remote_addr,
                dst_cep: ep.remote_cep,
                src_cep: ep.local_cep,
                result: FaResult::Accepted,
                max_sdu,
                reason: String::new(),
            },
        );
        Ok(max_sdu)
    }

    /// Refuses incoming request `handle`, telling the requester why.
    pub(super) fn refuse(
        &mut self,
        cx: &Ctx,
        now: Instant,
        handle: u64,
        reason: &str,
    ) -> Result<(), NormalError> {
        let p = self
            .pending
            .remove(&handle)
            .ok_or(NormalError::UnknownRequest(handle))?;
        self.counters.alloc_refused += 1;
        self.remember_refusal(cx, now, p.src_addr, p.src_cep, FaResult::Refused, reason);
        self.respond_refusal(cx, p.src_addr, p.src_cep, FaResult::Refused, reason);
        Ok(())
    }

    /// Deallocates `flow`. An allocation in progress is abandoned (`None`:
    /// a late acceptance is then answered with a deallocation); an open
    /// flow's peer object is deleted, and its endpoint returned for the
    /// IPCP to close.
    pub(super) fn deallocate(
        &mut self,
        cx: &Ctx,
        now: Instant,
        flow: FlowId,
    ) -> Result<Option<Endpoint>, NormalError> {
        if let Some(a) = self.allocating.remove(&flow) {
            self.allocating_by_cep.remove(&a.local_cep);
            if let Some((to, message)) = self.requests.stop(&flow) {
                self.out.push_back(FaOut::Settle { to, message });
            }
            self.cancel(cx, now, a.dst, a.local_cep);
            return Ok(None);
        }
        let f = cx.flows.get(&flow).ok_or(NormalError::UnknownFlow(flow))?;
        let (ep, last) = (f.ep, f.efcp.last_sent_seq());
        self.send_dealloc(cx, now, (ep.remote_addr, ep.remote_cep, ep.local_cep), last);
        Ok(Some(ep))
    }

    /// Tells the IPCP at `to` that the allocation from our CEP-id
    /// `src_cep` is given up: a DEALLOC naming no flow object of its own
    /// ([`NO_CEP`]), which withdraws the request if its application has
    /// not answered yet. Sent once: if it is lost, the responder's
    /// `accept_timeout` and the DEALLOC that answers a late ACCEPTED do
    /// the same, later (the allocation is remembered for that, see
    /// `gave_up`). A peer that does not know it
    /// acknowledges it as a DEALLOC of a flow it does not have.
    pub(super) fn cancel(&mut self, cx: &Ctx, now: Instant, to: Address, src_cep: CepId) {
        self.remember_given_up(cx, now, (to, src_cep));
        let message = FaMessage::Dealloc {
            dst_addr: to,
            dst_cep: NO_CEP,
            src_cep,
            last_seq: None,
        }
        .to_vec();
        self.send_request(to, message);
    }

    /// A data or control PDU came from connection `src_cep` of the member
    /// at `from` for CEP-id `dst_cep`, which no flow here has (the IPCP
    /// checked that it was not closed lately): the peer's end outlived
    /// ours, as when this IPCP restarted. Its flow object is deleted (a
    /// DEALLOC naming our CEP-id as its peer, sent once), so its
    /// application learns at once that the flow is gone instead of when
    /// its retransmissions give up. Not for a CEP-id of an allocation in
    /// progress (the acceptor's data may overtake its answer), nor for a
    /// connection this IPCP is deallocating; each connection is told at
    /// most once per `alloc_retry`, and at most `max_pending` at a time.
    pub(super) fn connection_gone(
        &mut self,
        cx: &Ctx,
        now: Instant,
        (from, src_cep): (Address, CepId),
        dst_cep: CepId,
    ) {
        if self.allocating_by_cep.contains_key(&dst_cep)
            || self.releasing.message(&(from, src_cep)).is_some()
        {
            return;
        }
        let retry = cx.cfg.alloc_retry;
        self.told_gone.retain(|_, at| *at + retry > now);
        if self.told_gone.contains_key(&(from, src_cep))
            || self.told_gone.len() >= cx.cfg.max_pending.max(1)
        {
            return;
        }
        self.told_gone.insert((from, src_cep), now);
        self.counters.connections_gone += 1;
        let message = FaMessage::Dealloc {
            dst_addr: from,
            dst_cep: src_cep,
            src_cep: dst_cep,
            last_seq: None,
        }
        .to_vec();
        self.send_request(from, message);
    }

    /// Deletes the flow object `(to, dst_cep)` at the peer (from ours,
    /// `src_cep`, whose last data PDU was `last_seq`), repeating the
    /// DEALLOC until it is acknowledged or `alloc_timeout` passes.
    fn send_dealloc(
        &mut self,
        cx: &Ctx,
        now: Instant,
        (to, dst_cep, src_cep): (Address, CepId, CepId),
        last_seq: Option<u64>,
    ) {
        let message = FaMessage::Dealloc {
            dst_addr: to,
            dst_cep,
            src_cep,
            last_seq,
        }
        .to_vec();
        self.send_request(to, message.clone());
        if self.releasing.len() >= cx.cfg.max_flows {
            // Too many unanswered: this one is sent once.
            return;
        }
        let (retry, timeout) = (cx.cfg.alloc_retry, cx.cfg.alloc_timeout);
        self.releasing
            .start(now, (to, dst_cep), to, message, retry, timeout);
    }

    /// Remembers for `alloc_timeout` that the allocation from our CEP-id
    /// to the responder at the address was given up (at most `max_flows`;
    /// the oldest are forgotten first).
    fn remember_given_up(&mut self, cx: &Ctx, now: Instant, key: (Address, CepId)) {
        let given_up = &mut self.given_up;
        given_up.retain(|_, until| *until > now);
        while given_up.len() >= cx.cfg.max_flows.max(1) {
            let oldest = given_up
                .iter()
                .min_by_key(|(k, u)| (**u, **k))
                .map(|(k, _)| *k);
            match oldest {
                Some(k) => given_up.remove(&k),
                None => break,
            };
        }
        given_up.insert(key, now + cx.cfg.alloc_timeout);
    }

    /// Whether the allocation from our CEP-id `cep` to the responder at
    /// `from` was given up within the last `alloc_timeout`; forgets it
    /// (one DEALLOC, repeated until acknowledged, undoes it).
    fn gave_up(&mut self, now: Instant, from: Address, cep: CepId) -> bool {
        self.given_up
            .remove(&(from, cep))
            .is_some_and(|until| until > now)
    }

    fn remember_refusal(
        &mut self,
        cx: &Ctx,
        now: Instant,
        addr: Address,
        cep: CepId,
        result: FaResult,
        reason: &str,
    ) {
        let refused = &mut self.refused;
        refused.retain(|_, r| r.until > now);
        while refused.len() >= cx.cfg.max_pending.max(1) {
            let oldest = refused
                .iter()
                .min_by_key(|(k, r)| (r.until, **k))
                .map(|(k, _)| *k);
            match oldest {
                Some(k) => refused.remove(&k),
                None => break,
            };
        }
        refused.insert(
            (addr, cep),
            Refusal {
                result,
                reason: truncate_utf8(reason, MAX_REASON_LEN).to_string(),
                until: now + cx.cfg.alloc_timeout,
            },
        );
    }

    /// Sends an encoded REQUEST or DEALLOC (a request on the peer's flow
    /// object), whose answer comes back to the flow allocator.
    fn send_request(&mut self, to: Address, message: Vec<u8>) {
        self.out.push_back(FaOut::Send {
            to,
            message,
            request: true,
        });
    }

    fn send(&mut self, to: Address, msg: &FaMessage) {
        self.out.push_back(FaOut::Send {
            to,
            message: msg.to_vec(),
            request: false,
        });
    }

    fn respond_refusal(
        &mut self,
        cx: &Ctx,
        to: Address,
        dst_cep: CepId,
        result: FaResult,
        reason: &str,
    ) {
        let mut msg = FaMessage::Response {
            dst_addr: to,
            dst_cep,
            src_cep: 0,
            result,
            max_sdu: cx.max_sdu(),
            reason: String::new(),
        };
        // The reason's length prefix takes at most 3 bytes here.
        let room = cx
            .cfg
            .dt
            .max_data_payload()
            .saturating_sub(msg.to_vec().len() + 3)
            .min(MAX_REASON_LEN);
        if let FaMessage::Response { reason: r, .. } = &mut msg {
            *r = truncate_utf8(reason, room).to_string();
        }
        self.send(to, &msg);
    }
}

/// Local CEP-ids of flows closed lately (the last [`ClosedCeps::KEPT`]):
/// PDUs that were on their way to them are dropped, not answered as for
/// a connection this IPCP never had (a closing peer waiting for its last
/// PDUs is not cut short).
#[derive(Debug, Default)]
pub(super) struct ClosedCeps {
    order: VecDeque<CepId>,
    set: BTreeSet<CepId>,
}

impl ClosedCeps {
    /// CEP-ids kept.
    pub(super) const KEPT: usize = 4096;

    /// Remembers that the flow of `cep` closed.
    pub(super) fn closed(&mut self, cep: CepId) {
        if !self.set.insert(cep) {
            return;
        }
        self.order.push_back(cep);
        if self.order.len() > Self::KEPT {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    /// Whether the flow of `cep` closed lately.
    pub(super) fn contains(&self, cep: CepId) -> bool {
        self.set.contains(&cep)
    }

    /// `cep` is a flow's again.
    pub(super) fn reused(&mut self, cep: CepId) {
        if self.set.remove(&cep) {
            self.order.retain(|&c| c != cep);
        }
    }
}
