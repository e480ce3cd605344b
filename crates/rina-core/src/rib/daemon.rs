//! The RIB daemon: dispatches peers' CDAP requests on RIB objects to the
//! component that owns them, as a sans-IO machine.
//!
//! Components say which part of the name space they own with
//! [`RibDaemon::subscribe`] (a prefix, matched segment by segment:
//! `/difm/enr` owns `/difm/enr` and `/difm/enr/neighs/pn=x`, not
//! `/difm/enr-x`). The driver (the IPCP, which holds one CDAP
//! [`Session`](crate::cdap_session::Session) per N-1 management flow) feeds
//! every object request of a peer to [`RibDaemon::on_request`] with the id of
//! the session it came on. The daemon
//!
//! * answers at once, with a result other than 0 and a reason naming the
//!   object, what it cannot dispatch: an invalid name, a name nobody owns,
//!   too many requests waiting;
//! * answers M_READ itself, from the tree, when the owner subscribed with
//!   [`ReadPolicy::Daemon`], and when the object exists but nobody owns it
//!   (containers, the root: so the whole RIB can be read). Objects of owners
//!   that did not allow daemon reads are left out of such answers;
//! * queues everything else as [`RibEvent::Request`] for the owner, who
//!   answers with [`RibDaemon::respond`].
//!
//! Responses come out of [`RibDaemon::poll_transmit`] as (session, message)
//! pairs, for the driver to hand to that session's `respond`. An M_READ_R
//! larger than [`DaemonConfig::max_read_part`] bytes is split: one part per
//! object, and the value of an object too big for one part cut over several
//! consecutive parts with the same object name (bytes and strings only;
//! [`reassemble_read`] joins them). Every part but the last carries
//! `F_RD_INCOMPLETE`. This is where IRATI's "management PDU too large" is
//! avoided for reads: no single answer exceeds the configured size.

use super::{ancestors, validate_name, Config, ObjValue, OwnerId, Rib, RibError};
use rina_wire::cdap::prost::Message;
use rina_wire::cdap::{CdapMessage, Flags, InvokeId, ObjVal, OpCode};
use std::collections::{BTreeMap, HashMap, VecDeque};
use thiserror::Error;

/// Identifies the CDAP session (N-1 management flow, or local client) a
/// request came on. Chosen by the driver.
pub type SessionId = u64;

/// Result code: no component owns the object.
pub const RESULT_NO_OWNER: i32 = -2;
/// Result code: the object name is not valid.
pub const RESULT_BAD_NAME: i32 = -3;
/// Result code: the object does not exist (daemon-answered reads).
pub const RESULT_NOT_FOUND: i32 = -4;
/// Result code: too many requests are waiting; try again later.
pub const RESULT_BUSY: i32 = -5;
/// Result code: the request is malformed (e.g. a negative scope).
pub const RESULT_BAD_REQUEST: i32 = -6;
/// Result code: the object's owner does not allow this operation on it.
pub const RESULT_NOT_ALLOWED: i32 = -7;

/// Bytes a value part may grow by through its two length prefixes; keeps
/// parts under [`DaemonConfig::max_read_part`] for values up to 256 MiB.
const LEN_SLACK: usize = 8;

/// Configuration of the RIB daemon.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Limits of the RIB.
    pub rib: Config,
    /// Largest encoded M_READ_R, in bytes; larger answers are split.
    pub max_read_part: usize,
    /// Most requests waiting for their owner's answer (all sessions).
    pub max_pending: usize,
    /// Most events waiting for [`RibDaemon::poll_event`].
    pub max_events: usize,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            rib: Config::default(),
            max_read_part: 1400,
            max_pending: 1024,
            max_events: 1024,
        }
    }
}

/// Who answers M_READ on a subscribed prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReadPolicy {
    /// The owner gets the request like any other.
    Owner,
    /// The RIB daemon answers from the tree; the owner never sees reads.
    Daemon,
}

/// The object requests an owner allows on its objects (a set of opcodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ops(u32);

impl Ops {
    /// Every object request.
    pub const ALL: Ops = Ops(u32::MAX);

    /// Exactly these operations.
    pub fn of(ops: &[OpCode]) -> Self {
        Ops(ops.iter().fold(0, |m, op| m | Self::bit(*op)))
    }

    /// Whether `op` is allowed.
    pub fn allows(self, op: OpCode) -> bool {
        self.0 & Self::bit(op) != 0
    }

    fn bit(op: OpCode) -> u32 {
        1u32.checked_shl(op as u32).unwrap_or(0)
    }
}

/// One subscription: the owner of a prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Subscription {
    /// The component.
    pub owner: OwnerId,
    /// Who answers reads.
    pub reads: ReadPolicy,
    /// The requests the owner takes; others are refused with
    /// [`RESULT_NOT_ALLOWED`].
    pub ops: Ops,
}

/// Something a component must handle.
// Nearly every event is a Request, so boxing its message would only add an
// allocation per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum RibEvent {
    /// A peer's request on an object `owner` owns. If `invoke_id` is set,
    /// answer with [`RibDaemon::respond`]; otherwise the peer wants no answer.
    Request {
        /// The component that owns the object.
        owner: OwnerId,
        /// The session the request came on.
        from: SessionId,
        /// Its invoke id.
        invoke_id: Option<InvokeId>,
        /// The request.
        msg: CdapMessage,
    },
    /// The peer cancelled read `invoke_id` before `owner` answered it; no
    /// answer is expected any more.
    Cancelled {
        /// The component that had the read.
        owner: OwnerId,
        /// The session.
        from: SessionId,
        /// The invoke id of the read.
        invoke_id: InvokeId,
    },
}

