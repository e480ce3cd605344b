//! DIF membership in the normal IPCP: neighbour hellos and liveness,
//! enrollment over N-1 ports (as enrollee and as enroller), and the failure
//! of flows whose destination stays unreachable. Together with the driver's
//! N-1 flow set-up this is the resource allocator of the IPCP: it turns N-1
//! ports into neighbours (and back) for routing and the directory.
//!
//! Enabled by [`NormalConfig::membership`](super::NormalConfig::membership).
//!
//! # A machine of its own
//!
//! `MembershipMachine` owns everything membership knows: the enrollment
//! machines and the address space, who said hello where and when, which
//! ports are admitted, port authentication and each port's keys, and its
//! counters. Each call gets a `Ctx`: a read-only view of what it needs of
//! the IPCP (its settings and address, the neighbours routing knows, the
//! RMT's ports, the flow-state and directory databases). It never changes
//! the IPCP: what it wants done comes back as `MsOut` (send a hello, an
//! enrollment message or a port-authentication message, open or close a
//! session, bring a neighbour up or down, take an address and a
//! configuration, report), which the IPCP's glue (`membership_glue`)
//! carries out in order. Taking an address is the one step whose outcome
//! the machine needs back: the glue applies it and answers with
//! `MembershipMachine::adopted` or `MembershipMachine::renumbered`.
//!
//! # Hellos and liveness
//!
//! A member sends a hello on each N-1 port every
//! [`MembershipConfig::hello_interval`] (and at once on a new port): an
//! unconfirmed CDAP `M_WRITE` of `Neighbor` on [`HELLO_OBJ_NAME`] (through
//! the RIB daemon, like every management message), whose
//! source names this IPCP, destination names the DIF, and value is a
//! [`Neighbor`] with its address. A hello from a member of the same DIF on
//! port `p` makes the sender the neighbour on `p`
//! ([`NormalIpcp::neighbor_up`], cost 1), so the driver never has to know
//! addresses. Any valid frame on `p` proves the neighbour alive; silence for
//! [`MembershipConfig::dead_interval`] takes it down
//! ([`NormalIpcp::neighbor_down`]) and closes its CDAP session; the next
//! hello brings it back.
//!
//! # Sessions
//!
//! Before its hello on an admitted port, a member opens the CDAP session
//! with the neighbour there with `M_CONNECT`, again with every hello until
//! it is open; the neighbour accepts it with `M_CONNECT_R` if it is a
//! member. Either side's `M_CONNECT` accepted opens it (two crossing ones
//! both succeed). A port removed closes it with `M_RELEASE` first. An
//! enrollee's session with its enroller is opened by the enrollment's own
//! `M_CONNECT`. Routing, the directory and RIB reads of a neighbour without
//! an open session are refused and counted ([`super::mgmt_rib`]); when a
//! session opens, routing and the directory send their databases to the
//! neighbour again.
//!
//! # Enrollment
//!
//! An IPCP configured with address 0 is not a member. The first hello it
//! hears tells it who can enroll it: it runs an [`Enrollee`] over that port,
//! whose CDAP messages go through the RIB daemons of both sides: the
//! enrollment objects (`/difm/enr`, `/difm/ops`, `/dt`, `/difm/nsm/dft`)
//! are the enrollment task's, and so are the answers to its requests and an
//! `M_CONNECT` from address 0 (the enrollee's source address is 0; the
//! member answers to address 0, which every IPCP takes as "for me" on
//! management PDUs). The flow-state objects the member creates
//! (`/ra/fsos/key=i`) are routing's, which hands them to the enrollment
//! until the enrollee has an address. The member runs one [`Enroller`] per
//! port, all sharing one [`Membership`] (the address space). When it is admitted
//! the enrollee takes its address and the DIF's configuration
//! ([`DifConfiguration`](rina_wire::cdap::DifConfiguration)), builds its routing and directory machines, loads
//! the member's flow-state objects and directory entries, and starts sending
//! hellos. The data-transfer constants and SDU protection must already match
//! (they are how the two talk at all): a difference fails the enrollment and
//! says which. A failed enrollment is retried at the next hello after its
//! back-off.
//!
//! Addresses are assigned by the enroller with [`NextFree`](crate::enrollment::NextFree) over
//! [`MembershipConfig::addresses`], avoiding every address it knows of
//! (its neighbours, the flow-state database, the directory). The enrollee
//! asks for an address hashed from its name, which the member gives when it
//! is free. Two members enrolling two newcomers at the same instant cannot
//! know of each other's choice and may give the same address: with the
//! disseminated directory on, the two newcomers find out from each other's
//! management entries and the one with the greater name takes another
//! address (`renumber`).
//!
//! # Unreachable flows
//!
//! With routing on, a flow whose destination has had no route for
//! [`MembershipConfig::unreachable_timeout`] fails with
//! [`EfcpError::NoRoute`], whatever its policies (an unreliable flow would
//! otherwise never notice).

