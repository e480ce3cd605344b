//! CDAP in management PDUs: every CDAP message for this IPCP is decoded
//! here once and goes through its RIB daemon ([`super::mgmt_rib`]) to the
//! component that owns its object, or that asked the request it answers.
//! A management payload holds one encoded CDAP message after
//! [`CDAP_DISCRIMINATOR`].
//!
//! Between neighbours, link-state routing ([`super::routing_glue`]) and the
//! disseminated directory ([`super::directory_glue`]) send their objects as
//! unconfirmed `M_WRITE`s whose value is the object's encoded bytes.

use super::mgmt_rib::{Gate, Inbound, Peer, Verdict};
use super::{Address, N1Port, NormalIpcp};
use crate::rib::OwnerId;
use crate::time::Instant;
use rina_wire::cdap::{CdapMessage, OpCode, Value};

/// First byte of a management payload that holds one encoded CDAP message
/// (every management message: flow objects, routing, the directory, RIB
/// reads, enrollment, hellos, port authentication, sessions).
pub const CDAP_DISCRIMINATOR: u8 = rina_wire::fa::CDAP_MGMT_DISCRIMINATOR;

/// A management payload: [`CDAP_DISCRIMINATOR`], then an unconfirmed CDAP
/// `M_WRITE` of `value` on object `name` of class `class`.
pub fn write_payload(class: &str, name: &str, value: Vec<u8>) -> Vec<u8> {
    let msg = CdapMessage::write(class, name, value);
    let mut out = vec![CDAP_DISCRIMINATOR];
    out.extend_from_slice(&msg.encode());
    out
}

/// The management payload that holds `msg`.
pub(super) fn payload_of(msg: &CdapMessage) -> Vec<u8> {
    let mut out = vec![CDAP_DISCRIMINATOR];
    out.extend_from_slice(&msg.encode());
    out
}

/// Whether `msg` writes (or creates) object `name`.
pub(super) fn writes(msg: &CdapMessage, name: &str) -> bool {
    matches!(msg.op_code(), OpCode::Write | OpCode::Create) && msg.obj_name.as_deref() == Some(name)
}

impl NormalIpcp {
    /// The object a neighbour wrote, decoded by `decode`, with the port it
    /// came on; `None` (counted as malformed) when the value is not bytes,
    /// does not decode, or came through the loopback rather than a port.
    pub(super) fn written_object<T, E>(
        &mut self,
        port: Option<N1Port>,
        msg: &CdapMessage,
        decode: impl FnOnce(&[u8]) -> Result<T, E>,
    ) -> Option<(T, N1Port)> {
        let decoded = match msg.value() {
            Some(Value::Bytes(b)) => decode(&b).ok(),
            _ => None,
        };
        match (decoded, port) {
            (Some(obj), Some(port)) => Some((obj, port)),
            _ => {
                self.counters.rx_mgmt_malformed += 1;
                None
            }
        }
    }

    /// Sends each payload (an unconfirmed CDAP request) on its ports, to
    /// the neighbour recorded there.
    pub(super) fn send_to_neighbors(&mut self, now: Instant, out: Vec<(Vec<N1Port>, Vec<u8>)>) {
        for (ports, payload) in out {
            for port in ports {
                self.mgmt.unconfirmed(now, Peer::Neighbor(port));
                let dst = self.neighbors.get(&port).map_or(0, |n| n.0);
                self.send_management(now, port, dst, &payload);
            }
        }
    }

    /// Sends CDAP message `msg` to `peer`: on the port to a neighbour, or
    /// routed to a member's address.
    pub(super) fn send_cdap(&mut self, now: Instant, peer: Peer, msg: &CdapMessage) {
        let payload = payload_of(msg);
        match peer {
            Peer::Neighbor(port) => {
                let dst = self.neighbors.get(&port).map_or(0, |n| n.0);
                self.send_management(now, port, dst, &payload);
            }
            Peer::Remote(addr) => self.send_management_to(now, addr, &payload),
        }
    }