/// A component's answer to a request ([`RibDaemon::respond`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reply {
    /// 0 for success.
    pub result: i32,
    /// Why it failed (empty on success).
    pub reason: String,
    /// The object value to send back (M_READ_R, or any response that carries one).
    pub value: ObjValue,
}

impl Reply {
    /// Success without a value.
    pub fn ok() -> Self {
        Reply::default()
    }

    /// Success with `value`.
    pub fn with_value(value: ObjValue) -> Self {
        Reply {
            value,
            ..Reply::default()
        }
    }

    /// Failure `result` (not 0) because of `reason`.
    pub fn error(result: i32, reason: impl Into<String>) -> Self {
        Reply {
            result,
            reason: reason.into(),
            value: ObjValue::None,
        }
    }
}

/// Why an API call of the RIB daemon failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DaemonError {
    /// [`RibDaemon::on_request`] was given a message that is not an object
    /// request (M_CONNECT, M_RELEASE, a response): the session handles those.
    #[error("{0} is not a request on a RIB object")]
    NotAnObjectRequest(OpCode),
    /// No request of this session with this invoke id waits for an answer.
    #[error("no request {invoke_id} of session {from} waits for an answer")]
    UnknownRequest {
        /// The session.
        from: SessionId,
        /// The invoke id.
        invoke_id: InvokeId,
    },
    /// Another component owns this prefix already.
    #[error("prefix {prefix} is owned by {owner} already")]
    PrefixTaken {
        /// The prefix.
        prefix: String,
        /// Its owner.
        owner: OwnerId,
    },
    /// Nobody subscribed to this prefix.
    #[error("nobody subscribed to prefix {0}")]
    NotSubscribed(String),
    /// The prefix is not a valid object name.
    #[error(transparent)]
    Rib(#[from] RibError),
}

/// Counters of the RIB daemon.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DaemonCounters {
    /// Object requests given to [`RibDaemon::on_request`].
    pub rx_requests: u64,
    /// Requests queued for their owner.
    pub dispatched: u64,
    /// Reads answered by the daemon from the tree.
    pub daemon_reads: u64,
    /// M_READ_R parts sent for daemon reads and owners' read answers.
    pub read_parts: u64,
    /// Requests refused because nobody owns the object.
    pub refused_no_owner: u64,
    /// Requests refused because the name is invalid.
    pub refused_bad_name: u64,
    /// Requests refused because the owner does not allow the operation.
    pub refused_not_allowed: u64,
    /// Requests refused because too many wait, or dropped (no invoke id).
    pub refused_busy: u64,
    /// Daemon reads of objects that do not exist, or with a negative scope.
    pub refused_other: u64,
    /// Requests reusing the invoke id of one still waiting (dropped).
    pub duplicate_requests: u64,
    /// Refusals not sent because the request had no invoke id.
    pub unanswerable: u64,
    /// M_CANCELREAD requests handled.
    pub cancelled_reads: u64,
    /// Answers of components sent.
    pub responses: u64,
}

/// A request waiting for its owner's answer.
#[derive(Debug)]
struct Pending {
    owner: OwnerId,
    /// The request without its value (to build the response).
    req: CdapMessage,
}

/// The RIB daemon of one IPC process, holding its [`Rib`]. See the module
/// documentation.
#[derive(Debug)]
pub struct RibDaemon {
    cfg: DaemonConfig,
    rib: Rib,
    subs: BTreeMap<String, Subscription>,
    pending: HashMap<(SessionId, InvokeId), Pending>,
    events: VecDeque<RibEvent>,
    transmit: VecDeque<(SessionId, CdapMessage)>,
    counters: DaemonCounters,
}

impl Default for RibDaemon {
    fn default() -> Self {
        RibDaemon::new(DaemonConfig::default())
    }
}

impl RibDaemon {
    /// A daemon with an empty RIB and no subscriptions.
    pub fn new(cfg: DaemonConfig) -> Self {
        RibDaemon {
            rib: Rib::new(cfg.rib.clone()),
            cfg,
            subs: BTreeMap::new(),
            pending: HashMap::new(),
            events: VecDeque::new(),
            transmit: VecDeque::new(),
            counters: DaemonCounters::default(),
        }
    }

    /// The RIB.
    pub fn rib(&self) -> &Rib {
        &self.rib
    }

    /// The RIB, for components to change their objects.
    pub fn rib_mut(&mut self) -> &mut Rib {
        &mut self.rib
    }

    /// The configuration.
    pub fn config(&self) -> &DaemonConfig {
        &self.cfg
    }

    /// The counters.
    pub fn counters(&self) -> &DaemonCounters {
        &self.counters
    }

    /// Number of requests waiting for their owner's answer.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Makes `owner` responsible for `prefix` and everything below it. The
    /// owner of the longest matching prefix gets a request. Subscribing the
    /// same owner again changes its read policy. Every operation is allowed
    /// (see [`RibDaemon::subscribe_ops`]).
    pub fn subscribe(
        &mut self,
        prefix: &str,
        owner: OwnerId,
        reads: ReadPolicy,
    ) -> Result<(), DaemonError> {
        self.subscribe_ops(prefix, owner, reads, Ops::ALL)
    }

