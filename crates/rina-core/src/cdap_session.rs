//! A CDAP session over one N-1 management flow, as a sans-IO state machine.
//!
//! The session keeps the application-connection state of CDAP
//! (`Null → AwaitCon → Connected → AwaitClose → Null`), hands out invoke ids,
//! matches responses to the requests they answer, gives up on requests that
//! are not answered in time, assembles multi-part read responses
//! (`F_RD_INCOMPLETE`) and counts what does not fit (duplicate, late, unknown
//! or mismatched responses, requests in the wrong state).
//!
//! The driver (the RIB daemon of an IPC process, or a test) feeds every
//! message that arrived on the flow to [`Session::on_message`], calls the API
//! methods ([`Session::connect`], [`Session::request`], [`Session::respond`],
//! [`Session::release`], ...), calls [`Session::handle_timeout`] when
//! [`Session::poll_timeout`] says so, sends what [`Session::poll_transmit`]
//! returns on the flow, and acts on what [`Session::poll_event`] returns.
//!
//! Answering the peer's requests is up to the application
//! ([`SessionEvent::Request`] → [`Session::respond`]), except M_RELEASE, which
//! the session answers itself, and requests it must refuse (too many waiting,
//! M_CONNECT in the wrong state), which it answers with result −1.

use crate::time::Instant;
use rina_wire::cdap::{AuthPolicy, CdapError, CdapMessage, InvokeId, OpCode};
use rina_wire::AppName;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;
use thiserror::Error;

/// Result code the session puts in the responses it sends on its own
/// when it refuses a request.
pub const RESULT_REFUSED: i32 = -1;

/// Configuration of one session.
#[derive(Debug, Clone)]
pub struct Config {
    /// Time an M_CONNECT may wait for its M_CONNECT_R.
    pub connect_timeout: Duration,
    /// Time a request may wait for its response (for a multi-part read: for
    /// the next part).
    pub request_timeout: Duration,
    /// Time an M_RELEASE may wait for its M_RELEASE_R; the session is closed
    /// when it runs out either way.
    pub release_timeout: Duration,
    /// Most requests of ours waiting for a response.
    pub max_outstanding: usize,
    /// Most requests of the peer waiting for our response; more are refused.
    pub max_incoming: usize,
    /// Most parts of one multi-part read response; a read that sends more
    /// is aborted.
    pub max_read_parts: usize,
    /// How many finished invoke ids are remembered to tell a duplicate or
    /// late response from an unknown one.
    pub remembered_ids: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            release_timeout: Duration::from_secs(5),
            max_outstanding: 1024,
            max_incoming: 1024,
            max_read_parts: 4096,
            remembered_ids: 256,
        }
    }
}

/// Application-connection state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// No connection (a peer's M_CONNECT may be waiting for our answer).
    Null,
    /// Our M_CONNECT is waiting for its M_CONNECT_R.
    AwaitCon,
    /// Connected: requests and responses flow.
    Connected,
    /// Our M_RELEASE is waiting for its M_RELEASE_R.
    AwaitClose,
}

/// Why an API call of the session was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SessionError {
    /// The operation is not possible in the current connection state.
    #[error("{op} is not possible in state {state:?}")]
    WrongState { op: OpCode, state: State },
    /// [`Session::request`] was given a response, or an opcode that has its
    /// own method (M_CONNECT, M_RELEASE, M_CANCELREAD).
    #[error("{0} cannot be sent with request(); use the method for it")]
    NotARequest(OpCode),
    /// [`Session::respond`] was given a request.
    #[error("{0} is not a response")]
    NotAResponse(OpCode),
    /// No request is waiting with this invoke id (or it has no invoke id).
    #[error("no request is waiting with invoke id {0:?}")]
    UnknownInvokeId(Option<InvokeId>),
    /// The response does not answer the request waiting under its invoke id.
    #[error("invoke id {invoke_id} waits for {expected}, not {got}")]
    WrongResponse {
        invoke_id: InvokeId,
        expected: OpCode,
        got: OpCode,
    },
    /// [`Config::max_outstanding`] requests are already waiting.
    #[error("{0} requests are already waiting for a response")]
    TooManyOutstanding(usize),
    /// The message does not pass [`CdapMessage::validate`].
    #[error("invalid CDAP message: {0}")]
    Invalid(#[from] CdapError),
}

/// Why a request of ours ended without a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AbortReason {
    /// The session was released, reset or aborted while it waited.
    SessionClosed,
    /// A multi-part read sent more than [`Config::max_read_parts`] parts.
    TooManyParts,
}

/// Something the application must know.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionEvent {
    /// The peer asks to connect (its M_CONNECT). Answer with
    /// [`Session::respond`] and an M_CONNECT_R (result 0 accepts).
    ConnectRequest(CdapMessage),
    /// The session is connected. Carries the M_CONNECT_R: the peer's if we
    /// connected, ours if the peer did.
    Connected(CdapMessage),
    /// The peer refused our M_CONNECT; carries its M_CONNECT_R.
    ConnectRefused(CdapMessage),
    /// A request of the peer. If it has an invoke id, answer it with
    /// [`Session::respond`].
    Request(CdapMessage),
    /// The response to our request `invoke_id`. `msg` is the final response;
    /// `parts` holds the `F_RD_INCOMPLETE` parts of a multi-part read that
    /// came before it, in order (empty otherwise).
    Response {
        invoke_id: InvokeId,
        msg: CdapMessage,
        parts: Vec<CdapMessage>,
    },
    /// Our request `invoke_id` got no response in time and was given up.
    /// A timed-out M_CONNECT leaves the session in `Null`; a timed-out
    /// M_RELEASE closes it (a [`SessionEvent::Released`] follows).
    Timeout {
        invoke_id: InvokeId,
        op_code: OpCode,
    },
    /// Our request `invoke_id` was given up for another reason.
    Aborted {
        invoke_id: InvokeId,
        op_code: OpCode,
        reason: AbortReason,
    },
    /// The connection is gone: released by either side, reset by a new
    /// M_CONNECT of the peer, or aborted.
    Released,
}

