//! The IPCP's RIB daemon alone: dispatch by object, refusals, sessions.

use super::*;
use crate::rib::daemon::{RESULT_BAD_NAME, RESULT_NOT_ALLOWED};
use crate::routing::{FSOS_OBJ_CLASS, FSOS_OBJ_NAME};
use rina_wire::cdap::Flags;

fn ms(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000_000)
}

fn drain(m: &mut MgmtRib) -> Vec<Inbound> {
    std::iter::from_fn(|| m.poll_inbound()).collect()
}

#[test]
fn requests_go_to_the_owner_of_their_object() {
    let mut m = MgmtRib::new();
    let create = CdapMessage::create("Flow", "/fa/flows/key=7-3", vec![1u8]).with_invoke_id(9);
    let peer = m.peer_of(&create, Some(2), 7);
    assert_eq!(peer, Peer::Remote(7), "flow objects are end to end");
    m.take(ms(0), peer, create.clone());
    let fsos = CdapMessage::write(FSOS_OBJ_CLASS, FSOS_OBJ_NAME, vec![0u8]);
    let peer = m.peer_of(&fsos, Some(2), 7);
    assert_eq!(peer, Peer::Neighbor(2));
    m.take(ms(0), peer, fsos.clone());
    let read = CdapMessage::read("", "/fa/flows").with_invoke_id(4);
    assert_eq!(m.peer_of(&read, Some(2), 7), Peer::Neighbor(2), "reads too");
    m.take(ms(0), Peer::Neighbor(2), read.clone());
    let got = drain(&mut m);
    let owners: Vec<(OwnerId, Peer)> = got.iter().map(|i| (i.owner, i.peer)).collect();
    assert_eq!(
        owners,
        vec![
            (OwnerId::FLOW_ALLOCATOR, Peer::Remote(7)),
            (OwnerId::ROUTING, Peer::Neighbor(2)),
            (OwnerId::FLOW_ALLOCATOR, Peer::Neighbor(2)),
        ]
    );
    assert_eq!(got[0].msg, create);
    assert!(m.poll_transmit().is_none(), "nothing refused");
    // Components answer on their own: the daemon keeps nothing waiting.
    assert_eq!(m.daemon().pending(), 0);
    let s = m.session(Peer::Neighbor(2)).unwrap();
    assert_eq!(s.counters.rx_requests, 2);
}

#[test]
fn operations_an_owner_does_not_allow_and_bad_names_are_refused_with_a_reason() {
    let mut m = MgmtRib::new();
    let peer = Peer::Neighbor(1);
    // Flow objects are created and deleted, never written.
    m.take(
        ms(0),
        peer,
        CdapMessage::write("Flow", "/fa/flows/key=1-1", 1i32).with_invoke_id(5),
    );
    // The flow-state objects are written, never deleted.
    m.take(
        ms(0),
        peer,
        CdapMessage::delete(FSOS_OBJ_CLASS, FSOS_OBJ_NAME).with_invoke_id(6),
    );
    // Nobody writes objects of its own choosing.
    m.take(
        ms(0),
        peer,
        CdapMessage::write("X", "/x/y", 1i32).with_invoke_id(7),
    );
    m.take(
        ms(0),
        peer,
        CdapMessage::read("", "no-slash").with_invoke_id(8),
    );
    // Unconfirmed: nobody to tell.
    m.take(ms(0), peer, CdapMessage::write("X", "/x/z", 1i32));
    assert!(drain(&mut m).is_empty(), "no component saw any of them");
    let out: Vec<(Peer, CdapMessage)> = std::iter::from_fn(|| m.poll_transmit()).collect();
    let got: Vec<(Option<i32>, Option<i32>)> =
        out.iter().map(|(_, r)| (r.invoke_id, r.result)).collect();
    assert_eq!(
        got,
        vec![
            (Some(5), Some(RESULT_NOT_ALLOWED)),
            (Some(6), Some(RESULT_NOT_ALLOWED)),
            (Some(7), Some(RESULT_NOT_ALLOWED)),
            (Some(8), Some(RESULT_BAD_NAME)),
        ]
    );
    assert!(out.iter().all(|(p, _)| *p == peer));
    let reason = out[0].1.result_reason.as_deref().unwrap();
    assert!(reason.contains("/fa/flows/key=1-1"), "{reason}");
    assert_eq!(m.daemon().counters().refused_not_allowed, 4);
    assert_eq!(m.daemon().counters().unanswerable, 1);
}

