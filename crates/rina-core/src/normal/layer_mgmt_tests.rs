//! Layer management through the RIB daemon, end to end between two IPCPs
//! joined by one N-1 port, with explicit time: enrollment, hellos and port
//! authentication as CDAP objects, sessions opened with `M_CONNECT`, the
//! loss of every kind of message, the old first-byte channels refused.

use super::mgmt_rib::{Peer, SessionState, RESULT_NO_SESSION};
use super::*;
use crate::rmt::Fifo;
use rina_wire::cdap::{CdapMessage, Flags, OpCode};
use std::collections::BTreeSet;

const PORT: N1Port = 1;
const PASSWORD: &str = "pw";

fn at(ms: u64) -> Instant {
    Instant::ZERO + Duration::from_millis(ms)
}

/// An IPCP of DIF "net" with membership and the password; `index` names
/// it (`m<index>.net`) and seeds its nonces.
fn ipcp(index: u64, addr: Address) -> NormalIpcp {
    let mut c = NormalConfig::new("net", addr);
    let mut m = MembershipConfig::new(format!("m{index}.net").parse().unwrap());
    m.password = Some(PASSWORD.into());
    m.entropy = [index as u8; 32];
    c.membership = Some(m);
    let mut p = NormalIpcp::new(c, Box::new(Fifo::new(1000))).unwrap();
    p.add_port(PORT);
    p
}

/// What a frame carries: "CDAP <op> <object>" for a CDAP message,
/// "fragment" for a piece of one, "other" else.
fn kind_of(p: &NormalIpcp, frame: &[u8]) -> String {
    let Ok(un) = p.sdup.unprotect(frame) else {
        return "other".into();
    };
    let Ok(pdu) = pci::Pdu::parse(&p.cfg.dt, &un.pdu) else {
        return "other".into();
    };
    match pdu.body {
        Body::Data(b) if pdu.pci.pdu_type == PduType::Mgmt => match b.split_first() {
            Some((&CDAP_DISCRIMINATOR, m)) => match CdapMessage::decode(m) {
                Ok(msg) => format!(
                    "{} {}",
                    msg.op_code().name(),
                    msg.obj_name.as_deref().unwrap_or("")
                ),
                Err(_) => "bad CDAP".into(),
            },
            Some((&FRAGMENT_DISCRIMINATOR, _)) => "fragment".into(),
            _ => "other".into(),
        },
        _ => "data".into(),
    }
}

/// Runs the two from `from` to `until` ms in steps of 10 ms, carrying
/// every frame at once unless `drop` (given the sender and the frame's
/// kind) says to lose it. Returns every (sender, kind) sent.
fn run(
    net: &mut [NormalIpcp; 2],
    from: u64,
    until: u64,
    drop: &mut dyn FnMut(usize, &str) -> bool,
) -> BTreeSet<(usize, String)> {
    let mut seen = BTreeSet::new();
    let mut t = from;
    while t <= until {
        let now = at(t);
        for p in net.iter_mut() {
            if p.poll_timeout().is_some_and(|d| d <= now) {
                p.handle_timeout(now);
            }
        }
        loop {
            let mut moved = false;
            for i in 0..2 {
                while let Some(a) = net[i].poll_action() {
                    if let Action::Transmit { frame, .. } = a {
                        moved = true;
                        let kind = kind_of(&net[i], &frame);
                        seen.insert((i, kind.clone()));
                        if !drop(i, &kind) {
                            net[1 - i].on_frame(now, PORT, &frame);
                        }
                    }
                }
            }
            if !moved {
                break;
            }
        }
        t += 10;
    }
    seen
}

fn session(p: &NormalIpcp) -> SessionState {
    p.rib_daemon().state(Peer::Neighbor(PORT))
}

