//! Unit tests of the normal IPCP's flow allocator, QoS cubes and directory,
//! with explicit time and a hand-carried wire: a chain of IPCPs, node `i`
//! (address `i + 1`) joined to node `i + 1` by its port RIGHT and their port
//! LEFT.

use super::*;
use crate::rib::ObjValue;
use crate::rmt::Fifo;
use rina_wire::cdap::{CdapMessage, OpCode};
use rina_wire::fa::{FaMessage, FaResult, CDAP_MGMT_DISCRIMINATOR, FLOW_CLASS};

/// A management payload: one CDAP message on a flow object.
fn flow_cdap(m: CdapMessage) -> Vec<u8> {
    let mut v = vec![CDAP_MGMT_DISCRIMINATOR];
    v.extend_from_slice(&m.encode());
    v
}

const LEFT: N1Port = 1;
const RIGHT: N1Port = 2;

fn name(s: &str) -> AppName {
    s.parse().unwrap()
}
fn ms(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000_000)
}

fn ipcp(addr: u64, n: usize) -> NormalIpcp {
    let mut c = NormalConfig::new("net", addr);
    c.dt.max_pdu_size = 1400;
    c.sdup = SdupConfig {
        ttl: Some(16),
        crc: true,
    };
    let mut p = NormalIpcp::new(c, Box::new(Fifo::new(1000))).unwrap();
    let i = addr as usize - 1;
    if i > 0 {
        p.add_port(LEFT);
    }
    if i + 1 < n {
        p.add_port(RIGHT);
    }
    for j in 0..n {
        if j != i {
            let port = if j > i { RIGHT } else { LEFT };
            p.rmt_mut().table_mut().set(j as u64 + 1, None, vec![port]);
        }
    }
    p
}

/// `n` IPCPs in a chain; every node's directory knows `echo` and `ghost`
/// at the last node, where `echo` is registered.
fn chain(n: usize) -> Vec<NormalIpcp> {
    let mut v: Vec<NormalIpcp> = (0..n).map(|i| ipcp(i as u64 + 1, n)).collect();
    for p in v.iter_mut() {
        p.set_directory(name("echo"), n as u64);
        p.set_directory(name("ghost"), n as u64);
    }
    v[n - 1].register(name("echo")).unwrap();
    v
}

/// Carries frames along the chain until nothing moves; frames for which
/// `drop(k)` is true (k counts frames carried) are lost. Returns the other
/// actions, with the node that produced them.
fn carry_lossy(
    now: Instant,
    net: &mut [NormalIpcp],
    mut drop: impl FnMut(u64) -> bool,
) -> Vec<(usize, Action)> {
    carry_with(now, net, |k, frame| (!drop(k)).then_some(frame))
}

/// [`carry_lossy`] through a link that hands frame `k` over as `link(k,
/// frame)` says (changed, or lost with `None`).
fn carry_with(
    now: Instant,
    net: &mut [NormalIpcp],
    mut link: impl FnMut(u64, Vec<u8>) -> Option<Vec<u8>>,
) -> Vec<(usize, Action)> {
    let mut out = Vec::new();
    let mut k = 0;
    loop {
        let mut moved = false;
        for i in 0..net.len() {
            while let Some(a) = net[i].poll_action() {
                match a {
                    Action::Transmit { port, frame } => {
                        moved = true;
                        k += 1;
                        let Some(frame) = link(k, frame.to_vec()) else {
                            continue;
                        };
                        let (j, in_port) = if port == RIGHT {
                            (i + 1, LEFT)
                        } else {
                            (i - 1, RIGHT)
                        };
                        net[j].on_frame(now, in_port, &frame);
                    }
                    a => out.push((i, a)),
                }
            }
        }
        if !moved {
            return out;
        }
    }
}

fn carry(now: Instant, net: &mut [NormalIpcp]) -> Vec<(usize, Action)> {
    carry_lossy(now, net, |_| false)
}

/// Allocates flow 1 from the first node to `echo` at the last as flow 7.
fn allocate(net: &mut [NormalIpcp], qos: QosSpec) {
    let last = net.len() - 1;
    net[0]
        .allocate(ms(0), 1, name("perf"), name("echo"), qos)
        .unwrap();
    let req = carry(ms(0), net);
    let [(
        node,
        Action::FlowRequest {
            handle,
            local,
            remote,
            qos: q,
        },
    )] = req.as_slice()
    else {
        panic!("expected one flow request, got {req:?}");
    };
    assert_eq!(*node, last);
    assert_eq!(
        (&**local, &**remote, &**q),
        (&name("echo"), &name("perf"), &qos)
    );
    assert_eq!(net[last].accept(ms(1), *handle, 7).unwrap(), 65_536);
    assert_eq!(
        carry(ms(1), net),
        vec![(
            0,
            Action::Allocated {
                flow: 1,
                max_sdu: 65_536
            }
        )]
    );
}

fn deliveries(actions: &[(usize, Action)]) -> Vec<(usize, FlowId, Vec<u8>)> {
    actions
        .iter()
        .filter_map(|(i, a)| match a {
            Action::Deliver { flow, sdu } => Some((*i, *flow, sdu.to_vec())),
            _ => None,
        })
        .collect()
}

#[test]
fn allocate_by_name_over_three_nodes_and_data_both_ways() {
    let mut net = chain(3);
    allocate(&mut net, QosSpec::default());
    assert!(net[1].counters().relayed >= 2, "the middle relays FA PDUs");
    assert_eq!(net[1].flows().count(), 0, "the middle keeps no state");
    let (_, a) = net[0].flows().next().unwrap();
    let (_, b) = net[2].flows().next().unwrap();
    assert_eq!((a.remote_addr, a.remote_cep), (3, b.local_cep));
    assert_eq!((b.remote_addr, b.remote_cep), (1, a.local_cep));
    assert_eq!(a.qos_id, 1, "best effort gets the unreliable cube");
    assert!(a.local_cep != 0 && b.local_cep != 0);

    net[0].write(ms(2), 1, b"hello").unwrap();
    net[2].write(ms(2), 7, b"hey").unwrap();
    let got = deliveries(&carry(ms(2), &mut net));
    assert_eq!(
        got,
        vec![(2, 7, b"hello".to_vec()), (0, 1, b"hey".to_vec())]
    );
    assert!(!net[0].is_allocating(1));
    assert_eq!(net[0].pending_requests() + net[2].pending_requests(), 0);
}

#[test]
fn flow_counters_count_each_sdu_once_whole_or_in_fragments() {
    let mut net = chain(2);
    allocate(&mut net, QosSpec::default());
    // One SDU in one PDU and one cut into four (the DIF's PDUs are 1,400
    // bytes), each counted once on both sides.
    let big = vec![7u8; 5_000];
    net[0].write(ms(2), 1, b"hello").unwrap();
    net[0].write(ms(2), 1, &big).unwrap();
    let got = deliveries(&carry(ms(2), &mut net));
    assert_eq!(got.len(), 2, "both SDUs arrive whole");
    let out = net[0].flow_counters(1).unwrap();
    assert_eq!((out.sdus_out, out.bytes_out), (2, 5_005));
    let inn = net[1].flow_counters(7).unwrap();
    assert_eq!((inn.sdus_in, inn.bytes_in), (2, 5_005));
}

/// The frames `p` transmits carry "first-sdu" before "second-sdu".
fn assert_first_then_second(p: &mut NormalIpcp) {
    let mut order = Vec::new();
    while let Some(a) = p.poll_action() {
        if let Action::Transmit { frame, .. } = a {
            if frame.windows(9).any(|w| w == b"first-sdu") {
                order.push("first");
            } else if frame.windows(10).any(|w| w == b"second-sdu") {
                order.push("second");
            }
        }
    }
    assert_eq!(
        order,
        vec!["first", "second"],
        "frames of one flow leave in the order written"
    );
}

