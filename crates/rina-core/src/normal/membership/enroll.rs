//! Enrollment in the membership machine: the enrollee this IPCP runs while
//! it is not a member, the enrollers it runs (one per port) once it is,
//! what it gives enrollees, and what it takes from its enroller.

use super::{
    neighbor_obj, preferred_address, Ctx, EnrollmentReport, MembershipEvent, MembershipMachine,
    MsOut,
};
use crate::cdap_session::State as SessionState;
use crate::efcp::EfcpConfig;
use crate::enrollment::{
    DifConfigBlob, DifContent, Enrollee, EnrolleeConfig, Enroller, EnrollerConfig, EnrollerEvent,
    EnrollmentError, EnrollmentEvent, Membership, NextFree, Phase, Step, OBJ_ENROLLMENT,
};
use crate::normal::{N1Port, NormalConfig, QosCube};
use crate::rmt::Address;
use crate::routing::encode_fsos;
use crate::time::Instant;
use prost::Message;
use rina_wire::cdap::{CdapMessage, DifConfiguration, OpCode, QosCubeInfo};
use rina_wire::pci::FieldWidth;
use rina_wire::AppName;

/// Holder of the addresses a member learnt are in use (from its
/// neighbours, routing and the directory), as opposed to those it gave to
/// enrollees.
const LEARNT: &str = "member";
/// Holder of the member's own address.
const SELF: &str = "self";

/// What an enroller gave this IPCP, checked against its own wire profile:
/// for the IPCP to take ([`MsOut::Adopt`]).
#[derive(Debug)]
pub(in crate::normal) struct Adoption {
    /// The port of the enroller.
    pub(in crate::normal) port: N1Port,
    /// Through whom.
    pub(in crate::normal) via: AppName,
    /// The enroller's address (0: it said no hello yet).
    pub(in crate::normal) enroller: Address,
    /// The address given.
    pub(in crate::normal) address: Address,
    /// The DIF's cubes (with this IPCP's own mapping below); empty: keep
    /// the configured ones.
    pub(in crate::normal) cubes: Vec<QosCube>,
    /// The DIF's largest SDU.
    pub(in crate::normal) max_sdu: usize,
    /// Whether the DIF runs link-state routing and the disseminated
    /// directory (on here too, with defaults, if not configured).
    pub(in crate::normal) routing: bool,
    pub(in crate::normal) directory: bool,
    /// The enroller's directory entries and flow-state objects.
    pub(in crate::normal) directory_blobs: Vec<Vec<u8>>,
    pub(in crate::normal) fsos: Vec<Vec<u8>>,
}

impl MembershipMachine {
    pub(super) fn maybe_start_enrollment(
        &mut self,
        cx: &Ctx,
        now: Instant,
        port: N1Port,
        via: AppName,
    ) {
        if self.enrollee.is_some() || self.enroll_hold.is_some_and(|t| now < t) {
            return;
        }
        let mut ec = EnrolleeConfig::new(self.cfg.name.clone(), via.clone());
        // Ask for an address derived from our name, so that members
        // enrolling several newcomers at once rarely offer the same one.
        let (first, last) = self.cfg.addresses;
        let last = last.min(cx.cfg.dt.addr.max_value());
        ec.address = preferred_address(&self.cfg.name, first, last);
        ec.step_timeout = self.cfg.step_timeout;
        ec.initial_backoff = self.cfg.initial_backoff;
        ec.max_backoff = self.cfg.initial_backoff * 8;
        ec.max_attempts = self.cfg.max_attempts.max(1);
        let mut e = Enrollee::new(ec, self.cfg.auth()).with_nonces(self.nonces.child());
        e.start(now);
        self.enrollee = Some((port, via, e));
        self.run_enrollee(cx, now);
    }

