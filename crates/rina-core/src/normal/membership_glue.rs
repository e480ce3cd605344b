//! The glue between the normal IPCP and its membership machine
//! ([`super::membership`]): what the rest of the IPCP asks of membership, and the
//! carrying out of what the machine asks for ([`MsOut`]) — sending its
//! messages through the RIB daemon, opening and closing sessions, bringing
//! neighbours up and down, taking an address and a configuration,
//! reporting to the driver.

use super::membership::{
    mgmt_name, Adoption, Ctx, EnrollmentReport, MembershipCounters, MembershipMachine, MsOut,
};
use super::mgmt_rib::Peer;
use super::{Action, FlowId, N1Port, NormalIpcp};
use crate::rib::OwnerId;
use crate::rmt::Address;
use crate::routing::{decode_fsos, LinkState};
use crate::time::Instant;
use rina_wire::cdap::{CdapMessage, OpCode};
use rina_wire::pci::{Pci, PduType};
use rina_wire::AppName;

impl NormalIpcp {
    /// The membership machine and what it may read of this IPCP, borrowed
    /// apart; `None` without membership.
    pub(super) fn ms_parts(&mut self) -> Option<(&mut MembershipMachine, Ctx<'_>)> {
        let m = self.mship.as_deref_mut()?;
        let cx = Ctx {
            cfg: &self.cfg,
            neighbors: &self.neighbors,
            rmt: &self.rmt,
            routing: self.routing.as_ref(),
            dft: self.dft.as_ref(),
        };
        Some((m, cx))
    }

    /// Carries out what the membership machine asked for, in order.
    pub(super) fn run_ms(&mut self, now: Instant) {
        while let Some(out) = self.mship.as_mut().and_then(|m| m.poll_out()) {
            match out {
                MsOut::Connect { port, msg } => {
                    let peer = Peer::Neighbor(port);
                    if let Some(m) = self.mgmt.connect(now, peer, *msg) {
                        self.send_cdap(now, peer, &m);
                    }
                }
                MsOut::Hello { port, msg } => {
                    self.mgmt.unconfirmed(now, Peer::Neighbor(port));
                    self.send_cdap(now, Peer::Neighbor(port), &msg);
                }
                MsOut::Enrollment { port, dst, bytes } => {
                    self.send_enrollment(now, port, dst, &bytes)
                }
                MsOut::PortAuth { port, kind, body } => self.send_port_auth(now, port, kind, &body),
                MsOut::SessionOpened { port } => self.mgmt.opened(now, Peer::Neighbor(port)),
                MsOut::SessionClosed { port } => self.mgmt.closed(Peer::Neighbor(port)),
                MsOut::NeighborUp { port, address } => self.neighbor_up(now, port, address, 1),
                MsOut::NeighborDown { port } => self.neighbor_down(now, port),
                MsOut::Resync { port } => self.resync_neighbor(now, port),
                MsOut::Adopt(a) => {
                    let result = self.adopt(now, &a);
                    if let Some((m, cx)) = self.ms_parts() {
                        m.adopted(&cx, now, &a, result);
                    }
                }
                MsOut::Renumber { to, twin } => {
                    let from = self.cfg.address;
                    self.take_address(now, to);
                    if let Some((m, cx)) = self.ms_parts() {
                        m.renumbered(&cx, now, from, twin);
                    }
                }
                MsOut::Report(event) => self.actions.push_back(Action::Membership(event)),
            }
        }
    }

    /// Whether this IPCP is a member of its DIF (has an address).
    pub fn is_enrolled(&self) -> bool {
        self.cfg.address != 0
    }

    /// Where this IPCP's own enrollment is (`None` if it never enrolled
    /// through a member: configured with an address, or no hello heard yet).
    pub fn enrollment_report(&self) -> Option<EnrollmentReport> {
        self.mship.as_ref()?.enrollment_report()
    }

    /// Membership counters, when membership is configured.
    pub fn membership_counters(&self) -> Option<&MembershipCounters> {
        self.mship.as_ref().map(|m| m.counters())
    }

    /// The neighbours that said hello: (port, name, address).
    pub fn hello_neighbors(&self) -> Vec<(N1Port, AppName, Address)> {
        self.mship
            .as_ref()
            .map_or_else(Vec::new, |m| m.hello_neighbors())
    }

    /// Whether this IPCP admits ports: a member of a DIF that authenticates.
    pub fn admission_required(&self) -> bool {
        self.mship
            .as_ref()
            .is_some_and(|m| m.admission_required(self.cfg.address))
    }

    /// Whether frames from `port` are taken: its peer authenticated (always
    /// true where admission is not required).
    pub fn port_admitted(&self, port: N1Port) -> bool {
        self.mship
            .as_ref()
            .is_none_or(|m| m.is_admitted(self.cfg.address, port))
    }

