//! The data path of N-1 flow encryption in the normal IPCP (see
//! [`membership::protection`](super::membership)): frames sealed on the way
//! out and opened on the way in under the keys the membership machine
//! holds, and the handshake that may go in clear before there are keys.

use super::membership::{port_auth_object, PortProtection, PORT_AUTH_CLASS};
use super::mgmt_rib::Peer;
use super::{Action, N1Port, NormalIpcp, CDAP_DISCRIMINATOR, FRAGMENT_DISCRIMINATOR};
use crate::buf::{self, PduBuf};
use crate::rib::OwnerId;
use crate::sdup::aead::{OpenError, OpenedKind};
use crate::time::Instant;
use rina_wire::cdap::CdapMessage;
use rina_wire::pci::{self, Body, Pci, PduType};

impl NormalIpcp {
    /// Whether this IPCP encrypts its N-1 flows.
    pub(super) fn encrypting(&self) -> bool {
        self.mship.as_ref().is_some_and(|m| m.encrypting())
    }

    #[cfg(test)]
    pub(super) fn port_has_keys(&self, port: N1Port) -> bool {
        self.mship.as_ref().is_some_and(|m| m.port_has_keys(port))
    }

    /// Each N-1 port's protection, for `rinactl` (empty when not
    /// encrypting).
    pub fn port_protection(&self) -> Vec<PortProtection> {
        self.mship
            .as_ref()
            .map_or_else(Vec::new, |m| m.port_protection(self.rmt.primary_ports()))
    }

    /// Starts a new handshake on `port` for fresh keys.
    fn start_rekey(&mut self, now: Instant, port: N1Port) {
        if let Some(m) = self.mship.as_mut() {
            m.start_rekey(now, port);
            self.run_ms(now);
        }
    }

    /// Sends a port-authentication message on `port`: through the RMT when
    /// not encrypting, straight to the port in clear when encrypting.
    pub(super) fn send_port_auth(&mut self, now: Instant, port: N1Port, kind: u8, body: &[u8]) {
        let msg = CdapMessage::write(PORT_AUTH_CLASS, port_auth_object(kind), body.to_vec());
        self.mgmt.unconfirmed(now, Peer::Neighbor(port));
        let mut payload = vec![CDAP_DISCRIMINATOR];
        payload.extend_from_slice(&msg.encode());
        if !self.encrypting() {
            return self.send_management(now, port, 0, &payload);
        }
        let mut pci = Pci::new(PduType::Mgmt);
        pci.src_addr = self.cfg.address;
        pci.qos_id = crate::normal::MGMT_QOS_ID;
        let mut pdu = Vec::new();
        if pci::encode_data(&self.cfg.dt, &pci, &payload, &mut pdu).is_err() {
            self.counters.tx_dropped += 1;
            return;
        }
        let mut frame = PduBuf::empty(buf::HEADROOM, pdu.len() + self.sdup.overhead());
        let ttl = self.sdup.initial_ttl().unwrap_or(0);
        self.sdup.protect(&pdu, ttl, frame.parts_mut().0);
        let Some(m) = self.mship.as_mut() else {
            return;
        };
        m.crypto_mut(port).clear_buf(&mut frame);
        self.counters.tx_frames += 1;
        self.actions.push_back(Action::Transmit { port, frame });
    }

    /// Seals a frame the RMT put out on `port` (a lane of `primary`), or
    /// lets it go in clear when it may, or drops it (`None`, counted).
    pub(in crate::normal) fn protect_out(
        &mut self,
        now: Instant,
        primary: N1Port,
        mut frame: PduBuf,
    ) -> Option<PduBuf> {
        if !self.encrypting() {
            return Some(frame);
        }
        let m = self.mship.as_mut()?;
        let rekey = m.rekey_policy();
        let c = m.crypto_mut(primary);
        if c.has_keys() {
            let sealed = c.seal_buf(&mut frame);
            if c.rekey_due(now, &rekey) {
                self.start_rekey(now, primary);
            }
            return sealed.then_some(frame);
        }
        // No keys yet: only the handshake goes, in clear (parsed only here,
        // not for every sealed frame).
        let may_go_clear = self.is_handshake_frame(primary, &frame, false, true);
        let c = self.mship.as_mut()?.crypto_mut(primary);
        if may_go_clear {
            c.clear_buf(&mut frame);
            return Some(frame);
        }
        c.counters.no_key_out += 1;
        None
    }

