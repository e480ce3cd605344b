//! The enrollment task of a normal IPC process, as a sans-IO state machine.
//!
//! An IPC process joins a DIF through a member it can reach over an N-1 DIF.
//! The joining side is an [`Enrollee`], the member an [`Enroller`]; each
//! drives one [`Session`] over one management flow. The driver feeds every
//! message received on the flow to `on_message`, sends what `poll_transmit`
//! returns, calls `handle_timeout` when `poll_timeout` says so and acts on what
//! `poll_event` returns. Nothing here reads a clock or touches a socket.
//!
//! # Message sequence
//!
//! A simplified version of IRATI's default enrollment policy
//! (`enrollment-task-ps.cc`), with IRATI's RIB object names:
//!
//! | # | direction | message | object | value |
//! |---|---|---|---|---|
//! | 1 | enrollee → member | M_CONNECT | – | auth policy: name + [`AuthPolicy::hello`] (the enrollee's nonce) |
//! | 2 | member → enrollee | M_CONNECT_R | – | 0 with [`AuthPolicy::challenge`] (the member's nonce and proof), or [`RESULT_BAD_CREDENTIALS`] / −1 with a reason |
//! | 3 | enrollee → member | M_START | `Enrollment` `/difm/enr` | `EnrollmentInformation{address, token}` (address 0: has none; token: the enrollee's proof, [`AuthPolicy::respond`]) |
//! | 4 | member → enrollee | M_START_R | `/difm/enr` | `EnrollmentInformation{address}` assigned by the [`AddressPolicy`], or [`RESULT_NO_ADDRESS`], or [`RESULT_BAD_CREDENTIALS`] |
//! | 5 | member → enrollee | M_CREATE (each answered by M_CREATE_R) | `DataTransfer` `/dt` | the DIF configuration ([`DifConfigBlob`]) |
//! | | | | `Neighbor` `/difm/enr/neighs/pn=<name>` | one `Neighbor` per member |
//! | | | | `DirectoryForwardingTableEntry` `/difm/nsm/dft/key=<i>` | opaque directory entry *i* |
//! | | | | `FlowStateObject` `/ra/fsos/key=<i>` | opaque flow-state object *i* |
//! | 6 | member → enrollee | M_STOP | `Enrollment` `/difm/enr` | `EnrollmentInformation{address}`; sent once every M_CREATE_R is in |
//! | 7 | enrollee → member | M_STOP_R | `/difm/enr` | 0 if the configuration arrived |
//! | 8 | enrollee → member | M_START | `OperationalStatus` `/difm/ops` | – |
//! | 9 | member → enrollee | M_START_R | `/difm/ops` | 0: the enrollee is a member ([`EnrollmentEvent::Enrolled`] / [`EnrollerEvent::Admitted`]) |
//!
//! A lost M_STOP_R is implied by the enrollee's M_START `/difm/ops`, which it
//! sends only after accepting the M_STOP.
//!
//! The member sends M_STOP only after every M_CREATE was confirmed, so a lost
//! object fails the attempt instead of leaving a member with half a
//! configuration (IRATI's enrollee M_READs what it missed; we start over).
//! The enrollee's M_START `/difm/ops` is the last word so that the member
//! admits it only once it holds the whole configuration; if the final
//! M_START_R is lost, the enrollee retries, presenting the address it was
//! given, and the member recognises it and gives it the same address again
//! (so [`EnrollerEvent::Admitted`] may come twice for one enrollee with the
//! same address: treat it as idempotent).
//!
//! # Failures and retries
//!
//! Every wait is bounded by [`EnrolleeConfig::step_timeout`]. A failed
//! attempt is retried from M_CONNECT after a back-off of
//! [`EnrolleeConfig::initial_backoff`], doubled after each attempt (capped at
//! [`EnrolleeConfig::max_backoff`]), up to [`EnrolleeConfig::max_attempts`]
//! attempts. Only transient errors are retried ([`EnrollmentError::is_retryable`]):
//! timeouts, protocol errors and an unreachable member. A refusal, a bad
//! password and an exhausted address space are answers, not accidents:
//! asking again would give the same answer (and retrying a password would
//! turn a typo into a guessing storm), so they fail at once.
//!
//! Every error names the [`Step`] that failed, and [`Enrollee::status`]
//! keeps the step, the attempt count and the last error for `rinactl`.
//!
//! # Authentication
//!
//! [`AuthPolicy`] is the trait; [`AuthNone`], [`AuthPassword`] (HMAC-SHA256
//! challenge–response over a pre-shared password) and [`AuthKeys`] (ed25519
//! key pairs and a list of trusted public keys) are the policies. Both
//! sides prove themselves over the other's nonce in messages 1–3 (the
//! "connect" step, see [`auth`]); no secret crosses the wire. The enrollee
//! checks the member's proof before it sends its own, the member checks the
//! enrollee's before it gives an address. Nonces come from a [`NonceGen`]
//! the driver seeds ([`Enrollee::with_nonces`], [`Enroller::with_nonces`]).

use crate::cdap_session::{Config as SessionConfig, Session, SessionEvent, State as SessionState};
use crate::time::Instant;
use rina_wire::cdap::{
    AuthPolicy as WireAuth, CdapMessage, EnrollmentInformation, InvokeId, Neighbor, ObjVal, OpCode,
    Value,
};
use rina_wire::AppName;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::Duration;
use thiserror::Error;

/// An address in a DIF. 0 means "none".
pub type Address = u64;

/// Result code of an M_CONNECT_R refusing the credentials.
pub const RESULT_BAD_CREDENTIALS: i32 = -2;
/// Result code of an M_START_R `/difm/enr` when no address is free.
pub const RESULT_NO_ADDRESS: i32 = -3;
/// Result code of any other refusal.
pub const RESULT_REFUSED: i32 = -1;

pub mod auth;
pub use auth::{
    AuthFailure, AuthKeys, AuthNone, AuthPassword, AuthPolicy, Handshake, Nonce, NonceGen,
    AUTH_KEYS, AUTH_PASSWORD,
};

