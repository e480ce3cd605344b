//! Unit tests of the shim-eth machine, with explicit time and a hand-carried wire.

use super::*;
use rina_wire::shim_eth::ETH_P_8021Q;

const MA: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xa]);
const MB: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xb]);
const MC: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xc]);

fn name(s: &str) -> AppName {
    s.parse().unwrap()
}
fn ms(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000_000)
}
fn shim(mac: MacAddr, vlan: Option<u16>) -> ShimEth {
    ShimEth::new(Config::new("10", vlan, mac, 1500))
}

/// `a` on VLAN 10 (nothing registered) and `b` on VLAN 10 serving `srv`.
fn pair() -> (ShimEth, ShimEth) {
    let a = shim(MA, Some(10));
    let mut b = shim(MB, Some(10));
    b.register(name("srv")).unwrap();
    (a, b)
}

/// Feeds every frame `from` transmits to each of `to`; returns the other actions of `from`.
fn carry(now: Instant, from: &mut ShimEth, to: &mut [&mut ShimEth]) -> Vec<Action> {
    let mut other = Vec::new();
    while let Some(a) = from.poll_action() {
        match a {
            Action::Transmit { frame } => {
                for t in to.iter_mut() {
                    let _ = t.on_frame(now, &frame, None);
                }
            }
            a => other.push(a),
        }
    }
    other
}

fn transmits(s: &mut ShimEth) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    while let Some(a) = s.poll_action() {
        if let Action::Transmit { frame } = a {
            v.push(frame);
        }
    }
    v
}

fn data(s: &mut ShimEth, port: PortId, sdu: &[u8]) -> Vec<u8> {
    let h = s.send_header(port, sdu.len()).unwrap();
    Frame {
        header: h,
        payload: sdu,
    }
    .to_vec()
}

/// Allocates port 1 of `a` to `srv` at `b`; returns `b`'s accepted port 7.
fn allocate(a: &mut ShimEth, b: &mut ShimEth) -> PortId {
    a.allocate(ms(0), 1, name("cli"), name("srv"), QosSpec::default())
        .unwrap();
    assert!(carry(ms(0), a, &mut [b]).is_empty());
    // The request itself offers the flow to b's application.
    let mut got = carry(ms(1), b, &mut [a]);
    assert_eq!(
        a.poll_action(),
        Some(Action::Allocated {
            port: 1,
            max_sdu: 1496
        })
    );
    // Data sent before the application answers waits for it.
    let f = data(a, 1, b"hello");
    assert_eq!(b.on_frame(ms(2), &f, None), Received::Consumed);
    assert_eq!(got.len(), 1);
    let Some(Action::FlowRequest {
        handle,
        local,
        remote,
        ..
    }) = got.pop()
    else {
        panic!("no flow request")
    };
    assert_eq!((local, remote), (name("srv"), name("cli")));
    assert_eq!(b.accept(handle, 7).unwrap(), 1496);
    assert_eq!(
        b.poll_action(),
        Some(Action::Deliver {
            port: 7,
            sdu: b"hello".to_vec()
        })
    );
    7
}

#[test]
fn arp_request_and_reply_are_rfc826_with_ptype_d1f0() {
    let (mut a, mut b) = pair();
    a.allocate(ms(0), 1, name("cli"), name("srv"), QosSpec::default())
        .unwrap();
    let req = transmits(&mut a).pop().unwrap();
    let f = Frame::parse(&req).unwrap();
    assert_eq!(f.header.dst, MacAddr::BROADCAST);
    assert_eq!(f.header.vlan, Some(10));
    assert_eq!(f.header.ethertype, ETH_P_ARP);
    assert_eq!(&f.payload[..8], &[0, 1, 0xd1, 0xf0, 6, 3, 0, 1]);
    assert_eq!(b.on_frame(ms(1), &req, None), Received::Consumed);
    let rep = transmits(&mut b).pop().unwrap();
    let f = Frame::parse(&rep).unwrap();
    assert_eq!((f.header.dst, f.header.src), (MA, MB));
    let arp = Arp::parse(f.payload).unwrap();
    assert_eq!(arp.op, ArpOp::Reply);
    assert_eq!((arp.spa, arp.tpa, arp.tha), (&b"srv"[..], &b"cli"[..], MA));
    // The target learnt the requester's name.
    assert_eq!(b.resolved(&name("cli")), Some(MA));
    assert_eq!(a.on_frame(ms(2), &rep, None), Received::Consumed);
    assert_eq!(a.resolved(&name("srv")), Some(MB));
}

