//! A normal IPCP hosted by the daemon: its N-1 flows over the shim IPCPs
//! of the same daemon, and the application side of its flows.
//!
//! N-1 flows are ordinary flows of a lower IPCP (a shim, or another normal
//! IPCP when DIFs are stacked) whose owner is the normal IPCP instead of an
//! application: the IPCP registers its own name in every N-1 DIF its
//! neighbours are reached through, the end with the smaller IPCP name
//! allocates the flow to each neighbour (and retries while it is down), the
//! other end accepts it. Frames cross between the two IPCPs in memory.
//!
//! Once a flow is up, the IPCP's membership machine
//! ([`rina_core::normal::membership`]) takes over: hellos tell each side the
//! other's address (so the file need not), silence takes a neighbour down in
//! bounded time (a dead peer over UDP closes nothing), and an IPCP without an
//! address enrolls through the first member it hears. Together this is the
//! resource allocator: N-1 flows set up and kept up here, their up/down
//! feeding routing there.
//!
//! Application flows keep end-to-end flow control: an SDU is consumed (and
//! credit returned to the sender) only once the application's socket took
//! it, and an SDU the IPCP cannot take yet stays with the daemon while the
//! application's writes block.

use super::*;
use rina_core::normal::{self, NormalIpcp};
use std::collections::BTreeSet;

/// Wait between attempts to set up an N-1 flow to a neighbour.
pub(super) const NEIGHBOR_RETRY: Duration = Duration::from_secs(1);
/// SDUs held for an application that does not read, per flow.
pub(super) const MAX_RX_PENDING: usize = 1024;

/// A configured neighbour and the state of the N-1 flow to it.
pub(super) struct Neighbor {
    pub name: AppName,
    /// Its address, when the file gives it (otherwise hellos tell).
    pub address: Option<u64>,
    /// The shim IPCP that reaches it.
    pub shim: usize,
    /// The live N-1 flow.
    pub port: Option<PortId>,
    /// An allocation in progress.
    pub pending: Option<PortId>,
    /// When to try again.
    pub retry_at: Option<Instant>,
}

/// A normal IPCP with the daemon-side state of its flows.
pub(super) struct NormalIo {
    pub machine: NormalIpcp,
    pub app_name: AppName,
    pub neighbors: Vec<Neighbor>,
    /// Static routes: destination address -> next-hop (neighbour) address.
    pub routes: BTreeMap<u64, u64>,
    /// Registered application names.
    pub names: BTreeSet<AppName>,
    /// SDUs delivered but not yet taken by the application's socket.
    pub rx_pending: HashMap<PortId, VecDeque<Vec<u8>>>,
    /// An SDU read from the application that flow control did not take yet.
    pub tx_stash: BTreeMap<PortId, Vec<u8>>,
    /// Per flow: SDUs dropped because the application did not read.
    pub drops_in: HashMap<PortId, u64>,
    /// Per flow: SDUs the application wrote that could not be sent.
    pub drops_out: HashMap<PortId, u64>,
    /// Management PDUs nobody here handles yet (layer management comes later).
    pub mgmt_unhandled: u64,
    /// The RMT scheduling policy in use, as configured (`rinactl sched`).
    pub sched: rina_core::rmt::SchedulerConfig,
}

impl NormalIo {
    /// Points every route whose next hop is `via` at `port` (or removes them).
    pub fn set_routes_via(&mut self, via: u64, port: Option<PortId>) {
        let ports = port.map(|p| vec![p]).unwrap_or_default();
        let table = self.machine.rmt_mut().table_mut();
        table.set(via, None, ports.clone());
        for (&dst, &hop) in &self.routes {
            if hop == via {
                table.set(dst, None, ports.clone());
            }
        }
    }
}

impl Daemon {
    /// The normal IPCP `j`, if it is one.
    pub(super) fn normal_mut(&mut self, j: usize) -> Option<&mut NormalIo> {
        match &mut self.ipcps[j].imp {
            Imp::Normal(n) => Some(n),
            _ => None,
        }
    }

