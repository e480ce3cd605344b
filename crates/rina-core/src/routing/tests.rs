//! Unit tests of the link-state machine, with explicit time and a
//! hand-carried network: every message goes through the CDAP object encoding
//! and arrives after a fixed link delay.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

fn ms(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000_000)
}

fn fso(origin: Address, neighbor: Address, seq: u32, up: bool) -> Fso {
    Fso {
        origin,
        neighbor,
        cost: 1,
        seq,
        up,
        age: 0,
    }
}

fn drain(m: &mut LinkState) -> Vec<RoutingAction> {
    std::iter::from_fn(|| m.poll_action()).collect()
}

/// A network of machines. The link between `a` and `b` is port `b` at `a`
/// and port `a` at `b`.
struct Net {
    now: Instant,
    delay: Duration,
    nodes: BTreeMap<Address, LinkState>,
    /// Live links, both directions: (node, port) -> peer node.
    links: BTreeSet<(Address, Address)>,
    /// In flight: (arrival, order) -> (to node, on port, encoded FSOs).
    wire: BTreeMap<(Instant, u64), (Address, PortId, Vec<u8>)>,
    order: u64,
    /// When each node's next hops last changed.
    changed: BTreeMap<Address, Instant>,
    messages: u64,
}

impl Net {
    fn new(addrs: impl IntoIterator<Item = Address>, cfg: &Config, delay: Duration) -> Net {
        Net {
            now: Instant::ZERO,
            delay,
            nodes: addrs
                .into_iter()
                .map(|a| (a, LinkState::new(a, cfg.clone()).unwrap()))
                .collect(),
            links: BTreeSet::new(),
            wire: BTreeMap::new(),
            order: 0,
            changed: BTreeMap::new(),
            messages: 0,
        }
    }

    fn node(&self, a: Address) -> &LinkState {
        &self.nodes[&a]
    }

    fn link(&mut self, a: Address, b: Address, cost: u32) {
        self.links.insert((a, b));
        self.links.insert((b, a));
        let now = self.now;
        let na = self.nodes.get_mut(&a).unwrap();
        na.neighbor_up(now, b as PortId, b, cost).unwrap();
        let nb = self.nodes.get_mut(&b).unwrap();
        nb.neighbor_up(now, a as PortId, a, cost).unwrap();
        self.carry();
    }

    /// The link breaks; only the ends in `noticed` are told.
    fn cut(&mut self, a: Address, b: Address, noticed: &[Address]) {
        self.links.remove(&(a, b));
        self.links.remove(&(b, a));
        let now = self.now;
        for &x in noticed {
            let peer = if x == a { b } else { a };
            self.nodes
                .get_mut(&x)
                .unwrap()
                .neighbor_down(now, peer as PortId)
                .unwrap();
        }
        self.carry();
    }

    /// Moves the queued actions of every node onto the wire.
    fn carry(&mut self) {
        let now = self.now;
        for (&a, m) in self.nodes.iter_mut() {
            while let Some(act) = m.poll_action() {
                let (ports, fsos) = match act {
                    RoutingAction::Flood { to_ports, fsos } => (to_ports, fsos),
                    RoutingAction::Send { port, fsos } => (vec![port], fsos),
                    RoutingAction::TableChanged => {
                        self.changed.insert(a, now);
                        continue;
                    }
                    RoutingAction::NeighborRestarted { .. } => continue,
                };
                let bytes = encode_fsos(&fsos);
                for p in ports {
                    let b = Address::from(p);
                    if self.links.contains(&(a, b)) {
                        self.order += 1;
                        self.messages += 1;
                        self.wire.insert(
                            (now + self.delay, self.order),
                            (b, a as PortId, bytes.clone()),
                        );
                    }
                }
            }
        }
    }

    fn next_event(&self) -> Option<Instant> {
        let w = self.wire.keys().next().map(|k| k.0);
        let t = self.nodes.values().filter_map(|m| m.poll_timeout()).min();
        [w, t].into_iter().flatten().min()
    }

    /// Runs every event up to and including `until`.
    fn run_until(&mut self, until: Instant) {
        while let Some(t) = self.next_event().filter(|t| *t <= until) {
            self.now = self.now.max(t);
            let now = self.now;
            while let Some(e) = self.wire.first_entry() {
                if e.key().0 > now {
                    break;
                }
                let (to, port, bytes) = e.remove();
                // A message on a link that broke meanwhile is lost.
                if self.links.contains(&(to, Address::from(port))) {
                    let fsos = decode_fsos(&bytes).unwrap();
                    self.nodes.get_mut(&to).unwrap().on_fsos(now, port, fsos);
                }
            }
            for m in self.nodes.values_mut() {
                if m.poll_timeout().is_some_and(|t| t <= now) {
                    m.handle_timeout(now);
                }
            }
            self.carry();
        }
        self.now = self.now.max(until);
    }

    /// Runs until nothing is in flight and no flood or computation is due
    /// (only refresh and expiry timers, seconds away, remain). Returns the
    /// time it went quiet.
    fn run_until_quiet(&mut self) -> Instant {
        loop {
            let busy = !self.wire.is_empty()
                || self
                    .nodes
                    .values()
                    .any(|m| m.db.flood_scheduled() || m.is_dirty());
            if !busy {
                return self.now;
            }
            let t = self.next_event().unwrap();
            self.run_until(t);
            assert!(self.now < ms(10_000), "no quiet within 10 s");
        }
    }

    /// The last time any next hops changed.
    fn converged_at(&self) -> Instant {
        self.changed
            .values()
            .copied()
            .max()
            .unwrap_or(Instant::ZERO)
    }
}

