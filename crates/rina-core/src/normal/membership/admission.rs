//! Admission of N-1 ports in a DIF that authenticates its members.
//!
//! A member of such a DIF takes frames from a neighbour only once the N-1
//! port to it is *admitted*: the neighbour enrolled through this member,
//! this member enrolled through it, or the two members authenticated each
//! other on the port with the DIF's policy (the three messages of
//! [`crate::enrollment::auth`], without the rest of enrollment). Until then
//! only management messages for the enrollment task and the security manager
//! (port authentication) pass — the RIB daemon checks this by the owner of
//! their object, or of the request they answer ([`PRE_ADMISSION`]); every
//! other frame (data, hellos, routing, directory, flow allocation, transit)
//! is dropped and counted (`membership_unadmitted_dropped`). A node that
//! skips enrollment with a configured address and no credentials therefore
//! never gets a frame in.
//!
//! Port authentication is the security manager's: unconfirmed CDAP
//! `M_WRITE`s (through the RIB daemon, which lets them in before admission)
//! of three objects under [`PORT_AUTH_PREFIX`], whose value is the policy's
//! bytes: every member writes [`PORT_AUTH_HELLO`] (its nonce) on each port
//! not yet admitted, at once and then with every hello round; the peer
//! answers with [`PORT_AUTH_ANSWER`] (its nonce and proof); the first
//! checks it, admits the port, and writes [`PORT_AUTH_PROOF`], with which
//! the peer admits it too. Both sides run this, so each admits the port as soon as
//! the other has proven itself over its own nonce. After a failure (wrong
//! password, untrusted key) the next hello on that port waits 2 s, doubling
//! up to [`MAX_PORT_AUTH_HOLD`], so a misconfigured neighbour is not
//! answered in a tight loop.

use super::{Ctx, MembershipEvent, MembershipMachine, MsOut, N1Port};
use crate::enrollment::{AuthFailure, Handshake, Nonce};
#[cfg(doc)]
use crate::normal::mgmt_rib::PRE_ADMISSION;
use crate::rmt::Address;
use crate::sdup::aead::{ephemeral_public, SessionKeys};
use crate::time::Instant;
use rina_wire::cdap::{CdapMessage, OpCode, Value};
use std::time::Duration;

/// The security manager's objects: port authentication.
pub const PORT_AUTH_PREFIX: &str = "/difm/auth";
/// Object of the first message of port authentication (the nonce).
pub const PORT_AUTH_HELLO: &str = "/difm/auth/port/hello";
/// Object of the second (the answerer's nonce and proof).
pub const PORT_AUTH_ANSWER: &str = "/difm/auth/port/answer";
/// Object of the third (the first one's proof).
pub const PORT_AUTH_PROOF: &str = "/difm/auth/port/proof";
/// Class of the port-authentication objects.
pub const PORT_AUTH_CLASS: &str = "PortAuthentication";
const KIND_HELLO: u8 = 1;
const KIND_ANSWER: u8 = 2;
const KIND_PROOF: u8 = 3;

/// The object a kind of message is written to.
pub(in crate::normal) fn port_auth_object(kind: u8) -> &'static str {
    match kind {
        KIND_HELLO => PORT_AUTH_HELLO,
        KIND_ANSWER => PORT_AUTH_ANSWER,
        _ => PORT_AUTH_PROOF,
    }
}
/// Longest wait between port authentications after failures.
pub const MAX_PORT_AUTH_HOLD: Duration = Duration::from_secs(64);

/// Port authentication in progress on one port.
#[derive(Debug, Default)]
pub(super) struct PortAuth {
    /// Our ephemeral secret, while we wait for the peer's answer to our
    /// hello with its public key (the nonce on the wire, computed once and
    /// not per hello sent again), and when we sent it.
    secret: Option<(Nonce, Nonce)>,
    sent_at: Option<Instant>,
    /// Hellos of the peer we answered (the latest [`MAX_ANSWERED`]): what
    /// checking its proof needs, and the key exchange of that handshake.
    answered: Vec<Responder>,
    /// Failures so far, and no new hello of ours before this time.
    failures: u32,
    hold_until: Option<Instant>,
}

