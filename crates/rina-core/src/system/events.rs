//! What a system does with the events of its members.

use super::member::{IpcpEvent, Machine, PortId};
use super::{AppEvent, Output, System};
use crate::sdu::Sdu;
use crate::time::Instant;
use rina_wire::AppName;

impl System {
    /// Carries out one event of member `i`.
    pub(super) fn on_event(&mut self, now: Instant, i: usize, ev: IpcpEvent) {
        match ev {
            IpcpEvent::FlowRequest {
                handle,
                local,
                remote,
                qos,
            } => self.flow_request(now, i, handle, local, remote, qos),
            IpcpEvent::RequestWithdrawn { handle } => {
                let gone: Vec<u64> = self
                    .incoming
                    .iter()
                    .filter(|(_, &(m, h))| m == i && h == handle)
                    .map(|(&h, _)| h)
                    .collect();
                for h in gone {
                    self.incoming.remove(&h);
                    self.out
                        .push_back(Output::App(AppEvent::RequestWithdrawn { handle: h }));
                }
            }
            IpcpEvent::Allocated { port, max_sdu } => {
                if let Some((j, k)) = self.n1_pending.remove(&port) {
                    self.bind_n1(now, j, k, i, port);
                } else if self.app_pending.remove(&port).is_some() {
                    self.app_flows.insert(port, i);
                    self.app_flow_opened(port, i);
                    self.out
                        .push_back(Output::App(AppEvent::Allocated { port, max_sdu }));
                } else {
                    self.members[i].deallocate(now, port);
                }
            }
            IpcpEvent::AllocateFailed { port, error } => {
                if let Some((j, k)) = self.n1_pending.remove(&port) {
                    let nb = &mut self.plans[j].neighbors[k];
                    if nb.pending == Some(port) {
                        nb.pending = None;
                    }
                } else if self.app_pending.remove(&port).is_some() {
                    self.out
                        .push_back(Output::App(AppEvent::AllocateFailed { port, error }));
                }
            }
            IpcpEvent::Deallocated { port } | IpcpEvent::FlowFailed { port } => {
                if self.n1.contains_key(&port) {
                    // A failed flow is still open in member `i`: the driver
                    // deallocates it (an N-1 flow of a stacked DIF that
                    // failed stayed open below, one more per outage).
                    if matches!(ev, IpcpEvent::FlowFailed { .. }) {
                        self.members[i].deallocate(now, port);
                    }
                    self.unbind_n1(now, port);
                } else if self.app_flows.remove(&port).is_some() {
                    self.want_writable.remove(&port);
                    self.app_closing.remove(&port);
                    self.members[i].deallocate(now, port);
                    self.out
                        .push_back(Output::App(AppEvent::Deallocated { port }));
                }
            }
            IpcpEvent::Deliver { port, sdu } => {
                let congested = match &mut self.members[i].machine {
                    Machine::Normal(n) => n.take_congested(port),
                    _ => false,
                };
                self.deliver_marked(now, port, sdu, congested)
            }
            IpcpEvent::Transmit { port, frame } => self.n1_transmit(now, port, frame),
            IpcpEvent::ToMedium { peer, frame } => self.send_on_medium(i, peer, frame),
            IpcpEvent::Membership(event) => {
                match *event {
                    crate::normal::MembershipEvent::NeighborDown { port, .. } => {
                        self.neighbor_silent(now, port)
                    }
                    crate::normal::MembershipEvent::NeighborUp { port, address, .. } => {
                        self.neighbor_heard(i, port, address)
                    }
                    _ => {}
                }
                self.out.push_back(Output::Membership { member: i, event });
            }
            IpcpEvent::ManagementUnhandled => self.counters.mgmt_unhandled += 1,
            IpcpEvent::RibRead { handle, result } => self.out.push_back(Output::RibRead {
                member: i,
                handle,
                result,
            }),
        }
    }

    fn flow_request(
        &mut self,
        now: Instant,
        i: usize,
        handle: u64,
        local: Box<AppName>,
        remote: Box<AppName>,
        qos: Box<rina_wire::QosSpec>,
    ) {
        if let Some(&j) = self.ipcp_names.get(&(i, (*local).clone())) {
            self.accept_n1(now, i, j, handle, &remote);
            return;
        }
        if !self.app_names.contains(&(i, (*local).clone())) {
            let _ = self.members[i].refuse(handle, "no application holds the name");
            return;
        }
        let h = self.next_handle;
        self.next_handle += 1;
        self.incoming.insert(h, (i, handle));
        self.out.push_back(Output::App(AppEvent::FlowRequest {
            handle: h,
            dif: self.members[i].dif.clone(),
            local,
            remote,
            qos,
        }));
    }

    /// Delivers an SDU that crossed congestion (`congested`: a PDU of its
    /// flow carried the ECN flag) to an upper IPCP or an application.
    pub(super) fn deliver_marked(&mut self, now: Instant, port: PortId, sdu: Sdu, congested: bool) {
        if let Some((upper, _)) = self.n1_of(port) {
            if let Machine::Normal(n) = &mut self.members[upper].machine {
                n.on_frame_buf(now, port, sdu.into_buf(), congested);
            }
        } else if self.app_flows.contains_key(&port) {
            self.out.push_back(Output::ToApp { port, sdu });
        } else {
            self.counters.app_rx_orphan += 1;
        }
    }

    /// A flow of member `i` became an application's: with credit on read,
    /// a normal IPCP keeps its SDUs' credit until the driver says they
    /// were taken.
    pub(super) fn app_flow_opened(&mut self, port: PortId, i: usize) {
        if self.credit_on_read {
            if let Some(n) = self.members[i].normal_mut() {
                let _ = n.set_auto_consume(port, false);
            }
        }
    }

    /// Tells the writers that waited for room that there is some.
    pub(super) fn report_writable(&mut self) {
        if self.want_writable.is_empty() {
            return;
        }
        let ready: Vec<PortId> = self
            .want_writable
            .iter()
            .filter(|(&p, &len)| self.can_write(p, len))
            .map(|(&p, _)| p)
            .collect();
        for port in ready {
            self.want_writable.remove(&port);
            self.out.push_back(Output::App(AppEvent::Writable { port }));
        }
    }
}
