//! The glue between the normal IPCP and its flow allocator ([`fa`]): the
//! public allocation API, the directory lookups that pick a destination,
//! and the carrying out of what the allocator asks for ([`fa::FaOut`]) —
//! sending its messages through the RIB daemon, opening and closing flows,
//! reporting to the driver.

use super::mgmt_rib::Peer;
use super::{cubes, fa, Endpoint, FlowId, NormalError, NormalIpcp, QosCube};
use crate::rib::OwnerId;
use crate::rmt::Address;
use crate::time::Instant;
use rina_wire::cdap::CdapMessage;
use rina_wire::{AppName, QosSpec};

impl NormalIpcp {
    /// The flow allocator and what it may read of this IPCP, borrowed apart.
    fn fa_parts(&mut self) -> (&mut fa::FlowAllocator, fa::Ctx<'_>) {
        let cx = fa::Ctx {
            cfg: &self.cfg,
            flows: &self.flows,
            by_cep: &self.by_cep,
        };
        (&mut self.fa, cx)
    }

    /// Carries out what the flow allocator asked for, in order.
    fn run_fa(&mut self, now: Instant) {
        while let Some(out) = self.fa.poll_out() {
            match out {
                fa::FaOut::Send {
                    to,
                    message,
                    request,
                } => {
                    if request {
                        self.track_fa_request(now, to, &message);
                    }
                    self.send_management_to(now, to, &message);
                }
                fa::FaOut::Settle { to, message } => self.settle_fa_request(to, &message),
                fa::FaOut::Open { flow, ep, max_sdu } => {
                    let result = self.open_cube_flow(now, flow, ep);
                    let (fa, cx) = self.fa_parts();
                    fa.opened(&cx, now, (flow, ep, max_sdu), result);
                }
                fa::FaOut::Close { flow } => {
                    // What it received is handed out before it closes.
                    self.flush_flow(now, flow);
                    let _ = self.close_flow(flow);
                }
                fa::FaOut::CloseAfter { flow, last_seq } => {
                    // A repeated DEALLOC (its answer was lost) keeps the
                    // first one's deadline: the peer's retries cannot hold
                    // the flow open.
                    self.closing
                        .entry(flow)
                        .or_insert((last_seq, now + fa::DEALLOC_GRACE));
                }
                fa::FaOut::Report(action) => self.actions.push_back(*action),
            }
        }
    }

    /// Opens `flow` as `ep` with the EFCP policies of its cube.
    fn open_cube_flow(
        &mut self,
        now: Instant,
        flow: FlowId,
        ep: Endpoint,
    ) -> Result<(), NormalError> {
        let efcp = self
            .cube(ep.qos_id)
            .map(|c| c.efcp.clone())
            .ok_or_else(|| NormalError::QosNotSatisfiable(format!("no QoS cube {}", ep.qos_id)))?;
        self.open_flow(now, flow, ep, efcp)
    }

    /// The RIB daemon's session with `to` waits for the answer to the
    /// encoded request `message` (REQUEST or DEALLOC), so that it comes
    /// back to the flow allocator.
    fn track_fa_request(&mut self, now: Instant, to: Address, message: &[u8]) {
        if let Some(m) = message.get(1..).and_then(|b| CdapMessage::decode(b).ok()) {
            let _ = self
                .mgmt
                .request(now, Peer::Remote(to), OwnerId::FLOW_ALLOCATOR, m);
        }
    }

    /// The flow allocator no longer waits for an answer to the encoded
    /// request `message` to `to`.
    fn settle_fa_request(&mut self, to: Address, message: &[u8]) {
        let invoke = message
            .get(1..)
            .and_then(|b| CdapMessage::decode(b).ok())
            .and_then(|m| m.invoke_id);
        if let Some(i) = invoke {
            self.mgmt.settle(Peer::Remote(to), i);
        }
    }

