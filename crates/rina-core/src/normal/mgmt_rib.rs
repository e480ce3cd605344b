//! The RIB daemon of the normal IPCP: the one path of its CDAP management
//! messages.
//!
//! Every CDAP message that arrives for this IPCP (a management payload
//! starting with [`CDAP_DISCRIMINATOR`](super::CDAP_DISCRIMINATOR)) is
//! decoded once and handed to [`MgmtRib::take`]:
//!
//! * an **object request** (`M_CREATE`, `M_DELETE`, `M_READ`, `M_WRITE`,
//!   ...) goes to the [`RibDaemon`], where each component registered the
//!   objects it owns and the operations it allows on them
//!   ([`MgmtRib::new`]): flow objects (`/fa/flows`, create and delete) to
//!   the flow allocator, the flow-state objects (write and create) to
//!   routing, the directory forwarding table (write and create) to the
//!   namespace manager, and reads of any object to the RIB reader (under
//!   the DIF's access policy). The daemon refuses, with a result and a
//!   reason naming the object, a request on an object nobody owns, an
//!   operation its owner does not allow, an invalid name;
//! * a **response** goes to the component that asked: each peer has a
//!   [`Session`] that gives requests their invoke ids and remembers which
//!   component waits for which ([`MgmtRib::request`]). An answer to nothing
//!   outstanding (a repeated or late one) goes to the owner of its object
//!   if that owner allows the request it answers (the flow allocator
//!   repairs an acceptance that came after it gave up), and is otherwise
//!   counted and dropped;
//! * **session messages** (`M_CONNECT`, `M_CONNECT_R`, `M_RELEASE`,
//!   `M_RELEASE_R`): an enrollee's `M_CONNECT` (from address 0) and the
//!   answer to this IPCP's own enrollment `M_CONNECT` go to the enrollment
//!   task; between members they open and close the session with a
//!   neighbour here ([`MgmtRib::connect`], [`SessionState`]).
//!
//! A session is kept per peer ([`Peer`]): the neighbour on an N-1 port for
//! the objects exchanged between neighbours (routing, the directory, RIB
//! reads, enrollment, hellos, port authentication), and the member at an
//! address for flow objects, which travel end to end.
//!
//! # Gates
//!
//! [`MgmtRib::take_gated`] applies, by the component a message is for (the
//! owner of its object, or the component whose request it answers), the two
//! rules of the normal IPCP:
//!
//! * from a neighbour not admitted (a DIF that authenticates, before
//!   enrollment or port authentication), only messages for the enrollment
//!   task and the security manager pass ([`PRE_ADMISSION`]); the rest is
//!   dropped ([`Verdict::Unadmitted`]);
//! * with sessions required (membership on), a neighbour's message for
//!   another component than those and the hellos ([`SESSIONLESS`]) needs a
//!   session opened with `M_CONNECT` / `M_CONNECT_R`: otherwise a request
//!   is refused with [`RESULT_NO_SESSION`] and anything else dropped, both
//!   counted ([`MgmtCounters::refused_no_session`]). Sessions with members
//!   at an address (flow objects, end to end) need no opening: every hop on
//!   the way admitted its neighbour.

use super::N1Port;
use crate::rib::daemon::{Ops, RibDaemon, RibEvent, SessionId};
use crate::rib::{DaemonConfig, OwnerId, ReadPolicy};
use crate::rmt::Address;
use crate::time::Instant;
use rina_wire::cdap::{CdapMessage, InvokeId, OpCode};
use std::collections::{BTreeMap, VecDeque};

/// Most sessions kept; the least recently used one without outstanding
/// requests makes room for a new one (a neighbour's only for another
/// neighbour's, see `MgmtRib::evict`).
pub const MAX_SESSIONS: usize = 4096;

/// Most requests of one session waiting for an answer; the oldest is
/// forgotten to make room.
pub const MAX_OUTSTANDING: usize = 1024;

/// Where a management message comes from or goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Peer {
    /// The neighbour at the other end of an N-1 port.
    Neighbor(N1Port),
    /// The member of the DIF at an address (reached through the RMT).
    Remote(Address),
}

/// Result of a request refused because the peer has no open session.
pub const RESULT_NO_SESSION: i32 = -8;

