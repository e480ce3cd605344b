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
//! # Cube mapping across DIFs
//!
//! Over a normal N-1 DIF, each QoS cube of this DIF rides on the cube of
//! the DIF below its configuration maps it to (`lower = { mr = "A1" }`,
//! else that DIF's default cube: [`rina_core::normal::cubes::lower_plan`]).
//! The side that sets up N-1 flows first allocates the *primary* flow, on
//! the most urgent and cherished lower cube used (it carries management),
//! then one *lane* per other lower cube used, each allocated with that
//! cube's QoS-id; the RMT puts a data PDU on the lane that carries its
//! QoS-id ([`rina_core::rmt::Lane`]), or on the primary while that lane is
//! down. The accepting side learns each flow's lower cube from the DIF
//! below: the first flow of a neighbour is its primary, a flow over
//! another cube a lane, carrying what this side's own mapping puts there.
//! A lane that goes is set up again; when the primary goes, its lanes go
//! with it and everything is set up anew. A mapping that names a cube the
//! DIF below lacks stops the N-1 flows of that neighbour, with an error in
//! the log naming the cube and what the DIF below offers.
//!
//! Application flows keep end-to-end flow control: an SDU is consumed (and
//! credit returned to the sender) only once the application's socket took
//! it, and an SDU the IPCP cannot take yet stays with the daemon while the
//! application's writes block.