    /// Starts N-1 flows to neighbours that need one and are due.
    pub(super) fn keep_neighbors(&mut self) {
        let now = self.now();
        for j in 0..self.ipcps.len() {
            let Some(n) = self.normal_mut(j) else {
                continue;
            };
            let me = n.app_name.clone();
            let my_key = me.to_string();
            let due: Vec<usize> = n
                .neighbors
                .iter()
                .enumerate()
                .filter(|(_, nb)| {
                    nb.port.is_none()
                        && nb.pending.is_none()
                        && my_key < nb.name.to_string()
                        && nb.retry_at.is_none_or(|t| t <= now)
                })
                .map(|(k, _)| k)
                .collect();
            for k in due {
                let port = self.free_port();
                let Some(n) = self.normal_mut(j) else { break };
                let (shim, remote) = (n.neighbors[k].shim, n.neighbors[k].name.clone());
                n.neighbors[k].retry_at = Some(now + NEIGHBOR_RETRY);
                match self.ipcps[shim].allocate(
                    now,
                    port,
                    me.clone(),
                    remote.clone(),
                    rina_wire::QosSpec::default(),
                ) {
                    Ok(()) => {
                        self.n1_pending.insert(port, (j, k));
                        if let Some(n) = self.normal_mut(j) {
                            n.neighbors[k].pending = Some(port);
                        }
                    }
                    Err(e) => debug!(neighbor = %remote, error = %e, "N-1 flow not started"),
                }
            }
        }
    }

    /// When [`Daemon::keep_neighbors`] next has something to do: the
    /// earliest retry of an N-1 flow this side must set up (never tried:
    /// now). Neighbours with a smaller name set up the flow themselves.
    pub(super) fn neighbor_timeout(&self) -> Option<Instant> {
        let now = self.now();
        self.ipcps
            .iter()
            .filter_map(|ip| match &ip.imp {
                Imp::Normal(n) => {
                    let me = n.app_name.to_string();
                    n.neighbors
                        .iter()
                        .filter(|nb| {
                            nb.port.is_none() && nb.pending.is_none() && me < nb.name.to_string()
                        })
                        .map(|nb| nb.retry_at.unwrap_or(now))
                        .min()
                }
                _ => None,
            })
            .min()
    }

    /// Binds shim flow `port` as the N-1 flow of normal IPCP `j` to neighbour `k`.
    pub(super) fn bind_n1(&mut self, j: usize, k: usize, shim: usize, port: PortId) {
        self.n1_owner.insert(port, (j, shim));
        let now = self.now();
        if let Some(n) = self.normal_mut(j) {
            n.neighbors[k].port = Some(port);
            n.neighbors[k].pending = None;
            match n.neighbors[k].address {
                // With link-state routing this also announces the link;
                // with static routing it only records the neighbour.
                Some(via) => {
                    n.machine.neighbor_up(now, port, via, 1);
                    if n.machine.config().routing.is_none() {
                        n.set_routes_via(via, Some(port));
                    }
                }
                // Its hellos will say who it is.
                None => n.machine.add_port(port),
            }
            info!(ipcp = %n.app_name, neighbor = %n.neighbors[k].name, port, "N-1 flow up");
        }
    }

    /// An N-1 flow went away.
    pub(super) fn unbind_n1(&mut self, port: PortId) {
        let Some((j, _)) = self.n1_owner.remove(&port) else {
            return;
        };
        let now = self.now();
        if let Some(n) = self.normal_mut(j) {
            n.machine.remove_port(port);
            if let Some(nb) = n.neighbors.iter_mut().find(|nb| nb.port == Some(port)) {
                nb.port = None;
                nb.retry_at = Some(now + NEIGHBOR_RETRY);
                warn!(neighbor = %nb.name, port, "N-1 flow down");
                if let (Some(via), None) = (nb.address, n.machine.config().routing.as_ref()) {
                    n.set_routes_via(via, None);
                }
            }
        }
    }