#[test]
fn one_flow_per_mac_pair_with_counters_both_ways() {
    let (mut a, mut b) = pair();
    let pb = allocate(&mut a, &mut b);
    let back = data(&mut b, pb, b"world");
    assert_eq!(
        a.on_frame(ms(3), &back, None),
        Received::Deliver {
            port: 1,
            sdu: b"world"
        }
    );
    // A second flow to the same MAC is refused with a clear error.
    let e = a
        .allocate(ms(3), 2, name("other"), name("srv"), QosSpec::default())
        .unwrap_err();
    assert_eq!(e, ShimEthError::FlowExists { mac: MB, port: 1 });
    assert!(e.to_string().contains("one flow per pair of MACs"));
    let fa = a.flow(1).unwrap().counters;
    assert_eq!(
        (fa.sdus_out, fa.bytes_out, fa.sdus_in, fa.bytes_in),
        (1, 5, 1, 5)
    );
    let fb = b.flow(pb).unwrap().counters;
    assert_eq!((fb.sdus_in, fb.sdus_out), (1, 1));
    // Closing is local: a later frame from the peer raises a new request.
    b.deallocate(pb).unwrap();
    let f = data(&mut a, 1, b"again");
    assert_eq!(b.on_frame(ms(4), &f, None), Received::Consumed);
    assert!(matches!(b.poll_action(), Some(Action::FlowRequest { .. })));
}

#[test]
fn a_name_that_does_not_resolve_fails_after_bounded_retries() {
    let (mut a, _) = pair();
    a.allocate(ms(0), 1, name("cli"), name("nobody"), QosSpec::default())
        .unwrap();
    assert_eq!(transmits(&mut a).len(), 1);
    let mut sent = 1;
    let mut now = ms(0);
    while let Some(t) = a.poll_timeout() {
        assert!(t >= now, "time goes forward");
        now = t;
        a.handle_timeout(now);
        let mut failed = None;
        while let Some(x) = a.poll_action() {
            match x {
                Action::Transmit { .. } => sent += 1,
                Action::AllocateFailed { port, error } => failed = Some((port, error)),
                other => panic!("unexpected {other:?}"),
            }
        }
        if let Some((port, error)) = failed {
            assert_eq!(port, 1);
            assert_eq!(now, ms(2000));
            assert_eq!(
                error.to_string(),
                "nobody does not resolve in shim DIF 10: no ARP reply within 2s"
            );
            break;
        }
    }
    // One request at 0 then one every 250 ms before the 2 s deadline.
    assert_eq!(sent, 8);
    assert_eq!(a.counters().arp_timeouts, 1);
    assert!(a.flow(1).is_none());
    assert_eq!(a.poll_timeout(), None);
}

#[test]
fn cache_expires_unless_a_flow_uses_it_then_it_is_refreshed() {
    let (mut a, mut b) = pair();
    allocate(&mut a, &mut b);
    let ttl = a.config().arp_ttl;
    let t = ms(1) + ttl;
    // a's entry for srv is in use: refreshed by a unicast request.
    a.handle_timeout(t);
    let out = transmits(&mut a);
    assert_eq!(out.len(), 1);
    let f = Frame::parse(&out[0]).unwrap();
    assert_eq!(f.header.dst, MB);
    assert_eq!(a.resolved(&name("srv")), Some(MB));
    // An entry without a flow goes away.
    let mut c = shim(MC, Some(10));
    c.register(name("third")).unwrap();
    a.allocate(t, 5, name("cli"), name("third"), QosSpec::default())
        .unwrap();
    carry(t, &mut a, &mut [&mut c]);
    carry(t, &mut c, &mut [&mut a]);
    a.deallocate(5).unwrap();
    assert_eq!(a.resolved(&name("third")), Some(MC));
    a.handle_timeout(t + ttl);
    assert_eq!(a.resolved(&name("third")), None);
    assert_eq!(a.resolved(&name("srv")), Some(MB));
}