/// The components that take messages from a neighbour that is not admitted
/// yet: enrollment and port authentication.
pub const PRE_ADMISSION: [OwnerId; 2] = [OwnerId::ENROLLMENT, OwnerId::SECURITY_MANAGER];

/// The components that take a neighbour's messages without a session:
/// those of [`PRE_ADMISSION`] and the hellos (which bring the neighbour up).
pub const SESSIONLESS: [OwnerId; 3] = [
    OwnerId::ENROLLMENT,
    OwnerId::SECURITY_MANAGER,
    OwnerId::RESOURCE_ALLOCATOR,
];

/// Where the CDAP session with a neighbour is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionState {
    /// No `M_CONNECT` exchanged (or released, or the neighbour went down).
    #[default]
    Idle,
    /// Our `M_CONNECT` waits for its `M_CONNECT_R`.
    Connecting,
    /// Opened: by an `M_CONNECT` we accepted or an `M_CONNECT_R` that
    /// accepted ours (enrollment's included).
    Open,
}

impl SessionState {
    /// The name shown in the RIB.
    pub fn name(self) -> &'static str {
        match self {
            SessionState::Idle => "idle",
            SessionState::Connecting => "connecting",
            SessionState::Open => "open",
        }
    }
}

/// What the IPCP knows of a message's sender when it hands it to
/// [`MgmtRib::take_gated`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    /// The neighbour is admitted (or admission is not required).
    pub admitted: bool,
    /// The message came from address 0: an IPCP that is enrolling.
    pub from_enrollee: bool,
    /// This IPCP is a member (has an address): it accepts `M_CONNECT`s.
    pub member: bool,
}

impl Gate {
    /// No restriction: admitted, from a member, to a member.
    pub const OPEN: Gate = Gate {
        admitted: true,
        from_enrollee: false,
        member: true,
    };
}

/// What [`MgmtRib::take_gated`] did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Taken: dispatched, answered or counted by the daemon.
    Taken,
    /// Dropped: the neighbour is not admitted and the message is for none
    /// of the [`PRE_ADMISSION`] components (the caller counts it).
    Unadmitted,
    /// Refused or dropped: no open session with the neighbour (counted in
    /// [`MgmtCounters::refused_no_session`]).
    NoSession,
}

/// A request this IPCP sent, waiting for its answer.
#[derive(Debug, Clone, Copy)]
struct Outstanding {
    owner: OwnerId,
    op: OpCode,
}

/// The CDAP session with one peer: invoke ids and outstanding requests.
#[derive(Debug)]
pub struct Session {
    next_invoke: InvokeId,
    outstanding: BTreeMap<InvokeId, Outstanding>,
    last_used: Instant,
    /// Where its opening is (neighbours only).
    pub state: SessionState,
    /// Invoke id of our last `M_CONNECT`.
    connect_id: Option<InvokeId>,
    /// Messages received and sent on it.
    pub counters: SessionCounters,
}

/// Counters of one session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionCounters {
    /// Object requests received.
    pub rx_requests: u64,
    /// Responses received that answered an outstanding request.
    pub rx_responses: u64,
    /// Responses received that answered nothing outstanding.
    pub rx_unmatched: u64,
    /// Requests sent (confirmed or not).
    pub tx_requests: u64,
}

impl Session {
    fn new(now: Instant) -> Self {
        Session {
            next_invoke: 1,
            outstanding: BTreeMap::new(),
            last_used: now,
            state: SessionState::Idle,
            connect_id: None,
            counters: SessionCounters::default(),
        }
    }

    fn fresh_invoke(&mut self) -> InvokeId {
        loop {
            let id = self.next_invoke;
            self.next_invoke = if id >= i32::MAX - 1 { 1 } else { id + 1 };
            if !self.outstanding.contains_key(&id) {
                return id;
            }
        }
    }

    /// Requests waiting for an answer.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }
}

/// A message for a component of the IPCP.
#[derive(Debug, Clone, PartialEq)]
pub struct Inbound {
    /// The component.
    pub owner: OwnerId,
    /// Who sent it.
    pub peer: Peer,
    /// The message.
    pub msg: CdapMessage,
}

