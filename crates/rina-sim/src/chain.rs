//! A chain of normal IPCPs: node 0 — node 1 — … — node n-1, each joined to
//! the next by an emulated link, with static routes (or dynamic routing, if
//! the IPCPs' configuration asks for it) and a static directory, as the
//! tests need before layer management exists. Flows are opened either
//! directly ([`Chain::open_flow`]) or by name through the flow allocator
//! ([`Net::register`], [`Net::allocate`]).
//!
//! [`Mesh`] builds arbitrary topologies from edge lists, with every IPCP
//! running link-state routing; links can be cut while the simulation runs.

use crate::link::{LinkConfig, LinkId};
use crate::normal_node::{NormalCommand, NormalNode};
use crate::shim_node::App;
use crate::world::{NodeId, World};
use rina_core::efcp::EfcpConfig;
use rina_core::normal::{Endpoint, FlowId, N1Port, NormalConfig, NormalIpcp};
use rina_core::rmt::{Address, Fifo};
use rina_core::routing;
use rina_core::Instant;
use rina_wire::{AppName, QosSpec};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

/// N-1 port towards the previous node.
pub const LEFT: u32 = 1;
/// N-1 port towards the next node.
pub const RIGHT: u32 = 2;

/// The fake link-end address of `side` (LEFT/RIGHT) of node `i`.
pub fn end_addr(i: usize, side: u32) -> SocketAddr {
    let i = u8::try_from(i).unwrap_or(u8::MAX);
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 1, i, side as u8)), 7000)
}

/// A chain of normal IPCPs.
/// Dereferences to [`Net`] for the world, the nodes and the scripted
/// application actions.
pub struct Chain {
    /// The world and the nodes, in chain order.
    pub net: Net,
    /// Link `i` joins node `i` and node `i + 1`.
    pub links: Vec<LinkId>,
}

impl Chain {
    /// `n` nodes joined by links like `link`, each IPCP configured by
    /// `cfg(address)`, FIFO queues of 1000 PDUs, and routes along the chain.
    ///
    /// If the configuration sets `routing`, no static route is set: every
    /// node is told its neighbours (cost 1) at time zero and routing fills
    /// the tables.
    pub fn new(seed: u64, n: usize, link: LinkConfig, cfg: impl Fn(u64) -> NormalConfig) -> Chain {
        let mut world = World::new(seed);
        let mut nodes = Vec::new();
        let mut ups = Vec::new();
        for i in 0..n {
            let addr = i as u64 + 1;
            let mut c = cfg(addr);
            draw_entropy(&mut c, restart_draw(seed, i, 0));
            let ipcp = NormalIpcp::new(c, Box::new(Fifo::new(1000)))
                .expect("valid normal IPCP configuration");
            let dynamic = ipcp.config().routing.is_some();
            let mut node = NormalNode::new(ipcp);
            if i > 0 {
                node.attach(LEFT, end_addr(i, LEFT), end_addr(i - 1, RIGHT));
                ups.push((i, LEFT, addr - 1));
            }
            if i + 1 < n {
                node.attach(RIGHT, end_addr(i, RIGHT), end_addr(i + 1, LEFT));
                ups.push((i, RIGHT, addr + 1));
            }
            if dynamic {
                nodes.push(world.add_node(node));
                continue;
            }
            for j in 0..n {
                if j != i {
                    let port = if j > i { RIGHT } else { LEFT };
                    node.ipcp_mut()
                        .rmt_mut()
                        .table_mut()
                        .set(j as u64 + 1, None, vec![port]);
                }
            }
            nodes.push(world.add_node(node));
        }
        let links = (0..n.saturating_sub(1))
            .map(|i| world.connect(end_addr(i, RIGHT), end_addr(i + 1, LEFT), link.clone()))
            .collect();
        for (i, port, neighbor) in ups {
            if world.node(nodes[i]).ipcp().config().routing.is_some() {
                world.schedule(
                    Instant::ZERO,
                    nodes[i],
                    NormalCommand::NeighborUp {
                        port,
                        neighbor,
                        cost: 1,
                    },
                );
            }
        }
        Chain {
            net: Net { world, nodes },
            links,
        }
    }