    /// Whether `frame` (SDU-protected, not encrypted) on `port` is a
    /// management PDU that agrees keys: enrollment or port authentication,
    /// and with `before_keys` also what leads to them (a membership hello,
    /// which starts enrollment, and management fragments). A received one
    /// (`rx`) must be for this IPCP.
    fn is_handshake_frame(&self, port: N1Port, frame: &[u8], rx: bool, before_keys: bool) -> bool {
        let Ok(un) = self.sdup.unprotect(&frame[..self.unpadded_len(frame)]) else {
            return false;
        };
        let Ok(pdu) = pci::Pdu::parse(&self.cfg.dt, &un.pdu) else {
            return false;
        };
        let local = !rx || pdu.pci.dst_addr == 0 || pdu.pci.dst_addr == self.cfg.address;
        match pdu.body {
            Body::Data(p) if pdu.pci.pdu_type == PduType::Mgmt && local => match p.split_first() {
                Some((&CDAP_DISCRIMINATOR, msg)) => {
                    self.is_handshake_message(port, &pdu.pci, msg, rx, before_keys)
                }
                Some((&FRAGMENT_DISCRIMINATOR, _)) => before_keys,
                _ => false,
            },
            _ => false,
        }
    }

    /// Whether an encoded CDAP message is one of the handshake (see
    /// `is_handshake_frame`), by the component the RIB
    /// daemon gives it to: port authentication always; the hello before
    /// keys; the enrollment's when it comes from an enrollee (address 0).
    /// An enrollee (no address yet, nothing of the DIF to protect) takes
    /// and sends its enrollment whatever the objects (the flow-state
    /// objects an enroller creates are routing's); a member sends to
    /// address 0 (an enrollee, or a neighbour whose address it does not
    /// know yet) only what it addresses so.
    fn is_handshake_message(
        &self,
        port: N1Port,
        pci: &Pci,
        bytes: &[u8],
        rx: bool,
        before_keys: bool,
    ) -> bool {
        let Ok(msg) = CdapMessage::decode(bytes) else {
            return false;
        };
        let from_enrollee = pci.src_addr == 0;
        let owner = self
            .mgmt
            .owner_for(Peer::Neighbor(port), &msg, from_enrollee);
        match owner {
            Some(OwnerId::SECURITY_MANAGER) => true,
            Some(OwnerId::RESOURCE_ALLOCATOR) => before_keys,
            _ if self.cfg.address == 0 => true,
            Some(OwnerId::ENROLLMENT) if rx => from_enrollee,
            _ => !rx && pci.dst_addr == 0,
        }
    }

    /// Opens a frame that arrived on `port` (primary), in place: false
    /// when it is to be dropped (counted in the port's crypto counters).
    /// A clear frame passes only when it may be taken in clear.
    pub(in crate::normal) fn open_in(
        &mut self,
        now: Instant,
        port: N1Port,
        frame: &mut PduBuf,
    ) -> bool {
        if !self.encrypting() {
            return true;
        }
        let Some(m) = self.mship.as_mut() else {
            return false;
        };
        let c = m.crypto_mut(port);
        let keyed = c.has_keys();
        match c.open_buf(frame) {
            Ok(OpenedKind::Sealed) => true,
            Ok(OpenedKind::Clear) => {
                // Before keys, enrollment may come in fragments.
                if self.is_handshake_frame(port, frame, true, !keyed) {
                    return true;
                }
                if let Some(m) = self.mship.as_mut() {
                    let c = m.crypto_mut(port);
                    c.counters.clear_in -= 1;
                    c.counters.clear_refused += 1;
                }
                false
            }
            Err(OpenError::UnknownKey(_)) => {
                // The peer has keys this side never got (a lost proof, or
                // a restart here): agree new ones.
                if keyed {
                    self.start_rekey(now, port);
                }
                false
            }
            Err(_) => false,
        }
    }
}
