//! The liveness check of shim-udp flows ([`Config::keepalive`]): time runs
//! explicitly, and the wire between the two shims is carried by hand (or
//! not, for a peer that vanished).

use super::*;

/// Which ends of the flow are still there.
#[derive(Clone, Copy, PartialEq)]
enum Up {
    Both,
    /// `b` vanished (its host went down): nothing it would send arrives,
    /// and it never runs again.
    OnlyA,
}

/// Runs both shims from `from` to `to` in 100 ms steps, `a` sending an
/// SDU on port 1 every `a_sends` (if any); returns what each shim did
/// besides transmitting.
fn run(
    a: &mut ShimUdp,
    b: &mut ShimUdp,
    from: u64,
    to: u64,
    up: Up,
    a_sends: Option<u64>,
) -> (Vec<Action>, Vec<Action>) {
    let (mut acts_a, mut acts_b) = (Vec::new(), Vec::new());
    let mut t = from;
    while t <= to {
        let now = ms(t);
        if let Some(every) = a_sends {
            if t.is_multiple_of(every) && a.flow(1).is_some() {
                let (_, hdr) = a.send_header(1, 3).unwrap();
                let mut d = hdr.to_vec();
                d.extend_from_slice(b"abc");
                if up == Up::Both {
                    let _ = b.on_datagram(now, addr(A), &d);
                }
            }
        }
        if a.poll_timeout().is_some_and(|w| w <= now) {
            a.handle_timeout(now);
        }
        if up == Up::Both {
            if b.poll_timeout().is_some_and(|w| w <= now) {
                b.handle_timeout(now);
            }
            acts_a.extend(carry(now, a, A, b));
            acts_b.extend(carry(now, b, B, a));
        } else {
            acts_a.extend(drop_transmits(a));
        }
        t += 100;
    }
    (acts_a, acts_b)
}

#[test]
fn a_flow_whose_peer_vanished_is_deallocated_after_three_silent_checks() {
    let (mut a, mut b) = pair();
    allocate(&mut a, &mut b);
    // The first check (10 s) finds the flow silent, as do the second and
    // the third: it goes at the third, 30 s after the flow began.
    let (acts, _) = run(&mut a, &mut b, 100, 29_900, Up::OnlyA, None);
    assert!(acts.is_empty(), "{acts:?}");
    assert!(a.flow(1).is_some(), "still there before the third check");
    assert_eq!(
        a.counters().keepalives_sent,
        2,
        "one per check that kept it"
    );
    a.handle_timeout(ms(30_000));
    let mut dealloc = 0;
    let mut other = Vec::new();
    while let Some(act) = a.poll_action() {
        match act {
            Action::Transmit { to, payload } => {
                assert_eq!(to, addr(B));
                let d = Datagram::parse(&payload).unwrap();
                assert_eq!(
                    d,
                    Datagram::Dealloc {
                        dst_port: 7,
                        src_port: 1
                    }
                );
                dealloc += 1;
            }
            act => other.push(act),
        }
    }
    assert_eq!(dealloc, 1, "the peer is told, in case it still hears");
    assert_eq!(other, vec![Action::Deallocated { port: 1 }]);
    assert!(a.flow(1).is_none());
    assert_eq!(a.counters().keepalive_expired, 1);
    // Once the DEALLOC's repeats are out, nothing is left to time.
    let (acts, _) = run(&mut a, &mut b, 30_100, 45_000, Up::OnlyA, None);
    assert!(acts.is_empty(), "{acts:?}");
    assert_eq!(a.poll_timeout(), None, "the check stops with the last flow");
}

#[test]
fn an_idle_flow_between_live_peers_stays_for_an_hour_on_keepalives_alone() {
    let (mut a, mut b) = pair();
    allocate(&mut a, &mut b);
    let (acts_a, acts_b) = run(&mut a, &mut b, 100, 3_600_000, Up::Both, None);
    assert!(
        acts_a.is_empty() && acts_b.is_empty(),
        "{acts_a:?} {acts_b:?}"
    );
    assert!(a.flow(1).is_some() && b.flow(7).is_some());
    // Each end probes at every other check (the answer to a probe is heard
    // by the next), and answers the other's: 180 + 180 of 360 checks.
    for s in [&a, &b] {
        let c = s.counters();
        assert_eq!((c.keepalives_sent, c.keepalives_received), (360, 360));
        assert_eq!(c.keepalive_expired, 0);
    }
}