/// Counters of one session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Messages given to [`Session::on_message`].
    pub rx_messages: u64,
    /// Messages queued for sending.
    pub tx_messages: u64,
    /// Received messages that did not decode or validate.
    pub rx_malformed: u64,
    /// Responses to a request that already had its final response.
    pub rx_duplicate_responses: u64,
    /// Responses to a request that had timed out or was aborted.
    pub rx_late_responses: u64,
    /// Responses whose invoke id matches nothing we remember.
    pub rx_unknown_responses: u64,
    /// Responses whose opcode does not answer the request's.
    pub rx_mismatched_responses: u64,
    /// Messages not allowed in the session's state (dropped).
    pub rx_unexpected: u64,
    /// Requests reusing the invoke id of one still waiting for our response.
    pub rx_duplicate_requests: u64,
    /// Requests refused by the session itself (too many waiting, M_CONNECT
    /// in the wrong state or with another abstract syntax).
    pub rx_refused: u64,
    /// Requests of ours that timed out.
    pub timeouts: u64,
}

/// How a request of ours ended, remembered for a while.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Answered,
    GivenUp,
}

/// A request of ours waiting for its response.
#[derive(Debug)]
struct Outstanding {
    op: OpCode,
    deadline: Instant,
    parts: Vec<CdapMessage>,
    cancelling: bool,
}

/// A request of the peer waiting for our response.
#[derive(Debug)]
struct Incoming {
    op: OpCode,
    cancel_asked: bool,
}

/// One CDAP session. See the module documentation.
#[derive(Debug)]
pub struct Session {
    cfg: Config,
    state: State,
    next_id: InvokeId,
    /// Invoke id of our M_CONNECT / M_RELEASE in flight.
    control_id: Option<InvokeId>,
    /// The peer's M_CONNECT waiting for our answer.
    peer_connect: Option<CdapMessage>,
    outstanding: BTreeMap<InvokeId, Outstanding>,
    incoming: HashMap<InvokeId, Incoming>,
    recent: VecDeque<(InvokeId, Ended)>,
    events: VecDeque<SessionEvent>,
    transmit: VecDeque<Vec<u8>>,
    counters: Counters,
}

impl Session {
    /// A session in state `Null`.
    pub fn new(cfg: Config) -> Self {
        Session {
            cfg,
            state: State::Null,
            next_id: 1,
            control_id: None,
            peer_connect: None,
            outstanding: BTreeMap::new(),
            incoming: HashMap::new(),
            recent: VecDeque::new(),
            events: VecDeque::new(),
            transmit: VecDeque::new(),
            counters: Counters::default(),
        }
    }

