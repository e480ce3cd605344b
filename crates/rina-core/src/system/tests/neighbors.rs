//! Neighbours with a configured address and with an address hellos tell:
//! static routes through them, and liveness across a restarted peer.

use super::*;

/// How the members of a test line know each other.
#[derive(Debug, Clone, Copy)]
struct Kind {
    /// Neighbours' addresses are configured (else hellos tell them).
    static_addresses: bool,
    /// Link-state routing (else static routes to the far members).
    link_state: bool,
}

const STATIC: Kind = Kind {
    static_addresses: true,
    link_state: false,
};
const LEARNT: Kind = Kind {
    static_addresses: false,
    link_state: false,
};
const STATIC_LINK_STATE: Kind = Kind {
    static_addresses: true,
    link_state: true,
};
const LEARNT_LINK_STATE: Kind = Kind {
    static_addresses: false,
    link_state: true,
};

/// System `i` of a line of `n` (normal IPCP `s<i>.net` at address i+1
/// over a shim-udp), its neighbours and routes as `kind` says: without
/// link-state, a static route to each member that is not a neighbour, via
/// the neighbour towards it (as in `examples/line-3`).
fn system(i: usize, n: usize, kind: Kind) -> System {
    let mut s = System::new(format!("s{i}"));
    let mut sc = shim_udp::Config::new("udp");
    let peers = line_peers(i, n);
    for &p in &peers {
        sc.directory.insert(name(&format!("s{p}.net")), udp(p));
    }
    s.add_shim_udp("udp", sc, None).unwrap();
    let addr = |p: usize| p as u64 + 1;
    let mut nc = NormalConfig::new("net", addr(i));
    nc.membership = Some(MembershipConfig::new(name(&format!("s{i}.net"))));
    if kind.link_state {
        nc.routing = Some(crate::routing::Config::default());
    }
    nc.cubes = cubes();
    for p in 0..n {
        nc.directory.insert(name(&format!("app{p}")), addr(p));
    }
    let nbs = peers
        .iter()
        .map(|&p| NeighborSpec {
            name: name(&format!("s{p}.net")),
            over: "udp".into(),
            address: kind.static_addresses.then_some(addr(p)),
        })
        .collect();
    let mut routes = BTreeMap::new();
    if !kind.link_state {
        for dst in (0..n).filter(|d| *d != i && !peers.contains(d)) {
            let hop = if dst < i { i - 1 } else { i + 1 };
            routes.insert(addr(dst), addr(hop));
        }
    }
    s.add_normal(name(&format!("s{i}.net")), nc, &fifo(), nbs, routes)
        .unwrap();
    s
}

fn line(n: usize, kind: Kind) -> Net {
    Net::new((0..n).map(|i| system(i, n, kind)).collect())
}

/// Whether app`from` at system `from` gets a flow to app`to` at system `to`
/// (registered there now if it is not) and three SDUs through it, in at
/// most 1.5 s.
fn carries(net: &mut Net, from: usize, to: usize) -> bool {
    let _ = net.sys[to].register("net", name(&format!("app{to}")));
    let (seen_from, seen_to) = (net.logs[from].events.len(), net.logs[to].events.len());
    let Ok(port) = net.sys[from].allocate(
        net.now,
        Some("net"),
        name(&format!("app{from}")),
        name(&format!("app{to}")),
        QosSpec::default(),
    ) else {
        return false;
    };
    net.run_until(net.now + Duration::from_millis(500));
    let Some(handle) = net.logs[to].events[seen_to..].iter().find_map(|e| match e {
        AppEvent::FlowRequest { handle, .. } => Some(*handle),
        _ => None,
    }) else {
        return false;
    };
    let Ok((theirs, _)) = net.sys[to].accept(net.now, handle) else {
        return false;
    };
    net.run_until(net.now + Duration::from_millis(500));
    let up = net.logs[from].events[seen_from..]
        .iter()
        .any(|e| matches!(e, AppEvent::Allocated { port: p, .. } if *p == port));
    if !up {
        return false;
    }
    for k in 0..3u8 {
        if net.sys[from].write(net.now, port, &[k; 100]).is_err() {
            return false;
        }
    }
    net.run_until(net.now + Duration::from_millis(500));
    let got = net.logs[to]
        .sdus
        .iter()
        .filter(|(_, p, _)| *p == theirs)
        .count();
    got == 3
}