/// RIB object: the enrollment (`Enrollment`).
pub const OBJ_ENROLLMENT: &str = "/difm/enr";
/// RIB object class of [`OBJ_ENROLLMENT`].
pub const CLASS_ENROLLMENT: &str = "Enrollment";
/// RIB object: the operational status (`OperationalStatus`).
pub const OBJ_OPERATIONAL: &str = "/difm/ops";
/// RIB object class of [`OBJ_OPERATIONAL`].
pub const CLASS_OPERATIONAL: &str = "OperationalStatus";
/// RIB object: the data-transfer constants and the rest of the DIF
/// configuration (`DataTransfer`).
pub const OBJ_DATA_TRANSFER: &str = "/dt";
/// RIB object class of [`OBJ_DATA_TRANSFER`].
pub const CLASS_DATA_TRANSFER: &str = "DataTransfer";
/// Prefix of the neighbour objects (`Neighbor`), followed by `pn=<name>`.
pub const OBJ_NEIGHBORS: &str = "/difm/enr/neighs";
/// RIB object class of one neighbour.
pub const CLASS_NEIGHBOR: &str = "Neighbor";
/// Prefix of the directory entries, followed by `/key=<i>`.
pub const OBJ_DIRECTORY: &str = "/difm/nsm/dft";
/// RIB object class of one directory entry.
pub const CLASS_DIRECTORY_ENTRY: &str = "DirectoryForwardingTableEntry";
/// Prefix of the flow-state objects, followed by `/key=<i>`.
pub const OBJ_FSOS: &str = "/ra/fsos";
/// RIB object class of one flow-state object.
pub const CLASS_FSO: &str = "FlowStateObject";

// ---------------------------------------------------------------------------
// Steps, errors, status
// ---------------------------------------------------------------------------

/// A step of the enrollment sequence (see the module table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Step {
    /// Nothing started yet.
    Idle,
    /// M_CONNECT / M_CONNECT_R: authentication (messages 1–2).
    Connect,
    /// M_START / M_START_R `/difm/enr`: address assignment (messages 3–4).
    StartEnrollment,
    /// M_CREATEs of the DIF's objects up to M_STOP `/difm/enr` (messages 5–6).
    Configuration,
    /// The member waits for M_STOP_R `/difm/enr` (message 7).
    StopEnrollment,
    /// M_START / M_START_R `/difm/ops` (messages 8–9).
    StartOperation,
    /// Done: the enrollee is a member of the DIF.
    Enrolled,
}

impl Step {
    /// Short lower-case name, as logs and `rinactl` show it.
    pub fn name(self) -> &'static str {
        match self {
            Step::Idle => "idle",
            Step::Connect => "connect",
            Step::StartEnrollment => "start-enrollment",
            Step::Configuration => "configuration",
            Step::StopEnrollment => "stop-enrollment",
            Step::StartOperation => "start-operation",
            Step::Enrolled => "enrolled",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why an enrollment (or one attempt of it) failed; each names its step.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EnrollmentError {
    /// The N-1 flow to the member could not be allocated or went down
    /// (reported by the driver with [`Enrollee::unreachable`]). Retried.
    #[error("step {step}: member unreachable: {reason}")]
    Unreachable { step: Step, reason: String },
    /// The peer answered with a refusal (not retried).
    #[error("step {step}: refused by the peer: {reason}")]
    Refused { step: Step, reason: String },
    /// The credentials were not accepted: the member refused the enrollee's
    /// (enrollee side), or the enrollee's proof failed (member side). Not
    /// retried.
    #[error("step connect: authentication failed (bad password or key): {reason}")]
    BadCredentials { reason: String },
    /// The member failed to prove itself to the enrollee (wrong password,
    /// untrusted or wrong key): it may be an impostor. Not retried.
    #[error(
        "step connect: authentication failed (bad password or key): \
         the member did not prove itself: {reason}"
    )]
    PeerNotAuthenticated { reason: String },
    /// The peer did not answer within the step timeout. Retried.
    #[error("step {step}: no answer from the peer in time")]
    Timeout { step: Step },
    /// The peer sent something the sequence does not allow. Retried.
    #[error("step {step}: protocol error: {detail}")]
    Protocol { step: Step, detail: String },
    /// The member has no free address to give (step start-enrollment; not retried).
    #[error("step start-enrollment: the DIF has no free address")]
    NoAddress,
}

impl EnrollmentError {
    /// The step that failed.
    pub fn step(&self) -> Step {
        match self {
            EnrollmentError::Unreachable { step, .. }
            | EnrollmentError::Refused { step, .. }
            | EnrollmentError::Timeout { step }
            | EnrollmentError::Protocol { step, .. } => *step,
            EnrollmentError::BadCredentials { .. }
            | EnrollmentError::PeerNotAuthenticated { .. } => Step::Connect,
            EnrollmentError::NoAddress => Step::StartEnrollment,
        }
    }

    /// Whether a new attempt may succeed: accidents (timeouts, protocol
    /// errors, an unreachable member) yes; answers (refusal, bad password,
    /// no address) no.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            EnrollmentError::Unreachable { .. }
                | EnrollmentError::Timeout { .. }
                | EnrollmentError::Protocol { .. }
        )
    }
}

/// Where an enrollment machine is, for `rinactl`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnrollmentStatus {
    /// The current step, or the step that failed if `phase` is `Failed` or
    /// `WaitingRetry`.
    pub step: Step,
    /// What the machine is doing.
    pub phase: Phase,
    /// Attempts started so far (enroller: enrollments handled so far).
    pub attempts: u32,
    /// The last error, as text.
    pub last_error: Option<String>,
    /// When the next attempt starts, while `phase` is `WaitingRetry`.
    pub next_retry: Option<Instant>,
}

/// Coarse state of an enrollment machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not started (enroller: waiting for an M_CONNECT).
    Idle,
    /// An attempt is in progress.
    Running,
    /// An attempt failed; the next starts at [`EnrollmentStatus::next_retry`].
    WaitingRetry,
    /// Enrolled (enroller: the last enrollee was admitted).
    Enrolled,
    /// Gave up (enroller: the last enrollee was rejected).
    Failed,
}

// ---------------------------------------------------------------------------
// Policies
// ---------------------------------------------------------------------------

/// Compares `a` and `b` in time that depends only on the longer length: a
/// xor-fold over every byte, the length difference folded in.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// Address assignment policy of the member (a per-DIF choice).
pub trait AddressPolicy: Send {
    /// Policy name, for logs.
    fn name(&self) -> &str;
    /// An address for an enrollee that asked for `requested` (0: none),
    /// avoiding every address in `in_use`; `None` when none is left.
    fn assign(&mut self, requested: Address, in_use: &BTreeSet<Address>) -> Option<Address>;
}

/// The lowest free address of `first..=last`; a requested address is kept
/// if it lies in the range and is free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextFree {
    /// First address of the range (0 is never given).
    pub first: Address,
    /// Last address of the range.
    pub last: Address,
}

impl NextFree {
    /// The range `first..=last`.
    pub fn new(first: Address, last: Address) -> Self {
        NextFree { first, last }
    }
}

impl AddressPolicy for NextFree {
    fn name(&self) -> &str {
        "next-free"
    }