fn line(n: u64, cfg: &Config, delay: Duration) -> Net {
    let mut net = Net::new(1..=n, cfg, delay);
    for a in 1..n {
        net.link(a, a + 1, 1);
    }
    net
}

#[test]
fn config_is_checked() {
    let mut c = Config::default();
    assert_eq!(c.validate(), Ok(()));
    c.refresh_interval = c.max_age;
    assert!(matches!(
        LinkState::new(1, c.clone()),
        Err(RoutingError::InvalidConfig(_))
    ));
    c = Config {
        max_fsos_per_message: 0,
        ..Config::default()
    };
    assert!(c.validate().is_err());
}

#[test]
fn neighbor_errors() {
    let mut m = LinkState::new(1, Config::default()).unwrap();
    assert_eq!(
        m.neighbor_up(ms(0), 5, 1, 1),
        Err(RoutingError::SelfNeighbor(1))
    );
    m.neighbor_up(ms(0), 5, 2, 1).unwrap();
    assert_eq!(
        m.neighbor_up(ms(0), 5, 3, 1),
        Err(RoutingError::PortInUse {
            port: 5,
            address: 2
        })
    );
    assert_eq!(m.neighbor_down(ms(0), 6), Err(RoutingError::UnknownPort(6)));
}

#[test]
fn wire_round_trip_and_errors() {
    let f = Fso {
        origin: 7,
        neighbor: 9,
        cost: 3,
        seq: 11,
        up: true,
        age: 4,
    };
    let w = fso_to_wire(&f);
    assert_eq!(w.name, "7");
    assert_eq!(w.neighbor_addresses, vec![9]);
    assert_eq!(fso_from_wire(&w), Ok(f));
    assert_eq!(decode_fsos(&encode_fsos(&[f, f])), Ok(vec![f, f]));
    let mut bad = w.clone();
    bad.addresses.clear();
    assert_eq!(fso_from_wire(&bad), Err(RoutingError::NoOriginAddress));
    bad = w;
    bad.neighbor_addresses.clear();
    assert_eq!(fso_from_wire(&bad), Err(RoutingError::NoNeighborAddress));
    assert!(matches!(
        decode_fsos(&[0xff]),
        Err(RoutingError::Malformed(_))
    ));
}

#[test]
fn line_converges_c_via_b() {
    let cfg = Config::default();
    let mut net = line(3, &cfg, Duration::from_millis(10));
    let quiet = net.run_until_quiet();
    let a = net.node(1);
    assert_eq!(a.next_hops(), &BTreeMap::from([(2, vec![2]), (3, vec![2])]));
    assert_eq!(a.routes()[&3].cost, 2);
    assert_eq!(
        net.node(3).next_hops(),
        &BTreeMap::from([(1, vec![2]), (2, vec![2])])
    );
    let mut t = ForwardingTable::default();
    t.set(99, None, vec![42]);
    a.fill(&mut t);
    assert_eq!(t.len(), 2);
    assert_eq!(t.lookup(3, 0, 17), Some(2));
    assert_eq!(t.lookup(99, 0, 0), None);
    // One hop for B's FSOs to reach A (10 ms), plus the flood rate limit.
    eprintln!(
        "line of 3, 10 ms links: converged at {:?}, quiet at {:?}, {} messages",
        net.converged_at() - Instant::ZERO,
        quiet - Instant::ZERO,
        net.messages
    );
    assert!(net.converged_at() <= ms(250));
    // Every node holds the 4 FSOs of the 2 links.
    assert!(net.nodes.values().all(|m| m.db_len() == 4));
}

#[test]
fn line_of_twenty_converges_in_bounded_time() {
    let cfg = Config::default();
    let d = Duration::from_millis(10);
    let mut net = line(20, &cfg, d);
    net.run_until_quiet();
    for (&a, m) in &net.nodes {
        assert_eq!(m.next_hops().len(), 19, "node {a}");
    }
    // The farthest FSO crosses 18 hops; each costs the link delay plus at
    // most one flood period.
    let bound = ms(0) + (d + cfg.propagation_delay) * 19 + cfg.pduft_interval;
    eprintln!(
        "line of 20, 10 ms links: converged at {:?} (bound {:?}), {} messages",
        net.converged_at() - Instant::ZERO,
        bound - Instant::ZERO,
        net.messages
    );
    assert!(net.converged_at() <= bound);
}

#[test]
fn square_with_broken_link_reroutes() {
    // 1 - 2
    // |   |
    // 3 - 4     cost 1 everywhere but 1-3 (cost 5): 1 reaches 4 via 2.
    let cfg = Config::default();
    let mut net = Net::new(1..=4, &cfg, Duration::from_millis(10));
    net.link(1, 2, 1);
    net.link(2, 4, 1);
    net.link(1, 3, 5);
    net.link(3, 4, 1);
    net.run_until_quiet();
    assert_eq!(net.node(1).next_hops()[&4], vec![2]);
    assert_eq!(net.node(1).routes()[&4].cost, 2);

    let t0 = net.now + Duration::from_secs(1);
    net.run_until(t0);
    net.cut(2, 4, &[2, 4]);
    net.run_until_quiet();
    assert_eq!(net.node(1).next_hops()[&4], vec![3]);
    assert_eq!(net.node(1).routes()[&4].cost, 6);
    assert_eq!(net.node(2).next_hops()[&4], vec![1]);
    let took = net.changed[&1] - t0;
    eprintln!("square, link cut: node 1 rerouted after {took:?}");
    assert!(took <= Duration::from_millis(250));
}

