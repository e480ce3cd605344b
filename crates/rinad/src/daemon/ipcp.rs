//! One IPC process of the daemon: its machine lives in the core's
//! [`System`] (at the same index), its driver here — the IO it needs, by
//! kind — and what listings show of both.

use super::normal::NormalIo;
use super::shim::UdpIo;
use super::shim_eth::EthIo;
use super::shim_hv::HvIo;
use super::Daemon;
use rina_core::normal;
use rina_core::system::{FlowError, Machine, PortId};
use rina_wire::ctl::{CtlError, ErrorKind, FlowCounters};
use std::collections::BTreeMap;
use tracing::{debug, error, info, warn};

/// The driver of an IPCP, by kind.
pub(super) enum Io {
    /// A shim IPCP over UDP: its socket.
    Udp(Box<UdpIo>),
    /// A shim IPCP over Ethernet 802.1Q: its raw socket.
    Eth(Box<EthIo>),
    /// A shim IPCP for hypervisors: its shared-memory rings.
    Hv(Box<HvIo>),
    /// A normal IPCP: no medium of its own.
    Normal(Box<NormalIo>),
    /// An IPCP destroyed at run time: its index stays taken (the core's
    /// [`rina_core::system::System::is_removed`]), its IO is gone.
    Removed,
}

impl Io {
    /// Whether the medium is in the ready queue already (shims).
    pub fn rx_queued(&mut self) -> Option<&mut bool> {
        match self {
            Io::Udp(u) => Some(&mut u.rx_queued),
            Io::Eth(e) => Some(&mut e.rx_queued),
            Io::Hv(h) => Some(&mut h.rx_queued),
            Io::Normal(_) | Io::Removed => None,
        }
    }
}

/// An IPC process hosted by the daemon.
pub(super) struct Ipcp {
    pub name: String,
    pub dif: String,
    pub io: Io,
    /// Its `[[ipcp]]` table, as read from the file or given at run time
    /// (what a reload compares the file with).
    pub cfg: crate::config::IpcpConfig,
}

impl Daemon {
    /// The machine of IPCP `i`.
    pub(super) fn machine(&self, i: usize) -> Option<&Machine> {
        self.sys.member(i).map(|m| &m.machine)
    }

