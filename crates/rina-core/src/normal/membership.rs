//! DIF membership in the normal IPCP: neighbour hellos and liveness,
//! enrollment over N-1 ports (as enrollee and as enroller), and the failure
//! of flows whose destination stays unreachable. Together with the driver's
//! N-1 flow set-up this is the resource allocator of the IPCP: it turns N-1
//! ports into neighbours (and back) for routing and the directory.
//!
//! Enabled by [`NormalConfig::membership`](super::NormalConfig::membership).
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
//! ([`DifConfiguration`]), builds its routing and directory machines, loads
//! the member's flow-state objects and directory entries, and starts sending
//! hellos. The data-transfer constants and SDU protection must already match
//! (they are how the two talk at all): a difference fails the enrollment and
//! says which. A failed enrollment is retried at the next hello after its
//! back-off.
//!
//! Addresses are assigned by the enroller with [`NextFree`] over
//! [`MembershipConfig::addresses`], avoiding every address it knows of
//! (its neighbours, the flow-state database, the directory). The enrollee
//! asks for an address hashed from its name, which the member gives when it
//! is free. Two members enrolling two newcomers at the same instant cannot
//! know of each other's choice and may give the same address: with the
//! disseminated directory on, the two newcomers find out from each other's
//! management entries and the one with the greater name takes another
//! address ([`renumber`]).
//!
//! # Unreachable flows
//!
//! With routing on, a flow whose destination has had no route for
//! [`MembershipConfig::unreachable_timeout`] fails with
//! [`EfcpError::NoRoute`], whatever its policies (an unreliable flow would
//! otherwise never notice).

use super::mgmt_rib::Peer;
use super::{Action, N1Port, NormalIpcp, QosCube};
use crate::cdap_session::State as SessionState;
use crate::efcp::{EfcpConfig, EfcpError};
use crate::enrollment::{
    AuthKeys, AuthNone, AuthPassword, AuthPolicy, DifConfigBlob, DifContent, Enrollee,
    EnrolleeConfig, Enroller, EnrollerConfig, EnrollerEvent, EnrollmentError, EnrollmentEvent,
    EnrollmentStatus, Membership, NextFree, NonceGen, Step,
};
use crate::rib::OwnerId;
use crate::rmt::Address;
use crate::routing::{decode_fsos, encode_fsos, LinkState};
use crate::time::Instant;
use prost::Message;
use rina_wire::cdap::{
    AuthPolicy as WireAuth, CdapMessage, DifConfiguration, Neighbor, OpCode, QosCubeInfo, Value,
};
use rina_wire::pci::FieldWidth;
use rina_wire::AppName;
use std::collections::BTreeMap;
use std::time::Duration;

mod admission;
mod protection;
mod renumber;
pub use admission::{PORT_AUTH_ANSWER, PORT_AUTH_HELLO, PORT_AUTH_PREFIX, PORT_AUTH_PROOF};
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
    /// address `to` (see [`renumber`]).
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
    /// Times this member gave its address up to another one that had it
    /// too, and took a new one.
    pub renumbered: u64,
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
            ("renumbered", self.renumbered),
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

/// Membership state of a normal IPCP.
#[derive(Debug)]
pub(super) struct MembershipState {
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
    /// Who said hello on each port.
    hello_from: BTreeMap<N1Port, (AppName, Address)>,
    next_hello: Option<Instant>,
    /// Flows without a route, since when.
    unreachable_since: BTreeMap<super::FlowId, Instant>,
    counters: MembershipCounters,
    /// Where every enrollment machine's nonces come from.
    nonces: NonceGen,
    /// N-1 ports whose peer is authenticated (see [`admission`]).
    admitted: std::collections::BTreeSet<N1Port>,
    /// Port authentication in progress.
    port_auth: BTreeMap<N1Port, admission::PortAuth>,
    /// Keys and counters of each N-1 port's encryption, when encrypting.
    crypto: BTreeMap<N1Port, crate::sdup::aead::PortCrypto>,
}

