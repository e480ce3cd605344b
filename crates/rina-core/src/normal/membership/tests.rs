//! The membership machine alone: two [`MembershipMachine`]s talk to each
//! other through their [`MsOut`]s, with no IPCP around them. What the IPCP
//! would do for them (routing's neighbours, taking an address) the test
//! does by hand, so what is tested is the machine behind its narrow
//! interface (a [`Ctx`] in, [`MsOut`]s out) and nothing else.

use super::{Ctx, MembershipConfig, MembershipEvent, MembershipMachine, MsOut};
use crate::normal::{N1Port, NormalConfig};
use crate::rmt::{Address, Fifo, Rmt};
use crate::time::Instant;
use rina_wire::cdap::CdapMessage;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

const PORT: N1Port = 3;

/// One side: its machine and what its IPCP would hold.
struct Side {
    ms: MembershipMachine,
    cfg: NormalConfig,
    neighbors: BTreeMap<N1Port, (Address, u32)>,
    rmt: Rmt,
    /// What the machine asked for and the test has not looked at yet.
    outs: VecDeque<MsOut>,
}

impl Side {
    fn new(name: &str, addr: Address, password: Option<&str>) -> Self {
        let mut m = MembershipConfig::new(name.parse().unwrap());
        m.password = password.map(str::to_string);
        m.entropy = [addr as u8 + 1; 32];
        let mut rmt = Rmt::new(Box::new(Fifo::new(10)));
        rmt.add_port(PORT);
        Side {
            ms: MembershipMachine::new(m, addr != 0),
            cfg: NormalConfig::new("net", addr),
            neighbors: BTreeMap::new(),
            rmt,
            outs: VecDeque::new(),
        }
    }

    /// Calls `f` with the machine and its context; keeps what it asked for.
    fn call(&mut self, f: impl FnOnce(&mut MembershipMachine, &Ctx)) {
        let cx = Ctx {
            cfg: &self.cfg,
            neighbors: &self.neighbors,
            rmt: &self.rmt,
            routing: None,
            dft: None,
        };
        f(&mut self.ms, &cx);
        while let Some(o) = self.ms.poll_out() {
            self.outs.push_back(o);
        }
    }
}

/// Carries the messages between the two (hellos, enrollment, port
/// authentication) until neither sends any, doing what an IPCP would for
/// neighbours coming up and for an address taken. Returns what else was
/// asked for, per side.
fn exchange(sides: &mut [Side; 2], now: Instant) -> [Vec<MsOut>; 2] {
    let mut rest: [Vec<MsOut>; 2] = [Vec::new(), Vec::new()];
    loop {
        let mut moved = false;
        for i in 0..2 {
            while let Some(o) = sides[i].outs.pop_front() {
                let (a, b) = sides.split_at_mut(1);
                let (me, peer) = if i == 0 {
                    (&mut a[0], &mut b[0])
                } else {
                    (&mut b[0], &mut a[0])
                };
                match o {
                    MsOut::Hello { msg, .. } => {
                        moved = true;
                        peer.call(|m, cx| m.on_hello(cx, now, PORT, &msg));
                    }
                    MsOut::Enrollment { bytes, .. } => {
                        moved = true;
                        let msg = CdapMessage::decode(&bytes).unwrap();
                        peer.call(|m, cx| m.on_enroll_cdap(cx, now, PORT, &msg));
                    }
                    MsOut::PortAuth { kind, body, .. } => {
                        moved = true;
                        let obj = super::port_auth_object(kind);
                        let msg = CdapMessage::write(super::PORT_AUTH_CLASS, obj, body);
                        peer.call(|m, cx| m.on_port_auth_cdap(cx, now, PORT, &msg));
                    }
                    MsOut::NeighborUp { port, address } => {
                        me.neighbors.insert(port, (address, 1));
                    }
                    MsOut::NeighborDown { port } => {
                        me.neighbors.remove(&port);
                    }
                    MsOut::Adopt(adoption) => {
                        me.cfg.address = adoption.address;
                        me.neighbors.insert(adoption.port, (adoption.enroller, 1));
                        me.call(|m, cx| m.adopted(cx, now, &adoption, Ok(())));
                    }
                    other => rest[i].push(other),
                }
            }
        }
        if !moved {
            return rest;
        }
    }
}

