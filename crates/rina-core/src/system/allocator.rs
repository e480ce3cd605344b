//! The resource allocator of a system: which N-1 flows exist.
//!
//! A normal IPCP's neighbours are configured by name and by the N-1 DIF
//! that reaches them. The IPCP's own name is registered in every such DIF;
//! the end with the smaller name allocates an N-1 flow to each neighbour
//! (and retries every [`NEIGHBOR_RETRY`] while it is down), the other end
//! accepts it. Over a normal N-1 DIF, each QoS cube of the upper DIF rides
//! on the lower cube its mapping names ([`lower_plan`]): the *primary* N-1
//! flow goes over the most urgent and cherished lower cube in use (it
//! carries management), then one *lane* per other lower cube in use. A lane
//! that goes is set up again; a primary takes its lanes with it. A
//! neighbour that goes silent (membership's liveness) has its N-1 flow torn
//! down, so that a fresh one is set up (a restarted peer accepts it).
//!
//! Over a shim with a known link rate, the N-1 port is paced at it, and
//! over a medium the driver says is full it is blocked: PDUs wait in the
//! RMT of the IPCP, where the scheduling policy is.

use super::member::{Machine, PortId};
use super::System;
use super::{FlowError, SystemError};
use crate::buf::PduBuf;
use crate::normal::cubes::{lower_plan, LowerPlan};
use crate::normal::NormalIpcp;
use crate::rmt::LowerCube;
use crate::time::Instant;
use rina_wire::{AppName, QosSpec};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Wait between attempts to set up an N-1 flow to a neighbour.
pub const NEIGHBOR_RETRY: Duration = Duration::from_secs(1);

/// A neighbour of a normal IPCP, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeighborSpec {
    /// The neighbour IPCP's name in the N-1 DIF.
    pub name: AppName,
    /// The N-1 DIF that reaches it.
    pub over: String,
    /// Its address in this DIF, if known (else hellos tell).
    pub address: Option<u64>,
}

/// A configured neighbour and the state of the N-1 flows to it.
#[derive(Debug, Clone)]
pub struct Neighbor {
    /// What the configuration says.
    pub spec: NeighborSpec,
    /// The member of the system that reaches it.
    pub lower: usize,
    /// The live primary N-1 flow.
    pub port: Option<PortId>,
    /// A primary being allocated.
    pub pending: Option<PortId>,
    /// When to try again.
    pub retry_at: Option<Instant>,
    /// Whether this end sets the N-1 flows up (its name is the smaller).
    pub sets_up: bool,
    /// The primary and every lane were up when last looked at; looked at
    /// again after this time, or at once when one of its flows changes
    /// (`retry_at` is written), so the busy loop does not re-plan lanes
    /// on every turn.
    pub settled_until: Option<Instant>,
}

impl Neighbor {
    /// A neighbour of the IPCP named `me`, nothing set up yet.
    pub fn new(me: &AppName, spec: NeighborSpec, lower: usize) -> Neighbor {
        Neighbor {
            sets_up: me.to_string() < spec.name.to_string(),
            spec,
            lower,
            port: None,
            pending: None,
            retry_at: None,
            settled_until: None,
        }
    }

    /// Something about its flows changed: try again at `at` (`None`: now).
    pub(super) fn retry(&mut self, at: Option<Instant>) {
        self.retry_at = at;
        self.settled_until = None;
    }

    /// Whether it is settled at `now`.
    fn settled(&self, now: Instant) -> bool {
        self.settled_until.is_some_and(|t| now < t)
    }
}

/// The resource-allocator state of one normal IPCP.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Its name in the N-1 DIFs.
    pub app_name: Option<AppName>,
    /// Its neighbours.
    pub neighbors: Vec<Neighbor>,
    /// Static routes: destination address -> next-hop address.
    pub routes: BTreeMap<u64, u64>,
}