    pub(super) fn count_unadmitted(&mut self) {
        if let Some(m) = self.mship.as_mut() {
            m.count_unadmitted();
        }
    }

    /// Whether a frame with this PCI, from `port`, may go further: from a
    /// port not admitted, only management PDUs for this IPCP (they are
    /// checked again whole, by the RIB daemon's gate).
    pub(super) fn admit_frame(&mut self, port: N1Port, pci: &Pci, local: bool) -> bool {
        if self.port_admitted(port) || (pci.pdu_type == PduType::Mgmt && local) {
            return true;
        }
        self.count_unadmitted();
        false
    }

    /// Membership side of a new port: a hello at once.
    pub(super) fn membership_port_added(&mut self, now: Instant, port: N1Port) {
        if let Some((m, cx)) = self.ms_parts() {
            m.port_added(&cx, now, port);
            self.run_ms(now);
        }
    }

    /// Membership side of a port going away.
    pub(super) fn membership_port_removed(&mut self, port: N1Port) {
        let now = self.now;
        if let Some(m) = self.mship.as_mut() {
            m.port_removed(now, port);
        }
    }

    /// A valid frame arrived on `port`: the neighbour is alive.
    pub(super) fn membership_heard(&mut self, now: Instant, port: N1Port) {
        if let Some(m) = self.mship.as_mut() {
            m.heard(now, port);
        }
    }

    /// Closes the open CDAP session with the neighbour on `port` with an
    /// (unconfirmed) `M_RELEASE`, before the port goes away.
    pub(super) fn release_session(&mut self, now: Instant, port: N1Port) {
        let peer = Peer::Neighbor(port);
        if self.mship.is_none() || self.mgmt.state(peer) != super::mgmt_rib::SessionState::Open {
            return;
        }
        self.mgmt.unconfirmed(now, peer);
        self.send_cdap(now, peer, &CdapMessage::release());
        self.mgmt.closed(peer);
    }

    /// A hello from the neighbour on `port`, through the RIB daemon.
    pub(super) fn on_hello(&mut self, now: Instant, port: N1Port, msg: &CdapMessage) {
        let Some((m, cx)) = self.ms_parts() else {
            self.counters.rx_mgmt_unhandled += 1;
            return;
        };
        m.on_hello(&cx, now, port, msg);
        self.run_ms(now);
    }

    /// An enrollment message from the neighbour on `port`, through the RIB
    /// daemon.
    pub(super) fn on_enroll_cdap(&mut self, now: Instant, port: N1Port, msg: &CdapMessage) {
        let Some((m, cx)) = self.ms_parts() else {
            self.counters.rx_mgmt_unhandled += 1;
            return;
        };
        m.on_enroll_cdap(&cx, now, port, msg);
        self.run_ms(now);
    }

    /// A port-authentication message from the neighbour on `port`, through
    /// the RIB daemon.
    pub(super) fn on_port_auth_cdap(&mut self, now: Instant, port: N1Port, msg: &CdapMessage) {
        if let Some((m, cx)) = self.ms_parts() {
            m.on_port_auth_cdap(&cx, now, port, msg);
            self.run_ms(now);
        }
    }

    /// Sends one encoded CDAP message of an enrollment machine to the
    /// neighbour on `port` (at `dst`) through the RIB daemon: its requests
    /// are recorded in the neighbour's session, so that their answers come
    /// back to the enrollment; an accepting `M_CONNECT_R` opens the
    /// session.
    fn send_enrollment(&mut self, now: Instant, port: N1Port, dst: Address, bytes: &[u8]) {
        let peer = Peer::Neighbor(port);
        match CdapMessage::decode(bytes) {
            Ok(msg) if !msg.is_response() && msg.invoke_id.is_some() => {
                self.mgmt.request(now, peer, OwnerId::ENROLLMENT, msg);
            }
            Ok(msg) if msg.op_code() == OpCode::ConnectR && msg.result.unwrap_or(0) == 0 => {
                self.mgmt.opened(now, peer);
            }
            _ => {}
        }
        let mut payload = vec![super::CDAP_DISCRIMINATOR];
        payload.extend_from_slice(bytes);
        self.send_management(now, port, dst, &payload);
    }