    /// The connection state.
    pub fn state(&self) -> State {
        self.state
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Number of our requests waiting for a response.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Sends M_CONNECT from `src` to `dest` with `auth`. Possible in `Null`
    /// when no M_CONNECT of the peer is waiting for our answer.
    pub fn connect(
        &mut self,
        now: Instant,
        auth: AuthPolicy,
        src: &AppName,
        dest: &AppName,
    ) -> Result<InvokeId, SessionError> {
        if self.state != State::Null || self.peer_connect.is_some() {
            return Err(self.wrong_state(OpCode::Connect));
        }
        let id = self.register(now, OpCode::Connect, self.cfg.connect_timeout)?;
        self.control_id = Some(id);
        self.state = State::AwaitCon;
        self.send(&CdapMessage::connect(auth, src, dest).with_invoke_id(id));
        Ok(id)
    }

    /// Sends M_RELEASE. Possible when `Connected`; the session closes when
    /// the M_RELEASE_R arrives or [`Config::release_timeout`] runs out.
    pub fn release(&mut self, now: Instant) -> Result<InvokeId, SessionError> {
        if self.state != State::Connected {
            return Err(self.wrong_state(OpCode::Release));
        }
        let id = self.register(now, OpCode::Release, self.cfg.release_timeout)?;
        self.control_id = Some(id);
        self.state = State::AwaitClose;
        self.send(&CdapMessage::release().with_invoke_id(id));
        Ok(id)
    }

    /// Sends request `msg` (M_CREATE, M_DELETE, M_READ, M_WRITE, M_START or
    /// M_STOP) with a fresh invoke id, which is returned; its response comes
    /// as [`SessionEvent::Response`] or [`SessionEvent::Timeout`].
    pub fn request(&mut self, now: Instant, msg: CdapMessage) -> Result<InvokeId, SessionError> {
        let op = self.check_request(&msg)?;
        let id = self.alloc_id();
        let msg = msg.with_invoke_id(id);
        msg.validate()?;
        let id = self.register_id(id, now, op, self.cfg.request_timeout)?;
        self.send(&msg);
        Ok(id)
    }

    /// Sends request `msg` without an invoke id: the peer will not answer.
    pub fn send_unconfirmed(&mut self, mut msg: CdapMessage) -> Result<(), SessionError> {
        self.check_request(&msg)?;
        msg.invoke_id = None;
        msg.validate()?;
        self.send(&msg);
        Ok(())
    }

    /// Asks the peer to stop our multi-part read `invoke_id` (M_CANCELREAD).
    /// The read ends with the peer's M_CANCELREAD_R, delivered as its
    /// [`SessionEvent::Response`] with the parts received until then.
    pub fn cancel_read(&mut self, now: Instant, invoke_id: InvokeId) -> Result<(), SessionError> {
        if self.state != State::Connected {
            return Err(self.wrong_state(OpCode::CancelRead));
        }
        match self.outstanding.get_mut(&invoke_id) {
            Some(o) if o.op == OpCode::Read && !o.cancelling => {
                o.cancelling = true;
                o.deadline = now + self.cfg.request_timeout;
            }
            _ => return Err(SessionError::UnknownInvokeId(Some(invoke_id))),
        }
        self.send(&CdapMessage::cancel_read(invoke_id));
        Ok(())
    }

    /// Sends response `msg` to a request of the peer (matched by invoke id;
    /// build it with [`CdapMessage::response_to`]). An M_CONNECT_R answers
    /// the peer's M_CONNECT: result 0 connects the session. An M_READ_R with
    /// `F_RD_INCOMPLETE` is one part of a multi-part read; more may follow.
    pub fn respond(&mut self, msg: CdapMessage) -> Result<(), SessionError> {
        msg.validate()?;
        let op = msg.op_code();
        if !op.is_response() {
            return Err(SessionError::NotAResponse(op));
        }
        let id = msg.invoke_id;
        if op == OpCode::ConnectR {
            let Some(req) = self.peer_connect.as_ref().filter(|r| r.invoke_id == id) else {
                return Err(SessionError::UnknownInvokeId(id));
            };
            debug_assert_eq!(req.op_code(), OpCode::Connect);
            self.peer_connect = None;
            self.send(&msg);
            if msg.result() == 0 {
                self.state = State::Connected;
                self.events.push_back(SessionEvent::Connected(msg));
            }
            return Ok(());
        }
        if !matches!(self.state, State::Connected | State::AwaitClose) {
            return Err(self.wrong_state(op));
        }
        let key = id.ok_or(SessionError::UnknownInvokeId(None))?;
        let inc = self
            .incoming
            .get(&key)
            .ok_or(SessionError::UnknownInvokeId(id))?;
        let cancel = op == OpCode::CancelReadR && inc.cancel_asked;
        if !cancel && inc.op.response() != Some(op) {
            return Err(SessionError::WrongResponse {
                invoke_id: key,
                expected: inc.op.response().unwrap_or(op),
                got: op,
            });
        }
        if !msg.is_incomplete() {
            self.incoming.remove(&key);
        }
        self.send(&msg);
        Ok(())
    }

    /// Closes the session at once, without telling the peer (the N-1 flow
    /// went away). Waiting requests are aborted; [`SessionEvent::Released`]
    /// follows if the session was connected or closing.
    pub fn abort(&mut self) {
        self.close();
    }

    /// Feeds one message received on the flow. An error means it did not
    /// decode or validate (it is counted and dropped); protocol errors
    /// (unknown responses, wrong state, ...) are counted, not returned.
    pub fn on_message(&mut self, now: Instant, bytes: &[u8]) -> Result<(), CdapError> {
        self.counters.rx_messages += 1;
        let msg = CdapMessage::decode(bytes).inspect_err(|_| self.counters.rx_malformed += 1)?;
        let op = msg.op_code();
        match op {
            OpCode::Connect => self.on_connect(msg),
            OpCode::ConnectR => self.on_connect_r(msg),
            OpCode::Release => self.on_release(msg),
            _ if op.is_response() => self.on_response(now, msg),
            _ => self.on_request(msg),
        }
        Ok(())
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<SessionEvent> {
        self.events.pop_front()
    }

    /// The next message to send on the flow.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.transmit.pop_front()
    }

    /// When [`Session::handle_timeout`] must be called next, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.outstanding.values().map(|o| o.deadline).min()
    }