#[test]
fn ecmp_in_a_square_gives_two_ports() {
    let cfg = Config {
        ecmp: true,
        ..Config::default()
    };
    let mut net = Net::new(1..=4, &cfg, Duration::from_millis(5));
    net.link(1, 2, 1);
    net.link(1, 3, 1);
    net.link(2, 4, 1);
    net.link(3, 4, 1);
    net.run_until_quiet();
    assert_eq!(net.node(1).next_hops()[&4], vec![2, 3]);
    assert_eq!(net.node(1).next_hops()[&2], vec![2]);
    assert_eq!(net.node(4).next_hops()[&1], vec![2, 3]);
    let mut t = ForwardingTable::default();
    net.node(1).fill(&mut t);
    assert_eq!(t.lookup(4, 0, 0), Some(2));
    assert_eq!(t.lookup(4, 0, 1), Some(3));

    // Without ECMP the lower neighbour address wins.
    let mut net = Net::new(1..=4, &Config::default(), Duration::from_millis(5));
    net.link(1, 3, 1);
    net.link(1, 2, 1);
    net.link(3, 4, 1);
    net.link(2, 4, 1);
    net.run_until_quiet();
    assert_eq!(net.node(1).next_hops()[&4], vec![2]);
}

#[test]
fn two_ports_to_one_neighbour() {
    let cfg = Config {
        ecmp: true,
        ..Config::default()
    };
    let mut m = LinkState::new(1, cfg).unwrap();
    m.neighbor_up(ms(0), 10, 2, 1).unwrap();
    m.neighbor_up(ms(0), 11, 2, 1).unwrap();
    m.neighbor_up(ms(0), 12, 2, 4).unwrap();
    // Only one own FSO, with the lowest cost.
    assert_eq!(m.fso(ms(0), 1, 2).map(|f| (f.cost, f.seq)), Some((1, 1)));
    m.on_fsos(ms(0), 10, [fso(2, 1, 1, true)]);
    m.handle_timeout(ms(0));
    assert_eq!(m.next_hops()[&2], vec![10, 11]);
    // Floods go on one port per neighbour.
    let floods: Vec<_> = drain(&mut m)
        .into_iter()
        .filter(|a| matches!(a, RoutingAction::Flood { .. }))
        .collect();
    assert_eq!(
        floods,
        vec![RoutingAction::Flood {
            to_ports: vec![10],
            fsos: vec![fso(1, 2, 1, true)]
        }]
    );
    // Losing one cheap port keeps the link up without a new FSO.
    m.neighbor_down(ms(200), 10).unwrap();
    assert_eq!(m.fso(ms(200), 1, 2).map(|f| f.seq), Some(1));
    m.handle_timeout(ms(200));
    assert_eq!(m.next_hops()[&2], vec![11]);
    // Losing the other raises the cost.
    m.neighbor_down(ms(400), 11).unwrap();
    assert_eq!(m.fso(ms(400), 1, 2).map(|f| (f.cost, f.seq)), Some((4, 2)));
    m.handle_timeout(ms(400));
    assert_eq!(m.next_hops()[&2], vec![12]);
}

#[test]
fn middle_link_down_removes_unreachable_destinations() {
    // 1 - 2 - 3 - 4 - 5; the 3-4 link breaks and both ends notice.
    let cfg = Config::default();
    let d = Duration::from_millis(10);
    let mut net = line(5, &cfg, d);
    net.run_until_quiet();
    assert_eq!(net.node(1).next_hops().len(), 4);
    let t0 = ms(5_000);
    net.run_until(t0);
    net.cut(3, 4, &[3, 4]);
    net.run_until_quiet();
    assert_eq!(
        net.node(1).next_hops().keys().copied().collect::<Vec<_>>(),
        vec![2, 3]
    );
    assert_eq!(
        net.node(5).next_hops().keys().copied().collect::<Vec<_>>(),
        vec![4]
    );
    // News travels at most 2 hops (3 -> 1) plus one computation.
    let bound = (d + cfg.propagation_delay) * 2 + cfg.pduft_interval;
    let took = net.converged_at() - t0;
    eprintln!("line of 5, middle link cut, both ends notice: tables updated after {took:?} (bound {bound:?})");
    assert!(took <= bound);
}

#[test]
fn one_sided_failure_is_enough() {
    // Node 4 dies silently: only 3 notices. The bidirectional check drops
    // the link at once; 4's own FSOs linger until they reach max age.
    let cfg = Config::default();
    let d = Duration::from_millis(10);
    let mut net = line(4, &cfg, d);
    net.run_until_quiet();
    let t0 = ms(1_000);
    net.run_until(t0);
    net.cut(3, 4, &[3]);
    net.nodes.remove(&4);
    net.run_until_quiet();
    let took = net.converged_at() - t0;
    assert_eq!(
        net.node(1).next_hops().keys().copied().collect::<Vec<_>>(),
        vec![2, 3]
    );
    assert!(took <= (d + cfg.propagation_delay) * 2 + cfg.pduft_interval);
    eprintln!("line of 4, end node dies, one side notices: tables updated after {took:?}");
    // 4's FSO about 3 is still up in 1's database...
    assert!(net.node(1).fso(net.now, 4, 3).is_some_and(|f| f.up));
    // ...until it ages out (it was last refreshed at t = 0; refreshes every
    // 20 s, so by t0 + 60 s at the latest).
    net.run_until(t0 + cfg.max_age + Duration::from_secs(1));
    assert_eq!(net.node(1).fso(net.now, 4, 3), None);
    assert!(net.node(1).counters().expired >= 1);
    // 3's down FSO about 4 aged out too; the live ones are refreshed.
    assert_eq!(net.node(1).fso(net.now, 3, 4), None);
    assert_eq!(net.node(1).db_len(), 4);
    assert_eq!(net.node(1).next_hops().len(), 2);
}