use super::*;
use rina_core::normal::cubes::{lower_plan, LowerPlan};
use rina_core::normal::{self, NormalIpcp};
use rina_core::rmt::LowerCube;
use std::collections::BTreeSet;
use tracing::error;

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

    /// The cubes of N-1 IPCP `lower` and its default cube, if it has cubes
    /// (a normal IPCP that is a member of its DIF).
    fn lower_cubes(&self, lower: usize) -> Option<(Vec<normal::QosCube>, u64)> {
        match &self.ipcps[lower].imp {
            Imp::Normal(l) if l.machine.is_enrolled() => {
                let d = l.machine.choose_cube(&rina_wire::QosSpec::default()).ok()?;
                Some((l.machine.config().cubes.clone(), d.id))
            }
            _ => None,
        }
    }

    /// How the cubes of normal IPCP `j` ride on the cubes of the DIF below
    /// its neighbour `k`: `None` when that DIF has none (a shim).
    pub(super) fn lane_plan(&self, j: usize, k: usize) -> Result<Option<LowerPlan>, String> {
        let Imp::Normal(n) = &self.ipcps[j].imp else {
            return Ok(None);
        };
        let lower = n.neighbors[k].shim;
        let Some((cubes, default)) = self.lower_cubes(lower) else {
            return Ok(None);
        };
        lower_plan(
            &n.machine.config().cubes,
            &self.ipcps[lower].dif,
            &cubes,
            default,
        )
        .map(Some)
    }

    /// The cube of the DIF below that N-1 flow `port` of IPCP `lower` has.
    fn n1_cube(&self, lower: usize, port: PortId) -> Option<LowerCube> {
        let Imp::Normal(l) = &self.ipcps[lower].imp else {
            return None;
        };
        let (_, ep) = l.machine.flows().find(|(f, _)| *f == port)?;
        let c = l.machine.cube(ep.qos_id)?;
        Some(LowerCube {
            id: c.id,
            name: c.name.clone(),
        })
    }

    /// The lanes of N-1 port `primary` of normal IPCP `j`.
    fn lanes_of(&self, j: usize, primary: PortId) -> Vec<PortId> {
        match &self.ipcps[j].imp {
            Imp::Normal(n) => n
                .machine
                .rmt()
                .lanes()
                .filter(|(_, l)| l.primary == primary)
                .map(|(p, _)| p)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The lower cube neighbour `k` of normal IPCP `j` should have a lane
    /// of and has not, if its primary is up and no lane is being set up.
    fn missing_lane(&self, j: usize, k: usize) -> Option<u64> {
        let Imp::Normal(n) = &self.ipcps[j].imp else {
            return None;
        };
        let primary = n.neighbors[k].port?;
        if self.n1_pending.values().any(|&v| v == (j, k)) {
            return None;
        }
        let plan = self.lane_plan(j, k).ok()??;
        let rmt = n.machine.rmt();
        let have: BTreeSet<u64> = std::iter::once(primary)
            .chain(self.lanes_of(j, primary))
            .filter_map(|p| rmt.lower_cube(p).map(|c| c.id))
            .collect();
        plan.lanes.keys().find(|id| !have.contains(id)).copied()
    }

    /// Starts N-1 flows to neighbours that need one and are due: the
    /// primary, then the lanes of the cube mapping one after the other.
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
                    nb.pending.is_none()
                        && my_key < nb.name.to_string()
                        && nb.retry_at.is_none_or(|t| t <= now)
                })
                .map(|(k, _)| k)
                .collect();
            for k in due {
                let up = self.normal_mut(j).and_then(|n| n.neighbors[k].port);
                let cube = match up {
                    Some(_) => match self.missing_lane(j, k) {
                        Some(id) => Some(id),
                        None => continue,
                    },
                    None => match self.lane_plan(j, k) {
                        Ok(plan) => plan.map(|p| p.primary),
                        Err(e) => {
                            if let Some(n) = self.normal_mut(j) {
                                let nb = &mut n.neighbors[k];
                                nb.retry_at = Some(now + NEIGHBOR_RETRY);
                                error!(ipcp = %n.app_name, neighbor = %nb.name, error = %e,
                                    "N-1 flows not set up: bad QoS cube mapping");
                            }
                            continue;
                        }
                    },
                };
                let port = self.free_port();
                let Some(n) = self.normal_mut(j) else { break };
                let (shim, remote) = (n.neighbors[k].shim, n.neighbors[k].name.clone());
                n.neighbors[k].retry_at = Some(now + NEIGHBOR_RETRY);
                let qos = rina_wire::QosSpec {
                    cube,
                    ..Default::default()
                };
                match self.ipcps[shim].allocate(now, port, me.clone(), remote.clone(), qos) {
                    Ok(()) => {
                        self.n1_pending.insert(port, (j, k));
                        if let Some(n) = self.normal_mut(j) {
                            if up.is_none() {
                                n.neighbors[k].pending = Some(port);
                            }
                        }
                    }
                    Err(e) => debug!(neighbor = %remote, error = %e, "N-1 flow not started"),
                }
            }
        }
    }

    /// When [`Daemon::keep_neighbors`] next has something to do: the
    /// earliest retry of an N-1 flow (primary or lane) this side must set
    /// up (never tried: now). Neighbours with a smaller name set up the
    /// flows themselves.
    pub(super) fn neighbor_timeout(&self) -> Option<Instant> {
        let now = self.now();
        self.ipcps
            .iter()
            .enumerate()
            .filter_map(|(j, ip)| match &ip.imp {
                Imp::Normal(n) => {
                    let me = n.app_name.to_string();
                    n.neighbors
                        .iter()
                        .enumerate()
                        .filter(|(k, nb)| {
                            nb.pending.is_none()
                                && me < nb.name.to_string()
                                && (nb.port.is_none() || self.missing_lane(j, *k).is_some())
                        })
                        .map(|(_, nb)| nb.retry_at.unwrap_or(now))
                        .min()
                }
                _ => None,
            })
            .min()
    }

    /// Binds flow `port` of lower IPCP `shim` as an N-1 flow of normal IPCP
    /// `j` to neighbour `k`: its primary if it has none, else a lane.
    pub(super) fn bind_n1(&mut self, j: usize, k: usize, shim: usize, port: PortId) {
        self.n1_owner.insert(port, (j, shim));
        let now = self.now();
        let cube = self.n1_cube(shim, port);
        let carries: BTreeSet<u64> = match (&cube, self.lane_plan(j, k)) {
            (Some(c), Ok(Some(plan))) => plan.lanes.get(&c.id).map(|l| l.1.clone()),
            _ => None,
        }
        .unwrap_or_default();
        let rate = self.link_rates.get(shim).copied().flatten();
        let stalled = matches!(&self.ipcps[shim].imp, Imp::Shim(sh) if sh.stalled.is_some());
        let Some(n) = self.normal_mut(j) else {
            return;
        };
        let label = cube
            .as_ref()
            .map_or_else(String::new, |c| format!(" (cube {})", c.name));
        if let Some(primary) = n.neighbors[k].port {
            if let Err(e) = n.machine.add_lane(primary, port, carries) {
                warn!(ipcp = %n.app_name, port, error = %e, "N-1 lane not usable");
                return;
            }
            n.machine.set_lower_cube(port, cube);
            n.neighbors[k].retry_at = None;
            info!(ipcp = %n.app_name, neighbor = %n.neighbors[k].name, port, primary, "N-1 lane up{label}");
            return;
        }
        n.neighbors[k].port = Some(port);
        n.neighbors[k].pending = None;
        n.neighbors[k].retry_at = None;
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
        // Over a shim with a known link capacity, PDUs leave at that rate
        // and the rest wait in the RMT's queues, where the policy decides.
        n.machine.set_port_rate(port, rate);
        if stalled {
            n.machine.set_port_blocked(now, port, true);
        }
        n.machine.set_lower_cube(port, cube);
        info!(ipcp = %n.app_name, neighbor = %n.neighbors[k].name, port, "N-1 flow up{label}");
    }

    /// An N-1 flow went away. A lane's QoS-ids go on its primary until it
    /// is back; a primary takes its lanes with it.
    pub(super) fn unbind_n1(&mut self, port: PortId) {
        let Some((j, _)) = self.n1_owner.remove(&port) else {
            return;
        };
        let now = self.now();
        let primary = match &self.ipcps[j].imp {
            Imp::Normal(n) => n.machine.rmt().primary_of(port),
            _ => return,
        };
        if primary != port {
            if let Some(n) = self.normal_mut(j) {
                n.machine.remove_port(port);
                if let Some(nb) = n.neighbors.iter_mut().find(|nb| nb.port == Some(primary)) {
                    nb.retry_at = Some(now + NEIGHBOR_RETRY);
                    warn!(neighbor = %nb.name, port, primary, "N-1 lane down; its cubes go on the primary");
                }
            }
            return;
        }
        for lane in self.lanes_of(j, port) {
            if let Some((_, lower)) = self.n1_owner.remove(&lane) {
                self.ipcps[lower].deallocate(now, lane);
            }
            if let Some(n) = self.normal_mut(j) {
                n.machine.remove_port(lane);
            }
        }
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

    /// A peer asks a lower IPCP for a flow to a normal IPCP's own name:
    /// accept it if it comes from a configured neighbour. A flow over the
    /// cube of the neighbour's primary (or the first) is its primary, and
    /// replaces an old one with its lanes; a flow over another cube is a
    /// lane, and replaces an old lane of that cube.
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
        let port = self.free_port();
        let now = self.now();
        if let Err(e) = self.ipcps[shim].accept(now, handle, port) {
            debug!(error = %e, "N-1 flow not accepted");
            return;
        }
        let cube = self.n1_cube(shim, port).map(|c| c.id);
        let Some(n) = self.normal_mut(j) else {
            return;
        };
        let old = n.neighbors[k].port;
        let same_cube = |p: PortId| n.machine.rmt().lower_cube(p).map(|c| c.id) == cube;
        let replaced = match old {
            Some(p) if cube.is_some() && !same_cube(p) => n
                .machine
                .rmt()
                .lanes()
                .find(|(l, lane)| lane.primary == p && same_cube(*l))
                .map(|(l, _)| l),
            other => other,
        };
        // A neighbour that comes back replaces its old flow.
        if let Some(old) = replaced {
            if let Some(&(_, lower)) = self.n1_owner.get(&old) {
                self.ipcps[lower].deallocate(now, old);
            }
            self.unbind_n1(old);
        }
        self.bind_n1(j, k, shim, port);
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
        match sh.sock.send_to(&self.buf[..n], to) {
            Ok(_) => {}
            // The medium is full: keep the frame for when it is writable
            // and hold the normal IPCPs' PDUs in their RMT meanwhile, where
            // their scheduling policy decides (none is lost here).
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && sh.stalled.is_none() => {
                sh.stalled = Some((to, self.buf[..n].to_vec()));
                let _ = self.poll.registry().reregister(
                    &mut sh.sock,
                    token(T_UDP, lower),
                    Interest::READABLE | Interest::WRITABLE,
                );
                self.set_medium_blocked(lower, true);
            }
            Err(_) => sh.send_errors += 1,
        }
    }

    /// Blocks (or unblocks, sending what waited) the N-1 ports of the
    /// normal IPCPs over shim `lower`.
    pub(super) fn set_medium_blocked(&mut self, lower: usize, blocked: bool) {
        let now = self.now();
        let ports: Vec<(PortId, usize)> = self
            .n1_owner
            .iter()
            .filter(|(_, &(_, l))| l == lower)
            .map(|(&p, &(j, _))| (p, j))
            .collect();
        for (port, j) in ports {
            if let Some(n) = self.normal_mut(j) {
                n.machine.set_port_blocked(now, port, blocked);
            }
        }
    }

    /// Delivers an SDU of a normal flow to its application, or holds it.
    pub(super) fn normal_deliver(&mut self, j: usize, port: PortId, sdu: Vec<u8>) {
        let now = self.now();
        let Some(slot) = self.flows.get(&port) else {
            return;
        };
        if slot.rings.is_some() {
            return self.normal_deliver_rings(j, port, sdu);
        }
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

    /// [`Daemon::normal_deliver`] for a flow with shared-memory rings:
    /// into the application's ring, or held (bounded as for sockets) until
    /// it kicks.
    fn normal_deliver_rings(&mut self, j: usize, port: PortId, sdu: Vec<u8>) {
        let now = self.now();
        let Some(r) = self.flows.get_mut(&port).and_then(|s| s.rings.as_mut()) else {
            return;
        };
        let Imp::Normal(n) = &mut self.ipcps[j].imp else {
            return;
        };
        let q = n.rx_pending.entry(port).or_default();
        if q.is_empty() && r.deliver(&sdu) {
            let _ = n.machine.consume(now, port, 1);
            return;
        }
        if q.len() >= MAX_RX_PENDING {
            let _ = n.machine.consume(now, port, 1);
            *n.drops_in.entry(port).or_default() += 1;
            return;
        }
        q.push_back(sdu);
        let room_now = q.front().is_some_and(|f| r.want_room(f.len()));
        if room_now {
            self.mark_flow_ready(port);
        }
    }

    /// Hands SDUs held for the application of ring flow `port` (of normal
    /// IPCP `j`) to its ring; true if room appeared for more meanwhile.
    fn normal_rings_flush_rx(&mut self, j: usize, port: PortId) -> bool {
        let now = self.now();
        let Some(r) = self.flows.get_mut(&port).and_then(|s| s.rings.as_mut()) else {
            return false;
        };
        let Imp::Normal(n) = &mut self.ipcps[j].imp else {
            return false;
        };
        let Some(q) = n.rx_pending.get_mut(&port) else {
            return false;
        };
        let (sent, again) = r.deliver_held(q);
        if q.is_empty() {
            n.rx_pending.remove(&port);
        }
        let _ = n.machine.consume(now, port, sent);
        again
    }

    /// Serves normal flow `port` whose application uses shared-memory
    /// rings: drains its kicks, hands it held SDUs, and writes up to
    /// [`BUDGET`] SDUs from its ring (copied once, into the daemon's
    /// buffer) into the IPCP.
    fn service_normal_rings(&mut self, port: PortId) -> FlowService {
        let Some(slot) = self.flows.get(&port) else {
            return FlowService::Drained;
        };
        let (fd, j) = (slot.fd.as_raw_fd(), slot.ipcp);
        if !super::app_rings::drain_kicks(fd) {
            return FlowService::Closed;
        }
        let now = self.now();
        let again = self.normal_rings_flush_rx(j, port);
        let more = if again {
            FlowService::More
        } else {
            FlowService::Drained
        };
        let over_hv = self.over_hv(j);
        for _ in 0..BUDGET {
            if over_hv {
                if let Some(lower) = self.hv_congested_under(j) {
                    self.hv_park_upper(lower, port);
                    return more;
                }
            }
            let Some(r) = self.flows.get_mut(&port).and_then(|s| s.rings.as_mut()) else {
                return FlowService::Drained;
            };
            let Imp::Normal(n) = &mut self.ipcps[j].imp else {
                return FlowService::Drained;
            };
            if n.tx_stash.contains_key(&port) {
                return more;
            }
            let seg = match r.next_from_app() {
                Ok(Some(seg)) => seg,
                Ok(None) => return more,
                Err(e) => {
                    debug!(port, error = %e, "garbage in a flow's ring; dropped what was published");
                    *n.drops_out.entry(port).or_default() += 1;
                    return more;
                }
            };
            let len = seg.len();
            let ok = len <= self.buf.len() && r.from_app.read(len, &mut self.buf[..len]);
            r.from_app.consume(len);
            r.took();
            if !ok {
                *n.drops_out.entry(port).or_default() += 1;
                continue;
            }
            match n.machine.write(now, port, &self.buf[..len]) {
                Ok(()) if over_hv => {
                    while let Some(ev) = self.ipcps[j].poll_event() {
                        self.on_event(j, ev);
                    }
                }
                Ok(()) => {}
                Err(normal::NormalError::WouldBlock(_)) => {
                    n.tx_stash.insert(port, self.buf[..len].to_vec());
                    return more;
                }
                Err(e) => {
                    *n.drops_out.entry(port).or_default() += 1;
                    debug!(port, error = %e, "SDU not sent");
                }
            }
        }
        FlowService::More
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
        if slot.rings.is_some() {
            return self.service_normal_rings(port);
        }
        let (fd, j) = (slot.fd.as_raw_fd(), slot.ipcp);
        let now = self.now();
        // Over shim-hv, the frames of each SDU go to the ring (or its
        // backlog) at once, and reading stops while a backlog is congested:
        // the application's writes block instead of frames being lost.
        let over_hv = self.over_hv(j);
        for _ in 0..BUDGET {
            if over_hv {
                if let Some(lower) = self.hv_congested_under(j) {
                    self.hv_park_upper(lower, port);
                    return FlowService::Drained;
                }
            }
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
                Ok(()) if over_hv => {
                    while let Some(ev) = self.ipcps[j].poll_event() {
                        self.on_event(j, ev);
                    }
                }
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