    /// Opens flow `flow` between nodes `a` and `b` (CEP-ids `flow` at both
    /// ends) with `policy`, and makes node `b`'s application echo if asked.
    pub fn open_flow(&mut self, a: usize, b: usize, flow: FlowId, policy: EfcpConfig) {
        let now = self.world.now();
        let (na, nb) = (self.nodes[a], self.nodes[b]);
        for (node, peer) in [(na, b), (nb, a)] {
            let ep = Endpoint {
                local_cep: flow as u64,
                remote_addr: peer as u64 + 1,
                remote_cep: flow as u64,
                qos_id: 1,
            };
            self.world
                .node_mut(node)
                .ipcp_mut()
                .open_flow(now, flow, ep, policy.clone())
                .expect("flow opens");
        }
    }

    /// Schedules node `node`'s N-1 port `port` (LEFT or RIGHT) to go down
    /// at `at` ([`NormalCommand::PortDown`]); the peer's end stays up.
    pub fn port_down(&mut self, at: Instant, node: usize, port: N1Port) {
        let id = self.nodes[node];
        self.world.schedule(at, id, NormalCommand::PortDown(port));
    }
}

/// The link end of node `a` towards node `b` in a [`Mesh`].
pub fn mesh_end(a: usize, b: usize) -> SocketAddr {
    let a = u8::try_from(a).unwrap_or(u8::MAX);
    let b = u8::try_from(b).unwrap_or(u8::MAX);
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 2, a, b)), 7000)
}

/// Normal IPCPs joined by emulated links in any topology, every one running
/// link-state routing (no static route at all) and knowing a static
/// directory ([`Net::register`]) or, if `cfg` sets
/// [`NormalConfig::dynamic_directory`], finding names through the
/// disseminated directory ([`Net::register_dynamic`]). Node `i` has address `i + 1`; its N-1 port towards node `j`
/// is [`Mesh::port`]`(j)` = `j + 1`, the neighbour's address (so at most
/// one link joins two nodes).
/// Dereferences to [`Net`] for the world, the nodes and the scripted
/// application actions.
pub struct Mesh {
    /// The world and the nodes.
    pub net: Net,
    /// The edges, as given.
    pub edges: Vec<(usize, usize)>,
    /// `links[k]` carries `edges[k]`.
    pub links: Vec<LinkId>,
    /// Restarts so far, of any node ([`Mesh::restart`]).
    restarts: u64,
}

impl Mesh {
    /// `n` nodes joined along `edges` by links like `link`, each IPCP
    /// configured by `cfg(address)` (its `routing` set to the default
    /// [`routing::Config`] if left `None`), with FIFO queues of 1000 PDUs.
    /// Every node is told its neighbours (cost 1) at time zero.
    ///
    /// # Panics
    /// On a self-loop, a repeated edge or a node index out of range.
    pub fn new(
        seed: u64,
        n: usize,
        edges: &[(usize, usize)],
        link: LinkConfig,
        cfg: impl Fn(u64) -> NormalConfig,
    ) -> Mesh {
        Self::build(seed, n, edges, link, |i| cfg(i as u64 + 1), true)
    }

    /// Like [`Mesh::new`], but nobody is told its neighbours: each IPCP is
    /// configured by `cfg(node index)`, normally with
    /// [`NormalConfig::membership`] set and address 0 everywhere but at the
    /// bootstrap member, so that the DIF assembles itself by hellos and
    /// enrollment. Routing is left as configured (a member adopts the DIF's
    /// policies when it enrolls).
    pub fn enrolling(
        seed: u64,
        n: usize,
        edges: &[(usize, usize)],
        link: LinkConfig,
        cfg: impl Fn(usize) -> NormalConfig,
    ) -> Mesh {
        Self::build(seed, n, edges, link, cfg, false)
    }