#[test]
fn answers_go_to_the_component_that_asked_by_invoke_id() {
    let mut m = MgmtRib::new();
    let peer = Peer::Neighbor(3);
    let a = m.request(
        ms(0),
        peer,
        OwnerId::RIB_DAEMON,
        CdapMessage::read("", "/ra"),
    );
    let b = m.request(
        ms(0),
        peer,
        OwnerId::RIB_DAEMON,
        CdapMessage::read("", "/dt"),
    );
    assert_eq!((a.invoke_id, b.invoke_id), (Some(1), Some(2)));
    assert_eq!(m.session(peer).unwrap().outstanding(), 2);
    // A multi-part answer to the first: each part is delivered, the
    // request stays outstanding until the last.
    let part = CdapMessage::response_to(&a, 0, "")
        .unwrap()
        .with_flags(Flags::RdIncomplete);
    m.take(ms(1), peer, part);
    assert_eq!(m.session(peer).unwrap().outstanding(), 2);
    m.take(ms(1), peer, CdapMessage::response_to(&a, 0, "").unwrap());
    assert_eq!(m.session(peer).unwrap().outstanding(), 1);
    let got = drain(&mut m);
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|i| i.owner == OwnerId::RIB_DAEMON));
    // Once more (a duplicate), or from another peer, or of another kind:
    // nobody waits for it.
    m.take(ms(2), peer, CdapMessage::response_to(&a, 0, "").unwrap());
    m.take(
        ms(2),
        Peer::Neighbor(4),
        CdapMessage::response_to(&b, 0, "").unwrap(),
    );
    let write = CdapMessage::write("", "/dt", 1i32).with_invoke_id(2);
    m.take(
        ms(2),
        peer,
        CdapMessage::response_to(&write, 0, "").unwrap(),
    );
    assert!(drain(&mut m).is_empty());
    assert_eq!(m.counters().rx_unmatched, 3);
    // The owner gives up: a late answer is not delivered either.
    m.settle(peer, 2);
    m.take(ms(3), peer, CdapMessage::response_to(&b, 0, "").unwrap());
    assert!(drain(&mut m).is_empty());
    assert_eq!(m.counters().rx_unmatched, 4);
}

#[test]
fn a_late_answer_on_a_flow_object_still_reaches_the_flow_allocator() {
    let mut m = MgmtRib::new();
    let req = CdapMessage::create("Flow", "/fa/flows/key=9-1", vec![1u8]).with_invoke_id(2);
    let resp = CdapMessage::response_to(&req, 0, "").unwrap();
    let peer = m.peer_of(&resp, Some(1), 9);
    assert_eq!(peer, Peer::Remote(9));
    m.take(ms(0), peer, resp.clone());
    let got = drain(&mut m);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].owner, OwnerId::FLOW_ALLOCATOR);
    assert_eq!(m.session(peer).unwrap().counters.rx_unmatched, 1);
    assert_eq!(m.counters().rx_unmatched, 0, "taken by its owner");
}

#[test]
fn connections_are_not_object_requests() {
    let mut m = MgmtRib::new();
    m.take(
        ms(0),
        Peer::Neighbor(1),
        CdapMessage::release().with_invoke_id(1),
    );
    assert!(drain(&mut m).is_empty());
    assert!(m.poll_transmit().is_none());
    assert_eq!(m.counters().rx_not_object, 1);
}

#[test]
fn a_closed_session_forgets_what_it_waited_for() {
    let mut m = MgmtRib::new();
    let peer = Peer::Neighbor(1);
    let r = m.request(ms(0), peer, OwnerId::RIB_DAEMON, CdapMessage::read("", "/"));
    m.close(peer);
    assert!(m.session(peer).is_none());
    m.take(ms(1), peer, CdapMessage::response_to(&r, 0, "").unwrap());
    assert!(drain(&mut m).is_empty());
    assert_eq!(m.counters().rx_unmatched, 1);
}

#[test]
fn sessions_are_bounded_and_idle_ones_go_first() {
    let mut m = MgmtRib::new();
    let busy = Peer::Remote(0);
    m.request(
        ms(0),
        busy,
        OwnerId::FLOW_ALLOCATOR,
        CdapMessage::read("", "/"),
    );
    for a in 1..MAX_SESSIONS as u64 + 10 {
        m.unconfirmed(ms(a), Peer::Remote(a));
    }
    assert_eq!(m.sessions().count(), MAX_SESSIONS);
    assert!(
        m.session(busy).is_some(),
        "the one waiting for an answer stays"
    );
    assert!(m.session(Peer::Remote(1)).is_none());
    assert_eq!(m.counters().sessions_evicted, 10);
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    const NAMES: [&str; 7] = [
        "/fa/flows/key=1-2",
        "/dif/mgmt/fsos",
        "/dif/mgmt/nsm/dft",
        "/",
        "/ra/x",
        "bad name",
        "",
    ];

    proptest! {
        /// Any sequence of messages from any peers: no panic, nothing left
        /// waiting in the daemon, every refusal answers a request of the
        /// peer it goes to, and every message goes to at most one place.
        #[test]
        fn arbitrary_messages_are_dispatched_or_refused(
            msgs in proptest::collection::vec(
                (0usize..OpCode::ALL.len(), 0usize..NAMES.len(), proptest::option::of(-2i32..6), 0u32..3, any::<bool>()),
                0..60,
            ),
        ) {
            let mut m = MgmtRib::new();
            let mut asked = std::collections::BTreeSet::new();
            for (k, (op, name, invoke, port, remote)) in msgs.into_iter().enumerate() {
                let op = OpCode::ALL[op];
                let mut msg = CdapMessage::new(op).with_value(vec![k as u8]);
                msg.obj_name = Some(NAMES[name].into());
                msg.invoke_id = invoke;
                let peer = if remote { Peer::Remote(u64::from(port)) } else { Peer::Neighbor(port) };
                if op.is_response() && k % 2 == 0 {
                    // Half the answers are to requests this end asked.
                    let mut ours = CdapMessage::read("", "/");
                    ours.invoke_id = invoke;
                    m.request(ms(k as u64), peer, OwnerId::RIB_DAEMON, ours);
                }
                asked.insert((peer, invoke));
                m.take(ms(k as u64), peer, msg);
                let inbound = drain(&mut m).len();
                let out: Vec<(Peer, CdapMessage)> = std::iter::from_fn(|| m.poll_transmit()).collect();
                prop_assert!(inbound + out.len() <= 1);
                for (p, r) in out {
                    prop_assert!(asked.contains(&(p, r.invoke_id)));
                }
                prop_assert_eq!(m.daemon().pending(), 0);
            }
        }
    }
}