#[test]
fn other_vlans_ethertypes_and_garbage_are_counted_not_fatal() {
    let (mut a, mut b) = pair();
    let pb = allocate(&mut a, &mut b);
    let good = data(&mut a, 1, b"x");
    let hdr = |vlan, et| FrameHeader {
        dst: MB,
        src: MA,
        vlan,
        ethertype: et,
    };
    let frame = |h: FrameHeader, p: &[u8]| {
        Frame {
            header: h,
            payload: p,
        }
        .to_vec()
    };
    let mut bad = vec![
        frame(hdr(Some(20), ETH_P_RINA), b"other vlan"),
        frame(hdr(None, ETH_P_RINA), b"untagged"),
        frame(hdr(Some(10), 0x88b5), b"other ethertype"),
        frame(
            hdr(Some(10), ETH_P_ARP),
            &[0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5],
        ),
        frame(hdr(Some(10), ETH_P_ARP), &[0, 1, 0xd1]),
        frame(hdr(Some(10), ETH_P_RINA), b""),
        good[..10].to_vec(),
        good[..15].to_vec(),
    ];
    // An ARP packet of ours whose names are not application names.
    let mut arp = Vec::new();
    Arp {
        op: ArpOp::Request,
        sha: MA,
        spa: b"bad name",
        tha: MacAddr::ZERO,
        tpa: b"srv",
    }
    .encode(&mut arp)
    .unwrap();
    bad.push(frame(hdr(Some(10), ETH_P_ARP), &arp));
    for f in &bad {
        assert!(matches!(b.on_frame(ms(5), f, None), Received::Dropped(_)));
    }
    let c = b.counters();
    assert_eq!(c.rx_other_vlan, 2);
    assert_eq!(c.rx_other_ethertype, 1);
    assert_eq!(c.rx_garbage, 2);
    assert_eq!(c.rx_truncated, 3);
    assert_eq!(c.rx_empty, 1);
    assert!(transmits(&mut b).is_empty());
    // The flow still works.
    assert!(matches!(
        b.on_frame(ms(6), &good, None),
        Received::Deliver { port, .. } if port == pb
    ));
}

#[test]
fn tag_stripped_by_the_kernel_is_taken_from_auxdata() {
    let (mut a, mut b) = pair();
    let pb = allocate(&mut a, &mut b);
    let tagged = data(&mut a, 1, b"sdu");
    // What AF_PACKET hands over when the kernel moved the tag out of band.
    let mut stripped = tagged[..12].to_vec();
    stripped.extend_from_slice(&tagged[16..]);
    assert_eq!(
        b.on_frame(ms(5), &stripped, Some(10)),
        Received::Deliver {
            port: pb,
            sdu: b"sdu"
        }
    );
    assert_eq!(
        b.on_frame(ms(5), &stripped, Some(20)),
        Received::Dropped(DropReason::OtherVlan(Some(20)))
    );
    assert_eq!(u16::from_be_bytes([tagged[12], tagged[13]]), ETH_P_8021Q);
}

#[test]
fn two_vlans_on_one_segment_are_isolated() {
    let mut a10 = shim(MA, Some(10));
    let mut a20 = shim(MA, Some(20));
    let mut b10 = shim(MB, Some(10));
    let mut b20 = shim(MB, Some(20));
    b10.register(name("ten")).unwrap();
    b20.register(name("twenty")).unwrap();
    // A request for a VLAN-20 name on VLAN 10 is never answered.
    a10.allocate(ms(0), 1, name("c"), name("twenty"), QosSpec::default())
        .unwrap();
    carry(ms(0), &mut a10, &mut [&mut b10, &mut b20, &mut a20]);
    assert!(transmits(&mut b10).is_empty() && transmits(&mut b20).is_empty());
    assert_eq!(b20.counters().rx_other_vlan, 1);
    // The VLAN-20 name resolves on VLAN 20.
    a20.allocate(ms(0), 2, name("c"), name("twenty"), QosSpec::default())
        .unwrap();
    carry(ms(0), &mut a20, &mut [&mut b10, &mut b20]);
    carry(ms(0), &mut b20, &mut [&mut a10, &mut a20]);
    assert!(matches!(
        a20.poll_action(),
        Some(Action::Allocated { port: 2, .. })
    ));
    assert!(a10.poll_action().is_none());
}

#[test]
fn untagged_mode_has_the_whole_mtu() {
    let mut a = shim(MA, None);
    let mut b = shim(MB, None);
    b.register(name("srv")).unwrap();
    a.allocate(ms(0), 1, name("cli"), name("srv"), QosSpec::default())
        .unwrap();
    carry(ms(0), &mut a, &mut [&mut b]);
    carry(ms(0), &mut b, &mut [&mut a]);
    assert_eq!(
        a.poll_action(),
        Some(Action::Allocated {
            port: 1,
            max_sdu: 1500
        })
    );
    let f = data(&mut a, 1, &[7; 1500]);
    assert_eq!(f.len(), 14 + 1500);
    assert_eq!(Frame::parse(&f).unwrap().header.vlan, None);
}