    /// A peer asks a shim for a flow to a normal IPCP's own name: accept it
    /// if it comes from a configured neighbour.
    pub(super) fn accept_n1(&mut self, shim: usize, j: usize, handle: u64, remote: &AppName) {
        let k = match self.normal_mut(j) {
            Some(n) => n
                .neighbors
                .iter()
                .position(|nb| &nb.name == remote && nb.shim == shim),
            None => None,
        };
        let Some(k) = k else {
            let _ = self.ipcps[shim].refuse(handle, "not a configured neighbour of this IPCP");
            return;
        };
        // A neighbour that comes back replaces its old flow.
        if let Some(old) = self.normal_mut(j).and_then(|n| n.neighbors[k].port) {
            let now = self.now();
            self.ipcps[shim].deallocate(now, old);
            self.unbind_n1(old);
        }
        let port = self.free_port();
        let now = self.now();
        match self.ipcps[shim].accept(now, handle, port) {
            Ok(_) => self.bind_n1(j, k, shim, port),
            Err(e) => debug!(error = %e, "N-1 flow not accepted"),
        }
    }

    /// Hands over frames that arrived before their N-1 flow was bound.
    pub(super) fn deliver_early_n1(&mut self) {
        if self.early_n1.is_empty() {
            return;
        }
        let now = self.now();
        for (port, frame) in std::mem::take(&mut self.early_n1) {
            if let Some(&(j, _)) = self.n1_owner.get(&port) {
                if let Imp::Normal(n) = &mut self.ipcps[j].imp {
                    n.machine.on_frame(now, port, &frame);
                }
            }
        }
        self.drain_events();
    }

    /// Writes a frame of a normal IPCP on its N-1 flow `port`.
    pub(super) fn n1_transmit(&mut self, port: PortId, frame: &[u8]) {
        let Some(&(_, lower)) = self.n1_owner.get(&port) else {
            return;
        };
        let now = self.now();
        let sh = match &mut self.ipcps[lower].imp {
            Imp::Shim(sh) => sh,
            Imp::ShimEth(_) => return self.eth_n1_transmit(lower, port, frame),
            Imp::ShimHv(_) => return self.hv_n1_transmit(lower, port, frame),
            Imp::Normal(n) => {
                // Stacked: the frame is an SDU of the lower DIF's flow. A
                // lower flow that cannot take it loses it, as a link would.
                if n.machine.write(now, port, frame).is_err() {
                    *n.drops_out.entry(port).or_default() += 1;
                }
                return;
            }
        };
        let Ok((to, hdr)) = sh.machine.send_header(port, frame.len()) else {
            return;
        };
        let n = hdr.len() + frame.len();
        if n > self.buf.len() {
            return;
        }
        self.buf[..hdr.len()].copy_from_slice(&hdr);
        self.buf[hdr.len()..n].copy_from_slice(frame);
        // A full socket buffer loses the frame, as a link would; the normal
        // IPCP's retransmission (where its policy has it) recovers.
        if sh.sock.send_to(&self.buf[..n], to).is_err() {
            sh.send_errors += 1;
        }
    }

    /// Delivers an SDU of a normal flow to its application, or holds it.
    pub(super) fn normal_deliver(&mut self, j: usize, port: PortId, sdu: Vec<u8>) {
        let now = self.now();
        let Some(slot) = self.flows.get(&port) else {
            return;
        };
        let fd = slot.fd.as_raw_fd();
        let Imp::Normal(n) = &mut self.ipcps[j].imp else {
            return;
        };
        let q = n.rx_pending.entry(port).or_default();
        if q.is_empty() {
            match sys::send(fd, &sdu, None) {
                Ok(Sent::Done) => {
                    let _ = n.machine.consume(now, port, 1);
                    return;
                }
                Ok(Sent::WouldBlock) => {}
                _ => return,
            }
        }
        if q.len() >= MAX_RX_PENDING {
            let _ = n.machine.consume(now, port, 1);
            *n.drops_in.entry(port).or_default() += 1;
            return;
        }
        q.push_back(sdu);
        let _ = self.poll.registry().reregister(
            &mut SourceFd(&fd),
            token(T_FLOW, port as usize),
            Interest::READABLE | Interest::WRITABLE,
        );
    }