#[cfg(doc)]
use super::NormalIpcp;
use super::{FlowId, N1Port, NormalConfig};
use crate::efcp::EfcpError;
use crate::enrollment::{
    AuthKeys, AuthNone, AuthPassword, AuthPolicy, Enrollee, Enroller, EnrollmentStatus, Membership,
    NonceGen, Step,
};
use crate::rmt::{Address, Rmt};
use crate::routing::LinkState;
use crate::time::Instant;
use prost::Message;
use rina_wire::cdap::{AuthPolicy as WireAuth, CdapMessage, Neighbor, OpCode, Value};
use rina_wire::AppName;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

mod admission;
mod enroll;
mod protection;
mod renumber;
#[cfg(test)]
mod tests;
pub(super) use admission::port_auth_object;
pub use admission::{
    PORT_AUTH_ANSWER, PORT_AUTH_CLASS, PORT_AUTH_HELLO, PORT_AUTH_PREFIX, PORT_AUTH_PROOF,
};
pub(super) use enroll::Adoption;
pub use protection::PortProtection;
pub use renumber::{mgmt_name, MGMT_AE};

/// RIB object a hello writes.
pub const HELLO_OBJ_NAME: &str = "/difm/enr/hello";
/// Class of [`HELLO_OBJ_NAME`].
pub const HELLO_OBJ_CLASS: &str = "Neighbor";

/// Membership policies of one IPCP.
#[derive(Debug, Clone)]
pub struct MembershipConfig {
    /// This IPCP's name (hellos, enrollment).
    pub name: AppName,
    /// Pre-shared password, proven by HMAC-SHA256 challenge–response in
    /// both directions (never sent). `None` (and no `keys`): no
    /// authentication.
    pub password: Option<String>,
    /// This member's ed25519 key pair and the DIF's trusted public keys;
    /// takes precedence over `password`.
    pub keys: Option<AuthKeys>,
    /// Seed of the enrollment nonces, which must be unpredictable: the
    /// driver fills it from a random source (`rinad`: the OS); the default
    /// (zeros) is for tests and the simulator.
    pub entropy: [u8; 32],
    /// Time between hellos on each port.
    pub hello_interval: Duration,
    /// Silence after which a neighbour is taken down.
    pub dead_interval: Duration,
    /// Addresses an enroller hands out (first, last).
    pub addresses: (Address, Address),
    /// Longest wait for each enrollment step.
    pub step_timeout: Duration,
    /// Back-off before the second enrollment attempt (doubling).
    pub initial_backoff: Duration,
    /// Attempts per enrollment run (a run starts at a hello).
    pub max_attempts: u32,
    /// A flow whose destination has no route this long fails.
    pub unreachable_timeout: Duration,
    /// Encrypt every N-1 flow (AES-256-GCM under keys that port
    /// authentication agrees, [`crate::sdup::aead`]), rotating keys as
    /// said; `None`: no encryption. Needs `password` or `keys`.
    pub encryption: Option<crate::sdup::aead::Rekey>,
}