    /// [`RibDaemon::subscribe`], allowing only the requests in `ops` on the
    /// objects under `prefix`; the daemon refuses the others with
    /// [`RESULT_NOT_ALLOWED`] (M_CANCELREAD goes with M_READ).
    pub fn subscribe_ops(
        &mut self,
        prefix: &str,
        owner: OwnerId,
        reads: ReadPolicy,
        ops: Ops,
    ) -> Result<(), DaemonError> {
        validate_name(prefix, &self.cfg.rib)?;
        match self.subs.get(prefix) {
            Some(s) if s.owner != owner => Err(DaemonError::PrefixTaken {
                prefix: prefix.to_string(),
                owner: s.owner,
            }),
            _ => {
                let sub = Subscription { owner, reads, ops };
                self.subs.insert(prefix.to_string(), sub);
                Ok(())
            }
        }
    }

    /// Removes the subscription of `prefix`. Requests already queued stay.
    pub fn unsubscribe(&mut self, prefix: &str) -> Result<Subscription, DaemonError> {
        self.subs
            .remove(prefix)
            .ok_or_else(|| DaemonError::NotSubscribed(prefix.to_string()))
    }

    /// The subscription responsible for `name` (longest matching prefix),
    /// with its prefix.
    pub fn owner_of(&self, name: &str) -> Option<(&str, Subscription)> {
        ancestors(name).find_map(|a| self.subs.get_key_value(a).map(|(k, s)| (k.as_str(), *s)))
    }

    /// Feeds one object request (M_CREATE, M_DELETE, M_READ, M_WRITE,
    /// M_START, M_STOP or M_CANCELREAD) a peer sent on session `from`. Errors
    /// only for other opcodes; a request that cannot be served is answered
    /// with an error result (see the module documentation).
    pub fn on_request(&mut self, from: SessionId, msg: CdapMessage) -> Result<(), DaemonError> {
        let op = msg.op_code();
        match op {
            OpCode::Create
            | OpCode::Delete
            | OpCode::Read
            | OpCode::Write
            | OpCode::Start
            | OpCode::Stop => {}
            OpCode::CancelRead => {
                self.on_cancel_read(from, &msg);
                return Ok(());
            }
            _ => return Err(DaemonError::NotAnObjectRequest(op)),
        }
        self.counters.rx_requests += 1;
        let name = msg.obj_name().to_string();
        if let Err(e) = validate_name(&name, &self.cfg.rib) {
            self.counters.refused_bad_name += 1;
            self.refuse(from, &msg, RESULT_BAD_NAME, &e.to_string());
            return Ok(());
        }
        let sub = self.owner_of(&name).map(|(_, s)| s);
        if op == OpCode::Read {
            let daemon_reads = match sub {
                Some(s) => s.reads == ReadPolicy::Daemon,
                None => self.rib.contains(&name),
            };
            if daemon_reads {
                self.answer_read(from, &msg);
                return Ok(());
            }
        }
        let Some(sub) = sub else {
            self.counters.refused_no_owner += 1;
            let reason = format!("no component owns {name}");
            self.refuse(from, &msg, RESULT_NO_OWNER, &reason);
            return Ok(());
        };
        if !sub.ops.allows(op) {
            self.counters.refused_not_allowed += 1;
            let reason = format!("{} does not allow {op:?} on {name}", sub.owner);
            self.refuse(from, &msg, RESULT_NOT_ALLOWED, &reason);
            return Ok(());
        }
        if let Some(id) = msg.invoke_id {
            if self.pending.contains_key(&(from, id)) {
                self.counters.duplicate_requests += 1;
                return Ok(());
            }
        }
        if self.pending.len() >= self.cfg.max_pending || self.events.len() >= self.cfg.max_events {
            self.counters.refused_busy += 1;
            let reason = format!("too many requests waiting; {name} not handled");
            self.refuse(from, &msg, RESULT_BUSY, &reason);
            return Ok(());
        }
        if let Some(id) = msg.invoke_id {
            let mut req = msg.clone();
            req.obj_value = None;
            req.filter = None;
            self.pending.insert(
                (from, id),
                Pending {
                    owner: sub.owner,
                    req,
                },
            );
        }
        self.counters.dispatched += 1;
        self.events.push_back(RibEvent::Request {
            owner: sub.owner,
            from,
            invoke_id: msg.invoke_id,
            msg,
        });
        Ok(())
    }

    /// Answers request `invoke_id` of session `from` with `reply`. A read
    /// answer too large for one part is split ([`DaemonConfig::max_read_part`]).
    pub fn respond(
        &mut self,
        from: SessionId,
        invoke_id: InvokeId,
        reply: Reply,
    ) -> Result<(), DaemonError> {
        let p = self
            .pending
            .remove(&(from, invoke_id))
            .ok_or(DaemonError::UnknownRequest { from, invoke_id })?;
        let Ok(base) = CdapMessage::response_to(&p.req, reply.result, &reply.reason) else {
            // Only requests are kept in `pending`.
            return Ok(());
        };
        self.counters.responses += 1;
        if base.op_code() == OpCode::ReadR {
            let parts = split_value(&base, &reply.value, self.cfg.max_read_part);
            self.queue_parts(from, vec![parts]);
        } else {
            let mut msg = base;
            msg.obj_value = reply.value.to_cdap();
            self.transmit.push_back((from, msg));
        }
        Ok(())
    }

    /// The owner answered request `invoke_id` of session `from` itself (or
    /// never will): the daemon stops waiting for it. Returns whether it
    /// waited.
    pub fn forget(&mut self, from: SessionId, invoke_id: InvokeId) -> bool {
        self.pending.remove(&(from, invoke_id)).is_some()
    }

    /// Session `from` is gone: forgets its waiting requests, its queued
    /// events and its unsent messages.
    pub fn session_closed(&mut self, from: SessionId) {
        self.pending.retain(|(s, _), _| *s != from);
        self.transmit.retain(|(s, _)| *s != from);
        self.events.retain(|e| match e {
            RibEvent::Request { from: s, .. } | RibEvent::Cancelled { from: s, .. } => *s != from,
        });
    }