    /// Kind of IPCP `i`, as written in the configuration.
    pub(super) fn kind(&self, i: usize) -> &'static str {
        self.sys.member(i).map_or("gone", |m| m.kind())
    }

    /// Its address in its DIF, for listings.
    pub(super) fn address(&self, i: usize) -> String {
        match (&self.ipcps[i].io, self.machine(i)) {
            (Io::Udp(u), _) => u.bind.to_string(),
            (Io::Eth(e), Some(Machine::ShimEth(m))) => e.address(m),
            (Io::Hv(h), Some(Machine::ShimHv(m))) => h.address(m),
            (_, Some(Machine::Normal(n))) => n.config().address.to_string(),
            _ => String::new(),
        }
    }

    /// Counters of flow `port` of IPCP `i`, with what the daemon dropped.
    pub(super) fn flow_counters(&self, i: usize, port: PortId) -> Option<FlowCounters> {
        let mut c = match self.machine(i)? {
            Machine::ShimUdp(s) => s.flow(port).map(|f| f.counters),
            Machine::ShimEth(e) => e.flow(port).map(|f| f.counters),
            Machine::ShimHv(h) => h.flow(port).map(|f| f.counters),
            Machine::Normal(n) => n.flow_counters(port).copied(),
        }?;
        if let Some(slot) = self.flows.get(&port) {
            c.drops_in += slot.drops_in;
            c.drops_out += slot.drops_out;
        }
        Some(c)
    }

    /// Number of flows of IPCP `i`.
    pub(super) fn flow_count(&self, i: usize) -> usize {
        match self.machine(i) {
            Some(Machine::ShimUdp(s)) => s.flows().count(),
            Some(Machine::ShimEth(e)) => e.flows().count(),
            Some(Machine::ShimHv(h)) => h.flows().count(),
            Some(Machine::Normal(n)) => n.flows().count(),
            None => 0,
        }
    }

    /// IPCP-wide counters of IPCP `i`: its machine's and its driver's.
    pub(super) fn counters(&self, i: usize) -> BTreeMap<String, u64> {
        match (&self.ipcps[i].io, self.machine(i)) {
            (Io::Udp(u), Some(Machine::ShimUdp(s))) => {
                let mut c = s.counters().to_map();
                c.insert("tx_errors".into(), u.send_errors);
                // Batching: system calls against datagrams (tx_datagrams,
                // rx_datagrams), and whether the kernel's offloads are in use.
                c.insert("tx_syscalls".into(), u.sender.calls());
                c.insert("rx_syscalls".into(), u.rx_calls);
                c.insert("rx_copied".into(), u.rx_copied);
                c.insert("tx_gso".into(), u64::from(u.sender.offload()));
                c.insert("rx_gro".into(), u64::from(u.gro));
                c
            }
            (Io::Eth(e), Some(Machine::ShimEth(m))) => {
                let mut c = m.counters().to_map();
                c.insert("tx_errors".into(), e.send_errors);
                c.insert("tx_buffer_full".into(), e.send_full);
                c.insert("rx_too_large".into(), e.rx_too_large);
                // Batching: `sendmmsg` calls against frames (tx_frames).
                c.insert("tx_syscalls".into(), e.tx_syscalls);
                if let Some(i) = &e.impair {
                    c.insert("tx_delay_queue_full".into(), i.delay_queue_full);
                }
                c.insert("arp_cache_entries".into(), m.arp_cache().count() as u64);
                c
            }
            (Io::Hv(h), Some(Machine::ShimHv(m))) => h.counters(m),
            (_, Some(Machine::Normal(n))) => {
                let mut c = n.counters_map();
                let r = n.rmt().counters();
                c.insert("rmt_queued".into(), r.queued);
                c.insert("rmt_queue_drops".into(), r.queue_drops);
                c.insert("rmt_no_route".into(), r.no_route);
                // The system's resource allocator, shown with each normal IPCP.
                let sc = self.sys.counters();
                for (k, v) in [
                    ("rx_mgmt_unhandled", sc.mgmt_unhandled),
                    ("n1_silent", sc.n1_silent),
                    ("n1_claims", sc.n1_claims),
                    ("n1_claims_admitted", sc.n1_claims_admitted),
                    ("n1_claims_refused", sc.n1_claims_refused),
                    ("n1_lanes_refused", sc.n1_lanes_refused),
                    ("app_close_expired", sc.app_close_expired),
                    ("ended_hold_expired", sc.ended_hold_expired),
                ] {
                    c.insert(k.into(), v);
                }
                let up = self.sys.plan(i).map_or(0, |p| {
                    p.neighbors.iter().filter(|nb| nb.port.is_some()).count()
                });
                c.insert("neighbors_up".into(), up as u64);
                c
            }
            _ => BTreeMap::new(),
        }
    }
}

/// Logs what membership reports: enrollment steps and failures name the
/// step and the reason (the first thing to look at when a DIF does not
/// assemble).
pub(super) fn log_membership(ipcp: &str, ev: &normal::MembershipEvent) {
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
    /// The RIB of an IPCP: the machine's own view (a normal IPCP's with
    /// its neighbours, from the system), plus what only the daemon knows
    /// about a shim's medium.
    pub(super) fn ipcp_rib(&self, i: usize) -> rina_core::rib::Rib {
        use rina_core::rib::{self, ObjValue, Rib};
        match (&self.ipcps[i].io, self.machine(i)) {
            (_, Some(Machine::Normal(_))) => self
                .sys
                .normal_rib(i)
                .unwrap_or_else(|| Rib::new(rib::Config::default())),
            (Io::Eth(e), Some(Machine::ShimEth(m))) => e.rib(m, self.now()),
            (Io::Hv(h), Some(Machine::ShimHv(m))) => h.rib(m),
            (Io::Udp(u), Some(Machine::ShimUdp(s))) => {
                let mut r = Rib::new(rib::Config::default());
                let _ = r.create_with_parents(
                    "/shim/addr",
                    "address",
                    ObjValue::Str(u.bind.to_string()),
                    rib::OwnerId::NAMESPACE_MANAGER,
                );
                for (name, addr) in &s.config().directory {
                    let _ = r.create_with_parents(
                        &format!("/shim/dir/key={name}"),
                        "DirectoryEntry",
                        ObjValue::Str(addr.to_string()),
                        rib::OwnerId::NAMESPACE_MANAGER,
                    );
                }
                for (port, f) in s.flows() {
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
            _ => Rib::new(rib::Config::default()),
        }
    }
}