    fn assign(&mut self, requested: Address, in_use: &BTreeSet<Address>) -> Option<Address> {
        let first = self.first.max(1);
        if requested >= first && requested <= self.last && !in_use.contains(&requested) {
            return Some(requested);
        }
        if first > self.last {
            return None;
        }
        // Walk the used addresses of the range in order; the first gap wins.
        let mut candidate = first;
        for &a in in_use.range(first..=self.last) {
            if a != candidate {
                break;
            }
            if candidate == self.last {
                return None;
            }
            candidate += 1;
        }
        Some(candidate)
    }
}

// ---------------------------------------------------------------------------
// What is transferred
// ---------------------------------------------------------------------------

/// The DIF's configuration (data-transfer constants, QoS cubes, policies),
/// opaque to this module: the caller encodes and decodes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct DifConfigBlob(pub Vec<u8>);

/// What a member gives every enrollee.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DifContent {
    /// The DIF configuration, sent as `/dt`.
    pub config: DifConfigBlob,
    /// The members the enrollee may connect to.
    pub neighbors: Vec<Neighbor>,
    /// Directory entries, opaque (encoded by the directory).
    pub directory: Vec<Vec<u8>>,
    /// Flow-state objects, opaque (encoded by routing).
    pub fsos: Vec<Vec<u8>>,
}

/// What every [`Enroller`] of a member shares: the policies, the addresses
/// in use and the content given to enrollees. Passed to the enroller's
/// methods so that many enrollers (one per management flow) assign from one
/// address space.
pub struct Membership {
    auth: Box<dyn AuthPolicy>,
    policy: Box<dyn AddressPolicy>,
    in_use: BTreeSet<Address>,
    holders: BTreeMap<Address, String>,
    /// What enrollees receive; the caller keeps it current.
    pub content: DifContent,
}

impl fmt::Debug for Membership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Membership")
            .field("auth", &self.auth.name())
            .field("policy", &self.policy.name())
            .field("holders", &self.holders)
            .finish_non_exhaustive()
    }
}

impl Membership {
    /// A membership with the given policies and content, and no address in use.
    pub fn new(
        auth: Box<dyn AuthPolicy>,
        policy: Box<dyn AddressPolicy>,
        content: DifContent,
    ) -> Self {
        Membership {
            auth,
            policy,
            in_use: BTreeSet::new(),
            holders: BTreeMap::new(),
            content,
        }
    }

    /// Marks `address` as held by `holder` (the member's own address, members
    /// known otherwise). Address 0 is ignored.
    pub fn reserve(&mut self, address: Address, holder: &str) {
        if address != 0 {
            self.in_use.insert(address);
            self.holders.insert(address, holder.to_string());
        }
    }

    /// Frees `address` (a member left).
    pub fn release(&mut self, address: Address) {
        self.in_use.remove(&address);
        self.holders.remove(&address);
    }

    /// The addresses in use.
    pub fn in_use(&self) -> &BTreeSet<Address> {
        &self.in_use
    }

    /// Who holds `address`.
    pub fn holder(&self, address: Address) -> Option<&str> {
        self.holders.get(&address).map(String::as_str)
    }
}

// ---------------------------------------------------------------------------
// Enrollee
// ---------------------------------------------------------------------------

/// Configuration of an [`Enrollee`].
#[derive(Debug, Clone)]
pub struct EnrolleeConfig {
    /// Name of the joining IPC process.
    pub name: AppName,
    /// Name of the member it enrolls through.
    pub enroller: AppName,
    /// Address it already holds (0: none; the member assigns one).
    pub address: Address,
    /// N-1 DIFs it can be reached through.
    pub supporting_difs: Vec<String>,
    /// Longest wait for each step (IRATI `enrollTimeoutInMs`, 10 s).
    pub step_timeout: Duration,
    /// Back-off before the second attempt; doubled for each further one.
    pub initial_backoff: Duration,
    /// Longest back-off.
    pub max_backoff: Duration,
    /// Most attempts, the first included (at least 1).
    pub max_attempts: u32,
    /// Most objects accepted in one attempt; more is a protocol error (a
    /// member cannot make us hold unbounded state).
    pub max_objects: usize,
    /// Most bytes of objects (their encoded M_CREATEs) accepted in one
    /// attempt; more is a protocol error ([`MAX_ENROLLMENT_BYTES`] by default).
    pub max_bytes: usize,
}

/// Most bytes of objects an enrollee accepts in one attempt (by default):
/// the count alone ([`EnrolleeConfig::max_objects`]) still let a member
/// make it hold 65,536 objects of up to 4 MiB each; a DIF's configuration,
/// neighbours, directory and flow-state objects fit many times over.
pub const MAX_ENROLLMENT_BYTES: usize = 64 << 20;

impl EnrolleeConfig {
    /// Defaults: no address, 10 s per step, back-off 1 s doubling up to
    /// 60 s, 4 attempts (IRATI's `maxEnrollmentRetries` 3 + the first).
    pub fn new(name: AppName, enroller: AppName) -> Self {
        EnrolleeConfig {
            name,
            enroller,
            address: 0,
            supporting_difs: Vec::new(),
            step_timeout: Duration::from_secs(10),
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
            max_attempts: 4,
            max_objects: 65_536,
            max_bytes: MAX_ENROLLMENT_BYTES,
        }
    }
}

/// What the enrollee tells its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnrollmentEvent {
    /// A step started.
    Progress {
        /// The step.
        step: Step,
    },
    /// An attempt failed; the next starts at `at`.
    Retrying {
        /// Why the attempt failed.
        error: EnrollmentError,
        /// The attempt that failed (1 = the first).
        attempt: u32,
        /// When the next attempt starts.
        at: Instant,
    },
    /// Enrolled: the address and everything the member sent.
    Enrolled {
        /// Address in the DIF.
        address: Address,
        /// The DIF configuration.
        config: DifConfigBlob,
        /// The neighbours.
        neighbors: Vec<Neighbor>,
        /// Directory entries, in the member's order.
        directory: Vec<Vec<u8>>,
        /// Flow-state objects, in the member's order.
        fsos: Vec<Vec<u8>>,
    },
    /// Gave up.
    Failed(EnrollmentError),
}

/// Counters of an [`Enrollee`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnrolleeCounters {
    /// Attempts started.
    pub attempts: u64,
    /// Attempts that timed out.
    pub timeouts: u64,
    /// Attempts ended by a protocol error.
    pub protocol_errors: u64,
    /// Objects received.
    pub objects: u64,
    /// Attempts ended because the member sent more than
    /// [`EnrolleeConfig::max_bytes`] of objects (also protocol errors).
    pub too_many_bytes: u64,
    /// Requests of the member that were not expected (answered with −1).
    pub unexpected_requests: u64,
    /// Received bytes that were not a valid CDAP message.
    pub malformed: u64,
}