impl MembershipConfig {
    /// Defaults: no password, hellos every second, a neighbour dead after
    /// 3.5 s of silence, addresses 1–65 535, 3 s per enrollment step, 1 s
    /// back-off, 4 attempts, flows failed after 6 s without a route.
    pub fn new(name: AppName) -> Self {
        MembershipConfig {
            name,
            password: None,
            keys: None,
            entropy: [0; 32],
            hello_interval: Duration::from_secs(1),
            dead_interval: Duration::from_millis(3500),
            addresses: (1, 65_535),
            step_timeout: Duration::from_secs(3),
            initial_backoff: Duration::from_secs(1),
            max_attempts: 4,
            unreachable_timeout: Duration::from_secs(6),
            encryption: None,
        }
    }

    fn auth(&self) -> Box<dyn AuthPolicy> {
        match (&self.keys, &self.password) {
            (Some(k), _) => Box::new(k.clone()),
            (None, Some(p)) => Box::new(AuthPassword(p.clone())),
            (None, None) => Box::new(AuthNone),
        }
    }

    /// Whether the DIF authenticates its members.
    pub fn authenticates(&self) -> bool {
        self.keys.is_some() || self.password.is_some()
    }
}

/// What membership tells the driver (through
/// [`Action::Membership`](super::Action::Membership)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MembershipEvent {
    /// The neighbour `name` at `address` answers on `port`.
    NeighborUp {
        /// The N-1 port.
        port: N1Port,
        /// Its IPCP name.
        name: AppName,
        /// Its address.
        address: Address,
    },
    /// The neighbour on `port` went silent (or its port went away).
    NeighborDown {
        /// The N-1 port.
        port: N1Port,
        /// Its address.
        address: Address,
    },
    /// An enrollment step started.
    EnrollStep {
        /// Through whom.
        via: AppName,
        /// The step.
        step: Step,
    },
    /// Enrolled: this IPCP is a member with `address`.
    Enrolled {
        /// Through whom.
        via: AppName,
        /// The address assigned.
        address: Address,
    },
    /// An enrollment attempt failed and will be retried.
    EnrollRetrying {
        /// Through whom.
        via: AppName,
        /// Why it failed (names the step).
        error: String,
        /// The attempt that failed (1 = first).
        attempt: u32,
    },
    /// Enrollment gave up (a refusal, a bad password, a mismatched DIF, or
    /// every attempt of a run failed).
    EnrollFailed {
        /// Through whom.
        via: AppName,
        /// Why (names the step).
        error: String,
    },
    /// This member admitted `peer` with `address`.
    Admitted {
        /// The new member.
        peer: AppName,
        /// Its address.
        address: Address,
    },
    /// This member refused or failed to enroll `peer`.
    Rejected {
        /// The would-be member.
        peer: AppName,
        /// Why (names the step).
        reason: String,
    },
    /// This member found another one at its address and gave way: it took
    /// address `to` (see `renumber`).
    Renumbered {
        /// The address given up.
        from: Address,
        /// The new address.
        to: Address,
        /// The management entity of the member that keeps `from`.
        twin: AppName,
    },
}

/// Counters of membership.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MembershipCounters {
    /// Hellos sent.
    pub hellos_sent: u64,
    /// Hellos received.
    pub hellos_received: u64,
    /// Hellos of another DIF, or undecodable.
    pub hellos_bad: u64,
    /// Neighbours taken down for silence.
    pub neighbor_timeouts: u64,
    /// Enrollment messages with no enrollment to take them.
    pub enroll_stray: u64,
    /// Enrollees admitted here.
    pub admitted: u64,
    /// Enrollees refused or failed here.
    pub rejected: u64,
    /// Flows failed for lack of a route.
    pub flows_unreachable: u64,
    /// Frames dropped because their N-1 port is not admitted (the peer
    /// neither enrolled nor authenticated).
    pub unadmitted_dropped: u64,
    /// N-1 ports admitted by port authentication.
    pub ports_authenticated: u64,
    /// Port authentications that failed (wrong password, untrusted key).
    pub port_auth_failed: u64,
    /// Port-authentication messages dropped because they carried back a
    /// nonce of this member's own (its messages reflected to it).
    pub port_auth_reflected: u64,
    /// Times this member gave its address up to another one that had it
    /// too, and took a new one.
    pub renumbered: u64,
    /// Addresses given to enrollees released after nothing knew them for
    /// routing's max age (members that left).
    pub addresses_released: u64,
}