    /// The next event for a component.
    pub fn poll_event(&mut self) -> Option<RibEvent> {
        self.events.pop_front()
    }

    /// The next message to send: hand it to session `.0`'s `respond`.
    pub fn poll_transmit(&mut self) -> Option<(SessionId, CdapMessage)> {
        self.transmit.pop_front()
    }

    fn refuse(&mut self, from: SessionId, req: &CdapMessage, result: i32, reason: &str) {
        if req.invoke_id.is_none() {
            self.counters.unanswerable += 1;
            return;
        }
        if let Ok(r) = CdapMessage::response_to(req, result, reason) {
            self.transmit.push_back((from, r));
        }
    }

    fn readable(&self, name: &str) -> bool {
        match self.owner_of(name) {
            Some((_, s)) => s.reads == ReadPolicy::Daemon,
            None => true,
        }
    }

    fn answer_read(&mut self, from: SessionId, req: &CdapMessage) {
        let name = req.obj_name();
        let scope = req.scope.unwrap_or(0);
        if scope < 0 {
            self.counters.refused_other += 1;
            let reason = format!("negative scope {scope} reading {name}");
            self.refuse(from, req, RESULT_BAD_REQUEST, &reason);
            return;
        }
        if !self.rib.contains(name) {
            self.counters.refused_other += 1;
            let reason = format!("no object {name}");
            self.refuse(from, req, RESULT_NOT_FOUND, &reason);
            return;
        }
        if req.invoke_id.is_none() {
            self.counters.unanswerable += 1;
            return;
        }
        self.counters.daemon_reads += 1;
        let depth = usize::try_from(scope).unwrap_or(usize::MAX);
        let mut all = Vec::new();
        for o in self.rib.iter_subtree_depth(name, depth) {
            if !self.readable(&o.name) {
                continue;
            }
            let mut base = CdapMessage::new(OpCode::ReadR)
                .with_obj_inst(i64::try_from(o.instance).unwrap_or(i64::MAX));
            base.invoke_id = req.invoke_id;
            base.obj_class = Some(o.class.clone());
            base.obj_name = Some(o.name.clone());
            base.result = Some(0);
            all.push(split_value(&base, &o.value, self.cfg.max_read_part));
        }
        self.queue_parts(from, all);
    }

    /// Queues the parts of one read answer, `F_RD_INCOMPLETE` on all but the
    /// last.
    fn queue_parts(&mut self, from: SessionId, objects: Vec<Vec<CdapMessage>>) {
        let mut parts: Vec<CdapMessage> = objects.into_iter().flatten().collect();
        let n = parts.len();
        for (i, p) in parts.iter_mut().enumerate() {
            if i + 1 < n {
                p.set_flags(Flags::RdIncomplete);
            }
        }
        self.counters.read_parts += n as u64;
        self.transmit.extend(parts.into_iter().map(|p| (from, p)));
    }

    fn on_cancel_read(&mut self, from: SessionId, msg: &CdapMessage) {
        let Some(id) = msg.invoke_id else {
            self.counters.unanswerable += 1;
            return;
        };
        self.counters.cancelled_reads += 1;
        let before = self.transmit.len();
        // Parts not handed out yet are dropped; the answer ends the read.
        self.transmit.retain(|(s, m)| {
            !(*s == from && m.invoke_id == Some(id) && m.op_code() == OpCode::ReadR)
        });
        let mut found = self.transmit.len() != before;
        if let Some(p) = self.pending.remove(&(from, id)) {
            found = true;
            self.events.push_back(RibEvent::Cancelled {
                owner: p.owner,
                from,
                invoke_id: id,
            });
        }
        let (result, reason) = if found {
            (0, String::new())
        } else {
            (RESULT_NOT_FOUND, format!("no read {id} in progress"))
        };
        if let Ok(r) = CdapMessage::response_to(msg, result, &reason) {
            self.transmit.push_back((from, r));
        }
    }
}

/// The M_READ_R parts that carry `value` with header `base`: one if it fits
/// in `max` bytes (counting an `F_RD_INCOMPLETE` flag), else bytes and
/// strings are cut over several (at least one byte / character each).
fn split_value(base: &CdapMessage, value: &ObjValue, max: usize) -> Vec<CdapMessage> {
    let mut whole = base.clone();
    whole.obj_value = value.to_cdap();
    let mut probe = whole.clone();
    probe.set_flags(Flags::RdIncomplete);
    if probe.encoded_len() <= max {
        return vec![whole];
    }
    let mut empty = base.clone();
    empty.set_flags(Flags::RdIncomplete);
    empty.obj_value = Some(ObjVal::from(Vec::new()));
    let room = max.saturating_sub(empty.encoded_len() + LEN_SLACK).max(1);
    let with = |v: ObjVal| {
        let mut m = base.clone();
        m.obj_value = Some(v);
        m
    };
    match value {
        ObjValue::Bytes(b) | ObjValue::Encoded { bytes: b, .. } => b
            .chunks(room)
            .map(|c| with(ObjVal::from(c.to_vec())))
            .collect(),
        ObjValue::Str(s) => {
            let mut out = Vec::new();
            let mut rest = s.as_str();
            while !rest.is_empty() {
                let mut cut = room.min(rest.len());
                while !rest.is_char_boundary(cut) {
                    cut -= 1;
                }
                if cut == 0 {
                    cut = rest.chars().next().map_or(rest.len(), char::len_utf8);
                }
                out.push(with(ObjVal::from(rest[..cut].to_string())));
                rest = &rest[cut..];
            }
            out
        }
        _ => vec![whole],
    }
}