#[test]
fn max_sdu_is_enforced_with_a_clear_error() {
    let (mut a, mut b) = pair();
    allocate(&mut a, &mut b);
    let e = a.send_header(1, 1497).unwrap_err();
    assert_eq!(
        e.to_string(),
        "SDU of 1497 bytes is larger than the maximum of 1496 (interface MTU less headers)"
    );
    assert_eq!(a.send_header(1, 0).unwrap_err(), ShimEthError::EmptySdu);
    assert_eq!(a.flow(1).unwrap().counters.drops_out, 2);
    assert!(a.send_header(1, 1496).is_ok());
    let big = QosSpec {
        max_sdu_size: Some(9000),
        ..Default::default()
    };
    assert!(matches!(
        a.allocate(ms(0), 9, name("x"), name("y"), big),
        Err(ShimEthError::QosNotSatisfiable(_))
    ));
    let reliable = QosSpec {
        reliable: true,
        ..Default::default()
    };
    assert!(a
        .allocate(ms(0), 9, name("x"), name("y"), reliable)
        .is_err());
}

#[test]
fn one_application_only_and_requests_without_one_are_dropped() {
    let (mut a, mut b) = pair();
    assert_eq!(
        b.register(name("second")),
        Err(ShimEthError::OneApplicationOnly(Box::new(name("srv"))))
    );
    allocate(&mut a, &mut b);
    let mut c = shim(MC, Some(10));
    // c has nothing registered: data from a new MAC is dropped and counted.
    let f = Frame {
        header: FrameHeader {
            dst: MC,
            src: MA,
            vlan: Some(10),
            ethertype: ETH_P_RINA,
        },
        payload: b"hi",
    }
    .to_vec();
    assert_eq!(
        c.on_frame(ms(0), &f, None),
        Received::Dropped(DropReason::NoApplication)
    );
    assert_eq!(c.counters().rx_no_app, 1);
}

#[test]
fn refused_and_late_requests_hold_off_then_retry() {
    let mut b = shim(MB, Some(10));
    b.register(name("srv")).unwrap();
    let f = |p: &[u8]| {
        Frame {
            header: FrameHeader {
                dst: MB,
                src: MA,
                vlan: Some(10),
                ethertype: ETH_P_RINA,
            },
            payload: p,
        }
        .to_vec()
    };
    assert_eq!(b.on_frame(ms(0), &f(b"1"), None), Received::Consumed);
    let Some(Action::FlowRequest { handle, remote, .. }) = b.poll_action() else {
        panic!()
    };
    // Never heard of by ARP: named after its MAC.
    assert_eq!(remote, name("02-00-00-00-00-0a"));
    // Frames wait while the application decides (bounded).
    for _ in 0..100 {
        let _ = b.on_frame(ms(1), &f(b"2"), None);
    }
    assert_eq!(b.counters().rx_held_full, 100 - 63);
    b.refuse(handle, "no").unwrap();
    assert_eq!(
        b.on_frame(ms(2), &f(b"3"), None),
        Received::Dropped(DropReason::NoApplication)
    );
    b.handle_timeout(ms(1001));
    assert_eq!(b.on_frame(ms(1001), &f(b"4"), None), Received::Consumed);
    assert!(matches!(b.poll_action(), Some(Action::FlowRequest { .. })));
    // Not answered in time: withdrawn.
    b.handle_timeout(ms(1001) + b.config().accept_timeout);
    assert!(matches!(
        b.poll_action(),
        Some(Action::RequestWithdrawn { .. })
    ));
    assert_eq!(b.counters().flow_refused, 2);
}

#[test]
fn concurrent_allocations_share_one_resolution() {
    let (mut a, mut b) = pair();
    a.allocate(ms(0), 1, name("cli"), name("srv"), QosSpec::default())
        .unwrap();
    a.allocate(ms(0), 2, name("cli2"), name("srv"), QosSpec::default())
        .unwrap();
    assert_eq!(transmits(&mut a).len(), 1);
    // Re-send the request through b by hand.
    let mut a2 = shim(MA, Some(10));
    a2.allocate(ms(0), 1, name("cli"), name("srv"), QosSpec::default())
        .unwrap();
    carry(ms(0), &mut a2, &mut [&mut b]);
    carry(ms(0), &mut b, &mut [&mut a]);
    let got: Vec<Action> = std::iter::from_fn(|| a.poll_action()).collect();
    assert_eq!(got.len(), 2);
    assert!(got.contains(&Action::Allocated {
        port: 1,
        max_sdu: 1496
    }));
    assert!(got.iter().any(|x| matches!(
        x,
        Action::AllocateFailed {
            port: 2,
            error: ShimEthError::FlowExists { .. }
        }
    )));
}

