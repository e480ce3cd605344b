//! Link-state routing over emulated links: unchanged `LinkState` machines,
//! FSO batches carried as CDAP object values (`flowStateObjectGroup_t`) in
//! datagrams, links with delay, jitter and loss.

use rina_core::rmt::{Address, PortId};
use rina_core::routing::{decode_fsos, encode_fsos, Config, LinkState, RoutingAction};
use rina_core::Instant;
use rina_sim::world::Ctx;
use rina_sim::{LinkConfig, Node, World};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

/// The end of the link from node `a` to node `b`. The port-id of that N-1
/// flow at `a` is `b`.
fn end(a: Address, b: Address) -> SocketAddr {
    SocketAddr::from(([10, 1, a as u8, b as u8], 7000))
}

#[derive(Debug)]
enum Cmd {
    /// The N-1 flow to this neighbour is up, with this cost.
    Up(Address, u32),
    /// The N-1 flow to this neighbour is gone.
    Down(Address),
}

#[derive(Debug, Clone, PartialEq)]
enum Ev {
    TableChanged(BTreeMap<Address, Vec<PortId>>),
}

struct RouterNode {
    addr: Address,
    peers: Vec<Address>,
    live: BTreeSet<Address>,
    ls: LinkState,
    malformed: u64,
}

impl RouterNode {
    fn new(addr: Address, peers: Vec<Address>, cfg: Config) -> Self {
        RouterNode {
            addr,
            peers,
            live: BTreeSet::new(),
            ls: LinkState::new(addr, cfg).unwrap(),
            malformed: 0,
        }
    }

    fn carry(&mut self, ctx: &mut Ctx<'_, Ev>) {
        let mut q = VecDeque::new();
        while let Some(a) = self.ls.poll_action() {
            q.push_back(a);
        }
        for a in q {
            let (ports, fsos) = match a {
                RoutingAction::Flood { to_ports, fsos } => (to_ports, fsos),
                RoutingAction::Send { port, fsos } => (vec![port], fsos),
                RoutingAction::TableChanged => {
                    ctx.record(Ev::TableChanged(self.ls.next_hops().clone()));
                    continue;
                }
                RoutingAction::NeighborRestarted { .. } => continue,
            };
            let bytes = encode_fsos(&fsos);
            for p in ports {
                let b = Address::from(p);
                ctx.transmit(end(self.addr, b), end(b, self.addr), bytes.clone());
            }
        }
    }
}

impl Node for RouterNode {
    type Command = Cmd;
    type Event = Ev;

    fn addrs(&self) -> Vec<SocketAddr> {
        self.peers.iter().map(|&b| end(self.addr, b)).collect()
    }

    fn on_datagram(
        &mut self,
        ctx: &mut Ctx<'_, Ev>,
        to: SocketAddr,
        _from: SocketAddr,
        payload: &[u8],
    ) {
        let SocketAddr::V4(v4) = to else { return };
        let peer = Address::from(v4.ip().octets()[3]);
        // A deallocated N-1 flow delivers nothing.
        if !self.live.contains(&peer) {
            return;
        }
        match decode_fsos(payload) {
            Ok(fsos) => self.ls.on_fsos(ctx.now(), peer as PortId, fsos),
            Err(_) => self.malformed += 1,
        }
        self.carry(ctx);
    }

    fn on_timeout(&mut self, ctx: &mut Ctx<'_, Ev>) {
        self.ls.handle_timeout(ctx.now());
        self.carry(ctx);
    }

    fn on_command(&mut self, ctx: &mut Ctx<'_, Ev>, cmd: Cmd) {
        match cmd {
            Cmd::Up(b, cost) => {
                self.live.insert(b);
                self.ls
                    .neighbor_up(ctx.now(), b as PortId, b, cost)
                    .unwrap();
            }
            Cmd::Down(b) => {
                self.live.remove(&b);
                self.ls.neighbor_down(ctx.now(), b as PortId).unwrap();
            }
        }
        self.carry(ctx);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.ls.poll_timeout()
    }
}

/// Next hops by breadth-first search (every cost is 1; ECMP on).
fn bfs(
    n: Address,
    edges: &BTreeSet<(Address, Address)>,
    src: Address,
) -> BTreeMap<Address, Vec<PortId>> {
    let adj = |u: Address| -> Vec<Address> {
        edges
            .iter()
            .filter_map(|&(a, b)| {
                if a == u {
                    Some(b)
                } else if b == u {
                    Some(a)
                } else {
                    None
                }
            })
            .collect()
    };
    let dist_from = |s: Address| {
        let mut d = BTreeMap::from([(s, 0u32)]);
        let mut q = VecDeque::from([s]);
        while let Some(u) = q.pop_front() {
            for v in adj(u) {
                if !d.contains_key(&v) {
                    d.insert(v, d[&u] + 1);
                    q.push_back(v);
                }
            }
        }
        d
    };
    let ds = dist_from(src);
    let mut out = BTreeMap::new();
    for t in 1..=n {
        let Some(&dt) = ds.get(&t) else { continue };
        if t == src {
            continue;
        }
        let mut ports: Vec<PortId> = adj(src)
            .into_iter()
            .filter(|&v| dist_from(v).get(&t).is_some_and(|&x| x + 1 == dt))
            .map(|v| v as PortId)
            .collect();
        ports.sort_unstable();
        out.insert(t, ports);
    }
    out
}

