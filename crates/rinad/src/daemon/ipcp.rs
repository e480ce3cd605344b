//! One IPC process of the daemon, whatever its kind, behind one facade.
//!
//! The daemon's bookkeeping (names, flows, control requests) does not care
//! whether an IPCP is a shim or a normal one: it calls the flow-allocation
//! API here and receives [`Event`]s. Each kind keeps its own IO in its own
//! module ([`super::shim`]).

use super::normal::NormalIo;
use super::shim::ShimIo;
use super::shim_eth::EthIo;
use super::shim_hv::HvIo;
use super::Daemon;
use rina_core::normal;
use rina_core::shim_eth as shim_eth_core;
use rina_core::shim_hv as shim_hv_core;
use rina_core::shim_udp::{self, PortId};
use rina_core::system::FlowError;
use rina_core::Instant;
use rina_wire::ctl::{CtlError, ErrorKind, FlowCounters};
use rina_wire::{AppName, QosSpec};
use std::collections::BTreeMap;
use tracing::{debug, error, info, warn};

/// What an IPCP tells the daemon: the core's one event vocabulary of the
/// IPCP contract (a shim's own datagrams, `ToMedium`, are sent here and
/// never reach the daemon's loop).
pub(super) use rina_core::system::IpcpEvent as Event;

/// The kinds of IPCP.
pub(super) enum Imp {
    /// A shim IPCP over UDP with its socket.
    Shim(Box<ShimIo>),
    /// A normal IPCP.
    Normal(Box<NormalIo>),
    /// A shim IPCP over Ethernet 802.1Q with its raw socket.
    ShimEth(Box<EthIo>),
    /// A shim IPCP for hypervisors with its shared-memory rings.
    ShimHv(Box<HvIo>),
}

/// An IPC process hosted by the daemon.
pub(super) struct Ipcp {
    pub name: String,
    pub dif: String,
    pub imp: Imp,
}

