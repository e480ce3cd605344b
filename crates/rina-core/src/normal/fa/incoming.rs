//! What reaches the flow allocator from outside: CDAP messages on flow
//! objects from peers, the outcome of opening an accepted flow, and time.

use super::{Allocating, Ctx, FaOut, FlowAllocator, Pending, NO_CEP};
use crate::normal::{Action, CepId, Endpoint, FlowId, NormalError};
use crate::rmt::Address;
use crate::time::Instant;
use rina_wire::cdap::CdapMessage;
use rina_wire::fa::{FaMessage, FaResult};
use rina_wire::{AppName, QosSpec};

use super::retransmit::Due;

/// A REQUEST as it arrived.
struct Request {
    src_addr: Address,
    src_cep: CepId,
    qos_id: u64,
    qos: QosSpec,
    src: AppName,
    dst: AppName,
}

/// A RESPONSE as it arrived.
struct Response {
    from: Address,
    dst_cep: CepId,
    src_cep: CepId,
    result: FaResult,
    max_sdu: u32,
    reason: String,
}

impl FlowAllocator {
    /// A CDAP message on a flow object arrived from the member at `from`
    /// (through the RIB daemon).
    pub(in crate::normal) fn on_cdap(
        &mut self,
        cx: &Ctx,
        now: Instant,
        from: Address,
        msg: &CdapMessage,
    ) {
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
                let r = Request {
                    src_addr,
                    src_cep,
                    qos_id,
                    qos,
                    src,
                    dst,
                };
                self.on_request(cx, now, r);
            }
            FaMessage::Response {
                dst_cep,
                src_cep,
                result,
                max_sdu,
                reason,
                ..
            } => {
                let r = Response {
                    from,
                    dst_cep,
                    src_cep,
                    result,
                    max_sdu,
                    reason,
                };
                self.on_response(cx, now, r);
            }
            FaMessage::Dealloc {
                dst_cep, src_cep, ..
            } if dst_cep == NO_CEP => self.on_cancel(cx, now, from, src_cep),
            FaMessage::Dealloc {
                dst_cep,
                src_cep,
                last_seq,
                ..
            } => self.on_dealloc(cx, from, (dst_cep, src_cep), last_seq),
            // The acknowledgement of a cancel: nothing waits for it.
            FaMessage::DeallocAck { src_cep, .. } if src_cep == NO_CEP => {}
            FaMessage::DeallocAck {
                dst_cep, src_cep, ..
            } => {
                let acked = self
                    .releasing
                    .message(&(from, src_cep))
                    .is_some_and(|m| dealloc_sender(m) == Some(dst_cep));
                if acked {
                    self.releasing.stop(&(from, src_cep));
                } else {
                    self.counters.rx_fa_stale += 1;
                }
            }
        }
    }

    /// Whether open flow `flow` is the one to `(from, remote_cep)`.
    fn is_flow_to(cx: &Ctx, flow: FlowId, from: Address, remote_cep: CepId) -> bool {
        cx.endpoint(flow)
            .is_some_and(|ep| ep.remote_addr == from && ep.remote_cep == remote_cep)
    }

    /// The requester `(from, src_cep)` gave up its allocation before an
    /// answer came (a DEALLOC naming no CEP-id of ours): a request still
    /// waiting for the application is withdrawn and refused, so that a
    /// late acceptance does not open a flow nobody will use, and a repeat
    /// of the request gets the refusal; a flow the application already
    /// accepted is closed. Acknowledged either way.
    fn on_cancel(&mut self, cx: &Ctx, now: Instant, from: Address, src_cep: CepId) {
        let waiting = self
            .pending
            .iter()
            .find(|(_, p)| p.src_addr == from && p.src_cep == src_cep)
            .map(|(h, _)| *h);
        let accepted = self.accepted.get(&(from, src_cep)).copied();
        if let Some(handle) = waiting {
            self.pending.remove(&handle);
            self.counters.alloc_cancelled += 1;
            let reason = "the requester gave up";
            self.remember_refusal(cx, now, from, src_cep, FaResult::Refused, reason);
            self.out
                .push_back(FaOut::Report(Box::new(Action::RequestWithdrawn { handle })));
        } else if let Some(flow) = accepted.filter(|&f| Self::is_flow_to(cx, f, from, src_cep)) {
            self.counters.alloc_cancelled += 1;
            self.out.push_back(FaOut::Close { flow });
            self.out
                .push_back(FaOut::Report(Box::new(Action::Deallocated { flow })));
        } else {
            self.counters.rx_fa_stale += 1;
        }
        self.send(
            from,
            &FaMessage::DeallocAck {
                src_addr: cx.cfg.address,
                dst_cep: src_cep,
                src_cep: NO_CEP,
            },
        );
    }

    /// The peer deleted our flow object `dst_cep`: close the flow, once
    /// its data PDUs up to `last_seq` have come (the DEALLOC may overtake
    /// them: management PDUs go first in every RMT), and acknowledge
    /// whether or not it was still here (the acknowledgement of an earlier
    /// copy may have been lost).
    fn on_dealloc(
        &mut self,
        cx: &Ctx,
        from: Address,
        (dst_cep, src_cep): (CepId, CepId),
        last_seq: Option<u64>,
    ) {
        let ours = cx
            .at_cep(dst_cep)
            .filter(|&id| Self::is_flow_to(cx, id, from, src_cep));
        match ours {
            Some(flow) => {
                let waiting = last_seq.filter(|&s| {
                    cx.flows
                        .get(&flow)
                        .is_some_and(|f| !f.efcp.received_through(s))
                });
                match waiting {
                    Some(last_seq) => self.out.push_back(FaOut::CloseAfter { flow, last_seq }),
                    None => {
                        self.out.push_back(FaOut::Close { flow });
                        self.out
                            .push_back(FaOut::Report(Box::new(Action::Deallocated { flow })));
                    }
                }
            }
            None => self.counters.rx_fa_stale += 1,
        }
        self.send(
            from,
            &FaMessage::DeallocAck {
                src_addr: cx.cfg.address,
                dst_cep: src_cep,
                src_cep: dst_cep,
            },
        );
    }

    /// Requests from address `src` waiting for an application's answer.
    fn pending_from(&self, src: Address) -> usize {
        self.pending.values().filter(|p| p.src_addr == src).count()
    }

    /// Why this IPCP cannot serve request `r` at all, if it cannot.
    fn refusal_of(&self, cx: &Ctx, r: &Request) -> Option<(FaResult, String)> {
        let cfg = cx.cfg;
        if !self.names.contains(&r.dst) {
            Some((
                FaResult::NotRegistered,
                format!("{} is not registered at address {}", r.dst, cfg.address),
            ))
        } else if let Err(reason) = cfg.access.check_allocate(&cfg.dif, &r.src, &r.dst) {
            Some((FaResult::Refused, reason))
        } else if self.pending.len() >= cfg.max_pending
            || cx.open_flows() + self.allocating.len() >= cfg.max_flows
        {
            Some((FaResult::NoResources, "too many flows".to_string()))
        } else if self.pending_from(r.src_addr) >= cfg.max_pending_per_source.max(1) {
            Some((
                FaResult::NoResources,
                format!(
                    "too many requests from address {} waiting for an answer",
                    r.src_addr
                ),
            ))
        } else if !cfg.cubes.iter().any(|c| c.id == r.qos_id) {
            Some((
                FaResult::QosNotSatisfiable,
                format!("no QoS cube {} in DIF {}", r.qos_id, cfg.dif),
            ))
        } else if r.qos.max_sdu_size.is_some_and(|s| s as usize > cfg.max_sdu) {
            Some((
                FaResult::QosNotSatisfiable,
                format!("SDUs are at most {} bytes", cfg.max_sdu),
            ))
        } else {
            None
        }
    }

    fn on_request(&mut self, cx: &Ctx, now: Instant, r: Request) {
        self.counters.alloc_requests_in += 1;
        let key = (r.src_addr, r.src_cep);
        // A repeated request: answer again if accepted, ignore if pending.
        if let Some(&flow) = self.accepted.get(&key) {
            if let Some(ep) = cx.endpoint(flow) {
                self.send(
                    r.src_addr,
                    &FaMessage::Response {
                        dst_addr: r.src_addr,
                        dst_cep: r.src_cep,
                        src_cep: ep.local_cep,
                        result: FaResult::Accepted,
                        max_sdu: cx.max_sdu(),
                        reason: String::new(),
                    },
                );
                return;
            }
        }
        if self
            .pending
            .values()
            .any(|p| (p.src_addr, p.src_cep) == key)
        {
            return;
        }
        // Refused lately (the refusal may have been lost): refuse again.
        if let Some(f) = self.refused.get(&key) {
            if f.until > now {
                let (result, reason) = (f.result, f.reason.clone());
                self.respond_refusal(cx, r.src_addr, r.src_cep, result, &reason);
                return;
            }
        }
        if let Some((result, reason)) = self.refusal_of(cx, &r) {
            self.counters.alloc_refused += 1;
            self.respond_refusal(cx, r.src_addr, r.src_cep, result, &reason);
            return;
        }
        let handle = self.next_handle;
        self.next_handle += 1;
        self.pending.insert(
            handle,
            Pending {
                src_addr: r.src_addr,
                src_cep: r.src_cep,
                qos_id: r.qos_id,
                local: r.dst.clone(),
                deadline: now + cx.cfg.accept_timeout,
            },
        );
        self.out
            .push_back(FaOut::Report(Box::new(Action::FlowRequest {
                handle,
                local: Box::new(r.dst),
                remote: Box::new(r.src),
                qos: Box::new(r.qos),
            })));
    }

    fn on_response(&mut self, cx: &Ctx, now: Instant, r: Response) {
        let waiting = self
            .allocating_by_cep
            .get(&r.dst_cep)
            .copied()
            .filter(|f| self.allocating.get(f).is_some_and(|a| a.dst == r.from));
        let Some(flow) = waiting else {
            // Not waiting for this: a repeated answer to a flow that exists
            // (ignored), an acceptance of an allocation given up lately
            // (undone), or anything else (ignored: answering it would have
            // a forged answer send DEALLOCs anywhere).
            let known = cx
                .at_cep(r.dst_cep)
                .is_some_and(|id| Self::is_flow_to(cx, id, r.from, r.src_cep));
            if !known {
                self.counters.rx_fa_stale += 1;
                if r.result == FaResult::Accepted
                    && r.src_cep != 0
                    && self.gave_up(now, r.from, r.dst_cep)
                {
                    self.send_dealloc(cx, now, (r.from, r.src_cep, r.dst_cep), None);
                }
            }
            return;
        };
        let Some(a) = self.allocating.remove(&flow) else {
            return;
        };
        self.allocating_by_cep.remove(&a.local_cep);
        self.requests.stop(&flow);
        if r.result != FaResult::Accepted {
            let error = match r.result {
                FaResult::NotRegistered => NormalError::NotRegistered(Box::new(a.remote)),
                FaResult::QosNotSatisfiable => NormalError::QosNotSatisfiable(r.reason),
                FaResult::NoResources => NormalError::NoResources(r.reason),
                FaResult::Refused | FaResult::Accepted => NormalError::Refused(r.reason),
            };
            self.fail(flow, error);
            return;
        }
        if r.max_sdu == 0 || r.src_cep == 0 {
            self.counters.rx_fa_malformed += 1;
            self.send_dealloc(cx, now, (r.from, r.src_cep, a.local_cep), None);
            let why = "the peer accepted with a maximum SDU or CEP-id of 0";
            self.fail(flow, NormalError::Refused(why.into()));
            return;
        }
        let Allocating {
            local_cep, qos_id, ..
        } = a;
        let ep = Endpoint {
            local_cep,
            remote_addr: r.from,
            remote_cep: r.src_cep,
            qos_id,
        };
        let max_sdu = r.max_sdu.min(cx.max_sdu());
        self.out.push_back(FaOut::Open { flow, ep, max_sdu });
    }

    /// The IPCP opened (or failed to open) flow `flow` as `ep`, which the
    /// peer accepted ([`FaOut::Open`]): reports it allocated, or undoes the
    /// peer's end and reports the failure.
    pub(in crate::normal) fn opened(
        &mut self,
        cx: &Ctx,
        now: Instant,
        (flow, ep, max_sdu): (FlowId, Endpoint, u32),
        result: Result<(), NormalError>,
    ) {
        match result {
            Ok(()) => self
                .out
                .push_back(FaOut::Report(Box::new(Action::Allocated { flow, max_sdu }))),
            Err(e) => {
                self.send_dealloc(cx, now, (ep.remote_addr, ep.remote_cep, ep.local_cep), None);
                self.fail(flow, e);
            }
        }
    }

    fn fail(&mut self, flow: FlowId, error: NormalError) {
        self.out
            .push_back(FaOut::Report(Box::new(Action::AllocateFailed {
                flow,
                error: Box::new(error),
            })));
    }

    /// Repeats requests and DEALLOCs, gives up allocations and withdraws
    /// requests that waited too long.
    pub(in crate::normal) fn handle_timeout(&mut self, cx: &Ctx, now: Instant) {
        let mut expired = Vec::new();
        for due in self.requests.handle_timeout(now, cx.cfg.alloc_retry) {
            match due {
                Due::Resend { to, message } => {
                    self.counters.alloc_retries += 1;
                    self.send_request(to, message);
                }
                Due::Expired { key, to, message } => expired.push((key, to, message)),
            }
        }
        for due in self.releasing.handle_timeout(now, cx.cfg.alloc_retry) {
            match due {
                Due::Resend { to, message } => {
                    self.counters.dealloc_retries += 1;
                    self.send_request(to, message);
                }
                Due::Expired { to, message, .. } => {
                    self.counters.dealloc_unacked += 1;
                    self.out.push_back(FaOut::Settle { to, message });
                }
            }
        }
        for (flow, to, message) in expired {
            self.out.push_back(FaOut::Settle { to, message });
            if let Some(a) = self.allocating.remove(&flow) {
                self.allocating_by_cep.remove(&a.local_cep);
                self.cancel(cx, now, to, a.local_cep);
                self.counters.alloc_timeouts += 1;
                let error = NormalError::Timeout {
                    dst: a.dst,
                    after: cx.cfg.alloc_timeout,
                };
                self.fail(flow, error);
            }
        }
        let late: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| now >= p.deadline)
            .map(|(h, _)| *h)
            .collect();
        for handle in late {
            let _ = self.refuse(cx, now, handle, "the application did not answer in time");
            self.out
                .push_back(FaOut::Report(Box::new(Action::RequestWithdrawn { handle })));
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