    /// The QoS cube that serves `qos`: see [`QosCube`] and the rules of
    /// [`NormalConfig::cubes`](super::NormalConfig::cubes).
    ///
    /// A spec asking for reliability (`reliable`, `max_loss_ppm = 0`,
    /// `max_sdu_gap = 0`, or `in_order`) gets a cube whose EFCP retransmits
    /// and delivers in order (and, unless only `in_order` was asked, never
    /// gives up a hole); anything else gets the first cube without
    /// retransmission. `max_sdu_size` above the DIF's maximum SDU, or
    /// `max_sdu_gap` above [`MAX_SDU_GAP`](rina_wire::qos::MAX_SDU_GAP), is
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
        self.resolve(name).is_some()
    }

    /// Where flows to `name` go, if anywhere: this IPCP if it is registered
    /// here, else its static directory entry, else (when on) the
    /// disseminated directory's answer.
    pub fn resolve(&self, name: &AppName) -> Option<Address> {
        if self.fa.is_registered(name) {
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

    /// Replaces the subtrees of the RIB members may read
    /// ([`NormalConfig::rib_readable`](super::NormalConfig::rib_readable));
    /// reads under way keep their answers.
    pub fn set_rib_readable(&mut self, readable: Vec<String>) {
        self.cfg.rib_readable = readable;
    }

    /// The subtrees of the RIB members may read.
    pub fn rib_readable(&self) -> &[String] {
        &self.cfg.rib_readable
    }

    /// Registers an application name so that flows can be allocated to it;
    /// [`NormalError::AccessDenied`] if the DIF's access rules do not let it.
    pub fn register(&mut self, name: AppName) -> Result<(), NormalError> {
        let (fa, cx) = self.fa_parts();
        fa.register(&cx, name.clone())?;
        self.dft_register(&name);
        Ok(())
    }

    /// Withdraws a name; requests waiting for its application are refused
    /// (and reported as [`Action::RequestWithdrawn`](super::Action::RequestWithdrawn)). Returns whether it
    /// was registered.
    pub fn unregister(&mut self, name: &AppName) -> bool {
        let now = self.now;
        let (fa, cx) = self.fa_parts();
        if !fa.unregister(&cx, now, name) {
            return false;
        }
        self.dft_unregister(name);
        self.run_fa(now);
        true
    }

    /// Registered names.
    pub fn names(&self) -> impl Iterator<Item = &AppName> {
        self.fa.names()
    }

    /// Whether `flow` is being allocated (asked for, not answered yet).
    pub fn is_allocating(&self, flow: FlowId) -> bool {
        self.fa.is_allocating(flow)
    }

    /// Incoming requests waiting for an application's answer.
    pub fn pending_requests(&self) -> usize {
        self.fa.pending_requests()
    }

    /// DEALLOCs sent and not acknowledged yet.
    pub fn deallocs_unacknowledged(&self) -> usize {
        self.fa.releasing()
    }

    /// Starts allocating flow `flow` from application `local` to application
    /// `remote`. The outcome is reported later as [`Action::Allocated`](super::Action::Allocated) or
    /// [`Action::AllocateFailed`](super::Action::AllocateFailed); what is wrong at once is returned:
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
        {
            let (fa, cx) = self.fa_parts();
            fa.check_allocate(&cx, flow, &local, &remote)?;
        }
        let dst = self
            .resolve(&remote)
            .ok_or_else(|| NormalError::NameNotFound(Box::new(remote.clone())))?;
        let qos_id = self.choose_cube(&qos)?.id;
        let (fa, cx) = self.fa_parts();
        fa.allocate(&cx, now, flow, local, remote, qos, (dst, qos_id))?;
        self.run_fa(now);
        self.flush(now);
        Ok(())
    }

    /// Accepts incoming request `handle` ([`Action::FlowRequest`](super::Action::FlowRequest)) as flow
    /// `flow`: opens this end and answers the requester. Returns the flow's
    /// largest SDU.
    pub fn accept(&mut self, now: Instant, handle: u64, flow: FlowId) -> Result<u32, NormalError> {
        self.tick(now);
        let (fa, cx) = self.fa_parts();
        let accepting = fa.accept(&cx, handle, flow)?;
        let opened = self.open_cube_flow(now, flow, accepting.ep);
        let (fa, cx) = self.fa_parts();
        let max_sdu = fa.accepted(&cx, accepting, opened);
        self.run_fa(now);
        self.flush(now);
        max_sdu
    }

    /// Refuses incoming request `handle`, telling the requester why.
    pub fn refuse(&mut self, handle: u64, reason: &str) -> Result<(), NormalError> {
        let now = self.now;
        let (fa, cx) = self.fa_parts();
        fa.refuse(&cx, now, handle, reason)?;
        self.run_fa(now);
        self.flush(now);
        Ok(())
    }

    /// Deallocates `flow`: closes it and tells the peer, whose IPCP reports
    /// [`Action::Deallocated`](super::Action::Deallocated). An allocation still in progress is
    /// abandoned (a late acceptance is then answered with a deallocation).
    pub fn deallocate(&mut self, now: Instant, flow: FlowId) -> Result<(), NormalError> {
        self.tick(now);
        let (fa, cx) = self.fa_parts();
        let open = fa.deallocate(&cx, now, flow)?;
        if open.is_some() {
            self.close_flow(flow)?;
        }
        self.run_fa(now);
        if open.is_some() {
            self.flush(now);
        }
        Ok(())
    }

    /// A CDAP message on a flow object arrived from the member at `from`
    /// (through the RIB daemon).
    pub(super) fn on_fa_cdap(&mut self, now: Instant, from: Address, msg: &CdapMessage) {
        let (fa, cx) = self.fa_parts();
        fa.on_cdap(&cx, now, from, msg);
        self.run_fa(now);
    }

    /// A PDU from the member at the PCI's source for a CEP-id of ours no
    /// flow has: unless its flow closed lately (or it is our own), the
    /// peer's connection is told it has no end here.
    pub(super) fn on_unknown_cep(&mut self, now: Instant, pci: &rina_wire::pci::Pci) {
        if pci.src_addr == self.cfg.address || self.closed_ceps.contains(pci.dst_cep) {
            return;
        }
        let (fa, cx) = self.fa_parts();
        fa.connection_gone(&cx, now, (pci.src_addr, pci.src_cep), pci.dst_cep);
        self.run_fa(now);
    }

    /// The flow allocator's timers.
    pub(super) fn fa_timeout(&mut self, now: Instant) {
        let (fa, cx) = self.fa_parts();
        fa.handle_timeout(&cx, now);
        self.run_fa(now);
    }
}