/// Both are members, neighbours of each other, with an open session.
fn assert_joined(net: &[NormalIpcp; 2], what: &str) {
    for (i, p) in net.iter().enumerate() {
        assert!(p.is_enrolled(), "{what}: {i} enrolled");
        assert!(p.port_admitted(PORT), "{what}: {i} admitted the port");
        assert_eq!(session(p), SessionState::Open, "{what}: {i}'s session");
        let other = net[1 - i].config().address;
        assert_eq!(
            p.neighbors.get(&PORT).map(|n| n.0),
            Some(other),
            "{what}: {i}'s neighbour"
        );
    }
}

/// Drops the first message of each kind in turn and checks that the
/// pair still ends joined; `must` lists kinds the clean run has to show
/// (so that the test covers them).
fn every_loss_recovers(make: &dyn Fn() -> [NormalIpcp; 2], until: u64, must: &[&str]) {
    let mut net = make();
    let kinds = run(&mut net, 0, until, &mut |_, _| false);
    assert_joined(&net, "no loss");
    let names: BTreeSet<&str> = kinds.iter().map(|(_, k)| k.as_str()).collect();
    for m in must {
        assert!(names.contains(m), "{m} was sent: {names:?}");
    }
    for (sender, kind) in kinds.iter().filter(|(_, k)| k.starts_with("M_")) {
        let mut net = make();
        let mut dropped = false;
        run(&mut net, 0, until, &mut |i, k| {
            let hit = !dropped && i == *sender && k == kind;
            dropped |= hit;
            hit
        });
        assert!(dropped, "{kind} from {sender} was sent again");
        assert_joined(&net, &format!("first {kind} from {sender} lost"));
    }
}

#[test]
fn enrollment_recovers_from_the_loss_of_any_of_its_messages() {
    every_loss_recovers(
        &|| [ipcp(1, 1), ipcp(2, 0)],
        40_000,
        &[
            "M_CONNECT ",
            "M_CONNECT_R ",
            "M_START /difm/enr",
            "M_START_R /difm/enr",
            "M_CREATE /dt",
            "M_CREATE_R /dt",
            "M_STOP /difm/enr",
            "M_STOP_R /difm/enr",
            "M_START /difm/ops",
            "M_START_R /difm/ops",
            "M_WRITE /difm/enr/hello",
        ],
    );
}

#[test]
fn port_authentication_and_sessions_of_members_recover_from_any_loss() {
    every_loss_recovers(
        &|| [ipcp(1, 1), ipcp(2, 2)],
        20_000,
        &[
            "M_WRITE /difm/auth/port/hello",
            "M_WRITE /difm/auth/port/answer",
            "M_WRITE /difm/auth/port/proof",
            "M_CONNECT ",
            "M_CONNECT_R ",
            "M_WRITE /difm/enr/hello",
        ],
    );
}

/// A management frame from address `src` to `p` holding `payload` (also
/// used by the routing and directory glue's tests).
pub(super) fn mgmt_frame(p: &NormalIpcp, src: Address, payload: &[u8]) -> Vec<u8> {
    let mut pci = Pci::new(PduType::Mgmt);
    pci.src_addr = src;
    pci.dst_addr = p.config().address;
    pci.qos_id = MGMT_QOS_ID;
    let mut pdu = Vec::new();
    pci::encode_data(&p.config().dt, &pci, payload, &mut pdu).unwrap();
    let mut frame = Vec::new();
    p.sdup
        .protect(&pdu, p.sdup.initial_ttl().unwrap_or(0), &mut frame);
    frame
}

fn cdap_frame(p: &NormalIpcp, src: Address, msg: &CdapMessage) -> Vec<u8> {
    mgmt_frame(p, src, &mgmt_cdap::payload_of(msg))
}

/// The CDAP messages `p` sent since the last call.
fn sent(p: &mut NormalIpcp) -> Vec<CdapMessage> {
    let mut out = Vec::new();
    while let Some(a) = p.poll_action() {
        if let Action::Transmit { frame, .. } = a {
            let Ok(un) = p.sdup.unprotect(&frame) else {
                continue;
            };
            let Ok(pdu) = pci::Pdu::parse(&p.cfg.dt, &un.pdu) else {
                continue;
            };
            if let Body::Data(b) = pdu.body {
                if b.first() == Some(&CDAP_DISCRIMINATOR) {
                    out.extend(CdapMessage::decode(&b[1..]).ok());
                }
            }
        }
    }
    out
}