fn set_routes_via(n: &mut NormalIpcp, routes: &BTreeMap<u64, u64>, via: u64, port: Option<u32>) {
    let ports = port.map(|p| vec![p]).unwrap_or_default();
    let table = n.rmt_mut().table_mut();
    table.set(via, None, ports.clone());
    for (&dst, &hop) in routes {
        if hop == via {
            table.set(dst, None, ports.clone());
        }
    }
}

impl System {
    pub(super) fn normal_of(&self, j: usize) -> Option<&NormalIpcp> {
        self.members.get(j).and_then(|m| m.normal())
    }

    pub(super) fn normal_of_mut(&mut self, j: usize) -> Option<&mut NormalIpcp> {
        self.members.get_mut(j).and_then(|m| m.normal_mut())
    }

    /// How the cubes of normal IPCP `j` ride on the cubes of the DIF below
    /// its neighbour `k`: `None` when that DIF has none (a shim) or its
    /// IPCP is not a member yet.
    pub(super) fn lane_plan(&self, j: usize, k: usize) -> Result<Option<LowerPlan>, String> {
        let Some(n) = self.normal_of(j) else {
            return Ok(None);
        };
        let lower = self.plans[j].neighbors[k].lower;
        let Some(l) = self.normal_of(lower).filter(|l| l.is_enrolled()) else {
            return Ok(None);
        };
        let Ok(default) = l.choose_cube(&QosSpec::default()) else {
            return Ok(None);
        };
        lower_plan(
            &n.config().cubes,
            &self.members[lower].dif,
            &l.config().cubes,
            default.id,
        )
        .map(Some)
    }

    /// The cube of the DIF below that flow `port` of member `lower` has.
    fn n1_cube(&self, lower: usize, port: PortId) -> Option<LowerCube> {
        let l = self.normal_of(lower)?;
        let (_, ep) = l.flows().find(|(f, _)| *f == port)?;
        let c = l.cube(ep.qos_id)?;
        Some(LowerCube {
            id: c.id,
            name: c.name.clone(),
        })
    }