impl MembershipState {
    /// State of an IPCP that is a member already (`enrolled`: it says hello
    /// from the start) or not.
    pub(super) fn new(cfg: MembershipConfig, enrolled: bool) -> Self {
        MembershipState {
            members: None,
            enrollers: BTreeMap::new(),
            enrollee: None,
            enroll_hold: None,
            report: None,
            last_heard: BTreeMap::new(),
            hello_from: BTreeMap::new(),
            next_hello: enrolled.then_some(Instant::ZERO),
            unreachable_since: BTreeMap::new(),
            counters: MembershipCounters::default(),
            nonces: NonceGen::new(cfg.entropy),
            admitted: std::collections::BTreeSet::new(),
            port_auth: BTreeMap::new(),
            crypto: BTreeMap::new(),
            cfg,
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
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

/// The DIF configuration as sent to enrollees.
fn dif_configuration(ipcp: &NormalIpcp) -> DifConfiguration {
    let c = &ipcp.cfg;
    let w = |f: FieldWidth| f.bytes() as u32;
    DifConfiguration {
        dif_name: c.dif.clone(),
        address_length: w(c.dt.addr),
        cep_id_length: w(c.dt.cep),
        qos_id_length: w(c.dt.qos),
        length_length: w(c.dt.length),
        seq_num_length: w(c.dt.seq),
        ctrl_seq_num_length: w(c.dt.ctrl_seq),
        rate_length: w(c.dt.rate),
        frame_length: w(c.dt.frame),
        max_pdu_size: c.dt.max_pdu_size,
        max_pdu_lifetime_ms: c.dt.max_pdu_lifetime_ms,
        ttl: c.sdup.ttl.map_or(0, u32::from),
        crc: c.sdup.crc,
        max_sdu: c.max_sdu as u64,
        link_state_routing: c.routing.is_some(),
        distributed_directory: c.dynamic_directory.is_some(),
        qos_cubes: c
            .cubes
            .iter()
            .map(|q| QosCubeInfo {
                id: q.id,
                name: q.name.clone(),
                reliable: q.is_reliable(),
            })
            .collect(),
    }
}

/// The differences between the member's wire profile and ours, if any.
fn profile_mismatch(ours: &DifConfiguration, theirs: &DifConfiguration) -> Option<String> {
    let mut diffs = Vec::new();
    macro_rules! cmp {
        ($($field:ident: $what:literal),* $(,)?) => {$(
            if ours.$field != theirs.$field {
                diffs.push(format!(
                    "{} {} at the member, {} here",
                    $what, theirs.$field, ours.$field
                ));
            }
        )*};
    }
    cmp!(
        dif_name: "DIF",
        address_length: "address length",
        cep_id_length: "CEP-id length",
        qos_id_length: "QoS-id length",
        length_length: "length length",
        seq_num_length: "sequence number length",
        ctrl_seq_num_length: "control sequence number length",
        rate_length: "rate length",
        frame_length: "frame length",
        max_pdu_size: "max PDU size",
        ttl: "TTL",
        crc: "CRC",
    );
    (!diffs.is_empty()).then(|| diffs.join(", "))
}

/// The cubes of a received configuration, with the built-in EFCP policies
/// (reliable or unreliable) each names.
fn cubes_of(conf: &DifConfiguration) -> Vec<QosCube> {
    conf.qos_cubes
        .iter()
        .map(|q| {
            let efcp = if q.reliable {
                EfcpConfig::reliable()
            } else {
                EfcpConfig::unreliable()
            };
            QosCube::new(q.id, q.name.clone(), efcp)
        })
        .collect()
}

impl NormalIpcp {
    /// Whether this IPCP is a member of its DIF (has an address).
    pub fn is_enrolled(&self) -> bool {
        self.cfg.address != 0
    }

    /// Where this IPCP's own enrollment is (`None` if it never enrolled
    /// through a member: configured with an address, or no hello heard yet).
    pub fn enrollment_report(&self) -> Option<EnrollmentReport> {
        let m = self.mship.as_ref()?;
        if let Some((_, via, e)) = &m.enrollee {
            return Some(EnrollmentReport {
                via: via.clone(),
                status: e.status(),
            });
        }
        m.report.clone()
    }

    /// Membership counters, when membership is configured.
    pub fn membership_counters(&self) -> Option<&MembershipCounters> {
        self.mship.as_ref().map(|m| &m.counters)
    }

    /// The neighbours that said hello: (port, name, address).
    pub fn hello_neighbors(&self) -> Vec<(N1Port, AppName, Address)> {
        self.mship.as_ref().map_or_else(Vec::new, |m| {
            m.hello_from
                .iter()
                .map(|(p, (n, a))| (*p, n.clone(), *a))
                .collect()
        })
    }

    /// Membership side of a new port: send a hello at once.
    pub(super) fn membership_port_added(&mut self, now: Instant, port: N1Port) {
        let Some(m) = self.mship.as_mut() else {
            return;
        };
        m.last_heard.insert(port, now);
        if self.cfg.address != 0 {
            self.send_hello(now, port);
            self.start_port_auth(now, port);
        }
    }

    /// Membership side of a port going away.
    pub(super) fn membership_port_removed(&mut self, port: N1Port) {
        let Some(m) = self.mship.as_mut() else {
            return;
        };
        m.last_heard.remove(&port);
        m.hello_from.remove(&port);
        m.enrollers.remove(&port);
        self.forget_port_admission(port);
        let Some(m) = self.mship.as_mut() else {
            return;
        };
        if m.enrollee.as_ref().is_some_and(|(p, _, _)| *p == port) {
            if let Some((_, _, e)) = m.enrollee.as_mut() {
                e.unreachable(self.now, "the N-1 flow went away");
            }
        }
    }

    /// A valid frame arrived on `port`: the neighbour is alive.
    pub(super) fn membership_heard(&mut self, now: Instant, port: N1Port) {
        if let Some(m) = self.mship.as_mut() {
            if let Some(t) = m.last_heard.get_mut(&port) {
                *t = now;
            }
        }
    }

    /// Opens the CDAP session with the neighbour on `port` (an admitted
    /// port of a member) with `M_CONNECT`, unless it is open; sent again
    /// with every hello until it is.
    fn connect_neighbor(&mut self, now: Instant, port: N1Port) {
        let Some(m) = self.mship.as_ref() else {
            return;
        };
        if self.cfg.address == 0 || !self.port_admitted(port) {
            return;
        }
        let dif = AppName {
            process_name: self.cfg.dif.clone(),
            ..AppName::default()
        };
        let connect = CdapMessage::connect(WireAuth::none(), &m.cfg.name, &dif);
        if let Some(msg) = self.mgmt.connect(now, Peer::Neighbor(port), connect) {
            self.send_cdap(now, Peer::Neighbor(port), &msg);
        }
    }

    /// Closes the open CDAP session with the neighbour on `port` with an
    /// (unconfirmed) `M_RELEASE`, before the port goes away.
    pub(super) fn release_session(&mut self, now: Instant, port: N1Port) {
        let peer = Peer::Neighbor(port);
        if self.mship.is_none() || self.mgmt.state(peer) != super::mgmt_rib::SessionState::Open {
            return;
        }
        self.mgmt.unconfirmed(now, peer);
        self.send_cdap(now, peer, &CdapMessage::release());
        self.mgmt.closed(peer);
    }

    fn send_hello(&mut self, now: Instant, port: N1Port) {
        // The session first: the neighbour takes our hello, and floods to
        // us, once it has accepted it.
        self.connect_neighbor(now, port);
        let Some(m) = self.mship.as_mut() else {
            return;
        };
        m.counters.hellos_sent += 1;
        let me = neighbor_obj(&m.cfg.name, self.cfg.address);
        let msg = CdapMessage::write(HELLO_OBJ_CLASS, HELLO_OBJ_NAME, me.encode_to_vec())
            .with_src(&m.cfg.name)
            .with_dest(&AppName {
                process_name: self.cfg.dif.clone(),
                ..AppName::default()
            });
        self.mgmt.unconfirmed(now, Peer::Neighbor(port));
        self.send_cdap(now, Peer::Neighbor(port), &msg);
    }

    /// A hello (an `M_WRITE` of [`HELLO_OBJ_NAME`]) from the neighbour on
    /// `port`, through the RIB daemon.
    pub(super) fn on_hello(&mut self, now: Instant, port: N1Port, msg: &CdapMessage) {
        let dif = self.cfg.dif.clone();
        let Some(m) = self.mship.as_mut() else {
            self.counters.rx_mgmt_unhandled += 1;
            return;
        };
        let parsed = {
            let ok = msg.op_code() == OpCode::Write
                && msg.obj_name.as_deref() == Some(HELLO_OBJ_NAME)
                && msg.dest_name().process_name == dif;
            match msg.value().filter(|_| ok) {
                Some(Value::Bytes(b)) => Neighbor::decode(b.as_slice())
                    .ok()
                    .map(|n| (msg.src_name(), n.address)),
                _ => None,
            }
        };
        let Some((name, address)) = parsed else {
            m.counters.hellos_bad += 1;
            return;
        };
        m.counters.hellos_received += 1;
        m.hello_from.insert(port, (name.clone(), address));
        if address == 0 {
            // Not a member yet: it will enroll through someone.
            return;
        }
        if self.cfg.address == 0 {
            self.maybe_start_enrollment(now, port, name);
            return;
        }
        if address == self.cfg.address {
            return;
        }
        if self.neighbors.get(&port).map(|n| n.0) != Some(address) {
            self.neighbor_up(now, port, address, 1);
            self.actions
                .push_back(Action::Membership(MembershipEvent::NeighborUp {
                    port,
                    name,
                    address,
                }));
        }
    }

    fn maybe_start_enrollment(&mut self, now: Instant, port: N1Port, via: AppName) {
        let Some(m) = self.mship.as_mut() else {
            return;
        };
        if m.enrollee.is_some() || m.enroll_hold.is_some_and(|t| now < t) {
            return;
        }
        let mut ec = EnrolleeConfig::new(m.cfg.name.clone(), via.clone());
        // Ask for an address derived from our name, so that members
        // enrolling several newcomers at once rarely offer the same one.
        let (first, last) = m.cfg.addresses;
        ec.address = preferred_address(&m.cfg.name, first, last.min(self.cfg.dt.addr.max_value()));
        ec.step_timeout = m.cfg.step_timeout;
        ec.initial_backoff = m.cfg.initial_backoff;
        ec.max_backoff = m.cfg.initial_backoff * 8;
        ec.max_attempts = m.cfg.max_attempts.max(1);
        let mut e = Enrollee::new(ec, m.cfg.auth()).with_nonces(m.nonces.child());
        e.start(now);
        m.enrollee = Some((port, via, e));
        self.run_enrollee(now);
    }

    /// An enrollment message from the neighbour on `port`, through the RIB
    /// daemon: for this IPCP's enrollee when it is not a member, for the
    /// enroller of that port when it is.
    pub(super) fn on_enroll_cdap(&mut self, now: Instant, port: N1Port, msg: &CdapMessage) {
        let bytes = msg.encode();
        let enrolled = self.cfg.address != 0;
        let Some(m) = self.mship.as_mut() else {
            self.counters.rx_mgmt_unhandled += 1;
            return;
        };
        if !enrolled {
            let connected = match m.enrollee.as_mut() {
                Some((p, _, e)) if *p == port => {
                    e.on_message(now, &bytes);
                    e.session().state() == SessionState::Connected
                }
                _ => {
                    m.counters.enroll_stray += 1;
                    return;
                }
            };
            if connected {
                // The enrollment's M_CONNECT opened the session.
                self.mgmt.opened(now, Peer::Neighbor(port));
            }
            self.run_enrollee(now);
            return;
        }
        if self.mship.as_ref().is_some_and(|m| m.members.is_none()) {
            let members = self.new_membership();
            if let Some(m) = self.mship.as_mut() {
                m.members = Some(members);
            }
        }
        self.refresh_content(now);
        let Some(m) = self.mship.as_mut() else {
            return;
        };
        let Some(members) = m.members.as_mut() else {
            m.counters.enroll_stray += 1;
            return;
        };
        let cfg = EnrollerConfig {
            step_timeout: m.cfg.step_timeout,
            ..EnrollerConfig::default()
        };
        let nonces = &mut m.nonces;
        let e = m
            .enrollers
            .entry(port)
            .or_insert_with(|| Enroller::new(cfg).with_nonces(nonces.child()));
        e.on_message(now, &bytes, members);
        self.run_enroller(now, port);
    }

    /// Brings the content given to enrollees up to date and reserves every
    /// address known to be in use.
    fn refresh_content(&mut self, now: Instant) {
        let conf = dif_configuration(self).encode_to_vec();
        let mut known: Vec<Address> = self.neighbors.values().map(|n| n.0).collect();
        let mut neighbors = Vec::new();
        let fsos: Vec<crate::routing::Fso> = self
            .routing
            .as_ref()
            .map_or_else(Vec::new, |r| r.fsos(now).collect());
        for f in &fsos {
            known.push(f.origin);
            known.push(f.neighbor);
        }
        let entries: Vec<crate::directory::DirEntry> = self
            .dft
            .as_ref()
            .map_or_else(Vec::new, |d| d.entries(now).collect());
        known.extend(entries.iter().map(|e| e.address));
        let Some(m) = self.mship.as_mut() else {
            return;
        };
        neighbors.push(neighbor_obj(&m.cfg.name, self.cfg.address));
        for (name, addr) in m.hello_from.values() {
            if *addr != 0 {
                neighbors.push(neighbor_obj(name, *addr));
            }
        }
        let Some(members) = m.members.as_mut() else {
            return;
        };
        for a in known {
            if members.holder(a).is_none() {
                members.reserve(a, "member");
            }
        }
        members.content = DifContent {
            config: DifConfigBlob(conf),
            neighbors,
            directory: if entries.is_empty() {
                Vec::new()
            } else {
                vec![crate::directory::encode_entries(&entries)]
            },
            fsos: if fsos.is_empty() {
                Vec::new()
            } else {
                vec![encode_fsos(&fsos)]
            },
        };
    }

    /// Sends one encoded CDAP message of an enrollment machine to the
    /// neighbour on `port` (at `dst`) through the RIB daemon: its requests
    /// are recorded in the neighbour's session, so that their answers come
    /// back to the enrollment; an accepting `M_CONNECT_R` opens the
    /// session.
    fn send_enrollment(&mut self, now: Instant, port: N1Port, dst: Address, bytes: &[u8]) {
        let peer = Peer::Neighbor(port);
        match CdapMessage::decode(bytes) {
            Ok(msg) if !msg.is_response() && msg.invoke_id.is_some() => {
                self.mgmt.request(now, peer, OwnerId::ENROLLMENT, msg);
            }
            Ok(msg) if msg.op_code() == OpCode::ConnectR && msg.result.unwrap_or(0) == 0 => {
                self.mgmt.opened(now, peer);
            }
            _ => {}
        }
        let mut payload = vec![super::CDAP_DISCRIMINATOR];
        payload.extend_from_slice(bytes);
        self.send_management(now, port, dst, &payload);
    }

    fn run_enroller(&mut self, now: Instant, port: N1Port) {
        let mut out = Vec::new();
        let mut events = Vec::new();
        if let Some(e) = self.mship.as_mut().and_then(|m| m.enrollers.get_mut(&port)) {
            while let Some(b) = e.poll_transmit() {
                out.push(b);
            }
            while let Some(ev) = e.poll_event() {
                events.push(ev);
            }
        }
        for b in out {
            self.send_enrollment(now, port, 0, &b);
        }
        for ev in events {
            match ev {
                EnrollerEvent::Admitted { address, peer } => {
                    if let Some(m) = self.mship.as_mut() {
                        m.counters.admitted += 1;
                        m.hello_from.insert(port, (peer.clone(), address));
                    }
                    self.admit_port(now, port);
                    if self.neighbors.get(&port).map(|n| n.0) != Some(address) {
                        self.neighbor_up(now, port, address, 1);
                    }
                    self.send_hello(now, port);
                    self.actions
                        .push_back(Action::Membership(MembershipEvent::Admitted {
                            peer,
                            address,
                        }));
                }
                EnrollerEvent::Rejected { peer, reason } => {
                    if let Some(m) = self.mship.as_mut() {
                        m.counters.rejected += 1;
                    }
                    self.actions
                        .push_back(Action::Membership(MembershipEvent::Rejected {
                            peer,
                            reason: reason.to_string(),
                        }));
                }
            }
        }
    }

    fn run_enrollee(&mut self, now: Instant) {
        let mut out = Vec::new();
        let mut events = Vec::new();
        let Some(m) = self.mship.as_mut() else {
            return;
        };
        let Some((port, via, e)) = m.enrollee.as_mut() else {
            return;
        };
        let (port, via) = (*port, via.clone());
        while let Some(b) = e.poll_transmit() {
            out.push(b);
        }
        while let Some(ev) = e.poll_event() {
            events.push(ev);
        }
        let dst = m.hello_from.get(&port).map_or(0, |h| h.1);
        for b in out {
            self.send_enrollment(now, port, dst, &b);
        }
        for ev in events {
            let event = match ev {
                EnrollmentEvent::Progress { step } => MembershipEvent::EnrollStep {
                    via: via.clone(),
                    step,
                },
                EnrollmentEvent::Retrying { error, attempt, .. } => {
                    MembershipEvent::EnrollRetrying {
                        via: via.clone(),
                        error: error.to_string(),
                        attempt,
                    }
                }
                EnrollmentEvent::Failed(error) => {
                    self.end_enrollee(now, None);
                    MembershipEvent::EnrollFailed {
                        via: via.clone(),
                        error: error.to_string(),
                    }
                }
                EnrollmentEvent::Enrolled {
                    address,
                    config,
                    neighbors: _,
                    directory,
                    fsos,
                } => match self.adopt(now, port, address, &config, &directory, &fsos) {
                    Ok(()) => {
                        self.end_enrollee(now, Some(address));
                        // The member we enrolled through proved itself; the
                        // other neighbours authenticate on their ports.
                        self.admit_port(now, port);
                        let ports: Vec<N1Port> = self.rmt.primary_ports().collect();
                        for p in ports {
                            self.start_port_auth(now, p);
                        }
                        MembershipEvent::Enrolled {
                            via: via.clone(),
                            address,
                        }
                    }
                    Err(why) => {
                        let error = EnrollmentError::Protocol {
                            step: Step::Configuration,
                            detail: why,
                        };
                        self.end_enrollee(now, None);
                        if let Some(r) = self.mship.as_mut().and_then(|m| m.report.as_mut()) {
                            r.status.last_error = Some(error.to_string());
                        }
                        MembershipEvent::EnrollFailed {
                            via: via.clone(),
                            error: error.to_string(),
                        }
                    }
                },
            };
            self.actions.push_back(Action::Membership(event));
        }
    }

    /// Ends the running enrollment, keeping its report; after a failure no
    /// new run starts for a back-off.
    fn end_enrollee(&mut self, now: Instant, enrolled: Option<Address>) {
        let Some(m) = self.mship.as_mut() else {
            return;
        };
        if let Some((_, via, e)) = m.enrollee.take() {
            m.report = Some(EnrollmentReport {
                via,
                status: e.status(),
            });
        }
        if enrolled.is_none() {
            m.enroll_hold = Some(now + m.cfg.initial_backoff * 4);
        }
    }

    /// The admission state of a member: its auth policy, the address range,
    /// its own address reserved.
    fn new_membership(&self) -> Membership {
        let (auth, (first, last)) = match self.mship.as_ref() {
            Some(m) => (m.cfg.auth(), m.cfg.addresses),
            None => (Box::new(AuthNone) as Box<dyn AuthPolicy>, (1, 65_535)),
        };
        let last = last.min(self.cfg.dt.addr.max_value());
        let mut members = Membership::new(
            auth,
            Box::new(NextFree::new(first, last)),
            DifContent::default(),
        );
        members.reserve(self.cfg.address, "self");
        members
    }

    /// Takes the address and configuration an enroller gave.
    fn adopt(
        &mut self,
        now: Instant,
        port: N1Port,
        address: Address,
        config: &DifConfigBlob,
        directory: &[Vec<u8>],
        fsos: &[Vec<u8>],
    ) -> Result<(), String> {
        let theirs = DifConfiguration::decode(config.0.as_slice())
            .map_err(|e| format!("the DIF configuration does not decode: {e}"))?;
        if let Some(d) = profile_mismatch(&dif_configuration(self), &theirs) {
            return Err(format!("the DIF's wire profile differs: {d}"));
        }
        if address == 0 || address > self.cfg.dt.addr.max_value() {
            return Err(format!("address {address} does not fit the DIF"));
        }
        let mut cubes = cubes_of(&theirs);
        // The mapping onto the DIFs below is local: keep what this IPCP's
        // own configuration says for a cube of the same name.
        for c in &mut cubes {
            if let Some(mine) = self.cfg.cubes.iter().find(|m| m.name == c.name) {
                c.lower = mine.lower.clone();
            }
        }
        if cubes.iter().any(|c| c.id > self.cfg.dt.qos.max_value()) {
            return Err("a QoS-id does not fit the DIF".into());
        }
        self.cfg.address = address;
        if !cubes.is_empty() {
            self.cfg.cubes = cubes;
        }
        self.cfg.max_sdu = usize::try_from(theirs.max_sdu).unwrap_or(usize::MAX).max(1);
        if theirs.link_state_routing && self.cfg.routing.is_none() {
            self.cfg.routing = Some(crate::routing::Config::default());
        }
        if theirs.distributed_directory && self.cfg.dynamic_directory.is_none() {
            self.cfg.dynamic_directory = Some(crate::directory::Config::default());
        }
        if let Some(rc) = self.cfg.routing.clone() {
            self.routing = Some(LinkState::new(address, rc).map_err(|e| e.to_string())?);
        }
        if let Some(dc) = self.cfg.dynamic_directory.clone() {
            let mut d = crate::directory::Directory::new(address, dc).map_err(|e| e.to_string())?;
            let names: Vec<AppName> = self.names().cloned().collect();
            for n in names {
                let _ = d.register(now, n);
            }
            self.dft = Some(d);
            self.register_mgmt_entity(now);
        }
        let members = self.new_membership();
        if let Some(m) = self.mship.as_mut() {
            m.members = Some(members);
        }
        // The enroller is our first neighbour; its databases are ours.
        let enroller = self
            .mship
            .as_ref()
            .and_then(|m| m.hello_from.get(&port))
            .map_or(0, |h| h.1);
        if enroller != 0 {
            self.neighbor_up(now, port, enroller, 1);
        }
        for blob in fsos {
            if let (Ok(list), Some(r)) = (decode_fsos(blob), self.routing.as_mut()) {
                r.on_fsos(now, port, list);
            }
        }
        for blob in directory {
            if let (Ok(list), Some(d)) = (crate::directory::decode_entries(blob), self.dft.as_mut())
            {
                d.on_entries(now, port, list);
            }
        }
        self.routing_timeout(now);
        self.directory_timeout(now);
        let ports: Vec<N1Port> = self.rmt.primary_ports().collect();
        for p in ports {
            self.send_hello(now, p);
        }
        if let Some(m) = self.mship.as_mut() {
            m.next_hello = Some(now + m.cfg.hello_interval);
        }
        Ok(())
    }

    /// Membership timers.
    pub(super) fn membership_poll_timeout(&self) -> Option<Instant> {
        self.mship.as_ref().and_then(|m| m.poll_timeout())
    }

    /// Runs the membership timers that are due.
    pub(super) fn membership_timeout(&mut self, now: Instant) {
        let Some(m) = self.mship.as_mut() else {
            return;
        };
        // Enrollment timers.
        if let Some((_, _, e)) = m.enrollee.as_mut() {
            if e.poll_timeout().is_some_and(|t| t <= now) {
                e.handle_timeout(now);
            }
        }
        let due: Vec<N1Port> = m
            .enrollers
            .iter()
            .filter(|(_, e)| e.poll_timeout().is_some_and(|t| t <= now))
            .map(|(p, _)| *p)
            .collect();
        if let Some(members) = m.members.as_mut() {
            for p in &due {
                if let Some(e) = m.enrollers.get_mut(p) {
                    e.handle_timeout(now, members);
                }
            }
        }
        self.run_enrollee(now);
        for p in due {
            self.run_enroller(now, p);
        }
        // Silent neighbours.
        let Some(m) = self.mship.as_mut() else {
            return;
        };
        let dead = m.cfg.dead_interval;
        let silent: Vec<N1Port> = m
            .last_heard
            .iter()
            .filter(|(_, t)| **t + dead <= now)
            .map(|(p, _)| *p)
            .collect();
        for p in silent {
            if let Some(m) = self.mship.as_mut() {
                // Checked again after the next interval.
                m.last_heard.insert(p, now);
                m.hello_from.remove(&p);
            }
            // Opened again with the next hello.
            self.mgmt.closed(Peer::Neighbor(p));
            if let Some(&(address, _)) = self.neighbors.get(&p) {
                if let Some(m) = self.mship.as_mut() {
                    m.counters.neighbor_timeouts += 1;
                }
                self.neighbor_down(now, p);
                self.actions
                    .push_back(Action::Membership(MembershipEvent::NeighborDown {
                        port: p,
                        address,
                    }));
            }
        }
        // Hellos.
        let Some(m) = self.mship.as_mut() else {
            return;
        };
        if self.cfg.address != 0 && !matches!(m.next_hello, Some(t) if t > now) {
            m.next_hello = Some(now + m.cfg.hello_interval);
            let ports: Vec<N1Port> = self.rmt.primary_ports().collect();
            for p in ports {
                self.send_hello(now, p);
                self.start_port_auth(now, p);
            }
            self.rekey_by_time(now);
            self.check_unreachable(now);
        }
    }

    /// Fails flows whose destination has had no route for too long.
    fn check_unreachable(&mut self, now: Instant) {
        if self.routing.is_none() {
            return;
        }
        let me = self.cfg.address;
        let table = self.rmt.table();
        let flows: Vec<(super::FlowId, bool)> = self
            .flows
            .iter()
            .filter(|(_, f)| !f.failure_reported)
            .map(|(id, f)| {
                let reach = f.ep.remote_addr == me
                    || table
                        .lookup(f.ep.remote_addr, f.ep.qos_id, f.hash)
                        .is_some();
                (*id, reach)
            })
            .collect();
        let Some(m) = self.mship.as_mut() else {
            return;
        };
        // A set, not a scan of `flows` per entry: with many flows
        // unreachable at once that would be quadratic.
        let unreachable: std::collections::BTreeSet<super::FlowId> =
            flows.iter().filter(|(_, r)| !r).map(|(f, _)| *f).collect();
        m.unreachable_since.retain(|id, _| unreachable.contains(id));
        let limit = m.cfg.unreachable_timeout;
        let mut failed = Vec::new();
        for (id, reach) in flows {
            if reach {
                continue;
            }
            let since = *m.unreachable_since.entry(id).or_insert(now);
            if since + limit <= now {
                failed.push(id);
            }
        }
        for id in failed {
            if let Some(m) = self.mship.as_mut() {
                m.unreachable_since.remove(&id);
                m.counters.flows_unreachable += 1;
            }
            if let Some(f) = self.flows.get_mut(&id) {
                f.failure_reported = true;
                self.actions.push_back(Action::FlowFailed {
                    flow: id,
                    error: EfcpError::NoRoute {
                        secs: limit.as_secs(),
                    },
                });
            }
        }
    }
}