    /// Takes the address and configuration an enroller gave: routing and
    /// the directory start at the address with the enroller's databases.
    fn adopt(&mut self, now: Instant, a: &Adoption) -> Result<(), String> {
        let mut routing_cfg = self.cfg.routing.clone();
        if a.routing && routing_cfg.is_none() {
            routing_cfg = Some(crate::routing::Config::default());
        }
        let mut dir_cfg = self.cfg.dynamic_directory.clone();
        if a.directory && dir_cfg.is_none() {
            dir_cfg = Some(crate::directory::Config::default());
        }
        let routing = routing_cfg
            .clone()
            .map(|rc| LinkState::new(a.address, rc))
            .transpose()
            .map_err(|e| e.to_string())?;
        let dft = dir_cfg
            .clone()
            .map(|dc| crate::directory::Directory::new(a.address, dc))
            .transpose()
            .map_err(|e| e.to_string())?;
        self.cfg.address = a.address;
        if !a.cubes.is_empty() {
            self.cfg.cubes = a.cubes.clone();
        }
        self.cfg.max_sdu = a.max_sdu;
        self.cfg.routing = routing_cfg;
        self.cfg.dynamic_directory = dir_cfg;
        if routing.is_some() {
            self.routing = routing;
        }
        if let Some(mut d) = dft {
            for n in self.fa.names() {
                let _ = d.register(now, n.clone());
            }
            self.dft = Some(d);
            self.register_mgmt_entity(now);
        }
        // The enroller is our first neighbour; its databases are ours.
        if a.enroller != 0 {
            self.neighbor_up(now, a.port, a.enroller, 1);
        }
        for blob in &a.fsos {
            if let (Ok(list), Some(r)) = (decode_fsos(blob), self.routing.as_mut()) {
                r.on_fsos(now, a.port, list);
            }
        }
        for blob in &a.directory_blobs {
            if let (Ok(list), Some(d)) = (crate::directory::decode_entries(blob), self.dft.as_mut())
            {
                d.on_entries(now, a.port, list);
            }
        }
        self.routing_timeout(now);
        self.directory_timeout(now);
        Ok(())
    }

    /// Registers this member's management entity in the directory.
    pub(super) fn register_mgmt_entity(&mut self, now: Instant) {
        let Some(name) = self.mship.as_ref().map(|m| mgmt_name(&m.config().name)) else {
            return;
        };
        if let Some(d) = self.dft.as_mut() {
            let _ = d.register(now, name);
        }
    }

    /// Looks for another member at this address (see
    /// `membership::renumber`); renumbers if this one must give way.
    pub(super) fn check_address_conflict(&mut self, now: Instant) {
        let Some(d) = self.dft.as_mut() else {
            return;
        };
        let foreign: Vec<AppName> = d.take_foreign().into_iter().map(|(n, _)| n).collect();
        if foreign.is_empty() {
            return;
        }
        if let Some((m, cx)) = self.ms_parts() {
            m.on_foreign(&cx, now, foreign);
            self.run_ms(now);
        }
    }

    /// Takes address `new` instead of this one: routing and the directory
    /// start again at it, with the neighbours and names they had.
    fn take_address(&mut self, now: Instant, new: Address) {
        self.cfg.address = new;
        if let Some(rc) = self.cfg.routing.clone() {
            self.routing = LinkState::new(new, rc).ok();
            if let Some(r) = self.routing.as_mut() {
                for (port, (addr, cost)) in &self.neighbors {
                    let _ = r.neighbor_up(now, *port, *addr, *cost);
                }
            }
        }
        if let Some(dc) = self.cfg.dynamic_directory.clone() {
            self.dft = crate::directory::Directory::new(new, dc).ok();
            if let Some(d) = self.dft.as_mut() {
                for n in self.fa.names() {
                    let _ = d.register(now, n.clone());
                }
                for p in self.neighbors.keys() {
                    let _ = d.neighbor_up(now, *p);
                }
            }
            self.register_mgmt_entity(now);
        }
        self.routing_timeout(now);
        self.directory_timeout(now);
    }

    /// Membership timers.
    pub(super) fn membership_poll_timeout(&self) -> Option<Instant> {
        self.mship.as_ref().and_then(|m| m.poll_timeout())
    }

    /// Runs the membership timers that are due.
    pub(super) fn membership_timeout(&mut self, now: Instant) {
        let Some((m, cx)) = self.ms_parts() else {
            return;
        };
        let hello_round = m.handle_timeout(&cx, now);
        self.run_ms(now);
        if hello_round {
            self.check_unreachable(now);
        }
    }

    /// Fails flows whose destination has had no route for too long.
    fn check_unreachable(&mut self, now: Instant) {
        if self.routing.is_none() {
            return;
        }
        let me = self.cfg.address;
        let table = self.rmt.table();
        let flows: Vec<(FlowId, bool)> = self
            .flows
            .iter()
            .filter(|(_, f)| !f.failure_reported)
            .map(|(id, f)| {
                let reach = f.ep.remote_addr == me
                    || table
                        .lookup(f.ep.remote_addr, f.ep.qos_id, f.hash)
                        .is_some();
                (*id, reach)
            })
            .collect();
        let Some(m) = self.mship.as_mut() else {
            return;
        };
        let (failed, error) = m.unreachable(now, &flows);
        for id in failed {
            if let Some(f) = self.flows.get_mut(&id) {
                f.failure_reported = true;
                self.actions.push_back(Action::FlowFailed {
                    flow: id,
                    error: Box::new(error.clone()),
                });
            }
        }
    }
}