    fn lanes_of(&self, j: usize, primary: PortId) -> Vec<PortId> {
        self.normal_of(j)
            .map(|n| {
                n.rmt()
                    .lanes()
                    .filter(|(_, l)| l.primary == primary)
                    .map(|(p, _)| p)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The lower cube neighbour `k` of `j` should have a lane of and has
    /// not, if its primary is up and nothing is being set up for it.
    fn missing_lane(&self, j: usize, k: usize) -> Option<u64> {
        let n = self.normal_of(j)?;
        let primary = self.plans[j].neighbors[k].port?;
        if self.n1_pending.values().any(|&v| v == (j, k)) {
            return None;
        }
        let plan = self.lane_plan(j, k).ok()??;
        let rmt = n.rmt();
        let have: BTreeSet<u64> = std::iter::once(primary)
            .chain(self.lanes_of(j, primary))
            .filter_map(|p| rmt.lower_cube(p).map(|c| c.id))
            .collect();
        plan.lanes.keys().find(|id| !have.contains(id)).copied()
    }

    /// Starts the N-1 flows that are due: primaries, then the lanes of the
    /// cube mapping one after the other.
    pub(super) fn keep_neighbors(&mut self, now: Instant) {
        for j in 0..self.members.len() {
            let due = |k: usize| {
                let nb = &self.plans[j].neighbors[k];
                nb.sets_up
                    && nb.pending.is_none()
                    && !nb.settled(now)
                    && nb.retry_at.is_none_or(|t| t <= now)
                    && !self.down_media.contains(&nb.lower)
            };
            // This runs on every turn of the system: no allocation unless
            // a neighbour is due.
            let neighbors = 0..self.plans[j].neighbors.len();
            if !neighbors.clone().any(due) {
                continue;
            }
            let due: Vec<usize> = neighbors.filter(|&k| due(k)).collect();
            for k in due {
                self.start_n1(now, j, k);
            }
        }
    }

    fn start_n1(&mut self, now: Instant, j: usize, k: usize) {
        let up = self.plans[j].neighbors[k].port;
        let cube = match up {
            Some(_) => match self.missing_lane(j, k) {
                Some(id) => Some(id),
                None => {
                    let nb = &mut self.plans[j].neighbors[k];
                    nb.settled_until = Some(now + NEIGHBOR_RETRY);
                    return;
                }
            },
            None => match self.lane_plan(j, k) {
                Ok(plan) => plan.map(|p| p.primary),
                Err(e) => {
                    self.plans[j].neighbors[k].retry(Some(now + NEIGHBOR_RETRY));
                    self.counters.bad_cube_mapping += 1;
                    self.out.push_back(super::Output::Alarm {
                        member: j,
                        neighbor: Box::new(self.plans[j].neighbors[k].spec.name.clone()),
                        message: format!("bad QoS cube mapping: {e}"),
                    });
                    self.last_error = Some(e);
                    return;
                }
            },
        };
        let Some(me) = self.plans[j].app_name.clone() else {
            return;
        };
        let port = self.free_port();
        let nb = &mut self.plans[j].neighbors[k];
        nb.retry(Some(now + NEIGHBOR_RETRY));
        let (lower, remote) = (nb.lower, nb.spec.name.clone());
        let qos = QosSpec {
            cube,
            ..Default::default()
        };
        match self.members[lower].allocate(now, port, (me, remote), qos, (None, false)) {
            Ok(()) => {
                self.n1_pending.insert(port, (j, k));
                if up.is_none() {
                    self.plans[j].neighbors[k].pending = Some(port);
                }
            }
            Err(_) => self.counters.n1_not_started += 1,
        }
    }

    /// When [`System::keep_neighbors`] next has something to do.
    pub(super) fn neighbor_timeout(&self, now: Instant) -> Option<Instant> {
        (0..self.members.len())
            .flat_map(|j| (0..self.plans[j].neighbors.len()).map(move |k| (j, k)))
            .filter(|&(j, k)| {
                let nb = &self.plans[j].neighbors[k];
                nb.sets_up
                    && nb.pending.is_none()
                    && nb.settled_until.is_none()
                    && !self.down_media.contains(&nb.lower)
                    && (nb.port.is_none() || self.missing_lane(j, k).is_some())
            })
            .map(|(j, k)| self.plans[j].neighbors[k].retry_at.unwrap_or(now))
            .min()
    }

    /// The (upper, lower) members of N-1 flow `port`, for the data path:
    /// [`System::n1_recent`] first, then the tree.
    pub(super) fn n1_of(&mut self, port: PortId) -> Option<(usize, usize)> {
        let [a, b] = self.n1_recent;
        if a.0 == port && port != 0 {
            return Some((a.1, a.2));
        }
        if b.0 == port && port != 0 {
            self.n1_recent = [b, a];
            return Some((b.1, b.2));
        }
        let &(upper, lower) = self.n1.get(&port)?;
        self.n1_recent = [(port, upper, lower), a];
        Some((upper, lower))
    }

    /// Records flow `port` of member `lower` as an N-1 flow of `upper`.
    pub(super) fn n1_insert(&mut self, port: PortId, upper: usize, lower: usize) {
        self.n1.insert(port, (upper, lower));
        self.n1_recent = [(0, 0, 0); 2];
        self.n1_stacked.retain(|&(p, ..)| p != port);
        if matches!(self.members[lower].machine, Machine::Normal(_)) {
            let at = self.n1_stacked.partition_point(|&(p, ..)| p < port);
            self.n1_stacked.insert(at, (port, upper, lower));
        }
    }

    /// Forgets N-1 flow `port`: its (upper, lower) members, if it was one.
    pub(super) fn n1_remove(&mut self, port: PortId) -> Option<(usize, usize)> {
        self.n1_stacked.retain(|&(p, ..)| p != port);
        self.n1_recent = [(0, 0, 0); 2];
        self.n1.remove(&port)
    }

    /// Binds flow `port` of member `lower` as an N-1 flow of `j` to its
    /// neighbour `k`: its primary if it has none, else a lane.
    pub(super) fn bind_n1(&mut self, now: Instant, j: usize, k: usize, lower: usize, port: PortId) {
        self.n1_insert(port, j, lower);
        let cube = self.n1_cube(lower, port);
        let carries: BTreeSet<u64> = match (&cube, self.lane_plan(j, k)) {
            (Some(c), Ok(Some(plan))) => plan.lanes.get(&c.id).map(|l| l.1.clone()),
            _ => None,
        }
        .unwrap_or_default();
        let rate = self.members[lower].rate;
        let blocked = self.blocked_media.contains(&lower);
        let routes = self.plans[j].routes.clone();
        let nb = self.plans[j].neighbors[k].clone();
        let Some(n) = self.normal_of_mut(j) else {
            return;
        };
        if let Some(primary) = nb.port {
            if n.add_lane(primary, port, carries).is_err() {
                return;
            }
            n.set_lower_cube(port, cube);
            self.plans[j].neighbors[k].retry(None);
            return;
        }
        match nb.spec.address {
            Some(via) => {
                n.neighbor_up(now, port, via, 1);
                if n.config().routing.is_none() {
                    set_routes_via(n, &routes, via, Some(port));
                }
            }
            None => n.add_port(port),
        }
        n.set_port_rate(port, rate);
        n.set_port_blocked(now, port, blocked);
        n.set_lower_cube(port, cube);
        let nb = &mut self.plans[j].neighbors[k];
        nb.port = Some(port);
        nb.pending = None;
        nb.retry(None);
    }

    /// An N-1 flow went away. A lane's QoS-ids go on its primary until it
    /// is back; a primary takes its lanes with it.
    pub(super) fn unbind_n1(&mut self, now: Instant, port: PortId) {
        let Some((j, _)) = self.n1_remove(port) else {
            return;
        };
        self.gated.remove(&port);
        let Some(primary) = self.normal_of(j).map(|n| n.rmt().primary_of(port)) else {
            return;
        };
        if primary != port {
            if let Some(n) = self.normal_of_mut(j) {
                n.remove_port(port);
            }
            if let Some(nb) = self.plans[j]
                .neighbors
                .iter_mut()
                .find(|nb| nb.port == Some(primary))
            {
                nb.retry(Some(now + NEIGHBOR_RETRY));
            }
            return;
        }
        for lane in self.lanes_of(j, port) {
            if let Some((_, lower)) = self.n1_remove(lane) {
                self.members[lower].deallocate(now, lane);
            }
            self.gated.remove(&lane);
            if let Some(n) = self.normal_of_mut(j) {
                n.remove_port(lane);
            }
        }
        let routes = self.plans[j].routes.clone();
        let Some(k) = self.plans[j]
            .neighbors
            .iter()
            .position(|nb| nb.port == Some(port))
        else {
            if let Some(n) = self.normal_of_mut(j) {
                n.remove_port(port);
            }
            return;
        };
        let nb = &mut self.plans[j].neighbors[k];
        nb.port = None;
        nb.retry(Some(now + NEIGHBOR_RETRY));
        let configured = nb.spec.address;
        if let Some(n) = self.normal_of_mut(j) {
            // The address hellos told, if it was not configured.
            let learnt = n.neighbors().find(|nb| nb.0 == port).map(|nb| nb.1);
            let via = configured.or(learnt);
            n.remove_port(port);
            if let (Some(via), None) = (via, n.config().routing.as_ref()) {
                set_routes_via(n, &routes, via, None);
            }
        }
    }

    /// A peer asks member `lower` for a flow to the name of normal IPCP
    /// `j`: accepted if it comes from a configured neighbour. A flow over
    /// the cube of the neighbour's primary (or the first) is its primary
    /// and replaces an old one; a flow over another cube is a lane and
    /// replaces an old lane of that cube.
    pub(super) fn accept_n1(
        &mut self,
        now: Instant,
        lower: usize,
        j: usize,
        handle: u64,
        remote: &AppName,
    ) {
        let Some(k) = self.plans[j]
            .neighbors
            .iter()
            .position(|nb| &nb.spec.name == remote && nb.lower == lower)
        else {
            let _ = self.members[lower].refuse(handle, "not a configured neighbour of this IPCP");
            return;
        };
        let port = self.free_port();
        if self.members[lower]
            .accept(now, handle, port, (None, false))
            .is_err()
        {
            return;
        }
        let cube = self.n1_cube(lower, port).map(|c| c.id);
        let old = self.plans[j].neighbors[k].port;
        let replaced = self.normal_of(j).and_then(|n| {
            let same_cube = |p: PortId| n.rmt().lower_cube(p).map(|c| c.id) == cube;
            match old {
                Some(p) if cube.is_some() && !same_cube(p) => n
                    .rmt()
                    .lanes()
                    .find(|(l, lane)| lane.primary == p && same_cube(*l))
                    .map(|(l, _)| l),
                other => other,
            }
        });
        if replaced.is_some_and(|p| Some(p) == old && self.must_claim(j, p)) {
            // Bound to the authenticated peer: the newcomer waits.
            return self.hold_claim(now, j, k, lower, port);
        }
        if let Some(primary) = old.filter(|&p| replaced != Some(p) && self.must_claim(j, p)) {
            // A lane rides on its primary's authentication: it must come
            // from the same peer below.
            if !self.lane_from_primary_peer(lower, port, primary) {
                self.counters.n1_lanes_refused += 1;
                self.members[lower].deallocate(now, port);
                return;
            }
        }
        if let Some(old) = replaced {
            if let Some(&(_, l)) = self.n1.get(&old) {
                self.members[l].deallocate(now, old);
            }
            self.unbind_n1(now, old);
        }
        self.bind_n1(now, j, k, lower, port);
    }

    /// Normal IPCP `j` heard a hello from the neighbour at `address` on
    /// N-1 flow `port`: without routing, the neighbour and the static
    /// routes through it go on that flow, whether or not its address is in
    /// the configuration (hellos tell it otherwise).
    pub(super) fn neighbor_heard(&mut self, j: usize, port: PortId, address: u64) {
        if !self.plans[j]
            .neighbors
            .iter()
            .any(|nb| nb.port == Some(port))
        {
            return;
        }
        let routes = self.plans[j].routes.clone();
        if let Some(n) = self.normal_of_mut(j) {
            if n.config().routing.is_none() {
                set_routes_via(n, &routes, address, Some(port));
            }
        }
    }

    /// The neighbour on N-1 flow `port` went silent: its flow is torn
    /// down, and set up again by the side that sets it up.
    pub(super) fn neighbor_silent(&mut self, now: Instant, port: PortId) {
        if let Some(&(_, lower)) = self.n1.get(&port) {
            self.counters.n1_silent += 1;
            self.members[lower].deallocate(now, port);
            self.unbind_n1(now, port);
        }
    }

    /// [`System::n1_transmit`] of a frame that normal member `upper`
    /// sends: over a lower normal IPCP, the frames `upper` sends next on
    /// the same port go down with it, in one call.
    pub(super) fn n1_transmit_from(
        &mut self,
        now: Instant,
        upper: usize,
        port: PortId,
        mut frame: PduBuf,
    ) {
        let Some((_, lower)) = self.n1_of(port) else {
            return;
        };
        if self.members[lower].normal_mut().is_some() {
            return self.n1_transmit_stacked(now, upper, lower, port, frame);
        }
        match self.members[lower].send_header(port, frame.len()) {
            Ok(send) => {
                frame.push_front(send.header());
                self.send_on_medium(lower, send.peer, frame);
            }
            Err(_) => self.counters.n1_tx_dropped += 1,
        }
    }

    /// [`System::n1_transmit_from`] over lower normal IPCP `lower`.
    fn n1_transmit_stacked(
        &mut self,
        now: Instant,
        upper: usize,
        lower: usize,
        port: PortId,
        frame: PduBuf,
    ) {
        let mut frames = std::mem::take(&mut self.tx_frames);
        frames.push(frame);
        if let Some(n) = self.members[upper].normal_mut() {
            while let Some(f) = n.poll_transmit_on(port) {
                frames.push(f);
            }
        }
        if let Some(n) = self.members[lower].normal_mut() {
            // The frames are SDUs of the lower DIF's flow, which takes
            // their buffers themselves. The port's gate follows the lower
            // flow's room, so they are taken unless the lower flow failed.
            self.counters.n1_tx_dropped += n.write_bufs(now, port, &mut frames) as u64;
        }
        frames.clear();
        self.tx_frames = frames;
    }

    /// Writes a frame of normal IPCP `upper` on its N-1 flow `port`.
    pub(super) fn n1_transmit(&mut self, now: Instant, port: PortId, mut frame: PduBuf) {
        let Some(&(_, lower)) = self.n1.get(&port) else {
            return;
        };
        if let Some(n) = self.members[lower].normal_mut() {
            // Stacked: see `n1_transmit_stacked`.
            if n.write_buf(now, port, frame).is_err() {
                self.counters.n1_tx_dropped += 1;
            }
            return;
        }
        match self.members[lower].send_header(port, frame.len()) {
            Ok(send) => {
                frame.push_front(send.header());
                self.send_on_medium(lower, send.peer, frame);
            }
            Err(_) => self.counters.n1_tx_dropped += 1,
        }
    }

    /// Opens or closes the gates of N-1 ports over lower normal flows as
    /// those flows gain or lose room (window flow control below pushes back
    /// to the RMT above). True if a gate opened.
    pub(super) fn update_stacked_gates(&mut self, now: Instant) -> bool {
        if self.n1_stacked.is_empty() {
            return false;
        }
        // The N-1 flows over a normal IPCP whose room changed: a gated one
        // with room again, or an open one without (none on most turns, and
        // then nothing is allocated).
        let changed: Vec<(PortId, usize, bool)> = self
            .n1_stacked
            .iter()
            .filter_map(|&(port, upper, lower)| {
                let frame = self.normal_of(upper)?.max_frame();
                let room = self
                    .normal_of(lower)
                    .is_some_and(|l| l.can_write(port, frame));
                (room == self.gated.contains(&port)).then_some((port, upper, room))
            })
            .collect();
        let mut opened = false;
        for (port, upper, room) in changed {
            if room {
                self.gated.remove(&port);
                opened = true;
            } else {
                self.gated.insert(port);
            }
            if let Some(n) = self.normal_of_mut(upper) {
                n.set_port_blocked(now, port, !room);
            }
        }
        opened
    }
}

/// Changes to the resource allocator's plan at run time.
impl System {
    /// The lower member of another DIF that normal IPCP `j` would reach
    /// DIF `over` through, checked: it exists, is not stacked on `j`
    /// itself, and carries `j`'s frames.
    pub fn lower_for(&self, j: usize, over: &str) -> Result<usize, SystemError> {
        if j >= self.members.len() || self.removed.contains(&j) {
            return Err(SystemError::NoMember(j));
        }
        let key = || self.members[j].name.clone();
        let Some(n) = self.normal_of(j) else {
            return Err(SystemError::Machine {
                ipcp: key(),
                reason: format!(
                    "a {} IPCP has no neighbours or lower DIFs",
                    self.members[j].kind()
                ),
            });
        };
        let own = &self.members[j].dif;
        let lower = self
            .live()
            .find(|(_, m)| m.dif == over && &m.dif != own)
            .map(|(l, _)| l)
            .ok_or_else(|| SystemError::NoLowerIpcp {
                ipcp: key(),
                dif: over.to_string(),
            })?;
        if self.plans[lower].neighbors.iter().any(|nb| nb.lower == j) {
            return Err(SystemError::Machine {
                ipcp: key(),
                reason: format!(
                    "DIF {over} runs over this IPCP's own DIF: stacking it the other way too would make a loop"
                ),
            });
        }
        let (frame, max) = (n.max_frame(), self.members[lower].max_sdu());
        if frame > max {
            return Err(SystemError::FrameTooLarge {
                ipcp: key(),
                frame,
                dif: over.to_string(),
                max,
            });
        }
        Ok(lower)
    }

    /// Registers normal IPCP `j`'s name in member `lower` (nothing if it
    /// is already), so that neighbours there can reach it.
    pub fn register_ipcp(&mut self, j: usize, lower: usize) -> Result<(), FlowError> {
        let Some(me) = self.plans.get(j).and_then(|p| p.app_name.clone()) else {
            return Err(FlowError::Invalid("not a normal IPCP".into()));
        };
        if self.ipcp_names.contains_key(&(lower, me.clone())) {
            return Ok(());
        }
        if self.app_names.contains(&(lower, me.clone())) {
            return Err(FlowError::NameInUse(format!(
                "an application holds {me} in DIF {}",
                self.members[lower].dif
            )));
        }
        self.members[lower].register(me.clone())?;
        self.ipcp_names.insert((lower, me), j);
        Ok(())
    }

    /// Withdraws normal IPCP `j`'s name from member `lower`; false if it
    /// was not registered there.
    pub fn unregister_ipcp(&mut self, j: usize, lower: usize) -> bool {
        let Some(me) = self.plans.get(j).and_then(|p| p.app_name.clone()) else {
            return false;
        };
        if self.ipcp_names.remove(&(lower, me.clone())).is_none() {
            return false;
        }
        self.members[lower].unregister(&me)
    }

    /// Whether a registration of `name` in member `i` is a normal IPCP's.
    pub fn is_ipcp_name(&self, i: usize, name: &AppName) -> bool {
        self.ipcp_names.contains_key(&(i, name.clone()))
    }

    /// Adds a neighbour to normal IPCP `j` and registers `j` in the DIF
    /// that reaches it; its N-1 flows are set up as for configured ones.
    pub fn add_neighbor(
        &mut self,
        now: Instant,
        j: usize,
        spec: NeighborSpec,
    ) -> Result<(), SystemError> {
        let lower = self.lower_for(j, &spec.over)?;
        if self.plans[j]
            .neighbors
            .iter()
            .any(|nb| nb.spec.name == spec.name)
        {
            return Err(SystemError::Machine {
                ipcp: self.members[j].name.clone(),
                reason: format!("{} is already a neighbour; remove it first", spec.name),
            });
        }
        self.register_ipcp(j, lower)
            .map_err(|e| SystemError::Machine {
                ipcp: self.members[j].name.clone(),
                reason: format!("cannot register in DIF {}: {e}", spec.over),
            })?;
        let me = self.plans[j].app_name.clone().unwrap_or_default();
        self.plans[j]
            .neighbors
            .push(Neighbor::new(&me, spec, lower));
        self.pump(now);
        Ok(())
    }

    /// Removes neighbour `name` of normal IPCP `j`, tearing its N-1 flows
    /// down; false if it was not a neighbour.
    pub fn remove_neighbor(&mut self, now: Instant, j: usize, name: &AppName) -> bool {
        let Some(k) = self
            .plans
            .get(j)
            .and_then(|p| p.neighbors.iter().position(|nb| &nb.spec.name == name))
        else {
            return false;
        };
        if let Some(p) = self.plans[j].neighbors[k].port {
            if let Some(&(_, lower)) = self.n1.get(&p) {
                self.members[lower].deallocate(now, p);
            }
            self.unbind_n1(now, p);
        }
        // Allocations in progress for it are dropped; the indices of the
        // neighbours after it move down by one.
        let lower = self.plans[j].neighbors[k].lower;
        let mut stale = Vec::new();
        for (&p, (jj, kk)) in self.n1_pending.iter_mut() {
            if *jj == j && *kk == k {
                stale.push(p);
            } else if *jj == j && *kk > k {
                *kk -= 1;
            }
        }
        for p in stale {
            self.n1_pending.remove(&p);
            self.members[lower].deallocate(now, p);
        }
        self.claims_neighbor_removed(now, j, k);
        self.plans[j].neighbors.remove(k);
        self.pump(now);
        true
    }
}