#[test]
fn partition_ages_out() {
    // 1 - 2 - 3, both ends of 2-3 notice; 1 keeps 3's FSOs until max age
    // although nothing else happens, then forgets them.
    let cfg = Config {
        max_age: Duration::from_secs(10),
        refresh_interval: Duration::from_secs(3),
        ..Config::default()
    };
    let mut net = line(3, &cfg, Duration::from_millis(10));
    net.run_until_quiet();
    net.cut(2, 3, &[2, 3]);
    net.run_until_quiet();
    assert!(net.node(1).fso(net.now, 3, 2).is_some());
    net.run_until(ms(11_500));
    let a = net.node(1);
    assert_eq!(a.fso(net.now, 3, 2), None);
    assert_eq!(a.fso(net.now, 2, 3), None);
    assert_eq!(a.db_len(), 2);
    // Refreshes kept the live link alive for longer than max age.
    assert!(a.fso(net.now, 1, 2).is_some_and(|f| f.up && f.seq >= 4));
    assert!(a.counters().refreshed >= 3);
}

#[test]
fn stale_and_duplicate_fsos_are_ignored_and_counted() {
    let mut m = LinkState::new(1, Config::default()).unwrap();
    m.neighbor_up(ms(0), 2, 2, 1).unwrap();
    m.neighbor_up(ms(0), 3, 3, 1).unwrap();
    m.handle_timeout(ms(0));
    drain(&mut m);
    let flood_time = ms(500);
    m.on_fsos(flood_time, 2, [fso(5, 6, 7, true)]);
    m.on_fsos(flood_time, 3, [fso(5, 6, 7, true)]); // duplicate
    m.on_fsos(flood_time, 3, [fso(5, 6, 6, false)]); // stale
    m.on_fsos(flood_time, 3, [fso(5, 5, 9, true)]); // invalid
    m.on_fsos(
        flood_time,
        3,
        [Fso {
            age: 60,
            ..fso(8, 9, 1, true)
        }],
    ); // too old
    m.on_fsos(flood_time, 3, [fso(1, 2, 1, true)]); // our own, same seq
    let c = *m.counters();
    assert_eq!(
        (
            c.rx_fsos,
            c.rx_accepted,
            c.rx_duplicate,
            c.rx_stale,
            c.rx_invalid,
            c.rx_too_old
        ),
        (6, 1, 2, 1, 1, 1)
    );
    assert_eq!(m.fso(flood_time, 5, 6), Some(fso(5, 6, 7, true)));
    // The accepted one is flooded once, not back to 2.
    m.handle_timeout(flood_time);
    assert_eq!(
        drain(&mut m),
        vec![RoutingAction::Flood {
            to_ports: vec![3],
            fsos: vec![fso(5, 6, 7, true)]
        }]
    );
    // A newer one replaces it and ages from its received age.
    m.on_fsos(
        ms(600),
        3,
        [Fso {
            age: 2,
            ..fso(5, 6, 8, false)
        }],
    );
    assert_eq!(
        m.fso(ms(3_600), 5, 6).map(|f| (f.seq, f.up, f.age)),
        Some((8, false, 5))
    );
}

#[test]
fn db_sync_on_neighbour_up() {
    let mut m = LinkState::new(1, Config::default()).unwrap();
    m.neighbor_up(ms(0), 2, 2, 1).unwrap();
    m.on_fsos(
        ms(0),
        2,
        [fso(2, 1, 1, true), fso(2, 3, 1, true), fso(3, 2, 1, true)],
    );
    m.handle_timeout(ms(0));
    drain(&mut m);
    // Port 9 comes up: it gets the whole database at once, except our new
    // FSO about it, which the next flood brings to everyone.
    m.neighbor_up(ms(2_000), 9, 9, 1).unwrap();
    let sync = drain(&mut m);
    let want: Vec<Fso> = [
        fso(1, 2, 1, true),
        fso(2, 1, 1, true),
        fso(2, 3, 1, true),
        fso(3, 2, 1, true),
    ]
    .into_iter()
    .map(|f| Fso { age: 2, ..f })
    .collect();
    assert_eq!(
        sync,
        vec![RoutingAction::Send {
            port: 9,
            fsos: want
        }]
    );
    assert_eq!(m.counters().db_syncs, 2);
    m.handle_timeout(ms(2_000));
    assert_eq!(
        drain(&mut m),
        vec![RoutingAction::Flood {
            to_ports: vec![2, 9],
            fsos: vec![fso(1, 9, 1, true)]
        }]
    );
}