    fn build(
        seed: u64,
        n: usize,
        edges: &[(usize, usize)],
        link: LinkConfig,
        cfg: impl Fn(usize) -> NormalConfig,
        announce: bool,
    ) -> Mesh {
        let mut world = World::new(seed);
        let mut adj: Vec<Vec<usize>> = vec![Vec::new(); n];
        for &(a, b) in edges {
            assert!(a < n && b < n && a != b, "bad edge ({a}, {b})");
            assert!(!adj[a].contains(&b), "edge ({a}, {b}) given twice");
            adj[a].push(b);
            adj[b].push(a);
        }
        let mut nodes = Vec::new();
        for (i, peers) in adj.iter().enumerate() {
            let mut c = cfg(i);
            if announce && c.routing.is_none() {
                c.routing = Some(routing::Config::default());
            }
            draw_entropy(&mut c, restart_draw(seed, i, 0));
            let ipcp = NormalIpcp::new(c, Box::new(Fifo::new(1000)))
                .expect("valid normal IPCP configuration");
            let mut node = NormalNode::new(ipcp);
            for &j in peers {
                node.attach(Self::port(j), mesh_end(i, j), mesh_end(j, i));
            }
            nodes.push(world.add_node(node));
        }
        let links = edges
            .iter()
            .map(|&(a, b)| world.connect(mesh_end(a, b), mesh_end(b, a), link.clone()))
            .collect();
        if announce {
            for (i, peers) in adj.iter().enumerate() {
                for &j in peers {
                    world.schedule(
                        Instant::ZERO,
                        nodes[i],
                        NormalCommand::NeighborUp {
                            port: Self::port(j),
                            neighbor: j as Address + 1,
                            cost: 1,
                        },
                    );
                }
            }
        }
        Mesh {
            net: Net { world, nodes },
            edges: edges.to_vec(),
            links,
            restarts: 0,
        }
    }

    /// The N-1 port towards node `peer`, at any of its neighbours.
    pub fn port(peer: usize) -> N1Port {
        peer as N1Port + 1
    }

    /// Schedules the link between nodes `a` and `b` to be cut at `at`: both
    /// ends go down at once ([`NormalCommand::PortDown`]).
    pub fn cut(&mut self, at: Instant, a: usize, b: usize) {
        self.port_down(at, a, b);
        self.port_down(at, b, a);
    }

    /// Schedules node `node`'s port towards node `peer` to go down at `at`;
    /// the peer's end stays up (it keeps sending into the void, and routing
    /// drops the link because only one end reports it).
    pub fn port_down(&mut self, at: Instant, node: usize, peer: usize) {
        let id = self.nodes[node];
        self.world
            .schedule(at, id, NormalCommand::PortDown(Self::port(peer)));
    }

    /// Schedules the link between nodes `a` and `b` to go silent at `at`:
    /// neither end is told ([`NormalCommand::Silence`]); only hellos and
    /// liveness checks can notice.
    pub fn cut_silently(&mut self, at: Instant, a: usize, b: usize) {
        for (x, y) in [(a, b), (b, a)] {
            let id = self.nodes[x];
            self.world
                .schedule(at, id, NormalCommand::Silence(Self::port(y)));
        }
    }

    /// Schedules a link silenced with [`Mesh::cut_silently`] to carry
    /// frames again at `at`.
    pub fn resume(&mut self, at: Instant, a: usize, b: usize) {
        for (x, y) in [(a, b), (b, a)] {
            let id = self.nodes[x];
            self.world
                .schedule(at, id, NormalCommand::Resume(Self::port(y)));
        }
    }

    /// Schedules the link between nodes `a` and `b`, cut with
    /// [`Mesh::cut`], to come back at `at`: both ends get their port again
    /// ([`NormalCommand::PortUp`]) and, with `announce`, are told their
    /// neighbour (cost 1), as [`Mesh::new`] does at time zero; without it
    /// the neighbours find each other by hellos.
    pub fn reconnect(&mut self, at: Instant, a: usize, b: usize, announce: bool) {
        for (x, y) in [(a, b), (b, a)] {
            let id = self.nodes[x];
            let port = Self::port(y);
            let (local, peer) = (mesh_end(x, y), mesh_end(y, x));
            self.world
                .schedule(at, id, NormalCommand::PortUp { port, local, peer });
            if announce {
                let neighbor = self.node(y).ipcp().config().address;
                self.world.schedule(
                    at,
                    id,
                    NormalCommand::NeighborUp {
                        port,
                        neighbor,
                        cost: 1,
                    },
                );
            }
        }
    }