impl Ipcp {
    /// Kind, as written in the configuration.
    pub fn kind(&self) -> &'static str {
        match &self.imp {
            Imp::Shim(_) => "shim-udp",
            Imp::Normal(_) => "normal",
            Imp::ShimEth(_) => "shim-eth",
            Imp::ShimHv(_) => "shim-hv",
        }
    }

    /// Its address in its DIF, for listings.
    pub fn address(&self) -> String {
        match &self.imp {
            Imp::Shim(s) => s.bind.to_string(),
            Imp::Normal(n) => n.machine.config().address.to_string(),
            Imp::ShimEth(e) => e.address(),
            Imp::ShimHv(h) => h.address(),
        }
    }

    /// Largest SDU its flows carry.
    pub fn max_sdu(&self) -> usize {
        match &self.imp {
            Imp::Shim(s) => s.machine.config().max_sdu as usize,
            Imp::Normal(n) => n.machine.config().max_sdu,
            Imp::ShimEth(e) => e.machine.config().max_sdu() as usize,
            Imp::ShimHv(h) => h.machine.config().max_sdu as usize,
        }
    }

    /// Registers an application name.
    pub fn register(&mut self, name: AppName) -> Result<(), CtlError> {
        match &mut self.imp {
            Imp::Shim(s) => s.machine.register(name).map_err(flow_error),
            Imp::Normal(n) => {
                n.machine.register(name.clone()).map_err(flow_error)?;
                n.names.insert(name);
                Ok(())
            }
            Imp::ShimEth(e) => e.machine.register(name).map_err(flow_error),
            Imp::ShimHv(h) => h.machine.register(name).map_err(flow_error),
        }
    }

    /// Withdraws a registration.
    pub fn unregister(&mut self, name: &AppName) -> bool {
        match &mut self.imp {
            Imp::Shim(s) => s.machine.unregister(name),
            Imp::Normal(n) => {
                n.names.remove(name);
                n.machine.unregister(name)
            }
            Imp::ShimEth(e) => e.machine.unregister(name),
            Imp::ShimHv(h) => h.machine.unregister(name),
        }
    }

    /// Whether this IPCP can reach `name`.
    pub fn knows(&self, name: &AppName) -> bool {
        match &self.imp {
            Imp::Shim(s) => s.machine.knows(name),
            Imp::Normal(n) => n.machine.knows(name),
            // Any name may resolve by ARP; it is asked at allocation.
            Imp::ShimEth(_) => true,
            // Point to point: whether the other end has it is asked at allocation.
            Imp::ShimHv(_) => true,
        }
    }

    /// Registered names.
    pub fn names(&self) -> Vec<AppName> {
        match &self.imp {
            Imp::Shim(s) => s.machine.names().cloned().collect(),
            Imp::ShimEth(e) => e.machine.registered().cloned().into_iter().collect(),
            Imp::ShimHv(h) => h.machine.names().cloned().collect(),
            Imp::Normal(n) => n.names.iter().cloned().collect(),
        }
    }

    /// Starts allocating flow `port`.
    pub fn allocate(
        &mut self,
        now: Instant,
        port: PortId,
        local: AppName,
        remote: AppName,
        qos: QosSpec,
    ) -> Result<(), CtlError> {
        match &mut self.imp {
            Imp::Shim(s) => s
                .machine
                .allocate(now, port, local, remote, qos)
                .map_err(flow_error),
            Imp::Normal(n) => n
                .machine
                .allocate(now, port, local, remote, qos)
                .map_err(flow_error),
            Imp::ShimEth(e) => e
                .machine
                .allocate(now, port, local, remote, qos)
                .map_err(flow_error),
            Imp::ShimHv(h) => h
                .machine
                .allocate(now, port, local, remote, qos)
                .map_err(flow_error),
        }
    }

    /// Accepts incoming request `handle` as flow `port`; returns its max SDU.
    pub fn accept(&mut self, now: Instant, handle: u64, port: PortId) -> Result<u32, CtlError> {
        match &mut self.imp {
            Imp::Shim(s) => s.machine.accept(handle, port).map_err(flow_error),
            Imp::Normal(n) => n.machine.accept(now, handle, port).map_err(flow_error),
            Imp::ShimEth(e) => e.machine.accept(handle, port).map_err(flow_error),
            Imp::ShimHv(h) => h.machine.accept(handle, port).map_err(flow_error),
        }
    }

    /// Refuses incoming request `handle`.
    pub fn refuse(&mut self, handle: u64, reason: &str) -> Result<(), CtlError> {
        match &mut self.imp {
            Imp::Shim(s) => s.machine.refuse(handle, reason).map_err(flow_error),
            Imp::Normal(n) => n.machine.refuse(handle, reason).map_err(flow_error),
            Imp::ShimEth(e) => e.machine.refuse(handle, reason).map_err(flow_error),
            Imp::ShimHv(h) => h.machine.refuse(handle, reason).map_err(flow_error),
        }
    }

    /// Deallocates flow `port` and tells the peer.
    pub fn deallocate(&mut self, now: Instant, port: PortId) {
        match &mut self.imp {
            Imp::Shim(s) => {
                let _ = s.machine.deallocate(port);
            }
            Imp::Normal(n) => {
                let _ = n.machine.deallocate(now, port);
                n.rx_pending.remove(&port);
                n.tx_stash.remove(&port);
                n.drops_in.remove(&port);
                n.drops_out.remove(&port);
            }
            Imp::ShimEth(e) => {
                let _ = e.machine.deallocate(port);
            }
            Imp::ShimHv(h) => {
                let _ = h.machine.deallocate(port);
            }
        }
    }

    /// Whether flow `port` belongs to this IPCP.
    pub fn has_flow(&self, port: PortId) -> bool {
        match &self.imp {
            Imp::Shim(s) => s.machine.flow(port).is_some(),
            Imp::Normal(n) => n.machine.flow_counters(port).is_some(),
            Imp::ShimEth(e) => e.machine.flow(port).is_some(),
            Imp::ShimHv(h) => h.machine.flow(port).is_some(),
        }
    }

    /// Counters of flow `port`.
    pub fn flow_counters(&self, port: PortId) -> Option<FlowCounters> {
        match &self.imp {
            Imp::Shim(s) => s.machine.flow(port).map(|f| f.counters),
            Imp::Normal(n) => n.machine.flow_counters(port).map(|c| {
                let mut c = *c;
                c.drops_in += n.drops_in.get(&port).copied().unwrap_or(0);
                c.drops_out += n.drops_out.get(&port).copied().unwrap_or(0);
                c
            }),
            Imp::ShimEth(e) => e.machine.flow(port).map(|f| f.counters),
            Imp::ShimHv(h) => h.machine.flow(port).map(|f| f.counters),
        }
    }

    /// Number of flows.
    pub fn flow_count(&self) -> usize {
        match &self.imp {
            Imp::Shim(s) => s.machine.flows().count(),
            Imp::Normal(n) => n.machine.flows().count(),
            Imp::ShimEth(e) => e.machine.flows().count(),
            Imp::ShimHv(h) => h.machine.flows().count(),
        }
    }

    /// IPCP-wide counters.
    pub fn counters(&self) -> BTreeMap<String, u64> {
        match &self.imp {
            Imp::Shim(s) => {
                let mut c = s.machine.counters().to_map();
                c.insert("tx_errors".into(), s.send_errors);
                c
            }
            Imp::Normal(n) => {
                let mut c = n.machine.counters_map();
                let r = n.machine.rmt().counters();
                c.insert("rmt_queued".into(), r.queued);
                c.insert("rmt_queue_drops".into(), r.queue_drops);
                c.insert("rmt_no_route".into(), r.no_route);
                c.insert("rx_mgmt_unhandled".into(), n.mgmt_unhandled);
                c.insert(
                    "neighbors_up".into(),
                    n.neighbors.iter().filter(|nb| nb.port.is_some()).count() as u64,
                );
                c
            }
            Imp::ShimEth(e) => {
                let mut c = e.machine.counters().to_map();
                c.insert("tx_errors".into(), e.send_errors);
                c.insert("tx_buffer_full".into(), e.send_full);
                c.insert(
                    "arp_cache_entries".into(),
                    e.machine.arp_cache().count() as u64,
                );
                c
            }
            Imp::ShimHv(h) => h.counters(),
        }
    }

    /// When [`Ipcp::handle_timeout`] next needs to run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.imp {
            Imp::Shim(s) => s.machine.poll_timeout(),
            Imp::Normal(n) => n.machine.poll_timeout(),
            Imp::ShimEth(e) => e.machine.poll_timeout(),
            Imp::ShimHv(h) => h.machine.poll_timeout(),
        }
    }

    /// Runs due timers.
    pub fn handle_timeout(&mut self, now: Instant) {
        match &mut self.imp {
            Imp::Shim(s) => s.machine.handle_timeout(now),
            Imp::Normal(n) => n.machine.handle_timeout(now),
            Imp::ShimEth(e) => e.machine.handle_timeout(now),
            Imp::ShimHv(h) => h.machine.handle_timeout(now),
        }
    }

    /// The next event for the daemon; IO the IPCP can do alone (sending a
    /// control datagram) is done here.
    pub fn poll_event(&mut self) -> Option<Event> {
        match &mut self.imp {
            Imp::Shim(s) => loop {
                let a = s.machine.poll_action()?;
                match a {
                    shim_udp::Action::Transmit { to, payload } => {
                        if let Err(e) = s.sock.send_to(&payload, to) {
                            s.send_errors += 1;
                            debug!(ipcp = %self.name, %to, error = %e, "control datagram not sent");
                        }
                    }
                    shim_udp::Action::FlowRequest {
                        handle,
                        local,
                        remote,
                        qos,
                    } => {
                        return Some(Event::FlowRequest {
                            handle,
                            local,
                            remote,
                            qos,
                        })
                    }
                    shim_udp::Action::RequestWithdrawn { handle } => {
                        return Some(Event::RequestWithdrawn { handle })
                    }
                    shim_udp::Action::Allocated { port, max_sdu } => {
                        return Some(Event::Allocated { port, max_sdu })
                    }
                    shim_udp::Action::AllocateFailed { port, error } => {
                        return Some(Event::AllocateFailed {
                            port,
                            error: error.into(),
                        })
                    }
                    shim_udp::Action::Deallocated { port } => {
                        return Some(Event::Deallocated { port })
                    }
                }
            },
            Imp::ShimEth(e) => loop {
                let a = e.machine.poll_action()?;
                return Some(match a {
                    shim_eth_core::Action::Transmit { frame } => {
                        e.send_control(&frame);
                        continue;
                    }
                    shim_eth_core::Action::FlowRequest {
                        handle,
                        local,
                        remote,
                        qos,
                    } => Event::FlowRequest {
                        handle,
                        local,
                        remote,
                        qos,
                    },
                    shim_eth_core::Action::RequestWithdrawn { handle } => {
                        Event::RequestWithdrawn { handle }
                    }
                    shim_eth_core::Action::Allocated { port, max_sdu } => {
                        Event::Allocated { port, max_sdu }
                    }
                    shim_eth_core::Action::AllocateFailed { port, error } => {
                        Event::AllocateFailed {
                            port,
                            error: error.into(),
                        }
                    }
                    shim_eth_core::Action::Deliver { port, sdu } => Event::Deliver { port, sdu },
                });
            },
            Imp::ShimHv(h) => loop {
                let a = h.machine.poll_action()?;
                return Some(match a {
                    shim_hv_core::Action::Transmit { buf } => {
                        h.send_control(buf);
                        continue;
                    }
                    shim_hv_core::Action::FlowRequest {
                        handle,
                        local,
                        remote,
                        qos,
                    } => Event::FlowRequest {
                        handle,
                        local,
                        remote,
                        qos,
                    },
                    shim_hv_core::Action::RequestWithdrawn { handle } => {
                        Event::RequestWithdrawn { handle }
                    }
                    shim_hv_core::Action::Allocated { port, max_sdu } => {
                        Event::Allocated { port, max_sdu }
                    }
                    shim_hv_core::Action::AllocateFailed { port, error } => Event::AllocateFailed {
                        port,
                        error: error.into(),
                    },
                    shim_hv_core::Action::Deallocated { port } => Event::Deallocated { port },
                });
            },
            Imp::Normal(n) => loop {
                let a = n.machine.poll_action()?;
                return Some(match a {
                    normal::Action::Transmit { port, frame } => Event::Transmit { port, frame },
                    normal::Action::Deliver { flow, sdu } => Event::Deliver { port: flow, sdu },
                    normal::Action::FlowFailed { flow, .. } => Event::FlowFailed { port: flow },
                    normal::Action::FlowRequest {
                        handle,
                        local,
                        remote,
                        qos,
                    } => Event::FlowRequest {
                        handle,
                        local,
                        remote,
                        qos,
                    },
                    normal::Action::RequestWithdrawn { handle } => {
                        Event::RequestWithdrawn { handle }
                    }
                    normal::Action::Allocated { flow, max_sdu } => Event::Allocated {
                        port: flow,
                        max_sdu,
                    },
                    normal::Action::AllocateFailed { flow, error } => Event::AllocateFailed {
                        port: flow,
                        error: error.into(),
                    },
                    normal::Action::Deallocated { flow } => Event::Deallocated { port: flow },
                    normal::Action::Membership(ev) => {
                        log_membership(&self.name, &ev);
                        if let normal::MembershipEvent::NeighborDown { port, .. } = ev {
                            return Some(Event::NeighborSilent { port });
                        }
                        continue;
                    }
                    normal::Action::Management { .. } => {
                        n.mgmt_unhandled += 1;
                        continue;
                    }
                    normal::Action::RibRead { handle, result } => Event::RibRead { handle, result },
                });
            },
        }
    }
}