#[test]
fn data_keeps_a_flow_alive_and_its_receiver_probes_nothing() {
    let (mut a, mut b) = pair();
    allocate(&mut a, &mut b);
    // `a` sends one SDU every 5 s; `b` sends nothing but answers.
    let (acts_a, acts_b) = run(&mut a, &mut b, 100, 600_000, Up::Both, Some(5_000));
    assert!(
        acts_a.is_empty() && acts_b.is_empty(),
        "{acts_a:?} {acts_b:?}"
    );
    assert!(a.flow(1).is_some() && b.flow(7).is_some());
    // `b` hears data at every check and never probes; `a`, hearing nothing
    // else, probes at every other check, and `b` answers each.
    assert_eq!(b.counters().keepalives_sent, 30);
    assert_eq!(a.counters().keepalives_sent, 30);
    assert_eq!(b.counters().keepalives_received, 30);
    assert_eq!(b.flow(7).unwrap().counters.sdus_in, 120);
}

#[test]
fn a_keepalive_from_another_address_keeps_nothing_alive() {
    let (mut a, mut b) = pair();
    allocate(&mut a, &mut b);
    let forged = rina_wire::shim_udp::keepalive(true, &[(1, 7)]);
    let mut t = 100;
    while a.flow(1).is_some() {
        assert!(t <= 30_000, "still there at {t} ms");
        // Every second, the right ports from the wrong address.
        if t % 1_000 == 0 {
            let r = a.on_datagram(ms(t), addr("127.0.0.1:6000"), &forged);
            assert_eq!(r, Received::Control);
        }
        if a.poll_timeout().is_some_and(|w| w <= ms(t)) {
            a.handle_timeout(ms(t));
        }
        while let Some(act) = a.poll_action() {
            if let Action::Transmit { to, .. } = act {
                assert_eq!(to, addr(B), "a forged probe is not answered");
            }
        }
        t += 100;
    }
    assert_eq!(t, 30_100, "it went at the third check, as if nothing came");
    assert_eq!(
        a.counters().keepalives_received,
        30,
        "counted, as datagrams"
    );
    assert!(a.counters().rx_unknown_flow >= 29);
}

#[test]
fn with_the_check_off_a_vanished_peer_s_flow_stays_and_nothing_is_timed() {
    let mut ca = Config::new("udp");
    ca.directory.insert(name("echo"), addr(B));
    ca.keepalive = None;
    let mut a = ShimUdp::new(ca);
    let (_, mut b) = pair();
    allocate(&mut a, &mut b);
    assert_eq!(a.poll_timeout(), None);
    let (acts, _) = run(&mut a, &mut b, 100, 120_000, Up::OnlyA, None);
    assert!(acts.is_empty(), "{acts:?}");
    assert!(a.flow(1).is_some());
    assert_eq!(a.counters().keepalives_sent, 0);
}

/// `a` asks `b` for `echo` on port 1, and `b` accepts it as port 7; the
/// answer is still in `b`'s actions.
fn accept_unanswered(a: &mut ShimUdp, b: &mut ShimUdp) {
    a.allocate(ms(0), 1, name("perf"), name("echo"), QosSpec::default())
        .unwrap();
    carry(ms(0), a, A, b);
    let req = drop_transmits(b);
    let [Action::FlowRequest { handle, .. }] = req.as_slice() else {
        panic!("{req:?}");
    };
    b.accept(*handle, 7).unwrap();
}

#[test]
fn an_accepted_flow_whose_requester_never_heard_the_answer_goes() {
    // The requester gave up (its answer was lost, and it timed out): the
    // flow accepted at `b` has no one at the other end.
    let (mut a, mut b) = pair();
    accept_unanswered(&mut a, &mut b);
    drop_transmits(&mut b);
    let mut t = 100;
    while b.flow(7).is_some() {
        assert!(t <= 40_000, "still there at {t} ms");
        if b.poll_timeout().is_some_and(|w| w <= ms(t)) {
            b.handle_timeout(ms(t));
        }
        let acts = drop_transmits(&mut b);
        if b.flow(7).is_none() {
            assert_eq!(acts, vec![Action::Deallocated { port: 7 }]);
        }
        t += 100;
    }
    assert!(
        (20_000..=30_000).contains(&(t - 100)),
        "went at {} ms",
        t - 100
    );
    assert_eq!(b.counters().keepalive_expired, 1);
}