    /// An enrollment message from the neighbour on `port`, through the RIB
    /// daemon: for this IPCP's enrollee when it is not a member, for the
    /// enroller of that port when it is.
    pub(in crate::normal) fn on_enroll_cdap(
        &mut self,
        cx: &Ctx,
        now: Instant,
        port: N1Port,
        msg: &CdapMessage,
    ) {
        let bytes = msg.encode();
        if cx.address() == 0 {
            let connected = match self.enrollee.as_mut() {
                Some((p, _, e)) if *p == port => {
                    e.on_message(now, &bytes);
                    e.session().state() == SessionState::Connected
                }
                _ => {
                    self.counters.enroll_stray += 1;
                    return;
                }
            };
            if connected {
                // The enrollment's M_CONNECT opened the session.
                self.out.push_back(MsOut::SessionOpened { port });
            }
            self.run_enrollee(cx, now);
            return;
        }
        if self.members.is_none() {
            self.members = Some(self.new_membership(cx));
        }
        // Only the enrollment's M_START gives an address and the content
        // (configuration, neighbours, directory, flow-state objects): the
        // content is built for it alone, not again for every answer the
        // enrollee sends to each object (one per neighbour) — each build
        // walks and encodes routing's and the directory's whole state. And
        // only for an M_START the enroller waits for (after an M_CONNECT it
        // accepted): any other is refused without the build.
        let awaited = self.enrollers.get(&port).is_some_and(|e| {
            let st = e.status();
            st.phase == Phase::Running && st.step == Step::StartEnrollment
        });
        if awaited
            && msg.op_code() == OpCode::Start
            && msg.obj_name.as_deref() == Some(OBJ_ENROLLMENT)
        {
            self.refresh_content(cx, now);
        }
        let Some(members) = self.members.as_mut() else {
            return;
        };
        let cfg = EnrollerConfig {
            step_timeout: self.cfg.step_timeout,
            ..EnrollerConfig::default()
        };
        let nonces = &mut self.nonces;
        let e = self
            .enrollers
            .entry(port)
            .or_insert_with(|| Enroller::new(cfg).with_nonces(nonces.child()));
        e.on_message(now, &bytes, members);
        self.run_enroller(cx, now, port);
    }