struct Grid {
    world: World<RouterNode>,
    ids: BTreeMap<Address, usize>,
    edges: BTreeSet<(Address, Address)>,
    n: Address,
}

/// A `side` x `side` grid, nodes numbered row by row from 1, every link up
/// (both ends told) at time zero.
fn grid(seed: u64, side: Address, link: LinkConfig, cfg: &Config) -> Grid {
    let n = side * side;
    let mut edges = BTreeSet::new();
    for a in 1..=n {
        if a % side != 0 {
            edges.insert((a, a + 1));
        }
        if a + side <= n {
            edges.insert((a, a + side));
        }
    }
    let mut world = World::new(seed);
    let mut ids = BTreeMap::new();
    for a in 1..=n {
        let peers: Vec<Address> = edges
            .iter()
            .filter_map(|&(x, y)| {
                if x == a {
                    Some(y)
                } else if y == a {
                    Some(x)
                } else {
                    None
                }
            })
            .collect();
        ids.insert(a, world.add_node(RouterNode::new(a, peers, cfg.clone())));
    }
    for &(a, b) in &edges {
        world.connect(end(a, b), end(b, a), link.clone());
        world.schedule(Instant::ZERO, ids[&a], Cmd::Up(b, 1));
        world.schedule(Instant::ZERO, ids[&b], Cmd::Up(a, 1));
    }
    Grid {
        world,
        ids,
        edges,
        n,
    }
}

impl Grid {
    fn check(&self) {
        for (&a, &id) in &self.ids {
            let node = self.world.node(id);
            if node.live.is_empty() {
                continue; // a dead node
            }
            assert_eq!(
                node.ls.next_hops(),
                &bfs(self.n, &self.edges, a),
                "node {a} at {:?}",
                self.world.now()
            );
        }
    }

    /// The last table change of any node at or after `since`.
    fn last_change(&self, since: Instant) -> Instant {
        self.world
            .node_events()
            .map(|(t, _, _)| t)
            .filter(|t| *t >= since)
            .max()
            .unwrap_or(since)
    }
}

fn secs(n: u64) -> Instant {
    Instant::ZERO + Duration::from_secs(n)
}

#[test]
fn a_grid_converges_then_routes_around_a_dead_node() {
    let cfg = Config {
        ecmp: true,
        ..Config::default()
    };
    let link = LinkConfig::ideal(Duration::from_millis(5)).jitter(Duration::from_millis(1));
    let mut g = grid(1, 4, link, &cfg);
    g.world.run_until(secs(3)).unwrap();
    g.check();
    let conv = g.last_change(Instant::ZERO) - Instant::ZERO;
    eprintln!("4x4 grid, 5 ms links: every table final at {conv:?}");
    // Diameter 6 hops, each at most link delay + jitter + one flood period.
    assert!(conv <= Duration::from_millis(6 * 106 + 100));

    // Node 6 (inner) dies; its four neighbours notice and deallocate.
    let t0 = secs(4);
    for b in [2, 5, 7, 10] {
        g.world.schedule(t0, g.ids[&b], Cmd::Down(6));
        g.world.schedule(t0, g.ids[&6], Cmd::Down(b));
        g.edges.retain(|&(x, y)| x != 6 && y != 6);
    }
    g.world.run_until(secs(6)).unwrap();
    g.check();
    let took = g.last_change(t0) - t0;
    eprintln!("4x4 grid, inner node dies: every table final {took:?} after");
    assert!(took <= Duration::from_millis(6 * 106 + 100));
    assert!(g.ids.values().all(|&id| g.world.node(id).malformed == 0));
}

#[test]
fn flooding_over_lossy_links_converges_by_refresh() {
    let cfg = Config {
        ecmp: true,
        ..Config::default()
    };
    let link = LinkConfig::ideal(Duration::from_millis(5)).loss(0.05);
    let mut g = grid(7, 4, link, &cfg);
    // Lost floods are repaired by other paths at once, or by the next
    // refresh (20 s) at worst.
    g.world.run_until(secs(45)).unwrap();
    g.check();
    let c: u64 = g
        .ids
        .values()
        .map(|&id| g.world.node(id).ls.counters().rx_duplicate)
        .sum();
    eprintln!(
        "4x4 grid, 5% loss: tables final at {:?}, {c} duplicate FSOs",
        g.last_change(Instant::ZERO) - Instant::ZERO
    );
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let cfg = Config::default();
    let link = LinkConfig::ideal(Duration::from_millis(5))
        .jitter(Duration::from_millis(2))
        .loss(0.02);
    let digest = || {
        let mut g = grid(3, 3, link.clone(), &cfg);
        g.world.run_until(secs(2)).unwrap();
        g.world.trace_digest()
    };
    assert_eq!(digest(), digest());
}