/// What arrived during the configuration step.
#[derive(Debug, Default)]
struct Received {
    count: usize,
    /// Bytes of the M_CREATEs accepted so far.
    bytes: usize,
    config: Option<DifConfigBlob>,
    neighbors: BTreeMap<String, Neighbor>,
    directory: BTreeMap<u64, Vec<u8>>,
    fsos: BTreeMap<u64, Vec<u8>>,
}

/// The joining side of enrollment. See the module documentation.
pub struct Enrollee {
    cfg: EnrolleeConfig,
    auth: Box<dyn AuthPolicy>,
    session: Session,
    phase: Phase,
    step: Step,
    attempts: u32,
    deadline: Option<Instant>,
    retry_at: Option<Instant>,
    pending: Option<InvokeId>,
    address: Address,
    rx: Received,
    last_error: Option<EnrollmentError>,
    events: VecDeque<EnrollmentEvent>,
    counters: EnrolleeCounters,
    nonces: NonceGen,
    /// This attempt's nonce.
    nonce: Nonce,
}

impl fmt::Debug for Enrollee {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Enrollee")
            .field("name", &self.cfg.name)
            .field("enroller", &self.cfg.enroller)
            .field("auth", &self.auth.name())
            .field("phase", &self.phase)
            .field("step", &self.step)
            .field("attempts", &self.attempts)
            .finish_non_exhaustive()
    }
}

impl Enrollee {
    /// An enrollee that has not started.
    pub fn new(cfg: EnrolleeConfig, auth: Box<dyn AuthPolicy>) -> Self {
        let scfg = SessionConfig {
            connect_timeout: cfg.step_timeout,
            request_timeout: cfg.step_timeout,
            ..SessionConfig::default()
        };
        Enrollee {
            address: cfg.address,
            cfg,
            auth,
            session: Session::new(scfg),
            phase: Phase::Idle,
            step: Step::Idle,
            attempts: 0,
            deadline: None,
            retry_at: None,
            pending: None,
            rx: Received::default(),
            last_error: None,
            events: VecDeque::new(),
            counters: EnrolleeCounters::default(),
            nonces: NonceGen::new([0; 32]),
            nonce: [0; 32],
        }
    }

    /// Takes its nonces from `nonces` (seeded by the driver). Without it
    /// the nonces are predictable: fine for tests, not for a real DIF.
    pub fn with_nonces(mut self, nonces: NonceGen) -> Self {
        self.nonces = nonces;
        self
    }

    /// Starts enrolling (sends M_CONNECT). Does nothing while an enrollment
    /// is running or waiting to retry; after `Enrolled` or `Failed` it starts
    /// over with a fresh attempt count.
    pub fn start(&mut self, now: Instant) {
        if matches!(self.phase, Phase::Running | Phase::WaitingRetry) {
            return;
        }
        self.attempts = 0;
        self.last_error = None;
        self.begin_attempt(now);
    }

    /// The driver could not allocate the N-1 flow, or it went down. Fails
    /// the current attempt with [`EnrollmentError::Unreachable`] (retried).
    pub fn unreachable(&mut self, now: Instant, reason: &str) {
        if self.phase == Phase::Running {
            self.fail(
                now,
                EnrollmentError::Unreachable {
                    step: self.step,
                    reason: reason.to_string(),
                },
            );
        }
    }

    /// Feeds one message received on the management flow.
    pub fn on_message(&mut self, now: Instant, bytes: &[u8]) {
        if self.session.on_message(now, bytes).is_err() {
            self.counters.malformed += 1;
        }
        self.process(now);
    }