#[test]
fn a_double_tagged_frame_is_dropped_not_taken_for_its_inner_vlan() {
    // b serves VLAN 10 with a flow to MA. A frame sent in VLAN 99 with an
    // inner tag 10: the kernel strips the outer tag (reported out of band
    // as 99) and leaves the inner one in the frame.
    let (mut a, mut b) = pair();
    let pb = allocate(&mut a, &mut b);
    let inner10 = data(&mut a, 1, b"hop");
    assert_eq!(
        b.on_frame(ms(5), &inner10, Some(99)),
        Received::Dropped(DropReason::DoubleTagged {
            outer: 99,
            inner: 10
        })
    );
    // Tagged twice with our own VLAN is no frame of ours either.
    assert_eq!(
        b.on_frame(ms(5), &inner10, Some(10)),
        Received::Dropped(DropReason::DoubleTagged {
            outer: 10,
            inner: 10
        })
    );
    assert_eq!(b.counters().rx_other_vlan, 2);
    assert_eq!(
        b.flow(pb).unwrap().counters.sdus_in,
        1,
        "only the first SDU"
    );
    // The tag in the frame alone (the kernel left it), or out of band alone
    // (the kernel stripped it): the flow's frames still arrive.
    assert_eq!(
        b.on_frame(ms(6), &inner10, None),
        Received::Deliver {
            port: pb,
            sdu: b"hop"
        }
    );
    let mut stripped = inner10[..12].to_vec();
    stripped.extend_from_slice(&inner10[16..]);
    assert_eq!(
        b.on_frame(ms(6), &stripped, Some(10)),
        Received::Deliver {
            port: pb,
            sdu: b"hop"
        }
    );
    assert_eq!(b.counters().rx_other_vlan, 2);
}

#[test]
fn a_priority_tag_inside_another_vlan_does_not_reach_an_untagged_shim() {
    let mut b = shim(MB, None);
    b.register(name("srv")).unwrap();
    let prio = Frame {
        header: FrameHeader {
            dst: MB,
            src: MA,
            vlan: Some(0),
            ethertype: ETH_P_RINA,
        },
        payload: b"x",
    }
    .to_vec();
    // In VLAN 99, with an inner priority tag (VID 0): not untagged.
    assert_eq!(
        b.on_frame(ms(1), &prio, Some(99)),
        Received::Dropped(DropReason::DoubleTagged {
            outer: 99,
            inner: 0
        })
    );
    assert_eq!(b.counters().flow_requests_in, 0);
    assert_eq!(b.counters().rx_other_vlan, 1);
    assert!(b.poll_action().is_none());
    // A priority tag alone, in the frame or stripped by the kernel, is no
    // VLAN: the frame is offered as untagged.
    assert_eq!(b.on_frame(ms(2), &prio, None), Received::Consumed);
    assert!(matches!(b.poll_action(), Some(Action::FlowRequest { .. })));
    let mut stripped = prio[..12].to_vec();
    stripped.extend_from_slice(&prio[16..]);
    assert_eq!(b.on_frame(ms(2), &stripped, Some(0)), Received::Consumed);
    assert_eq!(b.counters().flow_requests_in, 1, "held for the request");
    assert_eq!(b.counters().rx_other_vlan, 1);
}

/// An ARP packet in VLAN 10 from `sha` to `dst`.
fn arp_frame(op: ArpOp, sha: MacAddr, spa: &str, tha: MacAddr, tpa: &str, dst: MacAddr) -> Vec<u8> {
    Arp {
        op,
        sha,
        spa: spa.as_bytes(),
        tha,
        tpa: tpa.as_bytes(),
    }
    .to_frame(FrameHeader {
        dst,
        src: sha,
        vlan: Some(10),
        ethertype: 0,
    })
    .unwrap()
}

fn mac(i: u32) -> MacAddr {
    let [_, x, y, z] = i.to_be_bytes();
    MacAddr([2, 9, x, y, z, 1])
}