fn normal(net: &Net, i: usize) -> &crate::normal::NormalIpcp {
    net.sys[i].member(1).unwrap().normal().unwrap()
}

fn timeouts(net: &Net, i: usize) -> u64 {
    normal(net, i)
        .membership_counters()
        .unwrap()
        .neighbor_timeouts
}

/// Two members carry a flow; member `dead` is killed for `down`, then
/// started again; `settle` later the other one gets a flow to it again.
fn restart(kind: Kind, dead: usize, down: Duration, settle: Duration) -> Net {
    let mut net = line(2, kind);
    net.run_until(ms(2000));
    assert!(
        carries(&mut net, 0, 1),
        "{kind:?}: no flow before the restart"
    );
    net.down.insert(dead);
    net.run_until(net.now + down);
    net.restart(dead, system(dead, 2, kind));
    net.run_until(net.now + settle);
    assert!(
        carries(&mut net, 1 - dead, dead),
        "{kind:?}: s{dead} restarted after {down:?} is not taken back in {settle:?}: \
         s0 {:?} {:?}, s1 {:?} {:?}",
        normal(&net, 0).membership_counters(),
        normal(&net, 0).neighbors().collect::<Vec<_>>(),
        normal(&net, 1).membership_counters(),
        normal(&net, 1).neighbors().collect::<Vec<_>>(),
    );
    net
}

#[test]
fn a_neighbour_with_a_configured_address_is_timed_out_when_silent() {
    let mut net = line(2, STATIC);
    net.run_until(ms(2000));
    assert_eq!(timeouts(&net, 0), 0);
    net.down.insert(1);
    net.run_until(ms(6500));
    assert_eq!(timeouts(&net, 0), 1, "silent for 4.5 s");
    assert!(net.sys[0].counters().n1_silent >= 1);
    assert_eq!(normal(&net, 0).neighbors().count(), 0, "taken down");
}

#[test]
fn a_restarted_peer_with_a_configured_address_is_taken_back() {
    for kind in [STATIC, STATIC_LINK_STATE] {
        // The peer that accepts the N-1 flow (the greater name) is killed.
        let net = restart(kind, 1, Duration::from_secs(6), Duration::from_secs(6));
        assert!(timeouts(&net, 0) >= 1, "{kind:?}");
        // The one that sets it up, killed for longer or shorter than the
        // dead interval.
        for down in [Duration::from_secs(6), Duration::from_secs(1)] {
            restart(kind, 0, down, Duration::from_secs(6));
        }
    }
}

#[test]
fn a_restarted_peer_with_a_learnt_address_is_taken_back() {
    for kind in [LEARNT, LEARNT_LINK_STATE] {
        for dead in [0, 1] {
            for down in [Duration::from_secs(6), Duration::from_secs(1)] {
                restart(kind, dead, down, Duration::from_secs(6));
            }
        }
    }
}

#[test]
fn a_peer_restarted_at_once_is_taken_back() {
    for kind in [STATIC, LEARNT, STATIC_LINK_STATE, LEARNT_LINK_STATE] {
        for dead in [0, 1] {
            restart(kind, dead, Duration::ZERO, Duration::from_secs(6));
        }
    }
}

#[test]
fn static_routes_go_via_a_neighbour_whose_address_hellos_tell() {
    let mut net = line(3, LEARNT);
    net.run_until(ms(3000));
    // s1's direct neighbours, and s2 from s0 over the route "3" = 2.
    assert!(carries(&mut net, 1, 2), "a direct neighbour");
    assert!(carries(&mut net, 0, 2), "over the static route");
    assert!(carries(&mut net, 2, 0), "over the static route back");
    let table = normal(&net, 0).rmt().table();
    assert!(table.lookup(3, 0, 0).is_some(), "s0 routes to s2");
}

#[test]
fn static_routes_follow_a_learnt_neighbour_down_and_up_again() {
    let mut net = line(3, LEARNT);
    net.run_until(ms(3000));
    assert!(carries(&mut net, 0, 2));
    net.down.insert(1);
    net.run_until(net.now + Duration::from_secs(5));
    let table = normal(&net, 0).rmt().table();
    assert!(table.lookup(3, 0, 0).is_none(), "no route while s1 is down");
    assert!(table.lookup(2, 0, 0).is_none());
    net.restart(1, system(1, 3, LEARNT));
    net.run_until(net.now + Duration::from_secs(6));
    assert!(carries(&mut net, 0, 2), "routes back with s1");
}