/// `n` flows from `a` (its configuration `ca`, knowing `echo` at `b`) to
/// `echo` at `b`, all allocated at both ends.
fn many_flows(mut ca: Config, n: u32) -> (ShimUdp, ShimUdp) {
    ca.directory.insert(name("echo"), addr(B));
    let mut a = ShimUdp::new(ca);
    let mut cb = Config::new("udp");
    (cb.max_pending, cb.max_pending_per_host) = (n as usize, n as usize);
    let mut b = ShimUdp::new(cb);
    b.register(name("echo")).unwrap();
    for port in 1..=n {
        a.allocate(ms(0), port, name("perf"), name("echo"), QosSpec::default())
            .unwrap();
    }
    carry(ms(0), &mut a, A, &mut b);
    for act in drop_transmits(&mut b) {
        let Action::FlowRequest { handle, .. } = act else {
            panic!("{act:?}");
        };
        b.accept(handle, 100_000 + handle as u32).unwrap();
    }
    carry(ms(1), &mut b, B, &mut a);
    assert_eq!(
        a.flows().filter(|(_, f)| f.peer_port.is_some()).count(),
        n as usize
    );
    (a, b)
}

#[test]
fn one_keepalive_names_all_the_idle_flows_with_a_peer_as_many_as_fit() {
    let n = 20_000;
    let (mut a, mut b) = many_flows(Config::new("udp"), n);
    a.handle_timeout(ms(10_000));
    let mut sizes = Vec::new();
    while let Some(act) = a.poll_action() {
        if let Action::Transmit { to, payload } = act {
            assert_eq!(to, addr(B));
            let _ = b.on_datagram(ms(10_000), addr(A), &payload);
            sizes.push(payload.len());
        }
    }
    // 8,000 + 8,000 + 4,000 pairs, each within a datagram.
    assert_eq!(sizes, [64_002, 64_002, 32_002]);
    assert_eq!(
        b.counters().rx_unknown_flow,
        0,
        "every pair names a flow of b"
    );
    assert!(b.flows.values().all(|f| f.live.heard));
    // `b` answers each probe at once, naming all of them back.
    let mut answered = 0;
    while let Some(act) = b.poll_action() {
        if let Action::Transmit { to, payload } = act {
            assert_eq!(to, addr(A));
            let Ok(Datagram::Keepalive {
                probe: false,
                flows,
            }) = Datagram::parse(&payload)
            else {
                panic!("an answer");
            };
            answered += flows.len();
            let _ = a.on_datagram(ms(10_001), addr(B), &payload);
        }
    }
    assert_eq!(answered, n as usize);
    assert!(a.flows.values().all(|f| f.live.heard));
}

#[test]
fn keepalives_fit_a_datagram_of_the_largest_data() {
    // An operator who set `max_sdu` to keep datagrams within the path's
    // MTU gets KEEPALIVEs that fit too: 1,405-byte DATA, so 175 pairs.
    let mut ca = Config::new("udp");
    ca.max_sdu = 1400;
    let (mut a, _) = many_flows(ca, 200);
    a.handle_timeout(ms(10_000));
    let mut sizes = Vec::new();
    while let Some(act) = a.poll_action() {
        if let Action::Transmit { payload, .. } = act {
            sizes.push(payload.len());
        }
    }
    assert_eq!(sizes, [2 + 175 * 8, 2 + 25 * 8]);
}

/// Two ends whose keepalive is `ka` and `kb`, `a` knowing `echo` at `b`.
fn pair_with(ka: Option<Duration>, kb: Option<Duration>) -> (ShimUdp, ShimUdp) {
    let mut ca = Config::new("udp");
    ca.directory.insert(name("echo"), addr(B));
    ca.keepalive = ka;
    let mut cb = Config::new("udp");
    cb.keepalive = kb;
    let mut b = ShimUdp::new(cb);
    b.register(name("echo")).unwrap();
    (ShimUdp::new(ca), b)
}

#[test]
fn ends_with_different_intervals_keep_an_idle_flow() {
    // `a` checks every minute, `b` every 10 s: `b` probes when it heard
    // nothing, and `a` answers at once, whatever its own interval.
    let (mut a, mut b) = pair_with(Some(Duration::from_secs(60)), Some(Duration::from_secs(10)));
    allocate(&mut a, &mut b);
    let (acts_a, acts_b) = run(&mut a, &mut b, 100, 600_000, Up::Both, None);
    assert!(
        acts_a.is_empty() && acts_b.is_empty(),
        "{acts_a:?} {acts_b:?}"
    );
    assert!(a.flow(1).is_some() && b.flow(7).is_some());
    assert_eq!(
        a.counters().keepalive_expired + b.counters().keepalive_expired,
        0
    );
}