    /// The next message to send on the management flow.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.session.poll_transmit()
    }

    /// The next event for the driver.
    pub fn poll_event(&mut self) -> Option<EnrollmentEvent> {
        self.events.pop_front()
    }

    /// When [`Enrollee::handle_timeout`] must be called next, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::WaitingRetry => self.retry_at,
            Phase::Running => match (self.deadline, self.session.poll_timeout()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            _ => None,
        }
    }

    /// Handles every timer that ran out by `now`: a step timeout fails the
    /// attempt; the end of a back-off starts the next attempt.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.phase {
            Phase::WaitingRetry if self.retry_at.is_some_and(|t| t <= now) => {
                self.begin_attempt(now);
            }
            Phase::Running => {
                self.session.handle_timeout(now);
                self.process(now);
                if self.phase == Phase::Running && self.deadline.is_some_and(|d| d <= now) {
                    self.fail(now, EnrollmentError::Timeout { step: self.step });
                }
            }
            _ => {}
        }
    }

    /// Where the enrollment is.
    pub fn status(&self) -> EnrollmentStatus {
        EnrollmentStatus {
            step: self.step,
            phase: self.phase,
            attempts: self.attempts,
            last_error: self.last_error.as_ref().map(ToString::to_string),
            next_retry: self.retry_at.filter(|_| self.phase == Phase::WaitingRetry),
        }
    }

    /// The last error, if any.
    pub fn last_error(&self) -> Option<&EnrollmentError> {
        self.last_error.as_ref()
    }

    /// The address: assigned, or configured, or 0.
    pub fn address(&self) -> Address {
        self.address
    }

    /// The counters.
    pub fn counters(&self) -> &EnrolleeCounters {
        &self.counters
    }

    /// The CDAP session (its counters, its state).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The CDAP session, connected once enrolled, for the RIB daemon to
    /// carry on with.
    pub fn into_session(self) -> Session {
        self.session
    }

    // ---- internals ----

    fn begin_attempt(&mut self, now: Instant) {
        self.attempts += 1;
        self.counters.attempts += 1;
        // Keep the session (and its invoke ids), so that late answers to an
        // earlier attempt are recognised as such.
        self.session.abort();
        while self.session.poll_event().is_some() {}
        self.rx = Received::default();
        self.pending = None;
        self.retry_at = None;
        self.phase = Phase::Running;
        self.enter(now, Step::Connect);
        self.nonce = self.nonces.next_nonce();
        let auth = WireAuth::new(self.auth.name(), self.auth.hello(&self.nonce));
        if let Err(e) = self
            .session
            .connect(now, auth, &self.cfg.name, &self.cfg.enroller)
        {
            self.fail(
                now,
                EnrollmentError::Protocol {
                    step: Step::Connect,
                    detail: e.to_string(),
                },
            );
        }
    }

    fn enter(&mut self, now: Instant, step: Step) {
        self.step = step;
        self.deadline = Some(now + self.cfg.step_timeout);
        self.events.push_back(EnrollmentEvent::Progress { step });
    }

    fn fail(&mut self, now: Instant, err: EnrollmentError) {
        match err {
            EnrollmentError::Timeout { .. } => self.counters.timeouts += 1,
            EnrollmentError::Protocol { .. } => self.counters.protocol_errors += 1,
            _ => {}
        }
        self.last_error = Some(err.clone());
        self.deadline = None;
        self.pending = None;
        if self.session.state() == SessionState::Connected {
            // Tell the member; if this is lost, our next M_CONNECT resets it.
            let _ = self.session.release(now);
        } else {
            self.session.abort();
        }
        let max = self.cfg.max_attempts.max(1);
        if err.is_retryable() && self.attempts < max {
            let shift = self.attempts.saturating_sub(1).min(31);
            let backoff = self
                .cfg
                .initial_backoff
                .saturating_mul(1u32 << shift)
                .min(self.cfg.max_backoff);
            let at = now + backoff;
            self.retry_at = Some(at);
            self.phase = Phase::WaitingRetry;
            self.events.push_back(EnrollmentEvent::Retrying {
                error: err,
                attempt: self.attempts,
                at,
            });
        } else {
            self.retry_at = None;
            self.phase = Phase::Failed;
            self.events.push_back(EnrollmentEvent::Failed(err));
        }
    }

    fn protocol(&mut self, now: Instant, detail: String) {
        let step = self.step;
        self.fail(now, EnrollmentError::Protocol { step, detail });
    }

    fn respond(&mut self, req: &CdapMessage, result: i32, reason: &str) {
        if req.invoke_id.is_none() {
            return;
        }
        if let Ok(r) = CdapMessage::response_to(req, result, reason) {
            let _ = self.session.respond(r);
        }
    }

    fn process(&mut self, now: Instant) {
        while let Some(ev) = self.session.poll_event() {
            if self.phase != Phase::Running {
                // Late traffic of an ended attempt, or RIB traffic once
                // enrolled: not ours to judge.
                continue;
            }
            self.on_event(now, ev);
        }
    }

    fn on_event(&mut self, now: Instant, ev: SessionEvent) {
        match ev {
            SessionEvent::Connected(msg) if self.step == Step::Connect => {
                let answer = msg.auth_policy.and_then(|a| a.options).unwrap_or_default();
                let proof = match self
                    .auth
                    .respond(Handshake::Enrollment, &self.nonce, &answer)
                {
                    Ok(p) => p,
                    Err(f) => {
                        // An empty proof tells the member why we stop.
                        let info = EnrollmentInformation::default();
                        let msg =
                            CdapMessage::start(CLASS_ENROLLMENT, OBJ_ENROLLMENT).with_object(&info);
                        let _ = self.session.request(now, msg);
                        let reason = f.to_string();
                        return self.fail(now, EnrollmentError::PeerNotAuthenticated { reason });
                    }
                };
                self.enter(now, Step::StartEnrollment);
                let info = EnrollmentInformation {
                    address: self.address,
                    supporting_difs: self.cfg.supporting_difs.clone(),
                    start_early: false,
                    token: auth::hex(&proof),
                };
                let msg = CdapMessage::start(CLASS_ENROLLMENT, OBJ_ENROLLMENT).with_object(&info);
                match self.session.request(now, msg) {
                    Ok(id) => self.pending = Some(id),
                    Err(e) => self.protocol(now, e.to_string()),
                }
            }
            SessionEvent::ConnectRefused(r) => {
                let err = if r.result() == RESULT_BAD_CREDENTIALS {
                    EnrollmentError::BadCredentials {
                        reason: reason_of(&r),
                    }
                } else {
                    EnrollmentError::Refused {
                        step: Step::Connect,
                        reason: reason_of(&r),
                    }
                };
                self.fail(now, err);
            }
            SessionEvent::Response { invoke_id, msg, .. } if Some(invoke_id) == self.pending => {
                self.pending = None;
                self.on_response(now, msg);
            }
            SessionEvent::Request(req) => self.on_request(now, req),
            SessionEvent::Timeout { .. } => {
                self.fail(now, EnrollmentError::Timeout { step: self.step });
            }
            SessionEvent::Released => {
                self.protocol(now, "the member closed the connection".to_string());
            }
            _ => {}
        }
    }

    fn on_response(&mut self, now: Instant, msg: CdapMessage) {
        match self.step {
            Step::StartEnrollment => {
                if msg.result() == RESULT_NO_ADDRESS {
                    return self.fail(now, EnrollmentError::NoAddress);
                }
                if msg.result() == RESULT_BAD_CREDENTIALS {
                    let reason = reason_of(&msg);
                    return self.fail(now, EnrollmentError::BadCredentials { reason });
                }
                if msg.result() != 0 {
                    return self.fail(
                        now,
                        EnrollmentError::Refused {
                            step: Step::StartEnrollment,
                            reason: reason_of(&msg),
                        },
                    );
                }
                match msg.object::<EnrollmentInformation>() {
                    Ok(info) if info.address != 0 => {
                        self.address = info.address;
                        self.enter(now, Step::Configuration);
                    }
                    Ok(_) => self.protocol(now, "M_START_R /difm/enr without an address".into()),
                    Err(e) => self.protocol(now, format!("bad EnrollmentInformation: {e}")),
                }
            }
            Step::StartOperation => {
                if msg.result() != 0 {
                    return self.fail(
                        now,
                        EnrollmentError::Refused {
                            step: Step::StartOperation,
                            reason: reason_of(&msg),
                        },
                    );
                }
                let rx = std::mem::take(&mut self.rx);
                self.phase = Phase::Enrolled;
                self.step = Step::Enrolled;
                self.deadline = None;
                self.events.push_back(EnrollmentEvent::Progress {
                    step: Step::Enrolled,
                });
                self.events.push_back(EnrollmentEvent::Enrolled {
                    address: self.address,
                    config: rx.config.unwrap_or_default(),
                    neighbors: rx.neighbors.into_values().collect(),
                    directory: rx.directory.into_values().collect(),
                    fsos: rx.fsos.into_values().collect(),
                });
            }
            _ => {}
        }
    }

    fn on_request(&mut self, now: Instant, req: CdapMessage) {
        let op = req.op_code();
        let name = req.obj_name.clone().unwrap_or_default();
        let in_config = matches!(self.step, Step::StartEnrollment | Step::Configuration);
        match op {
            OpCode::Create if in_config && self.rx.count >= self.cfg.max_objects => {
                let detail = format!("more than {} objects", self.cfg.max_objects);
                self.respond(&req, RESULT_REFUSED, &detail);
                self.protocol(now, detail);
            }
            OpCode::Create
                if in_config
                    && self
                        .rx
                        .bytes
                        .saturating_add(prost::Message::encoded_len(&req))
                        > self.cfg.max_bytes =>
            {
                let detail = format!("more than {} bytes of objects", self.cfg.max_bytes);
                self.counters.too_many_bytes += 1;
                self.respond(&req, RESULT_REFUSED, &detail);
                self.protocol(now, detail);
            }
            OpCode::Create if in_config => match self.store(&req) {
                Ok(()) => {
                    self.rx.count += 1;
                    self.rx.bytes += prost::Message::encoded_len(&req);
                    self.counters.objects += 1;
                    self.respond(&req, 0, "");
                }
                Err(detail) => {
                    self.respond(&req, RESULT_REFUSED, &detail);
                    self.protocol(now, detail);
                }
            },
            OpCode::Stop if name == OBJ_ENROLLMENT && self.step == Step::Configuration => {
                if self.rx.config.is_none() {
                    let detail = "M_STOP /difm/enr before the DIF configuration (/dt)";
                    self.respond(&req, RESULT_REFUSED, detail);
                    return self.protocol(now, detail.to_string());
                }
                self.respond(&req, 0, "");
                self.enter(now, Step::StartOperation);
                let msg = CdapMessage::start(CLASS_OPERATIONAL, OBJ_OPERATIONAL);
                match self.session.request(now, msg) {
                    Ok(id) => self.pending = Some(id),
                    Err(e) => self.protocol(now, e.to_string()),
                }
            }
            _ => {
                self.counters.unexpected_requests += 1;
                self.respond(
                    &req,
                    RESULT_REFUSED,
                    &format!(
                        "{op} {name} not expected during enrollment step {}",
                        self.step
                    ),
                );
            }
        }
    }

    /// Stores one object of the configuration step.
    fn store(&mut self, req: &CdapMessage) -> Result<(), String> {
        let class = req.obj_class.as_deref().unwrap_or_default();
        let name = req.obj_name.as_deref().unwrap_or_default();
        let bytes = || match req.value() {
            Some(Value::Bytes(b)) => Ok(b),
            _ => Err(format!("{class} {name} has no byte value")),
        };
        match class {
            CLASS_DATA_TRANSFER => self.rx.config = Some(DifConfigBlob(bytes()?)),
            CLASS_NEIGHBOR => {
                let n: Neighbor = req
                    .object()
                    .map_err(|e| format!("bad Neighbor {name}: {e}"))?;
                self.rx.neighbors.insert(name.to_string(), n);
            }
            CLASS_DIRECTORY_ENTRY => {
                let k = key_index(name, OBJ_DIRECTORY)?;
                self.rx.directory.insert(k, bytes()?);
            }
            CLASS_FSO => {
                let k = key_index(name, OBJ_FSOS)?;
                self.rx.fsos.insert(k, bytes()?);
            }
            _ => return Err(format!("unknown object {class} {name}")),
        }
        Ok(())
    }
}