    /// Brings the content given to enrollees up to date and reserves every
    /// address known to be in use.
    fn refresh_content(&mut self, cx: &Ctx, now: Instant) {
        let conf = dif_configuration(cx.cfg).encode_to_vec();
        let mut known: Vec<Address> = cx.neighbors.values().map(|n| n.0).collect();
        let fsos: Vec<crate::routing::Fso> =
            cx.routing.map_or_else(Vec::new, |r| r.fsos(now).collect());
        for f in &fsos {
            known.push(f.origin);
            known.push(f.neighbor);
        }
        let entries: Vec<crate::directory::DirEntry> =
            cx.dft.map_or_else(Vec::new, |d| d.entries(now).collect());
        known.extend(entries.iter().map(|e| e.address));
        let mut neighbors = vec![neighbor_obj(&self.cfg.name, cx.address())];
        for (name, addr) in self.hello_from.values() {
            if *addr != 0 {
                neighbors.push(neighbor_obj(name, *addr));
            }
        }
        let Some(members) = self.members.as_mut() else {
            return;
        };
        // What was learnt is reserved only while it is known: routing and
        // the directory forget what expires, and addresses learnt from
        // them (chosen by whoever sent the FSOs and entries) would
        // otherwise pile up for ever. Addresses given to enrollees stay.
        let known: std::collections::BTreeSet<Address> = known.into_iter().collect();
        let gone: Vec<Address> = members
            .in_use()
            .iter()
            .copied()
            .filter(|a| !known.contains(a) && members.holder(*a) == Some(LEARNT))
            .collect();
        for a in gone {
            members.release(a);
        }
        // Addresses given to enrollees are released once nothing has known
        // them for routing's max age: not routing (a live member refreshes
        // its flow-state objects within it), nor the directory (where
        // every member registers its management entity), nor the
        // neighbours, nor an enrollment still running. Else members that
        // leave, or anyone enrolling under ever new names where no password
        // is asked, use the address range up for good. Other enrollers of
        // the DIF already give any address they do not know; a member that
        // comes back may get a new address; one given twice all the same
        // is found and renumbered (see `renumber`). Without link-state
        // routing nothing tells a far member is alive: kept, as before.
        if let Some(r) = cx.routing {
            let grace = r.config().max_age;
            let own = cx.address();
            let running: std::collections::BTreeSet<Address> = self
                .enrollers
                .values()
                .filter(|e| matches!(e.status().phase, Phase::Running | Phase::Enrolled))
                .map(|e| e.address())
                .collect();
            let given: Vec<Address> = members
                .in_use()
                .iter()
                .copied()
                .filter(|a| {
                    *a != own && !matches!(members.holder(*a), None | Some(LEARNT) | Some(SELF))
                })
                .collect();
            self.unknown_since.retain(|a, _| given.contains(a));
            for a in given {
                if known.contains(&a) || running.contains(&a) {
                    self.unknown_since.remove(&a);
                    continue;
                }
                let since = *self.unknown_since.entry(a).or_insert(now);
                if now - since >= grace {
                    members.release(a);
                    self.unknown_since.remove(&a);
                    self.counters.addresses_released += 1;
                }
            }
        }
        for a in known {
            if members.holder(a).is_none() {
                members.reserve(a, LEARNT);
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

    fn run_enroller(&mut self, cx: &Ctx, now: Instant, port: N1Port) {
        let Some(e) = self.enrollers.get_mut(&port) else {
            return;
        };
        let mut events = Vec::new();
        while let Some(bytes) = e.poll_transmit() {
            self.out.push_back(MsOut::Enrollment {
                port,
                dst: 0,
                bytes,
            });
        }
        while let Some(ev) = e.poll_event() {
            events.push(ev);
        }
        for ev in events {
            match ev {
                EnrollerEvent::Admitted { address, peer } => {
                    self.counters.admitted += 1;
                    self.hello_from.insert(port, (peer.clone(), address));
                    self.admit_port(cx, now, port);
                    if cx.neighbor(port) != Some(address) {
                        self.out.push_back(MsOut::NeighborUp { port, address });
                    }
                    self.send_hello(cx, now, port);
                    self.report_event(MembershipEvent::Admitted { peer, address });
                }
                EnrollerEvent::Rejected { peer, reason } => {
                    self.counters.rejected += 1;
                    self.report_event(MembershipEvent::Rejected {
                        peer,
                        reason: reason.to_string(),
                    });
                }
            }
        }
    }

    fn run_enrollee(&mut self, cx: &Ctx, now: Instant) {
        let Some((port, via, e)) = self.enrollee.as_mut() else {
            return;
        };
        let (port, via) = (*port, via.clone());
        let dst = self.hello_from.get(&port).map_or(0, |h| h.1);
        let mut events = Vec::new();
        while let Some(bytes) = e.poll_transmit() {
            self.out.push_back(MsOut::Enrollment { port, dst, bytes });
        }
        while let Some(ev) = e.poll_event() {
            events.push(ev);
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
                    self.end_enrollee(now, false);
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
                } => {
                    let enroller = dst;
                    match adoption(cx, &config, address) {
                        Ok((cubes, conf)) => {
                            let a = Adoption {
                                port,
                                via: via.clone(),
                                enroller,
                                address,
                                cubes,
                                max_sdu: usize::try_from(conf.max_sdu).unwrap_or(usize::MAX).max(1),
                                routing: conf.link_state_routing,
                                directory: conf.distributed_directory,
                                directory_blobs: directory,
                                fsos,
                            };
                            // Reported once the IPCP has taken it.
                            self.out.push_back(MsOut::Adopt(Box::new(a)));
                            continue;
                        }
                        Err(why) => self.adoption_failed(now, &via, why),
                    }
                }
            };
            self.report_event(event);
        }
    }

    /// The IPCP took (or failed to take) what the enroller gave
    /// ([`MsOut::Adopt`]): this IPCP is a member, says hello everywhere and
    /// authenticates its other neighbours; or the enrollment failed.
    pub(in crate::normal) fn adopted(
        &mut self,
        cx: &Ctx,
        now: Instant,
        a: &Adoption,
        result: Result<(), String>,
    ) {
        if let Err(why) = result {
            let event = self.adoption_failed(now, &a.via, why);
            return self.report_event(event);
        }
        self.members = Some(self.new_membership(cx));
        self.hello_all(cx, now);
        self.next_hello = Some(now + self.cfg.hello_interval);
        self.end_enrollee(now, true);
        // The member we enrolled through proved itself; the other
        // neighbours authenticate on their ports.
        self.admit_port(cx, now, a.port);
        for p in cx.ports() {
            self.start_port_auth(cx, now, p);
        }
        self.report_event(MembershipEvent::Enrolled {
            via: a.via.clone(),
            address: a.address,
        });
    }

    fn adoption_failed(&mut self, now: Instant, via: &AppName, why: String) -> MembershipEvent {
        let error = EnrollmentError::Protocol {
            step: Step::Configuration,
            detail: why,
        };
        self.end_enrollee(now, false);
        if let Some(r) = self.report.as_mut() {
            r.status.last_error = Some(error.to_string());
        }
        MembershipEvent::EnrollFailed {
            via: via.clone(),
            error: error.to_string(),
        }
    }

    /// Ends the running enrollment, keeping its report; after a failure no
    /// new run starts for a back-off.
    fn end_enrollee(&mut self, now: Instant, enrolled: bool) {
        if let Some((_, via, e)) = self.enrollee.take() {
            self.report = Some(EnrollmentReport {
                via,
                status: e.status(),
            });
        }
        if !enrolled {
            self.enroll_hold = Some(now + self.cfg.initial_backoff * 4);
        }
    }

    /// The admission state of a member: its auth policy, the address range,
    /// its own address reserved.
    pub(super) fn new_membership(&self, cx: &Ctx) -> Membership {
        let (first, last) = self.cfg.addresses;
        let last = last.min(cx.cfg.dt.addr.max_value());
        let mut members = Membership::new(
            self.cfg.auth(),
            Box::new(NextFree::new(first, last)),
            DifContent::default(),
        );
        members.reserve(cx.address(), SELF);
        members
    }

    /// Runs the enrollment machines' timers that are due.
    pub(super) fn enrollment_timeout(&mut self, cx: &Ctx, now: Instant) {
        if let Some((_, _, e)) = self.enrollee.as_mut() {
            if e.poll_timeout().is_some_and(|t| t <= now) {
                e.handle_timeout(now);
            }
        }
        let due: Vec<N1Port> = self
            .enrollers
            .iter()
            .filter(|(_, e)| e.poll_timeout().is_some_and(|t| t <= now))
            .map(|(p, _)| *p)
            .collect();
        if let Some(members) = self.members.as_mut() {
            for p in &due {
                if let Some(e) = self.enrollers.get_mut(p) {
                    e.handle_timeout(now, members);
                }
            }
        }
        self.run_enrollee(cx, now);
        for p in due {
            self.run_enroller(cx, now, p);
        }
    }
}

/// Checks what an enroller gave against this IPCP's wire profile: the
/// DIF's cubes (keeping this IPCP's mapping below for a cube of the same
/// name) and configuration, or why they cannot be taken.
fn adoption(
    cx: &Ctx,
    config: &DifConfigBlob,
    address: Address,
) -> Result<(Vec<QosCube>, DifConfiguration), String> {
    let theirs = DifConfiguration::decode(config.0.as_slice())
        .map_err(|e| format!("the DIF configuration does not decode: {e}"))?;
    if let Some(d) = profile_mismatch(&dif_configuration(cx.cfg), &theirs) {
        return Err(format!("the DIF's wire profile differs: {d}"));
    }
    if address == 0 || address > cx.cfg.dt.addr.max_value() {
        return Err(format!("address {address} does not fit the DIF"));
    }
    // The largest SDU bounds what each flow's reassembly holds: no more
    // than an IPCP may be configured with.
    if theirs.max_sdu == 0 || theirs.max_sdu > crate::normal::DEFAULT_MAX_SDU as u64 {
        return Err(format!(
            "the DIF's largest SDU, {} bytes, is not between 1 and {}",
            theirs.max_sdu,
            crate::normal::DEFAULT_MAX_SDU
        ));
    }
    let mut cubes = cubes_of(&theirs);
    // The mapping onto the DIFs below and the keepalive are local: keep
    // what this IPCP's own configuration says for a cube of the same name.
    for c in &mut cubes {
        if let Some(mine) = cx.cfg.cubes.iter().find(|m| m.name == c.name) {
            c.lower = mine.lower.clone();
            c.keepalive = mine.keepalive;
        }
    }
    if cubes.iter().any(|c| c.id > cx.cfg.dt.qos.max_value()) {
        return Err("a QoS-id does not fit the DIF".into());
    }
    Ok((cubes, theirs))
}

/// The DIF configuration as sent to enrollees.
fn dif_configuration(c: &NormalConfig) -> DifConfiguration {
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
