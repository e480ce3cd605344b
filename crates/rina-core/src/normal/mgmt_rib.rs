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
//! * anything else (`M_CONNECT`, `M_RELEASE`, ...) is counted and dropped:
//!   application connections are the enrollment's, on its own channel.
//!
//! A session is kept per peer ([`Peer`]): the neighbour on an N-1 port for
//! the objects exchanged between neighbours (routing, the directory, RIB
//! reads), and the member at an address for flow objects, which travel end
//! to end.

use super::N1Port;
use crate::rib::daemon::{Ops, RibDaemon, RibEvent, SessionId};
use crate::rib::{DaemonConfig, OwnerId, ReadPolicy};
use crate::rmt::Address;
use crate::time::Instant;
use rina_wire::cdap::{CdapMessage, InvokeId, OpCode};
use std::collections::{BTreeMap, VecDeque};

/// Most sessions kept; the least recently used one without outstanding
/// requests makes room for a new one.
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
    counters: MgmtCounters,
}

/// Flow objects: created and deleted by the flow allocator of the peer.
pub const FLOWS_PREFIX: &str = rina_wire::fa::FLOWS_PATH;

impl MgmtRib {
    /// The daemon with the objects of the normal IPCP registered: flow
    /// objects, flow-state objects, the directory forwarding table, and
    /// reads of everything.
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
            self.evict();
        }
        let s = self
            .sessions
            .entry(peer)
            .or_insert_with(|| Session::new(now));
        s.last_used = now;
        s
    }

    /// Drops the least recently used session, preferring one with nothing
    /// outstanding.
    fn evict(&mut self) {
        let victim = self
            .sessions
            .iter()
            .min_by_key(|(p, s)| (!s.outstanding.is_empty(), s.last_used, **p))
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
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