/// Counters of the IPCP's RIB daemon beyond the [`RibDaemon`]'s own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MgmtCounters {
    /// Responses that answered nothing outstanding and no owner took.
    pub rx_unmatched: u64,
    /// Messages that are neither object requests nor responses.
    pub rx_not_object: u64,
    /// Sessions dropped to make room for others.
    pub sessions_evicted: u64,
    /// A neighbour's messages refused or dropped for lack of an open
    /// session.
    pub refused_no_session: u64,
    /// Sessions opened with neighbours.
    pub sessions_opened: u64,
}

/// The IPCP's RIB daemon: object owners, per-peer sessions. See the module
/// documentation.
#[derive(Debug)]
pub struct MgmtRib {
    daemon: RibDaemon,
    ids: BTreeMap<Peer, SessionId>,
    peers: BTreeMap<SessionId, Peer>,
    sessions: BTreeMap<Peer, Session>,
    next_id: SessionId,
    inbound: VecDeque<Inbound>,
    /// Answers of the daemon itself (session messages, refusals for lack
    /// of a session).
    replies: VecDeque<(Peer, CdapMessage)>,
    /// Whether neighbours need an open session (see [`MgmtRib::take_gated`]).
    require_sessions: bool,
    counters: MgmtCounters,
}

/// Flow objects: created and deleted by the flow allocator of the peer.
pub const FLOWS_PREFIX: &str = rina_wire::fa::FLOWS_PATH;

impl MgmtRib {
    /// The daemon with the objects of the normal IPCP registered: flow
    /// objects, flow-state objects, the directory forwarding table, the
    /// enrollment objects (`/difm/enr`, `/difm/ops`, `/dt`, and the
    /// directory entries an enroller creates, `/difm/nsm/dft`), the hello
    /// (`/difm/enr/hello`), port authentication (`/difm/auth`), and reads
    /// of everything.
    pub fn new() -> Self {
        let mut daemon = RibDaemon::new(DaemonConfig::default());
        let owned = [
            (
                FLOWS_PREFIX,
                OwnerId::FLOW_ALLOCATOR,
                Ops::of(&[OpCode::Create, OpCode::Delete, OpCode::Read]),
            ),
            (
                crate::routing::FSOS_OBJ_NAME,
                OwnerId::ROUTING,
                Ops::of(&[OpCode::Write, OpCode::Create, OpCode::Read]),
            ),
            (
                crate::directory::DFT_OBJ_NAME,
                OwnerId::NAMESPACE_MANAGER,
                Ops::of(&[OpCode::Write, OpCode::Create, OpCode::Read]),
            ),
            (
                crate::rib::ROOT,
                OwnerId::RIB_DAEMON,
                Ops::of(&[OpCode::Read]),
            ),
            (
                crate::enrollment::OBJ_ENROLLMENT,
                OwnerId::ENROLLMENT,
                Ops::of(&[OpCode::Start, OpCode::Stop, OpCode::Create, OpCode::Read]),
            ),
            (
                crate::enrollment::OBJ_OPERATIONAL,
                OwnerId::ENROLLMENT,
                Ops::of(&[OpCode::Start, OpCode::Read]),
            ),
            (
                crate::enrollment::OBJ_DATA_TRANSFER,
                OwnerId::ENROLLMENT,
                Ops::of(&[OpCode::Create, OpCode::Read]),
            ),
            (
                crate::enrollment::OBJ_DIRECTORY,
                OwnerId::ENROLLMENT,
                Ops::of(&[OpCode::Create, OpCode::Read]),
            ),
            (
                super::membership::HELLO_OBJ_NAME,
                OwnerId::RESOURCE_ALLOCATOR,
                Ops::of(&[OpCode::Write, OpCode::Read]),
            ),
            (
                super::membership::PORT_AUTH_PREFIX,
                OwnerId::SECURITY_MANAGER,
                Ops::of(&[OpCode::Write]),
            ),
        ];
        for (prefix, owner, ops) in owned {
            // Valid names, each subscribed once.
            let _ = daemon.subscribe_ops(prefix, owner, ReadPolicy::Owner, ops);
        }
        MgmtRib {
            daemon,
            ids: BTreeMap::new(),
            peers: BTreeMap::new(),
            sessions: BTreeMap::new(),
            next_id: 1,
            inbound: VecDeque::new(),
            replies: VecDeque::new(),
            require_sessions: false,
            counters: MgmtCounters::default(),
        }
    }

