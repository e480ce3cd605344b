//! The flow allocator of the normal IPCP: flow objects created and deleted
//! on the peer IPCP with CDAP ([`rina_wire::fa`]: `M_CREATE` / `M_CREATE_R`
//! / `M_DELETE` / `M_DELETE_R` of `/fa/flows/key=<address>-<CEP-id>`), with
//! the same API as the shim IPCPs so that the daemon drives every IPCP alike.
//!
//! # Handshake
//!
//! [`NormalIpcp::allocate`] looks the destination name up (registered here,
//! or in the static directory), picks a QoS cube ([`NormalIpcp::choose_cube`])
//! and a fresh CEP-id, and creates the flow object on the destination
//! IPCP (REQUEST, a CDAP `M_CREATE`, [`rina_wire::fa`]) in a management PDU to the destination IPCP's address; the RMT routes it, and
//! intermediate IPCPs relay it like data. The destination IPCP refuses at
//! once what it cannot serve (name not registered, unknown cube, no room) or
//! asks the application with [`Action::FlowRequest`]. The application
//! answers with [`NormalIpcp::accept`] — the responder opens its end of the
//! flow with the cube's EFCP policies and answers ACCEPTED with its CEP-id —
//! or [`NormalIpcp::refuse`]; if it does not answer within
//! `accept_timeout` the request is refused on its behalf and
//! [`Action::RequestWithdrawn`] reported. On ACCEPTED the requester opens
//! its end and reports [`Action::Allocated`]; on anything else
//! [`Action::AllocateFailed`].
//!
//! # Loss
//!
//! Management PDUs are not retransmitted by EFCP, so the requester repeats
//! its REQUEST every `alloc_retry` until answered and gives up after
//! `alloc_timeout` ([`NormalError::Timeout`]). The responder knows a
//! repeated request by the requester's (address, CEP-id): if it accepted it,
//! it sends ACCEPTED again; if the application has not answered yet, it
//! ignores it; if the application refused it (or did not answer in time)
//! within the last `alloc_timeout`, it sends the refusal again. An ACCEPTED for an allocation the requester gave up on (or
//! deallocated before it completed) is answered with DEALLOC, so the
//! responder does not keep a half-open flow.
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

use super::mgmt_rib::Peer;
use super::{cubes, Action, CepId, FlowId, NormalError, NormalIpcp, QosCube};
use crate::rib::OwnerId;
use crate::rmt::Address;
use crate::time::Instant;
use rina_wire::cdap::CdapMessage;
use rina_wire::codec::truncate_utf8;
use rina_wire::fa::{FaMessage, FaResult};
use rina_wire::{AppName, QosSpec};
use std::collections::{BTreeMap, BTreeSet};

mod retransmit;
use retransmit::{Due, Retransmit};

/// Longest refusal reason sent to a peer, in bytes (also cut to fit a PDU).
pub const MAX_REASON_LEN: usize = 512;

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

/// A refusal sent, remembered so that a repeated request gets it again
/// rather than a second question to the application.
#[derive(Debug)]
struct Refusal {
    result: FaResult,
    reason: String,
    until: Instant,
}

/// State of the flow allocator. Ordered maps everywhere: their iteration
/// order reaches the wire (retransmissions, expiries).
#[derive(Debug)]
pub(super) struct FaState {
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
    next_handle: u64,
    next_cep: CepId,
}

impl FaState {
    pub(super) fn new() -> Self {
        FaState {
            names: BTreeSet::new(),
            allocating: BTreeMap::new(),
            requests: Retransmit::new(),
            allocating_by_cep: BTreeMap::new(),
            pending: BTreeMap::new(),
            accepted: BTreeMap::new(),
            refused: BTreeMap::new(),
            releasing: Retransmit::new(),
            next_handle: 1,
            next_cep: 0,
        }
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
}

impl NormalIpcp {
    /// The QoS cube that serves `qos`: see [`QosCube`] and the rules of
    /// [`NormalConfig::cubes`](super::NormalConfig::cubes).
    ///
    /// A spec asking for reliability (`reliable`, `max_loss_ppm = 0`,
    /// `max_sdu_gap = 0`, or `in_order`) gets a cube whose EFCP retransmits
    /// and delivers in order (and, unless only `in_order` was asked, never
    /// gives up a hole); anything else gets the first cube without
    /// retransmission. `max_sdu_size` above the DIF's maximum SDU is
    /// [`NormalError::QosNotSatisfiable`], with the reason.
    pub fn choose_cube(&self, qos: &QosSpec) -> Result<&QosCube, NormalError> {
        cubes::choose(&self.cfg, &self.cfg.cubes, qos)
    }