/// Answered hellos kept per port (a hello sent again, or a rekey crossing
/// the first handshake, must not lose the one in flight).
const MAX_ANSWERED: usize = 4;

/// The responder's half of a handshake.
#[derive(Debug)]
pub(super) struct Responder {
    /// What the policy needs to check the proof.
    ctx: Vec<u8>,
    /// What we answered (sent again if the same hello comes again).
    answer: Vec<u8>,
    secret: Nonce,
    initiator_nonce: Nonce,
    own_nonce: Nonce,
}

/// The first 32 bytes of a hello or an answer: the sender's nonce (its
/// ephemeral public key) under every policy that authenticates.
fn lead_nonce(b: &[u8]) -> Option<Nonce> {
    b.get(..32)?.try_into().ok()
}

impl MembershipMachine {
    /// Whether this IPCP admits ports: a member of a DIF that authenticates.
    pub(in crate::normal) fn admission_required(&self, address: Address) -> bool {
        address != 0 && self.cfg.authenticates()
    }

    /// Whether frames from `port` are taken by an IPCP at `address`: its
    /// peer authenticated (always true where admission is not required).
    pub(in crate::normal) fn is_admitted(&self, address: Address, port: N1Port) -> bool {
        !self.admission_required(address) || self.admitted.contains(&port)
    }

    pub(super) fn port_admitted(&self, cx: &Ctx, port: N1Port) -> bool {
        self.is_admitted(cx.address(), port)
    }

    /// A frame from a port not admitted was dropped.
    pub(in crate::normal) fn count_unadmitted(&mut self) {
        self.counters.unadmitted_dropped += 1;
    }

    /// The peer on `port` is authenticated.
    pub(super) fn admit_port(&mut self, cx: &Ctx, now: Instant, port: N1Port) {
        if self.encrypting() && !self.port_has_keys(port) {
            // Encrypting: admitted once keys are agreed on the port.
            return self.start_port_auth(cx, now, port);
        }
        if let Some(st) = self.port_auth.get_mut(&port) {
            // A handshake the peer started may still complete (its keys).
            st.secret = None;
            st.sent_at = None;
            st.failures = 0;
            st.hold_until = None;
        }
        if self.admitted.insert(port) && cx.address() != 0 {
            self.send_hello(cx, now, port);
        }
    }

    /// Forgets `port`.
    pub(super) fn forget_port_admission(&mut self, port: N1Port) {
        self.admitted.remove(&port);
        self.port_auth.remove(&port);
        self.crypto.remove(&port);
    }

    /// Sends (again) our port-authentication hello on `port` if it is not
    /// admitted yet.
    pub(super) fn start_port_auth(&mut self, cx: &Ctx, now: Instant, port: N1Port) {
        if self.port_admitted(cx, port) {
            return;
        }
        self.send_port_auth_hello(now, port);
    }

    /// Starts a new handshake on an admitted port for fresh keys, unless
    /// one is under way (answered within a second).
    pub(in crate::normal) fn start_rekey(&mut self, now: Instant, port: N1Port) {
        let pending = self.port_auth.get(&port).is_some_and(|st| {
            st.secret.is_some() && st.sent_at.is_some_and(|t| now < t + Duration::from_secs(1))
        });
        if !pending {
            self.send_port_auth_hello(now, port);
        }
    }

    fn send_port_auth_hello(&mut self, now: Instant, port: N1Port) {
        let st = self.port_auth.entry(port).or_default();
        if st.hold_until.is_some_and(|t| now < t) {
            return;
        }
        let nonces = &mut self.nonces;
        let (_, public) = *st.secret.get_or_insert_with(|| {
            let secret = nonces.next_nonce();
            (secret, ephemeral_public(&secret))
        });
        st.sent_at = Some(now);
        let hello = self.cfg.auth().hello(&public);
        self.send_port_auth(port, KIND_HELLO, hello);
    }

    fn send_port_auth(&mut self, port: N1Port, kind: u8, body: Vec<u8>) {
        self.out.push_back(MsOut::PortAuth { port, kind, body });
    }