/// The index `i` of an object named `<prefix>/key=<i>`.
fn key_index(name: &str, prefix: &str) -> Result<u64, String> {
    name.strip_prefix(prefix)
        .and_then(|s| s.strip_prefix("/key="))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("object name {name:?} is not {prefix}/key=<index>"))
}

fn reason_of(msg: &CdapMessage) -> String {
    match msg.result_reason.as_deref() {
        Some(r) if !r.is_empty() => r.to_string(),
        _ => format!("result {}", msg.result()),
    }
}

// ---------------------------------------------------------------------------
// Enroller
// ---------------------------------------------------------------------------

/// Configuration of an [`Enroller`].
#[derive(Debug, Clone)]
pub struct EnrollerConfig {
    /// Longest wait for each step.
    pub step_timeout: Duration,
    /// Most M_CREATEs waiting for their M_CREATE_R at once.
    pub window: usize,
}

impl Default for EnrollerConfig {
    fn default() -> Self {
        EnrollerConfig {
            step_timeout: Duration::from_secs(10),
            window: 64,
        }
    }
}

/// What the enroller tells its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnrollerEvent {
    /// `peer` is a member with `address` (may repeat for a re-enrolling peer).
    Admitted {
        /// The address it holds.
        address: Address,
        /// Its name.
        peer: AppName,
    },
    /// The enrollment of `peer` failed; `reason` names the step.
    Rejected {
        /// The enrollee's name (default if it never sent M_CONNECT).
        peer: AppName,
        /// Why.
        reason: EnrollmentError,
    },
}

/// Counters of an [`Enroller`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnrollerCounters {
    /// M_CONNECTs received.
    pub connects: u64,
    /// Enrollees admitted.
    pub admitted: u64,
    /// Enrollments rejected or failed.
    pub rejected: u64,
    /// Credentials refused.
    pub bad_credentials: u64,
    /// Objects sent.
    pub objects_sent: u64,
    /// Requests that were not expected (answered with −1).
    pub unexpected_requests: u64,
    /// Received bytes that were not a valid CDAP message.
    pub malformed: u64,
}

/// The member side of enrollment, over one management flow. See the module
/// documentation. It serves one enrollee at a time and is ready for the next
/// M_CONNECT (of the same or another enrollee) when one ends.
pub struct Enroller {
    cfg: EnrollerConfig,
    session: Session,
    phase: Phase,
    step: Step,
    enrollments: u32,
    deadline: Option<Instant>,
    peer: AppName,
    address: Address,
    fresh_address: bool,
    to_send: VecDeque<CdapMessage>,
    creates: BTreeSet<InvokeId>,
    stop_id: Option<InvokeId>,
    last_error: Option<EnrollmentError>,
    events: VecDeque<EnrollerEvent>,
    counters: EnrollerCounters,
    nonces: NonceGen,
    /// What the auth policy needs to check the enrollee's proof.
    auth_ctx: Option<Vec<u8>>,
}