/// The hello of member `name` at `address`.
fn hello_of(name: &str, address: Address) -> CdapMessage {
    let me = rina_wire::cdap::Neighbor {
        ap_name: name.into(),
        address,
        ..Default::default()
    };
    CdapMessage::write(
        membership::HELLO_OBJ_CLASS,
        membership::HELLO_OBJ_NAME,
        prost::Message::encode_to_vec(&me),
    )
    .with_src(&name.parse().unwrap())
    .with_dest(&AppName {
        process_name: "net".into(),
        ..AppName::default()
    })
}

/// A member without a password (every port admitted), sessions required.
fn open_member() -> NormalIpcp {
    let mut c = NormalConfig::new("net", 1);
    c.membership = Some(MembershipConfig::new("m1.net".parse().unwrap()));
    let mut p = NormalIpcp::new(c, Box::new(Fifo::new(1000))).unwrap();
    p.add_port(PORT);
    p.handle_timeout(at(0));
    p
}

/// The `M_CONNECT` with which member `name` of DIF "net" opens a session.
fn connect_of(name: &str) -> CdapMessage {
    let dif = AppName {
        process_name: "net".into(),
        ..AppName::default()
    };
    CdapMessage::connect(
        rina_wire::cdap::AuthPolicy::none(),
        &name.parse().unwrap(),
        &dif,
    )
    .with_invoke_id(1)
}

#[test]
fn a_neighbour_reading_the_rib_over_and_over_is_refused_beyond_its_rate() {
    let mut p = open_member();
    p.on_frame(at(1), PORT, &cdap_frame(&p, 2, &hello_of("m2.net", 2)));
    p.on_frame(at(1), PORT, &cdap_frame(&p, 2, &connect_of("m2.net")));
    assert_eq!(session(&p), SessionState::Open);
    sent(&mut p);
    let read_all = |p: &mut NormalIpcp, t: Instant, id: i32| {
        let read = CdapMessage::read("", "/").with_invoke_id(id);
        p.on_frame(t, PORT, &cdap_frame(p, 2, &read));
        // A new turn of the driver: the port may send again.
        p.handle_timeout(t);
        // The answers (not hellos, due now and then).
        let mut out = sent(p);
        out.retain(|m| m.op_code() == OpCode::ReadR);
        out
    };
    let per_read = read_all(&mut p, at(2), 1).len() as u64;
    assert!(per_read > 1, "the RIB read whole");
    // Reads of the whole RIB, all at one instant, until one is refused.
    let mut id = 1;
    while p.counters().rib_reads_limited == 0 && id < 100_000 {
        id += 1;
        read_all(&mut p, at(2), id);
    }
    let c = p.counters();
    assert_eq!(c.rib_reads_limited, 1, "reads are limited");
    // A second's worth was answered, and one read more at most.
    let objects = (c.rib_reads_answered - 1) * per_read;
    let per_s = RIB_READ_OBJECTS_PER_S;
    assert!(
        objects >= per_s && objects <= 2 * per_s + per_read,
        "{objects} objects answered"
    );
    // The refusal says why; so do those that follow at that instant.
    let refused = read_all(&mut p, at(2), id + 1);
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].op_code(), OpCode::ReadR);
    let reason = refused[0].result_reason.clone().unwrap_or_default();
    assert!(reason.contains("too many RIB objects read"), "{reason}");
    assert_eq!(p.counters().rib_reads_limited, 2);
    // Two seconds later, it is answered again.
    let again = read_all(&mut p, at(2002), id + 2);
    assert_eq!(again.len() as u64, per_read, "{again:?}");
    assert!(again.iter().all(|m| m.result == Some(0)), "{again:?}");
}