    /// A port-authentication message (an `M_WRITE` of one of its objects)
    /// from the neighbour on `port`, through the RIB daemon.
    pub(in crate::normal) fn on_port_auth_cdap(
        &mut self,
        cx: &Ctx,
        now: Instant,
        port: N1Port,
        msg: &CdapMessage,
    ) {
        let kind = match msg.obj_name.as_deref() {
            Some(PORT_AUTH_HELLO) => KIND_HELLO,
            Some(PORT_AUTH_ANSWER) => KIND_ANSWER,
            Some(PORT_AUTH_PROOF) => KIND_PROOF,
            _ => 0,
        };
        let body = match msg.value() {
            Some(Value::Bytes(b)) if msg.op_code() == OpCode::Write => b,
            _ => Vec::new(),
        };
        if !self.admission_required(cx.address()) {
            self.counters.enroll_stray += 1;
            return;
        }
        match kind {
            KIND_HELLO => self.on_port_auth_hello(now, port, &body),
            KIND_ANSWER => self.on_port_auth_answer(cx, now, port, &body),
            KIND_PROOF => self.on_port_auth_proof(cx, now, port, &body),
            _ => self.port_auth_failed(now, port, AuthFailure::Malformed("unknown kind")),
        }
    }

    /// Whether `nonce` is one of ours: the nonce of a hello we sent and
    /// wait to have answered, or of an answer we gave, on any port. A
    /// message that shows one back reflects our own (with them a peer
    /// would prove itself with our proofs): it is counted and dropped, and
    /// the handshakes under way go on.
    fn is_own_nonce(&self, nonce: &Nonce) -> bool {
        self.port_auth.values().any(|st| {
            st.secret.is_some_and(|(_, public)| public == *nonce)
                || st.answered.iter().any(|r| r.own_nonce == *nonce)
        })
    }

    /// The peer's hello: answer it (the same answer to the same hello).
    fn on_port_auth_hello(&mut self, now: Instant, port: N1Port, body: &[u8]) {
        let initiator_nonce = lead_nonce(body).unwrap_or_default();
        if self.is_own_nonce(&initiator_nonce) {
            self.counters.port_auth_reflected += 1;
            return;
        }
        let st = self.port_auth.entry(port).or_default();
        if let Some(r) = st
            .answered
            .iter()
            .find(|r| r.initiator_nonce == initiator_nonce)
        {
            // The same hello again: the same answer.
            let answer = r.answer.clone();
            return self.send_port_auth(port, KIND_ANSWER, answer);
        }
        let secret = self.nonces.next_nonce();
        let own_nonce = ephemeral_public(&secret);
        match self.cfg.auth().challenge(Handshake::Port, body, &own_nonce) {
            Ok((answer, ctx)) => {
                let st = self.port_auth.entry(port).or_default();
                if st.answered.len() >= MAX_ANSWERED {
                    st.answered.remove(0);
                }
                st.answered.push(Responder {
                    ctx,
                    answer: answer.clone(),
                    secret,
                    initiator_nonce,
                    own_nonce,
                });
                self.send_port_auth(port, KIND_ANSWER, answer);
            }
            Err(f) => self.port_auth_failed(now, port, f),
        }
    }

    /// The peer's answer to our hello: check it, prove ourselves, take the
    /// keys.
    fn on_port_auth_answer(&mut self, cx: &Ctx, now: Instant, port: N1Port, body: &[u8]) {
        let Some((secret, own_nonce)) = self.port_auth.get(&port).and_then(|s| s.secret) else {
            // Late, or already admitted.
            return;
        };
        if lead_nonce(body).is_some_and(|n| self.is_own_nonce(&n)) {
            self.counters.port_auth_reflected += 1;
            return;
        }
        let keys = self
            .cfg
            .auth()
            .respond(Handshake::Port, &own_nonce, body)
            .and_then(|proof| {
                let peer = lead_nonce(body).unwrap_or_default();
                let keys = SessionKeys::derive(&secret, &own_nonce, &peer, true)
                    .map_err(|_| AuthFailure::Malformed("low-order ephemeral key"))?;
                Ok((proof, keys))
            });
        match keys {
            Ok((proof, keys)) => {
                self.send_port_auth(port, KIND_PROOF, proof);
                self.port_auth_ok(cx, now, port, &keys);
            }
            Err(f) => self.port_auth_failed(now, port, f),
        }
    }