    /// The QoS cube with id `id`.
    pub fn cube(&self, id: u64) -> Option<&QosCube> {
        self.cfg.cubes.iter().find(|c| c.id == id)
    }

    /// Sets where application `name` is registered: the address of its IPCP
    /// in this DIF (the static directory).
    pub fn set_directory(&mut self, name: AppName, addr: Address) {
        self.cfg.directory.insert(name, addr);
    }

    /// Removes `name` from the static directory; returns whether it was there.
    pub fn remove_directory(&mut self, name: &AppName) -> bool {
        self.cfg.directory.remove(name).is_some()
    }

    /// Whether flows to `name` can be asked for: it is registered here, in
    /// the static directory or (when on) in the disseminated one.
    pub fn knows(&self, name: &AppName) -> bool {
        self.fa.names.contains(name)
            || self.cfg.directory.contains_key(name)
            || self.dft_lookup(name).is_some()
    }

    /// Where flows to `name` go, if anywhere: this IPCP if it is registered
    /// here, else its static directory entry, else (when on) the
    /// disseminated directory's answer.
    pub fn resolve(&self, name: &AppName) -> Option<Address> {
        if self.fa.names.contains(name) {
            Some(self.cfg.address)
        } else {
            self.cfg
                .directory
                .get(name)
                .copied()
                .or_else(|| self.dft_lookup(name))
        }
    }

    /// Replaces the DIF's access rules at this member (names registered
    /// before stay; see [`super::access`]).
    pub fn set_access(&mut self, rules: super::access::AccessRules) {
        self.cfg.access = rules;
    }

    /// The DIF's access rules at this member.
    pub fn access(&self) -> &super::access::AccessRules {
        &self.cfg.access
    }

    /// Registers an application name so that flows can be allocated to it;
    /// [`NormalError::Refused`] if the DIF's access rules do not let it.
    pub fn register(&mut self, name: AppName) -> Result<(), NormalError> {
        if self.fa.names.contains(&name) {
            return Err(NormalError::NameInUse(Box::new(name)));
        }
        self.cfg
            .access
            .check_register(&self.cfg.dif, &name)
            .map_err(NormalError::Refused)?;
        self.dft_register(&name);
        self.fa.names.insert(name);
        Ok(())
    }