/// Logs what membership reports: enrollment steps and failures name the
/// step and the reason (the first thing to look at when a DIF does not
/// assemble).
fn log_membership(ipcp: &str, ev: &normal::MembershipEvent) {
    use normal::MembershipEvent as M;
    match ev {
        M::NeighborUp {
            port,
            name,
            address,
        } => info!(ipcp, neighbor = %name, address, port, "neighbour up"),
        M::NeighborDown { port, address } => {
            warn!(ipcp, address, port, "neighbour silent: taken down")
        }
        M::EnrollStep { via, step } => debug!(ipcp, via = %via, step = step.name(), "enrolling"),
        M::Enrolled { via, address } => info!(ipcp, via = %via, address, "enrolled"),
        M::EnrollRetrying {
            via,
            error,
            attempt,
        } => warn!(ipcp, via = %via, attempt, %error, "enrollment attempt failed; retrying"),
        M::EnrollFailed { via, error } => error!(ipcp, via = %via, %error, "enrollment failed"),
        M::Admitted { peer, address } => info!(ipcp, peer = %peer, address, "admitted a member"),
        M::Rejected { peer, reason } => warn!(ipcp, peer = %peer, %reason, "refused a member"),
        M::Renumbered { from, to, twin } => {
            warn!(ipcp, from, to, twin = %twin, "address shared with another member: renumbered")
        }
    }
}