#[test]
fn gates_let_only_enrollment_and_port_authentication_in_before_admission() {
    let mut m = MgmtRib::new();
    m.set_require_sessions(true);
    let peer = Peer::Neighbor(3);
    let unadmitted = Gate {
        admitted: false,
        from_enrollee: true,
        member: true,
    };
    let start = CdapMessage::start("Enrollment", "/difm/enr").with_invoke_id(2);
    let auth = CdapMessage::write("PortAuthentication", "/difm/auth/port/hello", vec![1u8]);
    let hello = CdapMessage::write("Neighbor", "/difm/enr/hello", vec![1u8]);
    let fsos = CdapMessage::write(FSOS_OBJ_CLASS, FSOS_OBJ_NAME, vec![0u8]);
    let connect = CdapMessage::new(OpCode::Connect).with_invoke_id(1);
    assert_eq!(
        m.take_gated(ms(0), peer, connect, unadmitted),
        Verdict::Taken
    );
    assert_eq!(m.take_gated(ms(0), peer, start, unadmitted), Verdict::Taken);
    assert_eq!(m.take_gated(ms(0), peer, auth, unadmitted), Verdict::Taken);
    assert_eq!(
        m.take_gated(ms(0), peer, hello.clone(), unadmitted),
        Verdict::Unadmitted
    );
    assert_eq!(
        m.take_gated(ms(0), peer, fsos.clone(), unadmitted),
        Verdict::Unadmitted
    );
    let owners: Vec<OwnerId> = drain(&mut m).iter().map(|i| i.owner).collect();
    assert_eq!(
        owners,
        vec![
            OwnerId::ENROLLMENT,
            OwnerId::ENROLLMENT,
            OwnerId::SECURITY_MANAGER
        ]
    );
    // Admitted, but no session: hellos pass, routing does not.
    let admitted = Gate {
        admitted: true,
        from_enrollee: false,
        member: true,
    };
    assert_eq!(m.take_gated(ms(1), peer, hello, admitted), Verdict::Taken);
    assert_eq!(
        m.take_gated(ms(1), peer, fsos.clone(), admitted),
        Verdict::NoSession
    );
    assert_eq!(m.counters().refused_no_session, 1);
    // A member's M_CONNECT opens it; a non-member refuses one.
    let connect = CdapMessage::new(OpCode::Connect).with_invoke_id(5);
    assert_eq!(
        m.take_gated(ms(2), peer, connect.clone(), admitted),
        Verdict::Taken
    );
    let (to, r) = m.poll_transmit().unwrap();
    assert_eq!(
        (to, r.op_code(), r.result),
        (peer, OpCode::ConnectR, Some(0))
    );
    assert_eq!(m.state(peer), SessionState::Open);
    assert_eq!(m.take_gated(ms(3), peer, fsos, admitted), Verdict::Taken);
    let other = Peer::Neighbor(4);
    let not_member = Gate {
        member: false,
        ..admitted
    };
    m.take_gated(ms(4), other, connect, not_member);
    let (_, r) = m.poll_transmit().unwrap();
    assert_eq!(r.result, Some(gate::RESULT_NOT_MEMBER));
    assert_eq!(m.state(other), SessionState::Idle);
    // Our own M_CONNECT, accepted, opens a session; M_RELEASE closes it.
    let c = m
        .connect(ms(5), other, CdapMessage::new(OpCode::Connect))
        .unwrap();
    assert_eq!(m.state(other), SessionState::Connecting);
    let ok = CdapMessage::response_to(&c, 0, "").unwrap();
    m.take_gated(ms(6), other, ok, admitted);
    assert_eq!(m.state(other), SessionState::Open);
    assert!(m
        .connect(ms(7), other, CdapMessage::new(OpCode::Connect))
        .is_none());
    let release = CdapMessage::release().with_invoke_id(9);
    m.take_gated(ms(8), other, release, admitted);
    assert_eq!(m.state(other), SessionState::Idle);
}