    /// The peer's proof, over one of the hellos we answered.
    fn on_port_auth_proof(&mut self, cx: &Ctx, now: Instant, port: N1Port, body: &[u8]) {
        let auth = self.cfg.auth();
        let Some(st) = self.port_auth.get_mut(&port) else {
            return;
        };
        if st.answered.is_empty() {
            return;
        }
        let mut result = Err(AuthFailure::BadProof);
        for i in 0..st.answered.len() {
            let r = &st.answered[i];
            result = auth.verify(Handshake::Port, &r.ctx, body).and_then(|()| {
                SessionKeys::derive(&r.secret, &r.initiator_nonce, &r.own_nonce, false)
                    .map_err(|_| AuthFailure::Malformed("low-order ephemeral key"))
            });
            if result.is_ok() {
                st.answered.remove(i);
                break;
            }
        }
        match result {
            Ok(keys) => self.port_auth_ok(cx, now, port, &keys),
            Err(f) => {
                st.answered.clear();
                self.port_auth_failed(now, port, f)
            }
        }
    }

    fn port_auth_ok(&mut self, cx: &Ctx, now: Instant, port: N1Port, keys: &SessionKeys) {
        self.counters.ports_authenticated += 1;
        self.install_keys(now, port, keys);
        self.admit_port(cx, now, port);
    }