    /// The RIB daemon (subscriptions, counters).
    pub fn daemon(&self) -> &RibDaemon {
        &self.daemon
    }

    /// The counters.
    pub fn counters(&self) -> &MgmtCounters {
        &self.counters
    }

    /// The session with `peer`, if there is one.
    pub fn session(&self, peer: Peer) -> Option<&Session> {
        self.sessions.get(&peer)
    }

    /// The sessions, in peer order.
    pub fn sessions(&self) -> impl Iterator<Item = (&Peer, &Session)> + '_ {
        self.sessions.iter()
    }

    /// The peer message `msg` from `src` (on `port`) comes from: the member
    /// at `src` for flow objects (end to end), else the neighbour on `port`
    /// (reads of any object included).
    pub fn peer_of(&self, msg: &CdapMessage, port: Option<N1Port>, src: Address) -> Peer {
        let read = matches!(
            msg.op_code(),
            OpCode::Read | OpCode::ReadR | OpCode::CancelRead | OpCode::CancelReadR
        );
        let end_to_end = !read
            && self
                .daemon
                .owner_of(msg.obj_name())
                .is_some_and(|(_, s)| s.owner == OwnerId::FLOW_ALLOCATOR);
        match port {
            Some(p) if !end_to_end => Peer::Neighbor(p),
            _ => Peer::Remote(src),
        }
    }

    fn session_mut(&mut self, now: Instant, peer: Peer) -> &mut Session {
        if !self.sessions.contains_key(&peer) && self.sessions.len() >= MAX_SESSIONS {
            self.evict(peer);
        }
        let s = self
            .sessions
            .entry(peer)
            .or_insert_with(|| Session::new(now));
        s.last_used = now;
        s
    }

    /// Drops the least recently used session, preferring one with nothing
    /// outstanding, to make room for `new`'s. A session with a member at an
    /// address (whatever address a message names; they need no opening)
    /// only ever replaces another such: a neighbour's, opened with
    /// `M_CONNECT` and one per N-1 port, is never lost to them (its next
    /// requests would be refused until it connected again).
    fn evict(&mut self, new: Peer) {
        let far = |p: &Peer| matches!(p, Peer::Remote(_));
        let victim = self
            .sessions
            .iter()
            .filter(|(p, _)| far(p) || !far(&new))
            .min_by_key(|(p, s)| (!far(p), !s.outstanding.is_empty(), s.last_used, **p))
            .map(|(p, _)| *p);
        if let Some(p) = victim {
            self.close(p);
            self.counters.sessions_evicted += 1;
        }
    }

    fn id_of(&mut self, peer: Peer) -> SessionId {
        if let Some(id) = self.ids.get(&peer) {
            return *id;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.ids.insert(peer, id);
        self.peers.insert(id, peer);
        id
    }

    /// Sends request `msg` of `owner` to `peer`: it gets the session's next
    /// invoke id unless it has one (a repeated request keeps its id), and
    /// its answer will go to `owner`. Returns the message to send.
    pub fn request(
        &mut self,
        now: Instant,
        peer: Peer,
        owner: OwnerId,
        mut msg: CdapMessage,
    ) -> CdapMessage {
        let s = self.session_mut(now, peer);
        s.counters.tx_requests += 1;
        let id = match msg.invoke_id {
            Some(id) => id,
            None => s.fresh_invoke(),
        };
        msg.invoke_id = Some(id);
        if !s.outstanding.contains_key(&id) && s.outstanding.len() >= MAX_OUTSTANDING {
            s.outstanding.pop_first();
        }
        let op = msg.op_code();
        s.outstanding.insert(id, Outstanding { owner, op });
        msg
    }

    /// Counts an unconfirmed request (no invoke id, no answer) to `peer`.
    pub fn unconfirmed(&mut self, now: Instant, peer: Peer) {
        self.session_mut(now, peer).counters.tx_requests += 1;
    }

    /// The owner of request `invoke_id` to `peer` no longer waits for its
    /// answer (it gave up, or starts again with another id).
    pub fn settle(&mut self, peer: Peer, invoke_id: InvokeId) {
        if let Some(s) = self.sessions.get_mut(&peer) {
            s.outstanding.remove(&invoke_id);
        }
    }

    /// The peer is gone: its session, with what it had outstanding and the
    /// requests of it that wait, is dropped.
    pub fn close(&mut self, peer: Peer) {
        self.sessions.remove(&peer);
        if let Some(id) = self.ids.remove(&peer) {
            self.peers.remove(&id);
            self.daemon.session_closed(id);
        }
    }

    /// A CDAP message arrived from `peer`; what is for a component comes
    /// out of [`MgmtRib::poll_inbound`], the daemon's refusals out of
    /// [`MgmtRib::poll_transmit`].
    pub fn take(&mut self, now: Instant, peer: Peer, msg: CdapMessage) {
        let op = msg.op_code();
        if op.is_response() {
            self.take_response(now, peer, msg);
            return;
        }
        let id = self.id_of(peer);
        self.session_mut(now, peer).counters.rx_requests += 1;
        if self.daemon.on_request(id, msg).is_err() {
            // M_CONNECT, M_RELEASE: not an object request.
            self.counters.rx_not_object += 1;
        }
        while let Some(ev) = self.daemon.poll_event() {
            match ev {
                RibEvent::Request {
                    owner,
                    from,
                    invoke_id,
                    msg,
                } => {
                    // Components answer on their own (repeated requests
                    // included): the daemon does not wait for them.
                    if let Some(i) = invoke_id {
                        self.daemon.forget(from, i);
                    }
                    let peer = self.peers.get(&from).copied().unwrap_or(peer);
                    self.inbound.push_back(Inbound { owner, peer, msg });
                }
                RibEvent::Cancelled { .. } => {}
            }
        }
    }

    fn take_response(&mut self, now: Instant, peer: Peer, msg: CdapMessage) {
        let op = msg.op_code();
        let s = self.session_mut(now, peer);
        let matched = msg.invoke_id.and_then(|i| {
            let o = *s
                .outstanding
                .get(&i)
                .filter(|o| request_of(op) == Some(o.op))?;
            if !msg.is_incomplete() {
                s.outstanding.remove(&i);
            }
            Some(o.owner)
        });
        if let Some(owner) = matched {
            s.counters.rx_responses += 1;
            self.inbound.push_back(Inbound { owner, peer, msg });
            return;
        }
        s.counters.rx_unmatched += 1;
        // A late answer: for the object's owner if it takes the request.
        let late = request_of(op).and_then(|req| {
            let (_, sub) = self.daemon.owner_of(msg.obj_name.as_deref()?)?;
            (sub.ops.allows(req) && req != OpCode::Read).then_some(sub.owner)
        });
        match late {
            Some(owner) => self.inbound.push_back(Inbound { owner, peer, msg }),
            None => self.counters.rx_unmatched += 1,
        }
    }

    /// The next message for a component.
    pub fn poll_inbound(&mut self) -> Option<Inbound> {
        self.inbound.pop_front()
    }

    /// The next refusal of the daemon to send, and to whom.
    pub fn poll_transmit(&mut self) -> Option<(Peer, CdapMessage)> {
        if let Some(r) = self.replies.pop_front() {
            return Some(r);
        }
        while let Some((id, msg)) = self.daemon.poll_transmit() {
            if let Some(peer) = self.peers.get(&id) {
                return Some((*peer, msg));
            }
        }
        None
    }
}

impl Default for MgmtRib {
    fn default() -> Self {
        MgmtRib::new()
    }
}

/// The request a response answers.
fn request_of(op: OpCode) -> Option<OpCode> {
    Some(match op {
        OpCode::CreateR => OpCode::Create,
        OpCode::DeleteR => OpCode::Delete,
        OpCode::ReadR => OpCode::Read,
        OpCode::WriteR => OpCode::Write,
        OpCode::StartR => OpCode::Start,
        OpCode::StopR => OpCode::Stop,
        OpCode::ConnectR => OpCode::Connect,
        OpCode::ReleaseR => OpCode::Release,
        _ => return None,
    })
}

mod gate;
#[cfg(test)]
mod tests;