#[test]
fn stopping_a_capture_does_not_reorder_a_flows_frames() {
    let mut net = chain(2);
    allocate(&mut net, QosSpec::default());
    net[0].set_batched_flush(true);
    net[0].set_tap(Some(8));
    net[0].write(ms(2), 1, b"first-sdu").unwrap();
    net[0].set_tap(None);
    net[0].write(ms(2), 1, b"second-sdu").unwrap();
    assert_first_then_second(&mut net[0]);
}

#[test]
fn a_frame_waiting_in_through_is_not_overtaken_by_a_drain() {
    // With a capture running, a frame the FIFO passes straight through
    // waits in `through` until the (batched) flush; a drain of the RMT
    // before that flush (here the port unblocked) must not send a later
    // frame of the same flow ahead of it.
    let mut net = chain(2);
    allocate(&mut net, QosSpec::default());
    net[0].set_batched_flush(true);
    net[0].set_tap(Some(8));
    net[0].write(ms(2), 1, b"first-sdu").unwrap();
    net[0].set_port_blocked(ms(2), RIGHT, true);
    net[0].write(ms(2), 1, b"second-sdu").unwrap();
    net[0].set_port_blocked(ms(2), RIGHT, false);
    assert_first_then_second(&mut net[0]);
}

/// An application that writes more than the window takes and closes its
/// reliable flow at once loses none of it: the flow is deallocated once
/// everything is sent and acknowledged, and the peer then hears of it.
/// (Deallocating at once delivered 10 of 128 SDUs.)
#[test]
fn a_flow_closed_right_after_its_writes_delivers_them_all_first() {
    let mut net = chain(2);
    let reliable = QosSpec {
        reliable: true,
        ..Default::default()
    };
    allocate(&mut net, reliable);
    let mut written = 0u32;
    while net[0].write(ms(2), 1, &written.to_be_bytes()).is_ok() {
        written += 1;
    }
    assert!(written > 100, "{written} SDUs taken");
    net[0].close_when_sent(ms(2), 1).unwrap();
    assert!(net[0].flow_counters(1).is_some(), "kept while sending");
    let mut got = Vec::new();
    let mut closed_far = false;
    for k in 0..100 {
        let now = ms(3 + k * 50);
        for (i, a) in carry(now, &mut net) {
            match a {
                Action::Deliver { flow: 7, sdu } if i == 1 => {
                    got.push(u32::from_be_bytes(sdu.to_vec()[..4].try_into().unwrap()));
                }
                Action::Deallocated { flow: 7 } if i == 1 => closed_far = true,
                _ => {}
            }
        }
        net[0].handle_timeout(now);
        net[1].handle_timeout(now);
    }
    assert_eq!(got, (0..written).collect::<Vec<_>>(), "all, in order");
    assert!(closed_far, "the peer heard of the deallocation");
    assert!(net[0].flow_counters(1).is_none(), "gone here too");
}

/// A flow closed with a deadline ([`NormalIpcp::close_when_sent_by`]: its
/// application closed it earlier) waits for what it has left to send
/// until then only; one whose deadline has passed goes at once.
#[test]
fn a_flow_closed_with_a_deadline_lingers_until_it_and_no_longer() {
    let reliable = QosSpec {
        reliable: true,
        ..Default::default()
    };
    for (deadline, kept_until) in [(ms(300), Some(ms(290))), (ms(2), None)] {
        let mut net = chain(2);
        allocate(&mut net, reliable);
        // Nothing is carried: all of it stays unacknowledged.
        while net[0].write(ms(2), 1, b"unacknowledged").is_ok() {}
        net[0].close_when_sent_by(ms(2), 1, deadline).unwrap();
        if let Some(kept) = kept_until {
            net[0].handle_timeout(kept);
            assert!(
                net[0].flow_counters(1).is_some(),
                "gone before its deadline"
            );
        }
        net[0].handle_timeout(deadline);
        assert!(
            net[0].flow_counters(1).is_none(),
            "kept past its deadline {deadline:?}"
        );
    }
}

