//! A chain of normal IPCPs: node 0 — node 1 — … — node n-1, each joined to
//! the next by an emulated link, with static routes and a static directory,
//! as the tests need before layer management exists. Flows are opened
//! either directly ([`Chain::open_flow`]) or by name through the flow
//! allocator ([`Chain::register`], [`Chain::allocate`]).

use crate::link::{LinkConfig, LinkId};
use crate::normal_node::{NormalCommand, NormalNode};
use crate::shim_node::App;
use crate::world::{NodeId, World};
use rina_core::efcp::EfcpConfig;
use rina_core::normal::{Endpoint, FlowId, NormalConfig, NormalIpcp};
use rina_core::rmt::Fifo;
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
pub struct Chain {
    /// The simulation.
    pub world: World<NormalNode>,
    /// Node ids, in chain order; node `i` has address `i + 1`.
    pub nodes: Vec<NodeId>,
    /// Link `i` joins node `i` and node `i + 1`.
    pub links: Vec<LinkId>,
}

impl Chain {
    /// `n` nodes joined by links like `link`, each IPCP configured by
    /// `cfg(address)`, FIFO queues of 1000 PDUs, and routes along the chain.
    pub fn new(seed: u64, n: usize, link: LinkConfig, cfg: impl Fn(u64) -> NormalConfig) -> Chain {
        let mut world = World::new(seed);
        let mut nodes = Vec::new();
        for i in 0..n {
            let addr = i as u64 + 1;
            let ipcp = NormalIpcp::new(cfg(addr), Box::new(Fifo::new(1000)))
                .expect("valid normal IPCP configuration");
            let mut node = NormalNode::new(ipcp);
            if i > 0 {
                node.attach(LEFT, end_addr(i, LEFT), end_addr(i - 1, RIGHT));
            }
            if i + 1 < n {
                node.attach(RIGHT, end_addr(i, RIGHT), end_addr(i + 1, LEFT));
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
        Chain {
            world,
            nodes,
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

    /// The node at chain position `i`.
    pub fn node(&self, i: usize) -> &NormalNode {
        self.world.node(self.nodes[i])
    }

    /// The node at chain position `i`, mutably.
    pub fn node_mut(&mut self, i: usize) -> &mut NormalNode {
        self.world.node_mut(self.nodes[i])
    }
}