    /// Node `i` restarts now: its IPCP and applications are replaced by a
    /// fresh IPCP configured by `cfg` (all state lost), on the same link
    /// ends. Its neighbours are not told. With `announce`, the new IPCP is
    /// told its neighbours (cost 1, their current addresses) at once, as
    /// [`Mesh::new`] does at time zero; without it, it finds them by
    /// hellos (and enrolls again, if `cfg` says so).
    ///
    /// Like `rinad`, which draws them at random, the new IPCP numbers its
    /// CEP-ids from elsewhere and takes other nonces than the one it
    /// replaces: unless `cfg` sets them, its `first_cep` and membership
    /// `entropy` are drawn from the world's seed, the node and how many
    /// restarts came before ([`restart_draw`]), so that PDUs of its
    /// peers' flows from before never land in a flow of the new one (every
    /// node's first entropy is drawn the same way, for restart 0).
    pub fn restart(&mut self, i: usize, mut cfg: NormalConfig, announce: bool) {
        self.restarts += 1;
        let draw = restart_draw(self.world.seed(), i, self.restarts);
        if cfg.first_cep == 0 {
            cfg.first_cep = draw & 0xffff_ffff;
        }
        draw_entropy(&mut cfg, draw);
        let id = self.nodes[i];
        let ends = self.world.node(id).link_ends();
        let ipcp = NormalIpcp::new(cfg, Box::new(Fifo::new(1000)))
            .expect("valid normal IPCP configuration");
        let mut node = NormalNode::new(ipcp);
        for &(port, local, peer) in &ends {
            node.attach(port, local, peer);
        }
        *self.world.node_mut(id) = node;
        self.world.rearm(id);
        if !announce {
            return;
        }
        let now = self.world.now();
        for (port, _, _) in ends {
            let j = port as usize - 1;
            let neighbor = self.node(j).ipcp().config().address;
            self.world.schedule(
                now,
                id,
                NormalCommand::NeighborUp {
                    port,
                    neighbor,
                    cost: 1,
                },
            );
        }
    }

    /// Whether every node has a next hop to every node its live links
    /// reach (a breadth-first search over the ports still up at both ends).
    pub fn converged(&self) -> bool {
        let n = self.nodes.len();
        let up = |a: usize, b: usize| {
            let has = |x: usize, y: usize| {
                self.node(x)
                    .ipcp()
                    .neighbors()
                    .any(|(p, _, _)| p == Self::port(y))
            };
            has(a, b) && has(b, a)
        };
        (0..n).all(|s| {
            let mut seen = vec![false; n];
            seen[s] = true;
            let mut q = std::collections::VecDeque::from([s]);
            while let Some(x) = q.pop_front() {
                for &(a, b) in &self.edges {
                    for (u, v) in [(a, b), (b, a)] {
                        if u == x && !seen[v] && up(u, v) {
                            seen[v] = true;
                            q.push_back(v);
                        }
                    }
                }
            }
            let Some(ls) = self.node(s).ipcp().routing() else {
                return false;
            };
            let hops = ls.next_hops();
            let addr = |d: usize| self.node(d).ipcp().config().address;
            (0..n).all(|d| d == s || seen[d] == hops.contains_key(&addr(d))) && !ls.is_dirty()
        })
    }

    /// Runs the simulation in steps of `step` until [`Mesh::converged`] or
    /// `limit`; returns the time it converged, if it did. Events due now
    /// (such as the neighbour announcements at time zero) run first.
    pub fn run_until_converged(&mut self, step: Duration, limit: Instant) -> Option<Instant> {
        let now = self.world.now();
        self.world.run_until(now).expect("within the step limit");
        loop {
            if self.converged() {
                return Some(self.world.now());
            }
            if self.world.now() >= limit {
                return None;
            }
            let next = (self.world.now() + step).min(limit);
            self.world.run_until(next).expect("within the step limit");
        }
    }
}

/// Gives a member whose configuration sets no nonce entropy its own,
/// from `draw`, as `rinad` draws it at random: members that shared one
/// would take the same nonces, and each would take the other's hello for
/// its own reflected.
fn draw_entropy(cfg: &mut NormalConfig, draw: u64) {
    if let Some(m) = cfg.membership.as_mut().filter(|m| m.entropy == [0; 32]) {
        for (k, b) in m.entropy.iter_mut().enumerate() {
            *b = (restart_draw(draw, k, 0) & 0xff) as u8;
        }
    }
}