    /// Withdraws a name; requests waiting for its application are refused
    /// (and reported as [`Action::RequestWithdrawn`]). Returns whether it
    /// was registered.
    pub fn unregister(&mut self, name: &AppName) -> bool {
        if !self.fa.names.remove(name) {
            return false;
        }
        self.dft_unregister(name);
        let gone: Vec<u64> = self
            .fa
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

    /// Registered names.
    pub fn names(&self) -> impl Iterator<Item = &AppName> {
        self.fa.names.iter()
    }

    /// Whether `flow` is being allocated (asked for, not answered yet).
    pub fn is_allocating(&self, flow: FlowId) -> bool {
        self.fa.allocating.contains_key(&flow)
    }

    /// Incoming requests waiting for an application's answer.
    pub fn pending_requests(&self) -> usize {
        self.fa.pending.len()
    }

    /// A fresh CEP-id: never 0, not used by a flow or an allocation.
    fn fresh_cep(&mut self) -> Result<CepId, NormalError> {
        let max = self.cfg.dt.cep.max_value();
        let used = self.by_cep.len() as u64 + self.fa.allocating_by_cep.len() as u64;
        for _ in 0..=used.min(max) {
            self.fa.next_cep = if self.fa.next_cep >= max {
                1
            } else {
                self.fa.next_cep + 1
            };
            let c = self.fa.next_cep;
            if !self.by_cep.contains_key(&c) && !self.fa.allocating_by_cep.contains_key(&c) {
                return Ok(c);
            }
        }
        Err(NormalError::NoResources(format!(
            "all {max} CEP-ids are in use"
        )))
    }

    fn flow_in_use(&self, flow: FlowId) -> Option<NormalError> {
        if let Some(f) = self.flows.get(&flow) {
            return Some(NormalError::InUse {
                flow,
                cep: f.ep.local_cep,
            });
        }
        self.fa.allocating.get(&flow).map(|a| NormalError::InUse {
            flow,
            cep: a.local_cep,
        })
    }

    /// Starts allocating flow `flow` from application `local` to application
    /// `remote`. The outcome is reported later as [`Action::Allocated`] or
    /// [`Action::AllocateFailed`]; what is wrong at once is returned:
    /// [`NormalError::NameNotFound`] (neither registered here nor in the
    /// directory), [`NormalError::QosNotSatisfiable`],
    /// [`NormalError::InUse`], [`NormalError::NoResources`].
    pub fn allocate(
        &mut self,
        now: Instant,
        flow: FlowId,
        local: AppName,
        remote: AppName,
        qos: QosSpec,
    ) -> Result<(), NormalError> {
        self.tick(now);
        if self.cfg.address == 0 {
            return Err(NormalError::NotEnrolled);
        }
        if let Some(e) = self.flow_in_use(flow) {
            return Err(e);
        }
        self.cfg
            .access
            .check_allocate(&self.cfg.dif, &local, &remote)
            .map_err(NormalError::Refused)?;
        let dst = self
            .resolve(&remote)
            .ok_or_else(|| NormalError::NameNotFound(Box::new(remote.clone())))?;
        let qos_id = self.choose_cube(&qos)?.id;
        if self.flows.len() + self.fa.allocating.len() >= self.cfg.max_flows {
            return Err(NormalError::NoResources(format!(
                "{} flows already",
                self.cfg.max_flows
            )));
        }
        let local_cep = self.fresh_cep()?;
        let request = FaMessage::Request {
            src_addr: self.cfg.address,
            src_cep: local_cep,
            qos_id,
            qos,
            src: local,
            dst: remote.clone(),
        }
        .to_vec();
        let room = self.cfg.dt.max_data_payload();
        if request.len() > room {
            return Err(NormalError::NoResources(format!(
                "the flow request ({} bytes) does not fit a management PDU ({room} bytes)",
                request.len()
            )));
        }
        self.send_fa_request(now, dst, &request);
        self.fa.allocating_by_cep.insert(local_cep, flow);
        self.fa.allocating.insert(
            flow,
            Allocating {
                local_cep,
                dst,
                qos_id,
                remote,
            },
        );
        let (retry, timeout) = (self.cfg.alloc_retry, self.cfg.alloc_timeout);
        self.fa
            .requests
            .start(now, flow, dst, request, retry, timeout);
        self.flush(now);
        Ok(())
    }

    /// Accepts incoming request `handle` ([`Action::FlowRequest`]) as flow
    /// `flow`: opens this end and answers the requester. Returns the flow's
    /// largest SDU.
    pub fn accept(&mut self, now: Instant, handle: u64, flow: FlowId) -> Result<u32, NormalError> {
        self.tick(now);
        if let Some(e) = self.flow_in_use(flow) {
            return Err(e);
        }
        if !self.fa.pending.contains_key(&handle) {
            return Err(NormalError::UnknownRequest(handle));
        }
        let local_cep = self.fresh_cep()?;
        let Some(p) = self.fa.pending.remove(&handle) else {
            return Err(NormalError::UnknownRequest(handle));
        };
        let Some(efcp) = self.cube(p.qos_id).map(|c| c.efcp.clone()) else {
            // The cubes were checked when the request arrived; they do not change.
            self.respond_refusal(p.src_addr, p.src_cep, FaResult::QosNotSatisfiable, "");
            self.flush(now);
            return Err(NormalError::QosNotSatisfiable(format!(
                "no QoS cube {}",
                p.qos_id
            )));
        };
        let ep = super::Endpoint {
            local_cep,
            remote_addr: p.src_addr,
            remote_cep: p.src_cep,
            qos_id: p.qos_id,
        };
        if let Err(e) = self.open_flow(now, flow, ep, efcp) {
            self.respond_refusal(p.src_addr, p.src_cep, FaResult::NoResources, &e.to_string());
            self.flush(now);
            return Err(e);
        }
        self.fa.accepted.insert((p.src_addr, p.src_cep), flow);
        let max_sdu = self.max_sdu_u32();
        self.send_fa(
            now,
            p.src_addr,
            &FaMessage::Response {
                dst_addr: p.src_addr,
                dst_cep: p.src_cep,
                src_cep: local_cep,
                result: FaResult::Accepted,
                max_sdu,
                reason: String::new(),
            },
        );
        self.flush(now);
        Ok(max_sdu)
    }

    /// Refuses incoming request `handle`, telling the requester why.
    pub fn refuse(&mut self, handle: u64, reason: &str) -> Result<(), NormalError> {
        let p = self
            .fa
            .pending
            .remove(&handle)
            .ok_or(NormalError::UnknownRequest(handle))?;
        self.counters.alloc_refused += 1;
        let now = self.now;
        self.remember_refusal(now, p.src_addr, p.src_cep, FaResult::Refused, reason);
        self.respond_refusal(p.src_addr, p.src_cep, FaResult::Refused, reason);
        self.flush(now);
        Ok(())
    }

    /// Deallocates `flow`: closes it and tells the peer, whose IPCP reports
    /// [`Action::Deallocated`]. An allocation still in progress is
    /// abandoned (a late acceptance is then answered with a deallocation).
    pub fn deallocate(&mut self, now: Instant, flow: FlowId) -> Result<(), NormalError> {
        self.tick(now);
        if let Some(a) = self.fa.allocating.remove(&flow) {
            self.fa.allocating_by_cep.remove(&a.local_cep);
            if let Some((to, request)) = self.fa.requests.stop(&flow) {
                self.settle_fa_request(to, &request);
            }
            return Ok(());
        }
        let ep = self
            .flows
            .get(&flow)
            .map(|f| f.ep)
            .ok_or(NormalError::UnknownFlow(flow))?;
        self.close_flow(flow)?;
        self.send_dealloc(now, ep.remote_addr, ep.remote_cep, ep.local_cep);
        self.flush(now);
        Ok(())
    }

    /// Deletes the flow object `(to, dst_cep)` at the peer, repeating the
    /// DEALLOC until it is acknowledged or `alloc_timeout` passes.
    fn send_dealloc(&mut self, now: Instant, to: Address, dst_cep: CepId, src_cep: CepId) {
        let message = FaMessage::Dealloc {
            dst_addr: to,
            dst_cep,
            src_cep,
        }
        .to_vec();
        self.send_fa_request(now, to, &message);
        if self.fa.releasing.len() >= self.cfg.max_flows {
            // Too many unanswered: this one is sent once.
            return;
        }
        let (retry, timeout) = (self.cfg.alloc_retry, self.cfg.alloc_timeout);
        self.fa
            .releasing
            .start(now, (to, dst_cep), to, message, retry, timeout);
    }

    /// DEALLOCs sent and not acknowledged yet.
    pub fn deallocs_unacknowledged(&self) -> usize {
        self.fa.releasing()
    }

    fn remember_refusal(
        &mut self,
        now: Instant,
        addr: Address,
        cep: CepId,
        result: FaResult,
        reason: &str,
    ) {
        let refused = &mut self.fa.refused;
        refused.retain(|_, r| r.until > now);
        while refused.len() >= self.cfg.max_pending.max(1) {
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
                until: now + self.cfg.alloc_timeout,
            },
        );
    }