fn cached(s: &ShimEth) -> Vec<String> {
    s.arp_cache().map(|(n, _)| n.to_string()).collect()
}

#[test]
fn a_reply_nobody_asked_for_teaches_nothing_and_evicts_nothing() {
    let mut cfg = Config::new("10", Some(10), MA, 1500);
    cfg.max_arp_entries = 2;
    let mut a = ShimEth::new(cfg);
    a.register(name("cli")).unwrap();
    let mut b = shim(MB, Some(10));
    b.register(name("srv")).unwrap();
    // a resolved srv and no longer has a flow to it: an entry that a full
    // cache would give up first.
    a.allocate(ms(0), 1, name("cli"), name("srv"), QosSpec::default())
        .unwrap();
    carry(ms(0), &mut a, &mut [&mut b]);
    carry(ms(0), &mut b, &mut [&mut a]);
    assert!(matches!(a.poll_action(), Some(Action::Allocated { .. })));
    a.deallocate(1).unwrap();
    assert_eq!(cached(&a), ["srv"]);
    let arp_in = a.counters().arp_in;
    // Replies to a's MAC for names a never asked for, some naming a's own
    // application as their target.
    for i in 0..100 {
        let tpa = if i % 2 == 0 { "cli" } else { "x" };
        let f = arp_frame(ArpOp::Reply, mac(i), &format!("n{i}"), MA, tpa, MA);
        assert_eq!(a.on_frame(ms(1), &f, None), Received::Consumed);
    }
    assert_eq!(a.counters().arp_in, arp_in + 100);
    assert_eq!(cached(&a), ["srv"]);
    assert_eq!(a.resolved(&name("srv")), Some(MB));
    assert!(a.poll_action().is_none());
    // A reply to a request of a's is learnt, as before.
    a.allocate(ms(2), 2, name("cli"), name("third"), QosSpec::default())
        .unwrap();
    transmits(&mut a);
    let f = arp_frame(ArpOp::Reply, MC, "third", MA, "cli", MA);
    assert_eq!(a.on_frame(ms(3), &f, None), Received::Consumed);
    assert!(matches!(
        a.poll_action(),
        Some(Action::Allocated { port: 2, .. })
    ));
    assert_eq!(cached(&a), ["srv", "third"]);
}

#[test]
fn a_full_cache_gives_up_the_entry_without_a_flow_that_expires_first() {
    let mut cfg = Config::new("10", Some(10), MB, 1500);
    cfg.max_arp_entries = 3;
    let mut b = ShimEth::new(cfg);
    b.register(name("srv")).unwrap();
    let mut a = shim(MA, Some(10));
    // cli (at MA) has a flow to b: learnt first, so it expires first.
    allocate(&mut a, &mut b);
    transmits(&mut b);
    let ask = |b: &mut ShimEth, at: u64, who: u32| {
        let f = arp_frame(
            ArpOp::Request,
            mac(who),
            &format!("c{who}"),
            MacAddr::ZERO,
            "srv",
            MacAddr::BROADCAST,
        );
        assert_eq!(b.on_frame(ms(at), &f, None), Received::Consumed);
    };
    ask(&mut b, 10, 1);
    ask(&mut b, 20, 2);
    assert_eq!(cached(&b), ["c1", "c2", "cli"]);
    // Full: c1 goes, not cli, whose MAC has a flow.
    ask(&mut b, 30, 3);
    assert_eq!(cached(&b), ["c2", "c3", "cli"]);
    // c2 asks again: it now expires after c3, which goes next.
    ask(&mut b, 40, 2);
    ask(&mut b, 50, 4);
    assert_eq!(cached(&b), ["c2", "c4", "cli"]);
    // Once the requests of c1..c4 are withdrawn and their hold is over,
    // cli's entry is the next to expire; refreshed, it gives way to c2's.
    b.handle_timeout(ms(10_000));
    b.handle_timeout(ms(20_000));
    while b.poll_action().is_some() {}
    let ttl = b.config().arp_ttl;
    assert_eq!(b.poll_timeout(), Some(ms(0) + ttl));
    b.handle_timeout(ms(0) + ttl);
    let refresh = transmits(&mut b);
    assert_eq!(refresh.len(), 1);
    assert_eq!(Frame::parse(&refresh[0]).unwrap().header.dst, MA);
    assert_eq!(b.poll_timeout(), Some(ms(40) + ttl));
    assert_eq!(cached(&b), ["c2", "c4", "cli"]);
}