impl fmt::Debug for Enroller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Enroller")
            .field("phase", &self.phase)
            .field("step", &self.step)
            .field("peer", &self.peer)
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl Enroller {
    /// An enroller waiting for an M_CONNECT.
    pub fn new(cfg: EnrollerConfig) -> Self {
        let scfg = SessionConfig {
            connect_timeout: cfg.step_timeout,
            request_timeout: cfg.step_timeout,
            ..SessionConfig::default()
        };
        Enroller {
            cfg,
            session: Session::new(scfg),
            phase: Phase::Idle,
            step: Step::Idle,
            enrollments: 0,
            deadline: None,
            peer: AppName::default(),
            address: 0,
            fresh_address: false,
            to_send: VecDeque::new(),
            creates: BTreeSet::new(),
            stop_id: None,
            last_error: None,
            events: VecDeque::new(),
            counters: EnrollerCounters::default(),
            nonces: NonceGen::new([0; 32]),
            auth_ctx: None,
        }
    }

    /// Takes its nonces from `nonces` (seeded by the driver). Without it
    /// the nonces are predictable, and a recorded enrollee proof could be
    /// replayed: fine for tests, not for a real DIF.
    pub fn with_nonces(mut self, nonces: NonceGen) -> Self {
        self.nonces = nonces;
        self
    }

    /// Feeds one message received on the management flow.
    pub fn on_message(&mut self, now: Instant, bytes: &[u8], members: &mut Membership) {
        if self.session.on_message(now, bytes).is_err() {
            self.counters.malformed += 1;
        }
        self.process(now, members);
    }

    /// The next message to send on the management flow.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.session.poll_transmit()
    }

    /// The next event for the driver.
    pub fn poll_event(&mut self) -> Option<EnrollerEvent> {
        self.events.pop_front()
    }

    /// When [`Enroller::handle_timeout`] must be called next, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.phase != Phase::Running {
            return None;
        }
        match (self.deadline, self.session.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Handles every timer that ran out by `now`.
    pub fn handle_timeout(&mut self, now: Instant, members: &mut Membership) {
        if self.phase != Phase::Running {
            return;
        }
        self.session.handle_timeout(now);
        self.process(now, members);
        if self.phase == Phase::Running && self.deadline.is_some_and(|d| d <= now) {
            self.fail(members, EnrollmentError::Timeout { step: self.step });
        }
    }

    /// The address given in the enrollment in progress (or the last one);
    /// 0 before any.
    pub fn address(&self) -> Address {
        self.address
    }

    /// Where the enrollment in progress (or the last one) is.
    pub fn status(&self) -> EnrollmentStatus {
        EnrollmentStatus {
            step: self.step,
            phase: self.phase,
            attempts: self.enrollments,
            last_error: self.last_error.as_ref().map(ToString::to_string),
            next_retry: None,
        }
    }

    /// The counters.
    pub fn counters(&self) -> &EnrollerCounters {
        &self.counters
    }

    /// The CDAP session.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The CDAP session, connected once the enrollee is admitted.
    pub fn into_session(self) -> Session {
        self.session
    }

    // ---- internals ----

    fn process(&mut self, now: Instant, members: &mut Membership) {
        while let Some(ev) = self.session.poll_event() {
            self.on_event(now, ev, members);
        }
    }

    fn enter(&mut self, now: Instant, step: Step) {
        self.step = step;
        self.deadline = Some(now + self.cfg.step_timeout);
    }

    fn fail(&mut self, members: &mut Membership, reason: EnrollmentError) {
        if self.fresh_address && self.address != 0 {
            members.release(self.address);
        }
        self.fresh_address = false;
        self.auth_ctx = None;
        self.counters.rejected += 1;
        self.last_error = Some(reason.clone());
        self.phase = Phase::Failed;
        self.deadline = None;
        self.to_send.clear();
        self.creates.clear();
        self.stop_id = None;
        if self.session.state() != SessionState::Null {
            // Silently: a release would leave the session closing and unable
            // to take the enrollee's next M_CONNECT.
            self.session.abort();
            while self.session.poll_event().is_some() {}
        }
        self.events.push_back(EnrollerEvent::Rejected {
            peer: self.peer.clone(),
            reason,
        });
    }

    fn protocol(&mut self, members: &mut Membership, detail: String) {
        let step = self.step;
        self.fail(members, EnrollmentError::Protocol { step, detail });
    }

    fn respond(&mut self, req: &CdapMessage, result: i32, reason: &str) -> bool {
        match CdapMessage::response_to(req, result, reason) {
            Ok(r) => self.session.respond(r).is_ok(),
            Err(_) => false,
        }
    }

    fn on_event(&mut self, now: Instant, ev: SessionEvent, members: &mut Membership) {
        match ev {
            SessionEvent::ConnectRequest(req) => self.on_connect(now, req, members),
            SessionEvent::Released if self.phase == Phase::Running => {
                self.protocol(members, "the enrollee closed the connection".into());
            }
            SessionEvent::Timeout { .. } if self.phase == Phase::Running => {
                self.fail(members, EnrollmentError::Timeout { step: self.step });
            }
            SessionEvent::Request(req) => self.on_request(now, req, members),
            SessionEvent::Response { invoke_id, msg, .. } if self.phase == Phase::Running => {
                self.on_response(now, invoke_id, msg, members);
            }
            _ => {}
        }
    }

    fn on_connect(&mut self, now: Instant, req: CdapMessage, members: &mut Membership) {
        self.counters.connects += 1;
        if self.phase == Phase::Running {
            self.protocol(members, "the enrollee started over".into());
        }
        self.enrollments += 1;
        self.peer = req.src_name();
        self.address = 0;
        self.fresh_address = false;
        self.last_error = None;
        self.phase = Phase::Running;
        self.step = Step::Connect;
        let wire = req.auth_policy.clone().unwrap_or_default();
        let name = wire.name.unwrap_or_default();
        if name != members.auth.name() {
            let reason = format!(
                "authentication policy {name:?} not accepted; this DIF uses {:?}",
                members.auth.name()
            );
            self.respond(&req, RESULT_REFUSED, &reason);
            return self.fail(
                members,
                EnrollmentError::Refused {
                    step: Step::Connect,
                    reason,
                },
            );
        }
        let hello = wire.options.unwrap_or_default();
        let nonce = self.nonces.next_nonce();
        let (answer, ctx) = match members
            .auth
            .challenge(Handshake::Enrollment, &hello, &nonce)
        {
            Ok(a) => a,
            Err(f) => return self.refuse_credentials(&req, members, f),
        };
        self.auth_ctx = Some(ctx);
        let sent = CdapMessage::response_to(&req, 0, "").is_ok_and(|mut r| {
            r.auth_policy = Some(WireAuth::new(members.auth.name(), answer));
            self.session.respond(r).is_ok()
        });
        if sent {
            self.enter(now, Step::StartEnrollment);
        } else {
            self.protocol(members, "could not answer M_CONNECT".into());
        }
    }

    /// Refuses the enrollee's credentials with the reason, on both sides.
    fn refuse_credentials(&mut self, req: &CdapMessage, members: &mut Membership, f: AuthFailure) {
        self.counters.bad_credentials += 1;
        let reason = f.to_string();
        self.respond(
            req,
            RESULT_BAD_CREDENTIALS,
            &format!("authentication failed: {reason}"),
        );
        self.fail(members, EnrollmentError::BadCredentials { reason });
    }

    fn on_request(&mut self, now: Instant, req: CdapMessage, members: &mut Membership) {
        let op = req.op_code();
        let name = req.obj_name.clone().unwrap_or_default();
        let running = self.phase == Phase::Running;
        match op {
            OpCode::Start
                if running && name == OBJ_ENROLLMENT && self.step == Step::StartEnrollment =>
            {
                self.on_start_enrollment(now, req, members)
            }
            // In stop-enrollment: the M_STOP_R was lost, but the enrollee
            // sends this only after accepting the M_STOP, so it stands for it.
            OpCode::Start
                if running
                    && name == OBJ_OPERATIONAL
                    && matches!(self.step, Step::StopEnrollment | Step::StartOperation) =>
            {
                if self.respond(&req, 0, "") {
                    members.reserve(self.address, &self.peer.to_string());
                    self.fresh_address = false;
                    self.phase = Phase::Enrolled;
                    self.step = Step::Enrolled;
                    self.deadline = None;
                    self.stop_id = None;
                    self.counters.admitted += 1;
                    self.events.push_back(EnrollerEvent::Admitted {
                        address: self.address,
                        peer: self.peer.clone(),
                    });
                } else {
                    self.protocol(members, "could not answer M_START /difm/ops".into());
                }
            }
            _ => {
                self.counters.unexpected_requests += 1;
                if req.invoke_id.is_some() {
                    self.respond(
                        &req,
                        RESULT_REFUSED,
                        &format!("{op} {name} not expected in enrollment step {}", self.step),
                    );
                }
            }
        }
    }

    fn on_start_enrollment(&mut self, now: Instant, req: CdapMessage, members: &mut Membership) {
        let info: EnrollmentInformation = match req.object() {
            Ok(i) => i,
            Err(e) => {
                let detail = format!("bad EnrollmentInformation: {e}");
                self.respond(&req, RESULT_REFUSED, &detail);
                return self.protocol(members, detail);
            }
        };
        // Message 3: the enrollee's proof, checked before anything is given.
        // Kept (not taken): a repeated M_START of this attempt checks the
        // same way; the next M_CONNECT or a failure replaces it.
        let ctx = self.auth_ctx.clone().unwrap_or_default();
        let checked = match auth::unhex(&info.token) {
            Some(proof) => members.auth.verify(Handshake::Enrollment, &ctx, &proof),
            None => Err(AuthFailure::Malformed("token is not hex")),
        }
        .map_err(|f| {
            if info.token.is_empty() {
                AuthFailure::RejectedByPeer
            } else {
                f
            }
        });
        if let Err(f) = checked {
            return self.refuse_credentials(&req, members, f);
        }
        let peer = self.peer.to_string();
        let requested = info.address;
        let (address, fresh) = if requested != 0 && members.holder(requested) == Some(peer.as_str())
        {
            (requested, false)
        } else {
            let Membership { policy, in_use, .. } = &mut *members;
            match policy.assign(requested, in_use) {
                Some(a) if a != 0 && !in_use.contains(&a) => (a, true),
                _ => {
                    let reason = format!(
                        "no free address (policy {}, {} in use)",
                        members.policy.name(),
                        members.in_use.len()
                    );
                    self.respond(&req, RESULT_NO_ADDRESS, &reason);
                    return self.fail(members, EnrollmentError::NoAddress);
                }
            }
        };
        if fresh {
            members.reserve(address, &peer);
        }
        self.address = address;
        self.fresh_address = fresh;
        let reply = EnrollmentInformation {
            address,
            ..Default::default()
        };
        let ok = CdapMessage::response_to(&req, 0, "")
            .map(|r| r.with_object(&reply))
            .is_ok_and(|r| self.session.respond(r).is_ok());
        if !ok {
            return self.protocol(members, "could not answer M_START /difm/enr".into());
        }
        self.enter(now, Step::Configuration);
        let c = &members.content;
        self.to_send.push_back(CdapMessage::create(
            CLASS_DATA_TRANSFER,
            OBJ_DATA_TRANSFER,
            c.config.0.clone(),
        ));
        for n in &c.neighbors {
            self.to_send.push_back(CdapMessage::create(
                CLASS_NEIGHBOR,
                &format!("{OBJ_NEIGHBORS}/pn={}", n.ap_name),
                ObjVal::object(n),
            ));
        }
        for (i, d) in c.directory.iter().enumerate() {
            self.to_send.push_back(CdapMessage::create(
                CLASS_DIRECTORY_ENTRY,
                &format!("{OBJ_DIRECTORY}/key={i}"),
                d.clone(),
            ));
        }
        for (i, f) in c.fsos.iter().enumerate() {
            self.to_send.push_back(CdapMessage::create(
                CLASS_FSO,
                &format!("{OBJ_FSOS}/key={i}"),
                f.clone(),
            ));
        }
        self.flush(now, members);
    }

    /// Sends M_CREATEs up to the window; M_STOP once all are confirmed.
    fn flush(&mut self, now: Instant, members: &mut Membership) {
        while self.creates.len() < self.cfg.window.max(1) {
            let Some(msg) = self.to_send.pop_front() else {
                break;
            };
            match self.session.request(now, msg) {
                Ok(id) => {
                    self.counters.objects_sent += 1;
                    self.creates.insert(id);
                }
                Err(e) => return self.protocol(members, e.to_string()),
            }
        }
        if self.creates.is_empty() && self.to_send.is_empty() && self.step == Step::Configuration {
            let info = EnrollmentInformation {
                address: self.address,
                ..Default::default()
            };
            let msg = CdapMessage::stop(CLASS_ENROLLMENT, OBJ_ENROLLMENT).with_object(&info);
            match self.session.request(now, msg) {
                Ok(id) => {
                    self.stop_id = Some(id);
                    self.enter(now, Step::StopEnrollment);
                }
                Err(e) => self.protocol(members, e.to_string()),
            }
        }
    }

    fn on_response(
        &mut self,
        now: Instant,
        id: InvokeId,
        msg: CdapMessage,
        members: &mut Membership,
    ) {
        if self.creates.remove(&id) {
            if msg.result() != 0 {
                let name = msg.obj_name.clone().unwrap_or_default();
                return self.protocol(
                    members,
                    format!("M_CREATE {name} refused: {}", reason_of(&msg)),
                );
            }
            // Each confirmation extends the step: a long transfer is not a
            // stalled one.
            self.deadline = Some(now + self.cfg.step_timeout);
            self.flush(now, members);
        } else if Some(id) == self.stop_id {
            self.stop_id = None;
            if msg.result() != 0 {
                return self.fail(
                    members,
                    EnrollmentError::Refused {
                        step: Step::StopEnrollment,
                        reason: reason_of(&msg),
                    },
                );
            }
            self.enter(now, Step::StartOperation);
        }
    }
}

#[cfg(test)]
mod tests;