/// One object of a read answer, as [`reassemble_read`] gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadObject {
    /// Class.
    pub class: String,
    /// Full name.
    pub name: String,
    /// Instance number.
    pub instance: i64,
    /// Value (parts of a split value joined).
    pub value: Option<ObjVal>,
}

/// Joins the parts of a read answer (the `parts` then `msg` of
/// [`SessionEvent::Response`](crate::cdap_session::SessionEvent::Response),
/// in order) into objects: consecutive parts with the same object name are
/// one object whose `byteval` / `strval` pieces are concatenated.
pub fn reassemble_read<'a>(parts: impl IntoIterator<Item = &'a CdapMessage>) -> Vec<ReadObject> {
    let mut out: Vec<ReadObject> = Vec::new();
    for p in parts {
        if let Some(last) = out.last_mut().filter(|l| l.name == p.obj_name()) {
            if let (Some(acc), Some(v)) = (last.value.as_mut(), p.obj_value.as_ref()) {
                if let (Some(a), Some(b)) = (acc.byteval.as_mut(), v.byteval.as_ref()) {
                    a.extend_from_slice(b);
                } else if let (Some(a), Some(b)) = (acc.strval.as_mut(), v.strval.as_ref()) {
                    a.push_str(b);
                }
            }
            continue;
        }
        out.push(ReadObject {
            class: p.obj_class().to_string(),
            name: p.obj_name().to_string(),
            instance: p.obj_inst.unwrap_or(0),
            value: p.obj_value.clone(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdap_session::{Config as SessionConfig, Session, SessionEvent};
    use crate::rib::ALL_LEVELS;
    use crate::time::Instant;
    use proptest::prelude::*;
    use rina_wire::cdap::AuthPolicy;
    use rina_wire::AppName;

    const ENR: OwnerId = OwnerId::ENROLLMENT;
    const RA: OwnerId = OwnerId::RESOURCE_ALLOCATOR;
    const FA: OwnerId = OwnerId::FLOW_ALLOCATOR;

    fn daemon(max_read_part: usize) -> RibDaemon {
        let mut d = RibDaemon::new(DaemonConfig {
            max_read_part,
            ..DaemonConfig::default()
        });
        d.subscribe("/difm", OwnerId::NAMESPACE_MANAGER, ReadPolicy::Daemon)
            .unwrap();
        d.subscribe("/difm/enr", ENR, ReadPolicy::Owner).unwrap();
        d.subscribe("/ra", RA, ReadPolicy::Daemon).unwrap();
        d.subscribe("/fa/flows", FA, ReadPolicy::Owner).unwrap();
        let r = d.rib_mut();
        for (n, c, v, o) in [
            (
                "/difm/enr/neighs/pn=alpha.net",
                "Neighbor",
                ObjValue::Int(1),
                ENR,
            ),
            (
                "/ra/qoscubes/id=1",
                "QoSCube",
                ObjValue::Str("gold".into()),
                RA,
            ),
            (
                "/ra/qoscubes/id=2",
                "QoSCube",
                ObjValue::Str("silver".into()),
                RA,
            ),
            ("/fa/flows/key=1-7", "Flow", ObjValue::Bytes(vec![1, 7]), FA),
        ] {
            r.create_with_parents(n, c, v, o).unwrap();
        }
        d
    }

    fn request(d: &mut RibDaemon, from: SessionId, msg: CdapMessage) -> Option<RibEvent> {
        d.on_request(from, msg).unwrap();
        d.poll_event()
    }

    fn owner(e: Option<RibEvent>) -> Option<OwnerId> {
        match e? {
            RibEvent::Request { owner, .. } => Some(owner),
            RibEvent::Cancelled { .. } => None,
        }
    }

    #[test]
    fn dispatch_to_the_longest_prefix() {
        let mut d = daemon(1400);
        let mut id = 0;
        let mut ask = |d: &mut RibDaemon, m: CdapMessage| {
            id += 1;
            owner(request(d, 1, m.with_invoke_id(id)))
        };
        assert_eq!(
            ask(
                &mut d,
                CdapMessage::create("Neighbor", "/difm/enr/neighs/pn=b", 2i64)
            ),
            Some(ENR)
        );
        assert_eq!(
            ask(&mut d, CdapMessage::stop("Enrollment", "/difm/enr")),
            Some(ENR)
        );
        // Segment-wise: /difm/enr-x is not under /difm/enr.
        assert_eq!(
            ask(&mut d, CdapMessage::write("X", "/difm/enr-x", 1i64)),
            Some(OwnerId::NAMESPACE_MANAGER)
        );
        assert_eq!(
            ask(&mut d, CdapMessage::delete("Flow", "/fa/flows/key=1-7")),
            Some(FA)
        );
        assert_eq!(
            ask(&mut d, CdapMessage::start("QoSCube", "/ra/qoscubes/id=1")),
            Some(RA)
        );
        assert_eq!(d.owner_of("/difm/enr/neighs").unwrap().0, "/difm/enr");
        assert_eq!(d.owner_of("/dt"), None);
        assert_eq!(d.pending(), 5);
        assert_eq!(d.counters().dispatched, 5);
        assert!(
            d.poll_transmit().is_none(),
            "nothing answered by the daemon"
        );

        // The event carries what the component needs.
        let e = request(
            &mut d,
            9,
            CdapMessage::write("X", "/fa/flows/key=2-3", 1i64).with_invoke_id(77),
        );
        let Some(RibEvent::Request {
            owner,
            from,
            invoke_id,
            msg,
        }) = e
        else {
            panic!("{e:?}")
        };
        assert_eq!((owner, from, invoke_id), (FA, 9, Some(77)));
        assert_eq!(msg.value(), Some(rina_wire::cdap::Value::Int64(1)));
    }

    #[test]
    fn unowned_and_invalid_names_are_refused_with_a_reason() {
        let mut d = daemon(1400);
        assert_eq!(
            request(
                &mut d,
                3,
                CdapMessage::create("DataTransfer", "/dt", 1i64).with_invoke_id(4)
            ),
            None
        );
        let (s, r) = d.poll_transmit().unwrap();
        assert_eq!(s, 3);
        assert_eq!(r.op_code(), OpCode::CreateR);
        assert_eq!(r.invoke_id, Some(4));
        assert_eq!(r.result(), RESULT_NO_OWNER);
        assert_eq!(r.result_reason(), "no component owns /dt");
        assert_eq!(r.obj_name(), "/dt");

        // A read of a name that neither exists nor is owned.
        request(
            &mut d,
            3,
            CdapMessage::read("X", "/nothing").with_invoke_id(5),
        );
        let (_, r) = d.poll_transmit().unwrap();
        assert_eq!((r.op_code(), r.result()), (OpCode::ReadR, RESULT_NO_OWNER));
        assert!(r.result_reason().contains("/nothing"));

        request(
            &mut d,
            3,
            CdapMessage::write("X", "/ra//x", 1i64).with_invoke_id(6),
        );
        let (_, r) = d.poll_transmit().unwrap();
        assert_eq!(r.result(), RESULT_BAD_NAME);
        assert!(
            r.result_reason().contains("\"/ra//x\""),
            "{}",
            r.result_reason()
        );
        assert!(r.result_reason().contains("empty segment"));

        // Without an invoke id the peer wants no answer, and gets none.
        request(&mut d, 3, CdapMessage::create("DataTransfer", "/dt", 1i64));
        assert!(d.poll_transmit().is_none());
        assert_eq!(d.counters().unanswerable, 1);
        assert_eq!(d.counters().refused_no_owner, 3);
        assert_eq!(d.counters().refused_bad_name, 1);

        assert_eq!(
            d.on_request(3, CdapMessage::release().with_invoke_id(1)),
            Err(DaemonError::NotAnObjectRequest(OpCode::Release))
        );
        let r = CdapMessage::response_to(&CdapMessage::read("a", "/a").with_invoke_id(1), 0, "")
            .unwrap();
        assert_eq!(
            d.on_request(3, r),
            Err(DaemonError::NotAnObjectRequest(OpCode::ReadR))
        );
    }

    #[test]
    fn components_answer_with_respond() {
        let mut d = daemon(1400);
        request(
            &mut d,
            2,
            CdapMessage::start("Enrollment", "/difm/enr").with_invoke_id(10),
        )
        .unwrap();
        request(
            &mut d,
            2,
            CdapMessage::read("Neighbor", "/difm/enr/neighs/pn=alpha.net").with_invoke_id(11),
        )
        .unwrap();
        d.respond(2, 10, Reply::error(-7, "not now")).unwrap();
        let (s, r) = d.poll_transmit().unwrap();
        assert_eq!(s, 2);
        assert_eq!(r.op_code(), OpCode::StartR);
        assert_eq!(
            (r.invoke_id, r.result(), r.result_reason()),
            (Some(10), -7, "not now")
        );
        assert_eq!(r.obj_name(), "/difm/enr");
        d.respond(2, 11, Reply::with_value(ObjValue::Int(1)))
            .unwrap();
        let (_, r) = d.poll_transmit().unwrap();
        assert_eq!(r.op_code(), OpCode::ReadR);
        assert_eq!((r.result(), r.is_incomplete()), (0, false));
        assert_eq!(r.value(), Some(rina_wire::cdap::Value::Int64(1)));
        assert_eq!(
            d.respond(2, 11, Reply::ok()),
            Err(DaemonError::UnknownRequest {
                from: 2,
                invoke_id: 11
            })
        );
        assert_eq!(
            d.respond(3, 10, Reply::ok()),
            Err(DaemonError::UnknownRequest {
                from: 3,
                invoke_id: 10
            })
        );
        assert_eq!(d.counters().responses, 2);
        assert_eq!(d.pending(), 0);
    }

    #[test]
    fn read_policy_decides_who_answers() {
        let mut d = daemon(1400);
        // The owner reads itself: the request is an event.
        let e = request(
            &mut d,
            1,
            CdapMessage::read("Enrollment", "/difm/enr").with_invoke_id(1),
        );
        assert_eq!(owner(e), Some(ENR));
        // The daemon answers for /ra, from the tree.
        assert_eq!(
            request(
                &mut d,
                1,
                CdapMessage::read("QoSCubes", "/ra/qoscubes")
                    .with_invoke_id(2)
                    .with_scope(1)
            ),
            None
        );
        let parts: Vec<CdapMessage> =
            std::iter::from_fn(|| d.poll_transmit().map(|p| p.1)).collect();
        let objs = reassemble_read(&parts);
        let names: Vec<&str> = objs.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(
            names,
            ["/ra/qoscubes", "/ra/qoscubes/id=1", "/ra/qoscubes/id=2"]
        );
        assert_eq!(objs[1].class, "QoSCube");
        assert_eq!(objs[2].value, Some(ObjVal::from("silver")));
        assert_eq!(objs[0].value, None);
        assert_eq!(
            objs[1].instance,
            d.rib().get("/ra/qoscubes/id=1").unwrap().instance as i64
        );
        let flags: Vec<bool> = parts.iter().map(CdapMessage::is_incomplete).collect();
        assert_eq!(flags, [true, true, false]);
        assert!(parts
            .iter()
            .all(|p| p.invoke_id == Some(2) && p.result() == 0));

        // The whole RIB: containers and the root are nobody's, so readable;
        // objects of owners that read themselves are left out.
        request(
            &mut d,
            1,
            CdapMessage::read("RIB", "/")
                .with_invoke_id(3)
                .with_scope(i32::MAX),
        );
        let parts: Vec<CdapMessage> =
            std::iter::from_fn(|| d.poll_transmit().map(|p| p.1)).collect();
        let names: Vec<String> = reassemble_read(&parts)
            .into_iter()
            .map(|o| o.name)
            .collect();
        assert_eq!(
            names,
            [
                "/",
                "/difm",
                "/fa",
                "/ra",
                "/ra/qoscubes",
                "/ra/qoscubes/id=1",
                "/ra/qoscubes/id=2"
            ]
        );
        // A daemon read of something absent under a readable prefix.
        request(
            &mut d,
            1,
            CdapMessage::read("QoSCube", "/ra/qoscubes/id=9").with_invoke_id(4),
        );
        let (_, r) = d.poll_transmit().unwrap();
        assert_eq!(
            (r.result(), r.result_reason()),
            (RESULT_NOT_FOUND, "no object /ra/qoscubes/id=9")
        );
        request(
            &mut d,
            1,
            CdapMessage::read("QoSCube", "/ra")
                .with_invoke_id(5)
                .with_scope(-1),
        );
        assert_eq!(d.poll_transmit().unwrap().1.result(), RESULT_BAD_REQUEST);
        assert_eq!(d.counters().daemon_reads, 2);
    }

    fn big_rib(max_read_part: usize) -> RibDaemon {
        let mut d = RibDaemon::new(DaemonConfig {
            max_read_part,
            ..DaemonConfig::default()
        });
        d.subscribe("/ra", RA, ReadPolicy::Daemon).unwrap();
        let r = d.rib_mut();
        r.create("/ra", "RA", ObjValue::None, RA).unwrap();
        for i in 0..40u8 {
            let v = match i % 4 {
                0 => ObjValue::Bytes(vec![i; 50 * usize::from(i)]),
                1 => ObjValue::Str("é".repeat(30 * usize::from(i))),
                2 => ObjValue::Int(i.into()),
                _ => ObjValue::Encoded {
                    class: "qosCube_t".into(),
                    bytes: vec![i; 700],
                },
            };
            r.create(&format!("/ra/o{i:02}"), "Obj", v, RA).unwrap();
        }
        d
    }

    fn expected(d: &RibDaemon) -> Vec<ReadObject> {
        d.rib()
            .read("/ra", ALL_LEVELS)
            .unwrap()
            .into_iter()
            .map(|o| ReadObject {
                class: o.class.clone(),
                name: o.name.clone(),
                instance: o.instance as i64,
                value: o.value.to_cdap(),
            })
            .collect()
    }

    fn connected() -> (Session, Session) {
        let now = Instant::ZERO;
        let a: AppName = "a".parse().unwrap();
        let b: AppName = "b".parse().unwrap();
        let mut client = Session::new(SessionConfig::default());
        let mut server = Session::new(SessionConfig::default());
        client.connect(now, AuthPolicy::none(), &a, &b).unwrap();
        server
            .on_message(now, &client.poll_transmit().unwrap())
            .unwrap();
        let Some(SessionEvent::ConnectRequest(m)) = server.poll_event() else {
            panic!()
        };
        server
            .respond(CdapMessage::response_to(&m, 0, "").unwrap())
            .unwrap();
        client
            .on_message(now, &server.poll_transmit().unwrap())
            .unwrap();
        assert!(matches!(
            client.poll_event(),
            Some(SessionEvent::Connected(_))
        ));
        assert!(matches!(
            server.poll_event(),
            Some(SessionEvent::Connected(_))
        ));
        (client, server)
    }

    #[test]
    fn big_read_is_split_and_reassembles_through_cdap_sessions() {
        const MAX: usize = 300;
        let mut d = big_rib(MAX);
        let (mut client, mut server) = connected();
        let now = Instant::ZERO;
        let id = client
            .request(now, CdapMessage::read("RA", "/ra").with_scope(1))
            .unwrap();
        server
            .on_message(now, &client.poll_transmit().unwrap())
            .unwrap();
        let Some(SessionEvent::Request(req)) = server.poll_event() else {
            panic!()
        };
        d.on_request(7, req).unwrap();
        let mut sizes = Vec::new();
        while let Some((s, m)) = d.poll_transmit() {
            assert_eq!(s, 7);
            server.respond(m).unwrap();
            let bytes = server.poll_transmit().unwrap();
            sizes.push(bytes.len());
            client.on_message(now, &bytes).unwrap();
        }
        assert!(sizes.iter().all(|&n| n <= MAX), "{sizes:?}");
        assert!(sizes.len() > 41, "values were split: {} parts", sizes.len());
        let Some(SessionEvent::Response {
            invoke_id,
            msg,
            parts,
        }) = client.poll_event()
        else {
            panic!()
        };
        assert_eq!(invoke_id, id);
        assert_eq!(parts.len() + 1, sizes.len());
        assert!(parts.iter().all(CdapMessage::is_incomplete));
        assert!(!msg.is_incomplete());
        assert_eq!(reassemble_read(parts.iter().chain([&msg])), expected(&d));
        assert_eq!(d.counters().read_parts, sizes.len() as u64);
    }

    #[test]
    fn cancel_read_drops_unsent_parts() {
        let mut d = big_rib(200);
        request(
            &mut d,
            1,
            CdapMessage::read("RA", "/ra")
                .with_scope(1)
                .with_invoke_id(3),
        );
        let first = d.poll_transmit().unwrap().1;
        assert!(first.is_incomplete());
        request(&mut d, 1, CdapMessage::cancel_read(3));
        let (_, r) = d.poll_transmit().unwrap();
        assert_eq!((r.op_code(), r.result()), (OpCode::CancelReadR, 0));
        assert!(d.poll_transmit().is_none());
        // A cancel of nothing is answered with an error.
        request(&mut d, 1, CdapMessage::cancel_read(4));
        assert_eq!(d.poll_transmit().unwrap().1.result(), RESULT_NOT_FOUND);

        // A read waiting at its owner: the owner is told.
        let mut d = daemon(1400);
        request(
            &mut d,
            1,
            CdapMessage::read("Flow", "/fa/flows/key=1-7").with_invoke_id(8),
        );
        d.on_request(1, CdapMessage::cancel_read(8)).unwrap();
        assert_eq!(
            d.poll_event(),
            Some(RibEvent::Cancelled {
                owner: FA,
                from: 1,
                invoke_id: 8
            })
        );
        assert_eq!(d.poll_transmit().unwrap().1.result(), 0);
        assert!(d.respond(1, 8, Reply::ok()).is_err());
    }

    #[test]
    fn bounds_duplicates_and_closed_sessions() {
        let mut d = RibDaemon::new(DaemonConfig {
            max_pending: 2,
            ..DaemonConfig::default()
        });
        d.subscribe("/fa", FA, ReadPolicy::Owner).unwrap();
        for i in 1..=3 {
            d.on_request(1, CdapMessage::start("F", "/fa").with_invoke_id(i))
                .unwrap();
        }
        assert_eq!(d.pending(), 2);
        let (_, r) = d.poll_transmit().unwrap();
        assert_eq!((r.invoke_id, r.result()), (Some(3), RESULT_BUSY));
        assert!(r.result_reason().contains("/fa"));
        // Same invoke id again while the first waits: dropped.
        d.on_request(1, CdapMessage::start("F", "/fa").with_invoke_id(1))
            .unwrap();
        assert_eq!(d.counters().duplicate_requests, 1);
        assert!(d.poll_transmit().is_none());
        d.respond(1, 1, Reply::ok()).unwrap();
        d.session_closed(1);
        assert_eq!(d.pending(), 0);
        assert!(
            d.poll_transmit().is_none(),
            "unsent answers of a closed session are dropped"
        );
        assert!(d.poll_event().is_none());
    }

    #[test]
    fn subscriptions() {
        let mut d = RibDaemon::default();
        d.subscribe("/ra", RA, ReadPolicy::Owner).unwrap();
        assert_eq!(
            d.subscribe("/ra", FA, ReadPolicy::Owner),
            Err(DaemonError::PrefixTaken {
                prefix: "/ra".into(),
                owner: RA
            })
        );
        d.subscribe("/ra", RA, ReadPolicy::Daemon).unwrap();
        assert_eq!(d.owner_of("/ra/x").unwrap().1.reads, ReadPolicy::Daemon);
        assert!(matches!(
            d.subscribe("ra", RA, ReadPolicy::Owner),
            Err(DaemonError::Rib(RibError::InvalidName { .. }))
        ));
        assert_eq!(d.unsubscribe("/ra").unwrap().owner, RA);
        assert_eq!(
            d.unsubscribe("/ra"),
            Err(DaemonError::NotSubscribed("/ra".into()))
        );
        d.subscribe("/", OwnerId::RIB_DAEMON, ReadPolicy::Daemon)
            .unwrap();
        assert_eq!(d.owner_of("/any/thing").unwrap().0, "/");
    }

    proptest! {
        #[test]
        fn parts_fit_and_reassemble(
            max in 120usize..600,
            values in proptest::collection::vec(
                prop_oneof![
                    proptest::collection::vec(any::<u8>(), 0..2000).prop_map(ObjValue::Bytes),
                    "\\PC{0,400}".prop_map(ObjValue::Str),
                    any::<i64>().prop_map(ObjValue::Int),
                    Just(ObjValue::None),
                ],
                0..8,
            ),
        ) {
            let mut d = RibDaemon::new(DaemonConfig { max_read_part: max, ..DaemonConfig::default() });
            d.subscribe("/", RA, ReadPolicy::Daemon).unwrap();
            d.rib_mut().create("/x", "C", ObjValue::None, RA).unwrap();
            for (i, v) in values.into_iter().enumerate() {
                d.rib_mut().create(&format!("/x/pn=n{i}"), "C", v, RA).unwrap();
            }
            d.on_request(1, CdapMessage::read("RIB", "/").with_scope(5).with_invoke_id(1)).unwrap();
            let parts: Vec<CdapMessage> = std::iter::from_fn(|| d.poll_transmit().map(|p| p.1)).collect();
            for (i, p) in parts.iter().enumerate() {
                prop_assert!(p.encode().len() <= max, "part {} is {} bytes", i, p.encode().len());
                prop_assert_eq!(p.is_incomplete(), i + 1 < parts.len());
                prop_assert!(p.validate().is_ok());
            }
            let want: Vec<ReadObject> = d.rib().iter_subtree("/").map(|o| ReadObject {
                class: o.class.clone(),
                name: o.name.clone(),
                instance: o.instance as i64,
                value: o.value.to_cdap(),
            }).collect();
            prop_assert_eq!(reassemble_read(&parts), want);
        }
    }
}
