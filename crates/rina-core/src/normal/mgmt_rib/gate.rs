//! The RIB daemon's gates (admission, sessions) and the session messages
//! (`M_CONNECT`, `M_RELEASE` and their answers) between members.

use super::{
    Gate, Inbound, MgmtRib, Peer, SessionState, Verdict, PRE_ADMISSION, RESULT_NO_SESSION,
    SESSIONLESS,
};
use crate::rib::OwnerId;
use crate::time::Instant;
use rina_wire::cdap::{CdapMessage, OpCode};

/// Result of an `M_CONNECT_R` refusing a session: this IPCP is no member.
pub const RESULT_NOT_MEMBER: i32 = -1;

impl MgmtRib {
    /// Whether neighbours need an open session for messages other than
    /// enrollment, hellos and port authentication.
    pub fn set_require_sessions(&mut self, on: bool) {
        self.require_sessions = on;
    }

    /// Whether messages of `peer` are taken: a member at an address (end to
    /// end), sessions not required, or the neighbour's session is open.
    pub fn is_open(&self, peer: Peer) -> bool {
        match peer {
            Peer::Remote(_) => true,
            Peer::Neighbor(_) => {
                !self.require_sessions
                    || self
                        .sessions
                        .get(&peer)
                        .is_some_and(|s| s.state == SessionState::Open)
            }
        }
    }

    /// The state of the session with `peer` (idle if there is none).
    pub fn state(&self, peer: Peer) -> SessionState {
        self.sessions
            .get(&peer)
            .map(|s| s.state)
            .unwrap_or_default()
    }

    /// The session with `peer` is open: the enrollment's `M_CONNECT`
    /// succeeded (this IPCP accepted an enrollee's, or its own was
    /// accepted).
    pub fn opened(&mut self, now: Instant, peer: Peer) {
        let s = self.session_mut(now, peer);
        if s.state != SessionState::Open {
            s.state = SessionState::Open;
            self.counters.sessions_opened += 1;
        }
    }

    /// The neighbour is gone: the session is closed (its counters are
    /// kept; what it had outstanding is forgotten).
    pub fn closed(&mut self, peer: Peer) {
        if let Some(s) = self.sessions.get_mut(&peer) {
            s.state = SessionState::Idle;
            s.outstanding.clear();
            s.connect_id = None;
        }
    }

    /// Opens the session with `peer` by sending `connect` (an `M_CONNECT`),
    /// unless it is open. Returns the message to send (with its invoke
    /// id); a repeated call replaces the previous attempt.
    pub fn connect(
        &mut self,
        now: Instant,
        peer: Peer,
        connect: CdapMessage,
    ) -> Option<CdapMessage> {
        if self.state(peer) == SessionState::Open {
            return None;
        }
        if let Some(old) = self
            .sessions
            .get_mut(&peer)
            .and_then(|s| s.connect_id.take())
        {
            self.settle(peer, old);
        }
        let mut msg = connect;
        msg.invoke_id = None;
        let msg = self.request(now, peer, OwnerId::RIB_DAEMON, msg);
        let s = self.session_mut(now, peer);
        s.state = SessionState::Connecting;
        s.connect_id = msg.invoke_id;
        Some(msg)
    }

    /// The component message `msg` from `peer` is for: the owner of its
    /// object for a request, the component whose request it answers (or
    /// the owner of its object, for a late answer) for a response; an
    /// `M_CONNECT` is the enrollment's when it comes from an enrollee and
    /// the daemon's (the session) otherwise, like `M_RELEASE`.
    pub fn owner_for(&self, peer: Peer, msg: &CdapMessage, from_enrollee: bool) -> Option<OwnerId> {
        let op = msg.op_code();
        match op {
            OpCode::Connect if from_enrollee => Some(OwnerId::ENROLLMENT),
            OpCode::Connect | OpCode::Release | OpCode::ReleaseR => Some(OwnerId::RIB_DAEMON),
            _ if op.is_response() => {
                let waiting = self
                    .sessions
                    .get(&peer)
                    .and_then(|s| s.outstanding.get(&msg.invoke_id?))
                    .filter(|o| op.request() == Some(o.op))
                    .map(|o| o.owner);
                waiting.or_else(|| self.object_owner(msg))
            }
            _ => self.object_owner(msg),
        }
    }