impl MembershipCounters {
    /// The counters by name.
    pub fn to_map(&self) -> BTreeMap<String, u64> {
        [
            ("hellos_sent", self.hellos_sent),
            ("hellos_received", self.hellos_received),
            ("hellos_bad", self.hellos_bad),
            ("neighbor_timeouts", self.neighbor_timeouts),
            ("enroll_stray", self.enroll_stray),
            ("admitted", self.admitted),
            ("rejected", self.rejected),
            ("flows_unreachable", self.flows_unreachable),
            ("unadmitted_dropped", self.unadmitted_dropped),
            ("ports_authenticated", self.ports_authenticated),
            ("port_auth_failed", self.port_auth_failed),
            ("port_auth_reflected", self.port_auth_reflected),
            ("renumbered", self.renumbered),
            ("addresses_released", self.addresses_released),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// Where this IPCP's own enrollment is, for the RIB and `rinactl`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnrollmentReport {
    /// Through whom (empty before the first hello).
    pub via: AppName,
    /// Step, phase, attempts, last error.
    pub status: EnrollmentStatus,
}

/// What the membership machine reads of the IPCP for one call.
pub(super) struct Ctx<'a> {
    pub(super) cfg: &'a NormalConfig,
    /// The neighbour routing knows on each port: (address, cost).
    pub(super) neighbors: &'a BTreeMap<N1Port, (Address, u32)>,
    pub(super) rmt: &'a Rmt,
    pub(super) routing: Option<&'a LinkState>,
    pub(super) dft: Option<&'a crate::directory::Directory>,
}

impl Ctx<'_> {
    /// This IPCP's address (0 before it enrolls).
    fn address(&self) -> Address {
        self.cfg.address
    }

    /// The primary N-1 ports, where hellos go.
    fn ports(&self) -> Vec<N1Port> {
        self.rmt.primary_ports().collect()
    }

    /// The address of the neighbour routing knows on `port`.
    fn neighbor(&self, port: N1Port) -> Option<Address> {
        self.neighbors.get(&port).map(|n| n.0)
    }
}

/// What the membership machine asks the IPCP to do, in order.
#[derive(Debug)]
pub(super) enum MsOut {
    /// Open the CDAP session with the neighbour on `port` with this
    /// `M_CONNECT`, unless it is open.
    Connect { port: N1Port, msg: Box<CdapMessage> },
    /// Send this unconfirmed CDAP message (a hello) to the neighbour on
    /// `port`.
    Hello { port: N1Port, msg: Box<CdapMessage> },
    /// Send this encoded CDAP message of an enrollment machine to the
    /// neighbour on `port`, at `dst` (0: not known, or an enrollee).
    Enrollment {
        port: N1Port,
        dst: Address,
        bytes: Vec<u8>,
    },
    /// Send a port-authentication message of `kind` on `port`.
    PortAuth {
        port: N1Port,
        kind: u8,
        body: Vec<u8>,
    },
    /// The enrollment's `M_CONNECT` opened the session on `port`.
    SessionOpened { port: N1Port },
    /// The neighbour on `port` went silent: its session is closed.
    SessionClosed { port: N1Port },
    /// The neighbour at `address` said hello on `port` (cost 1).
    NeighborUp { port: N1Port, address: Address },
    /// The neighbour on `port` is gone.
    NeighborDown { port: N1Port },
    /// `port` has keys for the first time: send the databases again.
    Resync { port: N1Port },
    /// Take the address and configuration an enroller gave; answer with
    /// [`MembershipMachine::adopted`].
    Adopt(Box<Adoption>),
    /// Give this address up to `twin`'s member and take `to`; answer with
    /// [`MembershipMachine::renumbered`].
    Renumber { to: Address, twin: AppName },
    /// Report this to the driver.
    Report(Box<MembershipEvent>),
}