    fn max_sdu_u32(&self) -> u32 {
        u32::try_from(self.cfg.max_sdu).unwrap_or(u32::MAX)
    }

    /// Sends an encoded REQUEST or DEALLOC (a request on the peer's flow
    /// object) through the session with the peer, so that its answer comes
    /// back to the flow allocator.
    fn send_fa_request(&mut self, now: Instant, to: Address, payload: &[u8]) {
        if let Some(m) = payload.get(1..).and_then(|b| CdapMessage::decode(b).ok()) {
            let _ = self
                .mgmt
                .request(now, Peer::Remote(to), OwnerId::FLOW_ALLOCATOR, m);
        }
        self.send_management_to(now, to, payload);
    }

    /// The flow allocator no longer waits for an answer to the encoded
    /// request `payload` to `to`.
    fn settle_fa_request(&mut self, to: Address, payload: &[u8]) {
        let invoke = payload
            .get(1..)
            .and_then(|b| CdapMessage::decode(b).ok())
            .and_then(|m| m.invoke_id);
        if let Some(i) = invoke {
            self.mgmt.settle(Peer::Remote(to), i);
        }
    }

    fn send_fa(&mut self, now: Instant, dst: Address, msg: &FaMessage) {
        let payload = msg.to_vec();
        self.send_management_to(now, dst, &payload);
    }