/// The control-protocol error for the error of any kind of IPCP (the
/// core's one flow error type, [`FlowError`]).
pub(super) fn flow_error(e: impl Into<FlowError>) -> CtlError {
    let e = e.into();
    let kind = match &e {
        FlowError::UnknownFlow(_) => ErrorKind::UnknownFlow,
        FlowError::UnknownRequest(_) | FlowError::Invalid(_) => ErrorKind::InvalidRequest,
        FlowError::NameNotFound(_) => ErrorKind::NameNotFound,
        FlowError::NameInUse(_) => ErrorKind::NameInUse,
        FlowError::NotRegistered(_) => ErrorKind::NotRegistered,
        FlowError::Refused(_) => ErrorKind::Refused,
        FlowError::Timeout(_) => ErrorKind::Timeout,
        FlowError::NoResources(_) | FlowError::WouldBlock => ErrorKind::NoResources,
        FlowError::SduTooLarge(_) => ErrorKind::SduTooLarge,
        FlowError::Qos(_) => ErrorKind::QosNotSatisfiable,
        FlowError::NoIpcp(_) => ErrorKind::NoDif,
        FlowError::NotEnrolled | FlowError::Failed(_) | FlowError::Internal(_) => {
            ErrorKind::Internal
        }
    };
    CtlError::new(kind, e.to_string())
}