#[test]
fn a_refused_rib_read_is_refused_before_the_rib_is_built_and_missing_paths_are_charged() {
    let mut p = open_member();
    p.on_frame(at(1), PORT, &cdap_frame(&p, 2, &hello_of("m2.net", 2)));
    p.on_frame(at(1), PORT, &cdap_frame(&p, 2, &connect_of("m2.net")));
    assert_eq!(session(&p), SessionState::Open);
    sent(&mut p);
    let read = |p: &mut NormalIpcp, path: &str, id: i32| {
        let read = CdapMessage::read("", path).with_invoke_id(id);
        p.on_frame(at(2), PORT, &cdap_frame(p, 2, &read));
        p.handle_timeout(at(2));
        sent(p);
    };
    // Reads of a subtree that does not exist build the view too: they are
    // paid for, and run out like reads of everything.
    let mut id = 0;
    while p.counters().rib_reads_limited == 0 && id < 100_000 {
        id += 1;
        read(&mut p, "/no/such/object", id);
    }
    assert_eq!(
        p.counters().rib_reads_limited,
        1,
        "missing paths are charged"
    );
    let built = p.rib_reads.built;
    assert_eq!(built, id as u64 - 1, "one view per read answered");
    // Refused reads, of everything or of nothing, build nothing.
    for k in 0..10 {
        let path = if k % 2 == 0 { "/" } else { "/no/such/object" };
        read(&mut p, path, id + 1 + k);
    }
    assert_eq!(p.counters().rib_reads_limited, 11);
    assert_eq!(p.rib_reads.built, built, "refused reads built no view");
}

#[test]
fn a_request_without_an_open_session_is_refused_and_counted_until_m_connect() {
    let mut p = open_member();
    let ours = sent(&mut p);
    assert!(
        ours.iter().any(|m| m.op_code() == OpCode::Connect),
        "the member opens a session on a new port: {ours:?}"
    );
    // Its neighbour says hello (no session needed for that)...
    p.on_frame(at(1), PORT, &cdap_frame(&p, 2, &hello_of("m2.net", 2)));
    assert_eq!(p.neighbors.get(&PORT).map(|n| n.0), Some(2));
    // ... but reads its RIB without opening a session first.
    let read = CdapMessage::read("", "/").with_invoke_id(7);
    p.on_frame(at(1), PORT, &cdap_frame(&p, 2, &read));
    let answers = sent(&mut p);
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0].op_code(), OpCode::ReadR);
    assert_eq!(answers[0].result, Some(RESULT_NO_SESSION));
    assert_eq!(p.rib_daemon().counters().refused_no_session, 1);
    assert_eq!(p.counters().rib_reads_answered, 0);
    // An unconfirmed write (a routing flood) is dropped and counted too.
    let fsos = CdapMessage::write(
        crate::routing::FSOS_OBJ_CLASS,
        crate::routing::FSOS_OBJ_NAME,
        vec![0u8],
    );
    p.on_frame(at(2), PORT, &cdap_frame(&p, 2, &fsos));
    assert!(sent(&mut p).is_empty());
    assert_eq!(p.rib_daemon().counters().refused_no_session, 2);
    assert_eq!(p.counters().rx_mgmt_malformed, 0, "never reached routing");
    assert_eq!(p.counters().rx_mgmt_unhandled, 0, "never reached routing");
    // The neighbour opens the session: the same read is answered.
    p.on_frame(at(3), PORT, &cdap_frame(&p, 2, &connect_of("m2.net")));
    let answers = sent(&mut p);
    assert!(
        answers
            .iter()
            .any(|m| m.op_code() == OpCode::ConnectR && m.result == Some(0)),
        "{answers:?}"
    );
    assert_eq!(session(&p), SessionState::Open);
    p.on_frame(at(4), PORT, &cdap_frame(&p, 2, &read));
    let answers = sent(&mut p);
    assert!(
        answers
            .iter()
            .any(|m| m.op_code() == OpCode::ReadR && m.result.unwrap_or(0) == 0),
        "{answers:?}"
    );
    assert_eq!(p.counters().rib_reads_answered, 1);
    assert_eq!(p.rib_daemon().counters().refused_no_session, 2);
    // The RIB shows the session and its state.
    let rib = p.rib();
    let obj = rib
        .get(&format!("/difm/cdap/sessions/peer=port-{PORT}"))
        .expect("session object");
    assert!(
        format!("{:?}", obj.value).contains("state open"),
        "{:?}",
        obj.value
    );
}