    fn port_auth_failed(&mut self, now: Instant, port: N1Port, f: AuthFailure) {
        self.counters.port_auth_failed += 1;
        let st = self.port_auth.entry(port).or_default();
        st.failures = st.failures.saturating_add(1);
        let hold = Duration::from_secs(1 << st.failures.min(6)).min(MAX_PORT_AUTH_HOLD);
        st.hold_until = Some(now + hold);
        // A fresh nonce for the next try.
        st.secret = None;
        st.sent_at = None;
        let peer = self
            .hello_from
            .get(&port)
            .map(|h| h.0.clone())
            .unwrap_or_default();
        self.report_event(MembershipEvent::Rejected {
            peer,
            reason: format!("port authentication on N-1 port {port} failed: {f}"),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normal::{Action, MembershipConfig, NormalConfig, NormalIpcp};
    use crate::rmt::Fifo;
    use crate::sdup::{NullCipher, Sdup};
    use rina_wire::pci::PduType;
    use rina_wire::pci::{self, DtConstants};
    use std::time::Duration;

    const PORT: N1Port = 1;

    fn member(addr: u64, password: Option<&str>) -> NormalIpcp {
        let mut c = NormalConfig::new("net", addr);
        let mut m = MembershipConfig::new(format!("m{addr}.net").parse().unwrap());
        m.password = password.map(str::to_string);
        m.entropy = [addr as u8; 32];
        c.membership = Some(m);
        let mut p = NormalIpcp::new(c, Box::new(Fifo::new(100))).unwrap();
        p.add_port(PORT);
        p
    }

    /// Carries frames between the two until both are quiet, running
    /// timers up to `until` in steps of 100 ms; returns the membership
    /// events of each.
    fn run(net: &mut [NormalIpcp; 2], until: Instant) -> [Vec<MembershipEvent>; 2] {
        let mut events: [Vec<MembershipEvent>; 2] = [Vec::new(), Vec::new()];
        let mut now = Instant::ZERO;
        while now <= until {
            loop {
                let mut moved = false;
                for i in 0..2 {
                    while let Some(a) = net[i].poll_action() {
                        match a {
                            Action::Transmit { frame, .. } => {
                                moved = true;
                                net[1 - i].on_frame(now, PORT, &frame);
                            }
                            Action::Membership(e) => events[i].push(*e),
                            _ => {}
                        }
                    }
                }
                if !moved {
                    break;
                }
            }
            now = now + Duration::from_millis(100);
            for p in net.iter_mut() {
                if p.poll_timeout().is_some_and(|t| t <= now) {
                    p.handle_timeout(now);
                }
            }
        }
        events
    }

    fn counters(p: &NormalIpcp) -> crate::normal::membership::MembershipCounters {
        *p.membership_counters().unwrap()
    }

    #[test]
    fn two_members_with_the_password_admit_each_other_on_the_port() {
        let mut net = [member(1, Some("pw")), member(2, Some("pw"))];
        run(&mut net, Instant::ZERO + Duration::from_secs(3));
        for p in &net {
            let c = counters(p);
            assert!(c.ports_authenticated >= 1, "{c:?}");
            assert_eq!(c.port_auth_failed, 0);
            assert!(c.hellos_received >= 1, "hellos flow once admitted: {c:?}");
        }
        assert_eq!(net[0].neighbors.get(&PORT).map(|n| n.0), Some(2));
    }

    #[test]
    fn a_member_without_the_password_gets_no_frame_in() {
        let mut net = [member(1, Some("pw")), member(2, None)];
        run(&mut net, Instant::ZERO + Duration::from_secs(3));
        let c = counters(&net[0]);
        assert_eq!(c.hellos_received, 0, "{c:?}");
        assert!(c.unadmitted_dropped >= 3, "every hello dropped: {c:?}");
        assert_eq!(c.ports_authenticated, 0);
        assert!(!net[0].neighbors.contains_key(&PORT));
        // A data PDU for member 1 from that port is dropped and counted.
        let mut dt = pci::Pci::new(PduType::Dt);
        dt.dst_addr = 1;
        dt.src_addr = 2;
        dt.seq = 1;
        let mut pdu = Vec::new();
        pci::encode_data(&DtConstants::default(), &dt, &[1, 2, 3], &mut pdu).unwrap();
        let sdup = Sdup::new(net[0].cfg.sdup, Box::new(NullCipher));
        let mut frame = Vec::new();
        sdup.protect(&pdu, 64, &mut frame);
        let before = counters(&net[0]).unadmitted_dropped;
        net[0].on_frame(Instant::ZERO + Duration::from_secs(4), PORT, &frame);
        assert_eq!(counters(&net[0]).unadmitted_dropped, before + 1);
        assert_eq!(net[0].counters().rx_unknown_cep, 0, "never reached EFCP");
    }

    #[test]
    fn a_wrong_password_fails_port_authentication_with_the_reason_on_both_sides() {
        let mut net = [member(1, Some("pw")), member(2, Some("guess"))];
        let events = run(&mut net, Instant::ZERO + Duration::from_secs(30));
        for (p, ev) in net.iter().zip(&events) {
            let c = counters(p);
            // 30 s of hello rounds, but tries at 0, 2, 6, 14 and 30 s.
            assert!((1..=5).contains(&c.port_auth_failed), "backoff: {c:?}");
            assert_eq!(c.ports_authenticated, 0);
            assert!(
                ev.iter().any(|e| matches!(
                    e,
                    MembershipEvent::Rejected { reason, .. }
                        if reason.contains("port authentication") && reason.contains("wrong password")
                )),
                "{ev:?}"
            );
        }
    }

    /// A neighbour without the password that sends every frame straight
    /// back is not admitted: the hello it reflects carries our own nonce.
    #[test]
    fn a_neighbour_reflecting_our_frames_is_not_admitted() {
        let mut victim = member(1, Some("pw"));
        let mut now = Instant::ZERO;
        for _ in 0..10 {
            let mut frames = Vec::new();
            while let Some(a) = victim.poll_action() {
                if let Action::Transmit { frame, .. } = a {
                    frames.push(frame);
                }
            }
            for f in frames {
                victim.on_frame(now, PORT, &f);
            }
            now = now + Duration::from_millis(100);
        }
        let c = counters(&victim);
        assert!(!victim.port_admitted(PORT), "{c:?}");
        assert_eq!(c.ports_authenticated, 0, "{c:?}");
        assert!(c.port_auth_reflected >= 1, "{c:?}");
    }
}