    /// Sends request `msg` of `owner` to `peer` through the peer's session
    /// (which gives it an invoke id unless it has one); returns the id.
    pub(super) fn send_request(
        &mut self,
        now: Instant,
        peer: Peer,
        owner: OwnerId,
        msg: CdapMessage,
    ) -> i32 {
        let msg = self.mgmt.request(now, peer, owner, msg);
        self.send_cdap(now, peer, &msg);
        msg.invoke_id.unwrap_or(0)
    }

    /// An encoded CDAP message arrived from `src` (on `port`, or through
    /// the loopback): through the RIB daemon to its component.
    pub(super) fn on_cdap(
        &mut self,
        now: Instant,
        port: Option<N1Port>,
        src: Address,
        bytes: &[u8],
    ) {
        let Ok(msg) = CdapMessage::decode(bytes) else {
            self.counters.rx_mgmt_malformed += 1;
            return;
        };
        let peer = self.mgmt.peer_of(&msg, port, src);
        let gate = Gate {
            admitted: port.is_none_or(|p| self.port_admitted(p)),
            from_enrollee: src == 0,
            member: self.cfg.address != 0,
        };
        let was_open = self.mgmt.is_open(peer);
        if self.mgmt.take_gated(now, peer, msg, gate) == Verdict::Unadmitted {
            self.count_unadmitted();
        }
        self.run_mgmt(now);
        if let (Peer::Neighbor(p), false) = (peer, was_open) {
            if self.mgmt.is_open(peer) {
                // What routing and the directory sent the neighbour before
                // (it dropped it for lack of a session) goes again.
                self.resync_neighbor(now, p);
            }
        }
    }

    /// Sends the RIB daemon's refusals and hands what arrived to the
    /// components.
    pub(super) fn run_mgmt(&mut self, now: Instant) {
        while let Some((peer, msg)) = self.mgmt.poll_transmit() {
            self.send_cdap(now, peer, &msg);
        }
        while let Some(inbound) = self.mgmt.poll_inbound() {
            self.deliver_cdap(now, inbound);
        }
    }

    /// One message for one component.
    fn deliver_cdap(&mut self, now: Instant, inbound: Inbound) {
        let Inbound { owner, peer, msg } = inbound;
        let port = match peer {
            Peer::Neighbor(p) => Some(p),
            Peer::Remote(_) => None,
        };
        match (msg.op_code(), peer) {
            (OpCode::Read, Peer::Neighbor(p)) => return self.answer_read(now, p, &msg),
            (OpCode::ReadR, Peer::Neighbor(p)) => return self.on_read_response(Some(p), &msg),
            (OpCode::Read | OpCode::ReadR, Peer::Remote(_)) => {
                // Reads are between neighbours (the loopback has none).
                self.counters.rx_mgmt_malformed += 1;
                return;
            }
            _ => {}
        }
        match (owner, peer) {
            (OwnerId::FLOW_ALLOCATOR, Peer::Remote(from)) => self.on_fa_cdap(now, from, &msg),
            // Not a member yet: the enroller creates the flow-state
            // objects for the enrollment, which loads them into routing
            // once it has an address.
            (OwnerId::ROUTING, Peer::Neighbor(p)) if !self.is_enrolled() => {
                self.on_enroll_cdap(now, p, &msg)
            }
            (OwnerId::ROUTING, _) => self.on_fsos_cdap(now, port, &msg),
            (OwnerId::NAMESPACE_MANAGER, _) => self.on_directory_cdap(now, port, &msg),
            (OwnerId::ENROLLMENT, Peer::Neighbor(p)) => self.on_enroll_cdap(now, p, &msg),
            (OwnerId::RESOURCE_ALLOCATOR, Peer::Neighbor(p)) => self.on_hello(now, p, &msg),
            (OwnerId::SECURITY_MANAGER, Peer::Neighbor(p)) => self.on_port_auth_cdap(now, p, &msg),
            _ => self.counters.rx_mgmt_malformed += 1,
        }
    }
}