    /// Gives up on every request whose time ran out by `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        let expired: Vec<InvokeId> = self
            .outstanding
            .iter()
            .filter(|(_, o)| o.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            let Some(o) = self.outstanding.remove(&id) else {
                continue;
            };
            self.counters.timeouts += 1;
            self.remember(id, Ended::GivenUp);
            self.events.push_back(SessionEvent::Timeout {
                invoke_id: id,
                op_code: o.op,
            });
            match o.op {
                OpCode::Connect if self.state == State::AwaitCon => {
                    self.control_id = None;
                    self.state = State::Null;
                }
                OpCode::Release if self.state == State::AwaitClose => self.close(),
                _ => {}
            }
        }
    }

    // ---- received messages ----

    fn on_connect(&mut self, msg: CdapMessage) {
        match self.state {
            State::Connected => {
                // The peer started over (it restarted, or lost our state):
                // drop the old connection and take the new request.
                self.close();
            }
            State::AwaitCon | State::AwaitClose => {
                self.counters.rx_unexpected += 1;
                return self.refuse(&msg, "a connection is being set up or released");
            }
            State::Null => {}
        }
        if self.peer_connect.is_some() {
            self.counters.rx_duplicate_requests += 1;
            return;
        }
        if msg
            .abs_syntax
            .is_some_and(|a| a != rina_wire::cdap::ABSTRACT_SYNTAX)
        {
            return self.refuse(&msg, "unsupported abstract syntax");
        }
        self.peer_connect = Some(msg.clone());
        self.events.push_back(SessionEvent::ConnectRequest(msg));
    }

    fn on_connect_r(&mut self, msg: CdapMessage) {
        let id = msg.invoke_id;
        if self.state != State::AwaitCon || id != self.control_id {
            return self.stray_response(&msg);
        }
        if let Some(id) = id {
            self.outstanding.remove(&id);
            self.remember(id, Ended::Answered);
        }
        self.control_id = None;
        if msg.result() == 0 {
            self.state = State::Connected;
            self.events.push_back(SessionEvent::Connected(msg));
        } else {
            self.state = State::Null;
            self.events.push_back(SessionEvent::ConnectRefused(msg));
        }
    }

    fn on_release(&mut self, msg: CdapMessage) {
        if !matches!(self.state, State::Connected | State::AwaitClose) {
            self.counters.rx_unexpected += 1;
            return;
        }
        if msg.invoke_id.is_some() {
            if let Ok(r) = CdapMessage::response_to(&msg, 0, "") {
                self.send(&r);
            }
        }
        self.close();
    }

    fn on_request(&mut self, msg: CdapMessage) {
        let op = msg.op_code();
        if self.state != State::Connected {
            self.counters.rx_unexpected += 1;
            return;
        }
        let Some(id) = msg.invoke_id else {
            self.events.push_back(SessionEvent::Request(msg));
            return;
        };
        if op == OpCode::CancelRead {
            match self.incoming.get_mut(&id) {
                Some(inc) if inc.op == OpCode::Read && !inc.cancel_asked => {
                    inc.cancel_asked = true;
                    self.events.push_back(SessionEvent::Request(msg));
                }
                _ => self.counters.rx_unexpected += 1,
            }
            return;
        }
        if self.incoming.contains_key(&id) {
            self.counters.rx_duplicate_requests += 1;
            return;
        }
        if self.incoming.len() >= self.cfg.max_incoming {
            return self.refuse(&msg, "too many requests waiting for a response");
        }
        self.incoming.insert(
            id,
            Incoming {
                op,
                cancel_asked: false,
            },
        );
        self.events.push_back(SessionEvent::Request(msg));
    }

    fn on_response(&mut self, now: Instant, msg: CdapMessage) {
        let op = msg.op_code();
        let (Some(id), State::Connected | State::AwaitClose) = (msg.invoke_id, self.state) else {
            return self.stray_response(&msg);
        };
        if op == OpCode::ReleaseR {
            if self.state == State::AwaitClose && Some(id) == self.control_id {
                self.outstanding.remove(&id);
                self.remember(id, Ended::Answered);
                self.close();
            } else {
                self.stray_response(&msg);
            }
            return;
        }
        let Some(o) = self.outstanding.get_mut(&id) else {
            return self.stray_response(&msg);
        };
        let cancelled = op == OpCode::CancelReadR && o.cancelling;
        if !cancelled && o.op.response() != Some(op) {
            self.counters.rx_mismatched_responses += 1;
            return;
        }
        if msg.is_incomplete() {
            if o.parts.len() < self.cfg.max_read_parts {
                o.parts.push(msg);
                o.deadline = now + self.cfg.request_timeout;
                return;
            }
            let op_code = o.op;
            self.outstanding.remove(&id);
            self.remember(id, Ended::GivenUp);
            self.events.push_back(SessionEvent::Aborted {
                invoke_id: id,
                op_code,
                reason: AbortReason::TooManyParts,
            });
            return;
        }
        let parts = self
            .outstanding
            .remove(&id)
            .map(|o| o.parts)
            .unwrap_or_default();
        self.remember(id, Ended::Answered);
        self.events.push_back(SessionEvent::Response {
            invoke_id: id,
            msg,
            parts,
        });
    }

    /// Counts a response that matches no request waiting for one.
    fn stray_response(&mut self, msg: &CdapMessage) {
        let ended = msg
            .invoke_id
            .and_then(|id| self.recent.iter().rev().find(|(i, _)| *i == id))
            .map(|(_, e)| *e);
        match ended {
            Some(Ended::Answered) => self.counters.rx_duplicate_responses += 1,
            Some(Ended::GivenUp) => self.counters.rx_late_responses += 1,
            None => self.counters.rx_unknown_responses += 1,
        }
    }

    // ---- helpers ----

    fn wrong_state(&self, op: OpCode) -> SessionError {
        SessionError::WrongState {
            op,
            state: self.state,
        }
    }

    fn check_request(&self, msg: &CdapMessage) -> Result<OpCode, SessionError> {
        let op = msg.op_code();
        if op.is_response() || matches!(op, OpCode::Connect | OpCode::Release | OpCode::CancelRead)
        {
            return Err(SessionError::NotARequest(op));
        }
        if self.state != State::Connected {
            return Err(self.wrong_state(op));
        }
        Ok(op)
    }

    /// The next invoke id not in use: 1, 2, ... wrapping to 1 after `i32::MAX`.
    fn alloc_id(&mut self) -> InvokeId {
        loop {
            let id = self.next_id;
            self.next_id = if id == InvokeId::MAX { 1 } else { id + 1 };
            if !self.outstanding.contains_key(&id) {
                return id;
            }
        }
    }

    fn register(
        &mut self,
        now: Instant,
        op: OpCode,
        timeout: Duration,
    ) -> Result<InvokeId, SessionError> {
        let id = self.alloc_id();
        self.register_id(id, now, op, timeout)
    }

    fn register_id(
        &mut self,
        id: InvokeId,
        now: Instant,
        op: OpCode,
        timeout: Duration,
    ) -> Result<InvokeId, SessionError> {
        if self.outstanding.len() >= self.cfg.max_outstanding {
            return Err(SessionError::TooManyOutstanding(self.outstanding.len()));
        }
        self.outstanding.insert(
            id,
            Outstanding {
                op,
                deadline: now + timeout,
                parts: Vec::new(),
                cancelling: false,
            },
        );
        Ok(id)
    }

    fn remember(&mut self, id: InvokeId, how: Ended) {
        if self.cfg.remembered_ids == 0 {
            return;
        }
        while self.recent.len() >= self.cfg.remembered_ids {
            self.recent.pop_front();
        }
        self.recent.push_back((id, how));
    }

    fn send(&mut self, msg: &CdapMessage) {
        self.counters.tx_messages += 1;
        self.transmit.push_back(msg.encode());
    }

    /// Answers request `req` (if it wants an answer) with a refusal.
    fn refuse(&mut self, req: &CdapMessage, reason: &str) {
        self.counters.rx_refused += 1;
        if req.invoke_id.is_none() {
            return;
        }
        if let Ok(r) = CdapMessage::response_to(req, RESULT_REFUSED, reason) {
            self.send(&r);
        }
    }

    /// Back to `Null`: aborts our waiting requests, forgets the peer's.
    fn close(&mut self) {
        let was_open = matches!(self.state, State::Connected | State::AwaitClose);
        for (id, o) in std::mem::take(&mut self.outstanding) {
            self.remember(id, Ended::GivenUp);
            // The release that is closing the session is not "aborted".
            if Some(id) == self.control_id && o.op == OpCode::Release {
                continue;
            }
            self.events.push_back(SessionEvent::Aborted {
                invoke_id: id,
                op_code: o.op,
                reason: AbortReason::SessionClosed,
            });
        }
        self.incoming.clear();
        self.peer_connect = None;
        self.control_id = None;
        self.state = State::Null;
        if was_open {
            self.events.push_back(SessionEvent::Released);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rina_wire::cdap::{Flags, Value, ABSTRACT_SYNTAX};

    fn ms(n: u64) -> Instant {
        Instant::from_nanos(n * 1_000_000)
    }

    fn name(s: &str) -> AppName {
        s.parse().unwrap()
    }

    fn cfg() -> Config {
        Config {
            connect_timeout: Duration::from_millis(100),
            request_timeout: Duration::from_millis(50),
            release_timeout: Duration::from_millis(30),
            ..Config::default()
        }
    }

    /// Carries every queued message from `a` to `b` (the hand-carried N-1 flow).
    fn carry(now: Instant, a: &mut Session, b: &mut Session) -> usize {
        let mut n = 0;
        while let Some(m) = a.poll_transmit() {
            b.on_message(now, &m).unwrap();
            n += 1;
        }
        n
    }

    fn events(s: &mut Session) -> Vec<SessionEvent> {
        std::iter::from_fn(|| s.poll_event()).collect()
    }

    fn sent(s: &mut Session) -> Vec<CdapMessage> {
        std::iter::from_fn(|| s.poll_transmit())
            .map(|b| CdapMessage::decode(&b).unwrap())
            .collect()
    }

    /// Two sessions, `a` connected to `b`.
    fn connected() -> (Session, Session) {
        let mut a = Session::new(cfg());
        let mut b = Session::new(cfg());
        let id = a
            .connect(
                ms(0),
                AuthPolicy::none(),
                &name("a//mgmt"),
                &name("b//mgmt"),
            )
            .unwrap();
        assert_eq!(a.state(), State::AwaitCon);
        assert_eq!(carry(ms(1), &mut a, &mut b), 1);
        let [SessionEvent::ConnectRequest(req)] = &events(&mut b)[..] else {
            panic!("expected a connect request");
        };
        assert_eq!(req.invoke_id, Some(id));
        assert_eq!(req.abs_syntax, Some(ABSTRACT_SYNTAX));
        assert_eq!(req.src_name(), name("a//mgmt"));
        assert_eq!(
            req.auth_policy.as_ref().unwrap().name.as_deref(),
            Some(rina_wire::cdap::AUTH_NONE)
        );
        b.respond(CdapMessage::response_to(req, 0, "").unwrap())
            .unwrap();
        assert_eq!(b.state(), State::Connected);
        assert!(matches!(&events(&mut b)[..], [SessionEvent::Connected(_)]));
        carry(ms(2), &mut b, &mut a);
        let ev = events(&mut a);
        let [SessionEvent::Connected(r)] = &ev[..] else {
            panic!("expected Connected, got {ev:?}");
        };
        assert_eq!(r.src_name(), name("b//mgmt"));
        assert_eq!(a.state(), State::Connected);
        assert_eq!(a.outstanding(), 0);
        assert_eq!(a.poll_timeout(), None);
        (a, b)
    }

    #[test]
    fn connect_request_response_release() {
        let (mut a, mut b) = connected();
        let id = a
            .request(ms(10), CdapMessage::write("k", "/x", 7i64))
            .unwrap();
        assert_eq!(a.poll_timeout(), Some(ms(60)));
        carry(ms(11), &mut a, &mut b);
        let [SessionEvent::Request(req)] = &events(&mut b)[..] else {
            panic!()
        };
        assert_eq!(req.invoke_id, Some(id));
        assert_eq!(req.value(), Some(Value::Int64(7)));
        b.respond(CdapMessage::response_to(req, 0, "").unwrap())
            .unwrap();
        // A second answer to the same request has nothing to answer.
        assert_eq!(
            b.respond(CdapMessage::response_to(req, 0, "").unwrap()),
            Err(SessionError::UnknownInvokeId(Some(id)))
        );
        carry(ms(12), &mut b, &mut a);
        let ev = events(&mut a);
        let [SessionEvent::Response {
            invoke_id,
            msg,
            parts,
        }] = &ev[..]
        else {
            panic!("{ev:?}")
        };
        assert_eq!(
            (*invoke_id, msg.op_code(), msg.result()),
            (id, OpCode::WriteR, 0)
        );
        assert!(parts.is_empty());
        assert_eq!(a.poll_timeout(), None);

        // Release from a: b answers by itself, both end in Null.
        a.release(ms(20)).unwrap();
        assert_eq!(a.state(), State::AwaitClose);
        carry(ms(21), &mut a, &mut b);
        assert_eq!(b.state(), State::Null);
        assert_eq!(events(&mut b), [SessionEvent::Released]);
        carry(ms(22), &mut b, &mut a);
        assert_eq!(a.state(), State::Null);
        assert_eq!(events(&mut a), [SessionEvent::Released]);
        assert_eq!(a.poll_timeout(), None);
        assert_eq!(a.counters().rx_unknown_responses, 0);
        assert!(matches!(
            a.request(ms(23), CdapMessage::read("k", "/x")),
            Err(SessionError::WrongState { .. })
        ));
    }

    #[test]
    fn connect_refused_and_timed_out() {
        let mut a = Session::new(cfg());
        let mut b = Session::new(cfg());
        a.connect(
            ms(0),
            AuthPolicy::new("pw", b"secret".to_vec()),
            &name("a"),
            &name("b"),
        )
        .unwrap();
        carry(ms(1), &mut a, &mut b);
        let [SessionEvent::ConnectRequest(req)] = &events(&mut b)[..] else {
            panic!()
        };
        assert_eq!(
            req.auth_policy.as_ref().unwrap().options.as_deref(),
            Some(&b"secret"[..])
        );
        b.respond(CdapMessage::response_to(req, -5, "bad password").unwrap())
            .unwrap();
        assert_eq!(b.state(), State::Null);
        carry(ms(2), &mut b, &mut a);
        let ev = events(&mut a);
        let [SessionEvent::ConnectRefused(r)] = &ev[..] else {
            panic!("{ev:?}")
        };
        assert_eq!((r.result(), r.result_reason()), (-5, "bad password"));
        assert_eq!(a.state(), State::Null);

        // Nobody answers: the connect times out at exactly its deadline.
        let id = a
            .connect(ms(10), AuthPolicy::none(), &name("a"), &name("b"))
            .unwrap();
        assert_eq!(a.poll_timeout(), Some(ms(110)));
        a.handle_timeout(ms(109));
        assert!(events(&mut a).is_empty());
        a.handle_timeout(ms(110));
        assert_eq!(
            events(&mut a),
            [SessionEvent::Timeout {
                invoke_id: id,
                op_code: OpCode::Connect
            }]
        );
        assert_eq!(a.state(), State::Null);
        assert_eq!(a.counters().timeouts, 1);
    }

    #[test]
    fn timeouts_late_duplicate_and_unknown_responses() {
        let (mut a, mut b) = connected();
        let r1 = a.request(ms(0), CdapMessage::read("k", "/1")).unwrap();
        let r2 = a.request(ms(20), CdapMessage::read("k", "/2")).unwrap();
        assert_ne!(r1, r2);
        carry(ms(1), &mut a, &mut b);
        let reqs: Vec<CdapMessage> = events(&mut b)
            .into_iter()
            .map(|e| match e {
                SessionEvent::Request(m) => m,
                e => panic!("{e:?}"),
            })
            .collect();
        assert_eq!(a.poll_timeout(), Some(ms(50)));
        a.handle_timeout(ms(55));
        assert_eq!(
            events(&mut a),
            [SessionEvent::Timeout {
                invoke_id: r1,
                op_code: OpCode::Read
            }]
        );
        assert_eq!(a.poll_timeout(), Some(ms(70)));

        // r1's answer comes late, r2's twice, and one for an id never used.
        for req in &reqs {
            b.respond(
                CdapMessage::response_to(req, 0, "")
                    .unwrap()
                    .with_value(1i32),
            )
            .unwrap();
        }
        let mut bytes: Vec<Vec<u8>> = std::iter::from_fn(|| b.poll_transmit()).collect();
        bytes.push(bytes[1].clone());
        bytes.push(
            CdapMessage::response_to(&reqs[0], 0, "")
                .unwrap()
                .with_invoke_id(999)
                .encode(),
        );
        for m in &bytes {
            a.on_message(ms(60), m).unwrap();
        }
        let ev = events(&mut a);
        assert_eq!(ev.len(), 1);
        assert!(matches!(&ev[0], SessionEvent::Response { invoke_id, .. } if *invoke_id == r2));
        let c = a.counters();
        assert_eq!(
            (
                c.rx_late_responses,
                c.rx_duplicate_responses,
                c.rx_unknown_responses
            ),
            (1, 1, 1)
        );
        assert_eq!(c.timeouts, 1);
        assert_eq!(a.poll_timeout(), None);
    }

    #[test]
    fn multi_part_read_is_assembled() {
        let (mut a, mut b) = connected();
        let id = a.request(ms(0), CdapMessage::read("nbr", "/nbrs")).unwrap();
        carry(ms(1), &mut a, &mut b);
        let [SessionEvent::Request(req)] = &events(&mut b)[..] else {
            panic!()
        };
        // Three parts 40 ms apart: each part pushes the deadline on, so the
        // whole read outlives the 50 ms request timeout.
        for (i, t) in [(0, 40), (1, 80), (2, 120)] {
            let mut r = CdapMessage::response_to(req, 0, "").unwrap().with_value(i);
            if i < 2 {
                r = r.with_flags(Flags::RdIncomplete);
            }
            b.respond(r).unwrap();
            a.handle_timeout(ms(t));
            carry(ms(t), &mut b, &mut a);
            if i < 2 {
                assert!(events(&mut a).is_empty());
                assert_eq!(a.poll_timeout(), Some(ms(t + 50)));
            }
        }
        let ev = events(&mut a);
        let [SessionEvent::Response {
            invoke_id,
            msg,
            parts,
        }] = &ev[..]
        else {
            panic!("{ev:?}")
        };
        assert_eq!(*invoke_id, id);
        assert_eq!(msg.value(), Some(Value::Int(2)));
        let vals: Vec<_> = parts.iter().map(|p| p.value()).collect();
        assert_eq!(vals, [Some(Value::Int(0)), Some(Value::Int(1))]);
        assert!(parts.iter().all(|p| p.is_incomplete()));
        assert_eq!(a.outstanding(), 0);
        // b forgot the request after the final part.
        assert!(b
            .respond(CdapMessage::response_to(req, 0, "").unwrap())
            .is_err());
    }

    #[test]
    fn read_with_too_many_parts_is_aborted() {
        let (mut a, mut b) = connected();
        a.cfg.max_read_parts = 2;
        let id = a.request(ms(0), CdapMessage::read("k", "/")).unwrap();
        carry(ms(1), &mut a, &mut b);
        let [SessionEvent::Request(req)] = &events(&mut b)[..] else {
            panic!()
        };
        for _ in 0..4 {
            b.respond(
                CdapMessage::response_to(req, 0, "")
                    .unwrap()
                    .with_flags(Flags::RdIncomplete),
            )
            .unwrap();
        }
        carry(ms(2), &mut b, &mut a);
        assert_eq!(
            events(&mut a),
            [SessionEvent::Aborted {
                invoke_id: id,
                op_code: OpCode::Read,
                reason: AbortReason::TooManyParts
            }]
        );
        assert_eq!(a.counters().rx_late_responses, 1);
    }

    #[test]
    fn cancel_read() {
        let (mut a, mut b) = connected();
        let id = a.request(ms(0), CdapMessage::read("k", "/")).unwrap();
        carry(ms(1), &mut a, &mut b);
        let [SessionEvent::Request(req)] = &events(&mut b)[..] else {
            panic!()
        };
        b.respond(
            CdapMessage::response_to(req, 0, "")
                .unwrap()
                .with_flags(Flags::RdIncomplete),
        )
        .unwrap();
        carry(ms(2), &mut b, &mut a);
        a.cancel_read(ms(3), id).unwrap();
        assert!(a.cancel_read(ms(3), id).is_err(), "only once");
        carry(ms(4), &mut a, &mut b);
        let [SessionEvent::Request(cancel)] = &events(&mut b)[..] else {
            panic!()
        };
        assert_eq!(
            (cancel.op_code(), cancel.invoke_id),
            (OpCode::CancelRead, Some(id))
        );
        b.respond(CdapMessage::response_to(cancel, 0, "").unwrap())
            .unwrap();
        carry(ms(5), &mut b, &mut a);
        let ev = events(&mut a);
        let [SessionEvent::Response { msg, parts, .. }] = &ev[..] else {
            panic!("{ev:?}")
        };
        assert_eq!(msg.op_code(), OpCode::CancelReadR);
        assert_eq!(parts.len(), 1);
        assert_eq!(a.outstanding(), 0);
    }

    #[test]
    fn api_misuse_is_an_error() {
        let mut a = Session::new(cfg());
        assert!(matches!(
            a.request(ms(0), CdapMessage::read("k", "/")),
            Err(SessionError::WrongState { .. })
        ));
        assert!(matches!(
            a.release(ms(0)),
            Err(SessionError::WrongState { .. })
        ));
        let (mut a, _b) = connected();
        let req = CdapMessage::read("k", "/").with_invoke_id(3);
        assert_eq!(
            a.request(ms(0), CdapMessage::response_to(&req, 0, "").unwrap()),
            Err(SessionError::NotARequest(OpCode::ReadR))
        );
        assert_eq!(
            a.request(ms(0), CdapMessage::release()),
            Err(SessionError::NotARequest(OpCode::Release))
        );
        assert_eq!(
            a.respond(req.clone()),
            Err(SessionError::NotAResponse(OpCode::Read))
        );
        assert_eq!(
            a.respond(CdapMessage::response_to(&req, 0, "").unwrap()),
            Err(SessionError::UnknownInvokeId(Some(3)))
        );
        assert_eq!(
            a.request(
                ms(0),
                CdapMessage::write("k", "/", 1i32).with_flags(Flags::RdIncomplete)
            ),
            Err(SessionError::Invalid(CdapError::MisplacedIncomplete(
                OpCode::Write
            )))
        );
        assert!(matches!(
            a.connect(ms(0), AuthPolicy::none(), &name("a"), &name("b")),
            Err(SessionError::WrongState { .. })
        ));
        a.cfg.max_outstanding = 1;
        a.request(ms(0), CdapMessage::read("k", "/")).unwrap();
        assert_eq!(
            a.request(ms(0), CdapMessage::read("k", "/")),
            Err(SessionError::TooManyOutstanding(1))
        );
    }

    #[test]
    fn malformed_and_unexpected_messages_are_counted() {
        let (mut a, _b) = connected();
        assert!(a.on_message(ms(0), &[0xff, 0xff]).is_err());
        assert_eq!(
            a.on_message(ms(0), &[0x18, 0x01]),
            Err(CdapError::MissingOpCode)
        );
        assert_eq!(a.counters().rx_malformed, 2);

        // A request in Null is dropped.
        let mut n = Session::new(cfg());
        n.on_message(
            ms(0),
            &CdapMessage::read("k", "/").with_invoke_id(1).encode(),
        )
        .unwrap();
        assert_eq!(n.counters().rx_unexpected, 1);
        assert!(events(&mut n).is_empty());
        // An M_CONNECT with another abstract syntax is refused.
        let mut c =
            CdapMessage::connect(AuthPolicy::none(), &name("x"), &name("n")).with_invoke_id(4);
        c.abs_syntax = Some(1);
        n.on_message(ms(0), &c.encode()).unwrap();
        let out = sent(&mut n);
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0].op_code(), out[0].result(), out[0].invoke_id),
            (OpCode::ConnectR, RESULT_REFUSED, Some(4))
        );
        assert_eq!(n.counters().rx_refused, 1);
    }

    #[test]
    fn peer_requests_are_bounded_and_deduplicated() {
        let (mut a, mut b) = connected();
        b.cfg.max_incoming = 2;
        for _ in 0..3 {
            a.request(ms(0), CdapMessage::read("k", "/")).unwrap();
        }
        carry(ms(1), &mut a, &mut b);
        assert_eq!(events(&mut b).len(), 2);
        assert_eq!(b.counters().rx_refused, 1);
        carry(ms(2), &mut b, &mut a);
        let ev = events(&mut a);
        let [SessionEvent::Response { invoke_id, msg, .. }] = &ev[..] else {
            panic!("{ev:?}")
        };
        assert_eq!((*invoke_id, msg.result()), (4, RESULT_REFUSED));

        // The same invoke id again while the first is waiting.
        let dup = CdapMessage::read("k", "/").with_invoke_id(2).encode();
        b.on_message(ms(3), &dup).unwrap();
        assert_eq!(b.counters().rx_duplicate_requests, 1);
        // A request without an invoke id is delivered and needs no answer.
        a.send_unconfirmed(CdapMessage::write("k", "/", 1i32))
            .unwrap();
        carry(ms(4), &mut a, &mut b);
        let [SessionEvent::Request(m)] = &events(&mut b)[..] else {
            panic!()
        };
        assert_eq!(m.invoke_id, None);
    }

    #[test]
    fn release_aborts_waiting_requests_and_times_out() {
        let (mut a, mut b) = connected();
        let r = a.request(ms(0), CdapMessage::read("k", "/")).unwrap();
        a.release(ms(1)).unwrap();
        // b never answers: the release times out and closes a anyway.
        assert_eq!(a.poll_timeout(), Some(ms(31)));
        a.handle_timeout(ms(31));
        let ev = events(&mut a);
        assert_eq!(
            ev,
            [
                SessionEvent::Timeout {
                    invoke_id: r + 1,
                    op_code: OpCode::Release
                },
                SessionEvent::Aborted {
                    invoke_id: r,
                    op_code: OpCode::Read,
                    reason: AbortReason::SessionClosed
                },
                SessionEvent::Released,
            ]
        );
        assert_eq!(a.state(), State::Null);
        assert_eq!(a.poll_timeout(), None);
        // b then sees our read and release; it answers the release.
        carry(ms(40), &mut a, &mut b);
        assert_eq!(b.state(), State::Null);
        assert_eq!(events(&mut b).last(), Some(&SessionEvent::Released));
        // Its answers reach a closed session and are counted as late.
        carry(ms(41), &mut b, &mut a);
        assert_eq!(a.counters().rx_late_responses, 1);
    }

    #[test]
    fn peer_reconnect_resets_the_session() {
        let (mut a, mut b) = connected();
        let r = a.request(ms(0), CdapMessage::read("k", "/")).unwrap();
        carry(ms(1), &mut a, &mut b);
        events(&mut b);
        // b restarts and connects again.
        let mut b2 = Session::new(cfg());
        b2.connect(ms(2), AuthPolicy::none(), &name("b"), &name("a"))
            .unwrap();
        carry(ms(3), &mut b2, &mut a);
        let ev = events(&mut a);
        assert_eq!(ev.len(), 3, "{ev:?}");
        assert!(matches!(ev[0], SessionEvent::Aborted { invoke_id, .. } if invoke_id == r));
        assert_eq!(ev[1], SessionEvent::Released);
        assert!(matches!(ev[2], SessionEvent::ConnectRequest(_)));
        assert_eq!(a.state(), State::Null);
    }

    #[test]
    fn invoke_ids_skip_those_in_use_and_wrap() {
        let (mut a, _b) = connected();
        a.next_id = InvokeId::MAX;
        let x = a.request(ms(0), CdapMessage::read("k", "/")).unwrap();
        assert_eq!(x, InvokeId::MAX);
        let y = a.request(ms(0), CdapMessage::read("k", "/")).unwrap();
        assert_eq!(y, 1);
        a.next_id = InvokeId::MAX;
        let z = a.request(ms(0), CdapMessage::read("k", "/")).unwrap();
        assert_eq!(z, 2, "MAX and 1 are waiting");
    }

    #[test]
    fn abort_closes_without_a_message() {
        let (mut a, _b) = connected();
        a.abort();
        assert_eq!(a.state(), State::Null);
        assert_eq!(events(&mut a), [SessionEvent::Released]);
        assert!(a.poll_transmit().is_none());
    }
}