    /// The application's socket of normal flow `port` can take more.
    pub(super) fn normal_flush_rx(&mut self, port: PortId) {
        let now = self.now();
        let Some(slot) = self.flows.get(&port) else {
            return;
        };
        if matches!(self.ipcps[slot.ipcp].imp, Imp::ShimHv(_)) {
            return self.hv_flush_rx(port);
        }
        let (fd, j) = (slot.fd.as_raw_fd(), slot.ipcp);
        let Imp::Normal(n) = &mut self.ipcps[j].imp else {
            return;
        };
        let Some(q) = n.rx_pending.get_mut(&port) else {
            return;
        };
        let mut sent = 0;
        while let Some(sdu) = q.front() {
            match sys::send(fd, sdu, None) {
                Ok(Sent::Done) => {
                    q.pop_front();
                    sent += 1;
                }
                _ => break,
            }
        }
        let empty = q.is_empty();
        let _ = n.machine.consume(now, port, sent);
        if empty {
            let _ = self.poll.registry().reregister(
                &mut SourceFd(&fd),
                token(T_FLOW, port as usize),
                Interest::READABLE,
            );
        }
    }

    /// Reads SDUs the application wrote on normal flow `port` and sends them.
    pub(super) fn service_normal_flow(&mut self, port: PortId) -> FlowService {
        let Some(slot) = self.flows.get(&port) else {
            return FlowService::Drained;
        };
        let (fd, j) = (slot.fd.as_raw_fd(), slot.ipcp);
        let now = self.now();
        for _ in 0..BUDGET {
            let Imp::Normal(n) = &mut self.ipcps[j].imp else {
                return FlowService::Drained;
            };
            if n.tx_stash.contains_key(&port) {
                return FlowService::Drained;
            }
            let len = match sys::recv(fd, &mut self.buf) {
                Ok(Recv::Packet(len)) if len <= self.buf.len() => len,
                Ok(Recv::Packet(_)) | Ok(Recv::Empty) => {
                    *n.drops_out.entry(port).or_default() += 1;
                    continue;
                }
                Ok(Recv::WouldBlock) => return FlowService::Drained,
                Ok(Recv::Closed) | Err(_) => return FlowService::Closed,
            };
            match n.machine.write(now, port, &self.buf[..len]) {
                Ok(()) => {}
                Err(normal::NormalError::WouldBlock(_)) => {
                    n.tx_stash.insert(port, self.buf[..len].to_vec());
                    return FlowService::Drained;
                }
                Err(e) => {
                    *n.drops_out.entry(port).or_default() += 1;
                    debug!(port, error = %e, "SDU not sent");
                }
            }
        }
        FlowService::More
    }

    /// Retries SDUs that flow control held back; flows that got theirs
    /// through are read again.
    pub(super) fn retry_stashes(&mut self) {
        let now = self.now();
        let mut resume = Vec::new();
        for ip in &mut self.ipcps {
            let Imp::Normal(n) = &mut ip.imp else {
                continue;
            };
            let ports: Vec<PortId> = n.tx_stash.keys().copied().collect();
            for port in ports {
                let len = n.tx_stash[&port].len();
                if !n.machine.can_write(port, len) {
                    continue;
                }
                if let Some(sdu) = n.tx_stash.remove(&port) {
                    if n.machine.write(now, port, &sdu).is_err() {
                        *n.drops_out.entry(port).or_default() += 1;
                    }
                    resume.push(port);
                }
            }
        }
        for port in resume {
            self.mark_flow_ready(port);
        }
    }
}