    fn respond_refusal(&mut self, to: Address, dst_cep: CepId, result: FaResult, reason: &str) {
        let mut msg = FaMessage::Response {
            dst_addr: to,
            dst_cep,
            src_cep: 0,
            result,
            max_sdu: self.max_sdu_u32(),
            reason: String::new(),
        };
        // The reason's length prefix takes at most 3 bytes here.
        let room = self
            .cfg
            .dt
            .max_data_payload()
            .saturating_sub(msg.to_vec().len() + 3)
            .min(MAX_REASON_LEN);
        if let FaMessage::Response { reason: r, .. } = &mut msg {
            *r = truncate_utf8(reason, room).to_string();
        }
        let now = self.now;
        self.send_fa(now, to, &msg);
    }

    /// A CDAP message on a flow object arrived from the member at `from`
    /// (through the RIB daemon).
    pub(super) fn on_fa_cdap(&mut self, now: Instant, from: Address, msg: &CdapMessage) {
        let msg = match FaMessage::from_cdap(msg) {
            Ok(m) => m,
            Err(_) => {
                self.counters.rx_fa_malformed += 1;
                return;
            }
        };
        match msg {
            FaMessage::Request {
                src_addr,
                src_cep,
                qos_id,
                qos,
                src,
                dst,
            } => {
                if src_addr != from || src_cep == 0 {
                    self.counters.rx_fa_malformed += 1;
                    return;
                }
                self.on_request(now, src_addr, src_cep, qos_id, qos, src, dst);
            }
            FaMessage::Response {
                dst_cep,
                src_cep,
                result,
                max_sdu,
                reason,
                ..
            } => self.on_response(now, from, dst_cep, src_cep, result, max_sdu, reason),
            FaMessage::Dealloc {
                dst_cep, src_cep, ..
            } => self.on_dealloc(now, from, dst_cep, src_cep),
            FaMessage::DeallocAck {
                dst_cep, src_cep, ..
            } => {
                let acked = self
                    .fa
                    .releasing
                    .message(&(from, src_cep))
                    .is_some_and(|m| dealloc_sender(m) == Some(dst_cep));
                if acked {
                    self.fa.releasing.stop(&(from, src_cep));
                } else {
                    self.counters.rx_fa_stale += 1;
                }
            }
        }
    }

