//! Unit tests of the shim-udp machine, with explicit time and a hand-carried wire.

use super::*;

mod liveness;

const A: &str = "127.0.0.1:5001";
const B: &str = "127.0.0.1:5002";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}
fn name(s: &str) -> AppName {
    s.parse().unwrap()
}
fn ms(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000_000)
}

/// Two shims, `a` knowing `echo` at `b`.
fn pair() -> (ShimUdp, ShimUdp) {
    let mut ca = Config::new("udp");
    ca.directory.insert(name("echo"), addr(B));
    ca.directory.insert(name("ghost"), addr(B));
    let a = ShimUdp::new(ca);
    let mut b = ShimUdp::new(Config::new("udp"));
    b.register(name("echo")).unwrap();
    (a, b)
}

/// Moves every Transmit from `from` (at address `src`) into `to`; returns the
/// other actions of `from`.
fn carry(now: Instant, from: &mut ShimUdp, src: &str, to: &mut ShimUdp) -> Vec<Action> {
    let mut other = Vec::new();
    while let Some(a) = from.poll_action() {
        match a {
            Action::Transmit { payload, .. } => {
                let _ = to.on_datagram(now, addr(src), &payload);
            }
            a => other.push(a),
        }
    }
    other
}

fn drop_transmits(s: &mut ShimUdp) -> Vec<Action> {
    let mut other = Vec::new();
    while let Some(a) = s.poll_action() {
        if !matches!(a, Action::Transmit { .. }) {
            other.push(a);
        }
    }
    other
}