/// The membership machine of a normal IPCP.
#[derive(Debug)]
pub(super) struct MembershipMachine {
    cfg: MembershipConfig,
    /// Admission (address space); `Some` once a member.
    members: Option<Membership>,
    enrollers: BTreeMap<N1Port, Enroller>,
    enrollee: Option<(N1Port, AppName, Enrollee)>,
    /// No new enrollment run before this time (after a failed run).
    enroll_hold: Option<Instant>,
    /// Last report of the own enrollment.
    report: Option<EnrollmentReport>,
    /// When each port last carried a valid frame.
    last_heard: BTreeMap<N1Port, Instant>,
    /// The port and time [`MembershipMachine::heard`] last wrote into
    /// `last_heard`, while that entry still holds it: the frames of a
    /// turn are heard on one port at one time, and all but the first
    /// then change nothing. Cleared wherever `last_heard` is written else.
    heard_memo: Option<(N1Port, Instant)>,
    /// Who said hello on each port.
    hello_from: BTreeMap<N1Port, (AppName, Address)>,
    next_hello: Option<Instant>,
    /// Flows without a route, since when.
    unreachable_since: BTreeMap<FlowId, Instant>,
    /// Addresses given to enrollees that nothing knows (routing, the
    /// directory, the neighbours, an enrollment still running), since
    /// when; released after routing's max age (see `refresh_content`).
    unknown_since: BTreeMap<Address, Instant>,
    counters: MembershipCounters,
    /// Where every enrollment machine's nonces come from.
    nonces: NonceGen,
    /// N-1 ports whose peer is authenticated (see [`admission`]).
    admitted: BTreeSet<N1Port>,
    /// Port authentication in progress.
    port_auth: BTreeMap<N1Port, admission::PortAuth>,
    /// Keys and counters of each N-1 port's encryption, when encrypting.
    crypto: BTreeMap<N1Port, crate::sdup::aead::PortCrypto>,
    out: VecDeque<MsOut>,
}

impl MembershipMachine {
    /// The machine of an IPCP that is a member already (`enrolled`: it
    /// says hello from the start) or not.
    pub(super) fn new(cfg: MembershipConfig, enrolled: bool) -> Self {
        MembershipMachine {
            members: None,
            enrollers: BTreeMap::new(),
            enrollee: None,
            enroll_hold: None,
            report: None,
            last_heard: BTreeMap::new(),
            heard_memo: None,
            hello_from: BTreeMap::new(),
            next_hello: enrolled.then_some(Instant::ZERO),
            unreachable_since: BTreeMap::new(),
            unknown_since: BTreeMap::new(),
            counters: MembershipCounters::default(),
            nonces: NonceGen::new(cfg.entropy),
            admitted: BTreeSet::new(),
            port_auth: BTreeMap::new(),
            crypto: BTreeMap::new(),
            out: VecDeque::new(),
            cfg,
        }
    }

    /// The next thing the IPCP must do for membership.
    pub(super) fn poll_out(&mut self) -> Option<MsOut> {
        self.out.pop_front()
    }

    /// Its policies.
    pub(super) fn config(&self) -> &MembershipConfig {
        &self.cfg
    }

    pub(super) fn counters(&self) -> &MembershipCounters {
        &self.counters
    }

    fn report_event(&mut self, event: MembershipEvent) {
        self.out.push_back(MsOut::Report(Box::new(event)));
    }