    /// The peer deleted our flow object `dst_cep`: close the flow, and
    /// acknowledge whether or not it was still here (the acknowledgement of
    /// an earlier copy may have been lost).
    fn on_dealloc(&mut self, now: Instant, from: Address, dst_cep: CepId, src_cep: CepId) {
        let ours = self.by_cep.get(&dst_cep).copied().filter(|id| {
            self.flows
                .get(id)
                .is_some_and(|f| f.ep.remote_addr == from && f.ep.remote_cep == src_cep)
        });
        match ours {
            Some(flow) => {
                let _ = self.close_flow(flow);
                self.actions.push_back(Action::Deallocated { flow });
            }
            None => self.counters.rx_fa_stale += 1,
        }
        self.send_fa(
            now,
            from,
            &FaMessage::DeallocAck {
                src_addr: self.cfg.address,
                dst_cep: src_cep,
                src_cep: dst_cep,
            },
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn on_request(
        &mut self,
        now: Instant,
        src_addr: Address,
        src_cep: CepId,
        qos_id: u64,
        qos: QosSpec,
        src: AppName,
        dst: AppName,
    ) {
        self.counters.alloc_requests_in += 1;
        // A repeated request: answer again if accepted, ignore if pending.
        if let Some(&flow) = self.fa.accepted.get(&(src_addr, src_cep)) {
            if let Some(local_cep) = self.flows.get(&flow).map(|f| f.ep.local_cep) {
                let max_sdu = self.max_sdu_u32();
                self.send_fa(
                    now,
                    src_addr,
                    &FaMessage::Response {
                        dst_addr: src_addr,
                        dst_cep: src_cep,
                        src_cep: local_cep,
                        result: FaResult::Accepted,
                        max_sdu,
                        reason: String::new(),
                    },
                );
                return;
            }
        }
        if self
            .fa
            .pending
            .values()
            .any(|p| p.src_addr == src_addr && p.src_cep == src_cep)
        {
            return;
        }
        // Refused lately (the refusal may have been lost): refuse again.
        if let Some(r) = self.fa.refused.get(&(src_addr, src_cep)) {
            if r.until > now {
                let (result, reason) = (r.result, r.reason.clone());
                self.respond_refusal(src_addr, src_cep, result, &reason);
                return;
            }
        }
        let refusal = if !self.fa.names.contains(&dst) {
            Some((
                FaResult::NotRegistered,
                format!("{dst} is not registered at address {}", self.cfg.address),
            ))
        } else if let Err(reason) = self.cfg.access.check_allocate(&self.cfg.dif, &src, &dst) {
            Some((FaResult::Refused, reason))
        } else if self.fa.pending.len() >= self.cfg.max_pending
            || self.flows.len() + self.fa.allocating.len() >= self.cfg.max_flows
        {
            Some((FaResult::NoResources, "too many flows".to_string()))
        } else if self.cube(qos_id).is_none() {
            Some((
                FaResult::QosNotSatisfiable,
                format!("no QoS cube {qos_id} in DIF {}", self.cfg.dif),
            ))
        } else if qos
            .max_sdu_size
            .is_some_and(|s| s as usize > self.cfg.max_sdu)
        {
            Some((
                FaResult::QosNotSatisfiable,
                format!("SDUs are at most {} bytes", self.cfg.max_sdu),
            ))
        } else {
            None
        };
        if let Some((result, reason)) = refusal {
            self.counters.alloc_refused += 1;
            self.respond_refusal(src_addr, src_cep, result, &reason);
            return;
        }
        let handle = self.fa.next_handle;
        self.fa.next_handle += 1;
        self.fa.pending.insert(
            handle,
            Pending {
                src_addr,
                src_cep,
                qos_id,
                local: dst.clone(),
                deadline: now + self.cfg.accept_timeout,
            },
        );
        self.actions.push_back(Action::FlowRequest {
            handle,
            local: dst,
            remote: src,
            qos,
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn on_response(
        &mut self,
        now: Instant,
        from: Address,
        dst_cep: CepId,
        src_cep: CepId,
        result: FaResult,
        max_sdu: u32,
        reason: String,
    ) {
        let waiting = self
            .fa
            .allocating_by_cep
            .get(&dst_cep)
            .copied()
            .filter(|f| self.fa.allocating.get(f).is_some_and(|a| a.dst == from));
        let Some(flow) = waiting else {
            // Not waiting for this: a repeated answer to a flow that exists
            // (ignored), or an acceptance of an allocation given up (undone).
            let known = self.by_cep.get(&dst_cep).is_some_and(|id| {
                self.flows
                    .get(id)
                    .is_some_and(|f| f.ep.remote_addr == from && f.ep.remote_cep == src_cep)
            });
            if !known {
                self.counters.rx_fa_stale += 1;
                if result == FaResult::Accepted && src_cep != 0 {
                    self.send_dealloc(now, from, src_cep, dst_cep);
                }
            }
            return;
        };
        let Some(a) = self.fa.allocating.remove(&flow) else {
            return;
        };
        self.fa.allocating_by_cep.remove(&a.local_cep);
        self.fa.requests.stop(&flow);
        let fail = |me: &mut Self, error: NormalError| {
            me.actions.push_back(Action::AllocateFailed { flow, error });
        };
        if result != FaResult::Accepted {
            let error = match result {
                FaResult::NotRegistered => NormalError::NotRegistered(Box::new(a.remote)),
                FaResult::QosNotSatisfiable => NormalError::QosNotSatisfiable(reason),
                FaResult::NoResources => NormalError::NoResources(reason),
                FaResult::Refused | FaResult::Accepted => NormalError::Refused(reason),
            };
            fail(self, error);
            return;
        }
        let undo = |me: &mut Self| me.send_dealloc(now, from, src_cep, a.local_cep);
        if max_sdu == 0 || src_cep == 0 {
            self.counters.rx_fa_malformed += 1;
            undo(self);
            fail(
                self,
                NormalError::Refused("the peer accepted with a maximum SDU or CEP-id of 0".into()),
            );
            return;
        }
        let Some(efcp) = self.cube(a.qos_id).map(|c| c.efcp.clone()) else {
            undo(self);
            fail(
                self,
                NormalError::QosNotSatisfiable(format!("no QoS cube {}", a.qos_id)),
            );
            return;
        };
        let ep = super::Endpoint {
            local_cep: a.local_cep,
            remote_addr: from,
            remote_cep: src_cep,
            qos_id: a.qos_id,
        };
        if let Err(e) = self.open_flow(now, flow, ep, efcp) {
            undo(self);
            fail(self, e);
            return;
        }
        let max_sdu = max_sdu.min(self.max_sdu_u32());
        self.actions.push_back(Action::Allocated { flow, max_sdu });
    }

    /// Repeats requests, gives up allocations and withdraws requests that
    /// waited too long.
    pub(super) fn fa_timeout(&mut self, now: Instant) {
        let mut expired = Vec::new();
        for due in self.fa.requests.handle_timeout(now, self.cfg.alloc_retry) {
            match due {
                Due::Resend { to, message } => {
                    self.counters.alloc_retries += 1;
                    self.send_fa_request(now, to, &message);
                }
                Due::Expired { key, to, message } => expired.push((key, to, message)),
            }
        }
        self.dealloc_timeout(now);
        for (flow, to, request) in expired {
            self.settle_fa_request(to, &request);
            if let Some(a) = self.fa.allocating.remove(&flow) {
                self.fa.allocating_by_cep.remove(&a.local_cep);
                self.counters.alloc_timeouts += 1;
                self.actions.push_back(Action::AllocateFailed {
                    flow,
                    error: NormalError::Timeout {
                        dst: a.dst,
                        after: self.cfg.alloc_timeout,
                    },
                });
            }
        }
        let late: Vec<u64> = self
            .fa
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
}

impl NormalIpcp {
    /// Repeats unacknowledged DEALLOCs and gives up those past their
    /// deadline.
    fn dealloc_timeout(&mut self, now: Instant) {
        for due in self.fa.releasing.handle_timeout(now, self.cfg.alloc_retry) {
            match due {
                Due::Resend { to, message } => {
                    self.counters.dealloc_retries += 1;
                    self.send_fa_request(now, to, &message);
                }
                Due::Expired { to, message, .. } => {
                    self.counters.dealloc_unacked += 1;
                    self.settle_fa_request(to, &message);
                }
            }
        }
    }
}

/// The sender's CEP-id of an encoded DEALLOC.
fn dealloc_sender(message: &[u8]) -> Option<CepId> {
    match FaMessage::parse(message) {
        Ok(FaMessage::Dealloc { src_cep, .. }) => Some(src_cep),
        _ => None,
    }
}