fn events(rest: &[MsOut]) -> Vec<&MembershipEvent> {
    rest.iter()
        .filter_map(|o| match o {
            MsOut::Report(e) => Some(&**e),
            _ => None,
        })
        .collect()
}

#[test]
fn hellos_make_neighbours_and_silence_takes_them_down() {
    let mut s = [Side::new("a.net", 1, None), Side::new("b.net", 2, None)];
    let t = Instant::ZERO;
    for side in &mut s {
        side.call(|m, cx| m.port_added(cx, t, PORT));
    }
    assert!(
        matches!(s[0].outs.front(), Some(MsOut::Connect { port: PORT, .. })),
        "the session is asked for before the hello: {:?}",
        s[0].outs
    );
    let rest = exchange(&mut s, t);
    assert_eq!(s[0].neighbors.get(&PORT), Some(&(2, 1)));
    assert_eq!(s[1].neighbors.get(&PORT), Some(&(1, 1)));
    assert!(events(&rest[0])
        .iter()
        .any(|e| matches!(e, MembershipEvent::NeighborUp { address: 2, .. })));
    assert_eq!(s[0].ms.counters().hellos_received, 1);

    // A hears nothing more from B: after the dead interval B is down.
    let dead = t + s[0].ms.config().dead_interval;
    s[0].call(|m, cx| {
        assert!(m.poll_timeout().is_some_and(|w| w <= dead));
        m.handle_timeout(cx, dead);
    });
    let outs: Vec<MsOut> = s[0].outs.drain(..).collect();
    assert!(outs
        .iter()
        .any(|o| matches!(o, MsOut::SessionClosed { port: PORT })));
    assert!(outs
        .iter()
        .any(|o| matches!(o, MsOut::NeighborDown { port: PORT })));
    assert_eq!(s[0].ms.counters().neighbor_timeouts, 1);
}

/// Runs the exchanges from `t` until `s[1]` enrolled through `s[0]` (the
/// steps wait on nothing but each other; timers every 100 ms, at most 5
/// s): when it ended, and what each side put out.
fn enroll(s: &mut [Side; 2], t: Instant) -> (Instant, [Vec<MsOut>; 2]) {
    let mut rest = exchange(s, t);
    let mut now = t;
    for _ in 0..50 {
        if s[1].cfg.address != 0 {
            break;
        }
        now = now + Duration::from_millis(100);
        for side in s.iter_mut() {
            side.call(|m, cx| {
                if m.poll_timeout().is_some_and(|w| w <= now) {
                    m.handle_timeout(cx, now);
                }
            });
        }
        let [r0, r1] = exchange(s, now);
        rest[0].extend(r0);
        rest[1].extend(r1);
    }
    (now, rest)
}

#[test]
fn a_newcomer_enrolls_through_a_member_with_the_password_and_both_admit_the_port() {
    let pw = Some("pw");
    let mut s = [Side::new("member.net", 1, pw), Side::new("new.net", 0, pw)];
    let t = Instant::ZERO;
    s[0].call(|m, cx| m.port_added(cx, t, PORT));
    s[1].call(|m, cx| m.port_added(cx, t, PORT));
    let (_, rest) = enroll(&mut s, t);
    let addr = s[1].cfg.address;
    assert!(addr != 0 && addr != 1, "an address of its own: {addr}");
    assert!(
        events(&rest[1])
            .iter()
            .any(|e| matches!(e, MembershipEvent::Enrolled { address, .. } if *address == addr)),
        "{:?}",
        events(&rest[1])
    );
    assert!(events(&rest[0])
        .iter()
        .any(|e| matches!(e, MembershipEvent::Admitted { address, .. } if *address == addr)));
    assert_eq!(s[0].ms.counters().admitted, 1);
    for side in &s {
        assert!(side.ms.is_admitted(side.cfg.address, PORT));
    }
    assert_eq!(
        s[1].ms.enrollment_report().unwrap().via.to_string(),
        "member.net"
    );
}