/// Allocates port 1 on `a` to `echo` on `b` as port 7; returns nothing but
/// leaves both ends allocated.
fn allocate(a: &mut ShimUdp, b: &mut ShimUdp) {
    a.allocate(ms(0), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    assert!(carry(ms(0), a, A, b).is_empty());
    let req = carry(ms(1), b, B, a);
    let [Action::FlowRequest {
        handle,
        local,
        remote,
        ..
    }] = req.as_slice()
    else {
        panic!("expected a flow request, got {req:?}");
    };
    assert_eq!((local, remote), (&name("echo"), &name("perf")));
    assert_eq!(b.accept(*handle, 7).unwrap(), DEFAULT_MAX_SDU);
    assert!(carry(ms(1), b, B, a).is_empty());
    assert_eq!(
        drop_transmits(a),
        vec![Action::Allocated {
            port: 1,
            max_sdu: DEFAULT_MAX_SDU
        }]
    );
}

/// A requester at `A` that restarted (a new process numbering its first
/// flow 1 again) asks `b` for `echo` once more: `b`'s flow 7 from it goes
/// and a new request goes to the application.
fn restarted_requester_replaces_flow_7(b: &mut ShimUdp) {
    let (mut a, _) = pair();
    a.allocate(ms(5000), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    carry(ms(5000), &mut a, A, b);
    let acts = drop_transmits(b);
    assert!(
        matches!(
            acts.as_slice(),
            [Action::Deallocated { port: 7 }, Action::FlowRequest { .. }]
        ),
        "{acts:?}"
    );
    assert_eq!(b.counters().flows_restarted, 1);
}

#[test]
fn allocate_accept_and_data_both_ways() {
    let (mut a, mut b) = pair();
    allocate(&mut a, &mut b);

    let (to, hdr) = a.send_header(1, 5).unwrap();
    assert_eq!(to, addr(B));
    let mut dgram = hdr.to_vec();
    dgram.extend_from_slice(b"hello");
    assert_eq!(
        b.on_datagram(ms(2), addr(A), &dgram),
        Received::Deliver {
            port: 7,
            sdu: b"hello"
        }
    );
    let (to, hdr) = b.send_header(7, 3).unwrap();
    assert_eq!(to, addr(A));
    let mut back = hdr.to_vec();
    back.extend_from_slice(b"hey");
    assert_eq!(
        a.on_datagram(ms(3), addr(B), &back),
        Received::Deliver {
            port: 1,
            sdu: b"hey"
        }
    );
    assert_eq!(a.flow(1).unwrap().counters.sdus_out, 1);
    assert_eq!(a.flow(1).unwrap().counters.bytes_in, 3);
    assert_eq!(b.flow(7).unwrap().counters.bytes_in, 5);
    assert_eq!(
        a.poll_timeout(),
        Some(ms(10_000)),
        "nothing left to time but the liveness check"
    );
}

#[test]
fn refusal_by_the_application_reaches_the_requester() {
    let (mut a, mut b) = pair();
    a.allocate(ms(0), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    carry(ms(0), &mut a, A, &mut b);
    let req = carry(ms(0), &mut b, B, &mut a);
    let Action::FlowRequest { handle, .. } = req[0] else {
        panic!()
    };
    b.refuse(handle, "busy").unwrap();
    carry(ms(0), &mut b, B, &mut a);
    assert_eq!(
        drop_transmits(&mut a),
        vec![Action::AllocateFailed {
            port: 1,
            error: ShimError::Refused("busy".into())
        }]
    );
    assert!(a.flow(1).is_none());
    assert_eq!(b.counters().alloc_refused, 1);
}

#[test]
fn unregistered_name_is_refused_not_dropped() {
    let (mut a, mut b) = pair();
    a.allocate(ms(0), 1, name("perf"), name("ghost"), QosSpec::default())
        .unwrap();
    carry(ms(0), &mut a, A, &mut b);
    assert!(carry(ms(0), &mut b, B, &mut a).is_empty());
    assert_eq!(
        drop_transmits(&mut a),
        vec![Action::AllocateFailed {
            port: 1,
            error: ShimError::NotRegistered {
                name: Box::new(name("ghost")),
                peer: addr(B)
            }
        }]
    );
}

#[test]
fn name_outside_the_directory_fails_at_once() {
    let (mut a, _) = pair();
    assert_eq!(
        a.allocate(ms(0), 1, name("perf"), name("nowhere"), QosSpec::default()),
        Err(ShimError::NameNotFound(Box::new(name("nowhere"))))
    );
    assert!(a.poll_action().is_none());
}

#[test]
fn unsatisfiable_qos_is_refused_with_the_reason() {
    let (mut a, _) = pair();
    let reliable = QosSpec {
        reliable: true,
        ..Default::default()
    };
    let err = a
        .allocate(ms(0), 1, name("perf"), name("echo"), reliable)
        .unwrap_err();
    assert!(matches!(err, ShimError::QosNotSatisfiable(ref s) if s.contains("retransmit")));
    let big = QosSpec {
        max_sdu_size: Some(DEFAULT_MAX_SDU + 1),
        ..Default::default()
    };
    assert!(matches!(
        a.allocate(ms(0), 2, name("perf"), name("echo"), big),
        Err(ShimError::QosNotSatisfiable(_))
    ));
    let cube = QosSpec {
        cube: Some(2),
        ..Default::default()
    };
    assert!(matches!(
        a.allocate(ms(0), 3, name("perf"), name("echo"), cube),
        Err(ShimError::QosNotSatisfiable(ref s)) if s.contains("no QoS cubes")
    ));
}

#[test]
fn lost_requests_are_retransmitted_then_time_out() {
    let (mut a, _) = pair();
    a.allocate(ms(0), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    assert_eq!(drop_transmits(&mut a), vec![]);
    assert_eq!(a.poll_timeout(), Some(ms(200)));
    a.handle_timeout(ms(199));
    assert!(
        a.poll_action().is_none(),
        "nothing before the retry interval"
    );
    a.handle_timeout(ms(200));
    assert!(matches!(a.poll_action(), Some(Action::Transmit { .. })));
    for t in (400..2000).step_by(200) {
        a.handle_timeout(ms(t));
        assert!(drop_transmits(&mut a).is_empty());
    }
    a.handle_timeout(ms(2000));
    assert_eq!(
        a.poll_action(),
        Some(Action::AllocateFailed {
            port: 1,
            error: ShimError::Timeout {
                peer: addr(B),
                after: Duration::from_secs(2)
            }
        })
    );
    assert!(a.flow(1).is_none());
    assert_eq!(a.poll_timeout(), None);
    assert_eq!(a.counters().alloc_timeouts, 1);
}

#[test]
fn lost_response_is_answered_again_without_a_second_flow() {
    let (mut a, mut b) = pair();
    a.allocate(ms(0), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    carry(ms(0), &mut a, A, &mut b);
    let req = carry(ms(0), &mut b, B, &mut a);
    let Action::FlowRequest { handle, .. } = req[0] else {
        panic!()
    };
    b.accept(handle, 7).unwrap();
    drop_transmits(&mut b); // the response is lost
    a.handle_timeout(ms(200)); // a retransmits
    carry(ms(200), &mut a, A, &mut b);
    assert!(
        carry(ms(200), &mut b, B, &mut a).is_empty(),
        "no second request"
    );
    assert_eq!(b.flows().count(), 1);
    assert!(matches!(
        drop_transmits(&mut a).as_slice(),
        [Action::Allocated { port: 1, .. }]
    ));
}

#[test]
fn a_restarted_requester_asking_with_an_old_port_id_gets_a_new_flow() {
    let (mut a, mut b) = pair();
    allocate(&mut a, &mut b);
    let (_, hdr) = a.send_header(1, 5).unwrap();
    let mut dgram = hdr.to_vec();
    dgram.extend_from_slice(b"hello");
    assert!(matches!(
        b.on_datagram(ms(2), addr(A), &dgram),
        Received::Deliver { port: 7, .. }
    ));
    // `a` restarts: a new process at the same address, which numbers its
    // first flow 1 again. Its request is not a retransmission: flow 7 is
    // gone at `b` and a new request goes to the application.
    restarted_requester_replaces_flow_7(&mut b);
    assert_eq!(b.flows().count(), 0);
}

#[test]
fn malformed_and_stray_datagrams_are_counted_and_dropped() {
    let (mut a, mut b) = pair();
    allocate(&mut a, &mut b);
    assert!(matches!(
        b.on_datagram(ms(5), addr(A), &[0xee, 1, 2]),
        Received::Dropped(DropReason::Malformed(WireError::UnknownType(0xee)))
    ));
    assert!(matches!(
        b.on_datagram(ms(5), addr(A), &[]),
        Received::Dropped(DropReason::Malformed(_))
    ));
    let stray = Datagram::Data {
        dst_port: 99,
        sdu: b"x",
    }
    .to_vec();
    assert_eq!(
        b.on_datagram(ms(5), addr(A), &stray),
        Received::Dropped(DropReason::UnknownFlow(99))
    );
    let spoof = Datagram::Data {
        dst_port: 7,
        sdu: b"x",
    }
    .to_vec();
    assert!(matches!(
        b.on_datagram(ms(5), addr("127.0.0.1:6666"), &spoof),
        Received::Dropped(DropReason::WrongPeer { port: 7, .. })
    ));
    let c = b.counters();
    assert_eq!(
        (c.rx_malformed, c.rx_unknown_flow, c.rx_wrong_peer),
        (2, 1, 1)
    );
    // The flow is undisturbed.
    let (_, hdr) = a.send_header(1, 2).unwrap();
    let mut ok = hdr.to_vec();
    ok.extend_from_slice(b"ok");
    assert_eq!(
        b.on_datagram(ms(6), addr(A), &ok),
        Received::Deliver {
            port: 7,
            sdu: b"ok"
        }
    );
}

#[test]
fn oversize_sdu_is_refused_with_both_sizes() {
    let mut ca = Config::new("udp");
    ca.max_sdu = 100;
    ca.directory.insert(name("echo"), addr(B));
    let mut a = ShimUdp::new(ca);
    let (_, mut b) = pair();
    allocate_small(&mut a, &mut b);
    assert_eq!(
        a.send_header(1, 101),
        Err(ShimError::SduTooLarge {
            size: 101,
            max: 100
        })
    );
    assert!(a.send_header(1, 100).is_ok());
    assert_eq!(a.flow(1).unwrap().counters.drops_out, 1);
}

/// Like [`allocate`] but for a requester with a smaller maximum SDU: the flow
/// takes the smaller of the two ends' maxima.
fn allocate_small(a: &mut ShimUdp, b: &mut ShimUdp) {
    a.allocate(ms(0), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    carry(ms(0), a, A, b);
    let req = carry(ms(0), b, B, a);
    let Action::FlowRequest { handle, .. } = req[0] else {
        panic!()
    };
    b.accept(handle, 7).unwrap();
    carry(ms(0), b, B, a);
    assert_eq!(
        drop_transmits(a),
        vec![Action::Allocated {
            port: 1,
            max_sdu: 100
        }]
    );
}

#[test]
fn deallocation_reaches_the_peer() {
    let (mut a, mut b) = pair();
    allocate(&mut a, &mut b);
    a.deallocate(ms(1), 1).unwrap();
    assert!(carry(ms(9), &mut a, A, &mut b).is_empty());
    assert_eq!(
        drop_transmits(&mut b),
        vec![Action::Deallocated { port: 7 }]
    );
    assert!(b.flow(7).is_none());
    assert_eq!(a.deallocate(ms(1), 1), Err(ShimError::UnknownFlow(1)));
}

#[test]
fn an_application_that_never_answers_is_refused_for() {
    let (mut a, mut b) = pair();
    a.allocate(ms(0), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    carry(ms(0), &mut a, A, &mut b);
    let req = carry(ms(0), &mut b, B, &mut a);
    let Action::FlowRequest { handle, .. } = req[0] else {
        panic!()
    };
    let end = ms(0) + b.config().accept_timeout;
    assert!(b.config().accept_timeout < a.config().alloc_timeout);
    assert_eq!(b.poll_timeout(), Some(end));
    b.handle_timeout(end);
    let rest = carry(end, &mut b, B, &mut a);
    assert_eq!(rest, vec![Action::RequestWithdrawn { handle }]);
    assert!(matches!(
        drop_transmits(&mut a).as_slice(),
        [Action::AllocateFailed {
            error: ShimError::Refused(_),
            ..
        }]
    ));
    assert_eq!(b.accept(handle, 7), Err(ShimError::UnknownRequest(handle)));
}

#[test]
fn unregistering_refuses_pending_requests() {
    let (mut a, mut b) = pair();
    a.allocate(ms(0), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    carry(ms(0), &mut a, A, &mut b);
    let req = carry(ms(0), &mut b, B, &mut a);
    let Action::FlowRequest { handle, .. } = req[0] else {
        panic!()
    };
    assert!(b.unregister(&name("echo")));
    assert!(!b.unregister(&name("echo")));
    assert_eq!(
        carry(ms(1), &mut b, B, &mut a),
        vec![Action::RequestWithdrawn { handle }]
    );
    assert!(matches!(
        drop_transmits(&mut a).as_slice(),
        [Action::AllocateFailed { .. }]
    ));
    assert_eq!(b.register(name("echo")), Ok(()));
    assert_eq!(
        b.register(name("echo")),
        Err(ShimError::NameInUse(Box::new(name("echo"))))
    );
}

#[test]
fn late_acceptance_of_an_abandoned_flow_is_torn_down() {
    let (mut a, mut b) = pair();
    a.allocate(ms(0), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    carry(ms(0), &mut a, A, &mut b);
    let req = carry(ms(0), &mut b, B, &mut a);
    let Action::FlowRequest { handle, .. } = req[0] else {
        panic!()
    };
    a.deallocate(ms(1), 1).unwrap(); // the requester gives up
    b.accept(handle, 7).unwrap();
    carry(ms(1), &mut b, B, &mut a);
    assert!(carry(ms(1), &mut a, A, &mut b).is_empty());
    assert_eq!(
        drop_transmits(&mut b),
        vec![Action::Deallocated { port: 7 }]
    );
}

proptest::proptest! {
    #[test]
    fn arbitrary_datagrams_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
        let (mut a, mut b) = pair();
        allocate(&mut a, &mut b);
        let _ = b.on_datagram(ms(1), addr(A), &bytes);
        b.handle_timeout(ms(10_000));
        while b.poll_action().is_some() {}
    }
}

#[test]
fn empty_sdus_are_refused_and_dropped() {
    let (mut a, mut b) = pair();
    allocate(&mut a, &mut b);
    assert_eq!(a.send_header(1, 0), Err(ShimError::EmptySdu));
    let empty = Datagram::Data {
        dst_port: 7,
        sdu: b"",
    }
    .to_vec();
    assert_eq!(
        b.on_datagram(ms(5), addr(A), &empty),
        Received::Dropped(DropReason::EmptySdu(7))
    );
    assert_eq!(b.counters().rx_malformed, 1);
    assert_eq!(b.flow(7).unwrap().counters.sdus_in, 0);
}

#[test]
fn a_peer_offering_no_room_is_refused() {
    let (mut a, mut b) = pair();
    a.allocate(ms(0), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    carry(ms(0), &mut a, A, &mut b);
    let bogus = Datagram::AllocResp {
        dst_port: 1,
        src_port: 7,
        result: AllocResult::Accepted,
        max_sdu: 0,
        reason: "",
        direct: None,
    }
    .to_vec();
    assert_eq!(a.on_datagram(ms(1), addr(B), &bogus), Received::Control);
    let acts: Vec<Action> = std::iter::from_fn(|| a.poll_action()).collect();
    assert!(
        matches!(acts[0], Action::Transmit { .. }),
        "the peer is told to drop it"
    );
    assert!(matches!(
        acts[1],
        Action::AllocateFailed {
            port: 1,
            error: ShimError::Refused(_)
        }
    ));
    assert!(a.flow(1).is_none());
}

#[test]
fn long_refusal_reasons_are_cut_to_fit_a_datagram() {
    let (mut a, mut b) = pair();
    a.allocate(ms(0), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    carry(ms(0), &mut a, A, &mut b);
    let req = carry(ms(0), &mut b, B, &mut a);
    let Action::FlowRequest { handle, .. } = req[0] else {
        panic!()
    };
    let reason = "é".repeat(100_000);
    b.refuse(handle, &reason).unwrap();
    let Some(Action::Transmit { payload, .. }) = b.poll_action() else {
        panic!("a response")
    };
    assert!(payload.len() < 600, "{} bytes", payload.len());
    let _ = a.on_datagram(ms(1), addr(B), &payload);
    match a.poll_action() {
        Some(Action::AllocateFailed {
            error: ShimError::Refused(r),
            ..
        }) => assert_eq!(r, "é".repeat(MAX_REASON_LEN / 2)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn peers_only_takes_requests_from_configured_peers_and_no_one_else_claiming_them() {
    let mut cb = Config::new("udp");
    cb.peers_only = true;
    cb.directory.insert(name("alpha.net"), addr(A));
    let mut b = ShimUdp::new(cb);
    b.register(name("beta.net")).unwrap();
    let req = |src: &str| {
        Datagram::AllocReq {
            src_port: 9,
            qos: QosSpec::default(),
            src: name(src),
            dst: name("beta.net"),
            direct: None,
        }
        .to_vec()
    };
    let flow_requests = |b: &mut ShimUdp| {
        drop_transmits(b)
            .into_iter()
            .filter(|a| matches!(a, Action::FlowRequest { .. }))
            .count()
    };
    // Someone else, claiming to be alpha.net, or as anyone.
    let _ = b.on_datagram(ms(0), addr("127.0.0.1:6666"), &req("alpha.net"));
    let _ = b.on_datagram(ms(0), addr("127.0.0.1:6666"), &req("mallory.net"));
    assert_eq!(flow_requests(&mut b), 0);
    assert_eq!(b.counters().rx_wrong_peer, 2);
    // Alpha from its configured address.
    let _ = b.on_datagram(ms(0), addr(A), &req("alpha.net"));
    assert_eq!(flow_requests(&mut b), 1);
}

#[test]
fn a_directory_and_peers_only_set_at_run_time_judge_what_comes_next() {
    let (mut a, mut b) = pair();
    allocate(&mut a, &mut b);
    // `echo` leaves a's directory, `relay` joins it: the flow up stays,
    // an allocation to `echo` is refused at once, one to `relay` goes out.
    a.set_directory([(name("relay"), addr(B))].into_iter().collect());
    assert!(a.flow(1).is_some());
    assert!(!a.knows(&name("echo")) && a.knows(&name("relay")));
    let e = a.allocate(ms(10), 2, name("perf"), name("echo"), QosSpec::default());
    assert_eq!(e, Err(ShimError::NameNotFound(Box::new(name("echo")))));
    a.allocate(ms(10), 3, name("perf"), name("relay"), QosSpec::default())
        .unwrap();
    let sent: Vec<SocketAddr> = std::iter::from_fn(|| a.poll_action())
        .filter_map(|act| match act {
            Action::Transmit { to, .. } => Some(to),
            _ => None,
        })
        .collect();
    assert_eq!(sent, vec![addr(B)]);
    // b turns peers_only on, knowing no one: a's next request is dropped
    // and counted, its flow up stays; knowing a again, b takes it.
    b.set_peers_only(true);
    a.set_directory([(name("echo"), addr(B))].into_iter().collect());
    a.allocate(ms(20), 5, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    assert!(carry(ms(20), &mut a, A, &mut b).is_empty());
    assert_eq!(b.counters().rx_wrong_peer, 1);
    assert!(drop_transmits(&mut b).is_empty(), "no answer, no request");
    assert!(b.flow(7).is_some());
    b.set_directory([(name("perf"), addr(A))].into_iter().collect());
    a.handle_timeout(ms(220));
    assert!(carry(ms(220), &mut a, A, &mut b).is_empty());
    assert!(matches!(
        drop_transmits(&mut b).as_slice(),
        [Action::FlowRequest { .. }]
    ));
}

/// Allocates port 1 on `a` to `echo` on `b` as port 7, `a` offering a
/// direct socket on `a_offer` and `b` answering with `b_offer`; returns
/// what `b` saw offered.
fn allocate_offering(
    a: &mut ShimUdp,
    b: &mut ShimUdp,
    a_offer: Option<u16>,
    b_offer: Option<u16>,
) -> Option<SocketAddr> {
    let qos = QosSpec::default();
    a.allocate_direct(ms(0), 1, name("perf"), name("echo"), qos, a_offer)
        .unwrap();
    assert!(carry(ms(0), a, A, b).is_empty());
    let req = carry(ms(1), b, B, a);
    let [Action::FlowRequest { handle, .. }] = req.as_slice() else {
        panic!("expected a flow request, got {req:?}");
    };
    let offered = b.offered_direct(*handle);
    b.accept_direct(*handle, 7, b_offer).unwrap();
    assert!(carry(ms(1), b, B, a).is_empty());
    assert!(matches!(
        drop_transmits(a).as_slice(),
        [Action::Allocated { port: 1, .. }]
    ));
    offered
}

#[test]
fn a_direct_flow_needs_both_offers_and_names_each_end_s_socket() {
    // Both offer: each end learns where the other's socket is, on the
    // address its shim's datagrams came from.
    let (mut a, mut b) = pair();
    let offered = allocate_offering(&mut a, &mut b, Some(40_001), Some(40_002));
    assert_eq!(offered, Some(addr("127.0.0.1:40001")));
    assert_eq!(
        a.flow(1).unwrap().direct_peer,
        Some(addr("127.0.0.1:40002"))
    );
    assert_eq!(
        b.flow(7).unwrap().direct_peer,
        Some(addr("127.0.0.1:40001"))
    );

    // The responder does not take it: an ordinary flow at both ends.
    let (mut a, mut b) = pair();
    let offered = allocate_offering(&mut a, &mut b, Some(40_001), None);
    assert_eq!(offered, Some(addr("127.0.0.1:40001")));
    assert_eq!(a.flow(1).unwrap().direct_peer, None);
    assert_eq!(b.flow(7).unwrap().direct_peer, None);

    // The requester did not offer: the responder's port is not sent, and
    // data still flows through the shims.
    let (mut a, mut b) = pair();
    assert_eq!(allocate_offering(&mut a, &mut b, None, Some(40_002)), None);
    assert_eq!(a.flow(1).unwrap().direct_peer, None);
    assert_eq!(b.flow(7).unwrap().direct_peer, None);
    let (to, hdr) = a.send_header(1, 3).unwrap();
    assert_eq!(to, addr(B));
    let mut dgram = hdr.to_vec();
    dgram.extend_from_slice(b"abc");
    assert_eq!(
        b.on_datagram(ms(2), addr(A), &dgram),
        Received::Deliver {
            port: 7,
            sdu: b"abc"
        }
    );
}

#[test]
fn a_retransmitted_direct_request_gets_the_same_socket_again() {
    let (mut a, mut b) = pair();
    let qos = QosSpec::default();
    a.allocate_direct(ms(0), 1, name("perf"), name("echo"), qos, Some(40_001))
        .unwrap();
    let Some(Action::Transmit { payload: req, .. }) = a.poll_action() else {
        panic!("expected the request");
    };
    let _ = b.on_datagram(ms(0), addr(A), &req);
    let Some(Action::FlowRequest { handle, .. }) = b.poll_action() else {
        panic!("expected a flow request");
    };
    b.accept_direct(handle, 7, Some(40_002)).unwrap();
    // The first answer is lost; the retransmitted request is answered again
    // with the same socket, and no second flow.
    drop_transmits(&mut b);
    let _ = b.on_datagram(ms(200), addr(A), &req);
    let Some(Action::Transmit { payload, .. }) = b.poll_action() else {
        panic!("expected the answer again");
    };
    assert!(matches!(
        Datagram::parse(&payload),
        Ok(Datagram::AllocResp {
            dst_port: 1,
            src_port: 7,
            direct: Some(40_002),
            ..
        })
    ));
    assert_eq!(b.flows().count(), 1);
}

#[test]
fn a_request_for_other_applications_on_a_live_flows_port_id_changes_nothing() {
    let (mut a, mut b) = pair();
    allocate(&mut a, &mut b);
    let data = |a: &mut ShimUdp| {
        let (_, hdr) = a.send_header(1, 1).unwrap();
        let mut d = hdr.to_vec();
        d.push(b'x');
        d
    };
    // Off the path, with A's address on it, guessing port-id 1: before any
    // data (it is no retransmission) and after (it is no restart).
    let spoof = Datagram::AllocReq {
        src_port: 1,
        qos: QosSpec::default(),
        src: name("z"),
        dst: name("echo"),
        direct: None,
    }
    .to_vec();
    for at in [2, 4] {
        b.on_datagram(ms(at), addr(A), &spoof);
        let mut refusal = Vec::new();
        while let Some(x) = b.poll_action() {
            match x {
                Action::Transmit { to, payload } if to == addr(A) => refusal.push(payload),
                other => panic!("the request changed something: {other:?}"),
            }
        }
        let [resp] = refusal.as_slice() else {
            panic!("{refusal:?}")
        };
        let Ok(Datagram::AllocResp { result, reason, .. }) = Datagram::parse(resp) else {
            panic!("not a response")
        };
        assert_eq!(result, AllocResult::Refused);
        assert!(
            reason.contains("names a live flow from perf to echo"),
            "{reason}"
        );
        // The refusal reaching A changes nothing there either.
        let _ = a.on_datagram(ms(at), addr(B), resp);
        assert!(a.poll_action().is_none());
        assert!(matches!(
            b.on_datagram(ms(at + 1), addr(A), &data(&mut a)),
            Received::Deliver { port: 7, .. }
        ));
    }
    assert_eq!(b.flow(7).unwrap().counters.sdus_in, 2);
    assert_eq!(b.counters().flows_restarted, 0);
    assert_eq!(b.counters().alloc_refused, 2);
    // A requester that restarted and asks for the same applications again
    // still gets a new flow in place of the old one.
    restarted_requester_replaces_flow_7(&mut b);
}

#[test]
fn a_lost_deallocation_goes_again_until_the_peer_heard() {
    let (mut a, mut b) = pair();
    allocate(&mut a, &mut b);
    a.deallocate(ms(10), 1).unwrap();
    // The DEALLOC is lost: the peer's flow stays.
    assert!(drop_transmits(&mut a).is_empty());
    assert!(b.flow(7).is_some());
    let again = ms(10) + a.config().alloc_retry;
    assert_eq!(a.poll_timeout(), Some(again));
    a.handle_timeout(again);
    assert!(carry(again, &mut a, A, &mut b).is_empty());
    assert_eq!(
        drop_transmits(&mut b),
        vec![Action::Deallocated { port: 7 }]
    );
    assert!(b.flow(7).is_none());
    // Once more; the peer that heard ignores it, and then it stops.
    let last = a.poll_timeout().unwrap();
    assert_eq!(last, again + a.config().alloc_retry * 2);
    a.handle_timeout(last);
    assert!(carry(last, &mut a, A, &mut b).is_empty());
    assert!(drop_transmits(&mut b).is_empty());
    assert_eq!(a.poll_timeout(), None);
}

#[test]
fn a_deallocation_is_not_repeated_once_its_port_id_names_a_new_flow() {
    let (mut a, mut b) = pair();
    allocate(&mut a, &mut b);
    a.deallocate(ms(10), 1).unwrap();
    assert!(carry(ms(10), &mut a, A, &mut b).is_empty());
    assert_eq!(
        drop_transmits(&mut b),
        vec![Action::Deallocated { port: 7 }]
    );
    // Port-id 1 again, and the peer takes port-id 7 again too.
    a.allocate(ms(20), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    carry(ms(20), &mut a, A, &mut b);
    let req = carry(ms(20), &mut b, B, &mut a);
    let Action::FlowRequest { handle, .. } = req[0] else {
        panic!("{req:?}")
    };
    b.accept(handle, 7).unwrap();
    carry(ms(20), &mut b, B, &mut a);
    assert!(matches!(
        drop_transmits(&mut a).as_slice(),
        [Action::Allocated { port: 1, .. }]
    ));
    // The old DEALLOC (port-id 1 to 7) would name the new flow: not sent.
    let t = ms(10) + a.config().alloc_retry;
    a.handle_timeout(t);
    assert!(carry(t, &mut a, A, &mut b).is_empty());
    assert!(b.flow(7).is_some(), "the new flow stays");
    assert!(a
        .poll_timeout()
        .is_none_or(|d| d > t + a.config().alloc_retry * 10));
}

/// One host asking for flows faster than the application answers, from
/// any number of ports, takes at most `max_pending_per_host` of the
/// pending requests: a request from another host still reaches the
/// application, and the flooder hears why it was refused.
#[test]
fn one_host_cannot_take_every_pending_request() {
    let (_, mut b) = pair();
    let req = |src_port: PortId| {
        Datagram::AllocReq {
            src_port,
            qos: QosSpec::default(),
            src: name("flooder"),
            dst: name("echo"),
            direct: None,
        }
        .to_vec()
    };
    for k in 0..300u16 {
        let from = SocketAddr::new("10.0.0.66".parse().unwrap(), 1000 + k);
        let _ = b.on_datagram(ms(0), from, &req(1));
    }
    let acts: Vec<Action> = std::iter::from_fn(|| b.poll_action()).collect();
    let asked = acts
        .iter()
        .filter(|a| matches!(a, Action::FlowRequest { .. }))
        .count();
    assert_eq!(asked, 64, "the flooder's requests raised");
    let refused = acts
        .iter()
        .filter_map(|a| match a {
            Action::Transmit { payload, .. } => Datagram::parse(payload).ok(),
            _ => None,
        })
        .filter(|d| {
            matches!(d, Datagram::AllocResp { result: AllocResult::NoResources, reason, .. }
                if reason.contains("too many requests from 10.0.0.66"))
        })
        .count();
    assert_eq!(refused, 300 - 64);
    // Another host is served.
    let _ = b.on_datagram(ms(1), addr("10.0.0.7:9000"), &req(1));
    assert!(
        matches!(b.poll_action(), Some(Action::FlowRequest { .. })),
        "the other host's request reached the application"
    );
}