/// A number drawn for the `restart`-th restart of node `node` in a world
/// seeded with `seed` (SplitMix64 of the three): the same for the same
/// run, different for each restart.
pub fn restart_draw(seed: u64, node: usize, restart: u64) -> u64 {
    let mut z = seed
        ^ (node as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ restart.wrapping_mul(0xd1b5_4a32_d192_ed03);
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Nodes running normal IPCPs in a simulated world, with the scripted
/// application actions every topology builder ([`Chain`], [`Mesh`]) offers.
pub struct Net {
    /// The simulation.
    pub world: World<NormalNode>,
    /// Node ids; node `i` has address `i + 1`.
    pub nodes: Vec<NodeId>,
}

impl Net {
    /// Schedules a stream of `count` SDUs of `len` bytes from node `from` on
    /// `flow`, starting at `at`, one every `interval`.
    pub fn stream(
        &mut self,
        at: Instant,
        from: usize,
        flow: FlowId,
        count: u64,
        len: usize,
        interval: Duration,
    ) {
        let node = self.nodes[from];
        self.world.schedule(
            at,
            node,
            NormalCommand::Stream {
                flow,
                count,
                len,
                interval,
            },
        );
    }

    /// Registers `name` at node `node` with the application `app` (accept,
    /// refuse or ignore; echo or not), and enters it in the directory of
    /// every node. Takes effect at once.
    pub fn register(&mut self, node: usize, name: &str, app: App) {
        let name: AppName = name.parse().expect("valid application name");
        let addr = node as u64 + 1;
        for &id in &self.nodes {
            self.world
                .node_mut(id)
                .ipcp_mut()
                .set_directory(name.clone(), addr);
        }
        self.world
            .node_mut(self.nodes[node])
            .register(name, app)
            .expect("name not registered yet");
    }

    /// Registers `name` at node `node` with the application `app`, without
    /// touching any static directory: the other nodes find it only through
    /// the disseminated directory
    /// ([`NormalConfig::dynamic_directory`]), once it has flooded. Takes
    /// effect at once.
    pub fn register_dynamic(&mut self, node: usize, name: &str, app: App) {
        let name: AppName = name.parse().expect("valid application name");
        let id = self.nodes[node];
        self.world
            .node_mut(id)
            .register(name, app)
            .expect("name not registered yet");
        // The registration floods: the node's timer may be due earlier.
        self.world.rearm(id);
    }

    /// Schedules node `node` to unregister `name` at `at`
    /// ([`NormalCommand::Unregister`]); static directories are left alone.
    pub fn unregister_at(&mut self, at: Instant, node: usize, name: &str) {
        let id = self.nodes[node];
        let name: AppName = name.parse().expect("valid application name");
        self.world
            .schedule(at, id, NormalCommand::Unregister { name });
    }

    /// Schedules node `node` to register `name` at `at` with the
    /// application `app` ([`NormalCommand::Register`]), without touching any
    /// static directory.
    pub fn register_at(&mut self, at: Instant, node: usize, name: &str, app: App) {
        let id = self.nodes[node];
        let name: AppName = name.parse().expect("valid application name");
        self.world
            .schedule(at, id, NormalCommand::Register { name, app });
    }

    /// Enters `name` in the directory of every node as living at node
    /// `node`, without registering it there.
    pub fn set_directory(&mut self, name: &str, node: usize) {
        let name: AppName = name.parse().expect("valid application name");
        for &id in &self.nodes {
            self.world
                .node_mut(id)
                .ipcp_mut()
                .set_directory(name.clone(), node as u64 + 1);
        }
    }

    /// Schedules node `node` to allocate flow `flow` from `local` to
    /// `remote` at `at`.
    pub fn allocate(
        &mut self,
        at: Instant,
        node: usize,
        flow: FlowId,
        local: &str,
        remote: &str,
        qos: QosSpec,
    ) {
        let id = self.nodes[node];
        self.world.schedule(
            at,
            id,
            NormalCommand::Allocate {
                flow,
                local: local.parse().expect("valid application name"),
                remote: remote.parse().expect("valid application name"),
                qos,
            },
        );
    }

    /// Schedules node `node` to deallocate flow `flow` at `at`.
    pub fn deallocate(&mut self, at: Instant, node: usize, flow: FlowId) {
        let id = self.nodes[node];
        self.world
            .schedule(at, id, NormalCommand::Deallocate { flow });
    }

    /// The node at position `i`.
    pub fn node(&self, i: usize) -> &NormalNode {
        self.world.node(self.nodes[i])
    }

    /// The node at position `i`, mutably.
    pub fn node_mut(&mut self, i: usize) -> &mut NormalNode {
        self.world.node_mut(self.nodes[i])
    }
}

macro_rules! deref_to_net {
    ($t:ty) => {
        impl std::ops::Deref for $t {
            type Target = Net;
            fn deref(&self) -> &Net {
                &self.net
            }
        }
        impl std::ops::DerefMut for $t {
            fn deref_mut(&mut self) -> &mut Net {
                &mut self.net
            }
        }
    };
}

deref_to_net!(Chain);
deref_to_net!(Mesh);