#[test]
fn a_wrong_password_is_refused_with_the_reason_and_retried_only_after_a_hold() {
    let mut s = [
        Side::new("a.net", 1, Some("pw")),
        Side::new("b.net", 2, Some("guess")),
    ];
    let t = Instant::ZERO;
    for side in &mut s {
        side.call(|m, cx| m.port_added(cx, t, PORT));
    }
    let rest = exchange(&mut s, t);
    for (side, r) in s.iter().zip(&rest) {
        assert!(!side.ms.is_admitted(side.cfg.address, PORT));
        assert!(side.ms.counters().port_auth_failed >= 1);
        assert!(
            events(r).iter().any(|e| matches!(
                e,
                MembershipEvent::Rejected { reason, .. } if reason.contains("wrong password")
            )),
            "{:?}",
            events(r)
        );
    }
    // The next hello round within the hold sends no port authentication.
    let soon = t + Duration::from_secs(1);
    s[0].call(|m, cx| {
        m.handle_timeout(cx, soon);
    });
    assert!(
        !s[0]
            .outs
            .iter()
            .any(|o| matches!(o, MsOut::PortAuth { .. })),
        "held back: {:?}",
        s[0].outs
    );
}

/// Addresses a member learns are in use from routing (every FSO's two
/// ends) are reserved against new enrollees only while routing knows
/// them: FSOs about ever new addresses (a neighbour's, or forged into an
/// unprotected DIF), each round expired and followed by new ones, with an
/// enrollment message now and then, do not grow the reserved set without
/// end.
#[test]
fn addresses_learnt_from_routing_are_reserved_only_while_known() {
    use crate::routing::{Config as RoutingConfig, Fso, LinkState};
    let mut s = Side::new("m1.net", 1, None);
    let rc = RoutingConfig {
        max_fsos: 16,
        max_age: Duration::from_secs(4),
        refresh_interval: Duration::from_secs(2),
        ..RoutingConfig::default()
    };
    let mut ls = LinkState::new(1, rc).unwrap();
    let msg = CdapMessage::read("", "/");
    for round in 0..20u64 {
        let now = Instant::ZERO + Duration::from_secs(round * 5);
        ls.handle_timeout(now);
        let base = 1_000 + round * 100;
        ls.on_fsos(
            now,
            PORT,
            (0..16).map(|k| Fso {
                origin: base + k,
                neighbor: base + 50 + k,
                cost: 1,
                seq: 1,
                up: true,
                age: 0,
            }),
        );
        let cx = Ctx {
            cfg: &s.cfg,
            neighbors: &s.neighbors,
            rmt: &s.rmt,
            routing: Some(&ls),
            dft: None,
        };
        s.ms.on_enroll_cdap(&cx, now, PORT, &msg);
        let in_use = s.ms.members.as_ref().map_or(0, |m| m.in_use().len());
        // Its own address and both ends of every FSO routing holds.
        assert!(
            in_use <= 1 + 2 * 16,
            "round {round}: {in_use} addresses reserved"
        );
    }
}