#[test]
fn frames_on_the_old_membership_channels_are_unknown_management_pdus() {
    let mut p = open_member();
    sent(&mut p);
    // What a hello, an enrollee's M_CONNECT and a port-authentication
    // hello used to look like: their CDAP after 0xE1, 0xE0, 0xE2.
    let hello = hello_of("m2.net", 2);
    let connect = CdapMessage::connect(
        rina_wire::cdap::AuthPolicy::none(),
        &"m9.net".parse().unwrap(),
        &"m1.net".parse().unwrap(),
    )
    .with_invoke_id(1);
    for (first, body, src) in [
        (0xE1u8, hello.encode(), 2),
        (0xE0, connect.encode(), 0),
        (0xE2, [1u8; 33].to_vec(), 2),
    ] {
        let mut payload = vec![first];
        payload.extend_from_slice(&body);
        p.on_frame(at(5), PORT, &mgmt_frame(&p, src, &payload));
    }
    assert_eq!(p.counters().rx_mgmt_unknown, 3);
    let c = *p.membership_counters().unwrap();
    assert_eq!(c.hellos_received, 0, "{c:?}");
    assert!(p.neighbors.is_empty());
    assert!(
        sent(&mut p).is_empty(),
        "no enrollment answered, no port authentication"
    );
    // The same hello as CDAP is taken.
    p.on_frame(at(6), PORT, &cdap_frame(&p, 2, &hello));
    assert_eq!(p.membership_counters().unwrap().hellos_received, 1);
    assert_eq!(p.neighbors.get(&PORT).map(|n| n.0), Some(2));
}

#[test]
fn silence_closes_the_session_and_the_next_hellos_open_it_again() {
    let mut net = [ipcp(1, 1), ipcp(2, 2)];
    run(&mut net, 0, 3_000, &mut |_, _| false);
    assert_joined(&net, "at first");
    let opened = net[0].rib_daemon().counters().sessions_opened;
    // The link goes silent for longer than the dead interval.
    run(&mut net, 3_010, 8_000, &mut |_, _| true);
    for p in &net {
        assert_eq!(session(p), SessionState::Connecting, "closed, reopening");
        assert!(!p.neighbors.contains_key(&PORT));
    }
    // Back: M_CONNECT with the next hello round.
    let kinds = run(&mut net, 8_010, 10_000, &mut |_, _| false);
    assert!(kinds.contains(&(0, "M_CONNECT ".to_string())), "{kinds:?}");
    assert_joined(&net, "after the silence");
    assert!(net[0].rib_daemon().counters().sessions_opened > opened);
}

#[test]
fn encrypting_members_open_their_session_once_keyed() {
    let make = |i: u64| {
        let mut c = NormalConfig::new("net", i);
        let mut m = MembershipConfig::new(format!("m{i}.net").parse().unwrap());
        m.password = Some(PASSWORD.into());
        m.entropy = [i as u8; 32];
        m.encryption = Some(crate::sdup::aead::Rekey::default());
        c.membership = Some(m);
        let mut p = NormalIpcp::new(c, Box::new(Fifo::new(1000))).unwrap();
        p.add_port(PORT);
        p
    };
    let mut net = [make(1), make(2)];
    run(&mut net, 0, 5_000, &mut |_, _| false);
    assert_joined(&net, "encrypted");
    for p in &net {
        assert!(p.port_protection().iter().all(|x| x.key_id.is_some()));
        assert_eq!(p.rib_daemon().counters().refused_no_session, 0);
    }
}