#[test]
fn a_peer_with_the_check_off_still_answers_so_idle_flows_live() {
    let (mut a, mut b) = pair_with(None, Some(Duration::from_secs(10)));
    allocate(&mut a, &mut b);
    assert_eq!(a.poll_timeout(), None, "a times nothing");
    let (acts_a, acts_b) = run(&mut a, &mut b, 100, 600_000, Up::Both, None);
    assert!(
        acts_a.is_empty() && acts_b.is_empty(),
        "{acts_a:?} {acts_b:?}"
    );
    assert!(b.flow(7).is_some(), "b's flow expired though a answers");
    assert_eq!(b.counters().keepalive_expired, 0);
    // Every probe of `b` is answered.
    assert_eq!(a.counters().keepalives_sent, b.counters().keepalives_sent);
    assert!(a.counters().keepalives_sent >= 30);
}

#[test]
fn a_requester_still_asking_keeps_the_accepted_flow_alive() {
    // A check shorter than the allocation's own timeout: while the
    // requester asks again (its answers lost), the accepted flow is alive.
    let (mut a, mut b) = pair_with(
        Some(Duration::from_secs(10)),
        Some(Duration::from_millis(100)),
    );
    accept_unanswered(&mut a, &mut b);
    let mut t = 0;
    while t < 1_900 {
        t += 50;
        for s in [&mut a, &mut b] {
            if s.poll_timeout().is_some_and(|w| w <= ms(t)) {
                s.handle_timeout(ms(t));
            }
        }
        // Every answer of b is lost; a's requests arrive.
        carry(ms(t), &mut a, A, &mut b);
        drop_transmits(&mut b);
        assert!(
            b.flow(7).is_some(),
            "gone at {t} ms while the requester asks"
        );
    }
    assert_eq!(b.counters().keepalive_expired, 0);
}

#[test]
fn a_shorter_interval_set_at_run_time_applies_at_once_and_starts_afresh() {
    let (mut a, mut b) = pair();
    allocate(&mut a, &mut b);
    // The peer vanishes; the check at 10 s finds the flow silent once.
    run(&mut a, &mut b, 100, 19_900, Up::OnlyA, None);
    assert_eq!(a.counters().keepalives_sent, 1);
    a.set_keepalive(ms(20_000), Some(Duration::from_secs(1)));
    assert_eq!(a.poll_timeout(), Some(ms(21_000)), "one new interval on");
    // The silence counted under 10 s does not count: the checks at 21 s
    // and 22 s probe, the one at 23 s ends the flow.
    let (acts, _) = run(&mut a, &mut b, 20_000, 22_900, Up::OnlyA, None);
    assert!(acts.is_empty(), "{acts:?}");
    assert!(a.flow(1).is_some());
    assert_eq!(a.counters().keepalives_sent, 3);
    let (acts, _) = run(&mut a, &mut b, 23_000, 23_000, Up::OnlyA, None);
    assert_eq!(acts, vec![Action::Deallocated { port: 1 }]);
    assert_eq!(a.counters().keepalive_expired, 1);
}

#[test]
fn a_check_turned_off_keeps_a_silent_flow_and_on_again_starts_afresh() {
    let (mut a, mut b) = pair();
    allocate(&mut a, &mut b);
    run(&mut a, &mut b, 100, 29_900, Up::OnlyA, None);
    assert_eq!(a.counters().keepalives_sent, 2, "two silent checks");
    a.set_keepalive(ms(29_950), None);
    assert_eq!(a.poll_timeout(), None, "no timer while the check is off");
    let (acts, _) = run(&mut a, &mut b, 30_000, 100_000, Up::OnlyA, None);
    assert!(acts.is_empty(), "{acts:?}");
    assert!(a.flow(1).is_some(), "kept while off");
    assert_eq!(a.counters().keepalives_sent, 2, "no probe while off");
    // On again: three new silent checks, not one, end it.
    a.set_keepalive(ms(100_000), Some(Duration::from_secs(10)));
    let (acts, _) = run(&mut a, &mut b, 100_100, 129_900, Up::OnlyA, None);
    assert!(acts.is_empty(), "{acts:?}");
    assert!(a.flow(1).is_some());
    let (acts, _) = run(&mut a, &mut b, 130_000, 130_000, Up::OnlyA, None);
    assert_eq!(acts, vec![Action::Deallocated { port: 1 }]);
}

#[test]
fn a_check_set_while_no_flow_is_up_waits_for_one() {
    let (mut a, mut b) = pair();
    a.set_keepalive(ms(0), Some(Duration::from_secs(1)));
    assert_eq!(a.poll_timeout(), None, "nothing to check");
    allocate(&mut a, &mut b);
    // The allocation at 0 started the check: the first one is due at 1 s.
    run(&mut a, &mut b, 100, 3_900, Up::Both, None);
    assert!(a.flow(1).is_some(), "live peers keep the flow");
    assert!(a.counters().keepalives_sent >= 1, "checked every second");
}