    /// When the next timer is due.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        let dead = self.cfg.dead_interval;
        let enrollers = self.enrollers.values().filter_map(|e| e.poll_timeout());
        let enrollee = self
            .enrollee
            .as_ref()
            .and_then(|(_, _, e)| e.poll_timeout());
        let silence = self.last_heard.values().map(|t| *t + dead).min();
        let unreachable = self
            .unreachable_since
            .values()
            .map(|t| *t + self.cfg.unreachable_timeout)
            .min();
        enrollers
            .chain(enrollee)
            .chain(self.next_hello)
            .chain(silence)
            .chain(unreachable)
            .min()
    }

    /// Where this IPCP's own enrollment is (`None` if it never enrolled
    /// through a member).
    pub(super) fn enrollment_report(&self) -> Option<EnrollmentReport> {
        if let Some((_, via, e)) = &self.enrollee {
            return Some(EnrollmentReport {
                via: via.clone(),
                status: e.status(),
            });
        }
        self.report.clone()
    }

    /// The neighbours that said hello: (port, name, address).
    pub(super) fn hello_neighbors(&self) -> Vec<(N1Port, AppName, Address)> {
        self.hello_from
            .iter()
            .map(|(p, (n, a))| (*p, n.clone(), *a))
            .collect()
    }

    /// A new port: a hello (and port authentication) at once.
    pub(super) fn port_added(&mut self, cx: &Ctx, now: Instant, port: N1Port) {
        self.last_heard.insert(port, now);
        self.heard_memo = None;
        if cx.address() != 0 {
            self.send_hello(cx, now, port);
            self.start_port_auth(cx, now, port);
        }
    }

    /// A port went away.
    pub(super) fn port_removed(&mut self, now: Instant, port: N1Port) {
        self.last_heard.remove(&port);
        self.heard_memo = None;
        self.hello_from.remove(&port);
        self.enrollers.remove(&port);
        self.forget_port_admission(port);
        if let Some((p, _, e)) = self.enrollee.as_mut() {
            if *p == port {
                e.unreachable(now, "the N-1 flow went away");
            }
        }
    }

    /// A valid frame arrived on `port`: the neighbour is alive.
    pub(super) fn heard(&mut self, now: Instant, port: N1Port) {
        if self.heard_memo == Some((port, now)) {
            return;
        }
        if let Some(t) = self.last_heard.get_mut(&port) {
            *t = now;
            self.heard_memo = Some((port, now));
        }
    }

    /// Opens the CDAP session with the neighbour on `port` (an admitted
    /// port of a member) with `M_CONNECT`, unless it is open; sent again
    /// with every hello until it is.
    fn connect_neighbor(&mut self, cx: &Ctx, port: N1Port) {
        if cx.address() == 0 || !self.port_admitted(cx, port) {
            return;
        }
        let dif = AppName {
            process_name: cx.cfg.dif.clone(),
            ..AppName::default()
        };
        let msg = CdapMessage::connect(WireAuth::none(), &self.cfg.name, &dif);
        self.out.push_back(MsOut::Connect {
            port,
            msg: Box::new(msg),
        });
    }

    fn send_hello(&mut self, cx: &Ctx, _now: Instant, port: N1Port) {
        // The session first: the neighbour takes our hello, and floods to
        // us, once it has accepted it.
        self.connect_neighbor(cx, port);
        self.counters.hellos_sent += 1;
        let me = neighbor_obj(&self.cfg.name, cx.address());
        let msg = CdapMessage::write(HELLO_OBJ_CLASS, HELLO_OBJ_NAME, me.encode_to_vec())
            .with_src(&self.cfg.name)
            .with_dest(&AppName {
                process_name: cx.cfg.dif.clone(),
                ..AppName::default()
            });
        self.out.push_back(MsOut::Hello {
            port,
            msg: Box::new(msg),
        });
    }

    /// Sends a hello on every primary port.
    fn hello_all(&mut self, cx: &Ctx, now: Instant) {
        for p in cx.ports() {
            self.send_hello(cx, now, p);
        }
    }

    /// A hello (an `M_WRITE` of [`HELLO_OBJ_NAME`]) from the neighbour on
    /// `port`, through the RIB daemon.
    pub(super) fn on_hello(&mut self, cx: &Ctx, now: Instant, port: N1Port, msg: &CdapMessage) {
        let parsed = {
            let ok = msg.op_code() == OpCode::Write
                && msg.obj_name.as_deref() == Some(HELLO_OBJ_NAME)
                && msg.dest_name().process_name == cx.cfg.dif;
            match msg.value().filter(|_| ok) {
                Some(Value::Bytes(b)) => Neighbor::decode(b.as_slice())
                    .ok()
                    .map(|n| (msg.src_name(), n.address)),
                _ => None,
            }
        };
        let Some((name, address)) = parsed else {
            self.counters.hellos_bad += 1;
            return;
        };
        self.counters.hellos_received += 1;
        self.hello_from.insert(port, (name.clone(), address));
        if address == 0 {
            // Not a member yet: it will enroll through someone.
            return;
        }
        if cx.address() == 0 {
            self.maybe_start_enrollment(cx, now, port, name);
            return;
        }
        if address == cx.address() {
            return;
        }
        if cx.neighbor(port) != Some(address) {
            self.out.push_back(MsOut::NeighborUp { port, address });
            self.report_event(MembershipEvent::NeighborUp {
                port,
                name,
                address,
            });
        }
    }

    /// Runs the timers that are due; returns whether a round of hellos
    /// went out (when flows' reachability is checked, see
    /// [`MembershipMachine::unreachable`]).
    pub(super) fn handle_timeout(&mut self, cx: &Ctx, now: Instant) -> bool {
        self.enrollment_timeout(cx, now);
        // Silent neighbours.
        let dead = self.cfg.dead_interval;
        let silent: Vec<N1Port> = self
            .last_heard
            .iter()
            .filter(|(_, t)| **t + dead <= now)
            .map(|(p, _)| *p)
            .collect();
        for p in silent {
            // Checked again after the next interval.
            self.last_heard.insert(p, now);
            self.heard_memo = None;
            self.hello_from.remove(&p);
            // Opened again with the next hello.
            self.out.push_back(MsOut::SessionClosed { port: p });
            if let Some(address) = cx.neighbor(p) {
                self.counters.neighbor_timeouts += 1;
                self.out.push_back(MsOut::NeighborDown { port: p });
                self.report_event(MembershipEvent::NeighborDown { port: p, address });
            }
        }
        // Hellos.
        if cx.address() == 0 || matches!(self.next_hello, Some(t) if t > now) {
            return false;
        }
        self.next_hello = Some(now + self.cfg.hello_interval);
        for p in cx.ports() {
            self.send_hello(cx, now, p);
            self.start_port_auth(cx, now, p);
        }
        self.rekey_by_time(now);
        true
    }

    /// Of the IPCP's flows not failed yet, and whether each has a route:
    /// those that have had none for too long, which fail with the error
    /// returned. Keeps since when each has had none.
    pub(super) fn unreachable(
        &mut self,
        now: Instant,
        flows: &[(FlowId, bool)],
    ) -> (Vec<FlowId>, EfcpError) {
        // A set, not a scan of `flows` per entry: with many flows
        // unreachable at once that would be quadratic.
        let unreachable: BTreeSet<FlowId> =
            flows.iter().filter(|(_, r)| !r).map(|(f, _)| *f).collect();
        self.unreachable_since
            .retain(|id, _| unreachable.contains(id));
        let limit = self.cfg.unreachable_timeout;
        let mut failed = Vec::new();
        for id in unreachable {
            let since = *self.unreachable_since.entry(id).or_insert(now);
            if since + limit <= now {
                failed.push(id);
            }
        }
        for id in &failed {
            self.unreachable_since.remove(id);
            self.counters.flows_unreachable += 1;
        }
        let error = EfcpError::NoRoute {
            secs: limit.as_secs(),
        };
        (failed, error)
    }
}

/// The address an enrollee asks for: a hash (FNV-1a) of its name, spread
/// over `first..=last`. The member gives it if it is free there, and the
/// lowest free one otherwise.
fn preferred_address(name: &AppName, first: Address, last: Address) -> Address {
    let first = first.max(1);
    if last < first {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.to_string().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let span = last - first;
    if span == u64::MAX {
        return h.max(1);
    }
    first + h % (span + 1)
}

/// The `Neighbor` object naming `name` at `address`.
fn neighbor_obj(name: &AppName, address: Address) -> Neighbor {
    Neighbor {
        ap_name: name.process_name.clone(),
        ap_instance: name.process_instance.clone(),
        ae_name: name.entity_name.clone(),
        ae_instance: name.entity_instance.clone(),
        address,
        supporting_difs: Vec::new(),
    }
}