impl Daemon {
    /// The RIB of an IPCP: the machine's own view, plus what only the
    /// daemon knows (the neighbours and the state of their N-1 flows).
    pub(super) fn ipcp_rib(&self, ip: &Ipcp) -> rina_core::rib::Rib {
        use rina_core::rib::{self, ObjValue, Rib};
        match &ip.imp {
            Imp::Normal(n) => {
                let mut r = n.machine.rib();
                for nb in &n.neighbors {
                    let rmt = n.machine.rmt();
                    let on = |p: PortId| match rmt.lower_cube(p) {
                        Some(c) => format!("{p} (cube {})", c.name),
                        None => p.to_string(),
                    };
                    let state = match nb.port {
                        Some(p) => {
                            let lanes: Vec<String> = rmt
                                .lanes()
                                .filter(|(_, l)| l.primary == p)
                                .map(|(l, _)| on(l))
                                .collect();
                            if lanes.is_empty() {
                                format!("up on N-1 port {}", on(p))
                            } else {
                                format!("up on N-1 port {}, lanes {}", on(p), lanes.join(", "))
                            }
                        }
                        None if nb.pending.is_some() => "allocating".to_string(),
                        None => "down".to_string(),
                    };
                    let _ = r.create_with_parents(
                        &format!("/difm/enr/neighs/pn={}", nb.name),
                        "Neighbor",
                        ObjValue::Str(format!(
                            "address {}, over DIF {}, {state}",
                            nb.address
                                .map_or_else(|| "from hellos".to_string(), |a| a.to_string()),
                            self.ipcps[nb.shim].dif
                        )),
                        rib::OwnerId::ENROLLMENT,
                    );
                }
                r
            }
            Imp::ShimEth(e) => e.rib(self.now()),
            Imp::ShimHv(h) => h.rib(),
            Imp::Shim(s) => {
                let mut r = Rib::new(rib::Config::default());
                let _ = r.create_with_parents(
                    "/shim/addr",
                    "address",
                    ObjValue::Str(s.bind.to_string()),
                    rib::OwnerId::NAMESPACE_MANAGER,
                );
                for (name, addr) in &s.machine.config().directory {
                    let _ = r.create_with_parents(
                        &format!("/shim/dir/key={name}"),
                        "DirectoryEntry",
                        ObjValue::Str(addr.to_string()),
                        rib::OwnerId::NAMESPACE_MANAGER,
                    );
                }
                for (port, f) in s.machine.flows() {
                    let _ = r.create_with_parents(
                        &format!("/shim/flows/pid={port}"),
                        "Flow",
                        ObjValue::Str(format!(
                            "{} -> {} at {}; SDUs in {} out {}",
                            f.local, f.remote, f.peer, f.counters.sdus_in, f.counters.sdus_out
                        )),
                        rib::OwnerId::FLOW_ALLOCATOR,
                    );
                }
                r
            }
        }
    }
}