#[test]
fn db_sync_is_chunked() {
    let cfg = Config {
        max_fsos_per_message: 4,
        ..Config::default()
    };
    let mut m = LinkState::new(1, cfg).unwrap();
    m.on_fsos(ms(0), 77, (10..20).map(|a| fso(a, a + 100, 1, true)));
    m.handle_timeout(ms(0));
    m.neighbor_up(ms(0), 2, 2, 1).unwrap();
    let sizes: Vec<usize> = drain(&mut m)
        .into_iter()
        .map(|a| match a {
            RoutingAction::Send { fsos, .. } => fsos.len(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(sizes, vec![4, 4, 2]);
}

#[test]
fn floods_are_rate_limited_and_batched() {
    let mut m = LinkState::new(1, Config::default()).unwrap();
    m.neighbor_up(ms(0), 2, 2, 1).unwrap();
    m.neighbor_up(ms(0), 3, 3, 1).unwrap();
    assert_eq!(m.poll_timeout(), Some(ms(0)));
    m.handle_timeout(ms(0));
    drain(&mut m);
    // Three updates within the next 100 ms leave together at 100 ms.
    m.on_fsos(ms(10), 2, [fso(7, 8, 1, true)]);
    assert_eq!(m.poll_timeout(), Some(ms(100)));
    m.on_fsos(ms(20), 2, [fso(8, 7, 1, true)]);
    m.on_fsos(ms(30), 3, [fso(9, 8, 1, true)]);
    m.handle_timeout(ms(50));
    assert!(drain(&mut m).is_empty());
    m.handle_timeout(ms(100));
    assert_eq!(
        drain(&mut m),
        vec![
            RoutingAction::Flood {
                to_ports: vec![3],
                fsos: vec![fso(7, 8, 1, true), fso(8, 7, 1, true)]
            },
            RoutingAction::Flood {
                to_ports: vec![2],
                fsos: vec![fso(9, 8, 1, true)]
            },
        ]
    );
    assert_eq!(m.counters().tx_messages, 4);
}

#[test]
fn computation_is_rate_limited_and_only_reports_changes() {
    let mut m = LinkState::new(1, Config::default()).unwrap();
    m.neighbor_up(ms(0), 2, 2, 1).unwrap();
    m.handle_timeout(ms(0));
    // The link is not up from 2's side yet: no route.
    assert!(m.next_hops().is_empty());
    assert!(!drain(&mut m).contains(&RoutingAction::TableChanged));
    m.on_fsos(ms(10), 2, [fso(2, 1, 1, true)]);
    assert!(m.is_dirty());
    assert_eq!(m.poll_timeout(), Some(ms(100)));
    m.handle_timeout(ms(100));
    assert_eq!(m.next_hops()[&2], vec![2]);
    assert!(drain(&mut m).contains(&RoutingAction::TableChanged));
    // A refresh of the same link (new seq, same state) changes nothing.
    m.on_fsos(ms(300), 2, [fso(2, 1, 2, true)]);
    assert!(!m.is_dirty());
    assert_eq!(m.counters().table_changes, 1);
}

#[test]
fn own_fso_newer_after_restart_is_superseded() {
    // 1 restarted: the DIF still holds its FSO about 2 at seq 40, up, and
    // about 3 (no longer a neighbour) at seq 7.
    let mut m = LinkState::new(1, Config::default()).unwrap();
    m.neighbor_up(ms(0), 2, 2, 1).unwrap();
    m.on_fsos(ms(0), 2, [fso(1, 2, 40, true), fso(1, 3, 7, true)]);
    assert_eq!(m.counters().rx_own_newer, 2);
    assert_eq!(m.fso(ms(0), 1, 2), Some(fso(1, 2, 41, true)));
    assert_eq!(
        m.fso(ms(0), 1, 3),
        Some(Fso {
            cost: 0,
            ..fso(1, 3, 8, false)
        })
    );
    // A later change continues from there.
    m.neighbor_down(ms(5), 2).unwrap();
    assert_eq!(m.fso(ms(5), 1, 2), Some(fso(1, 2, 42, false)));
}

/// Forged copies of our own FSO that take our numbers to the top of
/// their space: we take the next number after each, which at the top
/// wraps to 1 and is newer in serial arithmetic, here and at a member
/// that stored the forged copy; later changes go on from there. (With
/// numbers that stopped at the top, every later change was a duplicate of
/// the forged copy for good.) A forged number behind ours is stale.
#[test]
fn own_fsos_forged_up_to_the_top_of_the_numbers_are_superseded_and_numbers_go_on() {
    let mut m = LinkState::new(1, Config::default()).unwrap();
    m.neighbor_up(ms(0), 2, 2, 1).unwrap();
    let mut other = LinkState::new(3, Config::default()).unwrap();
    // Just under half the space ahead of our 1, then of our 2^31 + 1.
    for (i, forged) in [1u32 << 31, u32::MAX].into_iter().enumerate() {
        let forged = fso(1, 2, forged, false);
        other.on_fsos(ms(0), 9, [forged]);
        m.on_fsos(ms(0), 2, [forged]);
        assert_eq!(m.counters().rx_own_newer, i as u64 + 1);
    }
    let truth = m.fso(ms(0), 1, 2).unwrap();
    assert_eq!(truth, fso(1, 2, 1, true), "the number after the top is 1");
    other.on_fsos(ms(1), 9, [truth]);
    assert_eq!(
        other.fso(ms(1), 1, 2),
        Some(fso(1, 2, 1, true)),
        "and newer"
    );
    m.neighbor_down(ms(5), 2).unwrap();
    let down = m.fso(ms(5), 1, 2).unwrap();
    assert_eq!(down, fso(1, 2, 2, false));
    other.on_fsos(ms(6), 9, [down]);
    assert_eq!(other.fso(ms(6), 1, 2), Some(fso(1, 2, 2, false)));
    // Behind ours (the top is just behind 2 now): stale, nothing changes.
    m.on_fsos(ms(7), 2, [fso(1, 2, u32::MAX, true)]);
    assert_eq!(m.counters().rx_own_newer, 2);
    assert_eq!(m.fso(ms(7), 1, 2), Some(fso(1, 2, 2, false)));
    // Exactly half the number space away, neither copy is newer: stale.
    other.on_fsos(ms(8), 9, [fso(1, 2, 2 + (1 << 31), true)]);
    assert_eq!(other.fso(ms(8), 1, 2), Some(fso(1, 2, 2, false)));
}

#[test]
fn sequence_survives_expiry_of_own_down_fso() {
    let cfg = Config {
        max_age: Duration::from_secs(4),
        refresh_interval: Duration::from_secs(2),
        ..Config::default()
    };
    let mut m = LinkState::new(1, cfg).unwrap();
    m.neighbor_up(ms(0), 2, 2, 1).unwrap();
    m.neighbor_down(ms(100), 2).unwrap();
    assert_eq!(m.fso(ms(100), 1, 2).map(|f| f.seq), Some(2));
    m.handle_timeout(ms(4_100));
    assert_eq!(m.fso(ms(4_100), 1, 2), None);
    assert_eq!(m.poll_timeout(), None);
    m.neighbor_up(ms(5_000), 2, 2, 1).unwrap();
    assert_eq!(m.fso(ms(5_000), 1, 2).map(|f| f.seq), Some(3));
}

#[test]
fn database_is_bounded() {
    let cfg = Config {
        max_fsos: 3,
        ..Config::default()
    };
    let mut m = LinkState::new(1, cfg).unwrap();
    m.on_fsos(ms(0), 1, (10..20).map(|a| fso(a, 1, 1, true)));
    assert_eq!(m.db_len(), 3);
    assert_eq!(m.counters().rx_db_full, 7);
    // Updates of known keys still go in.
    m.on_fsos(ms(0), 1, [fso(10, 1, 2, false)]);
    assert_eq!(m.fso(ms(0), 10, 1).map(|f| f.seq), Some(2));
}

/// FSOs that claim to be this IPCP's own, about neighbours it never had
/// (a forged or hostile management message can carry thousands), each with
/// a new address: the sequence numbers kept for its own FSOs stay bounded,
/// however many come and however long (the database expires what they
/// made this IPCP announce, and more come).
#[test]
fn forged_own_fsos_keep_memory_bounded() {
    let cfg = Config {
        max_fsos: 3,
        max_age: Duration::from_secs(4),
        refresh_interval: Duration::from_secs(2),
        ..Config::default()
    };
    let mut m = LinkState::new(1, cfg).unwrap();
    m.neighbor_up(ms(0), 2, 2, 1).unwrap();
    for round in 0..20u64 {
        let now = ms(round * 5_000);
        let base = 100 + round * 1_000;
        m.on_fsos(now, 2, (base..base + 1_000).map(|n| fso(1, n, 1, true)));
        m.handle_timeout(now);
        drain(&mut m);
        assert!(
            m.own_seq.len() <= 2 * 3 + 1,
            "round {round}: {} own sequence numbers kept",
            m.own_seq.len()
        );
    }
    // The live neighbour's own FSO is still there and refreshed.
    m.handle_timeout(ms(100_000));
    assert!(m.fso(ms(100_000), 1, 2).is_some_and(|f| f.up));
}

#[test]
fn a_neighbour_sending_its_own_fsos_older_than_ours_restarted_and_gets_the_database() {
    let mut m = LinkState::new(1, Config::default()).unwrap();
    m.neighbor_up(ms(0), 2, 2, 1).unwrap();
    m.on_fsos(ms(0), 2, [fso(2, 1, 5, true), fso(3, 2, 4, true)]);
    drain(&mut m);
    // A copy of 3's FSO relayed by 2 that is older: an ordinary late copy.
    m.on_fsos(ms(10), 2, [fso(3, 2, 3, true)]);
    assert!(drain(&mut m).is_empty());
    // 2's own FSO, from 2, older than ours: 2 restarted.
    m.on_fsos(ms(20), 2, [fso(2, 1, 1, true)]);
    let acts = drain(&mut m);
    assert!(
        acts.contains(&RoutingAction::NeighborRestarted { port: 2 }),
        "{acts:?}"
    );
    let sent: Vec<Fso> = acts
        .iter()
        .filter_map(|a| match a {
            RoutingAction::Send { port: 2, fsos } => Some(fsos.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert!(sent.iter().any(|f| f.key() == (2, 1) && f.seq == 5));
    assert!(sent.iter().any(|f| f.key() == (3, 2) && f.seq == 4));
    assert_eq!(m.counters().neighbor_restarts, 1);
    // The same sequence number saying something else: restarted too (once
    // a refresh interval passed since the last answer, as nothing new came
    // from 2); the same one saying the same: a plain duplicate.
    m.on_fsos(ms(30), 2, [fso(2, 1, 5, true)]);
    assert!(drain(&mut m).is_empty());
    let interval = Config::default().refresh_interval.as_millis() as u64;
    m.on_fsos(ms(20 + interval), 2, [fso(2, 1, 5, false)]);
    assert!(drain(&mut m).contains(&RoutingAction::NeighborRestarted { port: 2 }));
}

#[test]
fn stale_copies_of_a_neighbours_own_fso_are_answered_once_until_it_sends_something_new() {
    let cfg = Config::default();
    let mut m = LinkState::new(1, cfg.clone()).unwrap();
    m.neighbor_up(ms(0), 2, 2, 1).unwrap();
    let far: Vec<Fso> = (0..300).map(|i| fso(1000 + i, 5000 + i, 1, true)).collect();
    m.on_fsos(ms(0), 2, far);
    m.on_fsos(ms(0), 2, [fso(2, 1, 10, true)]);
    m.handle_timeout(ms(1000));
    drain(&mut m);
    let answer = |m: &mut LinkState, t: Instant, fsos: Vec<Fso>| {
        m.on_fsos(t, 2, fsos);
        let acts = drain(m);
        let sent: usize = acts
            .iter()
            .map(|a| match a {
                RoutingAction::Send { fsos, .. } => fsos.len(),
                _ => 0,
            })
            .sum();
        let restarted = acts.contains(&RoutingAction::NeighborRestarted { port: 2 });
        (sent, restarted)
    };
    // The first stale copy: 2 restarted, it gets the database.
    let (sent, restarted) = answer(&mut m, ms(2000), vec![fso(2, 1, 9, true)]);
    assert!(sent > 300 && restarted, "{sent}");
    // The same, over and over: not answered again.
    for k in 1..10 {
        let again = answer(&mut m, ms(2000 + k), vec![fso(2, 1, 9, true)]);
        assert_eq!(again, (0, false), "copy {k}");
    }
    assert_eq!(m.counters().neighbor_restarts, 1);
    // Something new from 2 (it jumped past its old numbers): a later
    // stale copy is a new restart.
    answer(&mut m, ms(3000), vec![fso(2, 1, 11, true)]);
    let (sent, restarted) = answer(&mut m, ms(3001), vec![fso(2, 1, 9, true)]);
    assert!(sent > 300 && restarted, "{sent}");
    // Nothing new, but a refresh interval later (the answer may have been
    // lost): answered again, once.
    let interval = cfg.refresh_interval.as_millis() as u64;
    let (early, later) = (ms(3000 + interval), ms(3001 + interval));
    assert!(!answer(&mut m, early, vec![fso(2, 1, 9, true)]).1);
    assert!(answer(&mut m, later, vec![fso(2, 1, 9, true)]).1);
    assert!(!answer(&mut m, later, vec![fso(2, 1, 9, true)]).1);
    assert_eq!(m.counters().neighbor_restarts, 3);
}

/// Carries the messages between `a` (address 1, port 2) and `b` (address
/// 2, port 1), running timers in steps of 10 ms for a second; returns the
/// number of messages carried.
fn exchange(a: &mut LinkState, b: &mut LinkState, from: Instant) -> usize {
    let mut carried = 0;
    for step in 0..100u64 {
        let now = from + Duration::from_millis(10 * step);
        for m in [&mut *a, &mut *b] {
            if m.poll_timeout().is_some_and(|t| t <= now) {
                m.handle_timeout(now);
            }
        }
        loop {
            let (ab, ba) = (drain(a), drain(b));
            if ab.is_empty() && ba.is_empty() {
                break;
            }
            for (acts, to, port) in [(ab, &mut *b, 1), (ba, &mut *a, 2)] {
                for act in acts {
                    if let RoutingAction::Flood { fsos, .. } | RoutingAction::Send { fsos, .. } =
                        act
                    {
                        carried += 1;
                        to.on_fsos(now, port, fsos);
                    }
                }
            }
        }
    }
    carried
}

#[test]
fn a_neighbour_restarting_before_any_change_gets_the_database_and_resyncs_stay_finite() {
    let cfg = Config::default();
    let mut a = LinkState::new(1, cfg.clone()).unwrap();
    let mut b = LinkState::new(2, cfg.clone()).unwrap();
    a.neighbor_up(ms(0), 2, 2, 1).unwrap();
    b.neighbor_up(ms(0), 1, 1, 1).unwrap();
    exchange(&mut a, &mut b, ms(0));
    assert_eq!(a.next_hops().get(&2), Some(&vec![2]));
    // A resync (b knows a) is not taken for a restart.
    a.resync(ms(2_000), 2).unwrap();
    let carried = exchange(&mut a, &mut b, ms(2_000));
    assert_eq!(carried, 1, "{carried} messages for one resync");
    // b restarts before anything changed: its FSO (2, 1) is the very one
    // a holds. a sends it the database all the same.
    let mut b = LinkState::new(2, cfg).unwrap();
    b.neighbor_up(ms(4_000), 1, 1, 1).unwrap();
    exchange(&mut a, &mut b, ms(4_000));
    assert_eq!(b.db_len(), 2);
    assert_eq!(b.next_hops().get(&1), Some(&vec![1]));
    assert_eq!(a.counters().neighbor_restarts, 1);
    // Its own FSO again, still knowing nothing of us, with nothing new
    // from it since the answer: not answered again (this is what keeps
    // two neighbours from answering each other's answers).
    let mut c = LinkState::new(2, Config::default()).unwrap();
    c.neighbor_up(ms(6_000), 1, 1, 1).unwrap();
    let own: Vec<Fso> = c.fsos(ms(6_000)).collect();
    a.on_fsos(ms(6_000), 2, own.clone());
    a.on_fsos(ms(6_010), 2, own);
    assert_eq!(a.counters().neighbor_restarts, 1);
    assert!(drain(&mut a).is_empty());
}

#[test]
fn a_copy_of_our_own_fso_with_our_number_but_another_state_makes_us_jump() {
    let mut m = LinkState::new(1, Config::default()).unwrap();
    m.neighbor_up(ms(0), 2, 2, 1).unwrap();
    assert_eq!(m.fso(ms(0), 1, 2).map(|f| (f.seq, f.up)), Some((1, true)));
    // Our previous life said the link was down with sequence number 1.
    m.on_fsos(ms(10), 2, [fso(1, 2, 1, false)]);
    assert_eq!(m.fso(ms(10), 1, 2).map(|f| (f.seq, f.up)), Some((2, true)));
    assert_eq!(m.counters().rx_own_newer, 1);
    // The same copy as ours is a duplicate.
    m.on_fsos(ms(20), 2, [fso(1, 2, 2, true)]);
    assert_eq!(m.fso(ms(20), 1, 2).map(|f| f.seq), Some(2));
    assert_eq!(m.counters().rx_own_newer, 1);
}

#[test]
fn counters_map_names_every_counter() {
    let m = LinkState::new(1, Config::default()).unwrap();
    assert_eq!(m.counters().to_map().len(), 17);
}

/// Floyd–Warshall on the full graph: the reference the machines must match.
fn reference(n: u64, edges: &Edges, ecmp: bool) -> BTreeMap<u64, BTreeMap<u64, Vec<PortId>>> {
    const INF: u64 = u64::MAX / 4;
    let idx = |a: u64| (a - 1) as usize;
    let n_ = n as usize;
    let mut d = vec![vec![INF; n_]; n_];
    for (i, row) in d.iter_mut().enumerate() {
        row[i] = 0;
    }
    for (&(a, b), &c) in edges {
        let c = u64::from(c.max(1));
        d[idx(a)][idx(b)] = d[idx(a)][idx(b)].min(c);
        d[idx(b)][idx(a)] = d[idx(b)][idx(a)].min(c);
    }
    for k in 0..n_ {
        for i in 0..n_ {
            for j in 0..n_ {
                if d[i][k] + d[k][j] < d[i][j] {
                    d[i][j] = d[i][k] + d[k][j];
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    for s in 1..=n {
        let mut hops = BTreeMap::new();
        for t in 1..=n {
            if s == t || d[idx(s)][idx(t)] >= INF {
                continue;
            }
            let mut ports: Vec<PortId> = edges
                .iter()
                .filter_map(|(&(a, b), &c)| {
                    let v = if a == s {
                        b
                    } else if b == s {
                        a
                    } else {
                        return None;
                    };
                    (u64::from(c.max(1)) + d[idx(v)][idx(t)] == d[idx(s)][idx(t)])
                        .then_some(v as PortId)
                })
                .collect();
            ports.sort_unstable();
            if !ecmp {
                ports.truncate(1);
            }
            hops.insert(t, ports);
        }
        out.insert(s, hops);
    }
    out
}

/// Undirected edges (lower address first) and their costs.
type Edges = BTreeMap<(u64, u64), u32>;

/// Node count, edges, which edges to cut later, ECMP on or off.
fn random_graph() -> impl Strategy<Value = (u64, Edges, Vec<usize>, bool)> {
    (2u64..=20).prop_flat_map(|n| {
        (
            Just(n),
            proptest::collection::btree_map((1..=n, 1..=n), 1u32..=4, 0..(3 * n as usize)),
            proptest::collection::vec(any::<usize>(), 0..4),
            any::<bool>(),
        )
            .prop_map(|(n, raw, cuts, ecmp)| {
                // One undirected edge per pair, no loops.
                let mut edges = BTreeMap::new();
                for ((a, b), c) in raw {
                    if a != b {
                        edges.entry((a.min(b), a.max(b))).or_insert(c);
                    }
                }
                (n, edges, cuts, ecmp)
            })
    })
}

fn check(net: &Net, n: u64, edges: &Edges, ecmp: bool) -> Result<(), TestCaseError> {
    let want = reference(n, edges, ecmp);
    for (a, m) in &net.nodes {
        prop_assert_eq!(m.next_hops(), &want[a], "node {}", a);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random graphs of up to 20 nodes: once the exchange is quiet, every
    /// node's next hops are those of Floyd–Warshall on the full graph; and
    /// again after some links break (both ends notice).
    #[test]
    fn random_graphs_match_the_reference((n, mut edges, cuts, ecmp) in random_graph()) {
        let cfg = Config { ecmp, ..Config::default() };
        let d = Duration::from_millis(3);
        let mut net = Net::new(1..=n, &cfg, d);
        for (&(a, b), &c) in &edges {
            net.link(a, b, c);
        }
        net.run_until_quiet();
        check(&net, n, &edges, ecmp)?;
        // Converged within (diameter in hops + 1) flood periods, loosely:
        // at most n hops.
        prop_assert!(net.converged_at() <= ms(0) + (d + cfg.propagation_delay) * (n as u32 + 1) + cfg.pduft_interval);

        if !edges.is_empty() {
            let t0 = net.now + Duration::from_secs(1);
            net.run_until(t0);
            for c in cuts {
                let keys: Vec<_> = edges.keys().copied().collect();
                if keys.is_empty() { break; }
                let (a, b) = keys[c % keys.len()];
                edges.remove(&(a, b));
                net.cut(a, b, &[a, b]);
            }
            net.run_until_quiet();
            check(&net, n, &edges, ecmp)?;
        }
    }

    /// Arbitrary FSOs never panic the machine and never break the bounds.
    #[test]
    fn arbitrary_fsos_never_panic(fsos in proptest::collection::vec(
        (0u64..6, 0u64..6, any::<u32>(), 0u32..5, any::<bool>(), 0u32..100), 0..60)) {
        let cfg = Config { max_fsos: 10, ..Config::default() };
        let mut m = LinkState::new(1, cfg).unwrap();
        m.neighbor_up(ms(0), 2, 2, 1).unwrap();
        let mut now = ms(0);
        for (i, (o, nb, cost, seq, up, age)) in fsos.into_iter().enumerate() {
            now = ms(i as u64 * 37);
            m.on_fsos(now, 2, [Fso { origin: o, neighbor: nb, cost, seq, up, age }]);
            m.handle_timeout(now);
            drain(&mut m);
        }
        // The bound, plus our own FSO about the live neighbour.
        prop_assert!(m.db_len() <= 11);
        m.handle_timeout(now + Duration::from_secs(120));
        // Only our own refreshed FSO survives: everything else aged out.
        prop_assert!(m.fsos(now).all(|f| f.origin == 1));
    }
}