#[test]
fn refusal_carries_the_reason() {
    let mut net = chain(2);
    net[0]
        .allocate(ms(0), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    let req = carry(ms(0), &mut net);
    let [(1, Action::FlowRequest { handle, .. })] = req.as_slice() else {
        panic!("{req:?}");
    };
    net[1].refuse(*handle, "go away").unwrap();
    assert_eq!(
        carry(ms(1), &mut net),
        vec![(
            0,
            Action::AllocateFailed {
                flow: 1,
                error: Box::new(NormalError::Refused("go away".into()))
            }
        )]
    );
    assert_eq!(net[1].counters().alloc_refused, 1);
    // The flow allocator's counters reach the map `rinactl` shows too.
    assert_eq!(net[1].counters_map()["alloc_refused"], 1);
    assert_eq!(
        net[1].refuse(*handle, "again"),
        Err(NormalError::UnknownRequest(*handle))
    );
    assert_eq!(net[0].flows().count() + net[1].flows().count(), 0);
    assert!(!net[0].is_allocating(1));
    assert_eq!(net[0].poll_timeout(), None);
}

#[test]
fn unregistered_name_vs_name_not_in_directory() {
    let mut net = chain(2);
    assert_eq!(
        net[0].allocate(ms(0), 1, name("perf"), name("nobody"), QosSpec::default()),
        Err(NormalError::NameNotFound(Box::new(name("nobody"))))
    );
    assert!(!net[0].knows(&name("nobody")));
    assert!(net[0].knows(&name("ghost")));
    assert!(net[1].knows(&name("echo")));
    net[0]
        .allocate(ms(0), 1, name("perf"), name("ghost"), QosSpec::default())
        .unwrap();
    assert_eq!(
        carry(ms(0), &mut net),
        vec![(
            0,
            Action::AllocateFailed {
                flow: 1,
                error: Box::new(NormalError::NotRegistered(Box::new(name("ghost"))))
            }
        )]
    );
}

#[test]
fn qos_cubes_are_chosen_by_spec() {
    let p = ipcp(1, 1);
    let id = |q: QosSpec| p.choose_cube(&q).map(|c| c.id);
    assert_eq!(id(QosSpec::default()), Ok(1));
    assert_eq!(
        id(QosSpec {
            max_sdu_gap: Some(3),
            ..Default::default()
        }),
        Ok(1)
    );
    for q in [
        QosSpec {
            reliable: true,
            ..Default::default()
        },
        QosSpec {
            max_loss_ppm: Some(0),
            ..Default::default()
        },
        QosSpec {
            max_sdu_gap: Some(0),
            ..Default::default()
        },
        QosSpec {
            in_order: true,
            ..Default::default()
        },
    ] {
        assert_eq!(id(q), Ok(2), "{q:?}");
        assert_eq!(p.choose_cube(&q).unwrap().name, "reliable");
    }
    let big = QosSpec {
        max_sdu_size: Some(100_000),
        ..Default::default()
    };
    let Err(NormalError::QosNotSatisfiable(why)) = id(big) else {
        panic!()
    };
    assert!(why.contains("100000") && why.contains("65536"), "{why}");

    // A DIF with only an unreliable cube cannot serve a reliable flow, and
    // says which cubes it has.
    let mut c = NormalConfig::new("thin", 1);
    c.cubes = vec![QosCube::new(5, "be", EfcpConfig::unreliable())];
    let thin = NormalIpcp::new(c, Box::new(Fifo::new(10))).unwrap();
    let Err(NormalError::QosNotSatisfiable(why)) = thin.choose_cube(&QosSpec {
        reliable: true,
        ..Default::default()
    }) else {
        panic!()
    };
    assert!(why.contains("5 (be)"), "{why}");
    // Duplicate ids are refused.
    let mut c = NormalConfig::new("dup", 1);
    c.cubes
        .push(QosCube::new(1, "again", EfcpConfig::unreliable()));
    assert!(matches!(
        NormalIpcp::new(c, Box::new(Fifo::new(10))),
        Err(NormalError::BadCube { id: 1, .. })
    ));
}

#[test]
fn reliable_flow_uses_the_reliable_cube_at_both_ends() {
    let mut net = chain(2);
    let qos = QosSpec {
        reliable: true,
        ..Default::default()
    };
    allocate(&mut net, qos);
    let (_, a) = net[0].flows().next().unwrap();
    let (_, b) = net[1].flows().next().unwrap();
    assert_eq!((a.qos_id, b.qos_id), (2, 2));
    // Lose the first data PDU: the reliable cube retransmits it.
    net[0].write(ms(10), 1, b"one").unwrap();
    assert!(carry_lossy(ms(10), &mut net, |k| k == 1).is_empty());
    let t = net[0].poll_timeout().unwrap();
    net[0].handle_timeout(t);
    let got = deliveries(&carry(t, &mut net));
    assert_eq!(got, vec![(1, 7, b"one".to_vec())]);
    assert!(net[0].flow_stats(1).unwrap().pdus_retransmitted >= 1);
    // The RIB shows the sender's DTCP at work: the resend, the timer that
    // fired it, the ack that came back and the congestion window.
    let key = |v: &str, k: &str| -> u64 {
        let w: Vec<&str> = v.split_whitespace().collect();
        let i = w
            .iter()
            .position(|s| *s == k)
            .unwrap_or_else(|| panic!("{k} in {v}"));
        w[i + 1].parse().unwrap()
    };
    let rib = net[0].rib();
    let ObjValue::Str(v) = &rib.read("/fa/flows/key=1", 0).unwrap()[0].value else {
        panic!("the flow's object is text");
    };
    assert_eq!(key(v, "pdus_sent"), 1, "{v}");
    assert_eq!(key(v, "retransmitted"), 1, "{v}");
    assert_eq!(key(v, "rto_expirations"), 1, "{v}");
    assert!(key(v, "acks_received") >= 1, "{v}");
    assert!(key(v, "cwnd") >= 1, "{v}");
    assert!(key(v, "rto_us") >= 10_000, "{v}");
    // An unreliable flow has no DTCP to show.
    let rib = chain_with_unreliable_flow().rib();
    let ObjValue::Str(v) = &rib.read("/fa/flows/key=1", 0).unwrap()[0].value else {
        panic!("the flow's object is text");
    };
    assert!(!v.contains("DTCP"), "{v}");
}

/// An Ethernet link pads a frame to 46 bytes of payload: with a CRC (the
/// chain's IPCPs append one), the padding stands where the CRC was. The
/// PDU's length tells where it ends: short data PDUs of a reliable flow
/// go through, are acked and none is counted as badly protected.
#[test]
fn frames_padded_by_the_link_keep_their_crc() {
    let mut net = chain(2);
    let qos = QosSpec {
        reliable: true,
        ..Default::default()
    };
    allocate(&mut net, qos);
    let mut padded = 0;
    let mut pad = |_, mut frame: Vec<u8>| {
        if frame.len() < 46 {
            frame.resize(46, 0);
            padded += 1;
        }
        Some(frame)
    };
    let mut got = Vec::new();
    for (i, sdu) in [&b"a"[..], b"bc", b"def"].into_iter().enumerate() {
        let t = ms(10 + i as u64);
        net[0].write(t, 1, sdu).unwrap();
        got.extend(deliveries(&carry_with(t, &mut net, &mut pad)));
    }
    let want: Vec<_> = [&b"a"[..], b"bc", b"def"]
        .iter()
        .map(|s| (1, 7, s.to_vec()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(padded, 3, "the three data PDUs were short");
    assert!(net[0].flow_stats(1).unwrap().acks_received >= 1);
    assert_eq!(net[0].flow_stats(1).unwrap().pdus_retransmitted, 0);
    for p in &net {
        assert_eq!(p.counters().rx_bad_protection, 0);
    }
}

/// The sender of a two-IPCP chain with an unreliable flow (port 1) to 7.
fn chain_with_unreliable_flow() -> NormalIpcp {
    let mut net = chain(2);
    allocate(&mut net, QosSpec::default());
    net.remove(0)
}

#[test]
fn lost_acceptance_is_sent_again_for_the_repeated_request() {
    let mut net = chain(2);
    net[0]
        .allocate(ms(0), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    let req = carry(ms(0), &mut net);
    let [(1, Action::FlowRequest { handle, .. })] = req.as_slice() else {
        panic!("{req:?}");
    };
    // A repetition while the application thinks is ignored.
    assert_eq!(net[0].poll_timeout(), Some(ms(250)));
    net[0].handle_timeout(ms(250));
    assert!(carry(ms(250), &mut net).is_empty(), "no second FlowRequest");
    // The acceptance is lost.
    net[1].accept(ms(300), *handle, 7).unwrap();
    assert!(carry_lossy(ms(300), &mut net, |_| true).is_empty());
    // The next repetition gets it again.
    net[0].handle_timeout(ms(500));
    assert_eq!(
        carry(ms(500), &mut net),
        vec![(
            0,
            Action::Allocated {
                flow: 1,
                max_sdu: 65_536
            }
        )]
    );
    assert_eq!(net[1].flows().count(), 1, "no twin flow");
    assert_eq!(net[1].counters().alloc_requests_in, 3);
    assert_eq!(net[0].counters().alloc_retries, 2);
    assert_eq!(net[0].poll_timeout(), None);
}

#[test]
fn a_dead_peer_times_out_after_exactly_3_s() {
    let mut net = chain(2);
    net[0]
        .allocate(ms(0), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    let mut sent = 0;
    let mut t;
    let failed = loop {
        while let Some(a) = net[0].poll_action() {
            match a {
                Action::Transmit { .. } => sent += 1,
                a => panic!("unexpected {a:?}"),
            }
        }
        t = net[0].poll_timeout().expect("a timer runs");
        net[0].handle_timeout(t);
        let acts: Vec<Action> = std::iter::from_fn(|| net[0].poll_action()).collect();
        sent += acts
            .iter()
            .filter(|a| matches!(a, Action::Transmit { .. }))
            .count();
        if let Some(f) = acts
            .into_iter()
            .find(|a| matches!(a, Action::AllocateFailed { .. }))
        {
            break f;
        }
    };
    assert_eq!(t, ms(3000));
    assert_eq!(
        failed,
        Action::AllocateFailed {
            flow: 1,
            error: Box::new(NormalError::Timeout {
                dst: 2,
                after: Duration::from_secs(3)
            })
        }
    );
    assert_eq!(
        sent, 13,
        "the request, 11 repetitions 250 ms apart, and the cancel"
    );
    assert_eq!(net[0].counters().alloc_timeouts, 1);
    assert_eq!(net[0].poll_timeout(), None);
}

#[test]
fn a_late_acceptance_is_answered_with_a_deallocation() {
    let mut net = chain(2);
    net[0]
        .allocate(ms(0), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    let req = carry(ms(0), &mut net);
    let [(1, Action::FlowRequest { handle, .. })] = req.as_slice() else {
        panic!("{req:?}");
    };
    // The requester gives up (its repetitions are lost on the way).
    for k in 1..=12 {
        net[0].handle_timeout(ms(250 * k));
    }
    let acts = carry_lossy(ms(3000), &mut net, |_| true);
    assert!(matches!(
        acts.as_slice(),
        [(0, Action::AllocateFailed { flow: 1, error })]
            if matches!(**error, NormalError::Timeout { .. })
    ));
    // The application accepts late: the acceptance is undone.
    net[1].accept(ms(4000), *handle, 7).unwrap();
    assert_eq!(
        carry(ms(4000), &mut net),
        vec![(1, Action::Deallocated { flow: 7 })]
    );
    assert_eq!(net[1].flows().count(), 0);
    assert_eq!(net[0].counters().rx_fa_stale, 1);
}

#[test]
fn a_requester_that_gives_up_withdraws_its_request_from_the_application() {
    let mut net = chain(2);
    net[0]
        .allocate(ms(0), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    let req = carry(ms(0), &mut net);
    let [(1, Action::FlowRequest { handle, .. })] = req.as_slice() else {
        panic!("{req:?}");
    };
    // The application does not answer; the requester's patience ends
    // first (alloc_timeout 3 s), and its cancel reaches the responder.
    for k in 1..12 {
        net[0].handle_timeout(ms(250 * k));
        let _ = carry(ms(250 * k), &mut net);
    }
    net[0].handle_timeout(ms(3000));
    let acts = carry(ms(3000), &mut net);
    assert!(
        acts.contains(&(1, Action::RequestWithdrawn { handle: *handle })),
        "the responder withdraws the request: {acts:?}"
    );
    assert!(acts.iter().any(|a| matches!(
        a,
        (0, Action::AllocateFailed { flow: 1, error })
            if matches!(**error, NormalError::Timeout { .. })
    )));
    assert_eq!(net[1].counters().alloc_cancelled, 1);
    assert_eq!(net[1].counters().rx_fa_stale, 0);
    // A late answer finds nothing to accept; no flow is opened.
    assert!(matches!(
        net[1].accept(ms(4000), *handle, 7),
        Err(NormalError::UnknownRequest(_))
    ));
    assert!(carry(ms(4000), &mut net).is_empty());
    assert_eq!(net[1].flows().count(), 0);
    assert_eq!(net[0].counters().rx_fa_stale, 0, "the ack was expected");
}

#[test]
fn deallocation_reaches_the_peer() {
    let mut net = chain(3);
    allocate(&mut net, QosSpec::default());
    net[0].deallocate(ms(5), 1).unwrap();
    assert_eq!(
        carry(ms(5), &mut net),
        vec![(2, Action::Deallocated { flow: 7 })]
    );
    assert_eq!(net[0].flows().count() + net[2].flows().count(), 0);
    assert_eq!(
        net[0].deallocate(ms(6), 1),
        Err(NormalError::UnknownFlow(1))
    );
    // And from the accepting side, the other way.
    allocate(&mut net, QosSpec::default());
    net[2].deallocate(ms(7), 7).unwrap();
    assert_eq!(
        carry(ms(7), &mut net),
        vec![(0, Action::Deallocated { flow: 1 })]
    );
}

/// What node 0 of a two-node chain sends now: (is it management, the frame).
fn sent_by_first(net: &mut [NormalIpcp]) -> Vec<(bool, Vec<u8>)> {
    let mut v = Vec::new();
    while let Some(a) = net[0].poll_action() {
        if let Action::Transmit { frame, .. } = a {
            let mut pdu = frame.clone();
            let _ = net[0].sdup.unprotect_buf(&mut pdu);
            let mgmt = pci::Pdu::parse(&net[0].cfg.dt, &pdu)
                .is_ok_and(|p| p.pci.pdu_type == PduType::Mgmt);
            v.push((mgmt, frame.to_vec()));
        }
    }
    v
}

/// Node 1's actions for `frames`, given in order, other than transmissions.
fn second_takes(net: &mut [NormalIpcp], now: Instant, frames: &[Vec<u8>]) -> Vec<Action> {
    for f in frames {
        net[1].on_frame(now, LEFT, f);
    }
    std::iter::from_fn(|| net[1].poll_action())
        .filter(|a| !matches!(a, Action::Transmit { .. }))
        .collect()
}

#[test]
fn a_deallocation_that_overtakes_its_flows_data_waits_for_it() {
    // The DEALLOC says which data PDU was the last; the flow closes once
    // that has come, its SDUs handed out first.
    let mut net = chain(2);
    allocate(&mut net, QosSpec::default());
    for sdu in [&b"a"[..], b"b", b"c"] {
        net[0].write(ms(2), 1, sdu).unwrap();
    }
    net[0].deallocate(ms(2), 1).unwrap();
    let (mgmt, data): (Vec<_>, Vec<_>) = sent_by_first(&mut net).into_iter().partition(|f| f.0);
    let (mgmt, data): (Vec<Vec<u8>>, Vec<Vec<u8>>) = (
        mgmt.into_iter().map(|f| f.1).collect(),
        data.into_iter().map(|f| f.1).collect(),
    );
    assert_eq!(
        (mgmt.len(), data.len()),
        (1, 3),
        "a DEALLOC and three data PDUs"
    );
    assert_eq!(second_takes(&mut net, ms(3), &mgmt), vec![], "it waits");
    assert_eq!(net[1].flows().count(), 1);
    assert_eq!(
        second_takes(&mut net, ms(4), &data),
        vec![
            Action::Deliver {
                flow: 7,
                sdu: Sdu::from(b"a".to_vec())
            },
            Action::Deliver {
                flow: 7,
                sdu: Sdu::from(b"b".to_vec())
            },
            Action::Deliver {
                flow: 7,
                sdu: Sdu::from(b"c".to_vec())
            },
            Action::Deallocated { flow: 7 },
        ]
    );
    assert_eq!(net[1].flows().count(), 0);

    // The last data PDU is lost: the flow closes after the grace period.
    allocate(&mut net, QosSpec::default());
    net[0].write(ms(10), 1, b"lost").unwrap();
    net[0].deallocate(ms(10), 1).unwrap();
    let mgmt: Vec<Vec<u8>> = sent_by_first(&mut net)
        .into_iter()
        .filter(|f| f.0)
        .map(|f| f.1)
        .collect();
    assert_eq!(second_takes(&mut net, ms(11), &mgmt), vec![]);
    let end = ms(11) + fa::DEALLOC_GRACE;
    assert_eq!(net[1].poll_timeout(), Some(end));
    // The DEALLOC again (its answer was lost): the end stays where it was.
    assert_eq!(second_takes(&mut net, ms(500), &mgmt), vec![]);
    assert_eq!(
        net[1].poll_timeout(),
        Some(end),
        "a repeat does not push it back"
    );
    net[1].handle_timeout(ms(10) + fa::DEALLOC_GRACE);
    assert_eq!(second_takes(&mut net, end, &[]), vec![]);
    net[1].handle_timeout(end);
    assert_eq!(
        second_takes(&mut net, end, &[]),
        vec![Action::Deallocated { flow: 7 }]
    );
}

#[test]
fn an_unanswered_request_is_withdrawn_after_the_accept_timeout() {
    let mut net = chain(2);
    // Let the requester wait longer than the accept timeout.
    net[0].config_mut_for_tests().alloc_timeout = Duration::from_secs(10);
    net[0]
        .allocate(ms(0), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    let req = carry(ms(0), &mut net);
    let [(1, Action::FlowRequest { handle, .. })] = req.as_slice() else {
        panic!("{req:?}");
    };
    let end = net[1].config().accept_timeout;
    assert!(
        end < net[1].config().alloc_timeout,
        "refused before the requester gives up"
    );
    let before = Instant::ZERO + (end - Duration::from_millis(1));
    net[1].handle_timeout(before);
    assert!(carry(before, &mut net).is_empty());
    assert_eq!(net[1].poll_timeout(), Some(Instant::ZERO + end));
    net[1].handle_timeout(Instant::ZERO + end);
    let acts = carry(Instant::ZERO + end, &mut net);
    assert_eq!(
        acts,
        vec![
            (1, Action::RequestWithdrawn { handle: *handle }),
            (
                0,
                Action::AllocateFailed {
                    flow: 1,
                    error: Box::new(NormalError::Refused(
                        "the application did not answer in time".into()
                    ))
                }
            )
        ]
    );
    assert_eq!(
        net[1].accept(Instant::ZERO + end, *handle, 7),
        Err(NormalError::UnknownRequest(*handle))
    );
}

#[test]
fn unregistering_withdraws_pending_requests() {
    let mut net = chain(2);
    net[0]
        .allocate(ms(0), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    let req = carry(ms(0), &mut net);
    let [(1, Action::FlowRequest { handle, .. })] = req.as_slice() else {
        panic!("{req:?}");
    };
    assert_eq!(
        net[1].register(name("echo")),
        Err(NormalError::NameInUse(Box::new(name("echo"))))
    );
    assert!(net[1].unregister(&name("echo")));
    assert!(!net[1].unregister(&name("echo")));
    let acts = carry(ms(1), &mut net);
    assert_eq!(acts.len(), 2, "{acts:?}");
    assert_eq!(acts[0], (1, Action::RequestWithdrawn { handle: *handle }));
    assert!(matches!(
        &acts[1],
        (0, Action::AllocateFailed { error, .. })
            if matches!(&**error, NormalError::Refused(r) if r.contains("unregistered"))
    ));
}

#[test]
fn a_flow_between_two_names_of_one_ipcp_goes_through_the_loopback() {
    let mut p = ipcp(1, 1);
    p.register(name("srv")).unwrap();
    assert!(p.knows(&name("srv")));
    p.allocate(
        ms(0),
        1,
        name("cli"),
        name("srv"),
        QosSpec {
            reliable: true,
            ..Default::default()
        },
    )
    .unwrap();
    let Some(Action::FlowRequest { handle, .. }) = p.poll_action() else {
        panic!()
    };
    assert_eq!(p.accept(ms(0), handle, 2).unwrap(), 65_536);
    assert_eq!(
        p.poll_action(),
        Some(Action::Allocated {
            flow: 1,
            max_sdu: 65_536
        })
    );
    p.write(ms(1), 1, b"ping").unwrap();
    assert_eq!(
        p.poll_action(),
        Some(Action::Deliver {
            flow: 2,
            sdu: b"ping".to_vec().into()
        })
    );
    p.write(ms(1), 2, b"pong").unwrap();
    assert_eq!(
        p.poll_action(),
        Some(Action::Deliver {
            flow: 1,
            sdu: b"pong".to_vec().into()
        })
    );
    // Acks flow through the loopback too; nothing reaches an N-1 port.
    let t = p.poll_timeout().unwrap();
    p.handle_timeout(t);
    while let Some(a) = p.poll_action() {
        assert!(!matches!(a, Action::Transmit { .. }), "{a:?}");
    }
    p.deallocate(ms(100), 1).unwrap();
    assert_eq!(p.poll_action(), Some(Action::Deallocated { flow: 2 }));
    assert_eq!(p.flows().count(), 0);
    assert!(p.counters().loopback > 4);
}

#[test]
fn cep_ids_are_numbered_from_where_the_driver_says() {
    // An IPCP started again with another first CEP-id does not hand its
    // peers the CEP-ids, and flow-object names, of its flows before.
    for (first, want) in [(0, 1), (40_000, 40_001), (65_535, 1), (65_535 + 9, 10)] {
        let mut c = NormalConfig::new("net", 1);
        c.first_cep = first;
        let mut p = NormalIpcp::new(c, Box::new(Fifo::new(10))).unwrap();
        p.register(name("srv")).unwrap();
        p.allocate(ms(0), 1, name("c"), name("srv"), QosSpec::default())
            .unwrap();
        let Some(Action::FlowRequest { handle, .. }) = p.poll_action() else {
            panic!("no request")
        };
        p.accept(ms(0), handle, 2).unwrap();
        let ceps: BTreeSet<CepId> = p.flows().map(|(_, e)| e.local_cep).collect();
        assert_eq!(ceps, BTreeSet::from([want, want + 1]), "first_cep {first}");
    }
}

#[test]
fn flow_ids_and_cep_ids() {
    let mut net = chain(2);
    allocate(&mut net, QosSpec::default());
    assert!(matches!(
        net[0].allocate(ms(1), 1, name("perf"), name("echo"), QosSpec::default()),
        Err(NormalError::InUse { flow: 1, .. })
    ));
    net[0]
        .allocate(ms(1), 2, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    assert!(matches!(
        net[0].allocate(ms(1), 2, name("perf"), name("echo"), QosSpec::default()),
        Err(NormalError::InUse { flow: 2, .. })
    ));
    let req = carry(ms(1), &mut net);
    let [(1, Action::FlowRequest { handle, .. })] = req.as_slice() else {
        panic!("{req:?}");
    };
    assert!(matches!(
        net[1].accept(ms(1), *handle, 7),
        Err(NormalError::InUse { flow: 7, .. })
    ));
    net[1].accept(ms(1), *handle, 8).unwrap();
    carry(ms(1), &mut net);
    let ceps: BTreeSet<CepId> = net[0].flows().map(|(_, e)| e.local_cep).collect();
    assert_eq!(ceps.len(), 2);
    assert!(!ceps.contains(&0));

    // With 1-byte CEP-ids the counter wraps, skipping 0 and those in use.
    let mut c = NormalConfig::new("small", 1);
    c.dt.cep = rina_wire::pci::FieldWidth::W1;
    let mut p = NormalIpcp::new(c, Box::new(Fifo::new(10))).unwrap();
    p.register(name("srv")).unwrap();
    let mut seen = BTreeSet::new();
    for flow in 0..127u32 {
        p.allocate(ms(0), 2 * flow, name("c"), name("srv"), QosSpec::default())
            .unwrap();
        let Some(Action::FlowRequest { handle, .. }) = p.poll_action() else {
            panic!()
        };
        p.accept(ms(0), handle, 2 * flow + 1).unwrap();
        while p.poll_action().is_some() {}
    }
    for (_, e) in p.flows() {
        assert!(e.local_cep != 0 && seen.insert(e.local_cep));
    }
    assert_eq!(seen.len(), 254);
    p.allocate(ms(0), 1000, name("c"), name("srv"), QosSpec::default())
        .unwrap();
    assert!(matches!(
        p.allocate(ms(0), 1001, name("c"), name("srv"), QosSpec::default()),
        Err(NormalError::NoResources(_))
    ));
}

/// The first node of `net` asks for flows 1 to 3 to `echo`: the other
/// actions, by node.
fn three_requests_from_the_first(net: &mut [NormalIpcp]) -> Vec<(usize, Action)> {
    for flow in 1..=3 {
        net[0]
            .allocate(ms(0), flow, name("perf"), name("echo"), QosSpec::default())
            .unwrap();
    }
    carry(ms(0), net)
}

/// Flow requests raised among `acts`.
fn flow_requests(acts: &[(usize, Action)]) -> usize {
    acts.iter()
        .filter(|(_, a)| matches!(a, Action::FlowRequest { .. }))
        .count()
}

#[test]
fn pending_requests_are_bounded() {
    let mut net = chain(2);
    net[1].config_mut_for_tests().max_pending = 2;
    let acts = three_requests_from_the_first(&mut net);
    assert_eq!(flow_requests(&acts), 2);
    assert!(acts.iter().any(|(i, a)| *i == 0
        && matches!(
            a,
            Action::AllocateFailed { flow: 3, error }
                if matches!(**error, NormalError::NoResources(_))
        )));
    assert_eq!(net[1].pending_requests(), 2);
}

/// A member asking for flows faster than the application answers takes
/// at most `max_pending_per_source` of the pending requests: it hears why
/// the others are refused, and another member is still served.
#[test]
fn one_member_cannot_take_every_pending_request() {
    let mut net = chain(3);
    net[2].config_mut_for_tests().max_pending_per_source = 2;
    let acts = three_requests_from_the_first(&mut net);
    assert_eq!(flow_requests(&acts), 2);
    assert!(
        acts.iter().any(|(i, a)| *i == 0
            && matches!(
                a,
                Action::AllocateFailed { flow: 3, error }
                    if matches!(&**error, NormalError::NoResources(why)
                        if why.contains("too many requests from address 1"))
            )),
        "{acts:?}"
    );
    net[1]
        .allocate(ms(1), 9, name("other"), name("echo"), QosSpec::default())
        .unwrap();
    let acts = carry(ms(1), &mut net);
    assert!(
        acts.iter()
            .any(|(i, a)| *i == 2 && matches!(a, Action::FlowRequest { .. })),
        "the other member's request reached the application: {acts:?}"
    );
    assert_eq!(net[2].pending_requests(), 3);
}

/// A MGMT PDU from address `src` to `dst` carrying `payload`, as a frame.
fn mgmt_frame(p: &NormalIpcp, src: u64, dst: u64, payload: &[u8]) -> Vec<u8> {
    let mut pci = Pci::new(PduType::Mgmt);
    pci.src_addr = src;
    pci.dst_addr = dst;
    pci.qos_id = 1;
    let mut pdu = Vec::new();
    pci::encode_data(&p.config().dt, &pci, payload, &mut pdu).unwrap();
    let sdup = Sdup::without_cipher(p.config().sdup);
    let mut frame = Vec::new();
    sdup.protect(&pdu, 16, &mut frame);
    frame
}

#[test]
fn management_pdus_are_routed_by_address() {
    let mut net = chain(3);
    // Not for the flow allocator, for this IPCP: handed to layer management.
    let f = mgmt_frame(&net[1], 1, 2, b"\x01hello");
    net[1].on_frame(ms(0), LEFT, &f);
    assert_eq!(
        net[1].poll_action(),
        Some(Action::Management {
            port: LEFT,
            src: 1,
            payload: b"\x01hello".to_vec()
        })
    );
    // Address 0 is "whoever is at the other end".
    let f = mgmt_frame(&net[1], 1, 0, b"\x02");
    net[1].on_frame(ms(0), LEFT, &f);
    assert!(matches!(
        net[1].poll_action(),
        Some(Action::Management { .. })
    ));
    // For another address: relayed, TTL decremented, as management.
    let f = mgmt_frame(&net[1], 1, 3, b"\x03");
    net[1].on_frame(ms(0), LEFT, &f);
    let Some(Action::Transmit { port: RIGHT, frame }) = net[1].poll_action() else {
        panic!()
    };
    assert_eq!(frame[0], 15, "TTL 16 - 1");
    assert_eq!(net[1].counters().relayed, 1);
    net[2].on_frame(ms(0), LEFT, &frame);
    assert!(matches!(
        net[2].poll_action(),
        Some(Action::Management { src: 1, .. })
    ));
    // send_management_to routes too.
    net[0].send_management_to(ms(0), 3, b"\x04x");
    let acts = carry(ms(0), &mut net);
    assert_eq!(
        acts,
        vec![(
            2,
            Action::Management {
                port: LEFT,
                src: 1,
                payload: b"\x04x".to_vec()
            }
        )]
    );
}

#[test]
fn malformed_fa_payloads_are_counted_and_dropped() {
    let mut net = chain(2);
    for bad in [
        // No value.
        flow_cdap(CdapMessage::create(FLOW_CLASS, "/fa/flows/key=1-1", vec![]).with_invoke_id(1)),
        // A value that is not a flow object.
        flow_cdap(
            CdapMessage::create(FLOW_CLASS, "/fa/flows/key=1-1", vec![0xff, 0xff])
                .with_invoke_id(1),
        ),
        // A request whose name is not the flow object the value names.
        flow_cdap(CdapMessage::delete(FLOW_CLASS, "/fa/flows/key=1-1").with_invoke_id(1)),
    ] {
        let f = mgmt_frame(&net[1], 1, 2, &bad);
        net[1].on_frame(ms(0), LEFT, &f);
    }
    // A request whose claimed source is not the PDU's source.
    let req = FaMessage::Request {
        src_addr: 9,
        src_cep: 1,
        qos_id: 1,
        qos: QosSpec::default(),
        src: name("x"),
        dst: name("echo"),
    };
    let f = mgmt_frame(&net[1], 1, 2, &req.to_vec());
    net[1].on_frame(ms(0), LEFT, &f);
    // A response for nothing.
    let resp = FaMessage::Response {
        dst_addr: 1,
        dst_cep: 77,
        src_cep: 0,
        result: FaResult::Refused,
        max_sdu: 1,
        reason: String::new(),
    };
    let f = mgmt_frame(&net[1], 1, 2, &resp.to_vec());
    net[1].on_frame(ms(0), LEFT, &f);
    assert_eq!(net[1].poll_action(), None);
    assert_eq!(net[1].counters().rx_fa_malformed, 4);
    assert_eq!(net[1].counters().rx_fa_stale, 1);
}

#[test]
fn a_request_no_component_allows_is_refused_over_the_wire_and_the_answer_dropped() {
    let mut net = chain(2);
    // A write of a flow object: flow objects are only created and deleted.
    let write = CdapMessage::write(FLOW_CLASS, "/fa/flows/key=1-1", vec![1u8]).with_invoke_id(5);
    net[0].send_management_to(ms(0), 2, &flow_cdap(write));
    assert!(carry(ms(0), &mut net).is_empty());
    let refused = net[1].rib_daemon().daemon().counters().refused_not_allowed;
    assert_eq!(refused, 1);
    assert_eq!(net[1].counters().rx_fa_malformed, 0, "the FA never saw it");
    // The refusal came back (M_WRITE_R); node 1 asked nothing, so nobody
    // takes it.
    let s = net[0]
        .rib_daemon()
        .session(mgmt_rib::Peer::Remote(2))
        .unwrap();
    assert_eq!(s.counters.rx_unmatched, 1);
    assert_eq!(net[0].rib_daemon().counters().rx_unmatched, 1);
    assert_eq!(net[1].counters_map()["rib_daemon_refused_not_allowed"], 1);
    assert_eq!(net[0].counters_map()["rib_daemon_rx_unmatched"], 1);
    // The sessions are RIB objects.
    let rib = net[0].rib();
    let o = rib
        .get("/difm/cdap/sessions/peer=addr-2")
        .expect("session object");
    assert!(
        o.value.summary().contains("unmatched answers 1"),
        "{:?}",
        o.value
    );
    // A flow allocation still works: its answer is matched in the session.
    allocate(&mut net, QosSpec::default());
    let s = net[0]
        .rib_daemon()
        .session(mgmt_rib::Peer::Remote(2))
        .unwrap();
    assert_eq!((s.counters.rx_responses, s.outstanding()), (1, 0));
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn arbitrary_fa_payloads_never_panic(
            op in 0usize..4,
            body in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let mut net = chain(2);
            let op = [OpCode::Create, OpCode::CreateR, OpCode::Delete, OpCode::DeleteR][op];
            let mut m = CdapMessage::new(op).with_invoke_id(1).with_value(body);
            m.obj_class = Some(FLOW_CLASS.into());
            m.obj_name = Some("/fa/flows/key=1-1".into());
            let payload = flow_cdap(m);
            let f = mgmt_frame(&net[1], 1, 2, &payload);
            net[1].on_frame(ms(0), LEFT, &f);
            net[1].handle_timeout(ms(10_000));
            let _ = carry(ms(10_000), &mut net);
        }
    }
}

#[test]
fn a_tap_keeps_copies_of_the_frames_both_ways_bounded() {
    let mut net = chain(2);
    allocate(&mut net, QosSpec::default());
    net[0].set_tap(Some(3));
    net[0].write(ms(2), 1, b"hello").unwrap();
    net[1].write(ms(2), 7, b"hey").unwrap();
    let got = deliveries(&carry(ms(2), &mut net));
    assert_eq!(got.len(), 2, "the tap changes nothing: {got:?}");
    let out = net[0].poll_tapped().expect("the sent frame");
    assert!(out.outbound && out.port == RIGHT && out.at == ms(2));
    assert!(
        out.frame.windows(5).any(|w| w == b"hello"),
        "{:?}",
        out.frame
    );
    let inb = net[0].poll_tapped().expect("the received frame");
    assert!(!inb.outbound && inb.port == RIGHT);
    assert!(inb.frame.windows(3).any(|w| w == b"hey"), "{:?}", inb.frame);
    assert_eq!(net[0].poll_tapped(), None);
    // Unpolled copies beyond the limit are counted, not kept.
    for _ in 0..5 {
        net[0].write(ms(3), 1, b"x").unwrap();
    }
    carry(ms(3), &mut net);
    let kept = std::iter::from_fn(|| net[0].poll_tapped()).count();
    assert_eq!(kept, 3);
    assert!(net[0].tap_dropped() >= 2);
    net[0].set_tap(None);
    net[0].write(ms(4), 1, b"y").unwrap();
    carry(ms(4), &mut net);
    assert_eq!(net[0].poll_tapped(), None);
}

#[test]
fn a_cube_s_efcp_policies_change_at_run_time_range_checked() {
    let mut net = chain(2);
    let tuning =
        |v: serde_json::Value| -> crate::efcp::EfcpTuning { serde_json::from_value(v).unwrap() };
    // Out of range, or inconsistent: refused, nothing changes.
    let before = net[0].cube(2).unwrap().efcp.clone();
    let e = net[0]
        .set_cube_efcp("reliable", &tuning(serde_json::json!({"window": 0})))
        .unwrap_err();
    assert!(
        e.to_string().contains("`window` must be between 1 and"),
        "{e}"
    );
    let e = net[0]
        .set_cube_efcp(
            "2",
            &tuning(serde_json::json!({"min_rto_ms": 5000, "max_rto_ms": 100})),
        )
        .unwrap_err();
    assert!(e.to_string().contains("RTO"), "{e}");
    let e = net[0]
        .set_cube_efcp("gold", &tuning(serde_json::json!({"window": 8})))
        .unwrap_err();
    assert!(
        e.to_string().starts_with("no QoS cube \"gold\" in DIF"),
        "{e}"
    );
    assert_eq!(net[0].cube(2).unwrap().efcp, before);
    // Keys the cube has no use for: refused, naming them.
    let unreliable = net[0].cube(1).unwrap().efcp.clone();
    let e = net[0]
        .set_cube_efcp(
            "1",
            &tuning(serde_json::json!({"max_retries": 5, "window": 8, "a_timer_ms": 10})),
        )
        .unwrap_err();
    assert!(
        e.to_string().ends_with("has no DTCP (retransmission, flow or congestion control) for window, max_retries to tune"),
        "{e}"
    );
    assert_eq!(net[0].cube(1).unwrap().efcp, unreliable);
    // A good one: flows allocated from now on get it.
    let c = net[0]
        .set_cube_efcp(
            "reliable",
            &tuning(serde_json::json!({"max_retries": 3, "min_rto_ms": 20})),
        )
        .unwrap();
    let rtx = c.efcp.dtcp.as_ref().unwrap().rtx.as_ref().unwrap();
    assert_eq!(
        (rtx.max_retries, rtx.min_rto),
        (3, Duration::from_millis(20))
    );
}

#[test]
fn access_rules_refuse_registration_and_flows_with_their_reason() {
    use crate::normal::access::{AccessRules, FlowRule, NamePattern};
    let pat = |s: &str| NamePattern::new(s).unwrap();
    let rules = AccessRules {
        register: Some(vec![pat("echo"), pat("client*")]),
        allocate: Some(vec![FlowRule {
            from: pat("client*"),
            to: pat("echo"),
        }]),
    };
    let mut net = chain(2);
    net[1].set_access(rules.clone());
    // Registration: refused for a name the rules do not list.
    // Decided here, not by a peer: the message does not say it was.
    match net[1].register(name("rogue")) {
        Err(e @ NormalError::AccessDenied(_)) => {
            let r = e.to_string();
            assert!(r.contains("rogue") && !r.contains("by the peer"), "{r}")
        }
        other => panic!("{other:?}"),
    }
    net[1].register(name("client-b")).unwrap();
    // The requester's member has no rules: the destination refuses, and
    // the reason reaches the requesting application.
    net[0]
        .allocate(ms(0), 1, name("rogue"), name("echo"), QosSpec::default())
        .unwrap();
    let out = carry(ms(0), &mut net);
    let [(0, Action::AllocateFailed { flow: 1, error })] = out.as_slice() else {
        panic!("{out:?}");
    };
    let NormalError::Refused(r) = &**error else {
        panic!("{error:?}");
    };
    assert!(
        r.contains("access rules") && r.contains("rogue") && r.contains("echo"),
        "{r}"
    );
    // An allowed pair reaches the application.
    net[0]
        .allocate(ms(1), 2, name("client-a"), name("echo"), QosSpec::default())
        .unwrap();
    let out = carry(ms(1), &mut net);
    assert!(
        matches!(out.as_slice(), [(1, Action::FlowRequest { .. })]),
        "{out:?}"
    );
    // With the rules at the requester too, a refused pair never leaves it.
    net[0].set_access(rules);
    match net[0].allocate(
        ms(2),
        3,
        name("client-a"),
        name("client-b"),
        QosSpec::default(),
    ) {
        Err(NormalError::AccessDenied(r)) => assert!(r.contains("client-b"), "{r}"),
        other => panic!("{other:?}"),
    }
    assert!(carry(ms(2), &mut net).is_empty());
}

/// The standard configuration has the daemon's largest PDU, and the
/// largest PDU that fits a shim's SDUs makes frames of exactly that size,
/// with or without a CRC.
#[test]
fn standard_config_and_largest_pdu_within_a_shim_sdu() {
    let s = NormalConfig::standard("net", 1);
    assert_eq!(s.dt.max_pdu_size, DEFAULT_MAX_PDU);
    assert_eq!(NormalConfig::new("net", 1).sdup.crc, s.sdup.crc);
    for crc in [false, true] {
        let mut c = NormalConfig::standard("net", 1);
        c.sdup.crc = crc;
        let max = c.max_pdu_within(1500);
        assert!(max < 1500, "{max}");
        c.dt.max_pdu_size = max;
        let p = NormalIpcp::new(c.clone(), Box::new(Fifo::new(10))).unwrap();
        assert_eq!(p.max_frame(), 1500, "crc {crc}");
        // One SDU's PDU: header, delimiter and protection.
        assert!(c.sdu_overhead() > pci::header_len(&c.dt, PduType::Dt));
        assert_eq!(
            c.sdu_overhead() - if crc { crate::sdup::CRC_LEN } else { 0 },
            pci::header_len(&c.dt, PduType::Dt) + 1 + crate::sdup::TTL_LEN
        );
    }
}

#[test]
fn cubes_whose_windows_do_not_fit_the_sequence_number_field_are_refused() {
    // One-byte sequence numbers: the reliable cube's window of 256 and
    // queue of 256 cannot be told apart from numbers a wrap earlier.
    let mut c = NormalConfig::new("narrow", 1);
    c.dt.seq = rina_wire::pci::FieldWidth::W1;
    let e = NormalIpcp::new(c.clone(), Box::new(Fifo::new(10))).unwrap_err();
    assert!(e.to_string().contains("8-bit sequence numbers"), "{e}");
    // Windows that fit: accepted, and a tuning that widens them refused.
    let reliable = &mut c.cubes[1].efcp;
    reliable.max_reorder = 32;
    if let Some(w) = reliable.dtcp.as_mut().and_then(|d| d.window.as_mut()) {
        *w = crate::efcp::WindowFc {
            initial_credit: 16,
            max_closed_queue: 16,
            receiver_buffer: 48,
        };
    }
    let mut p = NormalIpcp::new(c, Box::new(Fifo::new(10))).unwrap();
    let wide: crate::efcp::EfcpTuning =
        serde_json::from_value(serde_json::json!({"window": 200})).unwrap();
    let e = p.set_cube_efcp("reliable", &wide).unwrap_err();
    assert!(e.to_string().contains("at most 127"), "{e}");
}

#[test]
fn frames_written_together_arrive_in_order_and_bad_ones_are_counted_alone() {
    let mut net = chain(2);
    allocate(&mut net, QosSpec::default());
    let room = |b: &[u8]| PduBuf::with_room(buf::HEADROOM, b, buf::TAILROOM);
    // An empty SDU and one over max_sdu are refused; the others go, in
    // the order given.
    let mut frames = vec![
        room(b"one"),
        room(b""),
        room(b"two"),
        room(&vec![7; 65_537]),
        room(b"three"),
    ];
    assert_eq!(net[0].write_bufs(ms(2), 1, &mut frames), 2);
    assert!(frames.is_empty(), "every frame is taken or dropped");
    assert_eq!(
        deliveries(&carry(ms(2), &mut net)),
        vec![
            (1, 7, b"one".to_vec()),
            (1, 7, b"two".to_vec()),
            (1, 7, b"three".to_vec())
        ]
    );
    // On a flow that does not exist, every frame is refused.
    let mut frames = vec![room(b"a"), room(b"b")];
    assert_eq!(net[0].write_bufs(ms(3), 99, &mut frames), 2);
    assert!(frames.is_empty());
}

#[test]
fn a_partial_sdu_on_the_in_order_path_is_discarded_at_its_reassembly_deadline() {
    let mut net = chain(2);
    allocate(&mut net, QosSpec::default());
    // A keepalive longer than the reassembly timeout keeps a timer armed
    // past the partial SDU's deadline.
    let cube = net[1].flows().next().unwrap().1.qos_id;
    net[1]
        .set_cube_keepalive(ms(1), cube, Some(Duration::from_secs(10)))
        .unwrap();
    assert!(net[1].poll_timeout().unwrap() > ms(2) + Duration::from_secs(2));
    // After a first SDU, an SDU cut into four PDUs whose last is lost:
    // the first three wait in the receiver's reassembler.
    net[0].write(ms(2), 1, b"hello").unwrap();
    net[0].write(ms(2), 1, &vec![7u8; 5_000]).unwrap();
    let got = deliveries(&carry_lossy(ms(2), &mut net, |k| k == 5));
    assert_eq!(got.len(), 1);
    let deadline = ms(2) + Duration::from_secs(2);
    let due = net[1].poll_timeout().expect("a timer is armed");
    assert!(due <= deadline, "the reassembly deadline is filed");
    net[1].handle_timeout(deadline);
    assert_eq!(net[1].reassembly_counters(7).unwrap().discarded_timeout, 1);
}

/// `frame` (a protected PDU of a DIF configured as `c`) with its PCI
/// changed by `edit` when `pick` takes its type, protected again.
fn reforged(
    c: &NormalConfig,
    frame: Vec<u8>,
    pick: impl Fn(PduType) -> bool,
    edit: impl Fn(&mut Pci),
) -> Vec<u8> {
    let sdup = Sdup::without_cipher(c.sdup);
    let open = sdup.unprotect(&frame).unwrap();
    let mut pdu = pci::Pdu::parse(&c.dt, &open.pdu).unwrap();
    if !pick(pdu.pci.pdu_type) {
        return frame;
    }
    edit(&mut pdu.pci);
    let mut raw = Vec::new();
    pdu.encode(&c.dt, &mut raw).unwrap();
    let mut out = Vec::new();
    sdup.protect(&raw, open.ttl.unwrap_or(0), &mut out);
    out
}

#[test]
fn pdus_for_a_known_cep_from_another_connection_are_counted_and_dropped() {
    let mut net = chain(2);
    allocate(&mut net, QosSpec::default());
    let a = net[0].flows().next().unwrap().1;
    let cfg = net[0].config().clone();
    // The destination CEP-id is the flow's, the source is not its peer: a
    // late PDU of a closed connection whose CEP-id was reused, or a forged
    // one. None may reach the application.
    let edits: [&dyn Fn(&mut Pci); 3] = [
        &|p| p.src_cep = a.local_cep + 1,
        &|p| p.src_addr = 9,
        &|p| p.qos_id = a.qos_id + 1,
    ];
    let data = |t| t == PduType::Dt;
    for (i, edit) in edits.iter().enumerate() {
        net[0].write(ms(1), 1, b"forged").unwrap();
        let got = carry_with(ms(1), &mut net, |_, f| Some(reforged(&cfg, f, data, edit)));
        assert!(deliveries(&got).is_empty(), "edit {i}: {got:?}");
        assert_eq!(net[1].counters().rx_wrong_connection, i as u64 + 1);
    }
    assert_eq!(net[1].counters().rx_unknown_cep, 0);
    // The flow itself still works.
    net[0].write(ms(2), 1, b"real").unwrap();
    let got = deliveries(&carry(ms(2), &mut net));
    assert_eq!(got, vec![(1, 7, b"real".to_vec())]);
    assert_eq!(net[1].counters_map()["rx_wrong_connection"], 3);
}

#[test]
fn control_pdus_from_another_connection_do_not_move_a_reliable_flow() {
    let mut net = chain(2);
    let reliable = QosSpec {
        reliable: true,
        ..Default::default()
    };
    allocate(&mut net, reliable);
    let a = net[0].flows().next().unwrap().1;
    let cfg = net[0].config().clone();
    // Every control PDU (the acknowledgements) arrives from a CEP-id that
    // is not the peer's: the sender never hears that its SDU arrived.
    let control = |t| t != PduType::Dt && t != PduType::Mgmt;
    net[0].write(ms(1), 1, b"once").unwrap();
    let got = carry_with(ms(1), &mut net, |_, f| {
        Some(reforged(&cfg, f, control, |p| p.src_cep = a.remote_cep + 1))
    });
    assert_eq!(deliveries(&got), vec![(1, 7, b"once".to_vec())]);
    assert!(net[0].counters().rx_wrong_connection >= 1);
    let in_flight = |n: &NormalIpcp| n.flows.get(&1).unwrap().efcp.in_flight();
    assert_eq!(in_flight(&net[0]), 1, "the forged ack was not taken");
    // Its retransmission timer sends the SDU again; the peer's answer, now
    // untouched, is taken.
    for k in 1..40 {
        let now = ms(1 + k * 50);
        net[0].handle_timeout(now);
        net[1].handle_timeout(now);
        carry(now, &mut net);
    }
    assert_eq!(in_flight(&net[0]), 0);
}

/// A peer whose EFCP sends what payloads it likes: `payloads` in turn,
/// as long as its window lets it, for `rounds` rounds 30 ms apart. Returns
/// how many SDUs reached the receiver, which consumes none of them.
fn unconsumed_deliveries(payloads: &[&[u8]], rounds: u64) -> (usize, usize) {
    let mut net = chain(2);
    let reliable = QosSpec {
        reliable: true,
        ..Default::default()
    };
    allocate(&mut net, reliable);
    net[1].set_auto_consume(7, false).unwrap();
    let f = net[1].flows.get(&7).unwrap();
    let buffer = f.efcp.config().window().unwrap().receiver_buffer;
    let mut delivered = 0usize;
    for k in 0..rounds {
        let now = ms(2 + k * 30);
        let f = net[0].flows.get_mut(&1).unwrap();
        while f.efcp.write_capacity() >= payloads.len() {
            for p in payloads {
                f.efcp.write(now, PduBuf::with_headroom(p)).unwrap();
            }
        }
        mark_dirty(&mut net[0].dirty, 1);
        net[0].flush(now);
        for (i, a) in carry(now, &mut net) {
            if i == 1 && matches!(a, Action::Deliver { flow: 7, .. }) {
                delivered += 1;
            }
        }
        net[0].handle_timeout(now);
        net[1].handle_timeout(now);
    }
    (delivered, buffer)
}

/// A complete fragment that cuts a partial SDU short is handed to the
/// application holding its credit, as any SDU does: a peer alternating
/// first and complete fragments had every second PDU delivered with no
/// credit held, so a reader that does not read held without bound (12,736
/// SDUs in 100 rounds against a buffer of 256).
#[test]
fn sdus_that_cut_a_partial_one_short_hold_their_credit() {
    let (whole, buffer) = unconsumed_deliveries(&[&[delimiting::COMPLETE, b'y']], 100);
    assert!(whole <= buffer, "{whole} SDUs held, buffer {buffer}");
    assert!(whole > buffer / 2, "the window filled: {whole}");
    let cut = [
        &[delimiting::FIRST, b'x'][..],
        &[delimiting::COMPLETE, b'y'],
    ];
    let (delivered, _) = unconsumed_deliveries(&cut, 100);
    assert!(
        delivered <= buffer,
        "{delivered} SDUs held, buffer {buffer}"
    );
}