/// An address given to an enrollee is kept while anything knows it, and
/// released once nothing has (routing, the directory, the neighbours)
/// for routing's max age: members that leave, or newcomers enrolling
/// under ever new names where no password is asked, do not use the
/// address range up for good.
#[test]
fn an_address_given_to_an_enrollee_that_left_is_released_after_max_age() {
    use crate::routing::{Config as RoutingConfig, LinkState};
    let mut s = [
        Side::new("member.net", 1, None),
        Side::new("new.net", 0, None),
    ];
    let t = Instant::ZERO;
    s[0].call(|m, cx| m.port_added(cx, t, PORT));
    s[1].call(|m, cx| m.port_added(cx, t, PORT));
    let (now, _) = enroll(&mut s, t);
    let addr = s[1].cfg.address;
    assert!(addr != 0 && addr != 1, "enrolled: {addr}");
    let held = |s: &Side| {
        s.ms.members
            .as_ref()
            .and_then(|m| m.holder(addr).map(str::to_string))
    };
    assert_eq!(held(&s[0]).as_deref(), Some("new.net"));

    let rc = RoutingConfig {
        max_age: Duration::from_secs(4),
        refresh_interval: Duration::from_secs(2),
        ..RoutingConfig::default()
    };
    let ls = LinkState::new(1, rc).unwrap();
    // The next enrollment's M_START, when addresses are given and checked
    // (each on a port of its own, after its M_CONNECT).
    let connect = CdapMessage::connect(
        rina_wire::cdap::AuthPolicy::new(rina_wire::cdap::AUTH_NONE, Vec::new()),
        &"later.net".parse().unwrap(),
        &"member.net".parse().unwrap(),
    )
    .with_invoke_id(1);
    let start = CdapMessage::start("", crate::enrollment::OBJ_ENROLLMENT).with_invoke_id(2);
    let mut next_port = PORT;
    let mut poke = |s: &mut Side, at: Instant| {
        let cx = Ctx {
            cfg: &s.cfg,
            neighbors: &s.neighbors,
            rmt: &s.rmt,
            routing: Some(&ls),
            dft: None,
        };
        next_port += 1;
        s.ms.on_enroll_cdap(&cx, at, next_port, &connect);
        s.ms.on_enroll_cdap(&cx, at, next_port, &start);
    };
    // While it is a neighbour, however long: kept.
    let t1 = now + Duration::from_secs(60);
    poke(&mut s[0], t1);
    assert_eq!(held(&s[0]).as_deref(), Some("new.net"));
    // It leaves; nothing knows it any more.
    s[0].ms.port_removed(t1, PORT);
    s[0].neighbors.remove(&PORT);
    poke(&mut s[0], t1 + Duration::from_secs(1));
    poke(&mut s[0], t1 + Duration::from_secs(4));
    assert_eq!(held(&s[0]).as_deref(), Some("new.net"), "within max age");
    poke(&mut s[0], t1 + Duration::from_secs(6));
    assert_eq!(held(&s[0]), None, "released after max age");
    assert_eq!(s[0].ms.counters().addresses_released, 1);
    let in_use = s[0].ms.members.as_ref().unwrap().in_use().clone();
    assert!(in_use.contains(&1), "its own address stays: {in_use:?}");
}

/// An enroller whose DIF says SDUs may be larger than any IPCP may be
/// configured for (the bound of every flow's reassembly) is not followed:
/// the newcomer stays out and says why.
#[test]
fn a_dif_whose_largest_sdu_is_out_of_range_is_not_adopted() {
    let mut s = [
        Side::new("member.net", 1, None),
        Side::new("new.net", 0, None),
    ];
    s[0].cfg.max_sdu = usize::MAX;
    let t = Instant::ZERO;
    s[0].call(|m, cx| m.port_added(cx, t, PORT));
    s[1].call(|m, cx| m.port_added(cx, t, PORT));
    let (_, rest) = enroll(&mut s, t);
    assert_eq!(s[1].cfg.address, 0, "not enrolled");
    assert!(
        events(&rest[1]).iter().any(|e| matches!(
            e,
            MembershipEvent::EnrollFailed { error, .. } if error.contains("largest SDU")
        )),
        "{:?}",
        events(&rest[1])
    );
}