#[test]
fn a_port_removed_releases_its_session_at_the_neighbour() {
    let mut net = [ipcp(1, 1), ipcp(2, 2)];
    run(&mut net, 0, 3_000, &mut |_, _| false);
    assert_joined(&net, "at first");
    net[0].remove_port(PORT);
    let mut released = false;
    while let Some(a) = net[0].poll_action() {
        if let Action::Transmit { frame, .. } = a {
            released |= kind_of(&net[0], &frame) == "M_RELEASE ";
            net[1].on_frame(at(3_001), PORT, &frame);
        }
    }
    assert!(released, "M_RELEASE sent");
    assert_eq!(session(&net[1]), SessionState::Idle);
    assert_eq!(
        net[0]
            .rib_daemon()
            .session(Peer::Neighbor(PORT))
            .map(|s| s.state),
        None
    );
}

/// A neighbour answering a read of its RIB with an object at a position
/// no read takes (`i64::MAX`, which would overflow the completeness
/// check, or below 0): the read ends at once with the reason, rather than
/// keeping whatever the neighbour numbers until the deadline.
#[test]
fn a_remote_read_answer_past_the_positions_a_read_takes_ends_it() {
    for pos in [i64::MAX, MAX_READ_OBJECTS as i64, -1] {
        let mut p = open_member();
        let dif = AppName {
            process_name: "net".into(),
            ..AppName::default()
        };
        p.on_frame(at(1), PORT, &cdap_frame(&p, 2, &hello_of("m2.net", 2)));
        let connect = CdapMessage::connect(
            rina_wire::cdap::AuthPolicy::none(),
            &"m2.net".parse().unwrap(),
            &dif,
        )
        .with_invoke_id(1);
        p.on_frame(at(2), PORT, &cdap_frame(&p, 2, &connect));
        sent(&mut p);
        let handle = p.read_remote_rib(at(3), "m2.net", "/", None).unwrap();
        let read = sent(&mut p)
            .into_iter()
            .find(|m| m.op_code() == OpCode::Read)
            .expect("the read went out");
        // A first part at a good position is kept, the bad one ends it.
        let part = |v: i64| {
            let mut m = CdapMessage::response_to(&read, 0, "")
                .unwrap()
                .with_version(v)
                .with_flags(Flags::RdIncomplete);
            m.obj_name = Some("/x".into());
            m
        };
        p.on_frame(at(4), PORT, &cdap_frame(&p, 2, &part(0)));
        p.on_frame(at(4), PORT, &cdap_frame(&p, 2, &part(pos)));
        let mut done = None;
        while let Some(a) = p.poll_action() {
            if let Action::RibRead { handle: h, result } = a {
                done = Some((h, result));
            }
        }
        let Some((h, Err(RibReadError::TooLarge { address: 2 }))) = done else {
            panic!("position {pos}: {done:?}");
        };
        assert_eq!(h, handle);
        // Nothing is left of it: a later part is no answer to anything.
        let before = p.counters().rx_mgmt_malformed;
        p.on_frame(at(5), PORT, &cdap_frame(&p, 2, &part(1)));
        assert_eq!(p.counters().rx_mgmt_malformed, before + 1);
    }
}

/// Requests for flow objects from ever new source addresses (end to end:
/// each its own session, which needs no opening) must not evict the
/// session a neighbour opened with `M_CONNECT`: its next requests would be
/// refused until it connects again.
#[test]
fn sessions_with_far_members_do_not_evict_a_neighbours_session() {
    let mut net = [ipcp(1, 1), ipcp(2, 2)];
    run(&mut net, 0, 3_000, &mut |_, _| false);
    assert_joined(&net, "at first");
    let p = &mut net[0];
    for k in 0..(mgmt_rib::MAX_SESSIONS as u64 + 10) {
        let create = CdapMessage::create(
            "Flow",
            &format!("{}/key={}-1", rina_wire::fa::FLOWS_PATH, 100 + k),
            vec![0u8],
        )
        .with_invoke_id(1);
        p.on_frame(at(3_001), PORT, &cdap_frame(p, 100 + k, &create));
        sent(p);
    }
    assert!(
        p.rib_daemon().sessions().count() > 1_000,
        "the requests made sessions"
    );
    assert_eq!(
        session(p),
        SessionState::Open,
        "the neighbour's session is still open"
    );
}