    fn object_owner(&self, msg: &CdapMessage) -> Option<OwnerId> {
        let name = msg.obj_name.as_deref()?;
        self.daemon.owner_of(name).map(|(_, s)| s.owner)
    }

    /// [`MgmtRib::take`] behind the gates of the module documentation.
    pub fn take_gated(
        &mut self,
        now: Instant,
        peer: Peer,
        msg: CdapMessage,
        gate: Gate,
    ) -> Verdict {
        let owner = self.owner_for(peer, &msg, gate.from_enrollee);
        let is = |set: &[OwnerId]| owner.is_some_and(|o| set.contains(&o));
        if !gate.admitted && !is(&PRE_ADMISSION) {
            return Verdict::Unadmitted;
        }
        let op = msg.op_code();
        if owner == Some(OwnerId::RIB_DAEMON)
            && matches!(
                op,
                OpCode::Connect | OpCode::ConnectR | OpCode::Release | OpCode::ReleaseR
            )
        {
            self.session_message(now, peer, msg, gate.member);
            return Verdict::Taken;
        }
        if !is(&SESSIONLESS) && !self.is_open(peer) {
            self.counters.refused_no_session += 1;
            if !op.is_response() && msg.invoke_id.is_some() {
                let why = "no open CDAP session with this IPCP: M_CONNECT first";
                if let Ok(r) = CdapMessage::response_to(&msg, RESULT_NO_SESSION, why) {
                    self.replies.push_back((peer, r));
                }
            }
            return Verdict::NoSession;
        }
        if op == OpCode::Connect {
            // An enrollee's: for the enrollment task.
            let s = self.session_mut(now, peer);
            s.counters.rx_requests += 1;
            let owner = OwnerId::ENROLLMENT;
            self.inbound.push_back(Inbound { owner, peer, msg });
            return Verdict::Taken;
        }
        self.take(now, peer, msg);
        Verdict::Taken
    }

    /// `M_CONNECT`, `M_CONNECT_R`, `M_RELEASE`, `M_RELEASE_R` of a member's
    /// session with this IPCP.
    fn session_message(&mut self, now: Instant, peer: Peer, msg: CdapMessage, member: bool) {
        let op = msg.op_code();
        match op {
            OpCode::Connect => {
                self.session_mut(now, peer).counters.rx_requests += 1;
                let (result, why) = if member {
                    self.opened(now, peer);
                    (0, "")
                } else {
                    (RESULT_NOT_MEMBER, "not a member of the DIF yet")
                };
                if let Ok(r) = CdapMessage::response_to(&msg, result, why) {
                    self.replies.push_back((peer, r));
                }
            }
            OpCode::ConnectR => {
                let ours = self
                    .sessions
                    .get(&peer)
                    .is_some_and(|s| s.connect_id.is_some() && s.connect_id == msg.invoke_id);
                let accepted = ours && msg.result.unwrap_or(0) == 0;
                self.take(now, peer, msg);
                // `take` gave it to the daemon, which waits for nothing.
                while self
                    .inbound
                    .back()
                    .is_some_and(|i| i.owner == OwnerId::RIB_DAEMON)
                {
                    self.inbound.pop_back();
                }
                if accepted {
                    if let Some(s) = self.sessions.get_mut(&peer) {
                        s.connect_id = None;
                    }
                    self.opened(now, peer);
                }
            }
            OpCode::Release => {
                self.session_mut(now, peer).counters.rx_requests += 1;
                self.closed(peer);
                if msg.invoke_id.is_some() {
                    if let Ok(r) = CdapMessage::response_to(&msg, 0, "") {
                        self.replies.push_back((peer, r));
                    }
                }
            }
            _ => {
                // M_RELEASE_R: nothing waits for it.
            }
        }
    }
}
